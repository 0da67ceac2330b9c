"""Tests of fusegrad.nn: functional ops against numpy references, gradients against finite
differences, eager grad_fn names against PyTorch's, and the Module API's behaviour.

Expected reprs, error messages and grad_fn names are what PyTorch 2.13 prints (with
``torch.`` read as ``fusegrad.``).
"""

from __future__ import annotations

import copy
import math
import pickle
import warnings
from collections import OrderedDict

import numpy as np
import pytest

import fusegrad
from fusegrad import nn
from fusegrad.autograd.gradcheck import gradcheck
from fusegrad.nn import functional as NF

RNG = np.random.default_rng(1234)
_erf = np.vectorize(math.erf)


def t64(a, requires_grad: bool = False) -> fusegrad.Tensor:
    """A float64 tensor holding a copy of ``a``."""
    return fusegrad.tensor(np.array(a, dtype=np.float64), requires_grad=requires_grad)


def randn(*shape) -> np.ndarray:
    return RNG.standard_normal(shape)


def close(actual: fusegrad.Tensor, expected, rtol: float = 1e-10, atol: float = 1e-12) -> None:
    np.testing.assert_allclose(actual.detach().numpy(), expected, rtol=rtol, atol=atol)


# --------------------------------------------------------------------------- numpy references


def np_softmax(x, dim):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def np_log_softmax(x, dim):
    s = x - x.max(axis=dim, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=dim, keepdims=True))


def np_gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def np_softplus(x, beta=1.0, threshold=20.0):
    return np.where(x * beta > threshold, x, np.log1p(np.exp(np.minimum(x * beta, threshold)))
                    / beta)


