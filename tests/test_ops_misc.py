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
    # torch.trace(m): the top-level name given a tensor (given a function it is the tracer)
    np.testing.assert_allclose(fusegrad.trace(m).item(), np.trace(m.detach().numpy()))
    assert gradcheck(lambda m: fusegrad.trace(m), (m,))
    compiled = fusegrad.compile(lambda a: fusegrad.trace(a @ a.T))
    np.testing.assert_allclose(compiled(m.detach()).item(),
                               np.trace(m.detach().numpy() @ m.detach().numpy().T), rtol=1e-5)
    with pytest.raises(RuntimeError, match="diagonal dimensions cannot be identical"):
        m.diagonal(0, 1, 1)


def test_compiled_matches_eager():
    x, y, w = (fusegrad.tensor(RNG.standard_normal((4, 4)).astype(np.float32)) for _ in range(3))

    def f(x, y, w):
        return (fusegrad.lerp(x, y, w), x.addcmul(y, w, value=3), x.addcdiv(y, w.exp()),
                x.diagonal(1), fusegrad.diag(x.diagonal()), x.trace(), x.sum(axis=0))
    for e, c in zip(f(x, y, w), fusegrad.compile(f)(x, y, w)):
        np.testing.assert_allclose(c.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)


EINSUM_CASES = [("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("bij,bjk,kl->bil", [(2, 3, 4), (2, 4, 5), (5, 3)]),
                ("ii->i", [(4, 4)]), ("ii", [(4, 4)]), ("ij->ji", [(3, 4)]), ("i,i->", [(4,), (4,)]),
                ("i,j->ij", [(3,), (4,)]), ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
                ("bij->", [(2, 3, 4)]), ("bij,jk", [(2, 3, 4), (4, 4)]), ("bii->bi", [(2, 3, 3)]),
                ("...i,i", [(2, 3, 4), (4,)]), ("ji,k->ijk", [(3, 4), (2,)]),
                ("bij,bjk->ik", [(2, 3, 4), (2, 4, 5)]), ("iij->j", [(3, 3, 2)]),
                ("ij,ij->ij", [(1, 4), (3, 4)]), ("ij,jk->ik", [(3, 1), (4, 5)])]


@pytest.mark.parametrize("equation,shapes", EINSUM_CASES, ids=[c[0] for c in EINSUM_CASES])
def test_einsum_matches_numpy(equation, shapes):
    arrays = [RNG.standard_normal(s) for s in shapes]
    ops = [fusegrad.tensor(a, requires_grad=True) for a in arrays]
    if equation == "ij,jk->ik":   # a size-1 contracted dim broadcasts (torch's rule)
        ref = np.einsum(equation, np.broadcast_to(arrays[0], (3, 4)), arrays[1])
    else:
        ref = np.einsum(equation, *arrays)
    out = fusegrad.einsum(equation, *ops)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out.detach().numpy(), ref, rtol=1e-12, atol=1e-12)
    assert gradcheck(lambda *xs: fusegrad.einsum(equation, *xs), ops)


def test_einsum_list_form_and_errors():
    a = t(3, 3)
    np.testing.assert_allclose(fusegrad.einsum("ij,jk", [a, a]).numpy(), (a @ a).numpy())
    with pytest.raises(RuntimeError, match="does not match the number of dimensions"):
        fusegrad.einsum("ijk", a)
    with pytest.raises(RuntimeError, match="output subscript z does not appear"):
        fusegrad.einsum("ij->z", a)


def test_einsum_sublist_form():
    # torch's einsum(a, [0, 1], b, [1, 2], [0, 2]): labels 0-25 are A-Z, 26-51 a-z, so an
    # implicit output is ordered by number.
    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((4, 5))
    ta, tb = fusegrad.tensor(a), fusegrad.tensor(b)
    np.testing.assert_allclose(fusegrad.einsum(ta, [0, 1], tb, [1, 2], [0, 2]).numpy(), a @ b)
    np.testing.assert_allclose(fusegrad.einsum(ta, [30, 1], tb, [1, 2]).numpy(), (a @ b).T)
    np.testing.assert_allclose(fusegrad.einsum(ta, [..., 1], tb, [1, 2], [..., 2]).numpy(),
                               a @ b)
    with pytest.raises(RuntimeError, match="not within the valid range"):
        fusegrad.einsum(ta, [0, 52])


