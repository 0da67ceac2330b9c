"""Integer bitwise ops and shifts, inverse and hyperbolic trig: values against numpy (and
torch's rules for out-of-range shifts), gradients against finite differences, compiled against
eager."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad
from fusegrad.autograd.gradcheck import gradcheck

RNG = np.random.default_rng(10)
INT_DTYPES = ["int8", "uint8", "int16", "int32", "int64"]


def _ints(dtype, shape=(4, 5)):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)


def _shift_reference(a, s, left):
    """torch's BinaryOpsKernel.cpp shifts, element by element in Python integers."""
    bits = a.dtype.itemsize * 8
    signed = a.dtype.kind == "i"
    out = np.empty_like(a)
    for i, (x, k) in enumerate(zip(a.ravel().tolist(), s.ravel().tolist())):
        if left:
            v = 0 if k < 0 or k >= bits else (x << k) & ((1 << bits) - 1)
            if signed and v >= 1 << (bits - 1):
                v -= 1 << bits
        else:
            limit = bits - int(signed)
            v = x >> limit if k < 0 or k >= limit else x >> k
        out.flat[i] = v
    return out


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_bitwise_ops_match_numpy(dtype):
    a, b = _ints(dtype), _ints(dtype)
    x, y = fusegrad.tensor(a), fusegrad.tensor(b)
    np.testing.assert_array_equal((x & y).numpy(), a & b)
    np.testing.assert_array_equal(fusegrad.bitwise_or(x, y).numpy(), a | b)
    np.testing.assert_array_equal(x.bitwise_xor(y).numpy(), a ^ b)
    np.testing.assert_array_equal((~x).numpy(), ~a)
    np.testing.assert_array_equal(fusegrad.bitwise_not(x).numpy(), ~a)
    assert (x & y).dtype == x.dtype


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_shifts_follow_torch_out_of_range(dtype):
    a = _ints(dtype)
    bits = a.dtype.itemsize * 8
    lo = -3 if a.dtype.kind == "i" else 0
    s = RNG.integers(lo, bits + 3, size=a.shape).astype(dtype)
    x, k = fusegrad.tensor(a), fusegrad.tensor(s)
    np.testing.assert_array_equal((x << k).numpy(), _shift_reference(a, s, True))
    np.testing.assert_array_equal((x >> k).numpy(), _shift_reference(a, s, False))
    np.testing.assert_array_equal(fusegrad.bitwise_left_shift(x, k).numpy(),
                                  _shift_reference(a, s, True))
    np.testing.assert_array_equal(x.bitwise_right_shift(k).numpy(), _shift_reference(a, s, False))
    f = fusegrad.compile(lambda x, k: ((x << k) ^ (x >> k)) | (~x & k))
    np.testing.assert_array_equal(f(x, k).numpy(), ((x << k) ^ (x >> k) | (~x & k)).numpy())
    assert f.lower(x, k).kernels == ["k0[elementwise 4x5](shl,shr,bitxor,bitxor,bitand,bitor)"]


def test_bitwise_scalars_promotion_and_inplace():
    x = fusegrad.tensor([5, -3, 7])
    assert (x << 2).numpy().tolist() == [20, -12, 28]
    assert (1 << fusegrad.tensor([0, 3])).numpy().tolist() == [1, 8]
    assert (x & True).numpy().tolist() == [1, 1, 1]
    m = fusegrad.tensor([True, False])
    assert (m & 1).dtype == fusegrad.int64 and (m & 1).numpy().tolist() == [1, 0]
    assert (m ^ m).dtype == fusegrad.bool
    y = x.clone()
    y <<= 1
    y.bitwise_and_(6).bitwise_or_(1)
    y >>= 1
    y ^= 3
    y.bitwise_not_()
    expected = ~((((np.array([5, -3, 7]) << 1) & 6 | 1) >> 1) ^ 3)
    assert y.numpy().tolist() == expected.tolist()
    z = fusegrad.tensor([1, 2])
    z.bitwise_left_shift_(fusegrad.tensor([3, 1])).bitwise_right_shift_(1).bitwise_xor_(1)
    assert z.numpy().tolist() == [5, 3]


