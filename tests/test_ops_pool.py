"""Pooling: values and indices against direct numpy loops, gradients against finite
differences (and the max's gradient going to one element, as torch's), traced and compiled runs
against eager, and torch as an optional oracle."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import fusegrad
from fusegrad import nn
from fusegrad.autograd.gradcheck import gradcheck
from fusegrad.nn import functional as NF

RNG = np.random.default_rng(11)


def f32(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _out(n, k, s, p, d, ceil):
    span = n + 2 * p - d * (k - 1) - 1
    o = (-(-span // s) if ceil else span // s) + 1
    if ceil and (o - 1) * s >= n + p:
        o -= 1
    return o


def max_pool_ref(x, k, s, p=0, d=1, ceil=False):
    """Max and flat argmax (first maximum) per window, skipping padding; any spatial dims. A
    window of -inf values points at its first element in the input, as torch's does."""
    nd = x.ndim - 2
    k, s, p, d = (np.broadcast_to(v, nd) for v in (k, s, p, d))
    sp = x.shape[2:]
    out = [_out(sp[a], k[a], s[a], p[a], d[a], ceil) for a in range(nd)]
    vals = np.full(x.shape[:2] + tuple(out), -np.inf)
    idx = np.zeros(x.shape[:2] + tuple(out), dtype=np.int64)
    for nc in np.ndindex(*x.shape[:2]):
        for pos in np.ndindex(*out):
            seen = False
            for kk in itertools.product(*(range(v) for v in k)):
                at = [pos[a] * s[a] - p[a] + kk[a] * d[a] for a in range(nd)]
                if all(0 <= at[a] < sp[a] for a in range(nd)):
                    v = x[nc + tuple(at)]
                    if v > vals[nc + pos] or not seen:
                        seen = True
                        vals[nc + pos] = v
                        idx[nc + pos] = np.ravel_multi_index(at, sp)
    return vals, idx


def avg_pool_ref(x, k, s, p=0, ceil=False, count_include_pad=True, divisor_override=None):
    nd = x.ndim - 2
    k, s, p = (np.broadcast_to(v, nd) for v in (k, s, p))
    sp = x.shape[2:]
    out = [_out(sp[a], k[a], s[a], p[a], 1, ceil) for a in range(nd)]
    y = np.zeros(x.shape[:2] + tuple(out))
    for pos in np.ndindex(*out):
        start = [pos[a] * s[a] - p[a] for a in range(nd)]
        end = [min(start[a] + k[a], sp[a] + p[a]) for a in range(nd)]
        pool = np.prod([end[a] - start[a] for a in range(nd)])
        lo = [max(v, 0) for v in start]
        hi = [min(end[a], sp[a]) for a in range(nd)]
        win = x[(Ellipsis,) + tuple(slice(lo[a], hi[a]) for a in range(nd))]
        div = divisor_override or (pool if count_include_pad else np.prod(
            [hi[a] - lo[a] for a in range(nd)]))
        y[(Ellipsis,) + pos] = win.sum(axis=tuple(range(2, 2 + nd))) / div
    return y


