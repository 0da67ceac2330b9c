"""More of torch.nn.functional's losses: ``smooth_l1_loss``, ``huber_loss``, ``kl_div``,
``cosine_embedding_loss`` (re-exported by :mod:`fusegrad.nn.functional`)."""

from __future__ import annotations

import warnings

from fusegrad.nn import functional as NF  # its helpers, looked up at call time
from fusegrad.ops import functional as F
from fusegrad.tensor import Tensor


def smooth_l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,  # noqa: A002
                   reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """``0.5 * d**2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 * beta`` (``d = input -
    target``); ``beta = 0`` is the L1 loss."""
    reduction = NF._legacy_reduction(size_average, reduce, reduction)
    NF._check_reduction(reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    NF._warn_size(input, target)
    z = F.abs(F.sub(input, target))
    if beta == 0:
        return NF._reduce(z, reduction)
    loss = F.where(F.lt(z, beta), F.mul(F.mul(z, z), 0.5 / beta), F.sub(z, 0.5 * beta))
    return NF._reduce(loss, reduction)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean",  # noqa: A002
               delta: float = 1.0, weight: Tensor | None = None) -> Tensor:
    """``0.5 * d**2`` where ``|d| < delta``, else ``delta * (|d| - 0.5 * delta)``; ``weight``
    scales each element before the reduction."""
    NF._check_reduction(reduction)
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    NF._warn_size(input, target)
    z = F.abs(F.sub(input, target))
    loss = F.where(F.lt(z, delta), F.mul(F.mul(z, z), 0.5), F.mul(F.sub(z, 0.5 * delta), delta))
    if weight is not None:
        loss = F.mul(loss, weight)
    return NF._reduce(loss, reduction)


def kl_div(input: Tensor, target: Tensor, size_average=None, reduce=None,  # noqa: A002
           reduction: str = "mean", log_target: bool = False) -> Tensor:
    """The pointwise KL divergence ``target * (log(target) - input)`` of log-probabilities
    ``input`` (0 where ``target`` is 0); ``log_target``: ``target`` holds log-probabilities too.
    ``reduction='batchmean'`` divides the sum by the batch size (the KL divergence proper)."""
    reduction = NF._legacy_reduction(size_average, reduce, reduction)
    if reduction not in ("none", "mean", "sum", "batchmean"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if reduction == "mean":
        warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the "
                      "support size.'batchmean' divides only by the batch size, and aligns with "
                      "the KL div math definition.'mean' will be changed to behave the same as "
                      "'batchmean' in the next major release.", UserWarning, stacklevel=2)
    if log_target:
        loss = F.mul(F.exp(target), F.sub(target, input))
    else:
        # xlogy(t, t): t * log(t) with 0 at t == 0, and a finite gradient there
        zero = F.eq(target, 0)
        loss = F.sub(F.mul(target, F.log(F.where(zero, 1.0, target))), F.mul(target, input))
    if reduction == "batchmean":
        total = F.sum(loss)
        return F.div(total, input.shape[0]) if input.ndim else total
    return NF._reduce(loss, reduction)


def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                          size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """``1 - cos(x1, x2)`` where ``target`` is 1, ``max(0, cos(x1, x2) - margin)`` where it is
    -1; the cosine along dim 1 (dim 0 of unbatched 1-D inputs), computed as torch's (with
    1e-12 added to each squared norm)."""
    reduction = NF._legacy_reduction(size_average, reduce, reduction)
    NF._check_reduction(reduction)
    if input1.ndim != input2.ndim or input1.ndim not in (1, 2):
        raise RuntimeError(f"cosine_embedding_loss: Expected 1D or 2D inputs, but got "
                           f"{input1.ndim}D and {input2.ndim}D")
    if target.ndim != input1.ndim - 1:
        raise RuntimeError(f"{input1.ndim}D target tensor expects {input1.ndim - 1}D input "
                           f"tensors, but found inputs with sizes {list(input1.shape)} and "
                           f"{list(input2.shape)}.")
    dim = input1.ndim - 1
    eps = 1e-12
    prod = F.sum(F.mul(input1, input2), dim)
    mag1 = F.add(F.sum(F.mul(input1, input1), dim), eps)
    mag2 = F.add(F.sum(F.mul(input2, input2), dim), eps)
    cos = F.div(prod, F.sqrt(F.mul(mag1, mag2)))
    pos = F.sub(1.0, cos)
    neg = F.clamp(F.sub(cos, margin), min=0.0)
    zero = F.mul(cos, 0.0)
    loss = F.where(F.eq(target, 1), pos, F.where(F.eq(target, -1), neg, zero))
    return NF._reduce(loss, reduction)
