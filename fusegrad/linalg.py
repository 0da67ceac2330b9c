"""``fusegrad.linalg``: torch.linalg's norms, products, decompositions and solvers.

Norms and products are compositions of fusegrad's ops; decompositions and solvers (``inv``,
``solve``, ``det``, ``slogdet``, ``cholesky``, ``qr``, ``svd``, ``eigh``) are primitives of
:mod:`fusegrad.ops.decompositions` with torch's gradients, library calls when compiled. A torch
name fusegrad lacks says so (see ``__getattr__``).

>>> import fusegrad as torch
>>> torch.linalg.vector_norm(torch.tensor([3., 4.]))
tensor(5.)
"""

from __future__ import annotations

import math

import numpy as np

from fusegrad import dtypes
from fusegrad.ops import autocast as _autocast
from fusegrad.ops import decompositions as D
from fusegrad.ops import functional as F
from fusegrad.ops.creation import zeros as _zeros
from fusegrad.tensor import Tensor
from fusegrad.torch_api import missing_attribute as _missing_attribute

__all__ = ["norm", "vector_norm", "matrix_norm", "matmul", "vecdot", "inv", "solve", "det",
           "slogdet", "cholesky", "qr", "svd", "svdvals", "eigh", "eigvalsh", "pinv",
           "matrix_power", "cross", "matrix_exp", "solve_triangular", "multi_dot", "matrix_rank",
           "diagonal", "inv_ex", "cholesky_ex", "lu", "lu_factor", "lu_solve",
           "householder_product"]

matmul = F.matmul
det = D.det
slogdet = D.slogdet
solve = D.solve
eigh = D.eigh
svd = D.linalg_svd
matrix_power = F.matrix_power
matrix_exp = D.matrix_exp
lu = D.linalg_lu
lu_factor = D.lu_factor
lu_solve = D.linalg_lu_solve
householder_product = D.householder_product
solve_triangular = D.solve_triangular


def multi_dot(tensors) -> Tensor:
    """The product of a chain of matrices (the first may be a vector, as may the last)."""
    tensors = list(tensors)
    if len(tensors) < 2:
        raise RuntimeError("multi_dot(): expected at least 2 tensors but got " + str(len(tensors)))
    _check_chain(tensors)
    out = tensors[0]
    for t in tensors[1:]:
        out = F.matmul(out, t)
    return out


def _check_chain(tensors) -> None:
    """torch's rules for a chain: matrices, but for a vector first or last; one dtype; and
    neighbours that multiply (matmul alone would broadcast batched operands)."""
    last = len(tensors) - 1
    for i, t in enumerate(tensors):
        allowed = (1, 2) if i in (0, last) else (2,)
        if t.ndim not in allowed:
            which = "the first tensor" if i == 0 else "the last tensor" if i == last else \
                f"tensor {i}"
            raise RuntimeError(f"multi_dot(): {which} must be "
                               f"{' or '.join(f'{n}D' for n in allowed)} but got {t.ndim}D")
        if t.dtype is not tensors[0].dtype:
            raise RuntimeError(f"multi_dot(): all tensors must have be the same dtype but "
                               f"tensor 0 is {tensors[0].dtype.name} and tensor {i} "
                               f"{t.dtype.name}")
    for i in range(last):
        a, b = tensors[i], tensors[i + 1]
        if a.shape[-1] != b.shape[0]:
            raise RuntimeError(f"multi_dot(): tensors {i} and {i + 1} with shapes "
                               f"{list(a.shape)} and {list(b.shape)} cannot be multiplied")


def matrix_rank(x: Tensor, *, atol: float | None = None, rtol: float | None = None,
                hermitian: bool = False) -> Tensor:
    """The number of singular values above ``max(atol, rtol * largest)`` (``rtol`` defaults
    to ``max(m, n)`` times the dtype's epsilon when neither is given)."""
    s = svdvals(x)
    if rtol is None:
        rtol = 0.0 if atol is not None and atol > 0 else \
            max(x.shape[-2:]) * float(np.finfo(x.dtype.np_dtype).eps)
    largest = F.amax(s, -1, True) if s.shape[-1] else F.zeros_like(s)
    tol = F.maximum(largest * rtol, atol or 0.0)
    return F.sum(F.lt(tol, s), -1)


