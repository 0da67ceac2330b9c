"""The reductions over a set of axes, and the contraction (``matmul``).
"""

from __future__ import annotations

import warnings
from typing import Callable

import ml_dtypes
import numpy as np

from fusegrad import dtypes
from fusegrad.ops.primitive import (
    Kind,
    Primitive,
    Rule,
    ShapeError,
    TensorType,
    bind,
    jvp_rule,
    no_jvp,
    register,
)
from fusegrad.ops.prims_common import (
    _conj,
    _np_float_compute,
    _require_real,
    _sum_to,
    add_tangents,
    broadcast_shapes,
)

# torch computes log(-1) = nan and 1/0 = inf silently; numpy warns. The filter is scoped to
# the numpy calls made in this module (warnings name the calling module), so user code keeps
# numpy's default; np.errstate per call would cost ~3 us on every eager op.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=__name__)


# --------------------------------------------------------------------------- reductions


def _check_axes(op: str, x: TensorType, axes: tuple[int, ...]) -> None:
    for a in axes:
        if not 0 <= a < max(x.ndim, 1):
            raise ShapeError(f"{op}: axis {a} out of range for {x}")
    if len(set(axes)) != len(axes):
        raise ShapeError(f"{op}: repeated axis in {axes}")


def _reduced_shape(x: TensorType, axes) -> tuple[int, ...]:
    return tuple(d for i, d in enumerate(x.shape) if i not in axes)


