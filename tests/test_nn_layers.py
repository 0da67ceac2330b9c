"""Layers added for torch parity: the padding modules, pixel (un)shuffle, GLU, Softmin,
Threshold, CosineSimilarity, PairwiseDistance, Bilinear: values against numpy, gradients
against finite differences, printed like torch, compiled against eager."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad
from fusegrad import nn
from fusegrad.autograd.gradcheck import gradcheck
from fusegrad.nn import functional as NF

RNG = np.random.default_rng(21)


def t64(*shape):
    return fusegrad.tensor(RNG.standard_normal(shape), requires_grad=True)


PAD_MODES = {"Zero": "constant", "Constant": "constant", "Reflection": "reflect",
             "Replication": "edge", "Circular": "wrap"}


@pytest.mark.parametrize("kind", list(PAD_MODES))
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_padding_modules_match_numpy(kind, nd):
    padding = (1, 2, 0, 1, 2, 1)[:2 * nd]
    args = (padding, 0.5) if kind == "Constant" else (padding,)
    m = getattr(nn, f"{kind}Pad{nd}d")(*args)
    x = t64(*(2, 3, 4, 3, 5)[:nd + 2])
    widths = [(0, 0), (0, 0)] + [(padding[2 * i], padding[2 * i + 1]) for i in range(nd)][::-1]
    extra = {"constant_values": 0.5 if kind == "Constant" else 0.0} if kind in ("Zero",
                                                                               "Constant") else {}
    ref = np.pad(x.detach().numpy(), widths, mode=PAD_MODES[kind], **extra)
    np.testing.assert_array_equal(m(x).detach().numpy(), ref)
    np.testing.assert_array_equal(m(x[0]).detach().numpy(), ref[0])   # unbatched
    assert gradcheck(m, (x,))
    # a number pads every side by it
    same = getattr(nn, f"{kind}Pad{nd}d")(*((1, 0.5) if kind == "Constant" else (1,)))
    assert same.padding == (1,) * (2 * nd)


def test_padding_module_repr_and_checks():
    assert repr(nn.ZeroPad2d(1)) == "ZeroPad2d((1, 1, 1, 1))"
    assert repr(nn.ConstantPad1d((1, 2), 3)) == "ConstantPad1d(padding=(1, 2), value=3)"
    assert repr(nn.ReflectionPad3d(2)) == "ReflectionPad3d((2, 2, 2, 2, 2, 2))"
    assert repr(nn.CircularPad1d([1, 0])) == "CircularPad1d((1, 0))"
    with pytest.raises(ValueError, match=r"expected 3D or 4D input \(got 2D input\)"):
        nn.CircularPad2d(1)(fusegrad.zeros(3, 3))
    # negative constant padding crops
    x = fusegrad.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(nn.ZeroPad1d((-1, 1))(x).numpy(), [[1, 2, 0], [4, 5, 0]])


def test_padding_modules_compiled_match_eager():
    x = fusegrad.tensor(RNG.standard_normal((2, 3, 4, 5)).astype(np.float32))
    model = nn.Sequential(nn.ReflectionPad2d((1, 2, 2, 1)), nn.ReplicationPad2d(1),
                          nn.CircularPad2d((0, 1, 1, 0)), nn.ConstantPad2d(1, -2.0),
                          nn.ZeroPad1d(2))

    def loss(x):
        return (model(x) ** 2).sum()
    np.testing.assert_allclose(fusegrad.compile(model)(x).numpy(), model(x).numpy(), rtol=1e-6)
    g = fusegrad.grad(loss)
    np.testing.assert_allclose(fusegrad.compile(g)(x).numpy(), g(x).numpy(), rtol=1e-5)


def np_pixel_shuffle(x, r):
    *lead, c, h, w = x.shape
    y = x.reshape(*lead, c // (r * r), r, r, h, w)
    n = len(lead)
    y = y.transpose(*range(n), n, n + 3, n + 1, n + 4, n + 2)
    return y.reshape(*lead, c // (r * r), h * r, w * r)


@pytest.mark.parametrize("shape,r", [((2, 8, 3, 4), 2), ((9, 2, 3), 3), ((2, 3, 4, 2, 2), 2)])
def test_pixel_shuffle_and_unshuffle(shape, r):
    x = t64(*shape)
    y = NF.pixel_shuffle(x, r)
    ref = np_pixel_shuffle(x.detach().numpy(), r)
    np.testing.assert_array_equal(y.detach().numpy(), ref)
    np.testing.assert_array_equal(nn.PixelShuffle(r)(x).detach().numpy(), ref)
    # each output pixel (h * r + i, w * r + j) of channel c reads input channel c * r * r + i * r + j
    np.testing.assert_array_equal(ref[..., 0, 1, 1], x.detach().numpy()[..., r + 1, 0, 0])
    back = nn.PixelUnshuffle(r)(y)
    np.testing.assert_array_equal(back.detach().numpy(), x.detach().numpy())
    assert gradcheck(lambda t: NF.pixel_shuffle(t, r), (x,))
    assert gradcheck(lambda t: NF.pixel_unshuffle(t, r), (y.detach().requires_grad_(),))
    assert repr(nn.PixelShuffle(r)) == f"PixelShuffle(upscale_factor={r})"
    assert repr(nn.PixelUnshuffle(r)) == f"PixelUnshuffle(downscale_factor={r})"


def test_pixel_shuffle_errors():
    with pytest.raises(RuntimeError, match="at least 3 dimensions, but got input with 2"):
        NF.pixel_shuffle(fusegrad.zeros(4, 4), 2)
    with pytest.raises(RuntimeError, match="expects a positive upscale_factor, but got 0"):
        NF.pixel_shuffle(fusegrad.zeros(1, 4, 2, 2), 0)
    with pytest.raises(RuntimeError, match=r"input.size\(-3\)=6 is not divisible by 4"):
        NF.pixel_shuffle(fusegrad.zeros(1, 6, 2, 2), 2)
    with pytest.raises(RuntimeError, match=r"height to be divisible by downscale_factor, but "
                                           r"input.size\(-2\)=3"):
        NF.pixel_unshuffle(fusegrad.zeros(1, 4, 3, 2), 2)
    with pytest.raises(TypeError, match="'upscale_factor' .* must be int, not float"):
        NF.pixel_shuffle(fusegrad.zeros(1, 4, 2, 2), 2.0)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_glu(dim):
    x = t64(4, 6, 2)
    a, b = np.split(x.detach().numpy(), 2, axis=dim)
    np.testing.assert_allclose(NF.glu(x, dim).detach().numpy(), a * sigmoid(b), rtol=1e-12)
    np.testing.assert_allclose(nn.GLU(dim)(x).detach().numpy(), a * sigmoid(b), rtol=1e-12)
    assert gradcheck(lambda t: NF.glu(t, dim), (x,))
    assert NF.glu(x, dim).grad_fn.name() == "GluBackward0"
    assert repr(nn.GLU()) == "GLU(dim=-1)"


def test_glu_errors():
    with pytest.raises(RuntimeError, match="Halving dimension must be even, but dimension 1 is "
                                           "size 5"):
        NF.glu(fusegrad.zeros(3, 5))
    with pytest.raises(RuntimeError, match="glu does not support scalars"):
        NF.glu(fusegrad.tensor(1.0))
    with pytest.raises(IndexError, match=r"^Dimension out of range \(expected to be in range of "
                                         r"\[-2, 1\], but got 3\)"):
        NF.glu(fusegrad.zeros(3, 4), 3)


def test_softmin():
    x = t64(3, 4)
    e = np.exp(-x.detach().numpy())
    np.testing.assert_allclose(NF.softmin(x, 1).detach().numpy(), e / e.sum(1, keepdims=True),
                               rtol=1e-12)
    np.testing.assert_allclose(nn.Softmin(0)(x).detach().numpy(), e / e.sum(0, keepdims=True),
                               rtol=1e-12)
    assert gradcheck(lambda t: NF.softmin(t, 0), (x,))
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmin"):
        NF.softmin(x)
    assert NF.softmin(x.float(), 1, dtype=fusegrad.float64).dtype is fusegrad.float64
    assert repr(nn.Softmin(1)) == "Softmin(dim=1)"


def test_threshold():
    a = np.array([[-1.0, 0.5, 0.7, np.nan], [2.0, 0.4, -3.0, 0.5]])
    x = fusegrad.tensor(a, requires_grad=True)
    ref = np.where(a <= 0.5, -2.0, a)   # NaN compares false: kept, as torch's kernel does
    np.testing.assert_array_equal(NF.threshold(x, 0.5, -2.0).detach().numpy(), ref)
    NF.threshold(x, 0.5, -2.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), (~(a <= 0.5)).astype(float))
    m = nn.Threshold(0.5, -2.0, inplace=True)
    y = fusegrad.tensor(a)
    assert m(y) is y
    np.testing.assert_array_equal(y.numpy(), ref)
    assert repr(m) == "Threshold(threshold=0.5, value=-2.0, inplace=True)"
    assert repr(nn.Threshold(0.1, 20)) == "Threshold(threshold=0.1, value=20)"
    ints = NF.threshold(fusegrad.tensor([[1, -2, 3]]), 1, 2.7)
    assert ints.dtype is fusegrad.int64
    np.testing.assert_array_equal(ints.numpy(), [[2, 2, 3]])
    np.testing.assert_array_equal(fusegrad.threshold(fusegrad.tensor(a), 0.5, -2.0).numpy(), ref)


def test_cosine_similarity_and_pairwise_distance_modules():
    x, y = t64(3, 4), t64(3, 4)
    xn, yn = x.detach().numpy(), y.detach().numpy()
    cos = (xn * yn).sum(1) / (np.linalg.norm(xn, axis=1) * np.linalg.norm(yn, axis=1))
    np.testing.assert_allclose(nn.CosineSimilarity()(x, y).detach().numpy(), cos, rtol=1e-12)
    cos0 = (xn * yn).sum(0) / (np.linalg.norm(xn, axis=0) * np.linalg.norm(yn, axis=0))
    np.testing.assert_allclose(nn.CosineSimilarity(0)(x, y).detach().numpy(), cos0, rtol=1e-12)
    assert repr(nn.CosineSimilarity()) == "CosineSimilarity()"
    for p in (2.0, 1.0, 3.0, 0.5, np.inf):
        ref = np.linalg.norm(xn - yn + 1e-6, ord=p, axis=-1)
        np.testing.assert_allclose(NF.pairwise_distance(x, y, p).detach().numpy(), ref,
                                   rtol=1e-12)
        m = nn.PairwiseDistance(p, eps=1e-3, keepdim=True)
        np.testing.assert_allclose(m(x, y[0]).detach().numpy(),
                                   np.linalg.norm(xn - yn[0] + 1e-3, ord=p, axis=-1,
                                                  keepdims=True), rtol=1e-12)
        assert gradcheck(lambda a, b, p=p: NF.pairwise_distance(a, b, p), (x, y))
    assert repr(nn.PairwiseDistance()) == "PairwiseDistance()"
    # equal inputs: eps keeps the distance (and its gradient) finite
    d = NF.pairwise_distance(x, x.detach())
    d.sum().backward()
    np.testing.assert_allclose(d.detach().numpy(), np.full(3, 2e-6), rtol=1e-9)
    # p = 0 counts the nonzero differences; it has torch's zero gradient, not a detached result
    x.grad = None
    z = NF.pairwise_distance(x, y, 0.0)
    np.testing.assert_array_equal(z.detach().numpy(), [4.0, 4.0, 4.0])
    z.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros((3, 4)))


def test_bilinear():
    x1, x2, w, b = t64(2, 3, 4), t64(2, 3, 5), t64(6, 4, 5), t64(6)
    ref = np.einsum("nbi,oij,nbj->nbo", x1.detach().numpy(), w.detach().numpy(),
                    x2.detach().numpy()) + b.detach().numpy()
    np.testing.assert_allclose(NF.bilinear(x1, x2, w, b).detach().numpy(), ref, rtol=1e-12)
    assert gradcheck(NF.bilinear, (x1, x2, w, b))
    m = nn.Bilinear(4, 5, 6, dtype=fusegrad.float64)
    assert m.weight.shape == (6, 4, 5) and m.bias.shape == (6,)
    assert float(m.weight.abs().max()) <= 0.5 and float(m.bias.abs().max()) <= 0.5  # 1/sqrt(4)
    m.weight.data.copy_(w.detach())
    m.bias.data.copy_(b.detach())
    np.testing.assert_allclose(m(x1, x2).detach().numpy(), ref, rtol=1e-12)
    assert repr(m) == "Bilinear(in1_features=4, in2_features=5, out_features=6, bias=True)"
    assert nn.Bilinear(4, 5, 6, bias=False).bias is None
    with pytest.raises(RuntimeError, match="input1 size does not match weight size: got 3 but "
                                           "expected 4"):
        NF.bilinear(fusegrad.zeros(3, 3), fusegrad.zeros(3, 5), w)
    with pytest.raises(RuntimeError, match="input batch dimensions do not match at dim 0"):
        NF.bilinear(fusegrad.zeros(3, 4), fusegrad.zeros(2, 5), w)


def test_layers_compiled_match_eager():
    x = fusegrad.tensor(RNG.standard_normal((2, 8, 3, 4)).astype(np.float32))
    y = fusegrad.tensor(RNG.standard_normal((2, 8, 3, 4)).astype(np.float32))
    bil = nn.Bilinear(4, 4, 3)

    def f(x, y):
        s = NF.pixel_unshuffle(NF.pixel_shuffle(x, 2), 2) + NF.glu(x, 1).sum()
        s = s + NF.softmin(x, -1) + NF.threshold(x, 0.1, -1.0)
        return (s.sum() + NF.pairwise_distance(x, y).sum() + nn.CosineSimilarity()(x, y).sum()
                + bil(x, y).sum())
    np.testing.assert_allclose(fusegrad.compile(f)(x, y).detach().numpy(),
                               f(x, y).detach().numpy(), rtol=1e-5)
    g = fusegrad.grad(f)
    np.testing.assert_allclose(fusegrad.compile(g)(x, y).detach().numpy(),
                               g(x, y).detach().numpy(), rtol=1e-5, atol=1e-5)
