"""Data types and PyTorch's type-promotion rules.

A :class:`DType` wraps a numpy dtype (bfloat16 comes from ml_dtypes, as in JAX). Promotion
follows ``torch.result_type``: operands are ranked by *category* (bool < integer < floating <
complex) and by *priority* (tensors with dimensions > zero-dim tensors > Python scalars). A
lower priority operand only changes the result when it belongs to a higher category, so
``int_tensor * 2.5`` is float32 and ``float16_tensor + 1.0`` stays float16; a lower complex
operand keeps the precision of a higher floating one (``float64_tensor * 1j`` is complex128).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from fusegrad.symint import SymInt

__all__ = [
    "DType", "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
    "uint8", "uint32", "bool_", "complex64", "complex128", "get_default_dtype",
    "set_default_dtype", "default_complex_dtype", "to_real", "to_complex", "promote_types",
    "result_type", "from_numpy_dtype", "as_dtype",
]


@dataclass(frozen=True, eq=False)
class DType:
    """A tensor element type. Compared by identity: there is one object per type."""

    name: str
    short: str            # the IR's spelling: f32, i64, ...
    np_dtype: np.dtype
    category: int         # 0 bool, 1 integer, 2 floating, 3 complex

    @property
    def is_floating_point(self) -> bool:
        """Real floating point only, as torch's (complex types are not)."""
        return self.category == 2

    @property
    def is_complex(self) -> bool:
        return self.category == 3

    @property
    def is_differentiable(self) -> bool:
        """Floating or complex: the types a gradient can flow through (torch's
        ``isDifferentiableType``)."""
        return self.category >= 2

    @property
    def is_signed(self) -> bool:
        return self.category >= 2 or (self.category == 1 and self.np_dtype.kind == "i")

    @property
    def itemsize(self) -> int:
        return self.np_dtype.itemsize

    def __repr__(self) -> str:
        return f"fusegrad.{self.name}"

    def __reduce__(self):
        return (as_dtype, (self.name,))


def _make(name: str, short: str, np_dtype, category: int) -> DType:
    return DType(name, short, np.dtype(np_dtype), category)


bool_ = _make("bool", "i1", np.bool_, 0)
uint8 = _make("uint8", "u8", np.uint8, 1)
int8 = _make("int8", "i8", np.int8, 1)
int16 = _make("int16", "i16", np.int16, 1)
int32 = _make("int32", "i32", np.int32, 1)
int64 = _make("int64", "i64", np.int64, 1)
uint32 = _make("uint32", "u32", np.uint32, 1)   # internal: random bits
float16 = _make("float16", "f16", np.float16, 2)
bfloat16 = _make("bfloat16", "bf16", ml_dtypes.bfloat16, 2)
float32 = _make("float32", "f32", np.float32, 2)
float64 = _make("float64", "f64", np.float64, 2)
complex64 = _make("complex64", "c64", np.complex64, 3)
complex128 = _make("complex128", "c128", np.complex128, 3)

ALL_DTYPES = (bool_, uint8, int8, int16, int32, int64, uint32, float16, bfloat16, float32, float64,
              complex64, complex128)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NAME.update({d.short: d for d in ALL_DTYPES})
_BY_NAME.update({"half": float16, "float": float32, "double": float64, "long": int64, "int": int32,
                 "short": int16, "cfloat": complex64, "cdouble": complex128})
_BY_NP = {d.np_dtype: d for d in ALL_DTYPES}

_default_float = float32


def get_default_dtype() -> DType:
    """The dtype of tensors made from Python floats (float32 unless changed)."""
    return _default_float


def set_default_dtype(dtype: DType) -> None:
    """Set the dtype used for Python floats, as ``torch.set_default_dtype``."""
    global _default_float
    dtype = as_dtype(dtype)
    if not dtype.is_floating_point:
        raise TypeError(f"only floating-point types are supported as the default type, got {dtype}")
    _default_float = dtype


def default_complex_dtype() -> DType:
    """The dtype of tensors made from Python complex numbers: complex64 with the default
    float32, complex128 with float64 (torch's rule)."""
    return complex128 if _default_float is float64 else complex64


# The real type of a complex one and back (torch's toRealValueType / toComplexType).
_REAL_OF = {complex64: float32, complex128: float64}
_COMPLEX_OF = {float32: complex64, float64: complex128, bfloat16: complex64}


