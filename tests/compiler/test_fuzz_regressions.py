"""Regression tests for defects the differential fuzzer found (docs/fuzzing.md, "Findings").

Each test is the reduced program of a finding, compiled against eager (the reference).
"""

from __future__ import annotations

import functools
import subprocess
import sys

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F

BOOLS = [(x, y) for x in (False, True) for y in (False, True)]


@pytest.mark.parametrize("x, y", BOOLS)
def test_pow_of_bools(x, y):
    # Finding 1: the integer power loop shifted an i1 right by one bit (poison in LLVM), and
    # the kernel never returned for pow(True, True).
    cf = fg.compile(lambda a, b: fg.pow(a, b))
    got = cf(fg.tensor(x), fg.tensor(y))
    want = fg.pow(fg.tensor(x), fg.tensor(y))
    assert got.dtype is fg.bool and want.dtype is fg.bool
    assert bool(got) == bool(want) == (x or not y)


def test_pow_of_bool_tensors_and_literals():
    x = fg.tensor([True, False, True, False])
    y = fg.tensor([True, True, False, False])
    np.testing.assert_array_equal(fg.compile(lambda a, b: a ** b)(x, y).numpy(),
                                  [True, False, True, True])
    np.testing.assert_array_equal(fg.compile(lambda a: fg.pow(a, True))(x).numpy(), x.numpy())


@pytest.mark.slow
def test_pow_of_bools_returns_in_a_fresh_process():
    # The hang, guarded so that a regression fails instead of stalling the suite.
    code = ("import fusegrad as fg; cf = fg.compile(lambda x, y: fg.pow(x, y)); "
            "print(bool(cf(fg.tensor(True), fg.tensor(True))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.stdout.strip() == "True", out.stderr


def test_backward_of_a_matmul_used_twice_with_infinities():
    # Finding 2: the compiled backward of each output ran the VJP of all outputs with zero
    # cotangents for the others; 0 @ inf is NaN where eager autograd gives -inf.
    v4 = np.array([[np.nan, 1.25], [-np.inf, 1e-3], [-0.0, -1.06]], np.float32)

    def f(v0, v1, v4):
        v2 = v0 @ v1
        return v2 @ v4, v2.neg()

    grads = []
    for fn in (f, fg.compile(f)):
        v1 = fg.tensor([[0.5, -1.0, 2.0]], requires_grad=True)
        v5, v3 = fn(fg.tensor([1.5]), v1, fg.from_numpy(v4))
        fg.autograd.backward([v5, v3], [fg.tensor([1.0, -1.0]), fg.tensor([0.5, 0.5, 0.5])])
        grads.append(v1.grad.numpy())
    np.testing.assert_array_equal(grads[0][0, :2], [np.nan, -np.inf])
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-6)


def test_backward_of_one_output_ignores_the_others():
    # Only the first output gets a gradient: infinities on the second's path do not leak.
    def f(a, w):
        return (a * 2.0).sum(), a @ w

    w = fg.tensor([[np.inf], [-np.inf], [np.nan]])
    for fn in (f, fg.compile(f)):
        a = fg.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
        fn(a, w)[0].backward()
        np.testing.assert_array_equal(a.grad.numpy(), [[2.0, 2.0, 2.0]])


INT_POWERS = [
    ("literal -1", lambda x, y: x ** -1),
    ("literal -20", lambda x, y: fg.pow(x, -20)),
]


@pytest.mark.parametrize("name, fn", INT_POWERS, ids=[n for n, _ in INT_POWERS])
@pytest.mark.parametrize("dtype", [fg.int64, fg.int32, fg.int8])
def test_integer_pow_with_a_negative_exponent_raises(name, fn, dtype):
    # Finding 3: compiled code returned 0 where eager and torch raise.
    x = fg.tensor([2, 3, 1], dtype=dtype)
    y = fg.tensor([2, -1, 3], dtype=dtype)
    with pytest.raises(RuntimeError, match="negative integer powers"):
        fn(x, y)
    with pytest.raises(RuntimeError, match="negative integer powers"):
        fg.compile(fn)(x, y)


@pytest.mark.parametrize("dtype", [fg.int64, fg.int32, fg.int8])
def test_integer_pow_with_a_negative_exponent_tensor_truncates(dtype):
    # torch raises for a negative Python int exponent only; a tensor exponent gives
    # 1 / x**n truncated (0, or +-1 for x = +-1), eager and compiled alike.
    x = fg.tensor([2, 3, 1, -1], dtype=dtype)
    y = fg.tensor([2, -1, 3, -3], dtype=dtype)
    for fn in (fg.pow, fg.compile(fg.pow)):
        assert fn(x, y).tolist() == [4, 0, 1, -1]


