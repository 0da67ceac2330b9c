"""float32 matrix products as one kernel-IR program, register-tiled for AVX-512.

``C[M, N] = A[M, K] @ B[K, N]`` is cut into panels of 32 columns (the parallel loop, one
panel per iteration), and each panel into tiles of 8 rows. A tile keeps its 8 x 32 sums in
16 vector registers of 16 floats and, for each k, loads two vectors of B's row k and
multiplies them by A[r, k] broadcast to all lanes, once per row (16 fused multiply-adds per
two loads and eight broadcasts): the loop over k touches memory only to read its operands,
and C is written once, at the end. The last panel (N not a multiple of 32) reads and writes
under lane masks; the last tile (M not a multiple of 8) computes its missing rows again from
its last row and does not store them.

B is read along its rows; when its columns are not contiguous (``x @ W.T``, the forward
product of ``nn.Linear``), each panel first copies its 32 columns into a K x 32 block of a
scratch buffer (:attr:`Gemm.pack_floats`, a block per panel, so that panels run on several
threads at once). A is read element by element with any strides (``xᵀ @ g`` for a weight's
gradient reads A down its columns).

The sizes, strides and offsets are read at run time from a parameter vector
(:meth:`Gemm.params`), so one compiled function serves every product of every program: it
is compiled once per machine (then loaded from the kernel cache), where code specialized to
each product's shape cost 20-25 ms of LLVM time per distinct product and ran no faster.

There is no cache blocking over K: a panel's K x 32 block of B is reused from L1/L2 by
every tile and A is streamed from L2 once per panel, so :func:`fits` admits products whose A
is at most ``MAX_A_BYTES`` and whose K is at most ``MAX_K``; larger ones stay with numpy's
BLAS, whose blocking is made for them. On one core of an AVX-512 machine whose numpy BLAS
ran its AVX2 kernels, the products of the transformer training step in
``benchmarks/bench_training.py`` ran at 200-250 GFLOP/s against BLAS's 110-120 (512x64 @
64x256: 71 against 139 us).

Sums run in k order from 0, one fused multiply-add per term, as a dot product written
``sum(a[k] * b[k])`` with FMA: results differ from BLAS's (which splits K into blocks) in
the last bits.

The program (:func:`gemm_kernel`) is a :class:`fusegrad.codegen.kernel_ir.LoweredKernel`
with the CPU kernels' calling convention, its register tile written with the kernel IR's
vectors (accumulators as vector variables, broadcast loads of A, masked loads of B's rows,
fused multiply-adds on vectors, masked stores of C); :mod:`fusegrad.codegen.llvm.gemm`
prints it. Vectors of 16 lanes are one register on AVX-512; LLVM splits them into two on
AVX2.

bfloat16 products (``Gemm.dtype`` bf16: A, B and C in bf16, sums in float32, C rounded to
bf16 once, to nearest even, as torch's CPU bf16 GEMM) come in two variants of the program:

- ``bf16_pairs=False`` (any CPU): each panel of B is converted to float32 while it is
  packed (always packed), A's elements are converted as they are broadcast, and the float32
  tile loop runs unchanged: the same sums, in the same order, as the float32 GEMM on the
  operands widened to float32.
- ``bf16_pairs=True`` (CPUs with AVX512_BF16): B is packed in pairs of rows (row ``2q`` in
  the low half of each 32-bit word, ``2q + 1`` in the high half, zero past K), A's pairs are
  broadcast as words, and each term is one ``vdpbf16ps`` (16 lanes of two products each,
  added to the float32 sums): twice the terms of an FMA per instruction. Its sums add two
  products at a time (in the instruction's own rounding), so they differ from the
  converting variant's in the last bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fusegrad import dtypes
from fusegrad.codegen.kernel_ir import (
    INDEX,
    Assign,
    Declare,
    Expr,
    ExprBuilder,
    If,
    Loop,
    LoweredKernel,
    Param,
    Store,
    StoreLanes,
    Var,
)
from fusegrad.dtypes import DType
from fusegrad.ops.lowering import BITS16, from_memory, to_memory

__all__ = ["Gemm", "PARAMS", "fits", "gemm_kernel", "LANES", "TILE_ROWS", "PANEL", "MAX_K",
           "MAX_A_BYTES"]

LANES = 16                 # floats in a 512-bit vector
TILE_ROWS = 8              # rows of C per tile: 8 x 2 accumulators of 16 lanes
PANEL = 2 * LANES          # columns of C per panel (one parallel iteration)
MAX_K = 1024
MAX_A_BYTES = 1 << 20

F32, BF16, I64, U32 = dtypes.float32, dtypes.bfloat16, dtypes.int64, dtypes.uint32


@dataclass(frozen=True)
class Gemm:
    """``C[m, n] = A[m, k] @ B[k, n]`` in ``dtype`` (float32, or bfloat16 with float32
    sums): A and B are read at ``base + offset + i * strides[0] + j * strides[1]`` (in
    elements) of their buffers, C is its own contiguous buffer."""

    m: int
    n: int
    k: int
    a_strides: tuple[int, int]
    a_offset: int
    b_strides: tuple[int, int]
    b_offset: int
    dtype: DType = F32

    @property
    def packed(self) -> bool:
        """Whether B's panels are copied first (its columns are not contiguous, or it is
        converted: bf16 panels are always packed)."""
        return self.b_strides[1] != 1 or self.dtype is BF16

    @property
    def panels(self) -> int:
        """The length of the parallel loop: panels of 32 columns."""
        return -(-self.n // PANEL)

    @property
    def pack_floats(self) -> int:
        """The size of the scratch buffer B's panels are copied into, in 32-bit words (0:
        none); a bf16 panel takes at most K x 32 of them (converted, or pairs of rows)."""
        return self.panels * self.k * PANEL if self.packed else 0

    def params(self) -> np.ndarray:
        """The parameter vector the function reads (int64, in :data:`PARAMS` order)."""
        return np.array([self.m, self.n, self.k, *self.a_strides, self.a_offset,
                         *self.b_strides, self.b_offset, int(self.packed)], dtype=np.int64)


PARAMS = ("m", "n", "k", "a_rs", "a_cs", "a_off", "b_rs", "b_cs", "b_off", "packed")


def fits(g: Gemm) -> bool:
    """Whether the generated GEMM is made for ``g`` (see the module's docstring)."""
    if min(g.m, g.n, g.k) < 1 or g.k > MAX_K:
        return False
    return g.m * g.k * g.dtype.itemsize <= MAX_A_BYTES


class _Lanes:
    """The scalar builder of :mod:`fusegrad.ops.lowering`'s memory forms on vectors of
    ``lanes``: its constants are broadcast, every other operation is the vector's own."""

    def __init__(self, b: ExprBuilder, lanes: int):
        self.b, self.lanes = b, lanes

    def const(self, dt: DType, value) -> Expr:
        return self.b.broadcast(self.b.const(dt, value), self.lanes)

    def __getattr__(self, name: str):
        return getattr(self.b, name)


def gemm_kernel(name: str, dtype: DType = F32, bf16_pairs: bool = False) -> LoweredKernel:
    """The GEMM as ``name(bufs, start, end)``, computing panels ``[start, end)`` of a
    product: ``bufs`` holds the addresses of A's, B's and C's buffers, of the scratch buffer
    B is packed into (any, when B is not packed) and of the parameter vector
    (:meth:`Gemm.params`). ``dtype`` bfloat16 makes the bf16 program: converting to float32,
    or with ``bf16_pairs`` AVX512_BF16's pair products (see the module's docstring)."""
    b = ExprBuilder()
    mem = F32 if dtype is F32 else BITS16
    a_buf, b_buf = Param("a", mem), Param("b", mem)
    c_buf = Param("c", mem, writes=True)
    pack = Param("pack", U32 if bf16_pairs else F32, writes=True)
    params = Param("params", I64)
    # The parameters, loaded once (as variables, so that every loop reads the same register).
    sizes = {p: Var(p, INDEX) for p in PARAMS}
    body: list = [Declare(v, b.load(params, b.index(i))) for i, v in enumerate(sizes.values())]
    m, n, k, a_rs, a_cs, a_off, b_rs, b_cs, b_off, packed = (b.read(v) for v in sizes.values())

    p = Var("p", INDEX)
    j0 = b.mul(b.read(p), b.index(PANEL))
    left = b.sub(n, j0)
    width = b.select(b.cmp("lt", left, b.index(PANEL), I64), left, b.index(PANEL), INDEX)
    iota = b.iota(I64, LANES)
    masks = [Var(f"mask{v}", dtypes.bool_, LANES) for v in (0, 1)]
    panel: list = [Declare(masks[v], b.cmp("lt", iota, b.broadcast(b.sub(width, b.index(LANES * v)),
                                                                     LANES), I64))
                   for v in (0, 1)]
    mask_reads = [b.read(x) for x in masks]
    frame = (m, n, k, a_rs, a_cs, a_off, j0)
    jj, kk = Var("jj", INDEX), Var("kk", INDEX)
    block = b.mul(b.read(p), b.mul(k, b.index(PANEL)))

    def b_at(row: Expr, col: Expr) -> Expr:
        return b.add(b_off, b.add(b.mul(row, b_rs), b.mul(b.add(j0, col), b_cs)))

    if dtype is BF16 and bf16_pairs:
        panel += _pair_panel(b, a_buf, b_buf, c_buf, pack, block, width, mask_reads, frame, b_at)
        body.append(Loop(p, b.special("start"), b.special("end"), b.index(1), panel))
        return LoweredKernel(name, [a_buf, b_buf, c_buf, pack, params], [], body, block=1, grid=1,
                             family="gemm")
    if dtype is BF16:
        def load_a(at: Expr) -> Expr:
            return from_memory(b, b.load(a_buf, at), BF16)

        def load_b(at: Expr) -> Expr:
            return from_memory(b, b.load(b_buf, at), BF16)

        def stored(acc: Expr) -> Expr:
            return to_memory(_Lanes(b, LANES), acc, BF16)
    else:
        def load_a(at: Expr) -> Expr:
            return b.load(a_buf, at)

        def load_b(at: Expr) -> Expr:
            return b.load(b_buf, at)

        def stored(acc: Expr) -> Expr:
            return acc
    # B packed: its columns are copied (converted to float32) into the panel's K x 32 block
    # of the scratch buffer.
    copy = Loop(jj, b.index(0), width, b.index(1), [
        Loop(kk, b.index(0), k, b.index(1), [
            Store(pack, b.add(block, b.add(b.mul(b.read(kk), b.index(PANEL)), b.read(jj))),
                  load_b(b_at(b.read(kk), b.read(jj))))])])
    packed_tiles = _tiles(b, load_a, c_buf, stored, pack, block, b.index(PANEL), mask_reads, *frame)
    if dtype is BF16:
        panel += [copy] + packed_tiles
    else:
        # B not packed: the panel's rows are read in place.
        direct = _tiles(b, load_a, c_buf, stored, b_buf, b.add(b_off, j0), b_rs, mask_reads, *frame)
        is_packed = b.cmp("ne", packed, b.index(0), INDEX)
        panel += [If(is_packed, [copy] + packed_tiles),
                  If(b.cmp("eq", packed, b.index(0), INDEX), direct)]
    body.append(Loop(p, b.special("start"), b.special("end"), b.index(1), panel))
    return LoweredKernel(name, [a_buf, b_buf, c_buf, pack, params], [], body, block=1, grid=1,
                         family="gemm")


def _tile_rows(b: ExprBuilder, t: Var, m, a_off, a_rs) -> tuple:
    """A tile's first row, its rows (1 to 8), whether each of its 8 rows is inside, and the
    declarations of each row's offset in A (rows past the last read the last row)."""
    i0 = b.mul(b.read(t), b.index(TILE_ROWS))
    rows_left = b.sub(m, i0)
    rows = b.select(b.cmp("lt", rows_left, b.index(TILE_ROWS), I64), rows_left,
                    b.index(TILE_ROWS), INDEX)
    last = b.sub(rows, b.index(1))
    inside = [b.cmp("lt", b.index(r), rows, I64) for r in range(TILE_ROWS)]
    a_rows = [Var(f"a_row{r}", INDEX) for r in range(TILE_ROWS)]
    decls = [Declare(a_rows[r], b.add(a_off, b.mul(b.add(i0, b.select(
        inside[r], b.index(r), last, INDEX)), a_rs))) for r in range(TILE_ROWS)]
    return i0, inside, a_rows, decls


def _store_tile(b: ExprBuilder, c_buf: Param, stored, acc: list, i0, inside: list, masks: list,
                n, j0, m) -> list:
    """Store a tile's sums (``stored(acc)`` each) into C, and the loop over the tiles."""
    # A row past ``rows`` stores under an all-false mask: nothing, and no access.
    none = b.broadcast(b.const(dtypes.bool_, False), LANES)
    out = []
    for r in range(TILE_ROWS):
        row = b.add(b.mul(b.add(i0, b.index(r)), n), j0)
        out += [StoreLanes(c_buf, b.add(row, b.index(LANES * v)), stored(b.read(acc[r][v])),
                           b.select(inside[r], masks[v], none, dtypes.bool_)) for v in (0, 1)]
    return out


def _tiles(b: ExprBuilder, load_a, c_buf: Param, stored, src: Param, base: Expr, step: Expr,
           masks: list, m, n, k, a_rs, a_cs, a_off, j0) -> list:
    """The tiles of a panel: B's row ``kk`` at ``src[base + kk * step]``. Per tile, ``rows``
    (1 to 8) rows of C by up to 32 columns (the lanes in ``masks``): one accumulator per row
    and vector, summed over k. Rows past ``rows`` read the last row and are not stored."""
    t, kk = Var("t", INDEX), Var("kk", INDEX)
    i0, inside, a_rows, tile = _tile_rows(b, t, m, a_off, a_rs)
    acc = [[Var(f"acc{r}_{v}", F32, LANES) for v in (0, 1)] for r in range(TILE_ROWS)]
    zero = b.broadcast(b.const(F32, 0.0), LANES)
    tile += [Declare(x, zero) for row in acc for x in row]
    at = b.add(base, b.mul(b.read(kk), step))
    vectors = [b.load_lanes(src, b.add(at, b.index(LANES * v)), LANES, masks[v]) for v in (0, 1)]
    terms: list = []
    for r in range(TILE_ROWS):
        x = b.broadcast(load_a(b.add(b.read(a_rows[r]), b.mul(b.read(kk), a_cs))), LANES)
        terms += [Assign(acc[r][v], b.call("fma", (x, vectors[v], b.read(acc[r][v])), F32))
                  for v in (0, 1)]
    tile.append(Loop(kk, b.index(0), k, b.index(1), terms))
    tile += _store_tile(b, c_buf, stored, acc, i0, inside, masks, n, j0, m)
    count = b.div(b.add(m, b.index(TILE_ROWS - 1)), b.index(TILE_ROWS))
    return [Loop(t, b.index(0), count, b.index(1), tile)]


def _pair_panel(b: ExprBuilder, a_buf: Param, b_buf: Param, c_buf: Param, pack: Param,
                block: Expr, width: Expr, masks: list, frame: tuple, b_at) -> list:
    """A panel of the bf16 product with ``vdpbf16ps``: B's rows packed in pairs, then tiles
    whose terms each add two products per lane (see the module's docstring)."""
    m, n, k, a_rs, a_cs, a_off, j0 = frame
    jj, q = Var("jj", INDEX), Var("q", INDEX)
    pairs = b.div(k, b.index(2))            # full pairs; an odd K ends with a half pair
    odd = b.cmp("ne", b.rem(k, b.index(2)), b.index(0), INDEX)

    def word(lo: Expr, hi: Expr | None) -> Expr:
        lo = b.cast(lo, BITS16, U32)
        return lo if hi is None else b.binary("or", lo, b.binary(
            "shl", b.cast(hi, BITS16, U32), b.const(U32, 16), U32), U32)

    def b_word(row: Expr, last: bool) -> Expr:
        hi = None if last else b.load(b_buf, b_at(b.add(row, b.index(1)), b.read(jj)))
        return word(b.load(b_buf, b_at(row, b.read(jj))), hi)
    two_q = b.mul(b.read(q), b.index(2))
    slot = b.add(block, b.add(b.mul(b.read(q), b.index(PANEL)), b.read(jj)))
    tail_slot = b.add(block, b.add(b.mul(pairs, b.index(PANEL)), b.read(jj)))
    copy = Loop(jj, b.index(0), width, b.index(1), [
        Loop(q, b.index(0), pairs, b.index(1), [Store(pack, slot, b_word(two_q, False))]),
        If(odd, [Store(pack, tail_slot, b_word(b.sub(k, b.index(1)), True))])])

    t = Var("t", INDEX)
    i0, inside, a_rows, tile = _tile_rows(b, t, m, a_off, a_rs)
    acc = [[Var(f"acc{r}_{v}", F32, LANES) for v in (0, 1)] for r in range(TILE_ROWS)]
    zero = b.broadcast(b.const(F32, 0.0), LANES)
    tile += [Declare(x, zero) for row in acc for x in row]

    def terms(row: Expr, at: Expr, last: bool) -> list:
        vectors = [b.load_lanes(pack, b.add(at, b.index(LANES * v)), LANES, masks[v]) for v in (0, 1)]
        out = []
        for r in range(TILE_ROWS):
            a_at = b.add(b.read(a_rows[r]), b.mul(row, a_cs))
            hi = None if last else b.load(a_buf, b.add(a_at, a_cs))
            x = b.broadcast(word(b.load(a_buf, a_at), hi), LANES)
            out += [Assign(acc[r][v], b.call("dpbf16ps", (b.read(acc[r][v]), x, vectors[v]), F32))
                    for v in (0, 1)]
        return out
    at = b.add(block, b.mul(b.read(q), b.index(PANEL)))
    tile.append(Loop(q, b.index(0), pairs, b.index(1), terms(two_q, at, False)))
    tile.append(If(odd, terms(b.sub(k, b.index(1)), b.add(block, b.mul(pairs, b.index(PANEL))), True)))
    tile += _store_tile(b, c_buf, lambda acc: to_memory(_Lanes(b, LANES), acc, BF16), acc, i0,
                        inside, masks, n, j0, m)
    count = b.div(b.add(m, b.index(TILE_ROWS - 1)), b.index(TILE_ROWS))
    return [copy, Loop(t, b.index(0), count, b.index(1), tile)]