def test_cumulative_ops_match_numpy():
    a = np.array([[1.0, 3.0, 3.0, 2.0, 0.0, 5.0], [-1.0, -2.0, 4.0, 4.0, 1.0, 0.5]])
    x = fusegrad.tensor(a)
    np.testing.assert_array_equal(fusegrad.cumprod(x, 1).numpy(), np.cumprod(a, 1))
    np.testing.assert_array_equal(x.cumprod(dim=0).numpy(), np.cumprod(a, 0))
    v, i = fusegrad.cummax(x, 1)
    np.testing.assert_array_equal(v.numpy(), np.maximum.accumulate(a, 1))
    # the index of the last of equal maxima, as torch's
    np.testing.assert_array_equal(i.numpy(), [[0, 1, 2, 2, 2, 5], [0, 0, 2, 3, 3, 3]])
    v, i = x.cummin(1)
    np.testing.assert_array_equal(v.numpy(), np.minimum.accumulate(a, 1))
    np.testing.assert_array_equal(i.numpy(), [[0, 0, 0, 0, 4, 4], [0, 1, 1, 1, 1, 1]])
    np.testing.assert_allclose(fusegrad.logcumsumexp(x, 1).numpy(),
                               np.log(np.cumsum(np.exp(a), 1)), rtol=1e-12)
    big = fusegrad.tensor([1000.0, 1000.0, -1000.0])
    np.testing.assert_allclose(big.logcumsumexp(0).numpy(), [1000, 1000 + np.log(2), 1000 + np.log(2)])
    assert fusegrad.cumprod(fusegrad.tensor([1, 2, 3], dtype=fusegrad.int32), 0).dtype is fusegrad.int64
    np.testing.assert_array_equal(fusegrad.cummax(fusegrad.tensor([3, 1, 4]), 0).values.numpy(),
                                  [3, 3, 4])


def test_cummax_cummin_when_the_first_element_is_the_dtypes_extreme():
    # The scan filled with the dtype's extreme, which then won where x held it: cummin of
    # [inf, 7, ...] was [1, 7, 7, 7, 1] with indices pointing past the row.
    inf, imin = float("inf"), np.iinfo(np.int64).min
    for x, op, values, indices in [
            (fusegrad.tensor([inf, 7.0, inf, 9.0, 1.0]), "cummin", [inf, 7, 7, 7, 1],
             [0, 1, 1, 1, 4]),
            (fusegrad.tensor([255, 7, 9, 1], dtype=fusegrad.uint8), "cummin", [255, 7, 7, 1],
             [0, 1, 1, 3]),
            (fusegrad.tensor([imin, imin, 3, 1, imin]), "cummax", [imin, imin, 3, 3, 3],
             [0, 1, 2, 2, 2]),
            (fusegrad.tensor([False, True, False, True]), "cummax", [False, True, True, True],
             [0, 1, 1, 3])]:
        out = getattr(x, op)(0)
        assert out.values.tolist() == values and out.indices.tolist() == indices, (x, op)
    scalar = fusegrad.tensor(True).cummax(0)
    assert scalar.values.dtype is fusegrad.bool and scalar.values.item() is True


def test_cumulative_gradients():
    x = fusegrad.tensor([[1.0, 3.0, 0.0, 2.0], [-1.0, 0.5, 4.0, 0.0]], dtype=fusegrad.float64,
                        requires_grad=True)
    assert gradcheck(lambda x: fusegrad.cumprod(x, 1), (x,))       # zeros included
    y = fusegrad.tensor(RNG.permutation(12).reshape(3, 4) / 3.0, requires_grad=True)
    assert gradcheck(lambda y: fusegrad.cummax(y, 1).values, (y,))
    assert gradcheck(lambda y: fusegrad.cummin(y, 0).values, (y,))
    assert gradcheck(lambda y: fusegrad.logcumsumexp(y, 1), (y,))


