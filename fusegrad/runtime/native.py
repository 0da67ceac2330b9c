"""Native loops for the extern steps that a training step runs on every call: the row
scatter-add of ``index_add`` along axis 0 (an embedding's gradient), which numpy has only as
``np.add.at``, and the range checks of class targets and embedding indices.

In a compiled step these ran as numpy calls between kernels, and there each numpy call costs
several times what it costs in a loop of its own (the kernels before it have evicted its code
and data from the caches): the char transformer step's three such steps took 490 us, with
7-90 us each alone. Each loop here is one call:

- ``index_add_rows``: ``out[idx[i], :] += src[i, :]`` for each ``i`` in order, the additions
  of ``np.add.at`` in its order, so the results are the same bit for bit;
- ``check_copy``: copy int64 indices while checking that each lies in ``[lo, hi)``.

Both report failure instead of raising: the caller then runs the numpy reference, which
raises torch's error (or accepts what the fast check does not cover: negative indices that
wrap, a loss's ``ignore_index``). Compiled once per process (from the disk cache after the
first run).
"""

from __future__ import annotations

import ctypes
import functools
import re

import numpy as np

from fusegrad.ops.prims import register_index_add_rows

__all__ = ["index_add_rows", "check_copy", "data_pointer"]


def _find_data_offset() -> int | None:
    """Offset of the data pointer inside a numpy array object (its C struct starts with
    the object header, then ``char *data``). Reading it directly costs ~0.1 us where
    ``arr.ctypes.data`` costs ~1 us in a loop of its own and 4-10 us between the kernels of
    a training step, which matters for the per-call overhead of small compiled functions and
    for the native loops below. Verified against ``__array_interface__`` at import."""
    probe = np.arange(3, dtype=np.float32)
    want = probe.__array_interface__["data"][0]
    for offset in (16, 24):
        if ctypes.c_void_p.from_address(id(probe) + offset).value == want:
            return offset
    return None


_DATA_OFFSET = _find_data_offset()


def data_pointer(a: np.ndarray) -> int:
    """Address of ``a``'s first element."""
    if _DATA_OFFSET is not None:
        return ctypes.c_void_p.from_address(id(a) + _DATA_OFFSET).value or 0
    return a.__array_interface__["data"][0]


_CHECKS_IR = """
define i1 @fg_out_of_range_i64(i64* %src, i64 %n, i64 %lo, i64 %hi) {
entry:
  %empty = icmp eq i64 %n, 0
  br i1 %empty, label %done, label %loop
loop:
  %i = phi i64 [0, %entry], [%i.next, %loop]
  %bad = phi i1 [false, %entry], [%bad.next, %loop]
  %sp = getelementptr inbounds i64, i64* %src, i64 %i
  %v = load i64, i64* %sp
  %below = icmp slt i64 %v, %lo
  %above = icmp sge i64 %v, %hi
  %out = or i1 %below, %above
  %bad.next = or i1 %bad, %out
  %i.next = add i64 %i, 1
  %end = icmp eq i64 %i.next, %n
  br i1 %end, label %done, label %loop
done:
  %any = phi i1 [false, %entry], [%bad.next, %loop]
  ret i1 %any
}

define i32 @fg_check_copy_i64(i64* noalias %src, i64* noalias %dst, i64 %n, i64 %lo, i64 %hi) {
entry:
  %bad = call i1 @fg_out_of_range_i64(i64* %src, i64 %n, i64 %lo, i64 %hi)
  br i1 %bad, label %fail, label %copy
fail:
  ret i32 0
copy:
  %bytes = shl i64 %n, 3
  call void @llvm.memcpy.p0.p0.i64(i64* %dst, i64* %src, i64 %bytes, i1 false)
  ret i32 1
}

declare void @llvm.memcpy.p0.p0.i64(i8*, i8*, i64, i1)
"""

_ROWS_IR = """
define i32 @fg_index_add_rows_T(T* noalias %out, T* noalias %x, i64* noalias %idx,
                                T* noalias %src, i64 %n, i64 %inner, i64 %rows) {
entry:
  %bad = call i1 @fg_out_of_range_i64(i64* %idx, i64 %n, i64 0, i64 %rows)
  br i1 %bad, label %fail, label %copy.check
fail:
  ret i32 0
copy.check:
  %same = icmp eq T* %out, %x
  br i1 %same, label %scatter, label %copy
copy:
  %rows.end = getelementptr T, T* null, i64 %rows
  %rows.bytes = ptrtoint T* %rows.end to i64
  %bytes = mul i64 %rows.bytes, %inner
  call void @llvm.memcpy.p0.p0.i64(T* %out, T* %x, i64 %bytes, i1 false)
  br label %scatter
scatter:
  ; the column loop below runs at least once: rows of no elements must not enter it
  %no.rows = icmp eq i64 %n, 0
  %no.cols = icmp eq i64 %inner, 0
  %none = or i1 %no.rows, %no.cols
  br i1 %none, label %done, label %row
row:
  %i = phi i64 [0, %scatter], [%i.next, %row.end]
  %ip = getelementptr inbounds i64, i64* %idx, i64 %i
  %r = load i64, i64* %ip
  %dst.off = mul i64 %r, %inner
  %src.off = mul i64 %i, %inner
  %dst = getelementptr inbounds T, T* %out, i64 %dst.off
  %s = getelementptr inbounds T, T* %src, i64 %src.off
  br label %col
col:
  %j = phi i64 [0, %row], [%j.next, %col]
  %dp = getelementptr inbounds T, T* %dst, i64 %j
  %sp = getelementptr inbounds T, T* %s, i64 %j
  %a = load T, T* %dp
  %b = load T, T* %sp
  %c = fadd T %a, %b
  store T %c, T* %dp
  %j.next = add i64 %j, 1
  %col.done = icmp eq i64 %j.next, %inner
  br i1 %col.done, label %row.end, label %col
row.end:
  %i.next = add i64 %i, 1
  %rows.done = icmp eq i64 %i.next, %n
  br i1 %rows.done, label %done, label %row
done:
  ret i32 1
}
"""