def np_layer_norm(x, k, w=None, b=None, eps=1e-5):
    axes = tuple(range(x.ndim - k, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    out = (x - mu) / np.sqrt(var + eps)
    return out * (1 if w is None else w) + (0 if b is None else b)


def np_reduce(loss, reduction):
    return {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction](loss)


def np_nll(logp, target, weight=None, ignore_index=-100, reduction="mean"):
    """torch.nn.functional.nll_loss on (N, C, d...) or (C,) log-probabilities."""
    if logp.ndim == 1:
        logp, target = logp[None], np.asarray(target)[None]
        squeeze = True
    else:
        squeeze = False
    c = logp.shape[1]
    moved = np.moveaxis(logp, 1, -1).reshape(-1, c)
    flat_t = target.reshape(-1)
    w = np.ones(c) if weight is None else weight
    keep = flat_t != ignore_index
    safe = np.where(keep, flat_t, 0)
    wt = np.where(keep, w[safe], 0.0)
    loss = -moved[np.arange(len(flat_t)), safe] * wt
    if reduction == "mean":
        return loss.sum() / wt.sum()
    if reduction == "sum":
        return loss.sum()
    loss = loss.reshape(target.shape)
    return loss[0] if squeeze else loss


def np_cross_entropy(x, target, weight=None, ignore_index=-100, reduction="mean",
                     label_smoothing=0.0):
    dim = 0 if x.ndim == 1 else 1
    logp = np_log_softmax(x, dim)
    c = x.shape[dim]
    wshape = [1] * x.ndim
    wshape[dim] = c
    if np.issubdtype(np.asarray(target).dtype, np.floating):
        t = target * (1 - label_smoothing) + label_smoothing / c
        terms = logp * t * (1 if weight is None else weight.reshape(wshape))
        if reduction == "none":
            return -terms.sum(axis=dim)
        if reduction == "sum":
            return -terms.sum()
        return -terms.sum() / (x.size / c)
    nll = np_nll(logp, target, weight, ignore_index, reduction)
    if label_smoothing == 0:
        return nll
    w = np.ones(c) if weight is None else weight
    smooth = -(logp * w.reshape(wshape)).sum(axis=dim)
    ignored = target == ignore_index
    smooth = np.where(ignored, 0.0, smooth)
    if reduction == "mean":
        denom = np.where(ignored, 0.0, w[np.where(ignored, 0, target)]).sum()
        ret = smooth.sum() / denom
    else:
        ret = np_reduce(smooth, reduction)
    return (1 - label_smoothing) * nll + ret * (label_smoothing / c)


def np_bce(p, t, w=None, reduction="mean"):
    loss = -(t * np.maximum(np.log(p), -100) + (1 - t) * np.maximum(np.log(1 - p), -100))
    return np_reduce(loss * (1 if w is None else w), reduction)


def np_bce_logits(x, t, w=None, pos_weight=None, reduction="mean"):
    log_sig = -np.logaddexp(0, -x)
    log_one_minus = -np.logaddexp(0, x)
    pw = 1 if pos_weight is None else pos_weight
    loss = -(pw * t * log_sig + (1 - t) * log_one_minus)
    return np_reduce(loss * (1 if w is None else w), reduction)


# --------------------------------------------------------------------------- activations

ACTIVATIONS = [
    ("relu", NF.relu, lambda x: np.maximum(x, 0)),
    ("gelu", NF.gelu, np_gelu),
    ("gelu_tanh", lambda x: NF.gelu(x, approximate="tanh"), lambda x: np_gelu(x, "tanh")),
    ("silu", NF.silu, lambda x: x / (1 + np.exp(-x))),
    ("softplus", NF.softplus, np_softplus),
    ("softplus_beta", lambda x: NF.softplus(x, beta=2.0, threshold=3.0),
     lambda x: np_softplus(x, 2.0, 3.0)),
    ("leaky_relu", NF.leaky_relu, lambda x: np.where(x > 0, x, 0.01 * x)),
    ("leaky_relu_02", lambda x: NF.leaky_relu(x, 0.2), lambda x: np.where(x > 0, x, 0.2 * x)),
    ("sigmoid", NF.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    ("tanh", NF.tanh, np.tanh),
]


@pytest.mark.parametrize("name,fn,ref", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation_forward_matches_numpy(name, fn, ref):
    x = randn(4, 5) * 3
    close(fn(t64(x)), ref(x))
    out32 = fn(fusegrad.tensor(x.astype(np.float32)))
    assert out32.dtype is fusegrad.float32
    np.testing.assert_allclose(out32.numpy(), ref(x), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("name,fn,ref", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation_gradcheck(name, fn, ref):
    # Keep points away from the kinks (0 for relu-likes, the softplus threshold).
    x = randn(3, 4)
    x = np.where(np.abs(x) < 0.1, 0.5, x)
    assert gradcheck(fn, (t64(x, True),))


def test_activations_at_extremes_have_finite_gradients():
    x = fusegrad.tensor([-200.0, -90.0, 0.0, 90.0, 200.0], requires_grad=True)
    for fn in (NF.sigmoid, NF.silu, NF.softplus, lambda v: NF.gelu(v, "tanh"), NF.gelu):
        x.grad = None
        y = fn(x)
        y.sum().backward()
        assert np.isfinite(y.detach().numpy()).all()
        assert np.isfinite(x.grad.numpy()).all()
    assert NF.softplus(fusegrad.tensor([100.0])).item() == 100.0


def test_relu_gradient_at_zero_is_zero_and_nan_propagates():
    x = fusegrad.tensor([0.0, -1.0, 2.0], requires_grad=True)
    NF.relu(x).sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 1.0]
    assert math.isnan(NF.relu(fusegrad.tensor([math.nan])).item())


def test_leaky_relu_gradient_at_zero_is_slope():
    x = fusegrad.tensor([0.0], requires_grad=True)
    NF.leaky_relu(x, 0.2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.2])


def test_inplace_activations_write_into_input():
    x = fusegrad.tensor([-1.0, 2.0])
    assert NF.relu(x, inplace=True) is x and x.tolist() == [0.0, 2.0]
    y = fusegrad.tensor([-1.0, 2.0])
    NF.leaky_relu(y, 0.5, inplace=True)
    assert y.tolist() == [-0.5, 2.0]
    assert NF.relu_(fusegrad.tensor([-3.0])).tolist() == [0.0]
    z = fusegrad.tensor([-1.0, 0.0, 1.0])
    NF.silu(z, inplace=True)
    np.testing.assert_allclose(z.numpy(), [-1 / (1 + math.e), 0.0, 1 / (1 + math.exp(-1))],
                               rtol=1e-6)
    d = fusegrad.ones(1000)
    assert NF.dropout(d, 0.5, inplace=True) is d
    assert set(np.unique(d.numpy()).tolist()) == {0.0, 2.0}
    # In place on a leaf that requires grad is torch's error.
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        NF.relu(fusegrad.ones(2, requires_grad=True), inplace=True)


# --------------------------------------------------------------------------- softmax


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_and_log_softmax_match_numpy(dim):
    x = randn(3, 4, 5)
    close(NF.softmax(t64(x), dim), np_softmax(x, dim))
    close(NF.log_softmax(t64(x), dim), np_log_softmax(x, dim))
    assert gradcheck(lambda v: NF.softmax(v, dim), (t64(x[:2, :2, :3], True),))
    assert gradcheck(lambda v: NF.log_softmax(v, dim), (t64(x[:2, :2, :3], True),))


def test_softmax_is_stable_for_large_logits():
    x = fusegrad.tensor([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1002.0]])
    ref = np_softmax(np.array([[0.0, 1.0, 2.0], [0.0, -1.0, -2.0]]), 1)
    np.testing.assert_allclose(NF.softmax(x, 1).numpy(), ref, rtol=1e-6)
    np.testing.assert_allclose(NF.log_softmax(x, 1).numpy(), np.log(ref), rtol=1e-6)


def test_softmax_with_negative_infinity_entries():
    x = fusegrad.tensor([[0.0, -math.inf, 1.0], [-math.inf, -math.inf, -math.inf]],
                        requires_grad=True)
    sm = NF.softmax(x, 1)
    ref = np_softmax(np.array([0.0, 1.0]), 0)
    np.testing.assert_allclose(sm.detach().numpy()[0], [ref[0], 0.0, ref[1]], rtol=1e-6)
    assert np.isnan(sm.detach().numpy()[1]).all()      # torch: an all -inf row is NaN
    lsm = NF.log_softmax(x, 1).detach().numpy()
    assert lsm[0, 1] == -math.inf and np.isfinite(lsm[0, [0, 2]]).all()
    # The gradient through a -inf entry of a finite row is finite.
    y = NF.softmax(x[:1], 1)
    (y * fusegrad.tensor([[1.0, 2.0, 3.0]])).sum().backward()
    assert np.isfinite(x.grad.numpy()[0]).all()


def test_softmax_dtype_argument_and_implicit_dim_warning():
    x = fusegrad.tensor([[1.0, 2.0]])
    assert NF.softmax(x, 1, dtype=fusegrad.float64).dtype is fusegrad.float64
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmax"):
        out = NF.softmax(x)
    np.testing.assert_allclose(out.numpy(), np_softmax(np.array([[1.0, 2.0]]), 1), rtol=1e-6)


# --------------------------------------------------------------------------- layers


@pytest.mark.parametrize("shape", [(5,), (4, 5), (2, 3, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_numpy_and_gradcheck(shape, bias):
    x, w, b = randn(*shape), randn(3, 5), randn(3)
    ref = x @ w.T + (b if bias else 0)
    close(NF.linear(t64(x), t64(w), t64(b) if bias else None), ref)
    args = (t64(x, True), t64(w, True)) + ((t64(b, True),) if bias else ())
    assert gradcheck(lambda *a: NF.linear(*a), args)


def test_linear_bias_of_the_outputs_shape_expands_to_it_and_never_enlarges_it():
    # torch: a bias beyond a row expands to the product's shape (batched inputs too); one
    # with more or larger dims than the output is an error, not a bigger result.
    x, w, b = randn(5, 2, 3), randn(4, 3), randn(2, 4)
    close(NF.linear(t64(x), t64(w), t64(b)), x @ w.T + b)
    assert gradcheck(lambda *a: NF.linear(*a), (t64(x, True), t64(w, True), t64(b, True)))
    with pytest.raises(RuntimeError, match="expand"):
        NF.linear(t64(x[0]), t64(w), t64(b[None]))


def test_linear_shape_mismatch_message():
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(4x3 "
                                           r"and 5x2\)"):
        NF.linear(fusegrad.randn(4, 3), fusegrad.randn(2, 5))


@pytest.mark.parametrize("k,affine", [(1, True), (1, False), (2, True)])
def test_layer_norm_matches_numpy_and_gradcheck(k, affine):
    x = randn(3, 4, 5)
    shape = x.shape[3 - k:]
    w, b = (randn(*shape), randn(*shape)) if affine else (None, None)
    out = NF.layer_norm(t64(x), shape, None if w is None else t64(w),
                        None if b is None else t64(b))
    close(out, np_layer_norm(x, k, w, b))
    xs = x[:2, :2, :3] if k == 1 else x[:2, :2, :3]
    shape = xs.shape[3 - k:]
    args = [t64(xs, True)]
    if affine:
        args += [t64(randn(*shape), True), t64(randn(*shape), True)]
        assert gradcheck(lambda v, w_, b_: NF.layer_norm(v, shape, w_, b_), args)
    else:
        assert gradcheck(lambda v: NF.layer_norm(v, shape), args)


def test_layer_norm_shape_error_message():
    with pytest.raises(RuntimeError) as err:
        NF.layer_norm(fusegrad.randn(3, 4), (5,))
    assert str(err.value) == ("Given normalized_shape=[5], expected input with shape [*, 5], "
                              "but got input of size[3, 4]")


def test_embedding_lookup_gradient_and_padding_idx():
    w = randn(6, 3)
    idx = np.array([[0, 2, 5], [2, 2, 1]])
    close(NF.embedding(fusegrad.tensor(idx), t64(w)), w[idx])
    weight = t64(w, True)
    NF.embedding(fusegrad.tensor(idx), weight, padding_idx=2).sum().backward()
    expected = np.zeros((6, 3))
    for i in idx.reshape(-1):
        if i != 2:
            expected[i] += 1
    close(weight.grad, expected)
    assert gradcheck(lambda v: NF.embedding(fusegrad.tensor(idx), v), (t64(w, True),))
    with pytest.raises(RuntimeError, match="Expected tensor for argument #1 'indices'"):
        NF.embedding(fusegrad.tensor([1.0]), weight)


def test_one_hot():
    t = fusegrad.tensor([0, 1, 2, 1])
    assert NF.one_hot(t).tolist() == np.eye(3, dtype=np.int64)[[0, 1, 2, 1]].tolist()
    assert NF.one_hot(t).dtype is fusegrad.int64
    assert NF.one_hot(fusegrad.tensor(2), 4).tolist() == [0, 0, 1, 0]
    assert tuple(NF.one_hot(fusegrad.tensor([[1, 0]]), 5).shape) == (1, 2, 5)
    for bad, msg in [(fusegrad.tensor([1.0]), "only applicable to index tensor of type Long"),
                     (fusegrad.tensor([1, 5]), "Class values must be smaller than num_classes."),
                     (fusegrad.tensor([-1, 2]), "Class values must be non-negative.")]:
        with pytest.raises(RuntimeError, match=msg):
            NF.one_hot(bad, 3 if bad.dtype is fusegrad.int64 else -1)


def test_dropout_training_eval_scaling_and_seed():
    x = fusegrad.ones(200, 100)
    assert NF.dropout(x, 0.3, training=False) is x
    assert NF.dropout(x, 0.0) is x
    fusegrad.manual_seed(7)
    a = NF.dropout(x, 0.3).numpy()
    fusegrad.manual_seed(7)
    b = NF.dropout(x, 0.3).numpy()
    np.testing.assert_array_equal(a, b)
    assert set(np.unique(a).tolist()) == {0.0, np.float32(1 / 0.7).item()}
    assert abs((a == 0).mean() - 0.3) < 0.02
    assert (NF.dropout(x, 1.0).numpy() == 0).all()
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1, but "
                                         "got 1.5"):
        NF.dropout(x, 1.5)
    # The gradient is the same mask and scale.
    xg = fusegrad.ones(50, requires_grad=True)
    fusegrad.manual_seed(3)
    y = NF.dropout(xg, 0.5)
    y.sum().backward()
    np.testing.assert_array_equal(xg.grad.numpy(), y.detach().numpy())



@pytest.mark.parametrize("fn, shape, channel_dims", [
    (NF.dropout1d, (6, 8, 5), 2), (NF.dropout1d, (8, 5), 1), (NF.dropout2d, (6, 8, 3, 2), 2),
    (NF.dropout2d, (6, 8, 5), 2), (NF.dropout3d, (6, 8, 2, 3, 2), 2),
    (NF.dropout3d, (8, 2, 3, 2), 1)])
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.filterwarnings("ignore:dropout2d. Received a 3D input")
def test_channel_dropout_zeroes_whole_channels(fn, shape, channel_dims, compiled):
    x = fusegrad.tensor(RNG.uniform(1, 2, shape).astype(np.float32), requires_grad=True)

    def f(x):
        y = fn(x, 0.4)
        y.sum().backward()
        return y
    fusegrad.manual_seed(5)
    y = (fusegrad.compile(f) if compiled else f)(x).detach().numpy()
    kept = y != 0
    rest = tuple(range(channel_dims, len(shape)))
    assert (kept.all(rest) | ~kept.any(rest)).all()        # a channel is kept or dropped whole
    assert 0 < kept.mean() < 1
    np.testing.assert_allclose(y[kept], x.detach().numpy()[kept] / 0.6, rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), kept / 0.6, rtol=1e-6)
    assert fn(x, 0.4, training=False) is x
    with pytest.raises(ValueError, match="dropout probability"):
        fn(x, -0.1)


@pytest.mark.parametrize("feature", [False, True])
def test_alpha_dropout_keeps_mean_and_variance(feature):
    # torch's affine map: kept x -> a * x + b, dropped -> -1.758... * a + b
    p, sat = 0.2, 1.7580993408473766
    a = 1 / math.sqrt((sat ** 2 * p + 1) * (1 - p))
    b = sat * a * p
    fn = NF.feature_alpha_dropout if feature else NF.alpha_dropout
    z = RNG.standard_normal((400, 500, 1) if feature else (400, 500)).astype(np.float32)
    x = fusegrad.tensor(z, requires_grad=True)
    y = fn(x, p, training=True)
    y.sum().backward()
    out = y.detach().numpy()
    kept = np.isclose(out, a * z + b, rtol=1e-5, atol=1e-6)
    assert (kept | np.isclose(out, b - sat * a, rtol=1e-5)).all()
    assert abs(kept.mean() - (1 - p)) < 0.01
    np.testing.assert_allclose(x.grad.numpy(), kept * np.float32(a), rtol=1e-6)
    assert abs(out.mean()) < 0.01 and abs(out.var() - 1) < 0.01
    assert fn(x, p) is x                              # training defaults to False
    np.testing.assert_array_equal(nn.AlphaDropout(1.0)(x).detach().numpy(), 0 * z)


def test_normalize_matches_numpy():
    x = randn(3, 4)
    close(NF.normalize(t64(x)), x / np.linalg.norm(x, axis=1, keepdims=True))
    close(NF.normalize(t64(x), p=1, dim=0), x / np.abs(x).sum(axis=0, keepdims=True))
    assert gradcheck(lambda v: NF.normalize(v), (t64(x, True),))


def test_pad_constant_and_negative():
    x = np.arange(6.0).reshape(2, 3)
    close(NF.pad(t64(x), (1, 2)), np.pad(x, ((0, 0), (1, 2))))
    close(NF.pad(t64(x), (1, 0, 0, 1), value=-1.0),
          np.pad(x, ((0, 1), (1, 0)), constant_values=-1.0))
    # torch: F.pad(arange(6.).view(2, 3), (-1, 1, 1, 0))
    assert NF.pad(t64(x), (-1, 1, 1, 0)).tolist() == [[0.0, 0.0, 0.0], [1.0, 2.0, 0.0],
                                                      [4.0, 5.0, 0.0]]
    assert gradcheck(lambda v: NF.pad(v, (-1, 2, 1, 0)), (t64(x, True),))
    with pytest.raises(RuntimeError, match="Padding length must be divisible by 2"):
        NF.pad(t64(x), (1,))
    with pytest.raises(RuntimeError, match="Padding length should be less than or equal"):
        NF.pad(t64([1.0]), (1, 1, 1, 1))


# --------------------------------------------------------------------------- losses


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_and_l1_loss(reduction):
    x, y = randn(3, 4), randn(3, 4)
    close(NF.mse_loss(t64(x), t64(y), reduction=reduction), np_reduce((x - y) ** 2, reduction))
    close(NF.l1_loss(t64(x), t64(y), reduction=reduction), np_reduce(np.abs(x - y), reduction))
    assert gradcheck(lambda a, b: NF.mse_loss(a, b, reduction=reduction),
                     (t64(x, True), t64(y, True)))
    assert gradcheck(lambda a, b: NF.l1_loss(a, b, reduction=reduction),
                     (t64(x, True), t64(y, True)))


def test_loss_argument_errors_and_size_warning():
    x = fusegrad.randn(3)
    with pytest.raises(ValueError, match="avg is not a valid value for reduction"):
        NF.mse_loss(x, x, reduction="avg")
    with pytest.warns(UserWarning, match=r"Using a target size \(fusegrad.Size\(\[3\]\)\) that "
                                         r"is different to the input size"):
        NF.mse_loss(fusegrad.randn(3, 1), x)


CE_CASES = [
    dict(),
    dict(reduction="sum"),
    dict(reduction="none"),
    dict(weight=True),
    dict(weight=True, reduction="none"),
    dict(ignore_index=1),
    dict(ignore_index=1, weight=True),
    dict(label_smoothing=0.1),
    dict(label_smoothing=0.2, weight=True),
    dict(label_smoothing=0.1, ignore_index=2, reduction="sum"),
    dict(label_smoothing=0.1, ignore_index=2, weight=True),
]


@pytest.mark.parametrize("case", CE_CASES, ids=[str(c) for c in CE_CASES])
@pytest.mark.parametrize("shape", [(5, 4), (3, 4, 2)])
def test_cross_entropy_class_indices(case, shape):
    x = randn(*shape)
    target = RNG.integers(0, shape[1], (shape[0],) + shape[2:])
    target.reshape(-1)[0] = 1       # make sure ignore_index=1 occurs
    kw = dict(case)
    w = RNG.uniform(0.5, 2.0, shape[1]) if kw.pop("weight", False) else None
    out = NF.cross_entropy(t64(x), fusegrad.tensor(target),
                           weight=None if w is None else t64(w), **kw)
    close(out, np_cross_entropy(x, target, w, **kw))
    assert gradcheck(lambda v: NF.cross_entropy(v, fusegrad.tensor(target),
                                                weight=None if w is None else t64(w), **kw),
                     (t64(x, True),))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.25])
def test_cross_entropy_probability_targets(reduction, smoothing):
    x = randn(4, 5)
    p = np_softmax(randn(4, 5), 1)
    w = RNG.uniform(0.5, 2.0, 5)
    for weight in (None, w):
        out = NF.cross_entropy(t64(x), t64(p), weight=None if weight is None else t64(weight),
                               reduction=reduction, label_smoothing=smoothing)
        close(out, np_cross_entropy(x, p, weight, reduction=reduction,
                                    label_smoothing=smoothing))
    assert gradcheck(lambda v, q: NF.cross_entropy(v, q, reduction=reduction,
                                                   label_smoothing=smoothing),
                     (t64(x, True), t64(p, True)))


def test_cross_entropy_single_sample_and_errors():
    x = randn(4)
    close(NF.cross_entropy(t64(x), fusegrad.tensor(2)), -np_log_softmax(x, 0)[2])
    with pytest.raises(IndexError, match="Target 5 is out of bounds."):
        NF.nll_loss(fusegrad.randn(3, 4), fusegrad.tensor([0, 5, 1]))
    with pytest.raises(ValueError, match=r"Expected input batch_size \(3\) to match target "
                                         r"batch_size \(2\)."):
        NF.nll_loss(fusegrad.randn(3, 4), fusegrad.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="expected target dtype to be Long or Byte, but got "
                                           "Int"):
        NF.nll_loss(fusegrad.randn(3, 4), fusegrad.tensor([0, 1, 2], dtype=fusegrad.int32))
    with pytest.raises(RuntimeError, match="expected target dtype to be Long or Byte, but got "
                                           "Float"):
        NF.cross_entropy(fusegrad.randn(3, 4), fusegrad.tensor([0.0, 1.0, 2.0]))


@pytest.mark.parametrize("weight_shape", [(3,), (5,), (1, 4), ()])
def test_class_weight_of_another_size_is_an_error(weight_shape):
    # Targets 0..2 never reach the missing class: without the check a weight of 3 (or 5)
    # entries for 4 classes gave a loss, silently.
    x, target = fusegrad.randn(3, 4), fusegrad.tensor([0, 1, 2])
    w = fusegrad.ones(weight_shape)
    msg = (r"weight tensor should be defined either for all 4 classes or no classes but got "
           rf"weight tensor of shape: \[{', '.join(map(str, weight_shape))}\]")
    with pytest.raises(RuntimeError, match=msg):
        NF.nll_loss(NF.log_softmax(x, 1), target, weight=w)
    with pytest.raises(RuntimeError, match=msg):
        NF.cross_entropy(x, target, weight=w)
    with pytest.raises(RuntimeError, match=msg):
        NF.cross_entropy(x, target, weight=w, label_smoothing=0.1)
    with pytest.raises(RuntimeError, match="cross_entropy: " + msg):
        NF.cross_entropy(x, NF.softmax(x, 1), weight=w)


def test_class_weight_of_spatial_loss_is_checked_by_count():
    # torch's (N, C, d1, ...) path: any weight with C elements, another count an error
    x = randn(2, 4, 3)
    target = RNG.integers(0, 4, (2, 3))
    w = RNG.uniform(0.5, 2.0, 4)
    out = NF.cross_entropy(t64(x), fusegrad.tensor(target), weight=t64(w.reshape(1, 4)))
    close(out, np_cross_entropy(x, target, w))
    with pytest.raises(RuntimeError, match="weight tensor should be defined either for all or "
                                           "no classes"):
        NF.nll_loss(t64(x), fusegrad.tensor(target), weight=t64(w[:3]))


def test_cross_entropy_all_ignored_mean_is_nan():
    out = NF.cross_entropy(fusegrad.randn(2, 3), fusegrad.tensor([-100, -100]))
    assert math.isnan(out.item())


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_matches_numpy(reduction):
    logp = np_log_softmax(randn(6, 4), 1)
    target = RNG.integers(0, 4, 6)
    w = RNG.uniform(0.5, 2.0, 4)
    close(NF.nll_loss(t64(logp), fusegrad.tensor(target), weight=t64(w), reduction=reduction),
          np_nll(logp, target, w, reduction=reduction))
    assert gradcheck(lambda v: NF.nll_loss(v, fusegrad.tensor(target), reduction=reduction),
                     (t64(logp, True),))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy(reduction):
    p = RNG.uniform(0.05, 0.95, (3, 4))
    t = RNG.uniform(0, 1, (3, 4))
    w = RNG.uniform(0.5, 2, (3, 4))
    close(NF.binary_cross_entropy(t64(p), t64(t), reduction=reduction), np_bce(p, t, None,
                                                                              reduction))
    close(NF.binary_cross_entropy(t64(p), t64(t), t64(w), reduction=reduction),
          np_bce(p, t, w, reduction))
    assert gradcheck(lambda a, b: NF.binary_cross_entropy(a, b, reduction=reduction),
                     (t64(p, True), t64(t, True)))


def test_binary_cross_entropy_clamps_log_at_minus_100():
    p = fusegrad.tensor([0.0, 1.0, 0.5], requires_grad=True)
    t = fusegrad.tensor([1.0, 0.0, 1.0])
    loss = NF.binary_cross_entropy(p, t, reduction="none")
    np.testing.assert_allclose(loss.detach().numpy(), [100.0, 100.0, math.log(2)], rtol=1e-6)
    loss.sum().backward()
    assert np.isfinite(p.grad.numpy()).all()
    with pytest.raises(RuntimeError, match="all elements of input should be between 0 and 1"):
        NF.binary_cross_entropy(fusegrad.tensor([0.5, 1.5]), fusegrad.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="is deprecated. Please ensure they have the same size."):
        NF.binary_cross_entropy(fusegrad.tensor([0.5]), fusegrad.tensor([0.0, 1.0]))


@pytest.mark.parametrize("compiled", [False, True])
def test_binary_cross_entropy_gradient_is_torchs_at_0_and_1(compiled):
    # torch's BinaryCrossEntropyBackward0: (x - t) / max(x (1 - x), 1e-12) for the input,
    # -logit(x) for the target. The derivative of the clamped logs gave +-1 where x equals a
    # 0/1 target (torch: 0) and -1e30 at x = 1e-30 (torch: -1e12).
    p = np.array([0.0, 1.0, 0.0, 1.0, 1e-30, 0.25], np.float32)
    t = np.array([0.0, 1.0, 0.3, 0.3, 1.0, 0.5], np.float32)
    w = np.array([1.0, 2.0, 1.0, 1.0, 1.0, 3.0], np.float32)

    def loss_and_grads(a, b):
        loss = NF.binary_cross_entropy(a, b, fusegrad.tensor(w), reduction="sum")
        loss.backward()
        return loss

    x, y = fusegrad.tensor(p, requires_grad=True), fusegrad.tensor(t, requires_grad=True)
    (fusegrad.compile(loss_and_grads) if compiled else loss_and_grads)(x, y)
    p64, t64_ = p.astype(np.float64), t.astype(np.float64)
    want_x = w * (p64 - t64_) / np.maximum(p64 * (1 - p64), 1e-12)
    with np.errstate(divide="ignore"):
        want_t = -w * (np.log(p64) - np.log1p(-p64))
    np.testing.assert_allclose(x.grad.numpy(), want_x, rtol=1e-5)
    np.testing.assert_allclose(y.grad.numpy(), want_t, rtol=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_with_logits(reduction):
    x = randn(3, 4) * 4
    t = RNG.uniform(0, 1, (3, 4))
    w = RNG.uniform(0.5, 2, (3, 4))
    pw = RNG.uniform(0.5, 3, 4)
    close(NF.binary_cross_entropy_with_logits(t64(x), t64(t), reduction=reduction),
          np_bce_logits(x, t, reduction=reduction))
    close(NF.binary_cross_entropy_with_logits(t64(x), t64(t), t64(w), reduction=reduction,
                                              pos_weight=t64(pw)),
          np_bce_logits(x, t, w, pw, reduction))
    assert gradcheck(lambda a, b, c: NF.binary_cross_entropy_with_logits(
        a, b, reduction=reduction, pos_weight=c), (t64(x, True), t64(t, True), t64(pw, True)))


def test_binary_cross_entropy_with_logits_is_stable_and_exact_at_zero():
    x = fusegrad.tensor([-500.0, 0.0, 500.0], requires_grad=True)
    t = fusegrad.tensor([1.0, 0.25, 0.0])
    loss = NF.binary_cross_entropy_with_logits(x, t, reduction="none")
    np.testing.assert_allclose(loss.detach().numpy(), [500.0, math.log(2), 500.0], rtol=1e-6)
    loss.sum().backward()
    # d/dx = sigmoid(x) - t, also at the kink x == 0
    np.testing.assert_allclose(x.grad.numpy(), [-1.0, 0.25, 1.0], atol=1e-7)
    with pytest.raises(ValueError, match="must be the same as input size"):
        NF.binary_cross_entropy_with_logits(fusegrad.tensor([0.5]), fusegrad.tensor([0.0, 1.0]))


# --------------------------------------------------------------------------- grad_fn names

X = fusegrad.randn(4, 5, requires_grad=True)
X1 = fusegrad.randn(5, requires_grad=True)
X3 = fusegrad.randn(2, 4, 5, requires_grad=True)
W = fusegrad.randn(3, 5, requires_grad=True)
B = fusegrad.randn(3, requires_grad=True)
T = fusegrad.tensor([0, 1, 2, 1])
P = NF.softmax(fusegrad.randn(4, 5), 1)

GRAD_FN_NAMES = [
    ("relu", lambda: NF.relu(X), "ReluBackward0"),
    ("gelu", lambda: NF.gelu(X), "GeluBackward0"),
    ("gelu_tanh", lambda: NF.gelu(X, approximate="tanh"), "GeluBackward0"),
    ("silu", lambda: NF.silu(X), "SiluBackward0"),
    ("softplus", lambda: NF.softplus(X), "SoftplusBackward0"),
    ("leaky_relu", lambda: NF.leaky_relu(X), "LeakyReluBackward0"),
    ("sigmoid", lambda: NF.sigmoid(X), "SigmoidBackward0"),
    ("tanh", lambda: NF.tanh(X), "TanhBackward0"),
    ("softmax", lambda: NF.softmax(X, 1), "SoftmaxBackward0"),
    ("log_softmax", lambda: NF.log_softmax(X, 1), "LogSoftmaxBackward0"),
    ("linear_2d", lambda: NF.linear(X, W, B), "AddmmBackward0"),
    ("linear_2d_nobias", lambda: NF.linear(X, W), "MmBackward0"),
    ("linear_1d", lambda: NF.linear(X1, W, B), "ViewBackward0"),
    ("linear_3d", lambda: NF.linear(X3, W, B), "ViewBackward0"),
    ("linear_3d_nobias", lambda: NF.linear(X3, W), "UnsafeViewBackward0"),
    ("linear_1d_nobias", lambda: NF.linear(X1, W), "SqueezeBackward4"),
    ("layer_norm", lambda: NF.layer_norm(X, (5,)), "NativeLayerNormBackward0"),
    ("embedding", lambda: NF.embedding(T, W.t().contiguous().detach().requires_grad_()),
     "EmbeddingBackward0"),
    ("mse", lambda: NF.mse_loss(X, P), "MseLossBackward0"),
    ("mse_none", lambda: NF.mse_loss(X, P, reduction="none"), "MseLossBackward0"),
    ("l1", lambda: NF.l1_loss(X, P), "MeanBackward0"),
    ("l1_none", lambda: NF.l1_loss(X, P, reduction="none"), "AbsBackward0"),
    ("l1_sum", lambda: NF.l1_loss(X, P, reduction="sum"), "SumBackward0"),
    ("cross_entropy", lambda: NF.cross_entropy(X, T), "NllLossBackward0"),
    ("cross_entropy_none", lambda: NF.cross_entropy(X, T, reduction="none"), "NllLossBackward0"),
    ("cross_entropy_smoothing", lambda: NF.cross_entropy(X, T, label_smoothing=0.1),
     "AddBackward0"),
    ("cross_entropy_prob", lambda: NF.cross_entropy(X, P), "DivBackward1"),
    ("cross_entropy_prob_sum", lambda: NF.cross_entropy(X, P, reduction="sum"), "NegBackward0"),
    ("nll", lambda: NF.nll_loss(X, T), "NllLossBackward0"),
    ("bce", lambda: NF.binary_cross_entropy(NF.sigmoid(X), P), "BinaryCrossEntropyBackward0"),
    ("bce_logits", lambda: NF.binary_cross_entropy_with_logits(X, P),
     "BinaryCrossEntropyWithLogitsBackward0"),
    ("normalize", lambda: NF.normalize(X), "DivBackward0"),
    ("pad", lambda: NF.pad(X, (1, 2)), "ConstantPadNdBackward0"),
    ("dropout", lambda: NF.dropout(X, 0.5), "MulBackward0"),
    ("relu_inplace", lambda: NF.relu(X * 2, inplace=True), "ReluBackward0"),
    ("leaky_relu_inplace", lambda: NF.leaky_relu(X * 2, inplace=True), "LeakyReluBackward1"),
]


@pytest.mark.parametrize("name,make,expected", GRAD_FN_NAMES, ids=[g[0] for g in GRAD_FN_NAMES])
def test_grad_fn_names_match_torch(name, make, expected):
    assert make().grad_fn.name() == expected


def test_no_grad_fn_without_grad():
    assert NF.dropout(X, 0.5, training=False).grad_fn is None
    with fusegrad.no_grad():
        assert NF.softmax(X, 1).grad_fn is None
        assert NF.cross_entropy(X, T).grad_fn is None


def test_composite_gradgradcheck_through_softmax():
    from fusegrad.autograd.gradcheck import gradgradcheck
    assert gradgradcheck(lambda v: NF.log_softmax(v, 1), (t64(randn(2, 3), True),))


# --------------------------------------------------------------------------- modules: layers


def test_module_forwards_match_functional():
    fusegrad.manual_seed(0)
    x = fusegrad.randn(4, 5)
    cases = [
        (nn.ReLU(), NF.relu(x)), (nn.GELU(), NF.gelu(x)),
        (nn.GELU("tanh"), NF.gelu(x, approximate="tanh")), (nn.Tanh(), NF.tanh(x)),
        (nn.Sigmoid(), NF.sigmoid(x)), (nn.SiLU(), NF.silu(x)),
        (nn.Softmax(dim=1), NF.softmax(x, 1)), (nn.LogSoftmax(dim=0), NF.log_softmax(x, 0)),
        (nn.LeakyReLU(0.2), NF.leaky_relu(x, 0.2)), (nn.Softplus(2.0, 5.0), NF.softplus(x, 2, 5)),
        (nn.Identity(3, foo=1), x), (nn.Flatten(0), x.reshape(-1)),
    ]
    for module, expected in cases:
        np.testing.assert_array_equal(module(x).detach().numpy(), expected.detach().numpy())
    y = fusegrad.randn(4, 5)
    t = fusegrad.tensor([0, 1, 4, 2])
    assert nn.MSELoss()(x, y).item() == NF.mse_loss(x, y).item()
    assert nn.L1Loss(reduction="sum")(x, y).item() == NF.l1_loss(x, y, reduction="sum").item()
    assert nn.CrossEntropyLoss(label_smoothing=0.1)(x, t).item() == \
        NF.cross_entropy(x, t, label_smoothing=0.1).item()
    assert nn.NLLLoss()(x, t).item() == NF.nll_loss(x, t).item()
    p = NF.sigmoid(y)
    assert nn.BCELoss()(NF.sigmoid(x), p).item() == NF.binary_cross_entropy(NF.sigmoid(x),
                                                                             p).item()
    pw = fusegrad.full((5,), 2.0)
    assert nn.BCEWithLogitsLoss(pos_weight=pw)(x, p).item() == \
        NF.binary_cross_entropy_with_logits(x, p, pos_weight=pw).item()


def test_linear_default_init_bounds_and_seed():
    fusegrad.manual_seed(0)
    a = nn.Linear(50, 40)
    fusegrad.manual_seed(0)
    b = nn.Linear(50, 40)
    np.testing.assert_array_equal(a.weight.detach().numpy(), b.weight.detach().numpy())
    bound = 1 / math.sqrt(50)     # kaiming_uniform_(a=sqrt(5)) gives exactly this bound
    w = a.weight.detach().numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound
    assert np.abs(a.bias.detach().numpy()).max() <= bound
    assert a.weight.shape == (40, 50) and a.weight.dtype is fusegrad.float32
    assert nn.Linear(2, 3, dtype=fusegrad.float64).weight.dtype is fusegrad.float64
    assert nn.Linear(2, 3, bias=False).bias is None


def test_embedding_module_padding_and_from_pretrained():
    emb = nn.Embedding(10, 3, padding_idx=-1)
    assert emb.padding_idx == 9
    assert emb.weight[9].tolist() == [0.0, 0.0, 0.0]
    out = emb(fusegrad.tensor([[9, 1]]))
    assert tuple(out.shape) == (1, 2, 3)
    out.sum().backward()
    assert emb.weight.grad[9].tolist() == [0.0, 0.0, 0.0]
    assert emb.weight.grad[1].tolist() == [1.0, 1.0, 1.0]
    pre = nn.Embedding.from_pretrained(fusegrad.ones(2, 3))
    assert repr(pre) == "Embedding(2, 3)" and pre.weight.requires_grad is False
    with pytest.raises(AssertionError, match="Padding_idx must be within num_embeddings"):
        nn.Embedding(3, 2, padding_idx=3)


def test_layernorm_module_parameters():
    ln = nn.LayerNorm((2, 3))
    assert ln.weight.tolist() == [[1.0] * 3] * 2 and ln.bias.tolist() == [[0.0] * 3] * 2
    assert [n for n, _ in nn.LayerNorm(3, bias=False).named_parameters()] == ["weight"]
    assert list(nn.LayerNorm(3, elementwise_affine=False).parameters()) == []
    x = fusegrad.randn(4, 2, 3)
    np.testing.assert_allclose(ln(x).detach().numpy(), np_layer_norm(x.numpy(), 2), atol=1e-6)


def test_dropout_module_respects_train_and_eval():
    fusegrad.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
    x = fusegrad.randn(16, 8)
    assert model.training and model[1].training
    a, b = model(x), model(x)
    assert not np.array_equal(a.detach().numpy(), b.detach().numpy())
    model.eval()
    assert not model[1].training
    np.testing.assert_array_equal(model(x).detach().numpy(), model(x).detach().numpy())
    np.testing.assert_array_equal(model(x).detach().numpy(), model[0](x).detach().numpy())
    model.train()
    assert model[1].training
    with pytest.raises(ValueError, match="training mode is expected to be boolean"):
        model.train("yes")


# --------------------------------------------------------------------------- modules: reprs

SEQUENTIAL_REPR = """Sequential(
  (0): Linear(in_features=3, out_features=4, bias=True)
  (1): ReLU()
  (2): Sequential(
    (0): Linear(in_features=4, out_features=4, bias=False)
    (1): GELU(approximate='tanh')
  )
  (3): Dropout(p=0.1, inplace=False)
  (4): LayerNorm((4,), eps=1e-05, elementwise_affine=True, bias=True)
  (5): Embedding(10, 3, padding_idx=0)
)"""


def make_nested() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(),
                         nn.Sequential(nn.Linear(4, 4, bias=False), nn.GELU(approximate="tanh")),
                         nn.Dropout(0.1), nn.LayerNorm(4), nn.Embedding(10, 3, padding_idx=0))


def test_reprs_match_torch():
    assert repr(make_nested()) == SEQUENTIAL_REPR
    assert repr(nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2), nn.ReLU()])) == (
        "ModuleList(\n  (0-1): 2 x Linear(in_features=2, out_features=2, bias=True)\n"
        "  (2): ReLU()\n)")
    assert repr(nn.ModuleList()) == "ModuleList()"
    assert repr(nn.ModuleDict({"a": nn.Tanh(), "b": nn.Sigmoid()})) == (
        "ModuleDict(\n  (a): Tanh()\n  (b): Sigmoid()\n)")
    singles = {
        nn.Softplus(): "Softplus(beta=1.0, threshold=20.0)",
        nn.LeakyReLU(): "LeakyReLU(negative_slope=0.01)",
        nn.LeakyReLU(0.2, inplace=True): "LeakyReLU(negative_slope=0.2, inplace=True)",
        nn.ReLU(inplace=True): "ReLU(inplace=True)",
        nn.SiLU(): "SiLU()", nn.Softmax(dim=1): "Softmax(dim=1)",
        nn.LogSoftmax(1): "LogSoftmax(dim=1)", nn.Softmax(): "Softmax(dim=None)",
        nn.Flatten(): "Flatten(start_dim=1, end_dim=-1)", nn.Identity(): "Identity()",
        nn.CrossEntropyLoss(): "CrossEntropyLoss()", nn.MSELoss(): "MSELoss()",
        nn.GELU(): "GELU(approximate='none')",
        nn.LayerNorm((2, 3), elementwise_affine=False):
            "LayerNorm((2, 3), eps=1e-05, elementwise_affine=False, bias=False)",
        nn.LayerNorm(3, bias=False):
            "LayerNorm((3,), eps=1e-05, elementwise_affine=True, bias=False)",
        nn.Conv2d(2, 4, 3, padding="same"):
            "Conv2d(2, 4, kernel_size=(3, 3), stride=(1, 1), padding=same)",
        nn.AvgPool1d(3, count_include_pad=False):
            "AvgPool1d(kernel_size=(3,), stride=(3,), padding=(0,))",
        nn.RNN(3, 4, nonlinearity="relu"): "RNN(3, 4)",
        nn.RNNCell(3, 4, nonlinearity="relu"): "RNNCell(3, 4, nonlinearity=relu)",
        nn.Unfold(kernel_size=2): "Unfold(kernel_size=2, dilation=1, padding=0, stride=1)",
        nn.Fold((4, 4), 2):
            "Fold(output_size=(4, 4), kernel_size=2, dilation=1, padding=0, stride=1)",
        nn.ParameterList([nn.Parameter(fusegrad.ones(2)), fusegrad.ones(2, 3)]):
            "ParameterList(\n    (0): Parameter containing: [fusegrad.float32 of size 2]\n"
            "    (1): Parameter containing: [fusegrad.float32 of size 2x3]\n)",
        nn.ParameterDict({"a": fusegrad.ones(2)}):
            "ParameterDict(  (a): Parameter containing: [fusegrad.FloatTensor of size 2])",
        nn.MultiheadAttention(4, 2):
            "MultiheadAttention(\n  (out_proj): NonDynamicallyQuantizableLinear(in_features=4, "
            "out_features=4, bias=True)\n)",
    }
    for module, text in singles.items():
        assert repr(module) == text


