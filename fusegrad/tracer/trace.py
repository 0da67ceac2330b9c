"""``fusegrad.trace``: run a Python function on symbolic tensors and keep the graph.

Tensor arguments (found in nested tuples, lists and dicts) become graph inputs named after
the function's parameters; other arguments are static and baked in. Python control flow that
depends only on shapes and Python values unrolls at trace time; control flow on tensor
values raises a :class:`~fusegrad.ir.symbolic.ConcretizationError` naming the user's line.

For an ``nn.Module`` the parameters and buffers are lifted to graph inputs (before the call's
arguments), so one graph serves any weights. Random numbers draw their key from a lifted
``rng`` input. In-place writes to inputs (an optimizer step) become extra outputs: the
graph stays functional and ``graph.meta["mutations"]`` says where to write them back.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from fusegrad import dtypes
from fusegrad.ir.graph import Graph
from fusegrad.ir.symbolic import GraphTrace, SymbolicTensor
from fusegrad.ops import creation, philox
from fusegrad.ops.primitive import TensorType
from fusegrad.ops.reductions import trace as matrix_trace
from fusegrad.tensor import Tensor
from fusegrad.tracer.capture import StateCapture, capturing
from fusegrad.tracer.state import pop_key_source, pop_trace, push_key_source, push_trace

__all__ = ["trace", "trace_with_state", "TraceInfo", "tree_flatten", "tree_unflatten", "swap_module_state"]


# --------------------------------------------------------------------------- pytrees


@dataclass(frozen=True)
class TreeDef:
    """The structure of a nested container; leaves are tensors, the rest is static."""

    kind: str                       # "leaf", "static", "tuple", "list", "dict", "namedtuple"
    children: tuple = ()
    meta: Any = None


_LEAF = TreeDef("leaf")

def tree_flatten(obj) -> tuple[list[Tensor], TreeDef]:
    """Tensor leaves of ``obj`` in order, and its structure."""
    leaves: list[Tensor] = []
    return leaves, _flatten(obj, leaves)


# Module-level recursion: a recursive closure would form a reference cycle per call that
# keeps the leaves (and their arrays) alive until the garbage collector runs.
def _flatten(o, leaves: list) -> TreeDef:
    if isinstance(o, Tensor):
        leaves.append(o)
        return _LEAF
    if isinstance(o, tuple) and hasattr(o, "_fields"):
        return TreeDef("namedtuple", tuple(_flatten(c, leaves) for c in o), type(o))
    if isinstance(o, (tuple, list)):
        # A subclass (a returned ``x.shape``, a Size) keeps its type.
        kind = "tuple" if isinstance(o, tuple) else "list"
        return TreeDef(kind, tuple(_flatten(c, leaves) for c in o),
                       None if type(o) in (tuple, list) else type(o))
    if isinstance(o, dict):
        keys = tuple(o.keys())
        return TreeDef("dict", tuple(_flatten(o[k], leaves) for k in keys), keys)
    return TreeDef("static", (), o)


def tree_unflatten(tree: TreeDef, leaves) -> Any:
    """Rebuild the structure ``tree`` with ``leaves`` in place of its tensors."""
    if tree.kind == "leaf":
        return leaves[0]
    return _build(tree, iter(leaves))


def _build(t: TreeDef, it) -> Any:
    if t.kind == "leaf":
        return next(it)
    if t.kind == "static":
        return t.meta
    kids = [_build(c, it) for c in t.children]
    if t.kind in ("tuple", "list"):
        return t.meta(kids) if t.meta is not None else tuple(kids) if t.kind == "tuple" else kids
    if t.kind == "namedtuple":
        return t.meta(*kids)
    return dict(zip(t.meta, kids))


# --------------------------------------------------------------------------- modules


def module_state(module) -> list[tuple[str, Tensor]]:
    """(dotted name, tensor) for every parameter and buffer of ``module``, deduplicated."""
    seen, out = set(), []
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            out.append((name, t))
    return out


@contextlib.contextmanager
def swap_module_state(module, replacements: dict[int, Tensor]):
    """Temporarily replace parameters/buffers (by id of the original) inside ``module``."""
    saved = []
    for sub in module.modules():
        for table in (sub._parameters, sub._buffers):
            for key, t in table.items():
                if t is not None and id(t) in replacements:
                    saved.append((table, key, t))
                    table[key] = replacements[id(t)]
    try:
        yield
    finally:
        for table, key, t in saved:
            table[key] = t


# --------------------------------------------------------------------------- random


class _RngInput:
    """Key source while tracing: keys are ``rng + (0, offset)`` with ``rng`` a graph input
    holding the generator's (seed, offset) at call time."""

    def __init__(self, trace: GraphTrace):
        self.trace = trace
        self.input: SymbolicTensor | None = None
        self.counters = 0

    def __call__(self, generator, count: int) -> Tensor:
        if generator is not creation.default_generator:
            raise NotImplementedError("traced code can draw random numbers from the default "
                                      "generator only")
        if self.input is None:
            self.input = self.trace.new_input("rng", TensorType((2,), dtypes.int64))
        delta = Tensor._wrap(np.array([0, self.counters], dtype=np.int64), dtypes.int64)
        self.counters += philox.counters_used(count)
        return self.input + delta


