"""torch.nn.functional's activations: relu, gelu, silu, softplus, the ELU family, the hard
and shrink functions, prelu, glu.

Each is a composition of fusegrad's public ops, never numpy math, so that a trace records
primitives and fusion sees through them; one made of several primitives is a
:func:`~fusegrad.ops.composite.composite`, one autograd node with torch's name
(``GeluBackward0``). Where torch's own formula would give a NaN gradient through an
unselected ``where`` branch (exp overflow in softplus and ELU), the branch input is made safe
first: ``where``'s VJP multiplies the unselected branch by 0, and 0 * inf is NaN.
"""

from __future__ import annotations

import math

from fusegrad import dtypes
from fusegrad.grad_mode import is_grad_enabled as _grad_enabled
from fusegrad.ops import functional as F
from fusegrad.ops.autocast import wrap_namespace
from fusegrad.ops.composite import composite, custom_vjp, opmath
from fusegrad.ops.prims import normalize_axis
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor

__all__ = ["relu", "relu_", "gelu", "silu", "softplus", "leaky_relu", "hardtanh", "relu6", "elu",
           "selu", "celu", "mish", "hardswish", "hardsigmoid", "prelu", "softsign", "tanhshrink",
           "logsigmoid", "softshrink", "hardshrink", "threshold", "threshold_", "glu"]


def relu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002 - torch's names
    """``max(x, 0)``; the gradient at 0 is 0, as torch's."""
    return input.relu_() if inplace else F.relu(input)


def relu_(input: Tensor) -> Tensor:  # noqa: A002
    return relu(input, inplace=True)


# The forward and its VJP build these factors alike, so that CSE (after strip-barriers)
# computes each once: the VJP's tanh or erf is the forward's.
def _gelu_tanh_inner(x: Tensor) -> Tensor:
    # torch's kBeta = sqrt(2) * (2 / sqrt(pi)) * 0.5 = sqrt(2 / pi)
    return F.mul(F.add(x, F.mul(F.mul(F.mul(x, x), x), 0.044715)), math.sqrt(2.0 / math.pi))


def _gelu_one_plus(x: Tensor, approximate: str) -> Tensor:
    """``1 + tanh(inner)`` or ``1 + erf(x / sqrt 2)``: twice the normal CDF (or its tanh form)."""
    if approximate == "tanh":
        return F.add(F.tanh(_gelu_tanh_inner(x)), 1.0)
    return F.add(F.erf(F.mul(x, 1.0 / math.sqrt(2.0))), 1.0)


@custom_vjp("gelu")
def _gelu_values(x: Tensor, approximate: str) -> Tensor:
    return F.mul(F.mul(x, 0.5), _gelu_one_plus(x, approximate))


@_gelu_values.defvjp
def _gelu_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    """torch's GeluBackward: ``g * (cdf + x * pdf)``, one factor of ``x`` alone, which the
    forward's kernel computes beside the output (sharing its erf or tanh) and saves in place
    of the three values the chain rule through the forward's primitives reads."""
    (x,), (approximate,) = operands, params
    cdf = F.mul(_gelu_one_plus(x, approximate), 0.5)
    if approximate == "tanh":
        # d/dx of 0.5 * x * (1 + t): cdf + 0.5 * x * (1 - t^2) * kBeta * (1 + 3 kKappa x^2)
        t = F.tanh(_gelu_tanh_inner(x))
        inner_grad = F.mul(F.add(F.mul(F.mul(x, x), 3 * 0.044715), 1.0), math.sqrt(2.0 / math.pi))
        d = F.add(cdf, F.mul(F.mul(F.mul(x, 0.5), F.sub(1.0, F.mul(t, t))), inner_grad))
    else:
        pdf = F.mul(F.exp(F.mul(F.mul(x, x), -0.5)), 1.0 / math.sqrt(2.0 * math.pi))
        d = F.add(cdf, F.mul(x, pdf))
    return (F.mul(g, d),)


_gelu_wide = opmath(_gelu_values)


