"""Shared by the primitive definitions: broadcasting, the dtype checks of their rules, and
the conjugate and float32 compute that their VJPs and references use.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np

from fusegrad import dtypes
from fusegrad.ops.primitive import (
    ShapeError,
    TensorType,
)

# torch computes log(-1) = nan and 1/0 = inf silently; numpy warns. The filter is scoped to
# the numpy calls made in this module (warnings name the calling module), so user code keeps
# numpy's default; np.errstate per call would cost ~3 us on every eager op.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=__name__)


# --------------------------------------------------------------------------- shape helpers


def broadcast_shapes(*shapes: tuple[int, ...], op: str = "broadcast") -> tuple[int, ...]:
    """numpy/torch broadcasting of ``shapes``; raises with torch's message on a mismatch."""
    ndim = max((len(s) for s in shapes), default=0)
    result = [1] * ndim
    for s in shapes:
        offset = ndim - len(s)
        for i, d in enumerate(s):
            r = result[offset + i]
            if r == 1:
                result[offset + i] = d
            elif d != 1 and d != r:
                raise ShapeError(
                    f"{op}: the size of tensor a ({r}) must match the size of tensor b ({d}) at "
                    f"non-singleton dimension {offset + i} (shapes "
                    f"{', '.join(str(list(x)) for x in shapes)})")
    return tuple(result)


def _types_str(types) -> str:
    return ", ".join(str(t) for t in types)


def _same_dtype(op: str, *types: TensorType) -> dtypes.DType:
    dt = types[0].dtype
    for t in types[1:]:
        if t.dtype is not dt:
            raise ShapeError(f"{op}: operands must have one dtype, got {_types_str(types)}")
    return dt


def _require_float(op: str, t: TensorType, complex_ok: bool = False) -> None:
    if not (t.dtype.is_floating_point or complex_ok and t.dtype.is_complex):
        raise ShapeError(f"{op}: expected a floating-point operand, got {t}")


def _require_real(op: str, t: TensorType) -> None:
    if t.dtype.is_complex:
        raise ShapeError(f"{op} is not implemented for complex tensors (got {t})")


def _conj(t):
    """``t``'s complex conjugate; ``t`` itself when real. VJP rules follow torch's
    convention: the cotangent of a complex value ``z`` is dL/d(conj z), so a holomorphic
    op's rule multiplies by the conjugate of its derivative (mul's ``g * conj(y)``)."""
    return t.conj_physical() if t.dtype.is_complex else t


def _np_float_compute(a: np.ndarray) -> np.ndarray:
    """16-bit floats compute in float32 (as torch does on the CPU) and are rounded back."""
    if a.dtype == np.float16 or a.dtype == ml_dtypes.bfloat16:
        return a.astype(np.float32)
    return a


def _sum_to(g, shape: tuple[int, ...]):
    """Reduce a broadcast gradient back to ``shape``."""
    return g.sum_to_size(shape) if g.shape != tuple(shape) else g


# The public view ops that VJP rules return their gradients through, so that a gradient is a
# view of its operand's storage as the public op makes it: ``slice_axes(x, starts, stops,
# steps)`` (fusegrad.ops.movement), ``view_as_real(x)`` and ``view_as_complex(x)``
# (fusegrad.ops.complex). Those modules sit above the primitives and fill this at import
# (register_view_op); the rules call view_op(name) when they run, long after.
_VIEW_OPS: dict = dict.fromkeys(("slice_axes", "view_as_real", "view_as_complex"))


def register_view_op(name: str, fn) -> None:
    """Fill the view-op slot ``name`` of :data:`_VIEW_OPS`."""
    if name not in _VIEW_OPS:
        raise KeyError(f"no view-op slot {name!r} (slots: {', '.join(_VIEW_OPS)})")
    _VIEW_OPS[name] = fn


def view_op(name: str):
    """The public view op ``name`` registered by the ops above the primitives."""
    return _VIEW_OPS[name]
