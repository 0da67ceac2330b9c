"""Index ops (gather, scatter_add, index_select, masked ops, sort, topk, nonzero) and
``Tensor.__getitem__``.
"""

from __future__ import annotations

import builtins
import warnings
from collections import namedtuple

import numpy as np

from fusegrad import dtypes
from fusegrad.ops import prims as P
from fusegrad.ops.composite import _named
from fusegrad.ops.creation import _source
from fusegrad.ops.creation import tensor as make_tensor
from fusegrad.ops.elementwise import add, eq, ge, le, lt, mul, sub, where
from fusegrad.ops.movement import (
    broadcast_tensors,
    expand,
    narrow,
    permute,
    reshape,
    reshape_prim,
    slice_axes,
)
from fusegrad.ops.operands import _index_tensor, _scalar_tensor, as_tensor_operand, cast, take, take_add
from fusegrad.ops.primitive import bind
from fusegrad.ops.prims import normalize_axis
from fusegrad.ops.registry import public
from fusegrad.symint import SymInt, slice_indices
from fusegrad.tensor import Tensor


def _positions(index: Tensor, size: int, op: str | None = None, dim: int = 0) -> Tensor:
    """Integer positions with negative ones counted from the end (int64); with ``op``, checked
    to lie in ``[-size, size)`` first (when read: at the call, or when the compiled program
    runs), where a position that is later linearized or wrapped once more would otherwise
    land silently on another element."""
    index = cast(as_tensor_operand(index), dtypes.int64)
    if op is not None:
        index = bind(P.check_index, index, op=op, size=int(size), dim=int(dim), wrap=True)
    return where(lt(index, 0), add(index, size), index)


def _checked_index(index: Tensor, op: str, size: int, dim: int) -> Tensor:
    """``index``, checked to lie in ``[0, size)`` when it is read (at the call, or when the
    compiled program runs): ``op`` does not wrap negative indices, as in torch."""
    return bind(P.check_index, index, op=op, size=int(size), dim=int(dim), wrap=False)


@public(torch=True, method=True)
def index_select(x: Tensor, dim: int, index: Tensor) -> Tensor:
    if index.ndim > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    if index.dtype.category != 1:
        raise IndexError(f"index_select(): Expected dtype int32/int64 for index but got: "
                         f"{index.dtype}")
    axis = normalize_axis(dim, x.ndim, "index_select") if x.ndim else 0
    index = _checked_index(index, "index_select", x.shape[axis] if x.ndim else 1, axis)
    return take(x, reshape_prim(index, (index.numel(),)) if index.ndim == 0 else index, axis)


@public(torch=True, method=True, inplace=True)
def index_add(x: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1) -> Tensor:
    axis = normalize_axis(dim, x.ndim, "index_add")
    if alpha != 1:
        source = mul(source, alpha)
    index = _checked_index(index, "index_add", x.shape[axis], axis)
    return take_add(x, index, cast(source, x.dtype), axis)


def _last_writes(positions: Tensor, size: int, written: bool = False):
    """For 1-D int64 ``positions`` in ``[0, size)``: True where no later element repeats the
    position. Where several writes meet one place, the last wins (numpy's assignment and
    torch's CPU kernels); adding up their differences instead gave their sum. Traceable: the
    positions may be data of a compiled call. ``written``: also the (size,) mask of the
    positions written."""
    n = positions.shape[0]
    order = _index_tensor(np.arange(n, dtype=np.int64), like=positions)
    last = bind(P.scatter_reduce, _index_tensor(np.full(size, -1, np.int64), like=positions),
                positions, order, axis=0, reduce="amax", include_self=True)
    is_last = eq(take(last, positions, 0), order)
    if written:
        return is_last, bind(P.le, _index_tensor(np.zeros((), np.int64), like=positions), last)
    return is_last


