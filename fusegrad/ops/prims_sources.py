"""The source primitives: constants, ``iota`` and counter-based random numbers.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from fusegrad import dtypes
from fusegrad.ops import philox
from fusegrad.ops.primitive import (
    ConstantData,
    Kind,
    Primitive,
    ShapeError,
    TensorType,
    no_jvp,
    register,
)

# torch computes log(-1) = nan and 1/0 = inf silently; numpy warns. The filter is scoped to
# the numpy calls made in this module (warnings name the calling module), so user code keeps
# numpy's default; np.errstate per call would cost ~3 us on every eager op.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=__name__)


# --------------------------------------------------------------------------- sources


def _full_infer(*, shape, value, dtype) -> TensorType:
    # An integer the dtype cannot hold would wrap in compiled code and raise in numpy (a
    # fraction truncates in both, as torch's fill does; any number is a bool).
    if isinstance(dtype, dtypes.DType) and dtype.category == 1 and \
            isinstance(value, (int, float, np.integer, np.floating)):
        info = np.iinfo(dtype.np_dtype)
        if not (math.isfinite(value) and info.min <= math.trunc(value) <= info.max):
            raise ShapeError(f"full: value {value!r} is not a value of dtype {dtype.short}")
    return TensorType(tuple(shape), dtype)


full = register(Primitive(
    "full", Kind.SOURCE, _full_infer,
    lambda *, shape, value, dtype: np.full(shape, value, dtype=dtype.np_dtype),
    attrs=("shape", "value", "dtype")))


def _constant_infer(*, value: ConstantData) -> TensorType:
    return TensorType(value.array.shape, dtypes.from_numpy_dtype(value.array.dtype))


constant = register(Primitive(
    "constant", Kind.SOURCE, _constant_infer, lambda *, value: value.array.copy(),
    attrs=("value",), doc="A tensor constant captured while tracing (numpy array)."))


def _iota_infer(*, shape, axis, dtype) -> TensorType:
    if not 0 <= axis < len(shape):
        raise ShapeError(f"iota: axis {axis} is out of range for shape {list(shape)}")
    return TensorType(tuple(shape), dtype)


def _iota_impl(*, shape, axis, dtype):
    ramp = np.arange(shape[axis], dtype=dtype.np_dtype)
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return np.broadcast_to(ramp.reshape(view), shape).copy()


iota = register(Primitive("iota", Kind.SOURCE, _iota_infer, _iota_impl,
                          attrs=("shape", "axis", "dtype")))


def _rand_infer(key: TensorType, *, shape, dtype) -> TensorType:
    if key.shape != (2,) or key.dtype is not dtypes.int64:
        raise ShapeError(f"random: the key must be i64[2] (seed, offset), got {key}")
    return TensorType(tuple(shape), dtype)


def _rand_impl(key, *, shape, dtype):
    return philox.uniform(int(key[0]), int(key[1]), shape, dtype.np_dtype)


random_uniform = register(Primitive(
    "random_uniform", Kind.SOURCE, _rand_infer, _rand_impl, attrs=("shape", "dtype"),
    doc="Uniform [0, 1) numbers from a counter-based generator keyed by (seed, offset)."))


# --------------------------------------------------------------------------- JVP rules
# Forward mode (fusegrad.ops.dual): sources have no differentiable operand.

for _prim in (full, constant, iota):
    no_jvp(_prim, "a source: no operands")
no_jvp(random_uniform, "a source: its only operand is an integer key")


# --------------------------------------------------------------------------- batching rules
# full, constant and iota take no operands: nothing of theirs is ever batched. A batch of
# keys (vmap's randomness="different") draws each example's numbers from its own key: the
# examples' counters are not one contiguous request (each starts on a new block of four), so
# one draw for the batch would give other numbers than the examples' draws.

from fusegrad.ops.batching import fallback  # noqa: E402

fallback(random_uniform, "one draw per example key (the examples' counters are not one request)")