_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_INT64 = np.dtype(np.int64)
_P = ctypes.c_void_p
_ROWS_FN = ctypes.CFUNCTYPE(ctypes.c_int32, _P, _P, _P, _P, ctypes.c_int64, ctypes.c_int64,
                            ctypes.c_int64)
_CHECK_FN = ctypes.CFUNCTYPE(ctypes.c_int32, _P, _P, ctypes.c_int64, ctypes.c_int64,
                             ctypes.c_int64)


# Speed level 1 (no vectorizer): these loops are short, and at level 3 LLVM took 40-80 ms
# per module, which a compiled step's first call pays with an empty cache (the checks alone:
# 13 ms at level 1). Each module is compiled when a step first needs it.
@functools.lru_cache(maxsize=None)
def _function(name: str, llvm_type: str | None = None):
    from fusegrad.runtime.jit import compile_ir
    module = compile_ir(_module_text(llvm_type), [name], speed_level=SPEED_LEVEL)
    fn = (_ROWS_FN if llvm_type is not None else _CHECK_FN)(module.address(name))
    return module, fn


SPEED_LEVEL = 1


def _module_text(llvm_type: str | None) -> str:
    """The checks, and the rows loop of ``llvm_type`` when given."""
    text = _CHECKS_IR
    if llvm_type is not None:
        text += re.sub(r"\bT\b", llvm_type, _ROWS_IR).replace("_T(", f"_{llvm_type}(")
    return text


def modules_for(node) -> list[tuple[str, int]]:
    """The modules (IR text, speed level) a program step of ``node`` (``check_index``,
    ``check_target`` or ``index_add``) can call, for ahead-of-time artifacts to carry."""
    if node.op in ("check_index", "check_target"):
        return [(_module_text(None), SPEED_LEVEL)]
    llvm_type = _TYPES.get(np.dtype(node.output.type.dtype.np_dtype))
    if node.op == "index_add" and llvm_type is not None:
        return [(_module_text(llvm_type), SPEED_LEVEL)]
    return []


def _c_array(a: np.ndarray, dtype) -> bool:
    return a.dtype == dtype and a.flags.c_contiguous


def index_add_rows(out: np.ndarray, x: np.ndarray, rows: np.ndarray, src: np.ndarray) -> bool:
    """``out = x`` then ``out[rows[i]] += src[i]`` in order of ``i``, for C-contiguous float32
    or float64 ``out`` and ``x`` of one shape (``out`` may be ``x``), int64 ``rows`` and
    ``src`` of shape ``(rows.size, *x.shape[1:])``. False, with nothing written, when the
    arrays are of other kinds or a row index is outside ``[0, len(x))``."""
    llvm_type = _TYPES.get(x.dtype)
    if llvm_type is None or x.ndim < 2:
        return False
    inner = x.size // max(x.shape[0], 1)        # elements per row
    if not (_c_array(out, x.dtype) and _c_array(x, x.dtype) and _c_array(src, x.dtype) and
            _c_array(rows, _INT64) and out.shape == x.shape and out.flags.writeable and
            src.size == rows.size * inner):
        return False
    fn = _function(f"fg_index_add_rows_{llvm_type}", llvm_type)[1]
    return bool(fn(data_pointer(out), data_pointer(x), data_pointer(rows), data_pointer(src),
                   rows.size, inner, x.shape[0]))


def check_copy(src: np.ndarray, dst: np.ndarray, lo: int, hi: int) -> bool:
    """Copy int64 ``src`` into ``dst`` (C-contiguous, same size) if every value lies in
    ``[lo, hi)``; False (``dst`` untouched) otherwise or for arrays of other kinds."""
    if not (_c_array(src, _INT64) and _c_array(dst, _INT64) and src.size == dst.size and
            dst.flags.writeable):
        return False
    fn = _function("fg_check_copy_i64")[1]
    return bool(fn(data_pointer(src), data_pointer(dst), src.size, lo, hi))


register_index_add_rows(index_add_rows)