@public(torch=True, method=True)
def gather(x: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    if index.dtype.category != 1:
        raise RuntimeError(f"gather(): Expected dtype int64 for index, got {index.dtype}")
    index = cast(index, dtypes.int64)
    axis = normalize_axis(dim, x.ndim, "gather") if x.ndim else 0
    index = _checked_index(index, "gather", x.shape[axis] if x.ndim else 1, axis)
    return bind(P.gather, x, index, axis=axis)


@public(torch=True, method=True)
def take_along_dim(x: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    """The elements of ``x`` at ``indices`` along ``dim`` (the other dims broadcast); without
    ``dim``, of ``x`` and ``indices`` flattened."""
    if dim is None:
        return take_along_dim(reshape_prim(x, (x.numel(),)),
                              reshape_prim(indices, (indices.numel(),)), 0)
    axis = normalize_axis(dim, x.ndim, "take_along_dim")
    if indices.ndim != x.ndim:
        raise RuntimeError(f"take_along_dim(): input and indices should have the same number of "
                           f"dimensions, but got {x.ndim} dimensions for input, and {indices.ndim} "
                           f"dimensions for indices")
    # Broadcast all dims but ``axis``, where the two sizes differ by design.
    shape = list(P.broadcast_shapes(
        tuple(1 if i == axis else d for i, d in enumerate(x.shape)),
        tuple(1 if i == axis else d for i, d in enumerate(indices.shape)), op="take_along_dim"))
    shape_x, shape_i = list(shape), list(shape)
    shape_x[axis], shape_i[axis] = x.shape[axis], indices.shape[axis]
    return gather(expand(x, shape_x), axis, expand(indices, shape_i))


@public(torch=True, method=True, inplace=True)
def scatter_add(x: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    axis = normalize_axis(dim, x.ndim, "scatter_add")
    index = _checked_index(index, "scatter_add", x.shape[axis], axis)
    return bind(P.scatter_add, x, index, cast(src, x.dtype), axis=axis)


@public(torch=True, method=True, inplace=True)
def masked_fill(x: Tensor, mask: Tensor, value) -> Tensor:
    if mask.dtype is not dtypes.bool_:
        raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype "
                           f"{mask.dtype.name}")
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but got "
                               f"tensor with {value.ndim} dimension(s).")
        value = cast(value, x.dtype)
    else:
        value = _scalar_tensor(value, x.dtype)
    # x broadcasts to the mask's shape, as torch's out-of-place masked_fill does (masked_fill_
    # refuses in assign_: it cannot grow x)
    return _named(bind(P.where, mask, value, x), "MaskedFillBackward0")


def _tri_mask(x: Tensor, diagonal: int, upper: bool) -> Tensor:
    rows, cols = x.shape[-2], x.shape[-1]
    r = _source(P.iota, x, shape=(rows, cols), axis=0, dtype=dtypes.int64)
    c = _source(P.iota, x, shape=(rows, cols), axis=1, dtype=dtypes.int64)
    d = sub(c, r)
    return ge(d, diagonal) if upper else le(d, diagonal)


@public(torch=True, method=True, inplace=True)
def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    if x.ndim < 2:
        raise RuntimeError("tril: input tensor must have at least 2 dimensions")
    return _named(where(_tri_mask(x, diagonal, False), x, zeros_like_scalar(x)), "TrilBackward0")


@public(torch=True, method=True, inplace=True)
def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    if x.ndim < 2:
        raise RuntimeError("triu: input tensor must have at least 2 dimensions")
    return _named(where(_tri_mask(x, diagonal, True), x, zeros_like_scalar(x)), "TriuBackward0")


def zeros_like_scalar(x: Tensor) -> Tensor:
    return _scalar_tensor(0, x.dtype)


SortResult = namedtuple("sort", ["values", "indices"])
TopkResult = namedtuple("topk", ["values", "indices"])


@public(torch=True, method=True)
def argsort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    axis = normalize_axis(dim, x.ndim, "argsort") if x.ndim else 0
    return bind(P.argsort, x, axis=axis, descending=bool(descending))


@public(torch=True, method=True)
def sort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False):
    """(values, indices) sorted along ``dim``; the values are a gather, so differentiable."""
    idx = argsort(x, dim, descending)
    if x.ndim == 0:
        return SortResult(x, idx)
    axis = normalize_axis(dim, x.ndim)
    return SortResult(_named(gather(x, axis, idx), "SortBackward0"), idx)


@public(torch=True, method=True)
def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):  # noqa: A002
    axis = normalize_axis(dim, x.ndim, "topk") if x.ndim else 0
    size = x.shape[axis] if x.ndim else 1
    if not 0 <= k <= size:
        raise RuntimeError("selected index k out of range")
    idx = argsort(x, axis, descending=largest)
    idx = narrow(idx, axis, 0, k) if x.ndim else idx
    values = gather(x, axis, idx) if x.ndim else x
    return TopkResult(_named(values, "TopkBackward0", src=x), idx)


@public(torch=True, method=True)
def nonzero(x: Tensor, *, as_tuple: bool = False):
    """Indices of nonzero elements (data-dependent shape: eager only)."""
    x._check_concrete("nonzero()")
    if x.ndim == 0:
        # torch treats a 0-d tensor as one element with no coordinates: (1, 0) or (0, 0).
        hit = bool(x._host())
        if as_tuple:
            return (_index_tensor([0] if hit else [], like=x),)
        return _index_tensor(np.zeros((int(hit), 0)), like=x)
    idx = np.nonzero(x._host())
    if as_tuple:
        return tuple(_index_tensor(i, like=x) for i in idx)
    return _index_tensor(np.stack(idx, axis=1) if idx else np.zeros((1, 0)), like=x)