def test_custom_module_repr_and_extra_repr():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)
            self.act = nn.Sequential(nn.Tanh())

        def extra_repr(self):
            return "scale=2"

    assert repr(Block()) == ("Block(\n  scale=2\n  (fc): Linear(in_features=2, out_features=2, "
                             "bias=True)\n  (act): Sequential(\n    (0): Tanh()\n  )\n)")


def test_parameter_repr_and_semantics():
    data = fusegrad.tensor([1.0, 2.0])
    p = nn.Parameter(data)
    assert repr(p) == "Parameter containing:\ntensor([1., 2.], requires_grad=True)"
    assert repr(nn.Parameter(data, requires_grad=False)) == \
        "Parameter containing:\ntensor([1., 2.])"
    assert isinstance(p, fusegrad.Tensor) and p.is_leaf and p.requires_grad
    with fusegrad.no_grad():
        p.add_(1)
    assert data.tolist() == [2.0, 3.0]      # shares storage with its data
    assert type(p * 2) is fusegrad.Tensor
    assert nn.Parameter().shape == (0,)
    q = pickle.loads(pickle.dumps(p))
    assert isinstance(q, nn.Parameter) and q.requires_grad and q.tolist() == [2.0, 3.0]


# --------------------------------------------------------------------------- modules: API


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 3)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(3, 1))
        self.register_buffer("running", fusegrad.zeros(3))
        self.register_buffer("scratch", fusegrad.zeros(2), persistent=False)

    def forward(self, x):
        return self.head(self.fc(x) + self.running)


