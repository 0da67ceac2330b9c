"""What a traced function closes over, where its nodes come from, and how it prints.

- Python scalars become inline literals (``mul %x, 2.5``); numpy arrays and concrete tensors
  become ``constant`` nodes (one per tensor, however often it is used); a 0-d tensor becomes
  a literal.
- A captured tensor that requires grad is lifted to a graph input (``graph.meta.lifted``)
  so that its gradient is not silently lost.
- Every node records the user's ``file:line``.
- Printing is deterministic: tracing the same function twice gives byte-identical text.
"""

from __future__ import annotations

import numpy as np

import fusegrad as fg
import fusegrad.nn.functional as NF
from fusegrad.ir import Literal, interpret, parse, print_graph
from fusegrad.passes.autodiff import grad_graph


def _ops(graph) -> list[str]:
    return [n.op for n in graph.nodes]


def test_python_scalars_become_literals():
    graph = fg.trace(lambda x: (x * 2.5 + 1) ** 2 - True, fg.randn(3))
    assert "constant" not in _ops(graph)
    literals = [op for n in graph.nodes for op in n.inputs if isinstance(op, Literal)]
    assert [lit.value for lit in literals] == [2.5, 1.0, 1.0]
    assert "mul %x, 2.5 : f32[3]" in print_graph(graph)


def test_numpy_arrays_become_constant_nodes():
    table = np.array([[1.0, -2.0, 3.5]], dtype=np.float32)
    x = fg.randn(2, 3)
    graph = fg.trace(lambda x: x * table, x)
    (const,) = [n for n in graph.nodes if n.op == "constant"]
    np.testing.assert_array_equal(const.attrs["value"].array, table)
    assert "dense<[[1.0, -2.0, 3.5]]>" in print_graph(graph)
    np.testing.assert_array_equal(interpret(graph, x.numpy())[0], (x * table).numpy())


def test_captured_tensors_become_one_constant_each():
    """c is one constant however often it is used; c.exp() has no traced operand, so it runs
    at trace time (constant folding, as in JAX) and is a constant of its own."""
    c = fg.randn(3)
    x = fg.randn(3)
    graph = fg.trace(lambda x: x * c + c.exp() - c, x)
    assert _ops(graph) == ["constant", "mul", "constant", "add", "sub"]
    assert [v.name for v in graph.inputs] == ["x"]
    assert not graph.meta.lifted
    np.testing.assert_array_equal(interpret(graph, x.numpy())[0], (x * c + c.exp() - c).numpy())


def test_captured_0d_tensor_becomes_a_literal():
    scale = fg.tensor(0.25)
    graph = fg.trace(lambda x: x * scale, fg.randn(3))
    assert "mul %x, 0.25 : f32[3]" in print_graph(graph)


def test_captured_tensor_requiring_grad_is_lifted():
    """w (requires_grad) becomes input %captured0, used twice but lifted once."""
    w = fg.randn(3, requires_grad=True)
    x = fg.randn(2, 3)
    graph = fg.trace(lambda x: (x * w).sum(1) + (x - w).sum(), x)
    assert [v.name for v in graph.inputs] == ["x", "captured0"]
    assert len(graph.meta.lifted) == 1
    tensor, index = graph.meta.lifted[0]
    assert tensor is w and index == 1
    assert "constant" not in _ops(graph)
    got = interpret(graph, x.numpy(), w.detach().numpy())[0]
    np.testing.assert_array_equal(got, ((x * w).sum(1) + (x - w).sum()).detach().numpy())


def test_captured_requires_grad_tensor_keeps_its_gradient_in_grad():
    """fusegrad.grad passes lifted tensors back in; the result still reaches them."""
    fg.set_default_dtype(fg.float64)
    w = fg.randn(3, requires_grad=True)
    x = fg.randn(3)
    gx = fg.grad(lambda x: (x * w).sin().sum())(x)
    np.testing.assert_allclose(gx.detach().numpy(), (w * (x * w).cos()).detach().numpy(),
                               rtol=1e-12)
    gx.sum().backward()           # the gradient is itself differentiable in w
    assert w.grad is not None


def test_nodes_record_the_users_line():
    def f(x):
        y = x.exp()
        return NF.softmax(y * 2, -1)
    graph = fg.trace(f, fg.randn(2, 3))
    first = f.__code__.co_firstlineno
    locs = [n.loc for n in graph.nodes]
    assert locs[0] == f"{__file__}:{first + 1}"
    # Every node of softmax's decomposition points at the user's call, not into fusegrad.
    assert set(locs[1:]) == {f"{__file__}:{first + 2}"}


def test_module_nodes_record_the_forward_line():
    class Net(fg.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = fg.nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x).relu()
    graph = fg.trace(Net(), fg.randn(4, 3))
    line = Net.forward.__code__.co_firstlineno + 1
    assert {n.loc for n in graph.nodes} == {f"{__file__}:{line}"}


def test_gradient_nodes_point_at_the_forward_line():
    """The autodiff pass copies each node's location, and gives a node's VJP that location
    too, so an error in the backward names the user's line that made the forward op."""
    def f(x, y):
        h = (x @ y).tanh()
        return h.sum()
    graph = grad_graph(fg.trace(f, fg.randn(2, 3), fg.randn(3, 4)))
    line = f.__code__.co_firstlineno
    by_op = {}
    for n in graph.nodes:
        by_op.setdefault(n.op, set()).add(n.loc)
    assert by_op["matmul"] == by_op["tanh"] == {f"{__file__}:{line + 1}"}   # forward + VJPs
    assert by_op["permute"] == {f"{__file__}:{line + 1}"}                   # matmul's VJP
    assert by_op["broadcast_to"] == {f"{__file__}:{line + 2}"}              # sum's VJP


def test_locations_print_and_round_trip():
    """``print_graph(locations=True)`` prints loc(...) and parses back to the same text."""
    def f(x, y):
        return (x @ y).tanh().sum()
    graph = fg.trace(f, fg.randn(2, 3), fg.randn(3, 4))
    for g in (graph, grad_graph(graph)):
        text = print_graph(g, locations=True)
        assert f'loc("{__file__}":{f.__code__.co_firstlineno + 1})' in text
        assert print_graph(parse(text), locations=True) == text
        assert [n.loc for n in parse(text).nodes] == [n.loc for n in g.nodes]


def _model(x, w1, w2, t):
    h = NF.gelu(x @ w1) + fg.tensor([0.5, -0.5, 1.0, 0.0])
    h = NF.dropout(h, 0.1)
    return NF.cross_entropy(h @ w2, t) + 0.01 * (w1 ** 2).sum()


def test_printing_is_deterministic():
    """Two traces of one function (random ops, constants, literals) print identically, with
    locations too; so do their gradient graphs."""
    args = (fg.randn(5, 3), fg.randn(3, 4), fg.randn(4, 2), fg.tensor([0, 1, 1, 0, 1]))
    texts = []
    for _ in range(2):
        graph = fg.trace(_model, *args)
        texts.append((print_graph(graph), print_graph(graph, locations=True),
                      print_graph(grad_graph(graph, [1, 2]), locations=True)))
    assert texts[0] == texts[1]


def test_input_names_follow_the_signature_and_pytrees():
    def f(params, xs, *rest, scale):
        return params["w"] * xs[0] + xs[1] + rest[0] * scale
    t = fg.randn(2)
    graph = fg.trace(f, {"w": t}, [t, t], t, scale=t)
    assert [v.name for v in graph.inputs] == ["params_0", "xs_0", "xs_1", "rest2", "scale"]
