"""Matrix decompositions and solvers: ``inv``, ``solve``, ``det``, ``slogdet``, ``cholesky``,
``qr``, ``svd``, ``eigh``, as primitives that run LAPACK through numpy (eagerly, and between
kernels when compiled: they are extern primitives, library calls with no kernel lowering).

A decomposition with several results is one primitive per result (``svd_u``, ``svd_s``,
``svd_vh``): a primitive has one output. Each result's VJP is torch's backward formula with
only that result's cotangent; the formulas are linear in the cotangents, so the gradient of a
loss that uses several results is the sum, the joint formula. The rules are written with
fusegrad's ops, so they run on the tape and in the autodiff pass alike.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from fusegrad import dtypes
from fusegrad.ops.creation import arange, eye, zeros
from fusegrad.ops.dual import missing_rule_message
from fusegrad.ops.elementwise import eq, lt, reciprocal, where
from fusegrad.ops.factories import ones_like, zeros_like
from fusegrad.ops.indexing import tril, triu
from fusegrad.ops.movement import broadcast_to, cat, diag_embed, diagonal, narrow, squeeze, unsqueeze
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
from fusegrad.ops.prims import broadcast_shapes
from fusegrad.ops.prims_common import vjp_transposed
from fusegrad.ops.reductions import amax
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor


def _check_matrices(op: str, x: TensorType, square: bool = True) -> None:
    if x.ndim < 2:
        raise ShapeError(f"{op}: The input tensor A must have at least 2 dimensions.")
    if square and x.shape[-1] != x.shape[-2]:
        raise ShapeError(f"{op}: A must be batches of square matrices, but they are "
                         f"{x.shape[-2]} by {x.shape[-1]} matrices")
    if not x.dtype.is_floating_point:
        raise ShapeError(f"{op}: Expected a floating point tensor as input. Got {x.dtype.name}")


def _lapack(op: str, fn):
    """numpy's LAPACK call, its LinAlgError turned into torch's RuntimeError."""
    def impl(*arrays, **attrs):
        try:
            return fn(*arrays, **attrs)
        except np.linalg.LinAlgError as e:
            raise RuntimeError(f"{op}: {e}") from None
    return impl


def _mT(x):
    return x.transpose(-2, -1)


def _extern(name, infer, impl, rules, grad_name, attrs=()):
    return register(Primitive(name, Kind.EXTERN, infer, _lapack(f"linalg.{name}", impl), rules,
                              grad_name, attrs=attrs))


# --------------------------------------------------------------------------- inv, solve, det


def _inv_infer(x: TensorType) -> TensorType:
    _check_matrices("linalg.inv", x)
    return x


def _inv_impl(x):
    # LAPACK's LU raises on an exactly zero pivot, as torch's does; no rank tolerance.
    try:
        return np.linalg.inv(x)
    except np.linalg.LinAlgError:
        raise np.linalg.LinAlgError("The diagonal element is zero, the inversion could not be "
                                    "completed because the input matrix is singular.") from None


# d(A^-1) = -A^-1 dA A^-1, so gA = -A^-T g A^-T.
inv_prim = _extern("inv", _inv_infer, _inv_impl,
                   (Rule(lambda g, out, x: -(_mT(out) @ g @ _mT(out)), (), True),),
                   "LinalgInvExBackward0")


def _solve_infer(a: TensorType, b: TensorType) -> TensorType:
    _check_matrices("linalg.solve", a)
    if b.ndim != a.ndim or b.shape[:-2] != a.shape[:-2] or b.shape[-2] != a.shape[-1]:
        raise ShapeError(f"linalg.solve: Incompatible shapes of A and B for the equation AX = B "
                         f"({a.shape[-2]}x{a.shape[-1]} and {b.shape[-2]}x{b.shape[-1]})")
    return TensorType(b.shape, b.dtype)


def _solve_gb(g, out, a, b):
    return _solve_prim_apply(_mT(a), g)


def _solve_ga(g, out, a, b):
    return -(_solve_prim_apply(_mT(a), g) @ _mT(out))


solve_prim = _extern("solve", _solve_infer, lambda a, b: np.linalg.solve(a, b),
                     (Rule(_solve_ga, (0,), True), Rule(_solve_gb, (0,))), "LinalgSolveExBackward0")


def _solve_prim_apply(a, b):
    return bind(solve_prim, a, b)


def _det_infer(x: TensorType) -> TensorType:
    _check_matrices("linalg.det", x)
    return TensorType(x.shape[:-2], x.dtype)


def _det_vjp(g, out, x):
    # d det(A) = det(A) tr(A^-1 dA): gA = g det(A) A^-T. torch takes A^-T from an LU solve
    # that does not fail on a singular A, so its gradient is 0 where det(A) is 0: there the
    # inverse is taken of the identity instead, times det(A) = 0.
    singular = unsqueeze(unsqueeze(eq(out, 0), -1), -1)
    safe = where(singular, eye(x.shape[-1], dtype=x.dtype), x)
    return unsqueeze(unsqueeze(g * out, -1), -1) * _mT(inv(safe))


det_prim = _extern("det", _det_infer, lambda x: np.linalg.det(x), (Rule(_det_vjp, (0,), True),),
                   "LinalgDetBackward0")


def _slogdet_sign_impl(x):
    return np.linalg.slogdet(x)[0]


def _slogdet_log_impl(x):
    return np.linalg.slogdet(x)[1]


slogdet_sign_prim = _extern("slogdet_sign", _det_infer, _slogdet_sign_impl, None,
                            "LinalgSlogdetBackward0")


def _logabsdet_vjp(g, out, x):
    return unsqueeze(unsqueeze(g, -1), -1) * _mT(inv(x))


logabsdet_prim = _extern("logabsdet", _det_infer, _slogdet_log_impl,
                         (Rule(_logabsdet_vjp, (0,)),), "LinalgSlogdetBackward0")


# --------------------------------------------------------------------------- cholesky


def _cholesky_infer(x: TensorType, *, upper: bool) -> TensorType:
    _check_matrices("linalg.cholesky", x)
    return x


def _cholesky_impl(x, *, upper):
    try:
        low = np.linalg.cholesky(x)
    except np.linalg.LinAlgError:
        raise np.linalg.LinAlgError("The factorization could not be completed because the input "
                                    "is not positive-definite.") from None
    return np.swapaxes(low, -1, -2).copy() if upper else low


def _cholesky_vjp(g, out, x, *, upper):
    # torch's cholesky_backward: gA = L^-H Phi(L^H gL) L^-1, Phi the symmetric matrix with
    # the lower triangle of L^H gL (its diagonal halved) mirrored.
    low, g_low = (_mT(out), _mT(g)) if upper else (out, g)
    t = tril(_mT(low) @ g_low)
    phi = 0.5 * (t + _mT(tril(t, -1)))
    low_inv = inv(low)
    return _mT(low_inv) @ phi @ low_inv


cholesky_prim = _extern("cholesky", _cholesky_infer, _cholesky_impl,
                        (Rule(_cholesky_vjp, (), True),), "LinalgCholeskyExBackward0",
                        attrs=("upper",))


# --------------------------------------------------------------------------- qr


def _qr_shapes(x: TensorType, mode: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    m, n = x.shape[-2:]
    k = min(m, n)
    batch = x.shape[:-2]
    if mode == "reduced":
        return batch + (m, k), batch + (k, n)
    if mode == "complete":
        return batch + (m, m), batch + (m, n)
    if mode == "r":
        return batch + (0,), batch + (k, n)
    raise ShapeError(f"qr received unrecognized mode '{mode}' but expected one of 'reduced' "
                     f"(default), 'r', or 'complete'")


def _qr_q_infer(x: TensorType, *, mode: str) -> TensorType:
    _check_matrices("linalg.qr", x, square=False)
    return TensorType(_qr_shapes(x, mode)[0], x.dtype)


def _qr_r_infer(x: TensorType, *, mode: str) -> TensorType:
    _check_matrices("linalg.qr", x, square=False)
    return TensorType(_qr_shapes(x, mode)[1], x.dtype)


def _qr_impl(x, mode):
    if mode == "r":
        return np.zeros(x.shape[:-2] + (0,), x.dtype), np.linalg.qr(x, mode="r")
    return np.linalg.qr(x, mode=mode)


def _qr_backward(x, gq, gr, mode):
    """torch's linalg_qr_backward for m >= n: gA = [gQ + Q syminvadj(triu(gR R^H - Q^H gQ))]
    R^-H, with ``syminvadj(X) = X + X^H`` (diagonal halved)."""
    m, n = x.shape[-2:]
    if mode == "r":
        raise RuntimeError("The derivative of linalg.qr depends on Q, which is not computed when "
                           "mode='r'. Please use linalg.qr(A, mode='reduced') if you are going to "
                           "differentiate through linalg.qr.")
    if m < n or (mode == "complete" and m > n):
        raise NotImplementedError("linalg.qr: the gradient is implemented for m >= n in mode "
                                  "'reduced' (and square inputs in mode 'complete')")
    q, r = qr_q(x, mode), qr_r(x, mode)
    ga = (gr @ _mT(r)) if gq is None else -(_mT(q) @ gq)
    ga = triu(ga)
    sym = ga + _mT(ga)
    sym = sym - 0.5 * diag_embed(diagonal(sym, 0, -2, -1))
    ga = q @ sym
    if gq is not None:
        ga = ga + gq
    return ga @ _mT(inv(r))


qr_q_prim = _extern("qr_q", _qr_q_infer, lambda x, *, mode: _qr_impl(x, mode)[0],
                    (Rule(lambda g, out, x, *, mode: _qr_backward(x, g, None, mode), (0,)),),
                    "LinalgQrBackward0", attrs=("mode",))
qr_r_prim = _extern("qr_r", _qr_r_infer, lambda x, *, mode: _qr_impl(x, mode)[1],
                    (Rule(lambda g, out, x, *, mode: _qr_backward(x, None, g, mode), (0,)),),
                    "LinalgQrBackward0", attrs=("mode",))


# --------------------------------------------------------------------------- svd


def _svd_shapes(x: TensorType, full: bool):
    m, n = x.shape[-2:]
    k = min(m, n)
    batch = x.shape[:-2]
    u = batch + ((m, m) if full else (m, k))
    vh = batch + ((n, n) if full else (k, n))
    return u, batch + (k,), vh


def _svd_infer(which: int):
    def infer(x: TensorType, *, full_matrices: bool) -> TensorType:
        _check_matrices("linalg.svd", x, square=False)
        return TensorType(_svd_shapes(x, full_matrices)[which], x.dtype)
    return infer


def _svd_impl(which: int):
    def impl(x, *, full_matrices):
        if which == 1:
            return np.linalg.svd(x, compute_uv=False)
        return np.linalg.svd(x, full_matrices=full_matrices)[0 if which == 0 else 2]
    return impl


def _svd_backward(x, gu, gs, gvh, full_matrices):
    """torch's svd_backward (real case), with the cotangents that are not None."""
    m, n = x.shape[-2:]
    if full_matrices and m != n and (gu is not None or gvh is not None):
        raise NotImplementedError("linalg.svd: the gradient of U or Vh with full_matrices=True "
                                  "is not defined for non-square inputs; use "
                                  "full_matrices=False")
    u, s, vh = (svd_part(x, i, False) for i in range(3))
    if gu is None and gvh is None:
        return (u * unsqueeze(gs, -2)) @ vh
    s_row, s_col = unsqueeze(s, -2), unsqueeze(s, -1)
    s2 = s * s
    e = unsqueeze(s2, -2) - unsqueeze(s2, -1)
    e = e + diag_embed(ones_like(s2))      # the diagonal is 0; it divides zeros
    if gu is not None:
        gu = narrow(gu, -1, 0, s.shape[-1])
        uhgu = _mT(u) @ gu
        ret = ((uhgu - _mT(uhgu)) / e) * s_row
    else:
        gvh = narrow(gvh, -2, 0, s.shape[-1])
        vhgv = vh @ _mT(gvh)
        ret = s_col * ((vhgv - _mT(vhgv)) / e)
    if m > n and gu is not None:
        ga = u @ ret + (gu - u @ (_mT(u) @ gu)) / s_row
        return ga @ vh
    if m < n and gvh is not None:
        ga = ret @ vh + (gvh - (gvh @ _mT(vh)) @ vh) / s_col
        return u @ ga
    return u @ (ret @ vh) if m >= n else (u @ ret) @ vh


