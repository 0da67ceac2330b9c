"""Sliding windows over the spatial dims of an ``(N, C, *spatial)`` tensor, as primitives.

Convolution, pooling, ``unfold`` and ``fold`` are built on two movements: gathering the
windows (one strided slice of the padded input per kernel offset, stacked on a new axis:
im2col), and its adjoint, placing blocks back at strided offsets and summing (col2im). Both
are compositions of ``pad``, ``slice``, ``reshape`` and ``concat``, so they trace, differentiate
and compile like any view, and the compiler folds them into index arithmetic.
"""

from __future__ import annotations

import itertools
from typing import Sequence

from fusegrad.ops.elementwise import add
from fusegrad.ops.movement import narrow, pad_axes, reshape_prim, slice_axes, stack, unsqueeze
from fusegrad.tensor import Tensor

__all__ = ["ntuple", "out_size", "windows", "overlap_add", "crop_or_pad"]


def ntuple(value, n: int, op: str, name: str) -> tuple[int, ...]:
    """``value`` as ``n`` ints: one int is repeated, a sequence must have ``n`` (or 1) items."""
    if isinstance(value, (int,)) and not isinstance(value, bool):
        return (int(value),) * n
    values = tuple(int(v) for v in value)
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise RuntimeError(f"{op}: expected {name} to be a single integer value or a list of {n} "
                           f"values to match the convolution dimensions, but got {name}={list(values)}")
    return values


def out_size(length: int, kernel: int, stride: int, pad_lo: int, pad_hi: int, dilation: int,
             ceil_mode: bool = False) -> int:
    """Output length of a sliding window, torch's formula (with pooling's ceil_mode rule: the
    last window must start inside the input or the left padding)."""
    span = length + pad_lo + pad_hi - dilation * (kernel - 1) - 1
    if ceil_mode:
        n = -(-span // stride) + 1
        if (n - 1) * stride >= length + pad_lo:
            n -= 1
        return n
    return span // stride + 1


def windows(xp: Tensor, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
            out: Sequence[int]) -> Tensor:
    """The windows of an already padded ``xp`` (N, C, *S): shape (N, C, prod(kernel), *out).

    Axis 2 runs over the kernel offsets in row-major order, matching a weight of shape
    (..., *kernel) reshaped to (..., prod(kernel)).
    """
    lead = tuple(xp.shape[:2])
    views = []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        starts = (0, 0) + tuple(o * d for o, d in zip(offsets, dilation))
        stops = lead + tuple(o * d + s * (n - 1) + 1
                             for o, d, s, n in zip(offsets, dilation, stride, out))
        views.append(slice_axes(xp, starts, stops, (1, 1) + tuple(stride)))
    if len(views) == 1:
        return unsqueeze(views[0], 2)
    return stack(views, 2)


def _spread(v: Tensor, axis: int, step: int) -> Tensor:
    """Insert ``step - 1`` zeros between the elements along ``axis``: length n -> (n-1)*step+1."""
    n = v.shape[axis]
    if step == 1 or n == 0:
        return v
    v = unsqueeze(v, axis + 1)
    widths = [(0, 0)] * v.ndim
    widths[axis + 1] = (0, step - 1)
    v = pad_axes(v, widths)
    shape = tuple(v.shape[:axis]) + (n * step,) + tuple(v.shape[axis + 2:])
    return narrow(reshape_prim(v, shape), axis, 0, (n - 1) * step + 1)


def overlap_add(blocks: Tensor, padded: Sequence[int], kernel: Sequence[int],
                stride: Sequence[int], dilation: Sequence[int]) -> Tensor:
    """The adjoint of :func:`windows`: ``blocks`` (N, C, prod(kernel), *out) summed into an
    (N, C, *padded) tensor, each block at its kernel offset with the windows' stride."""
    nd = len(kernel)
    out = tuple(blocks.shape[3:])
    total = None
    for i, offsets in enumerate(itertools.product(*(range(k) for k in kernel))):
        block = blocks.select(2, i) if blocks.shape[2] > 1 else reshape_prim(
            blocks, tuple(blocks.shape[:2]) + out)
        widths = [(0, 0), (0, 0)]
        for a in range(nd):
            block = _spread(block, 2 + a, stride[a])
            lo = offsets[a] * dilation[a]
            widths.append((lo, padded[a] - lo - block.shape[2 + a]))
        block = pad_axes(block, widths)
        total = block if total is None else add(total, block)
    return total


def crop_or_pad(x: Tensor, widths: Sequence[tuple[int, int]]) -> Tensor:
    """Pad the spatial dims (N, C, *S) by ``widths``; negative widths crop."""
    starts = (0, 0) + tuple(max(-lo, 0) for lo, _ in widths)
    stops = tuple(x.shape[:2]) + tuple(d - max(-hi, 0) for d, (_, hi) in zip(x.shape[2:], widths))
    x = slice_axes(x, starts, stops, (1,) * x.ndim)
    return pad_axes(x, [(0, 0), (0, 0)] + [(max(lo, 0), max(hi, 0)) for lo, hi in widths])

