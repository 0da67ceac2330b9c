"""Short constant loops are unrolled by the kernel emitter itself.

The LLVM pipeline runs no unroller (runtime unrolling of vector and remainder loops cost a
third of the compile time for nothing measurable), so a kernel whose innermost loop has a
few constant iterations (a (4000, 3) broadcast, a softmax over 3 classes) asks for a full
unroll in the loop's metadata. Unrolled, the loop around it is innermost and vectorizes
across rows; left rolled, the kernel ran scalar, about 11x slower.
"""

from __future__ import annotations

import re

import numpy as np

import fusegrad as fg
from fusegrad.runtime import jit


def test_short_innermost_loop_is_unrolled_and_the_row_loop_vectorized():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3), dtype=np.float32)
    b = rng.standard_normal(3, dtype=np.float32)

    def f(x, b):
        return (x * b).exp()
    compiled = fg.compile(f)
    np.testing.assert_allclose(compiled(fg.tensor(x), fg.tensor(b)).numpy(),
                               np.exp(x.astype(np.float64) * b), rtol=2e-6)
    text = compiled.lower(fg.tensor(x), fg.tensor(b)).llvm_ir
    assert "llvm.loop.unroll.full" in text
    _, optimized = jit._compile_object(jit._prefer_wide_vectors(text), keep_ir=True)
    assert re.search(r"<\d+ x float>", optimized), "the row loop was not vectorized"


def test_loops_with_inner_loops_or_many_iterations_are_not_forced():
    x = fg.randn(4, 3, 40)
    text = fg.compile(lambda x: x.exp() + 1).lower(x).llvm_ir
    outer = fg.compile(lambda x, b: x * b).lower(fg.randn(3, 40, 5), fg.randn(40, 1)).llvm_ir
    assert "llvm.loop.unroll.full" not in text      # one flat loop of 480
    # the 3-iteration loop holds other loops: unrolling it would copy their bodies
    assert "llvm.loop.unroll.full" in outer and outer.count("llvm.loop.unroll.full") == 1


def test_rolled_short_innermost_loop_is_vectorized():
    # Rows of 10 stay a rolled loop (unrolled, the loop around them vectorizes, but LLVM
    # takes up to seconds over heavy bodies); LLVM vectorizes loops of under 16 known
    # iterations only when asked, and left alone this one ran scalar, 3-4x slower.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 10), dtype=np.float32)
    b = rng.standard_normal(10, dtype=np.float32)
    compiled = fg.compile(lambda x, b: (x * b).exp())
    np.testing.assert_allclose(compiled(fg.tensor(x), fg.tensor(b)).numpy(),
                               np.exp(x.astype(np.float64) * b), rtol=2e-6)
    text = compiled.lower(fg.tensor(x), fg.tensor(b)).llvm_ir
    assert "llvm.loop.vectorize.enable" in text and "llvm.loop.unroll.disable" in text
    _, optimized = jit._compile_object(jit._prefer_wide_vectors(text), keep_ir=True)
    assert re.search(r"<\d+ x float>", optimized), "the row loop was not vectorized"
