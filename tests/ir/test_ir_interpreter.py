"""The interpreter: input checks, result types, errors that name the node."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fusegrad import dtypes as D
from fusegrad.ir import Graph, IRError, Literal, Value, interpret
from tests.ir.ir_zoo import CASES, T, mlp_graph, rand


def test_mlp_against_numpy():
    x, w = rand(4, 8, seed=1), rand(8, 16, seed=2)
    relu, total = interpret(mlp_graph(), x, w)
    np.testing.assert_allclose(relu, np.maximum(x @ w, 0), rtol=1e-6)
    np.testing.assert_allclose(total, np.maximum(x @ w, 0).sum(), rtol=1e-5)
    assert relu.dtype == np.float32 and total.shape == () and isinstance(total, np.ndarray)


def test_wrong_number_of_inputs():
    with pytest.raises(IRError, match=r"interpret @f: the graph takes 2 input\(s\) \(f32\[4,8\], "
                                      r"f32\[8,16\]\), got 1"):
        interpret(mlp_graph(), rand(4, 8))


@pytest.mark.parametrize("x, got", [
    (np.zeros((4, 8)), "shape [4, 8] and dtype float64"),
    (np.zeros((8, 4), np.float32), "shape [8, 4] and dtype float32"),
    (1.0, "shape [] and dtype float64"),
])
def test_input_shape_and_dtype_are_checked(x, got):
    with pytest.raises(IRError) as info:
        interpret(mlp_graph(), x, rand(8, 16))
    assert str(info.value) == f"interpret @f: input 0 (%x) must be f32[4,8], got an array of {got}"


def test_outputs_that_are_inputs_and_literals():
    c = CASES["odd_names_and_outputs"]()
    out = interpret(c.graph, *c.args)
    assert out[1] is c.args[0]
    assert out[2].dtype == np.int64 and out[2].shape == () and out[2] == 2
    assert out[3].dtype == np.float32 and np.isnan(out[3])


def test_results_are_cast_to_the_rules_dtype():
    """numpy computes half floats in float32 here and sums bools to int64; the rule decides."""
    g = Graph("casts")
    b = g.add_input("b", T(3, dtype=D.bfloat16))
    m = g.add_input("m", T(3, dtype=D.bool_))
    g.set_outputs([g.add_node("exp", [b]), g.add_node("sum", [m], {"axes": (0,)}),
                   g.add_node("mul", [b, Literal(3.0, D.bfloat16)])])
    e, s, p = interpret(g, np.ones(3, ml_dtypes.bfloat16), np.array([True, True, False]))
    assert e.dtype == ml_dtypes.bfloat16 and s.dtype == np.int64 and p.dtype == ml_dtypes.bfloat16
    assert s == 2 and float(e[0]) == float(ml_dtypes.bfloat16(np.e))


def test_a_failing_primitive_keeps_its_error_and_says_which_node():
    c = CASES["index_ops"]()
    args = list(c.args)
    args[1] = np.array([[9, 0], [0, 0]])     # out of bounds for take along axis 0 (size 4)
    with pytest.raises(IndexError, match="index 9 is out of bounds") as info:
        interpret(c.graph, *args)
    assert "while interpreting node 0 of @index: %0 = take %x, %idx {axis=0} : f32[2,2,3]" in \
        "\n".join(getattr(info.value, "__notes__", []))


def test_undefined_operand_is_an_ir_error():
    g = mlp_graph()
    g.nodes[1].inputs[0] = Value(T(4, 16))
    with pytest.raises(IRError, match="node 1 \\(maximum\\) uses a value that is not defined"):
        interpret(g, rand(4, 8), rand(8, 16))


def test_a_result_of_the_wrong_shape_is_caught():
    g = mlp_graph()
    g.nodes[2].attrs["axes"] = (0,)          # the node still claims f32[]
    with pytest.raises(IRError, match=r"node 2 `%2 = sum %1 \{axes=\[0\]\} : f32\[\]` produced "
                                      r"shape \[16\], but its type is f32\[\]"):
        interpret(g, rand(4, 8), rand(8, 16))


def test_values_are_freed_after_their_last_use_but_outputs_survive():
    g = Graph("chain")
    x = g.add_input("x", T(3))
    y = x
    for _ in range(5):
        y = g.add_node("neg", [y])
    g.set_outputs([y, x, g.nodes[1].output])
    out = interpret(g, np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(out[0], -np.arange(3))
    np.testing.assert_array_equal(out[2], np.arange(3))


# Regression tests for bugs found while writing these tests.


def test_scalar_constant_keeps_its_shape():
    from fusegrad.ops.primitive import ConstantData
    g = Graph("scalar_constant")
    g.set_outputs([g.add_node("constant", [], {"value": ConstantData(np.array(2.5, np.float32))})])
    assert interpret(g)[0].shape == ()


def test_pad_of_a_scalar_runs():
    g = Graph("pad_scalar")
    x = g.add_input("x", T())
    g.set_outputs([g.add_node("pad", [x], {"widths": (), "value": 0.0})])
    assert interpret(g, np.array(1.5, np.float32))[0] == 1.5
