"""``fusegrad.compile``: trace on first call, compile to fused kernels, cache by guards.

A call computes a guard key from what the trace depends on: each tensor argument's shape,
dtype, device, layout and requires_grad, the grad mode, the values of static arguments, and
for a module its parameters' types and ``training`` flag; and, for the few tensors whose
values the trace read as host data (a packed sequence's lengths), those values. A miss
traces the function, runs the pass pipeline, partitions the graph into kernels and builds a
runtime program; a hit goes straight to the program. Parameters are graph inputs, so
training a compiled module does not recompile it.

Differentiability: when an input requires grad under grad mode, each differentiable
output gets an autograd node; they feed one node of the call, which runs a compiled VJP
program once (the autodiff pass's reverse graph of the outputs that received a gradient,
dead code removed); with ``create_graph=True`` that reverse graph is replayed eagerly
instead, so higher-order gradients still work.

``fullgraph=False`` (the default, as in torch) runs a function whose tracing fails on
data-dependent Python eagerly, with one warning; ``fullgraph=True`` raises the tracer's
error. ``FUSEGRAD_DEBUG=1`` prints one line per compile, the reason for each recompile and
each eager fallback. A compiled function counts its compiles (``compiled.compiles``) and
keeps the reason of each recompile (``compiled.recompile_reasons``); :data:`counters` counts
over all of them, in the shape of torch's ``torch._dynamo.utils.counters``. As torch's
``recompile_limit``, a function compiles for at most ``fusegrad.config.recompile_limit``
(default 8) signatures; calls with further ones run eagerly, with one warning naming the
guards that kept changing.
"""

from __future__ import annotations

import collections
import copy
import functools
import sys
import threading
import time
import types
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from fusegrad import dtypes, profiling
from fusegrad.autograd.engine import _FREED_MESSAGE, Node, _edge
from fusegrad.autograd.grad_mode import is_grad_enabled
from fusegrad.config import config
from fusegrad.ir.graph import Graph, Value
from fusegrad.ir.rewrite import copy_graph
from fusegrad.ir.symbolic import ConcretizationError, replay
from fusegrad.ops import creation, functional
from fusegrad.ops import primitive as _primitive
from fusegrad.ops import prims as P
from fusegrad.ops.autocast import state_key as autocast_state_key
from fusegrad.passes.attention import fuse_attention
from fusegrad.passes.autodiff import vjp_graph
from fusegrad.passes.dce import dce
from fusegrad.passes.fusion import fuse
from fusegrad.passes.manager import PassManager
from fusegrad.passes.partition import partition_joint
from fusegrad.runtime.cpu import Program
from fusegrad.tensor import HOOK_VERSION, Tensor
from fusegrad.tracer.capture import OptimizerGuard, _root
from fusegrad.tracer.guards import ClosureGuard, ModuleGuard, hashable, module_flags
from fusegrad.tracer.optimized_module import OptimizedModule
from fusegrad.tracer.trace import (
    arg_input_ranges,
    module_state,
    trace_with_state,
    tree_flatten,
    tree_unflatten,
)

__all__ = ["compile", "CompiledFunction", "Lowered", "counters", "RECOMPILE_WARNING_LIMIT"]

RECOMPILE_WARNING_LIMIT = 8        # the default of config.recompile_limit (kept for imports)
DEFAULT_PIPELINE = "simplify,strip-barriers,cse,dce,matmul-layout,overlap-collectives"
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
        from fusegrad.ir.printer import print_graph
        return print_graph(self.graph) + "\n// kernels:\n// " + "\n// ".join(self.kernels)

    def to_dot(self) -> str:
        """Graphviz text of the graph with each kernel drawn as a cluster."""
        from fusegrad.ir.dot import to_dot
        kernels = [k.nodes for k in self.program.kg.kernels] if self.program else None
        return to_dot(self.graph, kernels=kernels)

    def render(self, path: str) -> str:
        """Draw the graph and its kernels to an image (needs graphviz's ``dot``)."""
        from fusegrad.ir.dot import render
        kernels = [k.nodes for k in self.program.kg.kernels] if self.program else None
        return render(self.graph, path, kernels=kernels)


@dataclass
class _Entry:
    graph: Graph                      # traced graph (before passes)
    optimized: Graph
    program: Program | None
    info: Any
    backward: dict = field(default_factory=dict)     # (wrt, seeded) -> (Program, Graph)
    # wrt tuple -> (the inputs of wrt that reach those outputs, [differentiable per output])
    differentiable: dict = field(default_factory=dict)
    compile_ms: float = 0.0
    out_dtypes: list = field(default_factory=list)
    plain_inputs: bool = False                       # graph inputs are exactly the leaves
    fast: Callable | None = None                     # see _fast_call
    guard: Callable | None = None                    # checks what the key does not cover
    lifted_run: tuple | None = field(init=False, default=None)   # see __post_init__
    # The trace made optimizer state (a first step): the program writes those tensors, so it
    # is right only while the optimizer still holds them, and runs once (see _run).
    one_shot: bool = False
    # (id of a program's graph, outputs checked) -> the outputs a call copies
    # (see _outputs_to_copy)
    copies: dict = field(default_factory=dict)

    def __post_init__(self):
        # Where the captured tensors go in the input list: one slice when their indices are
        # a run (the usual case), else None and they are placed one by one.
        indices = [index for _, index in self.info.lifted]
        self.lifted_run = (indices[0], indices[-1] + 1, [t for t, _ in self.info.lifted]) \
            if indices and indices == list(range(indices[0], indices[-1] + 1)) else None


