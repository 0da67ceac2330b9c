"""The one definition of a primitive, and ``bind``: how a primitive is applied.

Every primitive is a :class:`Primitive`: its shape/dtype rule (``infer``), its numpy
reference implementation (``impl``), its VJP rule written with fusegrad's own tensor ops
(``vjp``), and the kind of lowering codegen uses (``kind``). Eager execution, the tracer, the
IR verifier and interpreter, the autodiff pass and codegen all read this one definition.

``bind(prim, *operands, **attrs)`` applies a primitive. Operands are tensors; when any of
them belongs to a trace (the tracer's abstract tensors carry a ``_trace``), the trace records
the primitive; otherwise it runs eagerly on numpy and, under grad mode, records an autograd
node. The eager path never imports the tracer: a trace plugs in through that attribute, and
a compiled function being traced through the slot the tracer fills
(:data:`fusegrad.effects.capture_lookup`). Code below the tracer that needs to know about
tracing (is this call traced? record an effect) asks the effect functions of
:mod:`fusegrad.effects`, which this module re-exports; nothing else reads the slots.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from fusegrad import effects as _effects
from fusegrad import profiling
from fusegrad.effects import (  # the effect functions, where ops and the layers above ask
    assign_captured,
    check_concrete,
    compiling,
    enclosing_traces,
    enter_optimizer,
    exit_optimizer,
    is_scalar_input,
    key_source,
    note_attribute,
    note_created,
    note_made,
    note_module,
    read_grad,
    refuse_traced,
    traced,
    write_grad,
)
from fusegrad.tensor_type import TensorType, device_suffix

__all__ = ["ConstantData", "Kind", "TensorType", "device_suffix", "infer_type", "Primitive",
           "Rule", "PRIMITIVES", "ShapeError", "bind", "register", "compiling", "traced",
           "note_made", "note_created", "read_grad", "write_grad", "refuse_traced", "check_concrete",
           "assign_captured", "enter_optimizer", "exit_optimizer", "is_scalar_input",
           "note_module", "note_attribute", "key_source", "enclosing_traces",
           "register_eager_node_recorder", "register_tensor_maker", "register_device_apply",
           "register_device_copies", "device_transfer", "device_copy_into", "jvp_rule", "no_jvp",
           "register_jvp_apply", "forward_mode_live"]


class Kind(enum.Enum):
    """How codegen lowers a primitive."""

    ELEMENTWISE = "elementwise"   # a scalar expression per element, with broadcasting
    REDUCE = "reduce"             # a reduction over a set of axes
    MOVEMENT = "movement"         # a view: folded into index arithmetic
    INDEX = "index"               # gather / scatter with data-dependent addresses
    CONTRACTION = "contraction"   # matmul
    SOURCE = "source"             # constants, iota, random numbers
    EXTERN = "extern"             # no kernel lowering (sort, cumsum): runs between kernels


class ShapeError(ValueError, RuntimeError):
    """An operation got operands whose shapes, dtypes or attributes it cannot accept.

    Also a RuntimeError, the type torch raises for these mistakes, so that code written
    against torch (``except RuntimeError``) catches it.
    """


class ConstantData:
    """A numpy array held as a node attribute (the ``constant`` primitive's value).

    Hashable and comparable by content, so CSE and the structural hash treat two equal
    constants as one.
    """

    __slots__ = ("array", "_key")

    def __init__(self, array: np.ndarray):
        self.array = np.array(array, copy=True, order="C")   # keeps 0-d arrays 0-d
        self.array.flags.writeable = False
        self._key = (self.array.dtype.str, self.array.shape, self.array.tobytes())

    def __eq__(self, other) -> bool:
        return isinstance(other, ConstantData) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"ConstantData({self.array!r})"


@dataclass(frozen=True)
class Rule:
    """The VJP of one operand: ``fn(ct, out, *primals, **attrs)`` gives its cotangent.

    ``reads`` names the operands ``fn`` looks at (the others arrive as their
    :class:`TensorType`, so eager autograd saves only what the rules of the operands that
    need a gradient read), and ``reads_output`` whether it uses the result. Rules use tensor
    ops, so one rule runs eagerly on the tape and symbolically in the autodiff pass.
    """

    fn: Callable
    reads: tuple[int, ...] = ()
    reads_output: bool = False


@dataclass(frozen=True, eq=False)
class Primitive:
    """One primitive operation.

    - ``infer(*types, **attrs) -> TensorType`` checks operands and gives the result type;
    - ``impl(*arrays, **attrs) -> np.ndarray`` is the numpy reference;
    - ``vjp``: one :class:`Rule` (or None: no gradient) per operand; a variadic primitive
      has a single rule, called with ``argnum=i`` for operand ``i``;
    - ``grad_name`` is the autograd node name PyTorch uses (``MulBackward0``).
    """

    name: str
    kind: Kind
    infer: Callable[..., TensorType]
    impl: Callable[..., np.ndarray]
    vjp: tuple[Rule | None, ...] | None = None
    grad_name: str = ""
    attrs: tuple[str, ...] = ()            # attribute names, in printing order
    variadic: bool = False
    doc: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def rule(self, i: int) -> Rule | None:
        """The VJP rule of operand ``i`` (None when it has no gradient)."""
        if self.vjp is None:
            return None
        return self.vjp[0] if self.variadic else self.vjp[i]

    def cotangent(self, i: int, ct, out, primals, attrs: dict):
        """Apply the rule of operand ``i``."""
        rule = self.rule(i)
        if self.variadic:
            return rule.fn(ct, out, *primals, argnum=i, **attrs)
        return rule.fn(ct, out, *primals, **attrs)

    def __repr__(self) -> str:
        return f"<primitive {self.name}>"


PRIMITIVES: dict[str, Primitive] = {}


def infer_type(prim: Primitive, types, attrs: dict) -> TensorType:
    """``prim``'s result type for operands of ``types``: its rule's shape and dtype, on the
    device of its operands (the first one not on the CPU; rules themselves know nothing of
    devices, and a source with no operands is on the CPU)."""
    out = prim.infer(*types, **attrs)
    device = next((t.device for t in types if t.device != "cpu"), "cpu")
    return out if device == out.device else TensorType(out.shape, out.dtype, device)


def register(prim: Primitive) -> Primitive:
    if prim.name in PRIMITIVES:
        raise ValueError(f"primitive {prim.name} defined twice")
    PRIMITIVES[prim.name] = prim
    return prim


def jvp_rule(*prims: Primitive) -> Callable:
    """Decorator: ``fn(tangents, out, *primals, **attrs)`` is the JVP rule of ``prims``.

    ``tangents`` has one entry per operand, None where the operand has no tangent (at least
    one has one); ``out`` is the primal result. The rule returns the result's tangent (None:
    zero), written with tensor ops like the VJP rules, so it runs eagerly and traced; a
    tangent of a broadcast result may keep the operands' shape (it is broadcast after).
    Forward mode (:mod:`fusegrad.ops.dual`) applies it."""
    def decorate(fn: Callable) -> Callable:
        for prim in prims:
            prim.extra["jvp"] = fn
        return fn
    return decorate


def no_jvp(prim: Primitive, reason: str) -> None:
    """Declare that ``prim``'s result has no tangent (``reason`` says why: an integer result,
    a value cut from differentiation), rather than a rule not written yet, which forward mode
    refuses."""
    prim.extra["jvp"] = None
    prim.extra["no_jvp"] = reason


def bind(prim: Primitive, *operands, **attrs):
    """Apply ``prim`` to tensor ``operands``: traced when any operand is traced, else eager."""
    if _jvp_apply is not None:
        # A forward-mode level is live: an operand with a tangent gets the result its tangent.
        out = _jvp_apply(prim, operands, attrs)
        if out is not None:
            return out
    for op in operands:
        trace = op._trace
        if trace is not None:
            return trace.process_primitive(prim, operands, attrs)
    lookup = _effects.capture_lookup
    if lookup is not None:
        capture = lookup()
        if capture is not None:
            # A compiled function is being traced: concrete tensors from outside it
            # (parameters, captured globals) are read at call time, so ops on them are
            # recorded too.
            return capture.bind_concrete(prim, operands, attrs)
    if profiling.recorder is not None:
        return _profiled_apply(prim, operands, attrs)
    if _device_apply is not None:
        # Set once a cuda tensor exists (register_device_apply): ops with a cuda operand run
        # there; until then the CPU path pays only this test.
        out = _device_apply(prim, operands, attrs)
        if out is not None:
            return out
    return _eager_apply(prim, operands, attrs)


def _profiled_apply(prim: Primitive, operands, attrs):
    """An eager primitive call while a profiler records: one event named ``aten::<prim>``
    (torch's namespace for its operators; fusegrad's primitive names are mostly aten's),
    with the operands' shapes and the bytes of the result when those are recorded."""
    rec = profiling.recorder
    stack = rec.stack()
    start = profiling.perf_counter_ns()
    out = None
    try:
        if _device_apply is not None:
            out = _device_apply(prim, operands, attrs)
        if out is None:
            out = _eager_apply(prim, operands, attrs)
        return out
    finally:
        end = profiling.perf_counter_ns()
        shapes = [list(op.shape) for op in operands] if rec.record_shapes else None
        nbytes = out.nbytes if out is not None and rec.profile_memory else 0
        rec.add("aten::" + prim.name, "cpu_op", start, end, shapes, stack, nbytes)


# ---------------------------------------------------------------- slots filled from above
# What the eager path needs from the layers above it, installed by them at import time
# through the register_* functions below (never assigned from outside). Kept as module
# globals: _eager_apply reads them on every eager op.

# (prim, operands, attrs, out) -> None: gives ``out`` its autograd node.
_record_eager_node: Callable | None = None
# (array, dtype) -> Tensor: wraps an eager result.
_make_tensor: Callable | None = None
# (prim, operands, attrs) -> the result on the device, or None when no operand is there.
_device_apply: Callable | None = None
# (prim, operands, attrs) -> the result with its tangent, or None when no operand has one.
_jvp_apply: Callable | None = None


def register_eager_node_recorder(fn: Callable) -> None:
    """Install ``fn(prim, operands, attrs, out)``, called after every differentiable eager
    primitive to record its node on the tape. Filled by :mod:`fusegrad.ops.tape`."""
    global _record_eager_node
    _record_eager_node = fn


def register_tensor_maker(fn: Callable) -> None:
    """Install ``fn(array, dtype) -> Tensor``, which wraps an eager primitive's numpy
    result (no copy, no checks). Filled by :mod:`fusegrad.ops` with ``Tensor._wrap``."""
    global _make_tensor
    _make_tensor = fn


# (tensor, device) -> the tensor on ``device`` (differentiably; itself when it is there), and
# (device buffer, host array or device buffer) -> None, writing into the buffer.
_device_transfer: Callable | None = None
_device_copy_into: Callable | None = None


def register_device_copies(transfer: Callable, copy_into: Callable) -> None:
    """Install the copies between the host and a device: ``transfer(tensor, device)`` and
    ``copy_into(buffer, source)``. Filled by :mod:`fusegrad.tracer.eager_cuda` at import
    (``import fusegrad`` imports it; no CUDA package is loaded until a copy runs)."""
    global _device_transfer, _device_copy_into
    _device_transfer, _device_copy_into = transfer, copy_into


def device_transfer(t, device):
    """``t`` on ``device`` (a cuda device): the device runtime's transfer."""
    return _device_transfer(t, device)


def device_copy_into(buffer, source) -> None:
    """Write ``source`` into the device buffer ``buffer``: the device runtime's copy."""
    _device_copy_into(buffer, source)


def register_device_apply(fn: Callable) -> None:
    """Install ``fn(prim, operands, attrs)``, which runs ``prim`` on the device of its cuda
    operands and returns the result, or None when no operand is on a device (the CPU path
    runs then). Filled by :mod:`fusegrad.tracer.eager_cuda` when the first cuda tensor is
    made, so that until then the CPU path pays only a test of None."""
    global _device_apply
    _device_apply = fn


def forward_mode_live() -> bool:
    """Whether a forward-mode level is live (and ``bind`` computes tangents): code that
    computes a result other than by ``bind`` (a fused eager kernel) steps aside then."""
    return _jvp_apply is not None


def register_jvp_apply(fn: Callable | None) -> None:
    """Install ``fn(prim, operands, attrs)``, which applies ``prim`` with forward mode's
    tangents, or None when no operand has one. Filled by :mod:`fusegrad.ops.dual` while a
    forward-mode level is live and emptied after, so that without one ``bind`` pays only a
    test of None."""
    global _jvp_apply
    _jvp_apply = fn


# Result types of eager primitive calls by (primitive, operand shapes and dtypes, attributes):
# most eager programs repeat a few signatures, and a rule's checks cost more than the lookup.
# Only successful inferences are kept (an error is raised afresh each time); bounded.
_INFER_CACHE: dict = {}
_INFER_CACHE_LIMIT = 8192


def _infer_key(prim: Primitive, operands, attrs) -> tuple:
    # Spelled out for one and two operands, the common cases: this runs for every eager op.
    if len(operands) == 1:
        x = operands[0]
        key = (prim, (x._data.shape, x._dtype))
    elif len(operands) == 2:
        x, y = operands
        key = (prim, (x._data.shape, x._dtype), (y._data.shape, y._dtype))
    else:
        key = (prim, *[(op._data.shape, op._dtype) for op in operands])
    return (*key, *attrs.items()) if attrs else key


def _infer(prim: Primitive, operands, attrs) -> "TensorType":
    key = _infer_key(prim, operands, attrs)
    try:
        return _INFER_CACHE[key]
    except KeyError:
        pass
    except TypeError:            # an unhashable attribute (a list): no caching
        return prim.infer(*(op._type() for op in operands), **attrs)
    out_type = prim.infer(*(op._type() for op in operands), **attrs)
    if len(_INFER_CACHE) >= _INFER_CACHE_LIMIT:
        _INFER_CACHE.clear()
    _INFER_CACHE[key] = out_type
    return out_type


def _eager_apply(prim: Primitive, operands, attrs):
    # The inference key (as _infer_key makes it) and the arrays, spelled out for one and two
    # operands: this runs for every eager op, and a comprehension is a call of its own.
    n = len(operands)
    if n == 2:
        x, y = operands
        arrays = (x._data, y._data)
        key = (prim, (arrays[0].shape, x._dtype), (arrays[1].shape, y._dtype))
    elif n == 1:
        x = operands[0]
        arrays = (x._data,)
        key = (prim, (arrays[0].shape, x._dtype))
    else:
        arrays = [op._data for op in operands]
        key = (prim, *[(a.shape, op._dtype) for a, op in zip(arrays, operands)])
    try:
        out_type = _INFER_CACHE[(*key, *attrs.items()) if attrs else key]
    except (KeyError, TypeError):
        out_type = _infer(prim, operands, attrs)
    result = prim.impl(*arrays, **attrs)
    # numpy returns scalars from 0-d ufuncs and its own dtypes from some reductions:
    # the primitive's rule decides the result type.
    if type(result) is not np.ndarray:
        result = np.asarray(result)
    dtype = out_type.dtype
    want = dtype.np_dtype
    if result.dtype is not want and result.dtype != want:
        with np.errstate(over="ignore"):      # a float out of the dtype's range is inf
            result = result.astype(want)
    out = _make_tensor(result, dtype)
    if prim.vjp is not None:          # else no node is recorded: spare the call
        _record_eager_node(prim, operands, attrs, out)
    return out
