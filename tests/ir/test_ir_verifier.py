"""The verifier: valid graphs pass; each kind of malformed graph fails with a clear reason."""

from __future__ import annotations

import dataclasses

import pytest

from fusegrad import dtypes as D
from fusegrad.ir import Graph, Literal, TensorType, Value, VerificationError, verify
from fusegrad.ir.graph import Node
from fusegrad.ops.primitive import PRIMITIVES
from fusegrad.ops.prims import add as add_prim
from tests.ir.ir_zoo import CASES, T, f32, mlp_graph


def _fails(g: Graph, *fragments: str) -> str:
    with pytest.raises(VerificationError) as info:
        verify(g)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_every_zoo_graph_verifies():
    for build in CASES.values():
        verify(build().graph)


def test_message_names_the_node_as_printed_and_its_location():
    g = mlp_graph()
    g.nodes[1].output.type = T(4, 15)
    assert _fails(g) == (
        "verify @f: node 1 `%1 = maximum %0, 0.0 : f32[4,15]` (at model.py:13): result type "
        "f32[4,15] does not match f32[4,16] given by maximum's rule")


def test_operand_from_another_graph():
    g = mlp_graph()
    g.nodes[1].inputs[0] = mlp_graph().nodes[0].output
    _fails(g, "node 1 `%1 = maximum %?undefined, 0.0", "operand 0 (%?undefined) is not defined")


def test_use_before_definition():
    g = mlp_graph()
    g.nodes[0], g.nodes[1] = g.nodes[1], g.nodes[0]
    _fails(g, "node 0 `%0 = maximum %1, 0.0", "operand 0 (%1) is used before it is defined "
           "(by node 1); nodes must be in topological order")


def test_cycle_is_reported_as_such():
    g = Graph("cyc")
    x = g.add_input("x", T(2))
    a = g.add_node("exp", [x])
    b = g.add_node("neg", [a])
    a.producer.inputs[0] = b          # exp now consumes neg, which consumes exp
    g.set_outputs([b])
    _fails(g, "node 0 `%0 = exp %1", "the graph has a cycle: %0 -> %1 -> %0")


def test_value_produced_twice():
    g = mlp_graph()
    g.nodes[2].output = g.nodes[1].output
    _fails(g, "node 2", "its result is already defined by an earlier node (SSA")


def test_node_result_that_is_an_input():
    g = mlp_graph()
    g.nodes[0].output = g.inputs[0]
    _fails(g, "node 0", "already defined by a graph input")


def test_result_whose_producer_is_another_node():
    g = mlp_graph()
    g.nodes[1].output.producer = g.nodes[0]
    _fails(g, "node 1", "its result's producer is another node")


def test_output_not_defined():
    g = mlp_graph()
    g.set_outputs([Value(T(4), "ghost")])
    assert _fails(g) == "verify @f: output 0 (ghost) is not defined in this graph"


def test_output_literal_must_be_legal_and_outputs_must_be_operands():
    g = mlp_graph()
    g.set_outputs([Literal(1.5, D.int64)])
    _fails(g, "output 0: literal 1.5 (float) is not a value of dtype i64")
    g.set_outputs(["x"])
    _fails(g, "output 0 is 'x', not a Value or Literal")


def test_result_type_must_match_the_rule():
    g = mlp_graph()
    g.nodes[0].output.type = TensorType((4, 16), D.float64)
    _fails(g, "node 0", "result type f64[4,16] does not match f32[4,16] given by matmul's rule")


def test_rule_that_rejects_the_operands():
    g = mlp_graph()
    g.nodes[2].attrs["axes"] = (0, 5)
    _fails(g, "node 2 `%2 = sum %1 {axes=[0, 5]}", "sum's rule rejects it: sum: axis 5 out of range")


@pytest.mark.parametrize("source, bad, why", [
    ("full {shape=[3], value=3, dtype=u8} : u8[3]", {"value": 300},
     "full: value 300 is not a value of dtype u8"),
    ("full {shape=[3], value=1, dtype=i8} : i8[3]", {"value": -200.5},
     "full: value -200.5 is not a value of dtype i8"),
    ("full {shape=[3], value=1, dtype=i32} : i32[3]", {"value": float("inf")},
     "full: value inf is not a value of dtype i32"),
    ("iota {shape=[3], axis=0, dtype=i64} : i64[3]", {"axis": 4},
     "iota: axis 4 is out of range for shape [3]"),
])
def test_sources_whose_attributes_the_dtype_or_shape_cannot_hold(source, bad, why):
    """A full value that would wrap in compiled code (and raise in numpy), an iota axis
    outside its shape: the rule rejects them, so the verifier (and the parser) do. (A
    fraction truncates, and any number is a bool, alike in both.)"""
    from fusegrad.ir import parse
    g = parse(f"graph @f() -> ({source.rsplit(': ', 1)[1]}) {{\n  %0 = {source}\n  return %0\n}}")
    verify(g)
    g.nodes[0].attrs = {**g.nodes[0].attrs, **bad}
    _fails(g, "node 0", why)