def adaptive_ref(x, size, fn):
    nd = x.ndim - 2
    sp = x.shape[2:]
    y = np.zeros(x.shape[:2] + tuple(size))
    for pos in np.ndindex(*size):
        sl = tuple(slice(pos[a] * sp[a] // size[a], -(-(pos[a] + 1) * sp[a] // size[a]))
                   for a in range(nd))
        y[(Ellipsis,) + pos] = fn(x[(Ellipsis,) + sl], axis=tuple(range(2, 2 + nd)))
    return y


MAX_CASES = [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
             dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
             dict(kernel_size=(2, 3), stride=(1, 2), dilation=(2, 1)),
             dict(kernel_size=2, stride=3, ceil_mode=True)]


@pytest.mark.parametrize("kw", MAX_CASES, ids=str)
def test_max_pool2d_values_and_indices(kw):
    x = f32(2, 3, 7, 8)
    v, i = NF.max_pool2d(fusegrad.tensor(x), return_indices=True, **kw)
    rv, ri = max_pool_ref(x, kw["kernel_size"], kw.get("stride", kw["kernel_size"]),
                          kw.get("padding", 0), kw.get("dilation", 1), kw.get("ceil_mode", False))
    np.testing.assert_array_equal(v.numpy(), rv.astype(np.float32))
    np.testing.assert_array_equal(i.numpy(), ri)
    assert i.dtype is fusegrad.int64


def test_max_pool1d_and_unbatched():
    x = f32(2, 3, 9)
    v, i = fusegrad.max_pool1d(fusegrad.tensor(x), 3, 2, 1, return_indices=True)
    rv, ri = max_pool_ref(x, 3, 2, 1)
    np.testing.assert_array_equal(v.numpy(), rv.astype(np.float32))
    np.testing.assert_array_equal(i.numpy(), ri)
    y = NF.max_pool2d(fusegrad.tensor(x), 2)        # (C, H, W) unbatched
    np.testing.assert_array_equal(y.numpy(), max_pool_ref(x[None], 2, 2)[0][0])


def test_max_pool_gradient_goes_to_the_first_maximum():
    # ties everywhere: torch sends each window's gradient to one element, not split
    x = fusegrad.zeros(1, 1, 4, 4, requires_grad=True)
    NF.max_pool2d(x, 2).sum().backward()
    expect = np.zeros((4, 4))
    expect[::2, ::2] = 1
    np.testing.assert_array_equal(x.grad.numpy()[0, 0], expect)
    assert NF.max_pool2d(x, 2).grad_fn.name() == "MaxPool2DWithIndicesBackward0"


def test_max_pool_gradcheck():
    x = fusegrad.tensor(RNG.permutation(60).reshape(1, 3, 4, 5) / 7.0, requires_grad=True)
    assert gradcheck(lambda x: NF.max_pool2d(x, 3, 2, 1, ceil_mode=True), (x,))


AVG_CASES = [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
             dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
             dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
             dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
             dict(kernel_size=(2, 3), stride=1, divisor_override=4)]


@pytest.mark.parametrize("kw", AVG_CASES, ids=str)
def test_avg_pool2d_matches_loop(kw):
    x = f32(2, 3, 7, 8)
    y = NF.avg_pool2d(fusegrad.tensor(x), **kw)
    ref = avg_pool_ref(x, kw["kernel_size"], kw.get("stride", kw["kernel_size"]),
                       kw.get("padding", 0), kw.get("ceil_mode", False),
                       kw.get("count_include_pad", True), kw.get("divisor_override"))
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-6)


def test_avg_pool1d_and_gradcheck():
    x = f32(2, 3, 9)
    y = fusegrad.avg_pool1d(fusegrad.tensor(x), 3, 2, 1, ceil_mode=True, count_include_pad=False)
    np.testing.assert_allclose(y.numpy(), avg_pool_ref(x, 3, 2, 1, True, False), rtol=1e-5,
                               atol=1e-6)
    x64 = fusegrad.tensor(RNG.standard_normal((1, 2, 5, 5)), requires_grad=True)
    assert gradcheck(lambda x: NF.avg_pool2d(x, 3, 2, 1, ceil_mode=True,
                                             count_include_pad=False), (x64,))


@pytest.mark.parametrize("size", [(3, 4), (1, 1), (7, 3), (2, None)], ids=str)
def test_adaptive_pools_match_loop(size):
    x = f32(2, 3, 7, 6)
    full = tuple(x.shape[2 + a] if s is None else s for a, s in enumerate(size))
    avg = NF.adaptive_avg_pool2d(fusegrad.tensor(x), size)
    np.testing.assert_allclose(avg.numpy(), adaptive_ref(x, full, np.mean), rtol=1e-5, atol=1e-6)
    mx, idx = NF.adaptive_max_pool2d(fusegrad.tensor(x), size, return_indices=True)
    np.testing.assert_array_equal(mx.numpy(), adaptive_ref(x, full, np.max).astype(np.float32))
    flat = x.reshape(2, 3, -1)
    np.testing.assert_array_equal(np.take_along_axis(flat, idx.numpy().reshape(2, 3, -1), 2),
                                  mx.numpy().reshape(2, 3, -1))


