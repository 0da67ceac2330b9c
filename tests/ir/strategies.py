"""Hypothesis strategies for random *valid* IR graphs, for testing the IR tools and passes.

``graphs()`` draws a :class:`Graph` built node by node with the builder, so every graph it
gives verifies: elementwise unary and binary ops (broadcasting between random shapes, literal
operands), comparisons and ``where``, reductions over random axes, reshape / permute / slice /
broadcast_to / pad / concat, casts, matmul, in-bounds take and gather, cumsum and argsort,
and constant / iota / full sources. ``graphs_and_args()`` pairs a graph with inputs for it.

Every graph also *runs*: ops that can raise on data (integer pow, floordiv and remainder,
index ops with data-dependent indices) are left out or given indices built with ``iota``.
Values stay small and non-empty (every dimension >= 1). NaN and inf appear freely in float
literals and constants: they are part of what printing and passes must keep.

Usage from any test::

    from hypothesis import given
    from tests.ir.strategies import graphs, graphs_and_args

    @given(graphs_and_args())
    def test_my_pass_preserves_meaning(case):
        g, args = case
        ...
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from hypothesis import strategies as st

from fusegrad import dtypes as D
from fusegrad.ir import Graph, Literal, TensorType, Value
from fusegrad.ops.primitive import ConstantData

__all__ = ["graphs", "graphs_and_args", "random_args", "shapes"]

FLOAT_UNARY = ("neg", "abs", "exp", "log", "log1p", "expm1", "sin", "cos", "tanh", "erf", "sqrt",
               "reciprocal", "sign", "floor", "ceil", "round", "copy", "stop_gradient")
INT_UNARY = ("neg", "abs", "sign", "copy")
FLOAT_BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "floordiv", "remainder",
                "fmod")
INT_BINARY = ("add", "sub", "mul", "maximum", "minimum")
COMPARE = ("lt", "le", "eq", "ne")
REDUCE = ("sum", "prod", "max", "min")

FLOAT_DTYPES = (D.float32, D.float64)

# Float literals: the interesting IEEE values plus a few ordinary ones, so that shrinking
# lands on readable numbers.
_SPECIAL_FLOATS = st.sampled_from([0.0, -0.0, 1.0, -1.5, 0.1, 2.0, math.inf, -math.inf, math.nan])
_FLOATS = st.one_of(_SPECIAL_FLOATS, st.floats(-1e6, 1e6, allow_nan=False))


def shapes(max_rank: int = 3, max_dim: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes of rank 0..max_rank with every dimension in 1..max_dim."""
    return st.lists(st.integers(1, max_dim), max_size=max_rank).map(tuple)


def _literal(draw, dtype: D.DType) -> Literal:
    if dtype.category == 0:
        return Literal(draw(st.booleans()), dtype)
    if dtype.category == 1:
        return Literal(draw(st.integers(-5, 5)), dtype)
    return Literal(draw(_FLOATS), dtype)


def _factor_shape(draw, numel: int, max_rank: int) -> tuple[int, ...]:
    """A random shape with ``numel`` elements: its prime factors grouped into dims."""
    factors, n, p = [], numel, 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    factors = draw(st.permutations(factors))
    rank = draw(st.integers(min(1, numel > 1), max(max_rank, 1)))
    dims = [1] * rank
    for f in factors:
        dims[draw(st.integers(0, rank - 1))] *= f
    return tuple(dims)


