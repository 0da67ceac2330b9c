"""Layer, batch, group, instance and RMS normalization, as compositions of reductions and
elementwise ops.

``batch_norm`` in training mode updates the running statistics in place (under ``no_grad``,
as torch does): in eager mode that writes the buffers; under ``fusegrad.compile`` the state
capture turns the writes into outputs written back after each call, so a compiled training
step updates them exactly as eager does. ``momentum`` may be a 0-d tensor (BatchNorm's
cumulative average with ``momentum=None`` uses 1 / num_batches_tracked, a buffer, whose value
a compiled step cannot read in Python).

Both modes run eagerly as fused kernels on large float32 CPU tensors
(:mod:`fusegrad.tracer.eager_kernels`): the training mode's running-statistics writes are
the compiled function's write-backs to its buffer arguments. In a CNN's training step the
unfused chain cost a numpy pass and an autograd node per primitive, forward and backward:
about a fifth of the eager step.
"""

from __future__ import annotations

import math
from typing import Sequence

from fusegrad import dtypes
from fusegrad.grad_mode import no_grad
from fusegrad.ops.autocast import wrap_namespace
from fusegrad.ops.composite import CustomVJP, composite, opmath
from fusegrad.ops.elementwise import add, div, mul, rsqrt, sub
from fusegrad.ops.inplace import copy_
from fusegrad.ops.movement import reshape, reshape_prim
from fusegrad.ops.operands import cast
from fusegrad.ops.reductions import mean, sum
from fusegrad.ops.registry import public
from fusegrad.symint import SymInt
from fusegrad.tensor import Tensor
from fusegrad.type_info import finfo

__all__ = ["layer_norm", "batch_norm", "group_norm", "instance_norm", "rms_norm"]


def _channel_view(t: Tensor, ndim: int) -> Tensor:
    """A per-channel vector (C,) shaped (1, C, 1, ...) to broadcast over (N, C, *S)."""
    return reshape_prim(t, (1, t.shape[0]) + (1,) * (ndim - 2))


def _affine(out: Tensor, weight, bias) -> Tensor:
    if weight is not None:
        out = mul(out, _channel_view(weight, out.ndim))
    if bias is not None:
        out = add(out, _channel_view(bias, out.ndim))
    return out


def _wide(x: Tensor) -> Tensor:
    """``x`` in float32 if it is float16 or bfloat16 (torch's accumulate type): the batch
    statistics of 16-bit inputs are computed in float32, and the output rounded once."""
    return cast(x, dtypes.float32) if x.dtype in (dtypes.float16, dtypes.bfloat16) else x