# --------------------------------------------------------------------------- trace


@dataclass
class TraceInfo:
    """What a traced graph needs to be called like the original function."""

    in_tree: TreeDef
    out_tree: TreeDef
    n_state: int = 0                      # leading inputs that are module parameters/buffers
    state_names: list[str] = field(default_factory=list)
    lifted: list[tuple[Tensor, int]] = field(default_factory=list)  # captured, input index
    rng_input: int | None = None          # index of the rng input, if any
    rng_counters: int = 0                 # how far each call advances the generator
    mutations: list[tuple[int, int]] = field(default_factory=list)  # (input, output) pairs
    n_user_outputs: int = 0
    capture: Any = None                   # a CaptureInfo when traced with trace_with_state
    # Per user output: ("input", index, view ops) when the function returned that input or a
    # view of it (``x``, ``x[1:]``, ``x.t()``), which eager gives back sharing its storage;
    # ("output", index, view ops) for an earlier output or a view of it (``(y, y)``,
    # ``(y, y[0])``); else None.
    output_aliases: list = field(default_factory=list)


def arg_input_ranges(graph: Graph, args) -> list[range]:
    """For each positional argument of a traced call, the graph inputs its tensor leaves
    became (after the lifted module state)."""
    pos, out = graph.meta.n_state, []
    for a in args:
        count = len(tree_flatten(a)[0])
        out.append(range(pos, pos + count))
        pos += count
    return out