class CompiledFunction:
    """The callable ``fusegrad.compile`` returns."""

    grad_name = "CompiledFunctionBackward"      # the grad_fn name of its outputs

    def __init__(self, fn: Callable, *, backend: str = "llvm", static_argnums=(),
                 static_argnames=(), donate_argnums=(), fullgraph: bool = False,
                 pipeline: str | None = None):
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
                    fullgraph=self.fullgraph, pipeline=self.pipeline)

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

    # ------------------------------------------------------------------ guards

    def _split(self, args, kwargs):
        """Separate static arguments (baked into the trace) from traced ones."""
        static = tuple((i, hashable(args[i])) for i in self.static_argnums if i < len(args))
        static += tuple((k, hashable(kwargs[k])) for k in self.static_argnames if k in kwargs)
        return static

    def _key(self, args, kwargs):
        leaves, tree = tree_flatten((args, kwargs))
        # The default dtype decides the dtype of every float the function creates
        # (fusegrad.zeros(3), fusegrad.rand(...)), so it is part of what the trace saw.
        # The autocast state decides which ops the trace cast (torch guards on it too).
        parts = [is_grad_enabled(), dtypes.get_default_dtype().name, autocast_state_key(),
                 self._split(args, kwargs), _tree_key(tree), _alias_pattern(leaves)]
        for t in leaves:
            d = t._data
            # A leaf that requires grad may not be written in place: leafness is traced too.
            parts.append((d.shape, t._dtype.name, t._requires_grad and (t.grad_fn is None),
                          t._requires_grad, d.flags.c_contiguous))
        if self.module is not None:
            # Every submodule's flag: m[1].eval() turns one Dropout off.
            parts.append(module_flags(self.module))
            for _, t in module_state(self.module):
                parts.append((t._data.shape, t._dtype.name, t._requires_grad))
        return tuple(parts), leaves

    # ------------------------------------------------------------------ compile

    def _compile(self, key, args, kwargs) -> _Entry:
        start = time.perf_counter()
        counters["frames"]["total"] += 1
        # Why this call needs a trace, said before tracing changes what the guards read.
        reason = self._reason(key) if self.cache else None
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        # Non-tensor arguments are baked into the trace (and part of the guard key); what the
        # function reads from its closure and globals is guarded.
        try:
            closure = self._closure_guard(args, kwargs)
        except Exception as e:       # what it reads cannot be guarded: eager, never a crash
            raise _unguardable(name, e) from e
        graph = trace_with_state(self.fn, args, kwargs)
        info = graph.meta
        effect = closure.changed()
        if effect is not None:
            # The function changed a Python value it reads (a counter, a list it appends
            # to) while it was traced: a compiled call runs no Python, so the change would
            # happen once. The trace's changes are undone and the function runs eagerly.
            closure.restore()
            info.capture.rollback()
            raise ConcretizationError(
                f"{name} changes a Python value it reads ({effect}) when it runs; a compiled "
                "call runs no Python, so the change would happen only once, when the function "
                "is traced. Keep such state in tensors, or change it outside the compiled "
                "function")
        try:
            return self._build(key, args, kwargs, graph, closure, start, name, reason)
        except BaseException:
            # A compile that fails leaves nothing behind: no entry (the caller caches only
            # what this returns) and no state its trace made (an optimizer's first-step
            # state), so that a later call starts afresh.
            info.capture.rollback()
            raise

    def _build(self, key, args, kwargs, graph: Graph, closure: ClosureGuard, start: float,
               name: str, reason: str | None) -> _Entry:
        """The entry of a traced ``graph``: passes, kernels and guards (``name``: the
        function's, for messages; ``reason``: why it was traced again, or None)."""
        info = graph.meta
        optimized = PassManager(self.pipeline).run(graph)
        program = None
        if self.backend == "cuda":
            program = self._program(optimized, _symbol(graph.name))
        if self.backend == "llvm":
            leaves, _ = tree_flatten((args, kwargs))
            pairs = []
            if info.capture.did_backward or not (
                    is_grad_enabled() and any(t._requires_grad for t in leaves) or
                    any(t._requires_grad for t, _ in info.lifted)):
                # Outputs may take input buffers: in-place updates (an optimizer step) are
                # then written where they belong, and donated arguments are reused. (Not
                # when a compiled backward may need the inputs as they were.)
                grads = [(gi, out) for leaf, out, in_place in info.capture.grad_writes
                         if in_place for leaf2, gi in info.capture.grad_inputs if leaf2 == leaf]
                pairs = list(info.mutations) + grads + self._donations(graph, args)
            program = Program(fuse(optimized), name=_symbol(graph.name), donate=pairs)
            if config.debug >= 4:
                print(f"[fusegrad] LLVM IR of {graph.name}:\n{program.llvm_ir}", file=sys.stderr)
        entry = _Entry(graph, optimized, program, info)
        entry.out_dtypes = [o.type.dtype for o in optimized.outputs]
        try:
            entry.guard = _entry_guard(info, closure, self.module)
        except Exception as e:      # _compile takes back what the trace did
            raise _unguardable(name, e) from e
        entry.one_shot = _makes_optimizer_state(info.capture)
        cap = info.capture
        entry.plain_inputs = self.module is None and info.rng_input is None and \
            not info.lifted and not cap.grad_inputs and not cap.scalar_inputs
        entry.compile_ms = (time.perf_counter() - start) * 1e3
        self.compiles += 1
        counters["frames"]["ok"] += 1
        counters["stats"]["unique_graphs"] += 1
        if reason is not None:
            self.recompile_reasons.append(reason)
        if config.debug >= 1:
            kernels = program.kernels() if program is not None else []
            print(f"[fusegrad] compiled {graph.name}: {len(graph.nodes)} nodes, "
                  f"{len(kernels)} kernels, {entry.compile_ms:.1f} ms", file=sys.stderr)
            if reason is not None:
                print(f"[fusegrad] recompile reason: {reason}", file=sys.stderr)
        return entry

    def _closure_guard(self, args, kwargs) -> ClosureGuard:
        """What the function reads from its closure and globals, and of the objects among
        its arguments, guarded on each call."""
        statics = _static_values(tree_flatten((args, kwargs))[1])
        if self.module is None:
            return ClosureGuard.of(self.fn, statics)
        return ClosureGuard.of(type(self.fn).forward, [self.fn] + statics)

    def _reason(self, key) -> str:
        """Why a call with ``key`` needs a new trace: the key part that differs from the
        last trace's, or the guard of the last entry for this key that no longer holds."""
        entries = self.cache.get(key)
        if entries and entries[-1].guard is not None:
            return f"{entries[-1].guard.why()} changed"
        return _diff(self._last_key, key) if self._last_key is not None else "a new signature"

    def _recompile_limit(self) -> int:
        return config.recompile_limit

    def _donations(self, graph: Graph, args) -> list[tuple[int, int]]:
        """(input, output) pairs offered by ``donate_argnums``: each donated tensor may give
        its buffer to any output of its type."""
        if not self.donate_argnums:
            return []
        ranges = arg_input_ranges(graph, args)
        outputs = range(graph.meta.n_user_outputs)
        return [(i, j) for n in self.donate_argnums if n < len(args)
                for i in ranges[n] for j in outputs]

    def lower(self, *args, **kwargs) -> Lowered:
        """Trace and compile for these arguments without running."""
        with self._lock:
            key, leaves = self._key(args, kwargs)
            entry = self._lookup(key, leaves)
            if entry is None:
                entry = self._compile(key, args, kwargs)
                # Lowering runs nothing: state a trace made (an optimizer's first-step state)
                # is taken back, so the entry's guards send the next call to a trace of its own.
                entry.info.capture.rollback()
                self.cache.setdefault(key, []).append(entry)
        prog = entry.program
        return Lowered(entry.optimized, prog.kernels() if prog else [],
                       prog.llvm_ir if prog else "", prog)

    # ------------------------------------------------------------------ call

    def __call__(self, *args, **kwargs):
        if profiling.recorder is not None and not self._in_region:
            return self._profiled_call(args, kwargs)
        if _primitive._device_apply is not None and self.backend == "llvm" and \
                self._on_cuda(args, kwargs):
            # Cuda tensors exist and some reach this call: its twin on the cuda backend runs
            # it, with device arrays in and out (the CPU path pays one test until then).
            with self._lock:
                if self._cuda_twin is None:
                    self._cuda_twin = CompiledFunction(
                        self.fn, backend="cuda", static_argnums=self.static_argnums,
                        static_argnames=self.static_argnames, donate_argnums=self.donate_argnums,
                        fullgraph=self.fullgraph, pipeline=self.pipeline)
            return self._cuda_twin(*args, **kwargs)
        # Fast path: positional tensor arguments only, a signature seen before.
        if not kwargs and self._fast_ok:
            try:
                fast = (is_grad_enabled(), dtypes.get_default_dtype(), autocast_state_key()) + tuple(
                    (a._data.shape, a._dtype, a._requires_grad, a.grad_fn is None) for a in args)
            except (AttributeError, RuntimeError):
                fast = None
            if fast is not None and len(args) > 1 and _alias_pattern(args):
                fast = None             # arguments sharing storage: the full path below
            if fast is not None:
                entry = self._fast.get(fast)
                if entry is not None:
                    run = entry.fast
                    if run is not None:
                        # Reads nothing but the arguments: no lock (see _lock).
                        return run(args)
                    with self._lock:
                        if self._holds(entry, args):
                            return self._run(entry, args)
        else:
            fast = None
        leaves, _ = tree_flatten((args, kwargs))
        if any(t._trace is not None for t in leaves):
            # Called inside a trace (another compile or a transform): inline the function.
            return self.fn(*args, **kwargs)
        with self._lock:
            key, leaves = self._key(args, kwargs)
            entry = None if key in self._eager_keys else self._lookup(key, leaves)
            if entry is None and key not in self._eager_keys:
                if self.compiles >= self._recompile_limit():
                    # torch's recompile_limit: past it, new signatures run eagerly.
                    if not self._warned_limit:
                        warnings.warn(_recompile_limit_message(self, key), UserWarning,
                                      stacklevel=2)
                        self._warned_limit = True
                else:
                    try:
                        entry = self._compile(key, args, kwargs)
                    except ConcretizationError as e:
                        if self.fullgraph:
                            raise
                        counters["graph_break"][str(e).split("\n")[0]] += 1
                        if config.debug >= 1:
                            print(f"[fusegrad] running {getattr(self.fn, '__name__', 'fn')} "
                                  f"eagerly: {e}", file=sys.stderr)
                        if not self._warned_eager:
                            warnings.warn(f"fusegrad.compile: running "
                                          f"{getattr(self.fn, '__name__', 'fn')} eagerly: {e}",
                                          UserWarning, stacklevel=2)
                            self._warned_eager = True
                        self._eager_keys.add(key)
                    else:
                        # Only a whole entry is cached: a compile that raises leaves none.
                        self.cache.setdefault(key, []).append(entry)
                        self._last_key = key
            if entry is not None and key[_ALIASES] and _writes_an_argument(entry):
                # f(a, a), or two slices of one tensor, where the function writes one of them
                # in place: the trace took them for separate inputs, and the other would not
                # see the write. Eager sees it. (What the trace did, e.g. an optimizer's
                # first-step state, is taken back first.)
                if entry.info.capture is not None:
                    entry.info.capture.rollback()
                if not self._warned_eager:
                    warnings.warn(f"fusegrad.compile: running "
                                  f"{getattr(self.fn, '__name__', 'fn')} eagerly for arguments "
                                  "that share storage, one of which it writes in place",
                                  UserWarning, stacklevel=2)
                    self._warned_eager = True
                self._eager_keys.add(key)
                entry = None
            if entry is not None:
                if fast is not None and len(leaves) == len(args):
                    # Guarded entries too (a training step's): the guard runs on each fast
                    # call, and when it fails the full lookup finds or compiles the entry
                    # that holds.
                    if entry.guard is None and not (
                            is_grad_enabled() and any(t._requires_grad for t in leaves)):
                        entry.fast = _fast_call(entry)
                    self._fast[fast] = entry
                return self._run(entry, leaves)
        # Outside the lock: the function runs eagerly, as often in parallel as it is called.
        return self.fn(*args, **kwargs)

    def _profiled_call(self, args, kwargs):
        """A call while a profiler records: one range around all of it, named as torch names
        a compiled call's (its self time is what the call spends outside its programs:
        guards, arguments, write-backs; tracing and compiling on a first call)."""
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        self._in_region = True
        try:
            with profiling.Span(profiling.recorder, f"Torch-Compiled Region: {name}"):
                return self(*args, **kwargs)
        finally:
            self._in_region = False

    def _on_cuda(self, args, kwargs) -> bool:
        """Whether a tensor argument, or the module's state, is a cuda tensor."""
        leaves, _ = tree_flatten((args, kwargs))
        if self.module is not None:
            leaves = leaves + [t for _, t in module_state(self.module)]
        return any(t._trace is None and not isinstance(t._data, np.ndarray) for t in leaves)

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
        return entry.guard is None or entry.guard(
            lambda: self._inputs(entry, leaves, read_only=True))

    def _inputs(self, entry: _Entry, leaves, read_only: bool = False) -> list[Tensor]:
        info = entry.info
        if entry.plain_inputs:
            return leaves
        tensors = [t for _, t in module_state(self.module)] if self.module is not None else []
        tensors += list(leaves)
        n = len(entry.graph.inputs)
        full: list = tensors + [None] * (n - len(tensors))
        if info.rng_input is not None:
            gen = creation.default_generator
            # The key for rng_counters counters (4 numbers each), advancing the generator as
            # the traced ops would have.
            full[info.rng_input] = gen.get_state() if read_only else \
                gen.next_key(4 * info.rng_counters)
        if entry.lifted_run is not None:
            start, stop, captured = entry.lifted_run
            full[start:stop] = captured
        else:
            for t, index in info.lifted:
                full[index] = t
        cap = info.capture
        if cap is not None:
            for leaf, index in cap.grad_inputs:
                full[index] = full[leaf]._grad
            for getter, index, np_dtype in cap.scalar_inputs:
                full[index] = Tensor._wrap(np.asarray(_scalar(getter()), dtype=np_dtype),
                                           dtypes.float64)
        return full

    def _run(self, entry: _Entry, leaves):
        info = entry.info
        inputs = self._inputs(entry, leaves)
        if info.capture is not None:
            for leaf in info.capture.grad_drops:
                inputs[leaf]._grad = None
        cap = info.capture
        # A call that autograd records (not a training step, whose gradients were taken
        # inside): the forward runs as the first half of a partitioned program, saving what
        # the backward needs (passes/partition.py).
        wrt = flags = split = residuals = None
        if not (cap is not None and cap.did_backward) and is_grad_enabled() and \
                any(t is not None and t._requires_grad for t in inputs):
            wrt = tuple(i for i, t in enumerate(inputs) if t is not None and t._requires_grad
                        and t.dtype.is_differentiable)
            found = entry.differentiable.get(wrt)
            if found is None:
                flags = _differentiable_outputs(entry.graph, wrt)
                found = entry.differentiable[wrt] = (_reaching(entry.graph, wrt, flags), flags)
            # Only the inputs some differentiable output depends on get a gradient: a
            # parameter the forward does not use keeps .grad None, as in eager.
            wrt, flags = found
            if any(flags) and entry.program is not None:
                split = self.split_programs(entry, wrt)
        arrays = [t._data for t in inputs]
        if split is not None:
            outs = split.forward(*arrays)
            n = split.partition.n_forward_outputs
            results = [Tensor._wrap(a, dt) for a, dt in zip(outs[:n], entry.out_dtypes)]
            residuals = outs[n:]
            copies = _copies(entry, split.forward.graph, n)
        elif entry.program is not None:
            results = _Outputs(entry.program(*arrays), entry.out_dtypes)
            copies = _copies(entry, entry.program.graph, len(results))
        else:
            from fusegrad.autograd.grad_mode import no_grad
            with no_grad():
                results = replay(entry.optimized, [t.detach() for t in inputs])
            copies = _replayed_copies(info, results, arrays)
        for k in copies:
            # An output in an input's buffer, or in another output's: its own copy, taken
            # before the write-backs below change those buffers.
            if isinstance(results, _Outputs):
                results.arrays[k] = results.arrays[k].copy()
            else:
                results[k] = Tensor._wrap(results[k]._data.copy(), results[k]._dtype)
        mutations = info.mutations or ()
        if flags is not None and any(flags):
            # Before the write-back below: the backward needs the inputs as the call saw them.
            saved = _SavedInputs(inputs, {i for i, _ in mutations}, split, residuals)
            saved.outputs = _saved_outputs(results, residuals)
            flagged = tuple(k for k, f in enumerate(flags) if f)
            joint = _CompiledBackward(self, entry, wrt, saved, inputs, flagged)
            for k in flagged:
                results[k].grad_fn = _OutputBackward(joint, k, self.grad_name)
                results[k]._requires_grad = True
        # In-place writes to inputs land in the caller's tensors. A parameter (a leaf that
        # requires grad: an optimizer step) is written as is; any other input is written the
        # way eager in-place ops write, so that its history becomes the compiled backward.
        out_arrays = _output_arrays(results)
        for in_index, out_index in mutations:
            target = inputs[in_index]
            if out_arrays[out_index] is target._data:
                target._version_counter.value += 1      # written in place by the kernel
                continue
            value = results[out_index]
            if not is_grad_enabled() or not value._requires_grad or (
                    target.is_leaf and target._requires_grad):
                # A value without history (a buffer's running statistics, a parameter's
                # update) is copied in; one with history is written as eager would.
                _copy_into(target._data, value._data)
                target._version_counter.value += 1
            else:
                functional.assign_(target, value)
        if cap is not None:
            _write_state(cap, inputs, results)
        if entry.one_shot:
            # Its state tensors are now the optimizer's, and a later call with no state
            # (opt.load_state_dict of a fresh state, state.clear()) must make new ones, as
            # eager does: that call traces again.
            entry.guard, entry.fast = _spent, None
        user = results[:info.n_user_outputs] if len(results) > info.n_user_outputs else results
        if any(info.output_aliases):
            user = _alias_outputs(list(user), info.output_aliases, inputs)
        return tree_unflatten(info.out_tree, user)

    # ------------------------------------------------------------------ autograd

    def split_programs(self, entry: _Entry, wrt: tuple) -> "_SplitPrograms":
        """The forward and backward programs of the min-cut partition of ``entry``'s graph
        for gradients with respect to inputs ``wrt`` (built on first use)."""
        key = ("split", wrt)
        hit = entry.backward.get(key)
        if hit is None:
            info = entry.info
            # Parameters and captured tensors stay alive anyway: saving them costs nothing.
            free = list(range(info.n_state)) + [i for _, i in info.lifted]
            # Attention chains fuse before the graph is differentiated, as in a traced
            # backward() (passes/attention.py); on a copy: the entry's graph stays as it is.
            graph = copy_graph(entry.graph)
            if not fuse_attention(graph):
                graph = entry.graph
            part = partition_joint(graph, wrt=list(wrt), free_inputs=free)
            name = _symbol(entry.graph.name)
            hit = entry.backward[key] = _SplitPrograms(
                part, self._program(PassManager(self.pipeline).run(part.forward), name + "_fwd"),
                self._program(PassManager(self.pipeline).run(part.backward), name + "_bwd"))
        return hit

    def backward_program(self, entry: _Entry, wrt: tuple, seeded: tuple) -> tuple:
        """The VJP of the outputs ``seeded`` (their indices), ``(*inputs, *their cotangents)
        -> grads of inputs[wrt]``: a compiled program (None for other backends), its graph,
        and the inputs of ``wrt`` those outputs reach (the others get no gradient)."""
        hit = entry.backward.get((wrt, seeded))
        if hit is None:
            # Only the outputs that received a gradient are seeded: a zero cotangent for the
            # others would go down their paths, where 0 * inf is NaN, and eager autograd
            # never visits a path without a gradient.
            forward = copy.copy(entry.graph)
            forward.set_outputs([entry.graph.outputs[k] for k in seeded])
            g = vjp_graph(forward, list(wrt), name=f"{entry.graph.name}_backward")
            g.set_outputs(g.outputs[len(seeded):])
            g = dce(g)
            program = self._program(PassManager(self.pipeline).run(g), _symbol(g.name)) \
                if self.backend in ("llvm", "cuda") else None
            reached = _reaching(entry.graph, wrt,
                                [k in seeded for k in range(len(entry.graph.outputs))])
            hit = entry.backward[(wrt, seeded)] = (program, g, frozenset(reached))
        return hit

    def _program(self, graph: Graph, name: str):
        """A program of ``graph`` (already through the pipeline) for this backend: LLVM
        kernels on the CPU, or CUDA kernels (numpy arrays in and out, copied to and from
        the device; the import happens only here, when CUDA is asked for)."""
        if self.backend == "cuda":
            from fusegrad.runtime.cuda import HostCudaProgram
            return HostCudaProgram(fuse(graph), name=name)
        return Program(fuse(graph), name=name)


