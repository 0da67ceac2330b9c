"""The index primitives: gathers and scatters with data-dependent addresses.
"""

from __future__ import annotations

import warnings

import numpy as np

from fusegrad import dtypes
from fusegrad.ops.primitive import (
    Kind,
    Primitive,
    Rule,
    ShapeError,
    TensorType,
    bind,
    jvp_rule,
    no_jvp,
    register,
)
from fusegrad.ops.prims_common import (
    _same_dtype,
    tangent_or_zeros,
    vjp_transposed,
)
from fusegrad.ops.prims_movement import pad_axes
from fusegrad.ops.prims_reduce import (
    _check_axes,
)

# torch computes log(-1) = nan and 1/0 = inf silently; numpy warns. The filter is scoped to
# the numpy calls made in this module (warnings name the calling module), so user code keeps
# numpy's default; np.errstate per call would cost ~3 us on every eager op.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=__name__)


# --------------------------------------------------------------------------- index


def _check_index(op: str, idx: TensorType) -> None:
    if idx.dtype.category != 1:
        raise ShapeError(f"{op}: index must be an integer tensor, got {idx}")


def _take_infer(x: TensorType, idx: TensorType, *, axis: int) -> TensorType:
    _check_index("take", idx)
    _check_axes("take", x, (axis,))
    return TensorType(x.shape[:axis] + idx.shape + x.shape[axis + 1:], x.dtype)


def _bounds(op: str, idx: np.ndarray, size: int, axis: int | None = None,
            wrap: bool = True) -> np.ndarray:
    """``idx``, or torch's IndexError naming ``op`` when an index is out of range: ``[-size,
    size)`` where negative indices count from the end (``wrap``), else ``[0, size)``."""
    low = -size if wrap else 0
    if idx.size and (idx.min() < low or idx.max() >= size):
        bad = idx[(idx < low) | (idx >= size)].flat[0]
        dim = "dimension" if axis is None else f"dimension {axis}"
        raise IndexError(f"{op}: index {bad} is out of bounds for {dim} with size {size}")
    return idx


def _take_impl(x, idx, *, axis):
    return np.take(x, _bounds("take", idx, x.shape[axis], axis), axis=axis)


def _take_vjp(g, out, x, idx, *, axis):
    return bind(index_add, g.new_zeros(x.shape), idx.long(), g, axis=axis)


take = register(Primitive("take", Kind.INDEX, _take_infer, _take_impl, (Rule(_take_vjp, (1,)), None),
                          "IndexSelectBackward0", attrs=("axis",)))


def _index_add_infer(x: TensorType, idx: TensorType, src: TensorType, *, axis: int) -> TensorType:
    _check_index("index_add", idx)
    _same_dtype("index_add", x, src)
    want = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
    if src.shape != want:
        raise ShapeError(f"index_add: source {src} does not match {want} (input {x}, index {idx})")
    return x


# ``fn(out, x, rows, src) -> bool``: adds rows of ``src`` into ``out`` in a native loop, False
# (nothing written) for arrays it does not take. Filled by fusegrad.runtime.native at import
# (register_index_add_rows: its ``index_add_rows``); while empty, numpy's path runs.
_index_add_rows = None


def register_index_add_rows(fn) -> None:
    """Install the native row loop of ``index_add`` along axis 0 (an embedding's gradient)."""
    global _index_add_rows
    _index_add_rows = fn


def _index_add_impl(x, idx, src, *, axis):
    # Row-major whatever x's layout: the row loop below adds through out.reshape(-1), which of
    # a transposed (Fortran-ordered) copy is a new array, and the sums were lost.
    out = np.array(x, copy=True, order="C")
    _bounds("index_add", idx, x.shape[axis], axis)
    if axis == 0 and out.ndim > 1 and out.size:
        rows = idx.reshape(-1)
        rows = np.where(rows < 0, rows + out.shape[0], rows)
        # Rows (an embedding's gradient): a native loop (fusegrad.runtime.native), else
        # np.add.at on the flat array with one index per element, 2-4x faster than on rows;
        # both add in the same order.
        if _index_add_rows is not None and _index_add_rows(
                out, out, np.ascontiguousarray(rows, dtype=np.int64),
                np.ascontiguousarray(src.reshape((rows.size,) + out.shape[1:]))):
            return out
        inner = out.size // out.shape[0]
        lin = (rows[:, None] * inner + np.arange(inner)).reshape(-1)
        np.add.at(out.reshape(-1), lin, src.reshape(-1))
        return out
    # Move the axis to the front so np.add.at can accumulate repeated indices.
    moved = np.moveaxis(out, axis, 0)
    src_moved = np.moveaxis(src.reshape(x.shape[:axis] + (idx.size,) + x.shape[axis + 1:]), axis, 0)
    np.add.at(moved, idx.reshape(-1), src_moved)
    return out




