"""Elementwise ops: values against numpy, gradients against finite differences.

Each op runs on contiguous, non-contiguous (transposed, strided) and 0-d inputs; binary ops
also on every broadcasting pattern.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

import fusegrad as fg
from tests.conftest import LAYOUTS, arr, assert_close, check_grad, leaf, positive

_np_erf = np.vectorize(math.erf, otypes=[np.float64])

# name, fusegrad function, numpy reference, input domain
UNARY = [
    ("neg", lambda x: -x, np.negative, arr),
    ("neg_fn", fg.neg, np.negative, arr),
    ("abs", lambda x: x.abs(), np.abs, arr),
    ("abs_builtin", abs, np.abs, arr),
    ("exp", fg.exp, np.exp, arr),
    ("exp2", fg.exp2, np.exp2, arr),
    ("expm1", fg.expm1, np.expm1, arr),
    ("log", fg.log, np.log, positive),
    ("log2", fg.log2, np.log2, positive),
    ("log10", fg.log10, np.log10, positive),
    ("log1p", fg.log1p, np.log1p, positive),
    ("sin", fg.sin, np.sin, arr),
    ("cos", fg.cos, np.cos, arr),
    ("tan", fg.tan, np.tan, lambda *s, seed=0: arr(*s, seed=seed, low=-1, high=1)),
    ("tanh", fg.tanh, np.tanh, arr),
    ("sigmoid", fg.sigmoid, lambda a: 1 / (1 + np.exp(-a)), arr),
    ("relu", fg.relu, lambda a: np.maximum(a, 0), arr),
    ("erf", fg.erf, _np_erf, arr),
    ("sqrt", fg.sqrt, np.sqrt, positive),
    ("rsqrt", fg.rsqrt, lambda a: 1 / np.sqrt(a), positive),
    ("reciprocal", fg.reciprocal, np.reciprocal, positive),
    ("square", fg.square, np.square, arr),
    ("sign", fg.sign, np.sign, arr),
    ("floor", fg.floor, np.floor, arr),
    ("ceil", fg.ceil, np.ceil, arr),
    ("trunc", fg.trunc, np.trunc, arr),
    ("round", fg.round, np.round, arr),
    ("round_decimals", lambda x: fg.round(x, decimals=1), lambda a: np.round(a, 1), arr),
    ("clamp_both", lambda x: x.clamp(-0.5, 0.7), lambda a: np.clip(a, -0.5, 0.7), arr),
    ("clamp_min", lambda x: x.clamp(min=0.1), lambda a: np.maximum(a, 0.1), arr),
    ("clamp_max", lambda x: x.clamp(max=0.1), lambda a: np.minimum(a, 0.1), arr),
    ("pow_scalar", lambda x: x ** 3, lambda a: a ** 3, arr),
    ("pow_square", lambda x: x ** 2, lambda a: a ** 2, arr),
    ("pow_one", lambda x: x ** 1, lambda a: a, arr),
    ("pow_half", lambda x: x ** 0.5, np.sqrt, positive),
    ("pow_neg", lambda x: x ** -1.5, lambda a: a ** -1.5, positive),
    ("rpow", lambda x: 2 ** x, lambda a: 2.0 ** a, arr),
    ("radd", lambda x: 1.5 + x, lambda a: 1.5 + a, arr),
    ("rsub", lambda x: 1.5 - x, lambda a: 1.5 - a, arr),
    ("rmul", lambda x: 1.5 * x, lambda a: 1.5 * a, arr),
    ("rdiv", lambda x: 1.5 / x, lambda a: 1.5 / a, positive),
    ("sub_alpha", lambda x: fg.sub(x, 1.0, alpha=2), lambda a: a - 2, arr),
    ("add_alpha", lambda x: fg.add(x, x, alpha=3), lambda a: 4 * a, arr),
]
UNARY_IDS = [u[0] for u in UNARY]


@pytest.mark.parametrize("name,fn,ref,domain", UNARY, ids=UNARY_IDS)
@pytest.mark.parametrize("shape", [(3, 4), (), (0, 2)], ids=["2d", "0d", "empty"])
def test_unary_forward_float32(name, fn, ref, domain, shape):
    a = domain(*shape).astype(np.float32)
    out = fn(fg.tensor(a))
    assert out.dtype is fg.float32
    assert_close(out, ref(a.astype(np.float64)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,fn,ref,domain", UNARY, ids=UNARY_IDS)
@pytest.mark.parametrize("kind", LAYOUTS)
def test_unary_grad(name, fn, ref, domain, kind):
    check_grad(fn, domain(3, 4), kind=kind)


@pytest.mark.parametrize("name,fn,ref,domain", UNARY, ids=UNARY_IDS)
def test_unary_grad_0d(name, fn, ref, domain):
    check_grad(fn, domain())


@pytest.mark.parametrize("name,fn,ref,domain", UNARY, ids=UNARY_IDS)
def test_unary_forward_noncontiguous(name, fn, ref, domain):
    a = domain(4, 3)
    out = fn(fg.from_numpy(a).t())
    assert_close(out, ref(a.T))


# name, fusegrad function, numpy reference, domain of the second operand
BINARY = [
    ("add", lambda x, y: x + y, np.add, arr),
    ("sub", lambda x, y: x - y, np.subtract, arr),
    ("mul", lambda x, y: x * y, np.multiply, arr),
    ("div", lambda x, y: x / y, np.divide, positive),
    ("pow", lambda x, y: x ** y, np.power, arr),
    ("maximum", fg.maximum, np.maximum, arr),
    ("minimum", fg.minimum, np.minimum, arr),
    ("remainder", lambda x, y: x % y, np.remainder, positive),
    ("fmod", fg.fmod, np.fmod, positive),
    ("floor_divide", lambda x, y: x // y, np.floor_divide, positive),
    ("atan2_like_where", lambda x, y: fg.where(x > y, x, y), np.maximum, arr),
    ("clamp_tensor", lambda x, y: x.clamp(min=y), np.maximum, arr),
]
BINARY_IDS = [b[0] for b in BINARY]
BROADCASTS = [
    ((3, 4), (3, 4)),
    ((3, 4), (4,)),
    ((3, 1), (1, 4)),
    ((2, 3, 4), (3, 1)),
    ((4,), (2, 3, 4)),
    ((), (3,)),
    ((3, 2), ()),
    ((), ()),
]
BROADCAST_IDS = ["x".join(map(str, a)) + "_" + "x".join(map(str, b)) for a, b in BROADCASTS]


def _first_operand(name, shape):
    # pow needs a positive base for real results at non-integer exponents
    return positive(*shape, seed=1) if name == "pow" else arr(*shape, seed=1)


@pytest.mark.parametrize("name,fn,ref,domain", BINARY, ids=BINARY_IDS)
@pytest.mark.parametrize("sx,sy", BROADCASTS, ids=BROADCAST_IDS)
def test_binary_forward(name, fn, ref, domain, sx, sy):
    a, b = _first_operand(name, sx), domain(*sy, seed=2)
    out = fn(fg.tensor(a), fg.tensor(b))
    assert out.dtype is fg.float64
    assert_close(out, ref(a, b))


@pytest.mark.parametrize("name,fn,ref,domain", BINARY, ids=BINARY_IDS)
@pytest.mark.parametrize("sx,sy", BROADCASTS, ids=BROADCAST_IDS)
def test_binary_grad(name, fn, ref, domain, sx, sy):
    check_grad(fn, _first_operand(name, sx), domain(*sy, seed=2))


@pytest.mark.parametrize("name,fn,ref,domain", BINARY, ids=BINARY_IDS)
@pytest.mark.parametrize("kind", ["transposed", "strided"])
def test_binary_grad_noncontiguous(name, fn, ref, domain, kind):
    check_grad(fn, _first_operand(name, (3, 4)), domain(3, 4, seed=2), kind=kind)


def test_binary_transposed_operand_values():
    a, b = arr(3, 4), arr(4, 3, seed=1)
    out = fg.tensor(a) + fg.tensor(b).t()
    assert_close(out, a + b.T)
    assert out.is_contiguous()


@pytest.mark.parametrize("op", [fg.add, fg.mul, fg.sub, fg.maximum, fg.where])
def test_broadcast_mismatch_names_shapes(op):
    x, y = fg.ones(2, 3), fg.ones(2, 4)
    args = (x > 0, x, y) if op is fg.where else (x, y)
    with pytest.raises(RuntimeError, match=r"size of tensor a \(3\) must match the size of "
                                           r"tensor b \(4\) at non-singleton dimension 1") as e:
        op(*args)
    assert "[2, 3]" in str(e.value) and "[2, 4]" in str(e.value)


def test_ties_split_gradient_in_maximum_minimum():
    x = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = fg.tensor([1.0, 5.0, 0.0], requires_grad=True)
    fg.maximum(x, y).sum().backward()
    assert x.grad.tolist() == [0.5, 0.0, 1.0]
    assert y.grad.tolist() == [0.5, 1.0, 0.0]


def test_clamp_gradient_at_bounds_passes_through():
    # torch's convention: a value equal to the bound keeps its gradient.
    x = fg.tensor([-1.0, 0.0, 0.5, 1.0, 2.0], requires_grad=True)
    x.clamp(0.0, 1.0).sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]


def test_clamp_keeps_nan_and_needs_a_bound():
    out = fg.tensor([float("nan"), -3.0, 3.0]).clamp(-1, 1)
    assert math.isnan(out[0].item()) and out[1:].tolist() == [-1.0, 1.0]
    with pytest.raises(RuntimeError, match="At least one of 'min' or 'max' must not be None"):
        fg.clamp(fg.ones(2))


def test_clamp_int_tensor_stays_int():
    out = fg.tensor([-5, 0, 5]).clamp(-2, 2)
    assert out.dtype is fg.int64 and out.tolist() == [-2, 0, 2]


def test_pow_zero_base_gradients_are_finite():
    x = fg.tensor([0.0, 2.0], requires_grad=True)
    (x ** 2).sum().backward()
    assert x.grad.tolist() == [0.0, 4.0]
    x.grad = None
    (x ** 0).sum().backward()
    assert x.grad.tolist() == [0.0, 0.0]
    e = fg.tensor([0.0, 1.0], requires_grad=True)
    (fg.tensor(0.0) ** e).sum().backward()
    assert not np.isnan(e.grad.numpy()).any()


def test_pow_tensor_exponent_grad_name():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    assert (x ** 2).grad_fn.name() == "PowBackward0"
    assert (x ** x).grad_fn.name() == "PowBackward1"


def test_integer_pow_and_negative_exponent_error():
    assert (fg.tensor([2, 3]) ** 2).tolist() == [4, 9]
    assert (fg.tensor([2, 3]) ** 2).dtype is fg.int64
    assert (fg.tensor([2, 3]) ** 0.5).dtype is fg.float32
    with pytest.raises(RuntimeError, match="Integers to negative integer powers are not allowed"):
        fg.tensor([2, 3]) ** -1


def test_integer_division_semantics():
    a, b = fg.tensor([7, -7, 7, -7]), fg.tensor([2, 2, -2, -2])
    assert (a / b).dtype is fg.float32
    assert (a / b).tolist() == [3.5, -3.5, -3.5, 3.5]
    assert (a // b).tolist() == [3, -4, -4, 3]
    assert (a // b).dtype is fg.int64
    assert (a % b).tolist() == [1, 1, -1, -1]          # sign of the divisor, as Python
    assert fg.fmod(a, b).tolist() == [1, -1, 1, -1]     # sign of the dividend, as C
    assert fg.div(a, b, rounding_mode="trunc").tolist() == [3, -3, -3, 3]
    assert fg.div(a, b, rounding_mode="floor").tolist() == [3, -4, -4, 3]
    assert fg.div(a.float(), b, rounding_mode="trunc").tolist() == [3.0, -3.0, -3.0, 3.0]
    with pytest.raises(RuntimeError, match="rounding_mode"):
        fg.div(a, b, rounding_mode="round")


def test_integer_division_by_zero_raises():
    with pytest.raises(ZeroDivisionError):
        fg.tensor([1, 2]) // fg.tensor([1, 0])
    with pytest.raises(ZeroDivisionError):
        fg.tensor([1, 2]) % 0
    assert math.isinf((fg.tensor([1.0]) / 0).item())


def test_float_remainder_sign_follows_divisor():
    out = fg.tensor([5.5, -5.5]) % fg.tensor([2.0, 2.0])
    assert out.tolist() == [1.5, 0.5]
    assert (fg.tensor([5.5]) % -2.0).tolist() == [-0.5]


def test_unary_on_integers_computes_in_default_float():
    x = fg.tensor([1, 2, 4])
    for fn in (fg.exp, fg.log, fg.sqrt, fg.sin, fg.tanh, fg.sigmoid, fg.reciprocal):
        assert fn(x).dtype is fg.float32, fn
    assert_close(fg.sqrt(x), [1.0, math.sqrt(2), 2.0])
    # rounding ops keep integers as they are
    for fn in (fg.floor, fg.ceil, fg.round, fg.trunc):
        out = fn(x)
        assert out.dtype is fg.int64 and out.tolist() == [1, 2, 4]
    assert fg.abs(fg.tensor([-3, 3])).tolist() == [3, 3]
    assert (-fg.tensor([1, -2])).tolist() == [-1, 2]


def test_round_half_to_even_and_decimals():
    assert fg.tensor([0.5, 1.5, 2.5, -0.5]).round().tolist() == [0.0, 2.0, 2.0, -0.0]
    assert_close(fg.tensor([1.2345, -2.5551], dtype=fg.float64).round(decimals=2), [1.23, -2.56])
    assert_close(fg.tensor([1234.5], dtype=fg.float64).round(decimals=-2), [1200.0])


def test_rounding_ops_have_zero_gradient():
    x = fg.tensor([0.3, 1.7, -2.2], requires_grad=True)
    (x.floor() + x.ceil() + x.round() + x.sign() + x.trunc()).sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 0.0]


def test_abs_and_relu_gradient_at_zero():
    x = fg.tensor([0.0], requires_grad=True)
    x.abs().sum().backward()
    assert x.grad.tolist() == [0.0]
    y = fg.tensor([0.0, 1.0, -1.0], requires_grad=True)
    y.relu().sum().backward()
    assert y.grad.tolist() == [0.0, 1.0, 0.0]


def test_sqrt_log_outside_domain_give_nan():
    out = fg.tensor([-1.0, 0.0])
    assert math.isnan(fg.sqrt(out)[0].item())
    assert math.isnan(fg.log(out)[0].item()) and fg.log(out)[1].item() == -math.inf


@pytest.mark.slow
def test_nan_and_inf_results_do_not_warn_in_user_code():
    # torch computes log(0), sqrt(-1) and 1/0 silently. fusegrad silences numpy's
    # RuntimeWarnings with a filter installed at import, which pytest's per-test warning
    # capture discards, so check it in a fresh interpreter that turns warnings into errors.
    code = ("import fusegrad as fg; x = fg.tensor([-1.0, 0.0]); "
            "fg.log(x); fg.sqrt(x); fg.tensor([1.0]) / 0; fg.tensor(0.0) ** -1")
    subprocess.run([sys.executable, "-W", "error", "-c", code], check=True)


# --------------------------------------------------------------------------- comparisons

COMPARE = [
    ("lt", lambda x, y: x < y, np.less),
    ("le", lambda x, y: x <= y, np.less_equal),
    ("gt", lambda x, y: x > y, np.greater),
    ("ge", lambda x, y: x >= y, np.greater_equal),
    ("eq", lambda x, y: x == y, np.equal),
    ("ne", lambda x, y: x != y, np.not_equal),
    ("lt_fn", fg.lt, np.less),
    ("gt_fn", fg.gt, np.greater),
    ("eq_fn", fg.eq, np.equal),
]


@pytest.mark.parametrize("name,fn,ref", COMPARE, ids=[c[0] for c in COMPARE])
@pytest.mark.parametrize("sx,sy", [((3, 4), (3, 4)), ((3, 4), (4,)), ((), (2,))])
def test_comparisons(name, fn, ref, sx, sy):
    a = np.round(arr(*sx)) if sx else np.float64(1.0)
    b = np.round(arr(*sy, seed=3))
    out = fn(fg.tensor(a), fg.tensor(b))
    assert out.dtype is fg.bool
    np.testing.assert_array_equal(out.numpy(), ref(a, b))


@pytest.mark.parametrize("name,fn,ref", COMPARE[:6], ids=[c[0] for c in COMPARE[:6]])
def test_comparison_with_scalar_and_mixed_dtypes(name, fn, ref):
    a = np.array([1, 2, 3])
    np.testing.assert_array_equal(fn(fg.tensor(a), 2).numpy(), ref(a, 2))
    np.testing.assert_array_equal(fn(fg.tensor(a), 2.5).numpy(), ref(a, 2.5))
    np.testing.assert_array_equal(fn(fg.tensor(a), fg.tensor([1.0, 2.0, 3.5])).numpy(),
                                  ref(a, np.array([1.0, 2.0, 3.5])))


def test_comparison_result_has_no_grad():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    out = x > 1
    assert not out.requires_grad and out.grad_fn is None


@pytest.mark.parametrize("fn,ref", [(fg.logical_and, np.logical_and),
                                    (fg.logical_or, np.logical_or),
                                    (fg.logical_xor, np.logical_xor)])
def test_logical_binary(fn, ref):
    a = np.array([0.0, 1.0, 2.0, 0.0])
    b = np.array([0, 0, 3, 4])
    out = fn(fg.tensor(a), fg.tensor(b))
    assert out.dtype is fg.bool
    np.testing.assert_array_equal(out.numpy(), ref(a, b))


def test_logical_not_and_bool_operators():
    a = fg.tensor([True, False, True])
    b = fg.tensor([True, True, False])
    assert fg.logical_not(fg.tensor([0.0, 2.0])).tolist() == [True, False]
    assert (~a).tolist() == [False, True, False]
    assert (a & b).tolist() == [True, False, False]
    assert (a | b).tolist() == [True, True, True]
    assert (a ^ b).tolist() == [False, True, True]
    assert (a + b).tolist() == [True, True, True]
    assert (a * b).tolist() == [True, False, False]
    with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with two bool"):
        a - b
    with pytest.raises(RuntimeError, match="Negation, the `-` operator, on a bool tensor"):
        _ = -a


def test_isnan_isinf_isfinite():
    x = fg.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    assert fg.isnan(x).tolist() == [False, True, False, False]
    assert fg.isinf(x).tolist() == [False, False, True, True]
    assert fg.isfinite(x).tolist() == [True, False, False, False]
    ints = fg.tensor([1, 2])
    assert fg.isnan(ints).tolist() == [False, False] and fg.isinf(ints).dtype is fg.bool
    assert fg.isfinite(ints).tolist() == [True, True]


def test_isclose_allclose_equal():
    x = fg.tensor([1.0, 2.0, float("nan")])
    y = fg.tensor([1.0 + 1e-7, 2.1, float("nan")])
    assert fg.isclose(x, y).tolist() == [True, False, False]
    assert fg.isclose(x, y, equal_nan=True).tolist() == [True, False, True]
    assert fg.allclose(x[:1], y[:1]) and not fg.allclose(x, y)
    assert fg.allclose(fg.tensor([1.0]), fg.tensor([1.05]), atol=0.1)
    assert fg.equal(fg.tensor([1, 2]), fg.tensor([1, 2]))
    assert not fg.equal(fg.tensor([1, 2]), fg.tensor([1, 3]))
    assert not fg.equal(fg.tensor([1, 2]), fg.tensor([[1, 2]]))
    # more than one dimension: the whole tensor is reduced, not its rows
    m = fg.tensor(np.arange(12.0).reshape(3, 4))
    assert fg.equal(m, m.clone()) and m.equal(m) and fg.allclose(m, m + 1e-9)
    assert not fg.equal(m, m.clone().masked_fill(m == 7.0, -1.0))
    assert not fg.allclose(m, m + 1) and not m.allclose(m + 1)


# --------------------------------------------------------------------------- where


@pytest.mark.parametrize("kind", LAYOUTS)
def test_where_forward_and_grad(kind):
    c = arr(3, 4, seed=5) > 0
    a, b = arr(3, 4), arr(4, seed=1)
    out = fg.where(fg.tensor(c), fg.tensor(a), fg.tensor(b))
    assert_close(out, np.where(c, a, b))
    check_grad(lambda x, y: fg.where(fg.tensor(c), x, y), a, b, kind=kind)


def test_where_scalar_operands_and_promotion():
    c = fg.tensor([True, False])
    assert fg.where(c, fg.tensor([1, 2]), 0.5).dtype is fg.float32
    assert fg.where(c, 1.0, 0.0).tolist() == [1.0, 0.0]
    assert fg.where(c, fg.tensor([1, 2]), fg.tensor([3, 4])).tolist() == [1, 4]
    x = fg.tensor([1.0, -2.0])
    assert x.where(x > 0, fg.tensor(0.0)).tolist() == [1.0, 0.0]


def test_where_single_argument_is_nonzero():
    rows, cols = fg.where(fg.tensor([[0, 1], [1, 0]]))
    assert rows.tolist() == [0, 1] and cols.tolist() == [1, 0]


# --------------------------------------------------------------------------- misc


def test_operand_of_wrong_type():
    with pytest.raises(TypeError, match="unsupported operand"):
        fg.ones(2) + "a"
    with pytest.raises(TypeError, match="must be Tensor or Number"):
        fg.add(fg.ones(2), "a")


def test_numpy_array_operands():
    out = fg.tensor([1.0, 2.0]) + np.array([1.0, 1.0])
    assert isinstance(out, fg.Tensor)
    assert out.tolist() == [2.0, 3.0]
    rout = np.array([1.0, 1.0]) * fg.tensor([2.0, 3.0])
    assert isinstance(rout, fg.Tensor) and rout.tolist() == [2.0, 3.0]


def test_sixteen_bit_floats_compute_and_round_back():
    for dt in (fg.float16, fg.bfloat16):
        x = fg.tensor([1.0, 2.0, 3.0], dtype=dt)
        out = (x.exp() * 2 + 1).sqrt()
        assert out.dtype is dt
        assert_close(out.float(), np.sqrt(np.exp([1.0, 2.0, 3.0]) * 2 + 1), rtol=1e-2, atol=1e-2)


def test_sixteen_bit_gradient_dtype():
    x = fg.tensor([1.0, 2.0], dtype=fg.float16, requires_grad=True)
    (x * x).sum().backward()
    assert x.grad.dtype is fg.float16 and x.grad.tolist() == [2.0, 4.0]


def test_grad_through_mixed_dtype_binary():
    x = fg.tensor([1.0, 2.0], dtype=fg.float32, requires_grad=True)
    y = fg.tensor([3.0, 4.0], dtype=fg.float64, requires_grad=True)
    out = x * y
    assert out.dtype is fg.float64
    out.sum().backward()
    assert x.grad.dtype is fg.float32 and x.grad.tolist() == [3.0, 4.0]
    assert y.grad.dtype is fg.float64 and y.grad.tolist() == [1.0, 2.0]


def test_grad_of_broadcast_sum_to_shape():
    x = leaf(arr(3, 1))
    y = leaf(arr(1, 4, seed=1))
    (x * y).sum().backward()
    assert x.grad.shape == (3, 1) and y.grad.shape == (1, 4)
    assert_close(x.grad, np.broadcast_to(y.detach().numpy().sum(), (3, 1)))


def test_aliases_and_functional_forms():
    x = fg.tensor([-1.5, 0.5, 2.0])
    y = fg.tensor([1.0, 0.5, -2.0])
    assert fg.absolute(x).tolist() == fg.abs(x).tolist() == [1.5, 0.5, 2.0]
    assert fg.negative(x).tolist() == [1.5, -0.5, -2.0]
    assert fg.fix(x).tolist() == fg.trunc(x).tolist() == [-1.0, 0.0, 2.0]
    assert fg.true_divide(x, y).tolist() == (x / y).tolist()
    assert fg.pow(x, 2).tolist() == (x ** 2).tolist()
    assert fg.clip(x, 0, 1).tolist() == [0.0, 0.5, 1.0]
    assert fg.ge(x, y).tolist() == [False, True, True] and fg.le(x, y).tolist() == [True, True,
                                                                                      False]
    assert fg.ne(x, y).tolist() == [True, False, True]
    assert fg.greater(x, y).tolist() == fg.gt(x, y).tolist()
    assert fg.less_equal(x, y).tolist() == fg.le(x, y).tolist()
    assert fg.not_equal(x, y).tolist() == fg.ne(x, y).tolist()
    a, b = fg.tensor([True, False]), fg.tensor([True, True])
    assert fg.bitwise_and(a, b).tolist() == [True, False]
    assert fg.bitwise_or(a, b).tolist() == [True, True]
    assert fg.bitwise_xor(a, b).tolist() == [False, True]
    assert fg.bitwise_not(a).tolist() == [False, True]
    assert (fg.tensor([1, 2]) & fg.tensor([3, 4])).tolist() == [1, 0]  # integers: test_ops_more
    assert (~fg.tensor([1, 2])).tolist() == [-2, -3]
    p, q = fg.broadcast_tensors(fg.ones(3, 1), fg.zeros(4))
    assert p.shape == q.shape == (3, 4)
    assert fg.ones(6).reshape_as(fg.zeros(2, 3)).shape == (2, 3)


def test_erf_float32_is_libm_rounded():
    # float32 erf runs a table-driven expansion, not libm per element: its result must still
    # be libm's erf rounded to float32, signed zeros, infinities and NaN included.
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(200_000) * np.exp(rng.uniform(-9, 3, 200_000))).astype(np.float32)
    edge = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5.9999, 6.0, -6.5, 1e-30, -1e-40,
                     2.0 ** -11, 3.0 ** 0.5], dtype=np.float32)
    x = np.concatenate([x, edge])
    want = np.array([math.erf(v) for v in x.astype(np.float64).tolist()]).astype(np.float32)
    got = fg.erf(fg.tensor(x)).numpy()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    assert fg.erf(fg.tensor(np.float32(-0.5))).item() == np.float32(math.erf(-0.5))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64, np.int8, np.bool_])
def test_where_primitive_matches_np_where_bitwise(dtype):
    # where's reference selects with bit operations instead of np.where: the bits (NaN
    # payloads, signed zeros), the broadcast shape and the C layout must be np.where's.
    from fusegrad.ops.prims import where
    rng = np.random.default_rng(0)
    special = np.array([np.nan, -0.0, np.inf, -np.inf, 1.5]) if np.dtype(dtype).kind == "f" \
        else np.array([1, 0])
    cases = [((7, 1, 5), (1, 6, 5), (7, 6, 1)), ((4, 3), (), (4, 3)), ((), (5,), ()),
             ((3, 4), (3, 4), (3, 4)), ((), (), ()), ((0, 3), (3,), (1, 3))]
    for xs, ys, cs in cases:
        x = (rng.standard_normal(xs) * 5).astype(dtype)
        y = rng.choice(special, ys).astype(dtype) if ys else np.asarray(special[0], dtype)
        c = rng.random(cs) < 0.5
        got = where.impl(c, x, y)
        want = np.where(c, x, y)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got).reshape(-1).view(np.uint8),
                                      want.reshape(-1).view(np.uint8))
    xt = rng.standard_normal((6, 5)).astype(dtype).T       # a transposed operand
    c = rng.random((5, 6)) < 0.5
    assert where.impl(c, xt, xt[::-1]).flags.c_contiguous


@pytest.mark.parametrize("name", ["exp", "log", "tanh", "erf", "expm1"])
def test_float32_transcendentals_in_blocks_equal_one_pass(name):
    # Large float32 inputs are evaluated in cache-sized blocks (prims._blockwise): the result
    # is float64's, rounded once, as for a small array, also for a transposed operand.
    from fusegrad.ops import prims
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((5, 3 * prims._BLOCK + 7)) * 3).astype(np.float32)
    if name == "log":
        x = np.abs(x)
    x[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    f64 = _np_erf if name == "erf" else getattr(np, name)
    for operand in (x, x.T):
        got = getattr(fg, name)(fg.tensor(operand)).numpy()
        want = f64(operand.astype(np.float64)).astype(np.float32)
        assert got.shape == operand.shape
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("dtype", [fg.float16, fg.bfloat16], ids=str)
def test_sixteen_bit_times_or_over_a_python_float_rounds_once(dtype):
    """torch's mul and div (every rounding mode) take a Python scalar in float32 with a 16-bit
    tensor and round once: float16 2.39453125 * 0.1 is 0.2395 (x * float16(0.1) rounded is
    0.23938), -1.7998046875 / 0.3 truncates to -5 (the quotient rounded first is -6). add and
    sub round the scalar to the tensor's dtype first."""
    x = np.random.default_rng(4).standard_normal(512).astype(np.float32) * 4
    x = np.concatenate([x, [2.39453125, -1.7998046875, 3.900390625, -1.203125]])
    t = fg.tensor(x).to(dtype)
    x32 = t.float().numpy()
    narrow = t.numpy().dtype

    def rounded(v):
        return np.asarray(v, np.float32).astype(narrow).astype(np.float32)
    s = np.float32(0.3)
    cases = {
        "mul": (lambda a: a * 0.3, rounded(x32 * s)),
        "rmul": (lambda a: 0.3 * a, rounded(x32 * s)),
        "div": (lambda a: a / 0.3, rounded(x32 / s)),
        "trunc": (lambda a: fg.div(a, 0.3, rounding_mode="trunc"), rounded(np.trunc(x32 / s))),
        "add": (lambda a: a + 0.3, rounded(x32 + np.float32(s.astype(narrow)))),
    }
    for name, (fn, want) in cases.items():
        for got in (fn(t), fg.compile(fn)(t)):
            assert got.dtype is dtype
            np.testing.assert_array_equal(got.float().numpy(), want, err_msg=name)
    # floor division: torch's div_floor_floating of the float32 values
    floor = fg.floor_divide(fg.tensor(x32), float(s)).to(dtype).float().numpy()
    for got in (t // 0.3, fg.compile(lambda a: a // 0.3)(t)):
        np.testing.assert_array_equal(got.float().numpy(), floor)
