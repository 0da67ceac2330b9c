"""Symbolic tensors: tensor ops that record into a :class:`Graph` instead of computing.

A :class:`SymbolicTensor` carries a graph value (shape and dtype, no data), as JAX's tracers
carry an abstract value. Every tensor method works on it unchanged: the methods bind
primitives, and ``bind`` hands a primitive whose operand is symbolic to that operand's
:class:`GraphTrace`, which appends a node. The tracer (user functions), the autodiff pass
(VJP rules) and graph replay all build graphs this way, so each op has one definition.

Anything that needs a concrete value (``bool(t)``, ``t.item()``, ``t.numpy()``) raises
:class:`ConcretizationError` naming the user's line.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

import numpy as np

from fusegrad import dtypes
from fusegrad.grad_mode import is_grad_enabled
from fusegrad.ir.graph import Graph, Literal, Value
from fusegrad.ops import functional as F
from fusegrad.ops import prims as P
from fusegrad.ops.dual import assign_tangents
from fusegrad.ops.movement import _mark_view, _traced_layout
from fusegrad.ops.primitive import (
    ConstantData,
    Primitive,
    ShapeError,
    TensorType,
    bind,
    enclosing_traces,
    note_created,
)
from fusegrad.tensor import Size, Tensor, _contiguous_strides

__all__ = ["SymbolicTensor", "GraphTrace", "ConcretizationError", "user_location", "host_values"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def user_location() -> str | None:
    """``file:line`` of the innermost frame outside the fusegrad package."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not os.path.abspath(path).startswith(_PACKAGE_DIR + os.sep):
            return f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return None


# GraphTrace.location's default: record the user's line.
USER_LINE = object()


class ConcretizationError(RuntimeError):
    """A traced tensor's value was needed while tracing (data-dependent Python)."""


_CONTROL_FLOW = (
    "so Python control flow on tensor values cannot be captured in a static graph. Use "
    "fusegrad.where(cond, a, b) to choose elementwise, mark the argument static "
    "(static_argnums) if it is a Python constant, or run this code eagerly (compile with "
    "fullgraph=False).")
_PRINT = (
    "so there are no values to print, and a print in a compiled function would run only once, "
    "while tracing. With fullgraph=False the function runs eagerly instead and prints on every "
    "call; to keep it compiled, print outside the compiled function (or print repr(t), the "
    "traced type, while tracing).")