svd_u_prim = _extern("svd_u", _svd_infer(0), _svd_impl(0), (Rule(
    lambda g, out, x, *, full_matrices: _svd_backward(x, g, None, None, full_matrices), (0,)),),
    "LinalgSvdBackward0", attrs=("full_matrices",))
svd_s_prim = _extern("svd_s", _svd_infer(1), _svd_impl(1), (Rule(
    lambda g, out, x, *, full_matrices: _svd_backward(x, None, g, None, full_matrices), (0,)),),
    "LinalgSvdBackward0", attrs=("full_matrices",))
svd_vh_prim = _extern("svd_vh", _svd_infer(2), _svd_impl(2), (Rule(
    lambda g, out, x, *, full_matrices: _svd_backward(x, None, None, g, full_matrices), (0,)),),
    "LinalgSvdBackward0", attrs=("full_matrices",))


# --------------------------------------------------------------------------- eigh


def _eigh_values_infer(x: TensorType, *, uplo: str) -> TensorType:
    _check_matrices("linalg.eigh", x)
    return TensorType(x.shape[:-1], x.dtype)


def _eigh_vectors_infer(x: TensorType, *, uplo: str) -> TensorType:
    _check_matrices("linalg.eigh", x)
    return x


def _eigh_backward(x, gl, gv, uplo):
    """torch's linalg_eig_backward, Hermitian case: gA = V ((skew(V^H gV) / E) + diag(gL)) V^H
    with ``E[i, j] = L[j] - L[i]`` (off the diagonal)."""
    lam, v = eigh_values(x, uplo), eigh_vectors(x, uplo)
    if gv is None:
        return (v * unsqueeze(gl, -2)) @ _mT(v)
    vhgv = _mT(v) @ gv
    vhgv = 0.5 * (vhgv - _mT(vhgv))
    e = unsqueeze(lam, -2) - unsqueeze(lam, -1)
    e = e + diag_embed(ones_like(lam))
    return v @ (vhgv / e) @ _mT(v)


