"""Pooling as reductions over a window axis (:mod:`fusegrad.ops.windows`).

``max_pool`` sums the window through a mask of its first maximum, so that its gradient goes to
the one element torch's gradient goes to, not split among ties as ``amax``'s is (the mask is
elementwise work the compiler fuses); ``return_indices`` maps the argmax over the window axis
to flat positions in each input plane.
``avg_pool`` sums the window and divides by torch's divisor (a constant: it depends on shapes
only). Adaptive average pooling gathers and averages each spatial dim's windows in turn (a
rectangle's mean is the mean of its rows' means); adaptive max pooling gathers each output's
window by a constant index table.
"""

from __future__ import annotations

import itertools
import math
from collections import namedtuple

import numpy as np

from fusegrad import dtypes
from fusegrad.grad_mode import no_grad
from fusegrad.ops import prims as P
from fusegrad.ops.composite import composite, opmath
from fusegrad.ops.elementwise import (
    div,
    eq,
    isnan,
    logical_and,
    logical_not,
    logical_or,
    where,
)
from fusegrad.ops.indexing import gather
from fusegrad.ops.movement import cat, expand, narrow, pad_axes, reshape_prim
from fusegrad.ops.operands import take
from fusegrad.ops.primitive import bind
from fusegrad.ops.reductions import amax, argmax, sum
from fusegrad.ops.registry import public
from fusegrad.ops.windows import eager_cpu, ntuple, out_size, windows
from fusegrad.tensor import Tensor

__all__ = [
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "avg_pool3d",
    "max_pool1d_with_indices",
    "max_pool2d_with_indices",
    "avg_pool1d",
    "avg_pool2d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool3d",
    "max_unpool1d",
    "max_unpool2d",
    "max_unpool3d",
    "PoolWithIndices",
]

PoolWithIndices = namedtuple("PoolWithIndices", ["values", "indices"])


def _batched(fn, x: Tensor, nd: int, op: str):
    """Run ``fn`` on (N, C, *S); an unbatched (C, *S) input gets a batch of 1 and loses it."""
    if x.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(f"{op}: Expected {nd + 1}D or {nd + 2}D input, but got input of size: "
                           f"{list(x.shape)}")
    if x.ndim == nd + 2:
        return fn(x)

    def unbatch(t):
        return reshape_prim(t, tuple(t.shape[1:]))
    out = fn(reshape_prim(x, (1,) + tuple(x.shape)))
    return tuple(unbatch(t) for t in out) if isinstance(out, tuple) else unbatch(out)


def _const(array: np.ndarray, dtype: dtypes.DType) -> Tensor:
    return Tensor._wrap(np.ascontiguousarray(array, dtype=dtype.np_dtype), dtype)


def _pool_geometry(op, x, nd, kernel_size, stride, padding, dilation, ceil_mode):
    kernel = ntuple(kernel_size, nd, op, "kernel_size")
    stride = kernel if stride is None or (not isinstance(stride, int) and len(stride) == 0) \
        else ntuple(stride, nd, op, "stride")
    padding = ntuple(padding, nd, op, "padding")
    dilation = ntuple(dilation, nd, op, "dilation")
    for a in range(nd):
        if padding[a] * 2 > kernel[a]:
            raise RuntimeError(f"{op}: pad should be at most half of effective kernel size, but "
                               f"got pad={padding[a]}, kernel_size={kernel[a]}")
        if stride[a] <= 0 or kernel[a] <= 0 or dilation[a] <= 0:
            raise RuntimeError(f"{op}: kernel_size, stride and dilation must be greater than zero")
    spatial = tuple(x.shape[-nd:])
    out = tuple(out_size(spatial[a], kernel[a], stride[a], padding[a], padding[a], dilation[a],
                         ceil_mode) for a in range(nd))
    if any(o <= 0 for o in out):
        raise RuntimeError(f"{op}: Given input size: {list(x.shape)}. Calculated output size: "
                           f"{list(out)}. Output size is too small")
    # ceil_mode windows may hang past the padded input: pad on the right for them
    pads = [(padding[a], max(0, (out[a] - 1) * stride[a] + dilation[a] * (kernel[a] - 1) + 1
                             - spatial[a] - padding[a])) for a in range(nd)]
    return kernel, stride, padding, dilation, spatial, out, pads