def test_bitwise_errors_are_torchs():
    f = fusegrad.tensor([1.0])
    with pytest.raises(NotImplementedError, match='"lshift_cpu" not implemented for \'Float\''):
        f << 1
    with pytest.raises(NotImplementedError, match='"rshift_cpu" not implemented for \'Bool\''):
        fusegrad.tensor([True]) >> fusegrad.tensor([True])
    with pytest.raises(NotImplementedError, match='"bitwise_and_cpu" not implemented'):
        f & 1
    with pytest.raises(TypeError, match="only implemented on integer and Boolean"):
        _ = ~f


UNARY = [("asin", np.arcsin, -0.9, 0.9), ("acos", np.arccos, -0.9, 0.9),
         ("atan", np.arctan, -3, 3), ("sinh", np.sinh, -3, 3), ("cosh", np.cosh, -3, 3),
         ("asinh", np.arcsinh, -3, 3), ("acosh", np.arccosh, 1.1, 4),
         ("atanh", np.arctanh, -0.9, 0.9)]


@pytest.mark.parametrize("name,ref,lo,hi", UNARY, ids=[u[0] for u in UNARY])
def test_trig_values_gradients_aliases(name, ref, lo, hi):
    a = RNG.uniform(lo, hi, size=(3, 4))
    x = fusegrad.tensor(a, requires_grad=True)
    fn = getattr(fusegrad, name)
    np.testing.assert_allclose(fn(x).detach().numpy(), ref(a), rtol=1e-14)
    assert gradcheck(fn, (x,))
    a32 = a.astype(np.float32)
    np.testing.assert_allclose(getattr(fusegrad.tensor(a32), name)().numpy(),
                               ref(a32.astype(np.float64)).astype(np.float32), rtol=1e-6)
    alias = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "asinh": "arcsinh",
             "acosh": "arccosh", "atanh": "arctanh"}.get(name)
    if alias:
        np.testing.assert_array_equal(getattr(x, alias)().detach().numpy(), fn(x).detach().numpy())
    y = fusegrad.tensor(a)
    getattr(y, name + "_")()
    np.testing.assert_allclose(y.numpy(), ref(a), rtol=1e-14)
    f = fusegrad.compile(lambda t: getattr(t, name)() * 2 + t)
    np.testing.assert_allclose(f(fusegrad.tensor(a32)).numpy(), ref(a32) * 2 + a32, rtol=1e-6)


def test_trig_on_integers_and_domain():
    assert fusegrad.asin(fusegrad.tensor([1])).dtype == fusegrad.float32
    np.testing.assert_allclose(fusegrad.tensor([0, 1]).sinh().numpy(), np.sinh([0.0, 1.0]),
                               rtol=1e-6)
    out = fusegrad.tensor([2.0, -1.0, 0.5]).atanh().numpy()
    assert np.isnan(out[0]) and out[1] == -np.inf
    assert np.isnan(fusegrad.tensor([0.5]).acosh().numpy()[0])


def test_atan2_values_and_gradients():
    y = fusegrad.tensor(RNG.standard_normal((3, 4)), requires_grad=True)
    x = fusegrad.tensor(RNG.standard_normal(4), requires_grad=True)
    np.testing.assert_allclose(fusegrad.atan2(y, x).detach().numpy(),
                               np.arctan2(y.detach().numpy(), x.detach().numpy()), rtol=1e-14)
    assert gradcheck(fusegrad.atan2, (y, x))
    assert gradcheck(lambda y: y.arctan2(fusegrad.tensor(-0.5, dtype=fusegrad.float64)), (y,))
    q = fusegrad.atan2(fusegrad.tensor([1, -1]), fusegrad.tensor([-1, -1]))
    assert q.dtype == fusegrad.float32
    np.testing.assert_allclose(q.numpy(), [3 * np.pi / 4, -3 * np.pi / 4], rtol=1e-6)
    z = fusegrad.tensor([1.0, 0.0])
    z.atan2_(fusegrad.tensor([0.0, -1.0]))
    np.testing.assert_allclose(z.numpy(), [np.pi / 2, np.pi], rtol=1e-6)


