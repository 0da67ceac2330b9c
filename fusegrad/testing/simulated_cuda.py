"""A simulated CUDA driver: device memory in host arrays, kernels run by the lowered IR's
reference interpreter. It lets the CUDA runtime (:mod:`fusegrad.runtime.cuda`) run whole
programs on a machine without a GPU: the memory plan, the launches and their arguments,
the host steps and the GPU-shaped kernels' numbers are all checked; the CUDA C and the
real driver calls are not (see ``benchmarks/gpu_check.sh`` for those)."""

from __future__ import annotations

import numpy as np

from fusegrad.codegen.interpret import numpy_dtype, run_kernel

__all__ = ["SimulatedDriver"]


class SimulatedDriver:
    """A :class:`fusegrad.runtime.cuda.Driver` with no device. ``max_grid`` caps the blocks
    a launch runs (the kernels' grid-stride loops cover the rest), to keep it fast."""

    name = "simulated"
    needs_ptx = False

    def __init__(self, max_grid: int = 4):
        self.memory: dict[int, np.ndarray] = {}
        self.next = 1 << 20
        self.max_grid = max_grid
        self.launches: list[tuple[str, int, int]] = []
        self.mallocs = 0

    def device_count(self) -> int:
        return 1

    def malloc(self, nbytes: int) -> int:
        ptr = self.next
        self.next += (nbytes + 255) // 256 * 256 + 256
        self.memory[ptr] = np.zeros(max(nbytes, 1), dtype=np.uint8)
        self.mallocs += 1
        return ptr

    def free(self, ptr: int) -> None:
        del self.memory[ptr]

    def htod(self, ptr: int, host: np.ndarray) -> None:
        raw = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        self.memory[ptr][:raw.size] = raw

    def dtoh(self, host: np.ndarray, ptr: int) -> None:
        raw = host.reshape(-1).view(np.uint8)
        raw[...] = self.memory[ptr][:raw.size]

    def dtod(self, dst: int, src: int, nbytes: int) -> None:
        self.memory[dst][:nbytes] = self.memory[src][:nbytes]

    def load_module(self, ptx: bytes, kernels: dict):
        return kernels

    def function(self, module, name: str):
        return module[name]

    def launch(self, fn, grid: int, block: int, args: list[int]) -> None:
        self.launches.append((fn.name, grid, block))
        arrays = []
        for p, ptr in zip(fn.params, args):
            dt = numpy_dtype(p.dtype)
            mem = self.memory[ptr]
            arrays.append(mem[:mem.size // dt.itemsize * dt.itemsize].view(dt))
        run_kernel(fn, arrays, grid=min(grid, self.max_grid))

    def synchronize(self) -> None:
        pass
