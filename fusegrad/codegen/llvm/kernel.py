"""LLVM IR for fused kernels, built with llvmlite.ir.

Every kernel becomes ``void kN(i8** buffers, i64 start, i64 end)``: ``buffers`` holds the
base pointers of the buffers it reads and writes, at the ``slots`` numbers it is given (the
CPU runtime numbers each kernel's buffers on its own), and ``[start, end)``
is the part of the kernel's outermost parallel loop this call runs, so the runtime can split
a kernel across threads by calling it on sub-ranges.

Values are emitted as expressions of a multi-index (:meth:`KernelEmitter.emit`): a computed
value is its primitive applied to its operands at the matching (broadcast) index, a value in
memory is a load through the strides of its view, a reduction result is its row's
accumulator. ``pad`` and ``concat`` select per element between their operands (loaded at an
index clamped into bounds) and the pad value. Emission is memoized per loop body, so a value
used twice at one index is computed once.

Loop structure: an elementwise kernel is a loop nest over its shape. A reduction kernel
loops over its kept ("row") axes and, per row, runs one loop over the reduced axes per
reduction (accumulators live in allocas that mem2reg turns into phis, so the loop vectorizer
sees a reduction; sums carry ``reassoc``) and a last loop storing full-size outputs. A
reduction that keeps the innermost axis runs interchanged instead (:class:`ColumnPlan`: the
reduced axes outside, a tile of accumulators inside), and a large full reduction is split
into parts reduced in parallel and combined in order (:class:`SplitPlan`, several functions
per kernel: :func:`kernel_phases`). The innermost loop of an elementwise nest is kept rolled
when it runs 8 to 64 times (see :meth:`KernelEmitter.nest`: unrolled, LLVM takes seconds
over it). A load whose address does not depend on the inner loops' indices is emitted ahead
of them (:meth:`KernelEmitter.load`).

Floating-point: the graph's arithmetic carries no fast-math flags (each op rounds as numpy's
does; ``reassoc`` only on reduction combines), never ``nnan``/``ninf``, so NaN and Inf keep
their meaning. Transcendentals come from
:mod:`fusegrad.codegen.llvm.mathlib` (inline polynomials the vectorizer can handle).
16-bit floats compute in float32 (held as 16 raw bits in memory, converted with integer code)
and are rounded where they are stored or cast to. A primitive or dtype with no lowering
raises :class:`Unsupported`, and the runtime runs that kernel with numpy instead.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Sequence

import llvmlite.ir as ir

from fusegrad import dtypes
from fusegrad.codegen import indexing
from fusegrad.codegen.llvm import mathlib
from fusegrad.ir.graph import Literal, Node, Value
from fusegrad.ir.kernel_graph import Kernel, KernelGraph, View, identity_view
from fusegrad.ops import lowering
from fusegrad.ops.lowering import Unsupported

__all__ = ["Unsupported", "KernelEmitter", "emit_kernel", "KERNEL_ARGS", "lltype", "ColumnPlan",
           "column_plan", "parallel_extent", "SplitPlan", "split_plan", "kernel_phases"]

I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
VOID = ir.VoidType()
I8P = I8.as_pointer()
KERNEL_ARGS = (I8P.as_pointer(), I64, I64)

# Interleaving a loop body of transcendental math whose input is loop-invariant (a broadcast
# load: ``a.expand(8, 100).cos().erf()``, a concat of one-element tensors) takes LLVM 22's
# loop vectorizer time exponential in the body (cos+erf: 18 s, two of them: over 8 minutes).
# Codegen therefore emits a load whose address does not depend on a loop's index in that
# loop's preheader (KernelEmitter.load): LICM then moves the math out with it, and the
# vectorizer never sees it. A loop that still holds such a load (its address invariant but
# computed inside the loop) and whose body has more instructions than this is not
# interleaved (``llvm.loop.interleave.count`` 1); other loops keep interleaving, which long
# bodies gain from too (((x*1.5).tanh()*x).sum(): 15-40% slower with the cap).
MAX_INTERLEAVED_BODY = 48
# Constant loops this short are unrolled completely (see KernelEmitter.loop).
FULL_UNROLL_TRIPS = 8

# Elements per block of a blocked float sum (KernelEmitter.blocked_sum): a block is summed in
# vector registers, block sums in float64. Sums of this many elements or fewer (softmax and
# layer_norm rows) are one block, with no outer accumulator.
SUM_BLOCK = 2048

_REDUCE_FLAGS = ("reassoc",)

# Column reductions (the innermost axis kept, see ColumnPlan): a tile holds at most this many
# accumulators (a few KiB: they stay in L1 while the reduced axis streams past them), and a
# float sum adds this many rows per float32 block before the block joins a float64 total
# (each accumulator adds its rows in sequence, so its block must be short to stay accurate).
COLUMN_TILE = 1024
COLUMN_BLOCK = 64
# Tiles are split until a kernel has this many parallel units (when its columns allow tiles
# of at least MIN_COLUMN_CHUNK): the runtime splits the unit loop across threads. Narrower
# tiles read each row in short pieces, which the prefetchers follow badly (a 4096x1024
# column sum: 4.3 ms in tiles of 1024, 11 ms in tiles of 128, on one thread).
COLUMN_UNITS = 8
MIN_COLUMN_CHUNK = 256


@dataclass(frozen=True)
class ColumnPlan:
    """Loop order of a reduction whose innermost axis is kept (``x.sum(0)`` of a row-major
    matrix): the reduced axes run outside and a tile of accumulators, one per kept element
    of the trailing kept axes, runs inside at unit stride, where the vectorizer finds it.
    Looping the other way (one strided reduction per kept element) is 10-30x slower.

    ``outer``: kept axes before the tile, one per parallel unit; ``tile``: trailing kept
    axes held in the tile; ``chunk``: when nonzero the tile is a chunk of that many
    elements of the last axis (``tile`` is then that axis alone). ``units``: the parallel
    loop's extent, ``prod(outer)`` times the chunks per row."""

    outer: tuple[int, ...]
    tile: tuple[int, ...]
    chunk: int
    units: int