def _offset_positions(kernel, stride, padding, dilation, out):
    """Per kernel offset, the input position along each spatial axis of each output position
    (arrays of shape ``out``), counted from the unpadded input's start."""
    grids = np.meshgrid(*[np.arange(o) for o in out], indexing="ij")
    for offsets in itertools.product(*(range(k) for k in kernel)):
        yield [grids[a] * stride[a] - padding[a] + offsets[a] * dilation[a]
               for a in range(len(kernel))]


def _window_positions(spatial, kernel, stride, padding, dilation, out) -> np.ndarray:
    """Flat input position of each (kernel offset, output position): (math.prod(kernel), *out)."""
    table = np.zeros((math.prod(kernel),) + tuple(out), dtype=np.int64)
    for i, positions in enumerate(_offset_positions(kernel, stride, padding, dilation, out)):
        flat = np.zeros(tuple(out), dtype=np.int64)
        for pos, size in zip(positions, spatial):
            flat = flat * size + pos
        table[i] = flat
    return table


def _window_inside(spatial, kernel, stride, dilation, out, pads) -> np.ndarray | None:
    """Which (kernel offset, output position) of the padded windows lie in the input, shaped
    (1, 1, math.prod(kernel), *out); None where the windows have no padding."""
    if not any(lo or hi for lo, hi in pads):
        return None
    inside = np.ones((math.prod(kernel),) + tuple(out), dtype=bool)
    before = [lo for lo, _ in pads]
    for i, positions in enumerate(_offset_positions(kernel, stride, before, dilation, out)):
        for pos, size in zip(positions, spatial):
            inside[i] &= (pos >= 0) & (pos < size)
    return inside.reshape((1, 1) + inside.shape)


def _padded_windows(b: Tensor, kernel, stride, dilation, out, pads) -> Tensor:
    """The windows (N, C, prod(kernel), *out) of ``b`` padded with its dtype's lowest value."""
    lowest = -math.inf if b.dtype.is_floating_point else int(np.iinfo(b.dtype.np_dtype).min)
    return windows(pad_axes(b, [(0, 0), (0, 0)] + list(pads), lowest), kernel, stride, dilation,
                   out)


def _first_max_index(cols: Tensor, inside: np.ndarray | None) -> Tensor:
    """The window offset of each window's first maximum (keepdim): the first NaN, else the
    first of the largest in the input. A padding position never wins, as torch's kernels only
    read the input: a window of -inf values picks its first element in the input."""
    if inside is None:
        return argmax(cols, 2, keepdim=True)   # numpy's: the first NaN, else the first largest
    return argmax(_max_hits(cols, inside), 2, keepdim=True)


def _max_hits(cols: Tensor, inside: np.ndarray | None) -> Tensor:
    """Where each window holds its maximum (a NaN is the maximum of its window: NaN != NaN,
    so it is marked by isnan), padding excluded (``inside``, see :func:`_window_inside`)."""
    hit = logical_or(eq(cols, amax(cols, 2, keepdim=True)), isnan(cols))
    return hit if inside is None else logical_and(hit, _const(inside, dtypes.bool_))


def _max_windows(b: Tensor, kernel, stride, dilation, out, pads):
    """(windows, offset of the first maximum in each window, keepdim) of ``b``."""
    cols = _padded_windows(b, kernel, stride, dilation, out, pads)
    inside = _window_inside(tuple(b.shape[2:]), kernel, stride, dilation, out, pads)
    return cols, _first_max_index(cols, inside)


