"""``PairwiseDistance`` and ``CosineSimilarity``."""

from __future__ import annotations

from fusegrad.nn import functional as NF
from fusegrad.nn.modules.module import Module
from fusegrad.tensor import Tensor

__all__ = ["PairwiseDistance", "CosineSimilarity"]


class PairwiseDistance(Module):
    """``||x1 - x2 + eps||_p`` over the last dim; see ``F.pairwise_distance``."""

    def __init__(self, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> None:
        super().__init__()
        self.norm = p   # torch's attribute name
        self.eps = eps
        self.keepdim = keepdim

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        return NF.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)


class CosineSimilarity(Module):
    """Cosine of the angle between ``x1`` and ``x2`` along ``dim``; see
    ``F.cosine_similarity``."""

    def __init__(self, dim: int = 1, eps: float = 1e-8) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        return NF.cosine_similarity(x1, x2, self.dim, self.eps)