eigh_values_prim = _extern(
    "eigh_values", _eigh_values_infer, lambda x, *, uplo: np.linalg.eigvalsh(x, UPLO=uplo),
    (Rule(lambda g, out, x, *, uplo: _eigh_backward(x, g, None, uplo), (0,)),),
    "LinalgEighBackward0", attrs=("uplo",))
eigh_vectors_prim = _extern(
    "eigh_vectors", _eigh_vectors_infer, lambda x, *, uplo: np.linalg.eigh(x, UPLO=uplo)[1],
    (Rule(lambda g, out, x, *, uplo: _eigh_backward(x, None, g, uplo), (0,)),),
    "LinalgEighBackward0", attrs=("uplo",))


# --------------------------------------------------------------------------- applying them


def _bind(prim, *operands, **attrs):
    return bind(prim, *operands, **attrs)


def inv(x):
    """The inverse of the square matrices in the last two dims."""
    return _bind(inv_prim, x)


def qr_q(x, mode="reduced"):
    return _bind(qr_q_prim, x, mode=mode)


def qr_r(x, mode="reduced"):
    return _bind(qr_r_prim, x, mode=mode)


def svd_part(x, which: int, full_matrices: bool):
    """U (0), S (1) or Vh (2) of the SVD of ``x``."""
    prim = (svd_u_prim, svd_s_prim, svd_vh_prim)[which]
    attrs = {"full_matrices": bool(full_matrices) and which != 1}
    return _bind(prim, x, **attrs)