def test_trig_against_torch():
    torch = pytest.importorskip("torch")
    a = RNG.uniform(-0.95, 0.95, size=(7,)).astype(np.float32)
    for name in ["asin", "acos", "atan", "sinh", "cosh", "asinh", "atanh"]:
        np.testing.assert_allclose(getattr(fusegrad.tensor(a), name)().numpy(),
                                   getattr(torch.tensor(a), name)().numpy(), rtol=2e-7)
    s = np.array([-1, 0, 5, 31, 32, 63, 64, 70], dtype=np.int32)
    v = np.array([-7, 3, 9, -1, 5, -100, 100, 1], dtype=np.int32)
    for op in ["__lshift__", "__rshift__"]:
        np.testing.assert_array_equal(getattr(fusegrad.tensor(v), op)(fusegrad.tensor(s)).numpy(),
                                      getattr(torch.tensor(v), op)(torch.tensor(s)).numpy())


# --------------------------------------------------------------------------- group 2


def t64(*shape, low=-2.0, high=2.0, requires_grad=False):
    return fusegrad.tensor(RNG.uniform(low, high, size=shape), requires_grad=requires_grad)


def _scatter_reference(x, dim, idx, src, reduce, include_self):
    out = x.copy()
    ufunc = {"sum": np.add, "prod": np.multiply, "amax": np.maximum, "amin": np.minimum,
             "mean": np.add}
    seen, count = np.zeros(x.shape, bool), np.zeros(x.shape)
    for pos in np.ndindex(*idx.shape):
        target = list(pos)
        target[dim] = idx[pos]
        target = tuple(target)
        if reduce == "replace":
            out[target] = src[pos]
            continue
        if not include_self and not seen[target]:
            out[target] = src[pos]
        else:
            out[target] = ufunc[reduce](out[target], src[pos])
        seen[target] = True
        count[target] += 1
    if reduce == "mean":
        n = count + include_self
        out = np.where(seen, out / np.maximum(n, 1), out)
    return out


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_values_and_gradients(reduce, include_self):
    x = t64(3, 4, requires_grad=True)
    src = t64(3, 5, requires_grad=True)
    idx = fusegrad.tensor([[0, 2, 1, 0], [0, 2, 1, 1], [2, 2, 0, 1]])
    out = fusegrad.scatter_reduce(x, 0, idx, src, reduce, include_self=include_self)
    expected = _scatter_reference(x.detach().numpy(), 0, idx.numpy(), src.detach().numpy(),
                                  reduce, include_self)
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-12)
    assert out.grad_fn.name() == "ScatterReduceBackward0"
    assert gradcheck(lambda x, s: x.scatter_reduce(0, idx, s, reduce, include_self=include_self),
                     (x, src))
    f = fusegrad.compile(lambda x, s: x.scatter_reduce(1, idx.T, s, reduce,
                                                       include_self=include_self) * 2)
    a, s = t64(4, 3), t64(4, 3)
    np.testing.assert_allclose(f(a, s).numpy(),
                               (a.scatter_reduce(1, idx.T, s, reduce,
                                                 include_self=include_self) * 2).numpy())