def _fast_call(entry: _Entry) -> Callable | None:
    """The whole call for an entry with nothing to do around its program: inputs are the
    arguments, no autograd, no write-backs, outputs are the program's buffers."""
    info = entry.info
    if entry.program is None or not entry.plain_inputs or info.mutations or config.debug >= 2 \
            or (info.capture is not None and info.capture.attribute_writes) or \
            any(info.output_aliases) or \
            _copies(entry, entry.program.graph, len(entry.program.graph.outputs)):
        return None
    run = entry.program.fast_runner()
    if run is None:
        return None
    dtypes_ = entry.out_dtypes
    wrap = Tensor._wrap
    tree = info.out_tree
    if tree.kind == "leaf":
        dt = dtypes_[0]
        return lambda args: wrap(run([a._data for a in args])[0], dt)
    return lambda args: tree_unflatten(
        tree, [wrap(o, d) for o, d in zip(run([a._data for a in args]), dtypes_)])


@dataclass
class _SplitPrograms:
    partition: Any            # passes.partition.Partition
    forward: Program
    backward: Program


class _SavedInputs:
    """What a compiled call keeps for its backward: its inputs with their versions (the
    tensors themselves, so a ``create_graph`` backward stays connected to them) and, when the
    forward ran as a partition's first half, the residuals it saved."""

    def __init__(self, inputs: list, mutated: set[int] = frozenset(),
                 split: "_SplitPrograms | None" = None, residuals: list | None = None):
        # An input the call writes in place is kept as a copy of its values before the
        # write: the VJP program computes from what the forward read.
        self.tensors = [Tensor._wrap(t._data.copy(), t._dtype) if i in mutated and t is not None
                        else t for i, t in enumerate(inputs)]
        self.versions = [t._version_counter.value if t is not None else 0 for t in self.tensors]
        self.freed = False
        self.split = split
        self.residuals = residuals
        self.outputs: list = []         # (output, its version): those saved as residuals

    def backward_arrays(self) -> list:
        """The partition's saved values, in the backward program's input order."""
        # The forward's outputs after its own are every saved value, inputs passed through
        # included; an input is read from the kept tensor (a copy if the call wrote it).
        return [self.tensors[s.input_index]._data if s.kind == "input" else self.residuals[k]
                for k, s in enumerate(self.split.partition.saved)]

    def unpack(self, name: str) -> list:
        if self.freed:
            raise RuntimeError(_FREED_MESSAGE)
        for t, v in list(zip(self.tensors, self.versions)) + self.outputs:
            if t is not None and t._version_counter.value != v:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified by "
                    f"an inplace operation: [{t._type_string()} {list(t.shape)}] is at version "
                    f"{t._version_counter.value}; expected version {v} instead (saved by {name})")
        return self.tensors


