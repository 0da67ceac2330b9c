"""The movement primitives: views and layout changes that codegen folds into index
arithmetic (reshape, permute, broadcast, slice, pad, concat).
"""

from __future__ import annotations

import warnings

import numpy as np

from fusegrad.ops.primitive import (
    Kind,
    Primitive,
    Rule,
    ShapeError,
    TensorType,
    bind,
    jvp_rule,
    register,
)
from fusegrad.ops.prims_common import (
    _same_dtype,
    _sum_to,
    _types_str,
    applied_to_tangent,
    tangent_or_zeros,
    view_op,
)
from fusegrad.symint import SymInt, as_size

# torch computes log(-1) = nan and 1/0 = inf silently; numpy warns. The filter is scoped to
# the numpy calls made in this module (warnings name the calling module), so user code keeps
# numpy's default; np.errstate per call would cost ~3 us on every eager op.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=__name__)


# --------------------------------------------------------------------------- movement


def _reshape_infer(x: TensorType, *, shape: tuple[int, ...]) -> TensorType:
    n = 1
    for d in shape:
        n *= d
    if n != x.numel or any(d < 0 for d in shape):
        raise ShapeError(f"shape '{list(shape)}' is invalid for input of size {x.numel}")
    return TensorType(tuple(shape), x.dtype)


reshape = register(Primitive(
    "reshape", Kind.MOVEMENT, _reshape_infer, lambda x, *, shape: x.reshape(shape),
    (Rule(lambda g, out, x, *, shape: g.reshape(x.shape)),), "ViewBackward0", attrs=("shape",)))


def _permute_infer(x: TensorType, *, perm: tuple[int, ...]) -> TensorType:
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"permute: number of dims don't match or not a permutation: {perm} for {x}")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _permute_vjp(g, out, x, *, perm):
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return g.permute(*inverse)


permute = register(Primitive(
    "permute", Kind.MOVEMENT, _permute_infer, lambda x, *, perm: x.transpose(perm),
    (Rule(_permute_vjp),), "PermuteBackward0", attrs=("perm",)))


def _broadcast_infer(x: TensorType, *, shape: tuple[int, ...]) -> TensorType:
    if len(shape) < x.ndim:
        raise ShapeError(
            f"expand: the number of sizes provided ({len(shape)}) must be greater or equal to "
            f"the number of dimensions in the tensor ({x.ndim})")
    offset = len(shape) - x.ndim
    for i, d in enumerate(x.shape):
        if d != 1 and d != shape[offset + i]:
            raise ShapeError(
                f"expand: the expanded size of the tensor ({shape[offset + i]}) must match the "
                f"existing size ({d}) at non-singleton dimension {offset + i}.  Target sizes: "
                f"{list(shape)}.  Tensor sizes: {list(x.shape)}")
    return TensorType(tuple(shape), x.dtype)


broadcast_to = register(Primitive(
    "broadcast_to", Kind.MOVEMENT, _broadcast_infer,
    lambda x, *, shape: np.broadcast_to(x, shape),
    (Rule(lambda g, out, x, *, shape: _sum_to(g, x.shape)),), "ExpandBackward0",
    attrs=("shape",)))