# A 16-bit GELU's gradient reads its 16-bit input, as torch's GeluBackward saves it, and
# recomputes the erf (or tanh) in the backward (float32 arithmetic, rounded once): a backward
# holds 2 bytes an element where the float32 factor the forward could compute beside its
# output (as the float32 GELU's kernel does, sharing its erf) would hold 4.
@custom_vjp("gelu_16bit", recompute=True)
def _gelu_16bit(x: Tensor, approximate: str) -> Tensor:
    return _gelu_wide(x, approximate)


@_gelu_16bit.defvjp
def _gelu_16bit_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    (x,) = operands
    wide = F.cast(x, dtypes.float32)
    return (F.cast(_gelu_vjp(F.cast(g, dtypes.float32), out, (wide,), params)[0], x.dtype),)


def _gelu_values_any(x: Tensor, approximate: str) -> Tensor:
    narrow = x.dtype in (dtypes.bfloat16, dtypes.float16)
    return (_gelu_16bit if narrow else _gelu_wide)(x, approximate)


_gelu = composite("GeluBackward0", kernel=True)(_gelu_values_any)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:  # noqa: A002
    """Gaussian error linear unit: ``x * Phi(x)`` (``approximate='tanh'``: Hendrycks' tanh
    form)."""
    if approximate not in ("none", "tanh"):
        raise RuntimeError("approximate argument must be either none or tanh.")
    return _gelu(input, approximate)


@composite("SiluBackward0", kernel=True)
@opmath
def _silu(x: Tensor) -> Tensor:
    return F.mul(x, F.sigmoid(x))


def silu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    """``x * sigmoid(x)`` (swish)."""
    return _maybe_inplace(input, inplace, _silu)


@composite("SoftplusBackward0", kernel=True)
@opmath
def _softplus(x: Tensor, beta: float, threshold: float) -> Tensor:
    xb = F.mul(x, beta) if beta != 1 else x
    linear = F.gt(xb, threshold)
    # exp() of the linear region could overflow, and 0 * inf would poison its gradient.
    safe = F.where(linear, 0.0, xb)
    soft = F.log1p(F.exp(safe))
    if beta != 1:
        soft = F.div(soft, beta)
    return F.where(linear, x, soft)


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:  # noqa: A002
    """``log(1 + exp(beta * x)) / beta``, linear where ``beta * x > threshold``."""
    return _softplus(input, beta, threshold)


@opmath
def _leaky_relu_impl(x: Tensor, negative_slope: float) -> Tensor:
    return F.where(F.gt(x, 0), x, F.mul(x, negative_slope))


_leaky_relu = composite("LeakyReluBackward0")(_leaky_relu_impl)
_leaky_relu_inplace = composite("LeakyReluBackward1")(_leaky_relu_impl)   # torch's leaky_relu_


def leaky_relu(input: Tensor, negative_slope: float = 0.01,  # noqa: A002
               inplace: bool = False) -> Tensor:
    """``x`` where positive, else ``negative_slope * x``."""
    if inplace:
        return input.copy_(_leaky_relu_inplace(input, negative_slope))
    return _leaky_relu(input, negative_slope)


def _hardtanh_impl(x: Tensor, min_val: float, max_val: float) -> Tensor:
    # where, not clamp: torch's gradient is 0 at the bounds themselves
    return F.where(F.le(x, min_val), min_val, F.where(F.ge(x, max_val), max_val, x))


_hardtanh = composite("HardtanhBackward0")(_hardtanh_impl)


def _maybe_inplace(input: Tensor, inplace: bool, fn, *args) -> Tensor:
    """``fn(input, *args)``, written into ``input`` when ``inplace``. The activation then reads
    a copy of the input: its backward needs the values the write replaces (torch saves the
    original for such in-place ops too; reading ``input`` itself failed the version check)."""
    if not inplace:
        return fn(input, *args)
    src = input.clone() if _grad_enabled() and input.requires_grad else input
    return input.copy_(fn(src, *args))


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0,  # noqa: A002
             inplace: bool = False) -> Tensor:
    """``x`` clamped to [min_val, max_val]; the gradient is 0 outside and at the bounds."""
    if min_val > max_val:
        raise ValueError("min_val cannot be greater than max_val")
    return _maybe_inplace(input, inplace, _hardtanh, min_val, max_val)


