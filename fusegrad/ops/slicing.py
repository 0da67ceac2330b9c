"""Splits, flips and tiles, and ops that write into parts of a tensor out of place
(``index_copy``, ``index_fill``, ``index_put``, ``put``, ``masked_scatter``, the ``*_scatter``
family), composed of movement, ``where`` and index primitives (so traced and compiled too).
"""

from __future__ import annotations

import math

from fusegrad import dtypes
from fusegrad.ops.composite import CustomVJP, _named
from fusegrad.ops.creation import full, full_like, ones, zeros
from fusegrad.ops.elementwise import add, clone, lt, where
from fusegrad.ops.indexing import _last_writes, _positions, index_add, index_select, sort
from fusegrad.ops.movement import (
    _int_sequence,
    broadcast_tensors,
    diag,
    flatten,
    flip,
    movedim,
    narrow,
    repeat,
    reshape,
    split,
    unsqueeze,
)
from fusegrad.ops.operands import _index_tensor, as_tensor_operand, cast, take
from fusegrad.ops.primitive import ShapeError
from fusegrad.ops.prims import broadcast_shapes, normalize_axis
from fusegrad.ops.reductions import cumsum
from fusegrad.ops.registry import public
from fusegrad.ops.scatter import scatter_reduce
from fusegrad.tensor import Tensor

moveaxis = public(movedim, name="moveaxis", torch=True, method=True)


@public(torch=True, method=True)
def split_with_sizes(x: Tensor, split_sizes, dim: int = 0):
    """Views of ``x`` along ``dim`` of the given sizes."""
    return split(x, list(split_sizes), dim)


unsafe_split = public(split, name="unsafe_split", torch=True, method=True)
unsafe_split_with_sizes = public(split_with_sizes, name="unsafe_split_with_sizes", torch=True,
                                 method=True)


@public(torch=True)
def detach(x: Tensor) -> Tensor:
    """A tensor sharing ``x``'s data, cut from the autograd graph."""
    return x.detach()


@public(torch=True, method=True)
def unsafe_chunk(x: Tensor, chunks: int, dim: int = 0):
    """``chunk`` (torch's variant that skips view checks)."""
    return x.chunk(chunks, dim)


@public(torch=True, method=True)
def ravel(x: Tensor) -> Tensor:
    """``x`` flattened to 1-D."""
    return reshape(x, (-1,))


@public(torch=True, method=True)
def tile(x: Tensor, *args, dims=None) -> Tensor:
    """``x`` repeated ``dims[i]`` times along each dim (ones prepended to the shorter); the
    method also takes ``x.tile(2)`` and ``x.tile(2, 3)``, as torch's does."""
    dims = _int_sequence(args, dims, "tile", "dims")
    if len(dims) < x.ndim:
        dims = (1,) * (x.ndim - len(dims)) + dims
    return repeat(x, dims)


@public(torch=True, method=True)
def fliplr(x: Tensor) -> Tensor:
    """``x`` flipped left to right (dim 1)."""
    if x.ndim < 2:
        raise RuntimeError("Input must be >= 2-d.")
    return flip(x, 1)


@public(torch=True, method=True)
def flipud(x: Tensor) -> Tensor:
    """``x`` flipped up to down (dim 0)."""
    if x.ndim < 1:
        raise RuntimeError("Input must be >= 1-d.")
    return flip(x, 0)


