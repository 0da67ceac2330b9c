"""The primitives with no kernel lowering, which compiled programs run as extern steps
between kernels: sort and scan kinds, the custom VJP marker, and complex numbers' parts.
"""

from __future__ import annotations

import warnings
from typing import Callable

import numpy as np

from fusegrad import dtypes
from fusegrad.ops.primitive import (
    Kind,
    Primitive,
    Rule,
    ShapeError,
    TensorType,
    bind,
    jvp_rule,
    no_jvp,
    register,
)
from fusegrad.ops.prims_common import (
    _np_float_compute,
    _require_real,
    _sum_to,
    applied_to_tangent,
    broadcast_shapes,
    tangent_or_zeros,
    view_op,
)
from fusegrad.ops.prims_reduce import (
    _check_axes,
    _sum_dtype,
)

# torch computes log(-1) = nan and 1/0 = inf silently; numpy warns. The filter is scoped to
# the numpy calls made in this module (warnings name the calling module), so user code keeps
# numpy's default; np.errstate per call would cost ~3 us on every eager op.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=__name__)


# --------------------------------------------------------------------------- extern


def _argsort_infer(x: TensorType, *, axis, descending) -> TensorType:
    _check_axes("argsort", x, (axis,))
    _require_real("argsort", x)            # torch's sort has no order of complex numbers
    return TensorType(x.shape, dtypes.int64)


def _argsort_impl(x, *, axis, descending):
    if x.ndim == 0:
        return np.zeros((), np.int64)
    x = _np_float_compute(x)
    if descending:
        return _stable_desc(x, axis)
    return np.argsort(x, axis=axis, kind="stable")


def _stable_desc(x, axis):
    # Negating breaks ties the wrong way; sort on the reversed sequence and flip back.
    n = x.shape[axis]
    rev = np.flip(x, axis=axis)
    idx = np.argsort(rev, axis=axis, kind="stable")
    idx = np.flip(idx, axis=axis)
    return n - 1 - idx


argsort = register(Primitive("argsort", Kind.EXTERN, _argsort_infer, _argsort_impl,
                             attrs=("axis", "descending")))


def _cumsum_infer(x: TensorType, *, axis) -> TensorType:
    _check_axes("cumsum", x, (axis,))
    return TensorType(x.shape, _sum_dtype(x.dtype))


def _cumsum_vjp(g, out, x, *, axis):
    # Gradient of an inclusive prefix sum is the suffix sum: total - prefix + g.
    total = g.sum(dim=axis, keepdim=True)
    return total - g.cumsum(axis) + g


cumsum = register(Primitive(
    "cumsum", Kind.EXTERN, _cumsum_infer,
    lambda x, *, axis: np.cumsum(_np_float_compute(x), axis=axis) if x.ndim else x.copy(),
    (Rule(_cumsum_vjp),), "CumsumBackward0", attrs=("axis",)))


# --------------------------------------------------------------------------- custom VJPs

# name -> fn(ct, out, operands, params) -> one cotangent (or None) per operand: the backward
# formula of a composite op (softmax, gelu), registered by the module defining the op.
CUSTOM_VJPS: dict[str, Callable] = {}
# name -> (whether the VJP reads the output, whether it reads the operands): what an eager
# backward checks for in-place writes since the forward, as torch checks what it saved.
CUSTOM_VJP_READS: dict[str, tuple[bool, bool]] = {}
# The VJPs that recompute what they need from operands in the backward rather than share the
# forward's values: name -> the positions of those operands, or None for all (``register_vjp``).
CUSTOM_VJP_RECOMPUTES: dict[str, tuple[int, ...] | None] = {}


def register_vjp(name: str, reads_output: bool = False, reads_operands: bool = True,
                 recompute: bool | tuple[int, ...] = False):
    """Register ``fn(ct, out, operands, params)`` as the VJP named ``name`` of
    :data:`custom_vjp` nodes; ``reads_output`` and ``reads_operands`` say what it reads.
    ``recompute``: a graph's backward reads the operands through ``remat`` barriers
    (:mod:`fusegrad.passes.autodiff`), so the rule's arithmetic is computed again there and
    the operands are what the forward keeps (a layer norm's input, not its centered and
    normalized values), as torch's saved tensors are; a tuple of operand positions reads those
    alone so (a weight's float32 widening, kept from the forward, is not made again)."""
    def decorate(fn):
        CUSTOM_VJPS[name] = fn
        CUSTOM_VJP_READS[name] = (reads_output, reads_operands)
        if recompute is not False:
            CUSTOM_VJP_RECOMPUTES[name] = None if recompute is True else tuple(recompute)
        return fn
    return decorate


