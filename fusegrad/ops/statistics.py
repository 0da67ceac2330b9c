"""Order statistics and NaN-aware reductions: ``median``, ``nanmedian``, ``kthvalue``,
``mode``, ``quantile``, ``nanquantile``, ``nansum``, ``nanmean``, ``aminmax``, histograms,
``renorm``, ``rot90``, ``unique_consecutive``.

Order statistics sort (the ``argsort`` primitive, stable) and gather, so their values are
differentiable and traceable; which position to gather is computed with tensor ops from the
number of NaNs, so nothing depends on data at trace time. ``mode``'s position comes from an
extern primitive (a run-length count that the other primitives cannot express cheaply).
"""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from fusegrad import dtypes
from fusegrad.ops.composite import _named, opmath
from fusegrad.ops.creation import full, tensor, zeros
from fusegrad.ops.elementwise import (
    abs,
    add,
    cast,
    clamp,
    div,
    eq,
    floor,
    isnan,
    logical_and,
    logical_or,
    lt,
    mul,
    pow,
    sub,
    where,
)
from fusegrad.ops.factories import zeros_like
from fusegrad.ops.indexing import argsort, gather, index_add
from fusegrad.ops.movement import flip, movedim, reshape, squeeze, transpose, unsqueeze
from fusegrad.ops.operands import as_tensor_operand
from fusegrad.ops.primitive import Kind, Primitive, ShapeError, TensorType, bind, no_jvp, register
from fusegrad.ops.prims import normalize_axis
from fusegrad.ops.reductions import amax, amin, sum
from fusegrad.ops.reductions import sum as total
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor

MedianResult = namedtuple("median", ["values", "indices"])
NanmedianResult = namedtuple("nanmedian", ["values", "indices"])
KthvalueResult = namedtuple("kthvalue", ["values", "indices"])
ModeResult = namedtuple("mode", ["values", "indices"])
AminmaxResult = namedtuple("aminmax", ["min", "max"])
HistogramResult = namedtuple("histogram", ["hist", "bin_edges"])


