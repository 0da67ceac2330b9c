"""``fusegrad.nn.functional``: torch.nn.functional's activations, layers and losses.

Every function is a composition of fusegrad's public ops (:mod:`fusegrad.ops.functional`),
never numpy math, so that a trace records primitives and fusion sees through them. A function
made of several primitives is wrapped by :func:`composite`, so that in eager mode its result
has one autograd node with PyTorch's name (``softmax`` gives ``SoftmaxBackward0``). Where
torch's own formula would give a NaN gradient through an unselected ``where`` branch (exp
overflow in softplus, log(0) in BCE), the branch input is made safe first: ``where``'s VJP
multiplies the unselected branch by 0, and 0 * inf is NaN.
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import is_grad_enabled as _grad_enabled
from fusegrad.nn.layer_functions import bilinear, pairwise_distance, pixel_shuffle, pixel_unshuffle
from fusegrad.nn.loss_functions import (
    cosine_embedding_loss,
    gaussian_nll_loss,
    hinge_embedding_loss,
    huber_loss,
    kl_div,
    margin_ranking_loss,
    multi_margin_loss,
    multilabel_soft_margin_loss,
    poisson_nll_loss,
    smooth_l1_loss,
    soft_margin_loss,
    triplet_margin_loss,
    triplet_margin_with_distance_loss,
)
from fusegrad.ops import autocast as _autocast
from fusegrad.ops import functional as F
from fusegrad.ops import prims as P
from fusegrad.ops.attention import scaled_dot_product_attention
from fusegrad.ops.composite import opmath
from fusegrad.ops.convolution import (
    conv1d,
    conv2d,
    conv3d,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
    fold,
    unfold,
)
from fusegrad.ops.creation import arange, rand
from fusegrad.ops.functional import composite
from fusegrad.ops.interpolate import interpolate, upsample
from fusegrad.ops.normalization import (
    _normalized_axes,
    batch_norm,
    group_norm,
    instance_norm,
    rms_norm,
)
from fusegrad.ops.pooling import (
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_avg_pool3d,
    adaptive_max_pool1d,
    adaptive_max_pool2d,
    adaptive_max_pool3d,
    avg_pool1d,
    avg_pool2d,
    avg_pool3d,
    max_pool1d,
    max_pool1d_with_indices,
    max_pool2d,
    max_pool2d_with_indices,
    max_pool3d,
    max_unpool1d,
    max_unpool2d,
    max_unpool3d,
)
from fusegrad.ops.products import cosine_similarity
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor

__all__ = [
    "relu", "relu_", "gelu", "silu", "softplus", "leaky_relu", "sigmoid", "tanh", "softmax",
    "log_softmax", "linear", "dropout", "layer_norm", "embedding", "one_hot", "mse_loss",
    "l1_loss", "cross_entropy", "nll_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "normalize", "pad",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "unfold", "fold", "max_pool3d", "avg_pool3d",
    "max_pool1d", "max_pool2d", "max_pool1d_with_indices", "max_pool2d_with_indices",
    "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
    "adaptive_max_pool1d", "adaptive_max_pool2d", "batch_norm", "group_norm", "instance_norm",
    "rms_norm", "hardtanh", "relu6", "elu", "selu", "celu", "mish", "hardswish", "hardsigmoid",
    "prelu", "softsign", "tanhshrink", "scaled_dot_product_attention", "logsigmoid",
    "softshrink", "hardshrink", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
    "feature_alpha_dropout", "threshold", "threshold_", "softmin", "glu",
]

_REDUCTIONS = ("none", "mean", "sum")
__all__ += ["cosine_similarity", "interpolate", "upsample", "smooth_l1_loss", "huber_loss", "kl_div",
            "cosine_embedding_loss", "adaptive_avg_pool3d", "adaptive_max_pool3d", "max_unpool1d",
            "max_unpool2d", "max_unpool3d", "pixel_shuffle", "pixel_unshuffle", "pairwise_distance",
            "bilinear", "poisson_nll_loss", "gaussian_nll_loss", "margin_ranking_loss",
            "hinge_embedding_loss", "soft_margin_loss", "multilabel_soft_margin_loss",
            "multi_margin_loss", "triplet_margin_loss", "triplet_margin_with_distance_loss"]


def _is_concrete(t: Tensor) -> bool:
    """Eager tensors can be checked by value; a traced one cannot (checks are skipped)."""
    return t._trace is None


def _check_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction")


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return F.mean(loss)
    if reduction == "sum":
        return F.sum(loss)
    return loss


def _legacy_reduction(size_average, reduce, reduction: str) -> str:
    if size_average is None and reduce is None:
        return reduction
    from fusegrad.nn.modules.module import _warn_legacy_reduction
    return _warn_legacy_reduction(size_average, reduce)


# --------------------------------------------------------------------------- activations


def relu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002 - torch's names
    """``max(x, 0)``; the gradient at 0 is 0, as torch's."""
    return input.relu_() if inplace else F.relu(input)


def relu_(input: Tensor) -> Tensor:  # noqa: A002
    return relu(input, inplace=True)


sigmoid = F.sigmoid
tanh = F.tanh


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


@opmath
def _gelu_impl(x: Tensor, approximate: str) -> Tensor:
    y = F.mul(F.mul(x, 0.5), _gelu_one_plus(x, approximate))
    return F.custom_vjp(y, (x,), "gelu", (approximate,))


@P.register_vjp("gelu")
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


_gelu = composite("GeluBackward0", kernel=True)(_gelu_impl)


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


