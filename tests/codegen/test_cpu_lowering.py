"""The CPU-shaped lowering, read as lowered kernel IR: which loops each kind of kernel gets,
and its numbers in the kernel IR's reference interpreter.

Every compiled program runs the lowering through the LLVM printer; the interpreter runs the
same lowered kernels without LLVM, so a disagreement between the two is the printer's (or
LLVM's), and an agreement with eager is the lowering's.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.codegen import cpu_lowering, cpu_plans, interpret
from fusegrad.codegen.kernel_ir import Loop, format_kernel
from fusegrad.passes.fusion import fuse
from fusegrad.passes.manager import PassManager
from fusegrad.runtime import jit
from fusegrad.runtime.cpu import GemmStep, LaunchStep, Program
from fusegrad.tracer.compile import DEFAULT_PIPELINE
from tests.codegen.gpu_zoo import ZOO
from tests.codegen.test_gpu_lowering import as_float, kernel_graph, tolerance


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
    (k,) = lowered(lambda x, c: (x * c).exp(), fg.ones(30, 40), fg.ones(30, 1))
    text = format_kernel(k)
    outer, inner = loops(k.body)
    assert outer.start.op == "special" and outer.start.arg == "start" and outer.stop.arg == "end"
    # rows of 8 to 64 stay a rolled loop, which LLVM vectorizes
    assert inner.stop.arg == 40 and not inner.unroll
    assert "exp.f32" in text and text.count("p2[") == 1


@pytest.mark.parametrize("shapes, extents", [
    (((30, 40), (30, 40)), [1200]),                 # contiguous: one loop
    (((500, 10, 3), (3,)), [5000, 3]),              # broadcast over the leading axes
    (((8, 6, 28, 28), (6, 1, 1)), [8, 6, 784]),     # a conv bias: the image is one row
    (((4, 5, 6), (4, 1, 6)), [4, 5, 6]),            # broadcast in the middle: no merge
])
def test_axes_that_every_buffer_steps_over_as_one_block_loop_as_one(shapes, extents):
    args = [fg.randn(*sh) for sh in shapes]

    def f(a, b):
        return (a * b).exp() + 1
    (k,) = lowered(f, *args)
    assert [lp.stop.arg if lp.stop.op == "const" else "end" for lp in loops(k.body)] == \
        ["end"] + extents[1:]
    kg = fuse(PassManager(DEFAULT_PIPELINE).run(fg.trace(f, *args)))
    assert cpu_lowering.parallel_extent(kg.kernels[0], kg) == extents[0]
    assert "div" not in format_kernel(k) and "rem" not in format_kernel(k)
    np.testing.assert_allclose(fg.compile(f)(*args).numpy(), f(*args).numpy(), rtol=2e-6)


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


def test_concat_along_an_outer_axis_loads_one_operand_per_range():
    # im2col's stack of strided slices: each operand's range of the stacked axis (one
    # index) gets a copy of the loops inside it, whose body loads that operand alone (over
    # the whole axis every element loaded all 9 and selected one).
    from fusegrad.ops.windows import windows_by_slices
    x = fg.randn(2, 3, 10, 10)

    def f(x):
        return windows_by_slices(x, (3, 3), (2, 2), (1, 1), (4, 4))
    (k,) = lowered(f, x)
    text = format_kernel(k)
    assert text.count("p0[") == 9 and "select" not in text, text
    assert len([lp for lp in loops(k.body) if not lp.body or not isinstance(lp.body[0], Loop)]) == 9
    want = np.stack([x.numpy()[:, :, a:a + 7:2, b:b + 7:2] for a in range(3) for b in range(3)], 2)
    np.testing.assert_array_equal(fg.compile(f)(x).numpy(), want)


def test_reductions_that_do_not_read_each_other_share_one_loop():
    # A batch norm's forward and backward in one kernel: the mean; the variance (reads the
    # mean) beside the backward's sums that read only the mean; then the ones that read the
    # variance. Three loops over each channel instead of six, with the values of eager.
    from fusegrad.codegen.values import reductions
    F = fg.nn.functional
    x, w, b, g = fg.randn(4, 3, 5, 6), fg.randn(3), fg.randn(3), fg.randn(4, 3, 5, 6)

    def bn_grad(x, w, b, g):
        def loss(x, w, b):
            return (F.batch_norm(x, None, None, w, b, training=True) * g).sum()
        return fg.grad(loss, argnums=(0, 1, 2))(x, w, b)
    kg = fuse(PassManager(DEFAULT_PIPELINE).run(fg.trace(bn_grad, x, w, b, g)))
    (k,) = [k for k in kg.kernels if len(reductions(k)) > 1]
    assert [len(r) for r in cpu_lowering.reduction_rounds(k, reductions(k))] == [1, 2, 3]
    want = [v.numpy().astype(np.float64) for v in bn_grad(x, w, b, g)]
    for got, ref in zip(fg.compile(bn_grad)(x, w, b, g), want):
        # sums of 120 terms of size ~1: float32 rounding, not a tuned bound
        np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=120 * 4 * np.finfo(np.float32).eps)


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


@pytest.mark.parametrize("shape,op,units", [((5, 1024), "sum", 4), ((5, 1024), "amax", 4),
                                            ((5, 3, 768), "sum", 9), ((5, 3, 768), "amin", 9)])
def test_column_chunks_a_thread_holds_run_as_one_tile_with_the_same_bits(shape, op, units,
                                                                        monkeypatch):
    # The columns are cut into chunks of 256 for the thread pool; the chunks of one row that
    # a thread's range of units holds run as one tile (ranges of the (5, 3, 768) reductions
    # cross its rows of 3 chunks). Every split of the units over threads gives every column
    # the same bits as one thread, and the 2-D sum the same as the interpreter (which is
    # slow: few rows, in blocks of 4 so that the blocked float sums run).
    monkeypatch.setattr(cpu_lowering, "COLUMN_BLOCK", 4)
    x = fg.randn(*shape)
    kg = fuse(PassManager(DEFAULT_PIPELINE).run(fg.trace(lambda v: getattr(v, op)(0), x)))
    plan = cpu_lowering.column_plan(kg.kernels[0])
    assert plan.chunk == 256 and plan.units == units
    prog = Program(kg)
    (step,) = [s for s in prog.steps if isinstance(s, LaunchStep)]
    got = prog(x._data)[0]
    numpy_op = {"sum": np.sum, "amax": np.max, "amin": np.min}[op]
    np.testing.assert_allclose(got, numpy_op(x.numpy().astype(np.float64), 0), rtol=1e-5,
                               atol=1e-5)
    ref = got.copy()
    for threads in (2, 3, 4, units):
        got[...] = np.nan
        step.run_split(threads)
        np.testing.assert_array_equal(got, ref)
    if op == "sum" and len(shape) == 2:
        np.testing.assert_array_equal(interpreted_program(kg)(x._data)[0], ref)


def test_large_full_sum_is_split_into_parallel_parts_and_an_ordered_combine():
    x = fg.randn(1 << 17)
    ks = lowered(lambda x: x.sum(), x)
    assert [k.name.rsplit("_", 1)[-1] for k in ks] == ["p0", "c0"]
    part, combine = ks
    assert any(p.value is cpu_lowering.SCRATCH for p in part.params)
    assert loops(combine.body) == []          # the parts are added in order, unrolled
    np.testing.assert_allclose(fg.compile(lambda x: x.sum())(x).item(),
                               x.numpy().astype(np.float64).sum(), rtol=1e-6)


# -- the CPU lowering run by the reference interpreter, against eager and the LLVM code


class _Interpreted:
    """A program step that runs one function of a kernel's CPU lowering in the kernel IR's
    interpreter instead of its LLVM code."""

    def __init__(self, step, lk, scratch_slot):
        self.step, self.lk, self.scratch_slot = step, lk, scratch_slot

    def run(self, prog) -> None:
        buffers = []
        for p in self.lk.params:
            slot = self.scratch_slot if p.value is cpu_lowering.SCRATCH else prog.slots[p.value]
            arr = prog.arrays[slot]
            buffers.append(arr.reshape(-1).view(interpret.numpy_dtype(p.dtype)))
        interpret.run_kernel(self.lk, buffers, extent=self.step.extent)


def interpreted_program(kg):
    prog = Program(kg)
    steps, lowered = [], {}
    for st in prog.steps:
        if isinstance(st, LaunchStep) and not isinstance(st, GemmStep):
            i = kg.kernels.index(st.kernel)
            if i not in lowered:
                lowered[i] = iter(cpu_lowering.lower_kernel(st.kernel, kg))
            st = _Interpreted(st, next(lowered[i]), prog.scratch_slots.get(i))
        steps.append(st)
    prog.steps = steps
    return prog


# the interpreter runs elementwise_vec4_mixed element by element for 7 s: heavy, and the same
# on every machine
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow)
                                  if n == "elementwise_vec4_mixed" else n for n in sorted(ZOO)])
def test_zoo_matches_eager_in_the_interpreter(name, monkeypatch):
    # Small blocks, so that the blocked sums run on the zoo's small shapes too.
    monkeypatch.setattr(cpu_lowering, "SUM_BLOCK", 16)
    monkeypatch.setattr(cpu_lowering, "COLUMN_BLOCK", 4)
    fn, args = ZOO[name]
    kg = kernel_graph(fn, args)
    eager = fn(*args)
    eager = list(eager) if isinstance(eager, tuple) else [eager]
    prog = interpreted_program(kg)
    assert any(isinstance(st, _Interpreted) for st in prog.steps) or \
        all(k.kind in ("extern", "matmul") for k in kg.kernels)
    got = prog(*[a._data for a in args])
    llvm = Program(kg)(*[a._data for a in args])
    assert len(got) == len(eager)
    for g, c, e in zip(got, llvm, eager):
        ref = e._data
        assert g.shape == ref.shape and g.dtype == ref.dtype, (g.dtype, ref.dtype)
        np.testing.assert_allclose(as_float(g), as_float(ref), **tolerance(ref.dtype))
        np.testing.assert_allclose(as_float(c), as_float(g), **tolerance(ref.dtype))


def test_split_reductions_match_in_the_interpreter(monkeypatch):
    monkeypatch.setattr(cpu_plans, "SPLIT_WORK", 64)
    monkeypatch.setattr(cpu_lowering, "SUM_BLOCK", 8)
    rng = np.random.default_rng(3)
    x = fg.tensor(rng.standard_normal((6, 5, 7)).astype(np.float32))
    d = fg.tensor(rng.standard_normal((9, 11)))                     # float64: compensated

    def f(x, d):
        return (x.sum(), (x - x.mean()) * 2, x.amax(), (x > 0).any(), d.sum(), x.int().sum())
    kg = kernel_graph(f, [x, d])
    assert any(cpu_lowering.split_plan(k) for k in kg.kernels)
    got = interpreted_program(kg)(x._data, d._data)
    for g, e in zip(got, f(x, d)):
        np.testing.assert_allclose(as_float(g), as_float(e._data), **tolerance(e._data.dtype))


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (3, 1, 1), (4, 1, 5)])
def test_column_kernel_reads_each_tiles_own_accumulators(shape):
    # logsumexp over dim 0 keeps the max in a tile of accumulators and stores exp(x - max)
    # for the backward after the sums: a value of the max at constant coordinates (size-1
    # dims) was reused from the reduction's loop, whose index does not reach the stores
    # (LLVM: "Instruction does not dominate all uses").
    x = fg.randn(*shape).requires_grad_()
    fg.compile(lambda v: v.logsumexp(dim=0).sum())(x).backward()
    ref = x.detach().clone().requires_grad_()
    ref.logsumexp(dim=0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), ref.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_loop_plans_depend_only_on_what_the_kernel_cache_keys_on():
    # Kernels are cached by description, which leaves out a matmul's operands (BLAS reads
    # them): the epilogue's loops must not depend on them either. They did, and a cached
    # epilogue compiled for one grouping ran with another's extent, writing out of bounds
    # (a heap corruption in an AdamW training step).
    from fusegrad.runtime.cpu import kernel_description
    a, b, c = fg.randn(16, 5), fg.randn(5, 5), fg.randn(16, 5)
    found = []
    for f, args in [(lambda a, b, c: (a @ b) * c, (a, b, c)),
                    (lambda a, bt, c: (a @ bt.t()) * c, (a, b.t().contiguous(), c))]:
        kg = fuse(PassManager(DEFAULT_PIPELINE).run(fg.trace(f, *args)))
        (k,) = [k for k in kg.kernels if k.kind == "matmul"]
        found.append((kernel_description(k, kg, 3)[0], cpu_lowering.loop_plan(k, kg),
                      cpu_lowering.parallel_extent(k, kg)))
    assert found[0] == found[1]


@pytest.mark.parametrize("shape, perm", [((7, 10), (1, 0)), ((3, 9, 6), (0, 2, 1)),
                                         ((2, 3, 7, 5), (0, 1, 3, 2))])
def test_transposing_kernels_loop_in_tiles(shape, perm, monkeypatch):
    # Small tiles on small shapes: edge tiles, a leading loop, and the kernel cache keyed on
    # the tile size (its code and its launch extent change with it).
    monkeypatch.setattr(cpu_plans, "TILE", 4)
    monkeypatch.setattr(cpu_plans, "TILE_WORK", 1)
    monkeypatch.setattr(cpu_plans, "TILE_STRIDE", 2)
    x = fg.randn(*shape)
    b = fg.randn(shape[perm[-1]])

    def f(x, b):
        return x.permute(*perm) * 2 + b
    kg = kernel_graph(f, [x, b])
    (k,) = [k for k in kg.kernels if k.kind == "elementwise"]
    assert cpu_lowering.loop_plan(k, kg).tiled
    (lk,) = cpu_lowering.lower_kernel(k, kg)
    names = [lp.var.name.rstrip("0123456789") for lp in loops(lk.body)]
    assert names[-4:] == ["ti", "tj", "i", "j"]
    want = f(x, b).numpy()
    np.testing.assert_allclose(interpreted_program(kg)(x._data, b._data)[0], want, rtol=1e-6)
    np.testing.assert_allclose(fg.compile(f)(x, b).numpy(), want, rtol=1e-6)


def test_kernel_cache_keys_on_the_lowerings_constants(monkeypatch):
    # Code made with other tiles or blocks loops (and launches) differently.
    before = jit.kernel_key("elementwise [4, 4]")
    monkeypatch.setattr(cpu_plans, "TILE", 8)
    assert jit.kernel_key("elementwise [4, 4]") != before
