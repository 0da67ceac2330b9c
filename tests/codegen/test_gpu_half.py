"""16-bit floats on the GPU convert through the hardware's instructions (``cvt``, as
cuda_fp16.h's ``__half2float``/``__float2half_rn`` and cuda_bf16.h's ``__float2bfloat16_rn``
write them), with the values of the CPU's integer code: round to nearest even, ties,
subnormals, overflow to infinity, NaN stays NaN."""

from __future__ import annotations

import subprocess

import ml_dtypes
import numpy as np
import pytest

import fusegrad as fg
from fusegrad.codegen.cuda.printer import cuda_source
from fusegrad.runtime import cuda as rt
from fusegrad.testing import nvcc
from fusegrad.testing.simulated_cuda import SimulatedDriver

# Ties at both widths, the smallest subnormals, the largest finite values and past them.
EDGES = np.array([0.0, -0.0, 1.0, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8,
                  1.0 + 3 * 2.0 ** -8, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25, 65504.0, 65520.0,
                  -65536.0, 3.3895e38, np.inf, -np.inf, np.nan, 1e-45, -7.25],
                 dtype=np.float32)


def run(fn, *arrays):
    drv = SimulatedDriver()
    rt.set_driver(drv)
    try:
        out = fg.compile(fn, backend="cuda")(*[fg.from_numpy(a) for a in arrays])
    finally:
        rt.set_driver(None)
    return out, drv.kernels


@pytest.mark.parametrize("name,npdt", [("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)])
def test_conversions_round_as_numpy(name, npdt):
    dt = getattr(fg, name)
    out, kernels = run(lambda x: (x.to(dt), (x.to(dt).float() * 3).to(dt)), EDGES)
    with np.errstate(over="ignore"):
        want = EDGES.astype(npdt)
        again = (want.astype(np.float32) * 3).astype(npdt).astype(np.float32)
    got = out[0].float().numpy()
    np.testing.assert_array_equal(got, want.astype(np.float32))
    assert np.array_equal(np.signbit(got), np.signbit(want.astype(np.float32)))
    np.testing.assert_array_equal(out[1].float().numpy(), again)
    src = cuda_source(kernels)
    cvt = "cvt.rn.f16.f32" if name == "float16" else "cvt.rn.bf16.f32"
    assert cvt in src and "#include" not in src
    assert "0x7FFF" not in src and "32767" not in src      # no hand-written rounding


@pytest.mark.slow
@pytest.mark.skipif(nvcc.find_nvcc() is None, reason="nvcc is not installed")
def test_half_kernels_compile_to_cubin_without_spills():
    _, k16 = run(lambda x: (x.to(fg.float16).exp() * 2, x.to(fg.bfloat16).sum()), EDGES)
    report = nvcc.compile_kernels(nvcc.named_apart(k16))
    assert not report.errors, report.errors
    assert not report.spilled()


@pytest.mark.parametrize("name,npdt", [("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)])
def test_elementwise_kernels_move_four_16_bit_floats_at_once(name, npdt):
    # 8192 elements: the vector loop, with 8-byte loads and stores (ushort4) where every
    # vector buffer is 8-byte aligned (else the scalar loop runs, as for 4-byte elements).
    rng = np.random.default_rng(0)
    x = rng.standard_normal(8192).astype(npdt)
    y = rng.standard_normal(8192).astype(npdt)
    dt = getattr(fg, name)
    out, kernels = run(lambda a, b: ((a * 2 + b).exp(), (a - b).to(dt)), x, y)
    (k,) = kernels
    source = cuda_source([k])
    assert source.count("__ldg(reinterpret_cast<const ushort4*>") == 2
    assert source.count("reinterpret_cast<ushort4*>") == 2           # both outputs
    # numpy's 16-bit arithmetic rounds each op's result, as the kernel does.
    with np.errstate(over="ignore"):
        want = (np.exp(x * npdt(2) + y), x - y)
    for got, w in zip(out, want):
        np.testing.assert_array_equal(got.float().numpy(), w.astype(np.float32))


@pytest.mark.slow
@pytest.mark.skipif(nvcc.find_nvcc() is None, reason="nvcc is not installed")
def test_16_bit_vector_loads_are_one_instruction_each(tmp_path):
    x = np.ones(8192, np.float16)
    _, kernels = run(lambda a, b: (a * 2 + b).exp(), x, x)
    src = tmp_path / "k.cu"
    src.write_text(cuda_source(kernels))
    subprocess.run([nvcc.find_nvcc(), "-arch=sm_90", "-ptx", str(src), "-o", str(tmp_path / "k.ptx"),
                    "-Werror", "all-warnings"], check=True, capture_output=True)
    ops = [line.split()[0] for line in (tmp_path / "k.ptx").read_text().splitlines()
           if "ld.global" in line or "st.global" in line]
    # Two 8-byte loads and one 8-byte store in the vector loop (the scalar loop's u16 beside).
    assert ops.count("ld.global.nc.v4.u16") == 2 and ops.count("st.global.v4.u16") == 1, ops
