"""Convolution, transposed convolution, ``unfold`` and ``fold``, as compositions of primitives.

A convolution is im2col into one batched matmul: the windows of the padded input (strided
slices, :mod:`fusegrad.ops.windows`) become a (N, groups, C/groups * math.prod(kernel), L) matrix
that the weight, reshaped to (groups, O/groups, C/groups * math.prod(kernel)), multiplies. The
compiler turns the window gather into one kernel, runs the product on BLAS and fuses the bias
(and what follows: an activation) into the product's epilogue. A transposed convolution is the
adjoint: the matmul with the transposed weight, then col2im (:func:`windows.overlap_add`).
Gradients come from the primitives' VJPs; in eager mode each call is one autograd node,
``ConvolutionBackward0`` as in torch.
"""

from __future__ import annotations

import math

from fusegrad import dtypes
from fusegrad.ops.composite import composite
from fusegrad.ops.elementwise import add
from fusegrad.ops.matmul import float32_sums, matmul
from fusegrad.ops.movement import pad_axes, reshape_prim, transpose
from fusegrad.ops.operands import cast
from fusegrad.ops.registry import public
from fusegrad.ops.windows import crop_or_pad, ntuple, out_size, overlap_add, windows
from fusegrad.tensor import Tensor

__all__ = [
    "conv1d",
    "conv2d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv3d",
    "conv_transpose3d",
    "unfold",
    "fold",
]


def _check_conv(op: str, x: Tensor, weight: Tensor, nd: int, groups: int, transposed: bool):
    if x.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(f"{op}: Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input to "
                           f"{op}, but got input of size: {list(x.shape)}")
    if weight.ndim != nd + 2:
        raise RuntimeError(f"{op}: weight should have {nd + 2} dimensions, got {list(weight.shape)}")
    if groups < 1:
        raise RuntimeError(f"{op}: non-positive groups is not supported")
    channels = x.shape[-nd - 1]
    if transposed:
        if channels != weight.shape[0]:
            raise RuntimeError(f"{op}: Given transposed=1, weight of size {list(weight.shape)}, "
                               f"expected input{list(x.shape)} to have {weight.shape[0]} channels, "
                               f"but got {channels} channels instead")
        if weight.shape[0] % groups:
            raise RuntimeError(f"{op}: in_channels must be divisible by groups")
    else:
        if channels != weight.shape[1] * groups:
            raise RuntimeError(f"{op}: Given groups={groups}, weight of size {list(weight.shape)}, "
                               f"expected input{list(x.shape)} to have {weight.shape[1] * groups} "
                               f"channels, but got {channels} channels instead")
        if weight.shape[0] % groups:
            raise RuntimeError(f"{op}: out_channels must be divisible by groups")
    if x.dtype is not weight.dtype:
        raise RuntimeError(f"{op}: Input type ({x.dtype}) and weight type ({weight.dtype}) should "
                           "be the same")


def _batched(fn, x: Tensor, nd: int, *args):
    """Run ``fn`` on a batched input; an unbatched one gets a batch of 1 and loses it again."""
    if x.ndim == nd + 2:
        return fn(x, *args)
    out = fn(reshape_prim(x, (1,) + tuple(x.shape)), *args)
    return reshape_prim(out, tuple(out.shape[1:]))


