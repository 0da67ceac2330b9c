"""A reference interpreter of the lowered kernel IR, on numpy, for small shapes.

It runs the kernels of both lowerings: a GPU grid, and a CPU kernel as one block of one
thread whose ``start`` and ``end`` are the whole parallel loop; and the kernels written by
hand in the kernel IR (vectors of lanes are a second axis of the lane arrays; a ``c_abi``
kernel takes its scalar arguments and returns its result).

It runs every thread of a grid at once, as lanes of numpy arrays (SIMT in lockstep): an
expression is evaluated for all lanes, a statement takes effect in the lanes of the current
mask, a loop runs while any lane is still in it. Blocks, threads, shared memory (one array
per block), barriers and warp shuffles behave as on a GPU, and the interpreter checks what a
GPU would leave undefined: a barrier reached by part of a block, a shuffle in a partly
active warp, a load or store out of bounds in an active lane, and a race on shared memory
(two threads of a block touching one element, one of them writing, with no barrier between:
lockstep lanes would hide it, so every shared access is recorded by thread and epoch).

Its arithmetic is the builder's contract (:mod:`fusegrad.ops.lowering`) on numpy scalars of
each dtype; transcendental functions are numpy's (correctly rounded in practice), so it
checks the lowering's numerics and index arithmetic, not a GPU's math library.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from fusegrad import dtypes
from fusegrad.codegen.kernel_ir import (
    Assign,
    AtomicInc,
    Barrier,
    Declare,
    Expr,
    Fence,
    If,
    Local,
    Loop,
    LoweredKernel,
    Store,
    StoreLanes,
    StoreLocal,
    StoreShared,
    StoreVec,
)
from fusegrad.ops.lowering import BITS16, MATH_TABLE, unsigned

__all__ = ["run_kernel", "InterpreterError", "numpy_dtype"]


class InterpreterError(RuntimeError):
    """The kernel did something a GPU leaves undefined."""


def numpy_dtype(dt) -> np.dtype:
    """The numpy dtype of a register or memory dtype."""
    if dt is dtypes.bool_:
        return np.dtype(np.bool_)
    if dt is BITS16:
        return np.dtype(np.uint16)
    return dt.np_dtype


_MATH = {"fabs": np.abs, "floor": np.floor, "ceil": np.ceil, "roundeven": np.rint,
         **{f.name: getattr(np, f.numpy) for f in MATH_TABLE.values() if f.numpy is not None}}


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)).astype(x.dtype)


class _Machine:
    def __init__(self, k: LoweredKernel, buffers: list[np.ndarray], grid: int,
                 extent: int = 0):
        self.k = k
        self.grid, self.block = grid, k.block
        self.lanes = grid * k.block
        lane = np.arange(self.lanes, dtype=np.uint64)
        self.special = {"blockIdx": lane // np.uint64(k.block),
                        "threadIdx": lane % np.uint64(k.block),
                        "blockDim": np.full(self.lanes, k.block, np.uint64),
                        "gridDim": np.full(self.lanes, grid, np.uint64),
                        "start": np.zeros(self.lanes, np.uint64),
                        "end": np.full(self.lanes, extent, np.uint64)}
        self.block_of = (lane // np.uint64(k.block)).astype(np.int64)
        self.buffers = {id(p): buf.reshape(-1) for p, buf in zip(k.params, buffers)}
        self.shared = {id(s): np.zeros((grid, s.size), dtype=numpy_dtype(s.dtype))
                       for s in k.shared}
        # A local array per lane, holding garbage until written (NaN, or all bits set).
        self.local = {id(a): _garbage((self.lanes, a.size), numpy_dtype(a.dtype))
                      for a in k.locals}
        # Race detection on shared memory: per element, the lane that last wrote it and the
        # last lane that read it, and in which barrier epoch of its block. Lanes run in
        # lockstep here, so a race a GPU would expose must be found by bookkeeping.
        self.epoch = np.zeros(grid, dtype=np.int64)
        self.access = {id(s): {key: np.full((grid, s.size), -1, dtype=np.int64)
                               for key in ("writer", "write_epoch", "reader", "read_epoch")}
                       for s in k.shared}
        self.vars: dict[int, np.ndarray] = {}

    # -- expressions
    def eval(self, e: Expr, mask: np.ndarray, memo: dict) -> np.ndarray:
        hit = memo.get(id(e))
        if hit is not None:
            return hit
        out = self._eval(e, mask, memo)
        memo[id(e)] = out
        return out

    def _eval(self, e: Expr, mask, memo) -> np.ndarray:
        op, dt = e.op, e.dtype
        if op == "const":
            return np.full(self.lanes, e.arg, dtype=numpy_dtype(dt))
        if op == "special":
            return self.special[e.arg]
        if op == "read":
            return self.vars[id(e.arg)]
        args = [self.eval(s, mask, memo) for s in e.src]
        if op == "load":
            buf = self.buffers[id(e.arg)]
            index = self.check(args[0], mask, buf.size, e.arg.name)
            return buf[index]
        if op == "aligned":
            p, size = e.arg
            return np.full(self.lanes, self.aligned(p, size))
        if op == "extract":
            return args[0][:, e.arg]
        if op == "load_vec":
            p, width = e.arg
            buf = self.buffers[id(p)]
            self.check_aligned(p, width, mask)
            index = args[0].astype(np.uint64) * np.uint64(width)
            lanes = [self.check(index + np.uint64(j), mask, buf.size, p.name) for j in range(width)]
            return np.stack([buf[i] for i in lanes], axis=1)
        if op == "address":
            return np.full(self.lanes, self.buffers[id(e.arg)].ctypes.data, np.uint64)
        if op == "broadcast":
            return np.repeat(args[0][:, None], e.lanes, axis=1)
        if op == "iota":
            return np.tile(np.arange(e.lanes, dtype=numpy_dtype(dt)), (self.lanes, 1))
        if op == "load_lanes":
            mem, index = self.lanes_of(e.arg, args[0], e.lanes, mask,
                                       args[1] if len(args) > 1 else None)
            out = mem[index]
            if len(args) > 1:
                out = np.where(args[1], out, np.zeros((), out.dtype))
            return out
        if op == "reduce":
            kind = "max" if e.arg == "max" else "add"
            cols = [args[0][:, j] for j in range(args[0].shape[1])]
            return functools.reduce(lambda x, y: _binary(kind, x, y, dt), cols)
        if op == "shuffle":
            return np.concatenate(args, axis=1)[:, list(e.arg)]
        if op == "load_local":
            mem = self.local[id(e.arg)]
            index = self.check(args[0], mask, mem.shape[1], e.arg.name)
            return mem[np.arange(self.lanes), index]
        if op == "load_shared":
            mem = self.shared[id(e.arg)]
            index = self.check(args[0], mask, mem.shape[1], e.arg.name)
            self.note_shared(e.arg, index, mask, write=False)
            return mem[self.rows(e.arg), index]
        if op == "shfl_xor":
            lane = np.arange(self.lanes)
            other = lane ^ e.arg
            warp_start = lane - lane % 32
            self.check_converged(mask)
            return args[0][np.where(other - warp_start < 32, other, lane)]
        if op == "binary":
            return _binary(e.arg[0], args[0], args[1], dt)
        if op == "unary":
            return _unary(e.arg, args[0], dt)
        if op == "cmp":
            return _cmp(e.arg[0], args[0], args[1], e.arg[2])
        if op == "select":
            c = args[0] if args[0].ndim == args[1].ndim else args[0][:, None]
            return np.where(c, args[1], args[2]).astype(numpy_dtype(dt))
        if op == "cast":
            return _cast(args[0], e.arg, dt)
        if op == "bitcast":
            return args[0].astype(numpy_dtype(e.arg), copy=False).view(numpy_dtype(dt))
        if op == "call":
            return _call(e.arg, args, dt)
        raise InterpreterError(f"unknown expression {op}")

    def lanes_of(self, owner, index: np.ndarray, lanes: int, mask, lane_mask=None):
        """The memory of a parameter or local array and the indices of the ``lanes``
        consecutive elements from ``index`` in each active lane (bounds checked where the
        lane mask, when given, is set)."""
        local = isinstance(owner, Local)
        mem = self.local[id(owner)] if local else self.buffers[id(owner)]
        size = mem.shape[1] if local else mem.size
        at = index.astype(np.uint64)[:, None] + np.arange(lanes, dtype=np.uint64)
        live = mask[:, None] if lane_mask is None else mask[:, None] & lane_mask
        bad = live & (at >= np.uint64(size))
        if bad.any():
            raise InterpreterError(f"{self.k.name}: {owner.name}[{int(at[bad][0])}] is out of "
                                   f"bounds ({size} elements)")
        at = np.where(at < np.uint64(size), at, 0).astype(np.int64)
        return mem, ((np.arange(self.lanes)[:, None], at) if local else at)

    def aligned(self, p, size: int) -> bool:
        """Whether parameter ``p``'s buffer starts at a multiple of ``size`` bytes."""
        return self.buffers[id(p)].ctypes.data % size == 0

    def check_aligned(self, p, width: int, mask) -> None:
        """A vector access needs its buffer aligned to the vector's size (a GPU faults)."""
        size = width * self.buffers[id(p)].itemsize
        if mask.any() and not self.aligned(p, size):
            raise InterpreterError(f"{self.k.name}: a vector access of {p.name}, whose buffer "
                                   f"is not aligned to {size} bytes")

    def check(self, index: np.ndarray, mask, size: int, name: str) -> np.ndarray:
        index = index.astype(np.uint64)
        bad = mask & (index >= np.uint64(size))
        if bad.any():
            raise InterpreterError(f"{self.k.name}: {name}[{int(index[bad][0])}] is out of "
                                   f"bounds ({size} elements)")
        return np.where(index < np.uint64(size), index, 0).astype(np.int64)

    def rows(self, shared) -> np.ndarray:
        """Per lane, the row of ``shared``'s memory it sees: its block's, or the one row of
        a grid-scope array."""
        return self.block_of if shared.scope == "block" else np.zeros_like(self.block_of)

    def note_shared(self, shared, index: np.ndarray, mask: np.ndarray, write: bool) -> None:
        """Record an access to shared memory; raise on a race with another thread of the
        block since its last barrier (read after write, write after write or read). The
        blocks of a grid meet in grid-scope arrays through fences and atomics, which
        lockstep lanes cannot race on: those accesses are not recorded."""
        if shared.scope != "block":
            return
        acc = self.access[id(shared)]
        lanes = np.nonzero(mask)[0]
        blocks, idx = self.block_of[lanes], index[lanes]
        epoch = self.epoch[blocks]
        thread = lanes % self.block
        now_written = acc["write_epoch"][blocks, idx] == epoch
        other_writer = now_written & (acc["writer"][blocks, idx] != thread)
        if write:
            now_read = acc["read_epoch"][blocks, idx] == epoch
            other_reader = now_read & (acc["reader"][blocks, idx] != thread)
            # Two lanes storing to one element in one statement race too.
            same = np.zeros(len(lanes), dtype=bool)
            keys = blocks * shared.size + idx
            _, first, counts = np.unique(keys, return_index=True, return_counts=True)
            same[first[counts > 1]] = True
            bad = other_writer | other_reader | same
            kind = "write after write or read"
        else:
            bad = other_writer
            kind = "read after write"
        if bad.any():
            at = int(np.nonzero(bad)[0][0])
            raise InterpreterError(f"{self.k.name}: a {kind} race on {shared.name}[{idx[at]}] "
                                   f"in block {blocks[at]} (no barrier between the accesses)")
        key = "writer" if write else "reader"
        acc[key][blocks, idx] = thread
        acc["write_epoch" if write else "read_epoch"][blocks, idx] = epoch

    def check_converged(self, mask) -> None:
        warps = mask.reshape(-1, 32) if self.lanes % 32 == 0 else None
        if warps is None or (warps.any(axis=1) & ~warps.all(axis=1)).any():
            raise InterpreterError(f"{self.k.name}: a shuffle in a partly active warp")

    # -- statements
    def run(self, body: list, mask: np.ndarray) -> None:
        for st in body:
            memo: dict = {}
            if isinstance(st, (Declare, Assign)):
                value = self.eval(st.init if isinstance(st, Declare) else st.value, mask, memo)
                value = value.astype(numpy_dtype(st.var.dtype))
                old = self.vars.get(id(st.var), value)
                self.vars[id(st.var)] = np.where(mask if value.ndim == 1 else mask[:, None],
                                                 value, old)
            elif isinstance(st, StoreLanes):
                value = self.eval(st.value, mask, memo)
                lane_mask = None if st.mask is None else self.eval(st.mask, mask, memo)
                if value.ndim == 1:                 # a vector of one lane is a scalar
                    value = value[:, None]
                    lane_mask = None if lane_mask is None else lane_mask[:, None]
                mem, index = self.lanes_of(st.param, self.eval(st.index, mask, memo),
                                           value.shape[1], mask, lane_mask)
                live = np.repeat(mask[:, None], value.shape[1], axis=1)
                if lane_mask is not None:
                    live &= lane_mask
                where = tuple(i[live] for i in np.broadcast_arrays(*index)) if \
                    isinstance(index, tuple) else index[live]
                mem[where] = value[live].astype(mem.dtype)
            elif isinstance(st, Store):
                buf = self.buffers[id(st.param)]
                index = self.check(self.eval(st.index, mask, memo), mask, buf.size, st.param.name)
                value = self.eval(st.value, mask, memo)
                buf[index[mask]] = value[mask].astype(buf.dtype)
            elif isinstance(st, StoreVec):
                buf = self.buffers[id(st.param)]
                width = len(st.values)
                self.check_aligned(st.param, width, mask)
                base = self.eval(st.index, mask, memo).astype(np.uint64) * np.uint64(width)
                for j, v in enumerate(st.values):
                    index = self.check(base + np.uint64(j), mask, buf.size, st.param.name)
                    value = self.eval(v, mask, memo)
                    buf[index[mask]] = value[mask].astype(buf.dtype)
            elif isinstance(st, StoreLocal):
                mem = self.local[id(st.local)]
                index = self.check(self.eval(st.index, mask, memo), mask, mem.shape[1],
                                   st.local.name)
                value = self.eval(st.value, mask, memo)
                mem[np.nonzero(mask)[0], index[mask]] = value[mask]
            elif isinstance(st, StoreShared):
                mem = self.shared[id(st.shared)]
                index = self.check(self.eval(st.index, mask, memo), mask, mem.shape[1],
                                   st.shared.name)
                value = self.eval(st.value, mask, memo)
                self.note_shared(st.shared, index, mask, write=True)
                mem[self.rows(st.shared)[mask], index[mask]] = value[mask]
            elif isinstance(st, AtomicInc):
                # The active lanes take their turns in lane order: each reads the count
                # the ones before it left.
                mem = self.shared[id(st.shared)]
                index = self.check(self.eval(st.index, mask, memo), mask, mem.shape[1],
                                   st.shared.name)
                old = np.zeros(self.lanes, numpy_dtype(st.var.dtype))
                for lane in np.nonzero(mask)[0]:
                    old[lane] = mem[0, index[lane]]
                    mem[0, index[lane]] += 1
                self.vars[id(st.var)] = old
            elif isinstance(st, Fence):
                pass    # lanes run in lockstep: every write is seen at once
            elif isinstance(st, Loop):
                start = self.eval(st.start, mask, memo)
                stop, step = self.eval(st.stop, mask, memo), self.eval(st.step, mask, memo)
                var = start.astype(np.uint64)
                self.vars[id(st.var)] = var
                while True:
                    active = mask & (self.vars[id(st.var)] < stop)
                    if not active.any():
                        break
                    self.run(st.body, active)
                    v = self.vars[id(st.var)]
                    self.vars[id(st.var)] = np.where(active, v + step, v)
            elif isinstance(st, If):
                cond = self.eval(st.cond, mask, memo)
                inner = mask & cond
                if inner.any():
                    self.run(st.body, inner)
            elif isinstance(st, Barrier):
                per_block = mask.reshape(self.grid, self.block)
                if (per_block.any(axis=1) & ~per_block.all(axis=1)).any():
                    raise InterpreterError(f"{self.k.name}: a barrier reached by part of a block")
                self.epoch += per_block.any(axis=1)
            else:
                raise InterpreterError(f"unknown statement {st!r}")


