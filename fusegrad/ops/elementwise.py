"""Elementwise public ops: arithmetic, comparisons, logic, unary math, rounding, clamping,
and conversions (clone, to, type_as).
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from fusegrad import dtypes
from fusegrad.config import config
from fusegrad.device import check_device_available
from fusegrad.device import device as Device
from fusegrad.ops import prims as P
from fusegrad.ops.composite import CustomVJP, _named, composite, opmath
from fusegrad.ops.factories import ones_like, zeros_like
from fusegrad.ops.operands import (
    _dtype_title,
    _float_dtype,
    _is_scalar,
    _promote,
    as_tensor_operand,
    cast,
)
from fusegrad.ops.primitive import bind, device_transfer, traced
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor

_NARROW = frozenset({dtypes.float16, dtypes.bfloat16})


def _scalar_of_narrow(x, other) -> bool:
    """Whether ``x`` is a 16-bit float tensor and ``other`` a Python number. torch's mul and
    div kernels (all rounding modes) take such a scalar in float32 and round the result once:
    float16 x * 0.1 is x * 0.1f rounded, not x * float16(0.1) (0.0999756) rounded, and x *
    1e5 is finite where x * float16(1e5) is inf. add, sub and the other binary ops round the
    scalar to the tensor's dtype first, as torch's do (float16 1 + 1e5 is inf there too)."""
    return (type(other) is float or type(other) is int) and \
        getattr(x, "_dtype", None) in _NARROW


@public(torch=True, method=True, inplace=True)
def add(x, other, *, alpha=1) -> Tensor:
    """``x + alpha * other``."""
    if isinstance(alpha, Tensor) or alpha != 1:
        other = mul(other, alpha)
    a, b = _promote("add", x, other)
    if a.dtype is dtypes.bool_:
        return bind(P.logical_or, a, b)
    return bind(P.add, a, b)


@public(torch=True, method=True, inplace=True)
def sub(x, other, *, alpha=1) -> Tensor:
    """``x - alpha * other``."""
    if isinstance(alpha, Tensor) or alpha != 1:
        other = mul(other, alpha)
    a, b = _promote("sub", x, other)
    if a.dtype is dtypes.bool_:
        raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not supported. "
                           "Use the `^` or `logical_xor()` operator instead.")
    return bind(P.sub, a, b)


def rsub(x, other, *, alpha=1) -> Tensor:
    return sub(other, x, alpha=alpha) if isinstance(other, Tensor) else \
        sub(_promote("rsub", other, x)[0], x, alpha=alpha)


@public(torch=True, method=True, inplace=True)
def mul(x, other) -> Tensor:
    if _scalar_of_narrow(x, other) or _scalar_of_narrow(other, x):
        return opmath(mul)(x, other)
    a, b = _promote("mul", x, other)
    if a.dtype is dtypes.bool_:
        return bind(P.logical_and, a, b)
    return bind(P.mul, a, b)


@public(torch=True, method=True, inplace=True)
def div(x, other, *, rounding_mode: str | None = None) -> Tensor:
    """True division (integers give floats); ``rounding_mode`` 'floor' or 'trunc'."""
    if _scalar_of_narrow(x, other) or _scalar_of_narrow(other, x):
        return opmath(div)(x, other, rounding_mode=rounding_mode)
    if rounding_mode is None:
        if not dtypes.result_type(x, other).is_differentiable:
            # true division of integers: in the default float dtype, the Python int too
            # (int8 / 300 is 0.167; 300 wrapped to int8 first would be 44)
            fdt = dtypes.get_default_dtype()
            x, other = (cast(v, fdt) if isinstance(v, Tensor) else v for v in (x, other))
        a, b = _promote("div", x, other)
        if not a.dtype.is_differentiable:
            a, b = cast(a, dtypes.get_default_dtype()), cast(b, dtypes.get_default_dtype())
        return bind(P.div, a, b)
    if rounding_mode == "floor":
        return floor_divide(x, other)
    if rounding_mode == "trunc":
        a, b = _promote("div", x, other)
        if a.dtype.is_floating_point:
            return trunc(bind(P.div, a, b))
        q = floor_divide(a, b)
        fix = ne(remainder(a, b), 0) & ne(lt(a, 0), lt(b, 0))
        return where(fix, q + 1, q)
    raise RuntimeError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but "
                       f"found '{rounding_mode}'")


true_divide = public(div, name="true_divide", torch=True, method=True, inplace=True)


@public(torch=True, method=True, inplace=True)
def floor_divide(x, other) -> Tensor:
    """Python's ``//``: for floats, torch's (and numpy's) floor of the exact quotient, so
    ``1 // 0.1`` is 9, ``1 // -inf`` is -1 and ``inf // 1`` is nan."""
    if _scalar_of_narrow(x, other):
        return opmath(floor_divide)(x, other)
    a, b = _promote("floor_divide", x, other)
    return bind(P.floordiv, a, b)


@public(torch=True, method=True, inplace=True)
def remainder(x, other) -> Tensor:
    a, b = _promote("remainder", x, other)
    return bind(P.remainder, a, b)


@public(torch=True, method=True, inplace=True)
def fmod(x, other) -> Tensor:
    """C's fmod: the exact remainder of the truncated quotient, with the sign of ``x``."""
    a, b = _promote("fmod", x, other)
    return bind(P.fmod, a, b)


@public(torch=True, method=True, inplace=True)
def pow(x, exponent) -> Tensor:  # noqa: A001 - torch's name
    """``x ** exponent``; ``x ** 2`` and other small integer powers stay exact."""
    # Promote first: int_tensor ** 2.0 is float, bool_tensor ** 2 is int64.
    a, b = _promote("pow", x, exponent)
    if type(exponent) is int and exponent < 0 and not a.dtype.is_floating_point:
        raise RuntimeError("Integers to negative integer powers are not allowed.")
    if isinstance(x, Tensor) and _is_scalar(exponent) and not isinstance(exponent, bool):
        if exponent == 2:
            return _named(bind(P.mul, a, a), "PowBackward0")
        if exponent == 1:
            return _named(bind(P.mul, a, b), "PowBackward0")
    out = bind(P.pow_, a, b)
    name = "PowBackward0" if _is_scalar(exponent) else "PowBackward1"
    return _named(out, name)


@public(torch=True, method=True, inplace=True)
def maximum(x, other) -> Tensor:
    a, b = _promote("maximum", x, other)
    return bind(P.maximum, a, b)


@public(torch=True, method=True, inplace=True)
def minimum(x, other) -> Tensor:
    a, b = _promote("minimum", x, other)
    return bind(P.minimum, a, b)


def _compare(prim, swap=False):
    def op(x, other):
        a, b = _promote(prim.name, x, other)
        return bind(prim, b, a) if swap else bind(prim, a, b)
    return op


lt = public(_compare(P.lt), name="lt", torch=True, method=True, inplace=True)
le = public(_compare(P.le), name="le", torch=True, method=True, inplace=True)
gt = public(_compare(P.lt, swap=True), name="gt", torch=True, method=True, inplace=True)
ge = public(_compare(P.le, swap=True), name="ge", torch=True, method=True, inplace=True)
eq = public(_compare(P.eq), name="eq", torch=True, method=True, inplace=True)
ne = public(_compare(P.ne), name="ne", torch=True, method=True, inplace=True)
less = public(lt, name="less", torch=True, method=True, inplace=True)
less_equal = public(le, name="less_equal", torch=True, method=True, inplace=True)
greater = public(gt, name="greater", torch=True, method=True, inplace=True)
greater_equal = public(ge, name="greater_equal", torch=True, method=True, inplace=True)
not_equal = public(ne, name="not_equal", torch=True, method=True, inplace=True)


def _to_bool(x) -> Tensor:
    x = as_tensor_operand(x)
    return x if x.dtype is dtypes.bool_ else ne(x, 0)


@public(torch=True, method=True, inplace=True)
def logical_and(x, other) -> Tensor:
    return bind(P.logical_and, _to_bool(x), _to_bool(other))


@public(torch=True, method=True, inplace=True)
def logical_or(x, other) -> Tensor:
    return bind(P.logical_or, _to_bool(x), _to_bool(other))


@public(torch=True, method=True, inplace=True)
def logical_xor(x, other) -> Tensor:
    return bind(P.ne, _to_bool(x), _to_bool(other))


@public(torch=True, method=True, inplace=True)
def logical_not(x) -> Tensor:
    return bind(P.logical_not, _to_bool(x))


def _bitwise(name, logical, prim):
    def op(x, other):
        a, b = _promote(name, x, other)
        if a.dtype is dtypes.bool_:
            return logical(a, b)
        if a.dtype.is_floating_point:
            raise NotImplementedError(f'"{name}_cpu" not implemented for '
                                      f"'{_dtype_title(a.dtype)}'")
        return bind(prim, a, b)
    op.__name__ = name
    op.__doc__ = f"Elementwise {name} of integer or bool tensors."
    return op


bitwise_and = public(_bitwise("bitwise_and", logical_and, P.bitwise_and), name="bitwise_and",
                     torch=True, method=True, inplace=True)
bitwise_or = public(_bitwise("bitwise_or", logical_or, P.bitwise_or), name="bitwise_or",
                    torch=True, method=True, inplace=True)
bitwise_xor = public(_bitwise("bitwise_xor", logical_xor, P.bitwise_xor), name="bitwise_xor",
                     torch=True, method=True, inplace=True)


@public(torch=True, method=True, inplace=True)
def bitwise_not(x) -> Tensor:
    """``~x``: logical not of a bool tensor, the bits flipped of an integer one."""
    x = as_tensor_operand(x)
    if x.dtype is dtypes.bool_:
        return logical_not(x)
    if x.dtype.is_floating_point:
        raise TypeError("~ (operator.invert) is only implemented on integer and Boolean-type "
                        "tensors")
    ones = bind(P.full, shape=(), value=-1 if x.dtype.is_signed else
                np.iinfo(x.dtype.np_dtype).max, dtype=x.dtype)
    return bind(P.bitwise_xor, x, ones)


def _shift(name, prim, kernel):
    def op(x, other):
        a, b = _promote(name, x, other)
        if a.dtype.is_floating_point or a.dtype is dtypes.bool_:
            raise NotImplementedError(f'"{kernel}_cpu" not implemented for '
                                      f"'{_dtype_title(a.dtype)}'")
        return bind(prim, a, b)
    op.__name__ = name
    op.__doc__ = (f"Elementwise {name} of integer tensors; torch's results for amounts that are "
                  "negative or not below the width (0 to the left, the sign fill to the right).")
    return op


bitwise_left_shift = public(_shift("bitwise_left_shift", P.shift_left, "lshift"),
                            name="bitwise_left_shift", torch=True, method=True, inplace=True)
bitwise_right_shift = public(_shift("bitwise_right_shift", P.shift_right, "rshift"),
                             name="bitwise_right_shift", torch=True, method=True, inplace=True)


@public(torch=True)
def where(condition, input=None, other=None) -> Tensor:  # noqa: A002
    """Elements of ``input`` where ``condition`` holds, else of ``other``."""
    if input is None and other is None:
        return condition.nonzero(as_tuple=True)   # the method: indexing builds on this module
    cond = _to_bool(condition)
    a, b = _promote("where", input, other)
    return bind(P.where, cond, a, b)


@public(torch=True, method=True, inplace=True)
def neg(x: Tensor) -> Tensor:
    if x.dtype is dtypes.bool_:
        raise RuntimeError("Negation, the `-` operator, on a bool tensor is not supported. If you "
                           "are trying to invert a mask, use the `~` or `logical_not()` operator "
                           "instead.")
    return bind(P.neg, x)


negative = public(neg, name="negative", torch=True, method=True, inplace=True)


@public(torch=True, method=True, inplace=True)
def abs(x: Tensor) -> Tensor:  # noqa: A001
    return x if x.dtype is dtypes.bool_ else bind(P.abs_, x)


absolute = public(abs, name="absolute", torch=True, method=True, inplace=True)


def _float_unary(prim):
    def op(x: Tensor) -> Tensor:
        x = as_tensor_operand(x)
        return bind(prim, cast(x, _float_dtype(x.dtype)))
    op.__name__ = prim.name
    op.__doc__ = f"Elementwise {prim.name}; integer inputs compute in the default float type."
    return op


exp = public(_float_unary(P.exp), name="exp", torch=True, method=True, inplace=True)
exp2 = public(_float_unary(P.exp2), name="exp2", torch=True, method=True, inplace=True)
log = public(_float_unary(P.log), name="log", torch=True, method=True, inplace=True)
log2 = public(_float_unary(P.log2), name="log2", torch=True, method=True, inplace=True)
log10 = public(_float_unary(P.log10), name="log10", torch=True, method=True, inplace=True)
log1p = public(_float_unary(P.log1p), name="log1p", torch=True, method=True, inplace=True)
expm1 = public(_float_unary(P.expm1), name="expm1", torch=True, method=True, inplace=True)
sin = public(_float_unary(P.sin), name="sin", torch=True, method=True, inplace=True)
cos = public(_float_unary(P.cos), name="cos", torch=True, method=True, inplace=True)
tan = public(_float_unary(P.tan), name="tan", torch=True, method=True, inplace=True)
tanh = public(_float_unary(P.tanh), name="tanh", torch=True, method=True, inplace=True)
erf = public(_float_unary(P.erf), name="erf", torch=True, method=True, inplace=True)
sqrt = public(_float_unary(P.sqrt), name="sqrt", torch=True, method=True, inplace=True)
reciprocal = public(_float_unary(P.reciprocal), name="reciprocal", torch=True, method=True,
                    inplace=True)


@public(torch=True, method=True, inplace=True)
@composite("RsqrtBackward0")
def rsqrt(x: Tensor) -> Tensor:
    return reciprocal(sqrt(x))





@public(torch=True, method=True, inplace=True)
@composite("SigmoidBackward0")
@opmath
def sigmoid(x: Tensor) -> Tensor:
    """``1 / (1 + exp(-x))``, computed as ``e / (1 + e)`` with ``e = exp(x)`` for x < 0.

    exp(-x) overflows for x < -88 (float32): its VJP then multiplies 0 by inf and the
    gradient is NaN. exp(-|x|) never overflows; -|x| is written with where() so that its
    gradient at 0 is -1 on the x >= 0 side (abs's would be 0 and lose sigmoid'(0) = 1/4).
    """
    x = cast(x, _float_dtype(x.dtype))
    nonneg = ge(x, 0)
    e = exp(where(nonneg, neg(x), x))
    return where(nonneg, reciprocal(add(e, 1)), div(e, add(e, 1)))


def _relu_values(x: Tensor) -> Tensor:
    a, zero = _promote("relu", x, 0)
    return bind(P.where, bind(P.le, a, zero), zero, a)


# A traced ReLU's gradient reads its output, as torch's threshold_backward(g, result, 0)
# does: ``out <= 0`` exactly where ``x <= 0`` (NaN passes in both), and the output is what
# the next product saves anyway, so a compiled step holds no separate byte mask per ReLU.
_relu_from_output = CustomVJP("relu", reads_output=True, reads_operands=False)


@_relu_from_output.defvjp
def _relu_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    return (where(le(out, 0), 0.0, g),)


# Eager ReLU of a large float32 CPU tensor runs as one fused kernel forward and one backward
# (fusegrad.tracer.eager_kernels) where numpy makes a mask and a ``where`` pass each way: 3x
# faster on 1M elements, the activations of a small CNN. Below RELU_KERNEL_MIN elements the
# kernel call's own cost is what numpy's passes cost, and the single-node path is kept.
_relu_kernel = composite("ReluBackward0", kernel=True)(_relu_values)
RELU_KERNEL_MIN = 1 << 16


@public(torch=True, method=True, inplace=True)
def relu(x: Tensor) -> Tensor:
    """``max(x, 0)`` with torch's gradient: 0 at x == 0 (maximum would split the tie), and
    NaN propagates."""
    a, zero = _promote("relu", x, 0)
    if a._dtype is dtypes.float32 and not traced(a) and type(a._data) is np.ndarray and \
            a._data.size >= builtins.max(RELU_KERNEL_MIN, config.eager_kernel_threshold) and \
            config.eager_kernel_threshold > 0:
        return _relu_kernel(a)
    out = bind(P.where, bind(P.le, a, zero), zero, a)
    if traced(a):
        return _relu_from_output.mark(out, (a,))
    return _named(out, "ReluBackward0")


@public(torch=True, method=True, inplace=True)
def square(x: Tensor) -> Tensor:
    return pow(x, 2)


@public(torch=True, method=True, inplace=True)
def sign(x: Tensor) -> Tensor:
    if x.dtype.is_complex:
        raise RuntimeError("Unlike NumPy, torch.sign is not intended to support complex numbers. "
                           "Please use torch.sgn instead.")
    if x.dtype is dtypes.bool_:
        return x                 # torch's sign of a bool is the bool itself
    return bind(P.sign, x)


def _refuse_complex(x: Tensor, op: str) -> None:
    if x.dtype.is_complex:
        raise NotImplementedError(f"{op} is not supported for complex inputs")


def _rounding(prim):
    def op(x: Tensor) -> Tensor:
        _refuse_complex(x, prim.name)
        return bind(prim, x) if x.dtype.is_floating_point else x
    return op


floor = public(_rounding(P.floor), name="floor", torch=True, method=True, inplace=True)
ceil = public(_rounding(P.ceil), name="ceil", torch=True, method=True, inplace=True)


@public(torch=True, method=True, inplace=True)
def trunc(x: Tensor) -> Tensor:
    _refuse_complex(x, "trunc")
    if not x.dtype.is_floating_point:
        return x
    return _named(where(lt(x, 0), ceil(x), floor(x)), "TruncBackward0")


fix = public(trunc, name="fix", torch=True, method=True, inplace=True)


@public(torch=True, method=True, inplace=True)
def round(x: Tensor, *, decimals: int = 0) -> Tensor:  # noqa: A001
    """Round half to even, as torch; with ``decimals`` scale by ``10**decimals`` first."""
    _refuse_complex(x, "round")
    if not x.dtype.is_floating_point:
        return x
    if decimals == 0:
        return bind(P.round_, x)
    scale = 10.0 ** decimals
    return _named(div(bind(P.round_, mul(x, scale)), scale), "RoundBackward1")


@public(torch=True, method=True, inplace=True)
def clamp(x: Tensor, min=None, max=None) -> Tensor:  # noqa: A002
    """Clamp into [min, max]; either bound may be None, a number or a tensor.

    Values and gradients are torch's: a NaN input stays NaN with a zero gradient; a NaN
    bound gives NaN; at a bound the gradient goes to ``x`` (not split as in maximum); with
    tensor bounds, ``min`` gets the gradient where ``x < min < max`` and ``max`` where
    ``x > max`` or ``max < min``."""
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        return _named(_clamp_tensor(x, min, max), "ClampBackward0")
    out = x
    if min is not None:
        out = _clamp_scalar(out, min, P.maximum)
    if max is not None:
        out = _clamp_scalar(out, max, P.minimum)
    return _named(out, "ClampBackward1")


def _clamp_scalar(x, bound, prim):
    # torch's clamp_backward passes the gradient where min <= x (x <= max), so a gradient
    # of 1 at the bound itself, and 0 at NaN, whose value still passes through (detached).
    a, b = _promote("clamp", x, bound)
    inside = (bind(P.le, b, a) if prim is P.maximum else bind(P.le, a, b))
    return bind(P.where, inside, a, bind(P.where, bind(P.ne, a, a), a.detach(), b))


def _clamp_tensor(x, lo, hi):
    """clamp with a tensor bound: torch's value (``hi if hi < v else v`` for
    ``v = lo if x < lo else x``, NaN where a bound is NaN), computed detached, with its
    gradient routed by torch's masks (clamp_backward_min_max) through ``where``."""
    ops = [x] + [v for v in (lo, hi) if v is not None]
    vals = _promote("clamp", *ops)
    a = vals[0]
    mn = vals[1] if lo is not None else None
    mx = vals[-1] if hi is not None else None
    ad = a.detach()
    value = ad
    if mn is not None:
        value = bind(P.where, bind(P.lt, ad, mn.detach()), mn.detach(), value)
    if mx is not None:
        value = bind(P.where, bind(P.lt, mx.detach(), value), mx.detach(), value)
    if mn is not None and mx is not None:
        # torch's clamp kernel gives NaN for a NaN bound; so does the sum of the bounds.
        unordered = bind(P.logical_or, bind(P.ne, mn, mn), bind(P.ne, mx, mx))
        value = bind(P.where, unordered, bind(P.add, mn.detach(), mx.detach()), value)
        pass_x = bind(P.logical_and, bind(P.le, mn, a), bind(P.le, a, mx))
        take_lo = bind(P.logical_and, bind(P.lt, a, mn), bind(P.lt, mn, mx))
        take_hi = bind(P.logical_or, bind(P.lt, mx, a), bind(P.lt, mx, mn))
        return bind(P.where, pass_x, a,
                    bind(P.where, take_lo, mn, bind(P.where, take_hi, mx, value)))
    if mn is not None:
        value = bind(P.where, bind(P.ne, mn, mn), bind(P.add, ad, mn.detach()), value)
        return bind(P.where, bind(P.le, mn, a), a, bind(P.where, bind(P.lt, a, mn), mn, value))
    value = bind(P.where, bind(P.ne, mx, mx), bind(P.add, ad, mx.detach()), value)
    return bind(P.where, bind(P.le, a, mx), a, bind(P.where, bind(P.lt, mx, a), mx, value))


clip = public(clamp, name="clip", torch=True, method=True, inplace=True)


@public(torch=True, method=True)
def isnan(x: Tensor) -> Tensor:
    return ne(x, x) if x.dtype.is_differentiable else zeros_like(x, dtype=dtypes.bool_)


@public(torch=True, method=True)
def isinf(x: Tensor) -> Tensor:
    return eq(abs(x), math.inf) if x.dtype.is_differentiable else \
        zeros_like(x, dtype=dtypes.bool_)


@public(torch=True, method=True)
def isfinite(x: Tensor) -> Tensor:
    if not x.dtype.is_differentiable:
        return ones_like(x, dtype=dtypes.bool_)
    return logical_not(logical_or(isnan(x), isinf(x)))


@public(torch=True, method=True)
def isclose(x, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> Tensor:
    """``|x - other| <= atol + rtol * |other|`` with a finite ``|x - other|``, or equal (so
    inf is close to inf only); integer and bool tensors compare in the default float type."""
    if isinstance(x, Tensor) and isinstance(other, Tensor) and x.dtype is not other.dtype:
        raise RuntimeError(f"{_dtype_title(x.dtype)} did not match {_dtype_title(other.dtype)}")
    if rtol < 0:
        raise RuntimeError(f"rtol must be greater than or equal to zero, but got {rtol}")
    if atol < 0:
        raise RuntimeError(f"atol must be greater than or equal to zero, but got {atol}")
    a, b = _promote("isclose", x, other)
    close = eq(a, b)
    if equal_nan and a.dtype.is_floating_point:
        close = close | (isnan(a) & isnan(b))
    if rtol == 0 and atol == 0:
        return close
    if not a.dtype.is_floating_point:
        a, b = cast(a, dtypes.get_default_dtype()), cast(b, dtypes.get_default_dtype())
    error = abs(sub(a, b))
    return close | (isfinite(error) & le(error, add(abs(mul(b, rtol)), atol)))


@public(torch=True, method=True, inplace=True)
def nan_to_num(x: Tensor, nan: float = 0.0, posinf: float | None = None,
               neginf: float | None = None) -> Tensor:
    """NaN, +inf and -inf replaced by ``nan``, ``posinf`` and ``neginf`` (by default the
    largest and lowest finite values of the dtype); integer tensors come back unchanged.
    The gradient passes where ``x`` is finite, as torch's."""
    if not x.dtype.is_floating_point:
        return clone(x)
    info = np.finfo(x.dtype.np_dtype)
    hi = float(info.max) if posinf is None else posinf
    lo = float(info.min) if neginf is None else neginf
    a, nan_v = _promote("nan_to_num", x, nan)
    out = where(eq(a, math.inf), hi, where(eq(a, -math.inf), lo, a))
    return _named(where(isnan(a), nan_v, out), "NanToNumBackward0")


@public(torch=True, method=True)
def allclose(x, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
    # Tensor.all, the reduction: reductions builds on this module
    return bool(isclose(x, other, rtol, atol, equal_nan).all())


@public(torch=True, method=True)
def equal(x: Tensor, other: Tensor) -> bool:
    """True when both have the same shape and elements."""
    return tuple(x.shape) == tuple(other.shape) and bool(eq(x, other).all())


@public(torch=True, method=True)
def clone(x: Tensor, *, memory_format=None) -> Tensor:
    return bind(P.copy, x)


def parse_to_args(args, kwargs) -> tuple[dtypes.DType | None, object]:
    """(dtype, device) out of torch's ``to`` arguments: ``to(dtype)``, ``to(device)``,
    ``to(device, dtype)``, ``to(other)``, keywords; a positional bool (non_blocking) is
    ignored. Shared by ``Tensor.to`` and ``Module.to``."""
    dtype, dev = kwargs.get("dtype"), kwargs.get("device")
    for a in args:
        if isinstance(a, Tensor):
            dtype, dev = a.dtype, a.device
        elif isinstance(a, dtypes.DType):
            dtype = a
        elif isinstance(a, (str, Device)):
            dev = a
        elif isinstance(a, bool):
            continue
        elif isinstance(a, int):             # to(1): cuda device 1, as torch reads it
            dev = Device(a)
        else:
            raise TypeError(f"to() received an invalid combination of arguments: {a!r}")
    return (dtypes.as_dtype(dtype) if dtype is not None else None), dev


@public(method=True)
def to(x: Tensor, *args, **kwargs) -> Tensor:
    """``to(dtype)``, ``to(device)``, ``to(device, dtype)``, ``to(other)``; ``copy=True``.
    A move between the cpu and cuda copies (differentiably: ``ToCopyBackward0``)."""
    dtype, dev = parse_to_args(args, kwargs)
    copy = kwargs.get("copy", False)
    out = x
    if dev is not None:
        dev = Device(dev)
        if dev.type != x.device.type or dev.type == "cuda" and x._trace is None:
            check_device_available(dev)
            out = device_transfer(x, dev)      # x itself when it is there (cuda: the current device)
    out = out if dtype is None else cast(out, dtype)
    if copy and out is x:
        out = clone(x)
    return out


@public(method=True)
def type_as(x: Tensor, other: Tensor) -> Tensor:
    return cast(x, other.dtype)


@public(torch=True, method=True, inplace=True)
@opmath
def lerp(x: Tensor, end, weight) -> Tensor:
    """``x + weight * (end - x)``, evaluated from the nearer end as torch does (exact at
    weight 0 and 1)."""
    diff = sub(end, x)
    near_start = add(x, mul(weight, diff))
    near_end = sub(end, mul(diff, sub(1.0, weight)))
    if _is_scalar(weight):
        return near_start if builtins.abs(weight) < 0.5 else near_end
    return where(lt(abs(weight), 0.5), near_start, near_end)


@public(torch=True, method=True, inplace=True)
@opmath
def addcmul(x: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """``x + value * tensor1 * tensor2``, in the dtype the three promote to, promoted before
    the product (uint8 + int8 * int8 wrapped in int8; 16-bit floats in float32)."""
    x, tensor1, tensor2 = _promote("addcmul", x, tensor1, tensor2)
    prod = mul(tensor1, tensor2)
    return add(x, mul(prod, value) if value != 1 else prod)


@public(torch=True, method=True, inplace=True)
@opmath
def addcdiv(x: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """``x + value * tensor1 / tensor2``."""
    if not tensor1.dtype.is_floating_point and not tensor2.dtype.is_floating_point:
        raise RuntimeError("Integer division with addcdiv is no longer supported, and in a "
                           "future release addcdiv will perform a true division of tensor1 and "
                           "tensor2. The historic addcdiv behavior can be implemented as "
                           "(input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) "
                           "for integer inputs and as (input + value * tensor1 / tensor2) for "
                           "float inputs. The future addcdiv behavior is just the latter "
                           "implementation: (input + value * tensor1 / tensor2), for all dtypes.")
    x, tensor1, tensor2 = _promote("addcdiv", x, tensor1, tensor2)
    quot = div(tensor1, tensor2)
    return add(x, mul(quot, value) if value != 1 else quot)
