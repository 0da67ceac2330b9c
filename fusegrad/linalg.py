"""``fusegrad.linalg``: the part of torch.linalg that is a composition of fusegrad's ops.

Norms and products only: decompositions and solvers (inv, solve, svd, eigh, ...) need
primitives fusegrad does not have, and asking for one says so (see ``__getattr__``).

>>> import fusegrad as torch
>>> torch.linalg.vector_norm(torch.tensor([3., 4.]))
tensor(5.)
"""

from __future__ import annotations

import math

from fusegrad.ops import functional as F
from fusegrad.tensor import Tensor

__all__ = ["norm", "vector_norm", "matrix_norm", "matmul", "vecdot"]

matmul = F.matmul


def vector_norm(x: Tensor, ord=2, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """``ord``-norm of ``x`` seen as a vector over ``dim`` (all elements when None), as torch's:
    ``ord`` is any real, ``inf`` (max |x|), ``-inf`` (min |x|) or 0 (count of nonzeros)."""
    if isinstance(ord, str):
        raise RuntimeError(f"linalg.vector_norm: ord must be a number, got '{ord}'")
    if isinstance(dim, int):
        dim = (dim,)
    return F.norm(x, p=float(ord), dim=tuple(dim) if dim is not None else None,
                  keepdim=keepdim, dtype=dtype)


def matrix_norm(x: Tensor, ord="fro", dim=(-2, -1), keepdim: bool = False, *, dtype=None) -> Tensor:
    """Matrix norm over the two dims ``dim``: 'fro', 1 / -1 (max / min absolute column sum),
    inf / -inf (max / min absolute row sum). 'nuc' and 2 need an SVD fusegrad lacks."""
    if x.ndim < 2:
        raise RuntimeError("linalg.matrix_norm: The input tensor A must have at least 2 dimensions.")
    if dtype is not None:
        x = x.to(dtype)
    rows, cols = (d % x.ndim for d in dim)
    if rows == cols:
        raise RuntimeError("linalg.matrix_norm: dims must be different")
    if ord == "fro":
        return F.norm(x, p=2, dim=(rows, cols), keepdim=keepdim)
    if ord in (1, -1, math.inf, -math.inf):
        # 1-norms sum over rows (one sum per column), inf-norms over columns.
        summed, kept = (rows, cols) if ord in (1, -1) else (cols, rows)
        sums = F.sum(F.abs(x), summed, True)
        out = F.amax(sums, kept, True) if ord > 0 else F.amin(sums, kept, True)
        return out if keepdim else F.squeeze(out, (rows, cols))
    raise NotImplementedError(f"linalg.matrix_norm: ord={ord!r} is not implemented in fusegrad "
                              f"yet (it needs singular values)")


def norm(x: Tensor, ord=None, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """torch.linalg.norm: a vector norm for a 1-D ``dim`` (or a 1-D input), a matrix norm for a
    2-D ``dim`` (or a 2-D input when ``ord`` is given); the 2-norm of all elements otherwise."""
    if isinstance(dim, int):
        dim = (dim,)
    if dim is None:
        if ord is None:
            return vector_norm(x, 2, None, keepdim, dtype=dtype)
        if x.ndim == 1:
            dim = (0,)
        elif x.ndim == 2:
            dim = (0, 1)
        else:
            raise RuntimeError("linalg.norm: If dim is not specified but ord is, the input must "
                               "be 1D or 2D")
    if len(dim) == 1:
        return vector_norm(x, 2 if ord is None else ord, dim, keepdim, dtype=dtype)
    return matrix_norm(x, "fro" if ord is None else ord, tuple(dim), keepdim, dtype=dtype)


def vecdot(x: Tensor, y: Tensor, *, dim: int = -1) -> Tensor:
    """Dot product of ``x`` and ``y`` along ``dim``, broadcasting the other dims."""
    return F.sum(F.mul(x, y), dim)


def __getattr__(name: str):
    from fusegrad.torch_api import missing_attribute
    raise missing_attribute("torch.linalg", "fusegrad.linalg", name)
