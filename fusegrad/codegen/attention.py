"""Attention of small heads, forward and backward, as kernel-IR programs over a range of heads.

A transformer step at small sizes (heads of 32 queries by 16 features) spends most of its
attention time around the math: numpy's ``matmul`` of stacked matrices calls BLAS once per
head, 64 calls per product, and between the products the scores, weights and their
gradients (each a (B, H, L, L) array) go through memory in five kernels. Here one kernel
does a head at a time:

- forward: per block of query rows, ``s = q @ k.T * scale`` (rows of scores in vector
  registers, K transposed into a local tile), the mask, the softmax (its max, exp and sum
  as the softmax kernel computes them), stored beside the row's result in the packed
  output; then ``out = p @ v``;
- backward, from the packed weights: ``dp = dout @ v.T``, ``ds = p * (dp - sum(p * dp))``
  (softmax's VJP), masked entries zero, times ``scale``, into a local tile; then
  ``dq = ds @ k``, ``dk = ds.T @ q`` and ``dv = p.T @ dout``.

Each product is a register-blocked sum (a GEMM micro-kernel: a few output rows side by side,
one row of the right operand and a broadcast scalar of the left per term). The formulas are
those of the primitives the fusion replaces (``fusegrad.passes.attention``), in another
order of summation, so results agree with them to rounding. The number of features is a
constant of the program and the number of keys L (and of queries: self-attention) is read
at run time, so one kernel per feature count, dtype and mask kind serves every sequence
length up to :data:`MAX_KEYS` (a program of a symbolic sequence length builds nothing at a
new length): it holds a body per row width S of :func:`row_widths` for L = S, with the
sizes as constants, and one for the L between S/2 and S, whose rows have lanes past the
keys, and computes for every L the bits a kernel made for that L would (see
:func:`_bodies`). Q, K, V, the mask and the output gradient may have any strides in the
head dimensions, with contiguous rows.

A kernel has the CPU kernels' calling convention (``bufs``, then the range of heads
``[start, end)``); ``bufs`` holds, in :data:`BUFFERS` order, q, k, v, the mask (bytes; any
address when there is none), dout, the packed forward output, the backward's output (dq,
dk and dv of all heads one after another, each contiguous), the layout (int64: H, then the
(batch, head, row) strides in elements of q, k, v, the mask and, for the backward, dout (0
for the forward), the number of heads, then L) and the scale (one float64). For an L that
is not a row width, the mask's rows must hold the row width's bytes (the first L read).
:mod:`fusegrad.runtime.native_attention` compiles and calls them.
"""

from __future__ import annotations

import contextlib

import numpy as np

from fusegrad import dtypes
from fusegrad.codegen.kernel_ir import (
    INDEX,
    Assign,
    Declare,
    Expr,
    ExprBuilder,
    If,
    Local,
    Loop,
    LoweredKernel,
    Param,
    StoreLanes,
    StoreLocal,
    Var,
)
from fusegrad.dtypes import DType

__all__ = ["attention_forward_kernel", "attention_backward_kernel", "supported", "MAX_KEYS",
           "MAX_FEATURES", "MAX_TILE", "BUFFERS", "LAYOUT", "row_widths", "row_width"]

MAX_KEYS = 128          # a row of scores is one vector of S lanes: 16 AVX2 registers at most
MAX_FEATURES = 128
MAX_TILE = 8192         # S * E: a local tile of K or V transposed is at most 64 KiB

BUFFERS = ("q", "k", "v", "mask", "dout", "packed", "out", "layout", "scale")
_Q, _K, _V, _M, _DO = 0, 1, 2, 3, 4
LAYOUT = 1 + 3 * 5 + 2           # int64s in the layout vector
_SUFFIX = {dtypes.float32: "f32", dtypes.float64: "f64"}
U32 = dtypes.uint32


def supported(dtype, L: int, S: int, E: int) -> bool:
    """Whether heads of ``L`` queries, ``S`` keys and ``E`` features of ``dtype`` (a numpy
    dtype) run here."""
    return (np.dtype(dtype) in (np.float32, np.float64) and 1 <= L and 1 <= S <= MAX_KEYS and
            1 <= E <= MAX_FEATURES and S * E <= MAX_TILE)


