"""The CPU-shaped lowering: a fused kernel as loop nests that a thread pool splits.

:func:`lower_kernel` turns a :class:`fusegrad.ir.kernel_graph.Kernel` into one or more
:class:`fusegrad.codegen.kernel_ir.LoweredKernel` functions (:func:`kernel_phases`), which
the LLVM printer (:mod:`fusegrad.codegen.llvm.kernel`) compiles. Values come from
:class:`fusegrad.codegen.values.KernelValues`, as in the GPU lowering; this module decides
only the loops. Each function runs the part ``[start, end)`` (the ``special`` expressions
``start`` and ``end``) of its outermost loop, so the runtime can split it across threads.

Loop structure: an elementwise kernel is a loop nest over its shape. A reduction kernel
loops over its kept ("row") axes and, per row, runs one loop over the reduced axes per
reduction (each into an accumulator variable: LLVM's mem2reg makes it a phi, so the loop
vectorizer sees a reduction; sums are ``reassociable``) and a last loop storing full-size
outputs. A reduction that keeps the innermost axis runs interchanged instead
(:class:`ColumnPlan`: the reduced axes outside, a tile of accumulators inside), and a large
full reduction is split into parts reduced in parallel and combined in order
(:class:`SplitPlan`, several functions per kernel). Float sums add blocks in float32 and
block sums in float64 (:data:`SUM_BLOCK`). The innermost loop of an elementwise nest is kept
rolled when it runs 8 to 64 times (see :meth:`_CPULowering.nest`).
"""

from __future__ import annotations

import collections
import contextlib
import math

from fusegrad import dtypes
from fusegrad.codegen import cpu_plans, indexing
from fusegrad.codegen.cpu_plans import (
    COLUMN_TILE,
    SPLIT_PARTS,
    SPLIT_WORK,
    ColumnPlan,
    LoopPlan,
    SplitPlan,
    column_plan,
    kernel_phases,
    loop_plan,
    parallel_extent,
    split_plan,
)
from fusegrad.codegen.kernel_ir import (
    INDEX,
    Assign,
    Declare,
    Local,
    Loop,
    LoweredKernel,
    Param,
    Store,
    StoreLocal,
    Var,
)
from fusegrad.codegen.values import KernelValues
from fusegrad.codegen.values import reductions as kernel_reductions
from fusegrad.ir.graph import Node, Value
from fusegrad.ir.kernel_graph import Kernel, KernelGraph
from fusegrad.ops import lowering
from fusegrad.ops.lowering import Unsupported
from fusegrad.symint import SymbolicDecisionError, SymInt, ceil_div, is_symbolic, known_equal

# The loop plans (fusegrad.codegen.cpu_plans) are importable from here too: the lowering is
# what their users ask for.
__all__ = ["lower_kernel", "ColumnPlan", "column_plan", "SplitPlan", "split_plan",
           "kernel_phases", "parallel_extent", "loop_plan", "LoopPlan", "SCRATCH", "SUM_BLOCK",
           "COLUMN_TILE", "COLUMN_BLOCK", "SPLIT_WORK", "SPLIT_PARTS", "tuning"]

F64 = dtypes.float64

# ``Param.value`` of a split reduction's scratch cells (the runtime gives them a buffer).
SCRATCH = "scratch"

# Elements per block of a blocked float sum (_CPULowering.blocked_sums): a block is summed in
# vector registers, block sums in float64. Sums of this many elements or fewer (softmax and
# layer_norm rows) are one block, with no outer accumulator.
SUM_BLOCK = 2048

# Column reductions (see fusegrad.codegen.cpu_plans.ColumnPlan): a float sum adds this many
# rows per float32 block before the block joins a float64 total (each accumulator adds its
# rows in sequence, so its block must be short to stay accurate).
COLUMN_BLOCK = 64

# The innermost loop of an elementwise nest stays rolled from this many iterations (see
# _CPULowering.nest); shorter ones unroll completely.
ROLL_FROM = 8

# At most this many copies of an elementwise body from cutting its loops where pads and
# concatenations switch operands (see _CPULowering.segments).
MAX_BODY_COPIES = 64

def tuning() -> str:
    """The CPU lowering's tunable constants (its loop plans' too) as text: code made under
    other values loops differently (other launch extents too), so the kernel cache keys on
    them."""
    return (f"SUM_BLOCK={SUM_BLOCK} COLUMN_BLOCK={COLUMN_BLOCK} ROLL_FROM={ROLL_FROM} "
            f"MAX_BODY_COPIES={MAX_BODY_COPIES} {cpu_plans.tuning()}")


def _longer(n, limit: int) -> bool:
    """Whether ``n`` elements are more than ``limit``; a symbolic count may be: code for
    every size takes the path that holds for long ones (blocks, of which a short count
    makes one)."""
    return isinstance(n, SymInt) or n > limit


class _Slot:
    """A register-sized place that statements read and write: a variable, or an element
    of a local array."""

    def __init__(self, low: "_CPULowering", var: Var | None = None,
                 local: Local | None = None, index=None):
        self.low, self.var_, self.local, self.index = low, var, local, index

    def read(self):
        b = self.low.b
        return b.read(self.var_) if self.var_ is not None else b.load_local(self.local,
                                                                           self.index)

    def assign(self, value) -> None:
        self.low.stmt(Assign(self.var_, value) if self.var_ is not None else
                      StoreLocal(self.local, self.index, value))


