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