@composite("ThresholdBackward0")
def _threshold(x: Tensor, threshold: float, value: float) -> Tensor:
    # le, not gt: torch's kernel keeps a NaN input (and passes its gradient)
    return F.cast(F.where(F.le(x, threshold), value, x), x.dtype)


def threshold(input: Tensor, threshold: float, value: float,  # noqa: A002
              inplace: bool = False) -> Tensor:
    """``x`` where ``x > threshold``, else ``value``; the gradient is 0 where replaced."""
    return _maybe_inplace(input, inplace, _threshold, threshold, value)


def threshold_(input: Tensor, threshold: float, value: float) -> Tensor:  # noqa: A002
    """In-place :func:`threshold`."""
    return _maybe_inplace(input, True, _threshold, threshold, value)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    """``min(max(x, 0), 6)``."""
    return hardtanh(input, 0.0, 6.0, inplace)


def _expm1_left(x: Tensor, scale: float = 1.0) -> Tensor:
    """``expm1(x * scale)`` where x <= 0 and 0 elsewhere: exp of the unselected positive
    branch could overflow, and 0 * inf would poison the gradient."""
    safe = F.where(F.gt(x, 0), 0.0, x)
    return F.expm1(F.mul(safe, scale) if scale != 1.0 else safe)


@composite("EluBackward0", kernel=True)
@opmath
def _elu(x: Tensor, alpha: float, scale: float) -> Tensor:
    out = F.where(F.gt(x, 0), x, F.mul(_expm1_left(x), alpha))
    return F.mul(out, scale) if scale != 1.0 else out


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:  # noqa: A002
    """``x`` where positive, else ``alpha * (exp(x) - 1)``."""
    return _maybe_inplace(input, inplace, _elu, alpha, 1.0)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def selu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    """``scale * elu(x, alpha)`` with the self-normalizing constants of Klambauer et al."""
    return _maybe_inplace(input, inplace, _elu, _SELU_ALPHA, _SELU_SCALE)


@composite("CeluBackward0", kernel=True)
@opmath
def _celu(x: Tensor, alpha: float) -> Tensor:
    return F.where(F.gt(x, 0), x, F.mul(_expm1_left(x, 1.0 / alpha), alpha))


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:  # noqa: A002
    """``x`` where positive, else ``alpha * (exp(x / alpha) - 1)``."""
    if alpha == 0:
        raise RuntimeError("ZeroDivisionError")
    return _maybe_inplace(input, inplace, _celu, alpha)


@composite("MishBackward0", kernel=True)
@opmath
def _mish(x: Tensor) -> Tensor:
    return F.mul(x, F.tanh(_softplus(x, 1.0, 20.0)))


