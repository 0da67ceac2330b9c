"""Symbolic sizes in the IR: the SymInt algebra, printing and parsing ``f32[B,784]`` and
``f32[B*T,64]``, the verifier's checks and the interpreter run at several sizes."""

import numpy as np
import pytest

from fusegrad import dtypes
from fusegrad.ir.graph import IRError
from fusegrad.ir.interpreter import interpret
from fusegrad.ir.parser import IRParseError, parse
from fusegrad.ir.printer import print_graph
from fusegrad.ir.specialize import specialize
from fusegrad.ir.verifier import VerificationError, verify
from fusegrad.symint import SymbolicDecisionError, SymInt, ceil_div, symbol
from fusegrad.tensor_type import TensorType

B, T = symbol("B"), symbol("T")

MLP = """\
graph @mlp(%x: f32[B,784], %w: f32[784,64], %b: f32[64]) -> (f32[B,64], f32[64*B], f32[]) {
  %0 = matmul %x, %w : f32[B,64]
  %1 = add %0, %b : f32[B,64]
  %2 = maximum %1, 0.0 : f32[B,64]
  %3 = reshape %2 {shape=[64*B]} : f32[64*B]
  %4 = sum %3 {axes=[0]} : f32[]
  return %2, %3, %4
}
"""

SEQ = """\
graph @seq(%x: f32[B,T,64]) -> (f32[B*T,64], f32[B,T-1,64]) {
  %0 = reshape %x {shape=[B*T, 64]} : f32[B*T,64]
  %1 = slice %x {starts=[0, 1, 0], stops=[B, T, 64], steps=[1, 1, 1]} : f32[B,T-1,64]
  return %0, %1
}
"""


