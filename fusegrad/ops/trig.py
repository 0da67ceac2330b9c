"""Inverse and hyperbolic trigonometric ops (``asin`` ... ``atanh``, ``atan2``) and their
numpy-style ``arc*`` aliases; integer inputs compute in the default float type."""

from __future__ import annotations

from fusegrad.ops import prims as P
from fusegrad.ops.elementwise import _float_unary
from fusegrad.ops.operands import _float_dtype, _promote, cast
from fusegrad.ops.primitive import bind
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor

asin = public(_float_unary(P.asin), name="asin", torch=True, method=True, inplace=True)
acos = public(_float_unary(P.acos), name="acos", torch=True, method=True, inplace=True)
atan = public(_float_unary(P.atan), name="atan", torch=True, method=True, inplace=True)
sinh = public(_float_unary(P.sinh), name="sinh", torch=True, method=True, inplace=True)
cosh = public(_float_unary(P.cosh), name="cosh", torch=True, method=True, inplace=True)
asinh = public(_float_unary(P.asinh), name="asinh", torch=True, method=True, inplace=True)
acosh = public(_float_unary(P.acosh), name="acosh", torch=True, method=True, inplace=True)
atanh = public(_float_unary(P.atanh), name="atanh", torch=True, method=True, inplace=True)


@public(torch=True, method=True, inplace=True)
def atan2(x, other) -> Tensor:
    """The angle of the point ``(other, x)``: ``atan(x / other)`` in the right quadrant."""
    a, b = _promote("atan2", x, other)
    dt = _float_dtype(a.dtype)
    return bind(P.atan2, cast(a, dt), cast(b, dt))


arcsin = public(asin, name="arcsin", torch=True, method=True, inplace=True)
arccos = public(acos, name="arccos", torch=True, method=True, inplace=True)
arctan = public(atan, name="arctan", torch=True, method=True, inplace=True)
arcsinh = public(asinh, name="arcsinh", torch=True, method=True, inplace=True)
arccosh = public(acosh, name="arccosh", torch=True, method=True, inplace=True)
arctanh = public(atanh, name="arctanh", torch=True, method=True, inplace=True)
arctan2 = public(atan2, name="arctan2", torch=True, method=True, inplace=True)
