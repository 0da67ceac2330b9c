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
error, so that the caching allocator's retry and message can be checked. ``live_graphs``
holds the executable CUDA graphs not yet destroyed, and ``kernels`` lists every kernel of
every module loaded (:mod:`fusegrad.testing.nvcc` compiles them).

With ``cublas=True`` it has a cuBLASLt of its own (:class:`SimulatedCublasLt`, numpy
behind the library's C interface), so matmuls take the runtime's cuBLASLt path
(:mod:`fusegrad.runtime.cublas`) with every argument marshalled as for the real library."""

from __future__ import annotations

import bisect
import ctypes

import numpy as np

from fusegrad.codegen.interpret import numpy_dtype, run_kernel
from fusegrad.runtime import cublas
from fusegrad.runtime.errors import OutOfMemoryError

__all__ = ["SimulatedDriver", "SimulatedCublasLt"]


class SimulatedDriver:
    """A :class:`fusegrad.runtime.cuda.Driver` with no device. ``max_grid`` caps the blocks
    a launch runs (the kernels' grid-stride loops cover the rest), to keep it fast;
    ``devices`` is how many devices it reports, ``memory`` the bytes of each (80 GiB, an
    H100's, by default); its devices say they are of compute capability 9.0."""

    name = "simulated"
    needs_ptx = False
    capability = (9, 0)

    def __init__(self, max_grid: int = 4, devices: int = 1, memory: int = 80 << 30,
                 cublas: bool = False):
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
        self.syncs = 0                 # calls that wait for the device (synchronize, dtoh, htod)
        self.capture: list | None = None  # the work recorded since begin_capture
        self.live_graphs: list[list] = []  # executable graphs made and not yet destroyed
        # None: no cuBLASLt (matmuls run the generated kernel)
        self.cublaslt_library = SimulatedCublasLt(self) if cublas else None
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

    def _not_capturing(self, what: str) -> None:
        """A call that a stream capture forbids (it would wait for, or allocate on, the
        device) raises the driver's error, as cuStreamBeginCapture's modes make it do."""
        if self.capture is not None:
            raise RuntimeError(f"CUDA error: operation not permitted when stream is capturing "
                               f"({what})")

    def enqueue(self, work) -> None:
        """Run ``work`` (a stream operation) now, or record it into the capture."""
        if self.capture is not None:
            self.capture.append(work)
        else:
            work()

    def begin_capture(self) -> None:
        self._not_capturing("cuStreamBeginCapture")
        self.capture = []

    def end_capture(self) -> list:
        graph, self.capture = self.capture, None
        self.live_graphs.append(graph)
        return graph

    def graph_destroy(self, graph: list, ordinal: int) -> None:
        """cuGraphExecDestroy: ``live_graphs`` loses the graph (destroying one twice, or one
        this driver did not make, raises)."""
        i = next((i for i, g in enumerate(self.live_graphs) if g is graph), None)
        if i is None:
            raise RuntimeError("CUDA error: invalid resource handle (graph destroyed twice)")
        del self.live_graphs[i]

    def graph_launch(self, graph: list) -> None:
        self._not_capturing("cuGraphLaunch")
        self.graph_launches += 1
        for work in graph:
            work()

    graph_launches = 0

    def malloc(self, nbytes: int) -> int:
        self._not_capturing("cuMemAlloc")
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
        self._not_capturing("cuMemcpyHtoD")
        self.syncs += 1                # the real drivers wait: ``host`` may be a temporary
        self.htod_async(ptr, host)

    def htod_async(self, ptr: int, host: np.ndarray) -> None:
        self._not_capturing("cuMemcpyHtoDAsync")
        raw = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        self.resolve(ptr)[:raw.size] = raw

    def dtoh(self, host: np.ndarray, ptr: int) -> None:
        self._not_capturing("cuMemcpyDtoH")
        self.syncs += 1
        raw = host.reshape(-1).view(np.uint8)
        raw[...] = self.resolve(ptr)[:raw.size]

    def dtod(self, dst: int, src: int, nbytes: int) -> None:
        def copy():
            self.resolve(dst)[:nbytes] = self.resolve(src)[:nbytes].copy()
        self.enqueue(copy)

    def load_module(self, ptx: bytes, kernels: dict):
        self.kernels.extend(kernels.values())
        return kernels

    def unload_module(self, module, ordinal: int) -> None:
        self.unloaded.append(module)

    def function(self, module, name: str):
        return module[name]

    def launch(self, fn, grid: int, block: int, args: list[int]) -> None:
        self.enqueue(lambda: self._launch(fn, grid, block, list(args)))

    def _launch(self, fn, grid: int, block: int, args: list[int]) -> None:
        self.launches.append((fn.name, grid, block))
        arrays = []
        for p, ptr in zip(fn.params, args):
            dt = numpy_dtype(p.dtype)
            mem = self.resolve(ptr)
            arrays.append(mem[:mem.size // dt.itemsize * dt.itemsize].view(dt))
        run_kernel(fn, arrays, grid=min(grid, self.max_grid))

    def synchronize(self) -> None:
        self._not_capturing("cuStreamSynchronize")
        self.syncs += 1

    def stream_handle(self) -> int:
        return 0


# cudaDataType_t -> numpy dtype of the stored elements; bfloat16 as its 16 bits
_DATA_TYPES = {0: np.dtype(np.float32), 1: np.dtype(np.float64), 2: np.dtype(np.float16),
               14: np.dtype(np.uint16)}
_NAMES = {v: k for k, v in cublas.EPILOGUE.items()}


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)   # round to nearest even


def _tf32(x: np.ndarray) -> np.ndarray:
    """float32 rounded to TF32's 10 mantissa bits (to nearest), as the tensor cores read it."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x1000) & np.uint32(0xFFFFE000)).view(np.float32)


class SimulatedCublasLt:
    """cuBLASLt's C functions (the ones :data:`fusegrad.runtime.cublas.SIGNATURES` names)
    in numpy, over a :class:`SimulatedDriver`'s memory. Arguments arrive as the ctypes
    binding passes them to the library: out-parameters as pointers, attribute values as
    addresses and sizes, read back here as bytes. ``calls`` records each matmul (its
    epilogue, compute type and cuBLAS's m, n, k)."""

    workspace_bytes = 0

    def __init__(self, drv: SimulatedDriver):
        self.drv = drv
        self.objects: dict[int, dict] = {}
        self.calls: list[dict] = []

    def _new(self, out, **fields) -> int:
        key = len(self.objects) + 1
        self.objects[key] = fields
        out.contents.value = key
        return cublas.STATUS_SUCCESS

    def _set(self, obj: int, attr: int, address: int, size: int) -> int:
        self.objects[obj][attr] = ctypes.string_at(address, size)
        return cublas.STATUS_SUCCESS

    def _attr(self, obj: int, attr: int, ctype, default=0):
        raw = self.objects[obj].get(attr)
        return default if raw is None else ctype.from_buffer_copy(raw).value

    def cublasLtGetVersion(self) -> int:
        return 120000

    def cublasLtGetStatusString(self, status: int) -> bytes:
        # the library's own texts
        return {cublas.STATUS_SUCCESS: b"success",
                cublas.STATUS_NOT_SUPPORTED: b"the requested functionality is not supported"}.get(
                    status, b"an unsupported value or parameter was passed to the function")

    def cublasLtCreate(self, out) -> int:
        return self._new(out, kind="handle")

    def cublasLtMatmulDescCreate(self, out, compute: int, scale: int) -> int:
        return self._new(out, kind="desc", compute=compute, scale=scale)

    def cublasLtMatrixLayoutCreate(self, out, dt: int, rows: int, cols: int, ld: int) -> int:
        if ld < max(rows, 1):
            return 7                                   # CUBLAS_STATUS_INVALID_VALUE
        return self._new(out, kind="layout", dt=dt, rows=rows, cols=cols, ld=ld)

    def cublasLtMatmulPreferenceCreate(self, out) -> int:
        return self._new(out, kind="pref")

    cublasLtMatmulDescSetAttribute = cublasLtMatrixLayoutSetAttribute = _set
    cublasLtMatmulPreferenceSetAttribute = _set

    def _destroy(self, obj: int) -> int:
        self.objects.pop(obj)
        return cublas.STATUS_SUCCESS

    cublasLtDestroy = cublasLtMatmulDescDestroy = cublasLtMatrixLayoutDestroy = _destroy
    cublasLtMatmulPreferenceDestroy = _destroy

    def cublasLtMatmulAlgoGetHeuristic(self, handle, desc, a, b, c, d, pref, requested, results,
                                       count) -> int:
        supported = self.objects[a]["dt"] in _DATA_TYPES
        results.contents.state = cublas.STATUS_SUCCESS
        count.contents.value = 1 if supported and requested >= 1 else 0
        return cublas.STATUS_SUCCESS

    def _matrix(self, ptr: int, lay: dict) -> np.ndarray:
        """The (batch, rows, cols) column-major matrices of layout ``lay`` at ``ptr``, as a
        view of the device memory."""
        dt = _DATA_TYPES[lay["dt"]]
        mem = self.drv.resolve(ptr)
        flat = mem[:mem.size // dt.itemsize * dt.itemsize].view(dt)
        return np.lib.stride_tricks.as_strided(
            flat, shape=(lay["batch"], lay["rows"], lay["cols"]),
            strides=(lay["stride"] * dt.itemsize, dt.itemsize, lay["ld"] * dt.itemsize))

    def cublasLtMatmul(self, handle, desc, alpha, a, a_desc, b, b_desc, beta, c, c_desc, d,
                       d_desc, algo, workspace, workspace_size, stream) -> int:
        # What the library reads at the call (the descriptors, alpha and beta) is read now;
        # the product runs on the stream (or is captured into a graph).
        args = self._read_call(desc, alpha, beta)
        layouts = {k: dict(self.objects[v], batch=self._attr(v, cublas.LAYOUT_BATCH_COUNT,
                                                             ctypes.c_int32, 1),
                           stride=self._attr(v, cublas.LAYOUT_STRIDED_BATCH_OFFSET,
                                             ctypes.c_int64, 0))
                   for k, v in (("a", a_desc), ("b", b_desc), ("c", c_desc), ("d", d_desc))}
        self.drv.enqueue(lambda: self._matmul(args, layouts, a, b, c, d))
        return cublas.STATUS_SUCCESS

    def _read_call(self, desc: int, alpha: int, beta: int) -> dict:
        scalar = ctypes.c_double if self.objects[desc]["scale"] == 1 else ctypes.c_float
        return {"compute": self.objects[desc]["compute"],
                "alpha": scalar.from_address(alpha).value,
                "beta": scalar.from_address(beta).value,
                "trans_a": self._attr(desc, cublas.DESC_TRANSA, ctypes.c_int32) == cublas.OP_T,
                "trans_b": self._attr(desc, cublas.DESC_TRANSB, ctypes.c_int32) == cublas.OP_T,
                "epilogue": _NAMES[self._attr(desc, cublas.DESC_EPILOGUE, ctypes.c_uint32, 1)],
                "bias": self._attr(desc, cublas.DESC_BIAS_POINTER, ctypes.c_void_p),
                "aux": self._attr(desc, cublas.DESC_EPILOGUE_AUX_POINTER, ctypes.c_void_p),
                "aux_ld": self._attr(desc, cublas.DESC_EPILOGUE_AUX_LD, ctypes.c_int64)}

    def _matmul(self, args: dict, layouts: dict, a: int, b: int, c: int, d: int) -> None:
        compute, epilogue, stored = args["compute"], args["epilogue"], layouts["d"]["dt"]

        def load(x: np.ndarray) -> np.ndarray:
            x = _bf16_to_f32(x) if stored == 14 else x
            x = _tf32(x) if compute == cublas.COMPUTE["32F_FAST_TF32"] else x
            return x.astype(np.float64)
        x = load(self._matrix(a, layouts["a"]))
        y = load(self._matrix(b, layouts["b"]))
        x = x.transpose(0, 2, 1) if args["trans_a"] else x
        y = y.transpose(0, 2, 1) if args["trans_b"] else y
        assert x.shape[2] == y.shape[1], (x.shape, y.shape)
        acc = args["alpha"] * np.matmul(x, y)
        if args["beta"]:
            acc += args["beta"] * load(self._matrix(c, layouts["c"]))
        if "BIAS" in epilogue:
            rows = acc.shape[1]
            bias = self.drv.resolve(args["bias"])[:rows * _DATA_TYPES[stored].itemsize]
            acc += load(bias.view(_DATA_TYPES[stored]))[None, :, None]
        out = self._matrix(d, layouts["d"])

        def store(dst: np.ndarray, value: np.ndarray) -> None:
            dst[...] = _f32_to_bf16(value) if stored == 14 else value.astype(dst.dtype)
        if "AUX" in epilogue:
            assert layouts["d"]["rows"] <= args["aux_ld"]
            aux = np.lib.stride_tricks.as_strided(
                self.drv.resolve(args["aux"]).view(out.dtype), shape=out.shape,
                strides=(out.strides[0], out.itemsize, args["aux_ld"] * out.itemsize))
            store(aux, acc)
        if epilogue.startswith("RELU"):
            acc = np.where(acc <= 0, 0.0, acc)
        elif epilogue.startswith("GELU"):
            acc = 0.5 * acc * (1 + np.tanh(0.7978845608028654 * (acc + 0.044715 * acc ** 3)))
        store(out, acc)
        self.calls.append({"epilogue": epilogue, "compute": compute, "m": out.shape[1],
                           "n": out.shape[2], "k": x.shape[2], "batch": out.shape[0]})
        self.drv.launches.append(("cublasLtMatmul", 1, 0))
