"""``CompiledFunction``: the callable ``fusegrad.compile`` returns, sequencing the stages of
a compiled call (see :mod:`fusegrad.tracer.compile` for what a call does).

A call looks its entry up in the call cache (:mod:`~fusegrad.tracer.call_cache`); a miss
captures the function (:mod:`~fusegrad.tracer.trace_call`), runs the pass pipeline
(:mod:`~fusegrad.tracer.pipeline`) and builds the program
(:mod:`~fusegrad.tracer.programs`); the entry then runs (:mod:`~fusegrad.tracer.execute`),
recording its backward on the eager tape when its inputs require grad
(:mod:`~fusegrad.tracer.compiled_autograd`).
"""

from __future__ import annotations

import collections
import copy
import functools
import sys
import threading
import time
import traceback
import types
import warnings
import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np

from fusegrad import profiling
from fusegrad.autograd.grad_mode import is_grad_enabled
from fusegrad.config import config
from fusegrad.ir.dot import render, to_dot
from fusegrad.ir.graph import Graph
from fusegrad.ir.printer import print_graph
from fusegrad.ir.specialize import specialize
from fusegrad.ir.symbolic import ConcretizationError
from fusegrad.ir.verifier import verify
from fusegrad.ops import primitive as _primitive
from fusegrad.runtime.cpu import Program
from fusegrad.symint import (
    COMPARE,
    MIN_SYMBOL_SIZE,
    SymbolicDecisionError,
    evaluate_dim,
    holds_symbol,
    is_symbolic,
    record_assumptions,
)
from fusegrad.tensor import Size
from fusegrad.tracer.call_cache import (
    _ALIASES,
    _KEY_PARTS,
    _Entry,
    _entry_guard,
    _makes_optimizer_state,
    _recompile_limit_message,
    _spent,
    _SplitPrograms,
    _writes_an_argument,
    call_key,
    fast_key,
    recompile_reason,
    static_key,
)
from fusegrad.tracer.compiled_autograd import differentiated, record_backward
from fusegrad.tracer.dynamic_shapes import (
    SymbolicSignature,
    choose_symbols,
    dim_name,
    marked_dims,
    symbolic_key,
)
from fusegrad.tracer.execute import (
    _fast_call,
    call_inputs,
    run_inputs,
    run_program,
    user_outputs,
    write_back,
)
from fusegrad.tracer.guards import ClosureGuard
from fusegrad.tracer.pipeline import DEFAULT_PIPELINE, program_pipeline, run_passes, vjp_pipeline
from fusegrad.tracer.programs import (
    entry_program,
    split_programs,
    symbolic_entry_program,
    vjp_program,
)
from fusegrad.tracer.trace import _arg_names, _leaf_names, module_state, tree_flatten
from fusegrad.tracer.trace_call import capture_call, closure_guard_of, guard_reads

__all__ = ["CompiledFunction", "Lowered", "counters", "RECOMPILE_WARNING_LIMIT", "BACKENDS"]

RECOMPILE_WARNING_LIMIT = 8        # the default of config.recompile_limit (kept for imports)
BACKENDS = ("llvm", "interpreter", "cuda")

# Over all compiled functions, as torch's torch._dynamo.utils.counters (fusegrad._dynamo.utils
# has it under that name): counters["frames"]["total"] traces started, ["frames"]["ok"] those
# compiled, ["stats"]["unique_graphs"] programs made, ["graph_break"][reason] calls sent to
# eager by a trace that failed. Clear it with counters.clear().
counters: collections.defaultdict = collections.defaultdict(collections.Counter)


@dataclass
class Lowered:
    """What a call compiles to, without running it: the graph (after passes), the kernels,
    and the generated LLVM IR."""

    graph: Graph
    kernels: list[str]
    llvm_ir: str
    program: Program | None = None

    def __str__(self) -> str:
        return print_graph(self.graph) + "\n// kernels:\n// " + "\n// ".join(self.kernels)

    def to_dot(self) -> str:
        """Graphviz text of the graph with each kernel drawn as a cluster."""
        kernels = [k.nodes for k in self.program.kg.kernels] if self.program else None
        return to_dot(self.graph, kernels=kernels)

    def render(self, path: str) -> str:
        """Draw the graph and its kernels to an image (needs graphviz's ``dot``)."""
        kernels = [k.nodes for k in self.program.kg.kernels] if self.program else None
        return render(self.graph, path, kernels=kernels)


