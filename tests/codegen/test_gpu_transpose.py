"""Elementwise kernels that read an input with its two innermost axes swapped go through
32x32 tiles in shared memory (32x33: the pad keeps a column's reads off one bank): read
along the input's unit stride, written along the output's. Values on the simulated driver
are eager's exactly (the arithmetic is the same, only where elements pass differs)."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.codegen.cuda.printer import cuda_source
from fusegrad.runtime import cuda as rt
from fusegrad.testing import nvcc
from fusegrad.testing.simulated_cuda import SimulatedDriver

RNG = np.random.default_rng(0)


def run(fn, *arrays, max_grid: int = 4):
    drv = SimulatedDriver(max_grid=max_grid)
    rt.set_driver(drv)
    try:
        out = fg.compile(fn, backend="cuda")(*[fg.from_numpy(a) for a in arrays])
    finally:
        rt.set_driver(None)
    return out, drv.kernels


CASES = {
    "t_tails": ((100, 70), lambda x: x.t() * 2 + 1),
    "batched_exp_plus": ((3, 64, 96), lambda x: x.transpose(1, 2).exp() + x.transpose(1, 2)),
    "with_broadcast": ((2, 33, 130), lambda x: x.mT * x[0, :, 0] - x[1, 0, :, None]),
    "float16": ((40, 200), lambda x: (x.half().t() * 3).float()),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("max_grid", [1, 4])
def test_transposes_match_eager(name, max_grid):
    shape, fn = CASES[name]
    a = RNG.standard_normal(shape).astype(np.float32)
    out, kernels = run(fn, a, max_grid=max_grid)
    want = fn(fg.from_numpy(a))
    np.testing.assert_array_equal(out.numpy(), want.numpy())
    assert any(s.name.startswith("tile") for k in kernels for s in k.shared)


def test_transpose_source_stages_a_padded_tile():
    _, kernels = run(lambda x: x.t() + 1, RNG.standard_normal((128, 64)).astype(np.float32))
    src = cuda_source(kernels)
    # CHECK: one 32x33 tile, written then read back after a barrier.
    assert "__shared__ float tile" in src and "[1056];" in src
    assert src.index("tile1[") < src.index("__syncthreads();")


def test_small_or_unswapped_views_keep_the_plain_loop():
    for shape, fn in [((20, 30), lambda x: x.t() + 1), ((64, 128), lambda x: x[:, ::2] + 1)]:
        _, kernels = run(fn, RNG.standard_normal(shape).astype(np.float32))
        assert not any(k.shared for k in kernels)


@pytest.mark.slow
@pytest.mark.skipif(nvcc.find_nvcc() is None, reason="nvcc is not installed")
def test_transpose_kernels_compile_to_cubin_without_spills():
    kernels = []
    for shape, fn in CASES.values():
        kernels += run(fn, RNG.standard_normal(shape).astype(np.float32))[1]
    report = nvcc.compile_kernels(nvcc.named_apart(kernels))
    assert not report.errors, report.errors
    assert not report.spilled()
