"""Run a partitioned graph on the CPU: buffers, compiled kernels, launches, threads.

A :class:`Program` is built once per graph (per input signature). It gives every
materialized value a slot, emits each LLVM kernel into a module of its own, compiles them
(:mod:`fusegrad.runtime.jit`, which caches per kernel), and turns each kernel into a step:

- an LLVM kernel is called through ctypes with the address of its own table of buffer
  pointers and a range of its outermost loop; large kernels are split across a thread pool
  (ctypes releases the GIL, so the threads run in parallel). A kernel numbers its buffers
  itself, in the order its code first uses them, so its code does not depend on the rest
  of the program: equal kernels in two programs are one cache entry;
- a matmul runs numpy's BLAS into its buffer, then its fused epilogue kernel;
- an extern primitive, or a kernel codegen cannot lower, runs its nodes' numpy references.

Memory: intermediate buffers are allocated on the first call and kept, and values whose
lifetimes do not overlap share a buffer. Outputs are fresh arrays, except that an output
array from the previous call that nobody holds any more (its reference count shows only
the program's own reference) is reused, which avoids the page faults of a new allocation.

A graph of symbolic sizes (``f32[B,784]``) compiles to one program for every size: its
kernels read the sizes at run time from a buffer of their own (see
:func:`fusegrad.codegen.values.program_symbols`), and a call with new sizes evaluates the
memory plan, the launch extents and the views for them (:meth:`Program.bind_sizes`) and
allocates its intermediates as one arena; no kernel is built again.
"""

from __future__ import annotations

import ctypes
import dataclasses
import linecache
import math
import operator
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass

import llvmlite.ir as ir
import numpy as np

from fusegrad import dtypes, profiling
from fusegrad.codegen.cpu_lowering import kernel_phases, split_plan
from fusegrad.codegen.llvm import gemm as native_gemm
from fusegrad.codegen.llvm.kernel import Unsupported, emit_kernel
from fusegrad.codegen.values import SYMBOLS, program_symbols
from fusegrad.config import config
from fusegrad.ir.graph import Graph, IRError, Literal, Value
from fusegrad.ir.interpreter import bind_symbols
from fusegrad.ir.kernel_graph import Kernel, KernelGraph, View
from fusegrad.ir.printer import format_attrs, format_scalar, format_type
from fusegrad.ir.specialize import concrete_attr
from fusegrad.ops.prims_reduce import register_bf16_matmul, register_gemm_enabled
from fusegrad.runtime import jit, native, native_attention
from fusegrad.runtime.memory_plan import donation_safe, plan_memory
from fusegrad.runtime.native import data_pointer
from fusegrad.runtime.threads import run_in_parts, set_blas_threads, thread_pool
from fusegrad.symint import (
    SymbolicDecisionError,
    at_hints,
    evaluate_dim,
    evaluate_shape,
    is_symbolic,
    strict_decisions,
)

__all__ = ["Program", "KernelCode", "thread_pool", "set_num_threads", "get_num_threads"]

# Eager ops are silent about NaN and Inf (fusegrad.ops.prims filters numpy's RuntimeWarnings
# for its module); so are the numpy calls that compiled programs make (BLAS products).
warnings.filterwarnings("ignore", category=RuntimeWarning, module=__name__)

_KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


# Work (elements) below which a kernel runs on the calling thread only.
PARALLEL_THRESHOLD = 1 << 16
# Work (elements) below which a kernel is optimized at LLVM's speed level 1 instead of 3:
# without vectorization and unrolling LLVM spends 2-3x less time on it. Kept small: the
# run time of scalar code grows fast (exp(x * y + 1), measured: 16 elements 0.8 us either
# way; 1024: 5-7 us at level 1, 1.2 us at 3; 4096: 18 us against 2.5 us), and a compiled
# kernel runs many times.
SMALL_KERNEL_WORK = 256

def set_num_threads(num: int) -> None:
    """Split large kernels across ``num`` threads, and run numpy's BLAS products on as many
    (``torch.set_num_threads``; the default is ``FUSEGRAD_NUM_THREADS`` or the number of
    cores)."""
    num = int(num)
    if num <= 0:
        raise RuntimeError(f"set_num_threads expects a positive integer, got {num}")
    config.num_threads = num
    set_blas_threads(num)


