"""``PixelShuffle`` and ``PixelUnshuffle``: channels to space and back."""

from __future__ import annotations

from fusegrad.nn import functional as NF
from fusegrad.nn.modules.module import Module
from fusegrad.tensor import Tensor

__all__ = ["PixelShuffle", "PixelUnshuffle"]


class PixelShuffle(Module):
    """(*, C * r * r, H, W) to (*, C, H * r, W * r); see ``F.pixel_shuffle``."""

    def __init__(self, upscale_factor: int) -> None:
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.pixel_shuffle(input, self.upscale_factor)

    def extra_repr(self) -> str:
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """(*, C, H * r, W * r) to (*, C * r * r, H, W); see ``F.pixel_unshuffle``."""

    def __init__(self, downscale_factor: int) -> None:
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.pixel_unshuffle(input, self.downscale_factor)

    def extra_repr(self) -> str:
        return f"downscale_factor={self.downscale_factor}"
