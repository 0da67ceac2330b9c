"""Padding modules over ``F.pad``: ``ZeroPad``, ``ConstantPad``, ``ReflectionPad``,
``ReplicationPad`` and ``CircularPad``, each in 1d, 2d and 3d."""

from __future__ import annotations

from collections.abc import Iterable

from fusegrad.nn import functional as NF
from fusegrad.nn.modules.module import Module
from fusegrad.tensor import Tensor

__all__ = ["CircularPad1d", "CircularPad2d", "CircularPad3d", "ConstantPad1d", "ConstantPad2d",
           "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d",
           "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "ZeroPad1d", "ZeroPad2d",
           "ZeroPad3d"]


def _pad_widths(padding, n: int) -> tuple:
    """torch's ``_ntuple``: a sequence is kept as given (``F.pad`` checks it), a number is
    repeated ``n`` times (``n = 2 * dims``: before and after each padded dim)."""
    return tuple(padding) if isinstance(padding, Iterable) else (padding,) * n


class _PadNd(Module):
    """Pads the last ``_nd`` dims by ``padding`` (left, right, top, bottom, front, back)."""

    _nd = 1
    _mode = "constant"

    def __init__(self, padding) -> None:
        super().__init__()
        self.padding = _pad_widths(padding, 2 * self._nd)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.pad(input, self.padding, self._mode)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class _ConstantPadNd(_PadNd):
    def __init__(self, padding, value: float) -> None:
        super().__init__(padding)
        self.value = value

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.pad(input, self.padding, "constant", self.value)

    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


class ConstantPad1d(_ConstantPadNd):
    """Pad the last dim with ``value``: ``padding`` is an int or ``(left, right)``."""

    _nd = 1


class ConstantPad2d(_ConstantPadNd):
    """Pad the last 2 dims with ``value``: ``(left, right, top, bottom)``."""

    _nd = 2


class ConstantPad3d(_ConstantPadNd):
    """Pad the last 3 dims with ``value``: ``(left, right, top, bottom, front, back)``."""

    _nd = 3


class _ZeroPad:
    """A constant pad of zeros, printed as the plain pads are (torch's ZeroPad)."""

    def __init__(self, padding) -> None:
        super().__init__(padding, 0.0)

    extra_repr = _PadNd.extra_repr


class ZeroPad1d(_ZeroPad, ConstantPad1d):
    """Pad the last dim with zeros."""


class ZeroPad2d(_ZeroPad, ConstantPad2d):
    """Pad the last 2 dims with zeros."""


class ZeroPad3d(_ZeroPad, ConstantPad3d):
    """Pad the last 3 dims with zeros."""


class ReflectionPad1d(_PadNd):
    """Pad the last dim with its mirror image, the edge not repeated."""

    _nd, _mode = 1, "reflect"


class ReflectionPad2d(_PadNd):
    """Pad the last 2 dims with their mirror image, the edge not repeated."""

    _nd, _mode = 2, "reflect"


class ReflectionPad3d(_PadNd):
    """Pad the last 3 dims with their mirror image, the edge not repeated."""

    _nd, _mode = 3, "reflect"


class ReplicationPad1d(_PadNd):
    """Pad the last dim by repeating its edge values."""

    _nd, _mode = 1, "replicate"


class ReplicationPad2d(_PadNd):
    """Pad the last 2 dims by repeating their edge values."""

    _nd, _mode = 2, "replicate"


class ReplicationPad3d(_PadNd):
    """Pad the last 3 dims by repeating their edge values."""

    _nd, _mode = 3, "replicate"


class _CircularPadNd(_PadNd):
    _mode = "circular"

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        # torch checks the rank here (unbatched or batched), before F.pad.
        if input.ndim not in (self._nd + 1, self._nd + 2):
            raise ValueError(f"expected {self._nd + 1}D or {self._nd + 2}D input (got "
                             f"{input.ndim}D input)")
        return super().forward(input)


class CircularPad1d(_CircularPadNd):
    """Pad the last dim by wrapping around: the left pad copies the right end."""

    _nd = 1


class CircularPad2d(_CircularPadNd):
    """Pad the last 2 dims by wrapping around."""

    _nd = 2


class CircularPad3d(_CircularPadNd):
    """Pad the last 3 dims by wrapping around."""

    _nd = 3