def _carries_tangents(args, kwargs) -> bool:
    """Whether an argument carries forward mode's tangents (a dual tensor made outside the
    function): a compiled program has no inputs for them, so the function runs eagerly, its
    primitives carrying them. (Forward mode inside the function compiles.)"""
    return any(getattr(t, "_fw_grads", None) for t in tree_flatten((args, kwargs))[0])


def _check_symbolic_ready(graph: Graph, args, kwargs) -> None:
    """Raise, naming it, what a symbolic entry of ``graph`` cannot run: a function that
    returns a size (``x.shape[0]``: a Python value of the trace, which would be the
    symbol)."""
    if _returns_a_size(graph.meta.out_tree):
        raise NotImplementedError("the function returns a size as a Python value")


def _returns_a_size(tree) -> bool:
    if tree.kind == "static":
        return holds_symbol(tree.meta) or isinstance(tree.meta, Size) and is_symbolic(tree.meta)
    return any(_returns_a_size(c) for c in tree.children or ())


def _said(assumption: tuple) -> str:
    """An assumption ``(expression, op, value)`` in words, as a comparable key."""
    expr, op, value = assumption
    return f"{expr} {op} {value}"


class CompiledFunction:
    """The callable ``fusegrad.compile`` returns."""

    grad_name = "CompiledFunctionBackward"      # the grad_fn name of its outputs

    def __init__(self, fn: Callable, *, backend: str = "llvm", static_argnums=(),
                 static_argnames=(), donate_argnums=(), fullgraph: bool = False,
                 pipeline: str | None = None, mode: str | None = None,
                 dynamic: bool | None = None):
        if backend == "inductor":       # torch.compile's default backend: the native one here
            backend = "llvm"
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
        self.fn = fn
        self.module = fn if hasattr(fn, "_parameters") and hasattr(fn, "named_parameters") \
            else None
        self.backend = backend
        self.static_argnums = (static_argnums,) if isinstance(static_argnums, int) \
            else tuple(static_argnums)
        self.static_argnames = (static_argnames,) if isinstance(static_argnames, str) \
            else tuple(static_argnames)
        self.donate_argnums = (donate_argnums,) if isinstance(donate_argnums, int) \
            else tuple(donate_argnums)
        self.fullgraph = fullgraph
        self.pipeline = pipeline or DEFAULT_PIPELINE
        # torch.compile's mode: "reduce-overhead" replays each CUDA program as a CUDA graph.
        self.mode = mode
        # Symbolic dims (tracer/dynamic_shapes.py): torch's dynamic option; the dims that
        # automatic dynamic made symbolic ((leaf index, dim)); the argument shapes of the
        # first compile, which later compiles compare with; why symbolic tracing was given
        # up (then every compile is static).
        self.dynamic = dynamic
        self._auto_dims: set[tuple[int, int]] = set()
        # Automatic dynamic: the dims the latest recompile made symbolic, and those whose
        # symbolic trace failed (they stay static, the dims symbolic before them stay so).
        self._new_dims: set[tuple[int, int]] = set()
        self._static_dims: set[tuple[int, int]] = set()
        self._first_shapes: list | None = None
        self._symbolic_off: str | None = None
        self._leading_only = False          # dynamic=True narrowed to each argument's dim 0
        self._dynamic_reason: str | None = None
        self.cache: dict = {}
        self._fast: dict = {}
        self._fast_ok = self.module is None and not self.static_argnums and \
            not self.static_argnames
        self.compiles = 0
        self.recompile_reasons: list[str] = []   # why each compile after the first happened
        self._eager_keys: set = set()
        self._warned_eager = False
        self._warned_limit = False
        self._last_key = None
        self._cuda_twin: CompiledFunction | None = None
        self._bound: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._in_region = False         # inside this call's profiler range
        # Held while a call looks up, compiles or runs an entry, so that threads calling for
        # the first time wait for one compile instead of each tracing, and no call reads the
        # state a trace changes while it runs (a compiled module's parameters are the trace's
        # symbolic tensors then). Reentrant: a traced function may call itself. A call whose
        # entry reads nothing but its arguments (``entry.fast``) runs without it.
        self._lock = threading.RLock()
        functools.update_wrapper(self, fn if not self.module else type(fn).forward)

    def _options(self) -> dict:
        return dict(backend=self.backend, static_argnums=self.static_argnums,
                    static_argnames=self.static_argnames, donate_argnums=self.donate_argnums,
                    fullgraph=self.fullgraph, pipeline=self.pipeline, mode=self.mode,
                    dynamic=self.dynamic)

    def __deepcopy__(self, memo):
        # A compiled module's copy (an EMA model, the best model so far) is the copied
        # module, compiled the same way; its programs are traced again, of its own tensors.
        fn = copy.deepcopy(self.fn, memo) if self.module is not None else self.fn
        return CompiledFunction(fn, **self._options())

    def __get__(self, obj, objtype=None):
        # @fusegrad.compile on a method in a class body: each instance gets its own compiled
        # bound method (its own traces and recompile limit; what it reads of self is guarded).
        if obj is None:
            return self
        try:
            bound = self._bound.get(obj)
        except TypeError:               # an instance that is unhashable or not weakly held
            return types.MethodType(self, obj)
        if bound is None:
            # Argument positions counted self (as jax.jit's on a method); now it is bound.
            options = self._options()
            options["static_argnums"] = [i - 1 for i in self.static_argnums if i > 0]
            options["donate_argnums"] = [i - 1 for i in self.donate_argnums if i > 0]
            bound = self._bound[obj] = CompiledFunction(types.MethodType(self.fn, obj),
                                                        **options)
        return bound

    def __getattr__(self, name: str):
        # A compiled module still looks like the module (parameters(), train(), ...).
        module = self.__dict__.get("module")
        if module is not None:
            return getattr(module, name)
        raise AttributeError(name)

    # ------------------------------------------------------------------ call

    def __call__(self, *args, **kwargs):
        """Run the compiled entry of this call (cached, or compiled now), or ``fn`` eagerly."""
        if profiling.recorder is not None and not self._in_region:
            return self._profiled_call(args, kwargs)
        if _primitive.forward_mode_live() and _carries_tangents(args, kwargs):
            return self.fn(*args, **kwargs)
        if _primitive._device_apply is not None and self.backend == "llvm" and \
                self._on_cuda(args, kwargs):
            return self._cuda()(*args, **kwargs)
        # Fast path: positional tensor arguments only, a signature seen before.
        fast = fast_key(args) if not kwargs and self._fast_ok else None
        hit = self._fast.get(fast) if fast is not None else None
        if hit is not None and (run := hit.fast) is not None:
            return run(args)                    # reads nothing but the arguments: no lock
        if hit is not None:
            with self._lock:
                if self._holds(hit, args):
                    return self._run(hit, args)
        if any(t._trace is not None for t in tree_flatten((args, kwargs))[0]):
            # Called inside a trace (another compile or a transform): inline the function.
            return self.fn(*args, **kwargs)
        with self._lock:
            key, leaves, symbols = self._key(args, kwargs)
            entry = self._entry_for(key, args, kwargs, leaves, symbols)
            if entry is not None:
                self._remember_fast(fast, entry, args, leaves)
                return self._run(entry, leaves)
        # Outside the lock: the function runs eagerly, as often in parallel as it is called.
        return self.fn(*args, **kwargs)

    def _run(self, entry: _Entry, leaves):
        """Run ``entry`` for a call with tensor arguments ``leaves``."""
        inputs = run_inputs(entry, leaves, self.module)
        # A call that autograd records: the forward runs as the first half of a partitioned
        # program, saving what the backward needs (passes/partition.py).
        wrt, flags = differentiated(entry, inputs)
        backward = flags is not None and any(flags)
        split = self.split_programs(entry, wrt) \
            if backward and entry.program is not None else None
        results, residuals = run_program(entry, inputs, split)
        if backward:
            # Before the write-back: the backward needs the inputs as the call saw them.
            record_backward(self, entry, wrt, flags, inputs, results, split, residuals)
        write_back(entry, inputs, results)
        if entry.one_shot:
            # Its state tensors are now the optimizer's, and a later call with no state
            # (opt.load_state_dict of a fresh state, state.clear()) must make new ones, as
            # eager does: that call traces again.
            entry.guard, entry.fast = _spent, None
        return user_outputs(entry, inputs, results)

    def _entry_for(self, key, args, kwargs, leaves, symbols) -> _Entry | None:
        """The entry that a call with ``key`` runs: cached, or compiled now; None when the
        call runs eagerly (past the recompile limit, a graph break, aliased arguments)."""
        if key in self._eager_keys:
            return None
        entry = self._lookup(key, leaves)
        if entry is None and self._more_dynamic(leaves, args, kwargs):
            # Automatic dynamic: a dim changed size, so the key has a symbol for it now
            # (a symbolic entry made earlier may serve this call).
            key, leaves, symbols = self._key(args, kwargs)
            entry = self._lookup(key, leaves)
        if entry is not None and entry.symbolic is not None and \
                not self._specialized(entry, key, leaves):
            key, leaves, symbols = self._key(args, kwargs)       # static now
            entry = self._lookup(key, leaves)
        if entry is None and symbols:
            # Sizes a symbolic entry's assumptions exclude have an entry of their own.
            static = self._key(args, kwargs, symbolic=False)[0]
            entry = self._lookup(static, leaves)
            if entry is not None:
                key = static
        if entry is None:
            if self.compiles >= self._recompile_limit():
                # torch's recompile_limit: past it, new signatures run eagerly.
                if not self._warned_limit:
                    warnings.warn(_recompile_limit_message(self._name(), self.cache,
                                                           self._last_key, key, self.compiles),
                                  UserWarning, stacklevel=3)
                    self._warned_limit = True
                return None
            try:
                entry, key = self._compile(key, args, kwargs, symbols)
            except ConcretizationError as e:
                if self.fullgraph:
                    raise
                counters["graph_break"][str(e).split("\n")[0]] += 1
                if config.debug >= 1:
                    print(f"[fusegrad] running {self._name('fn')} eagerly: {e}", file=sys.stderr)
                self._to_eager(key, f"running {self._name('fn')} eagerly: {e}")
                return None
            # Only a whole entry is cached: a compile that raises leaves none.
            self.cache.setdefault(key, []).append(entry)
            self._last_key = key
        if key[_ALIASES] and _writes_an_argument(entry):
            # f(a, a), or two slices of one tensor, where the function writes one of them
            # in place: the trace took them for separate inputs, and the other would not
            # see the write. Eager sees it. (What the trace did, e.g. an optimizer's
            # first-step state, is taken back first.)
            if entry.info.capture is not None:
                entry.info.capture.rollback()
            self._to_eager(key, f"running {self._name('fn')} eagerly for arguments that share "
                           "storage, one of which it writes in place")
            return None
        return entry

    def _to_eager(self, key, message: str) -> None:
        """Calls with ``key`` run eagerly from now on; the first such call warns."""
        if not self._warned_eager:
            # stacklevel: the line that called the compiled function (through _entry_for)
            warnings.warn(f"fusegrad.compile: {message}", UserWarning, stacklevel=4)
            self._warned_eager = True
        self._eager_keys.add(key)

    def _remember_fast(self, fast, entry: _Entry, args, leaves) -> None:
        """Send later calls with the fast key ``fast`` straight to ``entry``; guarded entries
        too (a training step's): the guard runs on each fast call, and when it fails the full
        lookup finds or compiles the entry that holds."""
        if fast is None or len(leaves) != len(args):
            return
        if entry.guard is None and not (
                is_grad_enabled() and any(t._requires_grad for t in leaves)):
            entry.fast = _fast_call(entry)
        self._fast[fast] = entry

    def _cuda(self) -> "CompiledFunction":
        """Cuda tensors exist and some reach this call: its twin on the cuda backend runs
        it, with device arrays in and out (the CPU path pays one test until then)."""
        with self._lock:
            if self._cuda_twin is None:
                self._cuda_twin = CompiledFunction(self.fn, **dict(self._options(),
                                                                   backend="cuda"))
        return self._cuda_twin

    def _name(self, default: str | None = None) -> str:
        """The function's name, for messages."""
        return getattr(self.fn, "__name__", default or type(self.fn).__name__)

    def _profiled_call(self, args, kwargs):
        """A call while a profiler records: one range around all of it, named as torch names
        a compiled call's (its self time is what the call spends outside its programs:
        guards, arguments, write-backs; tracing and compiling on a first call)."""
        self._in_region = True
        try:
            with profiling.Span(profiling.recorder, f"Torch-Compiled Region: {self._name()}"):
                return self(*args, **kwargs)
        finally:
            self._in_region = False

    def _on_cuda(self, args, kwargs) -> bool:
        """Whether a tensor argument, or the module's state, is a cuda tensor."""
        leaves, _ = tree_flatten((args, kwargs))
        if self.module is not None:
            leaves = leaves + [t for _, t in module_state(self.module)]
        return any(t._trace is None and not isinstance(t._data, np.ndarray) for t in leaves)

    # ------------------------------------------------------------------ guards

    def _key(self, args, kwargs, symbolic: bool = True):
        """The call-cache key of a call, its tensor arguments, and the symbols of its
        symbolic dims ({leaf index: {dim: SymInt}}; the key names them instead of sizes;
        none with ``symbolic=False``)."""
        static = static_key(args, kwargs, self.static_argnums, self.static_argnames)
        key, leaves = call_key(args, kwargs, static, self.module)
        symbols = self._symbols(leaves) if symbolic else {}
        return symbolic_key(key, len(_KEY_PARTS), symbols), leaves, symbols

    def _symbols(self, leaves) -> dict:
        """The symbols of a call's symbolic dims (see tracer/dynamic_shapes.py)."""
        if self.dynamic is False or self._symbolic_off is not None:
            return {}
        if self.backend not in ("llvm", "cuda"):
            if self.dynamic and config.debug >= 1 and self._symbolic_off is None:
                print(f"[fusegrad] {self._name()}: symbolic shapes run on the llvm and cuda "
                      f"backends only; the {self.backend} backend compiles static shapes",
                      file=sys.stderr)
            self._symbolic_off = f"the {self.backend} backend"
            return {}
        if self.dynamic:
            # Narrowed to the leading dims, the others still turn symbolic as automatic
            # dynamic's do (a sequence length beside a channel dim the trace needs).
            dims = {(i, d) for i, t in enumerate(leaves)
                    for d in range(min(t.dim(), 1) if self._leading_only else t.dim())}
            dims |= self._auto_dims
        else:
            dims = self._auto_dims | marked_dims(leaves)
        return choose_symbols(leaves, dims) if dims else {}

    def _more_dynamic(self, leaves, args, kwargs) -> bool:
        """Automatic dynamic (``dynamic=None``): the dims of a call needing a compile whose
        size differs from the first compile's join the symbolic dims; whether any did."""
        if self.dynamic is False or self.dynamic is True and not self._leading_only or \
                self._symbolic_off is not None or not config.automatic_dynamic_shapes:
            return False
        shapes = [t.shape for t in leaves]
        if self._first_shapes is None:
            self._first_shapes = shapes
            return False
        first = self._first_shapes
        new = {(i, d) for i, (a, b) in enumerate(zip(first, shapes)) if len(a) == len(b)
               for d, (m, n) in enumerate(zip(a, b)) if m != n and n >= MIN_SYMBOL_SIZE
               and (i, d) not in self._auto_dims and (i, d) not in self._static_dims}
        if not new:
            return False
        self._auto_dims |= new
        self._new_dims = new
        names = self._leaf_names(args, kwargs)
        said = ", ".join(f"{dim_name(names, i, d)} {first[i][d]} -> {shapes[i][d]}"
                         for i, d in sorted(new))
        # The reason of the recompile that follows (see _compile).
        self._dynamic_reason = f"automatic dynamic: {said} (now symbolic)"
        if config.debug >= 1:
            print(f"[fusegrad] automatic dynamic: {self._name()} saw {said}; compiling "
                  f"{'that dim' if len(new) == 1 else 'those dims'} as symbols",
                  file=sys.stderr)
        return True

    def _leaf_names(self, args, kwargs) -> list[str]:
        """The tensor arguments' names, for messages (``x``, ``batch_0``)."""
        target = self.module.forward if self.module is not None else self.fn
        return _leaf_names(args, kwargs, _arg_names(target, len(args)))

    def entries(self) -> list[_Entry]:
        """Every compiled entry (a signature and the guards it was traced under)."""
        return [e for group in self.cache.values() for e in group]

    def _lookup(self, key, leaves) -> _Entry | None:
        """The cached entry for ``key`` whose guards hold now, if any."""
        # Newest first: a training step's steady graph is traced after its first step's.
        for entry in reversed(self.cache.get(key, ())):
            if self._holds(entry, leaves):
                return entry
        return None

    def _holds(self, entry: _Entry, leaves) -> bool:
        """Whether ``entry``'s guards hold for a call with ``leaves``."""
        if entry.symbolic is not None and entry.symbolic.failing(leaves) is not None:
            return False
        return entry.guard is None or entry.guard(
            lambda: call_inputs(entry, leaves, self.module, read_only=True))

    def _closure_guard(self, args, kwargs) -> ClosureGuard:
        """What the function reads from its closure and globals, and of the objects among
        its arguments, guarded on each call."""
        return closure_guard_of(self.fn, self.module, args, kwargs)

    def _recompile_limit(self) -> int:
        return config.recompile_limit

    # ------------------------------------------------------------------ compile

    def _compile(self, key, args, kwargs, symbols=None) -> tuple[_Entry, tuple]:
        """Trace, compile and guard a call: the entry and the key to cache it under (the
        static key of the call when its symbolic compile fell back; see
        :meth:`_compile_symbolic`)."""
        start = time.perf_counter()
        counters["frames"]["total"] += 1
        # Why this call needs a trace, said before tracing changes what the guards read.
        reason = recompile_reason(self.cache, self._last_key, key) if self.cache else None
        name = self._name()
        # Non-tensor arguments are baked into the trace (and part of the guard key); what the
        # function reads from its closure and globals is guarded.
        closure = guard_reads(lambda: self._closure_guard(args, kwargs), name)
        if self._dynamic_reason is not None:
            reason, self._dynamic_reason = self._dynamic_reason, None
        broken = self._broken_assumption(key, args, kwargs)
        if broken is not None:
            reason, symbols = broken, None
        narrowed, auto = self._leading_only, set(self._auto_dims)
        entry = self._compile_symbolic(args, kwargs, closure, name, symbols) if symbols else None
        if entry is None and symbols and self._symbolic_off is None and \
                (self._leading_only and not narrowed or self._auto_dims != auto):
            # dynamic=True gave up on all dims, or automatic dynamic on the dims it just
            # added: the leading dims, or the dims symbolic before, may still do.
            key, _, symbols = self._key(args, kwargs)
            entry = self._compile_symbolic(args, kwargs, closure, name, symbols) \
                if symbols else None
        if entry is None:
            # Static: this call's own sizes, under its static key.
            key = self._key(args, kwargs, symbolic=False)[0]
            entry = self._compile_traced(args, kwargs, closure, name)
        entry.compile_ms = (time.perf_counter() - start) * 1e3
        self._count(entry, reason)
        return entry, key

    def _compile_traced(self, args, kwargs, closure, name, symbols=None) -> _Entry:
        """Trace and build the entry of a call (with ``symbols``: those dims symbolic)."""
        graph = capture_call(self.fn, args, kwargs, closure, name, symbols)
        try:
            return self._build(graph, args, kwargs, closure, name, symbols)
        except BaseException:
            # A compile that fails leaves nothing behind: no entry (the caller caches only
            # what this returns) and no state its trace made (an optimizer's first-step
            # state), so that a later call starts afresh.
            graph.meta.capture.rollback()
            raise

    def _compile_symbolic(self, args, kwargs, closure, name, symbols) -> _Entry | None:
        """The entry of a call traced with ``symbols``, or None when something on the way
        is not symbolic-ready (said under ``FUSEGRAD_DEBUG=1``): then symbolic tracing is
        given up for this function (with ``dynamic=True`` over all dims, first the
        non-leading dims), and its compiles are static."""
        names = self._leaf_names(args, kwargs)
        said = ", ".join(f"{dim_name(names, i, d)} as {s}" for i, dims in sorted(symbols.items())
                         for d, s in sorted(dims.items()))
        try:
            with record_assumptions() as assumed:
                entry = self._compile_traced(args, kwargs, closure, name, symbols)
                # (The signature holds the list the recording fills: the backward's
                # passes assume too.)
                entry.symbolic = SymbolicSignature(
                    symbols, {s.name: dim_name(names, i, d)
                              for i, dims in symbols.items() for d, s in dims.items()}, assumed)
                try:
                    self._build_backward(entry, args, kwargs)
                except BaseException:
                    entry.info.capture.rollback()    # nothing of this trace stays
                    raise
        except ConcretizationError:
            raise
        except Exception as e:
            bad = SymbolicSignature(symbols, {s.name: dim_name(names, i, d) for i, dims in
                                              symbols.items() for d, s in dims.items()},
                                    assumed).failing_at_hints()
            if bad is not None and not any(self._narrowing()):
                # The trace failed after answering a comparison against this call's own
                # sizes (a broadcast of floor((s0+1)/3) with a literal 2 at s0 = 5), and no
                # narrower set of symbolic dims is left to try: the sizes, not the symbols,
                # are the cause; this call compiles static, the next size traces symbolic.
                if config.debug >= 1:
                    print(f"[fusegrad] {name}: symbolic {said} is not valid at this call's "
                          f"sizes ({bad}); this call compiles static", file=sys.stderr)
                return None
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if config.debug >= 3:
                traceback.print_exc()           # where symbolic sizes met a concrete need
            self._give_up_symbols(why, said)
            return None
        sig = entry.symbolic
        bad = sig.failing_at_hints()
        if bad is not None:
            # Valid for other sizes, not this one: it compiles static (later sizes are
            # traced symbolic again).
            if entry.info.capture is not None:
                entry.info.capture.rollback()
            if config.debug >= 1:
                print(f"[fusegrad] {name}: symbolic {said} is not valid at this call's sizes "
                      f"({bad}); this call compiles static", file=sys.stderr)
            return None
        if config.debug >= 1:
            assumed_text = "; assuming " + ", ".join(
                f"{sig.describe(e)} {op} {sig.describe(k)}" for e, op, k in sig.assumptions) \
                if sig.assumptions else ""
            print(f"[fusegrad] {name}: traced with symbolic {said}{assumed_text}",
                  file=sys.stderr)
        return entry

    def _build_backward(self, entry: _Entry, args, kwargs) -> None:
        """For a symbolic entry of a call that autograd records: its forward and backward
        programs, built now at this call's sizes, so that what is not symbolic-ready there
        fails while compiling (and the call compiles static) rather than in the backward."""
        leaves = tree_flatten((args, kwargs))[0]
        wrt, flags = differentiated(entry, call_inputs(entry, leaves, self.module,
                                                       read_only=True))
        if not flags or not any(flags):
            return
        split = self.split_programs(entry, wrt)
        sizes = entry.symbolic.bindings(leaves)
        for half in (split.forward, split.backward):
            verify(half.graph)          # each half binds its symbols from its own inputs
            half.program_for(sizes)

    def _specialized(self, entry: _Entry, key, leaves) -> bool:
        """Whether the symbolic ``entry`` has (or now builds) the programs a call with
        ``leaves`` runs, at its sizes: the entry's, or the forward and backward halves of a
        call that autograd records. When building fails, the entry is dropped and symbolic
        compiles given up (said under ``FUSEGRAD_DEBUG=1``), so that the call compiles
        static instead."""
        sig = entry.symbolic
        sizes = sig.bindings(leaves)
        ready = tuple(sorted(sizes.items()))
        if ready in sig.ready:
            return True
        try:
            wrt, flags = differentiated(entry, call_inputs(entry, leaves, self.module,
                                                           read_only=True))
            if flags and any(flags):
                split = self.split_programs(entry, wrt)
                split.forward.program_for(sizes)
                split.backward.program_for(sizes)
            else:
                entry.program.program_for(sizes)
        except Exception as e:
            self.cache[key].remove(entry)
            for fast, hit in list(self._fast.items()):
                if hit is entry:
                    del self._fast[fast]
            self._give_up_symbols(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                                  "sizes", narrow=False)
            return False
        sig.ready.add(ready)
        return True

    def _narrowing(self) -> tuple[bool, bool]:
        """How a failed symbolic trace narrows the symbolic dims: (keep: automatic dynamic's
        new dims turn static, the earlier ones stay symbolic; narrow: ``dynamic=True``
        narrows to the leading dims); neither: symbolic tracing ends."""
        keep = (self.dynamic is None or self._leading_only) and self._symbolic_off is None \
            and bool(self._new_dims) and bool(self._auto_dims - self._new_dims)
        narrow = self.dynamic is True and self._symbolic_off is None and not self._leading_only
        return keep, narrow

    def _give_up_symbols(self, why: str, said: str, narrow: bool = True) -> None:
        """Symbolic tracing of ``said`` failed with ``why``: narrow it (``dynamic=True``:
        to the leading dims, once) or give it up; said under ``FUSEGRAD_DEBUG=1``."""
        keep, narrow = self._narrowing() if narrow else (False, False)
        if keep:
            # A dim that just became symbolic broke a trace that worked without it (a
            # sequence length a loop runs over): it stays static, the others symbolic.
            self._auto_dims -= self._new_dims
            self._static_dims |= self._new_dims
        elif narrow:
            self._leading_only = True
        else:
            self._symbolic_off = why
        self._new_dims = set()
        if config.debug >= 1:
            then = "trying the leading dims only" if narrow else \
                "the new dims stay static, the earlier ones symbolic" if keep else \
                "compiling static shapes (specialized to each size)"
            print(f"[fusegrad] {self._name()}: symbolic {said} is not supported here ({why}); "
                  f"{then}", file=sys.stderr)

    def _broken_assumption(self, key, args, kwargs) -> str | None:
        """The recompile reason when a symbolic entry for ``key`` exists whose assumption
        this call breaks (this call then compiles static, for its sizes)."""
        leaves = tree_flatten((args, kwargs))[0]
        for entry in self.cache.get(key, ()):
            if entry.symbolic is not None:
                why = entry.symbolic.failing(leaves)
                if why is not None:
                    return why
        return None

    def _build(self, graph: Graph, args, kwargs, closure: ClosureGuard, name: str,
               symbols=None) -> _Entry:
        """The entry of a traced ``graph``: passes, kernels, program and guards (``name``:
        the function's, for messages)."""
        info = graph.meta
        if symbols:
            _check_symbolic_ready(graph, args, kwargs)
            optimized = run_passes(graph, self.pipeline)
            program = symbolic_entry_program(graph, optimized, self.backend, args, kwargs,
                                             self.donate_argnums,
                                             cuda_graphs=self.mode == "reduce-overhead")
        else:
            optimized = run_passes(graph, program_pipeline(self.pipeline, self.backend))
            program = entry_program(graph, optimized, self.backend, args, kwargs,
                                    self.donate_argnums,
                                    cuda_graphs=self.mode == "reduce-overhead")
        entry = _Entry(graph, optimized, program, info)
        entry.out_dtypes = [o.type.dtype for o in optimized.outputs]
        entry.guard = guard_reads(lambda: _entry_guard(info, closure, self.module), name)
        entry.one_shot = _makes_optimizer_state(info.capture)
        cap = info.capture
        entry.plain_inputs = self.module is None and info.rng_input is None and \
            not info.lifted and not cap.grad_inputs and not cap.scalar_inputs
        return entry

    def _count(self, entry: _Entry, reason: str | None) -> None:
        """Count a compile (``reason``: why it was traced again, or None for the first)."""
        self.compiles += 1
        counters["frames"]["ok"] += 1
        counters["stats"]["unique_graphs"] += 1
        if reason is not None:
            self.recompile_reasons.append(reason)
        if config.debug >= 1:
            kernels = entry.program.kernels() if entry.program is not None else []
            print(f"[fusegrad] compiled {entry.graph.name}: {len(entry.graph.nodes)} nodes, "
                  f"{len(kernels)} kernels, {entry.compile_ms:.1f} ms", file=sys.stderr)
            if reason is not None:
                print(f"[fusegrad] recompile reason: {reason}", file=sys.stderr)

    def lower(self, *args, **kwargs) -> Lowered:
        """Trace and compile for these arguments without running."""
        with self._lock:
            key, leaves, symbols = self._key(args, kwargs)
            entry = self._lookup(key, leaves)
            if entry is None:
                entry, key = self._compile(key, args, kwargs, symbols)
                # Lowering runs nothing: state a trace made (an optimizer's first-step state)
                # is taken back, so the entry's guards send the next call to a trace of its own.
                entry.info.capture.rollback()
                self.cache.setdefault(key, []).append(entry)
        prog = entry.program
        return Lowered(entry.optimized, prog.kernels() if prog else [],
                       prog.llvm_ir if prog else "", prog)

    # ------------------------------------------------------------------ autograd

    def split_programs(self, entry: _Entry, wrt: tuple) -> _SplitPrograms:
        """The forward and backward programs of the min-cut partition of ``entry``'s graph
        for gradients with respect to inputs ``wrt`` (built on first use)."""
        return split_programs(entry, wrt, self.pipeline, self.backend)

    def backward_program(self, entry: _Entry, wrt: tuple, seeded: tuple,
                         sizes: dict | None = None) -> tuple:
        """The VJP of the outputs ``seeded`` (their indices), ``(*inputs, *their cotangents)
        -> grads of inputs[wrt]``: a compiled program (None for other backends), its graph,
        and the inputs of ``wrt`` those outputs reach (the others get no gradient);
        ``sizes``: the symbols' values in this call, for a symbolic entry."""
        if entry.symbolic is None:
            return vjp_program(entry, wrt, seeded, self.pipeline, self.backend)
        # The VJP of a symbolic entry is built at its first backward, its rules comparing
        # sizes again (narrow(0, 4, 1): s0 >= 5), answered at the traced sizes: as the trace
        # answered them where it compared too (the entry's guards hold every call to that),
        # and where it did not (a VJP's s0 != 7), the VJP holds only at the sizes where the
        # answer does; a call at other sizes gets the VJP of its own sizes.
        assumed_key = ("assumed", wrt, seeded)
        if assumed_key not in entry.backward:
            with record_assumptions() as assumed:
                vjp_program(entry, wrt, seeded, self.pipeline, self.backend)
            guarded = {_said(a) for a in entry.symbolic.assumptions}
            entry.backward[assumed_key] = [a for a in assumed if _said(a) not in guarded]
        hit = vjp_program(entry, wrt, seeded, self.pipeline, self.backend)
        new = entry.backward[assumed_key]
        if new and sizes is None:
            raise SymbolicDecisionError(
                f"the backward of {self._name()} assumed {', '.join(map(_said, new))}, which its "
                f"symbolic trace did not (and so does not guard)")
        if any(not COMPARE[op](expr.evaluate(sizes), evaluate_dim(value, sizes))
               for expr, op, value in new):
            g = run_passes(specialize(entry.graph, sizes), vjp_pipeline(wrt, seeded))
            return None, g, hit[2]
        return hit