def to_real(dtype: DType) -> DType:
    """The real dtype of a complex one's parts (complex64 -> float32); others unchanged."""
    return _REAL_OF.get(dtype, dtype)


def to_complex(dtype: DType) -> DType:
    """The complex dtype with ``dtype``'s precision (float64 -> complex128); complex
    unchanged. float16's would be complex32, a type fusegrad does not have."""
    if dtype.category == 3:
        return dtype
    try:
        return _COMPLEX_OF[dtype]
    except KeyError:
        raise RuntimeError(f"there is no complex type for {dtype} in fusegrad (torch's would be "
                        "complex32, which fusegrad does not support)") from None


def from_numpy_dtype(np_dtype) -> DType:
    """The fusegrad dtype of a numpy dtype; raises TypeError for unsupported ones."""
    np_dtype = np.dtype(np_dtype)
    try:
        return _BY_NP[np_dtype]
    except KeyError:
        raise TypeError(
            f"can't convert np.ndarray of type numpy.{np_dtype}. The only supported types are: "
            "float64, float32, float16, complex64, complex128, bfloat16, int64, int32, int16, "
            "int8, uint8, and bool."
        ) from None


def as_dtype(value) -> DType:
    """Coerce a DType, a name (``"float32"``, ``"f32"``), a numpy dtype or a Python type."""
    if isinstance(value, DType):
        return value
    if value is float:
        return _default_float
    if value is int:
        return int64
    if value is bool:
        return bool_
    if value is complex:
        return default_complex_dtype()
    if isinstance(value, str):
        try:
            return _BY_NAME[value]
        except KeyError:
            raise TypeError(f"unknown dtype {value!r}") from None
    return from_numpy_dtype(value)


def promote_types(a: DType, b: DType) -> DType:
    """The smallest dtype both ``a`` and ``b`` convert to safely (``torch.promote_types``)."""
    if a is b:
        return a
    if a.category == 3 or b.category == 3:
        # complex with anything: the wider of the two precisions (float64 with complex64 is
        # complex128, float16 or int64 with complex64 complex64).
        real = promote_types(to_real(a), to_real(b))
        return complex128 if real is float64 else complex64
    if a.category != b.category:
        return a if a.category > b.category else b
    if a.category == 2:
        if {a, b} == {float16, bfloat16}:
            return float32
        return a if a.itemsize >= b.itemsize else b
    if a.category == 0:
        return a
    # Integers: numpy's table agrees with torch's for the types torch has.
    return from_numpy_dtype(np.promote_types(a.np_dtype, b.np_dtype))


def _scalar_dtype(value) -> DType:
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer, SymInt)):
        return int64
    if isinstance(value, (float, np.floating)):
        return _default_float
    if isinstance(value, (complex, np.complexfloating)):
        return default_complex_dtype()
    raise TypeError(f"unsupported scalar type {type(value).__name__}")


def _combine(higher: DType | None, lower: DType | None) -> DType | None:
    """Merge the result of a higher-priority group with a lower-priority one."""
    if higher is None:
        return lower
    if lower is None:
        return higher
    # A lower-priority operand matters only when it brings a higher category; a complex one
    # keeps a floating higher operand's precision (torch's combine_categories).
    if lower.category == 3 and higher.category == 2:
        return to_complex(higher)
    return lower if lower.category > higher.category else higher


def result_type(*operands) -> DType:
    """PyTorch's ``result_type`` over tensors and Python scalars.

    Each operand is a tensor-like object with ``dtype`` and ``ndim``, or a Python number.
    """
    dim_result = zero_result = scalar_result = None
    for op in operands:
        # numpy scalars (np.float64(2.0)) have a dtype and an ndim too, but torch treats
        # them as Python numbers: t_f32 * np.float64(2) stays float32.
        if hasattr(op, "dtype") and hasattr(op, "ndim") and not isinstance(op, np.generic):
            dt = op.dtype if isinstance(op.dtype, DType) else from_numpy_dtype(op.dtype)
            if op.ndim > 0:
                dim_result = dt if dim_result is None else promote_types(dim_result, dt)
            else:
                zero_result = dt if zero_result is None else promote_types(zero_result, dt)
        else:
            dt = _scalar_dtype(op)
            if scalar_result is None or dt.category > scalar_result.category:
                scalar_result = dt
    result = _combine(dim_result, _combine(zero_result, scalar_result))
    if result is None:
        raise TypeError("result_type needs at least one operand")
    return result
