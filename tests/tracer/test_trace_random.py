"""Random numbers under the tracer: ``random_uniform`` nodes keyed by a lifted ``rng`` input.

The generator is counter-based (Philox), so a key ``(seed, offset)`` fixes every number: the
graph takes the generator's state as the ``i64[2]`` input ``%rng``, each draw offsets it by
the counters the draws before it used, and replaying the graph with the key eager code would
have used reproduces eager's numbers exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as NF
from fusegrad import nn
from fusegrad.ir import interpret
from fusegrad.ir.symbolic import replay


def _noisy(x):
    return x + fg.rand(2, 3) * fg.rand(3) + fg.randn(2, 3) * 0.1


def _dropout(x):
    return NF.dropout(x, 0.4, training=True)


def _module_dropout(x):
    return nn.Dropout(0.3)(x.tanh())


def _feature_dropouts(x):
    """The channel-wise and alpha dropouts: one draw per channel, or per element."""
    y = x.reshape(1, 2, 3)
    return (NF.dropout1d(y, 0.4) + NF.alpha_dropout(x, 0.4, True) +
            NF.feature_alpha_dropout(y, 0.4, True))


def _inplace_fills(x):
    """Tensor.uniform_, normal_ and bernoulli_ on intermediates."""
    a = x.new_zeros(2, 3).uniform_(-1.0, 1.0)
    b = x.new_zeros(3).normal_(2.0, 0.5)
    c = x.new_zeros(2, 3).bernoulli_(0.3)
    return x * a + b + c


@pytest.mark.parametrize("fn", [_noisy, _dropout, _module_dropout, _feature_dropouts,
                                _inplace_fills],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("seed", [0, 1234])
def test_replaying_with_the_same_key_reproduces_eager(fn, seed):
    x = fg.randn(2, 3)
    graph = fg.trace(fn, x)
    info = graph.meta
    rng = graph.inputs[info.rng_input]
    assert rng.name == "rng" and str(rng.type) == "i64[2]"
    uses = [n for n in graph.nodes if n.op == "random_uniform"]
    assert uses, "random ops must stay in the graph, not be baked in as constants"
    assert all(n.inputs[0].producer.inputs[0] is rng for n in uses), "keyed by %rng"

    fg.manual_seed(seed)
    expected = fn(x).numpy()
    key = np.array([seed, 0], np.int64)
    np.testing.assert_array_equal(interpret(graph, x.numpy(), key)[0], expected)
    np.testing.assert_array_equal(replay(graph, [x, fg.tensor(key)])[0].numpy(), expected)
    # How far one call moves the generator: what the traced graph records.
    assert fg.get_rng_state()[1].item() == info.rng_counters


def test_different_keys_give_different_numbers_and_the_generator_is_untouched():
    x = fg.zeros(4, 5)
    fg.manual_seed(7)
    graph = fg.trace(lambda x: x + fg.rand(4, 5), x)
    assert fg.get_rng_state().tolist() == [7, 0], "tracing draws no numbers"
    a = interpret(graph, x.numpy(), np.array([7, 0]))[0]
    b = interpret(graph, x.numpy(), np.array([7, 5]))[0]
    c = interpret(graph, x.numpy(), np.array([8, 0]))[0]
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    assert ((a >= 0) & (a < 1)).all()


def test_draws_get_consecutive_offsets():
    """Two draws of 6 and 3 numbers: keys rng + (0, 0) and rng + (0, 2) (4 numbers a counter)."""
    graph = fg.trace(lambda x: x * fg.rand(2, 3) + fg.rand(3), fg.randn(2, 3))
    offsets = [n.attrs["value"].array.tolist() for n in graph.nodes if n.op == "constant"]
    assert offsets == [[0, 0], [0, 2]]
    assert graph.meta.rng_counters == 3


def test_grad_through_dropout_uses_the_generator_like_eager():
    """fusegrad.grad passes the generator's key to the graph and advances it, so a gradient
    through training-mode dropout equals eager backward with the same seed."""
    fg.set_default_dtype(fg.float64)
    x = fg.randn(3, 4)

    def loss(x):
        return (NF.dropout(x.sin(), 0.5) * x).sum()
    fg.manual_seed(3)
    got = fg.grad(loss)(x)
    state_after = fg.get_rng_state().tolist()
    fg.manual_seed(3)
    xe = x.detach().requires_grad_()
    loss(xe).backward()
    np.testing.assert_allclose(got.numpy(), xe.grad.numpy(), rtol=1e-12)
    assert fg.get_rng_state().tolist() == state_after


def test_functions_without_random_ops_have_no_rng_input():
    graph = fg.trace(lambda x: NF.dropout(x, 0.5, training=False) + 1, fg.randn(3))
    assert graph.meta.rng_input is None
    assert [v.name for v in graph.inputs] == ["x"]


def test_nested_grad_draws_one_mask_like_eager():
    """Inside an outer trace the inner grad's key comes from the outer rng input: grad of
    grad through dropout uses the mask eager code draws, and advances the generator once."""
    fg.set_default_dtype(fg.float64)
    x, v = fg.randn(6), fg.arange(6.0)

    def inner(y):
        return (NF.dropout(y, 0.5) * y).sum()
    fg.manual_seed(5)
    got = fg.grad(lambda x: (fg.grad(inner)(x) * v).sum())(x)
    state = fg.get_rng_state().tolist()
    fg.manual_seed(5)
    mask = NF.dropout(fg.ones(6), 0.5)
    np.testing.assert_array_equal(got.numpy(), (2 * mask * v).numpy())
    assert fg.get_rng_state().tolist() == state
