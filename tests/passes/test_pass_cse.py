"""CSE's notion of sameness (its rewrites as text: tests/filecheck/cse/cse.fg)."""

from __future__ import annotations

import math

from fusegrad import dtypes as D
from fusegrad.ir import Graph, Literal, TensorType, parse
from fusegrad.passes.cse import cse


def _ops(g: Graph) -> list[str]:
    return [n.op for n in g.nodes]


def test_float_attributes_compare_by_spelling():
    # Python says 0.0 == -0.0; a constant of -0.0 is still not a constant of 0.0.
    g = Graph("f")
    fulls = [g.add_node("full", [], {"shape": (2,), "value": v, "dtype": D.float32})
             for v in (0.0, -0.0, 0.0, math.nan, math.nan)]
    g.set_outputs(fulls)
    out = cse(g)
    assert len(out.nodes) == 3
    assert out.outputs[0] is out.outputs[2] and out.outputs[3] is out.outputs[4]


def test_nan_literals_are_one_computation_and_dtypes_split_literals():
    g = Graph("f")
    x = g.add_input("x", TensorType((2,), D.float32))
    a = g.add_node("add", [x, Literal(math.nan, D.float32)])
    b = g.add_node("add", [x, Literal(math.nan, D.float32)])
    i = g.add_input("i", TensorType((2,), D.int64))
    c = g.add_node("take", [x, Literal(1, D.int64)], {"axis": 0})
    d = g.add_node("take", [x, Literal(1, D.int32)], {"axis": 0})
    g.set_outputs([a, b, c, d, i])
    out = cse(g)
    assert _ops(out) == ["add", "take", "take"]


def test_commutative_option():
    g = parse("""graph @f(%x: f32[4], %y: f32[4]) -> (f32[4], f32[4]) {
  %0 = mul %x, %y : f32[4]
  %1 = mul %y, %x : f32[4]
  return %0, %1
}""")
    assert _ops(cse(g)) == ["mul"]
    assert _ops(cse(g, commutative=False)) == ["mul", "mul"]


def test_maximum_is_not_commutative():
    # A tie of -0.0 and 0.0 gives the second operand: maximum(x, y) and maximum(y, x) differ.
    g = parse("""graph @f(%x: f32[4], %y: f32[4]) -> (f32[4], f32[4]) {
  %0 = maximum %x, %y : f32[4]
  %1 = maximum %y, %x : f32[4]
  return %0, %1
}""")
    assert _ops(cse(g)) == ["maximum", "maximum"]


def test_different_result_types_stay_apart():
    g = parse("""graph @f(%x: f32[4]) -> (f64[4], i64[4]) {
  %0 = cast %x {dtype=f64} : f64[4]
  %1 = cast %x {dtype=i64} : i64[4]
  return %0, %1
}""")
    assert _ops(cse(g)) == ["cast", "cast"]
