"""Run a partitioned graph on an NVIDIA GPU: compile, cache, allocate, copy, launch.

Nothing here imports a CUDA package or touches a driver until a CUDA device is asked for.

- **Compiling**: :func:`compile_cuda` turns CUDA C (:mod:`fusegrad.codegen.cuda`) into machine
  code (CUBIN) for the device's compute capability (``sm_90``) with NVRTC, in process (the
  ``nvidia-cuda-nvrtc`` wheel's ``libnvrtc``, found through ``FUSEGRAD_NVRTC``, the wheels,
  ``CUDA_HOME`` or the loader path; the one of the driver's CUDA major first), else with
  ``nvcc -cubin``; a virtual ``compute_90`` gives PTX. The code is cached on disk
  (:mod:`fusegrad.runtime.disk_cache`, never unpickled) keyed by the source's hash, the
  architecture and the compiler's version, like the CPU's object code. At a driver's first
  compile its CUDA version is checked against NVRTC's (:func:`check_driver_compatible`).
- **Driver**: the few driver calls the runtime makes sit behind :class:`Driver`; one
  implementation uses NVIDIA's cuda-python bindings (``cuda.bindings.driver``: ``pip install
  fusegrad[cuda]``, what CUDA images ship), one pycuda (``pip install fusegrad[pycuda]``).
  :func:`driver` picks the first that imports and says what to install when none does. Each
  thread makes a device's context current for itself; pycuda's pushed contexts are popped
  when their thread ends and at exit. ``FUSEGRAD_CUDA_SYNC=1`` waits for each kernel and
  names the one that faulted. A program's modules are unloaded when it is collected.
- **Memory**: :class:`CachingAllocator` rounds requests and carves them from segments as
  torch's caching allocator does, keeps freed blocks for reuse (so steady-state calls
  allocate nothing from the driver), and on out-of-memory empties its cache and retries
  once before raising :class:`OutOfMemoryError` with torch's message.
- **Programs**: :class:`CudaProgram` lowers each kernel of a kernel graph to the GPU
  (:func:`fusegrad.codegen.gpu_lowering.lower_kernel`), compiles them as one module, takes
  its buffers from the shared memory plan (:mod:`fusegrad.runtime.memory_plan`) and launches
  the kernels in order on one stream. A kernel with no GPU lowering (an extern primitive)
  runs its numpy reference on host copies of its operands.
"""

from __future__ import annotations

import atexit
import bisect
import ctypes
import ctypes.util
import dataclasses
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fusegrad import profiling
from fusegrad.codegen.cuda.printer import cuda_source
from fusegrad.codegen.gpu_lowering import lower_kernel
from fusegrad.config import config
from fusegrad.ir.graph import Literal, Value
from fusegrad.ir.kernel_graph import KernelGraph
from fusegrad.ops.lowering import Unsupported
from fusegrad.runtime import disk_cache
from fusegrad.runtime.errors import OutOfMemoryError
from fusegrad.runtime.memory_plan import plan_memory

__all__ = ["CudaUnavailable", "OutOfMemoryError", "Driver", "driver", "device_count",
           "is_available", "synchronize", "current_device", "set_device", "check_ordinal",
           "memory_stats", "empty_cache", "reset_peak_memory_stats", "compile_cuda",
           "find_nvrtc", "nvrtc_version", "nvrtc_arch_list", "nvrtc_package",
           "check_driver_compatible", "CachingAllocator", "round_size", "allocation_size",
           "DeviceArray", "CudaProgram", "HostCudaProgram", "INSTALL_HINT"]

INSTALL_HINT = ("install NVIDIA's CUDA Python bindings (pip install 'fusegrad[cuda]', which "
                "brings cuda-bindings and nvidia-cuda-nvrtc) or pycuda (pip install "
                "'fusegrad[pycuda]')")


class CudaUnavailable(RuntimeError):
    """No CUDA driver, device or compiler: the message says what is missing."""


# --------------------------------------------------------------------------- compiling


def _nvrtc_major(path: str) -> int | None:
    """The CUDA major version in a ``libnvrtc.so.12`` file name (None without one)."""
    m = re.search(r"libnvrtc\.so\.(\d+)", os.path.basename(path))
    return int(m.group(1)) if m else None


def find_nvrtc(driver_version: int | None = None) -> str | None:
    """Path of ``libnvrtc``: ``FUSEGRAD_NVRTC``, the NVRTC wheels (``nvidia/cu13/lib`` of
    ``nvidia-cuda-nvrtc`` 13, ``nvidia/cuda_nvrtc/lib`` of ``nvidia-cuda-nvrtc-cu12``),
    ``CUDA_HOME``, or the loader's search path; None when there is none.

    With several installed, the one whose CUDA major version is the driver's
    (``driver_version`` as ``cuDriverGetVersion`` gives it, 13000 for 13.0; the process's
    driver's when None and one is made) comes first, then older majors, newest first: a
    newer major makes code the driver cannot load."""
    env = os.environ.get("FUSEGRAD_NVRTC")
    if env and os.path.exists(env):
        return env
    candidates = []
    try:
        import importlib.util
        spec = importlib.util.find_spec("nvidia")
        for root in (spec.submodule_search_locations or []) if spec else []:
            candidates += sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*")))
    except (ImportError, ValueError):
        pass
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates += sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")))
    candidates = [c for c in candidates if "builtins" not in c and "alt" not in c]
    if driver_version is None:
        driver_version = _known_driver_version()
    if driver_version is not None and candidates:
        wanted = driver_version // 1000

        def preference(path: str) -> tuple[int, int]:
            major = _nvrtc_major(path)
            if major is None:                  # an unversioned libnvrtc.so: after the known
                return (1, 0)
            return (0 if major == wanted else 1 if major < wanted else 2, -major)
        candidates.sort(key=preference)       # stable: folder order breaks ties
    if candidates:
        return candidates[0]
    return ctypes.util.find_library("nvrtc")


def _known_driver_version() -> int | None:
    """The process's driver's CUDA version, when a driver was made and can tell."""
    version = getattr(_driver, "driver_version", None)
    try:
        return version() if callable(version) else None
    except Exception:
        return None


_nvrtc_lock = threading.Lock()
_nvrtc_lib = None


def _nvrtc(driver_version: int | None = None):
    """The NVRTC library, loaded on first use (the one :func:`find_nvrtc` picks for
    ``driver_version``); None without one."""
    global _nvrtc_lib
    with _nvrtc_lock:
        if _nvrtc_lib is None:
            path = find_nvrtc(driver_version)
            if path is None:
                return None
            # NVRTC opens libnvrtc-builtins by name at its first compile; a wheel's folder is
            # not on the loader's path, so the one beside it is loaded first.
            for builtins in sorted(glob.glob(os.path.join(os.path.dirname(path),
                                                          "libnvrtc-builtins.so*"))):
                if "alt" not in os.path.basename(builtins):
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                    break
            _nvrtc_lib = ctypes.CDLL(path)
        return _nvrtc_lib