def _keepdim_shape(shape, axes) -> tuple[int, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def _expand_back(g, x, axes):
    """Broadcast a reduced gradient back over the reduced axes of ``x``."""
    return g.reshape(_keepdim_shape(x.shape, axes)).expand(*x.shape)


def _reduce(name, impl, vjp: Rule, grad_name, out_dtype=None, identity_needed=False,
            complex_ok=True):
    def infer(x: TensorType, *, axes: tuple[int, ...]) -> TensorType:
        _check_axes(name, x, axes)
        if not complex_ok:
            _require_real(name, x)
        if identity_needed and x.numel == 0 and any(x.shape[a] == 0 for a in axes):
            raise ShapeError(f"{name}(): Expected reduction dim to have non-zero size "
                             f"(operand {x}, axes {axes})")
        dt = out_dtype(x.dtype) if out_dtype else x.dtype
        return TensorType(_reduced_shape(x, axes), dt)

    def run(x, *, axes):
        if x.ndim == 0:
            return impl(x, axis=None)
        return impl(_np_float_compute(x), axis=axes)

    return register(Primitive(name, Kind.REDUCE, infer, run, (vjp,), grad_name, attrs=("axes",)))


def _sum_dtype(dt):
    # torch sums bools and small integers to int64
    return dtypes.int64 if dt.category < 2 else dt


def _sum_vjp(g, out, x, *, axes):
    return _expand_back(g, x, axes)


sum_ = _reduce("sum", np.add.reduce, Rule(_sum_vjp), "SumBackward1", out_dtype=_sum_dtype)


def _prod_vjp(g, out, x, *, axes):
    # d prod / d x_i = prod_{j != i} x_j; computed as out / x away from zeros, and by an
    # explicit product of the others where x_i == 0 (one zero keeps a nonzero gradient).
    # Where x_i is one of exactly two zeros the value is 0, written P * (S - x_i) (P: the
    # product of the nonzeros, S: the sum of x over the zeros, 0 with gradient 1 at each) so
    # that its own derivative, P towards the other zero, is right (second derivatives).
    full = _expand_back(out, x, axes)
    zero_free = x.where(x != 0, x.new_ones(()))
    nonzeros = _expand_back(bind(prod, zero_free, axes=tuple(axes)), x, axes)
    others = nonzeros / zero_free
    zeros = (x == 0).to(x.dtype)
    at_zeros = x.where(x == 0, x.new_zeros(()))
    # (dim=() would be every dim, as in torch: a product over no axes counts each element.)
    nzeros = _expand_back(zeros.sum(dim=list(axes)), x, axes) if axes else zeros
    total = _expand_back(at_zeros.sum(dim=list(axes)), x, axes) if axes else at_zeros
    two = (nonzeros * (total - x)).where(nzeros == 2, x.new_zeros(()))
    only_zero_is_self = (x == 0) & (nzeros == 1)
    grad_x = (full / zero_free).where(x != 0, others.where(only_zero_is_self, two))
    return _expand_back(g, x, axes) * _conj(grad_x)


prod = _reduce("prod", np.multiply.reduce, Rule(_prod_vjp, (0,), True), "ProdBackward1",
               out_dtype=_sum_dtype)


def _extremum_vjp(g, out, x, *, axes):
    # Evenly split among ties, as torch's amax/amin (and max() without dim) do; a NaN result
    # is shared by the NaN elements (it was NaN everywhere: no element equals NaN).
    o = _expand_back(out, x, axes)
    mask = ((x == o) | ((x != x) & (o != o))).to(g.dtype)
    count = _expand_back(mask.sum(dim=list(axes)), x, axes) if axes else mask
    return _expand_back(g, x, axes) * mask / count


max_ = _reduce("max", np.maximum.reduce, Rule(_extremum_vjp, (0,), True), "AmaxBackward0",
               identity_needed=True, complex_ok=False)
min_ = _reduce("min", np.minimum.reduce, Rule(_extremum_vjp, (0,), True), "AminBackward0",
               identity_needed=True, complex_ok=False)


def _arg_reduce(name, impl):
    def infer(x: TensorType, *, axis: int) -> TensorType:
        _check_axes(name, x, (axis,))
        _require_real(name, x)
        if x.ndim and x.shape[axis] == 0:
            raise ShapeError(f"{name}(): Expected reduction dim {axis} to have non-zero size")
        return TensorType(_reduced_shape(x, (axis,)), dtypes.int64)

    def run(x, *, axis):
        return impl(_np_float_compute(x), axis=axis if x.ndim else None)

    return register(Primitive(name, Kind.REDUCE, infer, run, attrs=("axis",)))


argmax = _arg_reduce("argmax", np.argmax)
argmin = _arg_reduce("argmin", np.argmin)


# --------------------------------------------------------------------------- contraction


# torch's names for dtypes in its matmul errors (caffe2::TypeMeta names).
_TORCH_C_NAMES = {"float32": "float", "float64": "double", "float16": "c10::Half",
                  "bfloat16": "c10::BFloat16", "int64": "long int", "int32": "int",
                  "int16": "short int", "int8": "signed char", "uint8": "unsigned char",
                  "bool": "bool", "complex64": "c10::complex<float>",
                  "complex128": "c10::complex<double>"}


def matmul_dtype_message(a: TensorType, b: TensorType) -> str:
    """torch's error for a matmul of two dtypes (it never promotes), with the operands."""
    na, nb = (_TORCH_C_NAMES.get(t.dtype.name, t.dtype.name) for t in (a, b))
    return (f"expected m1 and m2 to have the same dtype, but got: {na} != {nb} (matmul of "
            f"{a.dtype.name}{list(a.shape)} and {b.dtype.name}{list(b.shape)})")


def _matmul_infer(a: TensorType, b: TensorType) -> TensorType:
    if a.dtype is not b.dtype:
        raise ShapeError(matmul_dtype_message(a, b))
    dt = a.dtype
    if a.ndim < 2 or b.ndim < 2:
        raise ShapeError(f"matmul primitive needs 2-D or batched operands, got {a} and {b}")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(
            f"mat1 and mat2 shapes cannot be multiplied ({a.shape[-2]}x{a.shape[-1]} and "
            f"{b.shape[-2]}x{b.shape[-1]})")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2], op=f"matmul (batch dims of {a} and {b})")
    return TensorType(batch + (a.shape[-2], b.shape[-1]), dt)


# A bf16 x bf16 product of 2-D arrays with float32 sums, rounded once: (a, b) -> the result,
# or None for a product it does not take. Filled by fusegrad.runtime.cpu at import (the
# generated GEMM where compiled programs use it, numpy's BLAS between native conversions
# elsewhere), through register_bf16_matmul.
_bf16_matmul_2d: Callable | None = None


def register_bf16_matmul(fn: Callable) -> None:
    """Let eager bf16 products run ``fn(a, b)`` (the runtime's generated GEMM) first."""
    global _bf16_matmul_2d
    _bf16_matmul_2d = fn


# Whether compiled products run on the generated GEMM (whose bf16 variant takes 16-bit
# operands as they are: vdpbf16ps where the CPU has AVX512_BF16), asked when a graph is
# traced. Filled by fusegrad.runtime.cpu at import (register_gemm_enabled).
_gemm_enabled: Callable[[], bool] | None = None


def register_gemm_enabled(fn: Callable[[], bool]) -> None:
    """Let :func:`gemm_enabled` ask ``fn`` (the runtime's ``native_gemm_enabled``)."""
    global _gemm_enabled
    _gemm_enabled = fn


