"""matmul in every torch broadcasting case, mm/bmm/dot/mv/outer, their errors and gradients."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from tests.conftest import LAYOUTS, arr, assert_close, check_grad

MATMUL_SHAPES = [
    ((3,), (3,)),               # dot
    ((3,), (3, 4)),             # vector @ matrix
    ((2, 3), (3,)),             # matrix @ vector
    ((2, 3), (3, 4)),           # mm
    ((5, 2, 3), (5, 3, 4)),     # bmm
    ((5, 2, 3), (3, 4)),        # batched @ matrix
    ((2, 3), (5, 3, 4)),        # matrix @ batched
    ((3,), (5, 3, 4)),          # vector @ batched
    ((5, 2, 3), (3,)),          # batched @ vector
    ((5, 1, 2, 3), (4, 3, 2)),  # broadcast batch dims
    ((1, 2, 3), (4, 3, 1)),
    ((2, 0), (0, 3)),           # empty contraction
    ((0, 2, 3), (3, 4)),        # empty batch
]
SHAPE_IDS = ["x".join(map(str, a)) + "@" + "x".join(map(str, b)) for a, b in MATMUL_SHAPES]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=SHAPE_IDS)
def test_matmul_forward(sa, sb):
    a, b = arr(*sa), arr(*sb, seed=1)
    out = fg.tensor(a) @ fg.tensor(b)
    expected = np.matmul(a, b)
    assert out.shape == expected.shape
    assert_close(out, expected, rtol=1e-12)
    assert_close(fg.matmul(fg.tensor(a), fg.tensor(b)), expected, rtol=1e-12)


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES[:11], ids=SHAPE_IDS[:11])
@pytest.mark.parametrize("kind", LAYOUTS)
def test_matmul_grad(sa, sb, kind):
    check_grad(lambda x, y: x @ y, arr(*sa), arr(*sb, seed=1), kind=kind)


def test_matmul_of_transposed_operands():
    a, b = arr(3, 2), arr(4, 3, seed=1)
    out = fg.tensor(a).t() @ fg.tensor(b).t()
    assert_close(out, a.T @ b.T)
    check_grad(lambda x, y: x.t() @ y.mT, a, b)


def test_matmul_float32_and_integers():
    a, b = arr(4, 5).astype(np.float32), arr(5, 3, seed=1).astype(np.float32)
    out = fg.tensor(a) @ fg.tensor(b)
    assert out.dtype is fg.float32
    assert_close(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    i = fg.tensor([[1, 2], [3, 4]]) @ fg.tensor([[5], [6]])
    assert i.dtype is fg.int64 and i.tolist() == [[17], [39]]
    assert (fg.ones(2, 2, dtype=fg.float16) @ fg.ones(2, 2, dtype=fg.float16)).dtype is fg.float16


@pytest.mark.parametrize("sa,sb,msg", [
    ((4, 8), (9, 16), r"mat1 and mat2 shapes cannot be multiplied \(4x8 and 9x16\)"),
    ((2, 4, 8), (2, 9, 16), r"mat1 and mat2 shapes cannot be multiplied \(4x8 and 9x16\)"),
    ((3,), (4, 5), r"mat1 and mat2 shapes cannot be multiplied \(1x3 and 4x5\)"),
    ((2, 3), (4,), r"size mismatch, got input \(2\), mat \(2x3\), vec \(4\)"),
    ((3,), (4,), r"inconsistent tensor size, expected tensor \[3\] and src \[4\] to have the same "
                 r"number of elements, but got 3 and 4 elements respectively"),
    ((5, 2, 3), (4, 3, 2), r"matmul \(batch dims of f32\[5,2,3\] and f32\[4,3,2\]\): the size of "
                           r"tensor a \(5\) must match the size of tensor b \(4\) at non-singleton "
                           r"dimension 0"),
    ((), (3,), "both arguments to matmul need to be at least 1D, but they are 0D and 1D"),
])
def test_matmul_shape_errors(sa, sb, msg):
    with pytest.raises(RuntimeError, match=msg):
        fg.ones(*sa) @ fg.ones(*sb)


def test_matmul_type_errors():
    with pytest.raises(TypeError):
        fg.ones(2, 2) @ 2
    with pytest.raises(RuntimeError, match="not implemented for 'Bool'"):
        fg.ones(2, 2, dtype=fg.bool) @ fg.ones(2, 2, dtype=fg.bool)


def test_mm():
    a, b = arr(2, 3), arr(3, 4, seed=1)
    assert_close(fg.tensor(a).mm(fg.tensor(b)), a @ b)
    assert_close(fg.mm(fg.tensor(a), fg.tensor(b)), a @ b)
    with pytest.raises(RuntimeError, match="self must be a matrix"):
        fg.ones(3).mm(fg.ones(3, 4))
    with pytest.raises(RuntimeError, match="mat2 must be a matrix"):
        fg.ones(2, 3).mm(fg.ones(2, 3, 4))
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(2x3 and "
                                           r"4x4\)"):
        fg.ones(2, 3).mm(fg.ones(4, 4))


def test_bmm():
    a, b = arr(5, 2, 3), arr(5, 3, 4, seed=1)
    out = fg.tensor(a).bmm(fg.tensor(b))
    assert out.grad_fn is None and out.shape == (5, 2, 4)
    assert_close(out, a @ b)
    check_grad(lambda x, y: fg.bmm(x, y), a, b)
    with pytest.raises(RuntimeError, match="batch1 must be a 3D tensor"):
        fg.ones(2, 3).bmm(fg.ones(5, 3, 4))
    with pytest.raises(RuntimeError, match="batch2 must be a 3D tensor"):
        fg.ones(5, 2, 3).bmm(fg.ones(3, 4))
    with pytest.raises(RuntimeError, match=r"Expected size for first two dimensions of batch2 "
                                           r"tensor to be: \[5, 3\] but got: \[4, 3\]"):
        fg.ones(5, 2, 3).bmm(fg.ones(4, 3, 4))
    with pytest.raises(RuntimeError, match=r"shapes cannot be multiplied \(2x3 and 4x4\)"):
        fg.ones(5, 2, 3).bmm(fg.ones(5, 4, 4))


def test_dot_mv_outer():
    v, w = arr(3), arr(3, seed=1)
    assert_close(fg.tensor(v).dot(fg.tensor(w)), v @ w)
    assert fg.dot(fg.tensor(v), fg.tensor(w)).shape == ()
    m = arr(2, 3)
    assert_close(fg.tensor(m).mv(fg.tensor(v)), m @ v)
    assert_close(fg.outer(fg.tensor(arr(2)), fg.tensor(v)), np.outer(arr(2), v))
    check_grad(lambda x, y: x.dot(y), v, w)
    check_grad(lambda x, y: x.mv(y), m, v)
    check_grad(lambda x, y: fg.outer(x, y), arr(2), v)
    with pytest.raises(RuntimeError, match="1D tensors expected, but got 1D and 2D tensors"):
        fg.ones(3).dot(fg.ones(3, 1))
    with pytest.raises(RuntimeError, match="inconsistent tensor size"):
        fg.ones(3).dot(fg.ones(4))
    with pytest.raises(RuntimeError, match=r"size mismatch, got input \(2\), mat \(2x3\), vec "
                                           r"\(4\)"):
        fg.ones(2, 3).mv(fg.ones(4))


def test_matmul_gradient_values():
    a = fg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    b = fg.tensor([[5.0], [6.0]], requires_grad=True)
    (a @ b).sum().backward()
    assert a.grad.tolist() == [[5.0, 6.0], [5.0, 6.0]]
    assert b.grad.tolist() == [[4.0], [6.0]]


def test_broadcast_batch_gradient_is_summed():
    a = fg.ones(4, 2, 3, dtype=fg.float64, requires_grad=True)
    w = fg.ones(3, 5, dtype=fg.float64, requires_grad=True)
    (a @ w).sum().backward()
    assert w.grad.shape == (3, 5) and (w.grad == 8.0).all()
    assert a.grad.shape == (4, 2, 3) and (a.grad == 5.0).all()


def test_matmul_double_backward():
    from fusegrad.autograd.gradcheck import gradgradcheck
    x = fg.tensor(arr(2, 3), requires_grad=True)
    y = fg.tensor(arr(3, 2, seed=1), requires_grad=True)
    assert gradgradcheck(lambda p, q: (p @ q).tanh(), [x, y])


# --------------------------------------------------------------------------- torch.linalg
# Decompositions and solvers: values against numpy's LAPACK, gradients against central finite
# differences in float64. Symmetric inputs are built inside the function (A = X X^T + n I) so
# that the differences move through the whole matrix, as the analytic gradient assumes; losses
# of SVD and eigh factors are invariant to the sign of each singular/eigen vector.


def _spd(x):
    n = x.shape[-1]
    return x @ x.mT + n * fg.eye(n, dtype=x.dtype)


def _well_conditioned(*shape, seed=0):
    n = shape[-1]
    return arr(*shape, seed=seed) + 3 * np.eye(n)


@pytest.mark.parametrize("ord_", [2, 1, 3.5, np.inf, -np.inf, 0.5])
def test_linalg_vector_norm_gradcheck(ord_):
    check_grad(lambda x: fg.linalg.vector_norm(x, ord_, dim=-1), arr(3, 4, seed=2))
    check_grad(lambda x: fg.linalg.norm(x, ord_), arr(5, seed=3))


@pytest.mark.parametrize("ord_", ["fro", "nuc", 2, -2, 1, -1, np.inf, -np.inf])
def test_linalg_matrix_norm_values_and_gradcheck(ord_):
    a = arr(2, 3, 4, seed=4)
    assert_close(fg.linalg.matrix_norm(fg.tensor(a), ord_), np.linalg.norm(a, ord_, axis=(-2, -1)),
                 rtol=1e-10)
    check_grad(lambda x: fg.linalg.matrix_norm(x, ord_), a)
    check_grad(lambda x: fg.linalg.norm(x, ord_ if ord_ != "fro" else None), a[0])


def test_linalg_inv_values_and_gradcheck():
    a = _well_conditioned(2, 3, 3)
    assert_close(fg.linalg.inv(fg.tensor(a)), np.linalg.inv(a), rtol=1e-10, atol=1e-12)
    assert_close(fg.inverse(fg.tensor(a[0])), np.linalg.inv(a[0]), rtol=1e-10, atol=1e-12)
    check_grad(fg.linalg.inv, a)
    with pytest.raises(RuntimeError, match="singular"):
        fg.linalg.inv(fg.zeros(2, 2))


def test_linalg_solve_values_and_gradcheck():
    a, b, v = _well_conditioned(2, 3, 3), arr(2, 3, 2, seed=1), arr(3, seed=5)
    assert_close(fg.linalg.solve(fg.tensor(a), fg.tensor(b)), np.linalg.solve(a, b), rtol=1e-10)
    # A vector right-hand side, broadcast over the batch of matrices.
    got = fg.linalg.solve(fg.tensor(a), fg.tensor(v))
    assert_close(got, np.linalg.solve(a, v[None, :, None].repeat(2, 0))[..., 0], rtol=1e-10)
    check_grad(fg.linalg.solve, a, b)
    check_grad(fg.linalg.solve, a[0], v)
    check_grad(lambda x, y: fg.linalg.solve(x, y, left=False), a, arr(2, 2, 3, seed=6))


def test_linalg_det_slogdet_logdet():
    a = arr(3, 4, 4, seed=7)
    assert_close(fg.linalg.det(fg.tensor(a)), np.linalg.det(a), rtol=1e-10)
    sign, logabs = fg.linalg.slogdet(fg.tensor(a))
    ref_sign, ref_log = np.linalg.slogdet(a)
    assert_close(sign, ref_sign) and assert_close(logabs, ref_log, rtol=1e-10)
    ref = np.where(ref_sign < 0, np.nan, ref_log)
    assert_close(fg.logdet(fg.tensor(a)), ref, rtol=1e-10)
    check_grad(fg.det, a)
    check_grad(lambda x: fg.slogdet(x).logabsdet, a)
    check_grad(lambda x: fg.logdet(_spd(x)), a)


@pytest.mark.parametrize("compiled", [False, True])
def test_det_gradient_of_a_singular_matrix_is_zero_as_torchs(compiled):
    """torch's det backward solves with an LU that tolerates a singular matrix: its gradient
    is 0 where det is exactly 0 (it raised here); an invertible matrix in the same batch keeps
    det(A) A^-T."""
    a = np.array([[[1.0, 2.0], [2.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]], [[2.0, 1.0], [1.0, 3.0]]])
    x = fg.tensor(a, requires_grad=True)
    f = fg.compile(lambda t: fg.linalg.det(t).sum()) if compiled else \
        (lambda t: fg.linalg.det(t).sum())
    f(x).backward()
    want = np.zeros_like(a)
    want[2] = np.linalg.det(a[2]) * np.linalg.inv(a[2]).T
    assert_close(x.grad, want, rtol=1e-12, atol=1e-15)


def test_linalg_cholesky_values_and_gradcheck():
    x = arr(2, 3, 3, seed=8)
    spd = x @ np.swapaxes(x, -1, -2) + 3 * np.eye(3)
    low = np.linalg.cholesky(spd)
    assert_close(fg.linalg.cholesky(fg.tensor(spd)), low, rtol=1e-10, atol=1e-12)
    assert_close(fg.linalg.cholesky(fg.tensor(spd), upper=True), np.swapaxes(low, -1, -2),
                 rtol=1e-10, atol=1e-12)
    w = fg.tensor(arr(3, 3, seed=9))
    check_grad(lambda x: fg.linalg.cholesky(_spd(x)) * w, x)
    check_grad(lambda x: fg.cholesky(_spd(x), upper=True) * w, x)
    assert_close(fg.cholesky_inverse(fg.tensor(low)), np.linalg.inv(spd), rtol=1e-9, atol=1e-12)
    b = arr(2, 3, 2, seed=10)
    assert_close(fg.cholesky_solve(fg.tensor(b), fg.tensor(low)), np.linalg.solve(spd, b),
                 rtol=1e-9, atol=1e-12)
    with pytest.raises(RuntimeError, match="positive-definite"):
        fg.linalg.cholesky(-fg.eye(2))


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (2, 4, 3)])
def test_linalg_qr_values_and_gradcheck(shape):
    a = arr(*shape, seed=11)
    q, r = fg.linalg.qr(fg.tensor(a))
    ref_q, ref_r = np.linalg.qr(a)
    assert_close(q, ref_q, rtol=1e-10, atol=1e-12) and assert_close(r, ref_r, rtol=1e-10, atol=1e-12)
    wq, wr = fg.tensor(arr(*ref_q.shape, seed=12)), fg.tensor(arr(*ref_r.shape, seed=13))
    check_grad(lambda x: (fg.linalg.qr(x).Q * wq).sum() + (fg.linalg.qr(x).R * wr).sum(), a)
    check_grad(lambda x: fg.qr(x).R * wr, a)
    check_grad(lambda x: fg.qr(x).Q * wq, a)


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 4, 3)])
def test_linalg_svd_values_and_gauge_invariant_gradients(shape):
    a = arr(*shape, seed=14)
    u, s, vh = fg.linalg.svd(fg.tensor(a), full_matrices=False)
    assert_close(s, np.linalg.svd(a, compute_uv=False), rtol=1e-10)
    assert_close(u @ (s.unsqueeze(-1) * vh), a, rtol=1e-10, atol=1e-12)
    assert_close(fg.linalg.svdvals(fg.tensor(a)), np.linalg.svd(a, compute_uv=False), rtol=1e-10)
    w = fg.tensor(arr(*shape, seed=15))
    # Sum of singular values (its gradient is U Vh), the reconstruction, and the projectors
    # U U^T and V V^T: each unchanged when a singular vector pair flips sign.
    check_grad(lambda x: fg.linalg.svdvals(x).sum(), a)
    check_grad(lambda x: fg.linalg.svd(x, full_matrices=False).S ** 2, a)

    def reconstruction(x):
        u, s, vh = fg.linalg.svd(x, full_matrices=False)
        return (u @ (s.unsqueeze(-1) * vh) * w).sum()
    check_grad(reconstruction, a)

    def projectors(x):
        u, s, vh = fg.linalg.svd(x, full_matrices=False)
        return (u @ u.mT).sum() * 0.3 + (vh.mT @ vh * vh.mT.sum()).sum() + (s * s).sum()
    check_grad(projectors, a)

    def weighted_projector(x):
        u, s, vh = fg.linalg.svd(x, full_matrices=False)
        return ((u * s.unsqueeze(-2)) @ u.mT * (x @ x.mT)).sum()
    check_grad(weighted_projector, a)
    # torch.svd's V is Vh transposed.
    u2, s2, v2 = fg.svd(fg.tensor(a))
    assert_close(u2 @ (s2.unsqueeze(-1) * v2.mT), a, rtol=1e-10, atol=1e-12)


def test_linalg_eigh_values_and_gauge_invariant_gradients():
    x = arr(2, 4, 4, seed=16)
    sym = x + np.swapaxes(x, -1, -2)
    lam, vec = fg.linalg.eigh(fg.tensor(sym))
    assert_close(lam, np.linalg.eigvalsh(sym), rtol=1e-10)
    assert_close(vec @ (lam.unsqueeze(-1) * vec.mT), sym, rtol=1e-10, atol=1e-12)
    assert_close(fg.linalg.eigvalsh(fg.tensor(sym)), np.linalg.eigvalsh(sym), rtol=1e-10)
    weights = fg.tensor(np.array([0.3, -1.0, 2.0, 0.7]))

    def eigenvalues(x):
        return fg.linalg.eigvalsh(x + x.mT) * weights

    def spectral_function(x):
        lam, v = fg.linalg.eigh(x + x.mT)
        return (v * fg.tanh(lam).unsqueeze(-2)) @ v.mT

    def top_projector(x):
        lam, v = fg.linalg.eigh(x + x.mT)
        top = v[..., -1:]
        return top @ top.mT
    check_grad(eigenvalues, x)
    check_grad(spectral_function, x)
    check_grad(top_projector, x)


def test_pinverse_and_matrix_power():
    a = arr(4, 3, seed=17)
    assert_close(fg.pinverse(fg.tensor(a)), np.linalg.pinv(a), rtol=1e-9, atol=1e-12)
    assert_close(fg.linalg.pinv(fg.tensor(a)), np.linalg.pinv(a), rtol=1e-9, atol=1e-12)
    check_grad(fg.pinverse, a)
    m = _well_conditioned(3, 3, seed=18)
    for n in (0, 1, 2, 5, -1, -3):
        assert_close(fg.matrix_power(fg.tensor(m), n), np.linalg.matrix_power(m, n), rtol=1e-9,
                     atol=1e-12)
    check_grad(lambda x: fg.linalg.matrix_power(x, 3), m)
    check_grad(lambda x: x.matrix_power(-2), m)


def test_matrix_power_zero_is_the_identity_with_a_zero_gradient():
    # torch: the identity whatever the matrix holds (inf and NaN too), and a gradient of
    # zeros, not an error.
    x = fg.tensor(np.array([[[np.inf, 1.0], [np.nan, 2.0]]] * 3), requires_grad=True)
    out = fg.matrix_power(x, 0)
    np.testing.assert_array_equal(out.detach().numpy(), np.broadcast_to(np.eye(2), (3, 2, 2)))
    out.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros((3, 2, 2)))


def test_linalg_compiled_matches_eager():
    x = fg.tensor(arr(3, 3, seed=19), requires_grad=True)
    b = fg.tensor(arr(3, 2, seed=20))

    def fn(x):
        spd = x @ x.mT + 3 * fg.eye(3, dtype=x.dtype)
        low = fg.linalg.cholesky(spd)
        return (fg.linalg.solve(spd, b).sum() + fg.linalg.det(x) + fg.linalg.svdvals(x).sum()
                + (low * low).sum() + fg.linalg.eigvalsh(spd).max())

    eager = fn(x)
    (g_eager,) = fg.autograd.grad(eager, [x])
    compiled = fg.compile(fn)(x)
    (g_compiled,) = fg.autograd.grad(compiled, [x])
    assert_close(compiled, eager, rtol=1e-10)
    assert_close(g_compiled, g_eager, rtol=1e-9, atol=1e-12)


def _expm_reference(a):
    """exp(A) from the eigendecomposition of a diagonalizable matrix (numpy only)."""
    w, v = np.linalg.eig(a)
    return (v * np.exp(w)) @ np.linalg.inv(v)


def test_matrix_exp_values_and_gradcheck():
    a = arr(2, 3, 3, seed=21)
    ref = np.stack([_expm_reference(m).real for m in a])
    assert_close(fg.matrix_exp(fg.tensor(a)), ref, rtol=1e-12, atol=1e-13)
    assert_close(fg.linalg.matrix_exp(fg.tensor(a * 20)),
                 np.stack([_expm_reference(m * 20).real for m in a]), rtol=1e-9)
    # exp of a nilpotent matrix is a finite sum; of a diagonal one, elementwise.
    assert_close(fg.tensor([[0.0, 1.0], [0.0, 0.0]]).matrix_exp(), [[1.0, 1.0], [0.0, 1.0]])
    assert_close(fg.matrix_exp(fg.diag(fg.tensor([1.0, -2.0]))), np.diag(np.exp([1.0, -2.0])),
                 rtol=1e-6)
    check_grad(fg.matrix_exp, a)
    check_grad(fg.matrix_exp, a[0] * 3)


@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("unitriangular", [True, False])
def test_triangular_solves(upper, unitriangular):
    a = _well_conditioned(2, 3, 3, seed=22)
    b = arr(2, 3, 2, seed=23)
    t = np.triu(a) if upper else np.tril(a)
    if unitriangular:
        t[..., range(3), range(3)] = 1.0
    sol, coeff = fg.triangular_solve(fg.tensor(b), fg.tensor(a), upper, unitriangular=unitriangular)
    assert_close(sol, np.linalg.solve(t, b), rtol=1e-10) and assert_close(coeff, a)
    sol_t = fg.tensor(b).triangular_solve(fg.tensor(a), upper, True, unitriangular).solution
    assert_close(sol_t, np.linalg.solve(np.swapaxes(t, -1, -2), b), rtol=1e-10)
    got = fg.linalg.solve_triangular(fg.tensor(a), fg.tensor(b), upper=upper,
                                     unitriangular=unitriangular)
    assert_close(got, np.linalg.solve(t, b), rtol=1e-10)
    right = fg.linalg.solve_triangular(fg.tensor(a), fg.tensor(np.swapaxes(b, -1, -2)),
                                       upper=upper, left=False, unitriangular=unitriangular)
    assert_close(right @ fg.tensor(t), np.swapaxes(b, -1, -2), rtol=1e-10)
    check_grad(lambda x, y: fg.triangular_solve(y, x, upper, unitriangular=unitriangular)[0], a, b)
    # Only the triangle that is read gets a gradient, as in torch.
    x = fg.tensor(a, requires_grad=True)
    fg.linalg.solve_triangular(x, fg.tensor(b), upper=upper).sum().backward()
    other = np.tril(np.ones((3, 3)), -1) if upper else np.triu(np.ones((3, 3)), 1)
    assert np.all(x.grad.numpy() * other == 0)


def test_linalg_helpers():
    a, b, c = arr(2, 3, seed=24), arr(3, 4, seed=25), arr(4, seed=26)
    assert_close(fg.linalg.multi_dot([fg.tensor(a), fg.tensor(b), fg.tensor(c)]),
                 np.linalg.multi_dot([a, b, c]), rtol=1e-13)
    m = arr(3, 4, 4, seed=27)
    m[1, 3] = m[1, 0] + m[1, 1]
    m[2] = 0
    assert fg.linalg.matrix_rank(fg.tensor(m)).tolist() == np.linalg.matrix_rank(m).tolist()
    assert_close(fg.linalg.diagonal(fg.tensor(m), offset=1), np.diagonal(m, 1, -2, -1))
    inverse, info = fg.linalg.inv_ex(fg.tensor(m[0]))
    assert_close(inverse, np.linalg.inv(m[0]), rtol=1e-10) and info.tolist() == 0
    spd = m[0] @ m[0].T + np.eye(4)
    low, info = fg.linalg.cholesky_ex(fg.tensor(spd))
    assert_close(low, np.linalg.cholesky(spd), rtol=1e-10) and info.dtype is fg.int32


def _lu_reference(a):
    """(P, L, U) by Doolittle elimination with partial pivoting, written out plainly."""
    n = a.shape[0]
    u, perm, low = a.copy(), np.arange(n), np.eye(n)
    for j in range(n):
        p = j + np.argmax(np.abs(u[j:, j]))
        u[[j, p]], perm[[j, p]] = u[[p, j]], perm[[p, j]]
        low[[j, p], :j] = low[[p, j], :j]
        for i in range(j + 1, n):
            low[i, j] = u[i, j] / u[j, j]
            u[i] -= low[i, j] * u[j]
    return np.eye(n)[perm].T, low, np.triu(u)


def test_lu_values_and_gradcheck():
    a = arr(2, 4, 4, seed=30)
    p, low, up = fg.linalg.lu(fg.tensor(a))
    for i in range(2):
        ref = _lu_reference(a[i])
        for got, want in zip((p[i], low[i], up[i]), ref):
            assert_close(got, want, rtol=1e-12, atol=1e-14)
    packed, pivots = fg.linalg.lu_factor(fg.tensor(a))
    assert pivots.dtype is fg.int32 and pivots.min().item() >= 1
    assert_close(packed, np.tril(low.numpy(), -1) + up.numpy(), rtol=1e-14)
    packed2, pivots2, infos = fg.lu(fg.tensor(a), get_infos=True)
    assert_close(packed2, packed) and infos.tolist() == [0, 0]
    # Rectangular factorizations reconstruct the input.
    for shape in [(5, 3), (3, 5)]:
        r = arr(*shape, seed=31)
        p, low, up = fg.linalg.lu(fg.tensor(r))
        assert_close(p @ low @ up, r, rtol=1e-12, atol=1e-14)
    check_grad(lambda x: fg.linalg.lu(x).L * fg.tensor(arr(4, 4, seed=32)), a[0])
    check_grad(lambda x: fg.linalg.lu(x).U, a[0])
    check_grad(lambda x: fg.linalg.lu_factor(x).LU, a)


def test_lu_solve_and_gradcheck():
    a, b = _well_conditioned(2, 3, 3, seed=33), arr(2, 3, 2, seed=34)
    packed, pivots = fg.linalg.lu_factor(fg.tensor(a))
    assert_close(fg.linalg.lu_solve(packed, pivots, fg.tensor(b)), np.linalg.solve(a, b),
                 rtol=1e-12)
    assert_close(fg.lu_solve(fg.tensor(b), packed, pivots), np.linalg.solve(a, b), rtol=1e-12)
    at = np.swapaxes(a, -1, -2)
    assert_close(fg.linalg.lu_solve(packed, pivots, fg.tensor(b), adjoint=True),
                 np.linalg.solve(at, b), rtol=1e-12)
    bt = np.swapaxes(b, -1, -2)
    right = fg.linalg.lu_solve(packed, pivots, fg.tensor(bt), left=False)
    assert_close(right @ fg.tensor(a), bt, rtol=1e-12)
    check_grad(lambda x, y: fg.linalg.lu_solve(*fg.linalg.lu_factor(x), y), a, b)


def test_geqrf_householder_product_ormqr():
    a = arr(5, 3, seed=35)
    h, tau = fg.geqrf(fg.tensor(a))
    raw_h, raw_tau = np.linalg.qr(a, mode="raw")
    assert_close(h, raw_h.T, rtol=1e-14) and assert_close(tau, raw_tau, rtol=1e-14)
    q = fg.linalg.householder_product(h, tau)
    assert_close(q, np.linalg.qr(a)[0], rtol=1e-12, atol=1e-14)
    assert_close(fg.orgqr(h, tau), q)
    c = arr(5, 2, seed=36)
    full_q = np.linalg.qr(a, mode="complete")[0]
    assert_close(fg.ormqr(h, tau, fg.tensor(c)), full_q @ c, rtol=1e-12, atol=1e-14)
    assert_close(fg.ormqr(h, tau, fg.tensor(c), transpose=True), full_q.T @ c, rtol=1e-12,
                 atol=1e-14)
    assert_close(fg.ormqr(h, tau, fg.tensor(c.T), left=False), c.T @ full_q, rtol=1e-12,
                 atol=1e-14)
    check_grad(fg.linalg.householder_product, raw_h.T, raw_tau)
