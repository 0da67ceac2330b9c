"""Attention of small heads, forward and backward, as one native call over a range of heads.

A transformer step at small sizes (heads of 32 queries by 16 features) spends most of its
attention time around the math: numpy's ``matmul`` of stacked matrices calls BLAS once per
head, 64 calls per product, and between the products the scores, weights and their
gradients (each a (B, H, L, L) array) go through memory in five kernels. Here one LLVM
function does a head at a time:

- forward: per block of query rows, ``s = q @ k.T * scale`` (rows of scores in vector
  registers, K transposed into a stack tile), the mask, the softmax (its max, exp and sum
  as the softmax kernel computes them), stored beside the row's result in the packed
  output; then ``out = p @ v``;
- backward, from the packed weights: ``dp = dout @ v.T``, ``ds = p * (dp - sum(p * dp))``
  (softmax's VJP), masked entries zero, times ``scale``, into a stack tile; then
  ``dq = ds @ k``, ``dk = ds.T @ q`` and ``dv = p.T @ dout``.

Each product is a register-blocked sum (a GEMM micro-kernel: a few output rows side by side,
one row of the right operand and a broadcast scalar of the left per term). The formulas are
those of the primitives the fusion replaces (``fusegrad.passes.attention``), in another
order of summation, so results agree with them to rounding. Shapes are constants of the
generated code (one function per head shape, dtype and mask kind, compiled once and cached
like kernels); Q, K, V, the mask and the output gradient may have any strides in the head
dimensions, with contiguous rows (others are copied for the call). Other arrays, and heads
larger than ``MAX_KEYS`` x ``MAX_FEATURES``, are not taken (the calls return False and the
caller runs the numpy reference).
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
from llvmlite import ir

from fusegrad.codegen.attention_limits import MAX_FEATURES, MAX_KEYS, supported
from fusegrad.codegen.llvm.mathlib import emit_unary
from fusegrad.runtime.native import data_pointer

__all__ = ["attention_forward", "attention_backward", "supported", "MAX_KEYS", "MAX_FEATURES"]

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_LLVM_TYPES = {np.dtype(np.float32): (ir.FloatType(), "f32"),
               np.dtype(np.float64): (ir.DoubleType(), "f64")}
# fn(pointers, layout, scale, first head, end head)
_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_double, ctypes.c_int64,
                       ctypes.c_int64)
_PARALLEL_WORK = 1 << 18       # multiply-adds below which one thread runs all heads


class _Emit:
    """Builder helpers for one function: vectors of S (a row of scores) and E (a row of
    features) elements, loops with carried values."""

    def __init__(self, module: ir.Module, b: ir.IRBuilder, t: ir.Type, suffix: str, S: int,
                 E: int):
        self.m, self.b, self.t, self.suffix = module, b, t, suffix
        self.S, self.E = S, E
        self.vs = ir.VectorType(t, S)

    def const(self, v: int) -> ir.Constant:
        return ir.Constant(I64, v)

    def splat(self, x: ir.Value, n: int) -> ir.Value:
        vt = ir.VectorType(x.type, n)
        v = self.b.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(I32, 0))
        return self.b.shuffle_vector(v, ir.Constant(vt, ir.Undefined),
                                     ir.Constant(ir.VectorType(I32, n), [0] * n))

    def zeros(self, n: int) -> ir.Constant:
        return ir.Constant(ir.VectorType(self.t, n), [ir.Constant(self.t, 0.0)] * n)

    def fma(self, a: ir.Value, x: ir.Value, acc: ir.Value) -> ir.Value:
        """``acc + a * x``, contracted into one fused multiply-add where the CPU has one."""
        return self.b.fadd(acc, self.b.fmul(a, x, flags=("contract",)), flags=("contract",))

    def vec_at(self, base: ir.Value, offset: ir.Value, n: int) -> ir.Value:
        """Pointer to the vector of ``n`` elements at ``base[offset]``."""
        p = self.b.gep(base, [offset], inbounds=True)
        return self.b.bitcast(p, ir.PointerType(ir.VectorType(self.t, n)))

    def load_vec(self, base, offset, n: int) -> ir.Value:
        return self.b.load(self.vec_at(base, offset, n), align=_align(self.t))

    def store_vec(self, value, base, offset, n: int) -> None:
        self.b.store(value, self.vec_at(base, offset, n), align=_align(self.t))

    def scalar(self, base, offset) -> ir.Value:
        return self.b.load(self.b.gep(base, [offset], inbounds=True))

    def reduce(self, kind: str, v: ir.Value) -> ir.Value:
        n = v.type.count
        name = f"llvm.vector.reduce.{kind}.v{n}{self.suffix}"
        if kind == "fadd":
            fn = self.m.globals.get(name) or ir.Function(
                self.m, ir.FunctionType(self.t, [self.t, v.type]), name=name)
            return self.b.call(fn, [ir.Constant(self.t, -0.0), v], fastmath=("reassoc",))
        fn = self.m.globals.get(name) or ir.Function(self.m, ir.FunctionType(self.t, [v.type]),
                                                     name=name)
        return self.b.call(fn, [v])

    def loop(self, n: int | ir.Value, carried: list, body, start: ir.Value | None = None):
        """``for i in range(start or 0, n)`` (at least one trip) with values carried from
        one trip to the next; ``body(i, carried) -> carried``. Returns the final values."""
        b = self.b
        pre = b.block
        header = b.append_basic_block("loop")
        done = b.append_basic_block("loop.end")
        b.branch(header)
        b.position_at_end(header)
        i = b.phi(I64)
        i.add_incoming(start if start is not None else self.const(0), pre)
        phis = []
        for c in carried:
            p = b.phi(c.type)
            p.add_incoming(c, pre)
            phis.append(p)
        new = body(i, phis)
        end = b.block
        nxt = b.add(i, self.const(1))
        i.add_incoming(nxt, end)
        for p, v in zip(phis, new):
            p.add_incoming(v, end)
        limit = self.const(n) if isinstance(n, int) else n
        b.cbranch(b.icmp_signed("<", nxt, limit), header, done)
        b.position_at_end(done)
        return new

    def loop_range(self, start: ir.Value, end: ir.Value, carried: list, body):
        """``for i in range(start, end)``, which may be empty (``carried`` come back as
        given); ``body(i, carried) -> carried``."""
        b = self.b
        pre = b.block
        enter, after = b.append_basic_block("range"), b.append_basic_block("range.end")
        b.cbranch(b.icmp_signed("<", start, end), enter, after)
        b.position_at_end(enter)
        new = self.loop(end, carried, body, start=start)
        last = b.block
        b.branch(after)
        b.position_at_end(after)
        out = []
        for c, n in zip(carried, new):
            p = b.phi(c.type)
            p.add_incoming(c, pre)
            p.add_incoming(n, last)
            out.append(p)
        return out

    def reduce_int(self, kind: str, v: ir.Value) -> ir.Value:
        """``umax`` or ``add`` of the lanes of an i32 vector."""
        name = f"llvm.vector.reduce.{kind}.v{v.type.count}i32"
        fn = self.m.globals.get(name) or ir.Function(self.m, ir.FunctionType(I32, [v.type]),
                                                     name=name)
        return self.b.call(fn, [v])


def _align(t: ir.Type) -> int:
    return 8 if isinstance(t, ir.DoubleType) else 4


# layout: H, then (batch, head, row) strides in elements of q, k, v, the mask (bytes) and
# dout, then the number of heads; rows are contiguous. Pointers: q, k, v, mask, -, packed
# (forward) / q, k, v, mask, dout, packed, out (backward: out holds dq, dk, dv one after
# another, each contiguous).
_Q, _K, _V, _M, _DO = 0, 1, 2, 3, 4
_LAYOUT = 1 + 3 * 5


def _head_offsets(em: _Emit, layout, n: ir.Value, count: int) -> list[ir.Value]:
    """Element offsets of head ``n`` in the first ``count`` of q, k, v, mask and dout."""
    b = em.b
    H = b.load(b.gep(layout, [em.const(0)]))
    bi, hi = b.sdiv(n, H), b.srem(n, H)
    out = []
    for a in range(count):
        sb = b.load(b.gep(layout, [em.const(1 + 3 * a)]))
        sh = b.load(b.gep(layout, [em.const(2 + 3 * a)]))
        out.append(b.add(b.mul(bi, sb), b.mul(hi, sh)))
    return out


def _row_stride(em: _Emit, layout, a: int) -> ir.Value:
    return em.b.load(em.b.gep(layout, [em.const(3 + 3 * a)]))


def _transpose_tile(em: _Emit, tile, src, offset, row_stride, S: int, E: int) -> None:
    """``tile[e * S + j] = src[offset + j * row_stride + e]``: a head's K (or V) transposed,
    so a row of scores is a sum of E vectors of S lanes.

    When S and E are multiples of the vector width n, by n x n blocks: n row loads, log2(n)
    rounds of shuffles, n column stores (a scalar loop took 40% of the backward's time)."""
    b = em.b
    n = 8 if isinstance(em.t, ir.FloatType) else 4
    if S % n == 0 and E % n == 0:
        def blocks(blk, _):
            j0 = b.mul(b.udiv(blk, em.const(E // n)), em.const(n))
            e0 = b.mul(b.urem(blk, em.const(E // n)), em.const(n))
            base = b.add(offset, b.add(b.mul(j0, row_stride), e0))
            rows = [em.load_vec(src, b.add(base, b.mul(em.const(r), row_stride)), n)
                    for r in range(n)]
            for u, col in enumerate(_transposed(b, rows)):
                em.store_vec(col, tile, b.add(b.mul(b.add(e0, em.const(u)), em.const(S)), j0), n)
            return []
        em.loop((S // n) * (E // n), [], blocks)
        return

    def rows(j, _):
        base = b.add(offset, b.mul(j, row_stride))

        def cols(e, _):
            x = em.scalar(src, b.add(base, e))
            b.store(x, b.gep(tile, [b.add(b.mul(e, em.const(S)), j)], inbounds=True))
            return []
        em.loop(E, [], cols)
        return []
    em.loop(S, [], rows)


def _transposed(b: ir.IRBuilder, rows: list) -> list:
    """The columns of the n x n block whose rows are the n vectors ``rows`` (n a power of
    two): in each round of block size s, rows i and i + s (bit s of i clear) trade their
    second and first s-element halves of every 2s-element segment; after the rounds for s =
    n/2, ..., 1 the block is transposed."""
    n = len(rows)
    s = n // 2
    while s:
        low = [k for o in range(0, n, 2 * s) for k in [*range(o, o + s), *range(n + o, n + o + s)]]
        high = [k + s for k in low]
        for i in range(n):
            if not i & s:
                a, c = rows[i], rows[i + s]
                rows[i] = b.shuffle_vector(a, c, ir.Constant(ir.VectorType(I32, n), low))
                rows[i + s] = b.shuffle_vector(a, c, ir.Constant(ir.VectorType(I32, n), high))
        s //= 2
    return rows


def _scores(em: _Emit, q, q_rows: list, kt, scale, mask, m_rows: list, keep: bool):
    """The masked scores of a block of query rows (each a vector of S) and their masks
    (None: no mask). The rows' sums run side by side, so their latencies overlap."""
    b, S = em.b, em.S

    def terms(e, acc):
        ke = em.load_vec(kt, b.mul(e, em.const(S)), S)
        return [em.fma(em.splat(em.scalar(q, b.add(r, e)), S), ke, a)
                for r, a in zip(q_rows, acc)]
    sums = em.loop(em.E, [em.zeros(S)] * len(q_rows), terms)
    scale = em.splat(scale, S)
    scores = [b.fmul(x, scale) for x in sums]
    if mask is None:
        return scores, [None] * len(scores)
    inf = ir.Constant(em.vs, [ir.Constant(em.t, float("-inf"))] * S)
    zero = ir.Constant(ir.VectorType(I8, S), [0] * S)
    out, masks = [], []
    for x, m_row in zip(scores, m_rows):
        bits = b.load(b.bitcast(b.gep(mask, [m_row], inbounds=True),
                                ir.PointerType(ir.VectorType(I8, S))), align=1)
        masked = b.icmp_unsigned("==" if keep else "!=", bits, zero)
        out.append(b.select(masked, inf, x))
        masks.append(masked)
    return out, masks


def _softmax(em: _Emit, s: ir.Value, zero_dead: bool) -> ir.Value:
    """softmax of a row as the softmax kernel computes it: the max (NaN-propagating; a row
    that is all -inf is shifted by 0), exp, the sum, one division. A row that is all -inf
    gives zeros (``zero_dead``, attention's rule) or 0/0 (softmax's)."""
    b, S = em.b, em.S
    m = em.reduce("fmaximum", s)
    dead = b.fcmp_ordered("==", m, ir.Constant(em.t, float("-inf")))
    m = b.select(dead, ir.Constant(em.t, 0.0), m)
    e = emit_unary(b, "exp", b.fsub(s, em.splat(m, S)))
    total = em.reduce("fadd", e)
    if zero_dead:
        total = b.select(dead, ir.Constant(em.t, 1.0), total)
    return b.fdiv(e, em.splat(total, S))


def _row_blocks(em: _Emit, L: int, rows: int, block) -> None:
    """``block(first_row, R)`` over the L rows: blocks of ``rows``, then single rows."""
    b = em.b
    full = L // rows
    if full:
        em.loop(full, [], lambda i, _: block(b.mul(i, em.const(rows)), rows) or [])
    if L % rows:
        em.loop(L, [], lambda i, _: block(i, 1) or [], start=em.const(full * rows))


def _block_rows(t: ir.Type, width: int) -> int:
    """Rows per block for sums that are rows of ``width`` lanes: as many as fill 8 of AVX2's
    16 vector registers (the rest hold operands and temporaries; more rows spill), at most
    4."""
    lanes = 8 if isinstance(t, ir.FloatType) else 4
    return max(1, min(4, 8 // -(-width // lanes)))


def _function(module: ir.Module, name: str, t: ir.Type):
    ptr = ir.PointerType(t)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [
        ir.PointerType(ir.PointerType(I8)), ir.PointerType(I64), ir.DoubleType(), I64, I64]),
        name=name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ptrs, layout, scale, start, end = fn.args
    for a in fn.args[:2]:
        a.add_attribute("noalias")

    def pointer(k: int, ty=ptr):
        return b.bitcast(b.load(b.gep(ptrs, [ir.Constant(I64, k)])), ty)
    scale_t = scale if isinstance(t, ir.DoubleType) else b.fptrunc(scale, t)
    return fn, b, pointer, layout, scale_t, start, end


def _enter_heads(fn: ir.Function, b: ir.IRBuilder, start, end) -> ir.Block:
    """Skip to the returned exit block when the range of heads is empty."""
    body, exit_ = fn.append_basic_block("heads"), fn.append_basic_block("exit")
    b.cbranch(b.icmp_signed("<", start, end), body, exit_)
    b.position_at_end(body)
    return exit_


def _over_heads(em: _Emit, head, start, end, exit_: ir.Block) -> None:
    """``head(n, [])`` for each head in ``[start, end)``, then return."""
    em.loop(end, [], head, start=start)
    em.b.branch(exit_)
    em.b.position_at_end(exit_)
    em.b.ret_void()


def _broadcast_products(em: _Emit, count: int, n_terms: int, rows: int, left, right, store,
                        bounds=None):
    """``out[c] = sum over t of left(c, t) * right(t)`` for ``count`` output rows (vectors of
    E) in blocks of ``rows``: per term, one row of ``right`` and ``rows`` broadcast scalars
    of ``left``, the sums of a block side by side in registers (a GEMM's micro-kernel).
    ``left(c, t)`` gives a scalar, ``right(t)`` a vector, ``store(c, vector)`` keeps a row.

    ``bounds(c0, n)``, if given, narrows the terms of the block of rows ``c0 .. c0 + n - 1``
    to those whose ``left`` may be nonzero (see :func:`_Skips`): it returns ``(start, end,
    first, last)``, the sums run over ``start <= t < end`` from the vector ``first`` (None:
    zeros), and ``last`` (None: nothing) is added to each."""
    b, E = em.b, em.E

    def block(c0, n):
        cs = [b.add(c0, em.const(r)) for r in range(n)]

        def terms(t, acc):
            x = right(t)
            return [em.fma(em.splat(left(c, t), E), x, a) for c, a in zip(cs, acc)]
        if bounds is None:
            sums = em.loop(n_terms, [em.zeros(E)] * n, terms)
        else:
            start, end, first, last = bounds(c0, n)
            sums = em.loop_range(start, end, [em.zeros(E) if first is None else first] * n,
                                 terms)
            if last is not None:
                sums = [b.fadd(x, last) for x in sums]
        for c, total in zip(cs, sums):
            store(c, total)
    _row_blocks(em, count, rows, block)


class _Skips:
    """What lets the products of a masked head skip the terms whose weight is exactly 0.

    A causal mask zeroes half of every product's weights (``p`` and ``ds`` are 0 where the
    mask removes a score). Per row ``i`` of weights, ``ends[i]`` is one past its last key
    that may be nonzero; sums over keys (``p @ v``, ``ds @ k``) stop at the largest end of
    a block of rows, and sums over queries (``ds.T @ q``, ``p.T @ dout``) of keys ``j0 ..``
    start at the first row whose running maximum of ends passes ``j0``.

    Skipping must not change a bit: a skipped term adds 0 times a row of the other operand,
    which is +-0 for a finite row and NaN for an inf or a NaN. So per operand the sums of 0
    times its rows before (or from) each row are kept (+0, or NaN in the lanes that see a
    non-finite value) and start (or end) the shortened sum. A full sum from +0 never holds
    -0, so adding +0 leaves it as it was."""

    def __init__(self, em: _Emit, rows: int, name: str, columns: bool = False):
        """``columns``: the sums over queries skip too (the backward's), which need the
        running maximum of the ends (:meth:`finish_rows`, :meth:`first_row`)."""
        self.em, self.rows = em, rows
        self.ends = em.b.alloca(I32, size=rows, name=f"{name}.ends")
        self.reach = em.b.alloca(I32, size=rows, name=f"{name}.reach") if columns else None

    def set_end(self, i: ir.Value, masked: ir.Value, dead_end: ir.Value | None = None) -> None:
        """Row ``i``'s end from its mask vector (true where a score is removed); a row with
        no key left gets ``dead_end`` if given (its weights are 0/0, not 0), else 0."""
        em, b, S = self.em, self.em.b, self.em.S
        ones_to_s = ir.Constant(ir.VectorType(I32, S), list(range(1, S + 1)))
        end = em.reduce_int("umax", b.select(masked, ir.Constant(ir.VectorType(I32, S),
                                                                  [0] * S), ones_to_s))
        if dead_end is not None:
            end = b.select(b.icmp_unsigned("==", end, ir.Constant(I32, 0)), dead_end, end)
        b.store(end, b.gep(self.ends, [i], inbounds=True))

    def end_of_block(self, c0: ir.Value, n: int) -> ir.Value:
        b = self.em.b
        ends = [b.load(b.gep(self.ends, [b.add(c0, self.em.const(r))], inbounds=True))
                for r in range(n)]
        end = ends[0]
        for e in ends[1:]:
            end = b.select(b.icmp_unsigned(">", e, end), e, end)
        return b.zext(end, I64)

    def finish_rows(self) -> None:
        """The running maximum of the ends, once every row's end is set."""
        em, b = self.em, self.em.b

        def step(i, carried):
            e = b.load(b.gep(self.ends, [i], inbounds=True))
            m = b.select(b.icmp_unsigned(">", e, carried[0]), e, carried[0])
            b.store(m, b.gep(self.reach, [i], inbounds=True))
            return [m]
        em.loop(self.rows, [ir.Constant(I32, 0)], step)

    def first_row(self, j0: ir.Value) -> ir.Value:
        """The first row whose weights may be nonzero at a key ``>= j0``: how many rows reach
        no further than ``j0`` (the running maximum never decreases)."""
        em, b, n = self.em, self.em.b, self.rows
        vt = ir.VectorType(I32, n)
        reach = b.load(b.bitcast(self.reach, ir.PointerType(vt)), align=4)
        j = em.splat(b.trunc(j0, I32), n)
        return b.zext(em.reduce_int("add", b.zext(b.icmp_unsigned("<=", reach, j), vt)), I64)


def _zero_sums(em: _Emit, z, rows: int, src, offset, row_stride, from_end: bool) -> None:
    """``z`` (``rows + 1`` vectors of E) at ``t``: the sum of 0 times each row of ``src``
    before ``t`` (``from_end``: from ``t`` on)."""
    b, E = em.b, em.E
    em.store_vec(em.zeros(E), z, em.const(rows * E if from_end else 0), E)
    zero = em.zeros(E)

    def step(i, carried):
        r = b.sub(em.const(rows - 1), i) if from_end else i
        x = b.fadd(carried[0], b.fmul(zero, em.load_vec(src, b.add(offset, b.mul(r, row_stride)),
                                                        E)))
        em.store_vec(x, z, b.mul(r if from_end else b.add(r, em.const(1)), em.const(E)), E)
        return [x]
    em.loop(rows, [zero], step)


def _forward_ir(dtype: np.dtype, L: int, E: int, has_mask: bool, keep: bool,
                zero_dead: bool) -> tuple[str, str]:
    """Forward: row ``i`` of head ``n`` of the packed output holds ``out[i]`` (E values),
    then the weights ``p[i]`` (L values) that the backward reads."""
    t, suffix = _LLVM_TYPES[dtype]
    S, W = L, E + L
    name = f"fg_attention_fwd_{suffix}_{L}x{E}_{int(has_mask)}{int(keep)}{int(zero_dead)}"
    module = ir.Module(name=name)
    fn, b, pointer, layout, scale, start, end = _function(module, name, t)
    q, k, v, out = pointer(0), pointer(1), pointer(2), pointer(5)
    mask = pointer(3, ir.PointerType(I8)) if has_mask else None
    em = _Emit(module, b, t, suffix, S, E)
    R, RE = _block_rows(t, S), _block_rows(t, E)
    kt = b.alloca(t, size=S * E, name="kt")
    if has_mask:
        skips = _Skips(em, L, "p")
        zv = b.alloca(t, size=(S + 1) * E, name="zv")
    exit_ = _enter_heads(fn, b, start, end)
    strides = [_row_stride(em, layout, a) for a in range(4)]
    # a row with every score masked: softmax's 0/0 is NaN unless zero_dead
    dead_end = None if zero_dead else ir.Constant(I32, S)

    def head(n, _):
        off = _head_offsets(em, layout, n, 4)
        first = b.mul(n, em.const(L * W))              # the head's first packed row
        _transpose_tile(em, kt, k, off[_K], strides[_K], S, E)

        def rows_of(i0, rows):
            idx = [b.add(i0, em.const(r)) for r in range(rows)]
            s, masks = _scores(em, q, [b.add(off[_Q], b.mul(i, strides[_Q])) for i in idx], kt,
                               scale, mask, [b.add(off[_M], b.mul(i, strides[_M])) for i in idx],
                               keep)
            for i, x, m in zip(idx, s, masks):
                at = b.add(first, b.add(b.mul(i, em.const(W)), em.const(E)))
                em.store_vec(_softmax(em, x, zero_dead), out, at, S)
                if has_mask:
                    skips.set_end(i, m, dead_end)
        _row_blocks(em, L, R, rows_of)
        bounds = None
        if has_mask:
            _zero_sums(em, zv, S, v, off[_V], strides[_V], from_end=True)

            def bounds(i0, rows):
                end_ = skips.end_of_block(i0, rows)
                return em.const(0), end_, None, em.load_vec(zv, b.mul(end_, em.const(E)), E)
        # out = p @ v
        _broadcast_products(
            em, L, S, RE,
            lambda i, j: em.scalar(out, b.add(first, b.add(b.mul(i, em.const(W)),
                                                           b.add(j, em.const(E))))),
            lambda j: em.load_vec(v, b.add(off[_V], b.mul(j, strides[_V])), E),
            lambda i, x: em.store_vec(x, out, b.add(first, b.mul(i, em.const(W))), E), bounds)
        return []
    _over_heads(em, head, start, end, exit_)
    return str(module), name


def _backward_ir(dtype: np.dtype, L: int, E: int, has_mask: bool,
                 keep: bool) -> tuple[str, str]:
    """Backward from the weights the forward packed: ``dp = dout @ v.T``, ``ds = p * (dp -
    sum(p * dp))`` (masked entries 0) times the scale, then ``dq = ds @ k``, ``dk = ds.T @ q``
    and ``dv = p.T @ dout``."""
    t, suffix = _LLVM_TYPES[dtype]
    S, W = L, E + L
    name = f"fg_attention_bwd_{suffix}_{L}x{E}_{int(has_mask)}{int(keep)}"
    module = ir.Module(name=name)
    fn, b, pointer, layout, scale, start, end = _function(module, name, t)
    q, k, v, dout, packed, out = (pointer(0), pointer(1), pointer(2), pointer(4), pointer(5),
                                  pointer(6))
    mask = pointer(3, ir.PointerType(I8)) if has_mask else None
    em = _Emit(module, b, t, suffix, S, E)
    R, RE = _block_rows(t, S), _block_rows(t, E)
    vt = b.alloca(t, size=S * E, name="vt")
    dst = b.alloca(t, size=L * S, name="ds")        # the gradient of the head's scores
    if has_mask:
        # ds is 0 where the mask removes a score; p too, except in a row of NaN weights
        ds_skips, p_skips = _Skips(em, L, "ds", columns=True), _Skips(em, L, "p", columns=True)
        zk, zq, zdo = (b.alloca(t, size=(L + 1) * E, name=f"z{a}") for a in "kqo")
    exit_ = _enter_heads(fn, b, start, end)
    strides = [_row_stride(em, layout, a) for a in range(5)]
    heads = b.load(b.gep(layout, [em.const(_LAYOUT)]))      # all heads: where dk, dv start
    dk_out = b.gep(out, [b.mul(heads, em.const(L * E))])
    dv_out = b.gep(out, [b.mul(heads, em.const(2 * L * E))])
    zero8 = ir.Constant(ir.VectorType(I8, S), [0] * S)

    def head(n, _):
        off = _head_offsets(em, layout, n, 5)
        first = b.mul(n, em.const(L * W))

        def p_at(i):
            return b.add(first, b.add(b.mul(i, em.const(W)), em.const(E)))
        _transpose_tile(em, vt, v, off[_V], strides[_V], S, E)

        def rows_of(i0, rows):
            idx = [b.add(i0, em.const(r)) for r in range(rows)]
            do_rows = [b.add(off[_DO], b.mul(i, strides[_DO])) for i in idx]

            def terms(e, acc):
                ve = em.load_vec(vt, b.mul(e, em.const(S)), S)
                return [em.fma(em.splat(em.scalar(dout, b.add(r, e)), S), ve, a)
                        for r, a in zip(do_rows, acc)]
            dp = em.loop(E, [em.zeros(S)] * rows, terms)
            scale_s = em.splat(scale, S)
            for r, i in enumerate(idx):
                p = em.load_vec(packed, p_at(i), S)
                total = em.reduce("fadd", b.fmul(p, dp[r]))
                ds = b.fmul(p, b.fsub(dp[r], em.splat(total, S)))
                if mask is not None:
                    m_row = b.add(off[_M], b.mul(i, strides[_M]))
                    bits = b.load(b.bitcast(b.gep(mask, [m_row], inbounds=True),
                                            ir.PointerType(ir.VectorType(I8, S))), align=1)
                    masked = b.icmp_unsigned("==" if keep else "!=", bits, zero8)
                    ds = b.select(masked, em.zeros(S), ds)
                    ds_skips.set_end(i, masked)
                    p0 = b.extract_element(p, ir.Constant(I32, 0))
                    p_skips.set_end(i, b.select(b.fcmp_unordered("uno", p0, p0),
                                                ir.Constant(ir.VectorType(ir.IntType(1), S),
                                                            [0] * S), masked))
                em.store_vec(b.fmul(ds, scale_s), dst, b.mul(i, em.const(S)), S)
        _row_blocks(em, L, R, rows_of)

        def row_out(base, c, x):
            em.store_vec(x, base, b.mul(b.add(b.mul(n, em.const(L)), c), em.const(E)), E)

        def row_of(src, a, j):
            return em.load_vec(src, b.add(off[a], b.mul(j, strides[a])), E)

        def ds_at(i, j):
            return em.scalar(dst, b.add(b.mul(i, em.const(S)), j))
        dq_bounds = dk_bounds = dv_bounds = None
        if has_mask:
            ds_skips.finish_rows()
            p_skips.finish_rows()
            _zero_sums(em, zk, S, k, off[_K], strides[_K], from_end=True)
            _zero_sums(em, zq, L, q, off[_Q], strides[_Q], from_end=False)
            _zero_sums(em, zdo, L, dout, off[_DO], strides[_DO], from_end=False)

            def dq_bounds(i0, rows):
                end_ = ds_skips.end_of_block(i0, rows)
                return em.const(0), end_, None, em.load_vec(zk, b.mul(end_, em.const(E)), E)

            def from_first_row(skips, z):
                def bounds(j0, rows):
                    i0 = skips.first_row(j0)
                    return i0, em.const(L), em.load_vec(z, b.mul(i0, em.const(E)), E), None
                return bounds
            dk_bounds, dv_bounds = from_first_row(ds_skips, zq), from_first_row(p_skips, zdo)
        # dq = ds @ k, dk = ds.T @ q, dv = p.T @ dout
        _broadcast_products(em, L, S, RE, ds_at, lambda j: row_of(k, _K, j),
                            lambda i, x: row_out(out, i, x), dq_bounds)
        _broadcast_products(em, S, L, RE, lambda j, i: ds_at(i, j),
                            lambda i: row_of(q, _Q, i), lambda j, x: row_out(dk_out, j, x),
                            dk_bounds)
        _broadcast_products(em, S, L, RE,
                            lambda j, i: em.scalar(packed, b.add(p_at(i), j)),
                            lambda i: row_of(dout, _DO, i), lambda j, x: row_out(dv_out, j, x),
                            dv_bounds)
        return []
    _over_heads(em, head, start, end, exit_)
    return str(module), name


@functools.lru_cache(maxsize=None)
def _compiled(backward: bool, dtype: np.dtype, L: int, E: int, has_mask: bool, keep: bool,
              zero_dead: bool):
    from fusegrad.runtime.jit import compile_ir
    text, name = _module_ir(backward, dtype, L, E, has_mask, keep, zero_dead)
    module = compile_ir(text, [name])
    return module, _FN(module.address(name))


def _module_ir(backward: bool, dtype: np.dtype, L: int, E: int, has_mask: bool, keep: bool,
               zero_dead: bool) -> tuple[str, str]:
    if backward:
        return _backward_ir(dtype, L, E, has_mask, keep)
    return _forward_ir(dtype, L, E, has_mask, keep, zero_dead)


def modules_for(node) -> list[tuple[str, int]]:
    """The module (IR text, speed level) a program step of ``node`` (``fused_attention`` or
    its backward) calls when its arrays have the layouts the native code takes, for
    ahead-of-time artifacts to carry."""
    q = node.inputs[0].type
    dtype = np.dtype(q.dtype.np_dtype)
    if len(q.shape) < 2:
        return []
    L, E = q.shape[-2:]
    if not supported(dtype, L, L, E):
        return []
    backward = node.op == "fused_attention_backward"
    has_mask = len(node.inputs) > (5 if backward else 3)
    zero_dead = False if backward else bool(node.attrs.get("zero_dead", False))
    text, _ = _module_ir(backward, dtype, L, E, has_mask, bool(node.attrs["keep"]), zero_dead)
    return [(text, 3)]


def _heads(a: np.ndarray, batch: tuple) -> tuple[int, int, int] | None:
    """(batch stride, head stride, row stride) in elements of ``a`` of shape ``batch + (rows,
    cols)`` with contiguous rows, its batch dimensions seen as (B, H); None if they cannot
    be (more than two batch dimensions whose strides do not merge)."""
    item = a.itemsize
    if a.shape[-1] > 1 and a.strides[-1] != item:
        return None
    st = [s // item for s in a.strides[:-2]]
    dims = list(batch)
    while len(dims) > 2:        # merge the two outermost batch dimensions
        if dims[1] == 1:
            merged = st[0]
        elif dims[0] == 1 or st[0] == st[1] * dims[1]:
            merged = st[1]
        else:
            return None
        st = [merged] + st[2:]
        dims = [dims[0] * dims[1]] + dims[2:]
    st = [0] * (2 - len(st)) + st
    return st[0], st[1], a.strides[-2] // item


class _Call:
    """A prepared native call: the function, its pointer table and layout."""

    __slots__ = ("fn", "table", "layout", "layout_ptr", "heads", "work", "arrays", "reusable")

    def __init__(self, fn, pointers, layout, heads, work, arrays, reusable):
        self.fn, self.heads, self.work, self.reusable = fn, heads, work, reusable
        self.table = (ctypes.c_void_p * len(pointers))(*pointers)
        self.layout = layout
        self.layout_ptr = data_pointer(layout)
        self.arrays = arrays                # kept alive: the table points into them


def _key(arrays) -> tuple:
    return tuple((data_pointer(a), a.shape, a.strides, a.dtype.char) if a is not None else None
                 for a in arrays)


def _prepare(kind: str, arrays: list, out: np.ndarray, flags: tuple) -> _Call | None:
    """The call for ``arrays`` (q, k, v, mask or None, then dout and the packed forward
    output for the backward), or None when the native code does not take them."""
    q, k, v, mask = arrays[:4]
    more = arrays[4:]
    L, E = q.shape[-2:] if q.ndim >= 2 else (0, 0)
    if not (q.ndim >= 2 and q.shape == k.shape == v.shape and q.dtype == k.dtype == v.dtype and
            supported(q.dtype, L, L, E) and out.dtype == q.dtype and out.flags.c_contiguous and
            out.flags.writeable):
        return None
    batch = q.shape[:-2]
    heads = int(np.prod(batch, dtype=np.int64))
    strided = [q, k, v]
    if mask is not None:
        if mask.dtype != np.bool_:
            return None
        mask = np.broadcast_to(mask, batch + (L, L))

    strided.append(mask if mask is not None else np.zeros(batch + (L, L), np.bool_))
    packed = None
    if kind == "backward":
        dout, packed = more
        if dout.shape != q.shape or dout.dtype != q.dtype or packed.dtype != q.dtype or \
                packed.shape != batch + (L, E + L) or not packed.flags.c_contiguous:
            return None
        strided.append(dout)
        if out.shape != (3,) + q.shape:
            return None
    elif out.shape != batch + (L, E + L):
        return None
    copied = [a.shape[-1] > 1 and a.strides[-1] != a.itemsize for a in strided]
    strided = [np.ascontiguousarray(a) if c else a for a, c in zip(strided, copied)]
    layout = [batch[-1] if batch else 1]
    for a in strided:
        s = _heads(a, batch)
        if s is None:
            return None
        layout += s
    layout.append(heads)
    pointers = [data_pointer(a) for a in strided[:3]]
    pointers.append(data_pointer(strided[3]) if mask is not None else 0)
    if kind == "backward":
        pointers += [data_pointer(strided[4]), data_pointer(packed)]
        fn = _compiled(True, q.dtype, L, E, mask is not None, flags[0], False)[1]
        work = heads * L * L * E * 4
    else:
        pointers.append(0)
        fn = _compiled(False, q.dtype, L, E, mask is not None, *flags)[1]
        work = heads * L * L * E * 2
    pointers.append(data_pointer(out))
    # A call that reads a copy is made anew each time (the copy is of this call's values).
    return _Call(fn, pointers, np.array(layout, dtype=np.int64), heads, work,
                 (strided, packed, out), reusable=not any(copied))


def _call(kind: str, arrays: list, out: np.ndarray, scale: float, flags: tuple,
          memo: dict | None) -> bool:
    """Run the call; ``memo`` (the caller's, e.g. a program step's) keeps the last prepared
    call, reused while the arrays are the same buffers with the same layout."""
    key = (kind, _key(arrays), _key([out]), flags)
    call = memo.get(key) if memo is not None else None
    if call is None:
        call = _prepare(kind, arrays, out, flags)
        if call is None:
            return False
        if memo is not None and call.reusable:
            memo.clear()
            memo[key] = call
    from fusegrad.config import config
    threads, heads = config.num_threads, call.heads
    if threads > 1 and heads > 1 and call.work >= _PARALLEL_WORK:
        from fusegrad.runtime.cpu import run_in_parts  # cpu.py imports this module
        run_in_parts(call.fn, (call.table, call.layout_ptr, scale), heads, threads)
    else:
        call.fn(call.table, call.layout_ptr, scale, 0, heads)
    return True


def attention_forward(out: np.ndarray, q, k, v, mask, *, scale: float, keep: bool,
                      zero_dead: bool, memo: dict | None = None) -> bool:
    """``out[..., :E] = p @ v`` and ``out[..., E:] = p``, the weights ``softmax(q @ k.T *
    scale, masked)``, for (..., L, E) arrays of one shape and ``out`` of (..., L, E + L);
    ``mask`` (bool, broadcastable to (..., L, L), or None): where it is not ``keep`` the
    score is -inf. False, with nothing written, for calls the native code does not take."""
    return _call("forward", [q, k, v, mask], out, scale, (keep, zero_dead), memo)


def attention_backward(out: np.ndarray, q, k, v, dout, packed, mask, *, scale: float,
                       keep: bool, memo: dict | None = None) -> bool:
    """``out[0], out[1], out[2] = dq, dk, dv`` given the gradient ``dout`` of the attention's
    result and ``packed``, the forward's output (its weights). False, with nothing written,
    for calls the native code does not take."""
    return _call("backward", [q, k, v, mask, dout, packed], out, scale, (keep,), memo)