def nvrtc_version() -> str | None:
    """NVRTC's version ("13.0"), or None without NVRTC."""
    lib = _nvrtc()
    if lib is None:
        return None
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def nvrtc_arch_list() -> list[str]:
    """The ``sm_XX`` architectures NVRTC compiles for (``nvrtcGetSupportedArchs``); empty
    without NVRTC."""
    lib = _nvrtc()
    if lib is None or not hasattr(lib, "nvrtcGetSupportedArchs"):
        return []
    count = ctypes.c_int()
    lib.nvrtcGetNumSupportedArchs(ctypes.byref(count))
    archs = (ctypes.c_int * count.value)()
    lib.nvrtcGetSupportedArchs(archs)
    return [f"sm_{a}" for a in archs]


def _nvrtc_compile(source: str, arch: str, name: str) -> tuple[bytes, str]:
    """(CUBIN for ``sm_XX``, PTX for ``compute_XX``; the log) from NVRTC; raises
    RuntimeError with the log on an error."""
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    check = _nvrtc_check(lib)
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None,
                                 None))
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        status = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        text = log.value.decode(errors="replace").strip()
        if status != 0:
            raise RuntimeError(f"NVRTC failed to compile {name}:\n{text}")
        if is_machine_code(arch):
            check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)))
            cubin = ctypes.create_string_buffer(size.value)
            check(lib.nvrtcGetCUBIN(prog, cubin))
            return cubin.raw, text
        check(lib.nvrtcGetPTXSize(prog, ctypes.byref(size)))
        ptx = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetPTX(prog, ptx))
        return ptx.raw.rstrip(b"\0"), text
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _nvrtc_check(lib):
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def check(status: int) -> None:
        if status != 0:
            raise RuntimeError(f"NVRTC: {lib.nvrtcGetErrorString(status).decode()}")
    return check


def machine_arch(arch: str) -> str:
    """The real GPU (``sm_90``) of a virtual architecture (``compute_90``), what programs
    compile machine code for; an ``sm_XX`` stays as it is."""
    return "sm_" + arch[len("compute_"):] if arch.startswith("compute_") else arch


def is_machine_code(arch: str) -> bool:
    """Whether ``arch`` names a real GPU (``sm_90``: CUBIN) rather than a virtual one
    (``compute_90``: PTX, which the driver compiles when it loads it)."""
    return arch.startswith("sm_")


def _nvcc_compile(source: str, arch: str, name: str) -> tuple[bytes, str]:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        raise CudaUnavailable(f"no CUDA compiler: neither NVRTC nor nvcc was found; {INSTALL_HINT}")
    kind = "cubin" if is_machine_code(arch) else "ptx"
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, f"{name}.cu"), os.path.join(tmp, f"{name}.{kind}")
        with open(src, "w") as f:
            f.write(source)
        arch_flag = arch.replace("compute_", "sm_")
        run = subprocess.run([nvcc, f"-arch={arch_flag}", f"-{kind}", src, "-o", out],
                             capture_output=True, text=True)
        log = (run.stdout + run.stderr).strip()
        if run.returncode != 0:
            raise RuntimeError(f"nvcc failed to compile {name}:\n{log}")
        with open(out, "rb") as f:
            return f.read(), log