def test_adaptive_1d_and_gradcheck():
    x = f32(2, 3, 10)
    np.testing.assert_allclose(fusegrad.adaptive_avg_pool1d(fusegrad.tensor(x), 4).numpy(),
                               adaptive_ref(x, (4,), np.mean), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(fusegrad.adaptive_max_pool1d(fusegrad.tensor(x), 4).numpy(),
                                  adaptive_ref(x, (4,), np.max).astype(np.float32))
    x64 = fusegrad.tensor(RNG.permutation(42).reshape(1, 2, 7, 3) / 5.0, requires_grad=True)
    assert gradcheck(lambda x: NF.adaptive_avg_pool2d(x, (3, 2)), (x64,))
    assert gradcheck(lambda x: NF.adaptive_max_pool2d(x, (3, 2)), (x64,))


def test_adaptive_avg_pool_keeps_inf_and_nan_in_their_own_windows():
    # only the windows holding the inf or NaN are inf or NaN, as a mean over each window is
    x = f32(1, 2, 7, 6)
    x[0, 0, 0, 0], x[0, 1, 4, 5] = np.inf, np.nan
    for size in [(3, 4), (2, 2), (7, 1), (1, 1)]:
        ref = adaptive_ref(x.astype(np.float64), size, np.mean)
        for f in (NF.adaptive_avg_pool2d, fusegrad.compile(NF.adaptive_avg_pool2d,
                                                           static_argnums=(1,))):
            np.testing.assert_allclose(f(fusegrad.tensor(x), size).numpy(), ref, rtol=1e-5,
                                       atol=1e-6)
    row = x[:, :, 0]
    np.testing.assert_allclose(NF.adaptive_avg_pool1d(fusegrad.tensor(row), 4).numpy(),
                               adaptive_ref(row.astype(np.float64), (4,), np.mean), rtol=1e-5)
    t = fusegrad.tensor(x, requires_grad=True)
    NF.adaptive_avg_pool2d(t, (3, 4)).sum().backward()
    assert np.isfinite(t.grad.numpy()).all()


def test_compiled_pools_match_eager():
    x = fusegrad.tensor(f32(2, 3, 7, 8))

    def f(x):
        v, i = NF.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True)
        return (v, i, NF.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
                NF.adaptive_avg_pool2d(x, (3, 5)), NF.adaptive_max_pool2d(x, (3, 5)))

    def loss(x):
        v, _, a, b, c = f(x)
        return (v * v).sum() + a.sum() + (b * b).sum() + c.sum()
    for e, c in zip(f(x), fusegrad.compile(f)(x)):
        np.testing.assert_allclose(c.numpy(), e.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fusegrad.compile(fusegrad.grad(loss))(x).numpy(),
                               fusegrad.grad(loss)(x).numpy(), rtol=1e-5, atol=1e-6)


def test_pool_modules():
    x = fusegrad.randn(2, 3, 8, 8)
    assert nn.MaxPool2d(2)(x).shape == (2, 3, 4, 4)
    v, i = nn.MaxPool2d(3, 2, 1, return_indices=True)(x)
    assert v.shape == i.shape == (2, 3, 4, 4)
    assert nn.AvgPool2d(2, ceil_mode=True)(fusegrad.randn(1, 1, 5, 5)).shape == (1, 1, 3, 3)
    assert nn.AdaptiveAvgPool2d((1, 1))(x).shape == (2, 3, 1, 1)
    assert nn.AdaptiveMaxPool2d(3)(x).shape == (2, 3, 3, 3)
    assert nn.MaxPool1d(2)(fusegrad.randn(2, 3, 8)).shape == (2, 3, 4)
    assert nn.AvgPool1d(2)(fusegrad.randn(2, 3, 8)).shape == (2, 3, 4)
    assert nn.AdaptiveAvgPool1d(3)(fusegrad.randn(2, 3, 8)).shape == (2, 3, 3)
    assert nn.AdaptiveMaxPool1d(3)(fusegrad.randn(2, 3, 8)).shape == (2, 3, 3)
    assert repr(nn.MaxPool2d(2)) == ("MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, "
                                     "ceil_mode=False)")


def test_pool_errors():
    with pytest.raises(RuntimeError, match="pad should be at most half"):
        NF.max_pool2d(fusegrad.zeros(1, 1, 4, 4), 2, padding=2)
    with pytest.raises(RuntimeError, match="Output size is too small"):
        NF.avg_pool2d(fusegrad.zeros(1, 1, 2, 2), 3)


