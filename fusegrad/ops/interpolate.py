"""``F.interpolate``: resampling of (N, C, *spatial) by nearest, (bi/tri)linear and bicubic
interpolation, one spatial dim at a time.

Along each dim the source positions and weights are computed once (they depend only on the
shapes), and the result is a weighted sum of ``take``s of the input at the neighbouring
indices: a composition of primitives, so it is traced, differentiated (the ``take``s' VJPs
scatter the gradient back) and compiled like any other op. Positions follow torch's
``area_pixel_compute_source_index`` and the cubic weights its ``upsample_bicubic2d`` (A =
-0.75), computed in float64 and rounded once to the input's dtype. uint8 bilinear input takes
torch's integer path instead (fixed-point weights, one rounded pass per dim), whose values
differ from float interpolation by one here and there.
"""

from __future__ import annotations

import math

import numpy as np

from fusegrad import dtypes
from fusegrad.ops.elementwise import add, clamp, floor_divide, mul
from fusegrad.ops.movement import reshape
from fusegrad.ops.operands import _index_tensor, cast, take
from fusegrad.ops.pooling import adaptive_avg_pool1d, adaptive_avg_pool2d
from fusegrad.tensor import Tensor

_MODE_DIMS = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}
_CUBIC_A = -0.75


def _source_scale(in_size: int, out_size: int, align_corners: bool, scale) -> float:
    if align_corners:
        return (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else in_size / out_size


def _nearest_index(in_size: int, out_size: int, scale, exact: bool,
                   size_shortcuts: bool = False) -> np.ndarray:
    # torch's 2-D 'nearest' kernel keeps the index of a dim whose size is unchanged and halves
    # that of a doubled one whatever scale_factor says; its 1-D and 3-D kernels and
    # 'nearest-exact' always resample by the factor.
    if size_shortcuts and out_size in (in_size, 2 * in_size):
        return np.arange(out_size, dtype=np.int64) // (out_size // in_size)
    s = _source_scale(in_size, out_size, False, scale)
    dst = np.arange(out_size, dtype=np.float64)
    # torch computes these in float (floorf of a float product)
    d32, s32 = dst.astype(np.float32), np.float32(s)
    src = np.floor((d32 + np.float32(0.5)) * s32) if exact else np.floor(d32 * s32)
    return np.minimum(src.astype(np.int64), in_size - 1)


def _source_positions(in_size, out_size, align_corners, scale, cubic: bool) -> np.ndarray:
    s = _source_scale(in_size, out_size, align_corners, scale)
    dst = np.arange(out_size, dtype=np.float64)
    if align_corners:
        return s * dst
    src = s * (dst + 0.5) - 0.5
    return src if cubic else np.maximum(src, 0.0)


def _linear_taps(in_size, out_size, align_corners, scale):
    src = _source_positions(in_size, out_size, align_corners, scale, cubic=False)
    i0 = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    i1 = np.minimum(i0 + 1, in_size - 1)
    lam = src - i0
    return [(i0, 1.0 - lam), (i1, lam)]


def _cubic_taps(in_size, out_size, align_corners, scale):
    src = _source_positions(in_size, out_size, align_corners, scale, cubic=True)
    x0 = np.floor(src)
    t = src - x0
    a = _CUBIC_A

    def near(d):   # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):    # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    weights = [far(t + 1), near(t), near(1 - t), far(2 - t)]
    base = x0.astype(np.int64)
    return [(np.clip(base + k - 1, 0, in_size - 1), w) for k, w in enumerate(weights)]


def _uint8_linear_taps(in_size, out_size, align_corners, scale):
    """torch's uint8 (bi)linear weights: float64 weights normalised per output, then rounded to
    int16 fixed point with the most fraction bits that keep the largest weight under 2**15
    (Pillow's resampling, which torch's uint8 kernels follow); the taps and those bits."""
    s = _source_scale(in_size, out_size, align_corners, scale)
    idx = np.zeros((2, out_size), dtype=np.int64)
    w = np.zeros((2, out_size))
    for i in range(out_size):
        # torch's window centre; align_corners maps corner centres (i -> s * i)
        center = s * i + 0.5 if align_corners else s * (i + 0.5)
        lo = max(int(center - 0.5), 0)
        count = min(min(int(center + 1.5), in_size) - lo, 2)
        taps = [max(1.0 - abs(j + lo - center + 0.5), 0.0) for j in range(count)]
        total = sum(taps)
        for j, t in enumerate(taps):
            idx[j, i], w[j, i] = lo + j, t / total if total else 0.0
        idx[count:, i] = lo
    bits = 0
    while bits < 22 and int(0.5 + w.max() * (1 << (bits + 1))) < (1 << 15):
        bits += 1
    fixed = np.floor(w * (1 << bits) + 0.5).astype(np.int32)
    return [(idx[0], fixed[0]), (idx[1], fixed[1])], bits


def _resample_axis_uint8(x: Tensor, axis: int, in_size, out_size, align_corners, scale) -> Tensor:
    """One pass of torch's uint8 bilinear resampling: an int32 weighted sum of the two taps,
    rounded (half up) back to the fixed point's integer part and clamped to [0, 255]."""
    taps, bits = _uint8_linear_taps(in_size, out_size, align_corners, scale)
    wide = cast(x, dtypes.int32)
    out = None
    for idx, w in taps:
        shape = [1] * x.ndim
        shape[axis] = len(idx)
        term = mul(take(wide, _index_tensor(idx), axis), Tensor._wrap(w.reshape(shape), dtypes.int32))
        out = term if out is None else add(out, term)
    out = floor_divide(add(out, 1 << (bits - 1)), 1 << bits)
    return cast(clamp(out, 0, 255), dtypes.uint8)


def _resample_axis(x: Tensor, axis: int, taps) -> Tensor:
    """``sum_k w_k * x[..., idx_k, ...]`` along ``axis``, weights broadcast along it."""
    out = None
    for idx, w in taps:
        shape = [1] * x.ndim
        shape[axis] = len(idx)
        weight = Tensor._wrap(np.asarray(w, dtype=x.dtype.np_dtype).reshape(shape), x.dtype)
        term = mul(take(x, _index_tensor(idx), axis), weight)
        out = term if out is None else add(out, term)
    return out


def _output_sizes(x: Tensor, nd: int, size, scale_factor, recompute_scale_factor):
    spatial = tuple(x.shape[2:])
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is not None:
        sizes = tuple(size) if isinstance(size, (list, tuple)) else (size,) * nd
        if len(sizes) != nd:
            raise ValueError(f"Input and output must have the same number of spatial dimensions, "
                             f"but got input with spatial dimensions of {list(spatial)} and output "
                             f"size of {list(sizes)}. Please provide input tensor in (N, C, d1, "
                             f"d2, ...,dK) format and output size in (o1, o2, ...,oK) format.")
        return tuple(int(s) for s in sizes), (None,) * nd
    if scale_factor is None:
        raise ValueError("either size or scale_factor should be defined")
    scales = tuple(scale_factor) if isinstance(scale_factor, (list, tuple)) else \
        (scale_factor,) * nd
    if len(scales) != nd:
        raise ValueError(f"Input and scale_factor must have the same number of spatial "
                         f"dimensions, but got input with spatial dimensions of {list(spatial)} "
                         f"and scale_factor of shape {list(scales)}. Please provide input tensor "
                         f"in (N, C, d1, d2, ...,dK) format and scale_factor in (s1, s2, ...,sK) "
                         f"format.")
    sizes = tuple(int(math.floor(float(d) * float(s))) for d, s in zip(spatial, scales))
    # recompute_scale_factor: positions come from the sizes, not from the given factors.
    return sizes, ((None,) * nd if recompute_scale_factor else tuple(float(s) for s in scales))


def interpolate(input: Tensor, size=None, scale_factor=None, mode: str = "nearest",  # noqa: A002
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> Tensor:
    """Resample (N, C, *spatial) to ``size`` or by ``scale_factor``.

    ``mode``: 'nearest', 'nearest-exact', 'linear' (3-D input), 'bilinear', 'bicubic' (4-D),
    'trilinear' (5-D), 'area' (adaptive average pooling, 3-D and 4-D). ``align_corners``
    (interpolating modes only) maps the corner pixels' centres onto each other.
    """
    x = input
    nd = x.ndim - 2
    if antialias:
        raise NotImplementedError("interpolate(antialias=True) is not supported")
    interpolating = mode in _MODE_DIMS
    if align_corners is not None and not interpolating:
        raise ValueError("align_corners option can only be set with the interpolating modes: "
                         "linear | bilinear | bicubic | trilinear")
    if mode not in ("nearest", "nearest-exact", "area") and not interpolating:
        raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got "
                                  f"{x.ndim}D) for the modes: nearest | linear | bilinear | "
                                  f"bicubic | trilinear | area | nearest-exact (got {mode})")
    if nd < 1 or nd > 3:
        raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got "
                                  f"{x.ndim}D) for the modes: nearest | linear | bilinear | "
                                  f"bicubic | trilinear | area | nearest-exact (got {mode})")
    if interpolating and _MODE_DIMS[mode] != nd:
        need = _MODE_DIMS[mode] + 2
        raise NotImplementedError(f"Got {x.ndim}D input, but {mode} mode needs {need}D input")
    uint8_bilinear = mode == "bilinear" and x.dtype is dtypes.uint8
    if interpolating and not x.dtype.is_floating_point and not uint8_bilinear:
        raise RuntimeError(f"\"upsample_{mode}{nd}d_out_frame\" not implemented for "
                           f"'{x.dtype.name}'")
    sizes, scales = _output_sizes(x, nd, size, scale_factor, recompute_scale_factor)
    if mode == "area":
        if nd == 1:
            return adaptive_avg_pool1d(x, sizes)
        if nd == 2:
            return adaptive_avg_pool2d(x, sizes)
        raise NotImplementedError("interpolate(mode='area') supports 3-D and 4-D input")
    out = x
    if uint8_bilinear:
        # torch's uint8 kernel: fixed-point passes, each rounded to uint8, width first
        for axis in (3, 2):
            n_in, n_out, scale = x.shape[axis], sizes[axis - 2], scales[axis - 2]
            if n_in != n_out:
                out = _resample_axis_uint8(out, axis, n_in, n_out, bool(align_corners), scale)
        return out if out is not x else reshape(x, tuple(x.shape))
    for i, (n_in, n_out, scale) in enumerate(zip(x.shape[2:], sizes, scales)):
        axis = 2 + i
        # torch's linear kernels copy a dim whose size does not change whatever scale_factor
        # says (so does its 2-D 'nearest', see _nearest_index); the others resample it.
        if n_in == n_out and (mode in ("linear", "bilinear", "trilinear") or scale is None
                              or scale == 1.0):
            continue   # the identity resampling
        if mode.startswith("nearest"):
            index = _nearest_index(n_in, n_out, scale, mode == "nearest-exact",
                                   size_shortcuts=mode == "nearest" and nd == 2)
            out = take(out, _index_tensor(index), axis)
            continue
        taps = (_cubic_taps if mode == "bicubic" else _linear_taps)(
            n_in, n_out, bool(align_corners), scale)
        out = _resample_axis(out, axis, taps)
    if out is x:
        out = reshape(x, tuple(x.shape))
    return out


def upsample(input: Tensor, size=None, scale_factor=None, mode: str = "nearest",  # noqa: A002
             align_corners: bool | None = None) -> Tensor:
    """Deprecated in torch in favour of :func:`interpolate`, which it calls."""
    return interpolate(input, size, scale_factor, mode, align_corners)
