"""More of torch.nn.functional's losses: ``smooth_l1_loss``, ``huber_loss``, ``kl_div``,
``cosine_embedding_loss``, the likelihood losses (Poisson, Gaussian), the margin losses
(ranking, hinge embedding, soft margin, multi-label soft margin, multi-class margin, triplet)
(re-exported by :mod:`fusegrad.nn.functional`)."""

from __future__ import annotations

import math
import warnings

from fusegrad.nn import functional as NF  # its helpers, looked up at call time
from fusegrad.nn.layer_functions import pairwise_distance
from fusegrad.ops import functional as F
from fusegrad.ops import primitive
from fusegrad.ops.creation import arange
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


def _check_reduction_is_valid(reduction: str) -> None:
    """torch's own wording for these two losses (the others': :func:`NF._check_reduction`)."""
    if reduction not in NF._REDUCTIONS:
        raise ValueError(reduction + " is not valid")


def _reduction_of(size_average, reduce, reduction: str) -> str:
    reduction = NF._legacy_reduction(size_average, reduce, reduction)
    NF._check_reduction(reduction)
    return reduction


def poisson_nll_loss(input: Tensor, target: Tensor, log_input: bool = True,  # noqa: A002
                     full: bool = False, size_average=None, eps: float = 1e-8, reduce=None,
                     reduction: str = "mean") -> Tensor:
    """Negative log likelihood of ``target`` under a Poisson of rate ``exp(input)``
    (``log_input``) or ``input``: ``exp(input) - target * input``, or ``input - target *
    log(input + eps)``; ``full`` adds Stirling's approximation of ``log(target!)`` where
    ``target > 1``."""
    reduction = _reduction_of(size_average, reduce, reduction)
    if log_input:
        loss = F.sub(F.exp(input), F.mul(target, input))
    else:
        loss = F.sub(input, F.mul(target, F.log(F.add(input, eps))))
    if full:
        big = F.gt(target, 1)
        t = F.where(big, target, 2.0)   # the masked entries stay finite (and their gradient 0)
        stirling = F.add(F.sub(F.mul(t, F.log(t)), t), F.mul(F.log(F.mul(t, 2 * math.pi)), 0.5))
        loss = F.add(loss, F.where(big, stirling, 0.0))
    return NF._reduce(loss, reduction)


def gaussian_nll_loss(input: Tensor, target: Tensor, var, full: bool = False,  # noqa: A002
                      eps: float = 1e-6, reduction: str = "mean") -> Tensor:
    """``0.5 * (log(var) + (input - target)**2 / var)`` (plus ``0.5 * log(2 * pi)`` when
    ``full``); ``var`` is clamped to ``eps`` without changing its gradient, as torch does. A
    ``var`` with one dim less than ``input``, or size 1 in one dim, broadcasts."""
    if isinstance(var, float):
        if var < 0:
            raise ValueError("var has negative entry/entries")
        var = F.full_like(input, var)
    elif not primitive.traced(var) and (var.detach().numpy() < 0).any():
        raise ValueError("var has negative entry/entries")
    if var.shape != input.shape:
        if input.shape[:-1] == var.shape:
            var = F.unsqueeze(var, -1)
        elif input.ndim == var.ndim and sum(
                v for i, v in zip(input.shape, var.shape, strict=True) if i != v) == 1:
            pass   # heteroscedastic: one dim of size 1
        else:
            raise ValueError("var is of incorrect size")
    _check_reduction_is_valid(reduction)
    # torch clamps a clone in place under no_grad: the value is clamped, the gradient is var's
    var = F.add(var, F.sub(F.clamp(var, min=eps), var).detach())
    d = F.sub(input, target)
    loss = F.mul(F.add(F.log(var), F.div(F.mul(d, d), var)), 0.5)
    if full:
        loss = F.add(loss, 0.5 * math.log(2 * math.pi))
    return NF._reduce(loss, reduction)


def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0,
                        size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """``max(0, -target * (input1 - input2) + margin)``: rank ``input1`` above ``input2``
    where ``target`` is 1, below where it is -1."""
    reduction = _reduction_of(size_average, reduce, reduction)
    if input1.ndim != input2.ndim or input1.ndim != target.ndim:
        raise RuntimeError(f"margin_ranking_loss : All input tensors should have same dimension "
                           f"but got sizes: input1: {_size(input1)}, input2: {_size(input2)}, "
                           f"target: {_size(target)} ")
    loss = F.clamp(F.add(F.mul(F.neg(target), F.sub(input1, input2)), margin), min=0)
    return NF._reduce(loss, reduction)


def _size(t: Tensor) -> str:
    return f"torch.Size({list(t.shape)})"


def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0,  # noqa: A002
                         size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """``input`` where ``target`` is 1, ``max(0, margin - input)`` where it is -1 (both terms
    where it is neither, as torch computes it)."""
    reduction = _reduction_of(size_average, reduce, reduction)
    margin_term = F.where(F.ne(target, 1), F.clamp(F.sub(margin, input), min=0), 0.0)
    self_term = F.where(F.ne(target, -1), input, 0.0)
    return NF._reduce(F.add(margin_term, self_term), reduction)


def soft_margin_loss(input: Tensor, target: Tensor, size_average=None,  # noqa: A002
                     reduce=None, reduction: str = "mean") -> Tensor:
    """``log(1 + exp(-target * input))``: a smooth two-class margin loss."""
    reduction = _reduction_of(size_average, reduce, reduction)
    return NF._reduce(F.log1p(F.exp(F.mul(F.neg(input), target))), reduction)