def test_against_torch():
    torch = pytest.importorskip("torch")
    x = f32(2, 3, 7, 8)
    for kw in MAX_CASES:
        ours = NF.max_pool2d(fusegrad.tensor(x), return_indices=True, **kw)
        ref = torch.nn.functional.max_pool2d(torch.tensor(x), return_indices=True, **kw)
        np.testing.assert_array_equal(ours[0].numpy(), ref[0].numpy())
        np.testing.assert_array_equal(ours[1].numpy(), ref[1].numpy())
    for kw in AVG_CASES:
        np.testing.assert_allclose(NF.avg_pool2d(fusegrad.tensor(x), **kw).numpy(),
                                   torch.nn.functional.avg_pool2d(torch.tensor(x), **kw).numpy(),
                                   rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(NF.adaptive_avg_pool2d(fusegrad.tensor(x), (3, 5)).numpy(),
                               torch.nn.functional.adaptive_avg_pool2d(torch.tensor(x),
                                                                       (3, 5)).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_max_pool_nan_is_the_maximum_and_takes_the_gradient():
    x = fusegrad.tensor([[[[1.0, np.nan, 3.0, 4.0], [0.0, 0.0, -np.inf, 0.0]]]], requires_grad=True)
    y = NF.max_pool2d(x, 2)
    assert np.isnan(y.detach().numpy()[0, 0, 0, 0]) and y.detach().numpy()[0, 0, 0, 1] == 4.0
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy()[0, 0], [[0, 1, 0, 1], [0, 0, 0, 0]])


@pytest.mark.parametrize("kw", MAX_CASES, ids=str)
def test_max_pool_never_picks_padding_in_a_window_of_minus_inf(kw):
    # -inf values tie with the -inf padding: the index and the gradient go to the window's
    # first element in the input, eager and compiled
    x = f32(2, 3, 7, 8)
    x[x < 0.5] = -np.inf
    rv, ri = max_pool_ref(x, kw["kernel_size"], kw.get("stride", kw["kernel_size"]),
                          kw.get("padding", 0), kw.get("dilation", 1), kw.get("ceil_mode", False))
    w = f32(*ri.shape)
    ref_grad = np.zeros(x.size // 6)
    for f in (NF.max_pool2d, fusegrad.compile(NF.max_pool2d, static_argnames=tuple(kw) +
                                              ("return_indices",))):
        t = fusegrad.tensor(x, requires_grad=True)
        v, i = f(t, return_indices=True, **kw)
        np.testing.assert_array_equal(v.detach().numpy(), rv.astype(np.float32))
        np.testing.assert_array_equal(i.numpy(), ri)
        (v * fusegrad.tensor(w)).sum().backward()
        for nc in np.ndindex(2, 3):
            ref_grad[:] = 0
            np.add.at(ref_grad, ri[nc].ravel(), w[nc].ravel())
            np.testing.assert_allclose(t.grad.numpy()[nc].ravel(), ref_grad, rtol=1e-6)


def test_compiled_max_pool_runs_no_numpy_steps():
    # the first-maximum mask is elementwise work: no argmax/gather/scatter_add numpy steps
    from fusegrad.runtime.cpu import NumpyStep
    x = fusegrad.tensor(f32(2, 3, 6, 6))
    f = fusegrad.compile(fusegrad.grad(lambda x: (NF.max_pool2d(x, 2) ** 2).sum()))
    program = f.lower(x).program
    assert not [s for s in program.steps if isinstance(s, NumpyStep)], f.lower(x).kernels
    np.testing.assert_allclose(f(x).numpy(), fusegrad.grad(
        lambda x: (NF.max_pool2d(x, 2) ** 2).sum())(x).numpy(), rtol=1e-6)


def test_pool3d_matches_loops():
    x = f32(2, 2, 5, 4, 6)
    v, i = NF.max_pool3d(fusegrad.tensor(x), (3, 2, 2), (2, 2, 1), (1, 0, 1), ceil_mode=True,
                         return_indices=True)
    rv, ri = max_pool_ref(x, (3, 2, 2), (2, 2, 1), (1, 0, 1), 1, True)
    np.testing.assert_array_equal(v.numpy(), rv.astype(np.float32))
    np.testing.assert_array_equal(i.numpy(), ri)
    a = NF.avg_pool3d(fusegrad.tensor(x), 2, 1, 1, count_include_pad=False)
    np.testing.assert_allclose(a.numpy(), avg_pool_ref(x, 2, 1, 1, False, False), rtol=1e-5,
                               atol=1e-6)
    assert nn.MaxPool3d(2)(fusegrad.tensor(x)).shape == (2, 2, 2, 2, 3)
    assert nn.AvgPool3d(2)(fusegrad.tensor(x)).shape == (2, 2, 2, 2, 3)


def test_eager_max_pool_mask_from_argmax_equals_the_traced_elementwise_mask():
    # Eager CPU max pooling finds each window's first maximum with argmax; traced code builds
    # the elementwise mask. Ties, NaNs, signed zeros and infinities: same values and the
    # same gradient element, eager against compiled.
    rng = np.random.default_rng(5)
    x = rng.integers(-2, 3, (2, 3, 6, 6)).astype(np.float32)
    x[0, 0, 0, :2] = [np.nan, np.nan]
    x[0, 1, :2, :2] = [[-0.0, 0.0], [0.0, -0.0]]
    x[1, 2, 2:4, 2:4] = [[-np.inf, -np.inf], [-np.inf, -np.inf]]
    x[1, 0, 4:, 4:] = [[1.0, np.inf], [np.inf, np.nan]]
    t = fusegrad.tensor(x)
    w = fusegrad.tensor(rng.standard_normal((2, 3, 3, 3)).astype(np.float32))

    def loss(t):
        return (NF.max_pool2d(t, 2) * w).sum()
    eager_v = NF.max_pool2d(t, 2).numpy()
    compiled_v = fusegrad.compile(lambda t: NF.max_pool2d(t, 2))(t).numpy()
    np.testing.assert_array_equal(eager_v, compiled_v)
    np.testing.assert_array_equal(np.signbit(eager_v), np.signbit(compiled_v))
    eager_g = fusegrad.grad(loss)(t).numpy()
    compiled_g = fusegrad.compile(fusegrad.grad(loss))(t).numpy()
    np.testing.assert_array_equal(eager_g, compiled_g)