@pytest.mark.parametrize("dtype", [fg.int64, fg.int32, fg.uint8])
def test_integer_pow_with_non_negative_exponents(dtype):
    x = fg.tensor([2, 3, 0, 1, 5], dtype=dtype)
    y = fg.tensor([0, 1, 0, 7, 3], dtype=dtype)
    for fn in (lambda a, b: a ** b, lambda a, b: a ** 3, lambda a, b: fg.pow(a, 20)):
        np.testing.assert_array_equal(fg.compile(fn)(x, y).numpy(), fn(x, y).numpy())


def test_float_computed_from_an_integer_cast_does_not_require_grad():
    # seed 2, program 110: eager autograd stops at an integer result, and so does
    # requires_grad of what is computed from it; the compiled function said True.
    def f(a):
        return a.to(fg.int32) + 0.5, (a.to(fg.int64) * a).sum()

    a = fg.tensor([1.5, -2.25, 3.0], requires_grad=True)
    want = f(a)
    got = fg.compile(f)(a)
    assert [t.requires_grad for t in got] == [t.requires_grad for t in want] == [False, True]
    got[1].backward()
    np.testing.assert_array_equal(a.grad.numpy(), [1.0, -2.0, 3.0])


@pytest.mark.parametrize("dtype", [fg.float16, fg.bfloat16, fg.float32, fg.float64])
@pytest.mark.parametrize("n", [0, 1, 3, 5000])
def test_sum_of_negative_zeros_is_positive_zero(dtype, n):
    # seed 2, program 425: compiled sums started at -0.0, so sum([]) and sum([-0.]) were -0.
    # and their rsqrt -inf; numpy, torch and eager start at +0.0.
    x = fg.from_numpy(np.full((n,), -0.0, np.float32)).to(dtype)

    def f(x):
        return x.sum(), x.sum(dim=(0,)).rsqrt(), x.reshape(1, n).sum(dim=1)

    for got, want in zip(fg.compile(f)(x), f(x)):
        np.testing.assert_array_equal(np.signbit(got.float().numpy()), False)
        np.testing.assert_array_equal(got.float().numpy(), want.float().numpy())


def test_sum_of_a_0d_negative_zero():
    x = fg.tensor(-0.0)
    assert not np.signbit(fg.compile(lambda t: t.sum())(x).numpy())
    assert not np.signbit(x.sum().numpy())


def test_gradients_of_two_outputs_meet_at_a_16_bit_value():
    # seed 2, program 638: eager adds the two outputs' gradients at the float16 value and
    # rounds the sum to float16; the compiled call's node does the same (one VJP for both).
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5))
    cts = [fg.from_numpy(rng.standard_normal((3, 5)).astype(np.float16)) for _ in range(2)]

    def f(v0):
        v1 = v0.to(fg.float16)
        return v1.flip((0,)), v1 * 1.0

    grads = []
    for fn in (f, fg.compile(f)):
        a = fg.from_numpy(x.copy()).requires_grad_()
        grads.append(fg.autograd.grad(list(fn(a)), [a], cts)[0].numpy())
    np.testing.assert_array_equal(grads[1], grads[0])


def test_outputs_of_one_call_backward_separately_and_together():
    def f(a, b):
        return (a * b).sum(), (a.exp() * 2).sum()

    x, y = np.array([0.5, -1.0, 2.0]), np.array([3.0, 0.25, -1.5])
    a, b = fg.tensor(x, requires_grad=True), fg.tensor(y, requires_grad=True)
    out0, out1 = fg.compile(f)(a, b)
    out0.backward()
    np.testing.assert_allclose(a.grad.numpy(), y)
    out1.backward()                                  # the other output still has its graph
    np.testing.assert_allclose(a.grad.numpy(), y + 2 * np.exp(x))
    with pytest.raises(RuntimeError, match="second time"):
        out0.backward()                              # this one was freed
    a.grad = b.grad = None
    out0, out1 = fg.compile(f)(a, b)
    (out0 + out1).backward()
    np.testing.assert_allclose(a.grad.numpy(), y + 2 * np.exp(x))
    np.testing.assert_allclose(b.grad.numpy(), x)