def _padding_pairs(op: str, padding, kernel, dilation, stride, nd) -> list[tuple[int, int]]:
    if isinstance(padding, str):
        if padding == "valid":
            return [(0, 0)] * nd
        if padding == "same":
            if any(s != 1 for s in stride):
                raise RuntimeError(f"{op}: padding='same' is not supported for strided convolutions")
            # torch puts the odd element of the total padding on the right
            totals = [d * (k - 1) for d, k in zip(dilation, kernel)]
            return [(t // 2, t - t // 2) for t in totals]
        raise RuntimeError(f"{op}: Invalid padding string '{padding}'")
    return [(p, p) for p in ntuple(padding, nd, op, "padding")]


@composite("ConvolutionBackward0", kernel=True)
def _conv(x: Tensor, weight: Tensor, bias, stride, pads, dilation, groups) -> Tensor:
    nd = weight.ndim - 2
    n, c = x.shape[:2]
    kernel = tuple(weight.shape[2:])
    out = tuple(out_size(x.shape[2 + a], kernel[a], stride[a], *pads[a], dilation[a])
                for a in range(nd))
    if any(o <= 0 for o in out):
        raise RuntimeError(f"Calculated output size: {list(out)} is too small for input "
                           f"{list(x.shape)} and kernel {list(kernel)}")
    xp = pad_axes(x, [(0, 0), (0, 0)] + list(pads))
    cols = windows(xp, kernel, stride, dilation, out)          # (N, C, KK, *out)
    cols = reshape_prim(cols, (n, groups, c // groups * math.prod(kernel), math.prod(out)))
    o = weight.shape[0]
    w = reshape_prim(weight, (groups, o // groups, c // groups * math.prod(kernel)))
    if bias is not None and x.dtype in (dtypes.bfloat16, dtypes.float16):
        # torch's 16-bit convolution adds the bias to the float32 sums and rounds once.
        row = cast(reshape_prim(bias, (groups, o // groups, 1)), dtypes.float32)
        y = add(float32_sums(w, cols, activation=1), row)
        return reshape_prim(cast(y, x.dtype), (n, o) + out)
    y = matmul(w, cols)                                        # (N, groups, O/groups, L)
    if bias is not None:
        y = add(y, reshape_prim(bias, (groups, o // groups, 1)))
    return reshape_prim(y, (n, o) + out)


def _conv_nd(op: str, nd: int, x, weight, bias, stride, padding, dilation, groups) -> Tensor:
    _check_conv(op, x, weight, nd, groups, transposed=False)
    stride = ntuple(stride, nd, op, "stride")
    dilation = ntuple(dilation, nd, op, "dilation")
    pads = tuple(_padding_pairs(op, padding, weight.shape[2:], dilation, stride, nd))
    return _batched(lambda b: _conv(b, weight, bias, stride, pads, dilation, groups), x, nd)


@public(torch=True)
def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1,  # noqa: A002
           padding=0, dilation=1, groups: int = 1) -> Tensor:
    """1-D convolution (cross-correlation) of ``input`` (N, C, L) with ``weight`` (O, C/groups, K).

    ``padding`` is an int, a 1-tuple, ``'valid'`` or ``'same'`` (stride 1 only).
    """
    return _conv_nd("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


@public(torch=True)
def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1,  # noqa: A002
           padding=0, dilation=1, groups: int = 1) -> Tensor:
    """2-D convolution of ``input`` (N, C, H, W) with ``weight`` (O, C/groups, KH, KW).

    >>> y = conv2d(x, w, b, stride=1, padding=1)   # same spatial size for a 3x3 kernel
    """
    return _conv_nd("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


@composite("ConvolutionBackward0")
def _conv_transpose(x: Tensor, weight: Tensor, bias, stride, padding, output_padding, dilation,
                    groups) -> Tensor:
    nd = weight.ndim - 2
    n, c = x.shape[:2]
    kernel = tuple(weight.shape[2:])
    og = weight.shape[1]
    spatial = tuple(x.shape[2:])
    # the product of the transposed weight with the input gives every output block at once
    w = reshape_prim(weight, (groups, c // groups, og * math.prod(kernel)))
    xs = reshape_prim(x, (n, groups, c // groups, math.prod(spatial)))
    blocks = matmul(transpose(w, 1, 2), xs)                      # (N, groups, Og*KK, L)
    blocks = reshape_prim(blocks, (n, groups * og, math.prod(kernel)) + spatial)
    full = tuple(stride[a] * (spatial[a] - 1) + dilation[a] * (kernel[a] - 1) + 1
                 for a in range(nd))
    y = overlap_add(blocks, full, kernel, stride, dilation)
    y = crop_or_pad(y, [(-padding[a], output_padding[a] - padding[a]) for a in range(nd)])
    if bias is not None:
        y = add(y, reshape_prim(bias, (1, groups * og) + (1,) * nd))
    return y


def _conv_transpose_nd(op, nd, x, weight, bias, stride, padding, output_padding, groups,
                       dilation) -> Tensor:
    _check_conv(op, x, weight, nd, groups, transposed=True)
    stride = ntuple(stride, nd, op, "stride")
    padding = ntuple(padding, nd, op, "padding")
    output_padding = ntuple(output_padding, nd, op, "output_padding")
    dilation = ntuple(dilation, nd, op, "dilation")
    for a in range(nd):
        if output_padding[a] >= max(stride[a], dilation[a]):
            raise RuntimeError(f"{op}: output padding must be smaller than either stride or "
                               f"dilation, but got output_padding={list(output_padding)}, "
                               f"stride={list(stride)}, dilation={list(dilation)}")
    return _batched(lambda b: _conv_transpose(b, weight, bias, stride, padding, output_padding,
                                              dilation, groups), x, nd)


@public(torch=True)
def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None,  # noqa: A002
                     stride=1, padding=0, output_padding=0, groups: int = 1,
                     dilation=1) -> Tensor:
    """Transposed 1-D convolution; ``weight`` is (C, O/groups, K), as torch's."""
    return _conv_transpose_nd("conv_transpose1d", 1, input, weight, bias, stride, padding,
                              output_padding, groups, dilation)


@public(torch=True)
def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None,  # noqa: A002
                     stride=1, padding=0, output_padding=0, groups: int = 1,
                     dilation=1) -> Tensor:
    """Transposed 2-D convolution (the gradient of conv2d with respect to its input);
    ``weight`` is (C, O/groups, KH, KW)."""
    return _conv_transpose_nd("conv_transpose2d", 2, input, weight, bias, stride, padding,
                              output_padding, groups, dilation)


@public(torch=True)
def conv3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1,  # noqa: A002
           padding=0, dilation=1, groups: int = 1) -> Tensor:
    """3-D convolution of ``input`` (N, C, D, H, W) with ``weight`` (O, C/groups, KD, KH, KW)."""
    return _conv_nd("conv3d", 3, input, weight, bias, stride, padding, dilation, groups)


@public(torch=True)
def conv_transpose3d(input: Tensor, weight: Tensor, bias: Tensor | None = None,  # noqa: A002
                     stride=1, padding=0, output_padding=0, groups: int = 1,
                     dilation=1) -> Tensor:
    """Transposed 3-D convolution; ``weight`` is (C, O/groups, KD, KH, KW)."""
    return _conv_transpose_nd("conv_transpose3d", 3, input, weight, bias, stride, padding,
                              output_padding, groups, dilation)


@composite("Im2ColBackward0")
def _unfold(x: Tensor, kernel, dilation, padding, stride) -> Tensor:
    n, c = x.shape[:2]
    pads = [(p, p) for p in padding]
    out = tuple(out_size(x.shape[2 + a], kernel[a], stride[a], *pads[a], dilation[a])
                for a in range(2))
    if any(o <= 0 for o in out):
        raise RuntimeError(f"unfold: the sliding blocks of size {list(kernel)} do not fit the "
                           f"input of size {list(x.shape)} (padding {list(padding)})")
    cols = windows(pad_axes(x, [(0, 0), (0, 0)] + pads), kernel, stride, dilation, out)
    return reshape_prim(cols, (n, c * math.prod(kernel), math.prod(out)))


def unfold(input: Tensor, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:  # noqa: A002
    """Sliding local blocks (im2col): (N, C, H, W) -> (N, C * KH * KW, L)."""
    if input.ndim not in (3, 4):
        raise RuntimeError(f"Input Error: Only 3D or 4D input Tensors are supported (got "
                           f"{input.ndim}D)")
    args = [ntuple(v, 2, "unfold", name) for v, name in
            ((kernel_size, "kernel_size"), (dilation, "dilation"), (padding, "padding"),
             (stride, "stride"))]
    return _batched(lambda b: _unfold(b, *args), input, 2)


@composite("Col2ImBackward0")
def _fold(x: Tensor, output_size, kernel, dilation, padding, stride) -> Tensor:
    n = x.shape[0]
    kk = math.prod(kernel)
    pads = [(p, p) for p in padding]
    out = tuple(out_size(output_size[a], kernel[a], stride[a], *pads[a], dilation[a])
                for a in range(2))
    if x.shape[1] % kk or math.prod(out) != x.shape[2]:
        raise RuntimeError(f"fold: expected an input of size (N, C * {kk}, {math.prod(out)}) for "
                           f"output_size={list(output_size)}, got {list(x.shape)}")
    blocks = reshape_prim(x, (n, x.shape[1] // kk, kk) + out)
    padded = tuple(output_size[a] + 2 * padding[a] for a in range(2))
    y = overlap_add(blocks, padded, kernel, stride, dilation)
    return crop_or_pad(y, [(-p, -p) for p in padding])


def fold(input: Tensor, output_size, kernel_size, dilation=1, padding=0,  # noqa: A002
         stride=1) -> Tensor:
    """Sum sliding blocks back into an image (col2im): (N, C * KH * KW, L) -> (N, C, H, W)."""
    if input.ndim not in (2, 3):
        raise RuntimeError(f"Input Error: Only unbatched (2D) or batched (3D) input Tensors are "
                           f"supported (got {input.ndim}D)")
    args = [ntuple(v, 2, "fold", name) for v, name in
            ((output_size, "output_size"), (kernel_size, "kernel_size"), (dilation, "dilation"),
             (padding, "padding"), (stride, "stride"))]
    return _batched(lambda b: _fold(b, *args), input, 1)
