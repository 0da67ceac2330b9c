"""Run a partitioned graph on an NVIDIA GPU: compile, cache, allocate, copy, launch.

Nothing here imports a CUDA package or touches a driver until a CUDA device is asked for.
This module holds the programs and gathers the runtime's CUDA names; the jobs below each have
a module of their own.

- **Compiling** (:mod:`~fusegrad.runtime.cuda_compile`): :func:`compile_cuda` turns CUDA C
  into machine code with NVRTC (else ``nvcc``), cached on disk like the CPU's object code.
- **Driver** (:mod:`~fusegrad.runtime.cuda_drivers`): the few driver calls the runtime makes
  sit behind :class:`Driver` (cuda-python's bindings, else pycuda); :func:`driver` picks the
  first that imports and says what to install when none does.
- **Memory** (:mod:`~fusegrad.runtime.cuda_memory`): :class:`CachingAllocator` rounds and
  caches allocations as torch's caching allocator does, and raises
  :class:`OutOfMemoryError` with torch's message; :class:`DeviceArray` is a tensor's storage.
- **Programs**: :class:`CudaProgram` lowers each kernel of a kernel graph to the GPU
  (:func:`fusegrad.codegen.gpu_lowering.lower_kernel`), compiles them as one module, takes
  its buffers from the shared memory plan (:mod:`fusegrad.runtime.memory_plan`) and launches
  the kernels in order on one stream; a matmul kernel runs as ``cublasLtMatmul`` where
  cuBLASLt is found and takes it (:mod:`~fusegrad.runtime.cublas`). A kernel with no GPU
  lowering (an extern primitive other than the fused attention and index_add) runs its numpy
  reference on host copies of its operands.
"""
from __future__ import annotations

import dataclasses
import warnings
import weakref

import numpy as np

from fusegrad import profiling
from fusegrad.codegen.cuda.printer import cuda_source
from fusegrad.codegen.gpu_lowering import indices_fit, launch_grid, lower_kernel
from fusegrad.codegen.values import SYMBOLS, program_symbols
from fusegrad.config import config
from fusegrad.ir.graph import Literal, Value
from fusegrad.ir.interpreter import bind_symbols
from fusegrad.ir.kernel_graph import KernelGraph, View, identity_view
from fusegrad.ir.specialize import concrete_attr
from fusegrad.ops.lowering import Unsupported
from fusegrad.runtime.cublas import BlasMatmul, cublaslt_for, gemm_at, plan_blas, tf32_allowed
from fusegrad.runtime.cuda_compile import (  # noqa: F401
    _nvcc_compile,
    _nvrtc,
    _nvrtc_compile,
    check_driver_compatible,
    compile_cuda,
    find_nvrtc,
    is_machine_code,
    machine_arch,
    nvrtc_arch_list,
    nvrtc_package,
    nvrtc_version,
)
from fusegrad.runtime.cuda_drivers import (  # noqa: F401
    INSTALL_HINT,
    CudaPythonDriver,
    CudaUnavailable,
    Driver,
    PyCudaDriver,
    _pending_unloads,
    _unload_later,
    check_ordinal,
    current_device,
    device_count,
    driver,
    find_libcuda,
    is_available,
    set_device,
    set_driver,
    synchronize,
    unload_pending,
)
from fusegrad.runtime.cuda_memory import (  # noqa: F401
    CachingAllocator,
    DeviceArray,
    _contiguous_byte_strides,
    allocation_size,
    allocator_of,
    empty_cache,
    format_size,
    memory_stats,
    register_array_kernels,
    reset_peak_memory_stats,
    round_size,
)
from fusegrad.runtime.errors import OutOfMemoryError
from fusegrad.runtime.memory_plan import plan_memory
from fusegrad.symint import (
    SizesOutOfRange,
    SymbolicDecisionError,
    evaluate_dim,
    evaluate_shape,
    strict_decisions,
)