def _moments(x: Tensor, axes: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """Mean and biased variance over ``axes``, kept as size-1 dims."""
    mu = mean(x, axes, keepdim=True)
    centered = sub(x, mu)
    return mu, mean(mul(centered, centered), axes, keepdim=True)


def _update_running(running: Tensor, batch: Tensor, momentum) -> None:
    """``running = (1 - momentum) * running + momentum * batch``, in place, without history."""
    with no_grad():
        keep = sub(1.0, momentum) if isinstance(momentum, Tensor) else 1.0 - momentum
        new = add(mul(running, keep), mul(batch.detach(), momentum))
        copy_(running, new.to(running.dtype))


def _bessel(var: Tensor, count) -> Tensor:
    """``var * count / (count - 1)``: the unbiased estimate from ``count`` values. A symbolic
    count (a batch dim traced as a symbol) is no Python number, so its ratio is the graph's
    arithmetic, read at call time."""
    if isinstance(count, SymInt):
        return div(mul(var, count), count - 1)
    return mul(var, count / (count - 1))


@composite("NativeBatchNormBackward0", kernel=True)
def _batch_norm_train(x: Tensor, weight, bias, running_mean, running_var, momentum,
                      eps: float) -> Tensor:
    axes = (0,) + tuple(range(2, x.ndim))
    xw = _wide(x)
    mu, var = _moments(xw, axes)
    out = mul(sub(xw, mu), rsqrt(add(var, eps)))
    count = x.numel() // x.shape[1]
    if running_mean is not None:
        _update_running(running_mean, reshape_prim(mu, (x.shape[1],)), momentum)
    if running_var is not None:
        # the running variance is the unbiased estimate, as torch's
        unbiased = _bessel(reshape_prim(var, (x.shape[1],)), count)
        _update_running(running_var, unbiased, momentum)
    return cast(_affine(out, weight, bias), x.dtype)


@composite("NativeBatchNormBackward0", kernel=True)
def _batch_norm_eval(x: Tensor, weight, bias, running_mean: Tensor, running_var: Tensor,
                     eps: float) -> Tensor:
    scale = rsqrt(add(_channel_view(running_var, x.ndim), eps))
    return _affine(mul(sub(x, _channel_view(running_mean, x.ndim)), scale), weight, bias)


def _check_channels(op: str, x: Tensor, *tensors) -> None:
    if x.ndim < 2:
        raise ValueError(f"{op}: expected an input of at least 2 dims (N, C, ...), got "
                         f"{list(x.shape)}")
    for t in tensors:
        if t is not None and tuple(t.shape) != (x.shape[1],):
            raise RuntimeError(f"{op}: expected per-channel tensors of {x.shape[1]} elements "
                               f"for an input of size {list(x.shape)}, got one of size "
                               f"{list(t.shape)}")


@public(torch=True)
def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,  # noqa: A002
               weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
               momentum: float | Tensor = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalize each channel (dim 1) of (N, C, *S) over the batch and spatial dims.

    Training: by the batch's mean and biased variance, and (when given) the running statistics
    become ``(1 - momentum) * running + momentum * batch`` (the running variance takes the
    unbiased batch variance). Evaluation: by ``running_mean`` and ``running_var``.
    """
    _check_channels("batch_norm", input, running_mean, running_var, weight, bias)
    if training:
        if input.numel() // input.shape[1] <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input "
                             f"size {list(input.shape)}")
        return _batch_norm_train(input, weight, bias, running_mean, running_var, momentum, eps)
    if running_mean is None or running_var is None:
        raise RuntimeError("batch_norm: running_mean and running_var must be defined in "
                           "evaluation mode")
    return _batch_norm_eval(input, weight, bias, running_mean, running_var, eps)


@composite("NativeGroupNormBackward0")
@opmath
def _group_norm(x: Tensor, num_groups: int, weight, bias, eps: float) -> Tensor:
    grouped = reshape(x, (x.shape[0], num_groups, -1))
    mu, var = _moments(grouped, (2,))
    out = reshape(mul(sub(grouped, mu), rsqrt(add(var, eps))), tuple(x.shape))
    return _affine(out, weight, bias)


@public(torch=True)
def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None,  # noqa: A002
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalize each of ``num_groups`` groups of channels of (N, C, *S) over its channels and
    spatial dims, then scale and shift per channel."""
    if input.ndim < 2:
        raise RuntimeError(f"group_norm: expected an input of at least 2 dims, got "
                           f"{list(input.shape)}")
    if input.shape[1] % num_groups:
        raise RuntimeError(f"Expected number of channels in input to be divisible by num_groups, "
                           f"but got input of shape {list(input.shape)} and num_groups="
                           f"{num_groups}")
    return _group_norm(input, num_groups, weight, bias, eps)


@composite("NativeBatchNormBackward0")
def _instance_norm(x: Tensor, weight, bias, running_mean, running_var, momentum,
                   eps: float) -> Tensor:
    axes = tuple(range(2, x.ndim))
    xw = _wide(x)
    mu, var = _moments(xw, axes)
    out = mul(sub(xw, mu), rsqrt(add(var, eps)))
    count = math.prod(x.shape[2:])
    # torch updates the running statistics with the instances' statistics averaged over N
    if running_mean is not None:
        _update_running(running_mean, mean(reshape_prim(mu, tuple(x.shape[:2])), 0), momentum)
    if running_var is not None:
        unbiased = _bessel(reshape_prim(var, tuple(x.shape[:2])), count)
        _update_running(running_var, mean(unbiased, 0), momentum)
    return cast(_affine(out, weight, bias), x.dtype)


@public(torch=True)
def instance_norm(input: Tensor, running_mean: Tensor | None = None,  # noqa: A002
                  running_var: Tensor | None = None, weight: Tensor | None = None,
                  bias: Tensor | None = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalize each channel of each instance of (N, C, *S) over its spatial dims; with
    ``use_input_stats=False``, by the running statistics instead."""
    _check_channels("instance_norm", input, running_mean, running_var, weight, bias)
    if not use_input_stats:
        return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    if math.prod(input.shape[2:]) <= 1:
        raise ValueError(f"Expected more than 1 spatial element when training, got input size "
                         f"{list(input.shape)}")
    return _instance_norm(input, weight, bias, running_mean, running_var, momentum, eps)


@composite("RmsNormBackward0")
@opmath
def _rms_norm(x: Tensor, axes: tuple[int, ...], weight, eps: float) -> Tensor:
    out = mul(x, rsqrt(add(mean(mul(x, x), axes, keepdim=True), eps)))
    return mul(out, weight) if weight is not None else out


def _normalized_axes(input: Tensor, normalized_shape: Sequence[int] | int) -> tuple[int, ...]:  # noqa: A002
    """The trailing axes of ``input`` that ``normalized_shape`` names (layer_norm, rms_norm),
    or torch's error when they are not its last dims."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or input.ndim < k or tuple(input.shape[input.ndim - k:]) != shape:
        raise RuntimeError(f"Given normalized_shape={list(shape)}, expected input with shape "
                           f"[*, {', '.join(map(str, shape))}], but got input of size"
                           f"{list(input.shape)}")
    return tuple(range(input.ndim - k, input.ndim))


@public(torch=True)
def rms_norm(input: Tensor, normalized_shape: Sequence[int] | int,  # noqa: A002
             weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last ``len(normalized_shape)`` dims;
    ``eps=None`` is the dtype's machine epsilon, as torch's."""
    axes = _normalized_axes(input, normalized_shape)
    if eps is None:
        eps = finfo(input.dtype if input.dtype.is_floating_point
                    else dtypes.get_default_dtype()).eps
    return _rms_norm(input, axes, weight, eps)


def _row_size(x: Tensor, axes: tuple[int, ...]):
    n = 1
    for a in axes:
        n *= x.shape[a]
    return n


def _centered_and_rstd(x: Tensor, axes: tuple[int, ...], eps: float) -> tuple[Tensor, Tensor]:
    """``x - mean`` and ``1 / sqrt(var + eps)`` over ``axes`` (the biased variance)."""
    n = _row_size(x, axes)
    centered = sub(x, div(sum(x, axes, keepdim=True), n))
    var = div(sum(mul(centered, centered), axes, keepdim=True), n)
    return centered, rsqrt(add(var, eps))


@opmath
def _layer_norm_values(x: Tensor, axes: tuple[int, ...], weight: Tensor | None, bias: Tensor | None,
                       eps: float) -> Tensor:
    centered, rstd = _centered_and_rstd(x, axes, eps)
    out = mul(centered, rstd)
    if weight is not None:
        out = mul(out, weight)
    if bias is not None:
        out = add(out, bias)
    return out


# torch's NativeLayerNormBackward, which reads the input (and the per-row mean and rstd): a
# compiled backward recomputes the centered and normalized values from the input where the
# chain rule through the forward's primitives would keep both from the forward (twice the
# input's bytes); the row statistics are recomputed beside them, in the same row loop.
_layer_norm_rule = CustomVJP("layer_norm", recompute=True)


@_layer_norm_rule.defvjp
def _layer_norm_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    axes, eps, has_weight, has_bias = params
    x = operands[0]
    weight = operands[1] if has_weight else None

    def wide(t: Tensor) -> Tensor:
        return cast(t, dtypes.float32) if t.dtype in (dtypes.bfloat16, dtypes.float16) else t
    g = wide(g)
    centered, rstd = _centered_and_rstd(wide(x), axes, eps)
    normalized = mul(centered, rstd)
    g_normalized = mul(g, wide(weight)) if has_weight else g
    n = _row_size(x, axes)
    row_mean = div(sum(g_normalized, axes, keepdim=True), n)
    row_dot = div(sum(mul(g_normalized, normalized), axes, keepdim=True), n)
    grads = [cast(mul(rstd, sub(sub(g_normalized, row_mean), mul(normalized, row_dot))), x.dtype)]
    lead = tuple(range(x.ndim - len(axes)))

    def over_rows(t: Tensor) -> Tensor:
        return sum(t, lead) if lead else t
    if has_weight:
        grads.append(cast(over_rows(mul(g, normalized)), weight.dtype))
    if has_bias:
        grads.append(cast(over_rows(g), operands[-1].dtype))
    return tuple(grads)


@composite("NativeLayerNormBackward0", kernel=True)
def _layer_norm(x: Tensor, axes: tuple[int, ...], weight: Tensor | None, bias: Tensor | None,
                eps: float) -> Tensor:
    out = _layer_norm_values(x, axes, weight, bias, eps)
    operands = tuple(t for t in (x, weight, bias) if t is not None)
    return _layer_norm_rule.mark(out, operands, (axes, eps, weight is not None, bias is not None))


def layer_norm(input: Tensor, normalized_shape: Sequence[int],  # noqa: A002
               weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalize over the last ``len(normalized_shape)`` dims to zero mean and unit
    (biased) variance, then scale by ``weight`` and shift by ``bias``."""
    return _layer_norm(input, _normalized_axes(input, normalized_shape), weight, bias, eps)


# torch's autocast lists name layer_norm (the registry wraps the public ops): wrapped here.
wrap_namespace(globals())
