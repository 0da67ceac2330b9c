"""Contractions and distances built on matmul and reductions: ``tensordot``, ``cdist``,
``cosine_similarity``."""

from __future__ import annotations

import math

from fusegrad.ops import reductions
from fusegrad.ops.composite import _named, opmath
from fusegrad.ops.elementwise import abs as abs_
from fusegrad.ops.elementwise import add, clamp, div, eq, mul, ne, pow, sqrt, sub, where
from fusegrad.ops.matmul import matmul
from fusegrad.ops.movement import broadcast_tensors, permute, reshape, unsqueeze
from fusegrad.ops.prims import normalize_axis
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor


@public(torch=True)
def tensordot(a: Tensor, b: Tensor, dims=2, out=None) -> Tensor:
    """Sum over the last ``dims`` dims of ``a`` and the first ``dims`` of ``b``, or over the
    dims listed in ``dims = (dims_a, dims_b)``; the free dims of ``a`` then those of ``b``."""
    if isinstance(dims, Tensor):
        dims = dims.tolist()         # an int (a 0-d tensor) or lists, as torch takes them
    if isinstance(dims, int):
        if dims < 0:
            raise RuntimeError(f"tensordot expects dims >= 0, but got dims={dims}")
        if dims > min(a.ndim, b.ndim):
            raise RuntimeError(f"tensordot expects dims < ndim_a or ndim_b, but got dims={dims}")
        dims_a, dims_b = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    else:
        dims_a, dims_b = ([d] if isinstance(d, int) else list(d) for d in dims)
        if len(dims_a) != len(dims_b):
            raise RuntimeError("both dimension lists should have same length")
    dims_a = [normalize_axis(d, a.ndim, "tensordot") for d in dims_a]
    dims_b = [normalize_axis(d, b.ndim, "tensordot") for d in dims_b]
    for listed in (dims_a, dims_b):
        if len(set(listed)) != len(listed):
            d = next(d for d in listed if listed.count(d) > 1)
            raise RuntimeError(f"dim {d} appears multiple times in the list of dims")
    for da, db in zip(dims_a, dims_b):
        if a.shape[da] != b.shape[db]:
            raise RuntimeError(f"contracted dimensions need to match, but first has size "
                               f"{a.shape[da]} in dim {da} and second has size {b.shape[db]} in "
                               f"dim {db}")
    free_a = [d for d in range(a.ndim) if d not in dims_a]
    free_b = [d for d in range(b.ndim) if d not in dims_b]
    k = math.prod(a.shape[d] for d in dims_a)
    shape_a = tuple(a.shape[d] for d in free_a)
    shape_b = tuple(b.shape[d] for d in free_b)
    lhs = reshape(permute(a, free_a + dims_a), (math.prod(shape_a), k))
    rhs = reshape(permute(b, dims_b + free_b), (k, math.prod(shape_b)))
    return _write_out(reshape(matmul(lhs, rhs), shape_a + shape_b), out, "tensordot")


def _write_out(result: Tensor, out: Tensor | None, op: str) -> Tensor:
    """``result``, or ``out`` holding it (torch's ``out=``; ``out`` must have the result's
    shape and dtype, where torch would resize or cast it)."""
    if out is None:
        return result
    if not isinstance(out, Tensor):
        raise TypeError(f"{op}(): argument 'out' must be Tensor, not {type(out).__name__}")
    if tuple(out.shape) != tuple(result.shape) or out.dtype is not result.dtype:
        raise RuntimeError(f"{op}(): out= has shape {list(out.shape)} and dtype {out.dtype}, the "
                           f"result {list(result.shape)} and {result.dtype} (out= is not resized "
                           f"or cast)")
    return out.copy_(result)


def _safe_root(total: Tensor, p: float) -> Tensor:
    """``total ** (1/p)`` with a zero gradient where ``total`` is 0 (torch's cdist backward
    gives 0 there, where the root's derivative is infinite)."""
    zero = eq(total, 0)
    safe = where(zero, 1.0, total)
    root = sqrt(safe) if p == 2 else pow(safe, 1.0 / p)
    return where(zero, 0.0, root)


@public(torch=True)
def cdist(x1: Tensor, x2: Tensor, p: float = 2.0, compute_mode=None) -> Tensor:
    """The p-norm distances between the rows of ``x1`` (..., P, M) and ``x2`` (..., R, M):
    (..., P, R). ``p`` may be 0 (count of differing coordinates), any positive number, or inf.

    Computed from the differences directly (torch switches to a matmul expansion for more
    than 25 rows when p = 2, which is faster and less accurate); ``compute_mode`` is accepted
    and ignored."""
    if x1.ndim < 2 or x2.ndim < 2:
        raise RuntimeError(f"cdist only supports at least 2D tensors, X1 got: {x1.ndim}D")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: {x1.shape[-1]} "
                           f"X2: {x2.shape[-1]}")
    if not x1.dtype.is_floating_point:
        raise RuntimeError(f"cdist only supports floating-point dtypes, X1 got: {x1.dtype}")
    if p < 0:
        raise RuntimeError("cdist only supports non-negative p values")
    diff = sub(unsqueeze(x1, -2), unsqueeze(x2, -3))
    if p == 0:
        # A count: its gradient is 0, but it is still part of the graph as torch's (a where
        # that always picks the count routes a zero gradient to the differences).
        count = reductions.sum(ne(diff, 0), -1).to(x1.dtype)
        return _named(where(eq(count, count), count, reductions.sum(diff, -1)), "CdistBackward0")
    if p == math.inf:
        return _named(reductions.amax(abs_(diff), -1), "CdistBackward0")
    if p == 1:
        return _named(reductions.sum(abs_(diff), -1), "CdistBackward0")
    if p == 2:
        return _named(_safe_root(reductions.sum(mul(diff, diff), -1), 2), "CdistBackward0")
    # |d|**p with a zero gradient at d == 0 (infinite there for p < 1; torch gives 0).
    ad = abs_(diff)
    zero = eq(ad, 0)
    powered = where(zero, 0.0, pow(where(zero, 1.0, ad), p))
    return _named(_safe_root(reductions.sum(powered, -1), p), "CdistBackward0")


@public(torch=True)
@opmath
def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """``sum(x1 * x2) / (max(|x1|, eps) * max(|x2|, eps))`` along ``dim``, after broadcasting:
    each operand is divided by its clamped norm first, as torch does."""
    a, b = broadcast_tensors(x1, x2)
    axis = normalize_axis(dim, a.ndim, "cosine_similarity")

    def norm(t: Tensor) -> Tensor:
        # torch clamps the norm in place under no_grad: the gradient is the norm's own (0 at
        # a zero vector, not the inf * 0 of sqrt's), the value at least eps.
        n = reductions._root_with_zero_grad(reductions.sum(mul(t, t), axis, keepdim=True),
                                            sqrt)
        return add(n, sub(clamp(n, min=eps), n).detach())
    return reductions.sum(mul(div(a, norm(a)), div(b, norm(b))), axis)