def test_registration_and_traversal():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == ["fc.weight", "fc.bias", "head.1.weight",
                                                      "head.1.bias"]
    assert [n for n, _ in net.named_parameters(prefix="m")][0] == "m.fc.weight"
    assert [n for n, _ in net.named_parameters(recurse=False)] == []
    assert sum(p.numel() for p in net.parameters()) == 2 * 3 + 3 + 3 + 1
    assert [n for n, _ in net.named_buffers()] == ["running", "scratch"]
    # A module's own parameters and buffers come before its children's (torch's order).
    assert list(net.state_dict()) == ["running", "fc.weight", "fc.bias", "head.1.weight",
                                      "head.1.bias"]
    assert [n for n, _ in net.named_children()] == ["fc", "head"]
    assert [n for n, _ in net.named_modules()] == ["", "fc", "head", "head.0", "head.1"]
    assert net.get_submodule("head.1") is net.head[1]
    assert net.get_parameter("head.1.bias") is net.head[1].bias
    assert net.get_buffer("running") is net.running
    with pytest.raises(AttributeError, match="Linear has no attribute `foo`"):
        net.get_submodule("fc.foo")
    with pytest.raises(AttributeError, match="`weight` is not an nn.Module"):
        net.get_submodule("fc.weight")
    assert tuple(net(fusegrad.randn(5, 2)).shape) == (5, 1)