def _saved_outputs(results, residuals) -> list:
    """The outputs whose buffers the backward reads as saved values (softmax's output), with
    their versions: written in place before the backward, they raise, as torch's saved
    outputs do (the gradient was computed from the written values, silently)."""
    if not residuals:
        return []
    saved = {id(r) for r in residuals} | {id(r.base) for r in residuals if r.base is not None}
    return [(t, t._version_counter.value) for t in results if id(t._data) in saved]


class _OutputGrads(dict):
    """Gradients of some outputs of one compiled call, by output index; the engine adds what
    the outputs' nodes pass on, so the call's node receives all of them together."""

    def __add__(self, other: "_OutputGrads") -> "_OutputGrads":
        total = _OutputGrads(self)
        for k, g in other.items():
            total[k] = total[k] + g if k in total else g
        return total


class _OutputBackward(Node):
    """The grad_fn of output ``k`` of a compiled call: passes its gradient on to the call's
    :class:`_CompiledBackward`, which the engine runs after every output's node (as torch
    runs one node with several outputs)."""

    __slots__ = ("k", "freed")

    def __init__(self, joint: "_CompiledBackward", k: int,
                 name: str = "CompiledFunctionBackward"):
        super().__init__(((joint, 0),), name)
        self.k, self.freed = k, False

    def apply(self, grad, create_graph, retain_graph):
        if self.freed:
            raise RuntimeError(_FREED_MESSAGE)
        return (_OutputGrads({self.k: grad}),)

    def release(self) -> None:
        # A second backward through this output raises, as for any freed node; the call's
        # node stays usable for its other outputs (it holds the saved inputs until they die).
        self.freed = True


