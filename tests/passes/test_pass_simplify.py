"""Unit tests of the simplifier's legality conditions (its rewrites are shown, as text, in
tests/filecheck/simplify/; meaning preservation on random graphs in test_pass_properties)."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from fusegrad import dtypes as D
from fusegrad.ir import Graph, Literal, TensorType, parse, print_graph
from fusegrad.ops import prims
from fusegrad.passes.simplify import cast_is_exact, simplify
from tests.passes.pass_testing import check_pass

NUMERIC = [d for d in D.ALL_DTYPES]


def _samples(dtype: D.DType) -> np.ndarray:
    """Values of ``dtype`` that include a counterexample to every lossy cast out of it."""
    if dtype.category == 0:
        return np.array([True, False])
    if dtype.category == 3:
        parts = _samples(D.to_real(dtype))
        out = np.empty(parts.shape, dtype.np_dtype)
        out.real, out.imag = parts, parts[::-1]
        return out
    if dtype.category == 1:
        info = np.iinfo(dtype.np_dtype)
        values = [info.min, info.max, 0, 1, 2, 257, 2049, 2 ** 24 + 1, 2 ** 31, 2 ** 53 + 1]
        return np.array([v for v in values if info.min <= v <= info.max], dtype.np_dtype)
    info = ml_dtypes.finfo(dtype.np_dtype)
    values = [0.0, -0.0, 0.5, 1.0 + float(info.eps), float(info.max), float(info.smallest_subnormal),
              float(info.tiny), np.inf, -np.inf, 3.0]
    return np.array(values, np.float64).astype(dtype.np_dtype)


@pytest.mark.parametrize("src,dst", list(itertools.product(NUMERIC, NUMERIC)),
                         ids=lambda d: d.short)
def test_cast_is_exact_matches_a_round_trip(src, dst):
    x = _samples(src)
    back = prims.cast.impl(prims.cast.impl(x, dtype=dst), dtype=src)
    if src.category == 3:                 # compared part by part
        x, back = x.view(x.real.dtype), back.view(back.real.dtype)
    round_trips = bool(np.all((back == x) | (np.isnan(back.astype(np.float64)) & np.isnan(
        x.astype(np.float64)))))
    if src.category >= 2:
        round_trips &= bool(np.all(np.signbit(back.astype(np.float64)) ==
                                   np.signbit(x.astype(np.float64))))
    assert cast_is_exact(src, dst) == round_trips


def test_rewrites_that_would_change_the_type_are_skipped():
    g = Graph("f")
    x = g.add_input("x", TensorType((4,), D.float32))
    c = g.add_input("c", TensorType((2, 4), D.bool_))
    y = g.add_node("where", [c, x, x])                       # broadcasts to [2,4]
    z = g.add_node("mul", [x, Literal(1.0, D.float32)])
    g.set_outputs([y, z])
    out = simplify(g)
    assert [n.op for n in out.nodes] == ["where"]
    assert out.outputs[1] is out.inputs[0]
    assert out.output_types == g.output_types


def test_boolean_negation_is_left_to_fail():
    # numpy refuses neg and sub of booleans; a rewrite must not turn the failure into a value.
    g = parse("""graph @f(%b: i1[2]) -> (i1[2], i1[2]) {
  %0 = neg %b : i1[2]
  %1 = neg %0 : i1[2]
  %2 = sub %b, false : i1[2]
  return %1, %2
}""")
    assert [n.op for n in simplify(g).nodes] == ["neg", "neg", "sub"]


def test_signed_zeros_make_x_plus_zero_observable():
    g = parse("""graph @f(%x: f32[2]) -> (f32[2]) {
  %0 = add %x, 0.0 : f32[2]
  return %0
}""")
    x = np.array([-0.0, 1.0], np.float32)
    check_pass(simplify, g, (x,), "simplify")
    assert "add" in print_graph(simplify(g))
    assert print_graph(simplify(g, ignore_signed_zeros=True)).count("add") == 0


def test_constant_splats_count_as_one_and_zero():
    g = parse("""graph @f(%x: f32[2,2], %i: i64[2,2]) -> (f32[2,2], i64[2,2]) {
  %0 = constant {value=dense<[[1.0, 1.0], [1.0, 1.0]]>} : f32[2,2]
  %1 = mul %x, %0 : f32[2,2]
  %2 = constant {value=dense<[[0, 0], [0, 0]]>} : i64[2,2]
  %3 = mul %2, %i : i64[2,2]
  return %1, %3
}""")
    out = check_pass(simplify, g, (np.ones((2, 2), np.float32), np.ones((2, 2), np.int64)))
    assert out.outputs[0] is out.inputs[0]
    assert [n.op for n in out.nodes] == ["full"]


def test_index_runs_become_a_slice_and_an_add():
    # take at consecutive constant indices is a slice of the rows; index_add at every index
    # in order adds each row once. Not at other constants: a repeated, reordered, partial or
    # negative index keeps the index op.
    g = parse("""graph @f(%w: f32[5,3], %s: f32[5,3], %t: f32[2,3])
    -> (f32[3,3], f32[5,3], f32[5,3], f32[2,3], f32[5,3], f32[3,3]) {
  %0 = constant {value=dense<[1, 2, 3]>} : i64[3]
  %1 = take %w, %0 {axis=0} : f32[3,3]
  %2 = constant {value=dense<[0, 1, 2, 3, 4]>} : i64[5]
  %3 = index_add %w, %2, %s {axis=0} : f32[5,3]
  %4 = constant {value=dense<[0, 2, 1, 3, 4]>} : i64[5]
  %5 = index_add %w, %4, %s {axis=0} : f32[5,3]
  %6 = constant {value=dense<[0, 0]>} : i64[2]
  %7 = take %w, %6 {axis=0} : f32[2,3]
  %8 = constant {value=dense<[3, 4]>} : i64[2]
  %9 = index_add %w, %8, %t {axis=0} : f32[5,3]
  %10 = constant {value=dense<[-2, -1, 0]>} : i64[3]
  %11 = take %w, %10 {axis=0} : f32[3,3]
  return %1, %3, %5, %7, %9, %11
}""")
    rng = np.random.default_rng(0)
    args = tuple(rng.standard_normal(s).astype(np.float32) for s in ((5, 3), (5, 3), (2, 3)))
    out = check_pass(simplify, g, args)
    ops = [n.op for n in out.nodes if n.op != "constant"]
    assert sorted(ops) == ["add", "index_add", "index_add", "slice", "take", "take"], ops
