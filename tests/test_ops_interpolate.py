"""F.interpolate and nn.Upsample: values against a per-pixel numpy reference, gradients
against finite differences, compiled against eager, torch as an optional oracle."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad
import fusegrad.nn.functional as NF
from fusegrad.autograd.gradcheck import gradcheck

RNG = np.random.default_rng(11)


def _keys(d: float) -> float:
    """The cubic convolution kernel (Keys, A = -0.75) at distance d."""
    a, d = -0.75, abs(d)
    if d <= 1:
        return ((a + 2) * d - (a + 3)) * d * d + 1
    if d < 2:
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return 0.0


def _resample_1d(v: np.ndarray, out: int, mode: str, align: bool, scale=None) -> np.ndarray:
    """One row, pixel by pixel, from the definitions (torch's source-index convention)."""
    n = len(v)
    res = np.zeros(out)
    for j in range(out):
        if align:
            src = j * (n - 1) / (out - 1) if out > 1 else 0.0
        else:
            s = 1 / scale if scale else n / out
            src = (j + 0.5) * s - 0.5
        if mode == "nearest":
            s = 1 / scale if scale else n / out
            res[j] = v[min(int(math.floor(j * s)), n - 1)]
        elif mode == "linear":
            src = max(src, 0.0)
            i0 = min(int(math.floor(src)), n - 1)
            lam = src - i0
            res[j] = v[i0] * (1 - lam) + v[min(i0 + 1, n - 1)] * lam
        else:
            base = math.floor(src)
            res[j] = sum(_keys(src - (base + k)) * v[min(max(base + k, 0), n - 1)]
                         for k in range(-1, 3))
    return res


def _reference(x: np.ndarray, sizes, mode: str, align: bool, scales=None) -> np.ndarray:
    out = x
    for i, size in enumerate(sizes):
        axis = 2 + i
        scale = scales[i] if scales else None
        out = np.apply_along_axis(_resample_1d, axis, out, size, mode, align, scale)
    return out


CASES = [("linear", (2, 3, 5), (8,)), ("linear", (1, 2, 6), (4,)), ("bilinear", (1, 2, 4, 5), (7, 3)),
         ("bicubic", (1, 2, 4, 5), (6, 9)), ("bicubic", (2, 1, 5, 4), (3, 2)),
         ("trilinear", (1, 1, 2, 3, 4), (3, 5, 2)), ("nearest", (1, 2, 4, 5), (7, 3)),
         ("nearest", (2, 3, 5), (2,))]


@pytest.mark.parametrize("mode,shape,size", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
@pytest.mark.parametrize("align", [False, True])
def test_interpolate_matches_reference(mode, shape, size, align):
    if mode == "nearest" and align:
        pytest.skip("align_corners applies to interpolating modes")
    x = fusegrad.tensor(RNG.standard_normal(shape), requires_grad=True)
    kw = {} if mode == "nearest" else {"align_corners": align}
    out = NF.interpolate(x, size=size, mode=mode, **kw)
    base = {"bilinear": "linear", "trilinear": "linear"}.get(mode, mode).replace("bicubic", "cubic")
    ref = _reference(x.detach().numpy(), size, base, align)
    np.testing.assert_allclose(out.detach().numpy(), ref, rtol=1e-12, atol=1e-12)
    assert gradcheck(lambda t: NF.interpolate(t, size=size, mode=mode, **kw), (x,))


@pytest.mark.parametrize("mode,scale", [("linear", 1.7), ("linear", 0.5), ("nearest", 2.5),
                                        ("nearest", 0.4)])
def test_interpolate_scale_factor_uses_the_given_scale(mode, scale):
    x = fusegrad.tensor(RNG.standard_normal((1, 2, 5)))
    out = NF.interpolate(x, scale_factor=scale, mode=mode)
    n = int(math.floor(5 * scale))
    assert tuple(out.shape) == (1, 2, n)
    np.testing.assert_allclose(out.numpy(), _reference(x.numpy(), (n,), mode, False, (scale,)),
                               rtol=1e-12)
    again = NF.interpolate(x, scale_factor=scale, mode=mode, recompute_scale_factor=True)
    np.testing.assert_allclose(again.numpy(), _reference(x.numpy(), (n,), mode, False),
                               rtol=1e-12)


def test_interpolate_unchanged_dim_follows_torch_kernels():
    """A scale_factor that leaves a dim's size unchanged (9 * 1.05 -> 9): torch's linear
    kernels and its 2-D 'nearest' copy that dim, which also maps a doubled dim (10 * 2.05 ->
    20) to index // 2; 'nearest-exact', 'bicubic' and 1-D / 3-D 'nearest' resample by the
    factor."""
    x = RNG.standard_normal((1, 2, 10, 9))
    t = fusegrad.tensor(x)
    for mode in ("bilinear", "nearest"):
        out = NF.interpolate(t, scale_factor=(1.1, 1.05), mode=mode)
        ref = _reference(x, (11,), {"bilinear": "linear"}.get(mode, mode), False, (1.1,))
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12)
    doubled = NF.interpolate(t, scale_factor=(2.05, 1.0), mode="nearest")
    np.testing.assert_array_equal(doubled.numpy(), x[:, :, np.arange(20) // 2])
    exact = NF.interpolate(t, scale_factor=(1.0, 1.1), mode="nearest-exact")
    index = np.minimum(np.floor((np.arange(9) + 0.5) / 1.1), 8).astype(np.int64)
    np.testing.assert_array_equal(exact.numpy(), x[..., index])
    row = RNG.standard_normal((1, 2, 9))
    out = NF.interpolate(fusegrad.tensor(row), scale_factor=1.05, mode="nearest")
    np.testing.assert_allclose(out.numpy(), _reference(row, (9,), "nearest", False, (1.05,)))
    vol = RNG.standard_normal((1, 1, 4, 5, 3))
    out = NF.interpolate(fusegrad.tensor(vol), scale_factor=(2.05, 1.05, 1.0), mode="nearest")
    np.testing.assert_allclose(out.numpy(), _reference(vol, (8, 5, 3), "nearest", False,
                                                       (2.05, 1.05, 1.0)))


def test_interpolate_float32_compiled_and_upsample_module():
    x = fusegrad.tensor(RNG.standard_normal((2, 3, 4, 5)).astype(np.float32))
    for mode in ("nearest", "bilinear", "bicubic"):
        kw = {} if mode == "nearest" else {"align_corners": False}
        f = fusegrad.compile(lambda t, m=mode, k=kw: NF.interpolate(t, scale_factor=2, mode=m,
                                                                    **k) * 2)
        eager = NF.interpolate(x, scale_factor=2, mode=mode, **kw) * 2
        np.testing.assert_allclose(f(x).numpy(), eager.numpy(), rtol=1e-6, atol=1e-6)
        ref = _reference(x.numpy().astype(np.float64), (8, 10),
                         {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode), False,
                         (2.0, 2.0)) * 2
        np.testing.assert_allclose(eager.numpy(), ref, rtol=1e-5, atol=1e-5)
    up = fusegrad.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
    np.testing.assert_allclose(up(x).numpy(), NF.interpolate(x, scale_factor=2, mode="bilinear",
                                                             align_corners=True).numpy())
    assert "scale_factor=2.0, mode='bilinear'" in repr(up)
    np.testing.assert_array_equal(fusegrad.nn.UpsamplingNearest2d(size=(6, 7))(x).numpy(),
                                  NF.interpolate(x, (6, 7)).numpy())
    np.testing.assert_array_equal(fusegrad.nn.UpsamplingBilinear2d(scale_factor=2)(x).numpy(),
                                  up(x).numpy())
    area = NF.interpolate(x, size=(2, 5), mode="area")
    np.testing.assert_allclose(area.numpy(), x.numpy().reshape(2, 3, 2, 2, 5).mean(3), rtol=1e-6)

    def loss(t):
        return (NF.interpolate(t, size=(5, 3), mode="bicubic", align_corners=True) ** 2).sum()
    x64 = fusegrad.tensor(RNG.standard_normal((1, 2, 4, 5)))
    np.testing.assert_allclose(fusegrad.compile(fusegrad.grad(loss))(x64).numpy(),
                               fusegrad.grad(loss)(x64).numpy(), rtol=1e-12)


def test_interpolate_errors():
    x = fusegrad.zeros(1, 2, 4, 4)
    with pytest.raises(NotImplementedError, match="Got 4D input, but linear mode needs 3D input"):
        NF.interpolate(x, size=3, mode="linear")
    with pytest.raises(ValueError, match="align_corners option can only be set"):
        NF.interpolate(x, size=3, mode="nearest", align_corners=True)
    with pytest.raises(ValueError, match="only one of size or scale_factor"):
        NF.interpolate(x, size=3, scale_factor=2)
    with pytest.raises(ValueError, match="either size or scale_factor"):
        NF.interpolate(x)
    with pytest.raises(ValueError, match="same number of spatial dimensions"):
        NF.interpolate(x, size=(2, 3, 4))


def test_interpolate_against_torch():
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((2, 3, 5, 6))
    for mode in ("nearest", "nearest-exact", "bilinear", "bicubic", "area"):
        for align in ((None,) if mode in ("nearest", "nearest-exact", "area") else (False, True)):
            for kw in ({"size": (7, 4)}, {"scale_factor": 1.5}, {"scale_factor": (0.6, 2.2)}):
                if mode == "area" and "scale_factor" in kw:
                    continue
                a = fusegrad.tensor(x, requires_grad=True)
                b = torch.tensor(x, requires_grad=True)
                ya = NF.interpolate(a, mode=mode, align_corners=align, **kw)
                yb = torch.nn.functional.interpolate(b, mode=mode, align_corners=align, **kw)
                np.testing.assert_allclose(ya.detach().numpy(), yb.detach().numpy(), rtol=1e-12,
                                           atol=1e-12)
                w = np.cos(np.arange(yb.numel())).reshape(yb.shape)
                (ya * fusegrad.tensor(w)).sum().backward()
                (yb * torch.tensor(w)).sum().backward()
                np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-12,
                                           atol=1e-12)


U8 = [[[[0, 37, 255, 128, 9], [200, 3, 77, 250, 64], [15, 99, 180, 1, 255]]]]


@pytest.mark.parametrize("compiled", [False, True])
def test_interpolate_bilinear_uint8_is_torchs_fixed_point_kernel(compiled):
    # torch's values (it raised "not implemented for 'uint8'"): two int16 fixed-point passes,
    # width first, each rounded to uint8, so not float interpolation rounded once ([2][1]: 70,
    # where float32 rounds to 69)
    def f(x, **kw):
        return NF.interpolate(x, mode="bilinear", **kw)
    run = fusegrad.compile(f) if compiled else f
    x = fusegrad.tensor(U8, dtype=fusegrad.uint8)
    y = run(x, size=(2, 3))
    assert y.dtype is fusegrad.uint8 and y.tolist() == [[[[43, 211, 68], [66, 154, 159]]]]
    assert run(x, size=(4, 7), align_corners=True).tolist() == [[[
        [0, 25, 110, 255, 170, 88, 9], [133, 54, 55, 136, 185, 155, 46],
        [138, 70, 61, 111, 148, 154, 128], [15, 71, 126, 180, 61, 86, 255]]]]
    assert run(x, scale_factor=0.5).tolist() == [[[[61, 178]]]]
    assert run(x, size=(3, 5)).tolist() == U8
