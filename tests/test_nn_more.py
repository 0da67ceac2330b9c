"""Smooth L1, Huber, KL divergence, cosine embedding, Poisson and Gaussian NLL and the margin
losses, ParameterList/Dict,
max_unpool, 3-d adaptive pooling: values against numpy, gradients against finite differences,
compiled against eager, torch as an optional oracle."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from functools import partial

import numpy as np
import pytest

import fusegrad
import fusegrad.nn as nn
import fusegrad.nn.functional as NF
from fusegrad.autograd.gradcheck import gradcheck
from tests.test_nn import np_reduce

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


def _np_logsigmoid(x):
    return -np.logaddexp(0, -x)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_likelihood_losses(reduction):
    red = partial(np_reduce, reduction=reduction)
    x, rate = t64(3, 4), fusegrad.tensor(RNG.uniform(0.1, 3, (3, 4)), requires_grad=True)
    t = fusegrad.tensor(RNG.poisson(2.0, (3, 4)).astype(float))
    xn, tn, rn = x.detach().numpy(), t.numpy(), rate.detach().numpy()
    safe_t = np.where(tn > 1, tn, 2.0)
    stirling = np.where(tn > 1, safe_t * np.log(safe_t) - safe_t + 0.5 * np.log(2 * np.pi * safe_t),
                        0.0)
    for log_input, inp, ref in ((True, x, np.exp(xn) - tn * xn),
                                (False, rate, rn - tn * np.log(rn + 1e-8))):
        for full in (False, True):
            out = NF.poisson_nll_loss(inp, t, log_input, full, reduction=reduction)
            np.testing.assert_allclose(out.detach().numpy(), red(ref + full * stirling),
                                       rtol=1e-12)
            assert gradcheck(lambda a, li=log_input, f=full: NF.poisson_nll_loss(
                a, t, li, f, reduction=reduction), (inp,))
    m = nn.PoissonNLLLoss(log_input=False, reduction=reduction)
    np.testing.assert_allclose(m(rate, t).detach().numpy(), red(rn - tn * np.log(rn + 1e-8)),
                               rtol=1e-12)
    y = t64(3, 4)
    var = fusegrad.tensor(RNG.uniform(0.0, 1.0, (3, 4)), requires_grad=True)
    vn = np.maximum(var.detach().numpy(), 0.3)   # clamped to eps
    d2 = (xn - y.detach().numpy()) ** 2
    for full in (False, True):
        out = NF.gaussian_nll_loss(x, y, var, full, eps=0.3, reduction=reduction)
        ref = 0.5 * (np.log(vn) + d2 / vn) + full * 0.5 * np.log(2 * np.pi)
        np.testing.assert_allclose(out.detach().numpy(), red(ref), rtol=1e-12)
    # the clamp keeps var's own gradient (torch clamps a copy under no_grad)
    NF.gaussian_nll_loss(x, y, var, eps=0.3, reduction="sum").backward()
    np.testing.assert_allclose(var.grad.numpy(), 0.5 * (1 / vn - d2 / vn ** 2), rtol=1e-12)
    v1 = fusegrad.tensor(RNG.uniform(0.5, 1.0, 3))   # one dim less: broadcast over the last
    np.testing.assert_allclose(
        nn.GaussianNLLLoss(reduction=reduction)(x, y, v1).detach().numpy(),
        red(0.5 * (np.log(v1.numpy()[:, None]) + d2 / v1.numpy()[:, None])), rtol=1e-12)
    with pytest.raises(ValueError, match="var is of incorrect size"):
        NF.gaussian_nll_loss(x, y, fusegrad.ones(2, 4))
    with pytest.raises(ValueError, match="var has negative entry/entries"):
        NF.gaussian_nll_loss(x, y, -1.0)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_margin_losses(reduction):
    red = partial(np_reduce, reduction=reduction)
    a, b = t64(5), t64(5)
    y = fusegrad.tensor(RNG.choice([-1.0, 1.0], 5))
    an, bn, yn = a.detach().numpy(), b.detach().numpy(), y.numpy()
    np.testing.assert_allclose(
        NF.margin_ranking_loss(a, b, y, 0.5, reduction=reduction).detach().numpy(),
        red(np.maximum(0, -yn * (an - bn) + 0.5)), rtol=1e-12)
    np.testing.assert_allclose(nn.MarginRankingLoss(0.5, reduction=reduction)(a, b, y)
                               .detach().numpy(), red(np.maximum(0, -yn * (an - bn) + 0.5)),
                               rtol=1e-12)
    assert gradcheck(lambda u, v: NF.margin_ranking_loss(u, v, y, 0.5, reduction=reduction),
                     (a, b))
    x = t64(3, 4)
    xn = x.detach().numpy()
    t3 = fusegrad.tensor(RNG.choice([-1.0, 1.0, 0.0], (3, 4)))
    tn = t3.numpy()
    # neither 1 nor -1: both terms, as torch computes it
    ref = np.where(tn != 1, np.maximum(0, 0.7 - xn), 0) + np.where(tn != -1, xn, 0)
    np.testing.assert_allclose(NF.hinge_embedding_loss(x, t3, 0.7, reduction=reduction)
                               .detach().numpy(), red(ref), rtol=1e-12)
    np.testing.assert_allclose(nn.HingeEmbeddingLoss(0.7, reduction=reduction)(x, t3)
                               .detach().numpy(), red(ref), rtol=1e-12)
    assert gradcheck(lambda u: NF.hinge_embedding_loss(u, t3, 0.7, reduction=reduction), (x,))
    s = fusegrad.tensor(RNG.choice([-1.0, 1.0], (3, 4)))
    ref = np.log1p(np.exp(-s.numpy() * xn))
    np.testing.assert_allclose(nn.SoftMarginLoss(reduction=reduction)(x, s).detach().numpy(),
                               red(ref), rtol=1e-12)
    assert gradcheck(lambda u: NF.soft_margin_loss(u, s, reduction=reduction), (x,))
    lab = fusegrad.tensor(RNG.integers(0, 2, (3, 4)).astype(float))
    w = fusegrad.tensor(RNG.uniform(0, 1, 4))
    ln = lab.numpy()
    ref = -(ln * _np_logsigmoid(xn) + (1 - ln) * _np_logsigmoid(-xn)) * w.numpy()
    np.testing.assert_allclose(
        nn.MultiLabelSoftMarginLoss(w, reduction=reduction)(x, lab).detach().numpy(),
        red(ref.mean(1)), rtol=1e-12)
    assert gradcheck(lambda u: NF.multilabel_soft_margin_loss(u, lab, w, reduction=reduction),
                     (x,))


def np_multi_margin(x, y, p, margin, w):
    out = []
    for row, c in zip(x, y, strict=True):
        z = np.maximum(0, margin - row[c] + row) ** p * w[c]
        z[c] = 0
        out.append(z.sum() / len(row))
    return np.array(out)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multi_margin_loss(p, reduction):
    x = t64(5, 4)
    y = fusegrad.tensor(RNG.integers(0, 4, 5))
    w = fusegrad.tensor(RNG.uniform(0, 1, 4))
    for weight in (None, w):
        wn = np.ones(4) if weight is None else w.numpy()
        ref = np_reduce(np_multi_margin(x.detach().numpy(), y.numpy(), p, 0.6, wn), reduction)
        np.testing.assert_allclose(NF.multi_margin_loss(x, y, p, 0.6, weight, reduction=reduction)
                                   .detach().numpy(), ref, rtol=1e-12)
        np.testing.assert_allclose(nn.MultiMarginLoss(p, 0.6, weight, reduction=reduction)(x, y)
                                   .detach().numpy(), ref, rtol=1e-12)
        assert gradcheck(lambda u, wt=weight: NF.multi_margin_loss(u, y, p, 0.6, wt,
                                                                   reduction=reduction), (x,))
    one = NF.multi_margin_loss(x[0], y[:1], p, 0.6)   # unbatched: a 0-d loss
    np.testing.assert_allclose(one.detach().numpy(), np_multi_margin(
        x.detach().numpy()[:1], y.numpy()[:1], p, 0.6, np.ones(4))[0], rtol=1e-12)


def test_multi_margin_loss_errors():
    x, y = fusegrad.zeros(5, 4), fusegrad.tensor([0, 1, 2, 3, 0])
    with pytest.raises(ValueError, match="only p == 1 and p == 2 supported"):
        NF.multi_margin_loss(x, y, 3)
    with pytest.raises(ValueError, match="only p == 1 and p == 2 supported"):
        nn.MultiMarginLoss(3)
    with pytest.raises(RuntimeError, match=r"Expected target size \[5\], but got \[3\]"):
        NF.multi_margin_loss(x, y[:3])
    with pytest.raises(RuntimeError, match="target out of range"):
        NF.multi_margin_loss(x, y + 4)
    with pytest.raises(RuntimeError, match=r"inconsistent weight size, expected 4 but got \[3\]"):
        NF.multi_margin_loss(x, y, weight=fusegrad.ones(3))


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_triplet_margin_losses(swap, reduction):
    a, p, n = t64(4, 5), t64(4, 5), t64(4, 5)
    an, pn, nn_ = (v.detach().numpy() for v in (a, p, n))

    def dist(u, v, q=2.0, eps=1e-6):
        return np.linalg.norm(u - v + eps, ord=q, axis=-1)
    for q in (1.0, 2.0, 3.0):
        d_neg = dist(an, nn_, q)
        if swap:
            d_neg = np.minimum(d_neg, dist(pn, nn_, q))
        ref = np_reduce(np.maximum(0, 0.8 + dist(an, pn, q) - d_neg), reduction)
        np.testing.assert_allclose(NF.triplet_margin_loss(a, p, n, 0.8, q, swap=swap,
                                                          reduction=reduction).detach().numpy(),
                                   ref, rtol=1e-12)
        np.testing.assert_allclose(nn.TripletMarginLoss(0.8, q, swap=swap, reduction=reduction)(
            a, p, n).detach().numpy(), ref, rtol=1e-12)
        assert gradcheck(lambda u, v, w, q=q: NF.triplet_margin_loss(
            u, v, w, 0.8, q, swap=swap, reduction=reduction), (a, p, n))

    def cos_dist(u, v):
        return 1 - NF.cosine_similarity(u, v)
    def cn(u, v):
        return 1 - (u * v).sum(-1) / np.linalg.norm(u, axis=-1) / np.linalg.norm(v, axis=-1)
    d_neg = np.minimum(cn(an, nn_), cn(pn, nn_)) if swap else cn(an, nn_)
    ref = np_reduce(np.maximum(0, 1.5 + cn(an, pn) - d_neg), reduction)
    m = nn.TripletMarginWithDistanceLoss(distance_function=cos_dist, margin=1.5, swap=swap,
                                         reduction=reduction)
    np.testing.assert_allclose(m(a, p, n).detach().numpy(), ref, rtol=1e-12)
    default = nn.TripletMarginWithDistanceLoss(reduction=reduction)
    np.testing.assert_allclose(default(a, p, n).detach().numpy(),
                               NF.triplet_margin_loss(a, p, n, reduction=reduction)
                               .detach().numpy(), rtol=1e-12)
    assert repr(default) == ("TripletMarginWithDistanceLoss(\n  (distance_function): "
                             "PairwiseDistance()\n)")


def test_triplet_margin_loss_errors():
    a = fusegrad.zeros(4, 5)
    with pytest.raises(RuntimeError, match="anchor 2D, positive 2D, and negative 1D inputs"):
        NF.triplet_margin_loss(a, a, a[0])
    with pytest.raises(ValueError, match="margin must be greater than 0, got 0"):
        NF.triplet_margin_loss(a, a, a, margin=0)
    with pytest.raises(ValueError, match="expected margin to be greater than 0, got -1"):
        nn.TripletMarginWithDistanceLoss(margin=-1)


def test_more_losses_compiled_match_eager():
    x = fusegrad.tensor(RNG.standard_normal((4, 5)).astype(np.float32))
    z = fusegrad.tensor(RNG.standard_normal((4, 5)).astype(np.float32))
    sign = fusegrad.tensor(RNG.choice([-1.0, 1.0], (4, 5)).astype(np.float32))
    cls = fusegrad.tensor(RNG.integers(0, 5, 4))
    counts = fusegrad.tensor(RNG.poisson(2.0, (4, 5)).astype(np.float32))

    def loss(x, z):
        return (NF.poisson_nll_loss(x, counts, full=True)
                + NF.gaussian_nll_loss(x, z, z.abs() + 0.1)
                + NF.margin_ranking_loss(x, z, sign, 0.2) + NF.hinge_embedding_loss(x, sign)
                + NF.soft_margin_loss(x, sign) + NF.multilabel_soft_margin_loss(x, sign.relu())
                + NF.multi_margin_loss(x, cls, 2) + NF.triplet_margin_loss(x, z, x.flip(0),
                                                                          swap=True))
    np.testing.assert_allclose(fusegrad.compile(loss)(x, z).numpy(), loss(x, z).numpy(),
                               rtol=1e-5)
    g = fusegrad.grad(loss)
    np.testing.assert_allclose(fusegrad.compile(g)(x, z).numpy(), g(x, z).numpy(), rtol=1e-4,
                               atol=1e-6)