def _nvcc_version() -> str:
    """``nvcc --version``'s release line (part of the cache key)."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return "nvcc"
    return next((line for line in out.splitlines() if "release" in line), "nvcc")


def compile_cuda(source: str, arch: str = "sm_90", name: str = "fusegrad",
                 compiler: str | None = None, cache_dir: str | None = None) -> bytes:
    """Machine code (CUBIN) of CUDA C ``source`` for ``arch`` (``sm_90``: Hopper), or PTX
    for a virtual ``compute_XX``, from NVRTC when found (``compiler="nvrtc"`` or ``"nvcc"``
    forces one), cached on disk in ``cache_dir`` (the runtime's cache folder by default)
    keyed by the source, the architecture and the compiler's version."""
    use_nvrtc = compiler == "nvrtc" or (compiler is None and _nvrtc() is not None)
    if use_nvrtc and _nvrtc() is None:
        raise CudaUnavailable(f"NVRTC was not found; {INSTALL_HINT}")
    identity = f"nvrtc {nvrtc_version()}" if use_nvrtc else _nvcc_identity()
    from fusegrad import __version__
    key = hashlib.sha256("\n".join([__version__, identity, arch, source]).encode()).hexdigest()
    cache_dir = cache_dir or _cache_dir()
    limit = 256 << 20
    if cache_dir:
        hit = disk_cache.read_entry(cache_dir, key, limit)
        if hit is not None:
            return hit
    code, _ = (_nvrtc_compile if use_nvrtc else _nvcc_compile)(source, arch, name)
    if cache_dir:
        disk_cache.write_entry(cache_dir, key, code, limit, 30 * 86400)
    return code


_nvcc_identity_value: str | None = None


def _nvcc_identity() -> str:
    global _nvcc_identity_value
    if _nvcc_identity_value is None:
        _nvcc_identity_value = _nvcc_version()
    return _nvcc_identity_value


def nvrtc_package(major: int, minor: int | None = None) -> str:
    """The pip requirement that installs NVRTC of CUDA ``major`` (``minor`` or older when
    given): ``nvidia-cuda-nvrtc`` from CUDA 13 on, ``nvidia-cuda-nvrtc-cu12`` before."""
    if major >= 13:
        return f"nvidia-cuda-nvrtc=={major}.{minor}.*" if minor is not None else \
            f"nvidia-cuda-nvrtc>={major},<{major + 1}"
    name = f"nvidia-cuda-nvrtc-cu{major}"
    return f"{name}=={major}.{minor}.*" if minor is not None else name


def check_driver_compatible(driver_version: int, nvrtc: str, arch: str) -> None:
    """Raise :class:`CudaUnavailable` when code that NVRTC ``nvrtc`` ("13.5") makes for
    ``arch`` cannot be loaded by a driver of CUDA ``driver_version`` (13000 for 13.0), naming
    both versions and the package to install.

    A newer NVRTC major than the driver's never works: its CUBIN and PTX need the newer
    driver. A newer minor within the driver's major works for CUBIN (CUDA's minor version
    compatibility: machine code of 13.x runs on any 13.y driver) but not for PTX: the
    driver's JIT reads no PTX ISA newer than its own (NVRTC 13.5 writes ``.version 9.5``,
    which a 13.0 driver refuses with CUDA_ERROR_UNSUPPORTED_PTX_VERSION)."""
    d_major, d_minor = driver_version // 1000, driver_version % 1000 // 10
    n_major, n_minor = (int(p) for p in nvrtc.split(".")[:2])
    driver = f"the NVIDIA driver supports CUDA {d_major}.{d_minor}"
    if n_major > d_major:
        raise CudaUnavailable(
            f"NVRTC {nvrtc} makes code that the installed driver cannot load ({driver}): "
            f'install the NVRTC of CUDA {d_major} (pip install "{nvrtc_package(d_major)}") '
            f"or a driver for CUDA {n_major}")
    if not is_machine_code(arch) and (n_major, n_minor) > (d_major, d_minor):
        raise CudaUnavailable(
            f"NVRTC {nvrtc} writes PTX that the installed driver cannot load ({driver}; "
            f"minor version compatibility covers machine code, not PTX): compile for "
            f"sm_XX, or install an older NVRTC (pip install "
            f'"{nvrtc_package(d_major, d_minor)}")')


def _cache_dir() -> str | None:
    base = getattr(config, "cache_dir", None)
    return os.path.join(base, "cuda") if base else None


# --------------------------------------------------------------------------- drivers


class Driver(Protocol):
    """The driver calls the runtime makes (device pointers are ints). ``use`` makes a
    device's context current for the calling thread (contexts are per thread in CUDA)."""

    name: str
    # compute_XX of device 0: its virtual architecture, what PTX targets (programs compile
    # machine code for the matching sm_XX: machine_arch)
    arch: str

    def device_count(self) -> int: ...
    def use(self, ordinal: int) -> None: ...
    def device_name(self, ordinal: int) -> str: ...
    def malloc(self, nbytes: int) -> int: ...            # OutOfMemoryError when full
    def free(self, ptr: int) -> None: ...
    def mem_get_info(self) -> tuple[int, int]: ...       # (free, total) bytes, current device
    def htod(self, ptr: int, host: np.ndarray) -> None: ...
    def dtoh(self, host: np.ndarray, ptr: int) -> None: ...
    def dtod(self, dst: int, src: int, nbytes: int) -> None: ...
    def load_module(self, image: bytes, kernels: dict) -> object: ...
    def unload_module(self, module, ordinal: int) -> None: ...
    def function(self, module, name: str) -> object: ...
    def launch(self, fn, grid: int, block: int, args: list[int]) -> None: ...
    def synchronize(self) -> None: ...


# CUDA_ERROR_OUT_OF_MEMORY in the driver API's CUresult.
_CUDA_ERROR_OUT_OF_MEMORY = 2

# torch's note on an asynchronous error, with this project's switch.
_ASYNC_HINT = ("CUDA kernel errors might be asynchronously reported at some other API call, "
               "so the stacktrace below might be incorrect.\nFor debugging consider passing "
               "FUSEGRAD_CUDA_SYNC=1")


def _with_sync_hint(message: str) -> str:
    return message if config.cuda_sync else f"{message}\n{_ASYNC_HINT}"


class CudaPythonDriver:
    """:class:`Driver` on NVIDIA's cuda-python bindings (``cuda.bindings.driver``)."""

    name = "cuda-python"
    package = "cuda"

    def __init__(self, ordinal: int = 0):
        from cuda.bindings import driver as cu  # optional dependency
        self.cu = cu
        self._check(cu.cuInit(0))
        self.count = self._check(cu.cuDeviceGetCount())
        if self.count == 0:
            raise CudaUnavailable("the CUDA driver reports no device")
        self.contexts: dict[int, tuple] = {}      # ordinal -> (context, stream)
        self._lock = threading.Lock()
        # The device whose context this thread made current: CUDA's current context is per
        # thread, so a new thread must set it itself (torch keeps its device per thread too).
        self._thread = threading.local()
        self.use(ordinal)
        major, minor = self.compute_capability(ordinal)
        self.arch = f"compute_{major}{minor}"

    def compute_capability(self, ordinal: int) -> tuple[int, int]:
        """(major, minor) of device ``ordinal``; (9, 0) from a binding without the enum."""
        cu = self.cu
        dev = self._check(cu.cuDeviceGet(ordinal))
        try:
            attr = cu.CUdevice_attribute
            return (self._check(cu.cuDeviceGetAttribute(
                        attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)),
                    self._check(cu.cuDeviceGetAttribute(
                        attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)))
        except AttributeError:               # a binding without the attribute enum
            return (9, 0)

    def driver_version(self) -> int:
        """The CUDA version the driver supports (``cuDriverGetVersion``: 13000 for 13.0)."""
        return int(self._check(self.cu.cuDriverGetVersion()))

    def use(self, ordinal: int) -> None:
        """Make device ``ordinal``'s primary context current in this thread (retained on the
        first use in any thread)."""
        if getattr(self._thread, "current", -1) == ordinal:
            return
        cu = self.cu
        with self._lock:
            if ordinal not in self.contexts:
                ctx = self._check(cu.cuDevicePrimaryCtxRetain(self._check(cu.cuDeviceGet(
                    ordinal))))
                self._check(cu.cuCtxSetCurrent(ctx))
                self.contexts[ordinal] = (ctx, self._check(cu.cuStreamCreate(0)))
            else:
                self._check(cu.cuCtxSetCurrent(self.contexts[ordinal][0]))
        self._thread.current = ordinal

    @property
    def current(self) -> int:
        """The device this thread made current (-1 before its first :meth:`use`)."""
        return getattr(self._thread, "current", -1)

    @property
    def stream(self):
        return self.contexts[self.current][1]

    def device_name(self, ordinal: int) -> str:
        dev = self._check(self.cu.cuDeviceGet(ordinal))
        name = self._check(self.cu.cuDeviceGetName(256, dev))
        return bytes(name).split(b"\0", 1)[0].decode()

    def _check(self, result):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            _, text = self.cu.cuGetErrorString(err)
            message = f"CUDA error: {text.decode() if text else err}"
            if int(err) == _CUDA_ERROR_OUT_OF_MEMORY:
                raise OutOfMemoryError(message)
            raise RuntimeError(_with_sync_hint(message))
        return rest[0] if len(rest) == 1 else tuple(rest) if rest else None

    def device_count(self) -> int:
        return self.count

    def malloc(self, nbytes: int) -> int:
        return int(self._check(self.cu.cuMemAlloc(max(nbytes, 1))))

    def free(self, ptr: int) -> None:
        self._check(self.cu.cuMemFree(ptr))

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self._check(self.cu.cuMemGetInfo())
        return int(free), int(total)

    def htod(self, ptr: int, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        self._check(self.cu.cuMemcpyHtoDAsync(ptr, host.ctypes.data, host.nbytes, self.stream))
        self._check(self.cu.cuStreamSynchronize(self.stream))   # host may be a temporary

    def dtoh(self, host: np.ndarray, ptr: int) -> None:
        self._check(self.cu.cuMemcpyDtoHAsync(host.ctypes.data, ptr, host.nbytes, self.stream))
        self._check(self.cu.cuStreamSynchronize(self.stream))

    def dtod(self, dst: int, src: int, nbytes: int) -> None:
        self._check(self.cu.cuMemcpyDtoDAsync(dst, src, nbytes, self.stream))

    def load_module(self, image: bytes, kernels: dict):
        # A CUBIN is an ELF image the driver reads whole; PTX is text and must end in NUL.
        return self._check(self.cu.cuModuleLoadData(image if image[:4] == b"\x7fELF"
                                                    else image + b"\0"))

    def unload_module(self, module, ordinal: int) -> None:
        """Unload ``module`` from device ``ordinal``'s context (made current for the call)."""
        self.use(ordinal)
        self._check(self.cu.cuModuleUnload(module))

    def function(self, module, name: str):
        return self._check(self.cu.cuModuleGetFunction(module, name.encode()))

    def launch(self, fn, grid: int, block: int, args: list[int]) -> None:
        values = [ctypes.c_void_p(a) for a in args]
        pointers = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        self._check(self.cu.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, self.stream,
                                           ctypes.addressof(pointers), 0))

    def synchronize(self) -> None:
        self._check(self.cu.cuStreamSynchronize(self.stream))


class _PushedContext:
    """The context a :class:`PyCudaDriver` pushed in one thread. pycuda keeps a context
    stack per thread and aborts the process ("context stack was not empty upon module
    cleanup", exit 134) when one is left on it, so it is popped when the thread ends (this
    object is then collected, in that thread) and, for the main thread, at exit."""

    def __init__(self, drv):
        self.drv = drv
        self.ordinal = -1
        self.thread = threading.get_ident()

    def pop(self) -> None:
        if self.ordinal >= 0 and threading.get_ident() == self.thread:
            self.ordinal = -1
            self.drv.Context.pop()

    def __del__(self):
        try:
            self.pop()
        except Exception:                  # the driver is already gone
            pass


class PyCudaDriver:
    """:class:`Driver` on pycuda."""

    name = "pycuda"
    package = "pycuda"

    def __init__(self, ordinal: int = 0):
        import pycuda.driver as drv  # optional dependency
        self.drv = drv
        drv.init()
        self.count = drv.Device.count()
        if self.count == 0:
            raise CudaUnavailable("the CUDA driver reports no device")
        major, minor = self.compute_capability(ordinal)
        self.arch = f"compute_{major}{minor}"
        self.contexts: dict[int, tuple] = {}      # ordinal -> (context, stream)
        self._lock = threading.Lock()
        self._thread = threading.local()
        self._keep: dict[int, object] = {}
        self.use(ordinal)
        # The main thread's context is popped before pycuda's own cleanup (atexit handlers
        # run last-registered first, and pycuda registered its handler when imported).
        atexit.register(self._thread.pushed.pop)

    def compute_capability(self, ordinal: int) -> tuple[int, int]:
        return tuple(self.drv.Device(ordinal).compute_capability())

    def driver_version(self) -> int:
        return int(self.drv.get_driver_version())

    def use(self, ordinal: int) -> None:
        """Make device ``ordinal``'s primary context current in this thread (retained on the
        first use in any thread): the one this thread pushed before is popped, so each
        thread's stack holds at most one context of ours."""
        pushed = getattr(self._thread, "pushed", None)
        if pushed is None:
            pushed = self._thread.pushed = _PushedContext(self.drv)
        if pushed.ordinal == ordinal:
            return
        pushed.pop()
        with self._lock:
            if ordinal not in self.contexts:
                ctx = self.drv.Device(ordinal).retain_primary_context()
                ctx.push()
                self.contexts[ordinal] = (ctx, self.drv.Stream())
            else:
                self.contexts[ordinal][0].push()
        pushed.ordinal = ordinal

    @property
    def current(self) -> int:
        pushed = getattr(self._thread, "pushed", None)
        return pushed.ordinal if pushed is not None else -1

    @property
    def stream(self):
        return self.contexts[self.current][1]

    def device_count(self) -> int:
        return self.count

    def device_name(self, ordinal: int) -> str:
        return self.drv.Device(ordinal).name()

    def malloc(self, nbytes: int) -> int:
        try:
            alloc = self.drv.mem_alloc(max(nbytes, 1))
        except self.drv.MemoryError as e:
            raise OutOfMemoryError(f"CUDA error: {e}") from None
        ptr = int(alloc)
        self._keep[ptr] = alloc
        return ptr

    def free(self, ptr: int) -> None:
        self._keep.pop(ptr).free()

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self.drv.mem_get_info()
        return int(free), int(total)

    def htod(self, ptr: int, host: np.ndarray) -> None:
        self.drv.memcpy_htod(ptr, np.ascontiguousarray(host))

    def dtoh(self, host: np.ndarray, ptr: int) -> None:
        self.stream.synchronize()
        self.drv.memcpy_dtoh(host, ptr)

    def dtod(self, dst: int, src: int, nbytes: int) -> None:
        self.drv.memcpy_dtod_async(dst, src, nbytes, self.stream)

    def load_module(self, image: bytes, kernels: dict):
        return self.drv.module_from_buffer(image if image[:4] == b"\x7fELF" else image + b"\0")

    def unload_module(self, module, ordinal: int) -> None:
        """Nothing: a pycuda module unloads itself when it is collected."""

    def function(self, module, name: str):
        return module.get_function(name)

    def launch(self, fn, grid: int, block: int, args: list[int]) -> None:
        fn(*[np.uintp(a) for a in args], block=(block, 1, 1), grid=(grid, 1),
           stream=self.stream)

    def synchronize(self) -> None:
        self.stream.synchronize()


_driver_lock = threading.Lock()
_driver: Driver | None = None
_driver_error: str | None = None


def find_libcuda() -> str | None:
    """Path of the NVIDIA driver library (``libcuda.so``): ``FUSEGRAD_LIBCUDA``, the usual
    system folders, ``LD_LIBRARY_PATH``, or the loader's cache; None on a machine without
    the driver. Looked for before any CUDA package is imported."""
    env = os.environ.get("FUSEGRAD_LIBCUDA")
    if env:
        return env if os.path.exists(env) else None
    folders = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
               "/usr/lib", "/usr/local/cuda/compat", "/usr/lib/wsl/lib"]
    folders += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    for folder in folders:
        hits = sorted(glob.glob(os.path.join(folder, "libcuda.so*")))
        if hits:
            return hits[0]
    return ctypes.util.find_library("cuda")


