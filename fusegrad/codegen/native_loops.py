"""The native loops of extern steps, as kernel-IR programs (``c_abi`` kernels): the row
scatter-add of ``index_add`` along axis 0 (an embedding's gradient) and the range check of
int64 indices. :mod:`fusegrad.runtime.native` compiles and calls them (see there for why
they exist); both return 1 when they did their work and 0, having written nothing, when an
index is out of range.

- :func:`check_copy_kernel`: ``fg_check_copy_i64(src, dst, n, lo, hi)`` copies ``n`` int64
  values of ``src`` to ``dst`` if each lies in ``[lo, hi)``;
- :func:`index_add_rows_kernel`: ``fg_index_add_rows_<T>(out, x, idx, src, n, inner,
  rows)`` sets ``out = x`` (nothing to copy when ``out`` is ``x``), then adds row ``i`` of
  ``src`` to row ``idx[i]`` of ``out`` for each ``i`` in order (``np.add.at``'s additions in
  its order, so the same results bit for bit), if every ``idx[i]`` lies in ``[0, rows)``;
- :func:`convert_kernel`: ``fg_convert_<S>_<D>(src, dst, n)`` sets ``dst[i] = src[i]``
  converted for ``i < n`` (bfloat16 to float32 exactly; float32 to bfloat16 rounded to
  nearest even, the kernels' one 16-bit rounding): the conversions around a bfloat16
  product that runs on float32 BLAS.
"""

from __future__ import annotations

from fusegrad import dtypes
from fusegrad.codegen.kernel_ir import (
    INDEX,
    Assign,
    Declare,
    ExprBuilder,
    If,
    Loop,
    LoweredKernel,
    Param,
    Store,
    Var,
)
from fusegrad.dtypes import DType
from fusegrad.ops import lowering

__all__ = ["check_copy_kernel", "index_add_rows_kernel", "convert_kernel", "LLVM_NAMES"]

# The LLVM spelling of each element type, in the functions' names.
LLVM_NAMES = {dtypes.float32: "float", dtypes.float64: "double", dtypes.int64: "i64",
              dtypes.bfloat16: "bf16"}


def _out_of_range(b: ExprBuilder, values: Param, n: Var, lo, hi) -> tuple[Var, list]:
    """A flag, and the loop setting it, of whether any of ``values[:n]`` is outside
    ``[lo, hi)`` (no early exit: one pass a vectorizer may take)."""
    bad = Var("bad", dtypes.bool_)
    i = Var("i", INDEX)
    v = b.load(values, b.read(i))
    out = b.binary("or", b.cmp("lt", v, lo, dtypes.int64), b.cmp("ge", v, hi, dtypes.int64),
                   dtypes.bool_)
    loop = Loop(i, b.index(0), b.read(n), b.index(1),
                [Assign(bad, b.binary("or", b.read(bad), out, dtypes.bool_))])
    return bad, [Declare(bad, b.const(dtypes.bool_, False)), loop]


def _kernel(name: str, params: list[Param], scalars: list[Var], ok: Var, body: list
            ) -> LoweredKernel:
    return LoweredKernel(name, params, [], body, block=1, grid=1, c_abi=True, scalars=scalars,
                         result=ok)


def _when_in_range(b: ExprBuilder, bad: Var, ok: Var, work: list) -> list:
    """``ok = 0; if not bad: work; ok = 1``."""
    return [Declare(ok, b.const(dtypes.int32, 0)),
            If(b.cmp("eq", b.read(bad), b.const(dtypes.bool_, False), dtypes.bool_),
               work + [Assign(ok, b.const(dtypes.int32, 1))])]


def check_copy_kernel() -> LoweredKernel:
    """``fg_check_copy_i64(src, dst, n, lo, hi) -> i32`` (see the module docstring)."""
    b = ExprBuilder()
    src, dst = Param("src", dtypes.int64), Param("dst", dtypes.int64, writes=True)
    n, lo, hi = Var("n", INDEX), Var("lo", dtypes.int64), Var("hi", dtypes.int64)
    ok, j = Var("ok", dtypes.int32), Var("j", INDEX)
    bad, check = _out_of_range(b, src, n, b.read(lo), b.read(hi))
    copy = Loop(j, b.index(0), b.read(n), b.index(1), [Store(dst, b.read(j), b.load(src, b.read(j)))])
    return _kernel("fg_check_copy_i64", [src, dst], [n, lo, hi], ok,
                   check + _when_in_range(b, bad, ok, [copy]))


def index_add_rows_kernel(dt: DType) -> LoweredKernel:
    """``fg_index_add_rows_<T>(out, x, idx, src, n, inner, rows) -> i32`` for float32 or
    float64 (see the module docstring)."""
    b = ExprBuilder()
    out, x = Param("out", dt, writes=True), Param("x", dt)
    idx, src = Param("idx", dtypes.int64), Param("src", dt)
    n, inner, rows = Var("n", INDEX), Var("inner", INDEX), Var("rows", INDEX)
    ok, e, i, j = Var("ok", dtypes.int32), Var("e", INDEX), Var("i", INDEX), Var("j", INDEX)
    row = Var("row", INDEX)
    bad, check = _out_of_range(b, idx, n, b.const(dtypes.int64, 0), b.read(rows))
    copy = If(b.cmp("ne", b.address(out), b.address(x), INDEX),
              [Loop(e, b.index(0), b.mul(b.read(rows), b.read(inner)), b.index(1),
                    [Store(out, b.read(e), b.load(x, b.read(e)))])])
    at = b.add(b.read(row), b.read(j))
    add = Store(out, at, b.binary("add", b.load(out, at),
                                  b.load(src, b.add(b.mul(b.read(i), b.read(inner)), b.read(j))), dt))
    scatter = Loop(i, b.index(0), b.read(n), b.index(1), [
        Declare(row, b.mul(b.load(idx, b.read(i)), b.read(inner))),
        Loop(j, b.index(0), b.read(inner), b.index(1), [add])])
    return _kernel(f"fg_index_add_rows_{LLVM_NAMES[dt]}", [out, x, idx, src], [n, inner, rows], ok,
                   check + _when_in_range(b, bad, ok, [copy, scatter]))


def convert_kernel(src_dt: DType, dst_dt: DType) -> LoweredKernel:
    """``fg_convert_<S>_<D>(src, dst, n) -> i32``: ``dst[:n] = src[:n]`` converted from
    ``src_dt`` to ``dst_dt`` (see the module docstring; 16-bit floats in their memory form,
    :func:`fusegrad.ops.lowering.to_memory`); always 1."""
    b = ExprBuilder()
    src = Param("src", lowering.memory_dtype(src_dt))
    dst = Param("dst", lowering.memory_dtype(dst_dt), writes=True)
    n, ok, i = Var("n", INDEX), Var("ok", dtypes.int32), Var("i", INDEX)
    wide = lowering.from_memory(b, b.load(src, b.read(i)), src_dt)
    value = b.cast(wide, lowering.register_dtype(src_dt), lowering.register_dtype(dst_dt))
    loop = Loop(i, b.index(0), b.read(n), b.index(1),
                [Store(dst, b.read(i), lowering.to_memory(b, value, dst_dt))])
    return _kernel(f"fg_convert_{LLVM_NAMES[src_dt]}_{LLVM_NAMES[dst_dt]}", [src, dst], [n], ok,
                   [loop, Declare(ok, b.const(dtypes.int32, 1))])