@public(torch=True, method=True)
def argwhere(x: Tensor) -> Tensor:
    return nonzero(x)


@public(torch=True, method=True)
def masked_select(x: Tensor, mask: Tensor) -> Tensor:
    x, mask = broadcast_tensors(x, mask)
    return _named(getitem(x, mask), "MaskedSelectBackward0")




_SEQUENCE_KEY_WARNING = (
    "Using a non-tuple sequence for multidimensional indexing is deprecated and will be changed "
    "in pytorch 2.9; use x[tuple(seq)] instead of x[seq]. In pytorch 2.9 this will be "
    "interpreted as tensor index, x[torch.tensor(seq)], which will result either in an error or "
    "a different result")


def _normalize_key(key) -> tuple:
    """The key as a tuple of per-dim entries. A list of fewer than 32 entries that holds a
    tensor, a sequence, a slice, ``...`` or None is such a tuple, with torch's deprecation
    warning (numpy's old heuristic, which torch keeps): ``x[[i, j]]`` with tensors ``i, j`` is
    ``x[i, j]``, and ``x[[i]]`` is ``x[i]``."""
    if isinstance(key, list) and len(key) < 32 and builtins.any(
            isinstance(k, (Tensor, list, tuple, np.ndarray, slice)) or k is None or k is Ellipsis
            for k in key):
        warnings.warn(_SEQUENCE_KEY_WARNING, UserWarning, stacklevel=3)   # the user's x[key]
        return tuple(key)
    if not isinstance(key, tuple):
        key = (key,)
    return key


