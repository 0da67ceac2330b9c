"""maximum/minimum keep their operand order through simplify and cse: a tie of -0.0 and 0.0
gives the second operand, so swapping them changes the sign of the result."""

import numpy as np

from fusegrad import dtypes
from fusegrad.ir.graph import Graph, Literal
from fusegrad.ir.interpreter import interpret
from fusegrad.ops.primitive import TensorType
from fusegrad.passes.cse import cse
from fusegrad.passes.simplify import simplify


def _graph(op: str, literal_first: bool) -> Graph:
    g = Graph("f")
    x = g.add_input("x", TensorType((3,), dtypes.float32))
    lit = Literal(0.0, dtypes.float32)
    y = g.add_node(op, [lit, x] if literal_first else [x, lit])
    g.set_outputs([y])
    return g


def test_maximum_and_minimum_keep_operand_order():
    x = np.array([-0.0, 0.0, 1.0], dtype=np.float32)
    for op in ("maximum", "minimum"):
        for first in (True, False):
            g = _graph(op, first)
            (want,) = interpret(g, x)
            for p in (simplify, cse):
                (got,) = interpret(p(g), x)
                np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
