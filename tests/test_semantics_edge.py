"""Eager semantics at the edges, against references derived from torch's definitions.

fmod and remainder are exact (an fmod of two floats is representable, so the float64 value
of np.fmod, cast back, is the exact answer); floor_divide is torch's ``div_floor_floating``;
float-to-int casts are torch's on x86 (see ``prims.float_to_int_wide``); gradients at NaN,
ties and bounds are torch's VJP formulas. An optional test compares with torch itself.
"""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest

import fusegrad as fg
from fusegrad import dtypes

FLOATS = (fg.float32, fg.float64, fg.float16, fg.bfloat16)
INTS = (fg.int8, fg.uint8, fg.int16, fg.int32, fg.int64)
INF, NAN = math.inf, math.nan

EDGE = (0.0, -0.0, 1.0, -1.0, 0.1, -0.1, 3.0, -3.0, 7.5, -7.5, 0.5, 1e30, -1e30, 1e10,
        123456789.0, 65504.0, 1e-30, 1e-45, 2.0 ** 24 + 1, INF, -INF, NAN)


def edge_pairs(dtype):
    """Every pair of EDGE values in ``dtype`` (overflowing values become +-inf there)."""
    pairs = np.array(list(itertools.product(EDGE, EDGE)))
    with np.errstate(over="ignore"):
        return pairs[:, 0].astype(dtype.np_dtype), pairs[:, 1].astype(dtype.np_dtype)


def f64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64)


def assert_bitwise(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """Equal values, equal signs of zero, NaN where NaN."""
    got, want = f64(np.asarray(got)), f64(np.asarray(want))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{what}: NaN mask")
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok], want[ok], err_msg=what)
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]),
                                  err_msg=f"{what}: sign of zero")


def ref_fmod(x, y):
    with np.errstate(invalid="ignore"):
        return np.fmod(f64(x), f64(y)).astype(x.dtype)


def ref_remainder(x, y):
    # torch: mod = fmod(x, y); mod += y where mod != 0 and the signs of mod and y differ.
    # In float64 the sum of two float32 (or 16-bit) values rounds once, as in float32.
    with np.errstate(invalid="ignore"):
        mod = np.fmod(f64(x), f64(y))
        fix = (mod != 0) & ((f64(y) < 0) != (mod < 0))
        return np.where(fix, mod + f64(y), mod).astype(x.dtype)


def ref_floor_divide(x, y):
    """torch's div_floor_floating (ATen/native/BinaryOps.h), computed in x's type (float32
    for 16-bit types, as torch's CPU kernels do), rounded back."""
    out_dtype = x.dtype
    if x.dtype in (np.float16, ml_dtypes.bfloat16):
        x, y = x.astype(np.float32), y.astype(np.float32)
    out = np.empty_like(x)
    with np.errstate(all="ignore"):
        for i, (a, b) in enumerate(zip(x, y)):
            if b == 0:
                out[i] = a / b
                continue
            mod = np.fmod(a, b)
            div = (a - mod) / b
            if mod != 0 and (b < 0) != (mod < 0):
                div -= 1
            if div != 0:
                fl = np.floor(div)
                if div - fl > 0.5:
                    fl += 1
                out[i] = fl
            else:
                out[i] = np.copysign(0, a / b)
    return out.astype(out_dtype)


# --------------------------------------------------------------------------- fmod, %, //


def test_fmod_issue_repro():
    x = fg.tensor([1e30, -1e30, 1e10, 123456789, 1, -1])
    y = fg.tensor([3, 7, 3, 0.1, INF, -INF])
    got = fg.fmod(x, y).numpy()
    np.testing.assert_array_equal(got, ref_fmod(x.numpy(), y.numpy()))
    np.testing.assert_allclose(got, [0, -1, 1, 0.0603505, 1, -1], rtol=1e-5)


