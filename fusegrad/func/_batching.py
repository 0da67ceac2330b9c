"""The batching trace behind ``vmap``: tensors that stand for one example of a batch.

A :class:`BatchTensor` is a tensor whose ``_trace`` is a :class:`BatchTrace`; it holds the
underlying batched tensor and the position of its batch dimension, and reports the shape
of one example. Every tensor method works on it unchanged: methods bind primitives, and
``bind`` hands a primitive with a batched operand to the operand's trace, which applies
the primitive's batching rule (:mod:`fusegrad.ops.batching`) to the underlying tensors. So
eager autograd records the batched ops, and under :func:`fusegrad.compile` the underlying
tensors are symbolic and the compiled program is one batched graph. Nested ``vmap`` is
nested traces, each with its level: the underlying tensors of an inner level are the
batched tensors of the outer one (JAX's ``BatchTrace``).

Autograd inside ``vmap`` (``vmap(grad(f))``) is recorded at the level of the batched
tensors: a primitive applied to a batched operand that requires grad leaves a
:class:`BatchNode`, whose backward runs the VJP rules on batched tensors, through the same
batching rules. The gradient of each example's output is then each example's own, as the
rules keep examples independent; a tensor that is not batched (a parameter) gets a batched
gradient, the per-example gradients.
"""

from __future__ import annotations

from typing import Sequence

from fusegrad.grad_mode import is_grad_enabled
from fusegrad.ir.symbolic import innermost_trace
from fusegrad.ops import dual
from fusegrad.ops import functional as F
from fusegrad.ops.batching import batching_rule, expand_batch
from fusegrad.ops.primitive import Primitive, TensorType, bind, enclosing_traces
from fusegrad.ops.tape import (
    _FREED,
    _FREED_MESSAGE,
    _NO_EDGE,
    _READS,
    Node,
    PrimitiveNode,
    _edge,
    _reads,
    _Saved,
)
from fusegrad.tensor import Size, Tensor, _contiguous_strides
from fusegrad.tracer.state import pop_trace, push_trace

__all__ = ["BatchTensor", "BatchTrace", "BatchNode"]

_ITEM = ("vmap: It looks like you're calling .item() on a Tensor. We don't support vmap over "
         "calling .item() on a Tensor, please try to rewrite what you're doing with other "
         "operations.")
_CONTROL_FLOW = ("vmap: It looks like you're attempting to use a Tensor in some data-dependent "
                 "control flow. We don't support that yet")


_INPLACE = ("vmap: inplace arithmetic(self, *extra_args) is not possible because there exists a "
            "Tensor `other` in extra_args that has more elements than `self`. This happened due "
            "to `other` being vmapped over but `self` not being vmapped over in a vmap. Please "
            "try to use out-of-place operators instead of inplace arithmetic.")


def data_dependent_error(what: str) -> RuntimeError:
    """torch's refusal of an op that needs a batched tensor's values (``what``), or writes
    one into a tensor that is not batched."""
    if what.startswith("item"):
        return RuntimeError(_ITEM)
    if "in-place write" in what:
        return RuntimeError(f"{_INPLACE} ({what.split(':')[0]})")
    return RuntimeError(f"{_CONTROL_FLOW}: {what} needs the values of a batched tensor, which "
                        f"differ per example; compute both branches and choose with "
                        f"torch.where")