__all__ = ["CudaUnavailable", "OutOfMemoryError", "Driver", "driver", "device_count",
           "is_available", "synchronize", "current_device", "set_device", "check_ordinal",
           "memory_stats", "empty_cache", "reset_peak_memory_stats", "compile_cuda",
           "find_nvrtc", "nvrtc_version", "nvrtc_arch_list", "nvrtc_package",
           "check_driver_compatible", "CachingAllocator", "round_size", "allocation_size",
           "DeviceArray", "CudaProgram", "HostCudaProgram", "INSTALL_HINT"]

# --------------------------------------------------------------------------- programs

# A program of symbolic sizes keeps the CUDA graphs of this many sizes per device (the most
# recently used): a captured graph holds its buffers' addresses and its launches' grids.
CUDA_GRAPH_SIZES = 8


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
    :class:`DeviceArray` inputs, get :class:`DeviceArray` outputs.

    A kernel graph of symbolic sizes (``f32[s0,784]``) compiles to one program for every
    size: its kernels read the sizes at run time from a small device buffer of 64-bit
    integers (one per symbol, :func:`~fusegrad.codegen.values.program_symbols`' order), and
    a call binds the symbols from its inputs' shapes and evaluates for them the memory
    plan's shapes, each launch's grid, cuBLASLt's m, n and k, and the views and attributes
    of host steps. A kernel whose code would hold at some sizes only raises
    :class:`~fusegrad.symint.SymbolicDecisionError` here (the caller then builds programs
    per size), and a call whose sizes overflow a kernel's 32-bit indices (chosen at the
    traced sizes) raises :class:`~fusegrad.symint.SizesOutOfRange` before it runs anything
    (the caller runs a program built for them). With ``cuda_graphs`` a graph is captured
    per size."""

    def __init__(self, kg: KernelGraph, drv: Driver | None = None, arch: str | None = None,
                 name: str = "program", cuda_graphs: bool = False):
        self.kg, self.graph, self.name = kg, kg.graph, name
        self.cuda_graphs = cuda_graphs
        # (device, sizes) -> its buffers and CUDA graph, the most recently used last
        self._graphs: dict[tuple, _StaticStep] = {}
        self.graph_skipped: str | None = None          # why calls launch kernel by kernel
        self._timed: list | None = None                # the kernels a profiled call times
        self._timed_names_of: dict[int, list] = {}     # device -> their profiler names
        self.drv = drv or driver()
        arch = arch or machine_arch(getattr(self.drv, "arch", "compute_90"))
        self.plan = plan_memory(kg)
        # Symbolic sizes: their names (the order of the sizes buffer) and this call's values.
        self.symbols = program_symbols(self.graph)
        self.bindings: dict | None = None
        self._sized: dict = {}           # the latest sizes ("key") and the plan's "specs" at them
        self._sizes_buffers: dict[int, tuple] = {}    # device -> (sizes key, its buffer)
        # The buffer of each value: the plan's, and the product's buffer for a value that
        # cuBLASLt writes in a matmul's place (its fused bias or activation).
        self.slots = dict(self.plan.slots)
        self.lowered: dict[int, object] = {}
        self.host_steps: dict[int, str] = {}
        self.blas_steps: dict[int, BlasMatmul] = {}
        self.blas = cublaslt_for(self.drv)
        if self.symbols:
            # Every decision the kernels' code makes must hold for every size.
            with strict_decisions():
                self._lower_kernels()
        else:
            self._lower_kernels()
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
        # The executable CUDA graph of each device (a list: one graph at most), destroyed
        # with the modules.
        self._graph_execs: dict[int, list] = {}
        self._unload = weakref.finalize(self, _unload_later, self.drv, self._modules,
                                        self._graph_execs)
        self._unload.atexit = False
        self._constants: dict[int, dict[int, DeviceArray]] = {}
        self.allocator = None     # the allocator of the device of the latest call

    def _lower_kernels(self) -> None:
        for i, k in enumerate(self.kg.kernels):
            try:
                if k.kind == "matmul" and self.blas is not None and self._plan_blas(i, k):
                    continue
                self.lowered[i] = lower_kernel(k, self.kg)
            except Unsupported as e:
                self.host_steps[i] = str(e)

    def _plan_blas(self, i: int, k) -> bool:
        """Run matmul kernel ``k`` through cuBLASLt (and the rest of its epilogue as an
        elementwise kernel) when it can; False leaves it to the generated kernel."""
        try:
            step = plan_blas(k, self.kg)
        except SymbolicDecisionError:   # a layout known at some sizes only: the kernel's
            return False
        if step is None:
            return False
        try:
            rest = lower_kernel(step.rest, self.kg) if step.rest is not None else None
        except Unsupported:            # the tiled kernel (or its host step) takes all of it
            return False
        self.blas_steps[i] = step
        self.slots.setdefault(step.out, self.plan.slots[step.product])
        if rest is not None:
            self.lowered[i] = rest
        return True

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
        if self.cuda_graphs and self._graphs_possible():
            return self._replay(inputs)
        plan, drv = self.plan, self.drv
        device = self._device_of(inputs)
        allocator = self.allocator = allocator_of(drv, device)
        functions = self._load(device)
        drv.use(device)
        intermediate_specs, output_specs = self._specs(inputs)
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
        if self.symbols:
            buffers[plan.slots[SYMBOLS]] = self._sizes_buffer(device, allocator)
        for slot, (shape, dt) in intermediate_specs.items():
            buffers[slot] = DeviceArray.empty(shape, dt, allocator)
        for slot, shape, dt in output_specs:
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

    # ---------------------------------------------------------------- symbolic sizes

    def _specs(self, inputs) -> tuple[dict, list]:
        """The memory plan's intermediate and output specs (slot, shape, dtype) for a call
        with ``inputs``: the plan's own, or for symbolic sizes its shapes evaluated at the
        sizes the inputs bind (which :attr:`bindings` then holds)."""
        plan = self.plan
        if not self.symbols:
            return plan.intermediate_specs, plan.output_specs
        bindings = bind_symbols(self.graph, [x.shape if x.__class__ is DeviceArray
                                             else np.shape(x) for x in inputs])
        key = tuple(bindings[n] for n in self.symbols)
        if self._sized.get("key") != key:
            wide = [lk.name for lk in self.lowered.values() if not indices_fit(lk, bindings)]
            if wide:
                sizes = ", ".join(f"{n}={bindings[n]}" for n in self.symbols)
                raise SizesOutOfRange(f"{sizes}: kernel {wide[0]} has 32-bit indices (its "
                                      f"sizes fit them when traced)")
            self._sized = {"key": key, "specs": plan.specs_at(bindings)}
        self.bindings = bindings
        return self._sized["specs"]

    def _sizes_key(self) -> tuple[int, ...]:
        """This call's sizes in the order of the sizes buffer."""
        return tuple(self.bindings[n] for n in self.symbols)

    def _sizes_buffer(self, device: int, allocator) -> DeviceArray:
        """The device buffer of this call's sizes, which the kernels read: kept while the
        sizes stay the same; for new sizes a new buffer (launches still queued read the
        old one)."""
        key = self._sizes_key()
        held = self._sizes_buffers.get(device)
        if held is None or held[0] != key:
            held = self._sizes_buffers[device] = (
                key, DeviceArray.from_host(np.array(key, np.int64), allocator))
        return held[1]

    def _view_at(self, view: View) -> View:
        """``view`` with its symbolic shape, strides and offset evaluated for this call."""
        if self.bindings is None:
            return view
        b = self.bindings
        return View(view.base, evaluate_shape(view.shape, b), evaluate_shape(view.strides, b),
                    evaluate_dim(view.offset, b))

    def _attrs_at(self, node) -> dict:
        """``node``'s attributes with their symbolic sizes evaluated for this call."""
        if self.bindings is None:
            return node.attrs
        return {k: concrete_attr(a, self.bindings) for k, a in node.attrs.items()}

    # ---------------------------------------------------------------- CUDA graphs

    def _graphs_possible(self) -> bool:
        """Whether calls can replay a CUDA graph: not with host steps (they wait for the
        device and copy through the host), ``FUSEGRAD_CUDA_SYNC`` or a profiler (both wait
        after each kernel), or a driver that cannot capture. Otherwise the program launches
        kernel by kernel, and says why once (``graph_skipped``), as torch does."""
        reason = None
        host = {i: r for i, r in self.host_steps.items() if i not in self._input_checks()}
        if host:
            first = next(iter(host.values()))
            reason = f"{len(host)} kernel(s) run on the host ({first})"
        elif not hasattr(self.drv, "begin_capture"):
            reason = f"the {self.drv.name} driver cannot capture CUDA graphs"
        elif config.cuda_sync or profiling.recorder is not None:
            return False           # for this call only
        if reason is not None and self.graph_skipped is None:
            self.graph_skipped = reason
            warnings.warn(f"skipping cudagraphs due to {reason}", UserWarning, stacklevel=4)
        return reason is None

    def _input_checks(self) -> dict[int, tuple]:
        """The host steps that only check an input of the program (the class indices of a
        cross-entropy's target: ``check_target``, ``check_index``), by kernel: (node, input
        position), also of a reshape of the input (its elements in the input's order). Their
        output is the input, so a graph copies it on the device, and the check runs on the
        host before the replay."""
        checks = getattr(self, "_checks", None)
        if checks is None:
            checks = self._checks = {}
            positions = {v: j for j, v in enumerate(self.graph.inputs)}
            for i in self.host_steps:
                nodes = self.kg.kernels[i].nodes
                if len(nodes) != 1 or nodes[0].op not in ("check_target", "check_index"):
                    continue
                # The input itself, or a reshape of it (a cross-entropy's ``y.view(-1)``):
                # its elements in the input's order.
                v = nodes[0].inputs[0]
                view = self.kg.views.get(v)
                if view is not None and view == dataclasses.replace(
                        identity_view(v), base=view.base):
                    v = view.base
                elif view is not None:
                    continue
                if v in positions:
                    checks[i] = (nodes[0], positions[v])
        return checks

    def _check_inputs(self, inputs, first: bool) -> None:
        """Run the input checks of :meth:`_input_checks` before a replay: on a host input,
        each call (it costs no wait); on a device input, at the first call only (reading it
        back would wait for the device), with a warning that later calls are not checked."""
        for node, j in self._input_checks().values():
            x = inputs[j]
            if x.__class__ is DeviceArray:
                if not first:
                    continue
                if not getattr(self, "_warned_checks", False):
                    self._warned_checks = True
                    warnings.warn(f"cudagraphs: the {node.attrs.get('op', node.op)} check of a "
                                  f"cuda tensor runs on the first call only (reading it back "
                                  f"would wait for the device)", UserWarning, stacklevel=5)
                x = x.to_host()
            shape = node.inputs[0].type.shape
            if self.bindings is not None:
                shape = evaluate_shape(shape, self.bindings)
            node.prim.impl(np.asarray(x).reshape(shape), **self._attrs_at(node))

    def _replay(self, inputs) -> list[DeviceArray]:
        """A call as one CUDA graph: the inputs are copied into the program's static buffers
        (every address is fixed by the memory plan, so one graph serves every call), the
        graph is launched, and the outputs are copied out of the static buffers (the next
        replay overwrites them). The first call per device runs the kernels once (modules
        load, cuBLASLt makes its handle and plans: nothing a capture may do), then captures
        them. Nothing waits for the device: the copies in and out are asynchronous.

        A program of symbolic sizes keeps a graph (and its buffers) per size, for the
        ``CUDA_GRAPH_SIZES`` sizes used last, as torch's cudagraph trees keep one per
        shape."""
        drv = self.drv
        device = self._device_of(inputs)
        functions = self._load(device)
        drv.use(device)
        self._specs(inputs)
        key = (device, self._sizes_key()) if self.symbols else (device,)
        step = self._graphs.pop(key, None)
        if step is None:
            step = self._static_step(device, inputs)
        self._graphs[key] = step                       # the most recently used, last
        for old in [k for k in self._graphs if k[0] == device][:-CUDA_GRAPH_SIZES]:
            self._drop_graph(device, self._graphs.pop(old))
        tf32 = tf32_allowed()
        if step.graph is not None and step.tf32 != tf32:
            # The graph's cuBLASLt calls hold the compute type read when they were captured:
            # a changed TF32 setting (torch reads it at each call) needs a new capture.
            self._drop_graph(device, step)
        self._check_inputs(inputs, step.graph is None)
        buffers = step.buffers
        for i, x in enumerate(inputs):
            dst = buffers[i]
            if x.__class__ is DeviceArray:
                x = x.contiguous()
                if x.ptr != dst.ptr and x.nbytes:
                    drv.dtod(dst.ptr, x.ptr, x.nbytes)
            else:
                x = np.asarray(x)
                if x.nbytes:
                    drv.htod_async(dst.ptr, x)
        checks = self._input_checks()

        def run_all():
            for i, k in enumerate(self.kg.kernels):
                if i in checks:                  # checked above: the copy is what is left
                    node = checks[i][0]
                    src, dst = buffers[checks[i][1]], buffers[self.slots[node.output]]
                    if src.nbytes:
                        drv.dtod(dst.ptr, src.ptr, src.nbytes)
                else:
                    self._run_kernel(i, k, functions, buffers)
        if step.graph is None:
            run_all()
            drv.begin_capture()
            try:
                run_all()
            finally:
                step.graph = drv.end_capture()
                step.tf32 = tf32
                self._graph_execs.setdefault(device, []).append(step.graph)
        else:
            drv.graph_launch(step.graph)
        self.replays += 1
        return [self._output(o, buffers).copy() for o in self.graph.outputs]

    replays = 0

    def _drop_graph(self, device: int, step: "_StaticStep") -> None:
        """Destroy ``step``'s CUDA graph (a new capture, or none, follows)."""
        if step.graph is not None:
            self.drv.graph_destroy(step.graph, device)
            self._graph_execs[device].remove(step.graph)
            step.graph = None

    def _static_step(self, device: int, inputs) -> "_StaticStep":
        """Buffers for every slot of the memory plan (at this call's sizes), kept for the
        program's life (for symbolic sizes: while its graph is kept)."""
        allocator = self.allocator = allocator_of(self.drv, device)
        intermediate_specs, output_specs = self._specs(inputs)
        buffers: dict[int, DeviceArray] = {}
        for i, x in enumerate(inputs):
            dt = x.dtype if x.__class__ is DeviceArray else np.asarray(x).dtype
            buffers[i] = DeviceArray.empty(np.shape(x) if x.__class__ is not DeviceArray
                                           else x.shape, dt, allocator)
        for slot, arr in self.plan.constants.items():
            buffers[slot] = DeviceArray.from_host(arr, allocator)
        if self.symbols:         # this graph's own sizes (another size's graph has others)
            buffers[self.plan.slots[SYMBOLS]] = DeviceArray.from_host(
                np.array(self._sizes_key(), np.int64), allocator)
        for slot, (shape, dt) in intermediate_specs.items():
            buffers[slot] = DeviceArray.empty(shape, dt, allocator)
        for slot, shape, dt in output_specs:
            buffers[slot] = DeviceArray.empty(shape, dt, allocator)
        return _StaticStep(buffers)

    def _run_kernel(self, i: int, k, functions: dict, buffers: dict) -> None:
        step = self.blas_steps.get(i)
        if step is not None:
            self._run_blas(step, buffers)
        if i in self.lowered:
            lk = self.lowered[i]
            if lk.grid == 0:
                return
            args = [buffers[self.slots[p.value]].ptr for p in lk.params]
            self.drv.launch(functions[i], launch_grid(lk, self.bindings), lk.block, args)
            if config.cuda_sync:
                self._sync_after(lk.name)
        elif step is None:
            self._host_step(k, buffers)

    def _run_blas(self, step: BlasMatmul, buffers: dict) -> None:
        """A matmul kernel's product (with its fused epilogue) by ``cublasLtMatmul``."""
        bindings = self.bindings

        def pointer(value_offset) -> int:
            value, offset = value_offset
            if bindings is not None:
                offset = evaluate_dim(offset, bindings)
            return buffers[self.slots[value]].ptr + offset * value.type.dtype.itemsize
        slots = self.slots
        gemm = step.gemm if bindings is None else gemm_at(step.gemm, bindings)
        self.blas.matmul(self.drv.current, gemm, pointer(step.a), pointer(step.b),
                         buffers[slots[step.out]].ptr,
                         bias=pointer(step.bias) if step.bias is not None else 0,
                         aux=buffers[slots[step.aux]].ptr if step.aux is not None else 0,
                         stream=self.drv.stream_handle())
        if config.cuda_sync:
            self._sync_after(f"cublasLtMatmul ({step.kernel.name})")

    def _run_kernels_timed(self, rec: "profiling.Recorder", functions: dict, buffers: dict,
                           device: int) -> None:
        """The kernels, each an event of the profiler's: named as the CPU runtime names
        them (``step::k3[elementwise 512](mul,add)``; a host step ``k5.host[...]``) and
        timed from the host, the device synchronized before and after each (launches are
        asynchronous: without the wait a launch would seem free and the next one slow).
        The waits are the profiler's cost; an unprofiled call makes none. As on the CPU,
        the loop only reads the clock (:meth:`fusegrad.profiling.Recorder.add_steps`)."""
        kernels = self._timed_kernels()
        clock = profiling.perf_counter_ns
        times: list[int] = []
        mark = times.append
        self.drv.synchronize()
        try:
            for i, k in kernels:
                mark(clock())
                self._run_kernel(i, k, functions, buffers)
                self.drv.synchronize()
                mark(clock())
        finally:
            rec.add_steps(lambda: self._timed_names(device), times)

    def _timed_kernels(self) -> list:
        """(index, kernel) of each kernel a profiled call times: not those with an empty
        grid."""
        if self._timed is None:
            self._timed = [(i, k) for i, k in enumerate(self.kg.kernels)
                           if not (i in self.lowered and self.lowered[i].grid == 0 and
                                   i not in self.blas_steps)]
        return self._timed

    def _timed_names(self, device: int) -> list:
        """The profiler's name, category and arguments of each kernel a profiled call on
        ``device`` times, made once per device."""
        names = self._timed_names_of.get(device)
        if names is None:
            names = []
            args = {"Program": self.name, "Device": f"cuda:{device}"}
            for i, k in self._timed_kernels():
                if i in self.lowered or i in self.blas_steps:
                    names.append((f"{self.name}::{k.describe()}", "kernel", args))
                else:
                    host = dataclasses.replace(k, name=k.name + ".host")
                    names.append((f"{self.name}::{host.describe()}", "extern", args))
            self._timed_names_of[device] = names
        return names

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
        view = self._view_at(view)
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
                out = np.asarray(node.prim.impl(*args, **self._attrs_at(node)))
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


@dataclasses.dataclass
class _StaticStep:
    """A program's static buffers on one device and the CUDA graph captured over them."""

    buffers: dict[int, DeviceArray]
    graph: object = None
    tf32: bool = False          # the TF32 setting the graph was captured under


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
