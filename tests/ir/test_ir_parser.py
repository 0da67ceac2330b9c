"""Parsing: hand-written text, several graphs per text, and located error messages."""

from __future__ import annotations

import numpy as np
import pytest

from fusegrad import dtypes as D
from fusegrad.ir import IRParseError, Literal, parse, parse_many, print_graph
from tests.ir.ir_zoo import MLP_TEXT, mlp_graph


def test_parse_the_golden_text():
    g = parse(MLP_TEXT)
    assert g.name == "f"
    assert [v.name for v in g.inputs] == ["x", "w"]
    assert [n.op for n in g.nodes] == ["matmul", "maximum", "sum"]
    assert g.nodes[1].inputs[1] == Literal(0.0, D.float32)
    assert g.nodes[2].attrs == {"axes": (0, 1)}
    assert g.outputs == [g.nodes[1].output, g.nodes[2].output]


def test_hand_written_text_is_free_in_layout_names_and_attribute_order():
    text = """
    // a comment
    graph @g(%a: f32[2,3]) -> (f32[2,2], f32[]) {   // trailing comment
      %t = slice %a {steps=[1, 2], starts=[0, 0], stops=[2, 3]} : f32[2,2]
      %s = sum %t
           {axes=[0, 1]} : f32[] loc("m.py":3)
      return %t, %s
    }
    """
    g = parse(text)
    assert g.nodes[0].attrs == {"starts": (0, 0), "stops": (2, 3), "steps": (1, 2)}
    assert g.nodes[1].loc == "m.py:3"
    assert g.nodes[0].output.name == "t"
    assert print_graph(g).splitlines()[1] == (
        "  %0 = slice %a {starts=[0, 0], stops=[2, 3], steps=[1, 2]} : f32[2,2]")


def test_parse_many_with_separators_and_blank_lines():
    text = MLP_TEXT + "\n\n// -----\n\n" + MLP_TEXT.replace("@f", "@g") + "\n\n" + \
        "graph @h() -> (i64[]) {\n  return 3\n}\n"
    graphs = parse_many(text)
    assert [g.name for g in graphs] == ["f", "g", "h"]
    assert graphs[2].outputs == [Literal(3, D.int64)]
    assert parse_many("// nothing here\n") == []


def test_parse_rejects_several_graphs():
    with pytest.raises(IRParseError, match="use parse_many"):
        parse(MLP_TEXT + "\n" + MLP_TEXT)


def test_literals_values_and_annotations():
    g = parse("""graph @l(%x: f32[2], %c: i1[2], %i: i32[2]) -> (f32[2], f32[2], i32[2], f16[]) {
      %0 = add %x, -inf : f32[2]
      %1 = where %c, 1:f32, nan:f32 : f32[2]
      %2 = maximum %i, -3 : i32[2]
      return %0, %1, %2, 1e-05
    }""")
    assert g.nodes[0].inputs[1] == Literal(float("-inf"), D.float32)
    lit = g.nodes[1].inputs[1]
    assert lit == Literal(1.0, D.float32) and isinstance(lit.value, float)
    assert np.isnan(g.nodes[1].inputs[2].value)
    assert g.nodes[2].inputs[1] == Literal(-3, D.int32) and isinstance(g.nodes[2].inputs[1].value, int)
    assert g.outputs[3] == Literal(1e-05, D.float16)


def test_constants_take_dtype_and_shape_from_the_result_type():
    g = parse("""graph @c() -> (bf16[2], i1[0,3], u8[2,1]) {
      %0 = constant {value=dense<[0.1, 3]>} : bf16[2]
      %1 = constant {value=dense<[]>} : i1[0,3]
      %2 = constant {value=dense<[[255], [0]]>} : u8[2,1]
      return %0, %1, %2
    }""")
    arrays = [n.attrs["value"].array for n in g.nodes]
    assert [a.dtype for a in arrays] == [D.bfloat16.np_dtype, np.bool_, np.uint8]
    assert [a.shape for a in arrays] == [(2,), (0, 3), (2, 1)]
    assert arrays[2].tolist() == [[255], [0]]