def test_scatter_reduce_ties_and_zeros_follow_torch():
    # amax shares the gradient equally among ties (torch's rule), prod is exact at zeros.
    x = fusegrad.tensor([1.0, 5.0, 0.0], dtype=fusegrad.float64, requires_grad=True)
    s = fusegrad.tensor([5.0, 2.0, 0.0, 3.0], dtype=fusegrad.float64, requires_grad=True)
    i = fusegrad.tensor([1, 0, 2, 2])
    x.scatter_reduce(0, i, s, "amax").sum().backward()
    assert x.grad.tolist() == [0.0, 0.5, 0.0] and s.grad.tolist() == [0.5, 1.0, 0.0, 1.0]
    x.grad = s.grad = None
    s2 = fusegrad.tensor([2.0, 0.0, 3.0], dtype=fusegrad.float64, requires_grad=True)
    y = fusegrad.tensor([4.0, 5.0], dtype=fusegrad.float64, requires_grad=True)
    y.scatter_reduce(0, fusegrad.tensor([0, 1, 1]), s2, "prod").sum().backward()
    assert y.grad.tolist() == [2.0, 0.0] and s2.grad.tolist() == [4.0, 15.0, 0.0]
    m = fusegrad.tensor([1, 5, 2]).scatter_reduce(0, fusegrad.tensor([0, 0, 2]),
                                                  fusegrad.tensor([4, 7, 3]), "mean")
    assert m.tolist() == [4, 5, 2]       # integer mean rounds down, as torch's


def test_scatter_src_value_and_reduce_forms():
    x = t64(3, 4, requires_grad=True)
    idx = fusegrad.tensor([[0, 2, 1, 0], [2, 0, 0, 1]])
    src = t64(2, 5, requires_grad=True)
    out = x.scatter(0, idx, src)
    ref = _scatter_reference(x.detach().numpy(), 0, idx.numpy(), src.detach().numpy(),
                             "replace", True)
    np.testing.assert_array_equal(out.detach().numpy(), ref)
    assert out.grad_fn.name() == "ScatterBackward0"
    assert gradcheck(lambda x, s: fusegrad.scatter(x, 0, idx, s), (x, src))
    v = fusegrad.scatter(x, 1, idx, 7.0)
    assert v.grad_fn.name() == "ScatterBackward1"
    np.testing.assert_array_equal(v.detach().numpy(), _scatter_reference(
        x.detach().numpy(), 1, idx.numpy(), np.full((2, 4), 7.0), "replace", True))
    add = x.scatter(0, idx, src, reduce="add")
    np.testing.assert_allclose(add.detach().numpy(), _scatter_reference(
        x.detach().numpy(), 0, idx.numpy(), src.detach().numpy(), "sum", True))
    mul = x.scatter(0, idx, 2.0, reduce="multiply")
    np.testing.assert_allclose(mul.detach().numpy(), _scatter_reference(
        x.detach().numpy(), 0, idx.numpy(), np.full((2, 4), 2.0), "prod", True))
    y = x.detach().clone()
    y.scatter_(0, idx, src.detach()).scatter_reduce_(0, idx, src.detach(), "sum")
    np.testing.assert_allclose(y.numpy(), x.detach().scatter(0, idx, src.detach()).scatter_reduce(
        0, idx, src.detach(), "sum").numpy())
    with pytest.raises(RuntimeError, match="reduce argument must be either add or multiply"):
        x.scatter(0, idx, src, reduce="max")
    with pytest.raises(RuntimeError, match="sum, prod, mean, amax or amin, got avg"):
        x.scatter_reduce(0, idx, src, "avg")
    with pytest.raises(RuntimeError, match="Expected dtype int64 for index"):
        x.scatter(0, idx.float(), src)