def _first_max(cols: Tensor, inside: np.ndarray | None) -> Tensor:
    """The window maxima (N, C, *out), differentiable into the first maximum of each window
    only, as torch's max pooling: a mask of the first element equal to the maximum, built
    with elementwise ops over the (few) window positions, so compiled code fuses it (argmax
    and gather would run as numpy steps). Eager CPU code makes the same mask from argmax,
    three ops where the elementwise mask takes three per window position. ``inside`` (see
    :func:`_window_inside`) keeps padding from being a window's first maximum."""
    if eager_cpu(cols):
        first = _first_max_index(cols.detach(), inside)
        offsets = _const(np.arange(cols.shape[2]).reshape((1, 1, -1) + (1,) * (cols.ndim - 3)),
                         dtypes.int64)
        return sum(where(eq(first, offsets), cols, 0), 2).to(cols.dtype)
    hit = _max_hits(cols.detach(), inside)
    seen, masks = None, []
    for k in range(cols.shape[2]):
        e = narrow(hit, 2, k, 1)
        masks.append(e if seen is None else logical_and(e, logical_not(seen)))
        seen = e if seen is None else logical_or(seen, e)
    mask = cat(masks, 2) if len(masks) > 1 else masks[0]
    return sum(where(mask, cols, 0), 2).to(cols.dtype)


def _max_pool_values(b: Tensor, kernel, stride, dilation, out, pads) -> Tensor:
    inside = _window_inside(tuple(b.shape[2:]), kernel, stride, dilation, out, pads)
    return _first_max(_padded_windows(b, kernel, stride, dilation, out, pads), inside)


# One composite per dimensionality (torch names each node after it); module-level, with the
# geometry as static arguments, so that eager calls run as cached kernels.
_MAX_POOL = {nd: composite(f"MaxPool{nd}DWithIndicesBackward0", kernel=True)(_max_pool_values)
             for nd in (1, 2, 3)}


def _max_pool(op: str, nd: int, x: Tensor, kernel_size, stride, padding,
              dilation, ceil_mode: bool, return_indices: bool):
    geometry = _pool_geometry(op, x, nd, kernel_size, stride, padding, dilation, ceil_mode)
    kernel, stride, padding, dilation, spatial, out, pads = geometry

    def run(b: Tensor):
        values = _MAX_POOL[nd](b, kernel, stride, dilation, out, pads)
        if not return_indices:
            return values
        with no_grad():
            # recomputed outside the composite (one tensor out); under a trace CSE merges it
            _, arg = _max_windows(b, kernel, stride, dilation, out, pads)
            table = _const(_window_positions(spatial, kernel, stride, padding, dilation, out),
                           dtypes.int64)
            table = expand(reshape_prim(table, (1, 1) + tuple(table.shape)),
                           tuple(b.shape[:2]) + tuple(table.shape))
            indices = reshape_prim(gather(table, 2, arg), tuple(b.shape[:2]) + out)
        return PoolWithIndices(values, indices)
    return _batched(run, x, nd, op)


@public(torch=True)
def max_pool1d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
               ceil_mode: bool = False, return_indices: bool = False):
    """Max over sliding windows of (N, C, L); with ``return_indices``, (values, indices) where
    an index is the position of the maximum in its input row (the first one, on ties)."""
    return _max_pool("max_pool1d", 1, input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


@public(torch=True)
def max_pool2d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
               ceil_mode: bool = False, return_indices: bool = False):
    """Max over sliding windows of (N, C, H, W); indices are flat positions in each H*W plane.

    >>> y = max_pool2d(x, 2)            # halve H and W
    """
    return _max_pool("max_pool2d", 2, input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


@public(torch=True)
def max_pool3d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
               ceil_mode: bool = False, return_indices: bool = False):
    """Max over sliding windows of (N, C, D, H, W); indices are flat positions in each
    D*H*W volume."""
    return _max_pool("max_pool3d", 3, input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


def max_pool1d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
                            ceil_mode=False, return_indices=True):
    return max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool2d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
                            ceil_mode=False, return_indices=True):
    return max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def _avg_divisor(spatial, kernel, stride, padding, out, count_include_pad, divisor_override):
    """torch's divisor per output position: the window clipped to the padded input (or, without
    ``count_include_pad``, to the input itself)."""
    if divisor_override:
        return np.full(tuple(out), float(divisor_override))
    per_dim = []
    for a in range(len(kernel)):
        start = np.arange(out[a]) * stride[a] - padding[a]
        end = np.minimum(start + kernel[a], spatial[a] + padding[a])
        size = end - start
        if not count_include_pad:
            size = np.minimum(end, spatial[a]) - np.maximum(start, 0)
        per_dim.append(size.astype(np.float64))
    divisor = per_dim[0]
    for d in per_dim[1:]:
        divisor = np.multiply.outer(divisor, d)
    return divisor