def test_compiled_einsum_and_scans_match_eager():
    a, b = (fusegrad.tensor(RNG.standard_normal((3, 4)).astype(np.float32)) for _ in range(2))

    def f(a, b):
        return (fusegrad.einsum("ij,kj->ik", a, b), fusegrad.einsum("ii->", a[:, :3]),
                a.cumprod(1), a.cummax(0).values, a.cummin(1).indices, a.logcumsumexp(1))

    def loss(a):
        return sum((y * y).sum() for y in f(a, b) if y.dtype.is_floating_point)
    for e, c in zip(f(a, b), fusegrad.compile(f)(a, b)):
        np.testing.assert_allclose(c.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fusegrad.compile(fusegrad.grad(loss))(a).numpy(),
                               fusegrad.grad(loss)(a).numpy(), rtol=1e-4, atol=1e-5)


def test_against_torch():
    torch = pytest.importorskip("torch")
    a = RNG.standard_normal((3, 5)).astype(np.float32)
    a[1, 2] = a[1, 1]
    for name in ("cummax", "cummin"):
        ours, ref = getattr(fusegrad, name)(fusegrad.tensor(a), 1), getattr(torch, name)(
            torch.tensor(a), 1)
        np.testing.assert_array_equal(ours.values.numpy(), ref.values.numpy())
        np.testing.assert_array_equal(ours.indices.numpy(), ref.indices.numpy())
    np.testing.assert_allclose(fusegrad.einsum("ij,kj->ik", fusegrad.tensor(a), fusegrad.tensor(a)).numpy(),
                               torch.einsum("ij,kj->ik", torch.tensor(a), torch.tensor(a)).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_tensor_unfold_matches_sliding_windows():
    a = RNG.standard_normal((2, 11, 3))
    x = fusegrad.tensor(a, requires_grad=True)
    y = x.unfold(1, 4, 3)
    ref = np.lib.stride_tricks.sliding_window_view(a, 4, axis=1)[:, ::3]
    np.testing.assert_array_equal(y.detach().numpy(), ref)
    assert y.shape == (2, 3, 3, 4)
    assert gradcheck(lambda x: x.unfold(1, 4, 3), (x,))     # overlapping windows add up
    assert gradcheck(lambda x: x.unfold(-1, 2, 1), (x,))
    with pytest.raises(RuntimeError, match="maximum size for tensor at dimension 1 is 11"):
        x.unfold(1, 12, 1)


@pytest.mark.parametrize("compiled", [False, True])
def test_tensor_unfold_empty_windows_and_zero_dim(compiled):
    # torch: size 0 gives (n // step + 1) empty windows (an IndexError here); a 0-dim tensor is
    # one window of shape [size] (it was [1, 1])
    x = t(3, 3, 3, requires_grad=True)
    f = fusegrad.compile(lambda x, d, n, s: x.unfold(d, n, s), static_argnums=(1, 2, 3)) \
        if compiled else (lambda x, d, n, s: x.unfold(d, n, s))
    assert f(x, 1, 0, 8).shape == (3, 1, 3, 0)
    assert f(x, 1, 0, 1).shape == (3, 4, 3, 0)
    assert f(x, -1, 2, 2).shape == (3, 3, 1, 2)
    (g,) = fusegrad.autograd.grad(f(x, 1, 0, 8).sum(), x)
    np.testing.assert_array_equal(g.numpy(), np.zeros((3, 3, 3)))
    s = fusegrad.tensor(5.0, requires_grad=True)
    assert s.unfold(0, 1, 1).shape == (1,) and s.unfold(-1, 0, 1).shape == (0,)
    (g,) = fusegrad.autograd.grad((s.unfold(0, 1, 1) * 3).sum(), s)
    assert g.item() == 3.0
    with pytest.raises(RuntimeError, match="maximum size for tensor at dimension 0 is 1 but size is 2"):
        s.unfold(0, 2, 1)
