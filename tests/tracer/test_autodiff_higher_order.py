"""Higher-order derivatives: the autodiff pass's output is an ordinary graph, so it can be
differentiated again.

``fusegrad.grad`` nested (grad of grad, with and without closures over the outer variable) is
checked against central finite differences of the first derivative, and at the graph level
``vjp_graph(grad_graph(g))`` gives Hessian-vector products.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as NF
from fusegrad.ir import interpret
from fusegrad.passes.autodiff import grad_graph, vjp_graph

EPS = 1e-6


def _fd_gradient(fn, x: np.ndarray) -> np.ndarray:
    """Central differences of the scalar ``fn`` (numpy in, float out) at ``x``."""
    out = np.zeros_like(x)
    for j in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[j] += EPS
        down[j] -= EPS
        out[j] = (fn(up) - fn(down)) / (2 * EPS)
    return out


def _t(a: np.ndarray) -> fg.Tensor:
    return fg.from_numpy(np.array(a, dtype=np.float64))


FUNCTIONS = {
    "cubic": lambda x: (x ** 3).sum(),
    "sin-times-norm": lambda x: (x.sin() * (x * x).sum()).sum(),
    "logsumexp": lambda x: fg.logsumexp(x * 1.5, 0),
    "softmax-entropy": lambda x: -(NF.softmax(x, 0) * NF.log_softmax(x, 0)).sum(),
    "tanh-matmul": lambda x: (x.reshape(2, 2) @ x.reshape(2, 2).tanh()).sum(),
    "gelu-layer-norm": lambda x: NF.gelu(NF.layer_norm(x, (4,))).pow(2).sum(),
}


@pytest.mark.parametrize("name", FUNCTIONS)
def test_grad_of_grad_matches_finite_differences(name):
    """d/dx <grad f(x), v> == Hessian(f) v, against differences of grad f."""
    f = FUNCTIONS[name]
    x = np.array([0.3, -0.7, 1.1, 0.4])
    v = _t([1.0, -2.0, 0.5, 3.0])
    df = fg.grad(f)

    def directional(x):
        return (df(x) * v).sum()
    hv = fg.grad(directional)(_t(x)).numpy()
    np.testing.assert_allclose(hv, _fd_gradient(lambda a: float(directional(_t(a))), x),
                               rtol=1e-6, atol=1e-7)


def test_third_derivative_of_a_scalar_function():
    """d^3/dx^3 of sin(x) x^2 at 0.7, in closed form and by differences of the second."""
    f = lambda s: s.sin() * s ** 2          # noqa: E731
    d2 = fg.grad(fg.grad(f))
    d3 = fg.grad(d2)(_t(0.7)).item()
    v = 0.7
    exact = -math.cos(v) * v * v - 6 * v * math.sin(v) + 6 * math.cos(v)
    assert d3 == pytest.approx(exact, rel=1e-12)
    fd = (d2(_t(v + EPS)).item() - d2(_t(v - EPS)).item()) / (2 * EPS)
    assert d3 == pytest.approx(fd, rel=1e-6)


def test_nested_grad_closing_over_the_outer_variable():
    """The inner function uses the outer x as a free variable (lifted into the inner graph),
    the Hessian-vector-product pattern: d/dx sum(v * d/dy sum(x * sin y)|_{y=x})."""
    v = _t([1.0, 2.0, -1.0])

    def outer(x):
        inner = fg.grad(lambda y: (x * y.sin()).sum())(x)
        return (inner * v).sum()
    x = np.array([0.2, -1.3, 0.8])
    got = fg.grad(outer)(_t(x)).numpy()
    np.testing.assert_allclose(got, v.numpy() * (np.cos(x) - x * np.sin(x)), rtol=1e-12)
    np.testing.assert_allclose(got, _fd_gradient(lambda a: float(outer(_t(a))), x), rtol=1e-6)


def test_hessian_vector_product_at_the_graph_level():
    """interpret(vjp_graph(grad_graph(trace(f))), x, 0, v) gives H v."""
    f = FUNCTIONS["sin-times-norm"]
    x = np.array([0.3, -0.7, 1.1, 0.4])
    v = np.array([1.0, -2.0, 0.5, 3.0])
    g1 = grad_graph(fg.trace(f, _t(x)))                      # x -> (f, grad f)
    g2 = vjp_graph(g1)                                       # (x, ct_f, ct_grad) -> (..., H v)
    _, _, hv = interpret(g2, x, np.array(0.0), v)
    fd = _fd_gradient(lambda a: float((fg.grad(f)(_t(a)).numpy() * v).sum()), x)
    np.testing.assert_allclose(hv, fd, rtol=1e-6, atol=1e-7)
