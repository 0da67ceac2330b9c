"""Tracing an ``nn.Module``: parameters and buffers become graph inputs.

They are lifted before the call's arguments, named after their dotted paths with ``_`` for
``.`` (``fc1.weight`` becomes ``%fc1_weight``), so one graph serves any weights: calling it
with new weights gives what the module computes with them. ``graph.meta`` records how many
inputs are module state and their names.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as NF
from fusegrad import nn
from fusegrad.ir import interpret
from fusegrad.ir.symbolic import SymbolicTensor
from fusegrad.passes.autodiff import grad_graph


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)
        self.register_buffer("scale", fg.ones(3) * 2)

    def forward(self, x):
        return self.fc2(NF.gelu(self.fc1(x))) * self.scale


def _state_arrays(module) -> list[np.ndarray]:
    seen, out = set(), []
    for _, t in list(module.named_parameters()) + list(module.named_buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t.detach().numpy())
    return out


def test_parameters_and_buffers_are_lifted_with_their_names():
    m = MLP()
    graph = fg.trace(m, fg.randn(5, 4))
    names = [v.name for v in graph.inputs]
    assert names == ["fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias", "scale", "x"]
    assert graph.meta.n_state == 5
    assert graph.meta.state_names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                      "scale"]
    assert not any(n.op == "constant" for n in graph.nodes), "weights must not be baked in"


def test_the_graph_runs_with_new_weights():
    """A second call with other weights (and another batch) matches the module eagerly."""
    m = MLP()
    x = fg.randn(5, 4)
    graph = fg.trace(m, x)
    np.testing.assert_array_equal(interpret(graph, *_state_arrays(m), x.numpy())[0],
                                  m(x).detach().numpy())
    with fg.no_grad():
        for p in m.parameters():
            p.copy_(fg.randn(*p.shape))
        m.scale.fill_(-0.5)
    x2 = fg.randn(5, 4)
    got = interpret(graph, *_state_arrays(m), x2.numpy())[0]
    np.testing.assert_array_equal(got, m(x2).detach().numpy())


def test_tracing_leaves_the_module_unchanged():
    m = MLP()
    before = {name: p for name, p in m.named_parameters()}
    fg.trace(m, fg.randn(2, 4))
    after = dict(m.named_parameters())
    assert all(after[k] is before[k] for k in before)
    assert all(not isinstance(p, SymbolicTensor) for p in m.parameters())
    assert m(fg.randn(2, 4)).shape == (2, 3)


def test_sequential_names_and_input_names():
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    graph = fg.trace(m, fg.randn(2, 3))
    assert [v.name for v in graph.inputs] == ["0_weight", "0_bias", "2_weight", "2_bias",
                                              "input"]


def test_shared_parameters_are_one_input():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(3, 3)
            self.dec = self.enc

        def forward(self, x):
            return self.dec(self.enc(x).tanh())
    m = Tied()
    x = fg.randn(2, 3)
    graph = fg.trace(m, x)
    assert [v.name for v in graph.inputs] == ["enc_weight", "enc_bias", "x"]
    np.testing.assert_array_equal(interpret(graph, *_state_arrays(m), x.numpy())[0],
                                  m(x).detach().numpy())


def test_buffer_updated_in_place_becomes_an_output():
    """A forward that writes a buffer (a step counter) returns its new value as an extra
    output; ``meta.mutations`` says which input it belongs to."""
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("steps", fg.zeros(()))

        def forward(self, x):
            self.steps.add_(1)
            return x * self.steps
    m = Counter()
    graph = fg.trace(m, fg.randn(3))
    assert graph.meta.mutations == [(0, 1)]
    assert float(m.steps) == 0.0, "tracing must not run the update"
    out, steps = interpret(graph, np.array(4.0, np.float32), np.ones(3, np.float32))
    assert float(steps) == 5.0 and out.tolist() == [5.0, 5.0, 5.0]


def test_gradients_with_respect_to_parameters_match_backward():
    """grad_graph of a traced module differentiates the lifted parameters."""
    fg.set_default_dtype(fg.float64)
    m = MLP()
    x = fg.randn(5, 4)
    target = fg.tensor([0, 2, 1, 1, 0])
    loss_fn = nn.CrossEntropyLoss()

    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = m

        def forward(self, x, t):
            return loss_fn(self.net(x), t)
    graph = fg.trace(WithLoss(), x, target)
    n_params = 4
    g2 = grad_graph(graph, wrt=range(n_params))
    results = interpret(g2, *_state_arrays(m), x.numpy(), target.numpy())
    loss = loss_fn(m(x), target)
    loss.backward()
    np.testing.assert_allclose(results[0], loss.detach().numpy(), rtol=1e-12)
    for got, p in zip(results[1:], m.parameters(), strict=True):
        np.testing.assert_allclose(got, p.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("training", [False, True])
def test_module_modes_trace_differently(training):
    """Dropout in eval mode is the identity; in training it draws from the rng input."""
    m = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    m.train(training)
    graph = fg.trace(m, fg.randn(2, 3))
    assert ("random_uniform" in [n.op for n in graph.nodes]) == training
    assert (graph.meta.rng_input is not None) == training