class _CompiledBackward(Node):
    """Backward of a compiled call: runs the compiled VJP of the outputs that received a
    gradient, seeded with those gradients."""

    __slots__ = ("cf", "entry", "wrt", "saved", "flagged")

    def __init__(self, cf: CompiledFunction, entry: _Entry, wrt: tuple, saved: _SavedInputs,
                 inputs: list, flagged: tuple = ()):
        super().__init__(tuple(_edge(inputs[i]) for i in wrt), "CompiledFunctionBackward")
        self.cf, self.entry, self.wrt, self.saved = cf, entry, wrt, saved
        self.flagged = flagged          # the outputs that carry gradients, in order

    def apply(self, grad: _OutputGrads, create_graph, retain_graph):
        inputs = self.saved.unpack(self._name)
        seeded = tuple(sorted(grad))
        split = self.saved.split
        if split is not None and not create_graph and seeded == self.flagged:
            # Every output that can carry a gradient got one: the partition's backward, from
            # the residuals the forward saved. (Others get zero cotangents there; they carry
            # no gradient to the inputs.)
            outs = self.entry.graph.outputs
            cts = [grad[i] if i in grad else _zeros(o.type) for i, o in enumerate(outs)]
            arrays = self.saved.backward_arrays() + [c._data for c in cts]
            return tuple(Tensor._wrap(a, dtypes.from_numpy_dtype(a.dtype))
                         for a in split.backward(*arrays))
        # Some outputs got no gradient (a zero cotangent down their paths could meet 0 * inf),
        # create_graph (the backward is recorded), or the interpreter backend: the VJP of the
        # seeded outputs, recomputing the forward from the inputs.
        program, g, reached = self.cf.backward_program(self.entry, self.wrt, seeded)
        cts = [grad[k] for k in seeded]
        if create_graph or program is None:
            grads = replay(g, list(inputs) + cts)
        else:
            arrays = [t._data for t in inputs] + [c._data for c in cts]
            grads = [Tensor._wrap(a, dtypes.from_numpy_dtype(a.dtype)) for a in program(*arrays)]
        # An input only the outputs without a gradient depend on gets none, not zeros (as
        # eager: its .grad stays None, and an optimizer skips it rather than stepping it)
        return tuple(gi if i in reached else None for i, gi in zip(self.wrt, grads))


