"""The driver layer against fake driver packages: contexts per thread, the driver and NVRTC
versions, pycuda's context stack at exit, ``FUSEGRAD_CUDA_SYNC``, modules unloaded with their
programs, the bounded eager program cache, and NVRTC's machine code where NVRTC is installed."""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.config import config
from fusegrad.passes.fusion import fuse
from fusegrad.runtime import cuda as rt
from fusegrad.runtime import cuda_drivers
from fusegrad.tracer import eager_cuda
from tests.runtime.fake_cuda import FakeCu, install_fake_cu, write_fake_pycuda

CUBIN = b"\x7fELF fake machine code"


@pytest.fixture
def fake_cu(monkeypatch):
    fake = FakeCu()
    install_fake_cu(monkeypatch, fake)
    return fake


def _program(monkeypatch, drv, nvrtc: str | None = None):
    """A two-kernel program for ``drv``, its compile faked (CUBIN bytes) and NVRTC's
    version ``nvrtc`` (None: no NVRTC, no version check)."""
    monkeypatch.setattr(rt, "compile_cuda", lambda source, arch, name: CUBIN)
    monkeypatch.setattr(rt, "_nvrtc", lambda driver_version=None: object() if nvrtc else None)
    monkeypatch.setattr(rt, "nvrtc_version", lambda: nvrtc)
    g = fg.trace(lambda x: (x.exp().sum(1, keepdim=True) * x).tanh(), fg.randn(4, 3))
    return rt.CudaProgram(fuse(g), drv, name="step")


# --------------------------------------------------------------------------- contexts


def test_a_second_thread_makes_the_context_current_for_itself(fake_cu):
    drv = rt.CudaPythonDriver()
    main = threading.get_ident()
    assert [c[1] for c in fake_cu.called("cuCtxSetCurrent")] == [main]
    drv.use(0)                                   # already current in this thread
    seen = []
    worker = threading.Thread(target=lambda: (drv.use(0), seen.append(threading.get_ident())))
    worker.start()
    worker.join()
    # A context is current per thread: the worker set it itself, or its launches would fail.
    assert [c[1] for c in fake_cu.called("cuCtxSetCurrent")] == [main, seen[0]]


def test_the_device_set_current_is_per_thread(two_devices):
    fg.cuda.set_device(1)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(fg.cuda.current_device()))
    worker.start()
    worker.join()
    assert seen == [0] and fg.cuda.current_device() == 1         # torch's rule