class BatchTensor(Tensor):
    """One example of a batch: the underlying batched tensor ``_val`` with its batch
    dimension at ``_bdim``, seen by the code inside ``vmap`` without that dimension. With
    ``_bdim`` None the value is the same for every example (a differentiated input that is
    not batched, lifted to the level so that its gradient is per example)."""

    __slots__ = ("_val", "_bdim", "_tr", "_view_of", "_seen")

    @classmethod
    def _make(cls, value: Tensor, bdim: int | None, trace: "BatchTrace") -> "BatchTensor":
        t = object.__new__(cls)
        t._val = value
        t._bdim = bdim
        t._tr = trace
        t._init_state(value.dtype)
        return t

    @property
    def _trace(self) -> "BatchTrace":
        return self._tr

    @property
    def _value(self) -> Tensor:
        return self._val

    # A view of a batched tensor that was written in place since (through the base or another
    # view of it) re-derives itself from the base on its next use, as the tracer's views do:
    # ``_seen`` is the base's value it was derived from.

    @property
    def _base(self) -> "BatchTensor | None":
        return self._view_of

    @_base.setter
    def _base(self, base: "Tensor | None") -> None:
        self._view_of = base
        self._seen = base._val if isinstance(base, BatchTensor) else None

    def _refresh(self) -> None:
        base = self._view_of
        if base is None or not isinstance(base, BatchTensor) or base._val is self._seen:
            return
        v = base
        for prim, attrs in self._view_ops:
            v = self._tr.process_primitive(prim, (v,), attrs)
        self._val, self._bdim, self._seen = v._val, v._bdim, base._val

    @property
    def _data(self):
        self._check_concrete("reading the data")

    @property
    def shape(self) -> Size:
        s, d = self._val.shape, self._bdim
        return s if d is None else Size(s[:d] + s[d + 1:])

    @property
    def ndim(self) -> int:
        return self._val.ndim - (self._bdim is not None)

    @property
    def device(self):
        return self._val.device

    def _type(self) -> TensorType:
        return TensorType(tuple(self.shape), self._dtype, self._val._type().device)

    def stride(self, dim: int | None = None):
        strides = _contiguous_strides(tuple(self.shape))
        return strides if dim is None else strides[dim]

    def is_contiguous(self, memory_format=None) -> bool:
        return True

    def data_ptr(self) -> int:
        self._check_concrete("data_ptr()")

    def _check_concrete(self, what: str, why: str | None = None) -> None:
        raise data_dependent_error(what)

    def detach(self) -> "BatchTensor":
        return BatchTensor._make(self._val.detach(), self._bdim, self._tr)

    def _detach_own_tape(self) -> "BatchTensor":
        # This level's tape only: the underlying tensor's history is the tape of the
        # transforms around this vmap, which must see through a transform inside it.
        return BatchTensor._make(self._val, self._bdim, self._tr)

    def __repr__(self) -> str:
        return (f"BatchedTensor(lvl={self._tr.level}, bdim={self._bdim}, "
                f"value={self._val!r})")

    def __str__(self) -> str:
        return self.__repr__()

    def __format__(self, spec: str) -> str:
        return self.__repr__()

    def __deepcopy__(self, memo):
        raise data_dependent_error("deepcopy")