class _Program:
    """Builds one kernel's statements in order, as a builder emits instructions: vectors of
    S (a row of scores) and E (a row of features) elements, loops with carried values."""

    def __init__(self, name: str, t: DType, E: int):
        self.b, self.t, self.E = ExprBuilder(), t, E
        # Set per body (:func:`_bodies`): the lanes of a row of scores, the number of keys
        # (and of queries: a constant when it is S), and, when fewer than S, the lanes that
        # hold keys (a bool vector) and the others.
        self.S = self.fewest = 0            # (fewest: the least number of keys)
        self.upto: int | None = None        # the one row width of a kernel for fewer keys
        self.keys: Expr | None = None
        self.valid: Expr | None = None
        self.invalid: Expr | None = None
        self.name = name
        self.params = {n: Param(n, dtypes.uint8 if n == "mask" else INDEX if n == "layout" else
                                dtypes.float64 if n == "scale" else t,
                                writes=n in ("packed", "out"))
                       for n in BUFFERS}
        self.bodies: list[list] = [[]]
        self.locals: list[Local] = []
        self.tiles: dict[int, dict] = {}
        self.count = 0

    def emit(self, st) -> None:
        self.bodies[-1].append(st)

    def fresh(self, base: str) -> str:
        self.count += 1
        return f"{base}{self.count}"

    def value(self, base: str, init: Expr) -> Expr:
        """``init`` computed here, into a variable (its value at this point)."""
        v = Var(self.fresh(base), init.dtype, init.lanes)
        self.emit(Declare(v, init))
        return self.b.read(v)

    def local(self, name: str, dt: DType, size: int) -> Local:
        loc = Local(name, dt, size)
        self.locals.append(loc)
        return loc

    def per_width(self, make) -> dict:
        """``make(S)``'s locals (a dict), made once per row width: the bodies of a width
        share them, sized for it (arrays sized for the widest rows placed a kernel's tiles
        apart in memory as a kernel made for one width does not, and cost the backward 5%
        at 64 keys)."""
        if self.S not in self.tiles:
            self.tiles[self.S] = make(self.S)
        return self.tiles[self.S]

    def const(self, v: int) -> Expr:
        return self.b.index(v)

    def splat(self, x: Expr, n: int) -> Expr:
        return self.b.broadcast(x, n)

    def zeros(self, n: int) -> Expr:
        return self.b.broadcast(self.b.const(self.t, 0.0), n)

    def fma(self, a: Expr, x: Expr, acc: Expr) -> Expr:
        """``acc + a * x``, one fused multiply-add where the CPU has one."""
        return self.b.call("muladd", (a, x, acc), self.t)

    def load_vec(self, src, offset: Expr, n: int) -> Expr:
        return self.b.load_lanes(src, offset, n)

    def store_vec(self, value: Expr, dst, offset: Expr) -> None:
        self.emit(StoreLanes(dst, offset, value))

    def load_row(self, src, offset: Expr) -> Expr:
        """A row of S lanes, of which those past the keys read 0 and touch no memory."""
        return self.b.load_lanes(src, offset, self.S, self.valid)

    def store_row(self, value: Expr, dst, offset: Expr) -> None:
        """The lanes of a row that hold keys."""
        self.emit(StoreLanes(dst, offset, value, self.valid))

    @property
    def partial(self) -> bool:
        """Whether the body's rows have lanes past the keys."""
        return self.valid is not None

    def keys_over(self, n: int) -> Expr:
        """``keys // n``."""
        return self.const(self.S // n) if not self.partial else self.b.div(self.keys, self.const(n))

    def scalar(self, src, offset: Expr) -> Expr:
        if isinstance(src, Local):
            return self.b.load_local(src, offset)
        return self.b.load(src, offset)

    @contextlib.contextmanager
    def block(self):
        self.bodies.append([])
        try:
            yield self.bodies[-1]
        finally:
            self.bodies.pop()

    def loop(self, n, carried: list, body, start: Expr | None = None) -> list:
        """``for i in range(start or 0, n)`` with values carried from one trip to the next;
        ``body(i, carried) -> carried``. Returns the final values (``carried`` as given when
        the range is empty)."""
        b = self.b
        slots = [Var(self.fresh("c"), c.dtype, c.lanes) for c in carried]
        for v, c in zip(slots, carried):
            self.emit(Declare(v, c))
        i = Var(self.fresh("i"), INDEX)
        with self.block() as stmts:
            new = body(b.read(i), [b.read(v) for v in slots])
            # Every new value is computed before any is assigned.
            fixed = [self.value("n", x) for x in new]
            for v, x in zip(slots, fixed):
                self.emit(Assign(v, x))
        stop = self.const(n) if isinstance(n, int) else n
        self.emit(Loop(i, start if start is not None else self.const(0), stop, self.const(1),
                       stmts, unroll=None))
        return [b.read(v) for v in slots]

    def kernel(self) -> LoweredKernel:
        return LoweredKernel(self.name, [self.params[n] for n in BUFFERS], [], self.bodies[0],
                             block=1, grid=1, family="attention", locals=self.locals)


def _vector_lanes(t: DType) -> int:
    return 8 if t is dtypes.float32 else 4


def _head_offsets(pr: _Program, lay: list, n: Expr, count: int) -> list[Expr]:
    """Element offsets of head ``n`` in the first ``count`` of q, k, v, mask and dout."""
    b = pr.b
    bi, hi = b.div(n, lay[0]), b.rem(n, lay[0])
    return [pr.value("off", b.add(b.mul(bi, lay[1 + 3 * a]), b.mul(hi, lay[2 + 3 * a])))
            for a in range(count)]


def _transpose_tile(pr: _Program, tile: Local, src: Param, offset, row_stride) -> None:
    """``tile[e * S + j] = src[offset + j * row_stride + e]`` for the keys ``j``: a head's K
    (or V) transposed, so a row of scores is a sum of E vectors of S lanes (the lanes past
    the keys are left as they were).

    When E is a multiple of the vector width n, by n x n blocks of whole groups of n keys:
    n row loads, log2(n) rounds of shuffles, n column stores (a scalar loop took 40% of the
    backward's time); the keys past the last whole group, and every key for other E, one
    element at a time."""
    b, S, E = pr.b, pr.S, pr.E
    n = _vector_lanes(pr.t)
    first_single = pr.const(0)
    if E % n == 0:
        def blocks(blk, _):
            j0 = b.mul(b.div(blk, pr.const(E // n)), pr.const(n))
            e0 = b.mul(b.rem(blk, pr.const(E // n)), pr.const(n))
            base = b.add(offset, b.add(b.mul(j0, row_stride), e0))
            rows = [pr.load_vec(src, b.add(base, b.mul(pr.const(r), row_stride)), n)
                    for r in range(n)]
            for u, col in enumerate(_transposed(b, rows)):
                pr.store_vec(col, tile, b.add(b.mul(b.add(e0, pr.const(u)), pr.const(S)), j0))
            return []
        groups = pr.keys_over(n)
        pr.loop(b.mul(groups, pr.const(E // n)), [], blocks)
        if not pr.partial:
            return
        first_single = pr.value("single", b.mul(groups, pr.const(n)))

    def rows(j, _):
        base = b.add(offset, b.mul(j, row_stride))

        def cols(e, _):
            x = pr.scalar(src, b.add(base, e))
            pr.emit(StoreLocal(tile, b.add(b.mul(e, pr.const(S)), j), x))
            return []
        pr.loop(E, [], cols)
        return []
    pr.loop(pr.keys, [], rows, start=first_single)


def _transposed(b: ExprBuilder, rows: list) -> list:
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
                rows[i] = b.shuffle(a, c, tuple(low))
                rows[i + s] = b.shuffle(a, c, tuple(high))
        s //= 2
    return rows


def _mask_row(pr: _Program, mask: Param, at: Expr, keep: bool) -> Expr:
    """The row of the mask at ``at`` as a bool vector: true where a score is removed (and in
    the lanes past the keys). A row is read S bytes wide even past the keys (the caller
    pads the rows): a load of bytes under a lane mask is one branch per lane on AVX2, and
    cost a kernel's build half a second."""
    b, S = pr.b, pr.S
    bits = pr.load_vec(mask, at, S)
    removed = b.cmp("eq" if keep else "ne", bits, pr.splat(b.const(dtypes.uint8, 0), S),
                    dtypes.uint8)
    return removed if not pr.partial else b.binary("or", removed, pr.invalid, dtypes.bool_)


def _scores(pr: _Program, q, q_rows: list, kt, scale, mask, m_rows: list, keep: bool):
    """The masked scores of a block of query rows (each a vector of S; -inf in the lanes past
    the keys) and their masks (None: no mask). The rows' sums run side by side, so their
    latencies overlap."""
    b, S = pr.b, pr.S

    def terms(e, acc):
        ke = pr.load_vec(kt, b.mul(e, pr.const(S)), S)
        return [pr.fma(pr.splat(pr.scalar(q, b.add(r, e)), S), ke, a)
                for r, a in zip(q_rows, acc)]
    sums = pr.loop(pr.E, [pr.zeros(S)] * len(q_rows), terms)
    scores = [b.binary("mul", x, pr.splat(scale, S), pr.t) for x in sums]
    inf = pr.splat(b.const(pr.t, float("-inf")), S)
    if mask is None:
        if pr.partial:
            scores = [b.select(pr.invalid, inf, x, pr.t) for x in scores]
        return scores, [None] * len(scores)
    out, masks = [], []
    for x, m_row in zip(scores, m_rows):
        masked = pr.value("masked", _mask_row(pr, mask, m_row, keep))
        out.append(b.select(masked, inf, x, pr.t))
        masks.append(masked)
    return out, masks


def _softmax(pr: _Program, s: Expr, zero_dead: bool) -> Expr:
    """softmax of a row as the softmax kernel computes it: the max (NaN-propagating; a row
    that is all -inf is shifted by 0), exp, the sum, one division. A row that is all -inf
    gives zeros (``zero_dead``, attention's rule) or 0/0 (softmax's)."""
    b, S, t = pr.b, pr.S, pr.t
    m = b.reduce("max", s)
    dead = b.cmp("eq", m, b.const(t, float("-inf")), t)
    m = b.select(dead, b.const(t, 0.0), m, t)
    e = b.unary("exp", b.binary("sub", s, pr.splat(m, S), t), t)
    total = b.reduce("add", e)
    if zero_dead:
        total = b.select(dead, b.const(t, 1.0), total, t)
    return b.binary("div", e, pr.splat(total, S), t)


def _row_blocks(pr: _Program, rows: int, block) -> None:
    """``block(first_row, R)`` over the rows (one per key): blocks of ``rows``, then single
    rows (in a body for fewer keys than S, where the rows may be no whole number of blocks,
    blocks only: one block's code builds in half the time of a block's and a row's)."""
    b = pr.b
    if not pr.partial:
        full = pr.S // rows
        if full:
            pr.loop(full, [], lambda i, _: block(b.mul(i, pr.const(rows)), rows) or [])
        if pr.S % rows:
            pr.loop(pr.S, [], lambda i, _: block(i, 1) or [], start=pr.const(full * rows))
        return
    if pr.fewest >= rows:
        # At least ``rows`` keys: the last block ends at the last row, overlapping the one
        # before it (its rows are computed twice, to the same bits: a row's sums do not
        # depend on the block it is in), so the rows are one loop of one block's code.
        last = pr.value("last", b.sub(pr.keys, pr.const(rows)))
        count = b.div(b.add(pr.keys, pr.const(rows - 1)), pr.const(rows))
        pr.loop(count, [], lambda i, _: block(
            b.binary("min", b.mul(i, pr.const(rows)), last, INDEX), rows) or [])
        return
    full = pr.keys_over(rows)
    pr.loop(full, [], lambda i, _: block(b.mul(i, pr.const(rows)), rows) or [])
    if rows > 1:
        pr.loop(pr.keys, [], lambda i, _: block(i, 1) or [], start=b.mul(full, pr.const(rows)))


def _block_rows(t: DType, width: int) -> int:
    """Rows per block for sums that are rows of ``width`` lanes: as many as fill 8 of AVX2's
    16 vector registers (the rest hold operands and temporaries; more rows spill), at most
    4."""
    return max(1, min(4, 8 // -(-width // _vector_lanes(t))))


def _broadcast_products(pr: _Program, rows: int, left, right, store, bounds=None) -> None:
    """``out[c] = sum over t of left(c, t) * right(t)`` for an output row per key (vectors of
    E), ``t`` over the keys too, in blocks of ``rows``: per term, one row of ``right`` and
    ``rows`` broadcast scalars of ``left``, the sums of a block side by side in registers (a
    GEMM's micro-kernel). ``left(c, t)`` gives a scalar, ``right(t)`` a vector, ``store(c,
    vector)`` keeps a row.

    ``bounds(c0, n)``, if given, narrows the terms of the block of rows ``c0 .. c0 + n - 1``
    to those whose ``left`` may be nonzero (see :class:`_Skips`): it returns ``(start, end,
    first, last)``, the sums run over ``start <= t < end`` from the vector ``first`` (None:
    zeros), and ``last`` (None: nothing) is added to each."""
    b, E = pr.b, pr.E

    def block(c0, n):
        c0 = pr.value("c", c0)
        cs = [b.add(c0, pr.const(r)) for r in range(n)]

        def terms(t, acc):
            x = right(t)
            return [pr.fma(pr.splat(left(c, t), E), x, a) for c, a in zip(cs, acc)]
        if bounds is None:
            sums = pr.loop(pr.keys, [pr.zeros(E)] * n, terms)
        else:
            start, end, first, last = bounds(c0, n)
            sums = pr.loop(end, [pr.zeros(E) if first is None else first] * n, terms, start)
            if last is not None:
                sums = [b.binary("add", x, last, pr.t) for x in sums]
        for c, total in zip(cs, sums):
            store(c, total)
    _row_blocks(pr, rows, block)


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

    def __init__(self, pr: _Program, size: int, name: str, columns: bool = False):
        """``size``: the most rows; ``columns``: the sums over queries skip too
        (the backward's), which need the running maximum of the ends (:meth:`finish_rows`,
        :meth:`first_row`)."""
        self.pr = pr
        self.ends = pr.local(f"{name}_ends", U32, size)
        self.reach = pr.local(f"{name}_reach", U32, size) if columns else None

    def set_end(self, i: Expr, masked: Expr, dead_end: Expr | None = None) -> None:
        """Row ``i``'s end from its mask vector (true where a score is removed, and in the
        lanes past the keys); a row with
        no key left gets ``dead_end`` if given (its weights are 0/0, not 0), else 0."""
        pr, b, S = self.pr, self.pr.b, self.pr.S
        ones_to_s = b.binary("add", b.iota(U32, S), pr.splat(b.const(U32, 1), S), U32)
        end = b.reduce("max", b.select(masked, pr.splat(b.const(U32, 0), S), ones_to_s, U32))
        if dead_end is not None:
            end = b.select(b.cmp("eq", end, b.const(U32, 0), U32), dead_end, end, U32)
        pr.emit(StoreLocal(self.ends, i, end))

    def end_of_block(self, c0: Expr, n: int) -> Expr:
        pr, b = self.pr, self.pr.b
        ends = [pr.scalar(self.ends, b.add(c0, pr.const(r))) for r in range(n)]
        end = ends[0]
        for e in ends[1:]:
            end = b.select(b.cmp("gt", e, end, U32), e, end, U32)
        return pr.value("end", b.cast(end, U32, INDEX))

    def finish_rows(self) -> None:
        """The running maximum of the ends, once every row's end is set."""
        pr, b = self.pr, self.pr.b

        def step(i, carried):
            e = pr.scalar(self.ends, i)
            m = pr.value("m", b.select(b.cmp("gt", e, carried[0], U32), e, carried[0], U32))
            pr.emit(StoreLocal(self.reach, i, m))
            return [m]
        pr.loop(pr.keys, [b.const(U32, 0)], step)

    def first_row(self, j0: Expr) -> Expr:
        """The first row whose weights may be nonzero at a key ``>= j0``: how many rows reach
        no further than ``j0`` (the running maximum never decreases)."""
        pr, b, n = self.pr, self.pr.b, self.pr.S
        reach = pr.load_vec(self.reach, pr.const(0), n)
        j = pr.splat(b.cast(j0, INDEX, U32), n)
        below = b.cmp("le", reach, j, U32)
        if pr.partial:
            below = b.binary("and", below, pr.valid, dtypes.bool_)
        below = b.select(below, pr.splat(b.const(U32, 1), n), pr.splat(b.const(U32, 0), n), U32)
        return pr.value("first", b.cast(b.reduce("add", below), U32, INDEX))


def _zero_sums(pr: _Program, z: Local, src: Param, offset, row_stride, from_end: bool) -> None:
    """``z`` (a vector of E per key, and one more) at ``t``: the sum of 0 times each row of
    ``src`` before ``t`` (``from_end``: from ``t`` on)."""
    b, E, t, rows = pr.b, pr.E, pr.t, pr.keys
    pr.store_vec(pr.zeros(E), z, b.mul(rows, pr.const(E)) if from_end else pr.const(0))
    zero = pr.zeros(E)

    def step(i, carried):
        r = b.sub(b.sub(rows, pr.const(1)), i) if from_end else i
        row = pr.load_vec(src, b.add(offset, b.mul(r, row_stride)), E)
        x = pr.value("z", b.binary("add", carried[0], b.binary("mul", zero, row, t), t))
        pr.store_vec(x, z, b.mul(r if from_end else b.add(r, pr.const(1)), pr.const(E)))
        return [x]
    pr.loop(rows, [zero], step)


def _prologue(pr: _Program, count: int) -> tuple[list, list, Expr]:
    """The layout, read once (head sizes and strides), and the scale in the kernel's type."""
    b = pr.b
    lay = [pr.value("lay", b.load(pr.params["layout"], pr.const(i))) for i in range(1 + 3 * count)]
    strides = [lay[3 + 3 * a] for a in range(count)]
    scale = b.cast(b.load(pr.params["scale"], pr.const(0)), dtypes.float64, pr.t)
    return lay, strides, pr.value("scale", scale)


def row_widths(t: DType, E: int) -> list[int]:
    """The lane counts S of a kernel's bodies for heads of E features: the vector width n,
    2n, 4n, ... up to the first that holds the most keys such heads take
    (:func:`supported`). A head of L keys runs the body of the least S >= L: with S = L its
    sizes are constants (the code of a kernel made for L alone); with fewer keys its rows
    have lanes past them (see :func:`_bodies`)."""
    most = min(MAX_KEYS, MAX_TILE // E)
    widths = [_vector_lanes(t)]
    while widths[-1] < most:
        widths.append(2 * widths[-1])
    return widths


def row_width(t: DType, L: int, E: int) -> int:
    """The row width of the body that runs heads of ``L`` keys."""
    return next(w for w in row_widths(t, E) if w >= L)


def _bodies(pr: _Program, head) -> None:
    """The kernel's statements for every number of keys: per S of :func:`row_widths`, a
    body for L = S (constant sizes) and one for S/2 < L < S (the least S: L < S), each
    ``head(n)`` over the call's heads; the call's L (the last int64 of the layout) picks
    one. In a body for fewer keys than S, the rows of scores and weights are vectors of S
    lanes whose lanes past the keys are never loaded from memory nor stored; the scores
    there are -inf (their exps 0) and the backward's products of a row -0, the identities
    of a max and a sum. So a row's max is that of its keys, and its sum adds the same terms
    (the order of a sum of lanes is the backend's: LLVM sums the halves of a vector of 2^k
    lanes, k times; for other lengths, as a kernel made for L had them, it sums in another
    order, so such an L may differ from that kernel in the last bit)."""
    b = pr.b
    keys = pr.value("keys", b.load(pr.params["layout"], pr.const(LAYOUT - 1)))
    low = 0
    for S in row_widths(pr.t, pr.E) if pr.upto is None else [pr.upto]:
        for partial in (True, False):
            if partial and S - low <= 1:
                continue
            pr.S, pr.fewest = S, low + 1 if partial else S
            with pr.block() as body:
                if partial:
                    pr.keys = keys
                    lanes = b.iota(INDEX, S)
                    pr.valid = pr.value("valid", b.cmp("lt", lanes, pr.splat(keys, S), INDEX))
                    pr.invalid = pr.value("invalid", b.cmp("ge", lanes, pr.splat(keys, S), INDEX))
                else:
                    pr.keys, pr.valid, pr.invalid = pr.const(S), None, None
                _over_heads(pr, head)
            # low < keys < S (unsigned: keys - low - 1 wraps for keys <= low), or keys == S
            cond = b.cmp("lt", b.sub(keys, pr.const(low + 1)), pr.const(S - low - 1), INDEX) \
                if partial else b.cmp("eq", keys, pr.const(S), INDEX)
            pr.emit(If(cond, body))
        low = S
    pr.S, pr.keys, pr.valid, pr.invalid = 0, None, None, None


def _over_heads(pr: _Program, head) -> None:
    """``head(n)`` for each head in ``[start, end)``."""
    pr.loop(pr.b.special("end"), [], lambda n, _: head(n) or [], start=pr.b.special("start"))


def _name(direction: str, t: DType, E: int, flags: tuple, upto: int | None) -> str:
    return (f"fg_attention_{direction}_{_SUFFIX[t]}_e{E}_{''.join(str(int(f)) for f in flags)}"
            + (f"_upto{upto}" if upto is not None else ""))


def attention_forward_kernel(t: DType, E: int, has_mask: bool, keep: bool, zero_dead: bool,
                             upto: int | None = None) -> LoweredKernel:
    """Forward, for heads of any number L of keys up to what :func:`supported` takes (the
    call's, in the layout), or, given ``upto`` (a row width), up to ``upto`` keys only (the
    bodies of that width: a program of a static length builds in a quarter of the time):
    row ``i`` of head ``n`` of the packed output holds ``out[i]`` (E values), then the
    weights ``p[i]`` (L values) that the backward reads."""
    pr = _Program(_name("fwd", t, E, (has_mask, keep, zero_dead), upto), t, E)
    pr.upto = upto
    b = pr.b
    q, k, v, out = (pr.params[x] for x in ("q", "k", "v", "packed"))
    mask = pr.params["mask"] if has_mask else None
    lay, strides, scale = _prologue(pr, 4)

    def tiles(S):
        return {"kt": pr.local(f"kt{S}", t, S * E),
                "skips": _Skips(pr, S, f"p{S}") if has_mask else None,
                "zv": pr.local(f"zv{S}", t, (S + 1) * E) if has_mask else None}

    def head(n):
        S, L = pr.S, pr.keys
        kt, skips, zv = pr.per_width(tiles).values()
        R, RE = _block_rows(t, S), _block_rows(t, E)
        W = pr.value("w", b.add(L, pr.const(E))) if pr.partial else pr.const(E + S)
        # a row with every score masked: softmax's 0/0 is NaN unless zero_dead
        dead_end = None if zero_dead else b.cast(L, INDEX, U32)
        off = _head_offsets(pr, lay, n, 4)
        first = pr.value("first", b.mul(n, b.mul(L, W)))      # the head's first packed row
        _transpose_tile(pr, kt, k, off[_K], strides[_K])

        def rows_of(i0, rows):
            i0 = pr.value("i", i0)
            idx = [b.add(i0, pr.const(r)) for r in range(rows)]
            s, masks = _scores(pr, q, [b.add(off[_Q], b.mul(i, strides[_Q])) for i in idx], kt,
                               scale, mask, [b.add(off[_M], b.mul(i, strides[_M])) for i in idx],
                               keep)
            for i, x, m in zip(idx, s, masks):
                at = b.add(first, b.add(b.mul(i, W), pr.const(E)))
                pr.store_row(_softmax(pr, x, zero_dead), out, at)
                if has_mask:
                    skips.set_end(i, m, dead_end)
        _row_blocks(pr, R, rows_of)
        bounds = None
        if has_mask:
            _zero_sums(pr, zv, v, off[_V], strides[_V], from_end=True)

            def bounds(i0, rows):
                end_ = skips.end_of_block(i0, rows)
                return pr.const(0), end_, None, pr.load_vec(zv, b.mul(end_, pr.const(E)), E)
        # out = p @ v
        _broadcast_products(
            pr, RE,
            lambda i, j: pr.scalar(out, b.add(first, b.add(b.mul(i, W), b.add(j, pr.const(E))))),
            lambda j: pr.load_vec(v, b.add(off[_V], b.mul(j, strides[_V])), E),
            lambda i, x: pr.store_vec(x, out, b.add(first, b.mul(i, W))), bounds)
    _bodies(pr, head)
    return pr.kernel()


def attention_backward_kernel(t: DType, E: int, has_mask: bool, keep: bool,
                              upto: int | None = None) -> LoweredKernel:
    """Backward from the weights the forward packed: ``dp = dout @ v.T``, ``ds = p * (dp -
    sum(p * dp))`` (masked entries 0) times the scale, then ``dq = ds @ k``, ``dk = ds.T @ q``
    and ``dv = p.T @ dout``; for the numbers of keys the forward takes."""
    pr = _Program(_name("bwd", t, E, (has_mask, keep), upto), t, E)
    pr.upto = upto
    b = pr.b
    q, k, v, dout, packed, out = (pr.params[x] for x in ("q", "k", "v", "dout", "packed", "out"))
    mask = pr.params["mask"] if has_mask else None
    lay, strides, scale = _prologue(pr, 5)
    heads = pr.value("heads", b.load(pr.params["layout"], pr.const(LAYOUT - 2)))  # where dk, dv start

    def tiles(S):
        found = {"vt": pr.local(f"vt{S}", t, S * E),
                 "ds": pr.local(f"ds{S}", t, S * S)}        # the gradient of the head's scores
        if has_mask:
            # ds is 0 where the mask removes a score; p too, except in a row of NaN weights
            found.update(ds_skips=_Skips(pr, S, f"ds{S}", columns=True),
                         p_skips=_Skips(pr, S, f"p{S}", columns=True),
                         **{f"z{a}": pr.local(f"z{a}{S}", t, (S + 1) * E) for a in "kqo"})
        return found

    def head(n):
        S, L = pr.S, pr.keys
        found = pr.per_width(tiles)
        vt, dst = found["vt"], found["ds"]
        if has_mask:
            ds_skips, p_skips, zk, zq, zdo = (found[x] for x in ("ds_skips", "p_skips", "zk", "zq",
                                                                "zo"))
        R, RE = _block_rows(t, S), _block_rows(t, E)
        W = pr.value("w", b.add(L, pr.const(E))) if pr.partial else pr.const(E + S)
        dk_out = pr.value("dk", b.mul(heads, b.mul(L, pr.const(E))))
        dv_out = pr.value("dv", b.mul(heads, b.mul(L, pr.const(2 * E))))
        off = _head_offsets(pr, lay, n, 5)
        first = pr.value("first", b.mul(n, b.mul(L, W)))

        def p_at(i):
            return b.add(first, b.add(b.mul(i, W), pr.const(E)))
        _transpose_tile(pr, vt, v, off[_V], strides[_V])

        def rows_of(i0, rows):
            i0 = pr.value("i", i0)
            idx = [b.add(i0, pr.const(r)) for r in range(rows)]
            do_rows = [b.add(off[_DO], b.mul(i, strides[_DO])) for i in idx]

            def terms(e, acc):
                ve = pr.load_vec(vt, b.mul(e, pr.const(S)), S)
                return [pr.fma(pr.splat(pr.scalar(dout, b.add(r, e)), S), ve, a)
                        for r, a in zip(do_rows, acc)]
            dp = pr.loop(E, [pr.zeros(S)] * rows, terms)
            for r, i in enumerate(idx):
                p = pr.value("p", pr.load_row(packed, p_at(i)))
                products = b.binary("mul", p, dp[r], t)
                if pr.partial:      # (dp there is of the tile's lanes past the keys)
                    products = b.select(pr.invalid, pr.splat(b.const(t, -0.0), S), products, t)
                total = b.reduce("add", products)
                ds = b.binary("mul", p, b.binary("sub", dp[r], pr.splat(total, S), t), t)
                if mask is not None:
                    masked = pr.value("masked", _mask_row(
                        pr, mask, b.add(off[_M], b.mul(i, strides[_M])), keep))
                    ds = b.select(masked, pr.zeros(S), ds, t)
                    ds_skips.set_end(i, masked)
                    p0 = b.extract(p, 0)
                    none = pr.invalid if pr.partial else pr.splat(b.const(dtypes.bool_, False), S)
                    p_skips.set_end(i, b.select(b.cmp("ne", p0, p0, t), none, masked,
                                                dtypes.bool_))
                pr.store_vec(b.binary("mul", ds, pr.splat(scale, S), t), dst,
                             b.mul(i, pr.const(S)))
        _row_blocks(pr, R, rows_of)

        def row_out(base, c, x):
            pr.store_vec(x, out, b.add(base, b.mul(b.add(b.mul(n, L), c), pr.const(E))))

        def row_of(src, a, j):
            return pr.load_vec(src, b.add(off[a], b.mul(j, strides[a])), E)

        def ds_at(i, j):
            return pr.scalar(dst, b.add(b.mul(i, pr.const(S)), j))
        dq_bounds = dk_bounds = dv_bounds = None
        if has_mask:
            ds_skips.finish_rows()
            p_skips.finish_rows()
            _zero_sums(pr, zk, k, off[_K], strides[_K], from_end=True)
            _zero_sums(pr, zq, q, off[_Q], strides[_Q], from_end=False)
            _zero_sums(pr, zdo, dout, off[_DO], strides[_DO], from_end=False)

            def dq_bounds(i0, rows):
                end_ = ds_skips.end_of_block(i0, rows)
                return pr.const(0), end_, None, pr.load_vec(zk, b.mul(end_, pr.const(E)), E)

            def from_first_row(skips, z):
                def bounds(j0, rows):
                    i0 = skips.first_row(j0)
                    return i0, L, pr.load_vec(z, b.mul(i0, pr.const(E)), E), None
                return bounds
            dk_bounds, dv_bounds = from_first_row(ds_skips, zq), from_first_row(p_skips, zdo)
        # dq = ds @ k, dk = ds.T @ q, dv = p.T @ dout
        _broadcast_products(pr, RE, ds_at, lambda j: row_of(k, _K, j),
                            lambda i, x: row_out(pr.const(0), i, x), dq_bounds)
        _broadcast_products(pr, RE, lambda j, i: ds_at(i, j),
                            lambda i: row_of(q, _Q, i), lambda j, x: row_out(dk_out, j, x),
                            dk_bounds)
        _broadcast_products(pr, RE,
                            lambda j, i: pr.scalar(packed, b.add(p_at(i), j)),
                            lambda i: row_of(dout, _DO, i), lambda j, x: row_out(dv_out, j, x),
                            dv_bounds)
    _bodies(pr, head)
    return pr.kernel()
