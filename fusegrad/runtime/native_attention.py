"""Attention of small heads, forward and backward, as one native call over a range of heads:
the kernels are the kernel-IR programs of :mod:`fusegrad.codegen.attention` (see there for
what they compute and how); this module compiles them (one per feature count, dtype and
mask kind, for every sequence length; cached like kernels), lays out the call's arrays and
runs it, across threads when the work is large enough. Q, K, V, the mask and the output
gradient may have any strides in the head dimensions, with contiguous rows (others are
copied for the call). Other arrays, and heads larger than ``MAX_KEYS`` x ``MAX_FEATURES``,
are not taken (the calls return False and the caller runs the numpy reference).
"""

from __future__ import annotations

import ctypes
import functools
import sys

import numpy as np

from fusegrad import dtypes
from fusegrad.codegen.attention import (
    BUFFERS,
    LAYOUT,
    MAX_FEATURES,
    MAX_KEYS,
    attention_backward_kernel,
    attention_forward_kernel,
    row_width,
    supported,
)
from fusegrad.codegen.llvm.kernel import module_text
from fusegrad.config import config
from fusegrad.runtime.jit import compile_ir
from fusegrad.runtime.native import data_pointer
from fusegrad.runtime.threads import run_in_parts
from fusegrad.symint import SymInt

__all__ = ["attention_forward", "attention_backward", "supported", "MAX_KEYS", "MAX_FEATURES"]

_DTYPES = {np.dtype(np.float32): dtypes.float32, np.dtype(np.float64): dtypes.float64}
# fn(buffers, first head, end head)
_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
_PARALLEL_WORK = 1 << 18       # multiply-adds below which one thread runs all heads


@functools.lru_cache(maxsize=None)
def _compiled(backward: bool, dtype: np.dtype, E: int, has_mask: bool, keep: bool,
              zero_dead: bool, upto: int | None = None):
    """The kernel for every sequence length, or (``upto``, a row width) for lengths up to
    that width: a static length's, which builds in a quarter of the time."""
    text, name = _module_ir(backward, dtype, E, has_mask, keep, zero_dead, upto)
    if config.debug >= 1:
        # (Once per feature count: every sequence length runs it.)
        print(f"[fusegrad] attention {'backward' if backward else 'forward'} kernel for "
              f"{E} features, {'every length' if upto is None else f'up to {upto} keys'}",
              file=sys.stderr)
    module = compile_ir(text, [name])
    return module, _FN(module.address(name))


@functools.lru_cache(maxsize=None)
def _module_ir(backward: bool, dtype: np.dtype, E: int, has_mask: bool, keep: bool,
               zero_dead: bool, upto: int | None) -> tuple[str, str]:
    t = _DTYPES[np.dtype(dtype)]
    if backward:
        kernel = attention_backward_kernel(t, E, has_mask, keep, upto)
    else:
        kernel = attention_forward_kernel(t, E, has_mask, keep, zero_dead, upto)
    return module_text(kernel.name, [kernel]), kernel.name


def modules_for(node) -> list[tuple[str, int]]:
    """The module (IR text, speed level) a program step of ``node`` (``fused_attention`` or
    its backward) calls when its arrays have the layouts the native code takes, for
    ahead-of-time artifacts to carry: for a symbolic sequence length, one for every length
    (the fusion took the node for the lengths it may have, :func:`supported`; a symbolic
    number of features raises :class:`~fusegrad.symint.SymbolicDecisionError`)."""
    q = node.inputs[0].type
    dtype = np.dtype(q.dtype.np_dtype)
    if len(q.shape) < 2:
        return []
    L, E = q.shape[-2], int(q.shape[-1])
    if not supported(dtype, 1 if isinstance(L, SymInt) else L, 1, E):
        return []
    upto = None if isinstance(L, SymInt) else row_width(_DTYPES[dtype], L, E)
    backward = node.op == "fused_attention_backward"
    has_mask = len(node.inputs) > (5 if backward else 3)
    zero_dead = False if backward else bool(node.attrs.get("zero_dead", False))
    text, _ = _module_ir(backward, dtype, E, has_mask, bool(node.attrs["keep"]), zero_dead,
                         upto)
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
    """A prepared native call: the function and its buffer table (the layout and the scale
    among the buffers, :data:`fusegrad.codegen.attention.BUFFERS`)."""

    __slots__ = ("fn", "table", "layout", "scale", "heads", "work", "arrays", "reusable")

    def __init__(self, fn, pointers: dict, layout, heads, work, arrays, reusable):
        self.fn, self.heads, self.work, self.reusable = fn, heads, work, reusable
        self.layout = layout
        self.scale = np.zeros(1, np.float64)        # set by each call
        pointers = {**pointers, "layout": data_pointer(layout),
                    "scale": data_pointer(self.scale)}
        self.table = (ctypes.c_void_p * len(BUFFERS))(*(pointers.get(n, 0) for n in BUFFERS))
        self.arrays = arrays                # kept alive: the table points into them