class _Builder:
    """Grows one graph; each ``op_*`` method appends a node using ``x`` or returns None."""

    def __init__(self, draw, g: Graph, max_inputs: int, max_rank: int, max_dim: int):
        self.draw, self.g = draw, g
        self.max_inputs, self.max_rank, self.max_dim = max_inputs, max_rank, max_dim
        self.values: list[Value] = list(g.inputs)

    def new_input(self, t: TensorType) -> Value | None:
        if len(self.g.inputs) >= self.max_inputs:
            return None
        v = self.g.add_input(f"x{len(self.g.inputs)}", t)
        self.values.append(v)
        return v

    def add(self, op: str, operands: Sequence, attrs: dict | None = None) -> Value:
        v = self.g.add_node(op, list(operands), attrs)
        self.values.append(v)
        return v

    def partner_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts with ``shape``: a suffix, some dims 1, maybe more leading."""
        draw = self.draw
        keep = draw(st.integers(0, len(shape)))
        dims = [1 if draw(st.booleans()) else d for d in shape[len(shape) - keep:]]
        if keep < len(shape):
            return tuple(dims)      # leading dims added here would face x's own
        extra = draw(st.lists(st.integers(1, self.max_dim),
                              max_size=max(self.max_rank - len(shape), 0)))
        return tuple(extra) + tuple(dims)

    def partner(self, x: Value, literal_ok: bool = True):
        """A second operand for an elementwise op on ``x``: a value, a new input or a literal."""
        draw = self.draw
        choice = draw(st.sampled_from(["value", "input", "literal"] if literal_ok else
                                      ["value", "input"]))
        if choice == "value":
            candidates = [v for v in self.values if v.dtype is x.dtype and _broadcasts(v, x)]
            return draw(st.sampled_from(candidates))      # x itself always qualifies
        if choice == "input":
            v = self.new_input(TensorType(self.partner_shape(x.shape), x.dtype))
            if v is not None:
                return v
        return _literal(draw, x.dtype) if literal_ok else x

    # -- elementwise

    def op_unary(self, x: Value) -> Value:
        if x.dtype is D.bool_:
            return self.add("not", [x])
        ops = FLOAT_UNARY if x.dtype.is_floating_point else INT_UNARY
        return self.add(self.draw(st.sampled_from(ops)), [x])

    def op_binary(self, x: Value) -> Value:
        if x.dtype is D.bool_:
            op = self.draw(st.sampled_from(("and", "or")))
        else:
            op = self.draw(st.sampled_from(FLOAT_BINARY if x.dtype.is_floating_point
                                           else INT_BINARY))
        y = self.partner(x)
        # Either order: a literal on the left tests the "last value operand" literal rule.
        operands = [y, x] if self.draw(st.booleans()) else [x, y]
        return self.add(op, operands)

    def op_compare(self, x: Value) -> Value | None:
        if x.dtype is D.bool_:
            return None
        return self.add(self.draw(st.sampled_from(COMPARE)), [x, self.partner(x)])

    def op_where(self, x: Value) -> Value | None:
        if x.dtype is not D.bool_:
            return None
        dtype = self.draw(st.sampled_from(FLOAT_DTYPES))
        choices = [v for v in self.values if v.dtype is dtype and _broadcasts(v, x)]
        a = self.draw(st.sampled_from(choices)) if choices else _literal(self.draw, dtype)
        b = _literal(self.draw, dtype)
        return self.add("where", [x, a, b] if self.draw(st.booleans()) else [x, b, a])

    def op_cast(self, x: Value) -> Value:
        dtype = self.draw(st.sampled_from((D.float32, D.float64, D.int64, D.bool_)))
        return self.add("cast", [x], {"dtype": dtype})

    # -- reductions

    def op_reduce(self, x: Value) -> Value:
        axes = self.draw(st.sets(st.integers(0, max(x.type.ndim - 1, 0)), max_size=x.type.ndim))
        if x.type.ndim == 0:
            axes = set()
        op = self.draw(st.sampled_from(REDUCE))
        return self.add(op, [x], {"axes": tuple(sorted(axes))})

    def op_arg_reduce(self, x: Value) -> Value:
        axis = self.draw(st.integers(0, max(x.type.ndim - 1, 0)))
        return self.add(self.draw(st.sampled_from(("argmax", "argmin"))), [x], {"axis": axis})

    # -- movement

    def op_reshape(self, x: Value) -> Value:
        return self.add("reshape", [x], {"shape": _factor_shape(self.draw, x.type.numel,
                                                                 self.max_rank)})

    def op_permute(self, x: Value) -> Value:
        perm = tuple(self.draw(st.permutations(range(x.type.ndim))))
        return self.add("permute", [x], {"perm": perm})

    def op_slice(self, x: Value) -> Value:
        starts, stops, steps = [], [], []
        for d in x.shape:
            a = self.draw(st.integers(0, d - 1))
            starts.append(a)
            stops.append(self.draw(st.integers(a + 1, d)))
            steps.append(self.draw(st.integers(1, 3)))
        return self.add("slice", [x], {"starts": tuple(starts), "stops": tuple(stops),
                                       "steps": tuple(steps)})

    def op_broadcast(self, x: Value) -> Value:
        extra = self.draw(st.lists(st.integers(1, self.max_dim),
                                   max_size=max(self.max_rank - x.type.ndim, 0)))
        dims = [self.draw(st.integers(1, self.max_dim)) if d == 1 else d for d in x.shape]
        return self.add("broadcast_to", [x], {"shape": tuple(extra) + tuple(dims)})

    def op_pad(self, x: Value) -> Value | None:
        # np.pad rejects the empty widths of a 0-d operand (prims.pad's impl does not
        # special-case it), so pad only arrays.
        if x.dtype is D.bool_ or x.type.ndim == 0:
            return None
        widths = tuple((self.draw(st.integers(0, 2)), self.draw(st.integers(0, 2)))
                       for _ in x.shape)
        value = _literal(self.draw, x.dtype).value
        return self.add("pad", [x], {"widths": widths, "value": value})

    def op_concat(self, x: Value) -> Value | None:
        if x.type.ndim == 0:
            return None
        axis = self.draw(st.integers(0, x.type.ndim - 1))
        shape = list(x.shape)
        shape[axis] = self.draw(st.integers(1, self.max_dim))
        other = self.new_input(TensorType(tuple(shape), x.dtype)) or x
        return self.add("concat", [x, other, x][:self.draw(st.integers(2, 3))], {"axis": axis})

    # -- contraction, index, extern

    def op_matmul(self, x: Value) -> Value | None:
        if x.type.ndim < 2 or not x.dtype.is_floating_point:
            return None
        batch = self.draw(st.sampled_from([(), x.shape[:-2]]))
        w = self.new_input(TensorType(batch + (x.shape[-1], self.draw(st.integers(1, 4))),
                                      x.dtype))
        return None if w is None else self.add("matmul", [x, w])

    def op_index(self, x: Value) -> Value | None:
        if x.type.ndim == 0:
            return None
        axis = self.draw(st.integers(0, x.type.ndim - 1))
        if self.draw(st.booleans()):
            # take: indices 0..k-1 along the axis are in bounds by construction.
            k = self.draw(st.integers(1, x.shape[axis]))
            idx = self.add("iota", [], {"shape": (k,), "axis": 0, "dtype": D.int64})
            return self.add("take", [x, idx], {"axis": axis})
        shape = tuple(self.draw(st.integers(1, d)) for d in x.shape)
        idx = self.add("iota", [], {"shape": shape, "axis": axis, "dtype": D.int64})
        return self.add("gather", [x, idx], {"axis": axis})

    def op_extern(self, x: Value) -> Value:
        axis = self.draw(st.integers(0, max(x.type.ndim - 1, 0)))
        if self.draw(st.booleans()):
            return self.add("cumsum", [x], {"axis": axis})
        return self.add("argsort", [x], {"axis": axis, "descending": self.draw(st.booleans())})

    # -- sources

    def source(self) -> Value:
        draw = self.draw
        kind = draw(st.sampled_from(["constant", "iota", "full"]))
        shape = draw(shapes(self.max_rank, self.max_dim))
        dtype = draw(st.sampled_from(FLOAT_DTYPES + (D.int64,)))
        if kind == "iota" and shape:
            return self.add("iota", [], {"shape": shape, "axis": draw(st.integers(0, len(shape) - 1)),
                                         "dtype": dtype})
        if kind == "full":
            return self.add("full", [], {"shape": shape, "value": _literal(draw, dtype).value,
                                         "dtype": dtype})
        n = math.prod(shape)
        if dtype.is_floating_point:
            width = 32 if dtype is D.float32 else 64
            items = draw(st.lists(st.floats(width=width), min_size=n, max_size=n))
        else:
            items = draw(st.lists(st.integers(-2 ** 63, 2 ** 63 - 1), min_size=n, max_size=n))
        # ConstantData holds arrays of rank >= 1 (numpy's ascontiguousarray), so 0-d shapes
        # would not survive as such.
        array = np.array(items, dtype=dtype.np_dtype).reshape(shape or (1,))
        return self.add("constant", [], {"value": ConstantData(array)})


def _broadcasts(a: Value, b: Value) -> bool:
    """Whether ``a``'s shape broadcasts with ``b``'s."""
    for p, q in zip(reversed(a.shape), reversed(b.shape), strict=False):
        if p != q and p != 1 and q != 1:
            return False
    return True


# Moves with weights: elementwise work dominates real programs (and fusion tests), so it
# dominates here. The first entry is what hypothesis shrinks towards.
_MOVES: list[Callable] = [
    *[_Builder.op_unary] * 3, *[_Builder.op_binary] * 4, _Builder.op_compare, _Builder.op_where,
    _Builder.op_cast, *[_Builder.op_reduce] * 2, _Builder.op_arg_reduce, _Builder.op_reshape,
    _Builder.op_permute, _Builder.op_slice, _Builder.op_broadcast, _Builder.op_pad,
    _Builder.op_concat, _Builder.op_matmul, _Builder.op_index, _Builder.op_extern,
]


@st.composite
def graphs(draw, max_nodes: int = 8, max_inputs: int = 4, max_rank: int = 3,
           max_dim: int = 4, dtypes: Sequence[D.DType] = FLOAT_DTYPES) -> Graph:
    """A random valid graph of 1..``max_nodes`` steps (a step may add an index node too)
    over 1..``max_inputs`` inputs whose dtypes come from ``dtypes``."""
    g = Graph(draw(st.sampled_from(["f", "step", "loss"])))
    b = _Builder(draw, g, max_inputs, max_rank, max_dim)
    for _ in range(draw(st.integers(1, max(1, max_inputs - 1)))):
        b.new_input(TensorType(draw(shapes(max_rank, max_dim)), draw(st.sampled_from(dtypes))))
    for _ in range(draw(st.integers(1, max_nodes))):
        # Not 0: hypothesis favours the smallest value, which would make sources common.
        if draw(st.integers(0, 9)) == 7:
            b.source()
            continue
        # Prefer recent values, so that graphs grow deep rather than wide.
        pick = draw(st.integers(0, len(b.values) - 1))
        x = b.values[len(b.values) - 1 - pick // 2]
        if draw(st.sampled_from(_MOVES))(b, x) is None:
            b.op_unary(x)
    outputs: list = [b.values[-1]]
    others = draw(st.lists(st.sampled_from(b.values), max_size=3))
    outputs += [v for v in others if v not in outputs]
    if draw(st.integers(0, 9)) == 0:
        outputs.append(_literal(draw, draw(st.sampled_from(dtypes))))
    g.set_outputs(outputs)
    return g


def random_args(g: Graph, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Inputs for ``g``: standard normal floats, integers in [-5, 5], random bools."""
    rng = np.random.default_rng(seed)
    args = []
    for v in g.inputs:
        t = v.type
        if t.dtype.category == 0:
            a = rng.random(t.shape) < 0.5
        elif t.dtype.category == 1:
            a = rng.integers(-5, 6, size=t.shape)
        else:
            a = rng.standard_normal(t.shape)
        args.append(np.asarray(a).astype(t.dtype.np_dtype))
    return tuple(args)


@st.composite
def graphs_and_args(draw, **kwargs) -> tuple[Graph, tuple[np.ndarray, ...]]:
    """A graph from :func:`graphs` (same keyword arguments) and inputs for it."""
    g = draw(graphs(**kwargs))
    return g, random_args(g, draw(st.integers(0, 2 ** 32 - 1)))
