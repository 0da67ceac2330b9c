"""The GPU-shaped lowering: a fused kernel as the per-thread code of a CUDA grid.

:func:`lower_kernel` turns a :class:`fusegrad.ir.kernel_graph.Kernel` into a
:class:`fusegrad.codegen.kernel_ir.LoweredKernel`; the CUDA C printer prints it and the
reference interpreter runs it. Every scalar operation comes from the lowering table
(:mod:`fusegrad.ops.lowering`) and every index from :mod:`fusegrad.codegen.indexing`: the
numerics are the CPU kernels', only the loop structure is the GPU's.

Families (``LoweredKernel.family``):

- ``elementwise``: a grid-stride loop over the output's elements, one element a thread per
  step; outputs and loads index through their views (broadcasts are index maps). Where the
  innermost axis holds whole groups of 4 and no reshape, pad or concat is fused in, a
  thread takes 4 consecutive elements a step instead, with 16-byte loads and stores of the
  4-byte buffers (8-byte ones of the 16-bit floats) read at unit stride (when their pointers
  are aligned; else the scalar loop runs). A kernel that reads an input with its two innermost axes swapped (a
  transpose) takes 32x32 tiles instead: that input read along its unit stride into a
  32x33 shared tile, the outputs computed and stored along the innermost axis;
- ``row_reduce`` (the reduced axes include the innermost one: softmax, layer_norm,
  log_softmax, sums over the last axis): a block per row. Each thread folds a strided part
  of the row into a register, the warp combines with shuffles, the warps through shared
  memory; every thread then reads the row's result and the full-size outputs are stored
  with the threads striding over the row again;
- ``grid_reduce`` (one reduction of every axis, of at least ``GRID_REDUCE_MIN`` elements:
  ``x.sum()``): the elements spread over many blocks, read 16 bytes at a time into 4
  accumulators where they are contiguous and aligned; each block's partial result goes to
  a grid-scope array and the last block to finish (an atomic count after a fence) combines
  them in block order, so the sum's order depends only on the grid (deterministic, no float
  atomics);
- ``col_reduce`` (the innermost axis is kept: ``x.sum(0)``): a block per tile of 32 kept
  elements, its 8 warps each folding every 8th reduced element of the 32 columns (a warp
  reads 32 neighbouring addresses: coalesced), the 8 partial results combined in shared
  memory in a fixed order;
- ``matmul``: 16x16 output tiles, a block per tile, the operands' tiles staged in shared
  memory, the product accumulated in a register (float32 for 16-bit operands) and the
  fused epilogue (bias, activation, residual) applied before the store;
- ``attention``, ``attention_backward`` and ``index_add``: kernels of their own for the
  extern primitives a transformer step uses, straightforward loops with a thread per row of
  a head (its scores, softmax and product; its rows of dq, dk and dv) or per output element
  (index_add adds the source elements whose index names it, in index order), so that the
  step runs on the device throughout. Other extern primitives run their numpy reference.
"""

from __future__ import annotations

import math

from fusegrad import dtypes
from fusegrad.codegen import indexing
from fusegrad.codegen.cuda import collect
from fusegrad.codegen.kernel_ir import (
    INDEX,
    Assign,
    AtomicInc,
    Barrier,
    Declare,
    Expr,
    Fence,
    If,
    Loop,
    LoweredKernel,
    Param,
    Shared,
    Store,
    StoreShared,
    StoreVec,
    Var,
)
from fusegrad.codegen.values import MOVES_ELEMENTS, KernelValues, reductions
from fusegrad.config import config
from fusegrad.ir.graph import Node, Value
from fusegrad.ir.kernel_graph import Kernel, KernelGraph, identity_view
from fusegrad.ops import lowering
from fusegrad.ops.lowering import Unsupported
from fusegrad.symint import (
    SymbolicDecisionError,
    SymInt,
    at_hints,
    ceil_div,
    evaluate_dim,
    is_symbolic,
    known_equal,
    known_multiple,
    size_hint,
)

__all__ = ["lower_kernel", "kernel_family", "launch_grid", "indices_fit", "BLOCK", "WARP", "TILE",
           "MAX_GRID", "EXTERN_FAMILIES", "INDEX32_LIMIT"]

BLOCK = 256          # threads per block
VEC = 4              # elements a thread loads and stores at once in elementwise kernels
VEC_MIN = 4096       # smaller kernels keep the one scalar loop
MAX_KEPT_ROW = 2048  # elements of a row a row_reduce block keeps in shared memory
WARP = 32
TRANSPOSE_TILE = 32  # tiles of 32x32 elements (in shared memory 32x33) for transposes
TILE = 16            # matmul output tile (TILE x TILE threads)
MAX_GRID = 8192      # blocks at most: the loops stride over the rest
GRID_REDUCE_MIN = 1 << 15   # a full reduction of at least this many elements spans blocks
INDEX32_LIMIT = 1 << 31     # indices are 32-bit where every buffer and loop is shorter
PARTIALS = 1024      # blocks of a grid_reduce at most (about 8 per SM of an H100)


# Extern primitives with a kernel of their own: straightforward loops, a thread per row of
# the attention (per output element of index_add), so that a step that uses them runs on the
# device throughout (and replays as one CUDA graph).
EXTERN_FAMILIES = {"fused_attention": "attention", "fused_attention_backward":
                   "attention_backward", "index_add": "index_add"}


def _vectors(memory_dtype) -> bool:
    """Whether elements of ``memory_dtype`` are read and written ``VEC`` at a time: 4-byte
    elements (16 bytes a vector), and 16-bit floats (their 16-bit integers: 8 bytes)."""
    return memory_dtype.itemsize == 4 or memory_dtype is lowering.BITS16


def kernel_family(kernel: Kernel) -> str:
    """Which GPU loop structure ``kernel`` gets (see the module docstring)."""
    if kernel.kind == "elementwise":
        return "elementwise"
    if kernel.kind == "matmul":
        return "matmul"
    if kernel.kind == "reduction":
        # (symbolic sizes: chosen at the sizes traced at; either family is right at any)
        if len(kernel.axes) == len(kernel.shape) and \
                math.prod(at_hints(kernel.shape)) >= GRID_REDUCE_MIN \
                and len(reductions(kernel)) == 1 and \
                not any(kernel.level.get(v) == "full" for v in kernel.outputs):
            return "grid_reduce"
        return "row_reduce" if len(kernel.shape) - 1 in kernel.axes else "col_reduce"
    if kernel.kind == "extern" and len(kernel.nodes) == 1 and kernel.nodes[0].op in EXTERN_FAMILIES:
        return EXTERN_FAMILIES[kernel.nodes[0].op]
    raise Unsupported(f"{kernel.kind} kernels run their numpy reference")


