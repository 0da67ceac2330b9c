"""Contractions: matmul and its torch spellings (mm, bmm, dot, mv, outer).
"""

from __future__ import annotations

from fusegrad import dtypes
from fusegrad.ops import prims as P
from fusegrad.ops.composite import _named, composite
from fusegrad.ops.elementwise import mul
from fusegrad.ops.movement import reshape_prim, unsqueeze
from fusegrad.ops.operands import _at_user_line
from fusegrad.ops.primitive import bind
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor


def matmul_nd(a: Tensor, b: Tensor) -> Tensor:
    return bind(P.matmul, a, b)


@public(torch=True, method=True)
def matmul(x: Tensor, other: Tensor) -> Tensor:
    """Matrix product with torch's rules for 1-D, 2-D and batched (broadcast) operands."""
    if not isinstance(other, Tensor) or not isinstance(x, Tensor):
        raise TypeError(f"matmul(): argument 'other' must be Tensor, not {type(other).__name__}")
    if x.ndim == 0 or other.ndim == 0:
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are "
                           f"{x.ndim}D and {other.ndim}D")
    if x.dtype is not other.dtype:
        # torch promotes no matmul operand (float32 @ float64 is an error, not a float64).
        raise RuntimeError(P.matmul_dtype_message(x._type(), other._type()) + _at_user_line(x, other))
    a, b = x, other
    if a.dtype is dtypes.bool_:
        raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Bool\'')
    if a.ndim == 1 and b.ndim == 1:
        if a.shape[0] != b.shape[0]:
            raise RuntimeError(f"inconsistent tensor size, expected tensor [{a.shape[0]}] and src "
                               f"[{b.shape[0]}] to have the same number of elements, but got "
                               f"{a.shape[0]} and {b.shape[0]} elements respectively")
        return _named(_dot(a, b), "DotBackward0")
    if a.ndim == 1:
        out = matmul_nd(reshape_prim(a, (1, a.shape[0])), b)
        return reshape_prim(out, tuple(out.shape[:-2]) + (out.shape[-1],))
    if b.ndim == 1:
        _check_mm(a, b)
        out = matmul_nd(a, reshape_prim(b, (b.shape[0], 1)))
        return _named(reshape_prim(out, tuple(out.shape[:-1])), "MvBackward0")
    _check_mm(a, b)
    out = matmul_nd(a, b)
    if a.ndim > 2 or b.ndim > 2:
        _named(out, "BmmBackward0")
    return out


@composite("DotBackward0")
def _dot(a, b):
    return reshape_prim(matmul_nd(reshape_prim(a, (1, a.shape[0])), reshape_prim(b, (b.shape[0], 1))),
                        ())


def _check_mm(a: Tensor, b: Tensor) -> None:
    k_b = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if a.shape[-1] != k_b:
        if b.ndim == 1:
            raise RuntimeError(f"size mismatch, got input ({a.shape[-2]}), mat ({a.shape[-2]}x"
                               f"{a.shape[-1]}), vec ({b.shape[0]})")
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({a.shape[-2]}x"
                           f"{a.shape[-1]} and {b.shape[-2]}x{b.shape[-1]})")


@public(torch=True, method=True)
def mm(x: Tensor, other: Tensor) -> Tensor:
    if x.ndim != 2 or other.ndim != 2:
        raise RuntimeError(f"{'self' if x.ndim != 2 else 'mat2'} must be a matrix")
    return matmul(x, other)


@public(torch=True, method=True)
def bmm(x: Tensor, other: Tensor) -> Tensor:
    if x.ndim != 3 or other.ndim != 3:
        raise RuntimeError("batch1 must be a 3D tensor" if x.ndim != 3 else
                           "batch2 must be a 3D tensor")
    if x.shape[0] != other.shape[0]:
        raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: "
                           f"[{x.shape[0]}, {x.shape[2]}] but got: [{other.shape[0]}, "
                           f"{other.shape[1]}].")
    return matmul(x, other)


@public(torch=True, method=True)
def dot(x: Tensor, other: Tensor) -> Tensor:
    if x.ndim != 1 or other.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {x.ndim}D and {other.ndim}D tensors")
    return matmul(x, other)


@public(torch=True, method=True)
def mv(x: Tensor, vec: Tensor) -> Tensor:
    return matmul(x, vec)


@public(torch=True, method=True)
def outer(x: Tensor, other: Tensor) -> Tensor:
    return mul(unsqueeze(x, 1), unsqueeze(other, 0))