def mish(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    """``x * tanh(softplus(x))``."""
    return _maybe_inplace(input, inplace, _mish)


@composite("HardswishBackward0")
@opmath
def _hardswish(x: Tensor) -> Tensor:
    # torch's gradient: 0 up to -3, (2x + 3) / 6 strictly inside, 1 from 3 (the values of the
    # pieces agree at the bounds; the gradient there is the outer piece's)
    middle = F.div(F.mul(x, F.add(x, 3.0)), 6.0)
    return F.where(F.le(x, -3.0), 0.0, F.where(F.lt(x, 3.0), middle, x))


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    """``x * relu6(x + 3) / 6``."""
    return _maybe_inplace(input, inplace, _hardswish)


@composite("HardsigmoidBackward0")
@opmath
def _hardsigmoid(x: Tensor) -> Tensor:
    ramp = F.add(F.div(x, 6.0), 0.5)
    return F.where(F.le(x, -3.0), 0.0, F.where(F.ge(x, 3.0), 1.0, ramp))


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    """``relu6(x + 3) / 6``; the gradient is 1/6 strictly inside (-3, 3), else 0."""
    return _maybe_inplace(input, inplace, _hardsigmoid)


@composite("PreluKernelBackward0")
def _prelu(x: Tensor, weight: Tensor) -> Tensor:
    if weight.numel() > 1:
        weight = F.reshape(weight, (1, weight.numel()) + (1,) * (x.ndim - 2))
    return F.where(F.gt(x, 0), x, F.mul(weight, x))


def prelu(input: Tensor, weight: Tensor) -> Tensor:  # noqa: A002
    """``x`` where positive, else ``weight * x``; ``weight`` has one element or one per channel
    (dim 1)."""
    if weight.numel() != 1:
        channels = input.shape[1] if input.ndim >= 2 else 1
        if input.ndim == 0 or weight.numel() != channels:
            raise RuntimeError(f"Mismatch of parameter numbers and input channel size. Found "
                               f"parameter numbers = {weight.numel()} and channel size = "
                               f"{channels}.")
    return _prelu(input, weight)


def softsign(input: Tensor) -> Tensor:  # noqa: A002
    """``x / (1 + |x|)``."""
    return F.div(input, F.add(F.abs(input), 1.0))


def tanhshrink(input: Tensor) -> Tensor:  # noqa: A002
    """``x - tanh(x)``."""
    return F.sub(input, F.tanh(input))


def logsigmoid(input: Tensor) -> Tensor:  # noqa: A002
    """``log(sigmoid(x)) = -softplus(-x)``, stable for large |x|, with the gradient
    ``sigmoid(-x)`` (second derivatives included)."""
    return F.neg(_softplus_of_neg(input))


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:  # noqa: A002
    """``x - lambd`` above ``lambd``, ``x + lambd`` below ``-lambd``, else 0 (NaN stays)."""
    if lambd < 0:
        raise RuntimeError(f"lambda must be greater or equal to 0, but found to be {lambd}.")
    x = input
    return F.where(F.gt(x, lambd), F.sub(x, lambd),
                   F.where(F.lt(x, -lambd), F.add(x, lambd), F.mul(x, 0.0)))


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:  # noqa: A002
    """``x`` where ``|x| > lambd`` (or NaN), else 0."""
    return F.hardshrink(input, lambd)


@composite("GluBackward0")
def _glu(x: Tensor, dim: int) -> Tensor:
    a, b = F.chunk(x, 2, dim)
    return F.mul(a, F.sigmoid(b))


def glu(input: Tensor, dim: int = -1) -> Tensor:  # noqa: A002
    """Gated linear unit: the first half of ``dim`` times the sigmoid of the second half."""
    if input.ndim == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    dim = normalize_axis(dim, input.ndim)
    if input.shape[dim] % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {dim} is size "
                           f"{input.shape[dim]}")
    if not input.dtype.is_floating_point:
        raise NotImplementedError(f'"glu_cpu" not implemented for '
                                  f"'{F._dtype_title(input.dtype)}'")
    return _glu(input, dim)


@custom_vjp("softplus_of_neg")
def _softplus_of_neg_values(x: Tensor) -> Tensor:
    """``softplus(-x) = max(-x, 0) + log1p(exp(-|x|))``, stable for large |x|, with the
    gradient ``-sigmoid(-x)``: the kinks of max and abs at 0 would give the second derivative
    0 there, not 1/4 (binary_cross_entropy_with_logits, logsigmoid)."""
    return F.add(F.maximum(F.neg(x), 0.0), F.log1p(F.exp(F.neg(F.abs(x)))))


@_softplus_of_neg_values.defvjp
def _softplus_of_neg_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    (x,) = operands
    return (F.mul(g, F.neg(F.sigmoid(F.neg(x)))),)


_softplus_of_neg = opmath(_softplus_of_neg_values)


public(selu, torch=True)
public(celu, torch=True)
public(prelu, torch=True, method=True)
public(threshold, torch=True)
public(threshold_, torch=True)

# torch's autocast lists name some of these: wrapped once, here.
wrap_namespace(globals())