def test_pycuda_contexts_are_popped_in_their_thread(monkeypatch, tmp_path):
    write_fake_pycuda(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("pycuda", "pycuda.driver"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    fake = importlib.import_module("pycuda.driver")
    atexit.unregister(fake._cleanup)             # its abort is for the subprocess below
    drv = rt.PyCudaDriver()
    seen = []
    worker = threading.Thread(target=lambda: (drv.use(0), seen.append(threading.get_ident())))
    worker.start()
    worker.join()
    gc.collect()
    assert ("push", seen[0]) in fake.LOG and ("pop", seen[0]) in fake.LOG
    with pytest.raises(fg.OutOfMemoryError, match="Tried to allocate 2.00 GiB. GPU 0 has a "
                       "total capacity of 1024.00 MiB"):
        rt.CachingAllocator(drv).alloc(2 << 30)  # pycuda's MemoryError, as torch's error
    drv._thread.pushed.pop()                     # what the exit handler does
    assert fake._stack() == []


@pytest.mark.slow
def test_pycuda_pops_its_context_at_exit(tmp_path):
    write_fake_pycuda(tmp_path)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = ("import threading\n"
            "from fusegrad.runtime import cuda as rt\n"
            "drv = rt.PyCudaDriver()\n"
            "t = threading.Thread(target=lambda: drv.use(0))\n"
            "t.start(); t.join()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), root]))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr                 # not pycuda's abort (134)
    assert run.stdout.split("\n")[-2:] == ["pop True", ""]   # the main thread's, last


# --------------------------------------------------------------------------- versions


def test_a_newer_nvrtc_major_than_the_driver_names_both_and_the_package(fake_cu, monkeypatch):
    fake_cu.version = 12080
    drv = rt.CudaPythonDriver()
    with pytest.raises(rt.CudaUnavailable) as info:
        _program(monkeypatch, drv, nvrtc="13.0")
    message = str(info.value)
    assert "NVRTC 13.0" in message and "CUDA 12.8" in message
    assert 'pip install "nvidia-cuda-nvrtc-cu12"' in message
    assert not fake_cu.called("cuModuleLoadData")


def test_a_newer_nvrtc_minor_loads_machine_code(fake_cu, monkeypatch):
    drv = rt.CudaPythonDriver()                  # driver 13.0
    assert drv.arch == "compute_90" and rt.machine_arch(drv.arch) == "sm_90"
    assert drv.driver_version() == 13000
    prog = _program(monkeypatch, drv, nvrtc="13.5")
    prog(np.ones((4, 3), np.float32))
    (load,) = fake_cu.called("cuModuleLoadData")
    assert load[2] == (CUBIN,)                   # the ELF image as it is, no NUL appended


def test_a_newer_nvrtc_minor_writes_ptx_the_driver_cannot_load():
    with pytest.raises(rt.CudaUnavailable) as info:
        rt.check_driver_compatible(13000, "13.5", "compute_90")
    message = str(info.value)
    assert "NVRTC 13.5" in message and "CUDA 13.0" in message and "PTX" in message
    assert 'pip install "nvidia-cuda-nvrtc==13.0.*"' in message
    rt.check_driver_compatible(13000, "13.5", "sm_90")
    rt.check_driver_compatible(13020, "13.0", "compute_90")
    rt.check_driver_compatible(13000, "12.9", "compute_90")


def test_find_nvrtc_prefers_the_drivers_major(monkeypatch, tmp_path):
    for layout in ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
                   "nvidia/cu13/lib/libnvrtc-builtins.so.13.0"):
        (tmp_path / layout).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / layout).write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("FUSEGRAD_NVRTC", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "none"))
    monkeypatch.setattr(cuda_drivers, "_driver", None)
    importlib.invalidate_caches()
    assert rt.find_nvrtc(12080).endswith("cuda_nvrtc/lib/libnvrtc.so.12")
    assert rt.find_nvrtc(13000).endswith("cu13/lib/libnvrtc.so.13")
    assert rt.find_nvrtc(14000).endswith("cu13/lib/libnvrtc.so.13")   # newest older major


def test_nvrtc_packages_are_the_wheels_names():
    assert rt.nvrtc_package(12) == "nvidia-cuda-nvrtc-cu12"
    assert rt.nvrtc_package(12, 4) == "nvidia-cuda-nvrtc-cu12==12.4.*"
    assert rt.nvrtc_package(13) == "nvidia-cuda-nvrtc>=13,<14"


# --------------------------------------------------------------------------- launches, modules


def test_cuda_sync_names_the_kernel_that_faulted(fake_cu, monkeypatch):
    drv = rt.CudaPythonDriver()
    prog = _program(monkeypatch, drv)
    fake_cu.fault_kernel = prog.lowered[max(prog.lowered)].name
    x = np.ones((4, 3), np.float32)
    monkeypatch.setattr(config, "cuda_sync", False)
    out = prog(x)[0]                             # asynchronous: the launch returns
    with pytest.raises(RuntimeError, match="unspecified launch failure") as info:
        out.to_host()
    assert "FUSEGRAD_CUDA_SYNC=1" in str(info.value)
    monkeypatch.setattr(config, "cuda_sync", True)
    with pytest.raises(RuntimeError) as info:
        prog(x)
    assert f"CUDA kernel {fake_cu.fault_kernel} of step failed" in str(info.value)
    assert "unspecified launch failure" in str(info.value)


def test_cuda_sync_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("FUSEGRAD_CUDA_SYNC", "1")
    monkeypatch.setenv("FUSEGRAD_CUDA_EAGER_CACHE", "7")
    try:
        assert fg.config.reload().cuda_sync and config.cuda_eager_cache == 7
    finally:
        monkeypatch.delenv("FUSEGRAD_CUDA_SYNC")
        monkeypatch.delenv("FUSEGRAD_CUDA_EAGER_CACHE")
        fg.config.reload()


def test_modules_are_unloaded_with_their_program(fake_cu, monkeypatch):
    drv = rt.CudaPythonDriver()
    prog = _program(monkeypatch, drv)
    prog(np.ones((4, 3), np.float32))
    assert not fake_cu.called("cuModuleUnload")
    del prog
    gc.collect()
    rt.empty_cache()                             # (as the next program call does)
    assert [c[2] for c in fake_cu.called("cuModuleUnload")] == [("module1",)]


