"""Run a partitioned graph on the CPU: buffers, compiled kernels, launches, threads.

A :class:`Program` is built once per graph (per input signature). It gives every
materialized value a slot in a buffer table, emits all LLVM kernels into one module,
compiles it (:mod:`fusegrad.runtime.jit`), and turns each kernel into a step:

- an LLVM kernel is called through ctypes with the table's address and a range of its
  outermost loop; large kernels are split across a thread pool (ctypes releases the GIL,
  so the threads run in parallel);
- a matmul runs numpy's BLAS into its buffer, then its fused epilogue kernel;
- an extern primitive, or a kernel codegen cannot lower, runs its nodes' numpy references.

Memory: intermediate buffers are allocated on the first call and kept, and values whose
lifetimes do not overlap share a buffer. Outputs are fresh arrays, except that an output
array from the previous call that nobody holds any more (its reference count shows only
the program's own reference) is reused, which avoids the page faults of a new allocation.
"""

from __future__ import annotations

import ctypes
import linecache
import math
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import llvmlite.ir as ir
import numpy as np

from fusegrad import dtypes
from fusegrad.codegen.llvm.kernel import Unsupported, emit_kernel, kernel_phases, split_plan
from fusegrad.config import config
from fusegrad.ir.graph import Graph, Literal, Value
from fusegrad.passes.fusion import Kernel, KernelGraph, View, identity_view
from fusegrad.runtime import jit

__all__ = ["Program", "thread_pool", "set_num_threads", "get_num_threads"]

# Eager ops are silent about NaN and Inf (fusegrad.ops.prims filters numpy's RuntimeWarnings
# for its module); so are the numpy calls that compiled programs make (BLAS products).
warnings.filterwarnings("ignore", category=RuntimeWarning, module=__name__)

_KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


def _find_data_offset() -> int | None:
    """Offset of the data pointer inside a numpy array object (its C struct starts with
    the object header, then ``char *data``). Reading it directly costs ~0.1 us where
    ``arr.ctypes.data`` costs ~1 us, which matters for the per-call overhead of small
    compiled functions. Verified against ``__array_interface__`` at import."""
    probe = np.arange(3, dtype=np.float32)
    want = probe.__array_interface__["data"][0]
    for offset in (16, 24):
        if ctypes.c_void_p.from_address(id(probe) + offset).value == want:
            return offset
    return None


_DATA_OFFSET = _find_data_offset()


def data_pointer(a: np.ndarray) -> int:
    """Address of ``a``'s first element."""
    if _DATA_OFFSET is not None:
        return ctypes.c_void_p.from_address(id(a) + _DATA_OFFSET).value or 0
    return a.__array_interface__["data"][0]
# Work (elements) below which a kernel runs on the calling thread only.
PARALLEL_THRESHOLD = 1 << 16

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


_pool_workers = 0


def thread_pool() -> ThreadPoolExecutor:
    """The kernel worker pool: ``config.num_threads - 1`` workers beside the caller's thread,
    remade when the thread count changed (``set_num_threads``, a config reload)."""
    global _pool, _pool_workers
    with _pool_lock:
        workers = max(1, config.num_threads - 1)
        if _pool is None or _pool_workers != workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fusegrad")
            _pool_workers = workers
        return _pool


def set_num_threads(num: int) -> None:
    """Split large kernels across ``num`` threads (``torch.set_num_threads``; the default is
    ``FUSEGRAD_NUM_THREADS`` or the number of cores)."""
    num = int(num)
    if num <= 0:
        raise RuntimeError(f"set_num_threads expects a positive integer, got {num}")
    config.num_threads = num


def get_num_threads() -> int:
    """The number of threads large kernels are split across."""
    return config.num_threads


