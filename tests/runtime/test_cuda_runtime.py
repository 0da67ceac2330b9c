"""The CUDA runtime without a GPU: what it does when no CUDA package is installed, its caches
and allocator, and its driver layer against fake driver modules."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.passes.fusion import fuse
from fusegrad.runtime import cuda as rt
from fusegrad.runtime import cuda_compile
from fusegrad.testing.simulated_cuda import SimulatedDriver
from tests.runtime.conftest import no_modules_after


@pytest.fixture
def no_cuda_packages(monkeypatch):
    # None in sys.modules makes ``import cuda.bindings`` / ``import pycuda`` fail.
    for name in ("cuda", "cuda.bindings", "pycuda", "pycuda.driver"):
        monkeypatch.setitem(sys.modules, name, None)
    rt.set_driver(None)
    yield
    rt.set_driver(None)


def test_without_cuda_packages_the_error_says_what_to_install(no_cuda_packages):
    with pytest.raises(rt.CudaUnavailable) as info:
        rt.driver()
    message = str(info.value)
    assert "cuda-python: not installed" in message and "pycuda: not installed" in message
    assert "pip install 'fusegrad[cuda]'" in message
    assert not fg.cuda.is_available() and fg.cuda.device_count() == 0
    fg.cuda.synchronize()                   # nothing launched: nothing to wait for
    with pytest.raises(RuntimeError, match="fusegrad\\[cuda\\]"):
        fg.zeros(2, device="cuda")


@pytest.mark.slow
def test_importing_and_compiling_for_the_cpu_touches_no_driver():
    no_modules_after("import fusegrad as fg\n"
                     "f = fg.compile(lambda x: x.exp() * 2)\n"
                     "f(fg.ones(8))\n", ("cuda.bindings", "pycuda", "cupy"))


def test_program_calls_reuse_device_memory():
    g = fg.trace(lambda x, y: ((x * y).sum(1, keepdim=True) + x).tanh(), fg.randn(8, 5),
                 fg.randn(8, 5))
    drv = SimulatedDriver()
    prog = rt.CudaProgram(fuse(g), drv)
    x, y = np.ones((8, 5), np.float32), np.full((8, 5), 0.5, np.float32)
    out = prog(x, y)[0].to_host()
    np.testing.assert_allclose(out, np.tanh(2.5 + 1), rtol=1e-6)
    del out
    first = drv.mallocs
    prog(x, y)
    assert drv.mallocs == first             # every buffer came back from the cache
    assert [name for name, _, _ in drv.launches][:1] == [prog.lowered[0].name]


def test_extern_kernels_run_on_the_host():
    g = fg.trace(lambda x: x.argsort(-1).to(fg.float32) + x, fg.randn(3, 4))
    prog = rt.CudaProgram(fuse(g), SimulatedDriver())
    assert prog.host_steps
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(prog(x)[0].to_host(), np.argsort(x, -1) + x, rtol=1e-6)


def test_compiled_ptx_is_cached_on_disk_by_source_arch_and_compiler(monkeypatch, tmp_path):
    calls = []

    def fake_nvcc(source, arch, name):
        calls.append(arch)
        return f"// ptx for {arch}\n".encode(), ""
    monkeypatch.setattr(cuda_compile, "_nvcc_compile", fake_nvcc)
    src = 'extern "C" __global__ void k() {}\n'
    a = rt.compile_cuda(src, "compute_90", compiler="nvcc", cache_dir=str(tmp_path))
    b = rt.compile_cuda(src, "compute_90", compiler="nvcc", cache_dir=str(tmp_path))
    c = rt.compile_cuda(src, "compute_80", compiler="nvcc", cache_dir=str(tmp_path))
    assert a == b and calls == ["compute_90", "compute_80"] and c != a
    d = rt.compile_cuda(src, "sm_90", compiler="nvcc", cache_dir=str(tmp_path))
    assert calls[-1] == "sm_90" and d not in (a, c)          # machine code: its own entry


class _FakeCu:
    """Enough of ``cuda.bindings.driver`` for the driver layer: results are tuples whose
    first item is the error code, as the real bindings return them."""

    def __init__(self):
        self.memory, self.launches, self.next = {}, [], 4096

    def cuInit(self, flags):
        return (0,)

    def cuDeviceGetCount(self):
        return (0, 2)

    def cuDeviceGet(self, i):
        return (0, i)

    def cuDevicePrimaryCtxRetain(self, dev):
        return (0, "ctx")

    def cuCtxSetCurrent(self, ctx):
        return (0,)

    def cuStreamCreate(self, flags):
        return (0, "stream")

    def cuStreamSynchronize(self, stream):
        return (0,)

    def cuMemAlloc(self, n):
        ptr, self.next = self.next, self.next + n
        self.memory[ptr] = bytearray(n)
        return (0, ptr)

    def cuMemcpyHtoDAsync(self, ptr, host, n, stream):
        import ctypes
        self.memory[ptr][:n] = ctypes.string_at(host, n)
        return (0,)

    def cuMemcpyDtoHAsync(self, host, ptr, n, stream):
        import ctypes
        ctypes.memmove(host, bytes(self.memory[ptr][:n]), n)
        return (0,)

    def cuMemFree(self, ptr):
        return (1,)                        # fails: the error must surface

    def cuGetErrorString(self, err):
        return (0, b"CUDA_ERROR_INVALID_VALUE")

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, args, extra):
        self.launches.append((fn, gx, bx))
        return (0,)


def test_cuda_python_driver_against_a_fake_binding(monkeypatch):
    fake = _FakeCu()
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = fake
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    drv = rt.CudaPythonDriver()
    assert drv.device_count() == 2
    ptr = drv.malloc(16)
    drv.htod(ptr, np.arange(4, dtype=np.float32))
    back = np.empty(4, np.float32)
    drv.dtoh(back, ptr)
    np.testing.assert_array_equal(back, np.arange(4, dtype=np.float32))
    drv.launch("fn", 7, 256, [ptr, ptr])
    assert fake.launches == [("fn", 7, 256)]
    with pytest.raises(RuntimeError, match="CUDA_ERROR_INVALID_VALUE"):
        drv.free(ptr)