def _softmax_dim(name: str, ndim: int) -> int:
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to "
                  "include dim=X as an argument.", UserWarning, stacklevel=3)
    return 0 if ndim in (0, 1, 3) else 1


def _shift_by_max(x: Tensor, dim: int) -> Tensor:
    """``x - max(x)`` along ``dim``: exp() of the result cannot overflow.

    The max is detached: the shift cancels out of softmax, so its gradient is zero anyway,
    and recording it would only cost time. A slice that is all -inf is shifted by 0 (not
    -inf, which would make -inf - -inf = NaN) so softmax gives NaN there as torch does, via
    0/0, while log_softmax's -inf entries stay -inf in mixed slices.
    """
    m = F.amax(x.detach(), dim, keepdim=True)
    m = F.where(F.eq(m, -math.inf), 0.0, m)
    return F.sub(x, m)


@opmath
def _softmax_impl(x: Tensor, dim: int) -> Tensor:
    e = F.exp(_shift_by_max(x, dim))
    return F.custom_vjp(F.div(e, F.sum(e, dim, keepdim=True)), (x,), "softmax", (dim,))


@opmath
def _log_softmax_impl(x: Tensor, dim: int) -> Tensor:
    s = _shift_by_max(x, dim)
    out = F.sub(s, F.log(F.sum(F.exp(s), dim, keepdim=True)))
    return F.custom_vjp(out, (x,), "log_softmax", (dim,))


@P.register_vjp("softmax", reads_output=True, reads_operands=False)
def _softmax_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    """torch's SoftmaxBackward: ``out * (g - sum(g * out))``, which reads the output alone."""
    (dim,) = params
    return (F.mul(out, F.sub(g, F.sum(F.mul(g, out), dim, keepdim=True))),)


@P.register_vjp("log_softmax", reads_output=True, reads_operands=False)
def _log_softmax_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    """torch's LogSoftmaxBackward: ``g - exp(out) * sum(g)``."""
    (dim,) = params
    return (F.sub(g, F.mul(F.exp(out), F.sum(g, dim, keepdim=True))),)


_softmax = composite("SoftmaxBackward0", kernel=True)(_softmax_impl)
_log_softmax = composite("LogSoftmaxBackward0", kernel=True)(_log_softmax_impl)


def _softmax_input(x: Tensor, dtype) -> Tensor:
    if dtype is not None:
        return F.cast(x, dtype)
    if not x.dtype.is_floating_point:
        raise RuntimeError(f'"softmax_lastdim_kernel_impl" not implemented for '
                           f"'{F._dtype_title(x.dtype)}'")
    return x


def softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3,  # noqa: A002
            dtype=None) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``dim``, computed stably (the max is subtracted)."""
    if dim is None:
        dim = _softmax_dim("softmax", input.ndim)
    x = _softmax_input(input, dtype)
    if x.numel() == 0:
        return F.mul(x, 1)          # nothing to normalize (a dim of size 0): torch's empty
    return _softmax(x, dim)


def log_softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3,  # noqa: A002
                dtype=None) -> Tensor:
    """``x - logsumexp(x)`` along ``dim``: the log of softmax without its underflow."""
    if dim is None:
        dim = _softmax_dim("log_softmax", input.ndim)
    x = _softmax_input(input, dtype)
    if x.numel() == 0:
        return F.mul(x, 1)
    return _log_softmax(x, dim)


def softmin(input: Tensor, dim: int | None = None, _stacklevel: int = 3,  # noqa: A002
            dtype=None) -> Tensor:
    """``softmax(-x)`` along ``dim``: largest weight on the smallest entry."""
    if dim is None:
        dim = _softmax_dim("softmin", input.ndim)
    return softmax(F.neg(input), dim, dtype=dtype)


@composite("GluBackward0")
def _glu(x: Tensor, dim: int) -> Tensor:
    a, b = F.chunk(x, 2, dim)
    return F.mul(a, F.sigmoid(b))


def glu(input: Tensor, dim: int = -1) -> Tensor:  # noqa: A002
    """Gated linear unit: the first half of ``dim`` times the sigmoid of the second half."""
    if input.ndim == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    dim = P.normalize_axis(dim, input.ndim)
    if input.shape[dim] % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {dim} is size "
                           f"{input.shape[dim]}")
    if not input.dtype.is_floating_point:
        raise NotImplementedError(f'"glu_cpu" not implemented for '
                                  f"'{F._dtype_title(input.dtype)}'")
    return _glu(input, dim)


# torch.softmax and Tensor.softmax are this function too
public(softmax, torch=True, method=True)
public(selu, torch=True)
public(celu, torch=True)
public(prelu, torch=True, method=True)
public(log_softmax, torch=True, method=True)
public(threshold, torch=True)
public(threshold_, torch=True)


# --------------------------------------------------------------------------- layers


def _linear_2d(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    out = F.matmul(x, F.t(weight))
    return out if bias is None else F.add(out, bias)


def _linear_nd(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    # Fold the batch dims into one so the product is a single 2-D matmul (as torch does).
    lead = tuple(x.shape[:-1])
    out = _linear_2d(F.reshape(x, (-1, x.shape[-1])), weight, bias)
    return F.reshape(out, lead + (weight.shape[0],))


_addmm = composite("AddmmBackward0", kernel=True)(_linear_2d)
_linear_view = composite("ViewBackward0", kernel=True)(_linear_nd)
_linear_unsafe_view = composite("UnsafeViewBackward0")(_linear_nd)
_linear_squeeze = composite("SqueezeBackward4")(_linear_nd)


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:  # noqa: A002
    """``input @ weight.T + bias``; ``weight`` is (out_features, in_features)."""
    if input.ndim == 0:
        raise RuntimeError("both arguments to linear need to be at least 1D, but they are 0D "
                           f"and {weight.ndim}D")
    if input.shape[-1] != weight.shape[-1]:
        rows = input.shape[-2] if input.ndim > 1 else 1
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({rows}x"
                           f"{input.shape[-1]} and {weight.shape[-1]}x{weight.shape[0]})")
    if bias is not None and bias.dtype is not weight.dtype:
        # torch adds the bias in its product (addmm), which promotes nothing.
        raise RuntimeError(f"linear: self and mat2 must have the same dtype, but got "
                           f"{bias.dtype.name} and {weight.dtype.name} (bias "
                           f"{bias.dtype.name}{list(bias.shape)}, weight "
                           f"{weight.dtype.name}{list(weight.shape)})")
    if bias is not None and bias.ndim > 1:
        # A bias with more than a row: torch expands it to the product's shape, which it
        # never enlarges (the kernels below add a row, or a bias in the folded 2-D shape).
        out = linear(input, weight)
        return F.add(out, F.broadcast_to(bias, tuple(out.shape)))
    if input.ndim == 2:
        return _addmm(input, weight, bias) if bias is not None else F.matmul(input, F.t(weight))
    if bias is not None:
        return _linear_view(input, weight, bias)
    return (_linear_squeeze if input.ndim == 1 else _linear_unsafe_view)(input, weight, None)


def _check_p(p: float) -> None:
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _dropout(input: Tensor, p: float, training: bool, inplace: bool,  # noqa: A002
             alpha: bool = False, channels: str = "") -> Tensor:
    """torch's ``_dropout_impl``: keep each element (or with ``channels`` "batched" or
    "unbatched", each channel: dim 1 or dim 0) with probability ``1 - p``. Plain dropout
    scales the kept values by ``1 / (1 - p)``; alpha dropout gives the dropped ones SELU's
    saturation value and keeps the mean and variance with an affine map ``a * x + b``
    (Klambauer et al., 2017)."""
    if not training or p == 0.0 or input.numel() == 0:
        return input
    if p == 1.0:
        scale = F.zeros_like(input)      # input * 0, as torch (an inf or NaN gives NaN)
        return input.mul_(scale) if inplace else F.mul(input, scale)
    noise_shape = _channel_noise_shape(input, channels) if channels else tuple(input.shape)
    keep = F.cast(F.lt(rand(noise_shape, dtype=input.dtype, device=input.device), 1.0 - p),
                  input.dtype)
    if not alpha:
        scale = F.mul(keep, 1.0 / (1.0 - p))
        return input.mul_(scale) if inplace else F.mul(input, scale)
    selu_saturation = 1.7580993408473766      # -SELU(-inf) = scale * alpha
    a = 1.0 / math.sqrt((selu_saturation ** 2 * p + 1) * (1 - p))
    scale = F.mul(keep, a)
    shift = F.add(F.mul(F.sub(keep, 1.0), selu_saturation * a), selu_saturation * a * p)
    return input.mul_(scale).add_(shift) if inplace else F.add(F.mul(input, scale), shift)


def _channel_noise_shape(input: Tensor, channels: str) -> tuple[int, ...]:  # noqa: A002
    """One draw per channel (dim 1 of a batch, dim 0 of one sample), spread over the rest."""
    if input.ndim < 2:
        raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
    lead = 2 if channels == "batched" else 1
    return tuple(input.shape[:lead]) + (1,) * (input.ndim - lead)


def dropout(input: Tensor, p: float = 0.5, training: bool = True,  # noqa: A002
            inplace: bool = False) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``.

    The mask comes from :func:`fusegrad.rand`, so ``manual_seed`` makes it reproducible.
    Outside training (or with ``p == 0``) the input is returned itself, as in torch.
    """
    _check_p(p)
    return _dropout(input, p, training, inplace)


def alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False,  # noqa: A002
                  inplace: bool = False) -> Tensor:
    """Dropout for SELU networks: dropped elements take SELU's negative saturation value and
    an affine map keeps the input's mean and variance. ``training`` defaults to False, as
    in torch."""
    _check_p(p)
    return _dropout(input, p, training, inplace, alpha=True)


def feature_alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False,  # noqa: A002
                          inplace: bool = False) -> Tensor:
    """:func:`alpha_dropout` of whole channels: dim 1 of (N, C, *)."""
    _check_p(p)
    return _dropout(input, p, training, inplace, alpha=True, channels="batched")


def dropout1d(input: Tensor, p: float = 0.5, training: bool = True,  # noqa: A002
              inplace: bool = False) -> Tensor:
    """Zero whole channels of (N, C, L) or (C, L) with probability ``p``, scaling the rest by
    ``1 / (1 - p)``."""
    _check_p(p)
    if input.ndim not in (2, 3):
        raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {input.ndim}D "
                           "input. Note that dropout1d exists to provide channel-wise dropout "
                           "on inputs with 1 spatial dimension, a channel dimension, and an "
                           "optional batch dimension (i.e. 2D or 3D inputs).")
    return _dropout(input, p, training, inplace,
                    channels="batched" if input.ndim == 3 else "unbatched")


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True,  # noqa: A002
              inplace: bool = False) -> Tensor:
    """Zero whole channels of (N, C, H, W) with probability ``p``, scaling the rest by
    ``1 / (1 - p)``. As torch, a 3-D input is read as (N, C, L), not as one sample."""
    _check_p(p)
    if input.ndim not in (3, 4):
        warnings.warn(f"dropout2d: Received a {input.ndim}-D input to dropout2d, which is "
                      "deprecated and will result in an error in a future release. To retain "
                      "the behavior and silence this warning, please use dropout instead.",
                      stacklevel=2)
    if input.ndim == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that "
                      "channel-wise 1D dropout behavior is desired - input is interpreted as "
                      "shape (N, C, L), where C is the channel dim.", stacklevel=2)
    return _dropout(input, p, training, inplace, channels="batched")


