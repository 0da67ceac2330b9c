"""Fused float sums are as accurate as numpy's pairwise sums.

A reduction loop that the vectorizer turns into a few dozen partial sums, each adding n / 64
values in sequence, loses accuracy linearly in n: ``((x*1.5).tanh()*x).sum()`` over 2**27
normals was off by 0.31%, ``(x*x).mean()`` over 2**24 by 5e-5. Codegen now sums blocks of
``cpu_lowering.SUM_BLOCK`` elements in registers and adds block sums in float64
(``_CPULowering.blocked_sum``). The bound used here, ``c * eps * sum(|x|)`` with a small c,
is what pairwise summation guarantees up to a log factor; sequential float32 sums of these
sizes miss it by orders of magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.codegen.cpu_lowering import SUM_BLOCK

EPS32 = float(np.finfo(np.float32).eps)


def check_sum(got, exact, abs_terms, c: float = 4.0, eps: float = EPS32) -> None:
    """``got`` is within ``c * eps * sum|terms|`` (+ one rounding of the result) of the
    float64 ``exact``."""
    got = np.asarray(got, dtype=np.float64)
    bound = c * eps * np.asarray(abs_terms) + eps * np.abs(exact)
    err = np.abs(got - exact)
    assert (err <= bound).all(), f"max error {err.max():.3g}, bound {bound.min():.3g}"


def normals(n, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


@pytest.mark.parametrize("log2n", [14, pytest.param(22, marks=pytest.mark.slow),
                                   pytest.param(24, marks=pytest.mark.slow)])
def test_full_sums(log2n):
    x = normals(1 << log2n)
    x64 = x.astype(np.float64)
    t = np.tanh(x64 * 1.5) * x64
    tanh_sum, sq_mean, plain = fg.compile(
        lambda a: (((a * 1.5).tanh() * a).sum(), (a * a).mean(), a.sum()))(fg.from_numpy(x))
    check_sum(tanh_sum.numpy(), t.sum(), np.abs(t).sum(), c=8)    # tanh is within a few ulp
    check_sum(sq_mean.numpy(), (x64 * x64).mean(), (x64 * x64).mean())
    check_sum(plain.numpy(), x64.sum(), np.abs(x64).sum())


def test_issue_figures_mean_of_squares_relative_error():
    # (x*x).mean() over 2**20: a sum of positive terms, so the relative error itself is
    # bounded (5e-5 at 2**24 before; pairwise gives a few eps).
    x = normals(1 << 20, seed=3)
    got = float(fg.compile(lambda a: (a * a).mean())(fg.from_numpy(x)).numpy())
    exact = (x.astype(np.float64) ** 2).mean()
    assert abs(got - exact) / exact < 4 * EPS32


@pytest.mark.parametrize("shape,axis", [
    ((64, 3 * SUM_BLOCK + 5), -1),          # long rows: chunked last axis
    ((3 * SUM_BLOCK + 7, 16), 0),           # a non-last axis, strided
    ((40, 300, 3), (0, 1)),                 # several axes, blocks of whole inner dims
    ((5, 2 * SUM_BLOCK, 2), 1),             # a middle axis
])
def test_sums_over_rows_and_non_last_axes(shape, axis):
    x = normals(int(np.prod(shape)), seed=1).reshape(shape) + 0.5
    x64 = x.astype(np.float64)
    got = fg.compile(lambda a: a.sum(axis))(fg.from_numpy(x)).numpy()
    check_sum(got, x64.sum(axis), np.abs(x64).sum(axis))
    mean = fg.compile(lambda a: (a * a).mean(axis))(fg.from_numpy(x)).numpy()
    check_sum(mean, (x64 * x64).mean(axis), (x64 * x64).mean(axis))


def test_float64_block_sums_are_compensated():
    # Block sums 2**53, 0.5, 0.5, 0.5, -2**53 (each exact): adding them in plain float64
    # gives 0 (2**53 + 0.5 rounds back to 2**53); Neumaier's compensation keeps 1.5.
    b = SUM_BLOCK
    x = np.concatenate([np.full(b, 2.0 ** 53 / b), np.full(3 * b, 0.5 / b),
                        np.full(b, -(2.0 ** 53) / b)])
    got = float(fg.compile(lambda a: a.sum())(fg.from_numpy(x)).numpy())
    assert got == 1.5


def test_float64_sums_within_bound():
    x = normals(1 << 18, seed=2, dtype=np.float64)
    got = float(fg.compile(lambda a: a.sum())(fg.from_numpy(x)).numpy())
    exact = float(np.sum(x.astype(np.longdouble)))
    check_sum(got, exact, np.abs(x).sum(), eps=float(np.finfo(np.float64).eps))


@pytest.mark.parametrize("dtype", [fg.float32, fg.float64, fg.bfloat16, fg.float16])
def test_blocked_sum_special_values(dtype):
    n = 2 * SUM_BLOCK + 9
    cases = {
        "inf": ([np.inf], np.inf), "-inf": ([-np.inf], -np.inf),
        "inf-inf": ([np.inf, -np.inf], np.nan), "nan": ([np.nan], np.nan),
    }
    for name, (specials, want) in cases.items():
        x = np.ones(n, dtype=np.float32)
        x[[7, n - 3][:len(specials)]] = specials
        got = fg.compile(lambda a: a.sum())(fg.tensor(x, dtype=dtype)).float().numpy()
        np.testing.assert_equal(got, np.float32(want), err_msg=name)
    zeros = fg.tensor(np.full(n, -0.0, dtype=np.float32), dtype=dtype)
    got = fg.compile(lambda a: a.sum())(zeros).float().numpy()
    assert got == 0 and not np.signbit(got)  # a sum starts at +0.0, as numpy's and torch's


def test_short_rows_are_one_block():
    # softmax- and layer_norm-sized rows keep the single-loop form (no float64 total).
    f = fg.compile(lambda a: a.sum(-1))
    lowered = f.lower(fg.ones(8, SUM_BLOCK))
    assert "double" not in lowered.program.llvm_ir
    lowered = f.lower(fg.ones(8, SUM_BLOCK + 1))
    assert "double" in lowered.program.llvm_ir