def _arg_names(fn: Callable, n: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    # *args need not be the last parameter (keyword-only ones follow it).
    star = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    names = []
    for i in range(n):
        if i < len(params) and params[i].kind in (params[i].POSITIONAL_ONLY,
                                                  params[i].POSITIONAL_OR_KEYWORD):
            names.append(params[i].name)
        elif star is not None:
            names.append(f"{star}{i}")
        else:
            names.append(f"arg{i}")
    return names


def _sanitize(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def trace(fn: Callable, *args, **kwargs) -> Graph:
    """Trace ``fn(*args, **kwargs)`` into a :class:`Graph` (``graph.meta`` holds a
    :class:`TraceInfo`).

    Concrete tensors the function captures are constants of the graph (those that require
    grad are inputs). ``fusegrad.compile`` traces with :func:`trace_with_state` instead.

    >>> g = fusegrad.trace(lambda x: (x * 2).relu(), fusegrad.randn(4))
    >>> print(g)   # doctest: +SKIP

    Given a tensor instead of a function, ``fusegrad.trace(x)`` is ``torch.trace``: the sum
    of the matrix's main diagonal (``Tensor.trace``), so that torch code runs unchanged.
    """
    if isinstance(fn, Tensor):
        return matrix_trace(fn, *args, **kwargs)
    return _trace(fn, args, kwargs, capture_state=False)


def trace_with_state(fn: Callable, args: tuple, kwargs: dict,
                     symbolic_dims: dict | None = None) -> Graph:
    """Trace as :func:`trace`, capturing state outside the arguments as
    :mod:`fusegrad.tracer.capture` describes: captured tensors are inputs read at call time,
    writes to them, ``.grad`` and ``backward()`` become outputs written back
    (``graph.meta.capture`` says how).

    ``symbolic_dims`` ({leaf index: {dim: SymInt}}) gives those dims of the tensor
    arguments (in ``tree_flatten`` order) symbolic sizes in the graph."""
    return _trace(fn, args, kwargs, capture_state=True, symbolic_dims=symbolic_dims)


def _leaf_type(t: Tensor, dims: dict | None) -> TensorType:
    """The graph type of an argument: its own, with the sizes in ``dims`` symbolic."""
    tt = t._type()
    if not dims:
        return tt
    return TensorType(tuple(dims.get(i, d) for i, d in enumerate(tt.shape)), tt.dtype, tt.device)


def _trace(fn: Callable, args: tuple, kwargs: dict, capture_state: bool,
           symbolic_dims: dict | None = None) -> Graph:
    module = fn if hasattr(fn, "named_parameters") and hasattr(fn, "_parameters") else None
    target = module.forward if module is not None else fn
    name = type(module).__name__ if module is not None else getattr(fn, "__name__", "f")
    graph = Graph(_sanitize(name) if name != "<lambda>" else "lambda")
    tr = GraphTrace(graph)

    state = module_state(module) if module is not None else []
    sym_state = {id(t): tr.new_input(_sanitize(n), t._type(), t.requires_grad)
                 for n, t in state}

    leaves, in_tree = tree_flatten((args, kwargs))
    names = _arg_names(target, len(args))
    sym_leaves = []
    leaf_names = _leaf_names(args, kwargs, names)
    for i, (t, n) in enumerate(zip(leaves, leaf_names)):
        sym_leaves.append(tr.new_input(_sanitize(n), _leaf_type(t, (symbolic_dims or {}).get(i)),
                                       t.requires_grad))
    for t, s in list(zip(leaves, sym_leaves)) + [(t, sym_state[id(t)]) for _, t in state]:
        if t.requires_grad and t.is_leaf and t._trace is None:
            tr.grad_leaves.add(s._value)
    sym_args, sym_kwargs = tree_unflatten(in_tree, sym_leaves)
    originals = {id(s): s._value for s in list(sym_state.values()) + sym_leaves}

    cap = None
    if capture_state:
        pairs = [(sym_state[id(t)], t) for _, t in state] + list(zip(sym_leaves, leaves))
        cap = StateCapture(tr, pairs)
    rng = _RngInput(tr)
    push_key_source(rng)
    push_trace(tr)
    try:
        with swap_module_state(module, sym_state) if module is not None else contextlib.nullcontext(), \
                capturing(cap) if cap is not None else contextlib.nullcontext():
            # A module runs through __call__: its own forward hooks and pre-hooks are part
            # of what it computes (fg.compile(model) skipped them).
            out = (module if module is not None else target)(*sym_args, **sym_kwargs)
            out_leaves, out_tree = tree_flatten(out)
            # Still active: an output may be a free variable (a tensor of an enclosing trace).
            outputs = [tr.operand(t) for t in out_leaves]
            position = {id(s): i for i, s in enumerate(list(sym_state.values()) + sym_leaves)}
            earlier: dict[int, int] = {}
            aliases = []
            for k, t in enumerate(out_leaves):
                aliases.append(_output_alias(t, position, earlier))
                earlier.setdefault(id(t), k)
            del out, out_leaves
            if cap is not None:
                cap.check_hyperparameters()
    except BaseException:
        if cap is not None:
            cap.rollback()
        raise
    finally:
        pop_trace()
        pop_key_source()

    info = TraceInfo(in_tree, out_tree, n_state=len(state), state_names=[n for n, _ in state],
                     n_user_outputs=len(outputs), output_aliases=aliases)
    # Inputs written in place: their final values become extra outputs.
    for i, sym in enumerate(list(sym_state.values()) + sym_leaves):
        if sym._value is not originals[id(sym)]:
            info.mutations.append((i, len(outputs)))
            outputs.append(sym._value)
    if cap is not None:
        info.capture = cap.finish(outputs, info.mutations, graph)
    graph.set_outputs(outputs)
    info.lifted = [(t, graph.inputs.index(v)) for t, v in tr.lifted]
    if rng.input is not None:
        info.rng_input = graph.inputs.index(rng.input._value)
        info.rng_counters = rng.counters
    graph.meta = info
    return graph


def _output_alias(t, inputs: dict[int, int], outputs: dict[int, int]) -> tuple | None:
    """("input", i, view ops) when output ``t`` is input ``i`` of the traced call or a view
    of it, ("output", k, view ops) when it is the earlier output ``k`` or a view of it (by
    ``inputs`` and ``outputs``: id of a symbolic tensor -> its index); else None."""
    if not isinstance(t, SymbolicTensor):
        return None
    for source, index in (("input", inputs), ("output", outputs)):
        if id(t) in index:
            return source, index[id(t)], ()
    base = t._base
    if base is not None and t._view_ops:
        for source, index in (("input", inputs), ("output", outputs)):
            if id(base) in index:
                return source, index[id(base)], tuple(t._view_ops)
    return None


def _leaf_names(args, kwargs, names: list[str]) -> list[str]:
    out = []
    for a, n in zip(args, names):
        leaves, _ = tree_flatten(a)
        out += [n] if len(leaves) == 1 and isinstance(a, Tensor) else \
            [f"{n}_{k}" for k in range(len(leaves))]
    for k, v in kwargs.items():
        leaves, _ = tree_flatten(v)
        out += [k] if len(leaves) == 1 and isinstance(v, Tensor) else \
            [f"{k}_{j}" for j in range(len(leaves))]
    return out
