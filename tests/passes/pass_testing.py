"""Helpers for the pass tests: an exact oracle, a NaN-aware comparison, and random graphs full
of the patterns the passes rewrite.

``run_canonical(g, *args)`` runs a graph as the interpreter does, but hands every primitive
C-contiguous operands. numpy's float reductions associate their terms by memory layout, so
the same values summed through a transposed view and through a copy can differ in the last
bit; a pass that removes a ``permute`` or folds a view into a constant changes layouts, not
values. With one layout everywhere, a pass that preserves meaning gives *bit-identical*
results, which is what ``assert_same_results`` checks (NaN positions instead of NaN bits).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from hypothesis import strategies as st

from fusegrad import dtypes as D
from fusegrad.ir import Graph, IRError, Literal, Value, interpret, print_graph, verify
from fusegrad.ops.primitive import ConstantData
from tests.ir.strategies import graphs

__all__ = ["run_canonical", "assert_same_results", "rewritable_graphs", "check_pass"]


def run_canonical(g: Graph, *args: np.ndarray) -> list[np.ndarray]:
    """``interpret(g, *args)`` with every operand made C-contiguous before each node."""
    env: dict[Value, np.ndarray] = dict(zip(g.inputs, args, strict=True))

    def get(op) -> np.ndarray:
        if isinstance(op, Literal):
            return np.asarray(op.value, dtype=op.dtype.np_dtype)
        return env[op]

    for node in g.nodes:
        operands = [np.asarray(get(op), order="C") for op in node.inputs]
        result = np.asarray(node.prim.impl(*operands, **node.attrs))
        want = node.output.type
        if result.dtype != want.dtype.np_dtype:
            result = result.astype(want.dtype.np_dtype)
        assert result.shape == want.shape, node
        env[node.output] = result
    return [np.asarray(get(o), order="C") for o in g.outputs]


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_same_results(want: list[np.ndarray], got: list[np.ndarray], context: str = "") -> None:
    """Same count, dtypes and shapes; equal bits, except that any NaN equals any NaN."""
    assert len(want) == len(got), context
    for k, (w, o) in enumerate(zip(want, got, strict=True)):
        where = f"output {k}{': ' + context if context else ''}"
        assert w.dtype == o.dtype and w.shape == o.shape, (where, w.dtype, o.dtype, w.shape,
                                                           o.shape)
        w, o = np.asarray(w, order="C"), np.asarray(o, order="C")
        if w.dtype.kind == "c":           # the parts, each compared as a float
            w, o = w.view(w.real.dtype), o.view(o.real.dtype)
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(w, o, err_msg=where)
            continue
        w_nan, o_nan = np.isnan(w.astype(np.float64)), np.isnan(o.astype(np.float64))
        np.testing.assert_array_equal(w_nan, o_nan, err_msg=f"NaN positions of {where}")
        same = (_bits(w) == _bits(o)) | w_nan
        assert same.all(), f"{where}: {w} != {o} (bitwise, -0.0 and 0.0 differ)"


def check_pass(run: Callable[[Graph], Graph], g: Graph, args: tuple, name: str = "") -> Graph:
    """Run a pass the way every test here does: the input must stay as it was, the output
    must verify and compute the same bits."""
    before = print_graph(g)
    out = run(g)
    assert print_graph(g) == before, f"{name} changed its input graph"
    verify(out)
    assert out.output_types == g.output_types, name
    context = f"{name} on\n{before}\n->\n{print_graph(out)}"
    assert_same_results(run_canonical(g, *args), run_canonical(out, *args), context)
    # The project's interpreter accepts the result too (inputs and result types checked).
    assert len(interpret(out, *args)) == len(g.outputs)
    return out


# --------------------------------------------------------------------------- strategies


def _one(dtype: D.DType):
    return Literal(True, dtype) if dtype.category == 0 else Literal(1 if dtype.category == 1
                                                                     else 1.0, dtype)


def _zero(draw, dtype: D.DType):
    if dtype.category == 0:
        return Literal(False, dtype)
    if dtype.category == 1:
        return Literal(0, dtype)
    return Literal(draw(st.sampled_from([0.0, -0.0])), dtype)


def _factor_shape(draw, numel: int) -> tuple[int, ...]:
    shape = [numel] if numel > 1 else []
    if numel > 1 and numel % 2 == 0 and draw(st.booleans()):
        shape = [2, numel // 2]
    if draw(st.booleans()):
        shape.insert(draw(st.integers(0, len(shape))), 1)
    return tuple(shape)


_CASTS = (D.bool_, D.int8, D.int32, D.int64, D.float16, D.float32, D.float64)


def _pattern(draw, g: Graph, v: Value) -> list:
    """Nodes applying one rewritable pattern to ``v``; returns the values to output."""
    t = v.type
    dt = t.dtype
    kind = draw(st.sampled_from(["mul1", "add0", "sub0", "div1", "mul0", "negneg", "notnot",
                                 "reshape2", "permute2", "broadcast2", "cast2", "where",
                                 "splat", "duplicate", "literals", "constant"]))
    add = g.add_node
    if kind == "mul1":
        ops = [v, _one(dt)] if draw(st.booleans()) else [_one(dt), v]
        return [add("mul", ops)]
    if kind == "add0" and dt.category != 0:
        ops = [v, _zero(draw, dt)] if draw(st.booleans()) else [_zero(draw, dt), v]
        return [add("add", ops)]
    if kind == "sub0" and dt.category != 0:
        return [add("sub", [v, _zero(draw, dt)])]
    if kind == "div1" and dt.category == 2:
        return [add("div", [v, _one(dt)])]
    if kind == "mul0":
        return [add("mul", [v, _zero(draw, dt)])]
    if kind == "negneg" and dt.category != 0:
        return [add("neg", [add("neg", [v])])]
    if kind == "notnot":
        return [add("not", [add("not", [v])])]
    if kind == "reshape2":
        mid = add("reshape", [v], {"shape": _factor_shape(draw, t.numel)})
        last = t.shape if draw(st.booleans()) else _factor_shape(draw, t.numel)
        return [add("reshape", [mid], {"shape": last})]
    if kind == "permute2":
        p = tuple(draw(st.permutations(range(t.ndim))))
        q = tuple(draw(st.permutations(range(t.ndim))))
        return [add("permute", [add("permute", [v], {"perm": p})], {"perm": q})]
    if kind == "broadcast2":
        s1 = (2,) + t.shape if draw(st.booleans()) else t.shape
        s2 = (3,) + s1 if draw(st.booleans()) else s1
        return [add("broadcast_to", [add("broadcast_to", [v], {"shape": s1})], {"shape": s2})]
    if kind == "cast2":
        mid = add("cast", [v], {"dtype": draw(st.sampled_from(_CASTS))})
        last = dt if draw(st.booleans()) else draw(st.sampled_from(_CASTS))
        return [add("cast", [mid], {"dtype": last})]
    if kind == "where":
        cond = draw(st.sampled_from([Literal(True, D.bool_), Literal(False, D.bool_)]))
        bools = [u for u in g.inputs if u.dtype is D.bool_]
        if bools and draw(st.booleans()):
            cond = draw(st.sampled_from(bools))
        other = v if draw(st.booleans()) else _zero(draw, dt)
        return [add("where", [cond, v, other])]
    if kind == "splat":
        one = add("full", [], {"shape": t.shape, "value": _one(dt).value, "dtype": dt})
        return [add(draw(st.sampled_from(["mul", "div"])) if dt.category == 2 else "mul",
                    [v, one])]
    if kind == "duplicate" and v.producer is not None:
        n = v.producer
        return [add(n.prim, list(n.inputs), dict(n.attrs))]
    if kind == "literals":
        x = draw(st.sampled_from([0.5, -0.0, 2.0, float("inf"), float("nan")]))
        s = add("add", [Literal(x, D.float32), Literal(1.5, D.float32)])
        return [add("exp", [s]), add("mul", [v, _one(dt)])]
    if kind == "constant":
        arr = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
        c = add("constant", [], {"value": ConstantData(arr)})
        p = add("permute", [c], {"perm": (1, 0)})
        return [add("sum", [add("tanh", [p])], {"axes": (0,)})]
    return [add("neg", [v])] if dt.category != 0 else [add("not", [v])]


@st.composite
def rewritable_graphs(draw, max_patterns: int = 4) -> Graph:
    """A random graph from ``tests.ir.strategies.graphs`` with a few patterns that the
    passes rewrite applied to its values (and those results added to its outputs)."""
    g = draw(graphs(max_nodes=5, dtypes=(D.float32, D.float64, D.int64, D.bool_)))
    outputs = list(g.outputs)
    for _ in range(draw(st.integers(1, max_patterns))):
        values = list(g.inputs) + [n.output for n in g.nodes]
        v = draw(st.sampled_from(values))
        try:
            outputs += _pattern(draw, g, v)
        except IRError:
            continue      # a pattern that does not type-check for this value
    g.set_outputs(outputs)
    return g

