"""The GPU reductions: values on the simulated driver against numpy on shapes that take every
path, the structure of the CUDA C they print, and (slow) machine code without spills.

- ``grid_reduce`` (a full reduction of at least ``GRID_REDUCE_MIN`` elements): many blocks,
  16-byte loads into 4 accumulators where the innermost axis holds whole groups of 4 (the
  scalar loop otherwise, or where a buffer is misaligned), a partial per block in a grid-scope
  array and the last block combining them;
- ``col_reduce`` (the innermost axis kept): a block per tile of 32 columns, partial sums in
  shared memory;
- ``row_reduce`` (a smaller full reduction, or rows): a block per row.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.codegen.cuda.printer import cuda_source
from fusegrad.codegen.gpu_lowering import GRID_REDUCE_MIN
from fusegrad.runtime import cuda as rt
from fusegrad.testing import nvcc
from fusegrad.testing.simulated_cuda import SimulatedDriver

EPS32 = float(np.finfo(np.float32).eps)


def run(fn, *arrays, max_grid: int = 4):
    """``fn`` compiled for CUDA and run on the simulated driver: its results and kernels."""
    drv = SimulatedDriver(max_grid=max_grid)
    rt.set_driver(drv)
    try:
        out = fg.compile(fn, backend="cuda")(*[fg.from_numpy(a) for a in arrays])
    finally:
        rt.set_driver(None)
    outs = out if isinstance(out, tuple) else (out,)
    return [o.numpy() for o in outs], drv.kernels


def close_to_sum(got, a: np.ndarray, axis=None) -> None:
    """Within the rounding of a float32 sum of ``a``'s terms in any order."""
    want = a.astype(np.float64).sum(axis)
    n = a.size if axis is None else a.shape[axis]
    bound = n * EPS32 * np.abs(a).astype(np.float64).sum(axis)
    assert np.all(np.abs(got - want) <= bound), (got, want)


def families(kernels) -> list[str]:
    return [k.family for k in kernels]


RNG = np.random.default_rng(0)


@pytest.mark.parametrize("shape", [(GRID_REDUCE_MIN,), (GRID_REDUCE_MIN + 3,), (257, 129),
                                   (64, 1024), (8, 4, 1032)])
@pytest.mark.parametrize("max_grid", [1, 4])
def test_full_sums_over_many_blocks_match_numpy(shape, max_grid):
    a = RNG.standard_normal(shape).astype(np.float32)
    (got,), kernels = run(lambda x: x.sum(), a, max_grid=max_grid)
    assert families(kernels) == ["grid_reduce"]
    close_to_sum(got, a)


def test_a_full_reduction_is_the_same_bits_from_run_to_run():
    a = RNG.standard_normal(GRID_REDUCE_MIN * 2).astype(np.float32)
    first = run(lambda x: x.sum(), a)[0][0]
    assert first.tobytes() == run(lambda x: x.sum(), a)[0][0].tobytes()


def test_full_max_mean_and_integer_sum_over_many_blocks():
    a = RNG.standard_normal(GRID_REDUCE_MIN + 4).astype(np.float32)
    a[12345] = 40.0
    (mx, mean), _ = run(lambda x: (x.amax(), x.mean()), a)
    assert mx == 40.0
    assert abs(mean - a.astype(np.float64).mean()) <= a.size * EPS32 * np.abs(a).mean()
    ints = RNG.integers(-1000, 1000, GRID_REDUCE_MIN).astype(np.int32)
    (got,), kernels = run(lambda x: x.sum(), ints)
    assert got == ints.astype(np.int64).sum() and families(kernels) == ["grid_reduce"]


def test_a_misaligned_view_takes_the_scalar_loop():
    a = RNG.standard_normal(GRID_REDUCE_MIN + 8).astype(np.float32)
    (got,), kernels = run(lambda x: x[1:-7].sum(), a)
    close_to_sum(got, a[1:-7])


def test_small_full_reductions_keep_one_block():
    a = RNG.standard_normal(1000).astype(np.float32)
    (got,), kernels = run(lambda x: x.sum(), a)
    assert families(kernels) == ["row_reduce"]
    close_to_sum(got, a)