def _avg_pool(op: str, grad_name: str, nd: int, x: Tensor, kernel_size, stride, padding,
              ceil_mode, count_include_pad, divisor_override):
    if not x.dtype.is_floating_point:
        raise RuntimeError(f'"{op}" not implemented for \'{x.dtype.name.capitalize()}\'')
    kernel, stride, padding, _, spatial, out, pads = _pool_geometry(
        op, x, nd, kernel_size, stride, padding, 1, ceil_mode)
    divisor = _avg_divisor(spatial, kernel, stride, padding, out, count_include_pad,
                           divisor_override)

    @composite(grad_name)
    @opmath
    def pool(b: Tensor) -> Tensor:
        cols = windows(pad_axes(b, [(0, 0), (0, 0)] + pads), kernel, stride, (1,) * nd, out)
        return div(sum(cols, 2), _const(divisor, b.dtype))
    return _batched(pool, x, nd, op)


@public(torch=True)
def avg_pool1d(input: Tensor, kernel_size, stride=None, padding=0,  # noqa: A002
               ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    """Mean over sliding windows of (N, C, L)."""
    return _avg_pool("avg_pool1d", "AvgPool2DBackward0", 1, input, kernel_size, stride, padding,
                     ceil_mode, count_include_pad, None)


def avg_pool2d(input: Tensor, kernel_size, stride=None, padding=0,  # noqa: A002
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Tensor:
    """Mean over sliding windows of (N, C, H, W); ``count_include_pad=False`` leaves the
    padding out of the divisor, ``divisor_override`` replaces it."""
    return _avg_pool("avg_pool2d", "AvgPool2DBackward0", 2, input, kernel_size, stride, padding,
                     ceil_mode, count_include_pad, divisor_override)


def avg_pool3d(input: Tensor, kernel_size, stride=None, padding=0,  # noqa: A002
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Tensor:
    """Mean over sliding windows of (N, C, D, H, W)."""
    return _avg_pool("avg_pool3d", "AvgPool3DBackward0", 3, input, kernel_size, stride, padding,
                     ceil_mode, count_include_pad, divisor_override)


def _adaptive_bounds(length: int, size: int) -> list[tuple[int, int]]:
    """torch's adaptive windows: [floor(i*L/O), ceil((i+1)*L/O))."""
    return [((i * length) // size, -(-((i + 1) * length) // size)) for i in range(size)]


def _adaptive_sizes(op: str, x: Tensor, nd: int, output_size) -> tuple[int, ...]:
    if isinstance(output_size, int):
        output_size = (output_size,) * nd
    sizes = tuple(x.shape[-nd + a] if s is None else int(s) for a, s in enumerate(output_size))
    if len(sizes) != nd:
        raise RuntimeError(f"{op}: output_size must be {nd}")
    if any(d == 0 for d in x.shape[-nd:]):
        raise RuntimeError(f"{op}: Expected input to have non-zero size for non-batch dimensions, "
                           f"but input has sizes {list(x.shape)}")
    return sizes


def _adaptive_mean_axis(y: Tensor, axis: int, size: int) -> Tensor:
    """Means over torch's adaptive windows along ``axis``: each window's own elements gathered
    and summed (an averaging matrix would multiply an inf or NaN outside a window by 0 into a
    NaN there); a window narrower than the widest reads zeros appended past the end."""
    length = y.shape[axis]
    after = y.ndim - axis - 1
    if length % size == 0:
        # equal windows side by side (a global pool, a halving): a reshape, no gather
        width = length // size
        cols = reshape_prim(y, tuple(y.shape[:axis]) + (size, width) + tuple(y.shape[axis + 1:]))
        return div(sum(cols, axis + 1), float(width))
    bounds = _adaptive_bounds(length, size)
    width = max(hi - lo for lo, hi in bounds)
    table = np.full((size, width), length, dtype=np.int64)
    for i, (lo, hi) in enumerate(bounds):
        table[i, :hi - lo] = np.arange(lo, hi)
    padded = pad_axes(y, [(0, 0)] * axis + [(0, int(table.max() == length))] + [(0, 0)] * after)
    cols = take(padded, _const(table.reshape(-1), dtypes.int64), axis)
    cols = reshape_prim(cols, tuple(y.shape[:axis]) + (size, width) + tuple(y.shape[axis + 1:]))
    counts = np.array([hi - lo for lo, hi in bounds]).reshape((size,) + (1,) * after)
    return div(sum(cols, axis + 1), _const(counts, y.dtype))


def _adaptive_avg(op: str, nd: int, x: Tensor, output_size) -> Tensor:
    sizes = _adaptive_sizes(op, x, nd, output_size)
    if not x.dtype.is_floating_point:
        raise RuntimeError(f'"{op}" not implemented for \'{x.dtype.name.capitalize()}\'')

    @composite(f"AdaptiveAvgPool{nd}DBackward0")
    @opmath
    def pool(b: Tensor) -> Tensor:
        y = b
        for a in range(nd):
            y = _adaptive_mean_axis(y, 2 + a, sizes[a])
        return y
    return _batched(pool, x, nd, op)


@public(torch=True)
def adaptive_avg_pool1d(input: Tensor, output_size) -> Tensor:  # noqa: A002
    """Mean over ``output_size`` windows that tile (N, C, L) as evenly as torch's do."""
    return _adaptive_avg("adaptive_avg_pool1d", 1, input, output_size)


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:  # noqa: A002
    """Mean over an ``output_size`` grid of windows tiling (N, C, H, W); ``None`` keeps a dim."""
    return _adaptive_avg("adaptive_avg_pool2d", 2, input, output_size)


def adaptive_avg_pool3d(input: Tensor, output_size) -> Tensor:  # noqa: A002
    """Mean over an ``output_size`` grid of windows tiling (N, C, D, H, W)."""
    return _adaptive_avg("adaptive_avg_pool3d", 3, input, output_size)


def _adaptive_table(spatial, sizes) -> np.ndarray:
    """Flat input positions of each output's window, (math.prod(sizes), widest window): windows
    narrower than the widest repeat their first position (a repeat changes no maximum)."""
    bounds = [_adaptive_bounds(spatial[a], sizes[a]) for a in range(len(sizes))]
    width = math.prod(max(hi - lo for lo, hi in b) for b in bounds)
    table = np.zeros((math.prod(sizes), width), dtype=np.int64)
    for row, cell in enumerate(itertools.product(*bounds)):
        flat = [np.ravel_multi_index(pos, spatial)
                for pos in itertools.product(*(range(lo, hi) for lo, hi in cell))]
        table[row] = flat + [flat[0]] * (width - len(flat))
    return table


def _adaptive_max(op: str, grad_name: str, nd: int, x: Tensor, output_size,
                  return_indices: bool):
    sizes = _adaptive_sizes(op, x, nd, output_size)
    spatial = tuple(x.shape[-nd:])
    table = _adaptive_table(spatial, sizes)

    def gathered(b: Tensor):
        flat = reshape_prim(b, tuple(b.shape[:2]) + (math.prod(spatial),))
        cols = reshape_prim(take(flat, _const(table.reshape(-1), dtypes.int64), 2),
                            tuple(b.shape[:2]) + table.shape)
        return cols, argmax(cols, 3, keepdim=True)

    @composite(grad_name)
    def pool(b: Tensor) -> Tensor:
        cols, arg = gathered(b)
        return reshape_prim(gather(cols, 3, arg), tuple(b.shape[:2]) + sizes)

    def run(b: Tensor):
        values = pool(b)
        if not return_indices:
            return values
        with no_grad():
            _, arg = gathered(b)
            positions = expand(reshape_prim(_const(table, dtypes.int64), (1, 1) + table.shape),
                               tuple(b.shape[:2]) + table.shape)
            indices = reshape_prim(gather(positions, 3, arg), tuple(b.shape[:2]) + sizes)
        return PoolWithIndices(values, indices)
    return _batched(run, x, nd, op)


@public(torch=True)
def adaptive_max_pool1d(input: Tensor, output_size, return_indices: bool = False):  # noqa: A002
    """Max over ``output_size`` windows tiling (N, C, L) as torch's adaptive pooling does."""
    return _adaptive_max("adaptive_max_pool1d", "AdaptiveMaxPool2DBackward0", 1, input,
                         output_size, return_indices)


def adaptive_max_pool2d(input: Tensor, output_size, return_indices: bool = False):  # noqa: A002
    """Max over an ``output_size`` grid of windows tiling (N, C, H, W)."""
    return _adaptive_max("adaptive_max_pool2d", "AdaptiveMaxPool2DBackward0", 2, input,
                         output_size, return_indices)


def adaptive_max_pool3d(input: Tensor, output_size, return_indices: bool = False):  # noqa: A002
    """Max over an ``output_size`` grid of windows tiling (N, C, D, H, W)."""
    return _adaptive_max("adaptive_max_pool3d", "AdaptiveMaxPool3DBackward0", 3, input,
                         output_size, return_indices)


def _max_unpool(op: str, nd: int, x: Tensor, indices: Tensor, kernel_size, stride, padding,
                output_size) -> Tensor:
    kernel = ntuple(kernel_size, nd, op, "kernel_size")
    stride = ntuple(stride if stride is not None else kernel_size, nd, op, "stride")
    padding = ntuple(padding, nd, op, "padding")
    if tuple(indices.shape) != tuple(x.shape):
        raise RuntimeError(f"Expected shape of indices to be same as that of the input tensor "
                           f"({list(x.shape)}) but got indices tensor with shape: "
                           f"{list(indices.shape)}")
    if indices.dtype is not dtypes.int64:
        raise RuntimeError(f"elements in indices should be type int64 but got: {indices.dtype}")
    spatial_in = tuple(x.shape[-nd:])
    default = tuple((i - 1) * st - 2 * p + k
                    for i, st, p, k in zip(spatial_in, stride, padding, kernel))
    if output_size is None:
        sizes = default
    else:
        sizes = tuple(int(s) for s in output_size)[-nd:]
        if len(sizes) != nd:
            raise ValueError(f"output_size should be a sequence containing {nd} or {nd + 2} "
                             f"elements, but it has a length of '{len(tuple(output_size))}'")
        for s, d, st in zip(sizes, default, stride):
            if not d - st < s < d + st:
                raise ValueError(f"invalid output_size \"{list(sizes)}\" (dim {nd} must be "
                                 f"between {[a - b for a, b in zip(default, stride)]} and "
                                 f"{[a + b for a, b in zip(default, stride)]})")

    def run(b: Tensor, i: Tensor) -> Tensor:
        lead = tuple(b.shape[:2])
        flat = reshape_prim(b, lead + (math.prod(spatial_in),))
        idx = reshape_prim(i, lead + (math.prod(spatial_in),))
        zeros = bind(P.full, shape=lead + (math.prod(sizes),), value=0, dtype=b.dtype)
        out = bind(P.scatter_reduce, zeros, idx, flat, axis=2, reduce="replace",
                   include_self=True)
        return reshape_prim(out, lead + sizes)

    if x.ndim == nd + 1:
        return reshape_prim(run(reshape_prim(x, (1,) + tuple(x.shape)),
                                reshape_prim(indices, (1,) + tuple(indices.shape))),
                            (x.shape[0],) + sizes)
    if x.ndim != nd + 2:
        raise RuntimeError(f"{op}: Expected {nd + 1}D or {nd + 2}D input, but got input of size: "
                           f"{list(x.shape)}")
    return run(x, indices)


def max_unpool1d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0,  # noqa: A002
                 output_size=None) -> Tensor:
    """The inverse of ``max_pool1d(return_indices=True)``: each value written back at its
    index, zeros elsewhere."""
    return _max_unpool("max_unpool1d", 1, input, indices, kernel_size, stride, padding,
                       output_size)


def max_unpool2d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0,  # noqa: A002
                 output_size=None) -> Tensor:
    """The inverse of ``max_pool2d(return_indices=True)``: each value written back at its
    flat index in its H*W plane, zeros elsewhere."""
    return _max_unpool("max_unpool2d", 2, input, indices, kernel_size, stride, padding,
                       output_size)


def max_unpool3d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0,  # noqa: A002
                 output_size=None) -> Tensor:
    """The inverse of ``max_pool3d(return_indices=True)``."""
    return _max_unpool("max_unpool3d", 3, input, indices, kernel_size, stride, padding,
                       output_size)