def test_shared_parameters_are_deduplicated():
    shared = nn.Linear(2, 2)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    assert len(list(model.parameters())) == 2
    assert [n for n, _ in model.named_modules()] == ["", "0", "1"]
    assert len(list(model.named_parameters(remove_duplicate=False))) == 4
    model.fc = nn.Linear(2, 2)
    model.fc.weight = shared.weight
    assert len(list(model.parameters())) == 3


def test_setattr_getattr_delattr_rules():
    net = Net()
    with pytest.raises(TypeError) as err:
        net.fc.weight = fusegrad.zeros(3, 2)
    assert str(err.value) == ("cannot assign 'fusegrad.FloatTensor' as parameter 'weight' "
                              "(torch.nn.Parameter or None expected)")
    net.fc.bias = None
    assert net.fc.bias is None and "bias" in net.fc._parameters
    net.running = fusegrad.ones(3)          # a registered buffer stays a buffer
    assert net.get_buffer("running").tolist() == [1.0, 1.0, 1.0]
    net.extra = nn.Tanh()
    assert "extra" in net._modules
    del net.extra
    assert "extra" not in net._modules
    with pytest.raises(AttributeError) as err:
        _ = net.missing
    assert str(err.value) == "'Net' object has no attribute 'missing'"
    net.plain = 3
    assert net.plain == 3 and "plain" not in net._parameters

    class Bad(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(1, 1)
    with pytest.raises(AttributeError, match=r"cannot assign module before Module.__init__\(\) "
                                             r"call"):
        Bad()


def test_register_errors_match_torch():
    lin = nn.Linear(2, 2)
    with pytest.raises(TypeError) as err:
        lin.register_parameter("w2", fusegrad.zeros(2))
    assert str(err.value) == ("cannot assign 'fusegrad.FloatTensor' object to parameter 'w2' "
                              "(torch.nn.Parameter or None required)")
    with pytest.raises(TypeError) as err:
        lin.register_buffer("b2", 3)
    assert str(err.value) == "cannot assign 'int' object to buffer 'b2' (torch Tensor or None " \
                             "required)"
    # KeyError's str() quotes its message: compare args[0].
    for call, message in [
            (lambda: lin.register_buffer("weight", fusegrad.zeros(1)),
             "attribute 'weight' already exists"),
            (lambda: lin.register_buffer("a.b", fusegrad.zeros(1)),
             'buffer name can\'t contain "."'),
            (lambda: lin.add_module("a.b", nn.ReLU()), 'module name can\'t contain ".", got: a.b'),
    ]:
        with pytest.raises(KeyError) as err:
            call()
        assert err.value.args[0] == message
    with pytest.raises(TypeError, match="int is not a Module subclass"):
        lin.add_module("c", 3)
    with pytest.raises(NotImplementedError, match=r'Module \[Module\] is missing the required '
                                                  r'"forward" function'):
        nn.Module()(1)


def test_state_dict_round_trip_and_strict_errors():
    fusegrad.manual_seed(0)
    a, b = Net(), Net()
    a.running.add_(1.5)
    result = b.load_state_dict(a.state_dict())
    assert repr(result) == "<All keys matched successfully>"
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert na == nb
        np.testing.assert_array_equal(pa.numpy(), pb.numpy())
    # state_dict values are detached views: not the parameters, but their storage.
    sd = a.state_dict()
    assert not sd["fc.weight"].requires_grad and sd["fc.weight"] is not a.fc.weight
    assert a.state_dict(keep_vars=True)["fc.weight"] is a.fc.weight
    # the loaded model keeps its own Parameter objects
    weight = b.fc.weight
    b.load_state_dict(a.state_dict())
    assert b.fc.weight is weight

    lin = nn.Linear(3, 2)
    with pytest.raises(RuntimeError) as err:
        lin.load_state_dict({"weight": fusegrad.zeros(3, 3), "foo": fusegrad.zeros(1)})
    assert str(err.value) == (
        'Error(s) in loading state_dict for Linear:\n\tMissing key(s) in state_dict: "bias". '
        '\n\tUnexpected key(s) in state_dict: "foo". \n\tsize mismatch for weight: copying a '
        "param with shape fusegrad.Size([3, 3]) from checkpoint, the shape in current model is "
        "fusegrad.Size([2, 3]).")
    result = lin.load_state_dict({"weight": fusegrad.zeros(2, 3), "foo": fusegrad.zeros(1)},
                                 strict=False)
    assert repr(result) == "_IncompatibleKeys(missing_keys=['bias'], unexpected_keys=['foo'])"
    assert lin.weight.tolist() == [[0.0] * 3] * 2


def test_state_dict_loads_float64_values_into_float32_params():
    lin = nn.Linear(2, 1)
    lin.load_state_dict({"weight": t64([[1.0, 2.0]]), "bias": t64([3.0])})
    assert lin.weight.dtype is fusegrad.float32 and lin.weight.tolist() == [[1.0, 2.0]]



def test_load_state_dict_assign_keeps_the_modules_requires_grad():
    frozen = nn.Linear(2, 2)
    frozen.weight.requires_grad_(False)
    source = nn.Linear(2, 2)
    frozen.load_state_dict(source.state_dict(keep_vars=True), assign=True)
    assert frozen.weight is source.weight and frozen.bias is source.bias
    assert not frozen.weight.requires_grad and frozen.bias.requires_grad
    frozen.bias.requires_grad_(False)
    frozen.load_state_dict({"weight": fusegrad.ones(2, 2), "bias": fusegrad.ones(2)}, assign=True)
    assert isinstance(frozen.bias, nn.Parameter) and not frozen.bias.requires_grad


class _WithExtraState(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(1, 1)
        self.step = 0

    def get_extra_state(self):
        return {"step": self.step}

    def set_extra_state(self, state):
        self.step = state["step"]


def test_state_dict_saves_and_loads_extra_state(tmp_path):
    a = _WithExtraState()
    a.step = 7
    sd = a.state_dict()
    assert list(sd) == ["_extra_state", "fc.weight", "fc.bias"]
    fusegrad.save(nn.Sequential(a).state_dict(), tmp_path / "m.fg")
    b = nn.Sequential(_WithExtraState())
    assert repr(b.load_state_dict(fusegrad.load(tmp_path / "m.fg"))) == \
        "<All keys matched successfully>"
    assert b[0].step == 7
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "_extra_state"'):
        _WithExtraState().load_state_dict({"fc.weight": fusegrad.ones(1, 1),
                                           "fc.bias": fusegrad.ones(1)})
    # a module without extra state does not expect one
    lin = nn.Linear(1, 1)
    full = {"weight": fusegrad.ones(1, 1), "bias": fusegrad.ones(1), "_extra_state": 3}
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "_extra_state"'):
        lin.load_state_dict(full)
    assert lin.load_state_dict(full, strict=False).unexpected_keys == ["_extra_state"]


def test_batchnorm_loads_state_dict_without_num_batches_tracked():
    # torch loads state dicts written before num_batches_tracked existed (and safetensors
    # exports that drop it), keeping the module's count
    bn = nn.BatchNorm1d(2)
    bn(fusegrad.randn(4, 2))
    sd = {k: v for k, v in bn.state_dict().items() if k != "num_batches_tracked"}
    fresh = nn.Sequential(nn.BatchNorm1d(2))
    result = fresh.load_state_dict({"0." + k: v for k, v in sd.items()})
    assert repr(result) == "<All keys matched successfully>"
    assert fresh[0].num_batches_tracked.item() == 0
    assert bn.load_state_dict(sd).missing_keys == [] and bn.num_batches_tracked.item() == 1
def test_zero_grad_requires_grad_apply_and_to():
    net = Net()
    net(fusegrad.randn(4, 2)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.numpy().any() for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())

    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())
    net.requires_grad_()

    seen = []
    assert net.apply(lambda m: seen.append(type(m).__name__)) is net
    assert seen == ["Linear", "ReLU", "Linear", "Sequential", "Net"]

    weight = net.fc.weight
    net(fusegrad.randn(4, 2)).sum().backward()
    grad = weight.grad
    assert net.double() is net
    assert net.fc.weight is weight and weight.dtype is fusegrad.float64
    assert weight.grad is grad and grad.dtype is fusegrad.float64     # torch keeps it too
    assert net.running.dtype is fusegrad.float64
    assert net(t64(randn(2, 2))).dtype is fusegrad.float64
    net.to(fusegrad.float32)
    assert weight.dtype is fusegrad.float32 and net.float() is net
    with pytest.raises(TypeError, match="nn.Module.to only accepts floating point or complex "
                                        "dtypes, but got desired dtype=fusegrad.int64"):
        net.to(fusegrad.int64)


def test_deepcopy_copies_parameters():
    net = Net()
    twin = copy.deepcopy(net)
    assert twin.fc.weight is not net.fc.weight
    assert isinstance(twin.fc.weight, nn.Parameter) and twin.fc.weight.requires_grad
    np.testing.assert_array_equal(twin.fc.weight.detach().numpy(), net.fc.weight.detach().numpy())
    with fusegrad.no_grad():
        twin.fc.weight.add_(1)
    assert not np.array_equal(twin.fc.weight.detach().numpy(), net.fc.weight.detach().numpy())
    thawed = pickle.loads(pickle.dumps(net))
    assert isinstance(thawed.fc.weight, nn.Parameter)
    assert list(thawed.state_dict()) == list(net.state_dict())
    x = fusegrad.randn(3, 2)
    np.testing.assert_array_equal(thawed(x).detach().numpy(), net(x).detach().numpy())
    assert {"fc", "head", "running", "forward"} <= set(dir(net))


def test_forward_hooks():
    lin = nn.Linear(2, 2)
    calls = []
    h1 = lin.register_forward_pre_hook(lambda m, args: calls.append("pre"))
    h2 = lin.register_forward_hook(lambda m, args, out: out * 0)
    assert lin(fusegrad.ones(1, 2)).tolist() == [[0.0, 0.0]] and calls == ["pre"]
    h1.remove()
    h2.remove()
    assert lin(fusegrad.ones(1, 2)).abs().sum().item() > 0 and calls == ["pre"]


def test_forward_hook_options_follow_torch():
    """prepend, with_kwargs (pre-hook: may return (args, kwargs); hook: sees kwargs) and
    always_call (runs, with output None, when forward raises)."""
    class Scale(nn.Module):
        def forward(self, x, *, k=1.0):
            if k < 0:
                raise ValueError("negative k")
            return x * k

    m = Scale()
    order = []
    m.register_forward_pre_hook(lambda mod, args: order.append("first"))
    m.register_forward_pre_hook(lambda mod, args: order.append("prepended"), prepend=True)
    m.register_forward_pre_hook(lambda mod, args, kwargs: (args, {"k": kwargs["k"] * 10}),
                                with_kwargs=True)
    seen = []
    m.register_forward_hook(lambda mod, args, kwargs, out: seen.append(kwargs["k"]) or out + 1,
                            with_kwargs=True)
    ended = []
    m.register_forward_hook(lambda mod, args, out: ended.append(out), always_call=True)
    out = m(fusegrad.ones(2), k=2.0)
    assert out.tolist() == [21.0, 21.0] and order == ["prepended", "first"] and seen == [20.0]
    assert ended[-1].tolist() == [21.0, 21.0]
    with pytest.raises(ValueError, match="negative k"):
        m(fusegrad.ones(2), k=-1.0)
    assert ended[-1] is None and seen == [20.0]
    bad = nn.Identity()
    bad.register_forward_pre_hook(lambda mod, args, kwargs: args, with_kwargs=True)
    with pytest.raises(RuntimeError, match="forward pre-hook must return None or a tuple"):
        bad(fusegrad.ones(1))


def test_missing_module_methods_say_they_are_not_implemented():
    with pytest.raises(AttributeError, match="register_full_backward_hook is not implemented in "
                                             "fusegrad yet"):
        _ = nn.Linear(2, 2).register_full_backward_hook
    with pytest.raises(AttributeError, match="^'Linear' object has no attribute 'nonsense'$"):
        _ = nn.Linear(2, 2).nonsense


# --------------------------------------------------------------------------- containers


def test_sequential_container_behaviour():
    a, b, c = nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)
    seq = nn.Sequential(a, b, c)
    assert len(seq) == 3 and seq[0] is a and seq[-1] is c and list(seq) == [a, b, c]
    sub = seq[1:]
    assert isinstance(sub, nn.Sequential) and list(sub._modules) == ["1", "2"]
    with pytest.raises(IndexError, match="index 10 is out of range"):
        seq[10]
    x = fusegrad.randn(4, 2)
    np.testing.assert_array_equal(seq(x).detach().numpy(), c(b(a(x))).detach().numpy())
    seq.append(nn.Tanh())
    assert len(seq) == 4 and list(seq._modules) == ["0", "1", "2", "3"]
    seq[3] = nn.Sigmoid()
    assert isinstance(seq[3], nn.Sigmoid)
    del seq[1]
    assert list(seq._modules) == ["0", "1", "2"] and seq[1] is c
    seq.insert(1, nn.GELU())
    assert isinstance(seq[1], nn.GELU) and len(seq) == 4
    named = nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2)), ("act", nn.ReLU())]))
    assert repr(named) == ("Sequential(\n  (fc): Linear(in_features=2, out_features=2, "
                           "bias=True)\n  (act): ReLU()\n)")
    assert [n for n, _ in named.named_parameters()] == ["fc.weight", "fc.bias"]
    assert named.fc is named[0]


