"""The lowering table (fusegrad.ops.lowering): one scalar lowering per primitive, shared by the
LLVM emitter and the kernel IR, with commutativity and reduction identities beside it."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import dtypes
from fusegrad.ops import lowering
from fusegrad.ops.primitive import PRIMITIVES, Kind
from fusegrad.passes.cse import COMMUTATIVE


def test_every_elementwise_primitive_has_a_scalar_lowering_or_is_known_extern():
    # Elementwise primitives that no kernel lowers (their numpy reference runs instead).
    extern = {"random_bits", "check_target", "iota"}
    # Inverse and hyperbolic trig: the mathlib has no kernels for them yet.
    extern |= {"asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh"}
    missing = [name for name, p in PRIMITIVES.items()
               if p.kind is Kind.ELEMENTWISE and name not in lowering.LOWERINGS
               and name not in extern]
    assert missing == []


def test_commutativity_and_reductions_come_from_the_table():
    assert COMMUTATIVE is lowering.COMMUTATIVE
    assert {"add", "mul", "eq", "ne", "and", "or", "bitand", "bitor", "bitxor"} == set(COMMUTATIVE)
    # maximum/minimum are not: a tie of -0.0 and 0.0 gives the second operand.
    assert "maximum" not in COMMUTATIVE
    assert set(lowering.REDUCE_OPS) == {"sum", "prod", "max", "min"}
    ident = {op: lowering.LOWERINGS[op].identity for op in lowering.REDUCE_OPS}
    assert ident["sum"](dtypes.float32) == 0.0 and ident["prod"](dtypes.int32) == 1
    assert ident["max"](dtypes.float32) == float("-inf")
    assert ident["max"](dtypes.uint8) == 0 and ident["min"](dtypes.uint8) == 255
    assert ident["max"](dtypes.int8) == -128 and ident["min"](dtypes.bool_) == 1


@pytest.mark.parametrize("dt", [np.uint8])
def test_compiled_abs_and_sign_of_unsigned_integers(dt):
    # Regression: the LLVM lowering compared unsigned bytes as signed, so a compiled abs of
    # uint8 200 gave 56 and its sign 0.
    x = fg.tensor(np.array([0, 1, 127, 128, 200, 255], dtype=dt))
    a, s = fg.compile(lambda x: (x.abs(), x.sign()))(x)
    np.testing.assert_array_equal(a.numpy(), np.abs(x.numpy()))
    np.testing.assert_array_equal(s.numpy(), np.sign(x.numpy()))
