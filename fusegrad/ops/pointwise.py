"""More elementwise public ops, each a composition of the elementwise primitives (so traced,
differentiated and fused like any other): sign and magnitude (``copysign``, ``signbit``,
``sgn``, ``frac``), NaN-aware extrema (``fmax``, ``fmin``), log-space sums (``logaddexp``),
``hypot``, ``xlogy``, ``logit``, ``sinc``, angle conversions, predicates, and torch's aliases
(``divide``, ``multiply``, ``subtract``, ``positive``, ``clamp_min``, ``clamp_max``).
"""

from __future__ import annotations

import math

from fusegrad import dtypes
from fusegrad.ops.composite import _named, custom_vjp, opmath
from fusegrad.ops.elementwise import (
    abs,
    add,
    clamp,
    div,
    eq,
    exp2,
    ge,
    isfinite,
    isinf,
    isnan,
    le,
    log,
    log1p,
    logical_and,
    logical_or,
    lt,
    maximum,
    minimum,
    mul,
    neg,
    pow,
    reciprocal,
    sin,
    sub,
    trunc,
    where,
)
from fusegrad.ops.factories import ones_like, zeros_like
from fusegrad.ops.inplace import assign_
from fusegrad.ops.operands import _float_dtype, _promote, as_tensor_operand, cast
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor

divide = public(div, name="divide", torch=True, method=True, inplace=True)
multiply = public(mul, name="multiply", torch=True, method=True, inplace=True)
subtract = public(sub, name="subtract", torch=True, method=True, inplace=True)


def _floats(name: str, *operands) -> list[Tensor]:
    """Operands promoted together, then to the default float type when integral."""
    vals = _promote(name, *operands)
    dt = _float_dtype(vals[0].dtype)
    return [cast(v, dt) for v in vals]


@public(torch=True, method=True)
def positive(x: Tensor) -> Tensor:
    """``x`` itself (``+x``); an error for bool tensors, as torch."""
    if x.dtype is dtypes.bool_:
        raise RuntimeError("The `+` operator, on a bool tensor is not supported.")
    return x


@public(torch=True, method=True, inplace=True)
def clamp_min(x: Tensor, min) -> Tensor:  # noqa: A002
    """``clamp(x, min=min)``."""
    return clamp(x, min=min)


@public(torch=True, method=True, inplace=True)
def clamp_max(x: Tensor, max) -> Tensor:  # noqa: A002
    """``clamp(x, max=max)``."""
    return clamp(x, max=max)


@public(torch=True, method=True, inplace=True)
def frac(x: Tensor) -> Tensor:
    """The fractional part ``x - trunc(x)``, with the sign of ``x``; gradient 1."""
    if not x.dtype.is_floating_point:
        raise RuntimeError(f'"frac_cpu" not implemented for \'{x.dtype.name.capitalize()}\'')
    return _named(sub(x, trunc(x).detach()), "FracBackward0")


@public(torch=True, method=True)
def signbit(x: Tensor) -> Tensor:
    """Whether the sign bit is set: true for -0.0 too (``1 / -0.0`` is -inf)."""
    x = as_tensor_operand(x)
    if x.dtype is dtypes.bool_ or (not x.dtype.is_floating_point and not x.dtype.is_signed):
        return zeros_like(x, dtype=dtypes.bool_)
    if not x.dtype.is_floating_point:
        return lt(x, 0)
    x = x.detach()
    return logical_or(lt(x, 0), logical_and(eq(x, 0), lt(reciprocal(x), 0)))


@public(torch=True, method=True, inplace=True)
def copysign(x, other) -> Tensor:
    """``|x|`` with the sign (bit) of ``other``; integers compute in the default float type.
    The gradient is torch's: ``out / x`` for ``x`` (0 where ``x`` is 0, NaN where it is
    infinite), and zeros for ``other``, which stays in the graph (``autograd.grad`` with respect
    to it gives zeros, not an unused-input error)."""
    a, b = _floats("copysign", x, other)
    return _named(_copysign_values(a, b), "CopysignBackward0")


@custom_vjp("copysign", reads_output=True)
def _copysign_values(a: Tensor, b: Tensor) -> Tensor:
    return where(signbit(b), neg(abs(a)), abs(a))