def _name(kernel: Kernel, family: str) -> str:
    """``k3_row_reduce_max_sub_exp_sum_div``: what the kernel does, for profiles."""
    ops = []
    for n in kernel.nodes:
        if n.op not in ops and n.op not in ("reshape", "broadcast_to", "copy"):
            ops.append(n.op)
    text = "_".join(ops)[:48].rstrip("_")
    return f"{kernel.name}_{family}" + (f"_{text}" if text else "")


class _Lowering(KernelValues):
    # The sizes buffer holds 64-bit integers; a kernel of 32-bit indices narrows them.
    sizes_dtype = dtypes.int64

    def __init__(self, kernel: Kernel, kg: KernelGraph):
        super().__init__(kernel, kg)
        # 16-bit floats convert in one instruction each (cvt), not through integer code.
        self.b.half_conversions = True
        self.shared: list[Shared] = []
        self.lane = None       # (lane, lane 0's coordinates, vectorized params): vector_loop
        self.staged: dict = {}  # Value -> its element read back from a transpose tile
        # Blocks a launch takes at most (a symbolic grid is min(this, the blocks needed)).
        self.grid_cap = MAX_GRID

    def loop(self, name: str, start, stop, step, body_fn) -> Loop | If:
        v = self.var(name, INDEX)
        body: list = []
        body_fn(self.b.read(v), body)
        if stop.op == "const" and stop.arg == 0:
            # Over an empty tensor or axis: no loop at all (``i < 0u`` is a comparison
            # nvcc warns of, and the body's stores must not run).
            return If(self.b.const(dtypes.bool_, 0), [])
        return Loop(v, start, stop, step, body)

    def store(self, v: Value, coords, body: list) -> None:
        index = indexing.linear_index(self.b, coords, v.type.shape)
        value = lowering.to_memory(self.b, self.emit(v, coords), v.type.dtype)
        body.append(Store(self.param(v), index, value))

    def thread_id(self):
        b = self.b
        return b.add(b.mul(b.special("blockIdx"), b.special("blockDim")), b.special("threadIdx"))

    def grid_stride(self):
        b = self.b
        return b.mul(b.special("blockDim"), b.special("gridDim"))

    # -- families
    def transposed_inputs(self) -> list[Value]:
        """The inputs read with the two innermost axes swapped (unit stride along the
        kernel's second-to-last axis, not its last), when the kernel is big enough for
        tiles and moves no element otherwise; reading them directly would make every warp
        touch 32 cache lines."""
        shape = self.k.shape
        hint = at_hints(shape)           # (a choice of speed: at the sizes traced at)
        if len(shape) < 2 or hint[-1] < TRANSPOSE_TILE // 2 or hint[-2] < TRANSPOSE_TILE // 2 \
                or math.prod(hint) < VEC_MIN or \
                any(nd.op in MOVES_ELEMENTS for nd in self.k.nodes):
            return []
        out: list[Value] = []
        for v in [v for nd in self.k.nodes for v in nd.inputs] + list(self.k.inputs):
            view = self.kg.views.get(v)
            if view is not None and known_equal(v.type.shape, shape) and \
                    known_equal(view.strides[-2], 1) and not known_equal(view.strides[-1], 1) \
                    and v not in out:
                out.append(v)
        return out

    def transpose_tiles(self, staged: list[Value]) -> tuple[list, int]:
        """A block per 32x32 tile of the two innermost axes: the threads read the swapped
        inputs along their unit-stride axis (coalesced) into shared tiles of 32x33 (the
        pad keeps a column's reads off one bank), then compute and store the outputs along
        the kernel's innermost axis (coalesced), taking those inputs from the tiles."""
        k, b = self.k, self.b
        shape = k.shape
        rows, cols = shape[-2], shape[-1]
        t = TRANSPOSE_TILE
        tiles_r, tiles_c = ceil_div(rows, t), ceil_div(cols, t)
        batch = shape[:-2]
        blocks = math.prod(batch) * tiles_r * tiles_c
        tid = b.special("threadIdx")
        tx, ty = b.rem(tid, self.idx(t)), b.div(tid, self.idx(t))
        steps = BLOCK // t
        tiles = {id(v): Shared(self.fresh("tile"), lowering.register_dtype(v.type.dtype),
                               t * (t + 1)) for v in staged}
        self.shared += list(tiles.values())
        outs = self.outputs_at("full")

        def per_tile(tile, body):
            per_batch = self.idx(tiles_r * tiles_c)
            bcoords = indexing.unravel(b, b.div(tile, per_batch), batch, bounded=True)
            within = b.rem(tile, per_batch)
            r0 = b.mul(b.div(within, self.idx(tiles_c)), self.idx(t))
            c0 = b.mul(b.rem(within, self.idx(tiles_c)), self.idx(t))
            for s in range(0, t, steps):
                # Read: thread (ty, tx) takes row r0 + tx of column c0 + ty + s.
                r, c = b.add(r0, tx), b.add(c0, b.add(ty, self.idx(s)))
                ok = b.binary("and", b.cmp("lt", r, self.idx(rows), INDEX),
                              b.cmp("lt", c, self.idx(cols), INDEX), dtypes.bool_)
                at = b.add(b.mul(b.add(ty, self.idx(s)), self.idx(t + 1)), tx)
                body.append(If(ok, [StoreShared(tiles[id(v)], at, self.load(v, bcoords + [r, c]))
                                    for v in staged]))
            body.append(Barrier())
            for s in range(0, t, steps):
                # Write: thread (ty, tx) takes column c0 + tx of row r0 + ty + s.
                r, c = b.add(r0, b.add(ty, self.idx(s))), b.add(c0, tx)
                ok = b.binary("and", b.cmp("lt", r, self.idx(rows), INDEX),
                              b.cmp("lt", c, self.idx(cols), INDEX), dtypes.bool_)
                at = b.add(b.mul(tx, self.idx(t + 1)), b.add(ty, self.idx(s)))
                self.staged = {id(v): b.load_shared(tiles[id(v)], at) for v in staged}
                stores: list = []
                for v in outs:
                    self.store(v, bcoords + [r, c], stores)
                self.staged = {}
                body.append(If(ok, stores))
            # Before the next tile overwrites the tiles.
            body.append(Barrier())
        return [self.loop("tile", b.special("blockIdx"), self.idx(blocks), b.special("gridDim"),
                          per_tile)], blocks

    def elementwise(self) -> tuple[list, int]:
        shape = self.k.shape
        n = math.prod(shape)
        outs = self.outputs_at("full")
        staged = self.transposed_inputs()
        if staged:
            return self.transpose_tiles(staged)

        def body(i, out):
            coords = indexing.unravel(self.b, i, shape, bounded=True)
            for v in outs:
                self.store(v, coords, out)
        scalar = self.loop("i", self.thread_id(), self.idx(n), self.grid_stride(), body)
        vector = self.vector_loop(outs)
        if vector is None:
            return [scalar], ceil_div(n, BLOCK)
        loop, params = vector
        aligned = None
        for p in params:
            ok = self.b.aligned(p, VEC * p.dtype.itemsize)
            aligned = ok if aligned is None else self.b.binary("and", aligned, ok, dtypes.bool_)
        misaligned = self.b.binary("xor", aligned, self.b.const(dtypes.bool_, 1), dtypes.bool_)
        return [If(aligned, [loop]), If(misaligned, [scalar])], ceil_div(n, VEC * BLOCK)

    def vector_loop(self, outs) -> tuple[Loop, list[Param]] | None:
        """The elementwise loop with ``VEC`` consecutive elements a thread per step, when
        the kernel's innermost axis holds whole groups of them and no reshape, pad or
        concat moves elements across the axis: each buffer read with unit stride along
        the axis is read ``VEC`` elements at once (``load_vec``: a 16-byte load for 4-byte
        elements), each output stored so; a value broadcast along the axis is one scalar
        load for the group. None when the kernel does not qualify or nothing would be
        vectorized. Returns the loop and the parameters it reads or writes in vectors (the
        caller runs it only where all of them are aligned)."""
        shape = self.k.shape
        n = math.prod(shape)
        if not shape or not known_multiple(shape[-1], VEC) or at_hints(n) < VEC_MIN or any(
                nd.op in MOVES_ELEMENTS for nd in self.k.nodes):
            return None
        b = self.b
        vectorized: dict[int, Param] = {}

        def body(i, out):
            coords0 = indexing.unravel(b, b.mul(i, self.idx(VEC)), shape, bounded=True)
            lanes = [coords0[:-1] + [b.add(coords0[-1], self.idx(k))] for k in range(VEC)]
            for v in outs:
                values = []
                for k, coords in enumerate(lanes):
                    self.lane = (k, coords0, vectorized)
                    values.append(lowering.to_memory(b, self.emit(v, coords), v.type.dtype))
                self.lane = None
                p = self.param(v)
                if _vectors(p.dtype):
                    vectorized[id(p)] = p
                    out.append(StoreVec(p, i, tuple(values)))      # outputs are contiguous
                else:
                    for coords, value in zip(lanes, values):
                        out.append(Store(p, indexing.linear_index(b, coords, shape), value))
        loop = self.loop("i", self.thread_id(), self.idx(n // VEC), self.grid_stride(), body)
        return (loop, list(vectorized.values())) if vectorized else None

    def load(self, v: Value, coords):
        if id(v) in self.staged:
            return self.staged[id(v)]
        lane = self.lane
        view = self.view(v)
        shape = self.k.shape
        # (Symbolic sizes: a vector where it holds at every size, else scalar loads.)
        if lane is None or not coords or not known_equal(v.type.shape[-1], shape[-1]) or \
                known_equal(shape[-1], 1) or not known_equal(view.strides[-1], 1) or \
                not known_multiple(view.offset, VEC) or \
                not all(known_multiple(s, VEC) for s in view.strides[:-1]) or \
                not _vectors(lowering.memory_dtype(v.type.dtype)):
            return super().load(v, coords)
        # Lane k reads the element k after lane 0's: the group is one vector.
        k, coords0, vectorized = lane
        p = self.param(view.base)
        vectorized[id(p)] = p
        start = self.address(view, list(coords[:-1]) + [coords0[-1]])
        vec = self.b.load_vec(p, self.b.div(start, self.idx(VEC)), VEC)
        return lowering.from_memory(self.b, self.b.extract(vec, k), v.type.dtype)

    def split(self, flat_row, flat_red):
        """Full coordinates from a row's and a reduced element's linear indices."""
        k = self.k
        kept = [d for i, d in enumerate(k.shape) if i not in k.axes]
        red = [k.shape[a] for a in k.axes]
        rows = iter(indexing.unravel(self.b, flat_row, kept, bounded=True))
        reds = iter(indexing.unravel(self.b, flat_red, red, bounded=True) if flat_red is not None else
                    [self.idx(0)] * len(red))
        return [next(reds) if i in k.axes else next(rows) for i in range(len(k.shape))]

    def row_outputs(self, row, body: list) -> None:
        k = self.k
        for v in self.outputs_at("row"):
            coords = self.split(row, None)
            if len(v.type.shape) != len(k.shape):
                coords = [c for i, c in enumerate(coords) if i not in k.axes]
            self.store(v, coords, body)

    def reduce_step(self, node: Node, acc: Var, coords, body: list) -> None:
        b = self.b
        src = node.inputs[0]
        out_dt = node.output.type.dtype
        x = self.emit(src, coords)
        if src.type.dtype is not out_dt:
            x = lowering.convert(b, x, src.type.dtype, out_dt)
        body.append(Assign(acc, lowering.combine(b, node.op, b.read(acc), x, out_dt)))

    def block_total(self, node: Node, acc: Var, body: list) -> Var:
        """``acc`` of every thread of the block combined, in a fixed order: the warp's with
        shuffles, then the warps' through shared memory; returns a variable every thread
        holds it in."""
        b = self.b
        out_dt = node.output.type.dtype
        reg = acc.dtype
        tid = b.special("threadIdx")
        lane = b.rem(tid, self.idx(WARP))
        warp = b.div(tid, self.idx(WARP))
        identity = lowering.reduction_identity(b, node.op, out_dt)
        for off in (16, 8, 4, 2, 1):
            body.append(Assign(acc, lowering.combine(
                b, node.op, b.read(acc), b.shfl_xor(b.read(acc), off), out_dt)))
        smem = Shared(self.fresh("red"), reg, WARP)
        self.shared.append(smem)
        is_lane0 = b.cmp("eq", lane, self.idx(0), INDEX)
        body.append(If(is_lane0, [StoreShared(smem, warp, b.read(acc))]))
        body.append(Barrier())
        first = If(b.cmp("eq", warp, self.idx(0), INDEX))
        part = b.select(b.cmp("lt", lane, self.idx(BLOCK // WARP), INDEX),
                        b.load_shared(smem, lane), identity, reg)
        first.body.append(Assign(acc, part))
        for off in (16, 8, 4, 2, 1):
            first.body.append(Assign(acc, lowering.combine(
                b, node.op, b.read(acc), b.shfl_xor(b.read(acc), off), out_dt)))
        first.body.append(If(is_lane0, [StoreShared(smem, self.idx(0), b.read(acc))]))
        body.append(first)
        body.append(Barrier())
        result = self.var("red", reg)
        body.append(Declare(result, b.load_shared(smem, self.idx(0))))
        # Before the next reduction (or the next row) reuses shared memory.
        body.append(Barrier())
        return result

    def grid_reduce(self) -> tuple[list, int]:
        """A full reduction over many blocks, in one launch. Each thread folds a grid-stride
        share of the elements into ``VEC`` accumulators, reading ``VEC`` at once (16-byte
        loads, where every buffer read so is aligned: else one at a time); the block
        combines them (:meth:`block_total`) and writes its partial result to a grid-scope
        array; the last block to finish (an atomic count of the blocks, after a fence)
        combines the partials in block order and stores the result. The order of every
        sum depends only on the grid: the result is the same from run to run (no float
        atomics)."""
        k, b = self.k, self.b
        shape = k.shape
        n = math.prod(shape)
        node = reductions(k)[0]
        out_dt = node.output.type.dtype
        reg = lowering.register_dtype(out_dt)
        identity = lowering.reduction_identity(b, node.op, out_dt)
        tid = b.special("threadIdx")
        accs = [self.var("acc", reg) for _ in range(VEC)]
        body: list = [Declare(a, identity) for a in accs]

        def scalar(j, out):
            self.reduce_step(node, accs[0], indexing.unravel(b, j, shape, bounded=True), out)
        scalar_loop = self.loop("j", self.thread_id(), self.idx(n), self.grid_stride(), scalar)
        vectorized: dict[int, Param] = {}
        if known_multiple(shape[-1], VEC):
            def vector(i, out):
                coords0 = indexing.unravel(b, b.mul(i, self.idx(VEC)), shape, bounded=True)
                for lane in range(VEC):
                    self.lane = (lane, coords0, vectorized)
                    coords = coords0[:-1] + [b.add(coords0[-1], self.idx(lane))]
                    self.reduce_step(node, accs[lane], coords, out)
                self.lane = None
            vector_loop = self.loop("i", self.thread_id(), self.idx(n // VEC),
                                    self.grid_stride(), vector)
        if vectorized:
            aligned = None
            for p in vectorized.values():
                ok = b.aligned(p, VEC * p.dtype.itemsize)
                aligned = ok if aligned is None else b.binary("and", aligned, ok, dtypes.bool_)
            body.append(If(aligned, [vector_loop]))
            body.append(If(b.binary("xor", aligned, b.const(dtypes.bool_, 1), dtypes.bool_),
                           [scalar_loop]))
        else:
            body.append(scalar_loop)
        for a in accs[1:]:
            body.append(Assign(accs[0], lowering.combine(b, node.op, b.read(accs[0]),
                                                         b.read(a), out_dt)))
        total = self.block_total(node, accs[0], body)
        partials = Shared(self.fresh("partials"), reg, PARTIALS, scope="grid")
        count = Shared(self.fresh("count"), dtypes.uint32, 1, scope="grid")
        last = Shared(self.fresh("last"), dtypes.uint32, 1)
        self.shared += [partials, count, last]
        is_thread0 = b.cmp("eq", tid, self.idx(0), INDEX)
        block = b.special("blockIdx")
        blocks = b.special("gridDim")
        done = self.var("done", dtypes.uint32)
        # Thread 0 publishes the block's partial, then counts the block: the fence orders
        # the partial's write before the count, so the last block sees every partial.
        body.append(If(is_thread0, [
            StoreShared(partials, block, b.read(total)), Fence(),
            AtomicInc(done, count, self.idx(0)),
            StoreShared(last, self.idx(0), b.select(
                b.cmp("eq", b.cast(b.read(done), dtypes.uint32, INDEX),
                      b.sub(blocks, self.idx(1)), INDEX),
                b.const(dtypes.uint32, 1), b.const(dtypes.uint32, 0), dtypes.uint32))]))
        body.append(Barrier())
        final = If(b.cmp("ne", b.load_shared(last, self.idx(0)), b.const(dtypes.uint32, 0),
                         dtypes.uint32))
        acc = self.var("acc", reg)
        final.body.append(Declare(acc, identity))
        final.body.append(self.loop("p", tid, blocks, b.special("blockDim"),
                                    lambda p, out: out.append(Assign(acc, lowering.combine(
                                        b, node.op, b.read(acc), b.load_shared(partials, p),
                                        out_dt)))))
        result = self.block_total(node, acc, final.body)
        self.acc[node.output] = b.read(result)
        stores: list = [StoreShared(count, self.idx(0), b.const(dtypes.uint32, 0))]
        self.row_outputs(self.idx(0), stores)
        final.body.append(If(is_thread0, stores))
        body.append(final)
        blocks_needed = ceil_div(n, BLOCK * VEC * 4)
        if isinstance(blocks_needed, SymInt):
            self.grid_cap = PARTIALS        # (``partials`` holds this many)
            return body, blocks_needed
        return body, min(blocks_needed, PARTIALS)

    def row_reduce(self) -> tuple[list, int]:
        k, b = self.k, self.b
        nrows = math.prod(d for i, d in enumerate(k.shape) if i not in k.axes)
        rowlen = math.prod(k.shape[a] for a in k.axes)
        tid = b.special("threadIdx")

        nodes = reductions(k)
        full = self.outputs_at("full")
        # The last reduction's operand, when the stores read it again (softmax's exp(x -
        # max)), kept in shared memory: each thread reads back the elements it wrote, so the
        # stores compute nothing the reduction did (the CPU kernel keeps such a row too).
        # (shared memory is sized when compiled: a row of symbolic length is not kept)
        kept = self.reused_operand(nodes[-1] if nodes else None, full) \
            if not is_symbolic(rowlen) and rowlen <= MAX_KEPT_ROW else None
        row_buf = None
        if kept is not None:
            row_buf = Shared(self.fresh("row"), lowering.register_dtype(kept.type.dtype),
                             rowlen)
            self.shared.append(row_buf)

        def reduce_and_keep(node, acc, row, j, out):
            coords = self.split(row, j)
            if row_buf is not None and node.inputs[0] is kept:
                out.append(StoreShared(row_buf, j, self.emit(kept, coords)))
            self.reduce_step(node, acc, coords, out)

        def per_row(row, body):
            for node in nodes:
                out_dt = node.output.type.dtype
                reg = lowering.register_dtype(out_dt)
                acc = self.var("acc", reg)
                identity = lowering.reduction_identity(b, node.op, out_dt)
                body.append(Declare(acc, identity))
                body.append(self.loop("j", tid, self.idx(rowlen), b.special("blockDim"),
                                      lambda j, out, node=node, acc=acc: reduce_and_keep(
                                          node, acc, row, j, out)))
                result = self.block_total(node, acc, body)
                self.acc[node.output] = b.read(result)
            row_body: list = []
            self.row_outputs(row, row_body)
            if row_body:
                body.append(If(b.cmp("eq", tid, self.idx(0), INDEX), row_body))
            if full:
                def store_full(j, out):
                    coords = self.split(row, j)
                    if row_buf is not None:
                        self.memo[(kept, tuple(id(c) for c in coords))] = (
                            b.load_shared(row_buf, j), tuple(coords))
                    for v in full:
                        self.store(v, coords, out)
                body.append(self.loop("j", tid, self.idx(rowlen), b.special("blockDim"),
                                      store_full))
        return [self.loop("row", b.special("blockIdx"), self.idx(nrows), b.special("gridDim"),
                          per_row)], nrows

    def col_reduce(self) -> tuple[list, int]:
        """A block per tile of ``WARP`` kept elements (columns): thread ``(ty, tx)`` folds
        the column ``tile * WARP + tx``'s reduced elements ``ty, ty + ROWS, ...`` in order,
        so each step a warp reads ``WARP`` neighbouring addresses (coalesced); the ``ROWS``
        partial results meet in shared memory and the first warp combines them in a fixed
        order (deterministic: no atomics). Every thread then reads its column's result, and
        full-size outputs are stored with the ``ROWS`` rows of threads striding again."""
        k, b = self.k, self.b
        ncols = math.prod(d for i, d in enumerate(k.shape) if i not in k.axes)
        rowlen = math.prod(k.shape[a] for a in k.axes)
        rows = BLOCK // WARP
        tiles = ceil_div(ncols, WARP)
        tid = b.special("threadIdx")
        tx, ty = b.rem(tid, self.idx(WARP)), b.div(tid, self.idx(WARP))
        first_row = b.cmp("eq", ty, self.idx(0), INDEX)

        def per_tile(tile, body):
            col = b.add(b.mul(tile, self.idx(WARP)), tx)
            inside = b.cmp("lt", col, self.idx(ncols), INDEX)
            for node in reductions(k):
                out_dt = node.output.type.dtype
                reg = lowering.register_dtype(out_dt)
                identity = lowering.reduction_identity(b, node.op, out_dt)
                acc = self.var("acc", reg)
                body.append(Declare(acc, identity))
                body.append(If(inside, [self.loop(
                    "j", ty, self.idx(rowlen), self.idx(rows),
                    lambda j, out, node=node, acc=acc: self.reduce_step(
                        node, acc, self.split(col, j), out))]))
                part = Shared(self.fresh("part"), reg, BLOCK)
                self.shared.append(part)
                body.append(StoreShared(part, tid, b.read(acc)))
                body.append(Barrier())
                final = If(first_row)
                for r in range(1, rows):
                    final.body.append(Assign(acc, lowering.combine(
                        b, node.op, b.read(acc), b.load_shared(part, b.add(self.idx(r * WARP), tx)),
                        out_dt)))
                final.body.append(StoreShared(part, tx, b.read(acc)))
                body.append(final)
                body.append(Barrier())
                result = self.var("red", reg)
                body.append(Declare(result, b.load_shared(part, tx)))
                # Before the next reduction (or the next tile) writes ``part`` again.
                body.append(Barrier())
                self.acc[node.output] = b.read(result)
            row_body: list = []
            self.row_outputs(col, row_body)
            if row_body:
                body.append(If(b.binary("and", inside, first_row, dtypes.bool_), row_body))
            full = self.outputs_at("full")
            if full:
                def store_full(j, out):
                    coords = self.split(col, j)
                    for v in full:
                        self.store(v, coords, out)
                body.append(If(inside, [self.loop("j", ty, self.idx(rowlen), self.idx(rows),
                                                  store_full)]))
        return [self.loop("tile", b.special("blockIdx"), self.idx(tiles), b.special("gridDim"),
                          per_tile)], tiles

    def matmul(self) -> tuple[list, int]:
        k, b = self.k, self.b
        mm = next(n for n in k.nodes if n.op == "matmul")
        a_val, b_val = mm.inputs
        dt = mm.output.type.dtype
        if dt is dtypes.bool_:
            raise Unsupported("bool matmul")
        reg = lowering.register_dtype(dt)
        out_shape = mm.output.type.shape
        batch, (m, n) = out_shape[:-2], out_shape[-2:]
        kk = a_val.type.shape[-1]
        tiles_m, tiles_n = ceil_div(m, TILE), ceil_div(n, TILE)
        blocks = math.prod(batch) * tiles_m * tiles_n
        tid = b.special("threadIdx")
        ty, tx = b.div(tid, self.idx(TILE)), b.rem(tid, self.idx(TILE))
        a_tile = Shared(self.fresh("a_tile"), reg, TILE * TILE)
        b_tile = Shared(self.fresh("b_tile"), reg, TILE * TILE)
        self.shared += [a_tile, b_tile]
        zero = lowering.constant(b, dt, 0)

        def per_tile(t, body):
            per_batch = self.idx(tiles_m * tiles_n)
            bcoords = indexing.unravel(b, b.div(t, per_batch), batch, bounded=True)
            within = b.rem(t, per_batch)
            row = b.add(b.mul(b.div(within, self.idx(tiles_n)), self.idx(TILE)), ty)
            col = b.add(b.mul(b.rem(within, self.idx(tiles_n)), self.idx(TILE)), tx)
            acc = self.var("acc", reg)
            body.append(Declare(acc, zero))

            def operand(v, r, c, ok):
                # The tile element, or 0 past the edges (loaded at a clamped index).
                coords = indexing.operand_coords(b, v, out_shape, bcoords + [r, c])[:-2]
                r = b.select(ok, r, self.idx(0), INDEX)
                c = b.select(ok, c, self.idx(0), INDEX)
                x = self.emit(v, coords + [r, c])
                return b.select(ok, x, zero, reg)

            def per_k(k0, out):
                a_col, b_row = b.add(k0, tx), b.add(k0, ty)
                a_ok = b.binary("and", b.cmp("lt", row, self.idx(m), INDEX),
                                b.cmp("lt", a_col, self.idx(kk), INDEX), dtypes.bool_)
                b_ok = b.binary("and", b.cmp("lt", b_row, self.idx(kk), INDEX),
                                b.cmp("lt", col, self.idx(n), INDEX), dtypes.bool_)
                out.append(StoreShared(a_tile, tid, operand(a_val, row, a_col, a_ok)))
                out.append(StoreShared(b_tile, tid, operand(b_val, b_row, col, b_ok)))
                out.append(Barrier())

                def inner(j, body2):
                    x = b.load_shared(a_tile, b.add(b.mul(ty, self.idx(TILE)), j))
                    y = b.load_shared(b_tile, b.add(b.mul(j, self.idx(TILE)), tx))
                    # Floats: a fused multiply-add, as BLAS accumulates (the CPU's
                    # products): a product past the float range then does not become an
                    # infinity of its own (inf - inf: NaN where BLAS keeps the sum's sign).
                    # Integers wrap, as numpy's.
                    step = b.call("fma", [x, y, b.read(acc)], reg) if reg.is_floating_point \
                        else b.binary("add", b.read(acc), b.binary("mul", x, y, reg), reg)
                    body2.append(Assign(acc, step))
                out.append(self.loop("kk", self.idx(0), self.idx(TILE), self.idx(1), inner))
                out.append(Barrier())
            body.append(self.loop("k0", self.idx(0), self.idx(kk), self.idx(TILE), per_k))
            self.acc[mm.output] = b.read(acc)
            inside = b.binary("and", b.cmp("lt", row, self.idx(m), INDEX),
                              b.cmp("lt", col, self.idx(n), INDEX), dtypes.bool_)
            stores: list = []
            coords = bcoords + [row, col]
            for v in k.outputs:
                if k.level.get(v) == "full":
                    self.store(v, coords, stores)
            body.append(If(inside, stores))
        return [self.loop("tile", b.special("blockIdx"), self.idx(blocks), b.special("gridDim"),
                          per_tile)], blocks

    # -- extern primitives

    def _declare(self, body: list, name: str, dt, init) -> Var:
        var = self.var(name, dt)
        body.append(Declare(var, init))
        return var

    def _dot(self, body: list, n: int, left, right, reg) -> Var:
        """A variable holding ``sum(left(e) * right(e) for e < n)``, accumulated by fused
        multiply-adds in order (a matmul's accumulation)."""
        b = self.b
        acc = self._declare(body, "dot", reg, b.const(reg, 0.0))

        def term(e, inner):
            inner.append(Assign(acc, b.call("fma", [left(e), right(e), b.read(acc)], reg)))
        body.append(self.loop("e", self.idx(0), self.idx(n), self.idx(1), term))
        return acc

    def _attention_setup(self):
        node = self.k.nodes[0]
        q = node.inputs[0]
        if q.type.dtype not in (dtypes.float32, dtypes.float64):
            raise Unsupported(f"{node.op} on {q.type.dtype} runs its numpy reference")
        L, E = q.type.shape[-2:]
        batch = q.type.shape[:-2]
        return node, L, E, batch, lowering.register_dtype(q.type.dtype)

    def _masked(self, node: Node, n_operands: int, bc: list, i, j):
        """Whether the score (i, j) of the head at batch coordinates ``bc`` is masked (None
        without a mask): the mask (broadcast to the scores) is not ``keep``."""
        if len(node.inputs) == n_operands:
            return None
        b, mask = self.b, node.inputs[n_operands]
        full = list(bc) + [i, j]
        coords = full[len(full) - len(mask.type.shape):]
        m = self.load(mask, [self.idx(0) if d == 1 else c
                             for c, d in zip(coords, mask.type.shape)])
        return b.binary("xor", m, b.const(dtypes.bool_, 1), dtypes.bool_) if \
            node.attrs["keep"] else m

    def _at(self, v: Value, coords: list):
        """The element index of ``coords`` in ``v``'s own (contiguous) buffer."""
        return self.address(identity_view(v), coords)

    def attention(self) -> tuple[list, int]:
        """``fused_attention``, a thread per query row: its scores, stored in the packed
        output's weights part, their max; then the weights (softmax as the reference
        computes it: shifted by the max, 0 for a row of -inf, exp, sum, divide); then the
        row of the result, each column a dot product of the weights and a column of v."""
        node, L, E, batch, reg = self._attention_setup()
        b = self.b
        q, k, v = node.inputs[:3]
        out = node.output
        p = self.param(out)
        dt = out.type.dtype
        scale = b.const(reg, node.attrs["scale"])
        neg_inf = b.const(reg, float("-inf"))

        def row(n, body):
            coords = indexing.unravel(b, n, batch + (L,), bounded=True)
            bc, i = coords[:-1], coords[-1]

            def weight(j):
                return lowering.from_memory(b, b.load(p, self._at(out, bc + [i, b.add(j, self.idx(E))])),
                                            dt)

            def store_weight(j, value, into):
                into.append(Store(p, self._at(out, bc + [i, b.add(j, self.idx(E))]),
                                  lowering.to_memory(b, value, dt)))
            top = self._declare(body, "top", reg, neg_inf)

            def score(j, inner):
                dot = self._dot(inner, E, lambda e: self.load(q, bc + [i, e]),
                                lambda e: self.load(k, bc + [j, e]), reg)
                s = b.binary("mul", b.read(dot), scale, reg)
                masked = self._masked(node, 3, bc, i, j)
                if masked is not None:
                    s = b.select(masked, neg_inf, s, reg)
                store_weight(j, s, inner)
                inner.append(Assign(top, lowering.combine(b, "max", b.read(top), s, dt)))
            body.append(self.loop("j", self.idx(0), self.idx(L), self.idx(1), score))
            dead = b.cmp("eq", b.read(top), neg_inf, reg)
            shift = self._declare(body, "shift", reg,
                                  b.select(dead, b.const(reg, 0.0), b.read(top), reg))
            total = self._declare(body, "total", reg, b.const(reg, 0.0))

            def exp(j, inner):
                # Held in a variable: an expression that loads the score would read the
                # exp stored over it.
                e = self._declare(inner, "exp", reg, b.unary(
                    "exp", b.binary("sub", weight(j), b.read(shift), reg), reg))
                store_weight(j, b.read(e), inner)
                inner.append(Assign(total, b.binary("add", b.read(total), b.read(e), reg)))
            body.append(self.loop("j", self.idx(0), self.idx(L), self.idx(1), exp))
            if node.attrs["zero_dead"]:
                body.append(Assign(total, b.select(dead, b.const(reg, 1.0), b.read(total), reg)))

            def normalize(j, inner):
                store_weight(j, b.binary("div", weight(j), b.read(total), reg), inner)
            body.append(self.loop("j", self.idx(0), self.idx(L), self.idx(1), normalize))

            def column(e, inner):
                dot = self._dot(inner, L, weight, lambda j: self.load(v, bc + [j, e]), reg)
                inner.append(Store(p, self._at(out, bc + [i, e]),
                                   lowering.to_memory(b, b.read(dot), dt)))
            body.append(self.loop("c", self.idx(0), self.idx(E), self.idx(1), column))
        rows = math.prod(batch) * L
        return [self.loop("row", self.thread_id(), self.idx(rows), self.grid_stride(), row)], \
            ceil_div(rows, BLOCK)

    def attention_backward(self) -> tuple[list, int]:
        """``fused_attention_backward``, a thread per row r of the head: dq's row r, then
        dk's and dv's rows r (key r's gradients), each accumulated in the output over the
        rows it sums. The softmax VJP's ``sum(p * dp)`` of row i is ``dout[i] . out[i]``
        (out = p @ v), read from the packed forward result."""
        node, L, E, batch, reg = self._attention_setup()
        b = self.b
        q, k, v, packed, dout = node.inputs[:5]
        out = node.output
        g = self.param(out)
        dt = out.type.dtype
        scale = b.const(reg, node.attrs["scale"])
        zero = b.const(reg, 0.0)

        def row(n, body):
            coords = indexing.unravel(b, n, batch + (L,), bounded=True)
            bc, r = coords[:-1], coords[-1]

            def grad_at(which, e):
                return self._at(out, [self.idx(which)] + bc + [r, e])

            def clear(e, inner):
                for which in range(3):
                    inner.append(Store(g, grad_at(which, e), lowering.to_memory(b, zero, dt)))
            body.append(self.loop("e", self.idx(0), self.idx(E), self.idx(1), clear))

            def accumulate(inner, which, weight, operand):
                def term(e, inner2):
                    at = grad_at(which, e)
                    old = lowering.from_memory(b, b.load(g, at), dt)
                    inner2.append(Store(g, at, lowering.to_memory(
                        b, b.call("fma", [weight, operand(e), old], reg), dt)))
                inner.append(self.loop("e", self.idx(0), self.idx(E), self.idx(1), term))

            def ds(inner, i, j, p_ij):
                """The score gradient (i, j): ``p * (dp - dout[i] . out[i])``, masked 0, scaled."""
                dp = self._dot(inner, E, lambda e: self.load(dout, bc + [i, e]),
                               lambda e: self.load(v, bc + [j, e]), reg)
                c = self._dot(inner, E, lambda e: self.load(dout, bc + [i, e]),
                              lambda e: self.load(packed, bc + [i, e]), reg)
                value = b.binary("mul", p_ij, b.binary("sub", b.read(dp), b.read(c), reg), reg)
                masked = self._masked(node, 5, bc, i, j)
                if masked is not None:
                    value = b.select(masked, zero, value, reg)
                return self._declare(inner, "ds", reg, b.binary("mul", value, scale, reg))

            def weight(i, j):
                return self.load(packed, bc + [i, b.add(j, self.idx(E))])

            def query_grad(j, inner):            # dq[r] += ds[r, j] * k[j]
                s = ds(inner, r, j, weight(r, j))
                accumulate(inner, 0, b.read(s), lambda e: self.load(k, bc + [j, e]))
            body.append(self.loop("j", self.idx(0), self.idx(L), self.idx(1), query_grad))

            def key_grads(i, inner):             # dk[r] += ds[i, r] * q[i]; dv[r] += p[i, r] * dout[i]
                p_ir = self._declare(inner, "p", reg, weight(i, r))
                s = ds(inner, i, r, b.read(p_ir))
                accumulate(inner, 1, b.read(s), lambda e: self.load(q, bc + [i, e]))
                accumulate(inner, 2, b.read(p_ir), lambda e: self.load(dout, bc + [i, e]))
            body.append(self.loop("i", self.idx(0), self.idx(L), self.idx(1), key_grads))
        rows = math.prod(batch) * L
        return [self.loop("row", self.thread_id(), self.idx(rows), self.grid_stride(), row)], \
            ceil_div(rows, BLOCK)

    def index_add(self) -> tuple[list, int]:
        """``index_add``, a thread per output element: the input's element, then each
        source element whose index names this position along the axis added in index order
        (``np.add.at``'s order: the sums are the reference's, rounded as it rounds)."""
        node = self.k.nodes[0]
        b = self.b
        x, idx, src = node.inputs
        axis = node.attrs["axis"]
        out = node.output
        dt = out.type.dtype
        if dt is dtypes.bool_:
            raise Unsupported("index_add on bool runs its numpy reference")
        reg = lowering.register_dtype(dt)
        shape = out.type.shape
        size = shape[axis]
        n = math.prod(shape)

        def element(n, body):
            coords = indexing.unravel(b, n, shape, bounded=True)
            at = lowering.convert(b, coords[axis], INDEX, dtypes.int64)
            acc = self._declare(body, "acc", reg, self.load(x, coords))

            def term(f, inner):
                icoords = indexing.unravel(b, f, idx.type.shape, bounded=True)
                i = lowering.convert(b, self.load(idx, icoords), idx.type.dtype, dtypes.int64)
                i = b.select(b.cmp("lt", i, b.const(dtypes.int64, 0), dtypes.int64),
                             b.add(i, b.const(dtypes.int64, size)), i, dtypes.int64)
                value = self.load(src, coords[:axis] + icoords + coords[axis + 1:])
                added = lowering.round_half(b, lowering.combine(b, "sum", b.read(acc), value, dt),
                                            dt)
                inner.append(Assign(acc, b.select(b.cmp("eq", i, at, dtypes.int64), added,
                                                  b.read(acc), reg)))
            body.append(self.loop("f", self.idx(0), self.idx(math.prod(idx.type.shape)),
                                  self.idx(1), term))
            body.append(Store(self.param(out), self._at(out, coords),
                              lowering.to_memory(b, b.read(acc), dt)))
        return [self.loop("i", self.thread_id(), self.idx(n), self.grid_stride(), element)], \
            ceil_div(n, BLOCK)


def _shared_used(body: list) -> set[int]:
    """The ids of the shared arrays ``body`` reads or writes."""
    used: set[int] = set()
    seen: set[int] = set()

    def visit(x) -> None:
        if id(x) in seen:
            return
        seen.add(id(x))
        if isinstance(x, Shared):
            used.add(id(x))
        elif isinstance(x, (list, tuple)):
            for y in x:
                visit(y)
        elif hasattr(x, "__dataclass_fields__") and not isinstance(x, (Param, Var)):
            for name in x.__dataclass_fields__:
                visit(getattr(x, name))
    visit(body)
    return used


def _vars_read(body: list) -> set[int]:
    """The ids of the variables ``body``'s expressions read."""
    read: set[int] = set()
    seen: set[int] = set()

    def visit(x) -> None:
        if id(x) in seen:
            return
        seen.add(id(x))
        if isinstance(x, Expr):
            if x.op == "read":
                read.add(id(x.arg))
            for y in x.src:
                visit(y)
        elif isinstance(x, (list, tuple)):
            for y in x:
                visit(y)
        elif hasattr(x, "__dataclass_fields__") and not isinstance(x, (Param, Var, Shared)):
            for name in x.__dataclass_fields__:
                visit(getattr(x, name))
    visit(body)
    return read


def _without_unread(body: list, read: set[int]) -> list:
    """``body`` without the declarations of and assignments to variables nothing reads (a
    reduction whose result only feeds an output that was not kept): nvcc warns of them."""
    out = []
    for st in body:
        if isinstance(st, (Declare, Assign)) and id(st.var) not in read:
            continue
        if isinstance(st, (Loop, If)):
            st.body = _without_unread(st.body, read)
        out.append(st)
    return out


def lower_kernel(kernel: Kernel, kg: KernelGraph) -> LoweredKernel:
    """``kernel`` as a :class:`LoweredKernel` of its family (:func:`kernel_family`); raises
    :class:`Unsupported` for a kernel (or a primitive or dtype in it) with no GPU lowering."""
    family = kernel_family(kernel)
    low = _Lowering(kernel, kg)
    if family == "matmul":
        block = TILE * TILE
    else:
        block = BLOCK
    body, blocks = getattr(low, family)()
    sizes = [v.type.numel for v in low.params] + [math.prod(kernel.shape), blocks * block]
    # Symbolic sizes are read at run time (the prologue reads them from the sizes buffer;
    # a kernel of static sizes has none).
    body = low.prologue() + body
    limits: tuple = ()
    if any(is_symbolic(n) for n in sizes):
        # 32-bit indices where the sizes traced at fit, as torch's guard on 32-bit indexing:
        # a call whose sizes do not (indices_fit) runs a program built for them. The extern
        # families' per-thread loops keep 64-bit ones: each holds many addresses live, and
        # the backward attention's over a symbolic length spills at 32 bits on sm_80 (the
        # 64 registers of its launch bounds), not at 64.
        try:
            fits = family not in EXTERN_FAMILIES.values() and \
                max(size_hint(n) for n in sizes) < INDEX32_LIMIT
        except SymbolicDecisionError:            # no hints (a graph read from text)
            fits = False
        bits = 32 if fits else 64
        limits = tuple(n for n in sizes if is_symbolic(n)) if fits else ()
    else:
        bits = 32 if max(sizes) < INDEX32_LIMIT else 64
    if isinstance(blocks, SymInt):
        grid = low.grid_cap          # evaluated per launch: see launch_grid
    else:
        grid = max(1, min(blocks, MAX_GRID))    # a launch of no block is an error on a GPU
        blocks = None
    params = list(low.params.values())
    # A loop over an empty axis is gone with the shared arrays only it used (nvcc warns of
    # an unused __shared__ array).
    while True:
        read = _vars_read(body)
        pruned = _without_unread(body, read)
        if _vars_read(pruned) == read:
            break
        body = pruned
    body = pruned
    used = _shared_used(body)
    shared = [s for s in low.shared if id(s) in used]
    lowered = LoweredKernel(_name(kernel, family), params, shared, body, block, grid, family,
                            bits, blocks=blocks, index_limits=limits)
    if config.cuda_collect:
        collect.record(lowered, config.cuda_collect)
    return lowered


def launch_grid(lk: LoweredKernel, bindings: dict | None) -> int:
    """The blocks a launch of ``lk`` takes: its ``grid``, or for a kernel of symbolic sizes
    the blocks its work needs under ``bindings`` (symbol -> size), at most ``grid`` and at
    least 1 (a launch of no block is an error on a GPU)."""
    if lk.blocks is None:
        return lk.grid
    return max(1, min(evaluate_dim(lk.blocks, bindings), lk.grid))


def indices_fit(lk: LoweredKernel, bindings: dict) -> bool:
    """Whether ``lk``'s 32-bit indices hold at the sizes ``bindings`` (a kernel of symbolic
    sizes lowered with them: its buffers and loops stay under ``INDEX32_LIMIT``)."""
    return all(evaluate_dim(n, bindings) < INDEX32_LIMIT for n in lk.index_limits)