def _key(arrays) -> tuple:
    return tuple((data_pointer(a), a.shape, a.strides, a.dtype.char) if a is not None else None
                 for a in arrays)


def _prepare(kind: str, arrays: list, out: np.ndarray, flags: tuple,
             every_length: bool) -> _Call | None:
    """The call for ``arrays`` (q, k, v, mask or None, then dout and the packed forward
    output for the backward), or None when the native code does not take them;
    ``every_length``: with the kernel for every sequence length (else the one up to L's row
    width)."""
    q, k, v, mask = arrays[:4]
    more = arrays[4:]
    L, E = q.shape[-2:] if q.ndim >= 2 else (0, 0)
    if not (q.ndim >= 2 and q.shape == k.shape == v.shape and q.dtype == k.dtype == v.dtype and
            supported(q.dtype, L, L, E) and out.dtype == q.dtype and out.flags.c_contiguous and
            out.flags.writeable):
        return None
    batch = q.shape[:-2]
    heads = int(np.prod(batch, dtype=np.int64))
    upto = None if every_length else row_width(_DTYPES[q.dtype], L, E)
    strided = [q, k, v]
    padded = False
    if mask is not None:
        if mask.dtype != np.bool_:
            return None
        width = row_width(_DTYPES[q.dtype], L, E)
        if width == L:
            mask = np.broadcast_to(mask, batch + (L, L))
        else:
            # Fewer keys than the kernel's row width: it reads each row of the mask that
            # wide (see fusegrad.codegen.attention._mask_row), from a copy.
            rows = np.broadcast_to(mask, mask.shape[:-2] + (L, L))
            wide = np.zeros(rows.shape[:-1] + (width,), np.bool_)
            wide[..., :L] = rows
            mask, padded = np.broadcast_to(wide, batch + (L, width)), True

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
    layout += [0] * (LAYOUT - 2 - len(layout)) + [heads, L]
    pointers = {n: data_pointer(a) for n, a in zip(("q", "k", "v"), strided)}
    if mask is not None:
        pointers["mask"] = data_pointer(strided[3])
    if kind == "backward":
        pointers.update(dout=data_pointer(strided[4]), packed=data_pointer(packed),
                        out=data_pointer(out))
        fn = _compiled(True, q.dtype, E, mask is not None, flags[0], False, upto)[1]
        work = heads * L * L * E * 4
    else:
        pointers["packed"] = data_pointer(out)         # the forward's output
        fn = _compiled(False, q.dtype, E, mask is not None, *flags, upto)[1]
        work = heads * L * L * E * 2
    # A call that reads a copy is made anew each time (the copy is of this call's values).
    return _Call(fn, pointers, np.array(layout, dtype=np.int64), heads, work,
                 (strided, packed, out), reusable=not (any(copied) or padded))


def _call(kind: str, arrays: list, out: np.ndarray, scale: float, flags: tuple,
          memo: dict | None, every_length: bool) -> bool:
    """Run the call; ``memo`` (the caller's, e.g. a program step's) keeps the last prepared
    call, reused while the arrays are the same buffers with the same layout."""
    key = (kind, _key(arrays), _key([out]), flags, every_length)
    call = memo.get(key) if memo is not None else None
    if call is None:
        call = _prepare(kind, arrays, out, flags, every_length)
        if call is None:
            return False
        if memo is not None and call.reusable:
            memo.clear()
            memo[key] = call
    call.scale[0] = scale
    threads, heads = config.num_threads, call.heads
    if threads > 1 and heads > 1 and call.work >= _PARALLEL_WORK:
        run_in_parts(call.fn, (call.table,), heads, threads)
    else:
        call.fn(call.table, 0, heads)
    return True


def attention_forward(out: np.ndarray, q, k, v, mask, *, scale: float, keep: bool,
                      zero_dead: bool, memo: dict | None = None,
                      every_length: bool = True) -> bool:
    """``out[..., :E] = p @ v`` and ``out[..., E:] = p``, the weights ``softmax(q @ k.T *
    scale, masked)``, for (..., L, E) arrays of one shape and ``out`` of (..., L, E + L);
    ``mask`` (bool, broadcastable to (..., L, L), or None): where it is not ``keep`` the
    score is -inf. False, with nothing written, for calls the native code does not take.
    ``every_length``: run the kernel for every sequence length (a program of a symbolic
    one), else the one for L's row width (a static length's, quicker to build)."""
    return _call("forward", [q, k, v, mask], out, scale, (keep, zero_dead), memo, every_length)


def attention_backward(out: np.ndarray, q, k, v, dout, packed, mask, *, scale: float,
                       keep: bool, memo: dict | None = None, every_length: bool = True) -> bool:
    """``out[0], out[1], out[2] = dq, dk, dv`` given the gradient ``dout`` of the attention's
    result and ``packed``, the forward's output (its weights). False, with nothing written,
    for calls the native code does not take; ``every_length`` as for the forward."""
    return _call("backward", [q, k, v, mask, dout, packed], out, scale, (keep,), memo,
                 every_length)
