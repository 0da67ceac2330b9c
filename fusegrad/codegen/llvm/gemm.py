"""float32 matrix products as one LLVM function, register-tiled for AVX-512.

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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LANES = 16                 # floats in a 512-bit vector
TILE_ROWS = 8              # rows of C per tile: 8 x 2 accumulators of 16 lanes
PANEL = 2 * LANES          # columns of C per panel (one parallel iteration)
MAX_K = 1024
MAX_A_BYTES = 1 << 20


@dataclass(frozen=True)
class Gemm:
    """``C[m, n] = A[m, k] @ B[k, n]`` in float32: A and B are read at
    ``base + offset + i * strides[0] + j * strides[1]`` (in elements) of their buffers, C is
    its own contiguous buffer."""

    m: int
    n: int
    k: int
    a_strides: tuple[int, int]
    a_offset: int
    b_strides: tuple[int, int]
    b_offset: int

    @property
    def packed(self) -> bool:
        """Whether B's panels are copied first (its columns are not contiguous)."""
        return self.b_strides[1] != 1

    @property
    def panels(self) -> int:
        """The length of the parallel loop: panels of 32 columns."""
        return -(-self.n // PANEL)

    @property
    def pack_floats(self) -> int:
        """The size of the scratch buffer B's panels are copied into (0: none)."""
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
    return g.m * g.k * 4 <= MAX_A_BYTES


def emit_gemm(name: str) -> str:
    """LLVM IR of ``void name(ptr bufs, i64 start, i64 end)``, computing panels
    ``[start, end)`` of a product: ``bufs`` holds the addresses of A's, B's and C's buffers,
    of the scratch buffer B is packed into (any, when B is not packed) and of the parameter
    vector."""
    params = "\n".join(
        f"  %{p}.ptr = getelementptr i64, ptr %params, i64 {i}\n  %{p} = load i64, ptr %{p}.ptr"
        for i, p in enumerate(PARAMS))
    lanes = ", ".join(f"i64 {i}" for i in range(LANES))
    return f"""\
declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)
declare <16 x float> @llvm.masked.load.v16f32.p0(ptr, i32, <16 x i1>, <16 x float>)
declare void @llvm.masked.store.v16f32.p0(<16 x float>, ptr, i32, <16 x i1>)

{_TILE.replace("@tile", f'@"{name}.tile"')}

define void @"{name}"(ptr noalias %bufs, i64 %start, i64 %end) {{
entry:
  %a.slot = getelementptr ptr, ptr %bufs, i64 0
  %a.base = load ptr, ptr %a.slot
  %b.slot = getelementptr ptr, ptr %bufs, i64 1
  %b.base = load ptr, ptr %b.slot
  %c.slot = getelementptr ptr, ptr %bufs, i64 2
  %c = load ptr, ptr %c.slot
  %pack.slot = getelementptr ptr, ptr %bufs, i64 3
  %pack.all = load ptr, ptr %pack.slot
  %params.slot = getelementptr ptr, ptr %bufs, i64 4
  %params = load ptr, ptr %params.slot
{params}
  %a = getelementptr float, ptr %a.base, i64 %a_off
  %b = getelementptr float, ptr %b.base, i64 %b_off
  %is.packed = icmp ne i64 %packed, 0
  %pack.size = mul i64 %k, {PANEL}
  %iota = add <16 x i64> zeroinitializer, <{lanes}>
  %empty = icmp sge i64 %start, %end
  br i1 %empty, label %done, label %panel
panel:
  %p = phi i64 [ %start, %entry ], [ %p.next, %panel.end ]
  %j0 = mul i64 %p, {PANEL}
  %left = sub i64 %n, %j0
  %wide = icmp slt i64 %left, {PANEL}
  %width = select i1 %wide, i64 %left, i64 {PANEL}
  %w0.one = insertelement <16 x i64> poison, i64 %width, i32 0
  %w0 = shufflevector <16 x i64> %w0.one, <16 x i64> poison, <16 x i32> zeroinitializer
  %mask0 = icmp slt <16 x i64> %iota, %w0
  %w1 = sub <16 x i64> %w0, <{", ".join(["i64 16"] * LANES)}>
  %mask1 = icmp slt <16 x i64> %iota, %w1
  %c.panel = getelementptr float, ptr %c, i64 %j0
  br i1 %is.packed, label %pack, label %direct
direct:
  %b.direct = getelementptr float, ptr %b, i64 %j0
  br label %tiles
pack:
  %pack.off = mul i64 %p, %pack.size
  %pack.panel = getelementptr float, ptr %pack.all, i64 %pack.off
  br label %pack.j
pack.j:
  %jj = phi i64 [ 0, %pack ], [ %jj.next, %pack.j.end ]
  %jj.abs = add i64 %j0, %jj
  %b.col = mul i64 %jj.abs, %b_cs
  br label %pack.k
pack.k:
  %kk = phi i64 [ 0, %pack.j ], [ %kk.next, %pack.k ]
  %src.row = mul i64 %kk, %b_rs
  %src.off = add i64 %src.row, %b.col
  %src = getelementptr float, ptr %b, i64 %src.off
  %x = load float, ptr %src, align 4
  %dst.row = mul i64 %kk, {PANEL}
  %dst.off = add i64 %dst.row, %jj
  %dst = getelementptr float, ptr %pack.panel, i64 %dst.off
  store float %x, ptr %dst, align 4
  %kk.next = add i64 %kk, 1
  %kk.more = icmp slt i64 %kk.next, %k
  br i1 %kk.more, label %pack.k, label %pack.j.end
pack.j.end:
  %jj.next = add i64 %jj, 1
  %jj.more = icmp slt i64 %jj.next, %width
  br i1 %jj.more, label %pack.j, label %tiles
tiles:
  %b.panel = phi ptr [ %b.direct, %direct ], [ %pack.panel, %pack.j.end ]
  %b.step = phi i64 [ %b_rs, %direct ], [ {PANEL}, %pack.j.end ]
  br label %tile
tile:
  %i0 = phi i64 [ 0, %tiles ], [ %i0.next, %tile ]
  %rows.left = sub i64 %m, %i0
  %short = icmp slt i64 %rows.left, {TILE_ROWS}
  %rows = select i1 %short, i64 %rows.left, i64 {TILE_ROWS}
  %a.row = mul i64 %i0, %a_rs
  %a.tile = getelementptr float, ptr %a, i64 %a.row
  %c.row = mul i64 %i0, %n
  %c.tile = getelementptr float, ptr %c.panel, i64 %c.row
  call void @"{name}.tile"(ptr %a.tile, i64 %a_rs, i64 %a_cs, ptr %b.panel, i64 %b.step,
                          ptr %c.tile, i64 %n, i64 %k, i64 %rows, <16 x i1> %mask0,
                          <16 x i1> %mask1)
  %i0.next = add i64 %i0, {TILE_ROWS}
  %i0.more = icmp slt i64 %i0.next, %m
  br i1 %i0.more, label %tile, label %panel.end
panel.end:
  %p.next = add i64 %p, 1
  %more = icmp slt i64 %p.next, %end
  br i1 %more, label %panel, label %done
done:
  ret void
}}
"""


def _tile_ir() -> str:
    """``rows`` (1 to 8) rows of C by up to 32 columns (the lanes in ``mask0``, ``mask1``):
    one accumulator per row and vector, summed over k. Rows past ``rows`` read the last row
    and are not stored."""
    lines = ["define internal void @tile(ptr noalias %a, i64 %a_rs, i64 %a_cs, ptr noalias %b, "
             "i64 %b_rs, ptr noalias %c, i64 %ldc, i64 %k, i64 %rows, <16 x i1> %mask0, "
             "<16 x i1> %mask1) {",
             "entry:",
             "  %last = sub i64 %rows, 1"]
    for r in range(TILE_ROWS):
        lines += [f"  %in{r} = icmp slt i64 {r}, %rows",
                  f"  %row{r} = select i1 %in{r}, i64 {r}, i64 %last",
                  f"  %a.off{r} = mul i64 %row{r}, %a_rs",
                  f"  %a{r}.row = getelementptr float, ptr %a, i64 %a.off{r}"]
    lines += ["  br label %loop", "loop:",
              "  %kk = phi i64 [ 0, %entry ], [ %kk.next, %loop ]"]
    for r in range(TILE_ROWS):
        for v in (0, 1):
            lines.append(f"  %acc{r}.{v} = phi <16 x float> [ zeroinitializer, %entry ], "
                         f"[ %sum{r}.{v}, %loop ]")
    lines += ["  %b.off = mul i64 %kk, %b_rs",
              "  %b.ptr0 = getelementptr float, ptr %b, i64 %b.off",
              f"  %b.ptr1 = getelementptr float, ptr %b.ptr0, i64 {LANES}"]
    for v in (0, 1):
        lines.append(f"  %b{v} = call <16 x float> @llvm.masked.load.v16f32.p0(ptr %b.ptr{v}, "
                     f"i32 4, <16 x i1> %mask{v}, <16 x float> zeroinitializer)")
    lines.append("  %a.col = mul i64 %kk, %a_cs")
    for r in range(TILE_ROWS):
        lines += [f"  %a.ptr{r} = getelementptr float, ptr %a{r}.row, i64 %a.col",
                  f"  %x{r} = load float, ptr %a.ptr{r}, align 4",
                  f"  %x{r}.one = insertelement <16 x float> poison, float %x{r}, i32 0",
                  f"  %x{r}.all = shufflevector <16 x float> %x{r}.one, <16 x float> poison, "
                  "<16 x i32> zeroinitializer"]
        for v in (0, 1):
            lines.append(f"  %sum{r}.{v} = call <16 x float> @llvm.fma.v16f32(<16 x float> "
                         f"%x{r}.all, <16 x float> %b{v}, <16 x float> %acc{r}.{v})")
    lines += ["  %kk.next = add i64 %kk, 1",
              "  %kk.more = icmp slt i64 %kk.next, %k",
              "  br i1 %kk.more, label %loop, label %store",
              "store:"]
    for r in range(TILE_ROWS):
        lines += [f"  %c.off{r} = mul i64 {r}, %ldc",
                  f"  %c{r}.0 = getelementptr float, ptr %c, i64 %c.off{r}",
                  f"  %c{r}.1 = getelementptr float, ptr %c{r}.0, i64 {LANES}"]
        for v in (0, 1):
            # A row past ``rows`` stores under an all-false mask: nothing, and no access.
            lines += [f"  %m{r}.{v} = select i1 %in{r}, <16 x i1> %mask{v}, "
                      "<16 x i1> zeroinitializer",
                      f"  call void @llvm.masked.store.v16f32.p0(<16 x float> %sum{r}.{v}, "
                      f"ptr %c{r}.{v}, i32 4, <16 x i1> %m{r}.{v})"]
    lines += ["  ret void", "}"]
    return "\n".join(lines)


_TILE = _tile_ir()