def test_module_list_and_dict():
    layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    assert len(layers) == 3 and len(list(layers.parameters())) == 6
    layers.append(nn.ReLU())
    layers.extend([nn.Tanh()])
    assert isinstance(layers[-1], nn.Tanh) and len(layers[1:3]) == 2
    layers += [nn.Sigmoid()]
    assert len(layers) == 6

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(1, 1), nn.Linear(1, 1)])
            self.heads = nn.ModuleDict({"a": nn.Linear(1, 2), "b": nn.Linear(1, 3)})

    h = Holder()
    assert [n for n, _ in h.named_parameters()] == [
        "blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias",
        "heads.a.weight", "heads.a.bias", "heads.b.weight", "heads.b.bias"]
    assert list(h.heads.keys()) == ["a", "b"] and "a" in h.heads and len(h.heads) == 2
    h.heads["c"] = nn.Tanh()
    assert list(h.heads) == ["a", "b", "c"]
    assert isinstance(h.heads.pop("c"), nn.Tanh) and len(h.heads) == 2


# --------------------------------------------------------------------------- init


def test_calculate_gain():
    assert nn.init.calculate_gain("linear") == 1
    assert nn.init.calculate_gain("sigmoid") == 1
    assert nn.init.calculate_gain("relu") == math.sqrt(2)
    assert nn.init.calculate_gain("tanh") == 5 / 3
    assert nn.init.calculate_gain("selu") == 0.75
    assert nn.init.calculate_gain("leaky_relu") == 1.4141428569978354
    assert nn.init.calculate_gain("leaky_relu", 0.2) == math.sqrt(2 / 1.04)
    with pytest.raises(ValueError, match="Unsupported nonlinearity foo"):
        nn.init.calculate_gain("foo")


