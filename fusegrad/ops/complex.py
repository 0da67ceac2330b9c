"""Complex-number ops: ``complex``, ``polar``, the parts (``real``, ``imag``, views as in torch),
``conj``, ``angle``, ``sgn``, ``view_as_real`` / ``view_as_complex``.

Gradients follow torch's convention: the gradient of a real loss ``L`` with respect to a
complex ``z`` is ``dL/d(conj z)`` as torch reports it (``L = |z|**2`` gives ``2 z``). The VJP
rules of the holomorphic primitives multiply by the conjugate of their derivative
(:func:`fusegrad.ops.prims._conj`); those of the parts are written out in
:mod:`fusegrad.ops.prims`.

``conj`` returns a new tensor holding the conjugate: torch's lazy conjugate bit is not
modelled, so ``is_conj()`` is always False and ``resolve_conj`` returns its input, with the
values torch gives.
"""

from __future__ import annotations

import math

import numpy as np

from fusegrad import dtypes
from fusegrad.ops import prims as P
from fusegrad.ops.composite import composite
from fusegrad.ops.elementwise import abs as abs_
from fusegrad.ops.elementwise import cos, div, eq, lt, mul, ne, sin, where
from fusegrad.ops.factories import zeros_like
from fusegrad.ops.movement import _mark_view
from fusegrad.ops.operands import _float_dtype, as_tensor_operand, cast
from fusegrad.ops.primitive import bind
from fusegrad.ops.prims_common import register_view_op
from fusegrad.ops.registry import public
from fusegrad.ops.trig import atan2
from fusegrad.tensor import Tensor

__all__ = ["complex", "polar", "real", "imag", "conj", "conj_physical", "resolve_conj",
           "resolve_neg", "is_conj", "is_neg", "angle", "sgn", "view_as_real", "view_as_complex"]


def _check_tensor(op: str, name: str, x) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}(): argument '{name}' (position 1) must be Tensor, not "
                        f"{type(x).__name__}")


@public(torch=True)
def complex(real: Tensor, imag: Tensor) -> Tensor:  # noqa: A001 - torch's name
    """The complex tensor ``real + imag * 1j`` (float32 parts give complex64, float64
    complex128; the parts broadcast).

    >>> fusegrad.complex(fusegrad.tensor([1.]), fusegrad.tensor([2.]))
    tensor([1.+2.j])
    """
    _check_tensor("complex", "real", real)
    _check_tensor("complex", "imag", imag)
    return bind(P.complex_, real, imag)


@public(torch=True)
def polar(abs: Tensor, angle: Tensor) -> Tensor:  # noqa: A002 - torch's names
    """``abs * (cos(angle) + sin(angle) * 1j)``."""
    _check_tensor("polar", "abs", abs)
    _check_tensor("polar", "angle", angle)
    return complex(mul(abs, cos(angle)), mul(abs, sin(angle)))


def _part(prim, x: Tensor) -> Tensor:
    # A view of x's storage eagerly (numpy's .real/.imag are views), so a write through it
    # changes x, as in torch.
    return _mark_view(bind(prim, x), x, prim, {})


@public(torch=True)
def real(x: Tensor) -> Tensor:
    """The real part of a complex tensor, as a view; a real tensor itself."""
    return _part(P.real, x) if x.dtype.is_complex else x


@public(torch=True)
def imag(x: Tensor) -> Tensor:
    """The imaginary part of a complex tensor, as a view; torch's error for a real one."""
    if not x.dtype.is_complex:
        raise RuntimeError("imag is not implemented for tensors with non-complex dtypes.")
    return _part(P.imag, x)


@public(torch=True, method=True, inplace=True)
def conj_physical(x: Tensor) -> Tensor:
    """The complex conjugate as a new tensor; a real tensor itself."""
    return bind(P.conj, x) if x.dtype.is_complex else x


@public(torch=True, method=True)
def conj(x: Tensor) -> Tensor:
    """The complex conjugate. torch returns a lazily conjugated view; fusegrad computes the
    conjugate (``is_conj()`` stays False), with the same values and gradients."""
    return conj_physical(x)


@public(torch=True, method=True)
def resolve_conj(x: Tensor) -> Tensor:
    """``x``: no tensor of fusegrad carries torch's lazy conjugate bit."""
    return x


@public(torch=True, method=True)
def resolve_neg(x: Tensor) -> Tensor:
    """``x``: no tensor of fusegrad carries torch's lazy negative bit."""
    return x


@public(torch=True, method=True)
def is_conj(x: Tensor) -> bool:
    """False: ``conj`` computes the conjugate rather than setting torch's lazy bit."""
    return False


@public(torch=True, method=True)
def is_neg(x: Tensor) -> bool:
    return False


@public(torch=True, method=True)
@composite("AngleBackward0")
def angle(x: Tensor) -> Tensor:
    """The argument of each element: ``atan2(imag, real)``; of a real tensor, pi where it is
    negative and 0 elsewhere (its gradient is zero, as torch's)."""
    x = as_tensor_operand(x)
    if x.dtype.is_complex:
        return atan2(imag(x), real(x))
    x = cast(x, _float_dtype(x.dtype))
    return where(ne(x, x), x, where(lt(x, 0), math.pi, zeros_like(x)))


@public(torch=True, method=True, inplace=True)
@composite("SgnBackward0")
def sgn(x: Tensor) -> Tensor:
    """``x / |x|`` (0 where ``x`` is 0) for complex tensors; ``sign`` for real ones."""
    if not x.dtype.is_complex:
        return bind(P.sign, x) if x.dtype is not dtypes.bool_ else x
    modulus = abs_(x)
    zero = eq(modulus, 0)
    scale = complex(where(zero, 1.0, modulus), zeros_like(modulus))
    return where(zero, zeros_like(x), div(x, scale))


@public(torch=True)
def view_as_real(x: Tensor) -> Tensor:
    """A real view of a complex tensor, its parts along a new last dimension of size 2."""
    return _mark_view(bind(P.view_as_real, x), x, P.view_as_real, {})


@public(torch=True)
def view_as_complex(x: Tensor) -> Tensor:
    """A complex view of a float tensor whose last dimension (of size 2, stride 1) holds
    real and imaginary parts."""
    if x.ndim and x.shape[-1] == 2 and x._trace is None and isinstance(x._data, np.ndarray):
        # torch's layout rules: a complex element is two adjacent parts, at an even position
        if x.stride(-1) != 1:
            raise RuntimeError("Tensor must have a last dimension with stride 1")
        if any(st % 2 for st in x.stride()[:-1]):
            raise RuntimeError("Tensor must have a stride divisible by 2 for all but last "
                               "dimension")
        base = x._base if x._base is not None else x
        if (x._data.ctypes.data - base._data.ctypes.data) // x.itemsize % 2:
            raise RuntimeError("Tensor must have a storage_offset divisible by 2")
    return _mark_view(bind(P.view_as_complex, x), x, P.view_as_complex, {})


register_view_op("view_as_real", view_as_real)
register_view_op("view_as_complex", view_as_complex)
