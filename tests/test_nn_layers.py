"""Layers added for torch parity: the padding modules, pixel (un)shuffle, GLU, Softmin,
Threshold, CosineSimilarity, PairwiseDistance, Bilinear: values against numpy, gradients
against finite differences, printed like torch, compiled against eager."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad
from fusegrad import nn
from fusegrad.autograd.gradcheck import gradcheck

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