def diagonal(x: Tensor, *, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """The diagonal ``offset`` of the matrices in dims ``dim1`` and ``dim2``."""
    return F.diagonal(x, offset, dim1, dim2)


def inv_ex(x: Tensor, *, check_errors: bool = False):
    """(inverse, info): info 0 where the inversion succeeded (errors are raised)."""
    return inv(x), _zero_info(x)


def _zero_info(x: Tensor) -> Tensor:
    return _zeros(tuple(x.shape[:-2]), dtype=dtypes.int32)


def cholesky_ex(x: Tensor, *, upper: bool = False, check_errors: bool = False):
    """(L, info): info 0 where the factorization succeeded (errors are raised)."""
    return cholesky(x, upper=upper), _zero_info(x)


def inv(x: Tensor) -> Tensor:
    """The inverse of the square matrices in the last two dims; an error when singular."""
    return D.inv(x)


def cholesky(x: Tensor, *, upper: bool = False) -> Tensor:
    """The Cholesky factor of symmetric positive-definite matrices (lower, or upper)."""
    return D.cholesky(x, upper)


def qr(x: Tensor, mode: str = "reduced"):
    """(Q, R) with ``x = Q R``; ``mode`` 'reduced', 'complete' or 'r' (Q empty)."""
    return D.QRResult(D.qr_q(x, mode), D.qr_r(x, mode))


def svdvals(x: Tensor) -> Tensor:
    """The singular values of ``x``, descending."""
    return D.svd_part(x, 1, False)


def eigvalsh(x: Tensor, UPLO: str = "L") -> Tensor:  # noqa: N803 - torch's name
    """The eigenvalues of symmetric matrices, ascending."""
    return D.eigh_values(x, UPLO)


def pinv(x: Tensor, *, rtol: float | None = None, hermitian: bool = False) -> Tensor:
    """The Moore-Penrose pseudo-inverse; singular values at most ``rtol`` times the largest
    are dropped (by default ``max(m, n)`` times the dtype's epsilon)."""
    if rtol is None:
        rtol = max(x.shape[-2:]) * float(np.finfo(x.dtype.np_dtype).eps)
    return D.pinverse(x, rtol)


def cross(x: Tensor, other: Tensor, *, dim: int = -1) -> Tensor:
    """The cross product of 3-vectors along ``dim``."""
    return F.cross(x, other, dim)


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
    """Matrix norm over the two dims ``dim``: 'fro', 'nuc' (sum of singular values), 2 / -2
    (largest / smallest singular value), 1 / -1 (max / min absolute column sum), inf / -inf
    (max / min absolute row sum)."""
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
    if ord in ("nuc", 2, -2):
        moved = F.movedim(x, (rows, cols), (-2, -1))
        s = svdvals(moved)
        out = F.sum(s, -1) if ord == "nuc" else F.amax(s, -1) if ord == 2 else F.amin(s, -1)
        if keepdim:
            out = F.unsqueeze(F.unsqueeze(out, min(rows, cols)), max(rows, cols))
        return out
    raise RuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")


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
    """Dot product of ``x`` and ``y`` along ``dim``, broadcasting the other dims: of floating
    tensors of one dtype, as torch's (a mul and a sum would promote)."""
    if not x.dtype.is_floating_point:
        raise RuntimeError("linalg.vecdot: Expected a floating point or complex tensor as "
                           f"input. Got {x.dtype.name}")
    if x.dtype is not y.dtype:
        raise RuntimeError("linalg.vecdot: Expected x and y to have the same dtype, but found "
                           f"x of type {x.dtype.name} and y of type {y.dtype.name} instead")
    return F.sum(F.mul(x, y), dim)


# The functions of torch's autocast lists are wrapped (fusegrad.ops.autocast).
_autocast.wrap_namespace(globals(), "linalg.")


def __getattr__(name: str):
    raise _missing_attribute("torch.linalg", "fusegrad.linalg", name)