def gemm_enabled() -> bool:
    """Whether compiled products run on the generated GEMM rather than numpy's BLAS."""
    return _gemm_enabled is not None and _gemm_enabled()


def _matmul_impl(a, b):
    if a.dtype.kind in "iub":
        return np.matmul(a, b)
    if (_bf16_matmul_2d is not None and a.dtype == ml_dtypes.bfloat16 == b.dtype
            and a.ndim == b.ndim == 2):
        out = _bf16_matmul_2d(a, b)
        if out is not None:
            return out
    return np.matmul(_np_float_compute(a), _np_float_compute(b))


matmul = register(Primitive("matmul", Kind.CONTRACTION, _matmul_infer, _matmul_impl, (
    Rule(lambda g, out, a, b: _sum_to(bind(matmul, g, _conj(b).mT), a.shape), (1,)),
    Rule(lambda g, out, a, b: _sum_to(bind(matmul, _conj(a).mT, g), b.shape), (0,))),
    "MmBackward0"))


# --------------------------------------------------------------------------- JVP rules
# Forward mode (fusegrad.ops.dual): sum and matmul are linear in each operand; prod, max and
# min take their VJP's weights (the VJP of a cotangent of ones is d out / d x per element,
# each element feeding one output) times the tangent, summed over the reduced axes.

jvp_rule(sum_)(lambda ts, out, x, *, axes: bind(sum_, ts[0], axes=axes))


def _reduce_from_vjp(prim):
    def rule(ts, out, x, *, axes):
        weights = _conj(prim.cotangent(0, out.new_ones(tuple(out.shape)), out, (x,),
                                       {"axes": axes}))
        return bind(sum_, weights * ts[0], axes=axes)
    return rule


for _prim in (prod, max_, min_):
    jvp_rule(_prim)(_reduce_from_vjp(_prim))


@jvp_rule(matmul)
def _matmul_jvp(ts, out, a, b):
    ta, tb = ts
    return add_tangents(None if ta is None else bind(matmul, ta, b),
                        None if tb is None else bind(matmul, a, tb))


no_jvp(argmax, "an integer result (an index)")
no_jvp(argmin, "an integer result (an index)")


# --------------------------------------------------------------------------- batching rules

from fusegrad.ops.batching import axes_rule, batching, to_front  # noqa: E402
from fusegrad.ops.primitive import PRIMITIVES  # noqa: E402

for _prim in (sum_, prod, max_, min_):
    batching(_prim)(axes_rule(_prim))
for _prim in (argmax, argmin):
    batching(_prim)(axes_rule(_prim, "axis"))
del _prim


@batching(matmul)
def _matmul_batching(args, dims):
    (a, b), (da, db) = args, dims
    if db is None and b.ndim == 2:
        # Each example times one matrix: the examples' rows are one GEMM's rows.
        a = to_front(a, da)
        rows = a.reshape((-1, a.shape[-1]))
        return bind(matmul, rows, b).reshape(tuple(a.shape[:-1]) + (b.shape[-1],)), 0
    # Batched operands batch-first, with size-1 axes after the batch so that every example
    # has the rank of the other's: the examples' batch dims broadcast as they did.
    ndim = max(a.ndim - (da is not None), b.ndim - (db is not None))
    ops = []
    for x, d in ((a, da), (b, db)):
        if d is not None:
            x = to_front(x, d)
            missing = ndim - (x.ndim - 1)
            if missing:
                x = x.reshape((x.shape[0],) + (1,) * missing + tuple(x.shape[1:]))
        ops.append(x)
    if ops[0].shape[-1] == 1:
        # A contraction of length one is an outer product (the per-example gradient of a
        # weight): one product per element, which a broadcasting multiply computes in an
        # elementwise kernel instead of a batch of rank-1 GEMMs. It is computed transposed
        # and transposed back: a linear layer's weight gradient (of x @ W.t()) transposes
        # it once more, the two transposes cancel, and the gradient is written in its own
        # layout rather than copied out of a transposed one.
        a, b = (_swap_last(x) for x in ops)
        return _swap_last(bind(PRIMITIVES["mul"], b, a)), 0
    return bind(matmul, *ops), 0


def _swap_last(x):
    """``x`` with its last two axes swapped (a view)."""
    n = x.ndim
    return bind(PRIMITIVES["permute"], x, perm=tuple(range(n - 2)) + (n - 1, n - 2))