def column_plan(kernel: Kernel) -> ColumnPlan | None:
    """The loop order of ``kernel`` when it is a reduction that keeps its innermost axis,
    else None (elementwise kernels, reductions over the last axis)."""
    shape, axes = kernel.shape, kernel.axes
    n = len(shape)
    if kernel.kind != "reduction" or not axes or n - 1 in axes or 0 in shape:
        return None
    tail = list(range(max(axes) + 1, n))
    tile, size = [], 1
    while tail and size * shape[tail[-1]] <= COLUMN_TILE:
        size *= shape[tail[-1]]
        tile.insert(0, tail.pop())
    last = shape[n - 1]
    chunk = 0
    if not tile:                     # the last axis alone is longer than a tile
        fewest = -(-last // COLUMN_TILE)
        tile, chunk = [n - 1], _even_chunk(last, range(fewest, 2 * fewest + 1)) or COLUMN_TILE
    outer = [a for a in range(n) if a not in axes and a not in tile]
    units = math.prod(shape[a] for a in outer)
    # More units for the thread pool: move tile axes out, then chunk the last axis.
    while len(tile) > 1 and units < COLUMN_UNITS and size // shape[tile[0]] >= MIN_COLUMN_CHUNK:
        size //= shape[tile[0]]
        units *= shape[tile[0]]
        outer.append(tile.pop(0))
    if len(tile) == 1 and units < COLUMN_UNITS and not chunk:
        chunk = _even_chunk(last, range(-(-COLUMN_UNITS // units), 1, -1))
    if chunk:
        units *= -(-last // chunk)
    return ColumnPlan(tuple(outer), tuple(tile), chunk, units)


def _even_chunk(n: int, pieces) -> int:
    """The chunk of the first count in ``pieces`` that cuts ``n`` into equal chunks of at
    least MIN_COLUMN_CHUNK and at most COLUMN_TILE elements, each a multiple of 16; 0 if
    none does. Equal chunks give the tile loop a constant trip count: LLVM then keeps the
    accumulators in registers (a 1000x3x300 sum(0) in chunks of 256 and 44: 5x slower)."""
    for p in pieces:
        c = n // p
        if n % p == 0 and c % 16 == 0 and MIN_COLUMN_CHUNK <= c <= COLUMN_TILE:
            return c
    return 0


# Full reductions (no kept axes) of at least SPLIT_WORK elements (the runtime's threading
# threshold) are split into at most SPLIT_PARTS parts along their leading axes, reduced
# in parallel and combined in part order. The parts are fixed by the shape, so a result
# has the same bits whatever the thread count.
SPLIT_WORK = 1 << 16
SPLIT_PARTS = 16


@dataclass(frozen=True)
class SplitPlan:
    """How a full reduction is split: the leading ``lead`` axes (``lead_size`` indices in
    all) are cut into ``parts`` ranges. Each reduction of the kernel runs as a parallel
    phase that reduces each part into a scratch cell (``kN_p<i>``, over the parts), then a
    serial one that combines the cells in order (``kN_c<i>``); the last combine stores the
    kernel's scalar outputs, and a parallel phase over the leading indices stores its
    full-size outputs (``kN``)."""

    lead: int
    lead_size: int
    parts: int
    reductions: int

    def cells(self) -> int:
        """8-byte cells of scratch: two per part and reduction (a float64 sum's
        compensation beside its total), then one final value per reduction."""
        return 2 * self.reductions * self.parts + self.reductions


def _reductions(kernel: Kernel) -> list[Node]:
    """The reductions a reduction kernel loops over, in order."""
    return [n for n in kernel.nodes if n.op in lowering.REDUCE_OPS and
            tuple(n.attrs["axes"]) == kernel.axes and kernel.level[n.output] == "row"]


def split_plan(kernel: Kernel) -> SplitPlan | None:
    """How ``kernel`` is split across threads when it is a large full reduction, else None."""
    shape = kernel.shape
    if kernel.kind != "reduction" or len(kernel.axes) != len(shape) or not shape or \
            math.prod(shape) < SPLIT_WORK:
        return None
    count = len(_reductions(kernel))
    if not count:
        return None
    lead, size = 0, 1
    while lead < len(shape) and size < 4 * SPLIT_PARTS:
        size *= shape[lead]
        lead += 1
    return SplitPlan(lead, size, min(SPLIT_PARTS, size), count)


def kernel_phases(kernel: Kernel) -> list[tuple[str, int]]:
    """(function name, parallel extent) of each function ``kernel`` compiles to, in launch
    order: one for most kernels, several for a split full reduction (:class:`SplitPlan`)."""
    plan = split_plan(kernel)
    if plan is None:
        return [(kernel.name, parallel_extent(kernel))]
    phases = []
    for i in range(plan.reductions):
        phases += [(f"{kernel.name}_p{i}", plan.parts), (f"{kernel.name}_c{i}", 1)]
    if any(kernel.level.get(v) == "full" for v in kernel.outputs):
        phases.append((kernel.name, plan.lead_size))
    return phases


def parallel_extent(kernel: Kernel) -> int:
    """Extent of ``kernel``'s parallel loop (the ``[start, end)`` the runtime splits)."""
    plan = column_plan(kernel)
    if plan is not None:
        return plan.units
    if kernel.kind == "reduction":
        kept = [d for i, d in enumerate(kernel.shape) if i not in kernel.axes]
        return kept[0] if kept else 1
    return kernel.shape[0] if kernel.shape else 1


def lltype(dt: dtypes.DType) -> ir.Type:
    """Register type of a dtype (bools are i1, 16-bit floats compute as float)."""
    if dt is dtypes.bool_:
        return I1
    if dt.is_floating_point:
        return F64 if dt is dtypes.float64 else F32
    return ir.IntType(dt.itemsize * 8)


def memtype(dt: dtypes.DType) -> ir.Type:
    """In-memory element type (bool is a byte, the 16-bit floats are 16 raw bits)."""
    if dt is dtypes.bool_:
        return I8
    if dt in (dtypes.float16, dtypes.bfloat16):
        return I16
    return lltype(dt)


class LLVMScalars:
    """The :class:`fusegrad.ops.lowering.ScalarBuilder` of the LLVM backend: each operation
    is one llvmlite instruction (or an intrinsic, or mathlib's inline code) at the position
    of ``emitter.b``. Float arithmetic carries no fast-math flags (``reassoc`` on a
    reduction's combine), never ``nnan``/``ninf``."""

    def __init__(self, emitter: "KernelEmitter | None"):
        self.em = emitter

    @property
    def b(self) -> ir.IRBuilder:
        return self.em.b

    def const(self, dt: dtypes.DType, value) -> ir.Constant:
        t = lltype(dt)
        return ir.Constant(t, int(value) if isinstance(t, ir.IntType) else float(value))

    def binary(self, op: str, x, y, dt: dtypes.DType, reassociable: bool = False):
        b = self.b
        if dt.is_floating_point:
            if op in ("max", "min"):
                return self.em.intrinsic("llvm." + ("maximum" if op == "max" else "minimum"),
                                         [x, y])
            if op == "rem":
                return b.frem(x, y)           # exact: IEEE fmod, as numpy and C
            # No ``contract``: each op rounds as numpy's does. With it LLVM fused ``x*x - m``
            # into one FMA, which is not 0 where eager's is (softmax over a dim of size 1 of
            # x*x gave NaN where eager gives 1). The mathlib's polynomials keep their FMAs.
            return getattr(b, "f" + op)(x, y, flags=_REDUCE_FLAGS if reassociable else ())
        u = lowering.unsigned(dt)
        if op in ("max", "min"):
            return self.em.intrinsic(f"llvm.{'u' if u else 's'}{op}", [x, y])
        if op == "div":
            return b.udiv(x, y) if u else b.sdiv(x, y)
        if op == "rem":
            return b.urem(x, y) if u else b.srem(x, y)
        if op == "shr":
            return b.lshr(x, y) if u else b.ashr(x, y)
        if op in ("and", "or"):
            return getattr(b, op + "_")(x, y)
        return getattr(b, op)(x, y)

    def unary(self, op: str, x, dt: dtypes.DType):
        b = self.b
        if op == "neg":
            return b.fneg(x) if dt.is_floating_point else b.neg(x)
        if op in ("fabs", "floor", "ceil", "roundeven"):
            return self.em.intrinsic(f"llvm.{op}", [x])
        return mathlib.emit_unary(b, op, x)

    def cmp(self, pred: str, x, y, dt: dtypes.DType):
        sym = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[pred]
        b = self.b
        if dt.is_floating_point:
            if pred == "ne" and x is y:
                return b.fcmp_unordered("uno", x, x)      # isnan, as LLVM spells it
            return b.fcmp_unordered(sym, x, y) if pred == "ne" else b.fcmp_ordered(sym, x, y)
        if lowering.unsigned(dt):
            return b.icmp_unsigned(sym, x, y)
        return b.icmp_signed(sym, x, y)

    def select(self, c, x, y, dt: dtypes.DType):
        return self.b.select(c, x, y)

    def cast(self, x, src: dtypes.DType, dst: dtypes.DType):
        b = self.b
        st, dt_ = lltype(src), lltype(dst)
        if src.is_floating_point and dst.is_floating_point:
            if st == dt_:
                return x
            return b.fpext(x, dt_) if isinstance(dt_, ir.DoubleType) else b.fptrunc(x, dt_)
        if src.is_floating_point:
            return b.fptoui(x, dt_) if lowering.unsigned(dst) else b.fptosi(x, dt_)
        if dst.is_floating_point:
            return b.uitofp(x, dt_) if lowering.unsigned(src) else b.sitofp(x, dt_)
        if st.width == dt_.width:
            return x
        if st.width > dt_.width:
            return b.trunc(x, dt_)
        return b.zext(x, dt_) if lowering.unsigned(src) else b.sext(x, dt_)

    def bitcast(self, x, src: dtypes.DType, dst: dtypes.DType):
        return x if lltype(src) == lltype(dst) else self.b.bitcast(x, lltype(dst))

    def call(self, fn: str, args: list, dt: dtypes.DType):
        if fn == "pow":
            return mathlib.emit_pow(self.b, *args)
        if fn == "ipow":
            return self.int_power(*args)
        if fn == "copysign":
            return self.em.intrinsic("llvm.copysign", args)
        raise lowering.Unsupported(f"no LLVM lowering for {fn}")

    def int_power(self, x, y) -> ir.Value:
        """Integer ``x**y`` for ``y >= 0`` by square-and-multiply, wrapping as numpy does: a
        loop over the bits of ``y`` (unrolled over all 64 bits, LLVM takes seconds to
        vectorize it)."""
        b = self.b
        t = x.type
        zero, one = ir.Constant(t, 0), ir.Constant(t, 1)
        pre = b.block
        header = b.append_basic_block("ipow.header")
        body = b.append_basic_block("ipow.body")
        done = b.append_basic_block("ipow.exit")
        b.branch(header)
        b.position_at_end(header)
        acc, base, e = b.phi(t), b.phi(t), b.phi(t)
        acc.add_incoming(one, pre)
        base.add_incoming(x, pre)
        e.add_incoming(y, pre)
        b.cbranch(b.icmp_unsigned("!=", e, zero), body, done)
        b.position_at_end(body)
        bit = b.icmp_unsigned("!=", b.and_(e, one), zero)
        acc.add_incoming(b.select(bit, b.mul(acc, base), acc), body)
        base.add_incoming(b.mul(base, base), body)
        e.add_incoming(b.lshr(e, one), body)
        b.branch(header)
        b.position_at_end(done)
        return acc


_CONSTANTS = LLVMScalars(None)


def _const(dt: dtypes.DType, value) -> ir.Constant:
    return lowering.constant(_CONSTANTS, dt, value)


class KernelEmitter:
    """Emits one kernel's function into ``module``."""

    def __init__(self, module: ir.Module, kernel: Kernel, kg: KernelGraph,
                 slots: dict[Value, int], name: str | None = None, scratch: int | None = None):
        self.module = module
        self.k = kernel
        self.kg = kg
        self.slots = slots
        self.scratch_slot = scratch       # a split reduction's cells (SplitPlan)
        self.internal = set(kernel.nodes)
        self.fn = ir.Function(module, ir.FunctionType(VOID, KERNEL_ARGS), name=name or kernel.name)
        self.fn.args[0].name, self.fn.args[1].name, self.fn.args[2].name = "bufs", "start", "end"
        # Allocas and buffer pointers go to "entry", which jumps to "body" once the kernel is
        # complete; keeping the two apart lets both builders append without clashing.
        entry = self.fn.append_basic_block("entry")
        self.body_block = self.fn.append_basic_block("body")
        self.b = ir.IRBuilder(self.body_block)
        self.sb = LLVMScalars(self)
        self.entry_builder = ir.IRBuilder(entry)
        self.scopes: list[dict] = [{}]
        self.acc: dict[Value, ir.Value] = {}
        self.scratch: tuple | None = None      # (value, alloca): see row_scratch
        self._ptrs: dict[int, ir.Value] = {}
        # Open loops, outermost first: [index phi, preheader block, holds an invariant load,
        # first block of the body].
        self.loops: list[list] = []
        self._deps: dict[int, frozenset] = {}
        # An empty kernel may have empty buffers: nothing is loaded ahead of its loops.
        self.can_hoist = 0 not in kernel.shape

    # ------------------------------------------------------------------ utilities

    def ptr(self, value: Value) -> ir.Value:
        """Typed base pointer of a buffer (loaded once, in the entry block)."""
        slot = self.slots[value]
        if slot not in self._ptrs:
            eb = self.entry_builder
            raw = eb.load(eb.gep(self.fn.args[0], [ir.Constant(I64, slot)], inbounds=True))
            self._ptrs[slot] = eb.bitcast(raw, memtype(value.type.dtype).as_pointer())
        return self._ptrs[slot]

    @contextlib.contextmanager
    def loop(self, start, stop, name: str, unroll: bool = True):
        """A canonical counted loop ``for i in [start, stop)``; yields ``i``. ``unroll=False``
        forbids LLVM to unroll it (``llvm.loop.unroll.disable``); otherwise an innermost loop
        of at most ``FULL_UNROLL_TRIPS`` constant iterations is unrolled completely
        (``llvm.loop.unroll.full``: the pipeline runs no unroller of its own, see
        :func:`fusegrad.runtime.jit._optimize`), so that the loop around it is innermost
        and vectorizes across rows (a softmax over 3 classes, a (4000, 3) broadcast)."""
        b = self.b
        trips = stop - start if isinstance(start, int) and isinstance(stop, int) else None
        start = start if isinstance(start, ir.Value) else ir.Constant(I64, start)
        stop = stop if isinstance(stop, ir.Value) else ir.Constant(I64, stop)
        first_block = len(self.fn.blocks)
        pre = b.block
        header = b.append_basic_block(f"{name}.header")
        body = b.append_basic_block(f"{name}.body")
        done = b.append_basic_block(f"{name}.exit")
        b.branch(header)
        b.position_at_end(header)
        i = b.phi(I64, name=name)
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", i, stop), body, done)
        b.position_at_end(body)
        self.scopes.append({})
        if self.loops:
            self.loops[-1][4] = True                  # the enclosing loop is not innermost
        self.loops.append([i, pre, False, body, False])
        yield i
        _, _, invariant_load, _, outer = self.loops.pop()
        self.scopes.pop()
        nxt = b.add(i, ir.Constant(I64, 1), name=f"{name}.next", flags=("nsw",))
        i.add_incoming(nxt, b.block)
        latch = b.branch(header)
        short = trips is not None and 1 < trips <= FULL_UNROLL_TRIPS and not outer
        flags: list = ["llvm.loop.unroll.disable"] if not unroll else \
            ["llvm.loop.unroll.full"] if short else []
        size = sum(len(block.instructions) for block in self.fn.blocks[first_block:])
        if size > MAX_INTERLEAVED_BODY and invariant_load:
            flags.append(("llvm.loop.interleave.count", ir.Constant(I32, 1)))
        if flags:
            latch.set_metadata("llvm.loop", self.loop_id(*flags))
        b.position_at_end(done)

    def loop_id(self, *flags) -> ir.Value:
        """Loop metadata ``!N = !{!N, !{!"flag"}, !{!"flag", value}, ...}`` (a flag is a
        name or a (name, constant) pair): LLVM wants the node to refer to itself, which
        llvmlite cannot build, so the self-reference replaces a placeholder."""
        m = self.module
        props = [m.add_metadata([ir.MetaDataString(m, f)] if isinstance(f, str) else
                                [ir.MetaDataString(m, f[0]), f[1]]) for f in flags]
        node = m.add_metadata([ir.MetaDataString(m, f"loop{len(m.metadata)}")] + props)
        node.operands = (node,) + node.operands[1:]
        return node

    def cached(self, key):
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    # ------------------------------------------------------------------ loads and stores

    def view(self, v: Value) -> View:
        return self.kg.views.get(v) or identity_view(v)

    def address(self, view: View, coords: Sequence) -> ir.Value:
        b = self.b
        offset = ir.Constant(I64, view.offset)
        for c, s, d in zip(coords, view.strides, view.shape):
            if s == 0 or d == 1:
                continue
            term = c if s == 1 else b.mul(c, ir.Constant(I64, s), flags=("nsw",))
            offset = b.add(offset, term, flags=("nsw",))
        return b.gep(self.ptr(view.base), [offset], inbounds=True, name="addr")

    def load(self, v: Value, coords: Sequence) -> ir.Value:
        view = self.view(v)
        producer = view.base.producer
        if producer in self.internal and producer.op != "matmul":
            # Its buffer is written after this kernel's loops: the load would read stale
            # memory. Fusion must not build such a kernel (_Partitioner.reads_own_view).
            raise AssertionError(f"{self.k.describe()} reads its own {producer.op} from memory")
        used = [c for c, s, d in zip(coords, view.strides, view.shape) if s != 0 and d != 1]
        deps = frozenset().union(*(self.loop_deps(c) for c in used))
        depth = max((n + 1 for n, entry in enumerate(self.loops) if id(entry[0]) in deps),
                    default=0)
        if depth == len(self.loops):                 # varies with the innermost loop
            raw = self.b.load(self.address(view, coords))
            return self.from_memory(raw, v.type.dtype)
        if self.can_hoist and all(self.available(c, depth) for c in used):
            # Emitted ahead of the outermost loop it does not depend on. The address is in
            # bounds (the kernel is not empty), so loading it there is safe even when that
            # loop would not have run.
            with self.b.goto_block(self.loops[depth][1]):
                raw = self.b.load(self.address(view, coords))
                return self.from_memory(raw, v.type.dtype)
        for entry in self.loops[depth:]:
            entry[2] = True
        raw = self.b.load(self.address(view, coords))
        return self.from_memory(raw, v.type.dtype)

    def available(self, c, depth: int) -> bool:
        """Whether coordinate ``c`` can be used in the preheader of open loop ``depth``:
        a constant, the index of an enclosing loop, or an instruction in a block that
        dominates that preheader (the first body block of an enclosing loop, or the
        preheader of one of the loops up to ``depth``: a unit's coordinates in a column
        kernel, a leading index's in a split one)."""
        if isinstance(c, ir.Constant):
            return True
        if any(entry[0] is c for entry in self.loops[:depth]):
            return True
        if not isinstance(c, ir.Instruction) or isinstance(c, ir.PhiInstr):
            return False
        return any(c.parent is entry[3] for entry in self.loops[:depth]) or \
            any(c.parent is entry[1] for entry in self.loops[:depth + 1])

    def loop_deps(self, value) -> frozenset:
        """ids of the loop indices ``value`` depends on (every open loop's, for a value not
        built from loop indices, constants and the entry block's pointers)."""
        key = id(value)
        hit = self._deps.get(key)
        if hit is not None:
            return hit
        if isinstance(value, ir.PhiInstr):
            out = frozenset([key]) if any(e[0] is value for e in self.loops) else \
                frozenset(id(e[0]) for e in self.loops)
        elif isinstance(value, ir.Instruction):
            out = frozenset().union(*(self.loop_deps(op) for op in value.operands))
        else:                                       # constants, arguments
            out = frozenset()
        # Only instructions are cached: the function keeps them alive, so their ids stay
        # theirs (a temporary constant's id may be reused); phis depend on the open loops.
        if isinstance(value, ir.Instruction) and not isinstance(value, ir.PhiInstr):
            self._deps[key] = out
        return out

    def store(self, v: Value, coords: Sequence, x: ir.Value) -> None:
        view = identity_view(v)
        self.b.store(self.to_memory(x, v.type.dtype), self.address(view, coords))

    def from_memory(self, raw: ir.Value, dt: dtypes.DType) -> ir.Value:
        return lowering.from_memory(self.sb, raw, dt)

    def to_memory(self, x: ir.Value, dt: dtypes.DType) -> ir.Value:
        return lowering.to_memory(self.sb, x, dt)

    # ------------------------------------------------------------------ expressions

    def emit(self, v, coords: Sequence) -> ir.Value:
        """The value of ``v`` at index ``coords`` (one i64 per dimension of ``v``)."""
        if isinstance(v, Literal):
            return _const(v.dtype, v.value)
        if v in self.acc:
            # A float16 sum accumulates in float32; eager rounds the result to float16.
            return self.round_half(self.acc[v], v.type.dtype)
        key = (v, tuple(id(c) for c in coords))
        hit = self.cached(key)
        if hit is not None:
            return hit[0]
        node = v.producer
        if node is None or node not in self.internal or node.op == "matmul":
            out = self.load(v, coords)
        else:
            out = self.emit_node(node, coords)
        # Keep the coordinate objects alive with the entry, so their ids stay unique.
        self.scopes[-1][key] = (out, tuple(coords))
        return out

    def emit_node(self, node: Node, coords) -> ir.Value:
        op = node.op
        out_shape = node.output.type.shape
        if op == "reshape":
            return self.emit(node.inputs[0], indexing.reshape_coords(
                self.sb, node.inputs[0].type.shape, out_shape, coords))
        if op == "broadcast_to":
            return self.emit(node.inputs[0], indexing.operand_coords(
                self.sb, node.inputs[0], out_shape, coords))
        if op == "full":
            return _const(node.attrs["dtype"], node.attrs["value"])
        if op == "iota":
            return self.convert(coords[node.attrs["axis"]], dtypes.int64, node.attrs["dtype"])
        if op == "pad":
            return indexing.pad_value(self.sb, node, coords, self.emit)
        if op == "concat":
            return indexing.concat_value(self.sb, node, coords, self.emit)
        args = [self.emit(x, indexing.operand_coords(self.sb, x, out_shape, coords))
                for x in node.inputs]
        return lowering.lower_scalar(self.sb, node, args)

    def round_half(self, x: ir.Value, dt: dtypes.DType) -> ir.Value:
        """``x`` (a float register) rounded to ``dt`` when ``dt`` is a 16-bit float."""
        return lowering.round_half(self.sb, x, dt)

    # ------------------------------------------------------------------ scalar ops

    def convert(self, x: ir.Value, src: dtypes.DType, dst: dtypes.DType) -> ir.Value:
        return lowering.convert(self.sb, x, src, dst)

    def intrinsic(self, name: str, args: list, ret: ir.Type | None = None) -> ir.Value:
        t = args[0].type
        ret = ret or t
        suffix = _mangle(ret) if name.endswith(".sat") else _mangle(t)
        full = f"{name}.{suffix}" if not name.endswith(".sat") else \
            f"{name}.{_mangle(ret)}.{_mangle(t)}"
        fn = self.module.globals.get(full)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, [a.type for a in args]), name=full)
        return self.b.call(fn, args)

    # ------------------------------------------------------------------ kernels

    def outputs_at(self, level: str) -> list[Value]:
        return [v for v in self.k.outputs if self.k.level.get(v) == level]

    def emit_elementwise(self) -> None:
        shape = self.k.shape
        outs = self.outputs_at("full")
        self.nest(shape, lambda coords: [self.store(v, coords, self.emit(v, coords))
                                         for v in outs], parallel=True, vectorize_inner=True)

    def nest(self, shape, body, parallel: bool, coords=(), vectorize_inner: bool = False) -> None:
        """Loops over ``shape``; the first loop runs [start, end) when ``parallel``.

        ``vectorize_inner``: an innermost loop of 8 to 64 iterations is kept rolled, so that
        LLVM vectorizes it. Fully unrolled, it would make LLVM vectorize the loop around it
        with interleaved accesses as wide as the unrolled body, which LLVM 22's SLP vectorizer
        and loop-load elimination take seconds over (a 3x33 float32 sign: 2.4 s; a 3x17
        bfloat16 copy: 5 s). Shorter loops still unroll: across rows is the better
        vectorization there (softmax over 3 classes)."""
        depth = len(coords)
        if depth == len(shape):
            body(list(coords))
            return
        if parallel and depth == 0:
            lo, hi = self.fn.args[1], self.fn.args[2]
        else:
            lo, hi = 0, shape[depth]
        innermost = depth == len(shape) - 1
        unroll = not (vectorize_inner and innermost and isinstance(hi, int)
                      and (8 <= hi <= 64 or (hi < 8 and self._wide_byte_body(shape))))
        with self.loop(lo, hi, f"i{depth}", unroll=unroll) as i:
            self.nest(shape, body, parallel, coords + (i,), vectorize_inner)

    def _wide_byte_body(self, shape) -> bool:
        """Whether fully unrolling the short trailing loops of ``shape`` would give a body of
        16 or more elements in a kernel that moves bytes (bool, int8). LLVM then vectorizes
        the loop around that body 64 lanes wide with interleaved accesses as wide as the
        body: a bool ``a & b`` over (3000, 5, 6) and (3000, 1, 6) took 7 to 14 s to compile
        (0.1 s with the innermost loop kept rolled; float32 loads vectorize at 16 lanes and
        compile in 0.2 s either way)."""
        body = 1
        for d in reversed(shape[1:]):
            if d >= 8:
                break
            body *= d
        return body >= 16 and any(v.type.dtype.itemsize == 1
                                  for v in [*self.k.inputs, *self.k.outputs])

    def emit_reduction(self) -> None:
        k = self.k
        kept = [i for i in range(len(k.shape)) if i not in k.axes]
        reductions = _reductions(k)
        row_outs = self.outputs_at("row")
        full_outs = self.outputs_at("full")
        zero = ir.Constant(I64, 0)

        def full_coords(row, red):
            coords, r, q = [], iter(row), iter(red)
            for i in range(len(k.shape)):
                coords.append(next(q) if i in k.axes else next(r))
            return coords

        plan = column_plan(k)
        if plan is not None and reductions:
            self.emit_columns(plan, reductions)
            return
        # Keep the last reduction's input per row in a scratch row when the stores read it
        # too (softmax's exp(x - max)): the final loop then loads it instead of recomputing.
        red_shape = [k.shape[a] for a in k.axes]
        self.scratch = self.row_scratch(reductions[-1] if reductions else None, full_outs,
                                        red_shape)

        def per_row(row):
            for node in reductions:
                self.reduce_loop(node, row, full_coords)
            for v in row_outs:
                shape = v.type.shape
                if len(shape) == len(k.shape):       # keepdim shape
                    coords = [zero if i in k.axes else c
                              for i, c in zip(range(len(k.shape)), full_coords(row, [zero] *
                                                                               len(k.axes)))]
                else:
                    coords = list(row)
                self.store(v, coords, self.emit(v, coords))
            if full_outs:
                red_shape = [k.shape[a] for a in k.axes]

                def store_full(red):
                    coords = full_coords(row, red)
                    if self.scratch is not None:
                        value, buf = self.scratch
                        cached = self.b.load(self.b.gep(buf, [self.red_index(red, red_shape)]))
                        self.scopes[-1][(value, tuple(id(c) for c in coords))] = \
                            (cached, tuple(coords))
                    for v in full_outs:
                        self.store(v, coords, self.emit(v, coords))
                self.nest(red_shape, store_full, parallel=False)

        self.nest([k.shape[i] for i in kept], per_row, parallel=bool(kept))

    def identity(self, node: Node) -> ir.Constant:
        """The accumulator's starting value for reduction ``node``."""
        return lowering.reduction_identity(self.sb, node.op, node.output.type.dtype)

    def reduce_loop(self, node: Node, row, full_coords) -> None:
        k, b = self.k, self.b
        out_dt = node.output.type.dtype
        op = node.op
        src = node.inputs[0]
        src_dt = src.type.dtype
        identity = self.identity(node)
        slot = self.entry_builder.alloca(lltype(out_dt), name="acc")
        b.store(identity, slot)
        red_shape = [k.shape[a] for a in k.axes]

        def body(red):
            x = self.emit(src, full_coords(row, red))
            if self.scratch is not None and self.scratch[0] is src:
                b.store(x, b.gep(self.scratch[1], [self.red_index(red, red_shape)]))
            x = self.convert(x, src_dt, out_dt) if src_dt is not out_dt else x
            cur = b.load(slot)
            b.store(self.combine(op, cur, x, out_dt), slot)
        if op == "sum" and out_dt.is_floating_point and math.prod(red_shape) > SUM_BLOCK:
            self.acc[node.output] = self.blocked_sum(red_shape, body, slot, identity)
            return
        self.nest(red_shape, body, parallel=False)
        self.acc[node.output] = b.load(slot)

    def blocks(self, red_shape, size: int, body, begin, end) -> None:
        """Loops over ``red_shape`` in blocks of at most ``size`` elements: ``begin()``,
        ``body(red)`` for each element of the block, ``end()``. A block is the innermost
        dims whose product fits ``size``, or a chunk of the innermost dim when that alone
        is longer."""
        b = self.b
        inner, split = 1, len(red_shape)
        while split > 0 and inner * red_shape[split - 1] <= size:
            split -= 1
            inner *= red_shape[split]
        chunked = split == len(red_shape)        # the last dim alone exceeds the block
        outer_shape = list(red_shape[:-1] if chunked else red_shape[:split])
        if chunked:
            outer_shape.append(-(-red_shape[-1] // size))

        def block(outer):
            begin()
            if chunked:
                n = red_shape[-1]
                lo = b.mul(outer[-1], ir.Constant(I64, size), flags=("nsw",))
                hi = b.add(lo, ir.Constant(I64, size), flags=("nsw",))
                hi = b.select(b.icmp_signed("<", hi, ir.Constant(I64, n)), hi,
                              ir.Constant(I64, n))
                with self.loop(lo, hi, f"r{len(outer)}") as i:
                    body(list(outer[:-1]) + [i])
            else:
                self.nest(red_shape, body, parallel=False, coords=tuple(outer))
            end()
        self.nest(outer_shape, block, parallel=False)

    def add_to_total(self, part: ir.Value, total, comp) -> None:
        """``total += part`` in float64: a float32 part is widened, a float64 one is added
        with Neumaier's compensation (the low-order bits lost go to ``comp``)."""
        b = self.b
        compensated = part.type == F64
        part = part if compensated else b.fpext(part, F64)
        s = b.load(total)
        t = b.fadd(s, part)
        if compensated:
            # Neumaier: the low-order bits lost by s + part, from whichever is larger.
            big = b.fcmp_ordered(">=", self.intrinsic("llvm.fabs", [s]),
                                 self.intrinsic("llvm.fabs", [part]))
            lost = b.select(big, b.fadd(b.fsub(s, t), part), b.fadd(b.fsub(part, t), s))
            b.store(b.fadd(b.load(comp), lost), comp)
        b.store(t, total)

    def total_value(self, total, comp, acc_t: ir.Type) -> ir.Value:
        """The sum kept by :meth:`add_to_total`, in the accumulator's type."""
        b = self.b
        s = b.load(total)
        if acc_t != F64:
            return b.fptrunc(s, acc_t)
        # An infinite or NaN total leaves a NaN compensation (inf - inf): keep the total.
        finite = b.fcmp_ordered("<", self.intrinsic("llvm.fabs", [s]),
                                ir.Constant(F64, float("inf")))
        # A zero compensation leaves the total as it is (-0.0 + 0.0 would lose the sign).
        c = b.load(comp)
        exact = b.fcmp_unordered("==", c, ir.Constant(F64, 0.0))
        return b.select(b.or_(exact, b.xor(finite, ir.Constant(I1, 1))), s, b.fadd(s, c))

    def blocked_sum(self, red_shape, body, slot, identity) -> ir.Value:
        """A float sum over ``red_shape`` in blocks of at most SUM_BLOCK elements: ``body``
        accumulates a block into ``slot`` (a loop the vectorizer turns into a few dozen
        partial sums), and block sums are added in float64 (float32 and 16-bit sums) or
        with Neumaier's compensation (float64 sums). The error is then that of a block
        plus one rounding, not that of n / lanes sequential additions (0.3% on 2**27
        elements); numpy sums pairwise and torch in cascades for the same reason."""
        b = self.b
        total = self.entry_builder.alloca(F64, name="total")
        comp = self.entry_builder.alloca(F64, name="comp")
        b.store(ir.Constant(F64, 0.0), total)
        b.store(ir.Constant(F64, 0.0), comp)
        self.blocks(red_shape, SUM_BLOCK, body, lambda: b.store(identity, slot),
                    lambda: self.add_to_total(b.load(slot), total, comp))
        return self.total_value(total, comp, slot.type.pointee)

    # ------------------------------------------------------------------ split reductions

    def cell(self, index: int, t: ir.Type) -> ir.Value:
        """Pointer to 8-byte cell ``index`` of the split reduction's scratch, as ``t*``."""
        eb = self.entry_builder
        raw = eb.load(eb.gep(self.fn.args[0], [ir.Constant(I64, self.scratch_slot)],
                             inbounds=True))
        base = eb.bitcast(raw, I64.as_pointer())
        return self.b.bitcast(self.b.gep(base, [ir.Constant(I64, index)], inbounds=True),
                              t.as_pointer())

    def lead_loop(self, plan: SplitPlan, lo, hi, body) -> None:
        """``body(coords)`` over the leading indices ``[lo, hi)`` and all the other axes.
        The last leading axis runs as a loop of its own (a range of each of its rows), so
        no element pays a division."""
        b, shape = self.b, self.k.shape
        if plan.lead == 1:
            with self.loop(lo, hi, "f") as f:
                self.nest(shape, body, parallel=False, coords=(f,))
            return
        d = ir.Constant(I64, shape[plan.lead - 1])
        first = b.udiv(lo, d)
        stop = b.udiv(b.add(hi, ir.Constant(I64, shape[plan.lead - 1] - 1)), d)
        with self.loop(first, stop, "q") as q:
            base = b.mul(q, d, flags=("nsw",))
            a = b.sub(lo, base)
            a = b.select(b.icmp_signed(">", a, ir.Constant(I64, 0)), a, ir.Constant(I64, 0))
            e = b.sub(hi, base)
            e = b.select(b.icmp_signed("<", e, d), e, d)
            outer = self.lead_coords(SplitPlan(plan.lead - 1, 0, 0, 0), q)
            with self.loop(a, e, "f") as f:
                self.nest(shape, body, parallel=False, coords=tuple(outer) + (f,))

    def emit_split_phase(self, plan: SplitPlan, phase: str, index: int) -> None:
        """One function of a split full reduction: ``phase`` "p" (reduction ``index`` over
        the parts [start, end)), "c" (its combination) or "full" (the full-size stores)."""
        k, b = self.k, self.b
        reductions = _reductions(k)
        finals = 2 * plan.reductions * plan.parts

        def load_finals(count):
            for i, node in enumerate(reductions[:count]):
                self.acc[node.output] = b.load(self.cell(finals + i, lltype(
                    node.output.type.dtype)))

        if phase == "full":
            load_finals(len(reductions))
            outs = self.outputs_at("full")
            self.lead_loop(plan, self.fn.args[1], self.fn.args[2],
                           lambda coords: [self.store(v, coords, self.emit(v, coords))
                                           for v in outs])
            return
        node = reductions[index]
        out_dt = node.output.type.dtype
        acc_t = lltype(out_dt)
        float_sum = node.op == "sum" and out_dt.is_floating_point
        load_finals(index)
        if phase == "p":
            with self.loop(self.fn.args[1], self.fn.args[2], "part") as part:
                self.split_part(plan, node, part, index)
            return
        # Combine the parts in order.
        identity = self.identity(node)
        if float_sum:
            total = self.entry_builder.alloca(F64, name="total")
            comp = self.entry_builder.alloca(F64, name="comp")
            b.store(ir.Constant(F64, 0.0), total)
            b.store(ir.Constant(F64, 0.0), comp)
            for p in range(plan.parts):
                cell = 2 * (index * plan.parts + p)
                self.add_to_total(b.load(self.cell(cell, F64)), total, comp)
                if acc_t == F64:
                    b.store(b.fadd(b.load(comp), b.load(self.cell(cell + 1, F64))), comp)
            value = self.total_value(total, comp, acc_t)
        else:
            value = identity
            for p in range(plan.parts):
                part = b.load(self.cell(2 * (index * plan.parts + p), acc_t))
                value = self.combine(node.op, value, part, out_dt)
        b.store(value, self.cell(finals + index, acc_t))
        if index == len(reductions) - 1:
            self.acc[node.output] = value
            zero = ir.Constant(I64, 0)
            for v in self.outputs_at("row"):
                coords = [zero] * len(v.type.shape)
                self.store(v, coords, self.emit(v, coords))

    def split_part(self, plan: SplitPlan, node: Node, part: ir.Value, index: int) -> None:
        """Reduce ``node`` over part ``part`` into its scratch cells."""
        b, shape = self.b, self.k.shape
        out_dt = node.output.type.dtype
        acc_t = lltype(out_dt)
        src, src_dt = node.inputs[0], node.inputs[0].type.dtype
        n, parts = ir.Constant(I64, plan.lead_size), ir.Constant(I64, plan.parts)
        lo = b.udiv(b.mul(part, n), parts)
        hi = b.udiv(b.mul(b.add(part, ir.Constant(I64, 1)), n), parts)
        identity = self.identity(node)
        slot = self.entry_builder.alloca(acc_t, name="acc")
        cell = 2 * index * plan.parts

        def body(coords):
            x = self.emit(src, coords)
            x = self.convert(x, src_dt, out_dt) if src_dt is not out_dt else x
            b.store(self.combine(node.op, b.load(slot), x, out_dt), slot)
        b.store(identity, slot)
        out = b.gep(self.cell(cell, I64), [b.mul(part, ir.Constant(I64, 2))])
        if not (node.op == "sum" and out_dt.is_floating_point):
            self.lead_loop(plan, lo, hi, body)
            b.store(b.load(slot), b.bitcast(out, acc_t.as_pointer()))
            return
        # Blocks of at most SUM_BLOCK elements, as blocked_sum: whole inner rows of a
        # leading index when they are that long, else groups of leading indices.
        total = self.entry_builder.alloca(F64, name="total")
        comp = self.entry_builder.alloca(F64, name="comp")
        b.store(ir.Constant(F64, 0.0), total)
        b.store(ir.Constant(F64, 0.0), comp)
        begin = lambda: b.store(identity, slot)  # noqa: E731
        end = lambda: self.add_to_total(b.load(slot), total, comp)  # noqa: E731
        inner = math.prod(shape[plan.lead:])
        if inner > SUM_BLOCK:
            def rows(g):
                lead_coords = self.lead_coords(plan, g)
                self.blocks(list(shape[plan.lead:]), SUM_BLOCK,
                            lambda red: body(lead_coords + list(red)), begin, end)
            with self.loop(lo, hi, "f") as f:
                rows(f)
        else:
            group = ir.Constant(I64, SUM_BLOCK // inner)
            count = b.udiv(b.add(b.sub(hi, lo), ir.Constant(I64, SUM_BLOCK // inner - 1)), group)
            with self.loop(0, count, "blk") as blk:
                first = b.add(lo, b.mul(blk, group))
                last = b.add(first, group)
                last = b.select(b.icmp_signed("<", last, hi), last, hi)
                begin()
                self.lead_loop(plan, first, last, body)
                end()
        b.store(b.load(total), b.bitcast(out, F64.as_pointer()))
        b.store(b.load(comp), b.bitcast(b.gep(out, [ir.Constant(I64, 1)]), F64.as_pointer()))

    def lead_coords(self, plan: SplitPlan, f: ir.Value) -> list:
        """Coordinates of leading index ``f`` over the plan's leading axes."""
        b, out, rest = self.b, [], f
        for d in reversed(self.k.shape[:plan.lead]):
            out.insert(0, b.urem(rest, ir.Constant(I64, d)) if plan.lead > 1 else rest)
            rest = b.udiv(rest, ir.Constant(I64, d))
        return out

    # ------------------------------------------------------------------ column reductions

    def emit_columns(self, plan: ColumnPlan, reductions: list[Node]) -> None:
        """A reduction kernel in the order of ``plan`` (see :class:`ColumnPlan`): per
        parallel unit, each reduction fills a tile of accumulators (the reduced axes
        outside, the tile inside), then the row-level outputs are stored from the tile and
        the full-size outputs computed over the reduced axes again. Each accumulator adds
        its elements in index order, whatever the tile and the thread count."""
        k, b = self.k, self.b
        shape = k.shape
        last = len(shape) - 1
        red_shape = [shape[a] for a in k.axes]
        tile_size = plan.chunk or math.prod(shape[a] for a in plan.tile)
        n_chunks = -(-shape[last] // plan.chunk) if plan.chunk else 1
        finished: dict[Value, ir.Value] = {}          # reduction result -> its tile

        def per_unit(unit):
            kept: dict[int, ir.Value] = {}
            rest, lo = unit, None
            if plan.chunk:
                chunk = b.urem(rest, ir.Constant(I64, n_chunks))
                rest = b.udiv(rest, ir.Constant(I64, n_chunks))
                lo = b.mul(chunk, ir.Constant(I64, plan.chunk), flags=("nsw",))
            for a in reversed(plan.outer):
                kept[a] = b.urem(rest, ir.Constant(I64, shape[a]))
                rest = b.udiv(rest, ir.Constant(I64, shape[a]))

            def tile(body):
                """``body(kept coords, index in the tile)`` over the unit's tile."""
                def inner(coords, index):
                    for v, buf in finished.items():
                        self.acc[v] = b.load(b.gep(buf, [index]))
                    body({**kept, **coords}, index)
                    for v in finished:
                        del self.acc[v]
                if plan.chunk:
                    hi = b.add(lo, ir.Constant(I64, plan.chunk), flags=("nsw",))
                    if shape[last] % plan.chunk:
                        hi = b.select(b.icmp_signed("<", hi, ir.Constant(I64, shape[last])),
                                      hi, ir.Constant(I64, shape[last]))
                    with self.loop(lo, hi, "j") as j:
                        inner({last: j}, b.sub(j, lo, flags=("nsw",)))
                    return
                self.tile_nest(plan.tile, {}, ir.Constant(I64, 0), inner)

            def coords_at(kept_coords, red):
                q = iter(red)
                return [next(q) if a in k.axes else kept_coords[a] for a in range(len(shape))]

            for node in reductions:
                finished[node.output] = self.column_reduce(node, tile, coords_at, red_shape,
                                                           tile_size)
            self.column_stores(tile, coords_at, red_shape)
            finished.clear()

        self.nest([plan.units], lambda u: per_unit(u[0]), parallel=True)

    def tile_nest(self, axes, coords: dict, index: ir.Value, body) -> None:
        """Loops over the tile ``axes`` (trailing axes of the kernel), with the linear index
        into the tile: ``body(coords, index)``. A loop of 8 to 64 iterations stays rolled:
        unrolled, LLVM would vectorize the reduced loop around it with interleaved accesses
        (see :meth:`nest`)."""
        if not axes:
            body(coords, index)
            return
        n = self.k.shape[axes[0]]
        with self.loop(0, n, f"j{len(coords)}", unroll=n < 8) as j:
            inner = self.b.add(self.b.mul(index, ir.Constant(I64, n), flags=("nsw",)), j,
                               flags=("nsw",))
            self.tile_nest(axes[1:], {**coords, axes[0]: j}, inner, body)

    def column_reduce(self, node: Node, tile, coords_at, red_shape, tile_size: int):
        """Reduce ``node`` into a tile of accumulators; returns the tile (an alloca)."""
        b = self.b
        out_dt = node.output.type.dtype
        acc_t = lltype(out_dt)
        src, src_dt, op = node.inputs[0], node.inputs[0].type.dtype, node.op
        identity = self.identity(node)
        size = ir.Constant(I64, tile_size)
        acc = self.entry_builder.alloca(acc_t, size=size, name="cols")

        def reset(_coords, index):
            b.store(identity, b.gep(acc, [index]))

        def body(red):
            def step(kept, index):
                x = self.emit(src, coords_at(kept, red))
                x = self.convert(x, src_dt, out_dt) if src_dt is not out_dt else x
                slot = b.gep(acc, [index])
                b.store(self.combine(op, b.load(slot), x, out_dt), slot)
            tile(step)

        if not (op == "sum" and out_dt.is_floating_point and
                math.prod(red_shape) > COLUMN_BLOCK):
            tile(reset)
            self.nest(red_shape, body, parallel=False)
            return acc
        # Blocks of COLUMN_BLOCK rows per accumulator, block sums added in float64.
        total = self.entry_builder.alloca(F64, size=size, name="total")
        comp = self.entry_builder.alloca(F64, size=size, name="comp") if acc_t == F64 \
            else None

        def start(_coords, index):
            b.store(ir.Constant(F64, 0.0), b.gep(total, [index]))
            if comp is not None:
                b.store(ir.Constant(F64, 0.0), b.gep(comp, [index]))

        def add(_coords, index):
            self.add_to_total(b.load(b.gep(acc, [index])), b.gep(total, [index]),
                              comp and b.gep(comp, [index]))

        def finish(_coords, index):
            value = self.total_value(b.gep(total, [index]), comp and b.gep(comp, [index]),
                                     acc_t)
            b.store(value, b.gep(acc, [index]))
        tile(start)
        self.blocks(red_shape, COLUMN_BLOCK, body, lambda: tile(reset), lambda: tile(add))
        tile(finish)
        return acc

    def column_stores(self, tile, coords_at, red_shape) -> None:
        """Stores of a column kernel's outputs: row-level ones from the tile, full-size ones
        over the reduced axes again."""
        k, zero = self.k, ir.Constant(I64, 0)
        row_outs, full_outs = self.outputs_at("row"), self.outputs_at("full")

        def rows(kept, _index):
            for v in row_outs:
                coords = coords_at(kept, [zero] * len(k.axes))
                if len(v.type.shape) != len(k.shape):        # not the keepdim shape
                    coords = [c for a, c in enumerate(coords) if a not in k.axes]
                self.store(v, coords, self.emit(v, coords))
        if row_outs:
            tile(rows)
        if full_outs:
            def full(red):
                tile(lambda kept, _index: [self.store(v, coords_at(kept, red),
                                                      self.emit(v, coords_at(kept, red)))
                                           for v in full_outs])
            self.nest(red_shape, full, parallel=False)

    def row_scratch(self, node: Node | None, full_outs: list, red_shape) -> tuple | None:
        """(value, alloca) when ``node``'s input is computed in this kernel, read again by
        the full-size outputs, and a row of it fits in 64 KiB of stack."""
        n = 1
        for d in red_shape:
            n *= d
        if node is None or not full_outs or n * 8 > 65536:
            return None
        src = node.inputs[0]
        if not isinstance(src, Value) or src.producer not in self.internal or \
                src.type.shape != self.k.shape:
            return None
        seen, stack, used = set(), list(full_outs), False
        while stack and not used:
            v = stack.pop()
            if v is src:
                used = True
            elif v.producer in self.internal and self.k.level.get(v) != "row" and v not in seen:
                seen.add(v)
                stack.extend(op for op in v.producer.inputs if isinstance(op, Value))
        if not used:
            return None
        buf = self.entry_builder.alloca(lltype(src.type.dtype), size=ir.Constant(I64, n),
                                        name="row")
        return src, buf

    def red_index(self, red, red_shape) -> ir.Value:
        """Linear index of the reduced coordinates ``red`` within a row."""
        b = self.b
        index = ir.Constant(I64, 0)
        for c, d in zip(red, red_shape):
            index = b.add(b.mul(index, ir.Constant(I64, d)), c)
        return index

    def combine(self, op: str, acc, x, dt) -> ir.Value:
        if op in ("max", "min") and dt.is_floating_point:
            # A masked max (softmax's ``masked_fill(~m, -inf)``) reduces select(c, x, -inf);
            # InstCombine folds maximum(acc, select(c, x, -inf)) into select(c, maximum(acc,
            # x), acc), a conditional min/max reduction the loop vectorizer does not handle
            # (the row stayed scalar: 6x slower). Freezing the operand (a no-op on values
            # that are not poison, and no instruction in the machine code) hides the select.
            x = self.freeze(x)
        return lowering.combine(self.sb, op, acc, x, dt)

    def freeze(self, x: ir.Value) -> ir.Value:
        """LLVM's ``freeze`` of ``x`` (llvmlite's builder has no method for it)."""
        instr = ir.instructions.Instruction(self.b.block, x.type, "freeze", [x])
        self.b._insert(instr)
        return instr

    def emit_epilogue(self) -> None:
        """matmul kernels: the product is already in memory (BLAS); apply the epilogue."""
        shape = self.k.shape
        outs = [v for v in self.outputs_at("full") if v.producer.op != "matmul"]
        self.nest(shape, lambda coords: [self.store(v, coords, self.emit(v, coords))
                                         for v in outs], parallel=True, vectorize_inner=True)

    def finish(self) -> ir.Function:
        self.b.ret_void()
        self.entry_builder.branch(self.body_block)
        return self.fn


_mangle = mathlib.mangle


def emit_kernel(module: ir.Module, kernel: Kernel, kg: KernelGraph,
                slots: dict[Value, int], scratch: int | None = None) -> ir.Function:
    """Emit ``kernel`` as functions of ``module`` (those of :func:`kernel_phases`); raises
    :class:`Unsupported` if some primitive or dtype in it has no lowering. A split full
    reduction (:func:`split_plan`) keeps its partial results in the buffer of slot
    ``scratch`` (:meth:`SplitPlan.cells` 8-byte cells). Returns the last function."""
    plan = split_plan(kernel)
    if plan is not None:
        if scratch is None:
            raise ValueError(f"{kernel.describe()} is split: it needs a scratch slot")
        fn = None
        for i in range(plan.reductions):
            for phase in ("p", "c"):
                em = KernelEmitter(module, kernel, kg, slots, f"{kernel.name}_{phase}{i}",
                                   scratch)
                em.emit_split_phase(plan, phase, i)
                fn = em.finish()
        if any(kernel.level.get(v) == "full" for v in kernel.outputs):
            em = KernelEmitter(module, kernel, kg, slots, scratch=scratch)
            em.emit_split_phase(plan, "full", 0)
            fn = em.finish()
        return fn
    em = KernelEmitter(module, kernel, kg, slots)
    if kernel.kind == "elementwise":
        em.emit_elementwise()
    elif kernel.kind == "reduction":
        em.emit_reduction()
    elif kernel.kind == "matmul":
        em.emit_epilogue()
    else:
        raise Unsupported(f"{kernel.kind} kernels run in numpy")
    return em.finish()
