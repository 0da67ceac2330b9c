"""Compiled reductions over every axis layout, against numpy.

A reduction that keeps the innermost axis (``x.sum(0)`` of a matrix) runs with its loops
interchanged (``kernel.ColumnPlan``: the reduced axes outside, a tile of accumulators
inside); one over the last axis runs a row at a time. Both must agree with numpy for every
reduction kind, every set of axes, keepdim or not, with NaN, infinities and -0.0 in the
data, and give the same bits whatever the thread count.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.codegen.cpu_lowering import (
    COLUMN_BLOCK,
    COLUMN_TILE,
    SPLIT_PARTS,
    SPLIT_WORK,
    column_plan,
    kernel_phases,
    parallel_extent,
    split_plan,
)
from fusegrad.passes.fusion import Kernel
from tests.compiler.compare import values

SHAPE = (4, 5, 6)
AXES = [ax for r in range(1, 4) for ax in itertools.combinations(range(3), r)]


def reductions(x, axes, keepdim):
    """Every reduction kind over ``axes`` (fusegrad tensors or numpy arrays); prod, as
    torch's, takes one axis: the product of the first axis over the others' sums."""
    if isinstance(x, np.ndarray):
        with np.errstate(all="ignore"):
            return (x.sum(axes, keepdims=keepdim), x.prod(axes[0], keepdims=keepdim),
                    x.max(axes, keepdims=keepdim), x.min(axes, keepdims=keepdim),
                    x.mean(axes, keepdims=keepdim), x.var(axes, ddof=1, keepdims=keepdim))
    return (x.sum(axes, keepdim=keepdim), x.prod(axes[0], keepdim=keepdim),
            x.amax(axes, keepdim=keepdim), x.amin(axes, keepdim=keepdim),
            x.mean(axes, keepdim=keepdim), x.var(axes, keepdim=keepdim))


def check(got, want, rtol, atol=0.0):
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                               atol=atol, equal_nan=True)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("axes", AXES, ids=str)
@pytest.mark.parametrize("dtype", [fg.float32, fg.float64], ids=str)
def test_every_kind_over_every_axis_set(axes, keepdim, dtype):
    x = values(SHAPE, dtype, seed=sum(axes))          # NaN, ±inf, -0.0 at random places
    got = fg.compile(lambda a: reductions(a, axes, keepdim))(fg.from_numpy(x))
    rtol = 1e-5 if dtype is fg.float32 else 1e-12
    for g, w in zip(got, reductions(x, axes, keepdim)):
        check(g.numpy(), w, rtol, atol=rtol)


@pytest.mark.parametrize("axes", AXES, ids=str)
def test_integer_reductions(axes):
    x = values(SHAPE, fg.int32, seed=3)
    fn = lambda a: (a.sum(axes), a.amax(axes), a.amin(axes), a.prod(axes[-1]))  # noqa: E731
    got = fg.compile(fn)(fg.from_numpy(x))
    want = (x.sum(axes, dtype=np.int64), x.max(axes), x.min(axes),
            x.prod(axes[-1], dtype=np.int64))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w)


@pytest.mark.parametrize("axes", [(0,), (0, 1), (1,)], ids=str)
def test_float16_column_reductions(axes):
    x = values((70, 3, 40), fg.float16, seed=5, special=False)
    got = fg.compile(lambda a: (a.sum(axes), a.amax(axes)))(fg.from_numpy(x))
    check(got[0].numpy(), x.astype(np.float64).sum(axes).astype(np.float16), 2e-3, atol=0.05)
    check(got[1].numpy(), x.max(axes), 0)


def test_signed_zero_and_special_columns():
    # Columns: all -0.0 (sum +0.0, as numpy and torch), a NaN (every kind NaN), inf and -inf
    # (sum NaN, max inf), inf alone (sum inf); long enough (200 rows) for blocked column sums.
    n = 200
    x = np.zeros((n, 4), dtype=np.float32)
    x[:, 0] = -0.0
    x[:, 1] = 1.0
    x[7, 1] = np.nan
    x[:, 2] = 1.0
    x[3, 2], x[150, 2] = np.inf, -np.inf
    x[:, 3] = 2.0
    x[120, 3] = np.inf
    s, mx, mn, mean = fg.compile(lambda a: (a.sum(0), a.amax(0), a.amin(0), a.mean(0)))(
        fg.from_numpy(x))
    s = s.numpy()
    assert s[0] == 0 and not np.signbit(s[0])
    assert np.isnan(s[1]) and np.isnan(mx.numpy()[1]) and np.isnan(mn.numpy()[1])
    assert np.isnan(s[2]) and mx.numpy()[2] == np.inf and mn.numpy()[2] == -np.inf
    assert s[3] == np.inf and mean.numpy()[3] == np.inf


@pytest.mark.parametrize("shape,axes", [
    ((3 * COLUMN_BLOCK + 5, 33), (0,)),            # blocked sums, one tile
    ((130, 3, COLUMN_TILE + 100), (0,)),           # the last axis in chunks, outer units
    ((20, 2560), (0,)),                            # in equal chunks (640)
    ((70, 9, 40), (0,)),                           # a two-axis tile
    ((6, 50, 7, 30), (0, 2)),                      # kept axes between reduced ones
    ((300, 2), (0,)),                              # a narrow tile
])
def test_column_layouts_against_numpy(shape, axes):
    x = values(shape, fg.float32, seed=len(shape), special=False)
    x64 = x.astype(np.float64)
    fn = lambda a: (a.sum(axes), a.amax(axes), a.var(axes), a - a.mean(axes, keepdim=True),  # noqa: E731
                    fg.nn.functional.softmax(a, dim=axes[0]))
    compiled = fg.compile(fn)
    got = compiled(fg.from_numpy(x))
    kernel = compiled.lower(fg.from_numpy(x)).program.kg.kernels[0]
    assert column_plan(kernel) is not None
    n = math.prod(shape[a] for a in axes)
    eps = float(np.finfo(np.float32).eps)
    np.testing.assert_allclose(got[0].numpy(), x64.sum(axes), rtol=0,
                               atol=4 * eps * np.abs(x64).sum(axes).max())
    np.testing.assert_array_equal(got[1].numpy(), x.max(axes))
    np.testing.assert_allclose(got[2].numpy(), x64.var(axes, ddof=1), rtol=1e-5)
    np.testing.assert_allclose(got[3].numpy(), x64 - x64.mean(axes, keepdims=True), rtol=1e-5,
                               atol=1e-5)
    e = np.exp(x64 - x64.max(axes[0], keepdims=True))
    np.testing.assert_allclose(got[4].numpy(), e / e.sum(axes[0], keepdims=True), rtol=1e-5,
                               atol=1e-7)
    assert n == math.prod(shape) // math.prod(got[0].shape)


def test_bias_gradient_and_update_fuse_into_one_column_kernel():
    rng = np.random.default_rng(0)
    g = rng.standard_normal((128, 256)).astype(np.float32)
    b = rng.standard_normal(256).astype(np.float32)
    f = fg.compile(lambda g, b: b - 0.1 * g.sum(0))
    got = f(fg.from_numpy(g), fg.from_numpy(b)).numpy()
    np.testing.assert_allclose(got, b - 0.1 * g.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
    kernels = f.lower(fg.from_numpy(g), fg.from_numpy(b)).program.kg.kernels
    assert len(kernels) == 1 and column_plan(kernels[0]) is not None


@pytest.mark.parametrize("fn", [
    lambda a: a.sum(0), lambda a: a.mean(0), lambda a: a.var(0), lambda a: a.amax(0),
    lambda a: a.sum(1), lambda a: (a * a).sum(), lambda a: a.sum((0, 2)),
], ids=["sum0", "mean0", "var0", "amax0", "sum1", "full", "sum02"])
def test_results_do_not_depend_on_the_thread_count(fn):
    # Large enough to be split across threads (the runtime's PARALLEL_THRESHOLD).
    x = values((300, 3, 1100), fg.float32, seed=9, special=False)
    results = []
    before = fg.get_num_threads()
    try:
        compiled = fg.compile(fn)
        for threads in (1, 2, 3):
            fg.set_num_threads(threads)
            # untimed, then one thread and split alternately while the runtime measures
            for _ in range(3):
                results.append(compiled(fg.from_numpy(x)).numpy().copy())
    finally:
        fg.set_num_threads(before)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def _kernel(shape, axes):
    return Kernel("k", "reduction", shape=shape, axes=axes)


def test_column_plans():
    assert column_plan(_kernel((8, 16), (1,))) is None             # the last axis reduced
    assert column_plan(_kernel((8, 16), ())) is None
    assert column_plan(_kernel((8, 0), (0,))) is None               # empty
    plan = column_plan(_kernel((128, 256), (0,)))
    assert plan.tile == (1,) and plan.chunk == 0 and plan.units == 1
    plan = column_plan(_kernel((4096, 4 * COLUMN_TILE), (0,)))     # chunks of the last axis
    assert plan.tile == (1,) and plan.chunk and plan.units == -(-4 * COLUMN_TILE // plan.chunk)
    plan = column_plan(_kernel((20, 2560), (0,)))                  # equal chunks if any
    assert plan.chunk == 640 and plan.units == 4
    plan = column_plan(_kernel((20, 1031), (0,)))                  # else a shorter last one
    assert plan.chunk == COLUMN_TILE and plan.units == 2
    plan = column_plan(_kernel((6, 50, 7, 30), (0, 2)))
    assert plan.outer == (1,) and plan.tile == (3,) and plan.units == 50
    assert parallel_extent(_kernel((6, 50, 7, 30), (0, 2))) == 50
    assert parallel_extent(_kernel((6, 50, 7, 30), (3,))) == 6


# ----------------------------------------------------------------------------- full reductions


def test_split_plans_and_phases():
    assert split_plan(_kernel((100,), (0,))) is None                  # too small to split
    assert split_plan(_kernel((300, 400), (0,))) is None               # kept axes
    ones = fg.ones(5, 40000)
    kernel = fg.compile(lambda a: a.sum()).lower(ones).program.kg.kernels[0]
    plan = split_plan(kernel)
    assert plan.lead == 2 and plan.lead_size == 200000 and plan.parts == SPLIT_PARTS
    x = np.ones(SPLIT_WORK, dtype=np.float32)
    kg = fg.compile(lambda a: fg.nn.functional.softmax(a, 0)).lower(fg.from_numpy(x)).program.kg
    kernels = kg.kernels
    phases = kernel_phases(kernels[0], kg)
    # max, then the sum of exponentials: a parallel and a combining phase each, then the
    # parallel full-size stores.
    assert [name[-3:] for name, _ in phases[:4]] == ["_p0", "_c0", "_p1", "_c1"]
    assert phases[-1] == (kernels[0].name, SPLIT_WORK)


def large(seed=0, n=3 * SPLIT_WORK + 17):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def test_split_full_reductions_against_numpy():
    x = large()
    x64 = x.astype(np.float64)
    fn = lambda a: (a.sum(), a.amax(), a.amin(), (a * a).mean(), a.var(),  # noqa: E731
                    fg.nn.functional.softmax(a, 0), (a > 0).sum(), a.prod())
    got = [t.numpy() for t in fg.compile(fn)(fg.from_numpy(x))]
    eps = float(np.finfo(np.float32).eps)
    assert abs(got[0] - x64.sum()) <= 4 * eps * np.abs(x64).sum()
    assert got[1] == x.max() and got[2] == x.min()
    assert abs(got[3] - (x64 * x64).mean()) <= 4 * eps * (x64 * x64).mean()
    np.testing.assert_allclose(got[4], x64.var(ddof=1), rtol=1e-5)
    e = np.exp(x64 - x64.max())
    np.testing.assert_allclose(got[5], e / e.sum(), rtol=1e-5, atol=1e-12)
    assert got[6] == (x > 0).sum() and got[6].dtype == np.int64
    assert got[7] == 0.0 or np.isinf(got[7])      # underflows / overflows like numpy's
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got[7], x.prod())


def test_split_full_reductions_with_special_values():
    n = 3 * SPLIT_WORK
    s = fg.compile(lambda a: (a.sum(), a.amax(), a.amin()))
    zeros = np.full(n, -0.0, dtype=np.float32)
    total = s(fg.from_numpy(zeros))[0].numpy()
    assert total == 0 and not np.signbit(total)   # +0.0, as numpy and torch (a sum starts at +0.0)
    x = np.ones(n, dtype=np.float32)
    x[n - 5] = np.nan                                          # in the last part only
    assert all(np.isnan(t.numpy()) for t in s(fg.from_numpy(x)))
    x = np.ones(n, dtype=np.float32)
    x[3], x[n - 3] = np.inf, -np.inf                           # in different parts
    got = [t.numpy() for t in s(fg.from_numpy(x))]
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == -np.inf


def test_split_float64_sums_are_compensated_across_parts():
    # Part sums 2**53, 1.5 and -2**53 (each exact): plain float64 adds give 0.
    n = 3 * SPLIT_PARTS * 4096
    x = np.zeros(n)
    x[0], x[n // 2], x[n // 2 + 1], x[n - 1] = 2.0 ** 53, 1.0, 0.5, -(2.0 ** 53)
    assert float(fg.compile(lambda a: a.sum())(fg.from_numpy(x)).numpy()) == 1.5
    i = np.arange(n, dtype=np.int64) * (1 << 40)               # int64 sums stay exact
    assert int(fg.compile(lambda a: a.sum())(fg.from_numpy(i)).numpy()) == int(i.sum())


@pytest.mark.parametrize("shape", [(5, 40000), (300, 3, 1100), (100000, 3)], ids=str)
def test_split_layouts_and_thread_counts(shape):
    x = values(shape, fg.float32, seed=4, special=False)
    x64 = x.astype(np.float64)
    fn = lambda a: (a.sum(), (a * a).mean(), a.amax(), a - a.amax())  # noqa: E731
    results = []
    before = fg.get_num_threads()
    try:
        for threads in (1, 2, 4):
            fg.set_num_threads(threads)
            results.append([t.numpy() for t in fg.compile(fn)(fg.from_numpy(x))])
    finally:
        fg.set_num_threads(before)
    for r in results[1:]:
        for a, b in zip(r, results[0]):
            np.testing.assert_array_equal(a, b)
    eps = float(np.finfo(np.float32).eps)
    got = results[0]
    assert abs(got[0] - x64.sum()) <= 4 * eps * np.abs(x64).sum()
    assert abs(got[1] - (x64 * x64).mean()) <= 4 * eps * (x64 * x64).mean()
    assert got[2] == x.max()
    np.testing.assert_array_equal(got[3], x - x.max())
