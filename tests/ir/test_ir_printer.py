"""The text form: golden outputs, attribute and literal spelling, names, exact floats."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from fusegrad import dtypes as D
from fusegrad.ir import Graph, Literal, TensorType, Value, parse, print_graph
from fusegrad.ir.printer import format_attr, format_dense, format_loc, print_node, value_names
from fusegrad.ops.primitive import ConstantData
from tests.ir.ir_zoo import CASES, MLP_TEXT, T, f32, mlp_graph


def test_golden_mlp():
    assert print_graph(mlp_graph()) == MLP_TEXT
    assert str(mlp_graph()) == MLP_TEXT


def test_golden_with_locations():
    lines = print_graph(mlp_graph(), locations=True).splitlines()
    assert lines[1] == '  %0 = matmul %x, %w : f32[4,16] loc("model.py":12)'
    assert lines[3] == '  %2 = sum %1 {axes=[0, 1]} : f32[] loc("model.py":14)'


def test_printing_is_deterministic_and_independent_of_result_names():
    g1, g2 = mlp_graph(), mlp_graph()
    for n in g2.nodes:
        n.output.name = "renamed"
    assert print_graph(g1) == print_graph(g2)


@pytest.mark.parametrize("value, text", [
    (3, "3"), (-7, "-7"), (True, "true"), (False, "false"), (np.int64(4), "4"), (np.bool_(True), "true"),
    (0.1, "0.1"), (2.0, "2.0"), (-0.0, "-0.0"), (1e-05, "1e-05"), (1e300, "1e+300"),
    (5e-324, "5e-324"), (math.inf, "inf"), (-math.inf, "-inf"), (math.nan, "nan"),
    (np.float32(0.1), repr(float(np.float32(0.1)))),
    ((0, 1), "[0, 1]"), ([2, 3], "[2, 3]"), ((), "[]"), (((1, 2), (0, 0)), "[[1, 2], [0, 0]]"),
    (D.float32, "f32"), (D.bool_, "i1"), (D.bfloat16, "bf16"), ("a \"q\"", '"a \\"q\\""'),
    (ConstantData(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)), "dense<[[1.0, 2.0], [3.0, 4.0]]>"),
])
def test_attribute_spelling(value, text):
    assert format_attr(value) == text


def test_attribute_that_has_no_spelling_is_an_error():
    with pytest.raises(ValueError, match="cannot print attribute value"):
        format_attr(object())


@pytest.mark.parametrize("array, text", [
    (np.array([True, False]), "[true, false]"),
    (np.array([[1, -2]], np.int8), "[[1, -2]]"),
    (np.zeros((0, 3), np.float32), "[]"),
    (np.zeros((2, 0), np.float32), "[[], []]"),
    (np.array([0.1, 1 / 3]), "[0.1, 0.3333333333333333]"),
    (np.array([0.1, np.nan, -np.inf], np.float32), "[0.1, nan, -inf]"),
    (np.array([0.1, 65504], np.float16), "[0.1, 6.55e+04]"),
    (np.array([0.1, 3.0, 1e20], ml_dtypes.bfloat16), "[0.1, 3.0, 1e+20]"),
])
def test_dense_spelling(array, text):
    assert format_dense(array) == text


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, ml_dtypes.bfloat16])
def test_dense_floats_round_trip_bit_exactly(dtype):
    # Every 7th 16-bit pattern (each exponent, many mantissas, subnormals) for the 16-bit
    # types; random bit patterns for the wider ones.
    rng = np.random.default_rng(0)
    if np.dtype(dtype).itemsize == 2:
        bits = np.arange(0, 2 ** 16, 7, dtype=np.uint16)
    else:
        uint = np.uint32 if np.dtype(dtype).itemsize == 4 else np.uint64
        bits = rng.integers(0, np.iinfo(uint).max, size=3000, dtype=uint, endpoint=True)
    a = bits.view(dtype)
    with np.errstate(invalid="ignore"):         # signalling NaN patterns
        a = a[~np.isnan(a)]
    g = Graph("c")
    g.set_outputs([g.add_node("constant", [], {"value": ConstantData(a)})])
    back = parse(print_graph(g)).nodes[0].attrs["value"].array
    assert back.dtype == a.dtype
    np.testing.assert_array_equal(back.view(bits.dtype), a.view(bits.dtype))


def test_literal_default_dtype_rule():
    """A literal is bare when it has its node's last value operand's dtype, else annotated."""
    g = Graph("lits")
    x = g.add_input("x", T(3))
    c = g.add_input("c", T(3, dtype=D.bool_))
    h = g.add_input("h", T(3, dtype=D.float16))
    g.add_node("add", [f32(2), x])                          # literal first: default from x
    g.add_node("where", [c, x, f32(0.5)])                   # default is x's, not c's
    g.add_node("where", [c, f32(1), f32(-1)])               # default would be i1: annotated
    g.add_node("add", [h, Literal(0.1, D.float16)])
    g.add_node("take", [h, Literal(1, D.int64)], {"axis": 0})
    g.add_node("and", [c, Literal(True, D.bool_)])
    g.set_outputs([Literal(1.5, D.float64), Literal(7, D.int32), Literal(False, D.bool_)])
    assert print_graph(g).splitlines()[1:] == [
        "  %0 = add 2.0, %x : f32[3]",
        "  %1 = where %c, %x, 0.5 : f32[3]",
        "  %2 = where %c, 1.0:f32, -1.0:f32 : f32[3]",
        "  %3 = add %h, 0.1 : f16[3]",
        "  %4 = take %h, 1:i64 {axis=0} : f16[]",
        "  %5 = and %c, true : i1[3]",
        "  return 1.5, 7, false",
        "}",
    ]
    assert print_graph(g).startswith("graph @lits(%x: f32[3], %c: i1[3], %h: f16[3]) -> "
                                     "(f64[], i32[], i1[]) {")


def test_input_names_are_sanitized_and_deduplicated():
    g = Graph("names")
    for name in ["x", "x", None, "0", "a b", "x_1", "arg2", ""]:
        g.inputs.append(Value(T(1), name))
    g.set_outputs(list(g.inputs))
    names = list(value_names(g).values())
    assert names == ["%x", "%x_1", "%arg2", "%_0", "%a_b", "%x_1_1", "%arg2_1", "%arg7"]
    assert len(set(names)) == len(names)
    assert print_graph(parse(print_graph(g))) == print_graph(g)


def test_graph_name_that_is_not_an_identifier_is_quoted():
    g = Graph("my graph/1")
    assert print_graph(g) == 'graph @"my graph/1"() -> () {\n  return\n}'
    assert parse(print_graph(g)).name == "my graph/1"


@pytest.mark.parametrize("loc, text", [
    ("model.py:12", 'loc("model.py":12)'), ("/a/b.py:0", 'loc("/a/b.py":0)'),
    ("c:\\x.py:3", 'loc("c:\\\\x.py":3)'), ("no line", 'loc("no line")'),
    ("x.py:012", 'loc("x.py:012")'), ("x.py:", 'loc("x.py:")'),
])
def test_location_spelling(loc, text):
    assert format_loc(loc) == text


def test_print_node_outside_a_graph_and_with_foreign_values():
    g = mlp_graph()
    stranger = Value(T(4, 16), None)
    node = g.nodes[1]
    node.inputs[0] = stranger
    assert print_node(node, value_names(g)) == "%1 = maximum %?undefined, 0.0 : f32[4,16]"
    assert print_node(g.nodes[0]) == "%? = matmul %x, %w : f32[4,16]"


def test_attribute_order_is_the_primitives():
    g = Graph("order")
    x = g.add_input("x", T(4, 4))
    g.add_node("slice", [x], {"steps": (1, 2), "stops": (4, 4), "starts": (0, 1)})
    assert print_graph(g).splitlines()[1] == (
        "  %0 = slice %x {starts=[0, 1], stops=[4, 4], steps=[1, 2]} : f32[4,2]")


def test_every_zoo_graph_prints_one_line_per_node():
    for build in CASES.values():
        g = build().graph
        lines = print_graph(g).splitlines()
        assert len(lines) == len(g.nodes) + 3
        assert all(line.startswith(f"  %{i} = ") for i, line in enumerate(lines[1:-2]))


def test_tensor_type_spelling():
    assert str(TensorType((), D.bool_)) == "i1[]"
    assert str(TensorType((4, 8), D.bfloat16)) == "bf16[4,8]"
