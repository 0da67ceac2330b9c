"""Helpers the distributions share (torch's ``torch.distributions.utils``)."""

from __future__ import annotations

import numbers
from functools import update_wrapper

import fusegrad.nn.functional as F
from fusegrad import dtypes, type_info
from fusegrad.autograd.grad_mode import enable_grad
from fusegrad.ops import creation
from fusegrad.ops import functional as _ops
from fusegrad.ops.primitive import traced
from fusegrad.tensor import Tensor

__all__ = ["broadcast_all", "clamp_probs", "lazy_property", "logits_to_probs", "probs_to_logits",
           "euler_constant"]

euler_constant = 0.5772156649015329   # Euler-Mascheroni


def broadcast_all(*values) -> tuple[Tensor, ...]:
    """``values`` (tensors and numbers) as tensors broadcast to one shape. Numbers take the
    dtype and device of the first tensor among them, or the default dtype.

    >>> loc, scale = broadcast_all(0.0, fusegrad.ones(3))
    >>> loc.shape
    fusegrad.Size([3])
    """
    if not all(isinstance(v, (Tensor, numbers.Number)) for v in values):
        raise ValueError("Input arguments must all be instances of Number, torch.Tensor or "
                         "objects implementing __torch_function__.")
    if not all(isinstance(v, Tensor) for v in values):
        like = next((v for v in values if isinstance(v, Tensor)), None)
        options = {"dtype": dtypes.get_default_dtype()} if like is None else \
            {"dtype": like.dtype, "device": like.device}
        values = [v if isinstance(v, Tensor) else creation.tensor(v, **options) for v in values]
    return tuple(_ops.broadcast_tensors(*values))


def _sum_rightmost(value, dim: int):
    """``value`` summed over its ``dim`` rightmost dims."""
    if dim == 0:
        return value
    return value.reshape(tuple(value.shape[:-dim]) + (-1,)).sum(-1)


def logits_to_probs(logits: Tensor, is_binary: bool = False) -> Tensor:
    """Probabilities from logits: the sigmoid for a binary variable, else the softmax of
    the last dim."""
    if is_binary:
        return _ops.sigmoid(logits)
    return F.softmax(logits, dim=-1)


def clamp_probs(probs: Tensor) -> Tensor:
    """``probs`` clamped into ``[eps, 1 - eps]`` of their dtype."""
    eps = type_info.finfo(probs.dtype).eps
    return probs.clamp(min=eps, max=1 - eps)


def probs_to_logits(probs: Tensor, is_binary: bool = False) -> Tensor:
    """Logits from probabilities (clamped away from 0 and 1 first, so they stay finite)."""
    clamped = clamp_probs(probs)
    if is_binary:
        return _ops.log(clamped) - _ops.log1p(-clamped)
    return _ops.log(clamped)


class lazy_property:  # noqa: N801 - torch's name
    """A property computed on first read and then stored on the instance (Bernoulli's
    ``logits`` from its ``probs``). Computed with grad enabled, as the value is kept."""

    def __init__(self, wrapped):
        self.wrapped = wrapped
        update_wrapper(self, wrapped)

    def __get__(self, instance, obj_type=None):
        if instance is None:
            return self
        with enable_grad():
            value = self.wrapped(instance)
        setattr(instance, self.wrapped.__name__, value)
        return value


def _standard_normal(shape, dtype, device=None) -> Tensor:
    return creation.randn(tuple(shape), dtype=dtype, device=device)


def _is_traced(*values) -> bool:
    """Whether an op on ``values`` is recorded into a trace, where their data is unknown (a
    validation check cannot look at it)."""
    return traced(*(v for v in values if isinstance(v, Tensor)))