def eigh_values(x, uplo="L"):
    return _bind(eigh_values_prim, x, uplo=uplo)


def eigh_vectors(x, uplo="L"):
    return _bind(eigh_vectors_prim, x, uplo=uplo)


# --------------------------------------------------------------------------- public ops

SlogdetResult = namedtuple("slogdet", ["sign", "logabsdet"])
QRResult = namedtuple("qr", ["Q", "R"])
SVDResult = namedtuple("svd", ["U", "S", "V"])
LinalgSVDResult = namedtuple("linalg_svd", ["U", "S", "Vh"])
EighResult = namedtuple("linalg_eigh", ["eigenvalues", "eigenvectors"])


@public(torch=True, method=True)
def det(x: Tensor) -> Tensor:
    """The determinant of the square matrices in the last two dims."""
    return _bind(det_prim, x)


@public(torch=True, method=True)
def slogdet(x: Tensor):
    """(sign, log |det|) of the square matrices in the last two dims; only the log is
    differentiable."""
    return SlogdetResult(_bind(slogdet_sign_prim, x), _bind(logabsdet_prim, x))


@public(torch=True, method=True)
def logdet(x: Tensor) -> Tensor:
    """``log(det(x))``: NaN where the determinant is negative, -inf where it is 0."""
    sign, logabs = slogdet(x)
    return where(lt(sign, 0), float("nan"), logabs)


@public(torch=True, method=True)
def inverse(x: Tensor) -> Tensor:
    """The inverse of the square matrices in the last two dims."""
    return inv(x)


@public(torch=True, method=True)
def cholesky(x: Tensor, upper: bool = False) -> Tensor:
    """The Cholesky factor of symmetric positive-definite matrices (lower, or upper)."""
    return _bind(cholesky_prim, x, upper=bool(upper))


@public(torch=True, method=True)
def cholesky_inverse(x: Tensor, upper: bool = False) -> Tensor:
    """The inverse of ``A`` from its Cholesky factor ``x`` (``A = x x^T``, or ``x^T x``)."""
    a = _mT(x) @ x if upper else x @ _mT(x)
    return inv(a)


@public(torch=True, method=True)
def cholesky_solve(b: Tensor, chol: Tensor, upper: bool = False) -> Tensor:
    """The solution ``X`` of ``A X = b`` from the Cholesky factor ``chol`` of ``A``."""
    a = _mT(chol) @ chol if upper else chol @ _mT(chol)
    return solve(a, b)


@public(torch=True, method=True)
def qr(x: Tensor, some: bool = True):
    """(Q, R) with ``x = Q R``, Q's columns orthonormal and R upper triangular (reduced when
    ``some``, complete otherwise)."""
    mode = "reduced" if some else "complete"
    return QRResult(qr_q(x, mode), qr_r(x, mode))


