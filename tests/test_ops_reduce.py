"""Reductions: dim as int, tuple or None, keepdim, values against numpy, gradients against
finite differences on contiguous, non-contiguous and 0-d inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad as fg
from tests.conftest import LAYOUTS, arr, assert_close, check_grad, leaf, positive


def _np_logsumexp(a, axis=None, keepdims=False):
    m = np.max(a, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def _np_norm(p):
    def ref(a, axis=None, keepdims=False):
        if p == math.inf:
            return np.max(np.abs(a), axis=axis, keepdims=keepdims)
        return np.sum(np.abs(a) ** p, axis=axis, keepdims=keepdims) ** (1 / p)
    return ref


# name, fusegrad reduction f(x, dim, keepdim), numpy reference r(a, axis, keepdims), domain
REDUCTIONS = [
    ("sum", lambda x, d, k: x.sum(d, keepdim=k), np.sum, arr),
    ("mean", lambda x, d, k: x.mean(d, keepdim=k), np.mean, arr),
    ("prod", None, np.prod, arr),   # prod takes an int dim only; see below
    ("var", lambda x, d, k: x.var(d, keepdim=k),
     lambda a, axis=None, keepdims=False: np.var(a, axis=axis, keepdims=keepdims, ddof=1), arr),
    ("var_corr0", lambda x, d, k: x.var(d, keepdim=k, correction=0), np.var, arr),
    ("std", lambda x, d, k: x.std(d, keepdim=k),
     lambda a, axis=None, keepdims=False: np.std(a, axis=axis, keepdims=keepdims, ddof=1), arr),
    ("std_unbiased_false", lambda x, d, k: x.std(d, False, k), np.std, arr),
    ("amax", lambda x, d, k: x.amax(() if d is None else d, keepdim=k), np.max, arr),
    ("amin", lambda x, d, k: x.amin(() if d is None else d, keepdim=k), np.min, arr),
    ("logsumexp", lambda x, d, k: x.logsumexp(tuple(range(x.ndim)) if d is None else d,
                                              keepdim=k), _np_logsumexp, arr),
    ("norm2", lambda x, d, k: x.norm(dim=d, keepdim=k), _np_norm(2), arr),
    ("norm1", lambda x, d, k: x.norm(1, dim=d, keepdim=k), _np_norm(1), arr),
    ("norm3", lambda x, d, k: x.norm(3, dim=d, keepdim=k), _np_norm(3), arr),
    ("norm_inf", lambda x, d, k: x.norm(math.inf, dim=d, keepdim=k), _np_norm(math.inf), arr),
]
REDUCTIONS = [r for r in REDUCTIONS if r[1] is not None]
RED_IDS = [r[0] for r in REDUCTIONS]
DIMS = [None, 0, 1, -1, (0, 2), (2, 0, 1), [1]]
DIM_IDS = ["all", "0", "1", "-1", "0_2", "2_0_1", "list1"]


def _axis(dim):
    return tuple(dim) if isinstance(dim, (list, tuple)) else dim


@pytest.mark.parametrize("name,fn,ref,domain", REDUCTIONS, ids=RED_IDS)
@pytest.mark.parametrize("dim", DIMS, ids=DIM_IDS)
@pytest.mark.parametrize("keepdim", [False, True], ids=["", "keep"])
def test_reduction_forward(name, fn, ref, domain, dim, keepdim):
    a = domain(2, 3, 4)
    out = fn(fg.tensor(a), dim, keepdim)
    assert_close(out, ref(a, axis=_axis(dim), keepdims=keepdim))


@pytest.mark.parametrize("name,fn,ref,domain", REDUCTIONS, ids=RED_IDS)
@pytest.mark.parametrize("dim", [None, 1, (0, 2)], ids=["all", "1", "0_2"])
@pytest.mark.parametrize("kind", LAYOUTS)
def test_reduction_grad(name, fn, ref, domain, dim, kind):
    check_grad(lambda x: fn(x, dim, False), domain(2, 3, 4), kind=kind)


@pytest.mark.parametrize("name,fn,ref,domain", REDUCTIONS, ids=RED_IDS)
def test_reduction_grad_keepdim(name, fn, ref, domain):
    check_grad(lambda x: fn(x, 1, True) * fg.arange(1.0, 9.0, dtype=fg.float64).reshape(2, 1, 4),
               domain(2, 3, 4))


# a single element has no sample variance: var and std are checked on 0-d inputs elsewhere
NO_VARIANCE = [r for r in REDUCTIONS if not r[0].startswith(("var", "std"))]


@pytest.mark.parametrize("name,fn,ref,domain", NO_VARIANCE, ids=[r[0] for r in NO_VARIANCE])
def test_reduction_0d(name, fn, ref, domain):
    a = domain()
    for dim in (None, 0, -1):
        out = fn(fg.tensor(a), dim, False)
        assert out.shape == () and math.isclose(out.item(), ref(a), rel_tol=1e-6)
        assert fn(fg.tensor(a), dim, True).shape == ()
    check_grad(lambda x: fn(x, 0, False), a)


@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (1, True), (-1, False)])
@pytest.mark.parametrize("kind", LAYOUTS)
def test_prod(dim, keepdim, kind):
    a = arr(3, 4)
    kwargs = {} if dim is None else {"dim": dim, "keepdim": keepdim}
    out = fg.from_numpy(a).prod(**kwargs)
    assert_close(out, np.prod(a, axis=dim, keepdims=keepdim if dim is not None else False))
    check_grad(lambda x: x.prod(**kwargs), a, kind=kind)


@pytest.mark.parametrize("values", [
    [2.0, 0.0, 3.0], [0.0, 0.0, 3.0], [0.0, 1.5, -2.0], [0.0], [0.0, 0.0, 0.0]],
    ids=["one_zero", "two_zeros", "zero_first", "only_zero", "all_zero"])
def test_prod_gradient_with_zeros(values):
    x = fg.tensor(values, dtype=fg.float64, requires_grad=True)
    x.prod().backward()
    a = np.array(values)
    expected = [np.prod(np.delete(a, i)) for i in range(a.size)]
    assert_close(x.grad, expected)
    check_grad(lambda t: t.prod(), np.array(values))


def test_prod_gradient_with_zero_along_dim():
    a = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 1.0], [1.0, 2.0, 3.0]])
    x = leaf(a)
    x.prod(1).sum().backward()
    assert_close(x.grad, [[0.0, 6.0, 0.0], [0.0, 0.0, 0.0], [6.0, 3.0, 2.0]])


def test_prod_dtypes_and_dim_type():
    assert fg.tensor([2, 3]).prod().dtype is fg.int64
    assert fg.tensor([2, 3], dtype=fg.int32).prod().dtype is fg.int64
    assert fg.tensor([2.0, 3.0]).prod(dtype=fg.float64).dtype is fg.float64
    with pytest.raises(TypeError, match="prod\\(\\): argument 'dim' must be int"):
        fg.ones(2, 2).prod((0, 1))


def test_sum_dtypes():
    assert fg.tensor([True, True, False]).sum().dtype is fg.int64
    assert fg.tensor([True, True, False]).sum().item() == 2
    assert fg.tensor([1, 2], dtype=fg.int32).sum().dtype is fg.int64
    assert fg.tensor([1, 2], dtype=fg.uint8).sum(0).dtype is fg.int64
    assert fg.ones(2).sum(dtype=fg.float64).dtype is fg.float64
    assert fg.ones(2, dtype=fg.float16).sum().dtype is fg.float16


def test_sum_float16_accumulates_in_float32():
    x = fg.full((4096,), 1.0, dtype=fg.float16)
    assert x.sum().item() == 4096.0          # a float16 running sum would stall at 2048


def test_empty_reductions():
    e = fg.zeros(0, 3)
    assert e.sum().item() == 0.0 and e.sum(0).tolist() == [0.0, 0.0, 0.0]
    assert e.prod(0).tolist() == [1.0, 1.0, 1.0]
    assert math.isnan(fg.zeros(0).mean().item())
    assert fg.zeros(0).all().item() is True and fg.zeros(0).any().item() is False
    assert e.all(0).tolist() == [True] * 3 and e.any(0).tolist() == [False] * 3
    assert e.all(1).shape == (0,)
    with pytest.raises(RuntimeError, match="max\\(\\): Expected reduction dim to be specified"):
        fg.zeros(0).max()
    with pytest.raises(RuntimeError, match="Expected reduction dim to have non-zero size"):
        e.amax(0)
    values, indices = e.max(1)
    assert values.shape == (0,) and indices.shape == (0,)


def test_var_std_corrections():
    a = arr(4, 5)
    x = fg.tensor(a)
    assert_close(x.var(), np.var(a, ddof=1), rtol=1e-5)
    assert_close(x.var(1, unbiased=False), np.var(a, axis=1), rtol=1e-5)
    assert_close(x.var(False), np.var(a), rtol=1e-5)
    assert_close(x.var(0, correction=2), np.var(a, axis=0, ddof=2), rtol=1e-5)
    assert_close(x.std(correction=0), np.std(a), rtol=1e-5)
    v, m = fg.var_mean(x, 1)
    assert_close(v, np.var(a, axis=1, ddof=1), rtol=1e-5) and assert_close(m, a.mean(1))
    s, m = fg.std_mean(x)
    assert_close(s, np.std(a, ddof=1), rtol=1e-5)
    assert math.isnan(fg.tensor([1.0]).var().item())      # n - correction <= 0
    assert math.isnan(fg.tensor(2.0).var().item())
    assert fg.tensor(2.0).var(correction=0).item() == 0.0
    assert fg.tensor(2.0).std(0, correction=0).item() == 0.0
    with pytest.raises(RuntimeError, match="std and var only support floating point"):
        fg.tensor([1, 2]).var()


def test_var_std_gradients_with_corrections():
    check_grad(lambda x: x.var(1, correction=0), arr(3, 4))
    check_grad(lambda x: x.std(0, correction=2), arr(4, 3))


def test_norm_and_std_have_zero_gradient_at_zero():
    # torch's convention: the subgradient 0, not inf * 0 = nan
    for p in (2, 3, 1.5, 1, math.inf):
        x = fg.zeros(3, dtype=fg.float64, requires_grad=True)
        x.norm(p).backward()
        assert x.grad.tolist() == [0.0, 0.0, 0.0], p
    x = fg.zeros(2, 3, dtype=fg.float64, requires_grad=True)
    x.norm(dim=1).sum().backward()
    assert not np.isnan(x.grad.numpy()).any()
    y = fg.tensor([[1.0, 1.0], [1.0, 2.0]], dtype=fg.float64, requires_grad=True)
    y.std(1).sum().backward()
    assert_close(y.grad, [[0.0, 0.0], [-math.sqrt(0.5), math.sqrt(0.5)]])


def test_norm_variants():
    a = np.array([[3.0, -4.0], [0.0, 1.0]])
    x = fg.tensor(a)
    assert math.isclose(x.norm().item(), math.sqrt(26))
    assert math.isclose(x.norm("fro").item(), math.sqrt(26))
    assert x.norm(1).item() == 8.0
    assert x.norm(math.inf).item() == 4.0 and x.norm(-math.inf).item() == 0.0
    assert x.norm(0).item() == 3.0
    assert_close(x.norm(dim=1), [5.0, 1.0])
    assert x.norm(2, 1, True).shape == (2, 1)
    assert x.norm(1, dim=(0, 1)).item() == 8.0
    assert_close(x.norm(math.inf, dim=0), [3.0, 4.0])
    assert x.norm(dtype=fg.float64).dtype is fg.float64


# --------------------------------------------------------------------------- max / min


def test_max_min_with_dim_return_named_tuples():
    x = fg.tensor([[1.0, 5.0, 3.0], [4.0, 2.0, 6.0]])
    out = x.max(1)
    assert type(out).__name__ == "max" and out._fields == ("values", "indices")
    assert out.values.tolist() == [5.0, 6.0] and out.indices.tolist() == [1, 2]
    values, indices = x.min(0)
    assert values.tolist() == [1.0, 2.0, 3.0] and indices.tolist() == [0, 1, 0]
    assert indices.dtype is fg.int64
    kept = x.max(0, keepdim=True)
    assert kept.values.shape == (1, 3) and kept.indices.tolist() == [[1, 0, 1]]
    assert fg.max(x, -1).indices.tolist() == [1, 2]
    assert type(fg.min(x, 1)).__name__ == "min"


def test_max_min_ties_pick_the_first_index():
    assert fg.tensor([1.0, 3.0, 3.0]).max(0).indices.item() == 1
    assert fg.tensor([1.0, 1.0, 3.0]).min(0).indices.item() == 0
    assert fg.tensor([3.0, 1.0, 3.0]).argmax().item() == 0


def test_max_without_dim_and_binary_max():
    x = fg.tensor([[1.0, 5.0], [4.0, 2.0]])
    assert x.max().item() == 5.0 and x.min().item() == 1.0
    assert fg.max(x, fg.tensor([3.0, 3.0])).tolist() == [[3.0, 5.0], [4.0, 3.0]]
    assert fg.min(x, fg.tensor(2.0)).tolist() == [[1.0, 2.0], [2.0, 2.0]]
    assert fg.tensor([1, 5]).max().dtype is fg.int64
    assert math.isnan(fg.tensor([1.0, float("nan")]).max().item())
    s = fg.tensor(3.0)
    values, indices = s.max(0)
    assert values.item() == 3.0 and indices.item() == 0


@pytest.mark.parametrize("kind", LAYOUTS)
def test_max_min_grad(kind):
    a = arr(3, 4)
    check_grad(lambda x: x.max(), a, kind=kind)
    check_grad(lambda x: x.min(1).values, a, kind=kind)
    check_grad(lambda x: x.max(0, keepdim=True).values, a, kind=kind)


def test_max_gradients_on_ties():
    x = fg.tensor([1.0, 3.0, 3.0], requires_grad=True)
    x.max().backward()                   # evenly split, as torch's max() and amax
    assert x.grad.tolist() == [0.0, 0.5, 0.5]
    y = fg.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], requires_grad=True)
    y.amax(1).sum().backward()
    assert_close(y.grad, [[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    z = fg.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], requires_grad=True)
    z.max(1).values.sum().backward()     # max(dim): only the returned index
    assert z.grad.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_amax_amin():
    a = arr(2, 3, 4)
    x = fg.tensor(a)
    assert_close(x.amax(), a.max())
    assert_close(x.amax((0, 1)), a.max(axis=(0, 1)))
    assert_close(x.amin(1, keepdim=True), a.min(axis=1, keepdims=True))


@pytest.mark.parametrize("fn,ref", [(fg.argmax, np.argmax), (fg.argmin, np.argmin)])
def test_argmax_argmin(fn, ref):
    a = arr(3, 4, 5)
    x = fg.tensor(a)
    assert fn(x).item() == ref(a) and fn(x).dtype is fg.int64
    for dim in (0, 1, -1):
        np.testing.assert_array_equal(fn(x, dim).numpy(), ref(a, axis=dim))
    assert fn(x, 1, keepdim=True).shape == (3, 1, 5)
    assert fn(x, keepdim=True).shape == (1, 1, 1)
    assert fn(fg.tensor(2.0)).item() == 0
    np.testing.assert_array_equal(fn(fg.from_numpy(a).transpose(0, 2), 1).numpy(),
                                  ref(a.transpose(2, 1, 0), axis=1))
    with pytest.raises(RuntimeError, match="Expected reduction dim"):
        fn(fg.zeros(0))


def test_argmax_has_no_grad():
    x = fg.ones(3, requires_grad=True)
    assert not x.argmax().requires_grad and not x.max(0).indices.requires_grad


# --------------------------------------------------------------------------- logsumexp


def test_logsumexp_is_stable():
    x = fg.tensor([1000.0, 1000.0])
    assert math.isclose(x.logsumexp(0).item(), 1000 + math.log(2), rel_tol=1e-6)
    assert fg.tensor([-1000.0, -1000.0]).logsumexp(0).item() == pytest.approx(-1000 + math.log(2))
    ninf = fg.tensor([-math.inf, -math.inf]).logsumexp(0)
    assert ninf.item() == -math.inf
    assert fg.tensor([math.inf, 1.0]).logsumexp(0).item() == math.inf
    assert fg.tensor([1, 2]).logsumexp(0).dtype is fg.float32


def test_logsumexp_gradient_is_softmax():
    a = arr(3, 4)
    x = leaf(a)
    x.logsumexp(1).sum().backward()
    e = np.exp(a - a.max(1, keepdims=True))
    assert_close(x.grad, e / e.sum(1, keepdims=True))
    y = fg.tensor([-math.inf, 0.0], dtype=fg.float64, requires_grad=True)
    y.logsumexp(0).backward()
    assert y.grad.tolist() == [0.0, 1.0]


# --------------------------------------------------------------------------- all / any


def test_all_any():
    assert fg.tensor([1, 0, 2]).all().item() is False
    assert fg.tensor([0, 0, 2]).any().item() is True
    assert fg.tensor([1.5, 0.1]).all().item() is True
    m = fg.tensor([[True, False], [True, True]])
    assert m.all(1).tolist() == [False, True] and m.any(0).tolist() == [True, True]
    assert m.all(1, keepdim=True).shape == (2, 1)
    assert m.all().dtype is fg.bool
    assert fg.count_nonzero(fg.tensor([[0, 1], [2, 0]]), 0).tolist() == [1, 1]
    assert fg.count_nonzero(fg.tensor([[0, 1], [2, 0]])).item() == 2


# --------------------------------------------------------------------------- cumsum


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("kind", LAYOUTS)
def test_cumsum(dim, kind):
    a = arr(3, 4)
    assert_close(fg.from_numpy(a).cumsum(dim), np.cumsum(a, axis=dim))
    check_grad(lambda x: x.cumsum(dim), a, kind=kind)


def test_cumsum_dtypes_and_0d():
    assert fg.tensor([1, 2], dtype=fg.int32).cumsum(0).dtype is fg.int64
    assert fg.tensor([True, True]).cumsum(0).tolist() == [1, 2]
    assert fg.ones(2).cumsum(0, dtype=fg.float64).dtype is fg.float64
    assert fg.tensor(3.0).cumsum(0).item() == 3.0
    check_grad(lambda x: x.cumsum(0), positive())


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("call", [
    lambda x: x.sum(3), lambda x: x.mean(-4), lambda x: x.amax(5), lambda x: x.argmax(3),
    lambda x: x.max(3), lambda x: x.var(3), lambda x: x.logsumexp(3), lambda x: x.cumsum(3),
    lambda x: x.norm(dim=3), lambda x: x.all(3), lambda x: x.prod(3),
])
def test_reduction_dim_out_of_range(call):
    with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of "
                                         r"\[-3, 2\], but got -?\d\)"):
        call(fg.ones(2, 3, 4))


def test_reduction_repeated_dim_and_int_mean():
    with pytest.raises(RuntimeError, match="appears multiple times in the list of dims"):
        fg.ones(2, 3).sum((0, 0))
    with pytest.raises(RuntimeError, match="mean\\(\\): could not infer output dtype. Input dtype "
                                           "must be either a floating point or complex dtype. "
                                           "Got: Long"):
        fg.tensor([1, 2]).mean()
    assert fg.tensor([1, 2]).mean(dtype=fg.float32).item() == 1.5


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "std", "var"])
@pytest.mark.parametrize("dim", [(), []])
def test_an_empty_dim_list_reduces_every_dim(name, dim):
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    x = leaf(a)
    out = getattr(x, name)(dim=dim)
    ref = {"std": lambda v: v.std(ddof=1), "var": lambda v: v.var(ddof=1),
           "amax": np.max, "amin": np.min}.get(name, getattr(np, name))(a)
    assert out.shape == ()
    np.testing.assert_allclose(out.detach().numpy(), ref, rtol=1e-6)
    np.testing.assert_allclose(fg.compile(lambda t: getattr(t, name)(dim=dim))(x).detach()
                               .numpy(), ref, rtol=1e-6)


def test_integer_dtype_of_a_reduction_is_kept():
    x = fg.tensor([1, 2, 3], dtype=fg.int32)
    assert x.sum(dtype=fg.int32).dtype is fg.int32
    assert x.sum(0, dtype=fg.int16).dtype is fg.int16
    assert x.prod(dtype=fg.int32).dtype is fg.int32
    assert x.cumsum(0, dtype=fg.int32).dtype is fg.int32
    assert x.cumprod(0, dtype=fg.int16).dtype is fg.int16
    assert x.sum().dtype is fg.int64                      # without dtype: int64, as torch
    # Accumulated in that dtype: uint8 wraps (200 + 100 = 44).
    assert fg.tensor([200, 100], dtype=fg.uint8).sum(dtype=fg.uint8).item() == 44
    assert fg.compile(lambda t: t.sum(dtype=fg.int32))(x).dtype is fg.int32


def test_gradient_of_a_product_over_no_axes():
    # The prod primitive's VJP counted zeros with sum(dim=[]), which (as in torch) now sums
    # every dim: over no axes each element is its own product.
    from fusegrad.ops import prims as P
    from fusegrad.ops.primitive import bind
    x = leaf(np.array([0.5, 0.0, -2.0], np.float32))
    bind(P.prod, x, axes=()).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0, 1.0])