def test_expressions_are_canonical_and_hash_alike():
    assert B * T == T * B and hash(B * T) == hash(T * B)
    assert B + B == 2 * B and B - B == 0 and isinstance(B - B, int)
    assert (4 * B + 8) // 4 == B + 2
    assert str(B * T + 1) == "B*T+1" and str(T - 1) == "T-1" and str(ceil_div(T, 2)) == "ceil(T/2)"
    assert str((B + 1) // 2) == "floor((B+1)/2)"
    assert (B * T).evaluate({"B": 3, "T": 5}) == 15
    assert ceil_div(T, 2).evaluate({"T": 7}) == 4 and ((T + 1) // 2).evaluate({"T": 8}) == 4
    assert TensorType((B, 784), dtypes.float32).numel == 784 * B


def test_comparisons_follow_the_at_least_two_assumption():
    # Sizes 0 and 1 are specialized, so a symbol is never 1 (broadcasting stays decidable).
    assert B != 1 and not (B == 1) and B >= 2 and B > 1 and B * T >= 4
    with pytest.raises(SymbolicDecisionError, match="cannot decide B < 784"):
        B < 784                                      # noqa: B015
    with pytest.raises(TypeError, match="no value until a call binds B"):
        int(B)
    with pytest.raises(TypeError, match="no value"):
        np.zeros((B, 3))


@pytest.mark.parametrize("text", [MLP, SEQ])
def test_symbolic_graphs_print_parse_and_verify(text):
    g = parse(text)
    verify(g)
    assert print_graph(g) == text.rstrip("\n")
    assert print_graph(parse(print_graph(g))) == print_graph(g)
    assert isinstance(g.inputs[0].type.shape[0], SymInt)


def test_interpreter_binds_symbols_from_the_inputs():
    g = parse(MLP)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((784, 64)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    for n in (2, 3, 17):
        x = rng.standard_normal((n, 784)).astype(np.float32)
        h, flat, total = interpret(g, x, w, b)
        ref = np.maximum(x.astype(np.float64) @ w + b, 0)
        # float32 dot products of length 784: rounding grows with the length.
        np.testing.assert_allclose(h, ref, rtol=0, atol=784 * 4 * np.finfo(np.float32).eps * 8)
        assert flat.shape == (64 * n,) and total.shape == ()
    x = np.ones((2, 5, 64), np.float32)
    flat, tail = interpret(parse(SEQ), x)
    assert flat.shape == (10, 64) and tail.shape == (2, 4, 64)


def test_interpreter_names_the_symbol_and_its_binding():
    g = parse(MLP)
    w, b = np.ones((784, 64), np.float32), np.ones(64, np.float32)
    with pytest.raises(IRError, match="symbol B is bound to 1, but a symbolic size is at least 2"):
        interpret(g, np.ones((1, 784), np.float32), w, b)
    with pytest.raises(IRError, match=r"must be f32\[B,784\] \(with B=3\), got an array of shape "
                                      r"\[3, 783\]"):
        interpret(g, np.ones((3, 783), np.float32), w, b)



def test_interpreter_takes_bindings():
    g = parse(SEQ)
    x = np.arange(2 * 5 * 64, dtype=np.float32).reshape(2, 5, 64)
    flat, tail = interpret(g, x, bindings={"B": 2, "T": 5})
    np.testing.assert_array_equal(flat, x.reshape(10, 64))
    np.testing.assert_array_equal(tail, x[:, 1:])
    with pytest.raises(IRError, match=r"must be f32\[B,T,64\] \(with B=2, T=6\), got an array of "
                                      r"shape \[2, 5, 64\]"):
        interpret(g, x, bindings={"T": 6})
    with pytest.raises(IRError, match="symbol T is bound to 1"):
        interpret(g, x, bindings={"T": 1})

def test_verifier_rejects_unbound_symbols_and_undecidable_rules():
    with pytest.raises(VerificationError, match="reads symbol.s. B, T that no input dim binds"):
        verify(parse("graph @f(%x: f32[B*T]) -> (f32[B*T]) {\n  return %x\n}\n"))
    with pytest.raises(IRParseError, match=r"reshape: shape '\[T\]' is invalid for input of size B"):
        verify(parse("graph @f(%x: f32[B]) -> (f32[T]) {\n"
                     "  %0 = reshape %x {shape=[T]} : f32[T]\n  return %0\n}\n"))
    # The parser applies each rule as it reads: x's columns T are not known to be 784.
    with pytest.raises(IRParseError, match=r"mat1 and mat2 shapes cannot be multiplied \(BxT and "
                                           r"784x64\)"):
        parse("graph @f(%x: f32[B,T], %w: f32[784,64]) -> (f32[B,64]) {\n"
              "  %0 = matmul %x, %w : f32[B,64]\n  return %0\n}\n")
    # A node whose type does not follow from its rule, or reads a symbol no input binds.
    g = parse("graph @f(%x: f32[T,784], %b: f32[B]) -> (f32[T]) {\n"
              "  %0 = sum %x {axes=[1]} : f32[T]\n  return %0\n}\n")
    g.nodes[0].output.type = TensorType((B,), dtypes.float32)
    with pytest.raises(VerificationError, match=r"result type f32\[B\] does not match f32\[T\]"):
        verify(g)
    g = parse("graph @f(%x: f32[T,784]) -> (f32[T,784]) {\n"
              "  %0 = reshape %x {shape=[T, 784]} : f32[T,784]\n  return %0\n}\n")
    g.nodes[0].attrs["shape"] = (B, 784)
    g.nodes[0].output.type = TensorType((B, 784), dtypes.float32)
    with pytest.raises(VerificationError, match="reshape's rule rejects it"):
        verify(g)


def test_parser_errors_in_sizes():
    with pytest.raises(IRParseError, match="dimension sizes cannot be negative"):
        parse("graph @f(%x: f32[-2]) -> (f32[-2]) {\n  return %x\n}\n")
    with pytest.raises(IRParseError, match="expected a size"):
        parse("graph @f(%x: f32[B*]) -> (f32[B]) {\n  return %x\n}\n")
    with pytest.raises(IRParseError, match="the divisor must be positive"):
        parse("graph @f(%x: f32[ceil(B/0)]) -> (f32[B]) {\n  return %x\n}\n")


def test_specialize_gives_the_graph_at_one_size():
    g = parse(SEQ)
    s = specialize(g, {"B": 2, "T": 5})
    verify(s)
    assert print_graph(s).splitlines()[0] == \
        "graph @seq(%x: f32[2,5,64]) -> (f32[10,64], f32[2,4,64]) {"
    assert s.nodes[1].attrs["stops"] == (2, 5, 64)
    x = np.arange(2 * 5 * 64, dtype=np.float32).reshape(2, 5, 64)
    for a, b in zip(interpret(s, x), interpret(g, x)):
        np.testing.assert_array_equal(a, b)


def test_division_by_a_monomial_that_divides_every_term_is_exact():
    # A reshape's -1 beside symbolic sizes: x.view(B, T, -1) of a [B, T, 64] tensor.
    B, T = symbol("B", 3), symbol("T", 5)
    assert (B * T * 64) // (B * T) == 64
    assert (B * T * 64) % (B * T) == 0
    assert (12 * B) // (2 * B) == 6
    assert (B * T + B) // B == T + 1
    with pytest.raises(SymbolicDecisionError):
        (B + 1) // B
    with pytest.raises(SymbolicDecisionError):
        (B * T) % (2 * T)
