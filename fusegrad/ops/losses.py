"""torch.nn.functional's losses: mse, l1, the class losses (nll_loss, cross_entropy), binary
cross entropy (of probabilities and of logits), smooth L1 and Huber, KL divergence, the
likelihood losses (Poisson, Gaussian), the margin losses (cosine embedding, ranking, hinge
embedding, soft margin, multi-label soft margin, multi-class margin, triplet).

Where torch's own formula would give a NaN gradient through an unselected ``where`` branch
(log(0) in BCE), the branch input is made safe first: ``where``'s VJP multiplies the
unselected branch by 0, and 0 * inf is NaN.
"""

from __future__ import annotations

import math
import warnings

from fusegrad import dtypes
from fusegrad.ops import functional as F
from fusegrad.ops import primitive
from fusegrad.ops import prims as P
from fusegrad.ops.activations import _softplus_of_neg, logsigmoid
from fusegrad.ops.autocast import wrap_namespace
from fusegrad.ops.composite import composite, custom_vjp
from fusegrad.ops.creation import _source, arange
from fusegrad.ops.layers import pairwise_distance
from fusegrad.ops.softmax import _log_softmax_impl
from fusegrad.tensor import Tensor

__all__ = ["mse_loss", "l1_loss", "nll_loss", "cross_entropy", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "smooth_l1_loss", "huber_loss", "kl_div",
           "cosine_embedding_loss", "poisson_nll_loss", "gaussian_nll_loss",
           "margin_ranking_loss", "hinge_embedding_loss", "soft_margin_loss",
           "multilabel_soft_margin_loss", "multi_margin_loss", "triplet_margin_loss",
           "triplet_margin_with_distance_loss"]

_REDUCTIONS = ("none", "mean", "sum")


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


def _warn_legacy_reduction(size_average, reduce) -> str:
    """torch's mapping of the deprecated ``size_average``/``reduce`` flags to ``reduction``."""
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    reduction = "mean" if size_average and reduce else "sum" if reduce else "none"
    warnings.warn(f"size_average and reduce args will be deprecated, please use "
                  f"reduction='{reduction}' instead.", UserWarning, stacklevel=3)
    return reduction