def getitem(x: Tensor, key) -> Tensor:
    """Basic indexing (ints, slices with positive steps, None, ...) is a view; integer-tensor
    and boolean-mask indexing gathers a copy, following numpy's (and torch's) rules."""
    key = _normalize_key(key)
    # Expand the Ellipsis and count the dims each entry consumes.
    def consumes(k):
        if k is None:
            return 0
        if isinstance(k, Tensor) and k.dtype is dtypes.bool_:
            return builtins.max(k.ndim, 1) if k.ndim else 0
        if isinstance(k, np.ndarray) and k.dtype == np.bool_:
            return k.ndim
        return 1
    n_ell = builtins.sum(1 for k in key if k is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = builtins.sum(consumes(k) for k in key if k is not Ellipsis)
    if used > x.ndim:
        raise IndexError(f"too many indices for tensor of dimension {x.ndim}")
    if n_ell:
        i = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (x.ndim - used) + key[i + 1:]
    else:
        key = key + (slice(None),) * (x.ndim - used)

    # Pass 1: slices and integers as a strided slice; None and ints reshape.
    starts, stops, steps = [], [], []
    out_shape: list[int] = []
    advanced: list[tuple[int, object]] = []   # (position in the sliced result, index)
    selects: list[tuple[int, Tensor, int, int]] = []  # traced 0-d: (position, index, size, dim)
    view_name = None     # torch names a basic index by its last non-trivial entry
    dim = 0
    for k in key:
        if k is None:
            out_shape.append(1)
            view_name = "UnsqueezeBackward0"
            continue
        size = x.shape[dim]
        if isinstance(k, (bool, np.bool_)):
            raise IndexError("boolean scalar indices are not supported")
        if isinstance(k, (int, np.integer, SymInt)) or (
                isinstance(k, Tensor) and k.ndim == 0 and k.dtype.category == 1 and
                k._trace is None):
            i = k if isinstance(k, SymInt) else int(k)       # x[x.shape[0] - 1]
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")
            if i < 0:          # x[-1] of a symbolic size is the size's expression s0-1
                i += size
            starts.append(i), stops.append(i + 1), steps.append(1)
            view_name = "SelectBackward0"
            dim += 1
            continue
        if isinstance(k, Tensor) and k.ndim == 0 and k.dtype.category == 1:
            # A traced 0-d index selects like an int (torch reads its value), so it takes no
            # part in the placement of the advanced indices' dims.
            starts.append(0), stops.append(size), steps.append(1)
            selects.append((len(out_shape), k, size, dim))
            out_shape.append(size)
            dim += 1
            continue
        if isinstance(k, slice):
            if k.step is not None and int(k.step) <= 0:
                raise ValueError("step must be greater than zero")
            if isinstance(size, SymInt) or isinstance(k.start, SymInt) or \
                    isinstance(k.stop, SymInt):
                a, b, s = slice_indices(k.start, k.stop, k.step, size)
                # An empty slice stops where it starts (x[-2:0]: s0-2:s0-2, a fact for every
                # s0 >= 2); a stop that cannot be before the start is left as it is.
                lo = (b - a) if isinstance(b - a, int) else (b - a).lower_bound()
                if (lo is None or lo < 0) and b <= a:
                    b = a
            else:
                a, b, s = k.indices(size)
                b = builtins.max(b, a)
            starts.append(a), stops.append(b), steps.append(s)
            out_shape.append((b - a + s - 1) // s)
            # (A symbolic stop is a slice by name: comparing it with an int size would be an
            # assumption about the symbol, for a name.)
            if (a, s) != (0, 1) or b is not size and (isinstance(b, SymInt) or b != size):
                view_name = "SliceBackward0"
            dim += 1
            continue
        if isinstance(k, (list, tuple, np.ndarray)) and not isinstance(k, Tensor):
            # a sequence within the key, a tuple too, is an integer index tensor
            # An empty list selects nothing (torch reads it as int64, not as float32).
            k = make_tensor(k, dtype=dtypes.int64) if isinstance(k, list) and \
                np.size(k) == 0 else make_tensor(k)
        if isinstance(k, Tensor):
            if k.dtype is dtypes.bool_:
                nd = builtins.max(k.ndim, 1)
                if tuple(k.shape) != tuple(x.shape[dim:dim + k.ndim]):
                    raise IndexError(f"The shape of the mask {list(k.shape)} at index {dim} does "
                                     f"not match the shape of the indexed tensor "
                                     f"{list(x.shape[dim:dim + k.ndim])}")
                for _ in range(nd):
                    starts.append(0), stops.append(x.shape[dim]), steps.append(1)
                    dim += 1
                advanced.append((len(out_shape), k))
                out_shape.extend(x.shape[dim - nd:dim])
                continue
            if k.dtype.category != 1:
                raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
            starts.append(0), stops.append(size), steps.append(1)
            advanced.append((len(out_shape), k))
            out_shape.append(size)
            dim += 1
            continue
        raise IndexError(f"only integers, slices (`:`), ellipsis (`...`), None and long or byte "
                         f"tensors are valid indices (got {type(k).__name__})")
    out = slice_axes(x, starts, stops, steps)
    out = reshape_prim(out, tuple(out_shape))
    for pos, k, size, d in reversed(selects):
        out = take(out, _positions(k, size, "index", d), pos)
    if selects:
        view_name = "SelectBackward0" if view_name is None else view_name
        advanced = [(p - builtins.sum(1 for q, *_ in selects if q < p), k) for p, k in advanced]
    if not advanced:
        return _named(out, view_name, src=x) if view_name else out
    return _advanced_index(out, advanced)


def _advanced_index(x: Tensor, advanced: list) -> Tensor:
    """Gather with integer/boolean index tensors at the given positions of ``x``."""
    # Boolean masks become integer index tensors, one per masked dim (data-dependent).
    items = []
    for pos, k in advanced:
        if k.dtype is dtypes.bool_:
            k._check_concrete("boolean mask indexing")
            nz = np.nonzero(k._host().reshape(k.shape if k.ndim else (1,)))
            for j, idx in enumerate(nz):
                items.append((pos + j, _index_tensor(idx)))
        else:
            items.append((pos, k))
    positions = [p for p, _ in items]
    idx_shape = P.broadcast_shapes(*(tuple(k.shape) for _, k in items), op="index")
    adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
    if not adjacent:
        # numpy's rule: non-adjacent advanced indices put the result dims first.
        rest = [i for i in range(x.ndim) if i not in positions]
        x = permute(x, *(positions + rest))
        positions = list(range(len(positions)))
    first = positions[0]
    sizes = [x.shape[p] for p in positions]
    # Linearize the indexed dims into one and take along it.
    linear = None
    stride = 1
    for (p, k), size in reversed(list(zip(items, sizes))):
        # Check each index against its own dim: once linearized, an index past the end of
        # one dim would silently land in the next row.
        if k._trace is None:
            P._bounds("index", k._host(), size, p)
            if k.device != x.device:        # a cpu index into a cuda tensor, as torch allows
                k = k.to(x.device)
        else:
            k = bind(P.check_index, k, op="index", size=int(size), dim=int(p), wrap=True)
        k = expand(cast(k, dtypes.int64), idx_shape)
        k = where(lt(k, 0), add(k, size), k)
        term = mul(k, stride) if stride != 1 else k
        linear = term if linear is None else add(linear, term)
        stride *= size
    merged_shape = tuple(x.shape[:first]) + (stride,) + tuple(x.shape[first + len(positions):])
    flat = reshape(x, merged_shape)
    return _named(take(flat, linear, first), "IndexBackward0")