def _custom_vjp_infer(y: TensorType, *operands: TensorType, rule, params) -> TensorType:
    if rule not in CUSTOM_VJPS:
        raise ShapeError(f"custom_vjp: no VJP named {rule!r} is registered "
                         f"(known: {', '.join(sorted(CUSTOM_VJPS))})")
    if not isinstance(params, tuple):
        raise ShapeError(f"custom_vjp: params must be a tuple, got {params!r}")
    return y


def _custom_vjp_rule(ct, out, y, *operands, argnum, rule, params):
    if argnum == 0:
        return None     # the value's own computation gets no cotangent: the rule replaces it
    return CUSTOM_VJPS[rule](ct, out, operands, params)[argnum - 1]


# ``custom_vjp(y, *operands, rule, params)`` is ``y``, computed from ``operands`` by the
# primitives before it, with the gradient of ``operands`` given by the registered VJP
# ``rule`` instead of by differentiating those primitives. Composites (softmax, gelu) emit it
# when traced, so a compiled backward uses torch's formula (softmax: out * (g - sum(g * out)),
# saving only ``out``) rather than the chain of the forward's primitives, which saves more.
# ``simplify`` replaces it by ``y`` (after differentiation nothing reads the rule); a graph
# differentiated after that differentiates the primitives computing ``y``, which is correct.
custom_vjp = register(Primitive(
    "custom_vjp", Kind.EXTERN, _custom_vjp_infer, lambda y, *operands, rule, params: y,
    (Rule(_custom_vjp_rule, tuple(range(1, 65)), reads_output=True),), "CustomVjpBackward0",
    attrs=("rule", "params"), variadic=True))


# --------------------------------------------------------------------------- complex numbers
# A complex value's parts and its conjugate. These have no kernel lowering (nor has any op on
# a complex value): compiled programs run their numpy references as extern steps. ``real``,
# ``imag`` and ``view_as_real`` give numpy views of their operand, which the public ops mark
# as views of its storage (writes through them change it, as in torch).


def _require_complex(op: str, t: TensorType) -> None:
    if not t.dtype.is_complex:
        raise ShapeError(f"{op}: expected a complex operand, got {t}")


def _part_infer(name):
    def infer(x: TensorType) -> TensorType:
        _require_complex(name, x)
        return TensorType(x.shape, dtypes.to_real(x.dtype))
    return infer


def _real_vjp(g, out, x):
    return bind(complex_, g, g.new_zeros(()).expand(*g.shape))


def _imag_vjp(g, out, x):
    return bind(complex_, g.new_zeros(()).expand(*g.shape), g)


real = register(Primitive("real", Kind.EXTERN, _part_infer("real"), lambda x: x.real,
                          (Rule(_real_vjp),), "RealBackward0"))
imag = register(Primitive("imag", Kind.EXTERN, _part_infer("imag"), lambda x: x.imag,
                          (Rule(_imag_vjp),), "ImagBackward0"))


def _complex_infer(re: TensorType, im: TensorType) -> TensorType:
    if not (re.dtype.is_floating_point and im.dtype.is_floating_point) or \
            re.dtype not in (dtypes.float32, dtypes.float64) or \
            im.dtype not in (dtypes.float32, dtypes.float64):
        raise ShapeError(f"Expected both inputs to be Float or Double tensors but got "
                         f"{re.dtype.name} and {im.dtype.name} (complex of {re} and {im})")
    if re.dtype is not im.dtype:
        raise ShapeError(f"Expected object of scalar type {re.dtype.name} but got scalar type "
                         f"{im.dtype.name} for second argument (complex of {re} and {im})")
    return TensorType(broadcast_shapes(re.shape, im.shape, op="complex"),
                      dtypes.to_complex(re.dtype))


def _complex_impl(re, im):
    out = np.empty(np.broadcast_shapes(re.shape, im.shape),
                   np.complex64 if re.dtype == np.float32 else np.complex128)
    out.real, out.imag = re, im
    return out