def _garbage(shape, dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "f":
        return np.full(shape, np.nan, dtype)
    return np.full(shape, -1, np.int64).astype(dtype)


def _binary(op: str, x, y, dt):
    npdt = numpy_dtype(dt)
    with np.errstate(all="ignore"):
        if dt.is_floating_point:
            if op == "add":
                return (x + y).astype(npdt)
            if op == "sub":
                return (x - y).astype(npdt)
            if op == "mul":
                return (x * y).astype(npdt)
            if op == "div":
                return (x / y).astype(npdt)
            if op == "rem":
                return np.fmod(x, y).astype(npdt)
            if op in ("max", "min"):
                # IEEE maximum/minimum: NaN wins, -0 < +0.
                nan = np.isnan(x) | np.isnan(y)
                pick = np.maximum if op == "max" else np.minimum
                out = pick(x, y)
                tie = (x == y) & (np.signbit(x) != np.signbit(y))
                zero = np.where(np.signbit(x), y, x) if op == "max" else np.where(np.signbit(x), x, y)
                return np.where(nan, np.nan, np.where(tie, zero, out)).astype(npdt)
        if dt is dtypes.bool_:
            table = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor,
                     "max": np.logical_or, "min": np.logical_and}
            return table[op](x, y)
        x, y = x.astype(npdt), y.astype(npdt)
        if op in ("add", "sub", "mul"):
            return {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](x, y, dtype=npdt)
        if op in ("div", "rem"):
            safe = np.where(y == 0, 1, y).astype(npdt)
            if unsigned(dt):
                return (x // safe if op == "div" else x % safe).astype(npdt)
            # C's division truncates: numpy's floor quotient, one up where the exact quotient
            # is negative and not whole. (Through |x| // |y|, INT64_MIN // 2 came out positive:
            # |INT64_MIN| wraps to itself.)
            floor = x // safe
            up = (x - floor * safe != 0) & ((x < 0) != (safe < 0))
            q = (floor + up.astype(npdt)).astype(npdt)
            return q if op == "div" else (x - q * safe).astype(npdt)
        if op == "and":
            return x & y
        if op == "or":
            return x | y
        if op == "xor":
            return x ^ y
        if op == "shl":
            return np.left_shift(x, y).astype(npdt)
        if op == "shr":
            return np.right_shift(x, y).astype(npdt)
        if op == "max":
            return np.maximum(x, y)
        if op == "min":
            return np.minimum(x, y)
    raise InterpreterError(f"binary {op} on {dt}")


def _unary(op: str, x, dt):
    npdt = numpy_dtype(dt)
    with np.errstate(all="ignore"):
        if op == "neg":
            return (-x).astype(npdt) if dt.is_floating_point else \
                np.subtract(npdt.type(0), x, dtype=npdt)
        if op == "erf":
            return _erf(x)
        if op in _MATH and npdt == np.float32:
            # Through float64, as eager's float32 transcendentals: correctly rounded in
            # practice (numpy's float32 loops may be an ulp off, which cancellation in
            # 1 + tanh(x) and the like turns into a visible relative error).
            return _MATH[op](x.astype(np.float64)).astype(npdt)
        if op == "freeze":
            return x
        return _MATH[op](x).astype(npdt)


def _cmp(pred: str, x, y, dt):
    with np.errstate(all="ignore"):
        if not dt.is_floating_point and dt is not dtypes.bool_:
            # Integers as ``dt`` holds them: an index compared as int64 is signed.
            npdt = numpy_dtype(dt)
            x, y = x.astype(npdt, copy=False), y.astype(npdt, copy=False)
        return {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
                "eq": np.equal, "ne": np.not_equal}[pred](x, y)


def _cast(x, src, dst):
    with np.errstate(all="ignore"):
        out = x.astype(numpy_dtype(dst))
    return out


def _call(fn: str, args, dt):
    npdt = numpy_dtype(dt)
    with np.errstate(all="ignore"):
        if fn == "pow":
            return np.power(args[0], args[1]).astype(npdt)
        if fn == "ipow":
            return np.power(args[0].astype(npdt), args[1].astype(npdt)).astype(npdt)
        if fn == "copysign":
            return np.copysign(args[0], args[1]).astype(npdt)
        if fn == "float16_to_float":
            return args[0].view(np.float16).astype(np.float32)
        if fn == "bfloat16_to_float":
            return (args[0].astype(np.uint32) << np.uint32(16)).view(np.float32)
        if fn == "float_to_float16":
            return args[0].astype(np.float32).astype(np.float16).view(np.uint16)
        if fn == "float_to_bfloat16":
            # Round to nearest even on the upper half; a NaN is the canonical 0x7FFF (cvt's).
            bits = args[0].astype(np.float32).view(np.uint32)
            lsb = (bits >> np.uint32(16)) & np.uint32(1)
            rounded = ((bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype(np.uint16)
            return np.where(np.isnan(args[0]), np.uint16(0x7FFF), rounded)
        if fn in ("fma", "muladd"):
            # float32: the product is exact in float64, one rounding of the sum there and
            # one to float32 (a second rounding only on ties of the first); float64 is
            # approximated by two roundings.
            x, y, z = (a.astype(np.float64) for a in args)
            return (x * y + z).astype(npdt)
        if fn == "dpbf16ps":
            return _dot_bf16_pairs(*args)
    raise InterpreterError(f"call {fn}")


def _dot_bf16_pairs(acc: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``vdpbf16ps`` on 32-bit words holding bf16 pairs: each lane's sum plus the product of
    the high halves, rounded to float32, plus that of the low halves, rounded (Intel's order;
    a product of two bf16 values is exact in float32). Denormal inputs and results, which
    the instruction flushes to zero, are not modelled."""
    def half(w: np.ndarray, high: bool) -> np.ndarray:
        w = w.astype(np.uint32)
        bits = (w & np.uint32(0xFFFF0000)) if high else (w << np.uint32(16))
        return bits.view(np.float32).astype(np.float64)
    out = acc.astype(np.float32)
    for high in (True, False):
        out = (out.astype(np.float64) + half(x, high) * half(y, high)).astype(np.float32)
    return out


def run_kernel(k: LoweredKernel, buffers: list[np.ndarray], grid: int | None = None,
               extent: int = 0, scalars: tuple = ()):
    """Run ``k`` on ``buffers`` (numpy arrays in the order of ``k.params``, each of the
    param's memory dtype; written in place) with ``grid`` blocks (default: the kernel's,
    at most 4: the loops stride over the rest, which is what this exercises). A CPU
    kernel (one block of one thread) runs its parallel loop over ``[0, extent)``; a
    ``c_abi`` kernel takes ``scalars`` (its scalar arguments) and returns its result."""
    grid = max(1, min(k.grid, 4) if grid is None else grid)
    machine = _Machine(k, buffers, grid, extent)
    for var, value in zip(k.scalars, scalars):
        machine.vars[id(var)] = np.full(machine.lanes, value, numpy_dtype(var.dtype))
    machine.run(k.body, np.ones(grid * k.block, dtype=bool))
    return None if k.result is None else machine.vars[id(k.result)][0].item()

