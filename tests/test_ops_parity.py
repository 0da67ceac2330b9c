"""Functions torch has both as ``torch.f`` and ``Tensor.f``: values against numpy, gradients
against finite differences, and, for compositions, compiled against eager."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad as fg
from tests.conftest import arr, assert_close, check_grad, positive

NAN, INF = math.nan, math.inf


def _both(name, *args, **kwargs):
    """``fg.name(*args)`` and ``args[0].name(*args[1:])``, checked equal; the first."""
    a = getattr(fg, name)(*args, **kwargs)
    b = getattr(args[0], name)(*args[1:], **kwargs)
    pairs = zip(a, b) if isinstance(a, tuple) else [(a, b)]
    for x, y in pairs:
        np.testing.assert_array_equal(*(v.detach().numpy() if isinstance(v, fg.Tensor) else v
                                        for v in (x, y)))
    return a


# --------------------------------------------------------------------------- elementwise

SPECIAL = np.array([-2.5, -1.0, -0.0, 0.0, 0.5, 3.0, NAN, INF, -INF])


def test_sign_and_magnitude_ops():
    x = fg.tensor(SPECIAL)
    assert_close(_both("signbit", x), np.signbit(SPECIAL))
    assert_close(_both("copysign", x, -1.0), np.copysign(SPECIAL, -1.0))
    assert_close(_both("copysign", fg.tensor([1, 2]), fg.tensor([-0.0, 1.0])), [-1.0, 2.0],
                 dtype=fg.float32)
    with np.errstate(invalid="ignore"):
        ref = np.where(np.isinf(SPECIAL), NAN, SPECIAL - np.trunc(SPECIAL))
    assert_close(_both("frac", x), ref)
    assert_close(_both("sgn", x), np.nan_to_num(np.sign(SPECIAL)))  # torch: sign(nan) == 0
    assert_close(_both("positive", x), SPECIAL)
    with pytest.raises(RuntimeError):
        fg.positive(fg.tensor([True]))
    assert_close(_both("deg2rad", x), np.deg2rad(SPECIAL), rtol=1e-15)
    assert_close(_both("rad2deg", x), np.rad2deg(SPECIAL), rtol=1e-15)
    assert _both("deg2rad", fg.tensor([180])).dtype is fg.float32
    check_grad(lambda t: fg.copysign(t, fg.tensor([1.0, -1.0, -0.0])), arr(3, seed=1))
    check_grad(fg.frac, arr(4, seed=2) + 0.05)


@pytest.mark.parametrize("compiled", [False, True])
def test_copysign_gradient_reaches_the_sign_operand_as_zeros(compiled):
    # torch: other gets zeros (it stays in the graph; autograd.grad raised "not used"), x gets
    # out / x, 0 at x == 0 and NaN at x == inf; broadcast operands get their own shapes.
    x = fg.tensor([[0.0, -0.0, 2.0, INF, -3.0]], requires_grad=True)
    s = fg.tensor([[-1.0], [1.0]], requires_grad=True)
    f = fg.compile(fg.copysign) if compiled else fg.copysign
    gx, gs = fg.autograd.grad(f(x, s).sum(), (x, s))
    assert_close(gx, [[0.0, 0.0, 0.0, NAN, 0.0]])
    assert_close(gs, [[0.0], [0.0]])
    neg = fg.tensor(-2.0, requires_grad=True)
    gx, gneg = fg.autograd.grad(f(x, neg).sum(), (x, neg))
    assert_close(gx, [[0.0, 0.0, -1.0, NAN, 1.0]])
    assert_close(gneg, 0.0)
    assert fg.copysign(x, s).grad_fn.name() == "CopysignBackward0"


def test_nan_aware_extrema_and_predicates():
    a = np.array([1.0, NAN, 3.0, NAN, -INF])
    b = np.array([NAN, 2.0, 1.0, NAN, 0.0])
    assert_close(_both("fmax", fg.tensor(a), fg.tensor(b)), np.fmax(a, b))
    assert_close(_both("fmin", fg.tensor(a), fg.tensor(b)), np.fmin(a, b))
    x = fg.tensor(SPECIAL)
    assert_close(_both("isposinf", x), np.isposinf(SPECIAL))
    assert_close(_both("isneginf", x), np.isneginf(SPECIAL))
    assert_close(_both("isreal", x), np.ones(SPECIAL.shape, bool))
    assert not fg.isposinf(fg.tensor([1, 2])).any()
    assert _both("is_same_size", x, fg.zeros(9)) and not x.is_same_size(fg.zeros(3))
    assert fg.is_signed(x) and not fg.tensor([1], dtype=fg.uint8).is_signed()
    assert _both("is_nonzero", fg.tensor([2.0])) and not fg.tensor(0).is_nonzero()
    with pytest.raises(RuntimeError, match="more than one value"):
        fg.is_nonzero(fg.ones(2))


def test_heaviside_and_hardshrink():
    x = np.array([-1.5, 0.0, 0.2, 2.0])
    assert_close(_both("heaviside", fg.tensor(x), fg.tensor(0.5)), np.heaviside(x, 0.5))
    assert_close(_both("hardshrink", fg.tensor(x), 0.5), np.where(np.abs(x) > 0.5, x, 0))


def test_hypot_logaddexp_xlogy_values():
    a, b = arr(5, seed=3), arr(5, seed=4)
    assert_close(_both("hypot", fg.tensor(a), fg.tensor(b)), np.hypot(a, b), rtol=1e-14)
    for x, y in [(a * 50, b * 50), (np.array([INF, -INF, INF, 1.0]), np.array([INF, -INF, 1.0, NAN]))]:
        with np.errstate(invalid="ignore"):
            ref, ref2 = np.logaddexp(x, y), np.logaddexp2(x, y)
        assert_close(_both("logaddexp", fg.tensor(x), fg.tensor(y)), ref, rtol=1e-14)
        assert_close(_both("logaddexp2", fg.tensor(x), fg.tensor(y)), ref2, rtol=1e-14)
    x, y = np.array([0.0, 0.0, 2.0, 1.5, 0.0]), np.array([0.0, NAN, 3.0, 0.5, INF])
    with np.errstate(all="ignore"):
        ref = np.where((x == 0) & ~np.isnan(y), 0.0, x * np.log(y))
    assert_close(_both("xlogy", fg.tensor(x), fg.tensor(y)), ref)
    assert_close(fg.xlogy(2, fg.tensor([3.0])), [2 * math.log(3.0)], rtol=1e-6)
    # Infinite x: the product's infinity (the gradient's x-is-0 term gave inf * 0 = NaN).
    inf_x, inf_y = fg.tensor([INF, -INF, INF]), fg.tensor([0.0, 2.0, INF])
    for f in (fg.xlogy, fg.compile(fg.xlogy)):
        assert f(inf_x, inf_y).tolist() == [-INF, -INF, INF]
    # hypot neither overflows nor underflows in its squares, and is inf at inf even with NaN.
    big = np.array([1e200, 1e-200, 3.0, INF, NAN, 0.0, -INF])
    other = np.array([1e200, 1e-200, 4.0, NAN, 1.0, 0.0, 2.0])
    for f in (fg.hypot, fg.compile(fg.hypot)):
        assert_close(f(fg.tensor(big, dtype=fg.float64), fg.tensor(other, dtype=fg.float64)),
                     np.hypot(big, other), rtol=1e-15)
        with np.errstate(over="ignore"):
            assert_close(f(fg.tensor([1e20, 1e-25]), fg.tensor([1e20, 1e-25])),
                         np.hypot(np.float32([1e20, 1e-25]), np.float32([1e20, 1e-25])),
                         rtol=1e-6)


def test_elementwise_gradients():
    a, b = arr(6, seed=5), arr(6, seed=6)
    check_grad(fg.hypot, a, b)
    check_grad(fg.logaddexp, a, b)
    check_grad(fg.logaddexp2, a, b)
    check_grad(fg.xlogy, a, positive(6, seed=7))
    check_grad(fg.fmax, a, b)
    check_grad(fg.ldexp, a, b)
    check_grad(fg.float_power, positive(6), b)
    check_grad(lambda t: fg.logit(t), positive(6) / 3)
    check_grad(lambda t: fg.logit(t, eps=0.2), positive(6) / 3)
    check_grad(fg.sinc, a)
    check_grad(fg.deg2rad, a)
    # logaddexp splits the gradient evenly at a tie, as torch.
    x = fg.tensor([1.0], requires_grad=True)
    fg.logaddexp(x, x.detach()).sum().backward()
    assert_close(x.grad, [0.5])


def test_logit_sinc_float_power_ldexp_values():
    p = np.array([0.0, 0.1, 0.5, 0.9, 1.0])
    with np.errstate(all="ignore"):
        assert_close(_both("logit", fg.tensor(p)), np.log(p / (1 - p)), rtol=1e-13)
    q = np.clip(p, 0.2, 0.8)
    assert_close(_both("logit", fg.tensor(p), 0.2), np.log(q / (1 - q)), rtol=1e-13)
    x = np.array([0.0, 0.5, -1.5, 2.25])
    assert_close(_both("sinc", fg.tensor(x)), np.sinc(x), rtol=1e-14, atol=1e-16)
    s = fg.tensor(0.0, requires_grad=True)
    fg.sinc(s).backward()
    assert s.grad.item() == 0.0
    out = _both("float_power", fg.tensor([2, 3]), 2)
    assert out.dtype is fg.float64 and out.tolist() == [4.0, 9.0]
    assert_close(_both("ldexp", fg.tensor([1.0, 3.0]), fg.tensor([3, -1])), [8.0, 1.5])


def test_aliases_and_clamp_variants():
    x = fg.tensor(arr(5, seed=8))
    assert_close(_both("clamp_min", x, 0.3), np.maximum(x.numpy(), 0.3))
    assert_close(_both("clamp_max", x, 0.3), np.minimum(x.numpy(), 0.3))
    assert_close(_both("divide", x, 2.0), x.numpy() / 2)
    assert_close(_both("multiply", x, 2.0), x.numpy() * 2)
    assert_close(_both("subtract", x, 2.0, alpha=2), x.numpy() - 4)
    y = x.clone()
    y.clamp_min_(0.0)
    assert_close(y, np.maximum(x.numpy(), 0))
    check_grad(lambda t: fg.clamp_min(t, 0.1), arr(5, seed=9))


# --------------------------------------------------------------------------- products

def test_addmm_family_values():
    m, a, b = arr(2, 4, seed=1), arr(2, 3, seed=2), arr(3, 4, seed=3)
    assert_close(_both("addmm", fg.tensor(m), fg.tensor(a), fg.tensor(b)), m + a @ b, rtol=1e-14)
    got = fg.addmm(fg.tensor(m), fg.tensor(a), fg.tensor(b), beta=0.5, alpha=2.0)
    assert_close(got, 0.5 * m + 2 * a @ b, rtol=1e-14)
    nan = fg.full((2, 4), NAN, dtype=fg.float64)
    assert_close(fg.addmm(nan, fg.tensor(a), fg.tensor(b), beta=0), a @ b, rtol=1e-14)
    v = arr(3, seed=4)
    assert_close(_both("addmv", fg.tensor(m[:, 0]), fg.tensor(a), fg.tensor(v)), m[:, 0] + a @ v)
    assert_close(_both("addr", fg.tensor(m), fg.tensor(a[:, 0]), fg.tensor(b[0])),
                 m + np.outer(a[:, 0], b[0]))
    b1, b2 = arr(5, 2, 3, seed=5), arr(5, 3, 4, seed=6)
    assert_close(_both("baddbmm", fg.tensor(m), fg.tensor(b1), fg.tensor(b2)), m + b1 @ b2,
                 rtol=1e-13)
    assert_close(_both("addbmm", fg.tensor(m), fg.tensor(b1), fg.tensor(b2)),
                 m + (b1 @ b2).sum(0), rtol=1e-13)
    x = fg.tensor(m.copy())
    x.addmm_(fg.tensor(a), fg.tensor(b))
    assert_close(x, m + a @ b, rtol=1e-14)


def test_addmm_family_gradients():
    check_grad(lambda m, a, b: fg.addmm(m, a, b, beta=0.5, alpha=1.5), arr(2, 4), arr(2, 3, seed=1),
               arr(3, 4, seed=2))
    check_grad(fg.addmv, arr(2), arr(2, 3, seed=1), arr(3, seed=2))
    check_grad(fg.addr, arr(2, 3), arr(2, seed=1), arr(3, seed=2))
    check_grad(fg.baddbmm, arr(2, 4), arr(3, 2, 5, seed=1), arr(3, 5, 4, seed=2))
    check_grad(fg.addbmm, arr(2, 4), arr(3, 2, 5, seed=1), arr(3, 5, 4, seed=2))


@pytest.mark.parametrize("op,shapes", [("addmm", [(2, 4), (2, 3), (3, 4)]),
                                       ("addmm", [(4,), (2, 3), (3, 4)]),
                                       ("addmv", [(2,), (2, 3), (3,)]),
                                       ("addr", [(2, 3), (2,), (3,)]),
                                       ("baddbmm", [(5, 2, 4), (5, 2, 3), (5, 3, 4)]),
                                       ("addbmm", [(2, 4), (5, 2, 3), (5, 3, 4)])])
def test_addmm_family_with_beta_zero_gives_the_input_a_zero_gradient(op, shapes):
    # torch: the input's gradient is beta * grad, zeros (not None), and NaN in the input
    # reaches neither the result nor any gradient.
    x = fg.full(shapes[0], NAN, dtype=fg.float64, requires_grad=True)
    a, b = (fg.tensor(arr(*s, seed=i), requires_grad=True) for i, s in enumerate(shapes[1:]))
    out = getattr(fg, op)(x, a, b, beta=0)
    out.sum().backward()
    assert x.grad is not None
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros(shapes[0]))
    assert np.isfinite(out.detach().numpy()).all() and np.isfinite(a.grad.numpy()).all()


@pytest.mark.parametrize("op,shapes", [("addmm", [(2, 4), (2, 3), (3, 4)]),
                                       ("addmv", [(2,), (2, 3), (3,)]),
                                       ("baddbmm", [(5, 2, 4), (5, 2, 3), (5, 3, 4)]),
                                       ("addbmm", [(2, 4), (5, 2, 3), (5, 3, 4)])])
def test_addmm_family_needs_an_input_of_the_products_dtype(op, shapes):
    # torch raises ("self and mat2 must have the same dtype"); addr alone promotes.
    x = fg.zeros(shapes[0], dtype=fg.float64)
    a, b = (fg.tensor(arr(*s, seed=i).astype(np.float32)) for i, s in enumerate(shapes[1:]))
    with pytest.raises(RuntimeError, match=f"{op}: self and mat2 must have the same dtype"):
        getattr(fg, op)(x, a, b)


def test_integer_addmm_family_truncates_fractional_factors_and_addr_refuses_them():
    # torch: the result keeps the integer dtype; alpha and beta are truncated toward zero
    # (addr raises instead).
    def ones(*shape):
        return fg.ones(*shape, dtype=fg.int64)

    out = fg.addmm(ones(2, 3), ones(2, 4), ones(4, 3), beta=2.7, alpha=-1.5)
    assert out.dtype == fg.int64
    np.testing.assert_array_equal(out.numpy(), np.full((2, 3), 2 - 4))
    out = fg.addbmm(ones(2, 3), ones(1, 2, 4), ones(1, 4, 3), beta=0.5, alpha=1.5)
    assert out.dtype == fg.int64
    np.testing.assert_array_equal(out.numpy(), np.full((2, 3), 4))
    with pytest.raises(RuntimeError, match="argument alpha must not be a floating point number"):
        fg.addr(ones(2, 3), ones(2), ones(3), alpha=0.5)
    assert fg.addr(ones(2, 3), ones(2), ones(3), beta=2, alpha=3).dtype == fg.int64


@pytest.mark.parametrize("op,shapes", [("addmm", [(1, 2, 4), (2, 3), (3, 4)]),
                                       ("addmm", [(5, 4), (1, 3), (3, 4)]),
                                       ("addmv", [(1, 2), (2, 3), (3,)]),
                                       ("addr", [(1, 2, 3), (2,), (3,)]),
                                       ("baddbmm", [(5, 2, 4), (1, 2, 3), (1, 3, 4)]),
                                       ("addbmm", [(1, 2, 4), (5, 2, 3), (5, 3, 4)])])
@pytest.mark.parametrize("beta", [1, 0])
def test_addmm_family_input_expands_to_the_product_and_never_broadcasts_it(op, shapes, beta):
    # torch expands the input to the product's shape; it does not broadcast the product to a
    # bigger input (the result had the input's extra or larger dims).
    x, a, b = (fg.ones(*s) for s in shapes)
    with pytest.raises(RuntimeError, match="expand"):
        getattr(fg, op)(x, a, b, beta=beta)


def test_addr_promotes_as_torch_does():
    assert fg.addr(fg.zeros(2, 3, dtype=fg.float64), fg.ones(2), fg.ones(3)).dtype == fg.float64


def test_addbmm_of_integers_keeps_their_dtype():
    a, b = fg.ones(2, 3, 4, dtype=fg.int32), fg.ones(2, 4, 5, dtype=fg.int32)
    out = fg.addbmm(fg.ones(3, 5, dtype=fg.int32), a, b)
    assert out.dtype == fg.int32
    np.testing.assert_array_equal(out.numpy(), np.full((3, 5), 9, np.int32))


def test_inner_vdot_ger_kron_cross():
    a, b = arr(2, 3, seed=1), arr(4, 3, seed=2)
    assert_close(_both("inner", fg.tensor(a), fg.tensor(b)), np.inner(a, b), rtol=1e-14)
    assert_close(_both("inner", fg.tensor(a), fg.tensor(2.0)), a * 2)
    assert_close(_both("vdot", fg.tensor(a[0]), fg.tensor(b[0])), np.vdot(a[0], b[0]), rtol=1e-14)
    assert_close(_both("ger", fg.tensor(a[0]), fg.tensor(b[:, 0])), np.outer(a[0], b[:, 0]))
    for sa, sb in [((2, 3), (4, 5)), ((3,), (2,)), ((2, 2, 2), (3, 1)), ((2,), (2, 3))]:
        x, y = arr(*sa, seed=3), arr(*sb, seed=4)
        assert_close(_both("kron", fg.tensor(x), fg.tensor(y)), np.kron(x, y), rtol=1e-14)
    u, v = arr(4, 3, seed=5), arr(4, 3, seed=6)
    assert_close(_both("cross", fg.tensor(u), fg.tensor(v), dim=1), np.cross(u, v), rtol=1e-14)
    assert_close(fg.linalg.cross(fg.tensor(u), fg.tensor(v)), np.cross(u, v), rtol=1e-14)
    assert_close(fg.cross(fg.tensor(u.T), fg.tensor(v.T)), np.cross(u, v).T, rtol=1e-14)
    check_grad(fg.inner, a, b)
    check_grad(fg.kron, arr(2, 3), arr(3, 2, seed=1))
    check_grad(lambda x, y: fg.cross(x, y, dim=-1), u, v)


def test_dist_diff_cov_corrcoef_adjoint():
    a, b = arr(3, 4, seed=1), arr(3, 4, seed=2)
    for p in (1, 2, 3.0, INF):
        assert_close(_both("dist", fg.tensor(a), fg.tensor(b), p),
                     np.linalg.norm((a - b).ravel(), p), rtol=1e-13)
    assert_close(_both("diff", fg.tensor(a)), np.diff(a), rtol=1e-14)
    assert_close(fg.diff(fg.tensor(a), n=2, dim=0), np.diff(a, n=2, axis=0), rtol=1e-14)
    pre, app = fg.tensor(a[:, :1]), fg.tensor(b[:, :2])
    assert_close(fg.diff(fg.tensor(a), prepend=pre, append=app),
                 np.diff(a, prepend=a[:, :1], append=b[:, :2]), rtol=1e-14)
    assert_close(_both("cov", fg.tensor(a)), np.cov(a), rtol=1e-13)
    assert_close(fg.cov(fg.tensor(a), correction=0), np.cov(a, bias=True), rtol=1e-13)
    fw, aw = np.array([1, 2, 1, 3]), positive(4, seed=3)
    assert_close(fg.cov(fg.tensor(a), fweights=fg.tensor(fw), aweights=fg.tensor(aw)),
                 np.cov(a, fweights=fw, aweights=aw), rtol=1e-12)
    assert_close(fg.cov(fg.tensor(a[0])), np.cov(a[0]), rtol=1e-13)
    assert_close(_both("corrcoef", fg.tensor(a)), np.corrcoef(a), rtol=1e-12)
    assert_close(_both("adjoint", fg.tensor(a)), a.T)
    check_grad(lambda x: fg.dist(x, fg.tensor(b), 3.0), a)
    check_grad(lambda x: fg.diff(x, n=2), a)
    check_grad(fg.cov, a)
    check_grad(fg.corrcoef, a)


def test_compositions_compile_to_the_eager_values():
    a, b = fg.tensor(arr(4, 3, seed=1)), fg.tensor(arr(4, 3, seed=2))
    m = fg.tensor(arr(4, 4, seed=3))

    def fn(a, b, m):
        return (fg.logaddexp(a, b).sum() + fg.hypot(a, b).mean() + fg.xlogy(a.abs(), b.abs()).sum()
                + fg.addmm(m, a, b.mT, beta=0.5).sum() + fg.kron(a, b).sum()
                + fg.cross(a, b).pow(2).sum() + fg.sinc(a).sum() + fg.copysign(a, b).sum()
                + fg.cov(a).sum() + fg.fmax(a, b).sum())

    compiled = fg.compile(fn)
    assert_close(compiled(a, b, m), fn(a, b, m), rtol=1e-12)
    af, bf, mf = (t.float().requires_grad_() for t in (a, b, m))
    eager = fn(af, bf, mf)
    g_eager = fg.autograd.grad(eager, [af, bf, mf])
    out = compiled(af, bf, mf)
    g_compiled = fg.autograd.grad(out, [af, bf, mf])
    assert_close(out, eager, rtol=1e-5, atol=1e-5)
    for gc, ge in zip(g_compiled, g_eager):
        assert_close(gc, ge, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- splits and slices

def test_splits_flips_tiles():
    a = arr(4, 6, 2, seed=1)
    x = fg.tensor(a)
    for sections in (3, [1, 4], [2, 2, 9], [5]):
        got = _both("tensor_split", x, sections, dim=1)
        ref = np.array_split(a, sections, axis=1)
        assert len(got) == len(ref)
        for g, r in zip(got, ref):
            assert_close(g, r)
    for name, axis, n in [("hsplit", 1, 3), ("vsplit", 0, 2), ("dsplit", 2, 2)]:
        got = _both(name, x, n)
        for g, r in zip(got, np.split(a, n, axis=axis)):
            assert_close(g, r)
    with pytest.raises(RuntimeError, match="not divisible"):
        fg.hsplit(x, 4)
    parts = _both("split_with_sizes", x, [1, 3])
    assert [tuple(p.shape) for p in parts] == [(1, 6, 2), (3, 6, 2)]
    assert len(fg.unsafe_chunk(x, 2, 1)) == 2 and len(x.unsafe_split(2)) == 2
    assert_close(_both("ravel", x), a.ravel())
    assert_close(_both("tile", x, (2,)), np.tile(a, (2,)))
    assert_close(_both("tile", x, (2, 1, 1, 3)), np.tile(a, (2, 1, 1, 3)))
    assert_close(_both("fliplr", x), np.fliplr(a))
    assert_close(_both("flipud", x), np.flipud(a))
    assert_close(_both("moveaxis", x, 0, -1), np.moveaxis(a, 0, -1))
    assert_close(_both("narrow_copy", x, 1, 2, 3), a[:, 2:5])
    assert_close(_both("msort", x), np.sort(a, axis=0))
    assert_close(_both("diagflat", fg.tensor(a[:2, :2, 0]), 1), np.diagflat(a[:2, :2, 0], 1))
    assert_close(_both("take", x, fg.tensor([[0, -1], [5, 7]])), np.take(a, [[0, -1], [5, 7]]))
    assert fg.detach(fg.ones(2, requires_grad=True)).requires_grad is False
    check_grad(lambda t: fg.tensor_split(t, 3, dim=1)[1], a)
    check_grad(lambda t: fg.take(t, fg.tensor([3, 0, 3])), a)
    check_grad(lambda t: fg.tile(t, (2, 1)), a[:, :, 0])


def test_index_writes_out_of_place():
    a, src = arr(4, 3, seed=2), arr(2, 3, seed=3)
    idx = np.array([3, 0])
    ref = a.copy()
    ref[idx] = src
    x = fg.tensor(a)
    assert_close(_both("index_copy", x, 0, fg.tensor(idx), fg.tensor(src)), ref)
    ref = a.copy()
    ref[:, [2, -3]] = 7.0
    assert_close(_both("index_fill", x, 1, fg.tensor([2, -3]), 7.0), ref)
    y = x.clone()
    y.index_fill_(0, fg.tensor([1]), -1.0)
    assert_close(y[1], [-1.0] * 3)
    rows, cols = np.array([0, 2, 0]), np.array([1, 1, 1])
    vals = np.array([10.0, 20.0, 30.0])
    ref = a.copy()
    np.add.at(ref, (rows, cols), vals)
    got = _both("index_put", x, (fg.tensor(rows), fg.tensor(cols)), fg.tensor(vals), True)
    assert_close(got, ref)
    ref = a.copy()
    ref[[1, 2]] = 5.0
    assert_close(fg.index_put(x, (fg.tensor([1, 2]),), fg.tensor(5.0)), ref)
    ref = a.copy().ravel()
    np.add.at(ref, [0, 11, 0], [1.0, 2.0, 3.0])
    got = _both("put", x, fg.tensor([0, -1, 0]), fg.tensor([1.0, 2.0, 3.0]), True)
    assert_close(got, ref.reshape(4, 3))
    mask = a > 0
    ref = a.copy()
    ref[mask] = np.arange(mask.sum()) * 1.0
    assert_close(_both("masked_scatter", x, fg.tensor(mask), fg.arange(12.0, dtype=fg.float64)), ref)
    check_grad(lambda t, s: fg.index_copy(t, 0, fg.tensor(idx), s), a, src)
    check_grad(lambda t, v: fg.index_put(t, (fg.tensor(rows), fg.tensor(cols)), v, True), a, vals)
    check_grad(lambda t, s: fg.masked_scatter(t, fg.tensor(mask), s), a, arr(12, seed=4))


def test_scatter_into_slices():
    a = arr(4, 5, seed=5)
    x = fg.tensor(a)
    ref = a.copy()
    ref[:, 2] = np.arange(4.0)
    assert_close(_both("select_scatter", x, fg.arange(4.0, dtype=fg.float64), 1, 2), ref)
    ref = a.copy()
    ref[1:5:2] = 1.5
    assert_close(_both("slice_scatter", x, fg.full((2, 5), 1.5, dtype=fg.float64), 0, 1, None, 2),
                 ref)
    for offset in (0, 1, -2):
        ref = a.copy()
        n = len(np.diagonal(a, offset))
        r0, c0 = max(-offset, 0), max(offset, 0)
        ref[np.arange(n) + r0, np.arange(n) + c0] = -np.arange(1.0, n + 1)
        src = fg.tensor(-np.arange(1.0, n + 1))
        assert_close(_both("diagonal_scatter", x, src, offset), ref)
    check_grad(lambda t, s: fg.diagonal_scatter(t, s, 1), a, arr(4, seed=6))
    check_grad(lambda t, s: fg.slice_scatter(t, s, 1, 1, 4), a, arr(4, 3, seed=7))


def test_slicing_ops_compile():
    a, s = fg.tensor(arr(4, 5, seed=8)), fg.tensor(arr(4, 3, seed=9))

    def fn(a, s):
        parts = fg.tensor_split(a, 3, dim=1)
        return (fg.slice_scatter(a, s, 1, 1, 4).sum() + parts[0].sum() * 2 + fg.fliplr(a)[0].sum()
                + fg.masked_scatter(a, a > 0, a.flip(0)).sum() + fg.diagonal_scatter(a, a[0, :4]).sum()
                + fg.index_fill(a, 1, fg.tensor([0, 2]), 3.0).sum() + fg.take(a, fg.tensor([1, 7])).sum())

    assert_close(fg.compile(fn)(a, s), fn(a, s), rtol=1e-12)


# --------------------------------------------------------------------------- statistics

def test_nan_reductions():
    a = arr(3, 4, seed=1)
    a[0, 1] = a[2, 3] = NAN
    a[1, :] = NAN
    x = fg.tensor(a)
    assert_close(_both("nansum", x), np.nansum(a), rtol=1e-14)
    assert_close(_both("nansum", x, 1, keepdim=True), np.nansum(a, 1, keepdims=True), rtol=1e-14)
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        ref = np.nanmean(a, 1)
    assert_close(_both("nanmean", x, 1), ref, rtol=1e-14)
    assert_close(fg.nansum(fg.tensor([1, 2])), 3)
    holes = fg.tensor(np.isnan(a))
    check_grad(lambda t: fg.nansum(fg.where(holes, NAN, t), 1), arr(3, 4))
    check_grad(lambda t: fg.nanmean(fg.where(holes[0], NAN, t)), arr(4))


def test_order_statistics_match_numpy():
    a = arr(3, 5, seed=2)
    x = fg.tensor(a)
    assert_close(_both("median", x), np.sort(a.ravel())[(a.size - 1) // 2])
    vals, idx = _both("median", x, 1)
    ref = np.sort(a, 1)[:, 2]
    assert_close(vals, ref) and assert_close(idx, np.argsort(a, 1, kind="stable")[:, 2])
    vals, idx = fg.median(x, 0, keepdim=True)
    assert vals.shape == (1, 5) and idx.shape == (1, 5)
    assert_close(np.take_along_axis(a, idx.numpy(), 0), vals)
    vals, idx = _both("kthvalue", x, 4, 1)
    assert_close(vals, np.sort(a, 1)[:, 3])
    assert_close(np.take_along_axis(a, idx.numpy()[:, None], 1)[:, 0], vals)
    b = a.copy()
    b[0, 1] = b[2, :] = NAN
    vals, idx = _both("nanmedian", fg.tensor(b), 1)
    ref = [np.sort(r[~np.isnan(r)])[(np.sum(~np.isnan(r)) - 1) // 2] if np.any(~np.isnan(r))
           else NAN for r in b]
    assert_close(vals, ref)
    assert_close(fg.median(fg.tensor(b), 1).values, [NAN, a[1, 2] * 0 + np.sort(a[1])[2], NAN])
    counts = fg.tensor([[3.0, 1.0, 3.0, 1.0, 2.0], [5.0, 5.0, 2.0, 2.0, 7.0]])
    vals, idx = _both("mode", counts, 1)
    assert vals.tolist() == [1.0, 2.0] and idx.tolist() == [3, 3]
    check_grad(lambda t: fg.median(t, 1).values, a)
    check_grad(lambda t: fg.kthvalue(t, 2, 0).values, a)
    check_grad(lambda t: fg.mode(t.round(), 1).values * 0 + fg.mode(t, 1).values, a)


@pytest.mark.parametrize("interpolation", ["linear", "lower", "higher", "midpoint", "nearest"])
def test_quantile_matches_numpy(interpolation):
    a = arr(4, 7, seed=3)
    x = fg.tensor(a)
    q = np.array([0.0, 0.1, 0.5, 0.77, 1.0])
    got = _both("quantile", x, fg.tensor(q), 1, interpolation=interpolation)
    assert_close(got, np.quantile(a, q, axis=1, method=interpolation), rtol=1e-13)
    got = fg.quantile(x, 0.3, interpolation=interpolation, keepdim=True)
    assert_close(got, np.quantile(a, 0.3, method=interpolation, keepdims=True), rtol=1e-13)
    b = a.copy()
    b[1, 2] = NAN
    b[3, :] = NAN
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        ref = np.nanquantile(b, q, axis=1, method=interpolation)
    assert_close(_both("nanquantile", fg.tensor(b), fg.tensor(q), 1, interpolation=interpolation),
                 ref, rtol=1e-13)
    assert_close(fg.quantile(fg.tensor(b), 0.5, 1), np.quantile(b, 0.5, axis=1))


def test_quantile_gradient_and_compile():
    a = arr(3, 6, seed=4)
    check_grad(lambda t: fg.quantile(t, fg.tensor([0.2, 0.9]), dim=1), a)
    check_grad(lambda t: fg.nanquantile(t, 0.4), a)

    def fn(t):
        return (fg.quantile(t, 0.3, dim=1).sum() + fg.median(t, 0).values.sum()
                + fg.nansum(t) + fg.kthvalue(t, 2).values.sum() + fg.rot90(t).sum(0)[1])
    t = fg.tensor(a)
    assert_close(fg.compile(fn)(t), fn(t), rtol=1e-12)


def test_aminmax_histc_histogram_renorm_rot90_unique_consecutive():
    a = arr(3, 4, seed=5)
    x = fg.tensor(a)
    mn, mx = _both("aminmax", x)
    assert mn.item() == a.min() and mx.item() == a.max()
    mn, mx = fg.aminmax(x, dim=1, keepdim=True)
    assert_close(mn, a.min(1, keepdims=True)) and assert_close(mx, a.max(1, keepdims=True))
    h = np.array([1.0, 2.0, 1.0, 4.0, 4.5, -1.0])
    assert_close(_both("histc", fg.tensor(h), 4, 0, 4), [0.0, 2.0, 1.0, 1.0])
    assert_close(fg.histc(fg.tensor(h), bins=5), np.histogram(h, 5)[0].astype(float))
    hist, edges = _both("histogram", fg.tensor(h), 3)
    ref_hist, ref_edges = np.histogram(h, 3)
    assert_close(hist, ref_hist) and assert_close(edges, ref_edges)
    for p, maxnorm in [(2, 1.0), (1, 2.5), (INF, 0.5)]:
        norms = np.linalg.norm(a, p, axis=1, keepdims=True)
        ref = a * np.where(norms > maxnorm, maxnorm / (norms + 1e-7), 1.0)
        assert_close(_both("renorm", x, p, 0, maxnorm), ref, rtol=1e-13)
    check_grad(lambda t: fg.renorm(t, 2, 1, 1.0), a)
    for k in range(-1, 5):
        assert_close(_both("rot90", x, k, [0, 1]), np.rot90(a, k, (0, 1)))
    b = fg.tensor(arr(2, 3, 4, seed=6))
    assert_close(fg.rot90(b, 1, (2, 0)), np.rot90(b.numpy(), 1, (2, 0)))
    check_grad(lambda t: fg.rot90(t, 3), a)
    r = fg.tensor([1, 1, 2, 2, 3, 1, 1, 2])
    out, inverse, counts = _both("unique_consecutive", r, return_inverse=True, return_counts=True)
    assert out.tolist() == [1, 2, 3, 1, 2] and counts.tolist() == [2, 2, 1, 2, 1]
    assert inverse.tolist() == [0, 0, 1, 1, 2, 3, 3, 4]
    m = fg.tensor([[1, 1], [1, 1], [2, 3], [1, 1]])
    assert fg.unique_consecutive(m, dim=0).tolist() == [[1, 1], [2, 3], [1, 1]]


# --------------------------------------------------------------------------- special functions

def test_the_special_namespace_names_the_same_functions():
    x = fg.tensor([-3.0, -0.5, 0.0, 0.25, 2.0])
    assert fg.special.expit is fg.sigmoid and fg.special.psi is fg.digamma
    assert fg.special.gammaln is fg.lgamma and fg.special.multigammaln is fg.mvlgamma
    assert_close(fg.special.xlogy(x, 2.0), fg.xlogy(x, 2.0))
    # ndtr from erfc: exact in the lower tail, where 1 + erf(x / sqrt 2) cancels to 0
    v = [-30.0, -8.0, -1.0, 0.0, 0.5, 6.0]
    assert_close(fg.special.ndtr(fg.tensor(v, dtype=fg.float64)),
                 [0.5 * math.erfc(-u / math.sqrt(2)) for u in v], rtol=1e-14)
    with pytest.raises(AttributeError, match="torch.special.zeta is not implemented"):
        _ = fg.special.zeta


def test_special_functions_identities():
    x = np.array([0.3, 1.0, 2.5, 7.0, 40.0, -0.5, -2.25])
    t = fg.tensor(x)
    assert_close(_both("lgamma", t), [math.lgamma(v) for v in x], rtol=1e-14)
    euler_gamma = 0.5772156649015329
    assert_close(fg.digamma(fg.tensor([1.0])), [-euler_gamma], rtol=1e-15)
    # The recurrence psi(x + 1) = psi(x) + 1/x and its derivatives.
    assert_close(_both("digamma", t + 1), fg.digamma(t) + 1 / t, rtol=1e-13)
    assert_close(fg.polygamma(1, t + 1), fg.polygamma(1, t) - 1 / t**2, rtol=1e-12)
    assert_close(t.polygamma(2), fg.polygamma(2, t + 1) - 2 / t**3, rtol=1e-12)
    assert_close(fg.polygamma(1, fg.tensor([1.0])), [math.pi**2 / 6], rtol=1e-15)
    assert_close(fg.digamma(fg.tensor([0.0, -1.0, INF])), [-INF, NAN, INF])
    assert_close(fg.lgamma(fg.tensor([0.0, -2.0, INF, -INF])), [INF, INF, INF, INF])
    assert_close(fg.polygamma(0, t), fg.digamma(t))
    # Large negative non-integers (the reflection's tan(pi x) of the exact fraction) against
    # mpmath; -0 is a pole from the left, as torch.
    big = fg.tensor([-5409150358.27088, -8495329.19819762, -1e15 - 0.5, -123456.75],
                    dtype=fg.float64)
    assert_close(fg.digamma(big), [25.165650419215253, 20.330951762480650,
                                   34.538776394910686, 8.5820575676918837], rtol=1e-13)
    assert_close(fg.compile(fg.digamma)(big), fg.digamma(big), rtol=1e-13)
    assert fg.digamma(fg.tensor([-0.0, 0.0])).tolist() == [INF, -INF]
    p = np.array([-0.999999, -0.7, -0.1, 0.0, 0.3, 0.9, 1 - 1e-12])
    assert_close(fg.erf(_both("erfinv", fg.tensor(p))), p, rtol=1e-15, atol=1e-16)
    assert_close(fg.erfinv(fg.tensor([1.0, -1.0, 1.5])), [INF, -INF, NAN])
    assert_close(_both("erfc", fg.tensor(x)), [math.erfc(v) for v in x], rtol=1e-15)
    assert_close(_both("i0", fg.tensor(x)), np.i0(x), rtol=1e-15)
    assert_close(_both("mvlgamma", fg.tensor([2.5, 4.0]), 3),
                 [3 / 2 * math.log(math.pi) + sum(math.lgamma(v - i / 2) for i in range(3))
                  for v in (2.5, 4.0)], rtol=1e-14)
    with pytest.raises(RuntimeError, match=r"greater than \(p-1\)/2"):
        fg.mvlgamma(fg.tensor([0.5]), 3)
    # P(1, x) = 1 - exp(-x); P(a, x) + Q(a, x) = 1.
    xs = fg.tensor([0.1, 1.0, 3.0, 30.0])
    assert_close(_both("igamma", fg.ones(4, dtype=fg.float64), xs), 1 - np.exp(-xs.numpy()),
                 rtol=1e-14)
    a = fg.tensor([0.5, 2.0, 5.0, 12.0])
    assert_close(fg.igamma(a, xs) + _both("igammac", a, xs), np.ones(4), rtol=1e-14)
    assert fg.lgamma(fg.tensor([3])).dtype is fg.float32
    p32 = fg.tensor(p, dtype=fg.float32)     # 1 - 1e-12 rounds to 1: inf
    assert_close(fg.erfinv(p32), fg.erfinv(p32.double()).float(), rtol=1e-6)


def test_special_functions_match_scipy():
    sp = pytest.importorskip("scipy.special")
    x = np.array([-3.7, -0.5, 1e-3, 0.5, 1.0, 2.5, 7.0, 30.0, 150.0])
    assert_close(fg.digamma(fg.tensor(x)), sp.digamma(x), rtol=1e-13)
    for n in (1, 2, 3, 5):
        assert_close(fg.polygamma(n, fg.tensor(x)), sp.polygamma(n, x), rtol=1e-12)
    p = np.linspace(-0.999, 0.999, 41)
    assert_close(fg.erfinv(fg.tensor(p)), sp.erfinv(p), rtol=1e-14)
    z = np.array([-30.0, -2.0, 0.0, 0.5, 3.0, 50.0, 700.0])
    assert_close(fg.i0(fg.tensor(z)), sp.i0(z), rtol=1e-14)
    a, xs = np.array([0.5, 1.0, 2.0, 5.0, 10.0, 30.0]), np.array([0.1, 1.0, 3.0, 4.0, 20.0, 25.0])
    assert_close(fg.igamma(fg.tensor(a), fg.tensor(xs)), sp.gammainc(a, xs), rtol=1e-13)
    assert_close(fg.igammac(fg.tensor(a), fg.tensor(xs)), sp.gammaincc(a, xs), rtol=1e-12)


def test_special_function_gradients():
    x = positive(5, seed=1)
    check_grad(fg.lgamma, x)
    check_grad(fg.digamma, x)
    check_grad(lambda t: fg.polygamma(2, t), x)
    check_grad(fg.erfc, arr(5, seed=2))
    check_grad(fg.erfinv, arr(5, seed=3) / 2.5)
    check_grad(fg.i0, arr(5, seed=4) * 3)
    check_grad(lambda t: fg.mvlgamma(t, 2), x + 1)
    check_grad(lambda t: fg.igamma(fg.tensor(x), t), positive(5, seed=5))
    check_grad(lambda t: fg.igammac(fg.tensor(x), t), positive(5, seed=6))
    # x broadcast against a: the gradient sums over the broadcast dim (a regression).
    check_grad(lambda t: fg.igamma(fg.tensor(positive(3, 5, seed=9)), t), positive(5, seed=10))
    check_grad(lambda t: fg.frexp(t).mantissa, arr(5, seed=7))


def test_bit_level_and_integer_ops():
    a, b = np.array([1.0, -0.0, 2.0, 1e-300]), np.array([2.0, -1.0, 1.0, 0.0])
    assert_close(_both("nextafter", fg.tensor(a), fg.tensor(b)), np.nextafter(a, b), rtol=0, atol=0)
    f32 = fg.nextafter(fg.tensor([1.0]), fg.tensor([2.0]))
    assert f32.item() == float(np.nextafter(np.float32(1), np.float32(2)))
    m, e = _both("frexp", fg.tensor(a))
    ref_m, ref_e = np.frexp(a)
    assert_close(m, ref_m) and e.dtype is fg.int32 and e.tolist() == ref_e.tolist()
    i, j = fg.tensor([12, -18, 0, 7]), fg.tensor([8, 12, 5, 0])
    assert _both("gcd", i, j).tolist() == np.gcd(i.numpy(), j.numpy()).tolist()
    assert _both("lcm", i, j).tolist() == np.lcm(i.numpy(), j.numpy()).tolist()
    with pytest.raises(RuntimeError):
        fg.gcd(fg.tensor([1.0]), fg.tensor([2.0]))


def test_special_functions_compile():
    x = fg.tensor(positive(6, seed=8))

    def fn(t):
        return (fg.lgamma(t).sum() + fg.digamma(t).exp().sum() + fg.erfinv(t / 3).sum()
                + fg.i0(t).mean() + fg.sinc(t).sum())

    assert_close(fg.compile(fn)(x), fn(x), rtol=1e-12)
    xg = x.clone().requires_grad_()
    (g_eager,) = fg.autograd.grad(fn(xg), [xg])
    (g_compiled,) = fg.autograd.grad(fg.compile(fn)(xg), [xg])
    assert_close(g_compiled, g_eager, rtol=1e-10)


# --------------------------------------------------------------------------- in place, index_reduce

@pytest.mark.parametrize("name,args", [
    ("eq_", (fg.tensor([1.0, 0.0, 3.0]),)), ("lt_", (2.0,)), ("greater_equal_", (2.0,)),
    ("not_equal_", (2.0,)), ("logical_xor_", (fg.tensor([1.0, 0.0, 0.0]),)),
    ("tan_", ()), ("exp2_", ()), ("log2_", ()), ("log10_", ()), ("negative_", ()),
    ("absolute_", ()), ("fix_", ()), ("fmod_", (1.5,)), ("cumsum_", (0,)), ("cumprod_", (0,)),
    ("heaviside_", (fg.tensor(0.5),)), ("ldexp_", (fg.tensor(2.0),)), ("lgamma_", ()),
    ("digamma_", ()), ("erfinv_", ()), ("i0_", ()), ("sinc_", ()), ("logit_", ()),
    ("xlogy_", (2.0,)), ("hypot_", (2.0,)), ("copysign_", (-1.0,)), ("frac_", ()),
    ("clamp_min_", (1.5,)), ("deg2rad_", ()), ("nextafter_", (fg.tensor(0.0),)),
])
def test_inplace_variants_match_out_of_place(name, args):
    base = fg.tensor([1.0, 2.0, 0.25]) * (0.5 if name in ("erfinv_", "logit_") else 1.0)
    x = base.clone()
    out = getattr(x, name)(*args)
    assert out is x
    ref = getattr(fg, name[:-1])(base, *args)
    assert_close(x, ref.to(x.dtype), rtol=0, atol=0)


def test_float_power_inplace_and_is_inference():
    x = fg.tensor([2.0, 3.0], dtype=fg.float64)
    x.float_power_(2)
    assert x.tolist() == [4.0, 9.0]
    with pytest.raises(RuntimeError, match="requires dtype Double"):
        fg.tensor([2.0]).float_power_(2)
    with fg.inference_mode():
        assert not fg.ones(1).is_inference() and not fg.is_inference(fg.ones(1))
    y = fg.tensor([1, 2])
    y.gcd_(fg.tensor([4, 4]))
    assert y.tolist() == [1, 2]
    z = fg.tensor([2.0, 3.0])
    z.polygamma_(1)
    assert_close(z, fg.polygamma(1, fg.tensor([2.0, 3.0])))


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce_matches_a_loop(reduce, include_self):
    a, src = arr(4, 3, seed=1), arr(5, 3, seed=2)
    index = np.array([0, 2, 0, 3, 2])
    ref = a.copy()
    fns = {"prod": np.prod, "mean": np.mean, "amax": np.max, "amin": np.min}
    for row in set(index.tolist()):
        parts = [src[index == row]] + ([a[row:row + 1]] if include_self else [])
        ref[row] = fns[reduce](np.concatenate(parts), axis=0)
    got = _both("index_reduce", fg.tensor(a), 0, fg.tensor(index), fg.tensor(src), reduce,
                include_self=include_self)
    assert_close(got, ref, rtol=1e-13)
    got = fg.index_reduce(fg.tensor(a.T), 1, fg.tensor(index), fg.tensor(src.T), reduce,
                          include_self=include_self)
    assert_close(got, ref.T, rtol=1e-13)
    x = fg.tensor(a.copy())
    x.index_reduce_(0, fg.tensor(index), fg.tensor(src), reduce, include_self=include_self)
    assert_close(x, ref, rtol=1e-13)
    check_grad(lambda t, s: fg.index_reduce(t, 0, fg.tensor(index), s, reduce,
                                            include_self=include_self), a, src)
