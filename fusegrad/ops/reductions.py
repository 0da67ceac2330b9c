"""Reductions: sum, prod, mean, var/std, max/min with indices, logsumexp, norms, cumsum.
"""

from __future__ import annotations

import builtins
import math
from collections import namedtuple

import numpy as np

from fusegrad import dtypes
from fusegrad.ops import prims as P
from fusegrad.ops.complex import imag, real
from fusegrad.ops.composite import _named, composite, opmath
from fusegrad.ops.elementwise import (
    _to_bool,
    abs,
    add,
    div,
    eq,
    exp,
    isinf,
    log,
    logical_not,
    maximum,
    minimum,
    mul,
    ne,
    pow,
    sqrt,
    sub,
    where,
)
from fusegrad.ops.indexing import gather
from fusegrad.ops.movement import diagonal, flip, movedim, reshape_prim, unsqueeze
from fusegrad.ops.operands import _dims, _dtype_title, _float_dtype, cast
from fusegrad.ops.primitive import bind
from fusegrad.ops.prims import normalize_axis
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor


def _keep(out: Tensor, x: Tensor, axes, keepdim: bool) -> Tensor:
    if keepdim and x.ndim:
        return reshape_prim(out, P._keepdim_shape(tuple(x.shape), axes))
    return out


def _reduce(prim, x: Tensor, dim, keepdim: bool, op: str) -> Tensor:
    axes = _dims(x, dim, op)
    return _keep(bind(prim, x, axes=axes), x, axes, keepdim)


def _all_if_empty(dim):
    """torch's sum, mean, amax, amin, var and std read ``dim=()`` (or ``[]``) as every dim."""
    return None if isinstance(dim, (tuple, list)) and not dim else dim


def _in_dtype(out: Tensor, dtype) -> Tensor:
    """A reduction asked for an integer ``dtype`` keeps it (its int64 sum wraps as torch's
    accumulation in that dtype does); others already have theirs."""
    return out if dtype is None or out.dtype is dtypes.as_dtype(dtype) else cast(out, dtype)