def test_floor_divide_issue_repro():
    got = (fg.tensor([1.0, INF, 1.0, -1.0, 1.0]) // fg.tensor([-INF, 1.0, 0.1, 0.1, 0.0])).numpy()
    assert_bitwise(got, np.array([-1.0, NAN, 9.0, -10.0, INF], np.float32))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", ["fmod", "remainder", "floor_divide"])
def test_float_division_family_edges(name, dtype):
    x, y = edge_pairs(dtype)
    op = {"fmod": fg.fmod, "remainder": fg.remainder, "floor_divide": fg.floor_divide}[name]
    ref = {"fmod": ref_fmod, "remainder": ref_remainder, "floor_divide": ref_floor_divide}[name]
    out = op(fg.from_numpy(x), fg.from_numpy(y))
    assert out.dtype is dtype
    assert_bitwise(out.numpy(), ref(x, y), f"{name} {dtype}")


def test_remainder_zero_keeps_the_sign_of_x():
    # torch's rule (numpy's np.remainder gives the zero the sign of y instead).
    got = fg.remainder(fg.tensor([3.0, -3.0, 0.0, -0.0]), fg.tensor([-1.0, 1.0, -2.0, 2.0]))
    assert_bitwise(got.numpy(), np.array([0.0, -0.0, 0.0, -0.0], np.float32))


def _wrap(v: int, dtype) -> int:
    bits = dtype.itemsize * 8
    v %= 2 ** bits
    return v - 2 ** bits if dtype.is_signed and v >= 2 ** (bits - 1) else v


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integer_division_family(dtype):
    info = np.iinfo(dtype.np_dtype)
    xs = [7, -7, 0, 1, -1, 100, -100, int(info.min), int(info.max)]
    ys = [2, -2, 3, -3, 1, -1, 7, int(info.max)]
    pairs = [(_wrap(a, dtype), _wrap(b, dtype)) for a in xs for b in ys]
    pairs = [(a, b) for a, b in pairs if b != 0]
    x = fg.tensor([a for a, _ in pairs], dtype=dtype)
    y = fg.tensor([b for _, b in pairs], dtype=dtype)
    floor = [_wrap(a // b, dtype) for a, b in pairs]          # INT_MIN // -1 wraps
    mod = [a - b * (a // b) for a, b in pairs]                  # Python's %: sign of b
    trunc_mod = [int(math.copysign(abs(a) % abs(b), a)) if abs(a) % abs(b) else 0
                 for a, b in pairs]                             # C's %: sign of a
    assert (x // y).tolist() == floor
    assert (x % y).tolist() == mod
    assert fg.fmod(x, y).tolist() == trunc_mod


@pytest.mark.parametrize("name", ["floor_divide", "remainder", "fmod"])
def test_integer_division_by_zero_raises(name):
    op = {"floor_divide": fg.floor_divide, "remainder": fg.remainder, "fmod": fg.fmod}[name]
    with pytest.raises(ZeroDivisionError, match="ZeroDivisionError"):
        op(fg.tensor([1, 2], dtype=fg.int32), fg.tensor([1, 0], dtype=fg.int32))
    with pytest.raises(ZeroDivisionError):
        op(fg.tensor([1, 2]), 0)


def test_fmod_and_remainder_gradients():
    # torch: d/dx = 1; d/dy = -trunc(x / y) for fmod, -floor(x / y) for remainder.
    xs, ys = [5.0, -5.0, 1e30, 1.0, 7.5], [3.0, 3.0, 3.0, INF, -2.0]
    for op, rounding in ((fg.fmod, np.trunc), (fg.remainder, np.floor)):
        x = fg.tensor(xs, requires_grad=True)
        y = fg.tensor(ys, requires_grad=True)
        op(x, y).sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), np.ones(5, np.float32))
        want = -rounding(np.float32(xs) / np.float32(ys))
        assert_bitwise(y.grad.numpy(), want.astype(np.float32), op.__name__)


def test_floor_divide_has_zero_gradient():
    x = fg.tensor([5.0, -5.0], requires_grad=True)
    (x // 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0])


# --------------------------------------------------------------------------- casts

CAST_VALUES = (NAN, INF, -INF, 3e9, -3e9, 1e20, -1e20, 300.0, -300.0, -2.0, 255.9, 256.0,
               65536.0, 70000.5, -1.5, 2.0 ** 31, -(2.0 ** 31), 2.0 ** 63, -(2.0 ** 63),
               2.0 ** 32 + 5, 40000.0, -40000.0, 0.0, -0.0, 0.99)


def ref_float_to_int(values: np.ndarray, dtype) -> list:
    """torch on x86: truncate to int32 (int8/int16/int32) or int64 (int64, uint8), INT_MIN of
    that type for NaN, Inf and out of range, then keep the low bits."""
    bits = 64 if dtype in (fg.int64, fg.uint8, dtypes.uint32) else 32
    out = []
    for v in f64(values.astype(np.float32) if values.dtype == ml_dtypes.bfloat16 else values):
        inside = -(2.0 ** (bits - 1)) <= v < 2.0 ** (bits - 1)
        out.append(_wrap(int(v) if inside else -(2 ** (bits - 1)), dtype))
    return out


@pytest.mark.parametrize("src", FLOATS, ids=str)
@pytest.mark.parametrize("dst", INTS + (dtypes.uint32,), ids=str)
def test_float_to_int_cast(src, dst):
    with np.errstate(over="ignore"):
        values = np.array(CAST_VALUES).astype(src.np_dtype)
    got = fg.from_numpy(values).to(dst)
    assert got.dtype is dst
    assert got.tolist() == ref_float_to_int(values, dst)


def test_cast_spot_values_seen_in_torch():
    f32 = fg.tensor([300.0, -2.0, NAN, 3e9])
    assert f32.to(fg.int8).tolist()[0] == 44
    assert f32.to(fg.uint8).tolist()[1] == 254
    assert f32.to(fg.int32).tolist()[2:] == [-2 ** 31, -2 ** 31]
    assert f32.to(fg.int16).tolist()[3] == 0          # via int32: INT_MIN's low bits
    assert f32.to(fg.int64).tolist()[2:] == [-2 ** 63, 3000000000]
    assert fg.tensor([2.0 ** 32 + 5], dtype=fg.float64).to(fg.uint8).tolist() == [5]
    assert fg.tensor([NAN, -0.0, 0.5]).to(fg.bool).tolist() == [True, False, True]


# --------------------------------------------------------------------------- sign, abs, clamp


def test_sign_of_nan_is_zero():
    # torch: (0 < x) - (x < 0), so NaN and -0. give +0.
    for dt in FLOATS:
        got = fg.tensor([NAN, -0.0, 2.0, -INF], dtype=dt).sign().numpy()
        assert_bitwise(got, np.array([0.0, 0.0, 1.0, -1.0], np.float32), str(dt))


def grads(fn, *columns):
    ts = [fg.tensor(c, requires_grad=True) for c in columns]
    fn(*ts).sum().backward()
    return [t.grad.numpy() for t in ts]


X = [NAN, 0.0, -0.0, 1.0, -1.0, INF, -INF, 2.0, 0.5]


def test_abs_gradient_is_zero_at_nan_and_zero():
    (g,) = grads(fg.abs, X)
    np.testing.assert_array_equal(g, np.sign(np.nan_to_num(np.array(X), nan=0.0)))


def test_clamp_scalar_values_and_gradients():
    x = np.array(X, np.float32)
    for lo, hi in ((0.0, 1.0), (0.0, None), (None, 1.0), (2.0, 1.0)):
        t = fg.tensor(x, requires_grad=True)
        out = t.clamp(lo, hi)
        out.sum().backward()
        want = x.copy()
        inside = np.ones(x.shape, bool)
        if lo is not None:
            want = np.where(want < lo, np.float32(lo), want)
            inside &= x >= lo
        if hi is not None:
            want = np.where(want > hi, np.float32(hi), want)
            inside &= x <= hi
        assert_bitwise(out.detach().numpy(), want, f"clamp({lo}, {hi})")
        # torch's clamp_backward: the gradient passes where lo <= x <= hi (0 at NaN)
        np.testing.assert_array_equal(t.grad.numpy(), inside.astype(np.float32))
    t = fg.tensor(x, requires_grad=True)
    out = t.clamp(min=NAN)
    out.sum().backward()
    assert np.isnan(out.detach().numpy()).all() and not t.grad.numpy().any()


def test_clamp_tensor_bounds_follow_torch_masks():
    x = np.array([NAN, NAN, 0.0, -0.0, 1.0, -1.0, INF, -INF, 2.0, 0.5], np.float32)
    lo = np.array([0.0, 0.0, NAN, 0.0, 1.0, -2.0, 0.0, 0.0, 3.0, 0.5], np.float32)
    hi = np.array([1.0, 1.0, 1.0, NAN, 1.0, -3.0, 0.0, 1.0, 1.0, 0.5], np.float32)
    ts = [fg.tensor(a, requires_grad=True) for a in (x, lo, hi)]
    out = ts[0].clamp(ts[1], ts[2])
    out.sum().backward()
    with np.errstate(invalid="ignore"):
        v = np.where(x < lo, lo, x)
        v = np.where(hi < v, hi, v)
        v = np.where(np.isnan(lo) | np.isnan(hi), np.nan, v)
        masks = ((lo <= x) & (x <= hi), (x < lo) & (lo < hi), (x > hi) | (hi < lo))
    assert_bitwise(out.detach().numpy(), v.astype(np.float32), "clamp value")
    for t, m in zip(ts, masks):
        np.testing.assert_array_equal(t.grad.numpy(), m.astype(np.float32))
    # one bound only: x gets lo <= x, lo gets x < lo (and the same for hi)
    a, b = fg.tensor(x, requires_grad=True), fg.tensor(lo, requires_grad=True)
    out = a.clamp(min=b)
    out.sum().backward()
    with np.errstate(invalid="ignore"):
        want = np.where(np.isnan(lo), np.nan, np.where(x < lo, lo, x))
        np.testing.assert_array_equal(a.grad.numpy(), (lo <= x).astype(np.float32))
        np.testing.assert_array_equal(b.grad.numpy(), (x < lo).astype(np.float32))
    assert_bitwise(out.detach().numpy(), want.astype(np.float32), "clamp(min=tensor)")
    a, c = fg.tensor(x, requires_grad=True), fg.tensor(hi, requires_grad=True)
    a.clamp(max=c).sum().backward()
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(a.grad.numpy(), (x <= hi).astype(np.float32))
        np.testing.assert_array_equal(c.grad.numpy(), (hi < x).astype(np.float32))


@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_minimum_gradients_at_nan_and_ties(op):
    x = np.array([NAN, -NAN, 0.0, -0.0, 1.0, -1.0, INF, -INF, 2.0], np.float32)
    y = np.array([1.0, NAN, 0.0, 0.0, 1.0, NAN, INF, 2.0, 0.5], np.float32)
    gx, gy = grads(getattr(fg, op), x, y)
    # torch: where(x == y, g / 2, g), zeroed where the operand loses; NaN loses nowhere.
    with np.errstate(invalid="ignore"):
        x_loses = x < y if op == "maximum" else x > y
        y_loses = y < x if op == "maximum" else y > x
        share = np.where(x == y, 0.5, 1.0)
    np.testing.assert_array_equal(gx, np.where(x_loses, 0.0, share).astype(np.float32))
    np.testing.assert_array_equal(gy, np.where(y_loses, 0.0, share).astype(np.float32))


# --------------------------------------------------------------------------- torch itself


def test_against_torch():
    """The same edges in torch, where installed (the tests above hold without it)."""
    torch = pytest.importorskip("torch")
    tt = {fg.float32: torch.float32, fg.float64: torch.float64, fg.float16: torch.float16,
          fg.bfloat16: torch.bfloat16}
    for dt in FLOATS:
        x, y = edge_pairs(dt)
        # torch's vectorized float32 fmod gives NaN for divisors below about 1e-28 (its
        # SLEEF fmodf); fusegrad keeps IEEE fmod there, as float64 torch does.
        keep = ~(np.abs(f64(y)) < 1e-20) | (y == 0)
        x, y = x[keep], y[keep]
        tx, ty = (torch.from_numpy(f64(a)).to(tt[dt]) for a in (x, y))
        for name in ("fmod", "remainder", "floor_divide"):
            got = getattr(fg, name)(fg.from_numpy(x), fg.from_numpy(y)).numpy()
            want = getattr(torch, name)(tx, ty).double().numpy()
            assert_bitwise(got, want, f"{name} {dt}")
        values = np.array(CAST_VALUES, np.float64)
        with np.errstate(over="ignore"):
            values = values.astype(dt.np_dtype)
        for dst, tdst in ((fg.int8, torch.int8), (fg.uint8, torch.uint8), (fg.int16, torch.int16),
                          (fg.int32, torch.int32), (fg.int64, torch.int64), (fg.bool, torch.bool)):
            want = torch.from_numpy(f64(values)).to(tt[dt]).to(tdst).tolist()
            assert fg.from_numpy(values).to(dst).tolist() == want, (dt, dst)
