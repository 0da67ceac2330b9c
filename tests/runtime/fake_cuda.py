"""Fake CUDA driver packages for the driver layer's tests: ``cuda.bindings.driver`` as a
recording object (:class:`FakeCu`) and a ``pycuda`` package written to a folder
(:func:`write_fake_pycuda`), so that :class:`CudaPythonDriver` and :class:`PyCudaDriver`
themselves run without a GPU."""

from __future__ import annotations

import ctypes
import enum
import sys
import textwrap
import threading
import types

CUDA_ERROR_LAUNCH_FAILED = 719
_ERRORS = {1: b"invalid argument", 2: b"out of memory",
           CUDA_ERROR_LAUNCH_FAILED: b"unspecified launch failure"}


class _Attribute(enum.IntEnum):
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


class _CaptureMode(enum.IntEnum):
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1


class FakeCu:
    """``cuda.bindings.driver``: each call is recorded in ``calls`` as (name, thread id,
    arguments) and returns a tuple whose first item is the error code, as the real bindings
    do. A launch of the kernel named ``fault_kernel`` leaves an error that the next
    synchronization reports, as a faulting kernel does."""

    CUdevice_attribute = _Attribute
    CUstreamCaptureMode = _CaptureMode

    def __init__(self, version: int = 13000, capability=(9, 0), memory: int = 1 << 30):
        self.version, self.capability, self.capacity = version, capability, memory
        self.calls: list[tuple] = []
        self.memory: dict[int, bytearray] = {}
        self.next = 1 << 16
        self.fault_kernel: str | None = None
        self.pending = 0
        self.modules = 0
        self.graphs = 0
        self.live_execs: list[str] = []       # executable graphs not yet destroyed

    def _record(self, name, *args):
        self.calls.append((name, threading.get_ident(), args))

    def called(self, name: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == name]

    def cuInit(self, flags):
        return (0,)

    def cuDriverGetVersion(self):
        self._record("cuDriverGetVersion")
        return (0, self.version)

    def cuDeviceGetCount(self):
        return (0, 1)

    def cuDeviceGet(self, i):
        return (0, i)

    def cuDeviceGetAttribute(self, attr, dev):
        return (0, self.capability[0 if attr == _Attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
                                   else 1])

    def cuDeviceGetName(self, n, dev):
        return (0, b"Fake GPU\0")

    def cuDevicePrimaryCtxRetain(self, dev):
        return (0, f"ctx{dev}")

    def cuCtxSetCurrent(self, ctx):
        self._record("cuCtxSetCurrent", ctx)
        return (0,)

    def cuStreamCreate(self, flags):
        return (0, "stream")

    def cuStreamSynchronize(self, stream):
        err, self.pending = self.pending, 0
        return (err,)

    def cuMemAlloc(self, n):
        if sum(map(len, self.memory.values())) + n > self.capacity:
            return (2, 0)
        ptr, self.next = self.next, self.next + n + 4096
        self.memory[ptr] = bytearray(n)
        return (0, ptr)

    def cuMemFree(self, ptr):
        del self.memory[ptr]
        return (0,)

    def cuMemGetInfo(self):
        return (0, self.capacity - sum(map(len, self.memory.values())), self.capacity)

    def _at(self, ptr: int) -> tuple[bytearray, int]:
        for start, mem in self.memory.items():
            if start <= ptr < start + len(mem):
                return mem, ptr - start
        raise AssertionError(f"no allocation holds {ptr:#x}")

    def cuMemcpyHtoDAsync(self, ptr, host, n, stream):
        mem, off = self._at(ptr)
        mem[off:off + n] = ctypes.string_at(host, n)
        return (0,)

    def cuMemcpyDtoHAsync(self, host, ptr, n, stream):
        mem, off = self._at(ptr)
        ctypes.memmove(host, bytes(mem[off:off + n]), n)
        return (0,)

    def cuMemcpyDtoDAsync(self, dst, src, n, stream):
        smem, soff = self._at(src)
        dmem, doff = self._at(dst)
        dmem[doff:doff + n] = smem[soff:soff + n]
        return (0,)

    def cuModuleLoadData(self, image):
        self.modules += 1
        self._record("cuModuleLoadData", bytes(image))
        return (0, f"module{self.modules}")

    def cuModuleUnload(self, module):
        self._record("cuModuleUnload", module)
        return (0,)

    def cuModuleGetFunction(self, module, name):
        return (0, name.decode())

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, args, extra):
        self._record("cuLaunchKernel", fn, gx, bx)
        if fn == self.fault_kernel:
            self.pending = CUDA_ERROR_LAUNCH_FAILED        # reported at the next sync
        return (0,)

    # CUDA graphs: a capture records the launches; graphs and executable graphs are names.
    def cuStreamBeginCapture(self, stream, mode):
        self._record("cuStreamBeginCapture", stream)
        return (0,)

    def cuStreamEndCapture(self, stream):
        self.graphs += 1
        return (0, f"graph{self.graphs}")

    def cuGraphInstantiateWithFlags(self, graph, flags):
        self.live_execs.append(f"exec{graph[5:]}")
        return (0, self.live_execs[-1])

    def cuGraphDestroy(self, graph):
        return (0,)

    def cuGraphExecDestroy(self, graph):
        self._record("cuGraphExecDestroy", graph)
        self.live_execs.remove(graph)
        return (0,)

    def cuGraphLaunch(self, graph, stream):
        self._record("cuGraphLaunch", graph)
        return (0,)

    def cuGetErrorString(self, err):
        return (0, _ERRORS.get(int(err), b"unknown error"))