def dropout3d(input: Tensor, p: float = 0.5, training: bool = True,  # noqa: A002
              inplace: bool = False) -> Tensor:
    """Zero whole channels of (N, C, D, H, W) or (C, D, H, W) with probability ``p``, scaling
    the rest by ``1 / (1 - p)``."""
    _check_p(p)
    if input.ndim not in (4, 5):
        warnings.warn(f"dropout3d: Received a {input.ndim}-D input to dropout3d, which is "
                      "deprecated and will result in an error in a future release. To retain "
                      "the behavior and silence this warning, please use dropout instead.",
                      stacklevel=2)
    return _dropout(input, p, training, inplace,
                    channels="batched" if input.ndim == 5 else "unbatched")


@composite("NativeLayerNormBackward0", kernel=True)
@opmath
def _layer_norm(x: Tensor, axes: tuple[int, ...], weight: Tensor | None, bias: Tensor | None,
                eps: float) -> Tensor:
    n = 1
    for a in axes:
        n *= x.shape[a]
    mean = F.div(F.sum(x, axes, keepdim=True), n)
    centered = F.sub(x, mean)
    var = F.div(F.sum(F.mul(centered, centered), axes, keepdim=True), n)
    out = F.mul(centered, F.rsqrt(F.add(var, eps)))
    if weight is not None:
        out = F.mul(out, weight)
    if bias is not None:
        out = F.add(out, bias)
    return out


