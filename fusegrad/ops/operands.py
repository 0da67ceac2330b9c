"""Operand handling shared by the public ops: scalars to tensors, torch's dtype promotion, casts.
"""

from __future__ import annotations

import warnings

import numpy as np

from fusegrad import dtypes
from fusegrad.ops import prims as P
from fusegrad.ops.creation import tensor
from fusegrad.ops.primitive import bind, note_created
from fusegrad.ops.prims import normalize_axis
from fusegrad.symint import SymInt
from fusegrad.tensor import Tensor


def _is_scalar(v) -> bool:
    # A symbolic size (x * x.shape[0] while tracing) is an int whose value a call gives.
    return isinstance(v, (bool, int, float, complex, np.bool_, np.integer, np.floating,
                          np.complexfloating, SymInt))


def _scalar_tensor(value, dtype: dtypes.DType, like: Tensor | None = None) -> Tensor:
    """A 0-d constant of ``dtype`` holding a Python scalar. A Python int outside a narrower
    integer dtype wraps to it, as torch's scalar conversion does (uint8 + -3 is 253,
    int8 < 300 compares with 44); beyond int64 numpy's OverflowError stands. A symbolic
    size is a ``full`` node of its value (the graph reads it at call time), in the graph of
    ``like`` where that is a traced tensor (a node without operands is not bound to a trace
    otherwise: a VJP rule run by the autodiff pass divides by a symbolic row size)."""
    if isinstance(value, SymInt):
        attrs = {"shape": (), "value": value, "dtype": dtype}
        trace = getattr(like, "_trace", None)
        if trace is not None:
            return trace.process_primitive(P.full, (), attrs)
        return bind(P.full, **attrs)
    if type(value) is int and dtype.category == 1 and dtype.itemsize < 8 and \
            -(1 << 63) <= value < (1 << 63):
        info = np.iinfo(dtype.np_dtype)
        if not info.min <= value <= info.max:
            value = (value - int(info.min)) % (1 << (8 * dtype.itemsize)) + int(info.min)
    with np.errstate(over="ignore"):          # float16 1 + 1e5 is inf, silently, as torch's
        t = Tensor._wrap(np.asarray(value, dtype=dtype.np_dtype), dtype)
    note_created(t)
    return t


def as_tensor_operand(v, dtype: dtypes.DType | None = None) -> Tensor:
    if isinstance(v, Tensor):
        return v if dtype is None or v.dtype is dtype else cast(v, dtype)
    if _is_scalar(v):
        return _scalar_tensor(v, dtype or dtypes.result_type(v))
    if isinstance(v, np.ndarray):
        t = tensor(v)
        return t if dtype is None else cast(t, dtype)
    raise TypeError(f"expected a Tensor or a number, got {type(v).__name__}")


def _promote(op: str, *values, dtype: dtypes.DType | None = None) -> list[Tensor]:
    """Convert operands to tensors of their common (torch-promoted) dtype."""
    if dtype is None and len(values) == 2:
        a, b = values
        # The common cases first: two tensors of one dtype, and a tensor with a Python
        # float or int its dtype holds (x * 0.5 with float x, i + 1 with integer i).
        if isinstance(a, Tensor):
            dt = a._dtype
            if isinstance(b, Tensor):
                if b._dtype is dt:
                    return [a, b]
            elif (type(b) is float and dt.category == 2) or (type(b) is int and dt.category >= 1):
                return [a, _scalar_tensor(b, dt)]
    for v in values:
        if not isinstance(v, Tensor) and not _is_scalar(v):
            if isinstance(v, np.ndarray):
                continue
            raise TypeError(f"{op}(): argument 'other' must be Tensor or Number, not "
                            f"{type(v).__name__}")
    values = [as_tensor_operand(v) if isinstance(v, np.ndarray) else v for v in values]
    target = dtype or dtypes.result_type(*values)
    like = next((v for v in values if isinstance(v, Tensor)), None)
    return [cast(v, target) if isinstance(v, Tensor) else _scalar_tensor(v, target, like)
            for v in values]


def _at_user_line(*tensors) -> str:
    """`` (at file:line)`` naming the user's line when a tensor is traced, else ``""``: for
    errors raised by an op before it binds a primitive (the tracer adds the line to errors
    raised by a primitive's own rule)."""
    for t in tensors:
        trace = getattr(t, "_trace", None)
        if trace is not None:
            loc = trace._location()
            return f" (at {loc})" if loc else ""
    return ""


def _float_dtype(dt: dtypes.DType) -> dtypes.DType:
    """Integer inputs of float-valued ops compute in the default float type, as in torch
    (complex ones in their own type)."""
    return dt if dt.is_differentiable else dtypes.get_default_dtype()


def cast(x: Tensor, dtype) -> Tensor:
    dtype = dtypes.as_dtype(dtype)
    if x.dtype is dtype:
        return x
    if x.dtype.is_complex and not dtype.is_complex:
        warnings.warn("Casting complex values to real discards the imaginary part", UserWarning,
                      stacklevel=2)
    return bind(P.cast, x, dtype=dtype)


def _dtype_title(dt: dtypes.DType) -> str:
    return {"float32": "Float", "float64": "Double", "int64": "Long", "int32": "Int",
            "float16": "Half", "bool": "Bool", "complex64": "ComplexFloat",
            "complex128": "ComplexDouble"}.get(dt.name, dt.name)


def _dims(x: Tensor, dim, op: str) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(x.ndim))
    if isinstance(dim, (int, np.integer)):
        dim = (int(dim),)
    axes = tuple(sorted({normalize_axis(d, x.ndim, op) for d in dim}))
    if len(axes) != len(tuple(dim)):
        raise RuntimeError(f"{op}: dim {list(dim)} appears multiple times in the list of dims")
    return axes if x.ndim else ()


def _index_tensor(values, like: Tensor | None = None) -> Tensor:
    """An int64 tensor of ``values``; on ``like``'s device when that is a cuda tensor."""
    t = Tensor._wrap(np.asarray(values, dtype=np.int64), dtypes.int64)
    if like is not None and like._trace is None and not isinstance(like._data, np.ndarray):
        t = t.to(like.device)
    return t


def take(x: Tensor, idx: Tensor, axis: int) -> Tensor:
    return bind(P.take, x, cast(idx, dtypes.int64), axis=axis)


def take_add(x: Tensor, idx: Tensor, src: Tensor, axis: int) -> Tensor:
    return bind(P.index_add, x, cast(idx, dtypes.int64), src, axis=axis)