index_add = register(Primitive("index_add", Kind.INDEX, _index_add_infer, _index_add_impl,
                               (Rule(lambda g, out, x, idx, src, *, axis: g), None,
                                Rule(lambda g, out, x, idx, src, *, axis:
                                     bind(take, g, idx.long(), axis=axis), (1,))),
                               "IndexAddBackward0", attrs=("axis",)))


def _gather_infer(x: TensorType, idx: TensorType, *, axis: int) -> TensorType:
    _check_index("gather", idx)
    if idx.ndim != x.ndim:
        raise ShapeError(f"gather(): Index tensor must have the same number of dimensions as "
                         f"input tensor (input {x}, index {idx})")
    for i, (a, b) in enumerate(zip(idx.shape, x.shape)):
        if i != axis and a > b:
            raise ShapeError(f"gather(): Size does not match at dimension {i} expected index "
                             f"{list(idx.shape)} to be smaller than self {list(x.shape)} apart "
                             f"from dimension {axis}")
    return TensorType(idx.shape, x.dtype)


def _gather_impl(x, idx, *, axis):
    _bounds("gather", idx, x.shape[axis], axis)
    sl = tuple(slice(0, d) if i != axis else slice(None) for i, d in enumerate(idx.shape))
    return np.take_along_axis(x[sl], idx, axis=axis)


def _gather_vjp(g, out, x, idx, *, axis):
    # The scatter_add primitive, not the public op: the forward read (and checked) idx.
    return bind(scatter_add, g.new_zeros(x.shape), idx, g, axis=axis)


gather = register(Primitive("gather", Kind.INDEX, _gather_infer, _gather_impl,
                            (Rule(_gather_vjp, (1,)), None), "GatherBackward0", attrs=("axis",)))


def _check_target_infer(target: TensorType, *, op: str, classes: int, ignore_index: int,
                        input: str) -> TensorType:  # noqa: A002
    _check_index(op, target)
    return target


def _check_target_impl(target, *, op, classes, ignore_index, input):  # noqa: A002
    if not target.size or (target.min() >= 0 and target.max() < classes):
        return target           # every target a class (the common case: two reductions)
    bad = (target != ignore_index) & ((target < 0) | (target >= classes))
    if bad.any():
        raise IndexError(f"Target {target[bad].flat[0]} is out of bounds. ({op}: input {input} "
                         f"has {classes} classes, target {dtypes.from_numpy_dtype(target.dtype).name}"
                         f"{list(target.shape)}; class indices must be in [0, {classes}) or "
                         f"equal ignore_index={ignore_index})")
    return target


# Class-index targets of nll_loss and cross_entropy checked as torch checks them ("Target 7
# is out of bounds."): eager at the call, and inside a compiled program as a node of its
# graph, so the error there names the loss rather than the gather it feeds.
check_target = register(Primitive("check_target", Kind.EXTERN, _check_target_infer,
                                  _check_target_impl,
                                  attrs=("op", "classes", "ignore_index", "input")))


def _check_index_infer(idx: TensorType, *, op: str, size: int, dim: int,
                       wrap: bool = False) -> TensorType:
    _check_index(op, idx)
    return idx


def _check_index_impl(idx, *, op, size, dim, wrap=False):
    return _bounds(op, idx, size, dim, wrap=wrap)


# Indices of the ops that torch bounds-checks without wrapping negative values (index_select,
# embedding, index_add, gather, scatter_add): the primitives under them also serve indexing,
# where -1 means the last element, so the check is a node of its own, as check_target is.
# ``wrap``: ``[-size, size)`` is in range (an index tensor of ``x[i, j]`` in a compiled call,
# checked against its own dim before the dims are linearized).
check_index = register(Primitive("check_index", Kind.EXTERN, _check_index_infer,
                                 _check_index_impl, attrs=("op", "size", "dim", "wrap")))