def test_init_functions_statistics_and_bounds():
    fusegrad.manual_seed(0)
    w = fusegrad.empty(400, 300)
    assert nn.init.uniform_(w, -2, 3) is w
    assert w.numpy().min() >= -2 and w.numpy().max() < 3
    nn.init.normal_(w, 1.0, 2.0)
    assert abs(w.numpy().mean() - 1.0) < 0.02 and abs(w.numpy().std() - 2.0) < 0.02
    nn.init.xavier_uniform_(w)
    bound = math.sqrt(6 / 700)
    assert np.abs(w.numpy()).max() <= bound
    nn.init.xavier_normal_(w, gain=2.0)
    assert abs(w.numpy().std() - 2 * math.sqrt(2 / 700)) < 0.002
    nn.init.kaiming_uniform_(w, nonlinearity="relu")
    assert np.abs(w.numpy()).max() <= math.sqrt(6 / 300)
    nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu")
    assert abs(w.numpy().std() - math.sqrt(2 / 400)) < 0.001
    nn.init.trunc_normal_(w, mean=0.5, std=1.0, a=-1.0, b=1.5)
    values = w.numpy()
    assert values.min() >= -1.0 and values.max() <= 1.5
    # mean of N(0.5, 1) truncated to [-1, 1.5] (from the closed form)
    from math import erf, exp, pi, sqrt
    alpha, beta = -1.5, 1.0
    phi = [exp(-v * v / 2) / sqrt(2 * pi) for v in (alpha, beta)]
    z = (erf(beta / sqrt(2)) - erf(alpha / sqrt(2))) / 2
    assert abs(values.mean() - (0.5 + (phi[0] - phi[1]) / z)) < 0.01
    nn.init.constant_(w, 0.3)
    assert np.all(w.numpy() == np.float32(0.3))
    nn.init.zeros_(w)
    assert not w.numpy().any()
    nn.init.ones_(w)
    assert np.all(w.numpy() == 1)
    e = nn.init.eye_(fusegrad.empty(2, 3))
    assert e.tolist() == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]


