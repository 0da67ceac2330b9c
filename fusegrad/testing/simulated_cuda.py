"""A simulated CUDA driver: device memory in host arrays, kernels run by the lowered IR's
reference interpreter. It lets the CUDA runtime (:mod:`fusegrad.runtime.cuda`) run whole
programs on a machine without a GPU: the memory plan, the launches and their arguments,
the host steps and the GPU-shaped kernels' numbers are all checked; the CUDA C and the
real driver calls are not (see ``benchmarks/gpu_check.sh`` for those).

Like a real driver it takes pointers into the middle of an allocation (views of a cuda
tensor pass ``base + offset``), and with ``devices=2`` it pretends to have two devices:
each allocation belongs to the device current when it was made, and using it while
another device is current raises, as an illegal address would on a GPU. With ``memory=N``
each device holds N bytes, and an allocation beyond them raises the driver's out-of-memory
error, so that the caching allocator's retry and message can be checked. ``kernels`` lists
every kernel of every module loaded (:mod:`fusegrad.testing.nvcc` compiles them)."""

from __future__ import annotations

import bisect

import numpy as np

from fusegrad.codegen.interpret import numpy_dtype, run_kernel
from fusegrad.runtime.errors import OutOfMemoryError

__all__ = ["SimulatedDriver"]


class SimulatedDriver:
    """A :class:`fusegrad.runtime.cuda.Driver` with no device. ``max_grid`` caps the blocks
    a launch runs (the kernels' grid-stride loops cover the rest), to keep it fast;
    ``devices`` is how many devices it reports, ``memory`` the bytes of each (80 GiB, an
    H100's, by default); its devices say they are of compute capability 9.0."""

    name = "simulated"
    needs_ptx = False
    capability = (9, 0)

    def __init__(self, max_grid: int = 4, devices: int = 1, memory: int = 80 << 30):
        self.memory: dict[int, np.ndarray] = {}
        self.owner: dict[int, int] = {}       # allocation -> device it was made on
        self.starts: list[int] = []           # allocations, sorted
        self.next = 1 << 20
        self.max_grid = max_grid
        self.devices = devices
        self.current = 0
        self.launches: list[tuple[str, int, int]] = []
        self.mallocs = 0
        self.capacity = memory
        self.in_use = [0] * devices              # bytes allocated, per device
        self.unloaded: list[object] = []         # modules given to unload_module
        self.kernels: list = []                  # every LoweredKernel of every module loaded

    def compute_capability(self, ordinal: int) -> tuple[int, int]:
        return self.capability

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current device."""
        return self.capacity - self.in_use[self.current], self.capacity

    def device_count(self) -> int:
        return self.devices

    def device_name(self, ordinal: int) -> str:
        return f"fusegrad simulated CUDA device {ordinal}"

    def use(self, ordinal: int) -> None:
        if not 0 <= ordinal < self.devices:
            raise RuntimeError(f"CUDA error: invalid device ordinal {ordinal}")
        self.current = ordinal

    def malloc(self, nbytes: int) -> int:
        if self.in_use[self.current] + nbytes > self.capacity:
            raise OutOfMemoryError("CUDA error: out of memory")
        self.in_use[self.current] += max(nbytes, 1)
        ptr = self.next
        self.next += (nbytes + 255) // 256 * 256 + 256
        self.memory[ptr] = np.zeros(max(nbytes, 1), dtype=np.uint8)
        self.owner[ptr] = self.current
        bisect.insort(self.starts, ptr)
        self.mallocs += 1
        return ptr

    def free(self, ptr: int) -> None:
        self._check_device(ptr)
        self.in_use[self.current] -= self.memory[ptr].size
        del self.memory[ptr], self.owner[ptr]
        self.starts.remove(ptr)

    def _check_device(self, start: int) -> None:
        if self.owner[start] != self.current:
            raise RuntimeError(f"CUDA error: an illegal memory access was encountered (memory "
                               f"of device {self.owner[start]} used on device {self.current})")

    def resolve(self, ptr: int) -> np.ndarray:
        """The bytes of the allocation holding ``ptr``, from ``ptr`` to its end."""
        i = bisect.bisect_right(self.starts, ptr) - 1
        start = self.starts[i] if i >= 0 else None
        if start is None or ptr >= start + self.memory[start].size:
            raise RuntimeError(f"CUDA error: an illegal memory access was encountered "
                               f"(address {ptr:#x})")
        self._check_device(start)
        return self.memory[start][ptr - start:]

    def htod(self, ptr: int, host: np.ndarray) -> None:
        raw = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        self.resolve(ptr)[:raw.size] = raw

    def dtoh(self, host: np.ndarray, ptr: int) -> None:
        raw = host.reshape(-1).view(np.uint8)
        raw[...] = self.resolve(ptr)[:raw.size]

    def dtod(self, dst: int, src: int, nbytes: int) -> None:
        self.resolve(dst)[:nbytes] = self.resolve(src)[:nbytes].copy()

    def load_module(self, ptx: bytes, kernels: dict):
        self.kernels.extend(kernels.values())
        return kernels

    def unload_module(self, module, ordinal: int) -> None:
        self.unloaded.append(module)

    def function(self, module, name: str):
        return module[name]

    def launch(self, fn, grid: int, block: int, args: list[int]) -> None:
        self.launches.append((fn.name, grid, block))
        arrays = []
        for p, ptr in zip(fn.params, args):
            dt = numpy_dtype(p.dtype)
            mem = self.resolve(ptr)
            arrays.append(mem[:mem.size // dt.itemsize * dt.itemsize].view(dt))
        run_kernel(fn, arrays, grid=min(grid, self.max_grid))

    def synchronize(self) -> None:
        pass
