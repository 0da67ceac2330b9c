"""The call cache of a compiled function: guard keys, entries and the guards they hold under.

A call's key (:func:`call_key`) holds what every trace depends on: the grad mode, the default
dtype, the autocast state, the static arguments' values, the argument structure, which
arguments share storage, each tensor argument's shape, dtype, leafness, ``requires_grad``
and layout, and for a module its flags and its state's shapes and dtypes. Under one key the
function keeps a list of :class:`_Entry` (newest last), each with a guard
(:func:`_entry_guard`) of what the key does not cover: what the function reads from its
closure, globals, modules and optimizers, and the values of tensors it read as host data.

When a call needs a new trace, :func:`_diff` and the guards' ``why`` say which part changed
(the recompile reason); past the recompile limit, :func:`_recompile_limit_message` names the
guards that kept changing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import is_grad_enabled
from fusegrad.config import config
from fusegrad.ir.graph import Graph
from fusegrad.ops.autocast import state_key as autocast_state_key
from fusegrad.runtime.cpu import Program
from fusegrad.tensor import HOOK_VERSION, Tensor
from fusegrad.tracer.capture import OptimizerGuard, _root
from fusegrad.tracer.guards import ClosureGuard, ModuleGuard, hashable, module_flags
from fusegrad.tracer.trace import module_state, tree_flatten

__all__ = ["call_key", "fast_key", "static_key", "recompile_reason"]


@dataclass
class _Entry:
    """One compiled signature of a function: its traced graph, the graph after the passes,
    the program, and what its calls and their backwards build and reuse."""

    graph: Graph                      # traced graph (before passes)
    optimized: Graph
    program: Program | None
    info: Any
    # ("split", wrt) -> _SplitPrograms; (wrt, seeded) -> (VJP program, its graph, reached)
    backward: dict = field(default_factory=dict)
    # wrt tuple -> (the inputs of wrt that reach those outputs, [differentiable per output])
    differentiable: dict = field(default_factory=dict)
    compile_ms: float = 0.0
    out_dtypes: list = field(default_factory=list)
    plain_inputs: bool = False                       # graph inputs are exactly the leaves
    fast: Callable | None = None                     # see _fast_call
    guard: Callable | None = None                    # checks what the key does not cover
    lifted_runs: tuple = field(init=False, default=())     # see __post_init__
    # The trace made optimizer state (a first step): the program writes those tensors, so it
    # is right only while the optimizer still holds them, and runs once (see _run).
    one_shot: bool = False
    # (id of a program's graph, outputs checked) -> the outputs a call copies
    # (see _outputs_to_copy)
    copies: dict = field(default_factory=dict)
    # Traced with symbolic dims: their symbols and what the trace assumed of them
    # (a tracer.dynamic_shapes.SymbolicSignature); None for a static entry.
    symbolic: Any = None

    def __post_init__(self):
        # Where the captured tensors go in the input list: a slice per run of consecutive
        # indices. A training step's are a few runs (the scalars its optimizer reads, the
        # learning rate, are inputs among them): a call places the 122 captured tensors of
        # a small transformer's AdamW step with two slice assignments, not 122 stores.
        self.lifted_runs = _index_runs(self.info.lifted)



def _index_runs(placed) -> tuple[tuple[int, int, list], ...]:
    """``placed``, (item, index) pairs, as (start, stop, items) runs of consecutive indices,
    in order: ``full[start:stop] = items`` for each places every item at its index."""
    runs: list[tuple[int, int, list]] = []
    for item, index in placed:
        if runs and runs[-1][1] == index:
            start, _, items = runs[-1]
            items.append(item)
            runs[-1] = (start, index + 1, items)
        else:
            runs.append((index, index + 1, [item]))
    return tuple(runs)


@dataclass
class _SplitPrograms:
    """The forward and backward programs of an entry's min-cut partition (in its
    ``backward`` table under ``("split", wrt)``)."""

    partition: Any            # passes.partition.Partition
    forward: Program
    backward: Program


def static_key(args, kwargs, static_argnums: tuple, static_argnames: tuple) -> tuple:
    """The static arguments (baked into the trace) as a part of the key."""
    static = tuple((i, hashable(args[i])) for i in static_argnums if i < len(args))
    static += tuple((k, hashable(kwargs[k])) for k in static_argnames if k in kwargs)
    return static


def call_key(args, kwargs, static: tuple, module) -> tuple[tuple, list]:
    """The guard key of a call (see the module docstring) and its tensor arguments."""
    leaves, tree = tree_flatten((args, kwargs))
    # The default dtype decides the dtype of every float the function creates
    # (fusegrad.zeros(3), fusegrad.rand(...)), so it is part of what the trace saw.
    # The autocast state decides which ops the trace cast (torch guards on it too).
    parts = [is_grad_enabled(), dtypes.get_default_dtype().name, autocast_state_key(),
             static, _tree_key(tree), _alias_pattern(leaves)]
    for t in leaves:
        d = t._data
        # A leaf that requires grad may not be written in place: leafness is traced too.
        parts.append((d.shape, t._dtype.name, t._requires_grad and (t.grad_fn is None),
                      t._requires_grad, d.flags.c_contiguous))
    if module is not None:
        # Every submodule's flag: m[1].eval() turns one Dropout off.
        parts.append(module_flags(module))
        for _, t in module_state(module):
            parts.append((t._data.shape, t._dtype.name, t._requires_grad))
    return tuple(parts), leaves


def fast_key(args: tuple) -> tuple | None:
    """The key of the fast path, for positional tensor arguments only: None for other
    arguments, or tensors that share storage (the full path handles those)."""
    try:
        fast = (is_grad_enabled(), dtypes.get_default_dtype(), autocast_state_key()) + tuple(
            (a._data.shape, a._dtype, a._requires_grad, a.grad_fn is None) for a in args)
    except (AttributeError, RuntimeError):
        return None
    if len(args) > 1 and _alias_pattern(args):
        return None
    return fast


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


# The parts of call_key before one part per tensor argument.
_KEY_PARTS = ("grad mode", "default dtype", "autocast", "static arguments", "argument structure",
              "arguments sharing storage")
_ALIASES = _KEY_PARTS.index("arguments sharing storage")


def _changed_guards(keys: list) -> list[str]:
    """Which parts of the guard keys ``keys`` (see :func:`call_key`) differ."""
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


def recompile_reason(cache: dict, last_key, key) -> str:
    """Why a call with ``key`` needs a new trace: the key part that differs from the last
    trace's (``last_key``), or the guard of the last entry in ``cache`` for this key that no
    longer holds."""
    entries = cache.get(key)
    if entries and entries[-1].guard is not None:
        return f"{entries[-1].guard.why()} changed"
    return _diff(last_key, key) if last_key is not None else "a new signature"


def _recompile_limit_message(name: str, cache: dict, last_key, key, compiles: int) -> str:
    """The warning for a call past ``config.recompile_limit``: what kept changing and what
    to do about it."""
    keys = list(cache) + [key]
    last = recompile_reason(cache, last_key, key)
    changed = ', '.join(_changed_guards(keys)) if key not in cache else \
        "what the function reads from its closure, globals, modules or objects, or the " \
        "values of tensors it reads as host data"
    return (f"fusegrad.compile: {name} hit the recompile limit (fusegrad.config.recompile_limit"
            f" = {config.recompile_limit}): it was compiled for {compiles} different "
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
            return f"{what} changed: {a} -> {b}{_zero_one_note(a, b)}"
    return "a new signature"


def _zero_one_note(old, new) -> str:
    """What a tensor's key change means when a symbolic dim got a size of 0 or 1."""
    if not (isinstance(old, tuple) and isinstance(new, tuple) and old and new
            and isinstance(old[0], tuple) and isinstance(new[0], tuple)
            and len(old[0]) == len(new[0])):
        return ""
    dims = [f"dim {d} ({s} = {n})" for d, (s, n) in enumerate(zip(old[0], new[0]))
            if isinstance(s, str) and n in (0, 1)]
    if not dims:
        return ""
    return (f"; {', '.join(dims)}: a size of 0 or 1 is compiled for itself, not as a symbol "
            f"(torch's 0/1 specialization: broadcasting and emptiness differ there)")




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


