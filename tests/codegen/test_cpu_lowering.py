"""The CPU-shaped lowering, read as lowered kernel IR: which loops each kind of kernel gets.

Numbers are checked everywhere else (every compiled program runs it through the LLVM
printer); these tests pin the loop structure the printer and LLVM's vectorizer rely on.
"""

from __future__ import annotations

import re

import numpy as np

import fusegrad as fg
from fusegrad.codegen import cpu_lowering
from fusegrad.codegen.kernel_ir import Loop, format_kernel
from fusegrad.passes.fusion import fuse
from fusegrad.passes.manager import PassManager
from fusegrad.runtime import jit
from fusegrad.tracer.compile import DEFAULT_PIPELINE


def lowered(fn, *args):
    kg = fuse(PassManager(DEFAULT_PIPELINE).run(fg.trace(fn, *args)))
    return [lk for k in kg.kernels for lk in cpu_lowering.lower_kernel(k, kg)]


def loops(body) -> list[Loop]:
    out = []
    for st in body:
        if isinstance(st, Loop):
            out.append(st)
            out += loops(st.body)
    return out


def test_elementwise_kernel_is_a_nest_split_by_start_and_end():
    (k,) = lowered(lambda x: (x * 2).exp(), fg.ones(30, 40))
    text = format_kernel(k)
    outer, inner = loops(k.body)
    assert outer.start.op == "special" and outer.start.arg == "start" and outer.stop.arg == "end"
    # rows of 8 to 64 stay a rolled loop, which LLVM vectorizes
    assert inner.stop.arg == 40 and not inner.unroll
    assert "exp.f32" in text and text.count("p1[") == 1


def test_concat_along_the_innermost_axis_gets_a_loop_per_operand():
    a, b, c = (fg.randn(4, 3, 16) for _ in range(3))

    def f(a, b, c):
        return fg.cat([a, b.exp(), c], -1) * 2
    k = lowered(f, a, b, c)[-1]           # b.exp() is a kernel of its own
    inner = [lp for lp in loops(k.body) if not lp.body or not isinstance(lp.body[0], Loop)]
    assert [(lp.start.arg, lp.stop.arg) for lp in inner] == [(0, 16), (16, 32), (32, 48)]
    compiled = fg.compile(f)
    expected = np.concatenate([a.numpy(), np.exp(b.numpy()), c.numpy()], -1) * 2
    np.testing.assert_allclose(compiled(a, b, c).numpy(), expected, rtol=2e-6)
    # Each range's selects are decided by its bounds: the loads are unit-stride vectors.
    _, optimized = jit._compile_object(jit._prefer_wide_vectors(compiled.lower(a, b, c).llvm_ir),
                                       keep_ir=True)
    assert re.search(r"load <\d+ x float>", optimized) and "masked.gather" not in optimized


def test_softmax_rows_reduce_into_variables_and_keep_the_exponentials():
    (k,) = lowered(lambda x: fg.nn.functional.softmax(x, -1), fg.randn(8, 100))
    text = format_kernel(k)
    # a max loop, a sum loop that also keeps exp(x - max) in a local row, a store loop
    assert len(loops(k.body)) == 4 and len(k.locals) == 1 and k.locals[0].size == 100
    assert "local row" in text and "max.f32" in text and "exp.f32" in text


def test_column_sum_runs_a_tile_of_accumulators_inside_the_reduced_loop():
    x = fg.randn(200, 300)            # over COLUMN_BLOCK rows: blocked sums
    kg = fuse(PassManager(DEFAULT_PIPELINE).run(fg.trace(lambda x: x.sum(0), x)))
    plan = cpu_lowering.column_plan(kg.kernels[0])
    assert plan is not None and plan.tile == (1,)
    (k,) = cpu_lowering.lower_kernel(kg.kernels[0], kg)
    assert [lc.size for lc in k.locals] == [300, 300]      # float32 block sums, float64 totals
    reduced = [lp for lp in loops(k.body) if any(isinstance(st, Loop) for st in lp.body)]
    assert reduced, "the reduced axis runs outside the tile"
    np.testing.assert_allclose(fg.compile(lambda x: x.sum(0))(x).numpy(),
                               x.numpy().astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)


def test_large_full_sum_is_split_into_parallel_parts_and_an_ordered_combine():
    x = fg.randn(1 << 17)
    ks = lowered(lambda x: x.sum(), x)
    assert [k.name.rsplit("_", 1)[-1] for k in ks] == ["p0", "c0"]
    part, combine = ks
    assert any(p.value is cpu_lowering.SCRATCH for p in part.params)
    assert loops(combine.body) == []          # the parts are added in order, unrolled
    np.testing.assert_allclose(fg.compile(lambda x: x.sum())(x).item(),
                               x.numpy().astype(np.float64).sum(), rtol=1e-6)
