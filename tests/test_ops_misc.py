"""``axis=`` for ``dim=``, lerp, addcmul/addcdiv, diagonal/diag/trace: values against numpy,
gradients against finite differences, compiled against eager."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad
from fusegrad.autograd.gradcheck import gradcheck

RNG = np.random.default_rng(9)


def t(*shape, requires_grad=False):
    return fusegrad.tensor(RNG.standard_normal(shape), requires_grad=requires_grad)


def test_axis_is_an_alias_of_dim():
    x = t(3, 4)
    a = x.numpy()
    np.testing.assert_allclose(fusegrad.sum(x, axis=1).numpy(), a.sum(1))
    np.testing.assert_allclose(x.mean(axis=0, keepdim=True).numpy(), a.mean(0, keepdims=True))
    np.testing.assert_allclose(x.std(axis=1).numpy(), a.std(1, ddof=1))
    np.testing.assert_array_equal(x.max(axis=1).indices.numpy(), a.argmax(1))
    np.testing.assert_array_equal(fusegrad.argmin(x, axis=0).numpy(), a.argmin(0))
    np.testing.assert_allclose(x.logsumexp(axis=1).numpy(), np.log(np.exp(a).sum(1)))
    np.testing.assert_allclose(fusegrad.cat([x, x], axis=1).numpy(), np.concatenate([a, a], 1))
    np.testing.assert_allclose(x.cumsum(axis=1).numpy(), a.cumsum(1))
    with pytest.raises(TypeError, match="both 'dim' and its alias 'axis'"):
        x.sum(dim=0, axis=0)


def test_lerp_addcmul_addcdiv():
    a, b, w = t(3, 4, requires_grad=True), t(3, 4, requires_grad=True), t(4, requires_grad=True)
    np.testing.assert_allclose(fusegrad.lerp(a, b, w).detach().numpy(),
                               a.detach().numpy() + w.detach().numpy() * (b - a).detach().numpy())
    assert fusegrad.lerp(a, b, 1.0).detach().numpy().tolist() == b.detach().numpy().tolist()
    assert gradcheck(fusegrad.lerp, (a, b, w))
    assert gradcheck(lambda a, b: fusegrad.lerp(a, b, 0.75), (a, b))
    c = t(3, 4, requires_grad=True)
    np.testing.assert_allclose(a.addcmul(b, c, value=0.5).detach().numpy(),
                               (a + 0.5 * b * c).detach().numpy())
    np.testing.assert_allclose(fusegrad.addcdiv(a, b, c, value=2).detach().numpy(),
                               (a + 2 * b / c).detach().numpy())
    assert gradcheck(lambda a, b, c: fusegrad.addcmul(a, b, c, value=-2), (a, b, c))
    x = fusegrad.ones(3)
    x.lerp_(fusegrad.zeros(3), 0.25).addcmul_(x, x).addcdiv_(x, fusegrad.full((3,), 2.0))
    np.testing.assert_allclose(x.numpy(), [0.75 + 0.5625 + 1.3125 / 2] * 3)
    with pytest.raises(RuntimeError, match="Integer division with addcdiv"):
        fusegrad.addcdiv(x, fusegrad.tensor([1]), fusegrad.tensor([2]))


@pytest.mark.parametrize("offset", [-2, -1, 0, 1, 3, 6])
def test_diagonal_matches_numpy(offset):
    x = t(2, 3, 4)
    a = x.numpy()
    for d1, d2 in [(0, 1), (1, 2), (2, 0), (-1, -2)]:
        np.testing.assert_array_equal(fusegrad.diagonal(x, offset, d1, d2).numpy(),
                                      np.diagonal(a, offset, d1 % 3, d2 % 3))


def test_diag_trace_and_gradients():
    v = t(3, requires_grad=True)
    for k in (-2, 0, 1):
        np.testing.assert_array_equal(fusegrad.diag(v, k).detach().numpy(),
                                      np.diag(v.detach().numpy(), k))
        assert gradcheck(lambda v, k=k: fusegrad.diag(v, k), (v,))
    m = t(3, 4, requires_grad=True)
    np.testing.assert_array_equal(m.diag(1).detach().numpy(), np.diag(m.detach().numpy(), 1))
    np.testing.assert_allclose(m.trace().item(), np.trace(m.detach().numpy()))
    assert gradcheck(lambda m: m.diagonal(-1), (m,))
    assert gradcheck(lambda m: m.trace(), (m,))
    assert m.trace().grad_fn.name() == "TraceBackward0"
    with pytest.raises(RuntimeError, match="diagonal dimensions cannot be identical"):
        m.diagonal(0, 1, 1)


def test_compiled_matches_eager():
    x, y, w = (fusegrad.tensor(RNG.standard_normal((4, 4)).astype(np.float32)) for _ in range(3))

    def f(x, y, w):
        return (fusegrad.lerp(x, y, w), x.addcmul(y, w, value=3), x.addcdiv(y, w.exp()),
                x.diagonal(1), fusegrad.diag(x.diagonal()), x.trace(), x.sum(axis=0))
    for e, c in zip(f(x, y, w), fusegrad.compile(f)(x, y, w)):
        np.testing.assert_allclose(c.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)