complex_ = register(Primitive("complex", Kind.EXTERN, _complex_infer, _complex_impl, (
    Rule(lambda g, out, re, im: _sum_to(g.real, re.shape)),
    Rule(lambda g, out, re, im: _sum_to(g.imag, im.shape))), "ComplexBackward0"))


def _conj_infer(x: TensorType) -> TensorType:
    _require_complex("conj", x)
    return x


conj = register(Primitive("conj", Kind.EXTERN, _conj_infer, np.conjugate,
                          (Rule(lambda g, out, x: g.conj_physical()),), "ConjBackward0"))


def _view_as_real_infer(x: TensorType) -> TensorType:
    if not x.dtype.is_complex:
        raise ShapeError(f"view_as_real is only supported for complex tensors (got {x})")
    return TensorType(x.shape + (2,), dtypes.to_real(x.dtype))


def _view_as_real_impl(x):
    if x.dtype.kind != "c":
        # the one-byte stand-in whose strides a traced view's layout is worked out on
        return np.broadcast_to(x[..., None], x.shape + (2,))
    part = x.real                             # a view: x's strides, the parts' itemsize
    return np.lib.stride_tricks.as_strided(part, x.shape + (2,), part.strides + (part.itemsize,))


def _view_as_complex_infer(x: TensorType) -> TensorType:
    if x.dtype not in (dtypes.float32, dtypes.float64):
        raise ShapeError(f"view_as_complex is only supported for float and double tensors, but "
                         f"got a tensor of scalar type: {x.dtype.name}")
    if not x.ndim or x.shape[-1] != 2:
        raise ShapeError(f"Tensor must have a last dimension of size 2 (got {x})")
    return TensorType(x.shape[:-1], dtypes.to_complex(x.dtype))


def _view_as_complex_impl(x):
    if x.dtype.kind not in "f":
        return x[..., 0]                       # a layout stand-in, as above
    if x.strides[-1] != x.itemsize:
        x = np.ascontiguousarray(x)
    return x.view(np.complex64 if x.dtype == np.float32 else np.complex128)[..., 0]


view_as_real = register(Primitive(
    "view_as_real", Kind.EXTERN, _view_as_real_infer, _view_as_real_impl,
    (Rule(lambda g, out, x: view_op("view_as_complex")(g.contiguous())),), "ViewAsRealBackward0"))
view_as_complex = register(Primitive(
    "view_as_complex", Kind.EXTERN, _view_as_complex_infer, _view_as_complex_impl,
    (Rule(lambda g, out, x: view_op("view_as_real")(g)),), "ViewAsComplexBackward0"))


# --------------------------------------------------------------------------- JVP rules
# Forward mode (fusegrad.ops.dual): cumsum and the complex parts are linear, the op applied to
# the tangent; custom_vjp is its value ``y``, whose tangent the primitives computing ``y``
# gave it (a custom VJP changes the backward only).

for _prim in (cumsum, real, imag, conj, view_as_real, view_as_complex):
    jvp_rule(_prim)(applied_to_tangent(_prim))
jvp_rule(custom_vjp)(lambda ts, out, y, *operands, rule, params: ts[0])
jvp_rule(complex_)(lambda ts, out, re, im: bind(
    complex_, tangent_or_zeros(ts[0], re), tangent_or_zeros(ts[1], im)))
no_jvp(argsort, "an integer result (indices)")


# --------------------------------------------------------------------------- batching rules

from fusegrad.ops.batching import (  # noqa: E402
    axes_rule,
    batching,
    elementwise_rule,
    to_front,
)

for _prim in (argsort, cumsum):
    batching(_prim)(axes_rule(_prim, "axis"))
for _prim in (real, imag, conj, complex_, view_as_real):
    batching(_prim)(elementwise_rule(_prim))
del _prim


@batching(view_as_complex)
def _view_as_complex_batching(args, dims):
    # The pair axis is each example's last: the batch must not be there.
    return bind(view_as_complex, to_front(args[0], dims[0])), 0


@batching(custom_vjp)
def _custom_vjp_batching(args, dims, *, rule, params):
    # The value is y's; its gradient is the rule's at the level of the batched tensors
    # (the tape of vmap records custom_vjp there, with each example's params). Below, y
    # keeps the history of the primitives that computed it.
    return args[0], dims[0]
