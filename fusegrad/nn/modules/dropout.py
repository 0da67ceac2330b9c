"""``Dropout``, its channel-wise forms ``Dropout1d/2d/3d``, and ``AlphaDropout``,
``FeatureAlphaDropout`` for SELU networks."""

from __future__ import annotations

from fusegrad.nn import functional as NF
from fusegrad.nn.modules.module import Module
from fusegrad.tensor import Tensor

__all__ = ["Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
           "FeatureAlphaDropout"]


class _DropoutNd(Module):
    """``p`` and ``inplace``, checked and printed as torch does."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Dropout(_DropoutNd):
    """Zero elements with probability ``p`` in training mode (scaling the rest by
    ``1 / (1 - p)``); the identity in eval mode."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.dropout(input, self.p, self.training, self.inplace)


class Dropout1d(_DropoutNd):
    """Zero whole channels of (N, C, L) or (C, L) in training mode."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.dropout1d(input, self.p, self.training, self.inplace)


class Dropout2d(_DropoutNd):
    """Zero whole channels of (N, C, H, W) in training mode."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.dropout2d(input, self.p, self.training, self.inplace)


class Dropout3d(_DropoutNd):
    """Zero whole channels of (N, C, D, H, W) or (C, D, H, W) in training mode."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.dropout3d(input, self.p, self.training, self.inplace)


class AlphaDropout(_DropoutNd):
    """Dropout that keeps a SELU network's mean and variance (training mode only)."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.alpha_dropout(input, self.p, self.training)


class FeatureAlphaDropout(_DropoutNd):
    """:class:`AlphaDropout` of whole channels (dim 1)."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.feature_alpha_dropout(input, self.p, self.training)