def _scatter_add_infer(x: TensorType, idx: TensorType, src: TensorType, *, axis) -> TensorType:
    _check_index("scatter_add", idx)
    _same_dtype("scatter_add", x, src)
    if not idx.ndim == src.ndim == x.ndim:
        raise ShapeError(f"scatter_add(): Index tensor must have the same number of dimensions "
                         f"as self and src (self {x}, index {idx}, src {src})")
    return x


def _scatter_add_impl(x, idx, src, *, axis):
    out = np.array(x, copy=True)
    _bounds("scatter_add", idx, x.shape[axis], axis)
    coords = list(np.indices(idx.shape, sparse=True))
    coords[axis] = idx
    src = src[tuple(slice(0, d) for d in idx.shape)]
    np.add.at(out, tuple(coords), src)
    return out




scatter_add = register(Primitive("scatter_add", Kind.INDEX, _scatter_add_infer, _scatter_add_impl,
                                 (Rule(lambda g, out, x, idx, src, *, axis: g), None,
                                  Rule(lambda g, out, x, idx, src, *, axis: g.gather(axis, idx),
                                       (1,))),
                                 "ScatterAddBackward0", attrs=("axis",)))


SCATTER_REDUCTIONS = ("replace", "sum", "prod", "mean", "amax", "amin")


def _scatter_reduce_infer(x: TensorType, idx: TensorType, src: TensorType, *, axis, reduce,
                          include_self) -> TensorType:
    _check_index("scatter", idx)
    _same_dtype("scatter", x, src)
    if not idx.ndim == src.ndim == x.ndim:
        raise ShapeError(f"scatter(): Index tensor must have the same number of dimensions "
                         f"as self and src (self {x}, index {idx}, src {src})")
    for i, (a, b, c) in enumerate(zip(idx.shape, x.shape, src.shape)):
        if a > c or (i != axis and a > b):
            raise ShapeError(f"scatter(): Expected index {list(idx.shape)} to be smaller than "
                             f"self {list(x.shape)} apart from dimension {axis} and to be "
                             f"smaller size than src {list(src.shape)}")
    return x