@public(torch=True, method=True)
def sum(x: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:  # noqa: A001
    """Sum over ``dim`` (all dims when None); bools and integers sum to int64."""
    if dtype is not None:
        x = cast(x, dtype)
    dim = _all_if_empty(dim)
    out = _in_dtype(_reduce(P.sum_, x, dim, keepdim, "sum"), dtype)
    return _named(out, "SumBackward0" if dim is None else "SumBackward1")


@public(method=True)
def sum_to_size(x: Tensor, *size) -> Tensor:
    """Sum broadcast dims so the result has shape ``size``."""
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    lead = x.ndim - len(shape)
    if lead < 0 or builtins.any(d not in (1, x.shape[lead + i]) for i, d in enumerate(shape)):
        raise RuntimeError(f"sum_to_size: size {{{list(shape)}}} is not expandable to size "
                           f"{{{list(x.shape)}}}.")
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
    if not axes:
        return x
    out = bind(P.sum_, x, axes=axes)
    out = reshape_prim(out, tuple(shape)) if tuple(out.shape) != tuple(shape) else out
    return _named(out, "SumBackward1")


def reduce_prod(x: Tensor, axes: tuple[int, ...]) -> Tensor:
    return bind(P.prod, x, axes=tuple(axes))


@public(torch=True, method=True)
def prod(x: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    if dtype is not None:
        x = cast(x, dtype)
    if dim is not None and not isinstance(dim, (int, np.integer)):
        raise TypeError("prod(): argument 'dim' must be int")
    out = _in_dtype(_reduce(P.prod, x, dim, keepdim, "prod"), dtype)
    return _named(out, "ProdBackward0" if dim is None else "ProdBackward1")


def _count(x: Tensor, axes) -> int:
    n = 1
    for a in axes:
        n *= x.shape[a]
    return n


@composite("MeanBackward1")
@opmath
def _mean(x: Tensor, dim, keepdim: bool) -> Tensor:
    axes = _dims(x, dim, "mean")
    return _keep(div(bind(P.sum_, x, axes=axes), _count(x, axes)), x, axes, keepdim)


@public(torch=True, method=True)
def mean(x: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Arithmetic mean; floating-point inputs only, as in torch."""
    if dtype is not None:
        x = cast(x, dtype)
    if not x.dtype.is_differentiable:
        raise RuntimeError(
            f"mean(): could not infer output dtype. Input dtype must be either a floating point "
            f"or complex dtype. Got: {_dtype_title(x.dtype)}")
    dim = _all_if_empty(dim)
    out = _mean(x, dim, keepdim)
    return _named(out, "MeanBackward0" if dim is None else "MeanBackward1")


def _correction(unbiased, correction) -> float:
    if correction is not None:
        return correction
    return 1 if unbiased is None or unbiased else 0


@composite("VarBackward0")
@opmath
def _var(x: Tensor, dim, correction: float, keepdim: bool) -> Tensor:
    axes = _dims(x, _all_if_empty(dim), "var")
    n = _count(x, axes)
    mu = reshape_prim(div(bind(P.sum_, x, axes=axes), n), P._keepdim_shape(tuple(x.shape), axes))
    d = sub(x, mu)
    out = div(bind(P.sum_, mul(d, d), axes=axes), builtins.max(n - correction, 0))
    return _keep(out, x, axes, keepdim)


def _require_float_input(x: Tensor, op: str) -> None:
    if not x.dtype.is_differentiable:
        raise RuntimeError(f"{op}(): std and var only support floating point and complex dtypes, "
                           f"got {x.dtype}")


@public(torch=True, method=True)
def var(x: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> Tensor:
    """Variance with Bessel's ``correction`` (1 by default)."""
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    _require_float_input(x, "var")
    if x.dtype.is_complex:
        # the mean squared modulus of the deviations: the parts' variances added
        return add(var(real(x), dim, unbiased, keepdim, correction=correction),
                   var(imag(x), dim, unbiased, keepdim, correction=correction))
    return _var(x, dim, _correction(unbiased, correction), keepdim)


def _root_with_zero_grad(s: Tensor, root) -> Tensor:
    """``root(s)`` whose gradient is 0 where ``s == 0`` instead of inf * 0 = nan: torch's
    convention for the norm and std of an all-zero (or constant) input. The inner where keeps
    the infinite derivative of the root at 0 out of the graph."""
    zero = eq(s, 0)
    return where(zero, 0.0, root(where(zero, 1.0, s)))


@composite("StdBackward0")
@opmath
def _std(x, dim, correction, keepdim):
    return _root_with_zero_grad(_var(x, dim, correction, keepdim), sqrt)


@public(torch=True, method=True)
def std(x: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> Tensor:
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    _require_float_input(x, "std")
    if x.dtype.is_complex:
        return _root_with_zero_grad(var(x, dim, unbiased, keepdim, correction=correction), sqrt)
    return _std(x, dim, _correction(unbiased, correction), keepdim)


@public(torch=True)
def var_mean(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return var(x, dim, unbiased, keepdim, correction=correction), mean(x, dim, keepdim)


@public(torch=True)
def std_mean(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return std(x, dim, unbiased, keepdim, correction=correction), mean(x, dim, keepdim)


ValuesIndices = namedtuple("ValuesIndices", ["values", "indices"])
_MAX_RESULT = namedtuple("max", ["values", "indices"])
_MIN_RESULT = namedtuple("min", ["values", "indices"])


def _extremum_with_dim(x: Tensor, dim: int, keepdim: bool, arg_prim, result_type):
    axis = normalize_axis(dim, x.ndim, "max") if x.ndim else 0
    idx = bind(arg_prim, x, axis=axis)
    index = reshape_prim(idx, P._keepdim_shape(tuple(x.shape), (axis,))) if x.ndim else idx
    values = bind(P.gather, x, index, axis=axis) if x.ndim else x
    if not keepdim and x.ndim:
        values = reshape_prim(values, tuple(idx.shape))
        index = idx
    return result_type(values, index)


@public(torch=True, method=True)
def max(x: Tensor, dim=None, keepdim: bool = False):  # noqa: A001
    """``max(x)``: the largest element; ``max(x, dim)``: (values, indices); ``max(x, y)``."""
    if isinstance(dim, Tensor):
        return maximum(x, dim)
    if dim is None:
        if x.numel() == 0:
            raise RuntimeError("max(): Expected reduction dim to be specified for input.numel() "
                               "== 0. Specify the reduction dim with the 'dim' argument.")
        return _named(_reduce(P.max_, x, None, False, "max"), "MaxBackward1")
    out = _extremum_with_dim(x, dim, keepdim, P.argmax, _MAX_RESULT)
    _named(out.values, "MaxBackward0", src=x)
    return out


@public(torch=True, method=True)
def min(x: Tensor, dim=None, keepdim: bool = False):  # noqa: A001
    """``min(x)``, ``min(x, dim)`` -> (values, indices), or ``min(x, y)``."""
    if isinstance(dim, Tensor):
        return minimum(x, dim)
    if dim is None:
        if x.numel() == 0:
            raise RuntimeError("min(): Expected reduction dim to be specified for input.numel() "
                               "== 0. Specify the reduction dim with the 'dim' argument.")
        return _named(_reduce(P.min_, x, None, False, "min"), "MinBackward1")
    out = _extremum_with_dim(x, dim, keepdim, P.argmin, _MIN_RESULT)
    _named(out.values, "MinBackward0", src=x)
    return out


@public(torch=True, method=True)
def amax(x: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    return _reduce(P.max_, x, _all_if_empty(dim), keepdim, "amax")


@public(torch=True, method=True)
def amin(x: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    return _reduce(P.min_, x, _all_if_empty(dim), keepdim, "amin")


def _arg(prim, x: Tensor, dim, keepdim: bool) -> Tensor:
    if dim is None:
        flat = reshape_prim(x, (x.numel(),))
        out = bind(prim, flat, axis=0)
        return reshape_prim(out, (1,) * x.ndim) if keepdim else out
    axis = normalize_axis(dim, x.ndim, prim.name) if x.ndim else 0
    return _keep(bind(prim, x, axis=axis), x, (axis,), keepdim)


@public(torch=True, method=True)
def argmax(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _arg(P.argmax, x, dim, keepdim)


@public(torch=True, method=True)
def argmin(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _arg(P.argmin, x, dim, keepdim)


@public(torch=True, method=True)
@composite("LogsumexpBackward0")
def logsumexp(x: Tensor, dim, keepdim: bool = False) -> Tensor:
    """``log(sum(exp(x)))`` computed stably by subtracting the max first."""
    x = cast(x, _float_dtype(x.dtype))
    axes = _dims(x, dim, "logsumexp")
    if builtins.any(x.shape[a] == 0 for a in axes):
        # max has no identity on an empty slice; unshifted, log(sum(exp(x))) = log(0) = -inf
        # there, torch's result.
        return _keep(log(bind(P.sum_, exp(x), axes=axes)), x, axes, keepdim)
    m = bind(P.max_, x, axes=axes)
    # An all -inf (or inf) slice would make x - m NaN: shift by 0 there instead.
    m = where(isinf(m), 0.0, m.detach())
    mk = reshape_prim(m, P._keepdim_shape(tuple(x.shape), axes))
    out = add(log(bind(P.sum_, exp(sub(x, mk)), axes=axes)), m)
    return _keep(out, x, axes, keepdim)


@public(torch=True, method=True)
def all(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """Whether every element (along ``dim``) is nonzero: bool, or uint8 for a uint8 input
    (torch keeps that dtype for backward compatibility)."""
    if x.numel():
        out = _reduce(P.min_, _to_bool(x), dim, keepdim, "all")
    else:
        # min has no identity on an empty reduction; counting the False elements does.
        out = eq(sum(logical_not(x), dim, keepdim), 0)
    return cast(out, dtypes.uint8) if x.dtype is dtypes.uint8 else out


@public(torch=True, method=True)
def any(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """Whether some element (along ``dim``) is nonzero: bool, or uint8 for a uint8 input."""
    if x.numel():
        out = _reduce(P.max_, _to_bool(x), dim, keepdim, "any")
    else:
        out = ne(sum(_to_bool(x), dim, keepdim), 0)
    return cast(out, dtypes.uint8) if x.dtype is dtypes.uint8 else out


@public(torch=True, method=True)
def count_nonzero(x: Tensor, dim=None) -> Tensor:
    return sum(_to_bool(x), dim)


@public(torch=True, method=True)
@composite("LinalgVectorNormBackward0")
def norm(x: Tensor, p="fro", dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    """Vector p-norm over ``dim`` (all elements by default): 2 ('fro'), 1, inf, -inf, or any p."""
    if dtype is not None:
        x = cast(x, dtype)
    if x.dtype.is_complex:
        x = abs(x)                  # a complex vector's norm is that of its moduli
    if p in ("fro", None):
        p = 2
    if x.dtype in (dtypes.float16, dtypes.bfloat16) and p not in (math.inf, -math.inf, 0):
        # sums of 16-bit powers overflow long before the norm does: float32 inside
        return cast(norm(cast(x, dtypes.float32), p, dim, keepdim), x.dtype)
    if p == math.inf:
        return amax(abs(x), dim if dim is not None else (), keepdim)
    if p == -math.inf:
        return amin(abs(x), dim if dim is not None else (), keepdim)
    if p == 2:
        return _root_with_zero_grad(sum(mul(x, x), dim, keepdim), sqrt)
    if p == 1:
        return sum(abs(x), dim, keepdim)
    if p == 0:
        # the count of nonzeros, still a function of x (torch's gradient: zero), so that a
        # loss built on it can backpropagate; mul(x, 0) is picked only where x is 0
        return sum(where(ne(x, 0), 1.0, mul(x, 0.0)), dim, keepdim)
    return _root_with_zero_grad(sum(pow(abs(x), p), dim, keepdim), lambda s: pow(s, 1.0 / p))


@public(torch=True, method=True, inplace=True)
def cumsum(x: Tensor, dim: int, *, dtype=None) -> Tensor:
    if dtype is not None:
        x = cast(x, dtype)
    out = bind(P.cumsum, x, axis=normalize_axis(dim, x.ndim, "cumsum") if x.ndim else 0)
    return _in_dtype(out, dtype)


@public(method=True)
def trace(x: Tensor) -> Tensor:
    """The sum of a matrix's main diagonal (``Tensor.trace``; ``fusegrad.trace`` given a
    tensor calls this, given a function it is the tracer)."""
    if x.ndim != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {x.ndim}")
    return _named(sum(diagonal(x)), "TraceBackward0")


# Cumulative products, extrema and log-sum-exps as reductions over a masked (n, n) view of the
# scanned dim: row i keeps elements 0..i and sets the rest to the reduction's identity. Exact,
# differentiable by the reductions' own rules (prod's handles zeros), and fused when compiled;
# the cost is an n x n intermediate per slice, fine for the dims these are used on.


def _prefix_rows(x: Tensor, axis: int, identity) -> Tensor:
    """(..., n, n) with row i holding x[..., :i+1] along ``axis`` and ``identity`` after."""
    n = x.shape[axis]
    keep = Tensor._wrap(np.tril(np.ones((n, n), dtype=bool)), dtypes.bool_)
    return where(keep, unsqueeze(movedim(x, axis, -1), -2), identity)


def _scan_result(out: Tensor, axis: int) -> Tensor:
    return movedim(out, -1, axis)


def _scan_axis(x: Tensor, dim: int, op: str) -> int:
    return normalize_axis(dim, x.ndim, op) if x.ndim else 0


@public(torch=True, method=True, inplace=True)
def cumprod(x: Tensor, dim: int, *, dtype=None) -> Tensor:
    """Running product along ``dim``."""
    if dtype is not None:
        x = cast(x, dtype)
    elif not x.dtype.is_differentiable:
        x = cast(x, dtypes.int64)        # torch accumulates integers (and bool) in int64
    if x.ndim == 0:
        return _named(mul(x, 1), "CumprodBackward0")
    axis = _scan_axis(x, dim, "cumprod")
    rows = _prefix_rows(x, axis, 1)
    return _named(_in_dtype(_scan_result(bind(P.prod, rows, axes=(rows.ndim - 1,)), axis),
                            dtype), "CumprodBackward0")


def _cum_extremum(x: Tensor, dim: int, op: str, largest: bool):
    axis = _scan_axis(x, dim, op)
    if x.ndim == 0:
        return ValuesIndices(cast(mul(x, 1), x.dtype),
                             Tensor._wrap(np.zeros((), np.int64), dtypes.int64))
    n = x.shape[axis]
    if x.numel() == 0:
        return ValuesIndices(mul(x, 1) if x.dtype.is_floating_point else cast(x, x.dtype),
                             Tensor._wrap(np.zeros(x.shape, np.int64), dtypes.int64))
    # Row i holds x[..., :i+1] and then x[..., i] again: a fill of the dtype's extreme made
    # the fill win where x itself starts with that extreme (cummin([inf, 7]) was [7, 7]).
    last = unsqueeze(movedim(x, axis, -1), -1)
    keep = Tensor._wrap(np.tril(np.ones((n, n), dtype=bool)), dtypes.bool_)
    rows = where(keep, unsqueeze(movedim(x, axis, -1), -2), last)
    # torch takes the last of equal extrema: the first one of the reversed row; a copy of
    # x[..., i] after it stands for i
    picked = bind(P.argmax if largest else P.argmin, flip(rows, (rows.ndim - 1,)),
                  axis=rows.ndim - 1)
    row = Tensor._wrap(np.arange(n, dtype=np.int64), dtypes.int64)
    indices = minimum(sub(n - 1, picked), row)
    values = gather(x, axis, _scan_result(indices, axis))
    return ValuesIndices(values, _scan_result(indices, axis))


@public(torch=True, method=True)
def cummax(x: Tensor, dim: int):
    """Running maximum along ``dim`` and the index where it was (the last, on ties)."""
    out = _cum_extremum(x, dim, "cummax", largest=True)
    return _CUMMAX_RESULT(_named(out.values, "CummaxBackward0"), out.indices)


@public(torch=True, method=True)
def cummin(x: Tensor, dim: int):
    """Running minimum along ``dim`` and the index where it was (the last, on ties)."""
    out = _cum_extremum(x, dim, "cummin", largest=False)
    return _CUMMIN_RESULT(_named(out.values, "CumminBackward0"), out.indices)


_CUMMAX_RESULT = namedtuple("cummax", ["values", "indices"])
_CUMMIN_RESULT = namedtuple("cummin", ["values", "indices"])


@public(torch=True, method=True)
def logcumsumexp(x: Tensor, dim: int) -> Tensor:
    """``log(cumsum(exp(x)))`` along ``dim``, computed stably."""
    x = cast(x, _float_dtype(x.dtype))
    if x.ndim == 0:
        return _named(mul(x, 1), "LogcumsumexpBackward0")
    axis = _scan_axis(x, dim, "logcumsumexp")
    rows = _prefix_rows(x, axis, -math.inf)
    return _named(_scan_result(logsumexp(rows, -1), axis), "LogcumsumexpBackward0")