class _Outputs(list):
    """A program's outputs as tensors, each wrapped when first read: a training step returns
    every parameter, gradient and optimizer state it updates, most of them written in place
    and never read as tensors."""

    def __init__(self, arrays: list, out_dtypes: list):
        super().__init__([None] * len(arrays))
        self.arrays, self.out_dtypes = arrays, out_dtypes

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        t = list.__getitem__(self, k)
        if t is None:
            t = Tensor._wrap(self.arrays[k], self.out_dtypes[k])
            list.__setitem__(self, k, t)
        return t

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _outputs_to_copy(graph: Graph, info, n: int) -> tuple[int, ...]:
    """The outputs among the first ``n`` of ``graph`` (a program of a traced call; a
    partition's forward saves more after those) that a call must copy: each
    that is an input's own buffer (a value the passes reduced to an input, ``x * 1``), but
    an input's in-place update of itself; and each user output in the buffer of an earlier
    one (``(x * 2, x * 2)`` after CSE). Not the outputs the function returned as an input or
    a view (``TraceInfo.output_aliases``): those are made from the input after the call."""
    position = {v: i for i, v in enumerate(graph.inputs)}
    aliases = info.output_aliases
    mutations = set(info.mutations or ())
    seen: set = set()
    out = []
    for k, o in enumerate(graph.outputs[:n]):
        if not isinstance(o, Value) or (k < len(aliases) and aliases[k] is not None):
            continue
        i = position.get(o)
        if i is not None:
            if (i, k) not in mutations:
                out.append(k)
        elif k < info.n_user_outputs:
            if o in seen:
                out.append(k)
            seen.add(o)
    return tuple(out)


def _copies(entry: _Entry, graph: Graph, n: int) -> tuple[int, ...]:
    hit = entry.copies.get((id(graph), n))
    if hit is None:
        hit = entry.copies[id(graph), n] = _outputs_to_copy(graph, entry.info, n)
    return hit


def _replayed_copies(info, results: list, arrays: list) -> list[int]:
    """:func:`_outputs_to_copy` for the results of an interpreted graph, by their memory."""
    aliases, mutations = info.output_aliases, set(info.mutations or ())
    out = []
    for k, r in enumerate(results):
        if k < len(aliases) and aliases[k] is not None:
            continue
        shared = [i for i, a in enumerate(arrays) if np.may_share_memory(r._data, a)]
        if any((i, k) not in mutations for i in shared) or any(
                np.may_share_memory(r._data, results[j]._data) for j in range(k)
                if k < info.n_user_outputs):
            out.append(k)
    return out


def _alias_outputs(user: list, aliases: list, inputs: list) -> list:
    """The outputs that the function returned as an input or an earlier output, or a view
    of one, made so from that tensor (after the call's in-place writes), as eager returns
    them: ``f(x) is x``, and ``f(x)[0] = 1`` writes into x."""
    from fusegrad.ops.movement import _view_prim
    for k, alias in enumerate(aliases):
        if alias is None:
            continue
        source, index, view_ops = alias
        t = inputs[index] if source == "input" else user[index]
        for prim, attrs in view_ops:
            t = t.detach() if prim is P.stop_gradient else \
                _view_prim(prim, t, **attrs)
        user[k] = t
    return user


def _output_arrays(results) -> list:
    """The outputs' arrays, without wrapping them as tensors."""
    return results.arrays if isinstance(results, _Outputs) else [r._data for r in results]


def _differentiable_outputs(graph: Graph, wrt: tuple) -> list[bool]:
    """Which outputs of ``graph`` depend on the inputs ``wrt`` through operands that have a
    VJP rule: not the results of comparisons, argmax or stop_gradient (detach), which eager
    autograd gives ``requires_grad=False``, as it does integer results, and so not what is
    computed from an integer result either (a float cast back from an int cast)."""
    live = {graph.inputs[i] for i in wrt}
    for node in graph.nodes:
        if node.output.type.dtype.is_differentiable and any(
                isinstance(op, Value) and op in live and node.prim.rule(j) is not None
                for j, op in enumerate(node.inputs)):
            live.add(node.output)
    return [isinstance(o, Value) and o in live and o.type.dtype.is_differentiable
            for o in graph.outputs]


def _hook_key(t: Tensor):
    """The gradient hooks of a captured tensor, compared by identity (None: none)."""
    hooks, post = t._hooks, t._post_accumulate_grad_hooks
    return (tuple(hooks) if hooks else None, tuple(post) if post else None) \
        if hooks or post else None


def _spent(get_inputs=None) -> bool:
    """The guard of a one-shot entry once it ran: it never holds again."""
    return False


_spent.why = lambda get_inputs=None: \
    "an optimizer's state (made by the first step, whose program runs once)"


def _unguardable(name: str, error: Exception) -> ConcretizationError:
    """The error that sends a call to eager (or, with fullgraph=True, to the user) when what
    the function reads cannot be guarded."""
    return ConcretizationError(
        f"fusegrad.compile cannot guard what {name} reads from its globals, closure or "
        f"objects ({type(error).__name__}: {error}); it runs eagerly")


def _makes_optimizer_state(cap) -> bool:
    """Whether a trace made tensors that its optimizers keep as state."""
    if cap is None or not cap.internal_writes or not cap.optimizers:
        return False
    made = {id(t) for t, _ in cap.internal_writes}
    return any(id(v) in made for opt in cap.optimizers for st in opt.state.values()
               for v in (st.values() if isinstance(st, dict) else ()))


