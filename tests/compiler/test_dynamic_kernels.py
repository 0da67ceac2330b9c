"""Kernels that read their sizes at run time: a program of symbolic sizes is fused and
lowered once, and serves every size without building kernels.

Each case compiles once with a symbolic dim (``mark_dynamic`` or ``dynamic=True``), runs at
sizes on both sides of the lowering's thresholds (sum blocks, column blocks, splits), and
compares with the program compiled for that size (``dynamic=False``) and with a float64
reference; the program's kernel count and build count stay constant."""

from __future__ import annotations

import numpy as np

import fusegrad as fg
from fusegrad import config as fg_config
from fusegrad.codegen.cpu_lowering import SUM_BLOCK

EPS32 = float(np.finfo(np.float32).eps)
F = fg.nn.functional


def _symbolic(fn, sizes, make, dims=(0,)):
    """Run ``fn`` compiled symbolic over ``dims`` of ``make(n)``'s first argument at each
    of ``sizes`` and compiled for each size; returns (pairs of results, the program)."""
    symbolic = fg.compile(fn)
    out, kernels = [], set()
    for n in sizes:
        args = make(n)
        for d in dims:
            fg.mark_dynamic(args[0], d)
        got = symbolic(*args)
        want = fg.compile(fn, dynamic=False)(*[fg.tensor(a.numpy()) for a in args])
        out.append((got.numpy(), want.numpy(), [a.numpy() for a in args]))
        program = symbolic.entries()[-1].program
        kernels.add(tuple(program.kernels()))
    assert symbolic.compiles == 1
    assert program.builds == 1 and program.fallback is None and len(kernels) == 1, \
        (program.builds, program.fallback, kernels)
    return out, program


def _randn(*shape, seed=0):
    rng = np.random.default_rng(seed + sum(shape))
    return fg.tensor(rng.standard_normal(shape).astype(np.float32))


def test_softmax_with_a_symbolic_batch_builds_once():
    out, program = _symbolic(lambda x: F.softmax(x, -1), [2, 3, 17, 64, 5],
                             lambda n: [_randn(n, 40)])
    for got, want, (x,) in out:
        ref = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
        ref /= ref.sum(-1, keepdims=True)
        np.testing.assert_allclose(got, ref, rtol=16 * EPS32, atol=1e-30)
        np.testing.assert_allclose(got, want, rtol=8 * EPS32, atol=0)
    assert "s0" in program.kernels()[0]