def test_nan_to_num_values_gradient_inplace():
    a = np.array([np.nan, np.inf, -np.inf, 1.5, -2.0], dtype=np.float32)
    x = fusegrad.tensor(a)
    np.testing.assert_array_equal(fusegrad.nan_to_num(x).numpy(), np.nan_to_num(a))
    np.testing.assert_array_equal(x.nan_to_num(1.0, 2.0, -3.0).numpy(), [1, 2, -3, 1.5, -2])
    assert fusegrad.nan_to_num(fusegrad.tensor([1, 2])).tolist() == [1, 2]
    g = fusegrad.tensor(a.astype(np.float64), requires_grad=True)
    fusegrad.nan_to_num(g).sum().backward()
    assert g.grad.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]
    x.nan_to_num_(posinf=9.0)
    assert x.tolist()[:3] == [0.0, 9.0, float(np.finfo(np.float32).min)]
    f = fusegrad.compile(lambda t: fusegrad.nan_to_num(t.log()))
    y = fusegrad.tensor(np.array([-1.0, 0.0, 2.0], dtype=np.float32))
    np.testing.assert_array_equal(f(y).numpy(), fusegrad.nan_to_num(y.log()).numpy())


def test_isclose_edge_cases():
    inf, nan = float("inf"), float("nan")
    a = fusegrad.tensor([1.0, inf, -inf, nan, 1e10, inf])
    b = fusegrad.tensor([1.0 + 1e-9, inf, inf, nan, 1.00001e10, 1.0])
    assert fusegrad.isclose(a, b).tolist() == [True, True, False, False, False, False]
    assert fusegrad.isclose(a, b, equal_nan=True).tolist()[3]
    assert not fusegrad.isclose(a[5:], b[5:], atol=inf).item()   # inf - 1 is not finite
    assert fusegrad.isclose(fusegrad.tensor([1.0]), fusegrad.tensor([2.0]), atol=inf).item()
    ints = fusegrad.isclose(fusegrad.tensor([1, 2, 100, 2**62]),
                            fusegrad.tensor([1, 3, 101, -2**62]), rtol=0.02, atol=0)
    assert ints.tolist() == [True, False, True, False]
    assert fusegrad.isclose(fusegrad.tensor([True, False]), fusegrad.tensor([True, True])).tolist() \
        == [True, False]
    with pytest.raises(RuntimeError, match="Float did not match Long"):
        fusegrad.isclose(fusegrad.tensor([1.0]), fusegrad.tensor([1]))
    with pytest.raises(RuntimeError, match="rtol must be greater than or equal to zero"):
        fusegrad.isclose(a, b, rtol=-1)


def test_nonzero_of_0d():
    assert tuple(fusegrad.nonzero(fusegrad.tensor(5)).shape) == (1, 0)
    assert tuple(fusegrad.tensor(0.0).nonzero().shape) == (0, 0)
    assert [t.tolist() for t in fusegrad.nonzero(fusegrad.tensor(5), as_tuple=True)] == [[0]]
    assert [t.tolist() for t in fusegrad.nonzero(fusegrad.tensor(0), as_tuple=True)] == [[]]


def test_tensordot_matches_numpy():
    a, b = t64(2, 3, 4, requires_grad=True), t64(4, 3, 5, requires_grad=True)
    for dims, np_dims in [(([1, 2], [1, 0]), ([1, 2], [1, 0])), (1, None), (([2], [0]), (2, 0))]:
        if dims == 1:
            c = fusegrad.tensordot(a, t64(4, 2), 1)
            continue
        out = fusegrad.tensordot(a, b, dims=dims)
        np.testing.assert_allclose(out.detach().numpy(), np.tensordot(
            a.detach().numpy(), b.detach().numpy(), axes=np_dims), rtol=1e-12)
    assert tuple(c.shape) == (2, 3, 2)
    assert gradcheck(lambda a, b: fusegrad.tensordot(a, b, dims=([1, 2], [1, 0])), (a, b))
    m = t64(3, 4)
    np.testing.assert_allclose(fusegrad.tensordot(m, m, 2).numpy(), (m.numpy() ** 2).sum())
    with pytest.raises(RuntimeError, match="contracted dimensions need to match"):
        fusegrad.tensordot(a, b, dims=([0], [0]))