def _alias_pattern(tensors) -> tuple:
    """For tensors of which some share storage (``f(a, a)``, two slices of one tensor): per
    tensor, the position of the first one sharing its storage; () when none do."""
    if len(tensors) < 2:
        return ()
    roots = [id(_root(t._data)) for t in tensors]
    if len(set(roots)) == len(roots):
        return ()
    first: dict[int, int] = {}
    return tuple(first.setdefault(r, i) for i, r in enumerate(roots))


def _writes_an_argument(entry: "_Entry") -> bool:
    """Whether ``entry``'s function writes one of its tensor arguments in place."""
    info = entry.info
    return any(i >= info.n_state for i, _ in info.mutations or ())


def _reaching(graph: Graph, wrt: tuple, flags: list[bool]) -> tuple:
    """The inputs of ``wrt`` that the outputs ``flags`` marks depend on through operands with
    a VJP rule (the others get no gradient from this call, not a zero one)."""
    need = {o for o, f in zip(graph.outputs, flags) if f}
    for node in reversed(graph.nodes):
        if node.output in need:
            need.update(op for j, op in enumerate(node.inputs)
                        if isinstance(op, Value) and node.prim.rule(j) is not None)
    return tuple(i for i in wrt if graph.inputs[i] in need)


def _copy_into(dst, src) -> None:
    """Write ``src``'s values into the storage ``dst`` (host arrays, or device arrays of cuda
    tensors)."""
    if isinstance(dst, np.ndarray) and isinstance(src, np.ndarray):
        np.copyto(dst, src)
    else:
        from fusegrad.runtime.eager_cuda import copy_into
        copy_into(dst, src)


def _write_state(cap, inputs: list, results: list) -> None:
    """After a call: ``.grad`` slots and tensors made while tracing get their new values."""
    arrays = _output_arrays(results)
    for leaf in cap.grad_clears:
        inputs[leaf]._grad = None
    taken: set[int] = set()         # arrays given to a .grad this call: each .grad owns one
    for leaf, out, in_place in cap.grad_writes:
        target = inputs[leaf]
        old = target._grad
        if in_place and old is not None:
            value = arrays[out]
            if value is not old._data:
                _copy_into(old._data, value)
            old._version_counter.value += 1
        else:
            if not target.is_leaf:
                raise RuntimeError("a compiled function's backward() reached a tensor that is "
                                   "not a leaf at this call; its gradient cannot be written")
            grad = results[out]
            if id(grad._data) in taken:
                grad = Tensor._wrap(grad._data.copy(), grad._dtype)
            taken.add(id(grad._data))
            target._grad = grad
    for t, out in cap.internal_writes:
        _copy_into(t._data, arrays[out])
        t._version_counter.value += 1
    for holder, name, out in cap.attribute_writes:
        holder[name] = results[out]            # self.weights = att: this call's tensor


def _entry_guard(info, closure: ClosureGuard, module) -> Callable | None:
    """What an entry depends on beyond the key: captured names, the modules the trace called
    (and those among the names, and a compiled module), .grad slots present or not,
    optimizer state, the shapes, dtypes and ``requires_grad`` of captured tensors, the values
    of the tensors the trace read as host data (``host_values``). None when nothing.

    The guard runs at every call of a training step, over every parameter and optimizer
    state: its checks are list comparisons, not a loop of Python statements per tensor."""
    cap = info.capture
    grad_guards = cap.grad_guards
    closure.add_modules(closure.modules + cap.modules + ([module] if module is not None
                                                         else []))
    written = frozenset((id(holder), name) for holder, name, _ in cap.attribute_writes)
    closure.forget(written)
    modules = ModuleGuard(closure.modules + cap.modules + ([module] if module is not None
                                                            else []), written)
    value_guards = cap.value_guards
    if closure.empty and modules.empty and not info.lifted and not grad_guards and \
            not cap.optimizers and not value_guards:
        return None
    lifted = tuple(t for t, _ in info.lifted)
    # Freezing a parameter (requires_grad_(False)) takes it out of backward and the update;
    # its gradient hooks are traced into the backward (compared when any hook changed).
    lifted_sig = [(t._data.shape, t._dtype, t._requires_grad) for t in lifted]
    lifted_hooks = [_hook_key(t) for t in lifted]
    hooks_seen = [HOOK_VERSION[0]]

    def lifted_hold() -> bool:
        if [(t._data.shape, t._dtype, t._requires_grad) for t in lifted] != lifted_sig:
            return False
        if HOOK_VERSION[0] != hooks_seen[0]:
            if [_hook_key(t) for t in lifted] != lifted_hooks:
                return False
            hooks_seen[0] = HOOK_VERSION[0]
        return True
    optimizers = [OptimizerGuard(o, sig) for o, sig in zip(cap.optimizers,
                                                            cap.optimizer_signatures)]
    # The leaves whose .grad is guarded, where they are captured tensors: read directly,
    # without building the call's whole input list.
    captured = {index: t for t, index in info.lifted}
    direct = tuple(captured[leaf] for leaf, _ in grad_guards) \
        if all(leaf in captured for leaf, _ in grad_guards) else None
    grad_sigs = [None if sig is None else (tuple(sig[0]), sig[1]) for _, sig in grad_guards]

    grads_changed = "which parameters have a .grad (or its shape or dtype)"
    values_changed = "the values of a tensor the function read as host data (a packed " \
        "sequence's lengths or batch sizes)"

    def failing(get_inputs: Callable[[], list] | None = None) -> str | None:
        """What no longer holds, in words (for the recompile messages); None if all holds.
        Without ``get_inputs`` the .grad slots of arguments are not read, and are named as
        what changed when everything else holds."""
        changed = closure.changed()
        if changed is not None:
            return changed
        if not modules.holds():
            return "a module's attributes, parameters, buffers, submodules or hooks"
        if not lifted_hold():
            return "the shape, dtype, requires_grad or hooks of a captured tensor"
        leaves = direct
        inputs = get_inputs() if get_inputs is not None and (
            leaves is None or value_guards) else None
        if leaves is None and inputs is not None:
            leaves = [inputs[leaf] for leaf, _ in grad_guards]
        if leaves is not None and [None if t._grad is None else
                                   (t._grad._data.shape, t._grad._dtype) for t in leaves] \
                != grad_sigs:
            return grads_changed
        if not all(o.holds() for o in optimizers):
            return "an optimizer's state or hyperparameters"
        if value_guards and (inputs is None or not all(
                np.array_equal(inputs[i]._host(), a) for i, a in value_guards)):
            return values_changed
        return grads_changed if leaves is None else None

    def guard(get_inputs: Callable[[], list]) -> bool:
        return failing(get_inputs) is None
    guard.why = failing
    return guard


def _scalar(v) -> float:
    if isinstance(v, Tensor):
        return float(v._data)
    return float(v)


