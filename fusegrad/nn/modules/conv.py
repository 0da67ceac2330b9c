"""``Conv1d/2d/3d``, ``ConvTranspose1d/2d/3d``, ``Unfold``, ``Fold``."""

from __future__ import annotations

import math

from fusegrad.nn import functional as NF
from fusegrad.nn import init
from fusegrad.nn.modules.module import Module
from fusegrad.nn.parameter import Parameter
from fusegrad.ops.creation import empty
from fusegrad.ops.windows import ntuple
from fusegrad.tensor import Tensor

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
           "Unfold", "Fold"]


class _ConvNd(Module):
    """Weights and torch's initialization shared by the convolutions: ``kaiming_uniform_`` with
    ``a=sqrt(5)`` for the weight and U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias."""

    _nd = 2
    _transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device=None, dtype=None, output_padding=0) -> None:
        super().__init__()
        nd, name = self._nd, type(self).__name__
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode not in ("zeros", "reflect", "replicate", "circular"):
            raise ValueError(f"padding_mode must be one of ['zeros', 'reflect', 'replicate', "
                             f"'circular'], but got padding_mode='{padding_mode}'")
        if padding_mode != "zeros" and self._transposed:
            raise ValueError(f'Only "zeros" padding mode is supported for {name}')
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Invalid padding string {padding!r}, should be one of "
                                 "{'valid', 'same'}")
            if padding == "same" and any(s != 1 for s in ntuple(stride, nd, name, "stride")):
                raise ValueError("padding='same' is not supported for strided convolutions")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = ntuple(kernel_size, nd, name, "kernel_size")
        self.stride = ntuple(stride, nd, name, "stride")
        self.padding = padding if isinstance(padding, str) else ntuple(padding, nd, name, "padding")
        self.dilation = ntuple(dilation, nd, name, "dilation")
        self.output_padding = ntuple(output_padding, nd, name, "output_padding")
        self.groups = groups
        self.padding_mode = padding_mode
        self.transposed = self._transposed
        # F.pad's (last dim first) widths for the non-zeros padding modes
        if isinstance(self.padding, str):
            totals = [d * (k - 1) for d, k in zip(self.dilation, self.kernel_size)] \
                if self.padding == "same" else [0] * nd
            pairs = [(t // 2, t - t // 2) for t in totals]
        else:
            pairs = [(p, p) for p in self.padding]
        self._reversed_padding_repeated_twice = tuple(v for lo, hi in reversed(pairs)
                                                      for v in (lo, hi))
        shape = ((in_channels, out_channels // groups) if self._transposed
                 else (out_channels, in_channels // groups)) + self.kernel_size
        self.weight = Parameter(empty(shape, dtype=dtype, device=device))
        if bias:
            self.bias = Parameter(empty(out_channels, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw fresh weights with torch's default initialization."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def _padded(self, input: Tensor):  # noqa: A002
        """(input, padding) for the functional conv: the padding modes other than zeros pad
        the input first and convolve without padding."""
        if self.padding_mode == "zeros":
            return input, self.padding
        return NF.pad(input, self._reversed_padding_repeated_twice, self.padding_mode), 0

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0,) * self._nd:
            s += f", padding={self.padding}"     # torch: padding=same, unquoted
        if self.dilation != (1,) * self._nd:
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * self._nd:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class _Conv(_ConvNd):
    """A convolution module: torch's constructor (no ``output_padding``) and forward."""

    _function = None            # NF.conv1d, conv2d or conv3d

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device=None, dtype=None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        x, padding = self._padded(input)
        return type(self)._function(x, self.weight, self.bias, self.stride, padding,
                                    self.dilation, self.groups)


class Conv1d(_Conv):
    """1-D convolution over (N, C, L); ``weight`` is (out, in/groups, k)."""

    _nd = 1
    _function = staticmethod(NF.conv1d)


class Conv2d(_Conv):
    """2-D convolution over (N, C, H, W); ``weight`` is (out, in/groups, kh, kw).

    >>> conv = Conv2d(1, 6, 3, padding=1)     # (N, 1, 8, 8) -> (N, 6, 8, 8)
    """

    _nd = 2
    _function = staticmethod(NF.conv2d)


class Conv3d(_Conv):
    """3-D convolution over (N, C, D, H, W); ``weight`` is (out, in/groups, kd, kh, kw)."""

    _nd = 3
    _function = staticmethod(NF.conv3d)


class _ConvTransposeNd(_ConvNd):
    _transposed = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1,
                 padding_mode: str = "zeros", device=None, dtype=None) -> None:
        if isinstance(padding, str):
            raise ValueError(f"{type(self).__name__}: padding must be an int or a tuple")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype, output_padding)

    _function = None            # NF.conv_transpose1d, 2d or 3d

    def forward(self, input: Tensor, output_size=None) -> Tensor:  # noqa: A002
        return type(self)._function(input, self.weight, self.bias, self.stride, self.padding,
                                    self._output_padding(input, output_size), self.groups,
                                    self.dilation)

    def _output_padding(self, input: Tensor, output_size) -> tuple[int, ...]:  # noqa: A002
        """torch's output_size argument: the output padding that reaches that size."""
        if output_size is None:
            return self.output_padding
        nd = self._nd
        output_size = tuple(output_size)[-nd:]
        pads = []
        for a in range(nd):
            smallest = ((input.shape[-nd + a] - 1) * self.stride[a] - 2 * self.padding[a]
                        + self.dilation[a] * (self.kernel_size[a] - 1) + 1)
            extra = output_size[a] - smallest
            if not 0 <= extra < max(self.stride[a], self.dilation[a]):
                raise ValueError(f"requested an output size of {list(output_size)}, but valid "
                                 f"sizes are from {smallest} to "
                                 f"{smallest + max(self.stride[a], self.dilation[a]) - 1}")
            pads.append(extra)
        return tuple(pads)


class ConvTranspose1d(_ConvTransposeNd):
    """Transposed 1-D convolution; ``weight`` is (in, out/groups, k)."""

    _nd = 1
    _function = staticmethod(NF.conv_transpose1d)


class ConvTranspose2d(_ConvTransposeNd):
    """Transposed 2-D convolution; ``weight`` is (in, out/groups, kh, kw)."""

    _nd = 2
    _function = staticmethod(NF.conv_transpose2d)


class ConvTranspose3d(_ConvTransposeNd):
    """Transposed 3-D convolution; ``weight`` is (in, out/groups, kd, kh, kw)."""

    _nd = 3
    _function = staticmethod(NF.conv_transpose3d)


class Unfold(Module):
    """Sliding blocks (im2col) of (N, C, H, W) as (N, C*kh*kw, L); see ``F.unfold``."""

    def __init__(self, kernel_size, dilation=1, padding=0, stride=1) -> None:
        super().__init__()
        self.kernel_size, self.dilation = kernel_size, dilation
        self.padding, self.stride = padding, stride

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.unfold(input, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, dilation={self.dilation}, "
                f"padding={self.padding}, stride={self.stride}")


class Fold(Module):
    """Sum sliding blocks back into an image (col2im); see ``F.fold``."""

    def __init__(self, output_size, kernel_size, dilation=1, padding=0, stride=1) -> None:
        super().__init__()
        self.output_size, self.kernel_size = output_size, kernel_size
        self.dilation, self.padding, self.stride = dilation, padding, stride

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return NF.fold(input, self.output_size, self.kernel_size, self.dilation, self.padding,
                       self.stride)

    def extra_repr(self) -> str:
        return (f"output_size={self.output_size}, kernel_size={self.kernel_size}, "
                f"dilation={self.dilation}, padding={self.padding}, stride={self.stride}")