def test_tensordot_takes_a_tensor_of_dims_and_refuses_repeated_dims():
    a, b = t64(2, 3, 4), t64(4, 3, 5)
    np.testing.assert_allclose(fusegrad.tensordot(a, b, dims=fusegrad.tensor(1)).numpy(),
                               np.tensordot(a.numpy(), b.numpy(), 1), rtol=1e-12)
    with pytest.raises(RuntimeError, match="dim 2 appears multiple times in the list of dims"):
        fusegrad.tensordot(a, b, dims=([2, 2], [0, 0]))


def test_meshgrid_and_diag_embed():
    x, y, z = fusegrad.arange(3), fusegrad.arange(2), fusegrad.tensor(7)
    for indexing in ("ij", "xy"):
        got = fusegrad.meshgrid(x, y, z, indexing=indexing)
        want = np.meshgrid(x.numpy(), y.numpy(), z.numpy().reshape(1), indexing=indexing)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.numpy(), w)
    assert len(fusegrad.meshgrid([x, y])) == 2
    with pytest.raises(RuntimeError, match="indexing must be one of"):
        fusegrad.meshgrid(x, y, indexing="yx")
    v = t64(2, 3, requires_grad=True)
    for offset, d1, d2 in [(0, -2, -1), (1, 0, 2), (-2, 2, 0)]:
        out = fusegrad.diag_embed(v, offset, d1, d2).detach().numpy()
        n = 3 + abs(offset)
        ref = np.zeros((2, n, n))
        for b in range(2):
            ref[b] = np.diag(v.detach().numpy()[b], offset)
        np.testing.assert_array_equal(out, np.moveaxis(ref, (1, 2), (d1 % 3, d2 % 3)))
    assert gradcheck(lambda v: fusegrad.diag_embed(v, 1, 0, 2), (v,))


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, 0.5, float("inf")])
def test_cdist_matches_numpy(p):
    a, b = t64(2, 3, 4, requires_grad=True), t64(2, 5, 4, requires_grad=True)
    diff = np.abs(a.detach().numpy()[:, :, None] - b.detach().numpy()[:, None])
    if p == 0:
        ref = (diff != 0).sum(-1).astype(np.float64)
    elif p == float("inf"):
        ref = diff.max(-1)
    else:
        ref = (diff ** p).sum(-1) ** (1 / p)
    np.testing.assert_allclose(fusegrad.cdist(a, b, p=p).detach().numpy(), ref, rtol=1e-12)
    if p not in (0.0,):
        assert gradcheck(lambda a, b: fusegrad.cdist(a, b, p=p), (a, b))
    # Zero distance: a zero gradient, not NaN (torch's).
    z = fusegrad.tensor(np.ones((2, 3)), requires_grad=True)
    fusegrad.cdist(z, z.detach(), p=p).sum().backward()
    assert np.isfinite(z.grad.numpy()).all()


def test_cosine_similarity():
    a, b = t64(3, 4, requires_grad=True), t64(4, requires_grad=True)
    an, bn = a.detach().numpy(), b.detach().numpy()
    ref = (an * bn).sum(-1) / (np.linalg.norm(an, axis=-1) * np.linalg.norm(bn))
    np.testing.assert_allclose(fusegrad.cosine_similarity(a, b, dim=-1).detach().numpy(), ref)
    np.testing.assert_allclose(fusegrad.nn.functional.cosine_similarity(a, b, -1).detach().numpy(),
                               ref)
    assert gradcheck(lambda a, b: fusegrad.cosine_similarity(a, b, dim=1), (a, b))
    zero = fusegrad.zeros(2, 3)
    assert fusegrad.cosine_similarity(zero, zero).tolist() == [0.0, 0.0]