def _error(text: str) -> IRParseError:
    with pytest.raises(IRParseError) as info:
        parse(text)
    return info.value


GOOD = MLP_TEXT.splitlines()


def _with_line(i: int, line: str) -> str:
    lines = list(GOOD)
    lines[i] = line
    return "\n".join(lines)


@pytest.mark.parametrize("line_no, line, where, message", [
    (1, "  %0 = matmul %x, %w f32[4,16]", "2:22",
     "expected ':' and the result type after the operands, got 'f32'"),
    (2, "  %1 = maximum %0, 0.0 {axes=[0]} : f32[4,16]", "3:25",
     "maximum has no attribute 'axes' (its attributes: none)"),
    (3, "  %2 = sum %1 : f32[]", "4:8", "sum needs attribute axes"),
    (3, "  %2 = sum %1 {axes=[0, 1] : f32[]", "4:28",
     "expected ',' or '}' after an attribute, got ':'"),
    (1, "  %0 = matmul %x, %y : f32[4,16]", "2:19", "use of undefined value %y"),
    (1, "  %0 = matmal %x, %w : f32[4,16]", "2:8", "unknown primitive 'matmal'"),
    (1, "  %0 = matmul %w, %x : f32[4,16]", "2:8",
     "matmul: mat1 and mat2 shapes cannot be multiplied (8x16 and 4x8)"),
    (1, "  %0 = matmul %x, %w : f32[4,8]", "2:24",
     "result type f32[4,8] does not match f32[4,16] given by matmul's rule"),
    (1, "  %0 = matmul %x : f32[4,16]", "2:8", "matmul takes 2 operands, got 1"),
    (2, "  %0 = maximum %0, 0.0 : f32[4,16]", "3:3", "redefinition of value %0"),
    (2, "  %1 = maximum %0, 0.0 : q32[4,16]", "3:26",
     "expected a tensor type like f32[4,8], got 'q32'"),
    (2, "  %1 = maximum %0, true : f32[4,16]", "3:20",
     "expected a number for f32 (the dtype of the node's last value operand), got true; "
     "write true:<dtype> for a literal of another dtype"),
    (2, "  %1 = maximum %0, 0.0 : f32[4,16] # oops", "3:36", "unexpected character '#'"),
    (4, "  return %2, %1", "5:10",
     "output 0 (%2) has type f32[] but the signature declares f32[4,16]"),
    (0, "graph @f(%x: f32[4,8], %x: f32[8,16]) -> (f32[4,16], f32[]) {", "1:24",
     "redefinition of value %x"),
    (0, "graph @f(%x: f32[4,-8], %w: f32[8,16]) -> (f32[4,16], f32[]) {", "1:20",
     "dimension sizes cannot be negative"),
    (3, '  %2 = sum %1 {axes=[0, 1]} : f32[] loc("m.py":)', "4:48",
     "expected a line number, got ')'"),
])
def test_error_messages_name_line_column_and_what_was_expected(line_no, line, where, message):
    text = _with_line(line_no, line)
    err = _error(text)
    assert str(err).splitlines()[0] == f"{where}: error: {message}"
    # MLIR style: the source line and a caret under the column follow.
    source, caret = str(err).splitlines()[1:3]
    assert source == text.splitlines()[err.line - 1]
    assert caret == " " * (err.col - 1) + "^"


def test_return_count_and_literal_output_errors():
    assert str(_error(_with_line(4, "  return %1"))).startswith(
        "5:3: error: return has 1 operand(s) but the signature declares 2 output(s)")
    text = "graph @f() -> (f32[2]) {\n  return 0.0\n}"
    assert str(_error(text)).startswith(
        "2:10: error: a literal output is a scalar, but output 0 is declared f32[2]")


