"""Loss modules over :mod:`fusegrad.nn.loss_functions`: ``SmoothL1Loss``, ``HuberLoss``,
``KLDivLoss``, ``CosineEmbeddingLoss``."""

from __future__ import annotations

from fusegrad.nn import functional as NF
from fusegrad.nn.modules.loss import _Loss
from fusegrad.tensor import Tensor

__all__ = ["SmoothL1Loss", "HuberLoss", "KLDivLoss", "CosineEmbeddingLoss"]


class SmoothL1Loss(_Loss):
    """Squared error below ``beta``, absolute error above; see ``F.smooth_l1_loss``."""

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean",
                 beta: float = 1.0) -> None:
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return NF.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """Squared error below ``delta``, ``delta`` times absolute error above; see
    ``F.huber_loss``."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return NF.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class KLDivLoss(_Loss):
    """KL divergence of log-probabilities ``input`` from ``target``; see ``F.kl_div``."""

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean",
                 log_target: bool = False) -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return NF.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


class CosineEmbeddingLoss(_Loss):
    """Pull pairs together (target 1) or push them below ``margin`` (target -1) in cosine;
    see ``F.cosine_embedding_loss``."""

    def __init__(self, margin: float = 0.0, size_average=None, reduce=None,
                 reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input1: Tensor, input2: Tensor, target: Tensor) -> Tensor:
        return NF.cosine_embedding_loss(input1, input2, target, margin=self.margin,
                                        reduction=self.reduction)
