"""Smooth L1, Huber, KL divergence and cosine embedding losses, ParameterList/Dict,
max_unpool, 3-d adaptive pooling: values against numpy, gradients against finite differences,
compiled against eager, torch as an optional oracle."""

from __future__ import annotations

import warnings
from collections import OrderedDict

import numpy as np
import pytest

import fusegrad
import fusegrad.nn as nn
import fusegrad.nn.functional as NF
from fusegrad.autograd.gradcheck import gradcheck

RNG = np.random.default_rng(12)


def t64(*shape, low=-2.0, high=2.0):
    return fusegrad.tensor(RNG.uniform(low, high, size=shape), requires_grad=True)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_smooth_l1_and_huber(beta, reduction):
    x, y = t64(3, 4), t64(3, 4)
    z = np.abs(x.detach().numpy() - y.detach().numpy())
    ref = z if beta == 0 else np.where(z < beta, 0.5 * z ** 2 / beta, z - 0.5 * beta)
    red = {"mean": np.mean, "sum": np.sum, "none": lambda a: a}[reduction]
    np.testing.assert_allclose(NF.smooth_l1_loss(x, y, reduction=reduction, beta=beta)
                               .detach().numpy(), red(ref), rtol=1e-12)
    np.testing.assert_allclose(nn.SmoothL1Loss(reduction=reduction, beta=beta)(x, y)
                               .detach().numpy(), red(ref), rtol=1e-12)
    assert gradcheck(lambda a, b: NF.smooth_l1_loss(a, b, reduction=reduction, beta=beta), (x, y))
    delta = beta or 0.3
    href = np.where(z < delta, 0.5 * z ** 2, delta * (z - 0.5 * delta))
    np.testing.assert_allclose(NF.huber_loss(x, y, reduction=reduction, delta=delta)
                               .detach().numpy(), red(href), rtol=1e-12)
    np.testing.assert_allclose(nn.HuberLoss(reduction=reduction, delta=delta)(x, y)
                               .detach().numpy(), red(href), rtol=1e-12)
    assert gradcheck(lambda a, b: NF.huber_loss(a, b, reduction=reduction, delta=delta), (x, y))


def test_loss_argument_errors():
    x = fusegrad.zeros(3)
    with pytest.raises(RuntimeError, match="negative values for beta"):
        NF.smooth_l1_loss(x, x, beta=-1)
    with pytest.raises(RuntimeError, match="non-positive values for delta"):
        NF.huber_loss(x, x, delta=0)
    with pytest.raises(ValueError, match="avg is not a valid value for reduction"):
        NF.kl_div(x, x, reduction="avg")