def multilabel_soft_margin_loss(input: Tensor, target: Tensor,  # noqa: A002
                                weight: Tensor | None = None, size_average=None, reduce=None,
                                reduction: str = "mean") -> Tensor:
    """Binary cross entropy of logits per class, averaged over the classes (the last dim);
    ``weight`` scales each class."""
    reduction = NF._legacy_reduction(size_average, reduce, reduction)
    loss = F.neg(F.add(F.mul(target, NF.logsigmoid(input)),
                       F.mul(F.sub(1, target), NF.logsigmoid(F.neg(input)))))
    if weight is not None:
        loss = F.mul(loss, weight)
    class_dim = input.ndim - 1
    loss = F.div(F.sum(loss, class_dim), input.shape[class_dim])
    _check_reduction_is_valid(reduction)
    return NF._reduce(loss, reduction)


def multi_margin_loss(input: Tensor, target: Tensor, p: int = 1,  # noqa: A002
                      margin: float = 1.0, weight: Tensor | None = None, size_average=None,
                      reduce=None, reduction: str = "mean") -> Tensor:
    """Multi-class hinge loss: per sample ``sum_{i != y} w[y] * max(0, margin - x[y] +
    x[i])**p / C`` for the target class ``y`` of ``C``."""
    reduction = _reduction_of(size_average, reduce, reduction)
    if p != 1 and p != 2:
        raise ValueError("only p == 1 and p == 2 supported")
    if weight is not None and weight.ndim != 1:
        raise ValueError("weight must be one-dimensional")
    if not ((input.ndim == 2 and input.shape[1] != 0) or (input.ndim == 1 and input.shape[0])
            or input.ndim == 0):
        raise RuntimeError(f"Expected non-empty vector or matrix with optional 0-dim batch "
                           f"size, but got: {list(input.shape)}")
    x = F.reshape(input, (-1, input.shape[-1] if input.ndim else 1))
    frames, classes = x.shape
    if target.ndim > 1 or target.numel() != frames:
        raise RuntimeError(f"multi_margin_loss: target tensor should be 1-D with size equal to "
                           f"the number of input samples (batch size). Expected target size "
                           f"[{frames}], but got {list(target.shape)}. Input has shape "
                           f"{list(input.shape)}.")
    if weight is not None and weight.numel() != classes:
        raise RuntimeError(f"inconsistent weight size, expected {classes} but got "
                           f"{list(weight.shape)}")
    if not primitive.traced(target) and frames:
        values = target.numpy()
        if (values < 0).any() or (values >= classes).any():
            raise RuntimeError("target out of range")
    y = F.reshape(target, (frames, 1))
    picked = F.gather(x, 1, y)
    z = F.clamp(F.add(F.sub(x, picked), margin), min=0)
    if p == 2:
        z = F.mul(z, z)
    if weight is not None:
        z = F.mul(z, F.unsqueeze(F.gather(weight, 0, F.reshape(y, (frames,))), 1))
    # the target class itself is left out of the sum
    z = F.where(F.eq(arange(classes), y), 0.0, z)
    loss = F.div(F.sum(z, 1), classes)
    if input.ndim < 2:
        loss = F.reshape(loss, ())
    return NF._reduce(loss, reduction)


def _triplet_dims(anchor: Tensor, positive: Tensor, negative: Tensor) -> None:
    if not (anchor.ndim == positive.ndim == negative.ndim):
        raise RuntimeError(f"The anchor, positive, and negative tensors are expected to have the "
                           f"same number of dimensions, but got: anchor {anchor.ndim}D, positive "
                           f"{positive.ndim}D, and negative {negative.ndim}D inputs")


def _triplet_loss(dist, anchor, positive, negative, margin, swap, reduction) -> Tensor:
    dist_pos = dist(anchor, positive)
    dist_neg = dist(anchor, negative)
    if swap:
        dist_neg = F.minimum(dist_neg, dist(positive, negative))
    return NF._reduce(F.clamp(F.sub(F.add(dist_pos, margin), dist_neg), min=0), reduction)


def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0,
                        p: float = 2, eps: float = 1e-6, swap: bool = False, size_average=None,
                        reduce=None, reduction: str = "mean") -> Tensor:
    """``max(0, margin + d(anchor, positive) - d(anchor, negative))`` with ``d`` the p-norm
    :func:`pairwise_distance`; ``swap``: the smaller of d(a, n) and d(p, n)."""
    reduction = _reduction_of(size_average, reduce, reduction)
    if margin <= 0:
        raise ValueError(f"margin must be greater than 0, got {margin}")
    _triplet_dims(anchor, positive, negative)
    return _triplet_loss(lambda a, b: pairwise_distance(a, b, p, eps), anchor, positive,
                         negative, margin, swap, reduction)


def triplet_margin_with_distance_loss(anchor: Tensor, positive: Tensor, negative: Tensor, *,
                                      distance_function=None, margin: float = 1.0,
                                      swap: bool = False, reduction: str = "mean") -> Tensor:
    """:func:`triplet_margin_loss` with any ``distance_function`` (default
    :func:`pairwise_distance`)."""
    NF._check_reduction(reduction)
    if margin <= 0:
        raise ValueError(f"margin must be greater than 0, got {margin}")
    _triplet_dims(anchor, positive, negative)
    return _triplet_loss(distance_function or pairwise_distance, anchor, positive, negative,
                         margin, swap, reduction)