def install_fake_cu(monkeypatch, fake: FakeCu) -> None:
    """Make ``from cuda.bindings import driver`` give ``fake``."""
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = fake
    cuda = types.ModuleType("cuda")
    cuda.bindings = bindings
    monkeypatch.setitem(sys.modules, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", fake)


# pycuda keeps a context stack per thread and aborts the process at its module cleanup when
# the stack is not empty; the fake does the same from an atexit handler registered when it
# is imported (so it runs after any handler registered later), and prints each push and pop.
FAKE_PYCUDA_DRIVER = '''
import atexit, os, sys, threading

_stacks = {}       # thread id -> its stack (pycuda's is C++ thread-local storage)
LOG = []


def _stack():
    return _stacks.setdefault(threading.get_ident(), [])


def _log(event):
    LOG.append((event, threading.get_ident()))
    print(event, threading.get_ident() == threading.main_thread().ident, flush=True)


class MemoryError(Exception):
    pass


def init():
    pass


def get_driver_version():
    return 13000


class Context:
    def __init__(self, ordinal):
        self.ordinal = ordinal

    def push(self):
        _stack().append(self)
        _log("push")

    @staticmethod
    def pop():
        _stack().pop()
        _log("pop")


class Device:
    def __init__(self, ordinal):
        self.ordinal = ordinal

    @staticmethod
    def count():
        return 1

    def compute_capability(self):
        return (9, 0)

    def retain_primary_context(self):
        return Context(self.ordinal)

    def name(self):
        return "Fake GPU"


class Stream:
    def synchronize(self):
        pass


def mem_get_info():
    return (1 << 30, 1 << 30)


class _Allocation(int):
    def free(self):
        pass


def mem_alloc(nbytes):
    if nbytes > 1 << 30:
        raise MemoryError("cuMemAlloc failed: out of memory")
    return _Allocation(1 << 20)


def _cleanup():
    if any(_stacks.values()):
        sys.stderr.write("PyCUDA ERROR: The context stack was not empty upon module cleanup.\\n")
        sys.stderr.flush()
        os._exit(134)


atexit.register(_cleanup)
'''


def write_fake_pycuda(folder) -> None:
    """Write the fake ``pycuda`` package into ``folder``."""
    pkg = folder / "pycuda"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "driver.py").write_text(textwrap.dedent(FAKE_PYCUDA_DRIVER))
