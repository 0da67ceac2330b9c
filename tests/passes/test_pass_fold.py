"""Constant folding's limits and exactness (its rewrites as text: tests/filecheck/fold/)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fusegrad import dtypes as D
from fusegrad.ir import Literal, interpret, parse
from fusegrad.passes.constant_folding import fold_constants
from tests.passes.pass_testing import check_pass


def test_half_precision_folds_as_the_interpreter_computes():
    # f16 and bf16 compute in f32 and round back; the folded literal holds that rounding.
    g = parse("""graph @f() -> (f16[], bf16[], f16[2]) {
  %0 = div 1.0:f16, 3.0:f16 : f16[]
  %1 = mul 0.1:bf16, 3.0:bf16 : bf16[]
  %2 = constant {value=dense<[0.1, 65504.0]>} : f16[2]
  %3 = add %2, %2 : f16[2]
  return %0, %1, %3
}""")
    out = check_pass(fold_constants, g, ())
    assert [n.op for n in out.nodes] == ["constant"]
    assert isinstance(out.outputs[0], Literal) and out.outputs[0].dtype is D.float16
    assert out.outputs[0].value == float(np.float16(1) / np.float16(3))
    want = (np.float32(ml_dtypes.bfloat16(0.1)) * 3).astype(ml_dtypes.bfloat16)
    assert out.outputs[1].value == float(want)
    assert np.isinf(out.nodes[0].attrs["value"].array[1])       # 65504 + 65504 overflows


def test_failing_nodes_stay_and_still_fail():
    g = parse("""graph @f(%x: i64[2]) -> (i64[2]) {
  %0 = floordiv 7:i64, 0:i64 : i64[]
  %1 = add %x, %0 : i64[2]
  return %1
}""")
    out = fold_constants(g)
    assert [n.op for n in out.nodes] == ["floordiv", "add"]
    with pytest.raises(ZeroDivisionError):
        interpret(out, np.zeros(2, np.int64))


def test_bools_and_integers_become_literals_of_their_dtype():
    g = parse("""graph @f() -> (i1[], i32[], u8[]) {
  %0 = lt 1:i32, 2:i32 : i1[]
  %1 = mul 6:i32, 7:i32 : i32[]
  %2 = add 250:u8, 10:u8 : u8[]
  return %0, %1, %2
}""")
    out = check_pass(fold_constants, g, ())
    assert out.outputs == [Literal(True, D.bool_), Literal(42, D.int32), Literal(4, D.uint8)]
    assert type(out.outputs[0].value) is bool and type(out.outputs[1].value) is int


def test_big_results_are_not_materialized():
    g = parse("""graph @f() -> (f32[2048]) {
  %0 = iota {shape=[2048], axis=0, dtype=f32} : f32[2048]
  %1 = exp %0 : f32[2048]
  return %1
}""")
    assert [n.op for n in fold_constants(g).nodes] == ["iota", "exp"]
    assert [n.op for n in fold_constants(g, max_elements=4096).nodes] == ["constant"]
