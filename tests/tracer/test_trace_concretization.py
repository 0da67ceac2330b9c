"""Python control flow under the tracer: on shapes it unrolls, on tensor values it fails loudly.

A traced tensor has a shape and a dtype but no value. Anything Python needs a value for
(``if t``, ``t.item()``, ``t.tolist()``, ``t.numpy()``, boolean-mask indexing, ops whose
result shape depends on the data) raises :class:`fusegrad.ConcretizationError`, whose message
names the user's file and line and suggests ``fusegrad.where`` or static arguments.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import nn
from fusegrad.ir import interpret

# One data-dependent construct per line: the error must name exactly that line.
DATA_DEPENDENT = [
    pytest.param(lambda x: 1.0 if x.sum() > 0 else 2.0, id="if-tensor"),
    pytest.param(lambda x: x.sum().item(), id="item"),
    pytest.param(lambda x: x.tolist(), id="tolist"),
    pytest.param(lambda x: bool(x[0, 0] > 0), id="bool"),
    pytest.param(lambda x: x.numpy(), id="numpy"),
    pytest.param(lambda x: float(x.sum()), id="float"),
    pytest.param(lambda x: int(x.argmax()), id="int"),
    pytest.param(lambda x: np.asarray(x), id="np.asarray"),
    pytest.param(lambda x: x[x > 0], id="boolean-mask-index"),
    pytest.param(lambda x: x[:, (x > 0)[0]], id="boolean-mask-index-dim"),
    pytest.param(lambda x: fg.nonzero(x > 0), id="nonzero"),
    pytest.param(lambda x: fg.argwhere(x), id="argwhere"),
    pytest.param(lambda x: fg.masked_select(x, x > 0), id="masked_select"),
    pytest.param(lambda x: fg.where(x > 0), id="where-one-argument"),
    pytest.param(lambda x: fg.equal(x, x * 1), id="equal"),
    pytest.param(lambda x: fg.allclose(x, x + 1e-9), id="allclose"),
    pytest.param(lambda x: x.sum() if (x > 0).any() else x.mean(), id="any-in-if"),
    pytest.param(lambda x: [v for v in x.flatten() if v > 0], id="filter-loop"),
    pytest.param(lambda x: x.narrow(0, fg.argmax(x[:, 0]), 1), id="tensor-as-int-argument"),
]


@pytest.mark.parametrize("fn", DATA_DEPENDENT)
def test_data_dependent_python_raises_naming_the_line(fn):
    """The message points at the user's line and says what to do instead."""
    with pytest.raises(fg.ConcretizationError) as info:
        fg.trace(fn, fg.randn(3, 4))
    message = str(info.value)
    assert f"{__file__}:{fn.__code__.co_firstlineno}" in message
    assert "fusegrad.where" in message and "static" in message
    assert "f32[" in message or "i1[" in message or "i64[" in message   # the traced type


def _helper_that_branches(t):
    if t.max() > 1:               # the line the error must name: the innermost user frame
        return t
    return -t


def test_error_names_the_innermost_user_line_not_the_caller():
    with pytest.raises(fg.ConcretizationError) as info:
        fg.trace(lambda x: _helper_that_branches(x * 2), fg.randn(3))
    line = _helper_that_branches.__code__.co_firstlineno + 1
    assert f"{__file__}:{line}" in str(info.value)


class _Gate(nn.Module):
    def forward(self, x):
        return x if x.mean() > 0 else -x        # data-dependent: the forward's line


def test_error_inside_a_module_forward_names_the_forward_line():
    with pytest.raises(fg.ConcretizationError) as info:
        fg.trace(_Gate(), fg.randn(2, 3))
    assert f"{__file__}:{_Gate.forward.__code__.co_firstlineno + 1}" in str(info.value)


def test_where_is_the_traceable_alternative():
    """The rewrite the error suggests traces, and agrees with eager."""
    def gate(x):
        return fg.where(x.mean() > 0, x, -x)
    x = fg.randn(2, 3)
    graph = fg.trace(gate, x)
    assert "where" in [n.op for n in graph.nodes]
    for sign in (1.0, -1.0):
        xs = x * sign
        np.testing.assert_array_equal(interpret(graph, xs.numpy())[0], gate(xs).numpy())


def test_control_flow_on_shapes_unrolls():
    """Loops over sizes and branches on ndim/shape run at trace time: a straight-line graph."""
    def f(x):
        acc = x[0]
        for i in range(1, x.shape[0]):
            acc = acc * 0.5 + x[i]
        if x.ndim == 2 and x.shape[1] > 2:
            acc = acc.exp()
        return acc
    for shape, n_exp in (((4, 3), 1), ((3, 2), 0)):
        x = fg.randn(*shape)
        graph = fg.trace(f, x)
        ops = [n.op for n in graph.nodes]
        assert ops.count("exp") == n_exp
        assert ops.count("slice") == shape[0]       # one per unrolled iteration
        np.testing.assert_array_equal(interpret(graph, x.numpy())[0], f(x).numpy())


def test_iterating_over_a_traced_tensor_unrolls_its_first_dim():
    x = fg.randn(3, 2)
    graph = fg.trace(lambda x: sum(row.sum() for row in x), x)
    assert [n.op for n in graph.nodes].count("sum") == 3
    np.testing.assert_allclose(interpret(graph, x.numpy())[0], x.sum().numpy(), rtol=1e-6)


def test_python_arguments_are_static_and_baked_in():
    """Non-tensor arguments (ints, floats, strings, None) are constants of the graph."""
    def f(x, k, scale, mode, bias=None):
        y = x * scale if mode == "scale" else x
        for _ in range(k):
            y = y + 1
        return y if bias is None else y + bias
    x = fg.randn(3)
    graph = fg.trace(f, x, 2, 0.5, "scale")
    assert [v.name for v in graph.inputs] == ["x"]
    assert [n.op for n in graph.nodes] == ["mul", "add", "add"]
    np.testing.assert_array_equal(interpret(graph, x.numpy())[0], f(x, 2, 0.5, "scale").numpy())
    assert len(fg.trace(f, x, 1, 0.5, "none").nodes) == 1


_LEAKED = []


def test_a_tracer_escaping_its_trace_is_reported():
    """Keeping a traced tensor past its trace and using it in another is a clear error."""
    def leak(x):
        _LEAKED.append(x * 2)
        return x
    fg.trace(leak, fg.randn(2))
    with pytest.raises(fg.ConcretizationError, match="escaped"):
        fg.trace(lambda y: y + _LEAKED[0], fg.randn(2))
    _LEAKED.clear()