if "FUSEGRAD_NUM_THREADS" in os.environ and not any(
        name in os.environ for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")):
    # The count asked for at start-up holds for the BLAS too (its own variables, which it
    # reads itself, take precedence).
    set_blas_threads(config.num_threads)


def get_num_threads() -> int:
    """The number of threads large kernels are split across."""
    return config.num_threads


# A kernel large enough to thread is timed on its first runs, TUNE_RUNS times on the calling
# thread and as many split over the pool (alternating, after one untimed run), and is split
# from then on only if the median split run took at most SPLIT_GAIN of the single one. Handing
# work to the pool's threads and waiting for them cost 90-150 us on a 2-vCPU VM: GELU of 2**16
# floats took 129 us on one thread and 217 split, and threading every kernel from 2**16
# elements made the compiled MLP step 30% slower with two threads than with one.
TUNE_RUNS = 3
SPLIT_GAIN = 0.85


@dataclass
class LaunchStep:
    kernel: Kernel
    fn: object                 # ctypes function
    extent: int                # length of the parallel loop
    work: int                  # elements, for the threading decision
    table: int = 0             # address of the kernel's buffer pointers
    # Symbolic sizes: the extent and work as expressions, evaluated by Program.bind_sizes.
    sizes: tuple | None = dataclasses.field(default=None, repr=False, compare=False)
    # thread count -> whether to split, once measured; and its timings until then
    split: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    timings: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def run(self, prog: "Program") -> None:
        threads = config.num_threads
        if threads > 1 and self.work >= PARALLEL_THRESHOLD and self.extent > 1:
            split = self.split.get(threads)
            if split is None:
                self._tune(threads)
                return
            if split:
                self.run_split(threads)
                return
        self.fn(self.table, 0, self.extent)

    def run_split(self, threads: int) -> None:
        """Run the kernel with its parallel loop split over ``threads`` threads."""
        run_in_parts(self.fn, (self.table,), self.extent, threads)

    def _tune(self, threads: int) -> None:
        times = self.timings.get(threads)
        if times is None:                 # the first run: cold caches, not timed
            self.timings[threads] = ([], [])
            self.fn(self.table, 0, self.extent)
            return
        single, split = times
        start = time.perf_counter()
        if len(split) < len(single):
            self.run_split(threads)
            split.append(time.perf_counter() - start)
        else:
            self.fn(self.table, 0, self.extent)
            single.append(time.perf_counter() - start)
        if len(split) == TUNE_RUNS:
            self.split[threads] = sorted(split)[TUNE_RUNS // 2] <= \
                SPLIT_GAIN * sorted(single)[TUNE_RUNS // 2]


@dataclass
class GemmStep(LaunchStep):
    """A matmul kernel's product as a GEMM generated for its shapes (its panels are the
    parallel loop); the kernel's epilogue, if any, is the next step."""

    gemm: native_gemm.Gemm | None = None


@dataclass
class SymbolicGemmStep(GemmStep):
    """A :class:`GemmStep` of symbolic sizes: :meth:`Program.bind_sizes` evaluates the
    product for a call's sizes (:meth:`bind`) and sets the parameters the function reads;
    a call whose product the GEMM is not made for (:func:`native_gemm.fits`) runs numpy's
    BLAS (``blas``) instead."""

    blas: "MatmulStep | None" = None
    fits: bool = True
    pack_entry: int = 0        # where the packing scratch's pointer is in the tables

    def bind(self, prog: "Program", bindings: dict) -> None:
        g = self.gemm
        def value(x):
            return evaluate_shape(x, bindings) if isinstance(x, tuple) else \
                evaluate_dim(x, bindings)
        concrete = native_gemm.Gemm(*(value(getattr(g, f.name)) if f.name != "dtype"
                                      else g.dtype for f in dataclasses.fields(g)))
        self.fits = native_gemm.fits(concrete)
        if not self.fits:
            return
        pack, params = prog.gemm_arrays[id(self)]
        params[:] = concrete.params()
        if pack.size < concrete.pack_floats:
            pack = np.empty(concrete.pack_floats, np.float32)
            prog.gemm_arrays[id(self)] = (pack, params)
            prog.tables[self.pack_entry] = pack.ctypes.data
        self.extent, self.work = concrete.panels, concrete.m * concrete.n * concrete.k // 16

    def run(self, prog: "Program") -> None:
        if self.fits:
            LaunchStep.run(self, prog)
        else:
            self.blas.run(prog)


@dataclass
class MatmulStep:
    kernel: Kernel
    a: Value
    b: Value
    out: Value

    def run(self, prog: "Program") -> None:
        out = prog.arrays[prog.slots[self.out]]
        a, b = prog.array(self.a), prog.array(self.b)
        if out.dtype == a.dtype == b.dtype == _BF16 and out.flags.c_contiguous:
            # bf16 x bf16 on float32 BLAS: the operands widened (exactly) by a native loop
            # into scratch buffers the program keeps, the float32 sums rounded once into the
            # product's buffer; the conversions cost what one pass over each array costs.
            bf16_product_on_blas(a, b, out, prog.scratch)
            return
        if self.out.type.dtype in (dtypes.float16, dtypes.bfloat16):
            # float16/bfloat16: numpy has no BLAS (bfloat16: no matmul at all) for them; the
            # primitive's reference computes in float32 and rounds once, as eager does.
            out[...] = self.out.producer.prim.impl(a, b)
            return
        with np.errstate(all="ignore"):   # inf * 0 is a NaN, no warning (a skipped step's)
            np.matmul(a, b, out=out)


_BF16 = np.dtype(dtypes.bfloat16.np_dtype)


def _widened(x: np.ndarray, into) -> np.ndarray:
    """bf16 ``x`` as float32, in ``into(shape)`` and in ``x``'s own layout (a transposed
    operand stays transposed, so BLAS reads it as it would read the float32 one); a copy by
    numpy where ``x`` is not a permutation of a C-contiguous array."""
    order = sorted(range(x.ndim), key=lambda d: -x.strides[d])
    dense = x.transpose(order)
    if not dense.flags.c_contiguous:
        return x.astype(np.float32)
    wide = into(dense.shape)
    native.convert(dense, wide, config.num_threads)
    return wide.transpose(np.argsort(order))


def bf16_product_on_blas(a: np.ndarray, b: np.ndarray, out: np.ndarray, into=None) -> None:
    """``out = a @ b`` for bf16 arrays by numpy's float32 BLAS: the operands widened
    exactly, the float32 sums rounded once into ``out`` (C-contiguous bf16), by native
    loops. ``into(role, shape)`` gives the float32 buffers (a program's scratch); fresh
    arrays without it."""
    def buffer(role: int):
        return (lambda shape: into(role, shape)) if into else (lambda shape: np.empty(shape, np.float32))
    c = buffer(2)(out.shape)
    with np.errstate(all="ignore"):       # as the reference's: inf * 0 is a NaN, no warning
        np.matmul(_widened(a, buffer(0)), _widened(b, buffer(1)), out=c)
    native.convert(c, out, config.num_threads)


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
            attrs = node.attrs if prog.bindings is None else \
                {k: concrete_attr(a, prog.bindings) for k, a in node.attrs.items()}
            try:
                with np.errstate(all="ignore"):
                    out = np.asarray(node.prim.impl(*args, **attrs))
            except (IndexError, ValueError, RuntimeError, ZeroDivisionError) as e:
                raise _at_node(e, node, prog.name) from e
            if out.dtype != node.output.type.dtype.np_dtype:
                out = out.astype(node.output.type.dtype.np_dtype)
            env[node.output] = out
            if node.output in prog.slots:
                np.copyto(prog.arrays[prog.slots[node.output]], out)


_NATIVE_OPS = frozenset({"index_add", "check_target", "check_index", "fused_attention",
                         "fused_attention_backward"})


@dataclass
class NativeStep(NumpyStep):
    """An extern node with a native loop for its common case (``fusegrad.runtime.native``):
    an embedding's gradient (``index_add`` of rows) and the range checks of targets and
    indices. In a step, one call of the loop costs what one numpy call costs, and the numpy
    reference took several (the check of 512 targets: 121 us in the transformer's step). Any
    other case, and every failing check, runs the numpy reference, which raises torch's
    error."""

    memo: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def run(self, prog: "Program") -> None:
        node = self.kernel.nodes[0]
        slot = prog.slots.get(node.output)
        if slot is None or not self._native(prog, node, prog.arrays[slot], self.memo):
            NumpyStep.run(self, prog)

    @staticmethod
    def _native(prog: "Program", node, out: np.ndarray, memo: dict) -> bool:
        if any(isinstance(op, Literal) for op in node.inputs):
            return False
        attrs = node.attrs if prog.bindings is None else \
            {k: concrete_attr(a, prog.bindings) for k, a in node.attrs.items()}
        # (A symbolic sequence length runs the attention kernel for every length.)
        if node.op == "fused_attention":
            q, k, v, *mask = (prog.array(op) for op in node.inputs)
            return native_attention.attention_forward(
                out, q, k, v, mask[0] if mask else None, memo=memo,
                every_length=is_symbolic(node.inputs[0].type.shape[-2]), **attrs)
        if node.op == "fused_attention_backward":
            q, k, v, packed, dout, *mask = (prog.array(op) for op in node.inputs)
            return native_attention.attention_backward(
                out, q, k, v, dout, packed, mask[0] if mask else None,
                scale=attrs["scale"], keep=attrs["keep"], memo=memo,
                every_length=is_symbolic(node.inputs[0].type.shape[-2]))
        if node.op == "index_add":
            if attrs["axis"] != 0:
                return False
            x, idx, src = (prog.array(op) for op in node.inputs)
            return native.index_add_rows(out, x, idx, src)
        high = attrs["classes"] if node.op == "check_target" else attrs["size"]
        low = -high if attrs.get("wrap") else 0
        return native.check_copy(prog.array(node.inputs[0]), out, low, high)


def _with_progress(steps: list) -> list:
    """``steps`` with a progress step after each kernel that runs while a nonblocking
    collective is open (a step with ``poll``, until the step whose ``start`` it is): most MPI
    libraries move a nonblocking collective forward only inside MPI calls."""
    if not any(hasattr(s, "poll") for s in steps):
        return steps
    out, open_ = [], []
    for st in steps:
        out.append(st)
        if hasattr(st, "poll"):
            open_.append(st)
        elif getattr(st, "start", None) is not None:
            open_ = [s for s in open_ if s is not st.start]
        elif open_:
            out.append(_ProgressStep(tuple(open_)))
    return out


@dataclass
class _ProgressStep:
    """Calls ``poll()`` of the open collectives (see :func:`_with_progress`)."""

    starts: tuple
    kernel: Kernel = dataclasses.field(default_factory=lambda: Kernel("progress", "extern"))

    def run(self, prog: "Program") -> None:
        for s in self.starts:
            s.poll()


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

    def __init__(self, kg: KernelGraph, name: str = "program",
                 prebuilt: "dict[int, KernelCode] | None" = None,
                 fallbacks: dict[int, str] | None = None, donate=(),
                 prebuilt_gemms: "dict[int, KernelCode] | None" = None):
        """``prebuilt`` (ahead-of-time artifacts): the machine code of every LLVM kernel by
        kernel index, with the program slot of each of its buffers, ``prebuilt_gemms`` that
        of the generated GEMMs of matmul kernels (the others call numpy's BLAS), and
        ``fallbacks``, the kernels that run on numpy; nothing is compiled then, the code is
        only linked.
        ``donate``: (graph input, graph output) pairs offered as for :meth:`donate`, decided
        before the kernels are compiled, so that a kernel writing an output in its input's
        buffer reads and writes it through one pointer (see :meth:`_compile_kernels`)."""
        self.kg = kg
        self.graph: Graph = kg.graph
        self.name = name
        self._lock = threading.Lock()
        start = time.perf_counter()
        # Symbolic sizes: their names (the order of the sizes buffer) and this call's values.
        self.symbols = program_symbols(self.graph)
        self.bindings: dict | None = None
        self.gemm_arrays: dict[int, tuple] = {}     # SymbolicGemmStep -> (pack, params)
        self._assign_slots()
        self.fallbacks: dict[int, str] = dict(fallbacks or {})
        self._baked: set[Value] = set()     # outputs whose kernels read their input through them
        self._scratch: dict[int, np.ndarray] = {}   # see scratch()
        self._set_donated(self._accept(donate) if donate and prebuilt is None else {})
        self._build_steps(prebuilt, fallbacks, prebuilt_gemms)
        if self.donated:
            # A kernel that fell back to numpy (which copies each result into its buffer as
            # it goes) may not write over an input it still reads: its pairs are dropped.
            dropped = {self.slots[o] for i in self.fallbacks for o in self.kg.kernels[i].outputs
                       if o in self.slots}
            self._set_donated({slot: i for slot, i in self.donated.items()
                               if slot not in dropped})
        self.compile_ms = (time.perf_counter() - start) * 1e3
        # When every output is a buffer the program writes, return those without checks.
        plain = all(isinstance(o, Value) and o in self.slots and self.slots[o] in
                    self.output_slots for o in self.graph.outputs)
        self._plain_outputs = [self.slots[o] for o in self.graph.outputs] if plain else None

    # ------------------------------------------------------------------ slots

    def _assign_slots(self) -> None:
        plan = plan_memory(self.kg, _scratch_cells)
        self.plan = plan
        self.slots = plan.slots
        self.n_inputs = plan.n_inputs
        self.constants = plan.constants
        self.output_slots = plan.output_slots
        self.intermediate_specs = plan.intermediate_specs
        self.scratch_slots = plan.scratch_slots
        self.output_specs = plan.output_specs
        self.n_slots = plan.n_slots
        self.arrays: list = [None] * self.n_slots
        for slot, arr in self.constants.items():
            self.arrays[slot] = arr
        self._allocated = False
        # Value -> (base array, strided view of it): numpy takes ~10 us to build a view, and
        # a step reads the same views of the same buffers on every call.
        self._views: dict[Value, tuple[np.ndarray, np.ndarray]] = {}

    # ------------------------------------------------------------------ steps

    def _build_steps(self, prebuilt=None, fallbacks=None, prebuilt_gemms=None) -> None:
        if self.symbols:
            # Every decision the kernels' code makes must hold for every size.
            with strict_decisions():
                emitted = self._compile_kernels() if prebuilt is None else dict(prebuilt)
                self._build_steps_of(emitted, prebuilt, prebuilt_gemms)
            return
        emitted = self._compile_kernels() if prebuilt is None else dict(prebuilt)
        self._build_steps_of(emitted, prebuilt, prebuilt_gemms)

    def _build_steps_of(self, emitted, prebuilt, prebuilt_gemms) -> None:
        gemms = self._compile_gemms(prebuilt is None, prebuilt_gemms or {})
        # Kept: an ahead-of-time artifact saves each kernel's object code and buffer slots.
        self.kernel_code: dict[int, KernelCode] = emitted
        self.gemm_code: dict[int, KernelCode] = {i: code for i, (_, code) in gemms.items()}
        records = [c.record for c in [*emitted.values(), *self.gemm_code.values()]]
        self.jit = jit.link_kernels(records) if records else None
        self._make_tables([*emitted.values(), *self.gemm_code.values()])
        self.steps = []
        for i, k in enumerate(self.kg.kernels):
            if i in gemms:
                g, code = gemms[i]
                fn = _KERNEL_FN(self.jit.address(code.record.symbol))
                table = self.tables_address + ctypes.sizeof(ctypes.c_void_p) * code.offset
                if self.symbols:
                    mm = next(n for n in k.nodes if n.op == "matmul")
                    step = SymbolicGemmStep(k, fn, 0, 0, table, gemm=g, blas=MatmulStep(
                        k, mm.inputs[0], mm.inputs[1], mm.output),
                        pack_entry=code.offset + len(code.slots))
                    self.gemm_arrays[id(step)] = code.extra
                    self.steps.append(step)
                else:
                    self.steps.append(GemmStep(k, fn, g.panels, g.m * g.n * g.k // 16, table,
                                               gemm=g))
            elif k.kind == "matmul":
                mm = next(n for n in k.nodes if n.op == "matmul")
                self.steps.append(MatmulStep(k, mm.inputs[0], mm.inputs[1], mm.output))
            if i in emitted:
                work = math.prod(k.shape)
                table = self.tables_address + ctypes.sizeof(ctypes.c_void_p) * emitted[i].offset
                # A split reduction is several functions (phases), named after the kernel's.
                for name, extent in kernel_phases(k, self.kg):
                    symbol = emitted[i].record.symbol + name[len(k.name):]
                    fn = _KERNEL_FN(self.jit.address(symbol))
                    if self.symbols:
                        step = LaunchStep(k, fn, 0, 0, table, sizes=(extent, work))
                    else:
                        step = LaunchStep(k, fn, extent, work, table)
                    self.steps.append(step)
            elif k.kind == "extern" and len(k.nodes) == 1 and \
                    "runtime_step" in k.nodes[0].prim.extra:
                # A primitive that brings its own step (a collective: fusegrad.distributed).
                self.steps.append(k.nodes[0].prim.extra["runtime_step"](k, k.nodes[0], self.steps))
            elif k.kind != "matmul" or i in self.fallbacks:
                reason = self.fallbacks.get(i, f"{k.kind} primitive")
                native = len(k.nodes) == 1 and k.nodes[0].op in _NATIVE_OPS
                self.steps.append((NativeStep if native else NumpyStep)(k, reason))
        self.steps = _with_progress(self.steps)

    def _lowered(self, i: int, k: Kernel) -> bool:
        """Whether kernel ``i`` is LLVM code (not numpy, not a bare BLAS call)."""
        if k.kind == "extern" or i in self.fallbacks:
            return False
        return k.kind != "matmul" or any(n.op != "matmul" for n in k.nodes)

    def _compile_kernels(self) -> dict[int, "KernelCode"]:
        """Machine code for each LLVM kernel, from the cache when its description is known
        (no IR is built then) or else emitted into a module of its own, with its own buffer
        numbering and its function named by its code; a kernel codegen cannot lower goes to
        ``self.fallbacks``."""
        emitted: dict[int, KernelCode] = {}
        for i, k in enumerate(self.kg.kernels):
            if not self._lowered(i, k):
                continue
            # (symbolic sizes: at the sizes of the call the program was made for)
            level = 1 if math.prod(at_hints(k.shape)) < SMALL_KERNEL_WORK else 3
            split = split_plan(k) is not None
            # A split reduction's scratch cells are not a value of its description: such
            # kernels are compiled for their program, not cached by description.
            described = None if split else kernel_description(k, self.kg, level)
            # A donated input is read through its output's buffer pointer: the same pointer
            # for the load and the store of an element, which the loop vectorizer sees as
            # no conflict (two pointers that overlap fail its runtime check, and the loop
            # ran scalar: an Adam update 4x slower).
            alias = self._aliases(k)
            if described is not None and alias:
                index = {v: j for j, v in enumerate(described[1])}
                described = (described[0] + "\nsame buffer " + " ".join(
                    f"%{index[v]}=%{index[o]}" for v, o in alias.items()), described[1])
            key = jit.kernel_key(described[0]) if described is not None else None
            record = jit.find_kernel(key) if key is not None else None
            values = described[1] if described is not None else []
            if record is None or max(record.buffers, default=-1) >= len(values):
                try:
                    module, local = self._emit(i, k, alias)
                except Unsupported as e:
                    self.fallbacks[i] = str(e)
                    continue
                symbol, source = jit.kernel_symbol(str(module), level)
                index = {v: j for j, v in enumerate(values)}
                if not all(v in index for v in local.values):
                    key = None          # a buffer the description misses: do not cache
                buffers = tuple(index.get(v, -1) for v in local.values)
                record = jit.build_kernel(key, source, symbol, buffers)
                emitted[i] = KernelCode(record, local.order)
            else:
                emitted[i] = KernelCode(record, [self.slots[values[j]]
                                                  for j in record.buffers])
            self._baked.update(alias.values())
        return emitted

    def _emit(self, i: int, k: Kernel, alias: dict) -> "tuple[ir.Module, _LocalSlots]":
        """Kernel ``i``'s LLVM IR, and its buffer numbering (raises Unsupported)."""
        module = ir.Module(name="kernel")
        local = _LocalSlots(self.slots, alias)
        scratch = local.reserve(self.scratch_slots[i]) if split_plan(k) is not None else None
        emit_kernel(module, dataclasses.replace(k, name=jit.KERNEL_PLACEHOLDER), self.kg, local,
                    scratch)
        return module, local

    def llvm_kernels(self) -> set[int]:
        """The indices of the kernels that run as LLVM code (the others: numpy, BLAS, a
        primitive's own step)."""
        return {i for i, k in enumerate(self.kg.kernels) if self._lowered(i, k)}

    def kernel_slots(self, i: int) -> list[int]:
        """The program slot behind each buffer number of LLVM kernel ``i``'s code, as its
        code numbers them: what an ahead-of-time artifact's plan must list for the kernel
        (its IR is built to learn them, not compiled)."""
        return self._emit(i, self.kg.kernels[i], self._aliases(self.kg.kernels[i]))[1].order

    def _compile_gemms(self, compile_new: bool, prebuilt: "dict[int, KernelCode]") \
            -> "dict[int, tuple[native_gemm.Gemm, KernelCode]]":
        """The products of matmul kernels that run as the generated GEMM (see
        :mod:`fusegrad.codegen.llvm.gemm` and ``config.native_gemm``), by kernel index, each
        with its buffers, packing scratch and parameters: the code from ``prebuilt`` for an
        ahead-of-time artifact (only those), else from the cache or compiled (one function
        for every product). The others run numpy's BLAS."""
        use = native_gemm_enabled()
        out = {}
        for i, k in enumerate(self.kg.kernels):
            if k.kind != "matmul" or (i not in prebuilt and not (compile_new and use)):
                continue
            found = gemm_of(k, self.kg)
            if found is None:
                continue
            g, operands = found
            record = prebuilt[i].record if i in prebuilt else _gemm_record(g.dtype)
            if self.symbols:
                # Sized and set per call (SymbolicGemmStep.bind).
                extra = (np.empty(1, np.float32), np.zeros(len(native_gemm.PARAMS), np.int64))
            else:
                extra = (np.empty(max(g.pack_floats, 1), np.float32), g.params())
            out[i] = (g, KernelCode(record, [self.slots[v] for v in operands], extra=extra))
        return out

    def _make_tables(self, codes: "list[KernelCode]") -> None:
        """One array of buffer pointers, a segment per kernel; ``self.uses[slot]`` lists
        where each slot's pointer goes. A kernel's own arrays (a GEMM's packing scratch and
        parameters) follow its slots."""
        self.uses: list[list[int]] = [[] for _ in range(self.n_slots)]
        offset = 0
        for code in codes:
            code.offset = offset
            for j, slot in enumerate(code.slots):
                self.uses[slot].append(offset + j)
            offset += len(code.slots) + len(code.extra)
        self.tables = (ctypes.c_void_p * max(offset, 1))()
        self.tables_address = ctypes.addressof(self.tables)
        for code in codes:
            for j, arr in enumerate(code.extra):
                self.tables[code.offset + len(code.slots) + j] = arr.ctypes.data
        for slot, arr in self.constants.items():
            self._point(slot, arr.ctypes.data)

    def _point(self, slot: int, address: int) -> None:
        """Point every kernel's entry for ``slot`` at ``address``."""
        tables = self.tables
        for pos in self.uses[slot]:
            tables[pos] = address

    @property
    def llvm_ir(self) -> str:
        """The program's LLVM kernels as one module to read (emitted again on request): each
        function as compiled (``bufs`` is the kernel's own table), named by its kernel."""
        module = ir.Module(name=self.name)
        for i, k in enumerate(self.kg.kernels):
            if self._lowered(i, k):
                local = _LocalSlots(self.slots, self._aliases(k))
                scratch = local.reserve(self.scratch_slots[i]) if i in self.scratch_slots \
                    else None
                emit_kernel(module, k, self.kg, local, scratch)
        return str(module)

    # ------------------------------------------------------------------ running

    def scratch(self, role: int, shape: tuple) -> np.ndarray:
        """A float32 array of ``shape`` in the program's scratch buffer ``role``, grown to the
        largest shape asked for and kept between calls (its pages stay mapped: a fresh 16 MB
        array costs its page faults on every call). The steps that use one run in turn."""
        n = math.prod(shape)
        buf = self._scratch.get(role)
        if buf is None or buf.size < n:
            buf = self._scratch[role] = np.empty(n, np.float32)
        return buf[:n].reshape(shape)

    def array(self, v: Value) -> np.ndarray:
        """The numpy array of a materialized value or of a view of one."""
        view = self.kg.views.get(v)
        if view is None:
            return self.arrays[self.slots[v]]
        base = self.arrays[self.slots[view.base]]
        hit = self._views.get(v)
        if hit is not None and hit[0] is base:
            return hit[1]
        if self.bindings is not None:
            view = View(view.base, evaluate_shape(view.shape, self.bindings),
                        evaluate_shape(view.strides, self.bindings),
                        evaluate_dim(view.offset, self.bindings))
        arr = _as_view(base, view)
        self._views[v] = (base, arr)
        return arr

    def bind_sizes(self, inputs) -> None:
        """For a program of symbolic sizes: bind the symbols from the shapes of ``inputs``
        and, when they changed, set the kernels' sizes buffer, the launch extents, and the
        intermediate buffers (one arena) and output shapes for them."""
        bindings = bind_symbols(self.graph, [np.shape(a) for a in inputs])
        if bindings == self.bindings:
            return
        self.bindings = bindings
        self.arrays[self.slots[SYMBOLS]][:] = [bindings[n] for n in self.symbols]
        for st in self.steps:
            if isinstance(st, SymbolicGemmStep):
                st.bind(self, bindings)
            elif isinstance(st, LaunchStep) and st.sizes is not None:
                st.extent, st.work = (evaluate_dim(d, bindings) for d in st.sizes)
        inter, outs = self.plan.specs_at(bindings)
        self._allocate_arena(inter)
        self._fresh_specs = [spec for spec in outs if spec[0] not in self.donated]
        for slot, _, _ in self._fresh_specs:
            self.arrays[slot] = None
        self._views.clear()

    def _allocate_arena(self, specs: dict) -> None:
        """The intermediate buffers of ``specs`` as views of one allocation (each 64-byte
        aligned)."""
        offsets, total = {}, 0
        for slot, (shape, dt) in specs.items():
            offsets[slot] = total
            nbytes = math.prod(shape) * np.dtype(dt).itemsize
            total += -(-nbytes // 64) * 64
        arena = np.empty(total + 64, np.uint8)
        skip = -data_pointer(arena) % 64
        for slot, (shape, dt) in specs.items():
            dt = np.dtype(dt)
            start = skip + offsets[slot]
            arr = arena[start:start + math.prod(shape) * dt.itemsize].view(dt).reshape(shape)
            self.arrays[slot] = arr
            self._point(slot, data_pointer(arr) if arr.size else arena.ctypes.data)
        self._allocated = True

    def _allocate(self) -> None:
        for slot, (shape, dt) in self.intermediate_specs.items():
            arr = np.empty(shape, dtype=np.dtype(dt))
            self.arrays[slot] = arr
            self._point(slot, arr.ctypes.data)
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
        the input's own array (its old contents are gone, as with JAX's donation).

        Pairs given to the constructor were decided before compiling, and their kernels
        read the input through the output's buffer: those must stay accepted."""
        accepted = self._accept(pairs)
        lost = [o for o in self._baked if self.slots[o] not in accepted]
        if lost:
            raise ValueError(f"{self.name}: donate() would drop donations its kernels were "
                             f"compiled for ({len(lost)} outputs)")
        self._set_donated(accepted)
        return accepted

    def _accept(self, pairs) -> dict[int, int]:
        accepted: dict[int, int] = {}
        kernels = self.kg.kernels
        for in_index, out_index in pairs:
            v = self.graph.inputs[in_index]
            o = self.graph.outputs[out_index]
            if not isinstance(o, Value) or o not in self.slots or \
                    self.slots[o] not in self.output_slots or self.slots[o] in accepted or \
                    in_index in accepted.values() or o.type != v.type or \
                    any(o2 is v for o2 in self.graph.outputs):
                continue
            # The one compiled kernel writing o, and what runs after it.
            writers = [i for i, k in enumerate(kernels) if o in k.outputs]
            if len(writers) != 1 or not self._lowered(writers[0], kernels[writers[0]]):
                continue
            i = writers[0]
            if donation_safe(self.kg, kernels[i], kernels[i + 1:], v, o):
                accepted[self.slots[o]] = in_index
        return accepted

    def _set_donated(self, accepted: dict[int, int]) -> None:
        self.donated = accepted
        self.bindings = None                # symbolic sizes: the next call sets every spec
        self._donor_slots: dict[int, list[int]] = {}      # input index -> donated outputs
        for slot, in_index in accepted.items():
            self._donor_slots.setdefault(in_index, []).append(slot)
        # Outputs in buffers of their own.
        self._fresh_specs = [spec for spec in self.output_specs if spec[0] not in accepted]
        for i in range(self.n_inputs):
            self.arrays[i] = None           # the next call binds every input (and donor) anew

    def _aliases(self, k: Kernel) -> dict[Value, Value]:
        """{input: output} of the donations whose output kernel ``k`` writes, where ``k``
        reads the input (directly or through a view)."""
        by_slot = {self.slots[o]: o for o in k.outputs if o in self.slots}
        read = {self.kg.views[v].base if v in self.kg.views else v for v in k.inputs}
        return {self.graph.inputs[i]: by_slot[slot] for slot, i in self.donated.items()
                if slot in by_slot and self.graph.inputs[i] in read}

    def fast_runner(self):
        """A call path for the common case, or None: a program of LLVM kernels, contiguous
        inputs, and outputs that are its own buffers. Every check the general path makes
        per call is made once here, which keeps the per-call overhead of a compiled function
        near that of one ctypes call (a 512x256 ``x.exp()`` spent 10 us in the general path
        around a 50 us kernel). A kernel large enough to thread takes the general path when
        more than one thread is configured at the call."""
        if self._plain_outputs is None or not all(isinstance(s, LaunchStep) for s in self.steps):
            return None
        if self.symbols:
            return self._symbolic_runner()
        threadable = any(s.work >= PARALLEL_THRESHOLD and s.extent > 1 for s in self.steps)
        calls = [(s.fn, s.table, s.extent) for s in self.steps]
        arrays, lock, bind = self.arrays, self._lock, self._bind
        plain = self._plain_outputs

        def run(inputs):
            if (threadable and config.num_threads > 1) or profiling.recorder is not None:
                return self(*inputs)
            with lock:
                bind(inputs)
                for fn, table, extent in calls:
                    fn(table, 0, extent)
                return [arrays[s] for s in plain]
        return run

    def _symbolic_runner(self):
        """:meth:`fast_runner` of a program of symbolic sizes: the extents (and whether a
        kernel is large enough to thread) are this call's, once its sizes are bound."""
        arrays, lock, bind, steps = self.arrays, self._lock, self._bind, self.steps
        plain = self._plain_outputs
        gemms = any(isinstance(s, SymbolicGemmStep) for s in steps)    # (BLAS at some sizes)

        def run(inputs):
            if profiling.recorder is not None:
                return self(*inputs)
            with lock:
                bind(inputs)
                if gemms or config.num_threads > 1 and any(
                        s.work >= PARALLEL_THRESHOLD and s.extent > 1 for s in steps):
                    for step in steps:
                        step.run(self)
                else:
                    for s in steps:
                        s.fn(s.table, 0, s.extent)
                return [arrays[s] for s in plain]
        return run

    def _bind(self, inputs) -> None:
        """Point the kernels' buffer tables at this call's inputs and outputs."""
        if self.symbols:
            self.bind_sizes(inputs)
        if not self._allocated:
            self._allocate()
        arrays, tables, uses, donors = self.arrays, self.tables, self.uses, self._donor_slots
        if len(inputs) == self.n_inputs and all(map(operator.is_, inputs, arrays)):
            inputs = ()           # the same arrays as last call: their pointers are set
        for i, a in enumerate(inputs):
            if arrays[i] is a:
                continue          # the same array as last call: its pointers are already set
            if not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
            arrays[i] = a
            address = data_pointer(a)
            for pos in uses[i]:
                tables[pos] = address
            for slot in donors.get(i, ()):
                arrays[slot] = a                    # a donated output is its input's array
                self._point(slot, address)
        for slot, shape, dt in self._fresh_specs:
            prev = arrays[slot]
            # Reuse last call's output when only this program still refers to it (the
            # references: the list, this local and getrefcount's argument).
            if prev is None or sys.getrefcount(prev) > 3:
                prev = arrays[slot] = np.empty(shape, dtype=dt)
                self._point(slot, data_pointer(prev))

    def _run(self, inputs) -> list[np.ndarray]:
        rec = profiling.recorder
        if rec is not None:
            with profiling.Span(rec, f"compiled::{self.name}", "compiled",
                                args={"Program": self.name, "Kernels": len(self.kg.kernels)}):
                self._bind(inputs)
                self._run_steps_timed(rec)
        else:
            self._bind(inputs)
            if config.debug >= 2:
                self._run_steps_timed(None)
            else:
                for step in self.steps:
                    step.run(self)
        if self._plain_outputs is not None:
            return [self.arrays[s] for s in self._plain_outputs]
        return [self._output(o) for o in self.graph.outputs]

    def _run_steps_timed(self, rec: "profiling.Recorder | None") -> None:
        """Run the steps, timing each: one event per step for the profiler's ``rec``, and
        one line per step on stderr under ``FUSEGRAD_DEBUG=2``. The loop only reads the
        clock around each step; the events (and the steps' names, on a program's first
        profiled run) are made when the profile is read, so that what a step's event
        measures is the step as an unprofiled call runs it."""
        clock = profiling.perf_counter_ns
        times: list[int] = []
        mark = times.append
        try:
            for step in self.steps:
                mark(clock())
                step.run(self)
                mark(clock())
        finally:
            if rec is not None:
                rec.add_steps(self.step_names, times)
            if config.debug >= 2:
                for step, start, end in zip(self.steps, times[::2], times[1::2]):
                    print(f"[fusegrad] {step.kernel.describe()} {type(step).__name__} "
                          f"{(end - start) / 1e3:.1f} us", file=sys.stderr)

    def step_names(self) -> list[tuple[str, str, dict]]:
        """The profiler's name, category and trace arguments of each step: ``<program>::<kernel>`` as the
        kernel listing describes it (``step::k3[elementwise 512](mul,add)``, category
        ``kernel``) for LLVM code, and with how the step runs after the kernel's index for
        the others (``step::k14.blas[matmul 512x64](matmul,add)``: the product of a matmul
        kernel, whose epilogue is the next step; ``.gemm``, ``.numpy``, ``.native``;
        category ``extern``)."""
        names = self.__dict__.get("_step_names")
        if names is None or len(names) != len(self.steps):
            names = self._step_names = [_step_name(self.name, st) for st in self.steps]
        return names

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

    def native_modules(self) -> list[tuple[str, int]]:
        """The native helper modules (IR text, speed level) the program's extern steps can
        call (``fusegrad.runtime.native``, ``native_attention``), compiled on first use."""
        out = []
        for st in self.steps:
            if isinstance(st, NativeStep):
                node = st.kernel.nodes[0]
                helper = native_attention if node.op.startswith("fused_attention") else native
                try:
                    modules = helper.modules_for(node)
                except SymbolicDecisionError as e:     # (its loops are made per size)
                    raise SymbolicDecisionError(f"{node.op}'s native loops: {e}") from e
                out += [m for m in modules if m not in out]
        return out


_STEP_KINDS = {"MatmulStep": "blas", "GemmStep": "gemm", "NumpyStep": "numpy",
               "NativeStep": "native"}


def _step_name(program: str, step) -> tuple[str, str, dict]:
    """See :meth:`Program.step_names`."""
    k = step.kernel
    kind = type(step).__name__
    args = {"Program": program, "Step": kind}
    if kind == "LaunchStep":
        return f"{program}::{k.describe()}", "kernel", args
    how = _STEP_KINDS.get(kind, kind)
    return (f"{program}::{dataclasses.replace(k, name=f'{k.name}.{how}').describe()}", "extern",
            args)


def _scratch_cells(k: Kernel) -> int | None:
    """8-byte scratch cells of a split full reduction's partial results (None: no scratch)."""
    plan = split_plan(k)
    return None if plan is None else plan.cells()


class _LocalSlots(dict):
    """A kernel's own buffer numbers: the LLVM printer asks for a value's slot, and gets the next
    local number the first time; ``order`` maps local numbers to the program's slots."""

    def __init__(self, slots: dict[Value, int], alias: dict[Value, Value] | None = None):
        super().__init__()
        self.slots = slots
        self.alias = alias or {}          # a donated input -> the output in its buffer
        self.values: list[Value] = []
        self.order: list[int] = []

    def reserve(self, slot: int) -> int:
        """A local number for program slot ``slot`` that no value names (scratch)."""
        self.order.append(slot)
        self.values.append(None)
        return len(self.order) - 1

    def __missing__(self, value: Value) -> int:
        if value in self.alias:
            self[value] = self[self.alias[value]]
            return self[value]
        self.order.append(self.slots[value])
        self.values.append(value)
        self[value] = len(self.order) - 1
        return self[value]


@dataclass
class KernelCode:
    """One compiled kernel of a program: its record, the program slot behind each of its
    local buffer numbers, and where its table starts in the program's tables."""

    record: jit.KernelRecord
    slots: list[int]
    offset: int = 0
    extra: tuple = ()       # arrays of the kernel's own (a GEMM's), after the slots' pointers


def kernel_description(k: Kernel, kg: KernelGraph, level: int) -> tuple[str, list[Value]] | None:
    """Everything the LLVM IR of kernel ``k`` is made from, as text, and the values it names
    (``%j`` in the text is ``values[j]``): kind, index space, optimization level, and per
    node its primitive, attributes, operands (literals; the kernel's own values; values in
    memory, with the view each is read through) and result type and level. Two kernels with
    equal descriptions have equal IR up to which buffers they use, so the cache keys kernels
    by it and skips building IR. None when an attribute has no text form (not cached)."""
    names: dict[Value, int] = {}
    values: list[Value] = []

    def name(v: Value) -> str:
        if v not in names:
            names[v] = len(values)
            values.append(v)
        return f"%{names[v]}"

    for node in k.nodes:
        name(node.output)
    lines = [f"{k.kind} {list(k.shape)} {list(k.axes)} O{level}"]
    symbols = program_symbols(kg.graph)
    if symbols:
        # The kernel reads its sizes at these positions of the sizes buffer (a buffer the
        # description names, so that a cached kernel is given the program's own).
        lines.append(f"symbols {name(SYMBOLS)} " + " ".join(symbols))
    for node in k.nodes:
        ops = []
        # A matmul's operands are BLAS's business: its kernel loads the product from memory
        # (so epilogues of products of any operands share their code).
        for op in node.inputs if node.op != "matmul" else ():
            if isinstance(op, Literal):
                ops.append(f"{format_scalar(op.value, op.dtype)}:{op.dtype.short}")
                continue
            text = f"{name(op)}:{format_type(op.type)}"
            view = kg.views.get(op)
            if view is not None:
                text += (f" view {name(view.base)}:{format_type(view.base.type)} "
                         f"{list(view.shape)} {list(view.strides)} {view.offset}")
            ops.append(text)
        try:
            attrs = format_attrs(node)
        except IRError:
            return None
        view = " viewed" if node.output in kg.views else ""
        lines.append(f"{name(node.output)} = {node.op}({', '.join(ops)}) {attrs} : "
                     f"{format_type(node.output.type)} {k.level.get(node.output)}{view}")
    lines.append("outputs " + " ".join(name(v) for v in k.outputs))
    return "\n".join(lines), values


def _gemm_record(dtype: dtypes.DType = dtypes.float32) -> jit.KernelRecord:
    """The generated GEMM's machine code for products in ``dtype`` (compiled once per
    machine, then cached): a bf16 one with ``vdpbf16ps`` where the target has AVX512_BF16,
    else converting to the float32 tile loop."""
    pairs = dtype is dtypes.bfloat16 and jit.target_has_avx512_bf16()
    key = jit.kernel_key(f"gemm {dtype.short}{' pairs' if pairs else ''}")
    record = jit.find_kernel(key)
    if record is None:
        symbol, source = jit.kernel_symbol(native_gemm.emit_gemm(jit.KERNEL_PLACEHOLDER, dtype, pairs))
        record = jit.build_kernel(key, source, symbol, (0, 1, 2))
    return record


def native_gemm_enabled() -> bool:
    """Whether products run as the generated GEMM (``config.native_gemm``: ``on``, or
    ``auto`` on a target with AVX-512)."""
    return config.native_gemm == "on" or (config.native_gemm == "auto" and jit.target_has_avx512())


_eager_gemms: dict = {}


def bf16_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``a @ b`` of 2-D bf16 arrays by the generated bf16 GEMM (float32 sums, rounded once),
    its panels over the worker threads, or where compiled programs would not use it
    (``config.native_gemm``, :func:`fusegrad.codegen.llvm.gemm.fits`) by numpy's BLAS as they
    run it. Eager bf16 products take it (registered into
    ``fusegrad.ops.prims_reduce.register_bf16_matmul``)."""
    if not native_gemm_enabled() or not all(s >= 0 and s % 2 == 0 for s in a.strides + b.strides):
        return _eager_bf16_on_blas(a, b)
    g = native_gemm.Gemm(a.shape[0], b.shape[1], a.shape[1], (a.strides[0] // 2, a.strides[1] // 2), 0,
                         (b.strides[0] // 2, b.strides[1] // 2), 0, dtypes.bfloat16)
    if not native_gemm.fits(g):
        return _eager_bf16_on_blas(a, b)
    key = jit.target_identity()
    fn = _eager_gemms.get(key)
    if fn is None:
        record = _gemm_record(dtypes.bfloat16)
        module = jit.link_kernels([record])
        fn = _eager_gemms[key] = (_KERNEL_FN(module.address(record.symbol)), module)
    c = np.empty((g.m, g.n), dtypes.bfloat16.np_dtype)
    pack = np.empty(max(g.pack_floats, 1), np.float32)
    params = g.params()
    table = (ctypes.c_void_p * 5)(a.ctypes.data, b.ctypes.data, c.ctypes.data, pack.ctypes.data,
                                  params.ctypes.data)
    run_in_parts(fn[0], (ctypes.addressof(table),), g.panels, config.num_threads)
    return c


def _eager_bf16_on_blas(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """An eager bf16 product by numpy's BLAS, as a compiled one without the generated GEMM
    runs it (:func:`bf16_product_on_blas`)."""
    c = np.empty((a.shape[0], b.shape[1]), dtypes.bfloat16.np_dtype)
    bf16_product_on_blas(a, b, c)
    return c


register_bf16_matmul(bf16_matmul)
register_gemm_enabled(native_gemm_enabled)


def gemm_of(k: Kernel, kg: KernelGraph) -> "tuple[native_gemm.Gemm, list[Value]] | None":
    """The product of matmul kernel ``k`` as a generated GEMM and the values of its buffers
    (A's, B's and C's), or None when it is not one the generator is made for (float32 2-D
    operands, or bfloat16 ones with a bfloat16 product; :func:`fusegrad.codegen.llvm.gemm.fits`)."""
    mm = next(n for n in k.nodes if n.op == "matmul")
    a, b = mm.inputs
    out = mm.output
    dtype = out.type.dtype
    if dtype not in (dtypes.float32, dtypes.bfloat16) or out in kg.views or not all(
            isinstance(v, Value) and v.type.dtype == dtype and len(v.type.shape) == 2
            for v in (a, b, out)):
        return None
    (m, kk), (_, n) = a.type.shape, b.type.shape
    operands = []
    layout = []
    for v in (a, b):
        view = kg.views.get(v)
        if view is None:
            operands.append(v)
            layout.append(((v.type.shape[1], 1), 0))
        elif view.base.type.dtype != dtype:      # strides count the base's elements
            return None
        else:
            operands.append(view.base)
            layout.append((tuple(view.strides), view.offset))
    g = native_gemm.Gemm(m, n, kk, layout[0][0], layout[0][1], layout[1][0], layout[1][1], dtype)
    if any(is_symbolic(getattr(g, f.name)) for f in dataclasses.fields(g) if f.name != "dtype"):
        # Symbolic sizes: whether it fits is decided per call (SymbolicGemmStep).
        return g, [*operands, out]
    return (g, [*operands, out]) if native_gemm.fits(g) else None


def _as_view(base: np.ndarray, view: View) -> np.ndarray:
    item = base.itemsize
    flat = base.reshape(-1)
    return np.lib.stride_tricks.as_strided(
        flat[view.offset:] if flat.size else flat, shape=view.shape,
        strides=tuple(s * item for s in view.strides))