def _zeros(t) -> Tensor:
    return Tensor._wrap(np.zeros(t.shape, dtype=t.dtype.np_dtype), t.dtype)


def _symbol(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name) or "graph"



def _static_values(tree) -> list:
    """The non-tensor values in an argument tree."""
    if tree.kind == "static":
        return [tree.meta]
    return [v for c in tree.children for v in _static_values(c)]


def _tree_key(tree) -> Any:
    if tree.kind == "static":
        return ("static", hashable(tree.meta) if not isinstance(tree.meta, Tensor) else None)
    return (tree.kind, tuple(_tree_key(c) for c in tree.children),
            tree.meta if tree.kind == "dict" else None)


# The parts of CompiledFunction._key before one part per tensor argument.
_KEY_PARTS = ("grad mode", "default dtype", "autocast", "static arguments", "argument structure",
              "arguments sharing storage")
_ALIASES = _KEY_PARTS.index("arguments sharing storage")


def _changed_guards(keys: list) -> list[str]:
    """Which parts of the guard keys ``keys`` (see ``CompiledFunction._key``) differ."""
    names = _KEY_PARTS
    fields = ("shape", "dtype", "leafness", "requires_grad", "memory layout")
    changed = []
    for i in range(max(len(k) for k in keys)):
        parts = [k[i] if i < len(k) else None for k in keys]
        if len(set(parts)) < 2:
            continue
        if i < len(names):
            changed.append(names[i])
        elif all(isinstance(p, tuple) and len(p) == len(fields) for p in parts):
            changed += [f"the {f} of tensor argument {i - len(names)}"
                        for j, f in enumerate(fields) if len({p[j] for p in parts}) > 1]
        else:
            changed.append("the arguments or module state (parameters, training flag)")
    return list(dict.fromkeys(changed)) or ["a new signature"]


def _recompile_limit_message(cf: "CompiledFunction", key) -> str:
    """The warning for a call past ``config.recompile_limit``: what kept changing and what
    to do about it."""
    name = getattr(cf.fn, "__name__", type(cf.fn).__name__)
    keys = list(cf.cache) + [key]
    last = cf._reason(key)
    changed = ', '.join(_changed_guards(keys)) if key not in cf.cache else \
        "what the function reads from its closure, globals, modules or objects, or the " \
        "values of tensors it reads as host data"
    return (f"fusegrad.compile: {name} hit the recompile limit (fusegrad.config.recompile_limit"
            f" = {config.recompile_limit}): it was compiled for {cf.compiles} different "
            f"signatures and this call needs another; the guards that kept changing: "
            f"{changed} (last: {last}). Calls with new signatures now "
            "run eagerly; signatures compiled so far still run compiled. Raise the limit with "
            "fusegrad.config.recompile_limit = N (or FUSEGRAD_RECOMPILE_LIMIT=N), or keep those "
            "guards fixed (e.g. pad inputs to a few shapes).")


def _diff(old, new) -> str:
    names = _KEY_PARTS
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            what = names[i] if i < len(names) else f"tensor {i - len(names)} (shape, dtype, " \
                                                    "requires_grad, layout)"
            return f"{what} changed: {a} -> {b}"
    return "a new signature"


TORCH_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile(fn: Callable | None = None, *, backend: str = "llvm", static_argnums=(),  # noqa: A001
            static_argnames=(), donate_argnums=(), fullgraph: bool = False,
            pipeline: str | None = None, dynamic: bool | None = None, mode: str | None = None,
            options: dict | None = None, disable: bool = False):
    """Compile ``fn`` (a function or an ``nn.Module``) to fused kernels.

    Usable as ``@fusegrad.compile``, ``@fusegrad.compile(fullgraph=True)`` or
    ``fusegrad.compile(model)``, which returns an ``OptimizedModule`` as torch's does (the
    model is its ``_orig_mod``; state-dict keys carry the ``_orig_mod.`` prefix). A whole
    training step compiles to one graph:
    ``opt.zero_grad(); loss.backward(); opt.step()`` inside the function are captured, and
    parameters, ``.grad`` and optimizer state are updated in place after each call.

    Options: ``backend`` ("llvm", "cuda" for CUDA kernels on the GPU, with numpy arrays
    copied in and out, or "interpreter" to run the graph on numpy; torch's
    "inductor" means "llvm"), ``static_argnums``/``static_argnames`` (Python values baked into
    the trace), ``donate_argnums`` (outputs may reuse those inputs' buffers), ``fullgraph``
    (raise instead of running eagerly what cannot be traced), ``pipeline`` (the passes before
    fusion). torch.compile's ``mode`` names are accepted (there is one mode: each call runs
    the fused kernels with no per-call compilation); ``dynamic=True`` (symbolic shapes) is not
    supported and raises; ``disable=True`` returns ``fn`` unchanged; ``options`` has no keys
    that fusegrad reads, so any key raises.

    Recompiles: a compiled entry is reused while the arguments' shapes, dtypes and flags and
    what the function reads (the globals and closure variables its code loads, the attributes
    and items it reads of them, the modules and optimizers it calls) are as they were. The
    compiled function counts its compiles in ``compiles`` and keeps why each recompile
    happened in ``recompile_reasons``; ``FUSEGRAD_DEBUG=1`` prints each reason, and
    ``fusegrad._dynamo.utils.counters`` counts over all functions, as torch's does.
    """
    if mode not in TORCH_MODES:
        raise RuntimeError(f"Unrecognized mode={mode}, should be one of: "
                           f"{', '.join(m for m in TORCH_MODES if m)}")
    if mode is not None and options is not None:
        raise RuntimeError("Either mode or options can be specified, but both can't be "
                           "specified at the same time.")
    if options:
        raise RuntimeError(f"fusegrad.compile: unsupported options {sorted(options)}: fusegrad "
                           "has no such settings (see the docstring for what it supports)")
    if dynamic:
        raise NotImplementedError("fusegrad.compile(dynamic=True): symbolic shapes are not "
                                  "supported yet; each new input shape compiles once (guarded "
                                  "by shape), so leave dynamic unset or False")
    if disable:
        return fn if fn is not None else (lambda f: f)

    def wrap(f):
        compiled = CompiledFunction(f, backend=backend, static_argnums=static_argnums,
                                    static_argnames=static_argnames,
                                    donate_argnums=donate_argnums, fullgraph=fullgraph,
                                    pipeline=pipeline)
        if compiled.module is None:
            return compiled
        return OptimizedModule(f, compiled)
    return wrap if fn is None else wrap(fn)