def test_bincount_and_unique():
    x = fusegrad.tensor([0, 2, 2, 5])
    assert fusegrad.bincount(x).tolist() == [1, 0, 2, 0, 0, 1]
    assert x.bincount(minlength=8).tolist() == np.bincount([0, 2, 2, 5], minlength=8).tolist()
    w = fusegrad.tensor([0.5, 1.0, 1.0, 2.0])
    r = fusegrad.bincount(x, w)
    assert r.dtype == fusegrad.float32 and r.tolist() == [0.5, 0, 2.0, 0, 0, 2.0]
    assert fusegrad.bincount(x, fusegrad.tensor([1, 1, 1, 1])).dtype == fusegrad.float64
    with pytest.raises(RuntimeError, match="1-d non-negative integral"):
        fusegrad.bincount(fusegrad.tensor([-1]))
    with pytest.raises(NotImplementedError, match="bincount_cpu"):
        fusegrad.bincount(fusegrad.tensor([1.0]))
    u = fusegrad.tensor([[3, 1], [3, 2]])
    assert fusegrad.unique(u).tolist() == [1, 2, 3]
    vals, inv, counts = u.unique(return_inverse=True, return_counts=True)
    assert inv.tolist() == [[2, 0], [2, 1]] and counts.tolist() == [1, 1, 2]
    rows = fusegrad.unique(fusegrad.tensor([[1, 2], [0, 1], [1, 2]]), dim=0, return_counts=True)
    assert rows[0].tolist() == [[0, 1], [1, 2]] and rows[1].tolist() == [1, 2]
    with pytest.raises(Exception, match="unique"):
        fusegrad.trace(lambda t: fusegrad.unique(t), fusegrad.tensor([1, 2]))


def test_bernoulli_and_multinomial():
    fusegrad.manual_seed(0)
    p = fusegrad.tensor([0.0, 1.0, 0.3] * 2000)
    s = fusegrad.bernoulli(p)
    assert s.dtype == fusegrad.float32 and s[:2].tolist() == [0.0, 1.0]
    assert abs(s[2::3].mean().item() - 0.3) < 0.05
    z = fusegrad.zeros(4000)
    z.bernoulli_(0.25)
    assert set(z.tolist()) <= {0.0, 1.0} and abs(z.mean().item() - 0.25) < 0.05
    w = fusegrad.tensor([[1.0, 0.0, 3.0], [0.0, 2.0, 2.0]])
    draws = fusegrad.multinomial(w, 4000, replacement=True)
    assert tuple(draws.shape) == (2, 4000)
    freq = np.stack([np.bincount(r, minlength=3) / 4000 for r in draws.numpy()])
    np.testing.assert_allclose(freq, [[0.25, 0, 0.75], [0, 0.5, 0.5]], atol=0.04)
    no_rep = w.multinomial(2)
    assert [sorted(r) for r in no_rep.tolist()] == [[0, 2], [1, 2]]
    fusegrad.manual_seed(1)
    a = fusegrad.multinomial(fusegrad.tensor([0.2, 0.3, 0.5]), 3)
    fusegrad.manual_seed(1)
    assert fusegrad.multinomial(fusegrad.tensor([0.2, 0.3, 0.5]), 3).tolist() == a.tolist()
    assert sorted(a.tolist()) == [0, 1, 2]
    with pytest.raises(RuntimeError, match="cannot sample n_sample > prob_dist.size"):
        fusegrad.multinomial(w, 4)
    with pytest.raises(RuntimeError, match="not enough non-negative category"):
        fusegrad.multinomial(w, 3)
    with pytest.raises(RuntimeError, match="element < 0"):
        fusegrad.multinomial(fusegrad.tensor([1.0, -1.0]), 1)


@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("int32", "float32"),
                                     ("float64", "int64"), ("int16", "float16"),
                                     ("uint8", "int8"), ("bool", "uint8")])
