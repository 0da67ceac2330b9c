"""In-place writes under the tracer are functionalized.

- A write to an input (``x.add_(y)``, ``x[0] = 1``, an optimizer step) becomes an extra graph
  output holding the input's new value; ``graph.meta.mutations`` pairs (input, output).
- A write through a view of an intermediate rebuilds its base (``where`` over the region),
  and every other view of that base sees the write, as aliasing views do in eager mode.

Each case is compared with eager execution on the same inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.ir import interpret
from tests.tracer.trace_cases import assert_same, to_tensors


def _eager_and_traced(fn, arrays):
    """(eager outputs + mutated inputs, interpreted outputs) of ``fn`` on copies of arrays."""
    xs = to_tensors([a.copy() for a in arrays])
    out = fn(*xs)
    outs = list(out) if isinstance(out, tuple) else ([] if out is None else [out])
    graph = fg.trace(fn, *to_tensors([a.copy() for a in arrays]))
    got = interpret(graph, *arrays)
    mutated = [xs[i] for i, _ in graph.meta.mutations]
    return graph, outs + mutated, got


def test_writes_to_inputs_become_extra_outputs():
    def f(x, y):
        x.add_(y)
        y[0] = 1.0
        return (x * 2).sum()
    arrays = [np.random.default_rng(0).normal(size=(2, 3)) for _ in range(2)]
    graph, expected, got = _eager_and_traced(f, arrays)
    assert graph.meta.mutations == [(0, 1), (1, 2)]
    assert graph.meta.n_user_outputs == 1
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert_same(g, e, f"output {k}")


def test_optimizer_step_returns_only_the_updated_parameters():
    def sgd_step(params, grads, lr):
        for p, g in zip(params, grads, strict=True):
            p.sub_(g * lr)
    rng = np.random.default_rng(1)
    ps = [rng.normal(size=(3, 2)), rng.normal(size=2)]
    gs = [rng.normal(size=(3, 2)), rng.normal(size=2)]
    graph = fg.trace(sgd_step, to_tensors(ps), to_tensors(gs), 0.1)
    assert graph.meta.n_user_outputs == 0
    assert graph.meta.mutations == [(0, 0), (1, 1)]
    assert [v.name for v in graph.inputs] == ["params_0", "params_1", "grads_0", "grads_1"]
    got = interpret(graph, *ps, *gs)
    for g, p, d in zip(got, ps, gs, strict=True):
        np.testing.assert_array_equal(g, p - d * 0.1)


def test_reading_an_input_is_not_a_mutation():
    graph = fg.trace(lambda x: x[0].exp() + x.t()[1], fg.randn(3, 3))
    assert graph.meta.mutations == []


def _write_view_read_sibling(x):
    y = x * 1.0
    a, b = y[0], y[:, 1]          # two views of y that overlap at y[0, 1]
    a.mul_(10.0)
    return b * 1.0, y


def _write_base_read_view(x):
    y = x + 0.0
    row = y[1]
    y.add_(100.0)
    return row.exp(), y


def _view_of_view(x):
    y = x * 2.0
    inner = y.t()[1:]             # a view of a view
    inner[0, 0] = -5.0
    return y, inner.sum(0)


def _loop_of_writes(x):
    y = x.clone()
    for i in range(1, y.shape[0]):
        y[i] = y[i - 1] * 0.5 + y[i]
    return y


def _transposed_then_reshaped(x):
    y = x * 1.0
    y.t()[0].fill_(3.0)
    return y.reshape(-1)[2:5] * 1.0, y


def _chain_of_inplace_ops(x):
    y = x * 1.0
    col = y[:, 2]
    col.mul_(2).add_(1).clamp_(max=2.0)
    return y, col


def _strided_write(x):
    y = x.clone()
    y[::2, 1::2] = y[::2, 1::2].exp()
    return y


def _written_view_is_returned(x):
    y = x * 3.0
    v = y[1:, :2]
    v += 1
    return v


FUNCTIONALIZED = [_write_view_read_sibling, _write_base_read_view, _view_of_view,
                  _loop_of_writes, _transposed_then_reshaped, _chain_of_inplace_ops,
                  _strided_write, _written_view_is_returned]


@pytest.mark.parametrize("fn", FUNCTIONALIZED, ids=lambda f: f.__name__.lstrip("_"))
def test_writes_through_views_of_intermediates_match_eager(fn):
    """Forward values, including other views of the written base, and gradients."""
    x = np.random.default_rng(2).normal(size=(4, 3))
    graph, expected, got = _eager_and_traced(fn, [x])
    assert not graph.meta.mutations
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert_same(g, e, f"{fn.__name__}: output {k}")

    def loss(x):
        out = fn(x)
        outs = out if isinstance(out, tuple) else (out,)
        return sum(((o * (k + 1)).sin()).sum() for k, o in enumerate(outs))
    xe = fg.from_numpy(x.copy()).requires_grad_()
    loss(xe).backward()
    np.testing.assert_allclose(fg.grad(loss)(fg.from_numpy(x)).numpy(), xe.grad.numpy(),
                               rtol=1e-10, atol=1e-12)


def test_view_sees_write_regression():
    """Regression: a view taken before a write through another view kept the old value."""
    x = fg.arange(6.0).reshape(2, 3)
    out = fg.trace(_write_view_read_sibling, x)
    b = interpret(out, x.numpy())[0]
    assert b.tolist() == [10.0, 4.0]


def test_write_through_an_expanded_view_is_an_error_as_in_eager():
    def f(x):
        y = x.expand(3, 4)
        y[0].fill_(1.0)
        return y
    with pytest.raises(RuntimeError):
        f(fg.randn(1, 4) * 1)
    with pytest.raises(RuntimeError, match="expanded view"):
        fg.trace(f, fg.randn(1, 4))
