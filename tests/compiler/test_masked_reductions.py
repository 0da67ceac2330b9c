"""Masked row reductions (attention's ``softmax(x.masked_fill(~m, -inf))``): values against
numpy, and the codegen property that made them slow when it was missing.

LLVM's InstCombine rewrote ``maximum(acc, select(c, x, -inf))`` (a max over masked values)
into the conditional reduction ``select(c, maximum(acc, x), acc)``, which the loop vectorizer
does not handle: the row's max stayed a scalar loop. The kernel emitter freezes a float
max/min reduction's operand so the select stays hidden; the test compares the optimized IR
of the masked kernel with the unmasked one (vector widths depend on the host).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.runtime import jit

F = fg.nn.functional


def _causal(t: int) -> np.ndarray:
    return np.tril(np.ones((t, t), dtype=bool))


def _softmax_ref(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _optimized(fn, *args) -> str:
    text = fg.compile(fn).lower(*args).llvm_ir
    _, optimized = jit._compile_object(jit._prefer_wide_vectors(text), keep_ir=True)
    return optimized


def _vector_max(optimized: str) -> bool:
    return bool(re.search(r"@llvm\.(vector\.reduce\.fmaximum|maximum\.v\d+f32)", optimized))


@pytest.mark.parametrize("fill", [float("-inf"), -1e9])
@pytest.mark.parametrize("op", ["max", "min"])
def test_masked_max_and_min_reductions_are_vectorized_like_plain_ones(fill, op):
    x = fg.tensor(np.random.default_rng(0).standard_normal((8, 4, 32, 32), dtype=np.float32))
    m = fg.tensor(_causal(32))
    sign = 1.0 if op == "max" else -1.0

    def reduce(t):
        return t.amax(-1) if op == "max" else t.amin(-1)

    plain = _optimized(lambda x: reduce(x), x)
    masked = _optimized(lambda x, m: reduce(x.masked_fill(~m, sign * fill)), x, m)
    if op == "min":
        plain, masked = (t.replace("fminimum", "fmaximum").replace("minimum.v", "maximum.v")
                         for t in (plain, masked))
    assert _vector_max(masked) == _vector_max(plain)
    assert "freeze" in fg.compile(lambda x, m: reduce(x.masked_fill(~m, sign * fill))) \
        .lower(x, m).llvm_ir


@pytest.mark.parametrize("fill", [float("-inf"), -1e9])
def test_masked_softmax_matches_numpy(fill):
    rng = np.random.default_rng(1)
    xn = rng.standard_normal((4, 2, 32, 32), dtype=np.float32)
    xn[0, 0, 5, 0] = np.nan                       # a NaN in an unmasked place: its row is NaN
    xn[1, 1, 7, 7] = -0.0
    mask = _causal(32)
    got = fg.compile(lambda x, m: F.softmax(x.masked_fill(~m, fill), -1))(
        fg.tensor(xn), fg.tensor(mask)).numpy()
    ref = _softmax_ref(np.where(mask, xn, np.float32(fill)))
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-7, equal_nan=True)
    assert np.isnan(got[0, 0, 5]).all() and not np.isnan(np.delete(got[0, 0], 5, 0)).any()
    got[0, 0, 5] = 0.0
    assert (got[..., ~mask] == 0).all() and not np.signbit(got[..., ~mask]).any()


def test_masked_max_keeps_nan_and_signed_zero():
    xn = np.full((3, 16), -1.0, dtype=np.float32)
    xn[0, 3] = np.nan
    xn[1, 2], xn[1, 9] = -0.0, 0.0
    xn[2, 4] = -0.0
    mask = np.ones((3, 16), dtype=bool)
    mask[:, 10:] = False
    xn[2, 12] = 5.0                               # masked out
    got = fg.compile(lambda x, m: x.masked_fill(~m, float("-inf")).amax(-1))(
        fg.tensor(xn), fg.tensor(mask)).numpy()
    assert np.isnan(got[0])
    assert got[1] == 0.0 and not np.signbit(got[1])
    assert got[2] == 0.0 and np.signbit(got[2])