def test_literal_without_any_value_operand_needs_an_annotation():
    text = "graph @f(%c: i1[2]) -> (f32[2]) {\n  %0 = where %c, 1.0, 2.0 : f32[2]\n  return %0\n}"
    err = _error(text)
    assert str(err).splitlines()[0] == (
        "2:18: error: expected true or false for i1 (the dtype of the node's last value operand), "
        "got 1.0; write 1.0:<dtype> for a literal of another dtype")
    text = "graph @f() -> (f32[]) {\n  %0 = add 1.0, 2.0 : f32[]\n  return %0\n}"
    assert "cannot tell the dtype of literal 1.0" in str(_error(text))
    assert _error(text).line == 2 and _error(text).col == 12


def test_integer_literal_range_and_kind():
    text = "graph @f(%x: i8[2]) -> (i8[2]) {\n  %0 = add %x, 300 : i8[2]\n  return %0\n}"
    assert str(_error(text)).startswith("2:16: error: 300 is out of range for i8")
    text = "graph @f(%x: i8[2]) -> (i8[2]) {\n  %0 = add %x, 1.5 : i8[2]\n  return %0\n}"
    assert "expected an integer for i8" in str(_error(text))


def test_dense_shape_must_match_the_result_type():
    text = ("graph @f() -> (f32[2,2]) {\n  %0 = constant {value=dense<[[1.0, 2.0], [3.0]]>} : "
            "f32[2,2]\n  return %0\n}")
    assert str(_error(text)).startswith("2:24: error: dense elements are not rectangular")
    text = text.replace("[3.0]", "[3.0, 4.0]").replace(": f32[2,2]", ": f32[4]")
    assert "dense elements have shape [2, 2] but the result type is f32[4]" in str(_error(text))


def test_unterminated_input():
    err = _error("graph @f(%x: f32[2]) -> (f32[2]) {\n  %0 = exp %x : f32[2]\n")
    assert str(err).startswith("3:1: error: expected a node ('%name = op ...') or 'return', got "
                               "end of input")
    assert str(_error('graph @"f')).startswith("1:7: error: unexpected character '@'")


def test_errors_are_value_errors():
    """IRParseError is an IRError, itself a ValueError: callers can catch either."""
    assert issubclass(IRParseError, ValueError)


def test_parse_preserves_locations_exactly():
    g = mlp_graph()
    g.nodes[0].loc = 'dir with "quotes"/ü.py:7'
    back = parse(print_graph(g, locations=True))
    assert back.nodes[0].loc == g.nodes[0].loc
    assert parse(print_graph(g)).nodes[0].loc is None


def test_rule_errors_name_the_op_once():
    text = ("graph @f(%a: f32[2], %b: f32[3]) -> (f32[2]) {\n  %0 = add %a, %b : f32[2]\n"
            "  return %0\n}")
    assert str(_error(text)).splitlines()[0] == (
        "2:8: error: add: the size of tensor a (2) must match the size of tensor b (3) at "
        "non-singleton dimension 0 (shapes [2], [3])")
    text = text.replace("add %a, %b : f32[2]", "sum %a {axes=[3]} : f32[2]")
    assert str(_error(text)).splitlines()[0] == "2:8: error: sum: axis 3 out of range for f32[2]"


def test_checkpoint_marks_print_parse_and_hash():
    """A checkpointed region's nodes (``region(N)``) and the copies its backward recomputes
    (``remat``) keep their marks through a print/parse round trip, and the marks are part of
    the structural hash (passes treat marked nodes apart)."""
    from fusegrad.ir import structural_hash
    text = "\n".join([
        "graph @f(%x: f32[4]) -> (f32[4]) {",
        "  %0 = sin %x : f32[4] region(0)",
        "  %1 = stop_gradient %x : f32[4] remat",
        "  %2 = sin %1 : f32[4] region(0) remat",
        "  %3 = mul %0, %2 : f32[4]",
        "  return %3",
        "}"])
    g = parse(text)
    assert [(n.region, n.remat) for n in g.nodes] == [(0, False), (None, True), (0, True),
                                                     (None, False)]
    assert print_graph(g) == text
    plain = parse(text.replace(" region(0)", "").replace(" remat", ""))
    assert structural_hash(plain) != structural_hash(g)
    with pytest.raises(IRParseError, match="region number"):
        parse(text.replace("region(0)", "region(x)", 1))