@public(torch=True, method=True)
def svd(x: Tensor, some: bool = True, compute_uv: bool = True):
    """torch.svd: (U, S, V) with ``x = U diag(S) V^T`` (V, not Vh, unlike linalg.svd)."""
    if not compute_uv:
        s = svd_part(x, 1, False)
        m, n = x.shape[-2:]
        z = tuple(x.shape[:-2])
        return SVDResult(zeros(z + (m, m), dtype=x.dtype), s, zeros(z + (n, n), dtype=x.dtype))
    full = not some
    return SVDResult(svd_part(x, 0, full), svd_part(x, 1, full), _mT(svd_part(x, 2, full)))


@public(torch=True, method=True)
def pinverse(x: Tensor, rcond: float = 1e-15) -> Tensor:
    """The Moore-Penrose pseudo-inverse, from the SVD (singular values below ``rcond`` times
    the largest are treated as zero)."""
    u, s, vh = (svd_part(x, i, False) for i in range(3))
    cutoff = unsqueeze(amax(s, -1, True) if s.shape[-1] else s, -1) * rcond
    s_inv = where(lt(cutoff[..., 0], s), reciprocal(where(eq(s, 0), 1.0, s)), 0.0)
    return _mT(vh) @ (unsqueeze(s_inv, -1) * _mT(u))


def solve(a: Tensor, b: Tensor, *, left: bool = True) -> Tensor:
    """The solution ``X`` of ``a X = b`` (``X a = b`` when not ``left``); ``b`` a vector or a
    batch of vectors when its shape is ``a``'s without the last dim; batch dims broadcast."""
    if not left:
        return _mT(solve(_mT(a), _mT(b)))
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and tuple(b.shape) == tuple(a.shape[:-1]))
    if vector:
        b = unsqueeze(b, -1)
    batch = broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]), op="linalg.solve")
    a = broadcast_to(a, batch + tuple(a.shape[-2:]))
    b = broadcast_to(b, batch + tuple(b.shape[-2:]))
    out = _bind(solve_prim, a, b)
    return squeeze(out, -1) if vector else out


def linalg_svd(x: Tensor, full_matrices: bool = True):
    """torch.linalg.svd: (U, S, Vh) with ``x = U diag(S) Vh``."""
    return LinalgSVDResult(*(svd_part(x, i, full_matrices) for i in range(3)))


def eigh(x: Tensor, UPLO: str = "L"):  # noqa: N803 - torch's name
    """Eigenvalues (ascending) and orthonormal eigenvectors of symmetric matrices, from the
    triangle ``UPLO`` of ``x``."""
    return EighResult(eigh_values(x, UPLO), eigh_vectors(x, UPLO))


# --------------------------------------------------------------------------- matrix_exp


def _matrix_exp_np(x):
    """exp of each matrix: scaled by 2^-s into norm <= 1/2, a Taylor series of 20 terms
    (truncation below 1e-25 relative there), then squared s times."""
    out = np.empty_like(x, dtype=np.float64)
    flat = x.reshape((-1,) + x.shape[-2:]).astype(np.float64)
    n = x.shape[-1]
    for i, a in enumerate(flat):
        norm = np.abs(a).sum(axis=0).max() if n else 0.0
        s = max(0, int(np.ceil(np.log2(norm / 0.5)))) if norm > 0.5 and np.isfinite(norm) else 0
        a = a / 2.0 ** s
        term = np.eye(n)
        total = np.eye(n)
        for k in range(1, 21):
            term = term @ a / k
            total = total + term
        for _ in range(s):
            total = total @ total
        if not np.all(np.isfinite(a)):
            total = np.full((n, n), np.nan)
        out.reshape((-1,) + x.shape[-2:])[i] = total
    return out.astype(x.dtype)


def _matrix_exp_vjp(g, out, x):
    # The adjoint of the Frechet derivative of exp at A applied to G is the upper right block
    # of exp([[A^T, G], [0, A^T]]) (Mathias 1996; what torch's backward computes too).
    n = x.shape[-1]
    at = _mT(x)
    top = cat([at, g], -1)
    bottom = cat([zeros_like(at), at], -1)
    big = _bind(matrix_exp_prim, cat([top, bottom], -2))
    return narrow(narrow(big, -2, 0, n), -1, n, n)


def _matrix_exp_infer(x: TensorType) -> TensorType:
    _check_matrices("linalg.matrix_exp", x)
    return x


matrix_exp_prim = _extern("matrix_exp", _matrix_exp_infer, _matrix_exp_np,
                          (Rule(_matrix_exp_vjp, (0,)),), "LinalgMatrixExpBackward0")


@public(torch=True, method=True)
def matrix_exp(x: Tensor) -> Tensor:
    """The matrix exponential of the square matrices in the last two dims."""
    return _bind(matrix_exp_prim, x)


# --------------------------------------------------------------------------- triangular solves

TriangularSolveResult = namedtuple("triangular_solve", ["solution", "cloned_coefficient"])