@pytest.mark.parametrize("attrs, why", [
    ({}, "missing axes"),
    ({"axes": (0, 1), "keepdim": False}, "unexpected keepdim"),
    ({"axis": 0}, "missing axes; unexpected axis"),
])
def test_attributes_must_be_exactly_the_primitives(attrs, why):
    g = mlp_graph()
    g.nodes[2].attrs = attrs
    _fails(g, "node 2", f"attributes of sum must be (axes): {why}")


def test_fixed_arity():
    g = mlp_graph()
    g.nodes[1].inputs.append(f32(1.0))
    _fails(g, "node 1 `%1 = maximum %0, 0.0, 1.0", "maximum takes 2 operands, got 3")
    g = mlp_graph()
    g.nodes[0].inputs.pop()
    _fails(g, "matmul takes 2 operands, got 1")


def test_variadic_arity():
    g = CASES["concat3"]().graph
    g.nodes[0].inputs.clear()
    _fails(g, "concat takes one or more operands, got none")
    g = CASES["concat3"]().graph
    del g.nodes[0].inputs[1:]
    _fails(g, "result type f32[2,6] does not match f32[2,1]")


@pytest.mark.parametrize("literal, why", [
    (Literal(1.5, D.int64), "literal 1.5 (float) is not a value of dtype i64"),
    (Literal(True, D.float32), "literal True (bool) is not a value of dtype f32"),
    (Literal(1, D.bool_), "literal 1 (int) is not a value of dtype i1"),
    (Literal(300, D.int8), "literal 300 is out of range for i8"),
    (Literal(-1, D.uint8), "literal -1 is out of range for u8"),
    (Literal(1.0, "f32"), "literal 1.0 has dtype 'f32', which is not a fusegrad dtype"),
    (Literal("1.0", D.float32), "literal '1.0' (str) is not a value of dtype f32"),
])
def test_illegal_literals(literal, why):
    g = Graph("lit")
    x = g.add_input("x", T(3, dtype=D.int8))
    g.add_node("add", [x, Literal(1, D.int8)])
    g.set_outputs([g.nodes[0].output])
    g.nodes[0].inputs[1] = literal
    _fails(g, "node 0", f"operand 1: {why}")


def test_operand_of_the_wrong_kind():
    g = mlp_graph()
    g.nodes[1].inputs[1] = 0.0
    _fails(g, "operand 1 is 0.0, not a Value or Literal")


def test_unregistered_primitive():
    g = mlp_graph()
    g.nodes[1].prim = dataclasses.replace(PRIMITIVES["maximum"])   # same name, not registered
    _fails(g, "node 1", "<primitive maximum> is not a registered primitive")


def test_inputs_must_be_distinct_typed_and_without_producer():
    g = mlp_graph()
    g.inputs.append(g.inputs[0])
    _fails(g, "input 2 (%x) appears twice among the inputs")
    g = mlp_graph()
    g.inputs[1].type = TensorType([8, 16], D.float32)
    _fails(g, "input 1 (%w): shape [8, 16] is not a tuple of non-negative ints")
    g = mlp_graph()
    g.inputs[1].type = TensorType((8, -1), D.float32)
    _fails(g, "input 1 (%w): shape (8, -1) is not a tuple of non-negative ints")
    g = mlp_graph()
    g.inputs[0].producer = g.nodes[0]
    _fails(g, "input 0 (%x) has a producer node; inputs have none")


def test_nodes_list_holds_only_nodes():
    g = mlp_graph()
    g.nodes.append("oops")
    _fails(g, "node 3 is 'oops', not a Node")


def test_a_node_built_directly_is_checked_like_any_other():
    g = Graph("direct")
    x = g.add_input("x", T(2))
    out = Value(T(3))
    node = Node(add_prim, [x, x], {}, out)
    out.producer = node
    g.nodes.append(node)
    g.set_outputs([out])
    _fails(g, "`%0 = add %x, %x : f32[3]`", "result type f32[3] does not match f32[2]")


def test_malformed_nodes_still_print_in_the_message():
    g = mlp_graph()
    g.nodes[1].prim = "maximum"
    _fails(g, "node 1 `%1 = <'maximum'> %0, 0.0 : f32[4,16]`", "'maximum' is not a registered")
    g = mlp_graph()
    g.nodes[1].output = None
    _fails(g, "node 1 `<None> = maximum %0, 0.0", "its output is None, not a Value")
