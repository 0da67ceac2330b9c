"""The one definition of a primitive, and ``bind``: how a primitive is applied.

Every primitive is a :class:`Primitive`: its shape/dtype rule (``infer``), its numpy
reference implementation (``impl``), its VJP rule written with fusegrad's own tensor ops
(``vjp``), and the kind of lowering codegen uses (``kind``). Eager execution, the tracer, the
IR verifier and interpreter, the autodiff pass and codegen all read this one definition.

``bind(prim, *operands, **attrs)`` applies a primitive. Operands are tensors; when any of
them belongs to a trace (the tracer's abstract tensors carry a ``_trace``), the trace records
the primitive; otherwise it runs eagerly on numpy and, under grad mode, records an autograd
node. The eager path never imports the tracer: a trace plugs in through that attribute, and
a compiled function being traced through the slot the tracer fills (``_capture_lookup``).
Code below the tracer that needs to know about tracing (is this call traced? record an
effect) asks the effect functions of the "trace slots and effects" section; nothing else
reads the slots.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from fusegrad import profiling
from fusegrad.dtypes import DType

__all__ = ["ConstantData", "Kind", "TensorType", "device_suffix", "infer_type", "Primitive",
           "Rule", "PRIMITIVES", "ShapeError", "bind", "register", "compiling", "traced",
           "note_made", "note_created", "read_grad", "write_grad", "refuse_traced", "check_concrete",
           "assign_captured", "enter_optimizer", "exit_optimizer", "is_scalar_input",
           "note_module", "note_attribute", "key_source", "enclosing_traces"]


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


@dataclass(frozen=True)
class TensorType:
    """The abstract value of a tensor: its shape, dtype and device, no data.

    ``device`` is a device string (``"cpu"``, ``"cuda"``, ``"cuda:1"``); the IR text shows
    it only when it is not the CPU (``f32[4,8]@cuda``), so CPU programs print as before."""

    shape: tuple[int, ...]
    dtype: DType
    device: str = "cpu"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __str__(self) -> str:
        text = f"{self.dtype.short}[{','.join(map(str, self.shape))}]"
        return text if self.device == "cpu" else f"{text}{device_suffix(self.device)}"


def device_suffix(device: str) -> str:
    """The IR spelling of a non-CPU device after a type: ``@cuda``, ``@"cuda:1"`` (a global
    token of the IR's lexer, quoted when it holds a colon)."""
    return f'@"{device}"' if ":" in device else f"@{device}"


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


def bind(prim: Primitive, *operands, **attrs):
    """Apply ``prim`` to tensor ``operands``: traced when any operand is traced, else eager."""
    for op in operands:
        trace = op._trace
        if trace is not None:
            return trace.process_primitive(prim, operands, attrs)
    lookup = _capture_lookup
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
        # Set once a cuda tensor exists (fusegrad.runtime.eager_cuda): ops with a cuda
        # operand run there; until then the CPU path pays only this test.
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


# ------------------------------------------------------------------ trace slots and effects
#
# The tracer (fusegrad.tracer.state) owns the trace state, per thread, and fills these slots
# while some thread holds what they look up; None while no thread does. Below the tracer,
# code never reads trace state: bind consults the capture slot, and everything else asks the
# effect functions after the slots, each of which costs one truth test while nothing is
# traced.

# () -> this thread's innermost state capture of a compiled function being traced
# (a fusegrad.tracer.capture.StateCapture), or None.
_capture_lookup: Callable[[], Any] | None = None
# () -> this thread's innermost random key source (a callable (generator, count) -> key
# tensor that the tracer or vmap pushed), or None.
_key_source_lookup: Callable[[], Any] | None = None
# () -> the GraphTraces running user code in this thread, innermost last.
_traces_lookup: Callable[[], list] | None = None


def set_capture_lookup(lookup: Callable[[], Any] | None) -> None:
    """Fill (or empty, with None) the slot bind consults for a compiled function being
    traced. Only the tracer calls this (fusegrad.tracer.state)."""
    global _capture_lookup
    _capture_lookup = lookup


def set_key_source_lookup(lookup: Callable[[], Any] | None) -> None:
    """Fill (or empty) the slot :func:`key_source` reads (fusegrad.tracer.state)."""
    global _key_source_lookup
    _key_source_lookup = lookup


def set_traces_lookup(lookup: Callable[[], list] | None) -> None:
    """Fill (or empty) the slot :func:`enclosing_traces` reads (fusegrad.tracer.state)."""
    global _traces_lookup
    _traces_lookup = lookup


def _capture():
    # Read once: another thread may empty the slot between a test and a call.
    lookup = _capture_lookup
    return lookup() if lookup is not None else None


def compiling() -> bool:
    """Whether a compiled function is being traced now, in this thread: every op is then
    recorded, so eager shortcuts (numpy on a tensor's data, effects kept in Python) are off."""
    lookup = _capture_lookup
    return lookup is not None and lookup() is not None


def traced(*tensors) -> bool:
    """Whether an op on ``tensors`` is recorded rather than run: one of them belongs to a
    trace (``fusegrad.trace``), or a compiled function is being traced."""
    return compiling() or any(t._trace is not None for t in tensors)


def note_made(t) -> None:
    """``t`` is a new tensor object. While a compiled function is traced, it belongs to that
    trace: a constant of the graph unless its storage turns out to be older (``p.detach()``)."""
    lookup = _capture_lookup
    if lookup is not None:
        capture = lookup()
        if capture is not None:
            capture.note_made(t)


def note_created(t) -> None:
    """Mark ``t``, made by a tensor factory, as created by the code being traced (a constant
    of the graph) rather than captured from outside it (an input read at call time)."""
    capture = _capture()
    if capture is not None:
        capture.note_created(t)


def read_grad(t):
    """``t.grad`` while a compiled function is traced (:func:`compiling`): the gradient
    present at call time (a graph input), or the one the trace wrote since."""
    return _capture().get_grad(t)


def write_grad(t, value) -> None:
    """``t.grad = value`` while a compiled function is traced: written back after each call."""
    _capture().set_grad(t, value)


def refuse_traced(what: str) -> None:
    """Raise ``ConcretizationError`` naming ``what`` (``"assigning f32[3].data"``) while a
    compiled function is traced: it would happen once, at trace time. Nothing otherwise."""
    capture = _capture()
    if capture is not None:
        capture.refuse(what)


def check_concrete(t, what: str) -> None:
    """Raise ``ConcretizationError`` when ``what`` (``"item()"``) needs the value of ``t``
    and a compiled function is traced that reads ``t`` at call time. Nothing otherwise."""
    capture = _capture()
    if capture is not None:
        capture.check_concrete(t, what)


def assign_captured(x, value, op: str):
    """The in-place write ``op`` of ``value`` into concrete ``x`` while a compiled function is
    traced: a write to a tensor from outside it (a parameter, an optimizer's state) becomes
    an output written back at call time. Returns ``x``'s new tensor."""
    return _capture().assign_concrete(x, value, op)


def enter_optimizer(opt):
    """``opt.step()`` begins. While a compiled function is traced, its learning rates become
    inputs read at each call and the structure of its state is guarded; returns what
    :func:`exit_optimizer` restores (None when nothing is traced)."""
    capture = _capture()
    return None if capture is None else (capture, capture.enter_optimizer(opt))


def exit_optimizer(token) -> None:
    """``opt.step()`` ends: undo what :func:`enter_optimizer` swapped in."""
    if token is not None:
        capture, replaced = token
        capture.exit_optimizer(replaced)


def is_scalar_input(value) -> bool:
    """Whether ``value`` is a hyperparameter a compiled function being traced reads at each
    call (a 0-d graph input whose value is unknown while tracing)."""
    capture = _capture()
    return capture is not None and capture.is_scalar_input(value)


def note_module(module) -> None:
    """``module`` is called: while a compiled function is traced, its hooks and state are
    part of what the graph's guards check."""
    capture = _capture()
    if capture is not None:
        capture.note_module(module)


def note_attribute(holder: dict, name: str, value, buffer: bool) -> None:
    """A traced tensor ``value`` is stored in ``holder[name]`` (a module's ``__dict__``, or
    its buffers when ``buffer``) while a compiled function is traced: the attribute is
    restored after the trace and written back after each call."""
    capture = _capture()
    if capture is not None:
        capture.note_attribute(holder, name, value, buffer)


def key_source():
    """Where random ops in this thread take their keys now: a callable
    ``(generator, count) -> key tensor`` (a trace's key input, vmap's recorded keys), or
    None for the generator itself."""
    lookup = _key_source_lookup
    return lookup() if lookup is not None else None


def enclosing_traces() -> list:
    """The traces running user code in this thread, innermost last (empty when none): a
    symbolic tensor of one of them met by an inner trace is a free variable."""
    lookup = _traces_lookup
    return lookup() if lookup is not None else []

# Set by fusegrad.autograd.engine at import: (prim, operands, attrs, out) -> None.
_record_eager_node: Callable | None = None
_make_tensor: Callable | None = None
# Set by fusegrad.runtime.eager_cuda when the first cuda tensor is made:
# (prim, operands, attrs) -> the result on the device, or None when no operand is there.
_device_apply: Callable | None = None


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