@_copysign_values.defvjp
def _copysign_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    """torch's copysign_tensor_self_backward: ``g * out / x``, masked to 0 where ``x`` is 0."""
    a, b = operands
    ratio = where(eq(a, 0), 0.0, div(out, a))
    return mul(g, ratio).sum_to_size(a.shape), zeros_like(b)


@public(torch=True, method=True, inplace=True)
def deg2rad(x: Tensor) -> Tensor:
    """Degrees to radians."""
    (a,) = _floats("deg2rad", x)
    return mul(a, math.pi / 180.0)


@public(torch=True, method=True, inplace=True)
def rad2deg(x: Tensor) -> Tensor:
    """Radians to degrees."""
    (a,) = _floats("rad2deg", x)
    return mul(a, 180.0 / math.pi)


def _nan_aware(name, extremum, keeps):
    def op(x, other) -> Tensor:
        a, b = _promote(name, x, other)
        if not a.dtype.is_floating_point:
            return extremum(a, b)
        # a where it wins or ties, or b is NaN: a tie's gradient goes to a alone, as torch's
        return where(logical_or(keeps(a, b), isnan(b)), a, b)
    op.__name__ = name
    op.__doc__ = (f"Elementwise {name[1:]}imum that ignores a NaN when the other element is a "
                  "number (NaN only where both are).")
    return op


fmax = public(_nan_aware("fmax", maximum, ge), name="fmax", torch=True, method=True)
fmin = public(_nan_aware("fmin", minimum, le), name="fmin", torch=True, method=True)


@public(torch=True, method=True, inplace=True)
@opmath
def hypot(x, other) -> Tensor:
    """``sqrt(x**2 + other**2)`` without overflow or underflow in the squares (the operands
    scaled by the larger magnitude, held constant: the gradient stays x / hypot); infinite
    where either operand is, NaN or not, as C's hypot."""
    a, b = _promote("hypot", x, other)
    m = maximum(abs(a), abs(b)).detach()
    scale = where(logical_or(eq(m, 0), isinf(m)), ones_like(m), m)
    sa, sb = div(a, scale), div(b, scale)
    out = mul(pow(add(mul(sa, sa), mul(sb, sb)), 0.5), scale)
    out = where(logical_or(isinf(a), isinf(b)), math.inf, out)
    return _named(out, "HypotBackward0")


def _logaddexp(name, log1p_exp, scale):
    @opmath
    def op(x, other) -> Tensor:
        a, b = _floats(name, x, other)
        m = maximum(a, b)
        # log(e^a + e^b) = max + log1p(e^-|a-b|): never overflows. Equal infinities give
        # that infinity (their difference is NaN); at a == b the gradient splits in half,
        # from maximum's tie rule (abs' gradient at 0 is 0).
        out = add(m, div(log1p_exp(neg(abs(sub(a, b)))), scale))
        return where(logical_and(isinf(a), eq(a, b)), a, out)
    op.__name__ = name
    return op


logaddexp = public(_logaddexp("logaddexp", lambda d: log1p(d.exp()), 1.0),
                   name="logaddexp", torch=True, method=True)
logaddexp.__doc__ = "``log(exp(x) + exp(other))``, without overflow."
logaddexp2 = public(_logaddexp("logaddexp2", lambda d: log1p(exp2(d)), math.log(2.0)),
                    name="logaddexp2", torch=True, method=True)
logaddexp2.__doc__ = "``log2(2**x + 2**other)``, without overflow."


@public(torch=True, method=True, inplace=True)
def xlogy(x, other) -> Tensor:
    """``x * log(other)``, 0 where ``x`` is 0 (unless ``other`` is NaN), as torch."""
    a, b = _floats("xlogy", x, other)
    zero = logical_and(eq(a, 0), _not_nan(b))
    safe_b = where(zero, ones_like(b), b)
    out = where(zero, zeros_like(a), mul(a, log(safe_b)))
    # Where x is 0 the value is 0, and the derivative in x is still log(y) (torch's): a term
    # x * log(y) that is 0 there, log(y) kept where finite. x is masked to 0 elsewhere, where
    # the slope is 0: an infinite x times it was NaN (xlogy(inf, 0) is -inf).
    at_zero = log(where(zero, b, ones_like(b)))
    slope = where(isfinite(at_zero), at_zero, zeros_like(at_zero))
    return _named(add(out, mul(where(zero, a, zeros_like(a)), slope)), "XlogyBackward0")


def _not_nan(x: Tensor) -> Tensor:
    """Where ``x`` is not NaN."""
    return eq(x, x)


