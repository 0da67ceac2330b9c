"""Native loops for the extern steps that a training step runs on every call: the row
scatter-add of ``index_add`` along axis 0 (an embedding's gradient), which numpy has only as
``np.add.at``, and the range checks of class targets and embedding indices.

In a compiled step these ran as numpy calls between kernels, and there each numpy call costs
several times what it costs in a loop of its own (the kernels before it have evicted its code
and data from the caches): the char transformer step's three such steps took 490 us, with
7-90 us each alone. Each loop here is one call:

- ``index_add_rows``: ``out[idx[i], :] += src[i, :]`` for each ``i`` in order, the additions
  of ``np.add.at`` in its order, so the results are the same bit for bit;
- ``check_copy``: copy int64 indices while checking that each lies in ``[lo, hi)``;
- ``convert``: bfloat16 to float32 and back (rounded to nearest even), the conversions
  around a bfloat16 product that runs on float32 BLAS (ml_dtypes' casts take 1.7-2 ns an
  element, these loops 0.3-0.4).

Each reports failure instead of raising: the caller then runs the numpy reference, which
raises torch's error (or accepts what the fast check does not cover: negative indices that
wrap, a loss's ``ignore_index``). Compiled once per process (from the disk cache after the
first run). The loops are kernel-IR programs of :mod:`fusegrad.codegen.native_loops`;
this module compiles, caches and calls them.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from fusegrad import dtypes
from fusegrad.codegen.llvm.kernel import module_text
from fusegrad.codegen.native_loops import check_copy_kernel, convert_kernel, index_add_rows_kernel
from fusegrad.dtypes import DType
from fusegrad.ops.prims import register_index_add_rows
from fusegrad.runtime.jit import compile_ir
from fusegrad.runtime.threads import run_in_parts

__all__ = ["index_add_rows", "check_copy", "convert", "data_pointer"]


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


_TYPES = {np.dtype(np.float32): dtypes.float32, np.dtype(np.float64): dtypes.float64}
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
def _function(dt: DType | None = None):
    """The loaded module and the function of the rows loop of ``dt``, or of the checks."""
    kernel = index_add_rows_kernel(dt) if dt is not None else check_copy_kernel()
    module = compile_ir(_module_text(dt), [kernel.name], speed_level=SPEED_LEVEL)
    fn = (_ROWS_FN if dt is not None else _CHECK_FN)(module.address(kernel.name))
    return module, fn


SPEED_LEVEL = 1


@functools.lru_cache(maxsize=None)
def _module_text(dt: DType | None) -> str:
    """The LLVM module of the checks, or of the rows loop of ``dt`` when given."""
    kernel = index_add_rows_kernel(dt) if dt is not None else check_copy_kernel()
    return module_text("native", [kernel])


def modules_for(node) -> list[tuple[str, int]]:
    """The modules (IR text, speed level) a program step of ``node`` (``check_index``,
    ``check_target`` or ``index_add``) can call, for ahead-of-time artifacts to carry."""
    if node.op in ("check_index", "check_target"):
        return [(_module_text(None), SPEED_LEVEL)]
    dt = _TYPES.get(np.dtype(node.output.type.dtype.np_dtype))
    if node.op == "index_add" and dt is not None:
        return [(_module_text(dt), SPEED_LEVEL)]
    return []


def _c_array(a: np.ndarray, dtype) -> bool:
    return a.dtype == dtype and a.flags.c_contiguous


def index_add_rows(out: np.ndarray, x: np.ndarray, rows: np.ndarray, src: np.ndarray) -> bool:
    """``out = x`` then ``out[rows[i]] += src[i]`` in order of ``i``, for C-contiguous float32
    or float64 ``out`` and ``x`` of one shape (``out`` may be ``x``), int64 ``rows`` and
    ``src`` of shape ``(rows.size, *x.shape[1:])``. False, with nothing written, when the
    arrays are of other kinds or a row index is outside ``[0, len(x))``."""
    dt = _TYPES.get(x.dtype)
    if dt is None or x.ndim < 2:
        return False
    inner = x.size // max(x.shape[0], 1)        # elements per row
    if not (_c_array(out, x.dtype) and _c_array(x, x.dtype) and _c_array(src, x.dtype) and
            _c_array(rows, _INT64) and out.shape == x.shape and out.flags.writeable and
            src.size == rows.size * inner):
        return False
    fn = _function(dt)[1]
    return bool(fn(data_pointer(out), data_pointer(x), data_pointer(rows), data_pointer(src),
                   rows.size, inner, x.shape[0]))


def check_copy(src: np.ndarray, dst: np.ndarray, lo: int, hi: int) -> bool:
    """Copy int64 ``src`` into ``dst`` (C-contiguous, same size) if every value lies in
    ``[lo, hi)``; False (``dst`` untouched) otherwise or for arrays of other kinds."""
    if not (_c_array(src, _INT64) and _c_array(dst, _INT64) and src.size == dst.size and
            dst.flags.writeable):
        return False
    fn = _function()[1]
    return bool(fn(data_pointer(src), data_pointer(dst), src.size, lo, hi))


_CONVERT_FN = ctypes.CFUNCTYPE(ctypes.c_int32, _P, _P, ctypes.c_int64)
_CONVERSIONS = {(np.dtype(dtypes.bfloat16.np_dtype), np.dtype(np.float32)): (dtypes.bfloat16, dtypes.float32),
                (np.dtype(np.float32), np.dtype(dtypes.bfloat16.np_dtype)): (dtypes.float32, dtypes.bfloat16)}


# Vectorized (speed level 3): the loop is all there is, and one module takes milliseconds.
@functools.lru_cache(maxsize=None)
def _convert_function(src: DType, dst: DType):
    kernel = convert_kernel(src, dst)
    module = compile_ir(module_text("native", [kernel]), [kernel.name])
    return module, _CONVERT_FN(module.address(kernel.name))


# Below this many elements a conversion runs on the calling thread alone (a pool hand-off
# costs tens of microseconds, and on a loaded machine a wait for a descheduled thread: 2M
# elements convert in about 0.7 ms).
PARALLEL_CONVERT = 1 << 21


def convert(src: np.ndarray, dst: np.ndarray, threads: int = 1) -> bool:
    """``dst[...] = src`` for C-contiguous arrays of one size, bfloat16 to float32 or float32
    to bfloat16 (rounded to nearest even, NaNs kept: ml_dtypes' values bit for bit), in
    ``threads`` parts where it is large; False, with nothing written, for any other kinds of
    array."""
    pair = _CONVERSIONS.get((src.dtype, dst.dtype))
    if pair is None or not (src.flags.c_contiguous and dst.flags.c_contiguous and src.size == dst.size
                            and dst.flags.writeable):
        return False
    fn = _convert_function(*pair)[1]
    a, b = data_pointer(src), data_pointer(dst)
    if threads < 2 or src.size < PARALLEL_CONVERT:
        fn(a, b, src.size)
        return True

    def part(start: int, end: int) -> None:
        fn(a + start * src.itemsize, b + start * dst.itemsize, end - start)
    run_in_parts(part, (), src.size, threads)
    return True


register_index_add_rows(index_add_rows)