def layer_norm(input: Tensor, normalized_shape: Sequence[int],  # noqa: A002
               weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalize over the last ``len(normalized_shape)`` dims to zero mean and unit
    (biased) variance, then scale by ``weight`` and shift by ``bias``."""
    return _layer_norm(input, _normalized_axes(input, normalized_shape), weight, bias, eps)


@composite("EmbeddingBackward0")
def _embedding(indices: Tensor, weight: Tensor, padding_idx: int | None) -> Tensor:
    rows = F.take(weight, indices, 0)
    if padding_idx is None:
        return rows
    # The padding row gets no gradient: read it from the detached weight.
    is_pad = F.unsqueeze(F.eq(indices, padding_idx), -1)
    return F.where(is_pad, F.take(weight.detach(), indices, 0), rows)


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None,  # noqa: A002
              max_norm: float | None = None, norm_type: float = 2.0,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """Rows of ``weight`` at the integer ``input``: shape ``input.shape + (dim,)``."""
    if input.dtype not in (dtypes.int64, dtypes.int32):
        raise RuntimeError("Expected tensor for argument #1 'indices' to have one of the "
                           f"following scalar types: Long, Int; but got {input.type()} instead "
                           "(while checking arguments for embedding)")
    if max_norm is not None or scale_grad_by_freq or sparse:
        raise NotImplementedError("embedding: max_norm, scale_grad_by_freq and sparse are not "
                                  "supported")
    if padding_idx is not None:
        n = weight.shape[0]
        if not -n <= padding_idx < n:
            raise AssertionError("Padding_idx must be within num_embeddings")
        padding_idx %= n
    input = F.bind(P.check_index, input, op="embedding", size=weight.shape[0], dim=0,
                   wrap=False)
    return _embedding(input, weight, padding_idx)


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """int64 tensor of shape ``tensor.shape + (num_classes,)`` with ones at the indices;
    ``num_classes=-1`` takes ``max + 1``."""
    if tensor.dtype is not dtypes.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if num_classes == -1:
        if tensor.numel() == 0:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        num_classes = int(F.amax(tensor)) + 1
    if _is_concrete(tensor) and tensor.numel():
        if bool(F.any(F.lt(tensor, 0))):
            raise RuntimeError("Class values must be non-negative.")
        if bool(F.any(F.ge(tensor, num_classes))):
            raise RuntimeError("Class values must be smaller than num_classes.")
    return F.cast(F.eq(F.unsqueeze(tensor, -1), arange(num_classes)), dtypes.int64)


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12,  # noqa: A002
              out=None) -> Tensor:
    """``input / max(||input||_p, eps)`` along ``dim`` (into ``out`` when given)."""
    from fusegrad.ops.products import _write_out
    denom = F.expand_as(F.clamp(F.norm(input, p, dim, keepdim=True), min=eps), input)
    return _write_out(F.div(input, denom), out, "normalize")


def pad(input: Tensor, pad: Sequence[int], mode: str = "constant",  # noqa: A002
        value: float | None = None) -> Tensor:
    """Pad the last dims: ``pad = (left, right, top, bottom, ...)`` starts from the last dim.

    ``mode``: ``'constant'`` (``value``, default 0; negative amounts crop), ``'reflect'``
    (mirror without the edge), ``'replicate'`` (repeat the edge), ``'circular'`` (wrap).
    """
    pad = tuple(int(v) for v in pad)
    if len(pad) % 2:
        raise RuntimeError("Padding length must be divisible by 2")
    if len(pad) // 2 > input.ndim:
        raise RuntimeError(f"Padding length should be less than or equal to two times the input "
                           f"dimension but got padding length {len(pad)} and input of dimension "
                           f"{input.ndim}")
    widths = [(0, 0)] * input.ndim
    for i in range(len(pad) // 2):
        widths[input.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    if mode != "constant":
        if mode not in _PAD_MODES:
            raise NotImplementedError(f"Unrecognised padding mode {mode}")
        if value:
            raise RuntimeError(f"Padding mode \"{mode}\" doesn't take in value argument")
        _check_copy_pad(input, len(pad) // 2, mode)
        if mode != "circular":
            _check_copy_pad_output(input, widths, mode, len(pad) // 2)
        return _pad_by_copies(input, widths, mode)
    fill = 0 if value is None else value
    if all(lo >= 0 and hi >= 0 for lo, hi in widths):
        return F.pad_axes(input, widths, fill)
    return _pad_crop(input, tuple(widths), fill)


def _check_copy_pad(x: Tensor, nd: int, mode: str) -> None:
    """torch's checks of a non-constant pad of the last ``nd`` dims: the input is one of them
    plus a channel dim and maybe a batch dim; reflect and replicate need non-empty dims past
    the first."""
    if x.ndim not in (nd + 1, nd + 2):
        raise NotImplementedError(
            f"Padding size {2 * nd} is not supported for {x.ndim}D input tensor.\n"
            "Supported combinations for non-constant padding:\n"
            "  - 2D or 3D input: padding size = 2 (pads last dimension)\n"
            "  - 3D or 4D input: padding size = 4 (pads last 2 dimensions)\n"
            "  - 4D or 5D input: padding size = 6 (pads last 3 dimensions)")
    if mode != "circular" and 0 in x.shape[1:]:
        raise RuntimeError(f"Expected {nd + 1}D or {nd + 2}D (batch mode) tensor with possibly 0 "
                           f"batch size and other non-zero dimensions for input, but got: "
                           f"{list(x.shape)}")


def _edge_block(x: Tensor, dim: int, count: int, side: str, mode: str) -> Tensor:
    """The ``count`` elements that ``mode`` puts before (``side='lo'``) or after the data."""
    n = x.shape[dim]
    if mode == "circular":
        if count > n:
            raise RuntimeError("Padding value causes wrapping around more than once.")
        return F.narrow(x, dim, n - count, count) if side == "lo" else F.narrow(x, dim, 0, count)
    if mode == "replicate":
        if n == 0:
            raise RuntimeError("padding size should be less than the corresponding input "
                               "dimension")
        edge = F.narrow(x, dim, 0 if side == "lo" else n - 1, 1)
        shape = list(x.shape)
        shape[dim] = count
        return F.expand(edge, *shape)
    if count >= n:   # reflect
        raise RuntimeError(f"Argument #4: Padding size should be less than the corresponding "
                           f"input dimension, but got: padding ({count}, {count}) at dimension "
                           f"{dim} of input {list(x.shape)}")
    block = F.narrow(x, dim, 1, count) if side == "lo" else F.narrow(x, dim, n - 1 - count, count)
    return F.flip(block, (dim,))


_PAD_MODES = ("reflect", "replicate", "circular")


def _check_copy_pad_output(x: Tensor, widths, mode: str, nd: int) -> None:
    """torch's checks of the output size of reflect and replicate padding with negative amounts:
    a negative size raises, and so do sizes all below 1."""
    dims = range(x.ndim - nd, x.ndim)
    out = [x.shape[d] + lo + hi for d, (lo, hi) in enumerate(widths)]
    if all(out[d] < 1 for d in dims):
        names = "DHW"[3 - nd:]
        sizes = [f"{n}: {x.shape[d]}" for n, d in zip(names, dims)]
        given = (", ".join(sizes) if nd < 3 else f"{sizes[0]} {sizes[1]}, {sizes[2]}") + (
            " " if mode == "replicate" and nd == 2 else "")
        calculated = " ".join(f"{n}: {out[d]}" for n, d in zip(names, dims))
        raise RuntimeError(f"input ({given}) is too small. Calculated output {calculated}")
    if any(n < 0 for n in out):
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(out)}: {out}")


def _pad_by_copies(x: Tensor, widths, mode: str) -> Tensor:
    """Non-constant padding: per padded dim, concatenate the edge blocks that ``mode`` copies
    from the data and crop negative amounts. Reflect and replicate index the whole input, as
    torch's do (``pad(x, (-1, 2), 'reflect')`` of ``[0, 1, 2, 3, 4]`` is ``[1, 2, 3, 4, 3, 2]``):
    they pad first and crop after; circular wraps around what is left after the crop."""
    if mode == "reflect":
        for dim in reversed(range(x.ndim)):   # torch checks the last dim first
            lo, hi = widths[dim]
            if lo >= x.shape[dim] or hi >= x.shape[dim]:
                # torch numbers the pad amounts as arguments: the last dim's are #4, then #6, #8
                raise RuntimeError(f"Argument #{4 + 2 * (x.ndim - 1 - dim)}: Padding size should "
                                   f"be less than the corresponding input dimension, but got: "
                                   f"padding ({lo}, {hi}) at dimension {dim} of input "
                                   f"{list(x.shape)}")
    for dim, (lo, hi) in enumerate(widths):
        if lo == 0 and hi == 0:
            continue
        crop_first = mode == "circular"
        if crop_first and (lo < 0 or hi < 0):
            x = _crop(x, dim, lo, hi)
        parts = []
        if lo > 0:
            parts.append(_edge_block(x, dim, lo, "lo", mode))
        parts.append(x)
        if hi > 0:
            parts.append(_edge_block(x, dim, hi, "hi", mode))
        x = F.cat(parts, dim) if len(parts) > 1 else x
        if not crop_first and (lo < 0 or hi < 0):
            x = _crop(x, dim, lo, hi)
    return x


def _crop(x: Tensor, dim: int, lo: int, hi: int) -> Tensor:
    """``x`` without ``-lo`` leading and ``-hi`` trailing elements of ``dim`` (where negative)."""
    start = max(-lo, 0)
    return F.narrow(x, dim, start, x.shape[dim] - start - max(-hi, 0))


@composite("ConstantPadNdBackward0")
def _pad_crop(x: Tensor, widths, value) -> Tensor:
    padded = F.pad_axes(x, [(max(lo, 0), max(hi, 0)) for lo, hi in widths], value)
    starts = [max(-lo, 0) for lo, _ in widths]
    stops = [d - max(-hi, 0) for d, (_, hi) in zip(padded.shape, widths, strict=True)]
    if any(b < a for a, b in zip(starts, stops, strict=True)):
        raise RuntimeError(f"The input size {list(x.shape)}, plus negative padding "
                           f"{[w for pair in widths for w in pair]} resulted in a negative output "
                           "size, which is invalid. Check dimension of your input.")
    return F.slice_axes(padded, starts, stops, [1] * x.ndim)


# --------------------------------------------------------------------------- losses


def _warn_size(input: Tensor, target: Tensor) -> None:
    if target.shape != input.shape:
        warnings.warn(f"Using a target size ({target.shape}) that is different to the input size "
                      f"({input.shape}). This will likely lead to incorrect results due to "
                      "broadcasting. Please ensure they have the same size.", UserWarning,
                      stacklevel=3)


@composite("MseLossBackward0", kernel=True)
def _mse_loss(input: Tensor, target: Tensor, reduction: str) -> Tensor:  # noqa: A002
    d = F.sub(input, target)
    return _reduce(F.mul(d, d), reduction)


def mse_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,  # noqa: A002
             reduction: str = "mean") -> Tensor:
    """Mean (or sum, or elementwise) squared error."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if input.dtype.is_complex or target.dtype.is_complex:
        # (a - b) ** 2 of complex values is no squared error; torch refuses them too
        raise NotImplementedError(f'"mse_cpu" not implemented for complex tensors (input '
                                  f"{input.dtype}, target {target.dtype})")
    _warn_size(input, target)
    return _mse_loss(input, target, reduction)


def l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,  # noqa: A002
            reduction: str = "mean") -> Tensor:
    """Mean (or sum, or elementwise) absolute error."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    _warn_size(input, target)
    return _reduce(F.abs(F.sub(input, target)), reduction)


def _check_nll(input: Tensor, target: Tensor) -> None:  # noqa: A002
    if target.dtype not in (dtypes.int64, dtypes.uint8):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got "
                           f"{F._dtype_title(target.dtype)}")
    if input.ndim < 1:
        raise ValueError(f"Expected 1 or more dimensions (got {input.ndim})")
    if input.ndim == 1:
        if target.ndim != 0:
            raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
        return
    if target.ndim == 0 or input.shape[0] != target.shape[0]:
        raise ValueError(f"Expected input batch_size ({input.shape[0]}) to match target "
                         f"batch_size ({target.shape[0] if target.ndim else 0}).")
    want = (input.shape[0],) + tuple(input.shape[2:])
    if tuple(target.shape) != want:
        raise RuntimeError(f"Expected target size {list(want)}, got {list(target.shape)}")


def _check_class_weight(input: Tensor, weight: Tensor | None,  # noqa: A002
                        op: str = "") -> Tensor | None:
    """``weight`` as a vector, after torch's check that a class weight has one entry per
    class: one of another size would otherwise be read only at the targets' classes,
    silently, while they stay in range."""
    if weight is None:
        return None
    n_classes = input.shape[0 if input.ndim == 1 else 1]
    if input.ndim > 2 and not op:
        # torch's (N, C, d1, ...) path checks only the count, with a message of its own
        if weight.numel() != n_classes:
            raise RuntimeError("weight tensor should be defined either for all or no classes")
        return F.reshape(weight, (n_classes,))
    if weight.ndim == 1 and weight.shape[0] == n_classes:
        return weight
    prefix = f"{op}: " if op else ""
    raise RuntimeError(f"{prefix}weight tensor should be defined either for all {n_classes} "
                       f"classes or no classes but got weight tensor of shape: "
                       f"{list(weight.shape)}")


def _check_targets(op: str, input: Tensor, target: Tensor, ignore_index: int) -> Tensor:  # noqa: A002
    """``target``, checked as torch checks class indices ("Target 5 is out of bounds."),
    naming the op and its operands. A traced target is checked by a node of the graph
    when the compiled program runs (the error then names the user's line too)."""
    if target.numel() == 0:
        return target
    n_classes = input.shape[0 if input.ndim == 1 else 1]
    try:
        return F.bind(P.check_target, target, op=op, classes=n_classes,
                      ignore_index=ignore_index, input=f"{input.dtype.name}{list(input.shape)}")
    except IndexError as e:
        raise IndexError(f"{e}{F._at_user_line(input, target)}") from None


def _pick(logp: Tensor, index: Tensor, class_dim: int) -> Tensor:
    """``logp`` at class ``index`` (checked by check_target). Traced (a compiled function,
    an eager kernel), it is the sum over ``class_dim`` of ``logp`` where the class equals
    the index: the other terms add exact zeros, so the values are the gather's, and the
    comparison with the classes' iota and the masked sum fuse into the log_softmax's kernel
    and their gradient (a select) into its backward's, where a gather and its scatter_add
    are steps of their own, run by numpy. Eager it is the gather, which reads one element
    per row."""
    if logp._trace is None:
        # The gather primitive, not F.gather: check_target has checked the targets.
        return F.squeeze(F.bind(P.gather, logp, F.unsqueeze(index, class_dim),
                                axis=class_dim), class_dim)
    from fusegrad.ops.creation import _source
    classes = _source(P.iota, logp, shape=tuple(logp.shape), axis=class_dim,
                      dtype=dtypes.int64)
    hit = F.eq(classes, F.unsqueeze(index, class_dim))
    return F.sum(F.where(hit, logp, 0.0), class_dim)


def _nll_impl(logp: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
              reduction: str) -> Tensor:
    """torch's nll_loss: ``-w[t] * logp[t]``, the mean weighted by ``sum(w[t])``."""
    class_dim = 0 if logp.ndim == 1 else 1
    target = F.cast(target, dtypes.int64)
    ignored = F.eq(target, ignore_index)
    # Ignored targets (often -100) would index out of range: gather row 0 and weigh it 0.
    safe = F.where(ignored, 0, target)
    picked = _pick(logp, safe, class_dim)
    w = F.take(weight, safe, 0) if weight is not None else F.ones_like(picked)
    w = F.where(ignored, 0.0, F.cast(w, logp.dtype))
    loss = F.mul(F.neg(picked), w)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return F.sum(loss)
    return _weighted_mean(F.sum(loss), F.sum(w))


def _weighted_mean(total: Tensor, weight: Tensor) -> Tensor:
    """``total / weight``: NaN when the weight is 0 (every target ignored), as torch's loss,
    with a zero gradient there, as torch's (the 0/0 gave NaN gradients to every logit)."""
    none = F.eq(weight, 0)
    return F.where(none, math.nan, F.div(total, F.where(none, 1.0, weight)))


_nll_loss = composite("NllLossBackward0")(_nll_impl)


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None,  # noqa: A002
             size_average=None, ignore_index: int = -100, reduce=None,
             reduction: str = "mean") -> Tensor:
    """Negative log likelihood of class-index ``target`` under log-probabilities ``input``
    of shape (C,), (N, C) or (N, C, d1, ...)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    _check_nll(input, target)
    weight = _check_class_weight(input, weight)
    target = _check_targets("nll_loss", input, target, ignore_index)
    return _nll_loss(input, target, weight, ignore_index, reduction)


def _class_weight_view(weight: Tensor, ndim: int, class_dim: int) -> Tensor:
    shape = [1] * ndim
    shape[class_dim] = weight.shape[0]
    return F.reshape(weight, tuple(shape))


def _ce_prob_impl(x: Tensor, target: Tensor, weight: Tensor | None, reduction: str,
                  label_smoothing: float) -> Tensor:
    class_dim = 0 if x.ndim == 1 else 1
    n_classes = x.shape[class_dim]
    if label_smoothing > 0:
        target = F.add(F.mul(target, 1 - label_smoothing), label_smoothing / n_classes)
    terms = F.mul(_log_softmax_impl(x, class_dim), target)
    if weight is not None:
        terms = F.mul(terms, _class_weight_view(weight, x.ndim, class_dim))
    if reduction == "none":
        return F.neg(F.sum(terms, class_dim))
    if reduction == "sum":
        return F.neg(F.sum(terms))
    return F.div(F.neg(F.sum(terms)), x.numel() / n_classes)


def _ce_smooth_impl(x: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
                    reduction: str, label_smoothing: float) -> Tensor:
    class_dim = 0 if x.ndim == 1 else 1
    n_classes = x.shape[class_dim]
    logp = _log_softmax_impl(x, class_dim)
    nll = _nll_impl(logp, target, weight, ignore_index, reduction)
    ignored = F.eq(target, ignore_index)
    if weight is not None:
        smooth = F.neg(F.sum(F.mul(logp, _class_weight_view(weight, x.ndim, class_dim)),
                             class_dim))
    else:
        smooth = F.neg(F.sum(logp, class_dim))
    smooth = F.where(ignored, 0.0, smooth)
    if reduction == "mean":
        if weight is not None:
            w = F.where(ignored, 0.0, F.take(weight, F.where(ignored, 0, target), 0))
            ret = _weighted_mean(F.sum(smooth), F.sum(w))
        else:
            ret = _weighted_mean(F.sum(smooth), F.cast(F.sum(F.logical_not(ignored)),
                                                       smooth.dtype))
    elif reduction == "sum":
        ret = F.sum(smooth)
    else:
        ret = smooth
    return F.add(F.mul(nll, 1 - label_smoothing), F.mul(ret, label_smoothing / n_classes))


def _ce_index_impl(x: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
                   reduction: str) -> Tensor:
    logp = _log_softmax_impl(x, 0 if x.ndim == 1 else 1)
    return _nll_impl(logp, target, weight, ignore_index, reduction)


_ce_index = composite("NllLossBackward0", kernel=True)(_ce_index_impl)
_ce_smooth = composite("AddBackward0")(_ce_smooth_impl)
_ce_prob_mean = composite("DivBackward1")(_ce_prob_impl)
_ce_prob_neg = composite("NegBackward0")(_ce_prob_impl)


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,  # noqa: A002
                  size_average=None, ignore_index: int = -100, reduce=None,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Cross entropy between logits ``input`` (C,), (N, C) or (N, C, d1, ...) and either
    class indices or class probabilities (a float ``target`` of the input's shape)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    if target.shape == input.shape and input.ndim >= 1:
        if not target.dtype.is_floating_point:
            raise RuntimeError(f"Expected floating point type for target with class "
                               f"probabilities, got {F._dtype_title(target.dtype)}")
        if ignore_index >= 0:
            raise RuntimeError("ignore_index is not supported for floating point target")
        weight = _check_class_weight(input, weight, "cross_entropy")
        fn = _ce_prob_mean if reduction == "mean" else _ce_prob_neg
        return fn(input, target, weight, reduction, label_smoothing)
    _check_nll(input, target)
    weight = _check_class_weight(input, weight)
    target = _check_targets("cross_entropy", input, target, ignore_index)
    if label_smoothing > 0:
        return _ce_smooth(input, target, weight, ignore_index, reduction, label_smoothing)
    return _ce_index(input, target, weight, ignore_index, reduction)


def _safe_log(x: Tensor) -> Tensor:
    """``max(log(x), -100)`` (torch's BCE clamp) with a finite gradient at ``x == 0``."""
    positive = F.gt(x, 0)
    return F.clamp(F.where(positive, F.log(F.where(positive, x, 1.0)), -100.0), min=-100.0)


@composite("BinaryCrossEntropyBackward0")
def _bce(x: Tensor, target: Tensor, weight: Tensor | None, reduction: str) -> Tensor:
    loss = F.neg(F.add(F.mul(target, _safe_log(x)),
                       F.mul(F.rsub(target, 1.0), _safe_log(F.rsub(x, 1.0)))))
    loss = F.custom_vjp(loss, (x, target), "binary_cross_entropy")
    if weight is not None:
        loss = F.mul(loss, weight)
    return _reduce(loss, reduction)


@P.register_vjp("binary_cross_entropy")
def _bce_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    """torch's BinaryCrossEntropyBackward0: ``g * (x - t) / max(x * (1 - x), 1e-12)`` for the
    input and ``g * -logit(x)`` for the target, not the derivative of the clamped logs, which
    differs where ``x`` is 0 or 1 (or within 1e-12 of them): there torch's input gradient is
    0 when the target equals ``x`` and at most 1e12 in size otherwise."""
    x, target = operands
    d = F.div(F.sub(x, target), F.clamp(F.mul(F.rsub(x, 1.0), x), min=1e-12))
    return F.mul(g, d), F.mul(g, F.neg(F.logit(x)))


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,  # noqa: A002
                         size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """``-(t * log(x) + (1 - t) * log(1 - x))`` with the logs clamped at -100, as torch."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if target.shape != input.shape:
        raise ValueError(f"Using a target size ({target.shape}) that is different to the input "
                         f"size ({input.shape}) is deprecated. Please ensure they have the same "
                         "size.")
    if _is_concrete(input) and input.numel() and \
            bool(F.any(F.logical_or(F.lt(input, 0), F.gt(input, 1)))):
        raise RuntimeError("all elements of input should be between 0 and 1")
    return _bce(input, target, weight, reduction)


@composite("BinaryCrossEntropyWithLogitsBackward0")
def _bce_logits(x: Tensor, target: Tensor, weight: Tensor | None, pos_weight: Tensor | None,
                reduction: str) -> Tensor:
    soft = _softplus_of_neg(x)
    if pos_weight is not None:
        soft = F.mul(soft, F.add(F.mul(F.sub(pos_weight, 1.0), target), 1.0))
    loss = F.add(F.mul(F.rsub(target, 1.0), x), soft)
    if weight is not None:
        loss = F.mul(loss, weight)
    return _reduce(loss, reduction)


@opmath
def _softplus_of_neg(x: Tensor) -> Tensor:
    """``softplus(-x) = max(-x, 0) + log1p(exp(-|x|))``, stable for large |x|, with the
    gradient ``-sigmoid(-x)``: the kinks of max and abs at 0 would give the second derivative
    0 there, not 1/4 (binary_cross_entropy_with_logits, logsigmoid)."""
    soft = F.add(F.maximum(F.neg(x), 0.0), F.log1p(F.exp(F.neg(F.abs(x)))))
    return F.custom_vjp(soft, (x,), "softplus_of_neg")


@P.register_vjp("softplus_of_neg")
def _softplus_of_neg_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    (x,) = operands
    return (F.mul(g, F.neg(F.sigmoid(F.neg(x)))),)


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor,  # noqa: A002
                                     weight: Tensor | None = None, size_average=None,
                                     reduce=None, reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
    """``binary_cross_entropy(sigmoid(input), target)`` computed stably from logits."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if target.shape != input.shape:
        raise ValueError(f"Target size ({target.shape}) must be the same as input size "
                         f"({input.shape})")
    return _bce_logits(input, target, weight, pos_weight, reduction)


# torch's autocast lists name nn.functional's ops too (linear, the losses, the pools):
# those defined or gathered here are wrapped once, here; the registry wraps its own ops.
_autocast.wrap_namespace(globals())


def __getattr__(name: str):
    from fusegrad.torch_api import missing_attribute
    raise missing_attribute("torch.nn.functional", "fusegrad.nn.functional", name)