def _package_present(name: str) -> bool:
    """Whether top-level package ``name`` is installed, without importing it."""
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):          # a None entry in sys.modules: blocked
        return False


def driver() -> Driver:
    """The process's CUDA driver (cuda-python, else pycuda), made on first use; raises
    :class:`CudaUnavailable` naming what is missing. No CUDA package is imported on a
    machine without the driver library."""
    global _driver, _driver_error
    with _driver_lock:
        if _driver is not None:
            return _driver
        if _driver_error is not None:          # looked once already: the answer stands
            raise CudaUnavailable(f"CUDA is not available ({_driver_error}); {INSTALL_HINT}")
        reasons = []
        has_driver = find_libcuda() is not None
        for cls in (CudaPythonDriver, PyCudaDriver):
            if not _package_present(cls.package):
                reasons.append(f"{cls.name}: not installed ({cls.package})")
                continue
            if not has_driver:
                reasons.append(f"{cls.name}: installed, but no NVIDIA driver (libcuda.so) "
                               f"was found")
                continue
            try:
                _driver = cls()
                return _driver
            except ImportError as e:
                reasons.append(f"{cls.name}: not installed ({e.name or e})")
            except Exception as e:    # a driver or device error: say which
                reasons.append(f"{cls.name}: {e}")
        _driver_error = "; ".join(reasons)
        raise CudaUnavailable(f"CUDA is not available ({_driver_error}); {INSTALL_HINT}")


