"""Scatter with replacement and reductions (``scatter``, ``scatter_reduce``), and the ops
whose result shape depends on the data (``bincount``, ``unique``: eager only)."""

from __future__ import annotations

import numpy as np

from fusegrad import dtypes
from fusegrad.ops import prims as P
from fusegrad.ops.composite import _named
from fusegrad.ops.operands import _index_tensor, _is_scalar, cast
from fusegrad.ops.primitive import bind
from fusegrad.ops.prims import normalize_axis
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor

_SCATTER_REDUCE = {"add": "sum", "multiply": "prod"}
_REDUCE_ALIASES = {"max": "amax", "min": "amin"}


def _scatter(x: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, include_self: bool,
             op: str) -> Tensor:
    if index.dtype.category != 1:
        raise RuntimeError(f"{op}(): Expected dtype int64 for index")
    axis = normalize_axis(dim, x.ndim, op) if x.ndim else 0
    return bind(P.scatter_reduce, x, cast(index, dtypes.int64), cast(src, x.dtype), axis=axis,
                reduce=reduce, include_self=include_self)


@public(torch=True, method=True, inplace=True)
def scatter(x: Tensor, dim: int, index: Tensor, src=None, *, value=None,
            reduce: str | None = None) -> Tensor:
    """``x`` with ``src[i][j]`` (or the number ``value``) written at ``index[i][j]`` along
    ``dim``; with ``reduce`` 'add' or 'multiply', combined with what is there instead.

    Which of several writes to one element wins is unspecified, as in torch."""
    if src is None and value is None:
        raise TypeError("scatter() missing 1 required positional argument: 'src' (or 'value')")
    given = src if src is not None else value
    if _is_scalar(given):
        given = bind(P.full, shape=tuple(index.shape), value=given, dtype=x.dtype)
        name = "ScatterBackward1"
    else:
        name = "ScatterBackward0"
    if reduce is None:
        return _named(_scatter(x, dim, index, given, "replace", True, "scatter"), name)
    if reduce not in _SCATTER_REDUCE:
        raise RuntimeError("reduce argument must be either add or multiply.")
    return _named(_scatter(x, dim, index, given, _SCATTER_REDUCE[reduce], True, "scatter"), name)


@public(torch=True, method=True, inplace=True)
def scatter_reduce(x: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                   include_self: bool = True) -> Tensor:
    """Reduce ``src`` into ``x`` at ``index`` along ``dim`` with 'sum', 'prod', 'mean',
    'amax' or 'amin'; ``include_self=False`` leaves the written elements of ``x`` out.

    Gradients are torch's: shared equally among ties for amax/amin, exact at zeros for prod.
    """
    reduce = _REDUCE_ALIASES.get(reduce, reduce)
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got "
                           f"{reduce}")
    return _scatter(x, dim, index, src, reduce, include_self, "scatter_reduce")


@public(torch=True, method=True)
def bincount(x: Tensor, weights: Tensor | None = None, minlength: int = 0) -> Tensor:
    """How often each value 0, 1, ... occurs in the 1-D non-negative integer ``x`` (or the sum
    of ``weights`` there); at least ``minlength`` bins. Eager only: the length is data."""
    x._check_concrete("bincount()")
    if x.dtype.is_floating_point or x.dtype is dtypes.bool_:
        name = {"float32": "Float", "float64": "Double", "bool": "Bool"}.get(x.dtype.name,
                                                                            x.dtype.name)
        raise NotImplementedError(f'"bincount_cpu" not implemented for \'{name}\'')
    a = x._data
    if a.ndim != 1 or (a.size and a.min() < 0):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if weights is None:
        return _index_tensor(np.bincount(a, minlength=minlength))
    if tuple(weights.shape) != tuple(a.shape):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    weights._check_concrete("bincount()")
    dt = weights.dtype if weights.dtype.is_floating_point else dtypes.float64
    counts = np.bincount(a, weights=weights._data.astype(np.float64), minlength=minlength)
    return Tensor._wrap(counts.astype(dt.np_dtype), dt)


@public(torch=True, method=True)
def unique(x: Tensor, sorted: bool = True, return_inverse: bool = False,  # noqa: A002
           return_counts: bool = False, dim: int | None = None):
    """The distinct elements of ``x`` (or its distinct slices along ``dim``), sorted; with
    ``return_inverse`` where each element of ``x`` went, with ``return_counts`` how often each
    occurs. Eager only: the length is data."""
    x._check_concrete("unique()")
    axis = None if dim is None else normalize_axis(dim, x.ndim, "unique")
    values, inverse, counts = np.unique(x._data, return_inverse=True, return_counts=True,
                                        axis=axis)
    out = Tensor._wrap(np.ascontiguousarray(values), x.dtype)
    if not (return_inverse or return_counts):
        return out
    result = (out,)
    if return_inverse:
        shape = x.shape if axis is None else (x.shape[axis],)
        result += (_index_tensor(inverse.reshape(shape)),)
    if return_counts:
        result += (_index_tensor(counts),)
    return result
