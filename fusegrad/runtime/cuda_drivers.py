"""The CUDA driver behind the runtime: which one (cuda-python's bindings, else pycuda), the
process's choice of it, its devices and the current one per thread.

The few driver calls the runtime makes sit behind :class:`Driver`; one implementation uses
NVIDIA's cuda-python bindings (``cuda.bindings.driver``: ``pip install fusegrad[cuda]``, what
CUDA images ship), one pycuda (``pip install fusegrad[pycuda]``). :func:`driver` picks the
first that imports and says what to install when none does; no CUDA package is imported on a
machine without the driver library. Each thread makes a device's context current for itself;
pycuda's pushed contexts are popped when their thread ends and at exit.
``FUSEGRAD_CUDA_SYNC=1`` waits for each kernel and names the one that faulted. A program's
modules are unloaded when it is collected (:func:`unload_pending`).
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import glob
import importlib.util
import os
import sys
import threading
from typing import Protocol

import numpy as np

from fusegrad.config import config
from fusegrad.runtime.errors import OutOfMemoryError

__all__ = ["CudaUnavailable", "INSTALL_HINT", "Driver", "CudaPythonDriver", "PyCudaDriver",
           "find_libcuda", "driver", "set_driver", "device_count", "is_available", "synchronize",
           "check_ordinal", "current_device", "set_device", "unload_pending"]

INSTALL_HINT = ("install NVIDIA's CUDA Python bindings (pip install 'fusegrad[cuda]', which "
                "brings cuda-bindings and nvidia-cuda-nvrtc) or pycuda (pip install "
                "'fusegrad[pycuda]')")


class CudaUnavailable(RuntimeError):
    """No CUDA driver, device or compiler: the message says what is missing."""

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
    def stream_handle(self) -> int: ...                  # the CUstream of this thread's device
    # CUDA graphs (mode="reduce-overhead"): the launches between begin_capture and
    # end_capture are recorded on the stream, not run; graph_launch replays them.
    def htod_async(self, ptr: int, host: np.ndarray) -> None: ...   # no wait for the device
    def begin_capture(self) -> None: ...
    def end_capture(self) -> object: ...                  # the instantiated graph
    def graph_launch(self, graph) -> None: ...
    def graph_destroy(self, graph, ordinal: int) -> None: ...  # frees what end_capture made


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
        from cuda.bindings import driver as cu  # optional: NVIDIA's bindings (fusegrad[cuda])
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

    def stream_handle(self) -> int:
        return int(self.stream)

    def htod_async(self, ptr: int, host: np.ndarray) -> None:
        # From pageable memory the driver stages the bytes before it returns (CUDA's "API
        # synchronization behavior"), so ``host`` may be a temporary, and nothing waits.
        host = np.ascontiguousarray(host)
        self._check(self.cu.cuMemcpyHtoDAsync(ptr, host.ctypes.data, host.nbytes, self.stream))

    def begin_capture(self) -> None:
        mode = self.cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self._check(self.cu.cuStreamBeginCapture(self.stream, mode))

    def end_capture(self):
        graph = self._check(self.cu.cuStreamEndCapture(self.stream))
        executable = self._check(self.cu.cuGraphInstantiateWithFlags(graph, 0))
        # The executable keeps what it needs; the graph it was made from is freed now.
        self._check(self.cu.cuGraphDestroy(graph))
        return executable

    def graph_launch(self, graph) -> None:
        self._check(self.cu.cuGraphLaunch(graph, self.stream))

    def graph_destroy(self, graph, ordinal: int) -> None:
        """Destroy an executable graph of device ``ordinal`` (made current for the call)."""
        self.use(ordinal)
        self._check(self.cu.cuGraphExecDestroy(graph))


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
        import pycuda.driver as drv  # optional: pycuda (fusegrad[pycuda])
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

    def stream_handle(self) -> int:
        return int(self.stream.handle)

    def htod_async(self, ptr: int, host: np.ndarray) -> None:
        self.drv.memcpy_htod_async(ptr, np.ascontiguousarray(host), self.stream)

    def begin_capture(self) -> None:
        self.stream.begin_capture(self.drv.capture_mode.THREAD_LOCAL)

    def end_capture(self):
        return self.stream.end_capture().instance()

    def graph_launch(self, graph) -> None:
        graph.launch(self.stream)

    def graph_destroy(self, graph, ordinal: int) -> None:
        """Nothing: a pycuda GraphExec destroys itself (cuGraphExecDestroy, in its context)
        when it is collected."""


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

# Modules and CUDA graphs of collected programs, released at the next safe point
# (:func:`unload_pending`): a finalizer can run inside a driver call of the same thread (a
# garbage collection there), and unloading then would change the thread's current context
# under that call.
_pending_unloads: list[tuple[Driver, dict[int, object], dict[int, list]]] = []


def _unload_later(drv: Driver, modules: dict[int, object],
                  graphs: dict[int, list] | None = None) -> None:
    """A collected program's finalizer: queue its modules and its executable graphs, by
    device (nothing at interpreter exit, when the driver may be gone; the process's end frees
    the contexts anyway)."""
    if (modules or graphs) and not sys.is_finalizing():
        _pending_unloads.append((drv, modules, graphs if graphs is not None else {}))


def unload_pending() -> None:
    """Destroy the executable graphs and unload the modules of the programs collected since
    the last call (each program call and :func:`empty_cache` start with it); the device that
    was current in this thread is made current again after."""
    while _pending_unloads:
        drv, modules, graphs = _pending_unloads.pop()
        before = getattr(drv, "current", -1)
        # A graph's kernel nodes use the module's functions: the graphs go first.
        for device, execs in list(graphs.items()):
            for graph in execs:
                try:
                    drv.graph_destroy(graph, device)
                except Exception:     # a context already destroyed: nothing left to free
                    pass
        graphs.clear()
        for device, module in list(modules.items()):
            try:
                drv.unload_module(module, device)
            except Exception:     # a context already destroyed: nothing left to unload
                pass
        modules.clear()
        if isinstance(before, int) and before >= 0:
            drv.use(before)