def set_driver(d: Driver | None) -> None:
    """Use ``d`` as the process's driver (tests use a simulated one); None forgets it and
    any failure to find one, so the next use looks again."""
    global _driver, _driver_error
    with _driver_lock:
        _driver, _driver_error = d, None
        _thread_device.index = 0


def device_count() -> int:
    """CUDA devices the driver reports; 0 when no CUDA package or driver is installed."""
    try:
        return driver().device_count()
    except CudaUnavailable:
        return 0


def is_available() -> bool:
    """Whether a CUDA device can be used."""
    return device_count() > 0


def synchronize(device: int | None = None) -> None:
    """Wait for the kernels launched so far on ``device`` (the current one by default;
    nothing to do when CUDA was never used)."""
    if _driver is not None:
        _driver.use(current_device() if device is None else check_ordinal(device))
        _driver.synchronize()


# The device that ``cuda`` without an index means (``torch.cuda.set_device``): per thread,
# as in torch (a new thread starts on device 0); explicit indices never read it.
_thread_device = threading.local()


def check_ordinal(index: int) -> int:
    """``index`` if the driver has a device of that ordinal, else torch's error."""
    count = device_count()
    if count == 0:
        raise CudaUnavailable(f"CUDA is not available ({_driver_error}); {INSTALL_HINT}")
    if not 0 <= index < count:
        raise RuntimeError(f"CUDA error: invalid device ordinal {index} ({count} available)")
    return index


def current_device() -> int:
    """The index of the device ``cuda`` means (0 until :func:`set_device`)."""
    return getattr(_thread_device, "index", 0)


def set_device(index: int) -> None:
    """Make device ``index`` the one ``cuda`` without an index means."""
    _thread_device.index = check_ordinal(int(index))


# --------------------------------------------------------------------------- memory


# torch's block and segment sizes (c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize,
# kSmallSize, kSmallBuffer, kMinLargeAlloc, kLargeBuffer, kRoundLarge).
MIN_BLOCK_SIZE = 512              # every block is a multiple of 512 bytes
SMALL_SIZE = 1 << 20              # the largest "small" request: 1 MiB
SMALL_BUFFER = 2 << 20            # small requests are packed into 2 MiB segments
MIN_LARGE_ALLOC = 10 << 20        # requests between 1 and 10 MiB split a 20 MiB segment
LARGE_BUFFER = 20 << 20
ROUND_LARGE = 2 << 20             # larger requests get a segment rounded up to 2 MiB