def test_init_on_parameters_needs_no_no_grad_and_errors():
    p = nn.Parameter(fusegrad.empty(3, 4))
    nn.init.kaiming_uniform_(p)
    assert p.requires_grad and p.is_leaf and p.grad_fn is None
    with pytest.raises(ValueError, match="Fan in and fan out can not be computed for tensor with "
                                         "fewer than 2 dimensions"):
        nn.init.kaiming_uniform_(fusegrad.zeros(3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nn.init.kaiming_uniform_(fusegrad.empty(0, 3))
    assert "Initializing zero-element tensors is a no-op" in str(caught[0].message)


def test_erfinv_helper_is_accurate():
    from fusegrad.nn.init import _erfinv
    y = np.linspace(-0.999, 0.999, 101)
    x = _erfinv(t64(y)).numpy()
    np.testing.assert_allclose(_erf(x), y, atol=1e-12)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("weighted", [False, True])
def test_a_batch_of_ignored_targets_has_a_nan_loss_and_zero_gradients(smoothing, weighted):
    # torch: the mean over no targets is NaN and the gradient 0 (an all-padding batch must
    # not poison the parameters); the 0/0 gave NaN gradients to every logit.
    x = fusegrad.tensor([[0.1, 0.2, 0.3], [0.5, -1.0, 2.0]], requires_grad=True)
    w = fusegrad.tensor([1.0, 2.0, 3.0]) if weighted else None
    loss = fusegrad.nn.functional.cross_entropy(x, fusegrad.tensor([-100, -100]), weight=w,
                                                label_smoothing=smoothing)
    loss.backward()
    assert np.isnan(loss.item())
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros((2, 3), np.float32))


def test_out_arguments_are_written():
    x = fusegrad.randn(3, 4)
    out = fusegrad.zeros(3, 4)
    assert fusegrad.nn.functional.normalize(x, out=out) is out
    np.testing.assert_allclose(out.numpy(), fusegrad.nn.functional.normalize(x).numpy())
    a, b = fusegrad.randn(2, 3), fusegrad.randn(3, 4)
    out = fusegrad.zeros(2, 4)
    fusegrad.tensordot(a, b, 1, out=out)
    np.testing.assert_allclose(out.numpy(), (a @ b).numpy(), rtol=1e-6)
    with pytest.raises(RuntimeError, match="not resized"):
        fusegrad.tensordot(a, b, 1, out=fusegrad.zeros(2, 5))