def test_executable_graphs_are_destroyed_with_their_program(fake_cu, monkeypatch):
    drv = rt.CudaPythonDriver()
    prog = _program(monkeypatch, drv)
    prog.cuda_graphs = True
    x = np.ones((4, 3), np.float32)
    for _ in range(3):
        prog(x)
    assert fake_cu.live_execs == ["exec1"] and len(fake_cu.called("cuGraphLaunch")) == 2
    del prog
    gc.collect()
    rt.empty_cache()
    assert fake_cu.live_execs == [] and [c[2] for c in fake_cu.called("cuGraphExecDestroy")] == \
        [("exec1",)]
    # The graph before the module whose functions its nodes launch.
    names = [c[0] for c in fake_cu.calls]
    assert names.index("cuGraphExecDestroy") < names.index("cuModuleUnload")


def test_the_eager_program_cache_is_bounded_and_unloads_what_it_evicts(simulated, monkeypatch):
    monkeypatch.setattr(config, "cuda_eager_cache", 2)
    x = fg.ones(8, device="cuda")
    for op in (fg.exp, fg.sin, fg.cos):
        op(x)
    assert len(eager_cuda._PROGRAMS) == 2 and len(simulated.unloaded) == 1
    assert [k[0].name for k in eager_cuda._PROGRAMS] == ["sin", "cos"]
    fg.sin(x)                                    # a hit makes sin the most recent
    fg.tanh(x)
    assert [k[0].name for k in eager_cuda._PROGRAMS] == ["sin", "tanh"]
    assert len(simulated.unloaded) == 2


def test_the_drivers_out_of_memory_becomes_torchs_error_after_a_retry(fake_cu):
    alloc = rt.CachingAllocator(rt.CudaPythonDriver())
    with pytest.raises(fg.OutOfMemoryError) as info:
        alloc.alloc(3 << 29)
    assert str(info.value).startswith("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 "
                                      "has a total capacity of 1024.00 MiB of which 1024.00 MiB is free.")
    assert alloc.reserved == 0


def test_the_simulated_driver_runs_out_of_memory_through_fusegrad_cuda(monkeypatch):
    from fusegrad.testing.simulated_cuda import SimulatedDriver
    rt.set_driver(SimulatedDriver(memory=8 << 20))
    eager_cuda.clear_cache()
    try:
        with pytest.raises(fg.cuda.OutOfMemoryError, match="CUDA out of memory. Tried to "
                           "allocate 16.00 MiB. GPU 0 has a total capacity of 8.00 MiB"):
            fg.zeros(4 << 20, device="cuda")
    finally:
        eager_cuda.clear_cache()
        rt.set_driver(None)


def test_device_capability_and_arch_list(simulated):
    assert fg.cuda.get_device_capability() == (9, 0) == fg.cuda.get_device_capability("cuda:0")
    archs = fg.cuda.get_arch_list()
    assert archs == rt.nvrtc_arch_list() and all(a.startswith("sm_") for a in archs)


def test_without_cuda_the_arch_list_is_empty(monkeypatch):
    monkeypatch.setattr(rt, "is_available", lambda: False)
    assert fg.cuda.get_arch_list() == []


def test_out_of_memory_error_is_torchs():
    torch = pytest.importorskip("torch")
    assert fg.OutOfMemoryError.__mro__[1:] == torch.OutOfMemoryError.__mro__[1:]
    assert fg.OutOfMemoryError.__name__ == torch.OutOfMemoryError.__name__
    assert fg.cuda.OutOfMemoryError is fg.OutOfMemoryError
    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError


# --------------------------------------------------------------------------- real NVRTC


@pytest.mark.skipif(rt.find_nvrtc() is None, reason="NVRTC is not installed")
def test_nvrtc_compiles_machine_code_for_sm_xx_and_ptx_for_compute_xx(tmp_path):
    src = 'extern "C" __global__ void scale(float* x) { x[threadIdx.x] *= 2.0f; }\n'
    cubin = rt.compile_cuda(src, "sm_80", compiler="nvrtc", cache_dir=str(tmp_path))
    assert cubin[:4] == b"\x7fELF"
    ptx = rt.compile_cuda(src, "compute_80", compiler="nvrtc", cache_dir=str(tmp_path))
    assert b".target sm_80" in ptx and b".entry scale" in ptx
    assert rt.compile_cuda(src, "sm_80", compiler="nvrtc", cache_dir=str(tmp_path)) == cubin
    assert "sm_80" in rt.nvrtc_arch_list() and "sm_90" in rt.nvrtc_arch_list()