@dataclass
class LaunchStep:
    kernel: Kernel
    fn: object                 # ctypes function
    extent: int                # length of the parallel loop
    work: int                  # elements, for the threading decision

    def run(self, prog: "Program") -> None:
        table = prog.table_address
        threads = config.num_threads
        if threads > 1 and self.work >= PARALLEL_THRESHOLD and self.extent > 1:
            chunks = min(threads, self.extent)
            bounds = [self.extent * i // chunks for i in range(chunks + 1)]
            pool = thread_pool()
            futures = [pool.submit(self.fn, table, bounds[i], bounds[i + 1])
                       for i in range(1, chunks)]
            self.fn(table, bounds[0], bounds[1])
            for f in futures:
                f.result()
        else:
            self.fn(table, 0, self.extent)


@dataclass
class MatmulStep:
    kernel: Kernel
    a: Value
    b: Value
    out: Value

    def run(self, prog: "Program") -> None:
        out = prog.arrays[prog.slots[self.out]]
        if self.out.type.dtype in (dtypes.float16, dtypes.bfloat16):
            # float16/bfloat16: numpy has no BLAS (bfloat16: no matmul at all) for them; the
            # primitive's reference computes in float32 and rounds once, as eager does.
            out[...] = self.out.producer.prim.impl(prog.array(self.a), prog.array(self.b))
            return
        np.matmul(prog.array(self.a), prog.array(self.b), out=out)


@dataclass
class NumpyStep:
    """Nodes run by their numpy reference (extern primitives, or a kernel with no lowering)."""

    kernel: Kernel
    reason: str

    def run(self, prog: "Program") -> None:
        env: dict[Value, np.ndarray] = {}
        for node in self.kernel.nodes:
            args = []
            for op in node.inputs:
                if isinstance(op, Literal):
                    args.append(np.asarray(op.value, dtype=op.dtype.np_dtype))
                elif op in env:
                    args.append(env[op])
                else:
                    args.append(prog.array(op))
            try:
                with np.errstate(all="ignore"):
                    out = np.asarray(node.prim.impl(*args, **node.attrs))
            except (IndexError, ValueError, RuntimeError, ZeroDivisionError) as e:
                raise _at_node(e, node, prog.name) from e
            if out.dtype != node.output.type.dtype.np_dtype:
                out = out.astype(node.output.type.dtype.np_dtype)
            env[node.output] = out
            if node.output in prog.slots:
                np.copyto(prog.arrays[prog.slots[node.output]], out)


def _at_node(error: Exception, node, program: str) -> Exception:
    """``error``, raised while running ``node`` of a compiled program, with what the user
    needs to find it: the primitive, its operand types, and the user's line (the node's
    ``loc``, recorded at trace time) with its source text, which shows the op called there
    (``cross_entropy``, ``gather``, ...)."""
    operands = ", ".join(str(op.type) if isinstance(op, Value) else repr(op.value)
                         for op in node.inputs)
    where = ""
    if node.loc:
        path, _, line = node.loc.rpartition(":")
        text = linecache.getline(path, int(line)).strip() if line.isdigit() else ""
        where = f", from {node.loc}" + (f": {text}" if text else "")
    message = (f"{error} (raised at run time by `{node.prim.name}` on {operands} in compiled "
               f"program {program}{where})")
    try:
        return type(error)(message)
    except TypeError:           # an exception type with a constructor of its own
        return RuntimeError(message)


class Program:
    """A graph compiled for the CPU; call it with numpy arrays, get numpy arrays."""

    def __init__(self, kg: KernelGraph, name: str = "program"):
        self.kg = kg
        self.graph: Graph = kg.graph
        self.name = name
        self._lock = threading.Lock()
        start = time.perf_counter()
        self._assign_slots()
        self._build_steps()
        self.compile_ms = (time.perf_counter() - start) * 1e3
        self.donated: dict[int, int] = {}
        # When every output is a buffer the program writes, return those without checks.
        plain = all(isinstance(o, Value) and o in self.slots and self.slots[o] in
                    self.output_slots for o in self.graph.outputs)
        self._plain_outputs = [self.slots[o] for o in self.graph.outputs] if plain else None

    # ------------------------------------------------------------------ slots

    def _assign_slots(self) -> None:
        g, kg = self.graph, self.kg
        self.slots: dict[Value, int] = {}
        for v in g.inputs:
            self.slots[v] = len(self.slots)
        self.n_inputs = len(g.inputs)
        self.constants: dict[int, np.ndarray] = {}
        for node in g.nodes:
            if node.op == "constant":
                self.slots[node.output] = len(self.slots)
                self.constants[self.slots[node.output]] = np.ascontiguousarray(
                    node.attrs["value"].array)
        # Values that need memory: kernel outputs, and each matmul's product (BLAS writes
        # it before the epilogue reads it).
        producer_step: dict[Value, int] = {}
        for i, k in enumerate(kg.kernels):
            for v in k.outputs:
                producer_step.setdefault(v, i)
            if k.kind == "matmul":
                for n in k.nodes:
                    if n.op == "matmul":
                        producer_step.setdefault(n.output, i)
        outputs = {o for o in g.outputs if isinstance(o, Value)}
        # Liveness: the last step reading each value (through any view); values returned
        # as (views of) outputs live to the end.
        last_use: dict[Value, int] = dict(producer_step)
        for i, k in enumerate(kg.kernels):
            for v in k.inputs:
                last_use[v] = max(last_use.get(v, i), i)
        for o in outputs:
            if o in kg.views:
                last_use[kg.views[o].base] = len(kg.kernels)
        self.output_slots: set[int] = set()
        self.intermediate_specs: dict[int, tuple] = {}
        next_slot = len(self.slots)
        busy_until: dict[int, int] = {}          # intermediate slot -> its last reader
        by_spec: dict[tuple, list[int]] = {}
        for v, step in sorted(producer_step.items(), key=lambda item: item[1]):
            if v in self.slots:
                continue
            if v in outputs:
                self.slots[v] = next_slot
                self.output_slots.add(next_slot)
                next_slot += 1
                continue
            # The dtype itself, not its .str: bfloat16's string is '<V2', which would
            # allocate raw void buffers that numpy steps and returned views misread.
            spec = (v.type.shape, v.type.dtype.np_dtype)
            # Share a buffer whose last reader ran before this value's producer.
            slot = next((s for s in by_spec.get(spec, []) if busy_until[s] < step), None)
            if slot is None:
                slot = next_slot
                next_slot += 1
                self.intermediate_specs[slot] = spec
                by_spec.setdefault(spec, []).append(slot)
            self.slots[v] = slot
            busy_until[slot] = last_use.get(v, step)
        # Scratch of split full reductions (their partial results between launches).
        self.scratch_slots: dict[int, int] = {}
        for i, k in enumerate(kg.kernels):
            plan = split_plan(k)
            if plan is not None:
                self.scratch_slots[i] = next_slot
                self.intermediate_specs[next_slot] = ((plan.cells(),), np.dtype(np.int64))
                next_slot += 1
        self.output_specs = sorted({(s, v.type.shape, v.type.dtype.np_dtype)
                                    for v, s in self.slots.items() if s in self.output_slots},
                                   key=lambda spec: spec[0])
        self.n_slots = next_slot
        self.arrays: list = [None] * self.n_slots
        for slot, arr in self.constants.items():
            self.arrays[slot] = arr
        self.table = (ctypes.c_void_p * max(self.n_slots, 1))()
        self.table_address = ctypes.addressof(self.table)
        for slot, arr in self.constants.items():
            self.table[slot] = arr.ctypes.data
        self._allocated = False

    # ------------------------------------------------------------------ steps

    def _build_steps(self) -> None:
        self.fallbacks: dict[int, str] = {}
        module, emitted = self._emit_module()
        self.llvm_ir = str(module)
        self.jit = jit.compile_ir(self.llvm_ir, [name for k in emitted.values()
                                                 for name, _ in kernel_phases(k)]) \
            if emitted else None
        self.steps = []
        for i, k in enumerate(self.kg.kernels):
            if k.kind == "matmul":
                mm = next(n for n in k.nodes if n.op == "matmul")
                self.steps.append(MatmulStep(k, mm.inputs[0], mm.inputs[1], mm.output))
            if i in emitted:
                work = math.prod(k.shape)
                for name, extent in kernel_phases(k):
                    fn = _KERNEL_FN(self.jit.address(name))
                    self.steps.append(LaunchStep(k, fn, extent, work))
            elif k.kind != "matmul" or i in self.fallbacks:
                reason = self.fallbacks.get(i, f"{k.kind} primitive")
                self.steps.append(NumpyStep(k, reason))

    def _emit_module(self) -> tuple[ir.Module, dict[int, Kernel]]:
        """All LLVM kernels in one module; a kernel codegen cannot lower goes to
        ``self.fallbacks``. A failed kernel leaves a partial function behind, so the module
        is emitted again without it (kernels are emitted once when none fails)."""
        while True:
            module = ir.Module(name=self.name)
            emitted: dict[int, Kernel] = {}
            try:
                for i, k in enumerate(self.kg.kernels):
                    if k.kind == "extern" or i in self.fallbacks:
                        continue
                    if k.kind == "matmul" and not any(n.op != "matmul" for n in k.nodes):
                        continue
                    emit_kernel(module, k, self.kg, self.slots, self.scratch_slots.get(i))
                    emitted[i] = k
                return module, emitted
            except Unsupported as e:
                self.fallbacks[i] = str(e)

    # ------------------------------------------------------------------ running

    def array(self, v: Value) -> np.ndarray:
        """The numpy array of a materialized value or of a view of one."""
        view = self.kg.views.get(v)
        if view is None:
            return self.arrays[self.slots[v]]
        base = self.arrays[self.slots[view.base]]
        return _as_view(base, view)

    def _allocate(self) -> None:
        for slot, (shape, dt) in self.intermediate_specs.items():
            arr = np.empty(shape, dtype=np.dtype(dt))
            self.arrays[slot] = arr
            self.table[slot] = arr.ctypes.data
        self._allocated = True

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        with self._lock:
            return self._run(inputs)

    def donate(self, pairs) -> dict[int, int]:
        """Let outputs take the buffers of inputs: ``pairs`` are (graph input index, graph
        output index) candidates. A pair is used when it is safe: the output is written by
        an LLVM kernel that reads the input only element for element at the index it writes
        (so each element is read before it is overwritten), and no later step reads the
        input. Returns the accepted {output slot: input index}; at a call, that output is
        the input's own array (its old contents are gone, as with JAX's donation)."""
        accepted: dict[int, int] = {}
        for in_index, out_index in pairs:
            v = self.graph.inputs[in_index]
            o = self.graph.outputs[out_index]
            if not isinstance(o, Value) or o not in self.slots or \
                    self.slots[o] not in self.output_slots or self.slots[o] in accepted or \
                    in_index in accepted.values() or o.type != v.type or \
                    any(o2 is v for o2 in self.graph.outputs):
                continue
            if self._alias_safe(v, o):
                accepted[self.slots[o]] = in_index
        self.donated = accepted
        return accepted

    def _alias_safe(self, v: Value, o: Value) -> bool:
        steps = [i for i, st in enumerate(self.steps) if o in st.kernel.outputs]
        if len(steps) != 1 or not isinstance(self.steps[steps[0]], LaunchStep):
            return False
        k = self.steps[steps[0]].kernel
        if k.kind not in ("elementwise", "reduction") or k.level.get(o) != "full" or \
                o.type.shape != k.shape:
            return False
        for st in self.steps[steps[0] + 1:]:
            if v in st.kernel.inputs:
                return False
        identity = identity_view(v).strides
        for n in k.nodes:
            for op in n.inputs:
                if not isinstance(op, Value):
                    continue
                view = self.kg.views.get(op)
                base = view.base if view is not None else op
                if base is not v:
                    continue
                shape = view.shape if view is not None else op.type.shape
                strides = view.strides if view is not None else identity
                same = all(a == b for a, b, d in zip(strides, identity, shape) if d != 1)
                if shape != k.shape or not same or \
                        (view is not None and view.offset != 0) or \
                        n.prim.kind.value not in ("elementwise",):
                    return False
        return True

    def fast_runner(self):
        """A call path for the common small case, or None: a program of LLVM kernels too
        small to thread, contiguous inputs, and outputs that are its own buffers. Every
        check the general path makes per call is made once here, which keeps the per-call
        overhead of a small compiled function near that of one ctypes call."""
        if self._plain_outputs is None or not all(
                isinstance(s, LaunchStep) and s.work < PARALLEL_THRESHOLD for s in self.steps):
            return None
        calls = [(s.fn, s.extent) for s in self.steps]
        address, arrays, lock, bind = self.table_address, self.arrays, self._lock, self._bind
        plain = self._plain_outputs

        def run(inputs):
            with lock:
                bind(inputs)
                for fn, extent in calls:
                    fn(address, 0, extent)
                return [arrays[s] for s in plain]
        return run

    def _bind(self, inputs) -> None:
        """Point the buffer table at this call's inputs and outputs."""
        if not self._allocated:
            self._allocate()
        arrays, table = self.arrays, self.table
        for i, a in enumerate(inputs):
            if arrays[i] is a:
                continue          # the same array as last call: its pointer is already set
            if not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
            arrays[i] = a
            table[i] = data_pointer(a)
        for slot, shape, dt in self.output_specs:
            if slot in self.donated:
                arrays[slot] = arrays[self.donated[slot]]
                table[slot] = table[self.donated[slot]]
                continue
            prev = arrays[slot]
            # Reuse last call's output when only this program still refers to it (the
            # references: the list, this local and getrefcount's argument).
            if prev is None or sys.getrefcount(prev) > 3:
                prev = arrays[slot] = np.empty(shape, dtype=dt)
                table[slot] = data_pointer(prev)

    def _run(self, inputs) -> list[np.ndarray]:
        self._bind(inputs)
        debug = config.debug >= 2
        for step in self.steps:
            if debug:
                t0 = time.perf_counter()
                step.run(self)
                print(f"[fusegrad] {step.kernel.describe()} {type(step).__name__} "
                      f"{(time.perf_counter() - t0) * 1e6:.1f} us", file=sys.stderr)
            else:
                step.run(self)
        if self._plain_outputs is not None:
            return [self.arrays[s] for s in self._plain_outputs]
        return [self._output(o) for o in self.graph.outputs]

    def _output(self, o) -> np.ndarray:
        if isinstance(o, Literal):
            return np.full((), o.value, dtype=o.dtype.np_dtype)
        if o in self.kg.views:
            return np.array(self.array(o))
        arr = self.arrays[self.slots[o]]
        if o.producer is not None and o.producer.op == "constant":
            return arr.copy()
        return arr

    def kernels(self) -> list[str]:
        return [k.describe() for k in self.kg.kernels]


def _as_view(base: np.ndarray, view: View) -> np.ndarray:
    item = base.itemsize
    flat = base.reshape(-1)
    return np.lib.stride_tricks.as_strided(
        flat[view.offset:] if flat.size else flat, shape=view.shape,
        strides=tuple(s * item for s in view.strides))