@public(torch=True, method=True)
def narrow_copy(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    """A copy of ``narrow(x, dim, start, length)``."""
    return clone(narrow(x, dim, start, length))


@public(torch=True, method=True)
def msort(x: Tensor) -> Tensor:
    """``x`` sorted along dim 0."""
    return sort(x, 0).values


@public(torch=True, method=True)
def tensor_split(x: Tensor, indices_or_sections, dim: int = 0):
    """Views of ``x`` split along ``dim``: into ``n`` nearly equal parts (the first
    ``size % n`` one longer) for an int, or at the given indices for a list."""
    axis = normalize_axis(dim, x.ndim, "tensor_split")
    size = x.shape[axis]
    if isinstance(indices_or_sections, Tensor):
        indices_or_sections = indices_or_sections.tolist()
    if isinstance(indices_or_sections, int):
        n = indices_or_sections
        if n <= 0:
            raise RuntimeError(f"number of sections must be larger than 0, got {n}")
        bounds, start = [], 0
        for i in range(n - 1):
            start += size // n + (1 if i < size % n else 0)
            bounds.append(start)
    else:
        bounds = list(indices_or_sections)
    out, start = [], 0
    for stop in bounds + [size]:
        lo, hi = min(max(start, 0), size), min(max(stop, 0), size)
        out.append(narrow(x, axis, lo, max(hi - lo, 0)))
        start = stop
    return tuple(out)


def _split_dim(name: str, dim: int, min_ndim: int):
    def op(x: Tensor, indices_or_sections):
        if x.ndim < min_ndim:
            raise RuntimeError(f"torch.{name} requires a tensor with at least {min_ndim} dimension"
                               f"{'s' if min_ndim > 1 else ''}, but got a tensor with {x.ndim} "
                               f"dimensions!")
        axis = dim if x.ndim > 1 or name != "hsplit" else 0
        if isinstance(indices_or_sections, int) and x.shape[axis] % indices_or_sections:
            raise RuntimeError(f"torch.{name} attempted to split along dimension {axis}, but the "
                               f"size of the dimension {x.shape[axis]} is not divisible by the "
                               f"split_size {indices_or_sections}!")
        return tensor_split(x, indices_or_sections, axis)
    op.__name__ = name
    op.__doc__ = f"``tensor_split`` along dim {dim}, into equal parts for an int."
    return op


hsplit = public(_split_dim("hsplit", 1, 1), name="hsplit", torch=True, method=True)
vsplit = public(_split_dim("vsplit", 0, 2), name="vsplit", torch=True, method=True)
dsplit = public(_split_dim("dsplit", 2, 3), name="dsplit", torch=True, method=True)


@public(torch=True, method=True)
def diagflat(x: Tensor, offset: int = 0) -> Tensor:
    """The square matrix with ``x`` flattened on diagonal ``offset``."""
    return diag(flatten(x), offset)


def _hit_mask(x: Tensor, axis: int, index: Tensor) -> Tensor:
    """A bool tensor that broadcasts against ``x``: true at the listed positions of ``axis``."""
    size = x.shape[axis]
    idx = reshape(_positions(index, size), (-1,))
    counts = index_add(zeros(size), 0, idx, ones(idx.shape[0]))
    shape = [1] * x.ndim
    shape[axis] = size
    return reshape(lt(0, counts), tuple(shape))


@public(method=True, inplace=True, torch=True)
def index_fill(x: Tensor, dim: int, index: Tensor, value) -> Tensor:
    """``x`` with the slices at ``index`` along ``dim`` set to ``value``."""
    if x.ndim == 0:
        return reshape(index_fill(reshape(x, (1,)), 0, index, value), ())
    axis = normalize_axis(dim, x.ndim, "index_fill")
    # The value takes x's dtype (3.9 into an int64 tensor is 3), as torch's fill does.
    value = cast(as_tensor_operand(value), x.dtype)
    return where(_hit_mask(x, axis, index), value, x)


@public(torch=True, method=True, inplace=True)
def index_copy(x: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """``x`` with the slices at ``index`` along ``dim`` replaced by those of ``source``; of an
    index given twice, the last slice wins (numpy's assignment and torch's CPU kernels; torch
    leaves which unspecified). Also ``x[i] = v`` and ``index_put``.

    A where over a scatter of the kept slices into -0.0, to which adding v gives v exactly
    (-0.0, inf and NaN included): adding the differences v - old instead gave NaN where old
    was inf, and lost v next to a large old value (1e8 + (1.0 - 1e8) is 0 in float32)."""
    axis = normalize_axis(dim, x.ndim, "index_copy") if x.ndim else 0
    size = x.shape[axis] if x.ndim else 1
    pos = reshape(_positions(index, size), (-1,))
    source = cast(source, x.dtype)
    keep, written = _last_writes(where(lt(pos, 0), 0, where(lt(pos, size), pos, 0)), size,
                                 written=True)
    shape = [1] * source.ndim
    if source.ndim:
        shape[axis] = pos.shape[0]
    zero = -0.0 if x.dtype.is_floating_point else 0     # (+0.0 + -0.0 is +0.0)
    kept = where(reshape(keep, tuple(shape)), source, full((), zero, dtype=x.dtype))
    placed = index_add(full_like(x, zero), axis, pos, kept)
    hit = [1] * x.ndim
    if x.ndim:
        hit[axis] = size
    hit = reshape(written, tuple(hit))
    out = where(hit, placed, x)
    if not x.dtype.is_floating_point:
        return out
    # torch's gradient: every slice, an overruled one too, gets its position's gradient
    return _index_copy_rule.mark(out, (x, source, pos, hit), (axis,))


_index_copy_rule = CustomVJP("index_copy", reads_operands=False)    # its own positions only


@_index_copy_rule.defvjp
def _index_copy_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    _, _, pos, hit = operands
    (axis,) = params
    return where(hit, zeros((), dtype=g.dtype), g), index_select(g, axis, pos), None, None


@public(torch=True, method=True, inplace=True)
def index_put(x: Tensor, indices, values, accumulate: bool = False) -> Tensor:
    """``x`` with ``x[indices] = values`` (``+=`` with ``accumulate``, where repeated indices
    add up), out of place; ``indices`` a tuple of integer tensors for the leading dims."""
    indices = tuple(indices)
    if len(indices) > x.ndim:
        raise IndexError(f"too many indices for tensor of dimension {x.ndim} (got {len(indices)})")
    if any(i.dtype is dtypes.bool_ for i in indices):
        if len(indices) == 1 and not accumulate:
            out = clone(x)
            out[indices[0]] = values
            return out
        raise NotImplementedError("index_put with bool masks is implemented for a single mask "
                                  "without accumulate")
    lead = tuple(x.shape[:len(indices)])
    rest = tuple(x.shape[len(indices):])
    idx = broadcast_tensors(*[_positions(i, n, "index_put", d)
                              for d, (i, n) in enumerate(zip(indices, lead))])
    linear = idx[0]
    for i, n in zip(idx[1:], lead[1:]):
        linear = add(linear * n, i)
    flat = reshape(x, (math.prod(lead),) + rest)
    lin = reshape(linear, (-1,))
    vals = cast(as_tensor_operand(values, x.dtype), x.dtype)
    target = tuple(linear.shape) + rest
    if not _broadcasts_to(tuple(vals.shape), target):
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(vals.shape)} cannot be "
                           f"broadcast to indexing result of shape {list(target)}")
    vals = reshape(vals.expand(target), (lin.shape[0],) + rest)
    if accumulate:
        out = index_add(flat, 0, lin, vals)
    else:
        out = index_copy(flat, 0, lin, vals)
    return reshape(out, tuple(x.shape))


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    try:
        return broadcast_shapes(shape, target) == target
    except ShapeError:
        return False


