"""The matmul-layout pass: a transposed product computed in its user's layout."""

import numpy as np

from fusegrad import dtypes
from fusegrad.ir.graph import Graph
from fusegrad.ir.interpreter import interpret
from fusegrad.ops.primitive import TensorType
from fusegrad.passes.matmul_layout import epilogues_through_reshape, transpose_matmuls


def _graph(shape_a, shape_b, perm, extra_use=False):
    g = Graph("f")
    a = g.add_input("a", TensorType(shape_a, dtypes.float32))
    b = g.add_input("b", TensorType(shape_b, dtypes.float32))
    m = g.add_node("matmul", [a, b])
    t = g.add_node("permute", [m], {"perm": perm})
    g.set_outputs([t, m] if extra_use else [t])
    return g


def test_transposed_product_becomes_a_product_of_transposes():
    rng = np.random.RandomState(0)
    for sa, sb, perm in [((3, 4), (4, 5), (1, 0)), ((2, 3, 4), (2, 4, 5), (0, 2, 1))]:
        g = _graph(sa, sb, perm)
        a, b = rng.randn(*sa).astype(np.float32), rng.randn(*sb).astype(np.float32)
        h = transpose_matmuls(g)
        ops = [n.op for n in h.nodes]
        assert ops.count("matmul") == 1 and h.nodes[-1].op == "matmul"
        np.testing.assert_allclose(interpret(h, a, b)[0], interpret(g, a, b)[0], rtol=1e-6)


def test_kept_when_the_product_has_other_uses_or_another_permutation():
    for g in (_graph((3, 4), (4, 5), (1, 0), extra_use=True),
              _graph((2, 3, 4), (2, 4, 5), (1, 0, 2))):
        h = transpose_matmuls(g)
        assert [n.op for n in h.nodes] == [n.op for n in g.nodes]


def _conv_like(bias_shape, other_shape):
    """relu(reshape(a @ b + bias, (2, 4, 3, 2)) + other): a product's epilogue behind a
    reshape, as a convolution's bias, residual and activation are."""
    g = Graph("f")
    a = g.add_input("a", TensorType((2, 1, 4, 5), dtypes.float32))
    b = g.add_input("b", TensorType((2, 1, 5, 6), dtypes.float32))
    bias = g.add_input("bias", TensorType(bias_shape, dtypes.float32))
    other = g.add_input("other", TensorType(other_shape, dtypes.float32))
    m = g.add_node("add", [g.add_node("matmul", [a, b]), bias])
    r = g.add_node("reshape", [m], {"shape": (2, 4, 3, 2)})
    s = g.add_node("add", [r, other])
    g.set_outputs([g.add_node("neg", [s])])
    return g


def test_elementwise_ops_behind_a_reshape_of_a_product_move_before_it():
    rng = np.random.RandomState(1)
    for other_shape, moved in [((2, 4, 3, 2), True),     # a residual: a plain reshape
                               ((4, 1, 1), True),         # per-channel: a strided broadcast
                               ((1, 1, 3, 1), False)]:    # no strided view: left as it was
        g = _conv_like((4, 1), other_shape)
        args = [rng.randn(*v.type.shape).astype(np.float32) for v in g.inputs]
        h = epilogues_through_reshape(g)
        ops = [n.op for n in h.nodes]
        assert (ops[-1] == "reshape") == moved, ops
        np.testing.assert_array_equal(interpret(h, *args)[0], interpret(g, *args)[0])