@public(torch=True, method=True)
def float_power(x, exponent) -> Tensor:
    """``x ** exponent`` computed in float64."""
    a = cast(as_tensor_operand(x), dtypes.float64)
    b = cast(exponent, dtypes.float64) if isinstance(exponent, Tensor) else float(exponent)
    return pow(a, b)


@public(torch=True, method=True, inplace=True)
def ldexp(x, other) -> Tensor:
    """``x * 2**other``."""
    a, b = _floats("ldexp", x, other)
    return mul(a, exp2(b))


@public(torch=True, method=True, inplace=True)
@opmath
def logit(x: Tensor, eps: float | None = None) -> Tensor:
    """``log(x / (1 - x))``, with ``x`` clamped into [eps, 1 - eps] when ``eps`` is given."""
    (a,) = _floats("logit", x)
    if eps is not None:
        a = clamp(a, eps, 1.0 - eps)
    return _named(sub(log(a), log1p(neg(a))), "LogitBackward0")


@public(torch=True, method=True, inplace=True)
@opmath
def sinc(x: Tensor) -> Tensor:
    """``sin(pi x) / (pi x)``, 1 at 0 (with gradient 0 there)."""
    (a,) = _floats("sinc", x)
    zero = eq(a, 0)
    px = mul(where(zero, ones_like(a), a), math.pi)
    return _named(where(zero, ones_like(a), div(sin(px), px)), "SincBackward0")


@public(torch=True, method=True, inplace=True)
def heaviside(x: Tensor, values) -> Tensor:
    """The Heaviside step: 0 below zero, 1 above, ``values`` at zero (no gradient)."""
    a, v = _promote("heaviside", x, values)
    a, v = a.detach(), v.detach()
    step = cast(lt(zeros_like(a), a), a.dtype)
    return where(eq(a, 0), v, step)


@public(torch=True, method=True)
def isposinf(x: Tensor) -> Tensor:
    """Where ``x`` is +inf."""
    return logical_and(isinf(x), lt(0, x)) if x.dtype.is_floating_point else \
        zeros_like(x, dtype=dtypes.bool_)


@public(torch=True, method=True)
def isneginf(x: Tensor) -> Tensor:
    """Where ``x`` is -inf."""
    return logical_and(isinf(x), lt(x, 0)) if x.dtype.is_floating_point else \
        zeros_like(x, dtype=dtypes.bool_)


@public(torch=True, method=True)
def isreal(x: Tensor) -> Tensor:
    """True everywhere: fusegrad's tensors are real."""
    return ones_like(x, dtype=dtypes.bool_)


@public(torch=True, method=True)
def is_same_size(x: Tensor, other: Tensor) -> bool:
    """Whether both have the same shape."""
    return tuple(x.shape) == tuple(other.shape)


@public(torch=True, method=True)
def is_signed(x: Tensor) -> bool:
    """Whether the dtype is signed (floats and signed integers)."""
    return x.dtype.is_signed


@public(torch=True, method=True)
def is_nonzero(x: Tensor) -> bool:
    """The truth of a one-element tensor."""
    if x.numel() != 1:
        if x.numel() == 0:
            raise RuntimeError("Boolean value of Tensor with no values is ambiguous")
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    return bool(x.item())


@public(torch=True, method=True)
def is_inference(x: Tensor) -> bool:
    """False: fusegrad has no inference tensors (``inference_mode`` is ``no_grad`` plus a
    flag), so every tensor can take part in autograd later."""
    return False


@public(torch=True, method=True)
def hardshrink(x: Tensor, lambd: float = 0.5) -> Tensor:
    """``x`` where ``|x| > lambd`` (or NaN), else 0."""
    return where(logical_or(lt(lambd, abs(x)), isnan(x)), x, zeros_like(x))


def _float_power_(x: Tensor, exponent) -> Tensor:
    """``x.float_power_(exponent)``: in place, so ``x`` must already be float64 (torch's rule)."""
    if x.dtype is not dtypes.float64:
        raise RuntimeError(f"the base given to float_power_ has dtype "
                           f"{x.dtype.name.capitalize()} but the operation's result requires "
                           f"dtype Double")
    return assign_(x, float_power(x, exponent), "float_power_")


# Not a registry in-place variant: those cast the result to x's dtype, torch refuses here.
Tensor.float_power_ = _float_power_