def round_size(nbytes: int) -> int:
    """The block size of a request: a multiple of 512 bytes, at least 512 (torch's
    ``round_size`` without ``roundup_power2_divisions``)."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return MIN_BLOCK_SIZE * ((nbytes + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """The segment asked of the driver for a block of ``size`` bytes that no cached block
    fits (torch's ``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


def format_size(nbytes: int) -> str:
    """A byte count as torch's allocator prints it ("20.00 MiB", "512 bytes")."""
    if nbytes <= 1024:
        return f"{nbytes} bytes"
    if nbytes <= 1 << 20:
        return f"{nbytes / 1024:.2f} KiB"
    if nbytes <= 1 << 30:
        return f"{nbytes / (1 << 20):.2f} MiB"
    return f"{nbytes / (1 << 30):.2f} GiB"


class _Block:
    """A piece of a segment: free or in use, linked to its neighbours in the segment."""

    __slots__ = ("ptr", "size", "small", "allocated", "prev", "next")

    def __init__(self, ptr: int, size: int, small: bool):
        self.ptr, self.size, self.small = ptr, size, small
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


class CachingAllocator:
    """Device memory of one device, as torch's CUDA caching allocator manages it: requests
    are rounded to 512-byte blocks (:func:`round_size`) cut from segments asked of the
    driver (2 MiB for requests up to 1 MiB, 20 MiB for those up to 10 MiB, else the request
    rounded to 2 MiB: :func:`allocation_size`); the best-fitting free block of the request's
    pool (small or large) is reused and split, a freed block merges with its free
    neighbours, and ``release()`` (``empty_cache``) returns the segments that are wholly free.

    When the driver is out of memory the cached segments are released and the request tried
    once more; then :class:`~fusegrad.runtime.errors.OutOfMemoryError` says, as torch's
    does, what was asked and what is held. ``allocated`` counts the bytes of blocks in use
    (``torch.cuda.memory_allocated``), ``peak`` its maximum, ``reserved`` the bytes of the
    segments held (``memory_reserved``) and ``peak_reserved`` theirs."""

    def __init__(self, drv: Driver, device: int = 0):
        self.drv = drv
        self.device = device
        self.pools: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # (size, ptr)
        self.blocks: dict[int, _Block] = {}         # ptr -> block, free or in use
        self.lock = threading.RLock()
        self.allocated = self.peak = self.reserved = self.peak_reserved = 0

    def activate(self) -> Driver:
        """The driver, with this allocator's device current."""
        self.drv.use(self.device)
        return self.drv

    def alloc(self, nbytes: int) -> int:
        """A pointer to at least ``nbytes`` bytes of this device's memory."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        with self.lock:
            block = self._best_fit(size, small)
            if block is None:
                block = self._new_segment(size, small)
            remaining = block.size - size
            # torch's should_split: a small block keeps any 512-byte remainder, a large one
            # only a remainder larger than a small request (the rest stays in the block).
            if remaining >= MIN_BLOCK_SIZE if small else remaining > SMALL_SIZE:
                rest = _Block(block.ptr + size, remaining, small)
                rest.prev, rest.next = block, block.next
                if block.next is not None:
                    block.next.prev = rest
                block.next, block.size = rest, size
                self.blocks[rest.ptr] = rest
                self._insert(rest)
            block.allocated = True
            self.allocated += block.size
            self.peak = max(self.peak, self.allocated)
            return block.ptr

    def _best_fit(self, size: int, small: bool) -> _Block | None:
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (size, 0))
        if i == len(pool):
            return None
        return self.blocks[pool.pop(i)[1]]

    def _insert(self, block: _Block) -> None:
        bisect.insort(self.pools[block.small], (block.size, block.ptr))

    def _remove(self, block: _Block) -> None:
        pool = self.pools[block.small]
        del pool[bisect.bisect_left(pool, (block.size, block.ptr))]

    def _new_segment(self, size: int, small: bool) -> _Block:
        nbytes = allocation_size(size)
        drv = self.activate()
        try:
            ptr = drv.malloc(nbytes)
        except OutOfMemoryError:
            # torch frees its cached blocks and tries once more before giving up.
            self.release()
            try:
                ptr = drv.malloc(nbytes)
            except OutOfMemoryError:
                raise self._out_of_memory(nbytes) from None
        block = _Block(ptr, nbytes, small)
        self.blocks[ptr] = block
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def _out_of_memory(self, nbytes: int) -> OutOfMemoryError:
        """torch's message (its ``malloc`` in CUDACachingAllocator.cpp), naming fusegrad where
        torch names itself, without the advice on ``PYTORCH_CUDA_ALLOC_CONF``, which has no
        counterpart here."""
        try:
            free, total = self.drv.mem_get_info()
        except Exception:                      # a driver that cannot tell
            free = total = 0
        return OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {format_size(nbytes)}. GPU {self.device} "
            f"has a total capacity of {format_size(total)} of which {format_size(free)} is "
            f"free. Of the allocated memory {format_size(self.allocated)} is allocated by "
            f"fusegrad, and {format_size(self.reserved - self.allocated)} is reserved by "
            f"fusegrad but unallocated.")

    def free(self, ptr: int) -> None:
        """Give the block at ``ptr`` back to the cache, merged with its free neighbours."""
        with self.lock:
            block = self.blocks[ptr]
            block.allocated = False
            self.allocated -= block.size
            for neighbour in (block.prev, block.next):
                if neighbour is None or neighbour.allocated:
                    continue
                self._remove(neighbour)
                first, second = (neighbour, block) if neighbour is block.prev else \
                    (block, neighbour)
                first.size += second.size
                first.next = second.next
                if second.next is not None:
                    second.next.prev = first
                del self.blocks[second.ptr]
                block = first
            self._insert(block)

    def release(self) -> None:
        """Return every wholly free segment to the driver (``torch.cuda.empty_cache``)."""
        with self.lock:
            for small, pool in self.pools.items():
                keep = []
                for size, ptr in pool:
                    block = self.blocks[ptr]
                    if block.prev is None and block.next is None:
                        self.activate().free(ptr)
                        del self.blocks[ptr]
                        self.reserved -= size
                    else:
                        keep.append((size, ptr))
                self.pools[small] = keep


_allocators: dict[tuple[int, int], CachingAllocator] = {}


def allocator_of(drv: Driver, device: int = 0) -> CachingAllocator:
    """The caching allocator of device ``device`` of driver ``drv`` (shared by its
    programs and tensors)."""
    key = (id(drv), device)
    alloc = _allocators.get(key)
    if alloc is None or alloc.drv is not drv:
        with _driver_lock:
            alloc = _allocators[key] = CachingAllocator(drv, device)
    return alloc


def memory_stats(device: int | None = None) -> dict[str, int]:
    """``allocated``, ``peak``, ``reserved`` and ``peak_reserved`` bytes of ``device``'s
    caching allocator (zeros when CUDA was never used)."""
    if _driver is None:
        return {"allocated": 0, "peak": 0, "reserved": 0, "peak_reserved": 0}
    a = allocator_of(_driver, current_device() if device is None else device)
    return {"allocated": a.allocated, "peak": a.peak, "reserved": a.reserved,
            "peak_reserved": a.peak_reserved}


def reset_peak_memory_stats(device: int | None = None) -> None:
    """Restart the peak counts of ``device``'s allocator from what is allocated and
    reserved now."""
    if _driver is not None:
        a = allocator_of(_driver, current_device() if device is None else device)
        a.peak, a.peak_reserved = a.allocated, a.reserved


def empty_cache() -> None:
    """Return every cached free block of every device to the driver (and unload the
    modules of collected programs)."""
    unload_pending()
    for a in list(_allocators.values()):
        if a.drv is _driver:
            a.release()


class _Flags:
    """The part of numpy's ``flags`` a tensor reads."""

    __slots__ = ("c_contiguous", "writeable")
    f_contiguous = False

    def __init__(self, c_contiguous: bool, writeable: bool):
        self.c_contiguous, self.writeable = c_contiguous, writeable


_CONTIGUOUS_FLAGS = _Flags(True, True)


def _contiguous_byte_strides(shape, itemsize: int) -> tuple[int, ...]:
    strides, acc = [], itemsize
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


@dataclass(eq=False)
class DeviceArray:
    """An array in device memory: an allocation of its own (``owner`` None), or a strided
    view of another's (``owner`` is the allocation, kept alive by the view). ``ptr`` is
    the address of the first element; ``byte_strides`` None means row-major contiguous.

    Views are what torch's views are: slicing, reshape, permute and expand of a cuda tensor
    make one (:func:`fusegrad.runtime.eager_cuda.device_apply`) and an in-place write
    through it changes the owner's memory. Kernels read contiguous buffers: a program
    given a strided view first copies it (:meth:`contiguous`)."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    allocator: CachingAllocator
    byte_strides: tuple[int, ...] | None = None
    owner: "DeviceArray | None" = None

    @classmethod
    def empty(cls, shape, dtype, allocator: CachingAllocator) -> "DeviceArray":
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return cls(allocator.alloc(n), tuple(shape), dtype, allocator)

    @classmethod
    def from_host(cls, host: np.ndarray, allocator: CachingAllocator) -> "DeviceArray":
        host = np.asarray(host, order="C")       # (ascontiguousarray makes 0-d arrays 1-d)
        out = cls.empty(host.shape, host.dtype, allocator)
        if host.nbytes:
            allocator.activate().htod(out.ptr, host)
        return out

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    # The part of numpy's array interface that a tensor's metadata reads (``Tensor.shape``,
    # ``ndim``, ``numel``, ``stride()``, ``is_contiguous()``, eager type inference), so a
    # cuda tensor's storage is this object where a cpu tensor's is an ndarray.

    @property
    def device(self) -> str:
        return f"cuda:{self.allocator.device}"

    @property
    def base(self) -> "DeviceArray | None":
        return self.owner

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        if self.byte_strides is None:
            return _contiguous_byte_strides(self.shape, self.dtype.itemsize)
        return self.byte_strides

    @property
    def c_contiguous(self) -> bool:
        """Row-major without gaps (the strides of size-1 dims do not matter, as in numpy):
        what a kernel can read through ``ptr`` alone."""
        if self.byte_strides is None:
            return True
        expected = _contiguous_byte_strides(self.shape, self.dtype.itemsize)
        return self.size == 0 or all(s == e for s, e, d in zip(self.byte_strides, expected,
                                                                 self.shape) if d > 1)

    @property
    def flags(self):
        if self.byte_strides is None:
            return _CONTIGUOUS_FLAGS
        # Writes through a view that maps two elements to one address (an expand) are
        # refused, as torch refuses them.
        overlapping = any(s == 0 and d > 1 for s, d in zip(self.byte_strides, self.shape))
        return _Flags(self.c_contiguous, not overlapping)

    def shares_storage(self, other) -> bool:
        """Whether ``self`` and ``other`` read the same allocation."""
        return (other.__class__ is DeviceArray and
                (self.owner or self) is (other.owner or other))

    # -- views

    def _stand_in(self) -> np.ndarray:
        # An array with this layout over one element: numpy computes the strides of a
        # reshape / transpose / slice / broadcast of it without reading memory.
        return np.lib.stride_tricks.as_strided(np.zeros(1, self.dtype), self.shape,
                                               self.strides)

    def view_by(self, fn) -> "DeviceArray":
        """The view of this array that ``fn`` (numpy movement ops that give views) makes of
        an ndarray of the same layout."""
        stand = self._stand_in()
        out = fn(stand)
        shift = out.__array_interface__["data"][0] - stand.__array_interface__["data"][0]
        strides = tuple(out.strides)
        if strides == _contiguous_byte_strides(out.shape, self.dtype.itemsize):
            strides = None
        return DeviceArray(self.ptr + shift, tuple(out.shape), self.dtype, self.allocator,
                           strides, self.owner or self)

    def reshape(self, shape, order: str = "C", copy=None) -> "DeviceArray":
        """A view of ``shape``; ValueError when the strides allow none (numpy's rule)."""
        return self.view_by(lambda a: np.reshape(a, shape, copy=False))

    def contiguous(self) -> "DeviceArray":
        """This array when it is contiguous, else a contiguous copy made on the device."""
        if self.c_contiguous:
            return self
        from fusegrad.runtime.eager_cuda import strided_copy
        return strided_copy(self)

    def span(self) -> "DeviceArray":
        """The bytes from the first element to the last one this view reads, as a flat
        contiguous view (what a strided copy reads, and a strided write rewrites)."""
        item = self.dtype.itemsize
        extent = sum((d - 1) * s for d, s in zip(self.shape, self.strides)) + item
        return DeviceArray(self.ptr, (extent // item,), self.dtype, self.allocator, None,
                           self.owner or self)

    def copy(self) -> "DeviceArray":
        """A new contiguous device array with the same contents (made on the device)."""
        if not self.c_contiguous:
            return self.contiguous()
        out = DeviceArray.empty(self.shape, self.dtype, self.allocator)
        if self.nbytes:
            self.allocator.activate().dtod(out.ptr, self.ptr, self.nbytes)
        return out

    def __iadd__(self, other: "DeviceArray") -> "DeviceArray":
        """In-place ``self += other`` by an add kernel, written back into this buffer (so
        that every tensor sharing it sees the sum, as with an ndarray). Autograd accumulates
        a leaf's ``.grad`` this way on both devices."""
        from fusegrad.runtime.eager_cuda import add_into
        add_into(self, other)
        return self

    def to_host(self) -> np.ndarray:
        """The values in a new contiguous host array (a strided view copies its span and
        picks its elements on the host)."""
        host = np.empty(self.shape, dtype=self.dtype)
        if not host.nbytes:
            return host
        drv = self.allocator.activate()
        if self.c_contiguous:
            drv.dtoh(host, self.ptr)
            return host
        raw = np.empty(self.span().shape, dtype=self.dtype)
        drv.dtoh(raw, self.ptr)
        host[...] = np.lib.stride_tricks.as_strided(raw, self.shape, self.byte_strides)
        return host

    def __del__(self):
        if self.owner is not None:
            return
        try:
            self.allocator.free(self.ptr)
        except Exception:     # interpreter shutdown
            pass


# --------------------------------------------------------------------------- programs


# Modules of collected programs, unloaded at the next safe point (:func:`unload_pending`): a
# finalizer can run inside a driver call of the same thread (a garbage collection there), and
# unloading then would change the thread's current context under that call.
_pending_unloads: list[tuple[Driver, dict[int, object]]] = []


def _unload_later(drv: Driver, modules: dict[int, object]) -> None:
    """A collected program's finalizer: queue its modules (nothing at interpreter exit, when
    the driver may be gone; the process's end frees the contexts anyway)."""
    if modules and not sys.is_finalizing():
        _pending_unloads.append((drv, modules))


def unload_pending() -> None:
    """Unload the modules of the programs collected since the last call (each program call
    and :func:`empty_cache` start with it); the device that was current in this thread is
    made current again after."""
    while _pending_unloads:
        drv, modules = _pending_unloads.pop()
        before = getattr(drv, "current", -1)
        for device, module in list(modules.items()):
            try:
                drv.unload_module(module, device)
            except Exception:     # a context already destroyed: nothing left to unload
                pass
        modules.clear()
        if isinstance(before, int) and before >= 0:
            drv.use(before)


def check_driver(drv: Driver, arch: str) -> None:
    """At a driver's first compile, check that what NVRTC makes for ``arch`` loads on it
    (:func:`check_driver_compatible`); the answer is kept on the driver."""
    checked = getattr(drv, "_checked_archs", None)
    if checked is None:
        checked = set()
        try:
            drv._checked_archs = checked
        except AttributeError:
            pass
    if arch in checked:
        return
    version = getattr(drv, "driver_version", None)
    if version is not None:
        version = version()
        # The NVRTC of the driver's major is picked when several are installed.
        if _nvrtc(version) is not None:
            check_driver_compatible(version, nvrtc_version(), arch)
    checked.add(arch)


class CudaProgram:
    """A kernel graph compiled for one CUDA device; call it with numpy arrays or
    :class:`DeviceArray` inputs, get :class:`DeviceArray` outputs."""

    def __init__(self, kg: KernelGraph, drv: Driver | None = None, arch: str | None = None,
                 name: str = "program"):
        self.kg, self.graph, self.name = kg, kg.graph, name
        self.drv = drv or driver()
        arch = arch or machine_arch(getattr(self.drv, "arch", "compute_90"))
        self.plan = plan_memory(kg)
        self.lowered: dict[int, object] = {}
        self.host_steps: dict[int, str] = {}
        for i, k in enumerate(kg.kernels):
            try:
                self.lowered[i] = lower_kernel(k, kg)
            except Unsupported as e:
                self.host_steps[i] = str(e)
        self.source = cuda_source(list(self.lowered.values())) if self.lowered else ""
        self.kernel_map = {lk.name: lk for lk in self.lowered.values()}
        needs_code = getattr(self.drv, "needs_ptx", True)
        if self.kernel_map and needs_code:
            check_driver(self.drv, arch)
            self.image = compile_cuda(self.source, arch, name)
        else:
            self.image = b""
        # A module is loaded into one device's context: per device, on its first call there,
        # and unloaded after the program is collected (:func:`unload_pending`).
        self._functions: dict[int, dict] = {}
        self._modules: dict[int, object] = {}
        self._unload = weakref.finalize(self, _unload_later, self.drv, self._modules)
        self._unload.atexit = False
        self._constants: dict[int, dict[int, DeviceArray]] = {}
        self.allocator = None     # the allocator of the device of the latest call

    def _device_of(self, inputs) -> int:
        devices = {x.allocator.device for x in inputs if x.__class__ is DeviceArray}
        if len(devices) > 1:
            a, b = sorted(devices)[:2]
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at "
                               f"least two devices, cuda:{a} and cuda:{b}!")
        return devices.pop() if devices else current_device()

    def _load(self, device: int) -> dict:
        functions = self._functions.get(device)
        if functions is None:
            self.drv.use(device)
            module = self.drv.load_module(self.image, self.kernel_map) if self.kernel_map \
                else None
            if module is not None:
                self._modules[device] = module
            functions = self._functions[device] = {
                i: self.drv.function(module, lk.name) for i, lk in self.lowered.items()}
        return functions

    def __call__(self, *inputs) -> list[DeviceArray]:
        if _pending_unloads:
            unload_pending()
        plan, drv = self.plan, self.drv
        device = self._device_of(inputs)
        allocator = self.allocator = allocator_of(drv, device)
        functions = self._load(device)
        drv.use(device)
        buffers: dict[int, DeviceArray] = {}
        for i, x in enumerate(inputs):
            # Kernels index their inputs as contiguous buffers: a strided view is copied.
            buffers[i] = x.contiguous() if x.__class__ is DeviceArray else \
                DeviceArray.from_host(np.asarray(x), allocator)
        constants = self._constants.get(device)
        if constants is None:         # uploaded once per device, on its first call
            constants = self._constants[device] = {
                slot: DeviceArray.from_host(arr, allocator)
                for slot, arr in plan.constants.items()}
        buffers.update(constants)
        for slot, (shape, dt) in plan.intermediate_specs.items():
            buffers[slot] = DeviceArray.empty(shape, dt, allocator)
        for slot, shape, dt in plan.output_specs:
            buffers[slot] = DeviceArray.empty(shape, dt, allocator)
        drv.use(device)
        rec = profiling.recorder
        if rec is not None:
            with profiling.Span(rec, f"compiled::{self.name}", "compiled",
                                args={"Program": self.name, "Device": f"cuda:{device}"}):
                self._run_kernels_timed(rec, functions, buffers, device)
        else:
            for i, k in enumerate(self.kg.kernels):
                self._run_kernel(i, k, functions, buffers)
        return [self._output(o, buffers) for o in self.graph.outputs]

    def _run_kernel(self, i: int, k, functions: dict, buffers: dict) -> None:
        if i in self.lowered:
            lk = self.lowered[i]
            if lk.grid == 0:
                return
            args = [buffers[self.plan.slots[p.value]].ptr for p in lk.params]
            self.drv.launch(functions[i], lk.grid, lk.block, args)
            if config.cuda_sync:
                self._sync_after(lk.name)
        else:
            self._host_step(k, buffers)

    def _run_kernels_timed(self, rec: "profiling.Recorder", functions: dict, buffers: dict,
                           device: int) -> None:
        """The kernels, each an event of the profiler's: named as the CPU runtime names
        them (``step::k3[elementwise 512](mul,add)``; a host step ``k5.host[...]``) and
        timed from the host, the device synchronized before and after each (launches are
        asynchronous: without the wait a launch would seem free and the next one slow).
        The waits are the profiler's cost; an unprofiled call makes none."""
        clock = profiling.perf_counter_ns
        self.drv.synchronize()
        for i, k in enumerate(self.kg.kernels):
            if i in self.lowered and self.lowered[i].grid == 0:
                continue
            start = clock()
            self._run_kernel(i, k, functions, buffers)
            self.drv.synchronize()
            if i in self.lowered:
                name, category = f"{self.name}::{k.describe()}", "kernel"
            else:
                name = f"{self.name}::{dataclasses.replace(k, name=k.name + '.host').describe()}"
                category = "extern"
            rec.add(name, category, start, clock(),
                    args={"Program": self.name, "Device": f"cuda:{device}"})

    @property
    def ptx(self) -> bytes:
        """The code the driver loads (CUBIN for ``sm_XX``; the older name)."""
        return self.image

    def _sync_after(self, kernel: str) -> None:
        """``FUSEGRAD_CUDA_SYNC=1``: wait for the kernel just launched, so that a fault is
        reported by the launch that made it, naming its kernel."""
        try:
            self.drv.synchronize()
        except RuntimeError as e:
            raise RuntimeError(f"CUDA kernel {kernel} of {self.name} failed: {e}") from e

    def _host_array(self, v: Value, buffers) -> np.ndarray:
        view = self.kg.views.get(v)
        base = view.base if view is not None else v
        arr = buffers[self.plan.slots[base]].to_host()
        if view is None:
            return arr
        item = arr.dtype.itemsize
        flat = arr.reshape(-1)
        return np.lib.stride_tricks.as_strided(
            flat[view.offset:], shape=view.shape, strides=[s * item for s in view.strides])

    def _host_step(self, k, buffers) -> None:
        """An extern kernel: its nodes' numpy references on host copies."""
        env: dict[Value, np.ndarray] = {}
        for node in k.nodes:
            args = [np.asarray(op.value, dtype=op.dtype.np_dtype) if isinstance(op, Literal)
                    else env[op] if op in env else self._host_array(op, buffers)
                    for op in node.inputs]
            with np.errstate(all="ignore"):
                out = np.asarray(node.prim.impl(*args, **node.attrs))
            out = out.astype(node.output.type.dtype.np_dtype, copy=False)
            env[node.output] = out
            if node.output in self.plan.slots and out.size:
                self.allocator.activate().htod(buffers[self.plan.slots[node.output]].ptr, out)

    def _output(self, o, buffers) -> DeviceArray:
        if isinstance(o, Literal):
            return DeviceArray.from_host(np.full((), o.value, dtype=o.dtype.np_dtype),
                                         self.allocator)
        if o in self.kg.views:
            # A returned view: made contiguous through the host (rare: a transposed output).
            return DeviceArray.from_host(np.array(self._host_array(o, buffers)), self.allocator)
        return buffers[self.plan.slots[o]]


class HostCudaProgram(CudaProgram):
    """A :class:`CudaProgram` with the CPU program's interface (``fusegrad.compile``'s
    ``backend="cuda"``): numpy arrays in, numpy arrays out, copied through the device. When
    any input is a :class:`DeviceArray` (cuda tensors' storage) the outputs stay on the
    device too."""

    def __call__(self, *inputs) -> list:
        outs = super().__call__(*inputs)
        if any(x.__class__ is DeviceArray for x in inputs):
            return outs
        return [o.to_host() for o in outs]

    def kernels(self) -> list[str]:
        return [k.describe() for k in self.kg.kernels]

    def fast_runner(self):
        return None

    @property
    def llvm_ir(self) -> str:
        return ""

    def donate(self, pairs) -> dict[int, int]:
        return {}
