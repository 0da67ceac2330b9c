"""Pooling modules: ``MaxPool1d/2d``, ``AvgPool1d/2d``, ``AdaptiveAvgPool1d/2d``,
``AdaptiveMaxPool1d/2d``."""

from __future__ import annotations

from fusegrad.nn import functional as NF
from fusegrad.nn.modules.module import Module
from fusegrad.tensor import Tensor

__all__ = ["MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d",
           "AdaptiveAvgPool2d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveAvgPool3d",
           "AdaptiveMaxPool3d", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d"]


class _MaxPoolNd(Module):
    _fn = None

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 return_indices: bool = False, ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, input: Tensor):  # noqa: A002
        return type(self)._fn(input, self.kernel_size, self.stride, self.padding, self.dilation,
                              ceil_mode=self.ceil_mode, return_indices=self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class MaxPool1d(_MaxPoolNd):
    """Max over sliding windows of (N, C, L); see ``F.max_pool1d``."""

    _fn = staticmethod(NF.max_pool1d)


class MaxPool2d(_MaxPoolNd):
    """Max over sliding windows of (N, C, H, W); see ``F.max_pool2d``."""

    _fn = staticmethod(NF.max_pool2d)


class MaxPool3d(_MaxPoolNd):
    """Max over sliding windows of (N, C, D, H, W); see ``F.max_pool3d``."""

    _fn = staticmethod(NF.max_pool3d)


class _AvgPoolNd(Module):
    """The state and repr the AvgPool modules share; ``_fn`` is the functional op (1-d has no
    ``divisor_override``, as in torch)."""

    _fn = None

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.ceil_mode = padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return type(self)._fn(input, self.kernel_size, self.stride, self.padding,
                              self.ceil_mode, self.count_include_pad, self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool1d(_AvgPoolNd):
    """Mean over sliding windows of (N, C, L); see ``F.avg_pool1d``."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True) -> None:
        # torch keeps AvgPool1d's sizes as 1-tuples (its repr prints kernel_size=(3,))
        def single(v):
            return tuple(v) if isinstance(v, (tuple, list)) else (v,)
        super().__init__(single(kernel_size), single(kernel_size if stride is None else stride),
                         single(padding), ceil_mode, count_include_pad)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.avg_pool1d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                             self.count_include_pad)


class AvgPool2d(_AvgPoolNd):
    """Mean over sliding windows of (N, C, H, W); see ``F.avg_pool2d``."""

    _fn = staticmethod(NF.avg_pool2d)


class AvgPool3d(_AvgPoolNd):
    """Mean over sliding windows of (N, C, D, H, W); see ``F.avg_pool3d``."""

    _fn = staticmethod(NF.avg_pool3d)


class _AdaptivePool(Module):
    _fn = None

    def __init__(self, output_size) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, input: Tensor):  # noqa: A002
        return type(self)._fn(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_AdaptivePool):
    """Mean over ``output_size`` windows tiling (N, C, L)."""

    _fn = staticmethod(NF.adaptive_avg_pool1d)


class AdaptiveAvgPool2d(_AdaptivePool):
    """Mean over an ``output_size`` grid of windows tiling (N, C, H, W)."""

    _fn = staticmethod(NF.adaptive_avg_pool2d)


class _AdaptiveMaxPool(_AdaptivePool):
    def __init__(self, output_size, return_indices: bool = False) -> None:
        super().__init__(output_size)
        self.return_indices = return_indices

    def forward(self, input: Tensor):  # noqa: A002
        return type(self)._fn(input, self.output_size, self.return_indices)


class AdaptiveMaxPool1d(_AdaptiveMaxPool):
    """Max over ``output_size`` windows tiling (N, C, L)."""

    _fn = staticmethod(NF.adaptive_max_pool1d)


class AdaptiveMaxPool2d(_AdaptiveMaxPool):
    """Max over an ``output_size`` grid of windows tiling (N, C, H, W)."""

    _fn = staticmethod(NF.adaptive_max_pool2d)


class AdaptiveAvgPool3d(_AdaptivePool):
    """Mean over an ``output_size`` grid of windows of (N, C, D, H, W)."""

    _fn = staticmethod(NF.adaptive_avg_pool3d)


class AdaptiveMaxPool3d(_AdaptiveMaxPool):
    """Max over an ``output_size`` grid of windows of (N, C, D, H, W)."""

    _fn = staticmethod(NF.adaptive_max_pool3d)


class _MaxUnpoolNd(Module):
    _fn = None

    def __init__(self, kernel_size, stride=None, padding=0) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding

    def forward(self, input: Tensor, indices: Tensor, output_size=None) -> Tensor:  # noqa: A002
        return type(self)._fn(input, indices, self.kernel_size, self.stride, self.padding,
                              output_size)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxUnpool1d(_MaxUnpoolNd):
    """The inverse of ``MaxPool1d(return_indices=True)``; see ``F.max_unpool1d``."""

    _fn = staticmethod(NF.max_unpool1d)


class MaxUnpool2d(_MaxUnpoolNd):
    """The inverse of ``MaxPool2d(return_indices=True)``; see ``F.max_unpool2d``."""

    _fn = staticmethod(NF.max_unpool2d)


class MaxUnpool3d(_MaxUnpoolNd):
    """The inverse of ``MaxPool3d(return_indices=True)``; see ``F.max_unpool3d``."""

    _fn = staticmethod(NF.max_unpool3d)