def _scatter_reduce_impl(x, idx, src, *, axis, reduce, include_self):
    out = np.array(x, copy=True)
    _bounds("scatter", idx, x.shape[axis], axis)
    coords = list(np.indices(idx.shape, sparse=True))
    coords[axis] = idx
    coords = tuple(coords)
    src = src[tuple(slice(0, d) for d in idx.shape)]
    if reduce == "replace":
        out[coords] = src
        return out
    count = np.zeros(x.shape, np.int64)
    np.add.at(count, coords, 1)
    hit = count > 0
    if not include_self:
        if reduce in ("sum", "mean"):
            fill = 0
        elif reduce == "prod":
            fill = 1
        elif x.dtype.kind == "f":
            fill = -np.inf if reduce == "amax" else np.inf
        else:
            info = np.iinfo(x.dtype) if x.dtype.kind in "iu" else None
            fill = (info.min if reduce == "amax" else info.max) if info else reduce == "amin"
        out[hit] = fill
    ufunc = {"sum": np.add, "mean": np.add, "prod": np.multiply, "amax": np.maximum,
             "amin": np.minimum}[reduce]
    ufunc.at(out, coords, src)
    if reduce == "mean":
        n = np.maximum(count + int(include_self), 1).astype(x.dtype)
        out = np.where(hit, out // n if x.dtype.kind in "iu" else out / n, out).astype(x.dtype)
    return out


def _scatter_reduce_dx(g, out, x, idx, src, *, axis, reduce, include_self):
    hit = g.new_zeros(x.shape).scatter_add(axis, idx, g.new_ones(idx.shape)) > 0
    if reduce == "replace" or not include_self:
        return g.masked_fill(hit, 0)      # x's elements that were written over
    if reduce == "sum":
        return g
    if reduce == "mean":
        return g / g.new_ones(x.shape).scatter_add(axis, idx, g.new_ones(idx.shape))
    if reduce == "prod":
        # torch's rule (derivatives of scatter_reduce): the product of the others is the
        # reduction over x with its zeros replaced by 1, divided by x there.
        masked = x.masked_fill(x == 0, 1)
        return g * masked.scatter_reduce(axis, idx, src, "prod") / masked
    # amax/amin: the gradient is shared equally by the elements that equal the result.
    x_wins = x == out
    src_wins = _narrow_to(src, idx.shape) == out.gather(axis, idx)
    n = x_wins.to(g.dtype).scatter_add(axis, idx, src_wins.to(g.dtype))
    return (g / n).masked_fill(~x_wins, 0)


def _narrow_to(t, shape):
    for i, d in enumerate(shape):
        if t.shape[i] != d:
            t = t.narrow(i, 0, d)
    return t


def _pad_to(t, shape):
    if tuple(t.shape) == tuple(shape):
        return t
    return pad_axes(t, [(0, b - a) for a, b in zip(t.shape, shape)])


def _scatter_reduce_dsrc(g, out, x, idx, src, *, axis, reduce, include_self):
    s = _narrow_to(src, idx.shape)
    if reduce in ("replace", "sum"):
        return _pad_to(g.gather(axis, idx), src.shape)
    if reduce == "mean":
        count = g.new_full(x.shape, int(include_self)).scatter_add(axis, idx, g.new_ones(idx.shape))
        return _pad_to((g / count).gather(axis, idx), src.shape)
    if reduce == "prod":
        zero = s == 0
        zeros = g.new_zeros(x.shape).scatter_add(axis, idx, zero.to(g.dtype)).gather(axis, idx)
        single = zero & (zeros == 1)
        others = x.scatter_reduce(axis, idx, s.masked_fill(single, 1), "prod",
                                  include_self=include_self)
        grad = ((g * out).gather(axis, idx) / s.masked_fill(zero, 1)).masked_fill(zero, 0)
        return _pad_to(grad.where(~single, (g * others).gather(axis, idx)), src.shape)
    x_wins = (x == out) if include_self else \
        (x == out) & ~(g.new_zeros(x.shape).scatter_add(axis, idx, g.new_ones(idx.shape)) > 0)
    src_wins = s == out.gather(axis, idx)
    n = x_wins.to(g.dtype).scatter_add(axis, idx, src_wins.to(g.dtype))
    return _pad_to((g / n).gather(axis, idx).masked_fill(~src_wins, 0), src.shape)


# scatter, scatter(reduce=) and scatter_reduce: the numpy reference runs in compiled programs.
scatter_reduce = register(Primitive(
    "scatter_reduce", Kind.EXTERN, _scatter_reduce_infer, _scatter_reduce_impl,
    (Rule(_scatter_reduce_dx, (0, 1, 2), True), None, Rule(_scatter_reduce_dsrc, (0, 1, 2), True)),
    "ScatterReduceBackward0", attrs=("axis", "reduce", "include_self")))


def _bitcast_infer(x: TensorType, *, dtype: dtypes.DType) -> TensorType:
    if x.dtype.itemsize != dtype.itemsize:
        raise ShapeError(f"bitcast: {x.dtype} and {dtype} differ in size")
    return TensorType(x.shape, dtype)


# x.view(dtype) between dtypes of one size: the same bits, read as another type.
bitcast = register(Primitive(
    "bitcast", Kind.ELEMENTWISE, _bitcast_infer,
    lambda x, *, dtype: np.array(x, order="C").view(dtype.np_dtype), attrs=("dtype",)))


# --------------------------------------------------------------------------- JVP rules
# Forward mode (fusegrad.ops.dual): for fixed indices, gathers and the adding, replacing and
# averaging scatters are linear in their values, so their tangent is the op applied to the
# tangents; a scatter by product or extremum takes its VJP transposed.

jvp_rule(take)(lambda ts, out, x, idx, *, axis: bind(take, ts[0], idx, axis=axis))
jvp_rule(gather)(lambda ts, out, x, idx, *, axis: bind(gather, ts[0], idx, axis=axis))


def _scatter_linear(prim):
    def rule(ts, out, x, idx, src, **attrs):
        return bind(prim, tangent_or_zeros(ts[0], x), idx, tangent_or_zeros(ts[2], src), **attrs)
    return rule


jvp_rule(index_add)(_scatter_linear(index_add))
jvp_rule(scatter_add)(_scatter_linear(scatter_add))
_scatter_reduce_transposed = vjp_transposed(scatter_reduce)


@jvp_rule(scatter_reduce)
def _scatter_reduce_jvp(ts, out, x, idx, src, *, axis, reduce, include_self):
    attrs = {"axis": axis, "reduce": reduce, "include_self": include_self}
    if reduce in ("replace", "sum", "mean"):
        return _scatter_linear(scatter_reduce)(ts, out, x, idx, src, **attrs)
    return _scatter_reduce_transposed(ts, out, x, idx, src, **attrs)


no_jvp(check_target, "passes an integer target through")
no_jvp(check_index, "passes an integer index through")
no_jvp(bitcast, "reinterprets bits: not a differentiable function of the value")


# --------------------------------------------------------------------------- batching rules
# Operands go batch-first (an unbatched one broadcast to the batch where the op needs every
# operand batched) and the axis moves up by one. An index that differs per example along
# with its operand turns take and index_add into gather and scatter_add, which pair each
# index with its own example.

from fusegrad.ops.batching import (  # noqa: E402
    batch_size,
    batching,
    elementwise_rule,
    to_front,
    unbatched_rule,
)
from fusegrad.ops.prims_movement import broadcast_to, reshape  # noqa: E402

for _prim in (check_target, check_index):
    batching(_prim)(unbatched_rule(_prim))
batching(bitcast)(elementwise_rule(bitcast))
del _prim


def _index_along(idx, x_shape: tuple, axis: int):
    """A front-batched index ``idx`` (``[B, *I]``) flattened and broadcast over a
    front-batched operand of ``x_shape`` (``[B, *pre, *, *post]``) at ``axis``: gather's and
    scatter's index for take's and index_add's."""
    size, k = idx.shape[0], 1
    for s in idx.shape[1:]:
        k *= s
    pre, post = x_shape[1:axis + 1], x_shape[axis + 2:]
    flat = bind(reshape, idx, shape=(size,) + (1,) * len(pre) + (k,) + (1,) * len(post))
    return bind(broadcast_to, flat, shape=(size,) + tuple(pre) + (k,) + tuple(post))


@batching(take)
def _take_batching(args, dims, *, axis):
    (x, idx), (dx, di) = args, dims
    if di is None:
        return bind(take, to_front(x, dx), idx, axis=axis + 1), 0
    if dx is None:
        return bind(take, x, idx, axis=axis), axis + di
    x, idx = to_front(x, dx), to_front(idx, di)
    index = _index_along(idx, tuple(x.shape), axis)
    out = bind(gather, x, index, axis=axis + 1)
    shape = tuple(x.shape[:axis + 1]) + tuple(idx.shape[1:]) + tuple(x.shape[axis + 2:])
    return bind(reshape, out, shape=shape), 0


@batching(gather)
def _gather_batching(args, dims, *, axis):
    size = batch_size(args, dims)
    x, idx = [to_front(a, d, size) for a, d in zip(args, dims)]
    return bind(gather, x, idx, axis=axis + 1), 0


def _scatter_rule(prim):
    def rule(args, dims, **attrs):
        size = batch_size(args, dims)
        ops = [to_front(a, d, size) for a, d in zip(args, dims)]
        return bind(prim, *ops, **{**attrs, "axis": attrs["axis"] + 1}), 0
    return rule


for _prim in (scatter_add, scatter_reduce):
    batching(_prim)(_scatter_rule(_prim))
del _prim


@batching(index_add)
def _index_add_batching(args, dims, *, axis):
    (x, idx, src), (dx, di, ds) = args, dims
    size = batch_size(args, dims)
    x, src = to_front(x, dx, size), to_front(src, ds, size)
    if di is None:
        return bind(index_add, x, idx, src, axis=axis + 1), 0
    idx = to_front(idx, di)
    index = _index_along(idx, tuple(x.shape), axis)
    src = bind(reshape, src, shape=tuple(index.shape))
    return bind(scatter_add, x, index, src, axis=axis + 1), 0