def _triangle(a: Tensor, upper: bool, unitriangular: bool) -> Tensor:
    """The triangle of ``a`` that a triangular solve reads (ones on the diagonal when
    ``unitriangular``): the other elements get no gradient, as in torch."""
    t = triu(a) if upper else tril(a)
    if unitriangular:
        n = a.shape[-1]
        t = where(eye(n, dtype=dtypes.bool_), 1.0, t)
    return t


def solve_triangular(a: Tensor, b: Tensor, *, upper: bool, left: bool = True,
                     unitriangular: bool = False) -> Tensor:
    """torch.linalg.solve_triangular: ``X`` with ``T X = b`` (``X T = b`` when not ``left``)
    for the triangle ``T`` of ``a``."""
    t = _triangle(a, upper, unitriangular)
    return solve(t, b, left=left) if b.ndim >= 2 else solve(t, b)


@public(torch=True, method=True)
def triangular_solve(b: Tensor, a: Tensor, upper: bool = True, transpose: bool = False,
                     unitriangular: bool = False):
    """(solution, a copy of ``a``) for the triangular system ``T X = b`` (``T^T X = b`` when
    ``transpose``), ``T`` the upper or lower triangle of ``a``."""
    t = _triangle(a, upper, unitriangular)
    if transpose:
        t = _mT(t)
    return TriangularSolveResult(_bind_solve(t, b), a.clone())


def _bind_solve(a: Tensor, b: Tensor) -> Tensor:
    batch = broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]), op="triangular_solve")
    return _bind(solve_prim, broadcast_to(a, batch + tuple(a.shape[-2:])),
                 broadcast_to(b, batch + tuple(b.shape[-2:])))


# --------------------------------------------------------------------------- LU


def _lu_np(a):
    """(packed L and U, LAPACK's 1-based pivots): Doolittle elimination with partial pivoting,
    as getrf (the largest magnitude in the column is the pivot; the first on ties)."""
    m, n = a.shape[-2:]
    k = min(m, n)
    flat = a.reshape((-1, m, n)).astype(np.float64)
    pivots = np.zeros((flat.shape[0], k), np.int32)
    for b, mat in enumerate(flat):
        for j in range(k):
            p = j + int(np.argmax(np.abs(mat[j:, j])))
            pivots[b, j] = p + 1
            if p != j:
                mat[[j, p]] = mat[[p, j]]
            if mat[j, j] != 0:
                mat[j + 1:, j] /= mat[j, j]
                mat[j + 1:, j + 1:] -= np.outer(mat[j + 1:, j], mat[j, j + 1:])
    return flat.reshape(a.shape).astype(a.dtype), pivots.reshape(a.shape[:-2] + (k,))


def _permutation_np(pivots, m: int, dtype):
    """P with ``A = P L U`` from LAPACK pivots (row ``j`` swapped with ``pivots[j] - 1``)."""
    flat = pivots.reshape((-1, pivots.shape[-1]))
    out = np.zeros((flat.shape[0], m, m), dtype)
    for b, piv in enumerate(flat):
        perm = np.arange(m)
        for j, p in enumerate(piv):
            perm[[j, p - 1]] = perm[[p - 1, j]]
        out[b, perm, np.arange(m)] = 1
    return out.reshape(pivots.shape[:-1] + (m, m))


def _lu_part_impl(which: str):
    def impl(x):
        packed, pivots = _lu_np(x)
        m, n = x.shape[-2:]
        k = min(m, n)
        if which == "pivots":
            return pivots
        if which == "p":
            return _permutation_np(pivots, m, x.dtype)
        if which == "l":
            low = np.tril(packed[..., :, :k], -1)
            low[..., range(k), range(k)] = 1
            return low
        return np.triu(packed[..., :k, :])
    return impl


def _lu_infer(which: str):
    def infer(x: TensorType) -> TensorType:
        _check_matrices("linalg.lu", x, square=False)
        m, n = x.shape[-2:]
        k = min(m, n)
        batch = x.shape[:-2]
        if which == "pivots":
            return TensorType(batch + (k,), dtypes.int32)
        shape = {"p": (m, m), "l": (m, k), "u": (k, n)}[which]
        return TensorType(batch + shape, x.dtype)
    return infer


def _lu_backward(x, gl, gu):
    """torch's linalg_lu_backward for square inputs:
    gA = P L^-T (tril(L^T gL, -1) + triu(gU U^T)) U^-T."""
    if x.shape[-1] != x.shape[-2]:
        raise NotImplementedError("linalg.lu: the gradient is implemented for square inputs")
    p, low, up = (_bind(prim, x) for prim in (lu_p_prim, lu_l_prim, lu_u_prim))
    inner = tril(_mT(low) @ gl, -1) if gl is not None else triu(gu @ _mT(up))
    return p @ (_mT(inv(low)) @ inner @ _mT(inv(up)))