def reduction_rounds(kernel: Kernel, reductions: list[Node]) -> list[list[Node]]:
    """``reductions`` in rounds, in order: a reduction joins the round after the last one
    of the reductions it reads (through the kernel's other nodes), so that each round's
    reductions can run in one loop."""
    internal = set(kernel.nodes)
    reads: dict[Node, set] = {}
    for n in kernel.nodes:
        got: set = set()
        for v in n.inputs:
            p = v.producer if isinstance(v, Value) else None
            if p in internal:
                got |= reads[p] | ({p} if p in reductions else set())
        reads[n] = got
    round_of: dict[Node, int] = {}
    for r in reductions:
        round_of[r] = 1 + max((round_of[q] for q in reads[r] if q in round_of), default=-1)
    rounds: list[list[Node]] = [[] for _ in range(max(round_of.values(), default=-1) + 1)]
    for r in reductions:
        rounds[round_of[r]].append(r)
    return rounds


class _CPULowering(KernelValues):
    def __init__(self, kernel: Kernel, kg: KernelGraph):
        super().__init__(kernel, kg)
        self.memo = collections.ChainMap()
        # Coordinates split from a loop group's index: id -> (index, position, sizes, expr).
        self.linear: dict[int, tuple] = {}
        self.body: list = []
        self.locals: list[Local] = []
        self.cells: dict[dtypes.DType, Param] = {}
        self.scratch: tuple | None = None      # (value, Local): see row_scratch

    # -- statements
    def stmt(self, st) -> None:
        self.body.append(st)

    @contextlib.contextmanager
    def loop(self, start, stop, name: str, unroll: bool = True):
        """``for i in [start, stop)`` around the statements made inside; yields ``i``."""
        v = self.var(name, INDEX)
        lp = Loop(v, self._index(start), self._index(stop), self.idx(1), [], unroll)
        self.body.append(lp)
        outer, self.body = self.body, lp.body
        # Values are memoized per loop body: one computed inside may read an accumulator
        # the next loop reads at another index (a column tile's), even at the same
        # coordinates (a value broadcast from a reduction's result, at constant ones).
        self.memo = self.memo.new_child()
        try:
            yield self.b.read(v)
        finally:
            self.body = outer
            self.memo = self.memo.parents

    def _index(self, x):
        return self.idx(x) if isinstance(x, (int, SymInt)) else x

    def local(self, name: str, dt, size: int) -> Local:
        if isinstance(size, SymInt):
            raise SymbolicDecisionError(f"a local array of {size} elements: stack arrays "
                                        "have constant sizes")
        arr = Local(f"{name}{len(self.locals)}", dt, size)
        self.locals.append(arr)
        return arr

    def declare(self, name: str, dt, init) -> _Slot:
        v = self.var(name, dt)
        self.stmt(Declare(v, init))
        return _Slot(self, v)

    def store(self, v: Value, coords) -> None:
        index, value = self.stored(v, coords)
        self.stmt(Store(self.param(v), index, value))

    def store_all(self, values, coords) -> None:
        self.store_each([(v, coords) for v in values])

    def store_each(self, items) -> None:
        """Store each (value, coords) of ``items``: one run of consecutive stores, whose
        values the printer computes before the first store (see ``KernelPrinter.block``)."""
        for v, coords in items:
            self.store(v, coords)

    def start_end(self):
        return self.b.special("start"), self.b.special("end")

    def combine(self, op: str, acc, x, dt):
        if op in ("max", "min") and dt.is_floating_point:
            # A masked max (softmax's ``masked_fill(~m, -inf)``) reduces select(c, x, -inf);
            # InstCombine folds maximum(acc, select(c, x, -inf)) into select(c, maximum(acc,
            # x), acc), a conditional min/max reduction the loop vectorizer does not handle
            # (the row stayed scalar: 6x slower). Freezing the operand (a no-op on values
            # that are not poison, and no instruction in the machine code) hides the select.
            x = self.b.unary("freeze", x, lowering.register_dtype(dt))
        return lowering.combine(self.b, op, acc, x, dt)

    def step(self, node: Node, acc: _Slot, coords) -> None:
        """One step of reduction ``node``: ``acc`` combined with its operand at ``coords``."""
        src, out_dt = node.inputs[0], node.output.type.dtype
        x = self.emit(src, coords)
        if src.type.dtype is not out_dt:
            x = lowering.convert(self.b, x, src.type.dtype, out_dt)
        acc.assign(self.combine(node.op, acc.read(), x, out_dt))

    # -- loop nests
    def nest(self, shape, body, parallel: bool, coords=(), vectorize_inner: bool = False,
             segments=None) -> None:
        """Loops over ``shape``; the first loop runs [start, end) when ``parallel``.

        ``vectorize_inner``: an innermost loop of 8 to 64 iterations is kept rolled, so that
        LLVM vectorizes it. Fully unrolled, it would make LLVM vectorize the loop around it
        with interleaved accesses as wide as the unrolled body, which LLVM 22's SLP vectorizer
        and loop-load elimination take seconds over (a 3x33 float32 sign: 2.4 s; a 3x17
        bfloat16 copy: 5 s). Shorter loops still unroll: across rows is the better
        vectorization there (softmax over 3 classes). ``segments``: by loop depth, the ranges
        that loop is cut into, one loop (and one copy of the body) each."""
        depth = len(coords)
        if depth == len(shape):
            body(list(coords))
            return
        innermost = depth == len(shape) - 1
        if parallel and depth == 0:
            ranges = [self.start_end()]
        elif segments and depth in segments:
            ranges = segments[depth]
        else:
            ranges = [(0, shape[depth])]
        for lo, hi in ranges:
            trips = hi - lo if isinstance(hi, int) else None
            if len(ranges) > 1 and trips == 1 and not innermost:
                # (a cut of one index: a constant, which picks a concat's operand outright)
                self.nest(shape, body, parallel, coords + (self.idx(lo),), vectorize_inner,
                          segments)
                continue
            unroll = not (vectorize_inner and innermost and trips is not None and (
                ROLL_FROM <= trips <= 64 or (trips < ROLL_FROM and self._wide_byte_body(shape))))
            with self.loop(lo, hi, f"i{depth}", unroll=unroll) as i:
                self.nest(shape, body, parallel, coords + (i,), vectorize_inner, segments)

    def segments(self) -> dict[int, list[tuple[int, int]]]:
        """Where the pads and concatenations along the kernel's innermost axis, and the
        concatenations along its other axes but the parallel one, switch operands: by axis,
        the ranges that axis is cut into (none for an axis without such switches). In a loop
        over one range every select of a pad or concat is decided by the loop's bounds,
        which LLVM sees: along the innermost axis the loads become unit-stride and the loop
        vectorizes (over the whole axis, each clamped load was a gather); along an outer
        axis each copy of the body loads only the operand its range takes (im2col's stack of
        9 strided slices loaded all 9 per element and selected one)."""
        shape = self.k.shape
        if len(shape) < 2:
            return {}
        cuts: dict[int, set] = {}
        last = len(shape) - 1
        for n in self.k.nodes:
            out = n.output.type.shape
            if n.op not in ("pad", "concat") or not out or out[-1] != shape[-1]:
                continue
            if n.op == "concat":
                axis = n.attrs["axis"] % len(out)
                # (an outer axis is the kernel's when the concat has the kernel's shape)
                if axis != len(out) - 1 and (len(out) != len(shape) or not all(
                        known_equal(a, b) for a, b in zip(out, shape))):
                    continue
                start = 0
                for x in n.inputs:
                    start += x.type.shape[axis]
                    cuts.setdefault(last if axis == len(out) - 1 else axis, set()).add(start)
            else:
                lo, _ = n.attrs["widths"][-1]
                cuts.setdefault(last, set()).update((lo, lo + n.inputs[0].type.shape[-1]))
        out, copies = {}, 1
        for axis in sorted(cuts, reverse=True):         # the innermost first: it vectorizes
            if axis == 0 or is_symbolic(shape[axis]):
                continue
            points = sorted({0, shape[axis]} | {c for c in cuts[axis] if 0 < c < shape[axis]})
            if len(points) <= 2 or len(points) > 17 or copies * (len(points) - 1) > MAX_BODY_COPIES:
                continue
            copies *= len(points) - 1
            out[axis] = list(zip(points[:-1], points[1:]))
        return out

    def _wide_byte_body(self, shape) -> bool:
        """Whether fully unrolling the short trailing loops of ``shape`` would give a body of
        16 or more elements in a kernel that moves bytes (bool, int8). LLVM then vectorizes
        the loop around that body 64 lanes wide with interleaved accesses as wide as the
        body: a bool ``a & b`` over (3000, 5, 6) and (3000, 1, 6) took 7 to 14 s to compile
        (0.1 s with the innermost loop kept rolled; float32 loads vectorize at 16 lanes and
        compile in 0.2 s either way)."""
        body = 1
        for d in reversed(shape[1:]):
            if isinstance(d, SymInt) or d >= 8:     # (a symbolic loop stays rolled)
                break
            body *= d
        return body >= 16 and any(v.type.dtype.itemsize == 1
                                  for v in [*self.k.inputs, *self.k.outputs])

    # -- kernels
    def elementwise(self) -> None:
        outs = self.outputs_at("full")
        shape = self.k.shape
        plan = loop_plan(self.k, self.kg)

        def body(loops):
            # Each group's axes from its loop index; address() turns them back into the
            # loop index times the innermost stride where a buffer steps over the group.
            coords: list = []
            for m, group in zip(loops, plan.groups):
                if len(group) == 1:
                    coords.append(m)
                    continue
                sizes = [shape[a] for a in group]
                parts = indexing.unravel(self.b, m, sizes, bounded=True)
                for k, part in enumerate(parts):
                    if part.op != "const":
                        self.linear[id(part)] = (m, k, sizes, part)
                coords += parts
            self.store_all(outs, coords)
        if plan.tiled:
            self.tiles(plan.extents, body)
        else:
            # Pads and concats only stand in kernels whose axes loop one by one.
            segments = self.segments() if len(plan.groups) == len(shape) else None
            self.nest(plan.extents, body, parallel=True, vectorize_inner=True,
                      segments=segments)

    def tiles(self, extents, body) -> None:
        """The loops over ``extents`` with the last two in tiles of TILE x TILE (tile rows
        outside, tile columns, then the tile's rows and columns): ``body(indices)``. The
        first loop runs [start, end): the tile rows when there are two loops."""
        b = self.b
        lead, (rows, cols) = extents[:-2], extents[-2:]

        def in_tile(t, size):
            lo = b.mul(t, self.idx(cpu_plans.TILE))
            hi = b.add(lo, self.idx(cpu_plans.TILE))
            if size % cpu_plans.TILE:
                hi = b.select(b.cmp("lt", hi, self.idx(size), INDEX), hi, self.idx(size), INDEX)
            return lo, hi

        def tile_loops(outer):
            start, end = self.start_end() if not lead else (0, -(-rows // cpu_plans.TILE))
            with self.loop(start, end, "ti") as ti:
                with self.loop(0, -(-cols // cpu_plans.TILE), "tj") as tj:
                    with self.loop(*in_tile(ti, rows), "i") as i:
                        with self.loop(*in_tile(tj, cols), "j") as j:
                            body(list(outer) + [i, j])
        if lead:
            self.nest(lead, tile_loops, parallel=True)
        else:
            tile_loops([])

    def address(self, view, coords):
        """As :meth:`KernelValues.address`, with the axes of a loop group (see
        :func:`loop_plan`) that a buffer steps over as one block addressed by the group's
        loop index (the division and remainder that split it are then dead)."""
        if not self.linear:
            return super().address(view, coords)
        b = self.b
        terms, groups = [], {}
        for c, st, d in zip(coords, view.strides, view.shape):
            if st == 0 or d == 1:
                continue
            hit = self.linear.get(id(c))
            if hit is None:
                terms.append((c, st))
            else:
                groups.setdefault(id(hit[0]), []).append((hit, st))
        for parts in groups.values():
            m, _, sizes, _ = parts[0][0]
            ks = [hit[1] for hit, _ in parts]
            full = [k for k in range(len(sizes)) if sizes[k] != 1]
            block = ks == full and all(
                parts[j][1] == parts[j + 1][1] * math.prod(sizes[ks[j] + 1:ks[j + 1] + 1])
                for j in range(len(parts) - 1))
            if block:
                terms.append((m, parts[-1][1]))
            else:
                terms += [(hit[3], st) for hit, st in parts]
        offset = self.idx(view.offset)
        for c, st in terms:
            offset = b.add(offset, c if st == 1 else b.mul(c, self.idx(st)))
        return offset

    epilogue = elementwise     # matmul kernels: BLAS wrote the product; apply the rest

    def reduction(self) -> None:
        k, b = self.k, self.b
        kept = [i for i in range(len(k.shape)) if i not in k.axes]
        reductions = kernel_reductions(k)
        row_outs = self.outputs_at("row")
        full_outs = self.outputs_at("full")
        zero = self.idx(0)
        red_shape = [k.shape[a] for a in k.axes]

        def full_coords(row, red):
            coords, r, q = [], iter(row), iter(red)
            for i in range(len(k.shape)):
                coords.append(next(q) if i in k.axes else next(r))
            return coords

        plan = column_plan(k)
        if plan is not None and reductions:
            self.columns(plan, reductions)
            return
        # Keep the last reduction's input per row in a scratch row when the stores read it
        # too (softmax's exp(x - max)): the final loop then loads it instead of recomputing.
        self.scratch = self.row_scratch(reductions[-1] if reductions else None, full_outs,
                                        red_shape)

        rounds = reduction_rounds(k, reductions)

        def per_row(row):
            for nodes in rounds:
                self.reduce_loops(nodes, row, full_coords)
            items = []
            for v in row_outs:
                coords = full_coords(row, [zero] * len(k.axes))
                if len(v.type.shape) != len(k.shape):       # not the keepdim shape
                    coords = list(row)
                items.append((v, coords))
            self.store_each(items)
            if full_outs:
                def store_full(red):
                    coords = full_coords(row, red)
                    if self.scratch is not None:
                        value, buf = self.scratch
                        cached = b.load_local(buf, self.red_index(red, red_shape))
                        self.memo[(value, tuple(id(c) for c in coords))] = (cached, coords)
                    self.store_all(full_outs, coords)
                self.nest(red_shape, store_full, parallel=False)

        self.nest([k.shape[i] for i in kept], per_row, parallel=bool(kept))

    def reduce_loops(self, nodes: list[Node], row, full_coords) -> None:
        """Reductions ``nodes`` (none reading another) of one row in one loop over the
        reduced axes, each into its own accumulator: a batch norm's backward sums its
        gradient and the gradient times the normalized input in one pass over them (a
        loop per sum read both again for each). Each sum keeps its blocks (the vectorizer
        may split a block into other partial sums beside the others: the last bits can
        differ from a loop of its own). Float sums of rows longer than SUM_BLOCK, summed
        in blocks, share a loop only with each other."""
        red_shape = [self.k.shape[a] for a in self.k.axes]
        # (A row of symbolic length is summed in blocks: one block while it fits one.)
        long = _longer(math.prod(red_shape), SUM_BLOCK)
        blocked = [n for n in nodes if n.op == "sum" and n.output.type.dtype.is_floating_point
                   and long]
        plain = [n for n in nodes if n not in blocked]
        for group in ([blocked] if blocked else []) + ([plain] if plain else []):
            self.reduce_loop(group, row, full_coords, blocked=group is blocked)

    def reduce_loop(self, nodes: list[Node], row, full_coords, blocked: bool) -> None:
        b = self.b
        identities = [lowering.reduction_identity(b, n.op, n.output.type.dtype) for n in nodes]
        accs = [self.declare("acc", lowering.register_dtype(n.output.type.dtype), identity)
                for n, identity in zip(nodes, identities)]
        red_shape = [self.k.shape[a] for a in self.k.axes]

        def body(red):
            coords = full_coords(row, red)
            for node, acc in zip(nodes, accs):
                if self.scratch is not None and self.scratch[0] is node.inputs[0]:
                    self.stmt(StoreLocal(self.scratch[1], self.red_index(red, red_shape),
                                         self.emit(node.inputs[0], coords)))
                self.step(node, acc, coords)
        if blocked:
            totals = self.blocked_sums(red_shape, body, accs, identities)
        else:
            self.nest(red_shape, body, parallel=False)
            totals = [acc.read() for acc in accs]
        for node, total in zip(nodes, totals):
            self.acc[node.output] = total

    def blocks(self, red_shape, size: int, body, begin, end) -> None:
        """Loops over ``red_shape`` in blocks of at most ``size`` elements: ``begin()``,
        ``body(red)`` for each element of the block, ``end()``. A block is the innermost
        dims whose product fits ``size``, or a chunk of the innermost dim when that alone
        is longer."""
        b = self.b
        inner, split = 1, len(red_shape)
        while split > 0 and not _longer(inner * red_shape[split - 1], size):
            split -= 1
            inner *= red_shape[split]
        # The last dim alone exceeds the block (or may: a symbolic one).
        chunked = split == len(red_shape)
        outer_shape = list(red_shape[:-1] if chunked else red_shape[:split])
        if chunked:
            outer_shape.append(ceil_div(red_shape[-1], size))

        def block(outer):
            begin()
            if chunked:
                n = self.idx(red_shape[-1])
                lo = b.mul(outer[-1], self.idx(size))
                hi = b.add(lo, self.idx(size))
                hi = b.select(b.cmp("lt", hi, n, INDEX), hi, n, INDEX)
                with self.loop(lo, hi, f"r{len(outer)}") as i:
                    body(list(outer[:-1]) + [i])
            else:
                self.nest(red_shape, body, parallel=False, coords=tuple(outer))
            end()
        self.nest(outer_shape, block, parallel=False)

    def add_to_total(self, part, part_dt, total: _Slot, comp: _Slot | None) -> None:
        """``total += part`` in float64: a float32 part is widened, a float64 one is added
        with Neumaier's compensation (the low-order bits lost go to ``comp``)."""
        b = self.b
        compensated = part_dt is F64
        if not compensated:
            part = b.cast(part, part_dt, F64)
        s = total.read()
        t = b.binary("add", s, part, F64)
        if compensated:
            # Neumaier: the low-order bits lost by s + part, from whichever is larger.
            big = b.cmp("ge", b.unary("fabs", s, F64), b.unary("fabs", part, F64), F64)
            lost = b.select(big, b.binary("add", b.binary("sub", s, t, F64), part, F64),
                            b.binary("add", b.binary("sub", part, t, F64), s, F64), F64)
            comp.assign(b.binary("add", comp.read(), lost, F64))
        total.assign(t)

    def total_value(self, total: _Slot, comp: _Slot | None, acc_dt):
        """The sum kept by :meth:`add_to_total`, in the accumulator's dtype."""
        b = self.b
        s = total.read()
        if acc_dt is not F64:
            return b.cast(s, F64, acc_dt)
        # An infinite or NaN total leaves a NaN compensation (inf - inf): keep the total.
        finite = b.cmp("lt", b.unary("fabs", s, F64), b.const(F64, math.inf), F64)
        # A zero compensation leaves the total as it is (-0.0 + 0.0 would lose the sign).
        c = comp.read()
        bool_ = dtypes.bool_
        exact = b.binary("or", b.cmp("eq", c, b.const(F64, 0.0), F64), b.cmp("ne", c, c, F64),
                         bool_)
        keep = b.binary("or", exact, b.binary("xor", finite, b.const(bool_, 1), bool_), bool_)
        return b.select(keep, s, b.binary("add", s, c, F64), F64)

    def blocked_sums(self, red_shape, body, accs: list[_Slot], identities) -> list:
        """Float sums over ``red_shape`` in blocks of at most SUM_BLOCK elements: ``body``
        accumulates a block into each of ``accs`` (a loop the vectorizer turns into a few
        dozen partial sums), and block sums are added in float64 (float32 and 16-bit sums)
        or with Neumaier's compensation (float64 sums). The error is then that of a block
        plus one rounding, not that of n / lanes sequential additions (0.3% on 2**27
        elements); numpy sums pairwise and torch in cascades for the same reason."""
        sums = [(acc, identity, self.declare("total", F64, self.b.const(F64, 0.0)),
                 self.declare("comp", F64, self.b.const(F64, 0.0)))
                for acc, identity in zip(accs, identities)]

        def begin():
            for acc, identity, _, _ in sums:
                acc.assign(identity)

        def end():
            for acc, _, total, comp in sums:
                self.add_to_total(acc.read(), acc.var_.dtype, total, comp)
        self.blocks(red_shape, SUM_BLOCK, body, begin, end)
        return [self.total_value(total, comp, acc.var_.dtype) for acc, _, total, comp in sums]

    def row_scratch(self, node: Node | None, full_outs: list, red_shape) -> tuple | None:
        """(value, local row) when ``node``'s input is computed in this kernel, read again
        by the full-size outputs, and a row of it fits in 64 KiB of stack."""
        n = math.prod(red_shape)
        if isinstance(n, SymInt):
            return None             # a row of symbolic length: computed again instead
        src = self.reused_operand(node, full_outs) if n * 8 <= 65536 else None
        if src is None:
            return None
        return src, self.local("row", lowering.register_dtype(src.type.dtype), n)

    def red_index(self, red, red_shape):
        """Linear index of the reduced coordinates ``red`` within a row."""
        b = self.b
        index = self.idx(0)
        for c, d in zip(red, red_shape):
            index = b.add(b.mul(index, self.idx(d)), c)
        return index

    # -- split full reductions
    def cell(self, index, dt):
        """(param, element index) of 8-byte scratch cell ``index`` (an INDEX expression)
        holding a register of ``dt`` (a bool as a byte)."""
        mem = dtypes.uint8 if dt is dtypes.bool_ else dt
        p = self.cells.get(mem)
        if p is None:
            p = self.cells[mem] = Param(f"cells_{mem.short}", mem, SCRATCH, writes=True)
        return p, self.b.mul(index, self.idx(8 // mem.itemsize))

    def load_cell(self, index, dt):
        p, i = self.cell(self._index(index), dt)
        raw = self.b.load(p, i)
        return self.b.cmp("ne", raw, self.b.const(dtypes.uint8, 0), dtypes.uint8) \
            if dt is dtypes.bool_ else raw

    def store_cell(self, index, dt, value) -> None:
        p, i = self.cell(self._index(index), dt)
        if dt is dtypes.bool_:
            value = self.b.cast(value, dt, dtypes.uint8)
        self.stmt(Store(p, i, value))

    def lead_coords(self, lead: int, f) -> list:
        """Coordinates of leading index ``f`` over the kernel's first ``lead`` axes."""
        b, out, rest = self.b, [], f
        for d in reversed(self.k.shape[:lead]):
            out.insert(0, b.rem(rest, self.idx(d)) if lead > 1 else rest)
            rest = b.div(rest, self.idx(d))
        return out

    def lead_loop(self, plan: SplitPlan, lo, hi, body) -> None:
        """``body(coords)`` over the leading indices ``[lo, hi)`` and all the other axes.
        The last leading axis runs as a loop of its own (a range of each of its rows), so
        no element pays a division."""
        b, shape = self.b, self.k.shape
        if plan.lead == 1:
            with self.loop(lo, hi, "f") as f:
                self.nest(shape, body, parallel=False, coords=(f,))
            return
        d = self.idx(shape[plan.lead - 1])
        first = b.div(lo, d)
        stop = b.div(b.add(hi, self.idx(shape[plan.lead - 1] - 1)), d)
        with self.loop(first, stop, "q") as q:
            base = b.mul(q, d)
            a = b.select(b.cmp("gt", lo, base, INDEX), b.sub(lo, base), self.idx(0), INDEX)
            e = b.sub(hi, base)
            e = b.select(b.cmp("lt", e, d, INDEX), e, d, INDEX)
            outer = self.lead_coords(plan.lead - 1, q)
            with self.loop(a, e, "f") as f:
                self.nest(shape, body, parallel=False, coords=tuple(outer) + (f,))

    def split_phase(self, plan: SplitPlan, phase: str, index: int) -> None:
        """One function of a split full reduction: ``phase`` "p" (reduction ``index`` over
        the parts [start, end)), "c" (its combination) or "full" (the full-size stores)."""
        b = self.b
        reductions = kernel_reductions(self.k)
        finals = 2 * plan.reductions * plan.parts

        def load_finals(count):
            for i, node in enumerate(reductions[:count]):
                self.acc[node.output] = self.load_cell(
                    finals + i, lowering.register_dtype(node.output.type.dtype))

        start, end = self.start_end()
        if phase == "full":
            load_finals(len(reductions))
            outs = self.outputs_at("full")
            self.lead_loop(plan, start, end, lambda coords: self.store_all(outs, coords))
            return
        node = reductions[index]
        out_dt = node.output.type.dtype
        acc_dt = lowering.register_dtype(out_dt)
        load_finals(index)
        if phase == "p":
            with self.loop(start, end, "part") as part:
                self.split_part(plan, node, part, index)
            return
        # Combine the parts in order.
        if node.op == "sum" and out_dt.is_floating_point:
            total = self.declare("total", F64, b.const(F64, 0.0))
            comp = self.declare("comp", F64, b.const(F64, 0.0))
            for p in range(plan.parts):
                cell = 2 * (index * plan.parts + p)
                self.add_to_total(self.load_cell(cell, F64), F64, total, comp)
                if acc_dt is F64:
                    comp.assign(b.binary("add", comp.read(), self.load_cell(cell + 1, F64), F64))
            value = self.total_value(total, comp, acc_dt)
        else:
            value = lowering.reduction_identity(b, node.op, out_dt)
            for p in range(plan.parts):
                part = self.load_cell(2 * (index * plan.parts + p), acc_dt)
                value = self.combine(node.op, value, part, out_dt)
        self.store_cell(finals + index, acc_dt, value)
        if index == len(reductions) - 1:
            self.acc[node.output] = value
            for v in self.outputs_at("row"):
                self.store(v, [self.idx(0)] * len(v.type.shape))

    def split_part(self, plan: SplitPlan, node: Node, part, index: int) -> None:
        """Reduce ``node`` over part ``part`` into its scratch cells."""
        b, shape = self.b, self.k.shape
        out_dt = node.output.type.dtype
        acc_dt = lowering.register_dtype(out_dt)
        n, parts = self.idx(plan.lead_size), self.idx(plan.parts)
        lo = b.div(b.mul(part, n), parts)
        hi = b.div(b.mul(b.add(part, self.idx(1)), n), parts)
        identity = lowering.reduction_identity(b, node.op, out_dt)
        acc = self.declare("acc", acc_dt, identity)
        out = b.add(self.idx(2 * index * plan.parts), b.mul(part, self.idx(2)))

        def body(coords):
            self.step(node, acc, coords)
        if not (node.op == "sum" and out_dt.is_floating_point):
            self.lead_loop(plan, lo, hi, body)
            self.store_cell(out, acc_dt, acc.read())
            return
        # Blocks of at most SUM_BLOCK elements, as blocked_sums: whole inner rows of a
        # leading index when they are that long, else groups of leading indices.
        total = self.declare("total", F64, b.const(F64, 0.0))
        comp = self.declare("comp", F64, b.const(F64, 0.0))

        def begin():
            acc.assign(identity)

        def end():
            self.add_to_total(acc.read(), acc_dt, total, comp)
        inner = math.prod(shape[plan.lead:])
        if _longer(inner, SUM_BLOCK):
            with self.loop(lo, hi, "f") as f:
                lead_coords = self.lead_coords(plan.lead, f)
                self.blocks(list(shape[plan.lead:]), SUM_BLOCK,
                            lambda red: body(lead_coords + list(red)), begin, end)
        else:
            group = self.idx(SUM_BLOCK // inner)
            count = b.div(b.add(b.sub(hi, lo), self.idx(SUM_BLOCK // inner - 1)), group)
            with self.loop(0, count, "blk") as blk:
                first = b.add(lo, b.mul(blk, group))
                last = b.add(first, group)
                last = b.select(b.cmp("lt", last, hi, INDEX), last, hi, INDEX)
                begin()
                self.lead_loop(plan, first, last, body)
                end()
        self.store_cell(out, F64, total.read())
        self.store_cell(b.add(out, self.idx(1)), F64, comp.read())

    # -- column reductions
    def columns(self, plan: ColumnPlan, reductions: list[Node]) -> None:
        """A reduction kernel in the order of ``plan`` (see :class:`ColumnPlan`): per
        parallel unit, each reduction fills a tile of accumulators (the reduced axes
        outside, the tile inside), then the row-level outputs are stored from the tile and
        the full-size outputs computed over the reduced axes again. Each accumulator adds
        its elements in index order, whatever the tile and the thread count."""
        k, b = self.k, self.b
        shape = k.shape
        last = len(shape) - 1
        red_shape = [shape[a] for a in k.axes]
        n_chunks = ceil_div(shape[last], plan.chunk) if plan.chunk else 1
        # Chunks cut only for the thread pool (the row fits one tile): the chunks of one row
        # that a thread's range of units holds run as one tile, so one thread reads each
        # row whole instead of once per chunk in 1 KiB pieces (a 4096x1024 sum(0) on one
        # thread: 2.1-2.6 ms in four chunks, numpy 0.9-1.4).
        merged = bool(plan.chunk) and not _longer(shape[last], COLUMN_TILE)
        tile_size = shape[last] if merged else \
            plan.chunk or math.prod(shape[a] for a in plan.tile)
        finished: dict[Value, Local] = {}          # reduction result -> its tile

        def per_unit(unit, span=None):
            """The unit's tile; ``span``: the (lo, hi) columns of a merged range instead."""
            kept: dict = {}
            rest, lo, hi = unit, None, None
            if span is not None:
                lo, hi = span
            elif plan.chunk:
                chunk = b.rem(rest, self.idx(n_chunks))
                rest = b.div(rest, self.idx(n_chunks))
                lo = b.mul(chunk, self.idx(plan.chunk))
                hi = b.add(lo, self.idx(plan.chunk))
                if is_symbolic(shape[last]) or shape[last] % plan.chunk:
                    n = self.idx(shape[last])
                    hi = b.select(b.cmp("lt", hi, n, INDEX), hi, n, INDEX)
            for a in reversed(plan.outer):
                kept[a] = b.rem(rest, self.idx(shape[a]))
                rest = b.div(rest, self.idx(shape[a]))

            def tile(body):
                """``body(kept coords, index in the tile)`` over the unit's tile."""
                def inner(coords, index):
                    for v, buf in finished.items():
                        self.acc[v] = b.load_local(buf, index)
                    body({**kept, **coords}, index)
                    for v in finished:
                        del self.acc[v]
                if lo is not None:
                    with self.loop(lo, hi, "j") as j:
                        inner({last: j}, b.sub(j, lo))
                    return
                self.tile_nest(plan.tile, {}, self.idx(0), inner)

            def coords_at(kept_coords, red):
                q = iter(red)
                return [next(q) if a in k.axes else kept_coords[a] for a in range(len(shape))]

            for node in reductions:
                finished[node.output] = self.column_reduce(node, tile, coords_at, red_shape,
                                                           tile_size)
            self.column_stores(tile, coords_at, red_shape)
            finished.clear()

        if not merged:
            self.nest([plan.units], lambda u: per_unit(u[0]), parallel=True)
            return
        # Units [start, end) cover rows first // n .. (end - 1) // n of the outer axes, each
        # from its first unit in the range to its last.
        start, end = self.start_end()
        n = self.idx(n_chunks)

        def least(x, y):
            return b.select(b.cmp("lt", x, y, INDEX), x, y, INDEX)
        first = b.div(start, n)
        stop = b.div(b.add(end, self.idx(n_chunks - 1)), n)
        with self.loop(first, stop, "u") as row:
            base = b.mul(row, n)
            # (index arithmetic is unsigned: start - base only where start > base)
            c_lo = b.select(b.cmp("gt", start, base, INDEX), b.sub(start, base), self.idx(0),
                            INDEX)
            c_hi = least(b.sub(end, base), n)         # end > base: row < stop
            lo = b.mul(c_lo, self.idx(plan.chunk))
            hi = least(b.mul(c_hi, self.idx(plan.chunk)), self.idx(shape[last]))
            per_unit(row, (lo, hi))

    def tile_nest(self, axes, coords: dict, index, body) -> None:
        """Loops over the tile ``axes`` (trailing axes of the kernel), with the linear index
        into the tile: ``body(coords, index)``. A loop of 8 to 64 iterations stays rolled:
        unrolled, LLVM would vectorize the reduced loop around it with interleaved accesses
        (see :meth:`nest`)."""
        if not axes:
            body(coords, index)
            return
        n = self.k.shape[axes[0]]
        with self.loop(0, n, f"j{len(coords)}", unroll=n < 8) as j:
            inner = self.b.add(self.b.mul(index, self.idx(n)), j)
            self.tile_nest(axes[1:], {**coords, axes[0]: j}, inner, body)

    def column_reduce(self, node: Node, tile, coords_at, red_shape, tile_size: int) -> Local:
        """Reduce ``node`` into a tile of accumulators; returns the tile."""
        b = self.b
        out_dt = node.output.type.dtype
        acc_dt = lowering.register_dtype(out_dt)
        identity = lowering.reduction_identity(b, node.op, out_dt)
        accs = self.local("cols", acc_dt, tile_size)

        def reset(_coords, index):
            self.stmt(StoreLocal(accs, index, identity))

        def body(red):
            tile(lambda kept, index: self.step(node, _Slot(self, local=accs, index=index),
                                               coords_at(kept, red)))

        if not (node.op == "sum" and out_dt.is_floating_point and
                _longer(math.prod(red_shape), COLUMN_BLOCK)):
            tile(reset)
            self.nest(red_shape, body, parallel=False)
            return accs
        # Blocks of COLUMN_BLOCK rows per accumulator, block sums added in float64.
        total = self.local("total", F64, tile_size)
        comp = self.local("comp", F64, tile_size) if acc_dt is F64 else None

        def slots(index):
            return (_Slot(self, local=total, index=index),
                    comp and _Slot(self, local=comp, index=index))

        def start(_coords, index):
            for slot in slots(index):
                if slot is not None:
                    slot.assign(b.const(F64, 0.0))

        def add(_coords, index):
            self.add_to_total(b.load_local(accs, index), acc_dt, *slots(index))

        def finish(_coords, index):
            self.stmt(StoreLocal(accs, index, self.total_value(*slots(index), acc_dt)))
        tile(start)
        self.blocks(red_shape, COLUMN_BLOCK, body, lambda: tile(reset), lambda: tile(add))
        tile(finish)
        return accs

    def column_stores(self, tile, coords_at, red_shape) -> None:
        """Stores of a column kernel's outputs: row-level ones from the tile, full-size ones
        over the reduced axes again."""
        k, zero = self.k, self.idx(0)
        row_outs, full_outs = self.outputs_at("row"), self.outputs_at("full")

        def rows(kept, _index):
            items = []
            for v in row_outs:
                coords = coords_at(kept, [zero] * len(k.axes))
                if len(v.type.shape) != len(k.shape):        # not the keepdim shape
                    coords = [c for a, c in enumerate(coords) if a not in k.axes]
                items.append((v, coords))
            self.store_each(items)
        if row_outs:
            tile(rows)
        if full_outs:
            def full(red):
                tile(lambda kept, _index: self.store_all(full_outs, coords_at(kept, red)))
            self.nest(red_shape, full, parallel=False)

    def finish(self, name: str, family: str) -> LoweredKernel:
        prologue = self.prologue()
        params = list(self.params.values()) + list(self.cells.values())
        return LoweredKernel(name, params, [], prologue + self.body, 1, 1, family, 64,
                             self.locals, hoistable=0 not in self.k.shape)


def lower_kernel(kernel: Kernel, kg: KernelGraph) -> list[LoweredKernel]:
    """``kernel`` as the functions of :func:`kernel_phases`, in launch order; raises
    :class:`Unsupported` if some primitive or dtype in it has no lowering. A split full
    reduction's partial results are in :data:`SCRATCH` parameters (:meth:`SplitPlan.cells`
    8-byte cells)."""
    plan = split_plan(kernel)
    if plan is not None:
        out = []
        for i in range(plan.reductions):
            for phase in ("p", "c"):
                low = _CPULowering(kernel, kg)
                low.split_phase(plan, phase, i)
                out.append(low.finish(f"{kernel.name}_{phase}{i}", f"split_{phase}"))
        if any(kernel.level.get(v) == "full" for v in kernel.outputs):
            low = _CPULowering(kernel, kg)
            low.split_phase(plan, "full", 0)
            out.append(low.finish(kernel.name, "split_full"))
        return out
    low = _CPULowering(kernel, kg)
    if kernel.kind == "elementwise":
        low.elementwise()
    elif kernel.kind == "reduction":
        low.reduction()
    elif kernel.kind == "matmul":
        low.epilogue()
    else:
        raise Unsupported(f"{kernel.kind} kernels run in numpy")
    return [low.finish(kernel.name, kernel.kind)]
