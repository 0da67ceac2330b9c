"""Compiled code equals eager at the edges, bit for bit where eager is exact.

fmod, remainder and floor_divide on huge, tiny, infinite, NaN and signed-zero operands;
integer division (wrapping INT_MIN // -1, raising on a zero divisor); float-to-int casts of
NaN, Inf and out-of-range values; the rounding of every 16-bit intermediate inside a fused
kernel; gradients at NaN; and the errors eager raises for in-place writes to leaves and for
views of incompatible strides. The eager side is pinned to references in
tests/test_semantics_edge.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.runtime.cpu import NumpyStep
from tests.test_semantics_edge import CAST_VALUES, FLOATS, INTS, assert_bitwise, edge_pairs

INF, NAN = math.inf, math.nan


def compiled_and_eager(fn, *arrays):
    args = [fg.from_numpy(a) for a in arrays]
    with fg.no_grad():
        compiled = fg.compile(fn, fullgraph=True)
        return compiled(*args), fn(*args), compiled


def numpy_ops(compiled, *arrays) -> set[str]:
    program = compiled.lower(*[fg.from_numpy(a) for a in arrays]).program
    return {n.op for s in program.steps if isinstance(s, NumpyStep) for n in s.kernel.nodes}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_division_family_bitwise_equal_to_eager(dtype):
    x, y = edge_pairs(dtype)

    def f(a, b):
        return fg.fmod(a, b), a % b, a // b, fg.fmod(a, 3.0), a % -0.5, a // 0.1

    got, want, compiled = compiled_and_eager(f, x, y)
    for name, g, w in zip(("fmod", "remainder", "floordiv", "fmod 3", "% -0.5", "// 0.1"),
                          got, want):
        assert g.dtype is w.dtype is dtype
        assert_bitwise(g.numpy(), w.numpy(), f"{name} {dtype}")
    assert not numpy_ops(compiled, x, y)


def test_issue_repros_compiled():
    x = fg.tensor([1e30, -1e30, 1e10, 123456789, 1, -1])
    y = fg.tensor([3, 7, 3, 0.1, INF, -INF])
    got = fg.compile(fg.fmod)(x, y).numpy()
    np.testing.assert_allclose(got, [0, -1, 1, 0.0603505, 1, -1], rtol=1e-5)
    got = fg.compile(lambda a, b: a // b)(fg.tensor([1.0, INF]), fg.tensor([-INF, 1.0]))
    assert_bitwise(got.numpy(), np.array([-1.0, NAN], np.float32))


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integer_division_by_literals(dtype):
    info = np.iinfo(dtype.np_dtype)
    x = np.array([7, -7, 0, 1, -1, 100, -100, info.min, info.max] if dtype.is_signed else
                 [7, 0, 1, 100, 254, info.max], dtype.np_dtype)

    def f(a):
        out = (a // 3, a % 3, fg.fmod(a, 3), a // 7, a % 7)
        if dtype.is_signed:
            # INT_MIN // -1 wraps to INT_MIN (LLVM's sdiv would be undefined there)
            out += (a // -1, a % -1, fg.fmod(a, -1), a // -3, a % -3, fg.fmod(a, -3))
        return out

    got, want, compiled = compiled_and_eager(f, x)
    for g, w in zip(got, want):
        assert g.dtype is w.dtype
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    assert not numpy_ops(compiled, x)      # literal divisors compile to LLVM code


@pytest.mark.parametrize("name", ["floor_divide", "remainder", "fmod"])
def test_compiled_integer_division_by_zero_raises(name):
    op = getattr(fg, name)
    compiled = fg.compile(lambda a, b: op(a * 2, b) + 1)
    a = fg.tensor([1, 2, 3], dtype=fg.int32)
    np.testing.assert_array_equal(compiled(a, fg.tensor([1, -1, 2], dtype=fg.int32)).numpy(),
                                  op(a * 2, fg.tensor([1, -1, 2], dtype=fg.int32)).numpy() + 1)
    with pytest.raises(ZeroDivisionError):
        compiled(a, fg.tensor([1, 0, 2], dtype=fg.int32))
    with pytest.raises(ZeroDivisionError):
        fg.compile(lambda a: op(a, 0))(a)


@pytest.mark.parametrize("src", FLOATS, ids=str)
def test_float_to_int_casts_equal_eager(src):
    with np.errstate(over="ignore"):
        values = np.array(CAST_VALUES * 3).astype(src.np_dtype)   # vector and scalar loops
    targets = INTS + (fg.bool,)

    def f(a):
        return tuple(a.to(d) for d in targets) + tuple((a * 1).to(d) for d in targets)

    got, want, compiled = compiled_and_eager(f, values)
    for g, w in zip(got, want):
        assert g.dtype is w.dtype
        np.testing.assert_array_equal(g.numpy(), w.numpy(), err_msg=f"{src} -> {w.dtype}")
    assert not numpy_ops(compiled, values)


def test_tanh_then_long_rounds_to_float16_first():
    t = fg.tensor([5.0], dtype=fg.float16)
    assert fg.compile(lambda t: t.tanh().long())(t).tolist() == [1]
    assert t.tanh().long().tolist() == [1]


HALF = (fg.float16, fg.bfloat16)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_sixteen_bit_intermediates_are_rounded(dtype):
    # Chains of correctly rounded float32 ops (+, *, /, sqrt) on 16-bit values: eager rounds
    # after each one, so the compiled kernel must too, for the results to agree exactly.
    rng = np.random.default_rng(0)
    x = rng.uniform(-4, 4, 257).astype(dtype.np_dtype)
    y = rng.uniform(0.5, 3, 257).astype(dtype.np_dtype)

    def f(a, b):
        s = a * 1.1 + b / 3
        return (s, (s * 7).floor(), (a / b).sqrt().to(fg.int64), ((a + b) * 1000).to(fg.int32),
                fg.where(a > 0, a * b, b / 7) * 3, (a * b).to(fg.float32),
                fg.full((257,), 0.1, dtype=dtype) * 10 + a,
                (a.sum() + 0.3) * b, (a * 3).sum(), (a * b).amax() * 1.7)

    got, want, _ = compiled_and_eager(f, x, y)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype is w.dtype
        if i == 8:
            # a sum: eager (numpy) and the kernel add in different orders
            np.testing.assert_allclose(g.float().numpy(), w.float().numpy(), rtol=1e-2)
        else:
            np.testing.assert_array_equal(g.float().numpy(), w.float().numpy(), err_msg=str(i))


def test_sixteen_bit_matmul_epilogue_is_rounded():
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (4, 8)).astype(np.float16)
    b = rng.uniform(-1, 1, (8, 5)).astype(np.float16)
    got, want, _ = compiled_and_eager(lambda a, b: ((a @ b) * 1.3 + 0.7) * 100, a, b)
    np.testing.assert_array_equal(got.float().numpy(), want.float().numpy())


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_sign_maximum_minimum_signed_zero_and_nan(dtype):
    x = np.array([-0.0, 0.0, NAN, 1.0, -0.0, NAN, 2.0] * 5, dtype.np_dtype)
    y = np.array([0.0, -0.0, 1.0, NAN, -0.0, NAN, 2.0] * 5, dtype.np_dtype)
    got, want, _ = compiled_and_eager(
        lambda a, b: (fg.maximum(a, b), fg.minimum(a, b), a.sign(), a.abs(), a.clamp(0.0, 1.0)),
        x, y)
    for g, w in zip(got, want):
        assert_bitwise(g.numpy(), w.numpy(), str(dtype))


def test_gradients_at_nan_compiled_equal_eager():
    x = np.array([NAN, 0.0, -0.0, 1.0, -1.0, INF, -INF, 2.0, 0.5], np.float32)
    y = np.array([1.0, 0.0, 0.0, 1.0, NAN, INF, 2.0, 0.5, 0.5], np.float32)
    lo = np.full(9, -0.5, np.float32)
    hi = np.array([1.0, NAN, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.25], np.float32)

    def f(a, b, c, d):
        return (a.abs() + a.clamp(0.0, 1.0) + fg.maximum(a, b) * 2 + fg.minimum(a, b) * 3
                + a.clamp(c, d) * 5 + fg.fmod(a, b) * 7 + (a % b) * 11).sum()

    def run(fn):
        ts = [fg.tensor(v, requires_grad=True) for v in (x, y, lo, hi)]
        fn(*ts).backward()
        return [t.grad.numpy() for t in ts]

    for g, w in zip(run(fg.compile(f)), run(f)):
        assert_bitwise(g, w)


def test_in_place_write_to_a_leaf_raises_compiled():
    x = fg.ones(3, requires_grad=True)
    for fn in (lambda t: t.add_(1), lambda t: t[1:].mul_(2)):
        for g in (fn, fg.compile(fn)):
            with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
                g(x)
    np.testing.assert_array_equal(x.detach().numpy(), [1.0, 1.0, 1.0])
    f = fg.compile(lambda t: t.add_(1))
    np.testing.assert_array_equal(f(x * 1).detach().numpy(), [2.0, 2.0, 2.0])  # not a leaf
    with fg.no_grad():
        f(x)                                          # allowed under no_grad, as eager
    np.testing.assert_array_equal(x.detach().numpy(), [2.0, 2.0, 2.0])
    captured = fg.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        fg.compile(lambda t: captured.mul_(t))(fg.ones(2))



@pytest.mark.parametrize("fn", [
    lambda i, f: i.add_(f), lambda i, f: i.mul_(2.5), lambda i, f: i.__itruediv__(2),
    lambda i, f: i[1:].sub_(f[1:]), lambda i, f: i.bool().add_(i)])
def test_in_place_result_of_a_higher_category_raises_compiled(fn):
    # int.add_(float) raises in eager (as torch); compiled, it used to truncate silently
    i, f = fg.tensor([1, 2, 3], dtype=fg.int32), fg.tensor([0.5, 1.5, 2.5])
    for g in (fn, fg.compile(fn)):
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
            g(i, f)
    np.testing.assert_array_equal(i.numpy(), [1, 2, 3])
    copy = fg.compile(lambda i, f: i.copy_(f) * 1)     # copy_ casts, as eager
    np.testing.assert_array_equal(copy(i, f).numpy(), [0, 1, 2])
    np.testing.assert_array_equal(i.numpy(), [0, 1, 2])


@pytest.mark.parametrize("fn", [
    lambda a: a.t().view(12), lambda a: a[:, :2].view(6), lambda a: a.t()[1:].view(-1),
    lambda a: a.expand(2, 3, 4).view(24)])
def test_incompatible_view_raises_compiled(fn):
    a = fg.ones(3, 4)
    for g in (fn, fg.compile(fn)):
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            g(a)


@pytest.mark.parametrize("fn", [
    lambda a: a.t().t().view(12), lambda a: a[:2].view(8), lambda a: a.t().reshape(12).view(3, 4),
    lambda a: a[None].expand(2, 3, 4).view(2, 12)])
def test_compatible_view_compiles(fn):
    a = fg.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(fg.compile(fn)(a).numpy(), fn(a).numpy())


def test_outputs_reduced_to_an_input_or_to_each_other_are_fresh_tensors():
    # x * 1 simplifies to x, and CSE merges x * 2 with x * 2: the outputs used to be the
    # input's buffer, or one buffer twice, so writing one changed the other
    for fn in (lambda x: x * 1, lambda x: x.neg().neg(), lambda x: (x * 2, x * 2),
               lambda x: (x * 2, x * 2 * 1)):
        x = fg.arange(4.0)
        out = fg.compile(fn)(x)
        out = out if isinstance(out, tuple) else (out,)
        out[0].add_(100)
        np.testing.assert_array_equal(x.numpy(), [0, 1, 2, 3])
        np.testing.assert_array_equal(out[-1].numpy(), fn(fg.arange(4.0))[-1].numpy()
                                      if len(out) > 1 else [100, 101, 102, 103])


def swap(x, z):
    t = x * 1
    x.copy_(z)
    z.copy_(t)
    return x * 1, z


@pytest.mark.parametrize("fn,want", [
    (lambda x, z: (lambda y: (x.add_(1), y)[1])(x * 1), [[0, 1, 2, 3], [1, 2, 3, 4], [1] * 4]),
    (lambda x, z: (lambda y: (x.copy_(z), y)[1])(x * 1), [[0, 1, 2, 3], [1] * 4, [1] * 4]),
    (lambda x, z: (x.copy_(z), z.add_(1), x * 1)[2], [[1] * 4, [1] * 4, [2] * 4]),
    (swap, [([1] * 4, [0, 1, 2, 3]), [1] * 4, [0, 1, 2, 3]]),
], ids=["output-then-write", "output-then-copy", "copy-then-write-source", "swap"])
def test_outputs_and_write_backs_read_the_values_before_the_writes(fn, want):
    # an output (or an in-place update) that is another input's value, unchanged, was read
    # after the call had written that input: the swap left z equal to x
    x, z = fg.arange(4.0), fg.ones(4)
    out = fg.compile(fn)(x, z)
    got = [tuple(o.tolist() for o in out) if isinstance(out, tuple) else out.tolist(),
           x.tolist(), z.tolist()]
    want = [tuple(w) if isinstance(w, tuple) else w for w in want]
    assert got == want


def test_returned_inputs_and_views_alias_as_in_eager():
    x = fg.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3))
    compiled = fg.compile(lambda x: x)
    assert compiled(x) is x
    assert fg.compile(lambda x: x.add_(1))(x) is x
    row = fg.compile(lambda x: x[1])(x)
    assert row._base is x
    row.add_(100)                                    # a write through the view reaches x
    np.testing.assert_array_equal(x.numpy(), [[1, 2, 3], [104, 105, 106]])
    x.mul_(-1)                                       # and a write to x shows in the view
    np.testing.assert_array_equal(row.numpy(), [-104, -105, -106])
    t = fg.compile(lambda x: x.mul_(2).t())(x)
    np.testing.assert_array_equal(t.numpy(), x.numpy().T)
    assert np.shares_memory(t.numpy(), x.numpy())
    y, same, part = fg.compile(lambda x: (lambda y: (y, y, y[1:]))(x * 2))(x)
    assert same is y and part._base is y
    y.zero_()
    np.testing.assert_array_equal(part.numpy(), np.zeros((1, 3)))


def test_returned_view_of_an_input_carries_the_gradient():
    a = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    out = fg.compile(lambda y: (y.mul_(2), y[1:])[1])(a * 1)
    (out * fg.tensor([3.0, 5.0])).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [0.0, 6.0, 10.0])
    np.testing.assert_array_equal(out.detach().numpy(), [4.0, 6.0])