@pytest.mark.parametrize("reduction", ["batchmean", "sum", "none", "mean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(reduction, log_target):
    x = fusegrad.tensor(np.log(RNG.dirichlet(np.ones(4), size=3)), requires_grad=True)
    p = RNG.dirichlet(np.ones(4), size=3)
    if not log_target:
        p[0, 1] = 0.0     # 0 * log 0 counts 0 (with log_target, torch's exp(-inf) * -inf is NaN)
    target = fusegrad.tensor(np.log(p) if log_target else p)
    xn = x.detach().numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        ref = np.where(p > 0, p * (np.log(p) - xn), 0.0)
    red = {"batchmean": lambda a: a.sum() / 3, "sum": np.sum, "none": lambda a: a,
           "mean": np.mean}[reduction]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = NF.kl_div(x, target, reduction=reduction, log_target=log_target)
    assert any("batchmean" in str(w.message) for w in caught) == (reduction == "mean")
    np.testing.assert_allclose(out.detach().numpy(), red(ref), rtol=1e-12, atol=1e-15)
    module = nn.KLDivLoss(reduction=reduction, log_target=log_target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_allclose(module(x, target).detach().numpy(), red(ref), rtol=1e-12,
                                   atol=1e-15)
        assert gradcheck(lambda a: NF.kl_div(a, target, reduction=reduction,
                                             log_target=log_target), (x,))
    if not log_target:
        t = fusegrad.tensor(p, requires_grad=True)
        NF.kl_div(x.detach(), t, reduction="sum").backward()
        assert np.isfinite(t.grad.numpy()).all()   # finite at the zero target


@pytest.mark.parametrize("margin", [0.0, 0.3])
def test_cosine_embedding_loss(margin):
    a, b = t64(4, 5), t64(4, 5)
    y = fusegrad.tensor([1, -1, -1, 1])
    an, bn = a.detach().numpy(), b.detach().numpy()
    cos = (an * bn).sum(1) / np.sqrt(((an * an).sum(1) + 1e-12) * ((bn * bn).sum(1) + 1e-12))
    ref = np.where(y.numpy() == 1, 1 - cos, np.maximum(cos - margin, 0))
    np.testing.assert_allclose(NF.cosine_embedding_loss(a, b, y, margin, reduction="none")
                               .detach().numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(nn.CosineEmbeddingLoss(margin)(a, b, y).detach().numpy(),
                               ref.mean(), rtol=1e-12)
    assert gradcheck(lambda a, b: NF.cosine_embedding_loss(a, b, y, margin), (a, b))
    one = NF.cosine_embedding_loss(a[0], b[0], fusegrad.tensor(1), reduction="sum")
    np.testing.assert_allclose(one.detach().numpy(), ref[0], rtol=1e-12)


def test_losses_compiled_match_eager():
    x = fusegrad.tensor(RNG.standard_normal((3, 4)).astype(np.float32))
    y = fusegrad.tensor(RNG.standard_normal((3, 4)).astype(np.float32))

    def loss(x, y):
        return (NF.smooth_l1_loss(x, y, beta=0.5) + NF.huber_loss(x, y, delta=2.0)
                + NF.kl_div(x.log_softmax(1), y.softmax(1), reduction="batchmean")
                + NF.cosine_embedding_loss(x, y, fusegrad.tensor([1, -1, 1])))
    np.testing.assert_allclose(fusegrad.compile(loss)(x, y).numpy(), loss(x, y).numpy(),
                               rtol=1e-6)
    g = fusegrad.grad(loss)
    np.testing.assert_allclose(fusegrad.compile(g)(x, y).numpy(), g(x, y).numpy(), rtol=1e-5,
                               atol=1e-7)


def test_parameter_list():
    plist = nn.ParameterList([fusegrad.ones(2), nn.Parameter(fusegrad.zeros(3))])
    assert all(isinstance(p, nn.Parameter) for p in plist) and len(plist) == 2
    plist.append(fusegrad.full((4,), 2.0))
    plist += [nn.Parameter(fusegrad.ones(1))]
    assert [n for n, _ in plist.named_parameters()] == ["0", "1", "2", "3"]
    assert plist[-2].shape == (4,) and len(plist[1:3]) == 2
    plist[0] = fusegrad.zeros(5)
    assert plist[0].shape == (5,) and isinstance(plist[0], nn.Parameter)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = nn.ParameterList([fusegrad.ones(3) for _ in range(2)])

        def forward(self, x):
            for w in self.weights:
                x = x * w
            return x.sum()
    m = Model()
    assert list(m.state_dict()) == ["weights.0", "weights.1"]
    m(fusegrad.ones(3)).backward()
    assert m.weights[1].grad.tolist() == [1.0, 1.0, 1.0]
    assert "(1): Parameter containing: [fusegrad.float32 of size 3]" in repr(m)
    with pytest.raises(IndexError):
        plist[7]


def test_parameter_dict():
    pdict = nn.ParameterDict({"a": fusegrad.ones(2), "b": nn.Parameter(fusegrad.zeros(3))})
    pdict["c"] = fusegrad.ones(1)
    pdict.update([("d", fusegrad.zeros(2))])
    assert list(pdict) == ["a", "b", "c", "d"] and len(pdict) == 4 and "c" in pdict
    assert [n for n, _ in pdict.named_parameters()] == ["a", "b", "c", "d"]
    assert isinstance(pdict["c"], nn.Parameter)
    assert pdict.pop("b").shape == (3,) and "b" not in pdict
    assert [k for k, _ in pdict.items()] == ["a", "c", "d"]
    assert pdict.get("zz") is None and pdict.setdefault("e", fusegrad.ones(4)).shape == (4,)
    del pdict["a"]
    assert list(pdict.keys()) == ["c", "d", "e"]
    merged = pdict | nn.ParameterDict({"f": fusegrad.ones(1)})
    assert list(merged) == ["c", "d", "e", "f"]
    pdict.clear()
    assert len(pdict) == 0 and list(pdict.parameters()) == []
    with pytest.raises(TypeError, match="parameter name should be a string"):
        pdict[1] = fusegrad.ones(1)


def test_parameter_dict_orders_a_plain_dict_by_key():
    # torch sorts a plain dict's keys (an OrderedDict or a list of pairs keeps its order):
    # that order is the order of parameters(), so of an optimizer's state indices
    pdict = nn.ParameterDict({"b": fusegrad.ones(1), "a": fusegrad.ones(2)})
    assert list(pdict) == ["a", "b"] and [p.shape[0] for p in pdict.parameters()] == [2, 1]
    ordered = OrderedDict([("b", fusegrad.ones(1)), ("a", fusegrad.ones(2))])
    assert list(nn.ParameterDict(ordered)) == ["b", "a"]
    assert list(nn.ParameterDict([("b", fusegrad.ones(1)), ("a", fusegrad.ones(2))])) == ["b", "a"]
    assert list(pdict.fromkeys(["z", "y"], fusegrad.ones(1))) == ["z", "y"]


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_max_unpool_inverts_max_pool(nd):
    shape = (2, 3) + (4,) * nd
    x = fusegrad.tensor(RNG.standard_normal(shape))
    pool = {1: NF.max_pool1d, 2: NF.max_pool2d, 3: NF.max_pool3d}[nd]
    unpool = {1: NF.max_unpool1d, 2: NF.max_unpool2d, 3: NF.max_unpool3d}[nd]
    y, idx = pool(x, 2, return_indices=True)
    out = unpool(y, idx, 2)
    assert tuple(out.shape) == shape
    ref = np.zeros((2, 3, 4 ** nd))
    np.put_along_axis(ref, idx.numpy().reshape(2, 3, -1), y.numpy().reshape(2, 3, -1), axis=2)
    np.testing.assert_array_equal(out.numpy(), ref.reshape(shape))
    module = {1: nn.MaxUnpool1d, 2: nn.MaxUnpool2d, 3: nn.MaxUnpool3d}[nd](2)
    np.testing.assert_array_equal(module(y, idx).numpy(), out.numpy())
    yg = fusegrad.tensor(y.numpy(), requires_grad=True)
    assert gradcheck(lambda v: unpool(v, idx, 2), (yg,))
    big = unpool(y, idx, 2, output_size=tuple(d + 1 for d in shape[2:]))
    assert tuple(big.shape[2:]) == (5,) * nd
    f = fusegrad.compile(lambda v, i: unpool(v, i, 2) * 2)
    np.testing.assert_array_equal(f(y, idx).numpy(), out.numpy() * 2)


def test_max_unpool_errors_and_unbatched():
    y, idx = NF.max_pool2d(fusegrad.randn(1, 4, 4), 2, return_indices=True)
    assert tuple(NF.max_unpool2d(y, idx, 2).shape) == (1, 4, 4)
    with pytest.raises(RuntimeError, match="Expected shape of indices to be same"):
        NF.max_unpool2d(y, idx[:, :1], 2)
    with pytest.raises(ValueError, match="invalid output_size"):
        NF.max_unpool2d(y, idx, 2, output_size=(9, 9))


def test_adaptive_pool3d():
    x = fusegrad.tensor(RNG.standard_normal((2, 3, 4, 5, 6)), requires_grad=True)
    out = NF.adaptive_avg_pool3d(x, (2, 3, 2))
    xn = x.detach().numpy()
    bounds = [[((i * n) // o, -(-((i + 1) * n) // o)) for i in range(o)]
              for n, o in zip((4, 5, 6), (2, 3, 2))]
    ref_avg = np.zeros((2, 3, 2, 3, 2))
    ref_max = np.zeros((2, 3, 2, 3, 2))
    for i, (a0, a1) in enumerate(bounds[0]):
        for j, (b0, b1) in enumerate(bounds[1]):
            for k, (c0, c1) in enumerate(bounds[2]):
                win = xn[:, :, a0:a1, b0:b1, c0:c1]
                ref_avg[:, :, i, j, k] = win.mean((2, 3, 4))
                ref_max[:, :, i, j, k] = win.max((2, 3, 4))
    np.testing.assert_allclose(out.detach().numpy(), ref_avg, rtol=1e-12)
    mx, arg = NF.adaptive_max_pool3d(x, (2, 3, 2), return_indices=True)
    np.testing.assert_array_equal(mx.detach().numpy(), ref_max)
    np.testing.assert_array_equal(np.take_along_axis(xn.reshape(2, 3, -1),
                                                     arg.numpy().reshape(2, 3, -1), 2),
                                  ref_max.reshape(2, 3, -1))
    assert gradcheck(lambda t: NF.adaptive_avg_pool3d(t, (2, 3, 2)), (x,))
    assert gradcheck(lambda t: NF.adaptive_max_pool3d(t, 2), (x,))
    np.testing.assert_allclose(nn.AdaptiveAvgPool3d((2, 3, 2))(x).detach().numpy(), ref_avg)
    np.testing.assert_array_equal(nn.AdaptiveMaxPool3d((2, 3, 2))(x).detach().numpy(), ref_max)
    assert tuple(NF.adaptive_avg_pool3d(x[0], 1).shape) == (3, 1, 1, 1)
    f = fusegrad.compile(lambda t: NF.adaptive_avg_pool3d(t, 2) + NF.adaptive_max_pool3d(t, 2))
    x32 = fusegrad.tensor(xn.astype(np.float32))
    np.testing.assert_allclose(f(x32).numpy(), (NF.adaptive_avg_pool3d(x32, 2)
                                                + NF.adaptive_max_pool3d(x32, 2)).numpy(),
                               rtol=1e-6)


def test_group4_against_torch():
    torch = pytest.importorskip("torch")
    a, b = RNG.standard_normal((4, 5)), RNG.standard_normal((4, 5))
    y = np.array([1, -1, 1, -1])
    tf = torch.nn.functional
    pairs = [
        (lambda m, x, z: m.smooth_l1_loss(x, z, beta=0.4), True),
        (lambda m, x, z: m.huber_loss(x, z, delta=0.6, reduction="sum"), True),
        (lambda m, x, z: m.kl_div(m.log_softmax(x, 1), m.softmax(z, 1), reduction="batchmean"),
         True),
        (lambda m, x, z: m.kl_div(m.log_softmax(x, 1), m.log_softmax(z, 1), reduction="none",
                                  log_target=True), True),
        (lambda m, x, z, lib=None: m.cosine_embedding_loss(x, z, (torch if m is tf else fusegrad)
                                                           .tensor(y), 0.2), True),
    ]
    for fn, _ in pairs:
        fa, fb = fusegrad.tensor(a, requires_grad=True), fusegrad.tensor(b, requires_grad=True)
        ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
        fo, to = fn(NF, fa, fb), fn(tf, ta, tb)
        np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), rtol=1e-12)
        fo.sum().backward()
        to.sum().backward()
        np.testing.assert_allclose(fa.grad.numpy(), ta.grad.numpy(), rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(fb.grad.numpy(), tb.grad.numpy(), rtol=1e-10, atol=1e-14)
    x = RNG.standard_normal((1, 2, 5, 6, 7))
    np.testing.assert_allclose(NF.adaptive_avg_pool3d(fusegrad.tensor(x), (2, 3, 4)).numpy(),
                               tf.adaptive_avg_pool3d(torch.tensor(x), (2, 3, 4)).numpy(),
                               rtol=1e-12)
    fm, fi = NF.adaptive_max_pool3d(fusegrad.tensor(x), (2, 3, 4), return_indices=True)
    tm, ti = tf.adaptive_max_pool3d(torch.tensor(x), (2, 3, 4), return_indices=True)
    np.testing.assert_array_equal(fm.numpy(), tm.numpy())
    np.testing.assert_array_equal(fi.numpy(), ti.numpy())
    y2, i2 = tf.max_pool2d(torch.tensor(x[0]), 2, return_indices=True)
    np.testing.assert_array_equal(
        NF.max_unpool2d(fusegrad.tensor(y2.numpy()), fusegrad.tensor(i2.numpy()), 2,
                        output_size=(6, 7)).numpy(),
        tf.max_unpool2d(y2, i2, 2, output_size=(6, 7)).numpy())
