"""Sliding windows over the spatial dims of an ``(N, C, *spatial)`` tensor.

Convolution, pooling, ``unfold`` and ``fold`` are built on two movements: gathering the
windows (one strided slice of the padded input per kernel offset, stacked on a new axis:
im2col), and its adjoint, placing blocks back at strided offsets and summing (col2im).

Each is one primitive (``windows``, ``overlap_add``: a numpy reference and a VJP, the other
one) defined by a composition of ``pad``, ``slice``, ``reshape`` and ``concat``. Eager code on
the CPU binds the primitive: one numpy gather (or one loop of strided adds) and one autograd
node, where the composition costs an op per kernel offset forward and backward. Traced code
(``fusegrad.compile``, ``fusegrad.trace``) and device tensors get the composition, so graphs
hold only views that the compiler folds into index arithmetic; the primitives never reach a
graph from these functions (they are ``extern`` if built into one by hand). Tests check the
primitives against their compositions.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

from fusegrad.ops import primitive as _primitive
from fusegrad.ops.elementwise import add
from fusegrad.ops.movement import narrow, pad_axes, reshape_prim, slice_axes, stack, unsqueeze
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
from fusegrad.ops.prims_common import applied_to_tangent
from fusegrad.symint import is_symbolic
from fusegrad.tensor import Tensor

__all__ = ["ntuple", "out_size", "windows", "overlap_add", "crop_or_pad", "eager_cpu"]


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


def eager_cpu(x: Tensor) -> bool:
    """Whether an op on ``x`` runs eagerly on numpy (as ``bind`` would route it)."""
    return not _primitive.traced(x) and type(x._data) is np.ndarray


def _check_geometry(op: str, spatial, kernel, stride, dilation, out) -> None:
    if not len(spatial) == len(kernel) == len(stride) == len(dilation) == len(out):
        raise ShapeError(f"{op}: spatial dims {list(spatial)}, kernel {list(kernel)}, stride "
                         f"{list(stride)}, dilation {list(dilation)} and output {list(out)} "
                         "must have one length")
    for s, k, t, d, n in zip(spatial, kernel, stride, dilation, out):
        if k < 1 or t < 1 or d < 1 or n < 0 or (n > 0 and (n - 1) * t + (k - 1) * d >= s):
            raise ShapeError(f"{op}: windows of kernel {list(kernel)}, stride {list(stride)}, "
                             f"dilation {list(dilation)} and output {list(out)} do not fit "
                             f"spatial dims {list(spatial)}")


# ``positions``: the number of windows along each spatial axis (the output's spatial shape).
def _windows_infer(x: TensorType, *, kernel, stride, dilation, positions) -> TensorType:
    if x.ndim != len(kernel) + 2:
        raise ShapeError(f"windows: expected an (N, C, *spatial) operand with {len(kernel)} "
                         f"spatial dims, got {x}")
    _check_geometry("windows", x.shape[2:], kernel, stride, dilation, positions)
    return TensorType(x.shape[:2] + (math.prod(kernel),) + tuple(positions), x.dtype)


def _windows_impl(x: np.ndarray, *, kernel, stride, dilation, positions) -> np.ndarray:
    # One strided view (N, C, *kernel, *out) of x, copied once into a fresh C-ordered array.
    steps = x.strides[2:]
    view = np.lib.stride_tricks.as_strided(
        x, x.shape[:2] + tuple(kernel) + tuple(positions),
        x.strides[:2] + tuple(s * d for s, d in zip(steps, dilation))
        + tuple(s * t for s, t in zip(steps, stride)), writeable=False)
    result = np.empty(x.shape[:2] + (math.prod(kernel),) + tuple(positions), dtype=x.dtype)
    np.copyto(result.reshape(view.shape), view)
    return result


def _overlap_add_infer(x: TensorType, *, padded, kernel, stride, dilation) -> TensorType:
    if x.ndim != len(kernel) + 3 or x.shape[2] != math.prod(kernel):
        raise ShapeError(f"overlap_add: expected (N, C, {math.prod(kernel)}, *out) blocks for "
                         f"kernel {list(kernel)}, got {x}")
    _check_geometry("overlap_add", padded, kernel, stride, dilation, x.shape[3:])
    return TensorType(x.shape[:2] + tuple(padded), x.dtype)


def _overlap_add_impl(x: np.ndarray, *, padded, kernel, stride, dilation) -> np.ndarray:
    # The composition's sum, element for element: the first block padded with zeros, plus
    # each further block padded with zeros, in kernel-offset order. Adding a padding zero
    # changes only a -0.0 (to +0.0): those additions are made once, at the end, where some
    # block after the first leaves the element uncovered.
    out = x.shape[3:]
    result = np.zeros(x.shape[:2] + tuple(padded), dtype=x.dtype)
    if 0 in out:
        return result
    blocks = x.reshape(x.shape[:2] + tuple(kernel) + out)
    covered = np.zeros(tuple(padded), dtype=np.intp)
    for i, offsets in enumerate(itertools.product(*(range(k) for k in kernel))):
        region = tuple(slice(o * d, o * d + t * (n - 1) + 1, t)
                       for o, d, t, n in zip(offsets, dilation, stride, out))
        block = blocks[(slice(None), slice(None)) + offsets]
        if i == 0:
            result[(slice(None), slice(None)) + region] = block
        else:
            result[(slice(None), slice(None)) + region] += block
            covered[region] += 1
    partial = covered < math.prod(kernel) - 1
    if result.dtype.kind in "biu":
        return result
    if partial.all():                    # windows that do not overlap (pooling's): in place
        result += result.dtype.type(0)
    elif partial.any():
        part = result[:, :, partial]
        part += part.dtype.type(0)
        result[:, :, partial] = part
    return result


windows_prim = register(Primitive(
    "windows", Kind.EXTERN, _windows_infer, _windows_impl,
    (Rule(lambda g, out, x, *, kernel, stride, dilation, positions:
          overlap_add(g, x.shape[2:], kernel, stride, dilation)),), "Im2ColBackward0",
    attrs=("kernel", "stride", "dilation", "positions"),
    doc="The windows of an (N, C, *S) tensor: (N, C, prod(kernel), *out) (im2col)."))

overlap_add_prim = register(Primitive(
    "overlap_add", Kind.EXTERN, _overlap_add_infer, _overlap_add_impl,
    (Rule(lambda g, out, x, *, padded, kernel, stride, dilation:
          windows(g, kernel, stride, dilation, x.shape[3:])),), "Col2ImBackward0",
    attrs=("padded", "kernel", "stride", "dilation"),
    doc="The adjoint of windows: (N, C, prod(kernel), *out) blocks summed into (N, C, *padded)."))


def windows(xp: Tensor, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
            out: Sequence[int]) -> Tensor:
    """The windows of an already padded ``xp`` (N, C, *S): shape (N, C, prod(kernel), *out).

    Axis 2 runs over the kernel offsets in row-major order, matching a weight of shape
    (..., *kernel) reshaped to (..., prod(kernel)).
    """
    if eager_cpu(xp):
        return bind(windows_prim, xp, kernel=tuple(kernel), stride=tuple(stride),
                    dilation=tuple(dilation), positions=tuple(out))
    return windows_by_slices(xp, kernel, stride, dilation, out)


def phase_grid(kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
               out: Sequence[int]) -> tuple[int, ...] | None:
    """The extents of the phase grid of strided windows, one per spatial axis: along an axis
    of stride ``s`` the padded input, cut (or padded with zeros) to ``grid * s``, is
    reshaped to ``(grid, s)``, on which the window of kernel offset ``o`` (at ``o * d``)
    is the unit-stride slice ``[o * d // s : o * d // s + out]`` at phase ``o * d % s``.
    None where there is no stride, or the sizes are symbolic (the comparisons of the cut
    are not known): windows are strided slices then."""
    if all(s == 1 for s in stride) or is_symbolic(tuple(out)):
        return None
    return tuple((k - 1) * d // s + n for k, d, s, n in zip(kernel, dilation, stride, out))


def _split_phases(x: Tensor, grid: Sequence[int], stride: Sequence[int]) -> Tensor:
    """(N, C, *S) cut or padded to ``grid * stride`` and reshaped to (N, C, grid0, s0, ...),
    with the phase axis after each strided axis only."""
    x = crop_or_pad(x, [(0, g * s - d) for g, s, d in zip(grid, stride, x.shape[2:])])
    return reshape_prim(x, tuple(x.shape[:2]) + tuple(
        v for g, s in zip(grid, stride) for v in ((g, s) if s > 1 else (g,))))


def windows_by_slices(xp: Tensor, kernel: Sequence[int], stride: Sequence[int],
                      dilation: Sequence[int], out: Sequence[int]) -> Tensor:
    """:func:`windows` as the ``windows`` primitive is defined: one slice per kernel offset,
    stacked (what traced code records). With strides each is a unit-stride slice of the
    input's phase grid (:func:`phase_grid`), so that its adjoint, a pad of the grid, fuses
    with the others' into one kernel (:func:`overlap_add_by_pads`)."""
    lead = tuple(xp.shape[:2])
    grid = phase_grid(kernel, stride, dilation, out)
    phases = None if grid is None else _split_phases(xp, grid, stride)
    views = []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        if phases is None:
            starts = (0, 0) + tuple(o * d for o, d in zip(offsets, dilation))
            stops = lead + tuple(o * d + s * (n - 1) + 1
                                 for o, d, s, n in zip(offsets, dilation, stride, out))
            views.append(slice_axes(xp, starts, stops, (1, 1) + tuple(stride)))
            continue
        starts, stops = [0, 0], list(lead)
        for o, d, s, n in zip(offsets, dilation, stride, out):
            starts.append(o * d // s)
            stops.append(o * d // s + n)
            if s > 1:
                starts.append(o * d % s)
                stops.append(o * d % s + 1)
        view = slice_axes(phases, starts, stops, (1,) * phases.ndim)
        views.append(reshape_prim(view, lead + tuple(out)))
    if len(views) == 1:
        return unsqueeze(views[0], 2)
    return stack(views, 2)


def overlap_add(blocks: Tensor, padded: Sequence[int], kernel: Sequence[int],
                stride: Sequence[int], dilation: Sequence[int]) -> Tensor:
    """The adjoint of :func:`windows`: ``blocks`` (N, C, prod(kernel), *out) summed into an
    (N, C, *padded) tensor, each block at its kernel offset with the windows' stride."""
    if eager_cpu(blocks):
        return bind(overlap_add_prim, blocks, padded=tuple(padded), kernel=tuple(kernel),
                    stride=tuple(stride), dilation=tuple(dilation))
    return overlap_add_by_pads(blocks, padded, kernel, stride, dilation)


def overlap_add_by_pads(blocks: Tensor, padded: Sequence[int], kernel: Sequence[int],
                        stride: Sequence[int], dilation: Sequence[int]) -> Tensor:
    """:func:`overlap_add` as the ``overlap_add`` primitive is defined: each block padded
    with zeros to its place, and the blocks added in kernel-offset order (the adjoint of
    :func:`windows_by_slices`).

    With strides the sum is made on the phase grid (:func:`phase_grid`), reshaped back and
    cut or padded to ``padded``: there each block is one pad, and all the pads and adds
    fuse into one elementwise kernel (blocks spread out by the stride took a pad per axis,
    each a kernel of its own, and copied every block twice)."""
    out = tuple(blocks.shape[3:])
    grid = phase_grid(kernel, stride, dilation, out)
    if grid is None and any(s != 1 for s in stride):
        return _overlap_add_spread(blocks, padded, kernel, stride, dilation)
    lead = tuple(blocks.shape[:2])
    split = lead + tuple(v for n, s in zip(out, stride) for v in ((n, 1) if s > 1 else (n,)))
    total = None
    for i, offsets in enumerate(itertools.product(*(range(k) for k in kernel))):
        block = blocks.select(2, i) if blocks.shape[2] > 1 else reshape_prim(blocks, lead + out)
        widths = [(0, 0), (0, 0)]
        for a, (o, d, s, n) in enumerate(zip(offsets, dilation, stride, out)):
            if grid is None:
                widths.append((o * d, padded[a] - o * d - n))
                continue
            widths.append((o * d // s, grid[a] - o * d // s - n))
            if s > 1:
                widths.append((o * d % s, s - 1 - o * d % s))
        block = pad_axes(reshape_prim(block, split) if grid is not None else block, widths)
        total = block if total is None else add(total, block)
    if grid is None:
        return total
    total = reshape_prim(total, lead + tuple(g * s for g, s in zip(grid, stride)))
    return crop_or_pad(total, [(0, p - g * s) for p, g, s in zip(padded, grid, stride)])


def _overlap_add_spread(blocks: Tensor, padded: Sequence[int], kernel: Sequence[int],
                        stride: Sequence[int], dilation: Sequence[int]) -> Tensor:
    """:func:`overlap_add_by_pads` for symbolic sizes: each block spread out by the stride
    (zeros between its elements), padded to its offset, and the blocks added in order."""
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


def crop_or_pad(x: Tensor, widths: Sequence[tuple[int, int]]) -> Tensor:
    """Pad the spatial dims (N, C, *S) by ``widths``; negative widths crop."""
    starts = (0, 0) + tuple(max(-lo, 0) for lo, _ in widths)
    stops = tuple(x.shape[:2]) + tuple(d - max(-hi, 0) for d, (_, hi) in zip(x.shape[2:], widths))
    x = slice_axes(x, starts, stops, (1,) * x.ndim)
    return pad_axes(x, [(0, 0), (0, 0)] + [(max(lo, 0), max(hi, 0)) for lo, hi in widths])



# --------------------------------------------------------------------------- JVP rules
# Forward mode (fusegrad.ops.dual): both are linear, applied to the tangent.

jvp_rule(windows_prim)(applied_to_tangent(windows_prim))
jvp_rule(overlap_add_prim)(applied_to_tangent(overlap_add_prim))


# --------------------------------------------------------------------------- batching rules
# Both take exactly (N, C, ...): the batch joins N, whose rows they treat independently.

from fusegrad.ops.batching import batching, to_front  # noqa: E402


def _merged_batch_rule(prim):
    def rule(args, dims, **attrs):
        x = to_front(args[0], dims[0])
        size, rest = x.shape[0], tuple(x.shape[2:])
        out = bind(prim, reshape_prim(x, (size * x.shape[1],) + rest), **attrs)
        return reshape_prim(out, (size, x.shape[1]) + tuple(out.shape[1:])), 0
    return rule


for _prim in (windows_prim, overlap_add_prim):
    batching(_prim)(_merged_batch_rule(_prim))
del _prim