def test_view_dtype_same_size(src, dst):
    a = (RNG.standard_normal((3, 4)) * 50).astype(src)
    x = fusegrad.tensor(a)
    out = x.view(getattr(fusegrad, dst if dst != "bool" else "bool"))
    np.testing.assert_array_equal(out.numpy(), a.view(dst))
    f = fusegrad.compile(lambda t: t.view(getattr(fusegrad, dst)) == t.view(getattr(fusegrad, dst)))
    if dst not in ("float32", "float16"):  # NaN bit patterns compare unequal
        assert f(x).numpy().all()
    g = fusegrad.compile(lambda t: t.view(getattr(fusegrad, dst)))
    np.testing.assert_array_equal(g(x).numpy(), a.view(dst))


def test_view_dtype_of_0d_keeps_its_shape():
    # Regression: np.ascontiguousarray made the 0-d result 1-d.
    z = fusegrad.tensor(1.5)
    assert tuple(z.view(fusegrad.int32).shape) == ()
    assert z.view(fusegrad.int32).item() == np.float32(1.5).view(np.int32)


def test_view_dtype_of_other_sizes():
    a = RNG.standard_normal((2, 4)).astype(np.float32)
    x = fusegrad.tensor(a)
    np.testing.assert_array_equal(x.view(fusegrad.int16).numpy(), a.view(np.int16))
    np.testing.assert_array_equal(x.view(fusegrad.float64).numpy(), a.view(np.float64))
    with pytest.raises(RuntimeError, match="must be divisible by 2"):
        fusegrad.tensor(a[:, :3]).view(fusegrad.float64)
    assert x.view(fusegrad.float32).tolist() == x.tolist()


def test_group2_against_torch():
    torch = pytest.importorskip("torch")
    a = RNG.standard_normal((3, 4))
    b = RNG.standard_normal((5, 4))
    np.testing.assert_allclose(fusegrad.cdist(fusegrad.tensor(a), fusegrad.tensor(b), p=1.5)
                               .numpy(), torch.cdist(torch.tensor(a), torch.tensor(b), p=1.5)
                               .numpy(), rtol=1e-12)
    np.testing.assert_allclose(fusegrad.cosine_similarity(fusegrad.tensor(a), fusegrad.tensor(a[0])
                                                          , dim=1).numpy(),
                               torch.cosine_similarity(torch.tensor(a), torch.tensor(a[0]), dim=1)
                               .numpy(), rtol=1e-12)
    x = RNG.standard_normal((3, 4))
    s = RNG.standard_normal((3, 4))
    i = np.array([[0, 2, 1, 0], [0, 2, 1, 1], [2, 2, 0, 1]])
    for reduce in ["sum", "prod", "mean", "amax", "amin"]:
        for inc in (True, False):
            fx = fusegrad.tensor(x, requires_grad=True)
            fs = fusegrad.tensor(s, requires_grad=True)
            tx = torch.tensor(x, requires_grad=True)
            ts = torch.tensor(s, requires_grad=True)
            fo = fx.scatter_reduce(0, fusegrad.tensor(i), fs, reduce, include_self=inc)
            to = tx.scatter_reduce(0, torch.tensor(i), ts, reduce, include_self=inc)
            np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), rtol=1e-12)
            w = RNG.standard_normal((3, 4))
            (fo * fusegrad.tensor(w)).sum().backward()
            (to * torch.tensor(w)).sum().backward()
            np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(fs.grad.numpy(), ts.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_cosine_similarity_gradient_at_a_zero_vector_is_torchs():
    # torch clamps the norm under no_grad: the gradient is finite (b / eps / |b|), not NaN
    # from sqrt at 0.
    a = fusegrad.tensor([[0.0, 0.0, 0.0]], requires_grad=True)
    b = fusegrad.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    y = fusegrad.nn.functional.cosine_similarity(a, b)
    y.sum().backward()
    assert y.item() == 0.0
    np.testing.assert_allclose(a.grad.numpy(), [[1.0, 2.0, 3.0]] / np.sqrt(14.0) / 1e-8,
                               rtol=1e-5)
    np.testing.assert_array_equal(b.grad.numpy(), [[0.0, 0.0, 0.0]])
