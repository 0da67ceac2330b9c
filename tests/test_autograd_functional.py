"""autograd.functional against finite differences (float64) and hand-derived results."""

import numpy as np
import pytest

import fusegrad as fg

AF = fg.autograd.functional
RNG = np.random.default_rng(0)
X = RNG.standard_normal(3)
Y = RNG.standard_normal((2, 3))


def f_np(x, y):
    return np.tanh(y @ x) * np.exp(x[:2]), (x ** 2).sum() * y


def f_fg(x, y):
    return (y @ x).tanh() * x[:2].exp(), (x ** 2).sum() * y


def numeric_jacobian(fn, args, which, out_index, eps=1e-6):
    base = [a.copy() for a in args]
    shape_in = base[which].shape
    out_shape = np.shape(fn(*base)[out_index])
    jac = np.zeros(out_shape + shape_in)
    for idx in np.ndindex(shape_in):
        plus = [a.copy() for a in base]
        minus = [a.copy() for a in base]
        plus[which][idx] += eps
        minus[which][idx] -= eps
        jac[(...,) + idx] = (fn(*plus)[out_index] - fn(*minus)[out_index]) / (2 * eps)
    return jac


def t(a):
    return fg.tensor(a, dtype=fg.float64)


def test_jacobian_tuple_structure_against_finite_differences():
    jac = AF.jacobian(f_fg, (t(X), t(Y)))
    assert len(jac) == 2 and all(len(row) == 2 for row in jac)
    for i in range(2):
        for j in range(2):
            want = numeric_jacobian(f_np, [X, Y], j, i)
            np.testing.assert_allclose(jac[i][j].numpy(), want, rtol=1e-6, atol=1e-8)


def test_jacobian_single_tensor_shape_and_options():
    fn = lambda x: x.sin() * x.sum()  # noqa: E731
    jac = AF.jacobian(fn, t(X), vectorize=True)
    assert jac.shape == (3, 3)
    want = numeric_jacobian(lambda x: (np.sin(x) * x.sum(),), [X], 0, 0)
    np.testing.assert_allclose(jac.numpy(), want, rtol=1e-6, atol=1e-8)
    with pytest.raises(NotImplementedError, match="requires `vectorize=True`"):
        AF.jacobian(fn, t(X), strategy="forward-mode")


def scalar_np(x, y):
    return (np.sum(x ** 3 * y[0]) + np.prod(np.cos(x)),)


def scalar_fg(x, y):
    return (x ** 3 * y[0]).sum() + x.cos().prod()


def grad_np(x, y):
    return (numeric_jacobian(scalar_np, [x, y], 0, 0),)


def test_hessian_against_finite_differences():
    h = AF.hessian(lambda x: scalar_fg(x, t(Y)), t(X))
    want = numeric_jacobian(lambda x: grad_np(x, Y), [X], 0, 0, eps=1e-4)
    assert h.shape == (3, 3)
    np.testing.assert_allclose(h.numpy(), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(h.numpy(), h.numpy().T, rtol=1e-12)
    blocks = AF.hessian(scalar_fg, (t(X), t(Y)))
    assert blocks[0][0].shape == (3, 3) and blocks[0][1].shape == (3, 2, 3)
    assert blocks[1][0].shape == (2, 3, 3) and blocks[1][1].shape == (2, 3, 2, 3)
    np.testing.assert_allclose(blocks[0][0].numpy(), h.numpy(), rtol=1e-12)
    # d2/dx dy[0]: 3 x^2 on the diagonal; y[1] does not enter
    np.testing.assert_allclose(blocks[0][1].numpy()[:, 0, :], np.diag(3 * X ** 2), atol=1e-12)
    assert np.all(blocks[1][1].numpy() == 0)


def test_vjp_jvp_match_the_jacobian():
    jac = AF.jacobian(f_fg, (t(X), t(Y)))
    u = (t(RNG.standard_normal(2)), t(RNG.standard_normal((2, 3))))
    v = (t(RNG.standard_normal(3)), t(RNG.standard_normal((2, 3))))
    out, vjp = AF.vjp(f_fg, (t(X), t(Y)), u)
    np.testing.assert_allclose(out[0].numpy(), f_np(X, Y)[0], rtol=1e-12)
    for j in range(2):
        want = sum(np.tensordot(u[i].numpy(), jac[i][j].numpy(), axes=u[i].ndim) for i in range(2))
        np.testing.assert_allclose(vjp[j].numpy(), want, rtol=1e-10, atol=1e-12)
    out, jvp = AF.jvp(f_fg, (t(X), t(Y)), v)
    for i in range(2):
        want = sum(np.tensordot(jac[i][j].numpy(), v[j].numpy(), axes=v[j].ndim) for j in range(2))
        np.testing.assert_allclose(jvp[i].numpy(), want, rtol=1e-10, atol=1e-12)


def test_hvp_vhp_match_the_hessian():
    fn = lambda x: scalar_fg(x, t(Y))  # noqa: E731
    h = AF.hessian(fn, t(X)).numpy()
    v = t(RNG.standard_normal(3))
    value, hv = AF.hvp(fn, t(X), v)
    _, vh = AF.vhp(fn, t(X), v)
    np.testing.assert_allclose(value.item(), scalar_np(X, Y)[0], rtol=1e-12)
    np.testing.assert_allclose(hv.numpy(), h @ v.numpy(), rtol=1e-10)
    np.testing.assert_allclose(vh.numpy(), v.numpy() @ h, rtol=1e-10)


def test_create_graph_results_are_differentiable():
    x = t(X).requires_grad_(True)
    _, g = AF.vjp(lambda a: (a ** 3).sum(), x, create_graph=True)
    assert g.requires_grad
    (gx,) = fg.autograd.grad(g.sum(), x)
    np.testing.assert_allclose(gx.numpy(), 6 * X, rtol=1e-12)
    _, g = AF.vjp(lambda a: (a ** 3).sum(), x)
    assert not g.requires_grad


def test_unused_inputs_strict_and_validation():
    fn = lambda a, b: a * 2  # noqa: E731
    _, grads = AF.vjp(fn, (t(X), t(X)), t(np.ones(3)))
    assert np.all(grads[1].numpy() == 0)
    with pytest.raises(RuntimeError, match="independent of input 1"):
        AF.vjp(fn, (t(X), t(X)), t(np.ones(3)), strict=True)
    with pytest.raises(RuntimeError, match="v can only be None if the user-provided function "
                       "returns a single Tensor with a single element"):
        AF.vjp(lambda a: a * 2, t(X))
    with pytest.raises(RuntimeError, match="v has invalid size"):
        AF.vjp(lambda a: a * 2, t(X), t(np.ones(2)))
    with pytest.raises(RuntimeError, match="v is a tuple of invalid length"):
        AF.jvp(fn, (t(X), t(X)), (t(X),))
    with pytest.raises(TypeError, match="must be either a Tensor or a tuple of Tensors"):
        AF.jacobian(lambda a: a, [1.0])
    with pytest.raises(RuntimeError, match="should contain a single element"):
        AF.hessian(lambda a: a * 2, t(X))
    with pytest.raises(RuntimeError, match="jacobian of the user-provided function with respect "
                       "to input 0 is independent of the input"):
        AF.hessian(lambda a: a.sum() * 2, t(X), strict=True)