@pytest.mark.parametrize("shape,axis", [((1000, 3), 0), ((7, 100), 0), ((5, 6, 70), 1),
                                        ((300, 65), 0), ((1, 33), 0)])
def test_sums_keeping_the_innermost_axis_match_numpy(shape, axis):
    a = RNG.standard_normal(shape).astype(np.float32)
    (got,), kernels = run(lambda x: x.sum(axis), a)
    assert families(kernels) == ["col_reduce"]
    close_to_sum(got, a, axis)


def test_a_softmax_over_an_outer_axis_stores_every_element():
    a = RNG.standard_normal((40, 70)).astype(np.float32)
    (got,), kernels = run(lambda x: F.softmax(x, 0), a)
    assert families(kernels) == ["col_reduce"]
    e = np.exp(a.astype(np.float64) - a.max(0))
    np.testing.assert_allclose(got, e / e.sum(0), rtol=64 * EPS32, atol=1e-7)


def test_integer_and_max_reductions_over_an_outer_axis_are_exact():
    a = RNG.integers(-50, 50, (33, 40)).astype(np.int32)
    (s, m), _ = run(lambda x: (x.sum(0), x.amax(0)), a)
    np.testing.assert_array_equal(s, a.sum(0))
    np.testing.assert_array_equal(m, a.max(0))


def source_of(fn, *arrays) -> str:
    return cuda_source(run(fn, *arrays)[1])


def test_grid_reduce_source_reads_float4_and_meets_in_the_last_block():
    src = source_of(lambda x: x.sum(), np.ones(GRID_REDUCE_MIN * 2, np.float32))
    # CHECK: a grid-scope array of partials and a block counter, 16-byte loads into 4
    # accumulators, a fence before the count, uncached reads of the partials; no float atomic.
    assert "__device__ float k0_grid_reduce_sum_partials" in src
    assert "__device__ unsigned int k0_grid_reduce_sum_count" in src
    assert "reinterpret_cast<const float4*>(p0)" in src
    assert src.index("__threadfence();") < src.index("atomicAdd(&k0_grid_reduce_sum_count")
    assert "__ldcg(k0_grid_reduce_sum_partials" in src
    assert src.count("atomicAdd(") == 1
    assert src.count("float acc") >= 4


def test_col_reduce_source_tiles_columns_with_partials_in_shared_memory():
    src = source_of(lambda x: x.sum(0), np.ones((100, 70), np.float32))
    # CHECK: the 8 rows of threads step 8 reduced elements at a time; partials in shared memory.
    assert "__shared__ float part" in src
    assert "+= 8u)" in src
    assert "__syncthreads();" in src


@pytest.mark.slow
@pytest.mark.skipif(nvcc.find_nvcc() is None, reason="nvcc is not installed")
def test_reduction_kernels_compile_to_cubin_without_spills():
    kernels = []
    big = RNG.standard_normal(GRID_REDUCE_MIN * 2).astype(np.float32)
    for fn, a in [(lambda x: x.sum(), big), (lambda x: x.amax(), big),
                  (lambda x: x.double().sum(), big), (lambda x: x.sum(0), big.reshape(-1, 64)),
                  (lambda x: F.softmax(x, 0), big.reshape(-1, 64)),
                  (lambda x: x.sum(), big.astype(np.float16))]:
        kernels += run(fn, a)[1]
    report = nvcc.compile_kernels(nvcc.named_apart(kernels))
    assert not report.errors, report.errors
    assert not report.spilled(), report.spilled()


def test_row_values_are_computed_before_the_loop_that_stores_the_row():
    # CHECK: layer_norm's 1/sqrt(var + eps) is named before the loop over the row's elements
    # (once per row; a double division's slow-path call inside the loop made ptxas spill).
    a = RNG.standard_normal((6, 3, 2)).astype(np.float64)
    src = source_of(lambda x: F.layer_norm(x, (3, 2)), a)
    body = src[src.index("extern"):]
    last_loop = body.rindex("for (")
    assert "sqrt(" in body[:last_loop] and "sqrt(" not in body[last_loop:]