def test_rows_of_symbolic_length_are_summed_in_blocks():
    # Every length, below, at and above a sum block: one block while it fits, as the
    # kernel for a constant length sums them.
    sizes = [2, 7, SUM_BLOCK - 1, SUM_BLOCK, SUM_BLOCK + 1, 2 * SUM_BLOCK + 5]
    out, _ = _symbolic(lambda x: x.sum(-1) + x.amax(-1), sizes, lambda n: [_randn(3, n)],
                       dims=(1,))
    for got, want, (x,) in out:
        ref = x.astype(np.float64).sum(-1) + x.max(-1)
        n = x.shape[-1]
        np.testing.assert_allclose(got, ref, rtol=0, atol=(SUM_BLOCK + 4) * EPS32 *
                                   np.abs(x).sum(-1).max() / max(1, n // SUM_BLOCK + 1))
        np.testing.assert_allclose(got, want, rtol=0, atol=8 * EPS32 * np.abs(x).sum(-1).max())


def test_column_sums_over_a_symbolic_batch():
    # x.sum(0): the batch is the reduced axis, outside a tile of accumulators; blocks of
    # COLUMN_BLOCK rows at every length.
    sizes = [2, 63, 64, 65, 300]
    out, _ = _symbolic(lambda x: (x * 2).sum(0), sizes, lambda n: [_randn(n, 24)])
    for got, want, (x,) in out:
        ref = 2 * x.astype(np.float64).sum(0)
        scale = 2 * np.abs(x).sum(0)
        np.testing.assert_array_less(np.abs(got - ref), 66 * EPS32 * scale + 1e-30)
        np.testing.assert_array_equal(got, want)


def test_views_of_symbolic_sizes_read_through_strides():
    # A transpose, a broadcast and a slice of symbolic sizes, fused into one loop.
    def f(x, b):
        return x.t().t() * b + x[:, 1:].sum(-1, keepdim=True)
    out, _ = _symbolic(f, [2, 9, 130], lambda n: [_randn(n, 6), _randn(6)])
    for got, want, (x, b) in out:
        ref = x * b + x[:, 1:].astype(np.float64).sum(-1, keepdims=True)
        np.testing.assert_allclose(got, ref, rtol=8 * EPS32, atol=8 * EPS32)
        np.testing.assert_allclose(got, want, rtol=4 * EPS32, atol=4 * EPS32)


def test_a_full_reduction_split_at_the_traced_size_is_exact_at_every_size():
    # Traced at 70000 elements: split into parts (decided at that size); smaller sizes
    # leave parts empty, and every size still sums each element once.
    def f(x):
        return x.sum() + x.max()
    sizes = [70000, 2, 33, 5000, 140001]
    out, program = _symbolic(f, sizes, lambda n: [_randn(n)])
    for got, want, (x,) in out:
        ref = x.astype(np.float64).sum() + x.max()
        np.testing.assert_allclose(got, ref, rtol=0, atol=64 * EPS32 * np.abs(x).sum())
        np.testing.assert_allclose(got, want, rtol=0, atol=64 * EPS32 * np.abs(x).sum())


def test_static_programs_read_no_sizes():
    x = _randn(8, 40)
    static = fg.compile(lambda t: F.softmax(t, -1), dynamic=False).lower(x)
    symbolic = fg.compile(lambda t: F.softmax(t, -1), dynamic=True).lower(x)
    assert "s0" not in static.kernels[0] and "s0" in symbolic.kernels[0]
    # The symbolic kernel's table has one more buffer: the sizes.
    assert static.llvm_ir != symbolic.llvm_ir


def test_fallback_to_kernels_per_size_is_said(capsys, monkeypatch):
    # A kernel whose code needs a size's value (here, every elementwise one of symbolic
    # shape, by a stand-in lowering that asks for it): that program builds kernels per size,
    # and says why.
    from fusegrad.codegen import cpu_lowering
    from fusegrad.symint import SymbolicDecisionError, is_symbolic
    elementwise = cpu_lowering._CPULowering.elementwise

    def needs_sizes(low):
        if is_symbolic(low.k.shape):
            raise SymbolicDecisionError(f"{low.k.describe()} needs its sizes")
        elementwise(low)
    monkeypatch.setattr(cpu_lowering._CPULowering, "elementwise", needs_sizes)
    monkeypatch.setattr(fg_config.config, "debug", 1)
    f = fg.compile(lambda x: F.pad(x, (1, 2)).exp(), dynamic=True)
    for n in (3, 5, 3):
        x = _randn(2, n)
        np.testing.assert_allclose(f(x).numpy(), np.exp(np.pad(x.numpy(), ((0, 0), (1, 2)))),
                                   rtol=4 * EPS32)
    program = f.entries()[-1].program
    assert program.fallback is not None and "needs its sizes" in program.fallback
    assert program.builds == 2 and f.compiles == 1
    err = capsys.readouterr().err
    assert "kernels per size" in err and program.fallback in err


def test_a_padded_symbolic_axis_and_a_large_full_sum_build_once():
    out, _ = _symbolic(lambda x: F.pad(x, (1, 2)).exp().sum(-1), [3, 5, 40],
                       lambda n: [_randn(2, n)], dims=(1,))
    for got, want, (x,) in out:
        ref = np.exp(np.pad(x.astype(np.float64), ((0, 0), (1, 2)))).sum(-1)
        np.testing.assert_allclose(got, ref, rtol=16 * EPS32)
        np.testing.assert_allclose(got, want, rtol=8 * EPS32)
    # Split at the traced size (over 2**16 elements), the rows of symbolic length in blocks.
    out, _ = _symbolic(lambda x: x.sum(), [300, 250, 2], lambda n: [_randn(n, n + 1)],
                       dims=(0, 1))
    for got, want, (x,) in out:
        ref = x.astype(np.float64).sum()
        np.testing.assert_allclose(got, ref, rtol=0, atol=64 * EPS32 * np.abs(x).sum())
        np.testing.assert_allclose(got, want, rtol=0, atol=64 * EPS32 * np.abs(x).sum())


def test_products_of_symbolic_size_run_the_generated_gemm_where_it_fits(monkeypatch):
    # The GEMM reads its sizes from its parameters: set per call, and a call whose A is
    # over the GEMM's limit (7000 x 40 floats) runs numpy's BLAS instead.
    from fusegrad.runtime.cpu import SymbolicGemmStep
    monkeypatch.setattr(fg_config.config, "native_gemm", "on")

    def f(x, w):
        return (x @ w).relu().sum(-1)
    out, program = _symbolic(f, [3, 7000, 17, 2], lambda n: [_randn(n, 40), _randn(40, 24)])
    for got, want, (x, w) in out:
        ref = np.maximum(x.astype(np.float64) @ w, 0).sum(-1)
        bound = 64 * EPS32 * (np.abs(x) @ np.abs(w)).sum(-1)
        np.testing.assert_array_less(np.abs(got - ref), bound + 1e-30)
        np.testing.assert_array_less(np.abs(got - want), bound + 1e-30)
    steps = [s for s in program.runtime_sized.steps if isinstance(s, SymbolicGemmStep)]
    assert len(steps) == 1 and steps[0].fits        # the last call's 2 rows fit