lu_p_prim = _extern("lu_p", _lu_infer("p"), _lu_part_impl("p"), None, "LinalgLuBackward0")
lu_pivots_prim = _extern("lu_pivots", _lu_infer("pivots"), _lu_part_impl("pivots"), None,
                         "LinalgLuFactorExBackward0")
lu_l_prim = _extern("lu_l", _lu_infer("l"), _lu_part_impl("l"),
                    (Rule(lambda g, out, x: _lu_backward(x, g, None), (0,)),), "LinalgLuBackward0")
lu_u_prim = _extern("lu_u", _lu_infer("u"), _lu_part_impl("u"),
                    (Rule(lambda g, out, x: _lu_backward(x, None, g), (0,)),), "LinalgLuBackward0")


def _pivots_to_p_infer(pivots: TensorType, *, m: int, dtype) -> TensorType:
    return TensorType(pivots.shape[:-1] + (m, m), dtype)


pivots_to_p_prim = register(Primitive(
    "pivots_to_p", Kind.EXTERN, _pivots_to_p_infer,
    lambda piv, *, m, dtype: _permutation_np(piv, m, dtype.np_dtype), None, "",
    attrs=("m", "dtype")))

LUResult = namedtuple("linalg_lu", ["P", "L", "U"])
LUFactorResult = namedtuple("linalg_lu_factor", ["LU", "pivots"])


def linalg_lu(x: Tensor, *, pivot: bool = True):
    """(P, L, U) with ``x = P L U``, L unit lower triangular and U upper triangular."""
    if not pivot:
        raise NotImplementedError("linalg.lu: pivot=False is a CUDA-only option in torch")
    return LUResult(_bind(lu_p_prim, x), _bind(lu_l_prim, x), _bind(lu_u_prim, x))


def lu_factor(x: Tensor, *, pivot: bool = True):
    """(LU, pivots): L below the diagonal (its unit diagonal implied) and U on and above it,
    with LAPACK's 1-based int32 row pivots."""
    _, low, up = linalg_lu(x, pivot=pivot)
    m, n = x.shape[-2:]
    k = min(m, n)
    lower = tril(low, -1)
    if n > k:
        lower = cat([lower, zeros_like(x)[..., :, k:]], -1)
    upper = up if m == k else cat([up, zeros_like(x)[..., k:, :]], -2)
    return LUFactorResult(lower + upper, _bind(lu_pivots_prim, x))


@public(torch=True, method=True)
def lu(x: Tensor, pivot: bool = True, get_infos: bool = False):
    """torch.lu: (LU, pivots[, infos]) as ``linalg.lu_factor``."""
    packed, pivots = lu_factor(x, pivot=pivot)
    if get_infos:
        return packed, pivots, zeros(tuple(x.shape[:-2]), dtype=dtypes.int32)
    return packed, pivots


def linalg_lu_solve(lu_data: Tensor, pivots: Tensor, b: Tensor, *, left: bool = True,
                    adjoint: bool = False) -> Tensor:
    """``X`` with ``A X = b`` from A's ``lu_factor`` (``X A = b`` when not ``left``, ``A^T``
    when ``adjoint``): two triangular solves and the row permutation."""
    n = lu_data.shape[-1]
    low = _triangle(lu_data, False, True)
    up = triu(lu_data)
    p = _bind(pivots_to_p_prim, pivots, m=n, dtype=lu_data.dtype)
    a_factors = (p, low, up)
    if not left:
        # X A = b  <=>  A^T X^T = b^T.
        return _mT(linalg_lu_solve(lu_data, pivots, _mT(b), adjoint=not adjoint))
    if adjoint:
        # A^T = U^T L^T P^T: solve U^T y = b, then L^T z = y, then X = P z.
        y = _bind_solve(_mT(up), b)
        z = _bind_solve(_mT(low), y)
        return a_factors[0] @ z
    y = _bind_solve(low, _mT(p) @ b)
    return _bind_solve(up, y)


@public(torch=True, method=True)
def lu_solve(b: Tensor, lu_data: Tensor, lu_pivots: Tensor) -> Tensor:
    """torch.lu_solve: ``X`` with ``A X = b`` from A's ``lu_factor``."""
    return linalg_lu_solve(lu_data, lu_pivots, b)


# --------------------------------------------------------------------------- Householder


def _geqrf_a_infer(x: TensorType) -> TensorType:
    _check_matrices("geqrf", x, square=False)
    return x


def _geqrf_tau_infer(x: TensorType) -> TensorType:
    _check_matrices("geqrf", x, square=False)
    return TensorType(x.shape[:-2] + (min(x.shape[-2:]),), x.dtype)


def _geqrf_np(x):
    flat = x.reshape((-1,) + x.shape[-2:])
    hs, taus = zip(*(np.linalg.qr(m, mode="raw") for m in flat)) if len(flat) else ((), ())
    a = np.stack([h.T for h in hs]) if hs else np.zeros(flat.shape, x.dtype)
    tau = np.stack(taus) if taus else np.zeros((0, min(x.shape[-2:])), x.dtype)
    return a.reshape(x.shape).astype(x.dtype), tau.reshape(x.shape[:-2] + (-1,)).astype(x.dtype)