def test_graph_arithmetic_rounds_each_op_as_eager_does():
    # Fuzzer seed 7, program 1345: softmax over a dim of size 1 of x*x. With FMA contraction
    # `x*x - max(x*x)` was the rounding error of x*x (-3.2e8 for x = 1.4e8, -inf where x*x
    # overflows), so softmax gave NaN where eager gives 1.
    a = np.array([[[[7.0395434e+23, -2.5387026e+31], [1.4166290e+08, 3.0476164e+17]]]],
                 np.float32)

    def f(v):
        return F.softmax(v.square(), dim=0), v * v - (v * v).amax(0, keepdim=True)

    x = fg.from_numpy(a)
    with np.errstate(all="ignore"):
        for got, want in zip(fg.compile(f)(x), f(x)):
            np.testing.assert_array_equal(got.numpy(), want.numpy())
    # Products feeding sums and differences round before the add, as numpy's do.
    r = np.random.default_rng(0)
    p, q, s = (r.standard_normal(257).astype(np.float32) for _ in range(3))
    got = fg.compile(lambda p, q, s: p * q + s)(*map(fg.from_numpy, (p, q, s)))
    np.testing.assert_array_equal(got.numpy(), p * q + s)


@pytest.mark.parametrize("dtype", [fg.float16, fg.bfloat16, fg.float32, fg.float64], ids=str)
def test_square_root_power_at_negative_infinity_and_zero(dtype):
    # Fuzzer seed 7, program 2601: float16 (-inf) ** 0.5 is +inf in eager (numpy and torch
    # take 16-bit powers as C's pow in float32) and was NaN compiled (sqrt). float32 and
    # float64 take x ** 0.5 as sqrt in numpy and torch: NaN and -0 there.
    t = fg.tensor([-np.inf, -0.0, 0.0, 4.0, np.inf, -1.0, np.nan], dtype=dtype)
    with np.errstate(all="ignore"):
        want = (t ** 0.5).numpy().astype(np.float64)
        got = fg.compile(lambda v: v ** 0.5)(t).numpy().astype(np.float64)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def _divisions(a, y):
    return a // y, fg.remainder(a, y), fg.fmod(a, y)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8])
def test_simulated_cuda_integer_division_truncates_at_the_minimum(dtype):
    # Finding 11 (seed 20261202, program 794): the kernel IR interpreter (the simulated CUDA
    # driver's) divided integers as |x| // |y| with the signs restored, and |INT64_MIN| wraps
    # to itself: INT64_MIN // 2 came out positive. C's truncating division is now numpy's
    # floor quotient, one up where the exact quotient is negative and not whole.
    from fusegrad.runtime import cuda as rt
    from fusegrad.testing.simulated_cuda import SimulatedDriver
    info = np.iinfo(dtype)
    x = np.array([info.min, info.min + 1, -7, -6, -1, 0, 5, info.max], dtype)
    rt.set_driver(SimulatedDriver())
    try:
        for y in (2, 3, -2, -3, 7):
            f = fg.compile(functools.partial(_divisions, y=y), backend="cuda")
            got = [t.numpy() for t in f(fg.from_numpy(x.copy()))]
            want = [np.floor_divide(x, dtype(y)), np.remainder(x, dtype(y)),
                    np.fmod(x, dtype(y))]
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
    finally:
        rt.set_driver(None)


def test_eager_gelu_gradient_under_an_overflowing_exp_is_inf_as_torchs():
    # Finding 12 (seed 20261202, program 26): exp(gelu(100)) overflows float32, and the
    # gradient is inf * gelu'(100) = inf. Compiled code (GELU's custom VJP) gave inf, as
    # torch; eager differentiated the primitives and multiplied inf by the pdf's 0 (NaN).
    # Eager custom_vjp now records a node applying the rule (tests/compiler/test_custom_vjp.py).
    x = fg.tensor([100.0, -1.0568868], requires_grad=True)
    F.gelu(x).exp().sum().backward()
    eager = x.grad.numpy()
    compiled = fg.compile(lambda v: fg.autograd.grad(F.gelu(v).exp().sum(), [v])[0])(
        fg.tensor([100.0, -1.0568868], requires_grad=True)).numpy()
    assert np.isposinf(eager[0]) and np.isposinf(compiled[0])
    np.testing.assert_allclose(eager[1], compiled[1], rtol=1e-6)


@pytest.mark.slow
def test_backward_of_a_flip_of_an_empty_tensor_in_a_fresh_process():
    # Finding 13 (seed 20261202, programs 3003, 3457, 3764, 4950, 6926: a crash): the
    # compiled backward of `flip` scatters rows with the native row loop, whose column loop
    # ran at least once. Rows of no elements, as in a (2, 0, 1) tensor, wrote past the
    # buffer until the process died. Run in a fresh process, so that a regression fails.
    code = ("import fusegrad as fg\n"
            "x = fg.zeros(2, 0, 1, dtype=fg.float64, requires_grad=True)\n"
            "f = fg.compile(lambda v: v.flip((0, 1, 2)).var(dim=(0, 1)), fullgraph=True)\n"
            "out = f(x)\n"
            "g, = fg.autograd.grad(out.sum(), [x])\n"
            "print(tuple(g.shape), out.isnan().all().item())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "(2, 0, 1) True"