def _legacy_reduction(size_average, reduce, reduction: str) -> str:
    if size_average is None and reduce is None:
        return reduction
    return _warn_legacy_reduction(size_average, reduce)


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
    # numel // n_classes is exact, and stays a size when the batch dim is symbolic
    return F.div(F.neg(F.sum(terms)), x.numel() // n_classes)


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


@custom_vjp("binary_cross_entropy")
def _bce_terms(x: Tensor, target: Tensor) -> Tensor:
    """The elementwise loss, with torch's gradient (:func:`_bce_vjp`)."""
    return F.neg(F.add(F.mul(target, _safe_log(x)),
                       F.mul(F.rsub(target, 1.0), _safe_log(F.rsub(x, 1.0)))))


@composite("BinaryCrossEntropyBackward0")
def _bce(x: Tensor, target: Tensor, weight: Tensor | None, reduction: str) -> Tensor:
    loss = _bce_terms(x, target)
    if weight is not None:
        loss = F.mul(loss, weight)
    return _reduce(loss, reduction)


@_bce_terms.defvjp
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


def smooth_l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,  # noqa: A002
                   reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """``0.5 * d**2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 * beta`` (``d = input -
    target``); ``beta = 0`` is the L1 loss."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    _warn_size(input, target)
    z = F.abs(F.sub(input, target))
    if beta == 0:
        return _reduce(z, reduction)
    loss = F.where(F.lt(z, beta), F.mul(F.mul(z, z), 0.5 / beta), F.sub(z, 0.5 * beta))
    return _reduce(loss, reduction)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean",  # noqa: A002
               delta: float = 1.0, weight: Tensor | None = None) -> Tensor:
    """``0.5 * d**2`` where ``|d| < delta``, else ``delta * (|d| - 0.5 * delta)``; ``weight``
    scales each element before the reduction."""
    _check_reduction(reduction)
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    _warn_size(input, target)
    z = F.abs(F.sub(input, target))
    loss = F.where(F.lt(z, delta), F.mul(F.mul(z, z), 0.5), F.mul(F.sub(z, 0.5 * delta), delta))
    if weight is not None:
        loss = F.mul(loss, weight)
    return _reduce(loss, reduction)


def kl_div(input: Tensor, target: Tensor, size_average=None, reduce=None,  # noqa: A002
           reduction: str = "mean", log_target: bool = False) -> Tensor:
    """The pointwise KL divergence ``target * (log(target) - input)`` of log-probabilities
    ``input`` (0 where ``target`` is 0); ``log_target``: ``target`` holds log-probabilities too.
    ``reduction='batchmean'`` divides the sum by the batch size (the KL divergence proper)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
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
    return _reduce(loss, reduction)


def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                          size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """``1 - cos(x1, x2)`` where ``target`` is 1, ``max(0, cos(x1, x2) - margin)`` where it is
    -1; the cosine along dim 1 (dim 0 of unbatched 1-D inputs), computed as torch's (with
    1e-12 added to each squared norm)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
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
    return _reduce(loss, reduction)


def _check_reduction_is_valid(reduction: str) -> None:
    """torch's own wording for these two losses (the others': :func:`_check_reduction`)."""
    if reduction not in _REDUCTIONS:
        raise ValueError(reduction + " is not valid")


def _reduction_of(size_average, reduce, reduction: str) -> str:
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
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
    return _reduce(loss, reduction)


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
    return _reduce(loss, reduction)


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
    return _reduce(loss, reduction)


def _size(t: Tensor) -> str:
    return f"torch.Size({list(t.shape)})"


def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0,  # noqa: A002
                         size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """``input`` where ``target`` is 1, ``max(0, margin - input)`` where it is -1 (both terms
    where it is neither, as torch computes it)."""
    reduction = _reduction_of(size_average, reduce, reduction)
    margin_term = F.where(F.ne(target, 1), F.clamp(F.sub(margin, input), min=0), 0.0)
    self_term = F.where(F.ne(target, -1), input, 0.0)
    return _reduce(F.add(margin_term, self_term), reduction)


def soft_margin_loss(input: Tensor, target: Tensor, size_average=None,  # noqa: A002
                     reduce=None, reduction: str = "mean") -> Tensor:
    """``log(1 + exp(-target * input))``: a smooth two-class margin loss."""
    reduction = _reduction_of(size_average, reduce, reduction)
    return _reduce(F.log1p(F.exp(F.mul(F.neg(input), target))), reduction)


def multilabel_soft_margin_loss(input: Tensor, target: Tensor,  # noqa: A002
                                weight: Tensor | None = None, size_average=None, reduce=None,
                                reduction: str = "mean") -> Tensor:
    """Binary cross entropy of logits per class, averaged over the classes (the last dim);
    ``weight`` scales each class."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    loss = F.neg(F.add(F.mul(target, logsigmoid(input)),
                       F.mul(F.sub(1, target), logsigmoid(F.neg(input)))))
    if weight is not None:
        loss = F.mul(loss, weight)
    class_dim = input.ndim - 1
    loss = F.div(F.sum(loss, class_dim), input.shape[class_dim])
    _check_reduction_is_valid(reduction)
    return _reduce(loss, reduction)


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
    return _reduce(loss, reduction)


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
    return _reduce(F.clamp(F.sub(F.add(dist_pos, margin), dist_neg), min=0), reduction)


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
    _check_reduction(reduction)
    if margin <= 0:
        raise ValueError(f"margin must be greater than 0, got {margin}")
    _triplet_dims(anchor, positive, negative)
    return _triplet_loss(distance_function or pairwise_distance, anchor, positive, negative,
                         margin, swap, reduction)


# torch's autocast lists name most losses: wrapped once, here.
wrap_namespace(globals())