@public(torch=True, method=True, inplace=True)
def put(x: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    """``x`` seen as 1-D with ``source``'s elements put at ``index`` (added with
    ``accumulate``)."""
    out = index_put(reshape(x, (-1,)), (reshape(index, (-1,)),), reshape(source, (-1,)),
                    accumulate)
    return reshape(out, tuple(x.shape))


@public(name="take", torch=True, method=True)
def _take_flat(x: Tensor, index: Tensor) -> Tensor:
    """Elements of ``x`` seen as 1-D, at ``index`` (negative from the end), in its shape."""
    n = x.numel()
    pos = _positions(index, n, "take")
    return reshape(take(reshape(x, (-1,)), reshape(pos, (-1,)), 0), tuple(pos.shape))


@public(torch=True, method=True)
def masked_scatter(x: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """``x`` with the positions where ``mask`` holds filled by ``source``'s elements, in
    order (a prefix sum over the mask numbers them, so this traces). ``x`` and ``mask``
    broadcast together, as torch's; ``masked_scatter_`` expands the mask to ``x``."""
    if mask.dtype is not dtypes.bool_:
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with "
                           f"dtype {mask.dtype.name}")
    if tuple(mask.shape) != tuple(x.shape):
        x, mask = broadcast_tensors(x, mask)
    order = cumsum(cast(reshape(mask, (-1,)), dtypes.int64), 0) - 1
    order = where(lt(order, 0), 0, order)
    src = reshape(cast(source, x.dtype), (-1,))
    picked = reshape(take(src, order, 0), tuple(x.shape))
    return _named(where(mask, picked, x), "MaskedScatterBackward0")


@public(torch=True, method=True)
def select_scatter(x: Tensor, src: Tensor, dim: int, index: int) -> Tensor:
    """``x`` with ``x.select(dim, index)`` replaced by ``src``."""
    axis = normalize_axis(dim, x.ndim, "select_scatter")
    return index_copy(x, axis, _index_tensor([index]), unsqueeze(src, axis))


@public(torch=True, method=True)
def slice_scatter(x: Tensor, src: Tensor, dim: int = 0, start: int | None = None,
                  end: int | None = None, step: int = 1) -> Tensor:
    """``x`` with the slice ``start:end:step`` of ``dim`` replaced by ``src``."""
    axis = normalize_axis(dim, x.ndim, "slice_scatter")
    positions = list(range(x.shape[axis]))[slice(start, end, step)]
    if not positions:
        return clone(x)
    return index_copy(x, axis, _index_tensor(positions), src)


@public(torch=True, method=True)
def diagonal_scatter(x: Tensor, src: Tensor, offset: int = 0, dim1: int = 0,
                     dim2: int = 1) -> Tensor:
    """``x`` with ``x.diagonal(offset, dim1, dim2)`` replaced by ``src``."""
    d1, d2 = (normalize_axis(d, x.ndim, "diagonal_scatter") for d in (dim1, dim2))
    y = movedim(x, (d1, d2), (-2, -1))
    rows, cols = y.shape[-2:]
    first_row, first_col = max(-offset, 0), max(offset, 0)
    length = max(min(rows - first_row, cols - first_col), 0)
    lin = [(first_row + i) * cols + first_col + i for i in range(length)]
    flat = reshape(y, tuple(y.shape[:-2]) + (rows * cols,))
    if lin:
        flat = index_copy(flat, -1, _index_tensor(lin), src)
    return movedim(reshape(flat, tuple(y.shape)), (-2, -1), (d1, d2))



@public(torch=True, method=True, inplace=True)
def index_reduce(x: Tensor, dim: int, index: Tensor, source: Tensor, reduce: str, *,
                 include_self: bool = True) -> Tensor:
    """Reduce the slices of ``source`` into those of ``x`` at ``index`` along ``dim`` with
    'prod', 'mean', 'amax' or 'amin' (``scatter_reduce`` with the index spread over the
    slices)."""
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or "
                           f"amin but got {reduce}.")
    axis = normalize_axis(dim, x.ndim, "index_reduce") if x.ndim else 0
    shape = [1] * source.ndim
    shape[axis] = -1
    spread = reshape(_positions(index, x.shape[axis]), tuple(shape)).expand(tuple(source.shape))
    return scatter_reduce(x, axis, spread, cast(source, x.dtype), reduce,
                          include_self=include_self)
