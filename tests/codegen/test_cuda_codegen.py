"""CUDA C for every kernel of the zoo compiles with nvcc (``-arch=sm_90 -ptx``) and with NVRTC
with no error and no warning. Each is skipped when its compiler is absent (nvcc from a CUDA
toolkit; NVRTC from the nvidia-cuda-nvrtc wheel, or FUSEGRAD_NVRTC naming libnvrtc)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from fusegrad.codegen.cuda.printer import cuda_source
from fusegrad.codegen.gpu_lowering import lower_kernel
from fusegrad.ops.lowering import Unsupported
from fusegrad.runtime import cuda as rt
from tests.codegen.gpu_zoo import ZOO, mlp_args, mlp_loss
from tests.codegen.test_gpu_lowering import kernel_graph


def zoo_kernels():
    out = []
    for name, (fn, args) in sorted(ZOO.items()) + [("mlp", (mlp_loss, mlp_args()))]:
        kg = kernel_graph(fn, args)
        for k in kg.kernels:
            try:
                lk = lower_kernel(k, kg)
            except Unsupported:
                assert k.kind == "extern", k.describe()
                continue
            lk.name = f"{name}_{lk.name}"
            out.append(lk)
            # The same kernel with 64-bit indices (what buffers of 2**31 elements get).
            wide = lower_kernel(k, kg)
            wide.name, wide.index_bits = f"{lk.name}_i64", 64
            out.append(wide)
    return out


@pytest.fixture(scope="module")
def source():
    kernels = zoo_kernels()
    assert len(kernels) > 40
    return cuda_source(kernels)


def test_source_is_readable_cuda(source):
    entries = re.findall(r'extern "C" __global__ void __launch_bounds__\(\d+, \d+\) (\w+)\(', source)
    assert len(entries) == len(set(entries)) > 40
    assert any("_row_reduce_" in e and "exp" in e for e in entries)
    assert "__shfl_xor_sync(0xffffffffu" in source and "__syncthreads();" in source
    assert "#include" not in source          # NVRTC needs no header
    assert "unsigned long long row" in source and "unsigned int row" in source


def test_float_arithmetic_rounds_each_op(source):
    # Plain float operators would let nvcc fuse a*b + c into one FMA, which the CPU kernels and
    # eager never do (x*x - max(x*x) must be 0): every float op is a rounding intrinsic.
    from fusegrad import dtypes
    from fusegrad.codegen.cuda.printer import _Printer
    printer = object.__new__(_Printer)          # binary() reads no kernel state
    for dt, suffix in ((dtypes.float32, "f"), (dtypes.float64, "d")):
        for op in ("add", "sub", "mul", "div"):
            assert printer.binary(op, "a", "b", dt) == f"__{suffix}{op}_rn(a, b)"
    assert "__fmul_rn(" in source and "__fadd_rn(" in source


NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if shutil.os.path.exists(
    "/usr/local/cuda/bin/nvcc") else None)


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_every_zoo_kernel_compiles_with_nvcc_without_warnings(source, tmp_path):
    src = tmp_path / "zoo.cu"
    src.write_text(source)
    run = subprocess.run([NVCC, "-arch=sm_90", "-ptx", str(src), "-o", str(tmp_path / "zoo.ptx"),
                          "-Werror", "all-warnings"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stderr.strip() == "", run.stderr[-4000:]
    ptx = (tmp_path / "zoo.ptx").read_text()
    assert ptx.count(".entry") == source.count("__global__")


@pytest.mark.skipif(rt.find_nvrtc() is None, reason="NVRTC (nvidia-cuda-nvrtc) is not installed")
def test_every_zoo_kernel_compiles_with_nvrtc_without_warnings(source):
    ptx, log = rt._nvrtc_compile(source, "compute_90", "zoo.cu")
    assert log == "", log
    assert ptx.count(b".entry") == source.count("__global__")
