"""Softmax, log_softmax and softmin: one formula and one VJP each.

The formulas are :mod:`fusegrad.ops.softmax_math`'s, here on tensors; scaled dot-product
attention (:mod:`fusegrad.ops.attention`) marks its weights with :data:`softmax_values`'s
VJP. Traced, softmax and log_softmax carry torch's backward formulas
(:class:`~fusegrad.ops.composite.CustomVJP`), which read the output alone.
"""

from __future__ import annotations

import warnings

from fusegrad import dtypes
from fusegrad.ops import functional as F
from fusegrad.ops.autocast import wrap_namespace
from fusegrad.ops.composite import composite, custom_vjp, opmath
from fusegrad.ops.registry import public
from fusegrad.ops.softmax_math import SoftmaxMath, shift_by_max, softmax_formula, softmax_vjp_formula
from fusegrad.tensor import Tensor

__all__ = ["softmax", "log_softmax", "softmin", "softmax_values", "log_softmax_values",
           "TENSOR_MATH"]


# The formulas' operations on tensors (traced or eager)
TENSOR_MATH = SoftmaxMath(lambda x, dim: F.amax(x.detach(), dim, keepdim=True),
                          lambda x, dim: F.sum(x, dim, keepdim=True),
                          F.exp, F.where, F.eq, F.sub, F.mul, F.div)


@custom_vjp("softmax", reads_output=True, reads_operands=False)
def softmax_values(x: Tensor, dim: int) -> Tensor:
    """Softmax's value, with :func:`softmax_vjp_formula` as its gradient."""
    return softmax_formula(TENSOR_MATH, x, dim)


@softmax_values.defvjp
def _softmax_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    (dim,) = params
    return (softmax_vjp_formula(TENSOR_MATH, g, out, dim),)


@custom_vjp("log_softmax", reads_output=True, reads_operands=False)
def log_softmax_values(x: Tensor, dim: int) -> Tensor:
    """``x - logsumexp(x)``, with torch's LogSoftmaxBackward as its gradient."""
    s, _ = shift_by_max(TENSOR_MATH, x, dim)
    return F.sub(s, F.log(F.sum(F.exp(s), dim, keepdim=True)))


@log_softmax_values.defvjp
def _log_softmax_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    """torch's LogSoftmaxBackward: ``g - exp(out) * sum(g)``."""
    (dim,) = params
    return (F.sub(g, F.mul(F.exp(out), F.sum(g, dim, keepdim=True))),)


# 16-bit inputs are computed in float32 (cross_entropy calls _log_softmax_impl in its own node)
_softmax_impl = opmath(softmax_values)
_log_softmax_impl = opmath(log_softmax_values)


# A 16-bit softmax's gradient reads its 16-bit output, as torch's (softmax_backward_data of
# a bf16 output: float32 arithmetic, rounded once): a backward holds the rounded output,
# which the next product reads too, not the float32 one it was rounded from.
@custom_vjp("softmax_16bit", reads_output=True, reads_operands=False)
def _softmax_16bit(x: Tensor, dim: int) -> Tensor:
    return _softmax_impl(x, dim)


@_softmax_16bit.defvjp
def _softmax_16bit_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    return (F.cast(_softmax_vjp(F.cast(g, dtypes.float32), F.cast(out, dtypes.float32), operands,
                                params)[0], out.dtype),)


@custom_vjp("log_softmax_16bit", reads_output=True, reads_operands=False)
def _log_softmax_16bit(x: Tensor, dim: int) -> Tensor:
    return _log_softmax_impl(x, dim)


@_log_softmax_16bit.defvjp
def _log_softmax_16bit_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    return (F.cast(_log_softmax_vjp(F.cast(g, dtypes.float32), F.cast(out, dtypes.float32),
                                    operands, params)[0], out.dtype),)


def _by_width(wide, narrow):
    def values(x: Tensor, dim: int) -> Tensor:
        return (narrow if x.dtype in (dtypes.bfloat16, dtypes.float16) else wide)(x, dim)
    return values


_softmax = composite("SoftmaxBackward0", kernel=True)(_by_width(_softmax_impl, _softmax_16bit))
_log_softmax = composite("LogSoftmaxBackward0", kernel=True)(
    _by_width(_log_softmax_impl, _log_softmax_16bit))


def _softmax_dim(name: str, ndim: int) -> int:
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to "
                  "include dim=X as an argument.", UserWarning, stacklevel=3)
    return 0 if ndim in (0, 1, 3) else 1


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


# torch.softmax and Tensor.softmax are this function too
public(softmax, torch=True, method=True)
public(log_softmax, torch=True, method=True)

# torch's autocast lists name these (softmax, log_softmax, softmin): wrapped once, here.
wrap_namespace(globals())