@public(torch=True, method=True)
def nansum(x: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """``sum`` with NaNs counted as zero."""
    if x.dtype.is_floating_point:
        x = where(isnan(x), zeros_like(x), x)
    return sum(x, dim, keepdim, dtype=dtype)


@public(torch=True, method=True)
def nanmean(x: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """The mean of the elements that are not NaN (NaN where there are none)."""
    if not x.is_floating_point() and dtype is None:
        raise RuntimeError(f"nanmean(): expected input to have floating point dtype but got "
                           f"{x.dtype.name.capitalize()}")
    count = sum(_not_nan(x), dim, keepdim)
    return div(nansum(x, dim, keepdim, dtype=dtype), count)


def _not_nan(x: Tensor) -> Tensor:
    return eq(x, x)


def _sorted_along(x: Tensor, dim: int | None):
    """(x with the reduced dim last, its ascending sort order): ``dim`` None flattens."""
    if dim is None:
        y = reshape(x, (-1,))
    else:
        y = movedim(x, normalize_axis(dim, x.ndim, "median"), -1) if x.ndim else reshape(x, (1,))
    return y, argsort(y, -1)


def _pick(y: Tensor, order: Tensor, position: Tensor):
    """Values and indices of ``y`` at sorted ``position`` (shape ``y.shape[:-1]`` + (1,))."""
    idx = gather(order, -1, position)
    return gather(y, -1, idx), idx


def _finish(values, idx, x, dim, keepdim, result):
    if dim is None:
        return reshape(values, ())
    if keepdim and x.ndim:
        axis = normalize_axis(dim, x.ndim, "median")
        return result(movedim(values, -1, axis), movedim(idx, -1, axis))
    return result(squeeze(values, -1), squeeze(idx, -1))


def _order_statistic(x, dim, keepdim, result, name, position_of):
    y, order = _sorted_along(x, dim)
    n = y.shape[-1]
    if n == 0:
        raise IndexError(f"{name}(): Expected reduction dim to have non-zero size.")
    nan_count = sum(isnan(y), -1, True) if y.dtype.is_floating_point else None
    position = position_of(y, nan_count)
    values, idx = _pick(y, order, cast(position, dtypes.int64))
    if dim is None and name != "kthvalue" and values.requires_grad:
        values = _shared_by_ties(x, values)
    values = _named(values, f"{name.capitalize()}Backward{0 if dim is None else 1}")
    return _finish(values, idx, x, dim, keepdim, result)


def _shared_by_ties(x: Tensor, value: Tensor) -> Tensor:
    """``value`` (one of ``x``'s elements), whose gradient the elements equal to it share
    evenly (NaN: the NaN elements), as torch's gradient of a median of all elements. The
    value itself is kept exactly: ``value + (a - a)`` with ``a`` the mean of the ties."""
    v = reshape(value.detach(), ())
    ties = eq(x, v)
    if x.dtype.is_floating_point:
        ties = logical_or(ties, logical_and(isnan(x), isnan(v)))
    a = div(total(where(ties, x, 0.0)), total(cast(ties, x.dtype)))
    return reshape(add(v, sub(a, a.detach())), tuple(value.shape))


def _const_position(y_shape, value):
    return full(tuple(y_shape[:-1]) + (1,), value, dtype=dtypes.int64)


@public(torch=True, method=True)
def median(x: Tensor, dim: int | None = None, keepdim: bool = False):
    """The lower median (of all elements, or (values, indices) along ``dim``); NaN where the
    elements include NaN, as torch."""
    def position(y, nan_count):
        n = y.shape[-1]
        base = _const_position(y.shape, (n - 1) // 2)
        if nan_count is None:
            return base
        # Sorting puts NaNs last: the first NaN is at n - nan_count.
        return where(lt(0, nan_count), sub(n, nan_count), base)
    return _order_statistic(x, dim, keepdim, MedianResult, "median", position)


@public(torch=True, method=True)
def nanmedian(x: Tensor, dim: int | None = None, keepdim: bool = False):
    """The lower median of the elements that are not NaN (NaN where all are)."""
    def position(y, nan_count):
        if nan_count is None:
            return _const_position(y.shape, (y.shape[-1] - 1) // 2)
        valid = sub(y.shape[-1], nan_count)
        return clamp(floor(div(sub(valid, 1), 2)), min=0)
    return _order_statistic(x, dim, keepdim, NanmedianResult, "nanmedian", position)


@public(torch=True, method=True)
def kthvalue(x: Tensor, k: int, dim: int = -1, keepdim: bool = False):
    """(values, indices) of the ``k``-th smallest elements along ``dim``."""
    size = x.shape[normalize_axis(dim, x.ndim, "kthvalue")] if x.ndim else 1
    if not 1 <= k <= size:
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {dim}")
    out = _order_statistic(x, dim, keepdim, KthvalueResult, "kthvalue",
                           lambda y, nan_count: _const_position(y.shape, k - 1))
    return out


def _mode_index_infer(x: TensorType) -> TensorType:
    if x.ndim == 0:
        raise ShapeError("mode_index expects at least one dim")
    return TensorType(x.shape[:-1] + (1,), dtypes.int64)


def _mode_index_impl(x):
    """Per row of the last dim: the index of the last occurrence of the most frequent value
    (the smallest such value on ties), as torch's CPU kernel."""
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty(rows.shape[0], np.int64)
    for r, row in enumerate(rows):
        values, counts = np.unique(row, return_counts=True)
        best = values[np.argmax(counts)]
        out[r] = np.flatnonzero((row == best) | (np.isnan(row) & np.isnan(best)))[-1]
    return out.reshape(x.shape[:-1] + (1,))


mode_index = register(Primitive("mode_index", Kind.EXTERN, _mode_index_infer, _mode_index_impl))


@public(torch=True, method=True)
def mode(x: Tensor, dim: int = -1, keepdim: bool = False):
    """(values, indices): the most frequent value along ``dim`` (the smallest on ties) and the
    index of its last occurrence."""
    y = movedim(x, normalize_axis(dim, x.ndim, "mode"), -1) if x.ndim else reshape(x, (1,))
    idx = bind(mode_index, y)
    values = _named(gather(y, -1, idx), "ModeBackward0")
    return _finish(values, idx, x, dim if x.ndim else 0, keepdim, ModeResult) if x.ndim else \
        ModeResult(reshape(values, ()), reshape(idx, ()))


def _quantile(x, q, dim, keepdim, interpolation, ignore_nan, name):
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"{name}() input tensor must be either float or double dtype")
    scalar_q = not isinstance(q, Tensor)
    qt = as_tensor_operand(q, x.dtype) if not scalar_q else None
    qs = [float(q)] if scalar_q else None
    if qs is not None and not all(0 <= v <= 1 for v in qs):
        raise RuntimeError(f"{name}() q values must be in the range [0, 1]")
    if interpolation not in ("linear", "lower", "higher", "midpoint", "nearest"):
        raise RuntimeError(f"{name}() interpolation must be one of linear, lower, higher, "
                           f"midpoint or nearest. Got {interpolation}")
    y, order = _sorted_along(x, dim)
    n = y.shape[-1]
    srt = gather(y, -1, order)
    nan_count = sum(isnan(y), -1, True)
    valid = sub(n, nan_count) if ignore_nan else \
        where(lt(0, nan_count), n * 1.0, _const_position(y.shape, n).to(x.dtype))
    q_vec = qt if qt is not None else as_tensor_operand(qs[0], x.dtype)
    q_vec = reshape(q_vec, (-1,))                              # (Q,)
    last = cast(sub(valid, 1), x.dtype)                        # (..., 1)
    rank = mul(unsqueeze(last, 0), reshape(q_vec, (-1,) + (1,) * y.ndim))  # (Q, ..., 1)
    rank = clamp(rank, min=0)
    lo = floor(rank)
    hi = clamp(add(lo, 1), max=clamp(last, min=0))
    hi = where(lt(lo, rank), hi, lo)                           # ceil(rank), within range
    if interpolation == "lower":
        hi = lo
    elif interpolation == "higher":
        lo = hi
    elif interpolation == "nearest":
        # round half to even, as torch (and numpy's 'nearest').
        lo = hi = rank.round()
    srt_q = srt.expand((rank.shape[0],) + tuple(srt.shape))
    v_lo = gather(srt_q, -1, cast(lo, dtypes.int64))
    v_hi = gather(srt_q, -1, cast(hi, dtypes.int64))
    if interpolation == "linear":
        out = add(v_lo, mul(sub(v_hi, v_lo), sub(rank, lo)))
    elif interpolation == "midpoint":
        out = add(v_lo, mul(sub(v_hi, v_lo), 0.5))
    else:
        out = v_lo
    # All NaN (nanquantile) or any NaN (quantile): NaN.
    bad = lt(0, nan_count) if not ignore_nan else eq(nan_count, n)
    out = where(unsqueeze(bad, 0), math.nan, out)
    out = squeeze(out, -1)                                     # (Q, ...)
    if keepdim:
        if dim is None:
            out = reshape(out, (out.shape[0],) + (1,) * x.ndim)
        elif x.ndim:                 # (a 0-d input keeps no dim: torch's shape is ())
            out = unsqueeze(out, normalize_axis(dim, x.ndim, name) + 1)
    if scalar_q or (qt is not None and qt.ndim == 0):
        out = squeeze(out, 0)
    return out


@public(torch=True, method=True)
def quantile(x: Tensor, q, dim: int | None = None, keepdim: bool = False, *,
             interpolation: str = "linear") -> Tensor:
    """The ``q``-quantiles (a number or a 1-D tensor, a leading dim) along ``dim`` or of all
    elements, interpolated between order statistics as numpy does; NaN where a NaN is."""
    return _quantile(x, q, dim, keepdim, interpolation, False, "quantile")


@public(torch=True, method=True)
def nanquantile(x: Tensor, q, dim: int | None = None, keepdim: bool = False, *,
                interpolation: str = "linear") -> Tensor:
    """``quantile`` of the elements that are not NaN."""
    return _quantile(x, q, dim, keepdim, interpolation, True, "nanquantile")


@public(torch=True, method=True)
def aminmax(x: Tensor, *, dim: int | None = None, keepdim: bool = False):
    """(min, max) over ``dim`` or all elements."""
    if dim is None:
        return AminmaxResult(amin(x, (), keepdim), amax(x, (), keepdim))
    return AminmaxResult(amin(x, dim, keepdim), amax(x, dim, keepdim))


@public(torch=True, method=True)
def histc(x: Tensor, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:  # noqa: A002
    """Counts of the elements in ``bins`` equal bins over [min, max] (the data's range when
    both are 0); elements outside are ignored, the last bin includes ``max``."""
    if not x.dtype.is_floating_point:
        raise RuntimeError(f'"histogram_cpu" not implemented for \'{x.dtype.name.capitalize()}\'')
    flat = reshape(x.detach(), (-1,))
    if min == max and flat.numel():
        lo, hi = amin(flat), amax(flat)
    else:
        lo, hi = as_tensor_operand(float(min), x.dtype), as_tensor_operand(float(max), x.dtype)
    if min == max:
        # torch widens an empty range by one on each side.
        same = eq(lo, hi)
        lo, hi = where(same, sub(lo, 1), lo), where(same, add(hi, 1), hi)
    inside = logical_and(logical_and(eq(flat, flat), lt(lo, flat) | eq(lo, flat)),
                         lt(flat, hi) | eq(flat, hi))
    pos = floor(mul(div(sub(flat, lo), sub(hi, lo)), bins))
    pos = clamp(where(inside, pos, 0.0), 0, bins - 1)
    return index_add(zeros(bins, dtype=x.dtype), 0, cast(pos, dtypes.int64), cast(inside, x.dtype))


@public(torch=True, method=True)
def histogram(x: Tensor, bins=100, *, range=None, weight=None, density: bool = False):  # noqa: A002
    """(hist, bin_edges) as numpy.histogram (eager: the edges may depend on the data)."""
    x._check_concrete("histogram()")
    edges_in = bins.numpy() if isinstance(bins, Tensor) else bins
    w = None if weight is None else weight.numpy()
    hist, edges = np.histogram(x.numpy(), edges_in, range=range, weights=w, density=density)
    return HistogramResult(tensor(hist.astype(x.dtype.np_dtype)),
                           tensor(edges.astype(x.dtype.np_dtype)))


@public(torch=True, method=True, inplace=True)
@opmath
def renorm(x: Tensor, p: float, dim: int, maxnorm: float) -> Tensor:
    """``x`` with each slice along ``dim`` whose ``p``-norm exceeds ``maxnorm`` scaled down to
    that norm (``maxnorm / (norm + 1e-7)``, as torch)."""
    axis = normalize_axis(dim, x.ndim, "renorm")
    others = tuple(d for d in range(x.ndim) if d != axis)
    if p == math.inf:
        norms = amax(abs(x), others, True)
    else:
        norms = pow(sum(pow(abs(x), p), others, True), 1.0 / p)
    factor = where(lt(maxnorm, norms), div(maxnorm, add(norms, 1e-7)), 1.0)
    return _named(mul(x, factor), "RenormBackward0")


@public(torch=True, method=True)
def rot90(x: Tensor, k: int = 1, dims=(0, 1)) -> Tensor:
    """``x`` rotated by 90 degrees ``k`` times in the plane of ``dims``, from the first
    towards the second."""
    if len(dims) != 2:
        raise RuntimeError(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    d0, d1 = (normalize_axis(d, x.ndim, "rot90") for d in dims)
    if d0 == d1:
        raise RuntimeError(f"expected rotation dims to be different, but got dim0 = {d0} and "
                           f"dim1 = {d1}")
    k %= 4
    if k == 1:
        return transpose(flip(x, d1), d0, d1)
    if k == 2:
        return flip(x, (d0, d1))
    if k == 3:
        return flip(transpose(x, d0, d1), d1)
    return x.clone()


@public(torch=True, method=True)
def unique_consecutive(x: Tensor, return_inverse: bool = False, return_counts: bool = False,
                       dim: int | None = None):
    """Each run of equal consecutive elements (or slices along ``dim``) reduced to one, with
    the run index of every element and the run lengths on request (eager)."""
    x._check_concrete("unique_consecutive()")
    a = x.detach().numpy()                  # (its results have no gradient, as torch's)
    axis = 0 if dim is None else normalize_axis(dim, x.ndim, "unique_consecutive")
    b = a.reshape(-1) if dim is None else np.moveaxis(a, axis, 0)
    if b.shape[0] <= 1:
        starts = np.ones(b.shape[0], bool)
    else:
        change = np.any((b[1:] != b[:-1]).reshape(b.shape[0] - 1, -1), axis=1)
        starts = np.concatenate([[True], change])
    run = np.cumsum(starts) - 1
    values = b[starts]
    if dim is not None:
        values = np.moveaxis(values, 0, axis)
    out = [tensor(np.ascontiguousarray(values))]
    if return_inverse:
        out.append(tensor(run.reshape(x.shape if dim is None else (b.shape[0],)).astype(np.int64)))
    if return_counts:
        out.append(tensor(np.diff(np.flatnonzero(np.append(starts, True))).astype(np.int64)))
    return out[0] if len(out) == 1 else tuple(out)


# --------------------------------------------------------------------------- JVP rules
# Forward mode (fusegrad.ops.dual).

no_jvp(mode_index, "an integer result (an index)")


# --------------------------------------------------------------------------- batching rules

from fusegrad.ops.batching import batching, leading_rule  # noqa: E402

batching(mode_index)(leading_rule(mode_index))      # over each example's last axis