class BatchTrace:
    """The trace of one ``vmap`` level: applies batching rules to its tensors' ops.

    Active (``push``/``pop``) while the vmapped function runs: it sits on the thread's
    stack of running traces, so an op mixing its tensors with those of a trace it runs
    inside (the tracer of :func:`fusegrad.compile`, an outer ``vmap``) comes to it first,
    and it hands the underlying tensors down.
    """

    def __init__(self, level: int, size: int):
        self.level = level
        self.size = size
        self.active = False
        self.grad_leaves: set = set()      # read by the in-place checks; nothing here is one
        self.forward_level_at_entry = 0

    def __enter__(self) -> "BatchTrace":
        push_trace(self)
        self.active = True
        # Forward-mode levels up to this one were entered outside this vmap: their tangents
        # ride on the underlying tensors, so ops on this level's tensors come here first
        # (dual.apply_jvp reads this).
        self.forward_level_at_entry = max(dual.live_levels(), default=0)
        return self

    def __exit__(self, *exc) -> None:
        self.active = False
        pop_trace()

    def wrap(self, value: Tensor, bdim: int | None) -> "BatchTensor":
        """``value`` as a tensor of this level; with ``bdim`` None it is the same for every
        example (a differentiated input that is not batched: its ops are recorded on this
        level's tape, so that its gradient is per example)."""
        return BatchTensor._make(value, bdim, self)

    def unwrap(self, t: Tensor) -> tuple[Tensor, int | None]:
        """``t``'s underlying tensor and batch dim at this level (None: not batched here)."""
        if isinstance(t, BatchTensor) and t._tr is self:
            if t._view_of is not None:
                t._refresh()
            return t._val, t._bdim
        return t, None

    def process_primitive(self, prim: Primitive, operands: Sequence[Tensor], attrs: dict):
        if not operands:
            # A source made like one of this level's tensors (ones_like): the same for every
            # example, made by the trace this one runs inside (the tracer's, under compile).
            below = self._trace_below()
            return bind(prim, **attrs) if below is None else \
                below.process_primitive(prim, operands, attrs)
        owner = innermost_trace(operands, self)
        if owner is not self:
            return owner.process_primitive(prim, operands, attrs)
        if not self.active:
            raise RuntimeError(
                f"vmap: a batched tensor was used in `{prim.name}` after the vmapped function "
                "returned (it escaped vmap, stored in a global or an attribute?); return it "
                "from the function instead")
        args, dims = zip(*[self.unwrap(t) for t in operands])
        if all(d is None for d in dims):
            value, bdim = bind(prim, *args, **attrs), None
        else:
            value, bdim = batching_rule(prim)(list(args), list(dims), **attrs)
        out = self.wrap(value, bdim)
        _record(prim, operands, attrs, out)
        return out

    def _trace_below(self):
        active = enclosing_traces()
        for i in range(len(active) - 1, -1, -1):
            if active[i] is self:
                return active[i - 1] if i else None
        return None

    def backward(self, outputs, grad_outputs, create_graph: bool, inputs, accumulate: bool,
                 allow_unused: bool = False):
        """``autograd.grad`` or ``backward()`` on batched tensors: the tape of this level."""
        from fusegrad.autograd import engine
        outputs = list(outputs)
        grads = engine._make_grads(outputs, None if grad_outputs is None else
                                   engine._as_seq(grad_outputs))
        if inputs is not None:
            inputs = engine._as_seq(inputs)
        # The graph is kept (retain_graph): the trace's backward is not told the caller's
        # choice, and a vjp function may be called again; nodes free their saved tensors
        # when the level's tensors go.
        return engine.run_backward(outputs, grads, True, create_graph, inputs=inputs,
                                   accumulate=accumulate, allow_unused=allow_unused)

    def assign(self, x: BatchTensor, value: Tensor) -> BatchTensor:
        """An in-place write to a batched tensor: ``x`` (and its base, for a view) takes the
        batched value; the write through a view is built as the tracer builds it."""
        if tuple(value.shape) != tuple(x.shape):
            value = F.expand(value, tuple(x.shape))
        value = F.cast(value, x.dtype) if value.dtype is not x.dtype else value
        if x._base is not None:
            base = x._base
            types = [base._type()]
            for prim, attrs in x._view_ops:
                types.append(prim.infer(types[-1], **attrs))
            embedded = value
            mask = F.ones_like(value, dtype=F.dtypes.bool_)
            for (prim, attrs), t in zip(reversed(x._view_ops), reversed(types[:-1])):
                embedded = prim.cotangent(0, embedded, None, (t,), attrs)
                mask = prim.cotangent(0, mask, None, (t,), attrs)
            new_base = F.where(mask, embedded, base)
            self._rebind(base, new_base)
            dual.assign_tangents(base, new_base)
        self._rebind(x, value)
        if x._base is not None:
            x._seen = x._base._val       # x holds the value written: it is current
        return x

    def _rebind(self, x: BatchTensor, value: Tensor) -> None:
        v, d = self.unwrap(value)
        if d is None and x._bdim is not None:
            v, d = expand_batch(v, self.size), 0
        x._val, x._bdim = v, d
        x.grad_fn = value.grad_fn
        x._requires_grad = x._requires_grad or value._requires_grad