geqrf_a_prim = _extern("geqrf_a", _geqrf_a_infer, lambda x: _geqrf_np(x)[0], None,
                       "GeqrfBackward0")
geqrf_tau_prim = _extern("geqrf_tau", _geqrf_tau_infer, lambda x: _geqrf_np(x)[1], None,
                         "GeqrfBackward0")
GeqrfResult = namedtuple("geqrf", ["a", "tau"])


@public(torch=True, method=True)
def geqrf(x: Tensor):
    """LAPACK's geqrf: R on and above the diagonal of ``a``, the Householder vectors below it,
    and their scales ``tau`` (not differentiable, as in torch)."""
    return GeqrfResult(_bind(geqrf_a_prim, x), _bind(geqrf_tau_prim, x))


def _reflectors(a: Tensor, tau: Tensor):
    """The Householder matrices ``H_i = I - tau_i v_i v_i^T`` of geqrf's output, in order."""
    m = a.shape[-2]
    rows = arange(m)
    out = []
    for i in range(tau.shape[-1]):
        col = a[..., :, i]
        v = where(lt(rows, i), 0.0, where(eq(rows, i), 1.0, col))
        outer = unsqueeze(v, -1) * unsqueeze(v, -2)
        out.append(eye(m, dtype=a.dtype) - unsqueeze(unsqueeze(tau[..., i], -1), -1) * outer)
    return out


def householder_product(a: Tensor, tau: Tensor) -> Tensor:
    """The first ``n`` columns of ``H_1 H_2 ... H_k`` (torch.linalg.householder_product)."""
    m, n = a.shape[-2:]
    q = eye(m, dtype=a.dtype)
    for h in _reflectors(a, tau):
        q = q @ h
    return narrow(q, -1, 0, n) if n < m else q + zeros_like(a)


orgqr = public(householder_product, name="orgqr", torch=True, method=True)


@public(torch=True, method=True)
def ormqr(a: Tensor, tau: Tensor, other: Tensor, left: bool = True,
          transpose: bool = False) -> Tensor:
    """``Q other`` (``other Q`` when not ``left``; ``Q^T`` when ``transpose``) with Q the
    full product of geqrf's Householder reflectors."""
    m = a.shape[-2]
    q = eye(m, dtype=a.dtype)
    for h in _reflectors(a, tau):
        q = q @ h
    if transpose:
        q = _mT(q)
    return q @ other if left else other @ q


# --------------------------------------------------------------------------- JVP rules
# Forward mode (fusegrad.ops.dual). inv's rule is written out; the other decompositions take
# their VJP transposed (vjp_transposed: exact, a backward pass through the VJP), which
# keeps one derivation per decomposition. geqrf has no derivative, as in torch.

jvp_rule(inv_prim)(lambda ts, out, x: -(out @ ts[0] @ out))
for _prim in (solve_prim, det_prim, logabsdet_prim, cholesky_prim, qr_q_prim, qr_r_prim,
              svd_u_prim, svd_s_prim, svd_vh_prim, eigh_values_prim, eigh_vectors_prim,
              matrix_exp_prim, lu_l_prim, lu_u_prim):
    jvp_rule(_prim)(vjp_transposed(_prim))


@jvp_rule(slogdet_sign_prim)
def _slogdet_sign_jvp(ts, out, x):
    if x.dtype.is_complex:
        raise NotImplementedError(missing_rule_message(slogdet_sign_prim))
    return zeros_like(out)       # the sign of a real determinant is piecewise constant


no_jvp(lu_p_prim, "a permutation matrix: piecewise constant in the input")
no_jvp(lu_pivots_prim, "an integer result (pivot indices)")
no_jvp(pivots_to_p_prim, "its operand is integer pivots")


# --------------------------------------------------------------------------- batching rules
# LAPACK's calls map over leading dims: every operand batch-first, an unbatched one
# broadcast to the batch (solve wants A and B with the same leading dims).

from fusegrad.ops.batching import batching, leading_rule  # noqa: E402

for _prim in (inv_prim, solve_prim, det_prim, slogdet_sign_prim, logabsdet_prim, cholesky_prim,
              qr_q_prim, qr_r_prim, svd_u_prim, svd_s_prim, svd_vh_prim, eigh_values_prim,
              eigh_vectors_prim, matrix_exp_prim, lu_p_prim, lu_pivots_prim, lu_l_prim, lu_u_prim,
              pivots_to_p_prim, geqrf_a_prim, geqrf_tau_prim):
    batching(_prim)(leading_rule(_prim))
del _prim