def _slice_infer(x: TensorType, *, starts, stops, steps) -> TensorType:
    if not len(starts) == len(stops) == len(steps) == x.ndim:
        raise ShapeError(f"slice: need one start/stop/step per axis of {x}")
    shape = []
    for d, a, b, s in zip(x.shape, starts, stops, steps):
        if s <= 0:
            raise ShapeError("slice step must be positive")
        if not 0 <= a <= b <= d:
            raise ShapeError(f"slice: bounds {a}:{b} out of range for size {d}")
        shape.append((b - a + s - 1) // s)
    return TensorType(tuple(shape), x.dtype)


def _slice_impl(x, *, starts, stops, steps):
    return x[tuple(map(slice, starts, stops, steps))]     # map: no Python frame per axis


def _slice_vjp(g, out, x, *, starts, stops, steps):
    # Scatter g back into zeros: for a step s, interleave s-1 zeros after each element by
    # padding a new trailing axis and merging it; then pad the ends to the input's extent.
    for axis, s in enumerate(steps):
        m = g.shape[axis]
        if s > 1 and m > 0:
            g = g.unsqueeze(axis + 1)
            widths = [(0, 0)] * g.ndim
            widths[axis + 1] = (0, s - 1)
            g = pad_axes(g, widths)
            merged = list(g.shape[:axis]) + [m * s] + list(g.shape[axis + 2:])
            g = g.reshape(merged)
            # Through the last element taken ((m-1)*s): no comparison of m*s with d - a, which
            # a symbolic size cannot answer without guarding its parity (x[::2]).
            g = g.narrow(axis, 0, (m - 1) * s + 1)
    # one pad for all axes: a pad of a pad is a copy, one pad folds into its consumer's loop
    return pad_axes(g, [(a, d - a - n) for d, a, n in zip(x.shape, starts, g.shape)])


slice_ = register(Primitive(
    "slice", Kind.MOVEMENT, _slice_infer, _slice_impl, (Rule(_slice_vjp),), "SliceBackward0",
    attrs=("starts", "stops", "steps")))


def _pad_infer(x: TensorType, *, widths, value) -> TensorType:
    if len(widths) != x.ndim or any(lo < 0 or hi < 0 for lo, hi in widths):
        raise ShapeError(f"pad: need one non-negative (low, high) pair per axis of {x}")
    return TensorType(tuple(d + lo + hi for d, (lo, hi) in zip(x.shape, widths)), x.dtype)


def _pad_vjp(g, out, x, *, widths, value):
    starts = tuple(lo for lo, _ in widths)
    stops = tuple(lo + d for (lo, _), d in zip(widths, x.shape))
    return view_op("slice_axes")(g, starts, stops, (1,) * x.ndim)


def _pad_impl(x, *, widths, value):
    # np.pad's constant mode, without its per-call Python (it dominated the small padded
    # slices of convolution backward): fill, then copy the input into the middle.
    if not x.ndim:
        return x.copy()
    if x.dtype.kind in "iub":        # np.pad's own checks of the value's range
        return np.pad(x, widths, constant_values=value)
    out = np.empty(tuple(d + lo + hi for d, (lo, hi) in zip(x.shape, widths)), x.dtype)
    out[...] = value                 # the assignment np.pad casts the value with
    out[tuple(slice(lo, lo + d) for d, (lo, _) in zip(x.shape, widths))] = x
    return out


pad = register(Primitive(
    "pad", Kind.MOVEMENT, _pad_infer, _pad_impl,
    (Rule(_pad_vjp),), "ConstantPadNdBackward0", attrs=("widths", "value")))


def pad_axes(x, widths, value=0.0):
    """``x`` padded by ``widths`` (a (low, high) pair per axis) with ``value``; ``x`` itself
    when every pair is (0, 0). The public ops and the VJP rules pad through it. A symbolic
    width is padded even where it is 0 (x[::2]'s VJP at odd sizes): comparing it with 0
    would make the trace guard it."""
    widths = tuple((as_size(lo), as_size(hi)) for lo, hi in widths)
    if not any(isinstance(n, SymInt) or n != 0 for w in widths for n in w):
        return x
    return bind(pad, x, widths=widths, value=value)


def _concat_infer(*xs: TensorType, axis: int) -> TensorType:
    if not xs:
        raise ShapeError("cat(): expected a non-empty list of Tensors")
    dt = _same_dtype("cat", *xs)
    first = xs[0]
    for t in xs[1:]:
        if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape))
                                       if i != axis):
            raise ShapeError(
                f"Sizes of tensors must match except in dimension {axis}. Got {_types_str(xs)}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in xs)
    return TensorType(tuple(shape), dt)


def _concat_vjp(g, out, *xs, argnum, axis):
    start = 0
    for x in xs[:argnum]:
        start += x.shape[axis]
    return g.narrow(axis, start, xs[argnum].shape[axis])


concat = register(Primitive(
    "concat", Kind.MOVEMENT, _concat_infer, lambda *xs, axis: np.concatenate(xs, axis=axis),
    (Rule(_concat_vjp),), "CatBackward0", attrs=("axis",), variadic=True))


# --------------------------------------------------------------------------- JVP rules
# Forward mode (fusegrad.ops.dual): every movement is linear, the op applied to the tangent
# (pad with zeros; concat with zeros for operands without one).

for _prim in (reshape, permute, broadcast_to, slice_):
    jvp_rule(_prim)(applied_to_tangent(_prim))
jvp_rule(pad)(lambda ts, out, x, *, widths, value: bind(pad, ts[0], widths=widths, value=0.0))
jvp_rule(concat)(lambda ts, out, *xs, axis: bind(
    concat, *[tangent_or_zeros(t, x) for t, x in zip(ts, xs)], axis=axis))


# --------------------------------------------------------------------------- batching rules
# The batch goes first and each attribute gains its axis: the whole batch dimension is kept.

from fusegrad.ops.batching import batch_size, batching, to_front  # noqa: E402


@batching(reshape)
def _reshape_batching(args, dims, *, shape):
    x = to_front(args[0], dims[0])
    return bind(reshape, x, shape=(x.shape[0],) + tuple(shape)), 0


@batching(permute)
def _permute_batching(args, dims, *, perm):
    x = to_front(args[0], dims[0])
    return bind(permute, x, perm=(0,) + tuple(p + 1 for p in perm)), 0


@batching(broadcast_to)
def _broadcast_batching(args, dims, *, shape):
    x = to_front(args[0], dims[0])
    missing = len(shape) - (x.ndim - 1)      # new leading axes go after the batch
    if missing:
        x = bind(reshape, x, shape=(x.shape[0],) + (1,) * missing + tuple(x.shape[1:]))
    return bind(broadcast_to, x, shape=(x.shape[0],) + tuple(shape)), 0


@batching(slice_)
def _slice_batching(args, dims, *, starts, stops, steps):
    x = to_front(args[0], dims[0])
    return bind(slice_, x, starts=(0,) + tuple(starts), stops=(x.shape[0],) + tuple(stops),
                steps=(1,) + tuple(steps)), 0


@batching(pad)
def _pad_batching(args, dims, *, widths, value):
    x = to_front(args[0], dims[0])
    return bind(pad, x, widths=((0, 0),) + tuple(widths), value=value), 0


@batching(concat)
def _concat_batching(args, dims, *, axis):
    size = batch_size(args, dims)
    return bind(concat, *[to_front(x, d, size) for x, d in zip(args, dims)], axis=axis + 1), 0
