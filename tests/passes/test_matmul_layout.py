"""The matmul-layout pass: a transposed product computed in its user's layout."""

import numpy as np

from fusegrad import dtypes
from fusegrad.ir.graph import Graph
from fusegrad.ir.interpreter import interpret
from fusegrad.ops.primitive import TensorType
from fusegrad.passes.matmul_layout import copies_before_reshape, epilogues_through_reshape, transpose_matmuls


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


def test_a_cast_between_the_product_and_its_transpose_is_taken_along():
    # A 16-bit operand's gradient: permute(cast(matmul(a, b))) -> cast(matmul(bT, aT)),
    # written in its user's layout (a weight's, for the optimizer's epilogue).
    g = Graph("f")
    a = g.add_input("a", TensorType((3, 4), dtypes.float32))
    b = g.add_input("b", TensorType((4, 5), dtypes.float32))
    m = g.add_node("cast", [g.add_node("matmul", [a, b])], {"dtype": dtypes.bfloat16})
    g.set_outputs([g.add_node("permute", [m], {"perm": (1, 0)})])
    h = transpose_matmuls(g)
    assert [n.op for n in h.nodes][-2:] == ["matmul", "cast"]
    rng = np.random.RandomState(2)
    # Small integers: the sums are exact in any order, so the rounding compares bit for bit.
    args = (rng.randint(-40, 40, (3, 4)).astype(np.float32),
            rng.randint(-40, 40, (4, 5)).astype(np.float32))
    np.testing.assert_array_equal(interpret(h, *args)[0].astype(np.float32),
                                  interpret(g, *args)[0].astype(np.float32))


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


def _heads_merged(user: str):
    """pad(reshape(permute(a @ b))) or another ``user``: attention heads (B, H, T, D)
    merged to (B, T, H * D), as the gradient of a qkv split makes them."""
    g = Graph("f")
    a = g.add_input("a", TensorType((2, 3, 4, 5), dtypes.float32))
    b = g.add_input("b", TensorType((2, 3, 5, 8), dtypes.float32))
    t = g.add_node("permute", [g.add_node("matmul", [a, b])], {"perm": (0, 2, 1, 3)})
    r = g.add_node("reshape", [t], {"shape": (2, 4, 24)})
    if user == "pad":
        out = g.add_node("pad", [r], {"widths": ((0, 0), (0, 0), (0, 48)), "value": 0.0})
    else:
        out = g.add_node(user, [r])
    g.set_outputs([out])
    return g


def test_a_reshape_merging_permuted_axes_reads_a_copy_in_the_views_shape():
    import fusegrad as fg
    from fusegrad.passes.fusion import fuse
    rng = np.random.RandomState(2)
    for user, copied in [("pad", True), ("neg", False)]:   # neg would join the copy
        g = _heads_merged(user)
        args = [rng.randn(*v.type.shape).astype(np.float32) for v in g.inputs]
        h = copies_before_reshape(g)
        ops = [n.op for n in h.nodes]
        assert ("copy" in ops) == copied, ops
        if copied:
            copy = next(n for n in h.nodes if n.op == "copy")
            assert copy.output.type.shape == (2, 4, 3, 8)
            assert copy.inputs[0].producer.op == "permute"
            # fused: the copy is a kernel of the view's shape, the reshape a free view
            kernels = [k for k in fuse(h).kernels if k.kind == "elementwise"]
            assert any(k.shape == (2, 4, 3, 8) and [n.op for n in k.nodes] == ["copy"]
                       for k in kernels)
        np.testing.assert_array_equal(interpret(h, *args)[0], interpret(g, *args)[0])
    # end to end, compiled against eager
    x = fg.randn(2, 3, 4, 8)
    f = fg.compile(lambda v: fg.nn.functional.pad((v * 2).transpose(1, 2).reshape(2, 4, 24),
                                                  (0, 8)))
    np.testing.assert_array_equal(f(x).numpy(), fg.nn.functional.pad(
        (x * 2).transpose(1, 2).reshape(2, 4, 24), (0, 8)).numpy())


def test_a_reshape_of_any_view_no_strides_express_reads_a_copy_and_others_are_left():
    import fusegrad as fg
    x = fg.randn(4, 6)
    cases = [(lambda a: a[:, :4].reshape(16), True),                       # a slice
             (lambda a: a.unsqueeze(1).expand(4, 3, 6).reshape(12, 6), True),  # a broadcast
             (lambda a: a[:2].reshape(12), False),          # strides express it: a free view
             (lambda a: a.t().reshape(24) + 1.0, False)]    # an elementwise user joins it
    for fn, copied in cases:
        g = fg.trace(fn, x)
        h = copies_before_reshape(g)
        ops = [n.op for n in h.nodes]
        assert ("copy" in ops) == copied, ops
        if copied:
            copy = next(n for n in h.nodes if n.op == "copy")
            assert copy.output.type.shape == copy.inputs[0].type.shape != \
                h.outputs[0].type.shape
        np.testing.assert_array_equal(interpret(h, x.numpy())[0], fn(x).numpy())
        np.testing.assert_array_equal(fg.compile(fn)(x).numpy(), fn(x).numpy())


def test_a_reshape_of_a_broadcast_literal_is_left():
    # The gradient of 0.5 * x.diagonal().sum() reshapes a broadcast of the literal 0.5: the
    # movement ops start from no value, and the pass leaves them (it failed on the literal).
    import fusegrad as fg
    x = fg.randn(4, 4, requires_grad=True)

    def step(x):
        out = x.diagonal().sum()
        (out * 0.5).backward()
        return out.detach()

    np.testing.assert_allclose(fg.compile(step)(x).numpy(), np.trace(x.detach().numpy()),
                               rtol=1e-6)
    np.testing.assert_array_equal(x.grad.numpy(), 0.5 * np.eye(4, dtype=np.float32))