class BatchNode(PrimitiveNode):
    """The backward of one primitive applied to batched tensors: the primitive's VJP rules,
    run on batched tensors (so through the batching rules again). A :class:`PrimitiveNode`
    that reads operand shapes from ``shape`` (its operands may be batched or symbolic, with
    no storage) and checks its gradients the same way."""

    __slots__ = ()

    def __init__(self, prim, attrs: dict, operands: Sequence, out):
        rules = prim.vjp
        needs, edges, meta = [], [], []
        for i, op in enumerate(operands):
            n = op._requires_grad and (rules[0] if prim.variadic else rules[i]) is not None
            needs.append(n)
            edges.append(_edge(op) if n else _NO_EDGE)
            meta.append((tuple(op.shape), op._dtype))
        Node.__init__(self, tuple(edges), prim.grad_name or prim.name)
        self.prim = prim
        self.attrs = attrs
        self._needs = needs = tuple(needs)
        self._in_meta = tuple(meta)
        try:
            reads, reads_output = _READS[prim, needs]
        except KeyError:
            reads, reads_output = _READS.setdefault((prim, needs), _reads(prim, needs))
        self._saved = tuple([_Saved(_as_it_is(op)) if i in reads else None
                             for i, op in enumerate(operands)]) if reads else None
        self._out = _Saved(out._detach_own_tape(), self._name) if reads_output else None

    def apply(self, grad, create_graph: bool, retain_graph: bool) -> tuple:
        saved = self._saved
        if saved is _FREED:
            raise RuntimeError(_FREED_MESSAGE)
        primals = tuple([TensorType(*meta) if saved is None or saved[i] is None
                         else saved[i].unpack(self) for i, meta in enumerate(self._in_meta)])
        out = None if self._out is None else self._saved_output(create_graph)
        grads = [self.prim.cotangent(i, grad, out, primals, self.attrs) if n else None
                 for i, n in enumerate(self._needs)]
        fixed = []
        for g, (shape, dtype) in zip(grads, self._in_meta):
            if g is not None:
                if tuple(g.shape) != shape:
                    raise RuntimeError(
                        f"Function {self.name()} returned an invalid gradient: got shape "
                        f"{list(g.shape)} but expected shape compatible with {list(shape)}")
                if g._dtype is not dtype and dtype.is_differentiable:
                    g = g.to(dtype)
            fixed.append(g)
        return tuple(fixed)


def _as_it_is(t: Tensor) -> Tensor:
    """A batched operand as a node saves it: a tensor of its own with the operand's value,
    history and tangents now. An in-place write rebinds the operand's value rather than
    writing into storage (there is no version to check), so the operand itself would give the
    backward the value written later (``y.mul_(x)``'s gradient of ``x`` reads the old ``y``).
    A leaf that requires grad is kept: its gradient accumulates into it, and it cannot be
    written in place."""
    if not isinstance(t, BatchTensor) or (t.grad_fn is None and t._requires_grad):
        return t
    s = BatchTensor._make(t._val, t._bdim, t._tr)
    s.grad_fn, s._requires_grad, s._fw_grads = t.grad_fn, t._requires_grad, t._fw_grads
    return s


def _record(prim: Primitive, operands, attrs: dict, out: BatchTensor) -> None:
    """Give ``out`` its node on this level's tape when an operand requires grad."""
    if prim.vjp is None or not is_grad_enabled() or not out._dtype.is_differentiable:
        return
    if not any(op._requires_grad for op in operands):
        return
    out.grad_fn = BatchNode(prim, attrs, operands, out)
    out._requires_grad = True


def innermost_batch_trace() -> BatchTrace | None:
    """The innermost ``vmap`` level running in this thread, or None."""
    for t in reversed(enclosing_traces()):
        if isinstance(t, BatchTrace) and t.active:
            return t
    return None


def lift(t: Tensor) -> Tensor:
    """``t`` as a tensor of the innermost running ``vmap`` level (itself when it is one, or
    when no vmap runs): what a differentiation inside vmap takes its inputs as, so that its
    tape is that level's."""
    trace = innermost_batch_trace()
    if trace is None or (isinstance(t, BatchTensor) and t._tr is trace):
        return t
    return trace.wrap(t, None)


def current_level() -> int:
    """The number of ``vmap`` levels running in this thread."""
    return sum(isinstance(t, BatchTrace) and t.active for t in enclosing_traces())