class SymbolicTensor(Tensor):
    """A tensor known only by its type while a graph is being built."""

    __slots__ = ("_val", "_tr", "_view_of", "_seen")

    @classmethod
    def _make(cls, value: Value, trace: "GraphTrace", requires_grad: bool) -> "SymbolicTensor":
        t = object.__new__(cls)
        t._val = value
        t._tr = trace
        t._init_state(value.type.dtype)
        t._requires_grad = requires_grad
        return t

    @property
    def _trace(self) -> "GraphTrace":
        return self._tr

    # Views alias their base in eager mode, so a write through one view shows in the others.
    # Under a trace a write rebinds the base to a new value (GraphTrace.assign); every other
    # view of that base notices on its next use that the base moved on (``_seen`` is the base
    # value it was derived from) and re-derives itself by replaying its view ops.

    @property
    def _value(self) -> Value:
        base = self._view_of
        if base is not None and base._val is not self._seen:
            v = base
            for prim, attrs in self._view_ops:
                v = self._tr.process_primitive(prim, (v,), attrs)
            self._val, self._seen = v._val, base._val
            self._requires_grad = v._requires_grad
        return self._val

    @_value.setter
    def _value(self, value: Value) -> None:
        self._val = value

    @property
    def _base(self) -> "SymbolicTensor | None":
        return self._view_of

    @_base.setter
    def _base(self, base: "Tensor | None") -> None:
        # Set by functional._mark_view right after the view op, so this view is current.
        if base is not None and not isinstance(base, SymbolicTensor):
            # A traced view of a concrete tensor: only fusegrad.compile's state capture
            # records such ops (the tensor is an input read at call time); its symbolic
            # stand-in is the base, so writes through the view reach it.
            if self._tr.capture is None:
                raise ConcretizationError("a traced view of a concrete tensor outside "
                                          "fusegrad.compile")
            base = self._tr.capture.sym_for(base)
        self._view_of = base
        self._seen = base._val if isinstance(base, SymbolicTensor) else None

    @property
    def _data(self):
        self._check_concrete("reading the data")

    @property
    def shape(self) -> Size:
        return Size(self._val.type.shape)

    @property
    def ndim(self) -> int:
        return len(self._val.type.shape)

    def _type(self) -> TensorType:
        return self._val.type

    # The layout eager would give this tensor (a transpose's strides), replayed from its view
    # ops: code that branches on it (``if x.is_contiguous()``) traces the branch eager takes.
    def stride(self, dim: int | None = None):
        shape = self._val.type.shape
        if self._view_of is None or not self._view_ops:
            strides = _contiguous_strides(shape)
        else:
            a = _traced_layout(self)
            strides = tuple(st // a.itemsize for st in a.strides)
            if a.size <= 1 or 0 in a.shape:
                strides = _contiguous_strides(shape)
        return strides if dim is None else strides[dim]

    def is_contiguous(self, memory_format=None) -> bool:
        if self._view_of is None or not self._view_ops:
            return True
        return bool(_traced_layout(self).flags.c_contiguous)

    def data_ptr(self) -> int:
        self._check_concrete("data_ptr()")

    def _check_concrete(self, what: str, why: str | None = None) -> None:
        """Raise :class:`ConcretizationError`: ``what`` needs this tensor's value. ``why``
        replaces the default explanation (Python control flow on tensor values) where the
        value is needed for something else."""
        loc = user_location()
        where = f" at {loc}" if loc else ""
        raise ConcretizationError(
            f"{what} needs the value of a traced tensor ({self._val.type}){where}, but while "
            "tracing only its shape and dtype are known, " + (why or _CONTROL_FLOW))

    def detach(self) -> "SymbolicTensor":
        # A view of this tensor, as in eager (detach shares storage): a write through it
        # (``y.detach()[0] = 1``, ``y.data.mul_(0)``) reaches y (see assign).
        out = self._tr.process_primitive(P.stop_gradient, (self,), {})
        return _mark_view(out, self, P.stop_gradient, {})

    def requires_grad_(self, requires_grad: bool = True) -> "SymbolicTensor":
        super().requires_grad_(requires_grad)
        value = self._value
        if self._requires_grad and self._tr.capture is not None and \
                value not in self._tr.grad_values:
            # A leaf made while compile traces (x.detach().requires_grad_()): a gradient
            # root of backward() inside the function.
            self._tr.capture.internal_leaf(self, value)
        return self

    def retain_grad(self) -> None:
        if not self._requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self._tr.capture is None:
            self._check_concrete("retain_grad()", "and a gradient is kept only for a function "
                                 "compiled with fusegrad.compile")
        self._tr.capture.retain(self)

    def register_hook(self, hook):
        self._check_concrete("register_hook()")

    # repr() stays a description of the traced value (debuggers and error messages use it);
    # str() and format() -- what print() and f-strings call -- need values, which a trace
    # does not have: printing "Traced<f32[3]>" once at trace time and then nothing on later
    # calls would mislead. So they raise; with fullgraph=False the function then runs
    # eagerly and prints real values on every call (as torch.compile's graph break does).
    def __repr__(self) -> str:
        return f"Traced<{self._val.type}>"

    def __str__(self) -> str:
        self._check_concrete("print() or str() of a tensor", _PRINT)

    def __format__(self, spec: str) -> str:
        self._check_concrete("formatting a tensor (an f-string or format())", _PRINT)

    def __deepcopy__(self, memo):
        raise ConcretizationError("cannot deepcopy a traced tensor")

    def __reduce_ex__(self, protocol):
        raise ConcretizationError("cannot pickle a traced tensor")


class GraphTrace:
    """Records primitives applied to its symbolic tensors into ``graph``.

    Concrete tensors met as operands become constants: 0-d ones inline literals, others
    ``constant`` nodes (one per tensor). A concrete tensor that requires grad is lifted to a
    graph input instead (``lifted``), so its gradient is not silently lost. So is a symbolic
    tensor of an enclosing trace (a free variable of a function traced inside another one,
    as in ``grad(lambda x: grad(lambda y: (x * y).sum())(x).sum())``): it has no value to
    bake in, and the caller passes it back in when it replays the graph.
    """

    def __init__(self, graph: Graph, lift_requires_grad: bool = True):
        self.graph = graph
        self.lift_requires_grad = lift_requires_grad
        # The source location of new nodes: the user's line (USER_LINE), or, while the
        # autodiff pass or replay copies a graph, that of the node being copied (so the VJP of
        # a node points at the user's line that made the node).
        self.location: str | None | object = USER_LINE
        self.lifted: list[tuple[Tensor, Value]] = []   # (captured tensor, its graph input)
        self._constants: dict[int, tuple[Tensor, Value]] = {}
        # Values that require grad (recorded under grad mode from operands that do): what
        # backward() inside the trace differentiates through.
        self.grad_values: set[Value] = set()
        # fusegrad.compile's state capture (fusegrad.tracer.capture), when it traces.
        self.capture = None
        # Inputs that stand for leaves requiring grad: eager forbids in-place writes to them.
        self.grad_leaves: set[Value] = set()
        # Forward mode's tangents of values ({level: tangent}, fusegrad.ops.dual), so that a
        # tensor made again for a value (by backward's reverse pass) carries them too.
        self.tangents: dict[Value, dict] = {}

    def new_input(self, name: str, type: TensorType, requires_grad: bool = False) -> SymbolicTensor:
        value = self.graph.add_input(_unique_name(self.graph, name), type)
        if requires_grad:
            self.grad_values.add(value)
        return SymbolicTensor._make(value, self, requires_grad)

    def operand(self, t: Tensor):
        """The graph operand for tensor ``t`` (a value, a literal, or a new constant)."""
        if isinstance(t, SymbolicTensor):
            if t._tr is self:
                return t._value
            # A tensor of a trace running user code in this thread is a free variable; of
            # any other, a leaked tracer.
            if t._tr not in enclosing_traces():
                raise ConcretizationError(
                    f"a traced tensor ({t._val.type}) from another trace was used here: a "
                    "tensor escaped from a traced function (stored in a global or attribute?)")
            return self._lift(t)
        if self.capture is not None:
            op = self.capture.operand(t)
            if op is not None:
                return op
        elif t._requires_grad and self.lift_requires_grad:
            return self._lift(t)
        if t.ndim == 0 and not (self.capture is not None and t._requires_grad):
            host = t._host()                # a cuda tensor's value comes from a host copy
            return Literal(host.item() if t.dtype is not dtypes.bfloat16 else float(host),
                           t.dtype)
        hit = self._constants.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        value = self.graph.add_node(P.constant, [], {"value": ConstantData(np.array(t._host()))},
                                    loc=self._location())
        self._constants[id(t)] = (t, value)
        if self.capture is not None and t._requires_grad and t.grad_fn is None:
            self.capture.internal_leaf(t, value)     # fusegrad.ones(3, requires_grad=True)
        return value

    def _location(self) -> str | None:
        return user_location() if self.location is USER_LINE else self.location

    def _lift(self, t: Tensor) -> Value:
        for src, value in self.lifted:
            if src is t:
                return value
        sym = self.new_input(f"captured{len(self.lifted)}", t._type(), t._requires_grad)
        self.lifted.append((t, sym._value))
        if t._trace is None and t.is_leaf and t._requires_grad:
            self.grad_leaves.add(sym._value)
        return sym._value

    def process_primitive(self, prim: Primitive, operands: Sequence[Tensor], attrs: dict):
        owner = innermost_trace(operands, self)
        if owner is not self:
            # bind() handed the op to its first traced operand's trace, but an operand of a
            # trace nested inside that one makes the op part of the inner function.
            return owner.process_primitive(prim, operands, attrs)
        inputs = [self.operand(t) for t in operands]
        loc = self._location()
        try:
            prim.infer(*(op.type for op in inputs), **attrs)
        except (ShapeError, TypeError, IndexError) as e:
            raise type(e)(f"{e}{f' (at {loc})' if loc else ''}") from None
        value = self.graph.add_node(prim, inputs, attrs, loc=loc)
        differentiable = (prim.vjp is not None and value.type.dtype.is_differentiable and
                          any(t._requires_grad for t in operands))
        requires_grad = differentiable and is_grad_enabled()
        if requires_grad:
            self.grad_values.add(value)
        elif differentiable:
            # Computed under no_grad from values that require grad (a running statistic, an
            # optimizer update): eager gives it no history, so the graph's own autodiff must
            # not differentiate through it either.
            value = self.graph.add_node(P.stop_gradient, [value], {}, loc=loc)
        return SymbolicTensor._make(value, self, requires_grad)

    def backward(self, outputs, grad_outputs, create_graph: bool, inputs, accumulate: bool,
                 allow_unused: bool = False):
        """``backward()`` or ``autograd.grad`` called on this trace's tensors."""
        if self.capture is None:
            loc = user_location()
            raise ConcretizationError(
                f"backward() on a traced tensor{f' at {loc}' if loc else ''}: only "
                "fusegrad.compile records backward() and .grad; in fusegrad.trace and the "
                "function transforms use fusegrad.grad / fusegrad.vjp instead.")
        return self.capture.backward(outputs, grad_outputs, create_graph, inputs, accumulate,
                                     allow_unused)

    def assign(self, x: SymbolicTensor, value: Tensor) -> SymbolicTensor:
        """An in-place write under a trace: rebind ``x`` (functionalization).

        A write through a view rebuilds the base: the view ops are inverted with their own
        VJP rules (reshape back, permute back, slice -> embed in zeros) and the region is
        selected with a mask built the same way.
        """
        if tuple(value.shape) != tuple(x.shape):
            value = F.expand(value, tuple(x.shape))
        value = F.cast(value, x.dtype) if value.dtype is not x.dtype else value
        if not isinstance(value, SymbolicTensor):
            value = self.process_primitive(P.copy, (value,), {})
        if x._base is not None:
            base = x._base
            types = [base._type()]
            for prim, attrs in x._view_ops:
                if prim is P.broadcast_to:
                    raise RuntimeError("in-place write through an expanded view is not supported "
                                       "(more than one element refers to one memory location)")
                if prim is P.stop_gradient and (base._requires_grad or value._requires_grad):
                    # Eager hides such a write from autograd (the base's history stays as it
                    # was): a graph cannot say that, so the function runs eagerly instead.
                    raise ConcretizationError(
                        f"an in-place write through .detach() or .data of a tensor that "
                        f"requires grad ({user_location() or 'in the traced function'}) is "
                        "hidden from autograd in eager mode, which a traced graph cannot "
                        "express; write to the tensor itself, or compile with "
                        "fullgraph=False to run this function eagerly")
                types.append(prim.infer(types[-1], **attrs))
            if any(prim in _PART_VIEWS for prim, _ in x._view_ops):
                new_base = _write_through_parts(base, x._view_ops, value)
            else:
                embedded = value
                mask = F.ones_like(value, dtype=dtypes.bool_)
                for (prim, attrs), t in zip(reversed(x._view_ops), reversed(types[:-1])):
                    if prim is P.stop_gradient:
                        continue                # the same elements: nothing to invert
                    embedded = prim.cotangent(0, embedded, None, (t,), attrs)
                    mask = prim.cotangent(0, mask, None, (t,), attrs)
                new_base = F.where(mask, embedded, base)
            base._value = new_base._value
            base._requires_grad = base._requires_grad or value._requires_grad
            assign_tangents(base, new_base)
        x._value = value._value
        if x._base is not None:
            x._seen = x._base._val     # x holds the written value: it is current
        x._requires_grad = x._requires_grad or value._requires_grad
        assign_tangents(x, value)
        return x


def host_values(t: Tensor, what: str) -> np.ndarray:
    """The values of ``t`` as a host array, for code that needs them in Python: host data such
    as a packed sequence's lengths and batch sizes, which decide the shapes of what follows.

    A concrete tensor gives its values. A traced one gives them only where fusegrad.compile
    traces with that tensor as an argument or a captured tensor, unchanged so far: its values
    at trace time, guarded, so the trace is reused only for calls where they are equal (a new
    pattern traces again, up to the recompile limit). Any other traced tensor raises
    :class:`ConcretizationError` naming ``what`` needed its values.
    """
    if not isinstance(t, SymbolicTensor):
        return t._host()
    capture = t._tr.capture
    value = None if capture is None else capture.guard_value(t)
    if value is None:
        t._check_concrete(what, "so values that decide the shapes of the graph must be host data: "
                          "an argument of the compiled function (guarded by value), or a tensor "
                          "computed outside it.")
    return value


# Views of a complex value's parts: a write through one keeps the other part.
_PART_VIEWS = frozenset({P.real, P.imag, P.view_as_real, P.view_as_complex})


def _write_through_parts(base: Tensor, view_ops, value: Tensor) -> Tensor:
    """The base after ``value`` is written through ``view_ops`` that include a view of a
    complex value's parts: the view chain is walked back one op at a time, each step putting
    the written value into the value it was viewed from (``real`` keeps the imaginary part,
    a slice keeps the elements outside it)."""
    viewed = [base]
    for prim, attrs in view_ops[:-1]:
        viewed.append(F.bind(prim, viewed[-1], **attrs))
    new = value
    for (prim, attrs), src in zip(reversed(view_ops), reversed(viewed)):
        if prim is P.real:
            new = F.bind(P.complex_, new, F.bind(P.imag, src))
        elif prim is P.imag:
            new = F.bind(P.complex_, F.bind(P.real, src), new)
        elif prim is P.view_as_real:
            new = F.bind(P.view_as_complex, new)
        elif prim is P.view_as_complex:
            new = F.bind(P.view_as_real, new)
        elif prim is not P.stop_gradient:
            t = src._type()
            embedded = prim.cotangent(0, new, None, (t,), attrs)
            mask = prim.cotangent(0, F.ones_like(new, dtype=dtypes.bool_), None, (t,), attrs)
            new = F.where(mask, embedded, src)
    return new


def innermost_trace(tensors: Sequence[Tensor], default: "GraphTrace | None" = None):
    """The trace that records an op on ``tensors``: the innermost active trace among theirs.

    With nested traces (``grad`` of ``grad``, a traced function calling ``fusegrad.trace``)
    an op can mix tensors of an outer trace (free variables) with those of an inner one; it
    belongs to the inner function, which lifts the outer tensors as inputs.
    """
    best, best_rank = default, None
    for t in tensors:
        tr = t._trace
        if tr is None or tr is best:
            continue
        if best is None:
            best = tr
            continue
        if best_rank is None:
            best_rank = _rank(best)
        r = _rank(tr)
        if r > best_rank:
            best, best_rank = tr, r
    return best


def _rank(trace: "GraphTrace") -> int:
    active = enclosing_traces()
    for i in range(len(active) - 1, -1, -1):
        if active[i] is trace:
            return i
    return -1


def _unique_name(graph: Graph, name: str) -> str:
    taken = {v.name for v in graph.inputs}
    if name not in taken:
        return name
    k = 1
    while f"{name}_{k}" in taken:
        k += 1
    return f"{name}_{k}"


def literal_tensor(lit: Literal) -> Tensor:
    """A concrete 0-d tensor for an inline literal (a constant of a graph being traced)."""
    t = Tensor._wrap(np.asarray(lit.value, dtype=lit.dtype.np_dtype), lit.dtype)
    note_created(t)
    return t


def replay(graph: Graph, args: Sequence[Tensor]) -> list[Tensor]:
    """Run ``graph`` by binding each node's primitive on tensors.

    With concrete tensors this executes eagerly (and records autograd for inputs that
    require grad); with symbolic tensors of one trace it inlines the graph into that trace.
    """
    if len(args) != len(graph.inputs):
        raise TypeError(f"graph @{graph.name} takes {len(graph.inputs)} inputs, got {len(args)}")
    trace = innermost_trace(args)
    env: dict[Value, Tensor] = {}
    for v, a in zip(graph.inputs, args):
        if tuple(a.shape) != v.type.shape or a.dtype is not v.type.dtype:
            raise TypeError(f"graph @{graph.name}: input %{v.name} expects {v.type}, got "
                            f"{a.dtype.short}[{','.join(map(str, a.shape))}]")
        env[v] = a

    def get(op):
        return env[op] if isinstance(op, Value) else literal_tensor(op)

    saved = trace.location if trace is not None else None
    try:
        for node in graph.nodes:
            operands = [get(op) for op in node.inputs]
            if trace is not None:
                trace.location = node.loc      # inlined nodes keep their own lines
            if trace is not None and not any(o._trace is not None for o in operands):
                env[node.output] = trace.process_primitive(node.prim, operands, node.attrs)
            else:
                try:
                    env[node.output] = bind(node.prim, *operands, **node.attrs)
                except IndexError as e:
                    # A data-dependent index (gather, take) is only checked when the graph
                    # runs: name the user's line that made the node.
                    if not node.loc:
                        raise
                    raise IndexError(f"{e} (in `{node.prim.name}` at {node.loc})") from e
    finally:
        if trace is not None:
            trace.location = saved
    return [get(o) for o in graph.outputs]
