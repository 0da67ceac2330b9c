"""The functional transforms (``grad``, ``value_and_grad``, ``vjp``) and the graph-level API of
the autodiff pass (``grad_graph``, ``vjp_graph``): arguments, pytrees, outputs and errors.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.ir import interpret
from fusegrad.passes.autodiff import grad_graph, vjp_graph
from fusegrad.tracer import transforms


@pytest.fixture(autouse=True)
def _float64():
    fg.set_default_dtype(fg.float64)


def _eager_grads(fn, *xs):
    leaves = [x.detach().requires_grad_() for x in xs]
    fn(*leaves).backward()
    return [x.grad for x in leaves]


def test_value_and_grad_with_argnums():
    x, y = fg.randn(3), fg.randn(3)
    f = lambda x, y: (x.exp() * y).sum()        # noqa: E731
    value, (gx, gy) = fg.value_and_grad(f, argnums=(0, 1))(x, y)
    ex, ey = _eager_grads(f, x, y)
    assert value.item() == pytest.approx(f(x, y).item(), rel=1e-15)
    np.testing.assert_allclose(gx.numpy(), ex.numpy(), rtol=1e-12)
    np.testing.assert_allclose(gy.numpy(), ey.numpy(), rtol=1e-12)
    gy_only = fg.grad(f, argnums=1)(x, y)
    np.testing.assert_allclose(gy_only.numpy(), ey.numpy(), rtol=1e-12)


def test_has_aux_returns_the_auxiliary_value():
    x = fg.randn(4)
    g, aux = fg.grad(lambda x: ((x ** 2).sum(), {"mean": x.mean()}), has_aux=True)(x)
    np.testing.assert_allclose(g.numpy(), 2 * x.numpy(), rtol=1e-15)
    assert aux["mean"].item() == pytest.approx(x.mean().item())


def test_pytree_arguments_get_pytree_gradients():
    params = {"w": fg.randn(3, 2), "b": [fg.randn(2)]}
    x = fg.randn(4, 3)

    def loss(params, x):
        return ((x @ params["w"] + params["b"][0]).tanh() ** 2).mean()
    grads = fg.grad(loss)(params, x)
    assert set(grads) == {"w", "b"} and isinstance(grads["b"], list)
    ew, eb = _eager_grads(lambda w, b: loss({"w": w, "b": [b]}, x), params["w"], params["b"][0])
    np.testing.assert_allclose(grads["w"].numpy(), ew.numpy(), rtol=1e-10)
    np.testing.assert_allclose(grads["b"][0].numpy(), eb.numpy(), rtol=1e-10)


def test_keyword_and_static_arguments_pass_through():
    x = fg.randn(3)
    g = fg.grad(lambda x, scale, *, shift: ((x + shift) * scale).sum())(x, 2.5, shift=x)
    np.testing.assert_allclose(g.numpy(), np.full(3, 2.5))


def test_integer_arguments_are_not_differentiable():
    """Regression: grad with respect to an index tensor returned silent integer zeros."""
    x, idx = fg.randn(4), fg.tensor([0, 2])
    f = lambda x, i: x[i].sum()          # noqa: E731
    np.testing.assert_array_equal(fg.grad(f)(x, idx).numpy(), [1.0, 0.0, 1.0, 0.0])
    with pytest.raises(TypeError, match="floating-point"):
        fg.grad(f, argnums=1)(x, idx)


def test_grad_requires_a_scalar_output():
    with pytest.raises(TypeError, match="real scalar output"):
        fg.grad(lambda x: x * 2)(fg.randn(3))


def test_grad_graph_takes_the_functions_names(monkeypatch):
    """fusegrad.grad traces the user's function under its own name and parameter names."""
    graphs = []

    def spy(graph, wrt):
        graphs.append(graph)
        return grad_graph(graph, wrt)

    def loss(weights, inputs):
        return (weights * inputs).sum()
    monkeypatch.setattr(transforms, "grad_graph", spy)
    fg.grad(loss)(fg.randn(2), fg.randn(2))
    assert graphs[0].name == "loss"
    assert [v.name for v in graphs[0].inputs] == ["weights", "inputs"]


def test_vjp_matches_eager_backward_with_a_cotangent():
    x, y = fg.randn(2, 3), fg.randn(3)
    f = lambda x, y: (x * y).sin()        # noqa: E731
    out, vjp_fn = fg.vjp(f, x, y)
    ct = fg.randn(2, 3)
    gx, gy = vjp_fn(ct)
    xe, ye = x.detach().requires_grad_(), y.detach().requires_grad_()
    f(xe, ye).backward(ct)
    np.testing.assert_array_equal(out.numpy(), f(x, y).numpy())
    np.testing.assert_allclose(gx.numpy(), xe.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(gy.numpy(), ye.grad.numpy(), rtol=1e-12)


def test_grad_graph_outputs_wrt_subsets_and_unused_inputs():
    """Outputs are (*outputs, *grads[wrt]); an input the output ignores gets zeros, an index
    input takes part without a gradient."""
    def f(x, unused, idx):
        return (x[idx] ** 2).sum()
    args = (fg.randn(4), fg.randn(2), fg.tensor([1, 1, 3]))
    graph = fg.trace(f, *args)
    g2 = grad_graph(graph, wrt=[0, 1])
    assert [str(t) for t in g2.output_types] == ["f64[]", "f64[4]", "f64[2]"]
    value, gx, gu = interpret(g2, *(a.numpy() for a in args))
    x = args[0].numpy()
    np.testing.assert_allclose(gx, [0, 4 * x[1], 0, 2 * x[3]], rtol=1e-15)
    np.testing.assert_array_equal(gu, np.zeros(2))
    assert value == pytest.approx(f(*args).item())
    with pytest.raises(TypeError, match="real scalar"):
        grad_graph(fg.trace(lambda x: x * 2, args[0]))


def test_grad_graph_of_a_chosen_output():
    graph = fg.trace(lambda x: (x.sum(), (x ** 3).sum()), fg.randn(3))
    g2 = grad_graph(graph, wrt=[0], output=1)
    x = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(interpret(g2, x)[2], 3 * x ** 2, rtol=1e-15)


def test_vjp_graph_sums_cotangents_of_repeated_outputs():
    """An output returned twice gets the sum of both cotangents."""
    def f(x):
        y = x * 2
        return y, y, x.exp()
    graph = fg.trace(f, fg.randn(3))
    assert graph.outputs[0] is graph.outputs[1]
    g2 = vjp_graph(graph)
    assert [v.name for v in g2.inputs] == ["x", "ct0", "ct1", "ct2"]
    x = np.array([0.1, 0.2, 0.3])
    cts = [np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.5, 0.5]), np.ones(3)]
    *_, gx = interpret(g2, x, *cts)
    np.testing.assert_allclose(gx, 2 * cts[0] + 2 * cts[1] + np.exp(x), rtol=1e-15)


def test_grad_of_a_function_closing_over_a_model():
    """Regression: capturing a module (parameters that require grad) raised
    NotImplementedError; the parameters are now passed back in as lifted inputs."""
    model = fg.nn.Sequential(fg.nn.Linear(3, 4), fg.nn.Tanh(), fg.nn.Linear(4, 1))
    x = fg.randn(5, 3)
    got = fg.grad(lambda x: model(x).sum())(x)
    (expected,) = _eager_grads(lambda x: model(x).sum(), x)
    np.testing.assert_allclose(got.detach().numpy(), expected.numpy(), rtol=1e-12)
