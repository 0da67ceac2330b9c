"""Every primitive and every public op, compiled, against eager execution.

One compiled function per (kind of op, dtype) applies each op of that kind to every layout
at once: non-contiguous inputs passed in, views taken inside the function, broadcast
operands and 0-d tensors; float inputs carry NaN, ±Inf and -0.0. (One function, not one per
op: building an LLVM module costs far more than a few more kernels in it.) The primitive
tests also pin down which primitives run as LLVM code and which fall back to their numpy
reference (``NUMPY_PRIMITIVES``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as NF
from fusegrad.ops import prims as P
from fusegrad.ops.primitive import PRIMITIVES, bind
from fusegrad.runtime.cpu import NumpyStep
from tests.compiler.compare import check_compiled, strided, tensors, values

FLOATS = (fg.float32, fg.float64, fg.float16, fg.bfloat16)
INTS = (fg.int32, fg.int64)
B = fg.bool

# Primitives whose kernels run their numpy reference between LLVM kernels: data-dependent
# addressing (index ops), sorting and scans, arg-reductions, and the Philox generator.
NUMPY_PRIMITIVES = {"argmax", "argmin", "take", "index_add", "gather", "scatter_add",
                    "argsort", "cumsum", "random_uniform", "check_target", "check_index"}


def numpy_ops(compiled, *args) -> set[str]:
    program = compiled.lower(*tensors(*args)).program
    return {n.op for step in program.steps if isinstance(step, NumpyStep)
            for n in step.kernel.nodes}


def check_primitives(dtype, cases: dict, *args, rtol=None, atol=None, in_numpy=()) -> None:
    """Each ``cases[name](*args)`` (which binds primitive ``name``), compiled together, equals
    eager, and each primitive runs as LLVM code unless it is one of NUMPY_PRIMITIVES or
    ``in_numpy``."""
    compiled = check_compiled(lambda *a: {name: fn(*a) for name, fn in cases.items()}, *args,
                              rtol=rtol, atol=atol)
    ran_numpy = numpy_ops(compiled, *args)
    for name in cases:
        expect_numpy = name in NUMPY_PRIMITIVES or name in in_numpy
        assert (name in ran_numpy) == expect_numpy, \
            f"{name} on {dtype}: {compiled.lower(*tensors(*args)).kernels}"


def check_primitive(name: str, dtype, fn, *args, rtol=None, atol=None) -> None:
    check_primitives(dtype, {name: fn}, *args, rtol=rtol, atol=atol)


# An odd inner extent: vector loops and their remainder loops both run. (LLVM 22 takes
# seconds on some bfloat16 copy kernels with inner extents from 9 to 32, so not those.)
SHAPE = (3, 33)


def layouts(dtype, **kw) -> tuple:
    """A transposed and a sliced array of SHAPE (non-contiguous, passed in) and a 0-d one.

    Passed-in arrays reach the kernels as contiguous copies; views taken inside the
    compiled function (``s.t()`` below) are read through their strides.
    """
    return (strided(values(SHAPE, dtype, 0, **kw), "T"),
            strided(values(SHAPE, dtype, 1, **kw), "slice"), values((), dtype, 2, **kw))


def unary(op):
    def f(t, s, z):
        return op(t), op(s.t()), op(z)
    return f


def binary(op):
    """``op`` on non-contiguous inputs, a broadcast row, 0-d operands either side (one with
    a transposed view inside the function), and two 0-d operands."""
    def f(t, s, z, t2, row):
        return op(t, s), op(t2, row), op(z, t), op(t2.t(), z), op(z, z)
    return f


def binary_args(dtype, **kw) -> tuple:
    return layouts(dtype, **kw) + (strided(values(SHAPE, dtype, 4, **kw), "T"),
                                   values(SHAPE[-1:], dtype, 5, **kw))


# --------------------------------------------------------------------------- elementwise

UNARY_FLOAT = ("exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sin", "cos", "tan", "tanh",
               "erf", "sqrt", "reciprocal", "floor", "ceil", "round")
UNARY_ANY = ("neg", "abs", "sign", "copy", "stop_gradient")


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
def test_unary_primitives(dtype):
    names = UNARY_ANY + (UNARY_FLOAT if dtype.is_floating_point else ())
    check_primitives(dtype, {n: unary(lambda x, p=PRIMITIVES[n]: bind(p, x)) for n in names},
                     *layouts(dtype))


def test_not_primitive():
    check_primitive("not", B, unary(lambda x: bind(P.logical_not, x)), *layouts(B))


CAST_TARGETS = (fg.float32, fg.float64, fg.float16, fg.bfloat16, fg.int32, fg.int64, fg.int8,
                fg.uint8, B)


@pytest.mark.parametrize("src", FLOATS + INTS + (B,), ids=str)
def test_cast_primitive(src):
    # Float to integer keeps to values that every integer type holds (out of range is
    # undefined in C and torch); negative values to uint8 wrap around as in numpy.
    def f(t, s, z):
        targets = [d for d in CAST_TARGETS if d is not src]
        return (tuple(bind(P.cast, t, dtype=d) for d in targets),
                tuple(bind(P.cast, z, dtype=d) for d in targets),
                bind(P.cast, s.t(), dtype=targets[-1]))
    kw = {"special": False} if src.is_floating_point else {}
    check_primitive("cast", src, f, *layouts(src, **kw))


def test_cast_nan_and_inf_to_bool_and_float():
    check_primitive("cast", fg.float32, lambda x: (
        bind(P.cast, x, dtype=B), bind(P.cast, x, dtype=fg.float16),
        bind(P.cast, x, dtype=fg.bfloat16), bind(P.cast, x, dtype=fg.float64)),
        np.array([math.nan, math.inf, -math.inf, -0.0, 1e30, 65520.0, 1e-40, 3.0], np.float32))


BINARY_DTYPES = {
    "add": FLOATS + INTS, "sub": FLOATS + INTS, "mul": FLOATS + INTS, "div": FLOATS,
    "pow": FLOATS + INTS, "maximum": FLOATS + INTS + (B,), "minimum": FLOATS + INTS + (B,),
    "floordiv": FLOATS + INTS, "remainder": FLOATS + INTS, "fmod": FLOATS + INTS, "lt": FLOATS + INTS + (B,),
    "le": FLOATS + INTS + (B,), "eq": FLOATS + INTS + (B,), "ne": FLOATS + INTS + (B,),
    "and": (B,), "or": (B,), "bitand": INTS, "bitor": INTS, "bitxor": INTS, "shl": INTS,
    "shr": INTS,
}


INT_DIVISIONS = ("floordiv", "remainder", "fmod")


@pytest.mark.parametrize("dtype", FLOATS + INTS + (B,), ids=str)
def test_binary_primitives(dtype):
    args = binary_args(dtype)
    # Every operand is a divisor or an exponent somewhere: numpy raises on integer division
    # by zero and on negative integer exponents, so those get arguments of their own.
    nonzero = tuple(np.where(a == 0, 7, a).astype(a.dtype) for a in args)
    small = tuple(np.asarray(np.abs(a) % 4) for a in args) if dtype in INTS else args
    n = len(args)
    cases = {}
    for name, dts in BINARY_DTYPES.items():
        if dtype not in dts:
            continue
        part = 0
        if dtype in INTS and name in INT_DIVISIONS:
            part = 1
        if dtype in INTS and name == "pow":
            part = 2
        op = binary(lambda x, y, p=PRIMITIVES[name]: bind(p, x, y))
        cases[name] = lambda *a, op=op, part=part: op(*a[part * n:(part + 1) * n])

    def where(*a):
        (t, s, z, *_), cond = a[:n], a[-1]
        w = lambda *a: bind(P.where, *a)  # noqa: E731
        return (w(cond, t, s), w(cond[0], t, z), w(cond.t(), z, s.t()),
                w(bind(P.ne, t, s), z, z))
    cases["where"] = where
    cond = strided(values(SHAPE, B, 7), "T")
    # Integer division and signed integer pow by a tensor run numpy, which raises on a zero
    # divisor or a negative exponent as eager does (a kernel cannot raise); in a function of
    # their own, so the other ops stay LLVM code.
    in_numpy = INT_DIVISIONS + (("pow",) if dtype.is_signed else ())
    divisions = {n: cases.pop(n) for n in in_numpy} if dtype in INTS else {}
    check_primitives(dtype, cases, *args, *nonzero, *small, cond)
    if divisions:
        check_primitives(dtype, divisions, *args, *nonzero, *small, cond, in_numpy=in_numpy)


INVERSE_TRIG = ("asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_inverse_trig_primitives_run_their_numpy_reference(dtype):
    # No mathlib kernels for these yet: they run numpy between the LLVM kernels.
    cases = {n: unary(lambda x, p=PRIMITIVES[n]: bind(p, x)) for n in INVERSE_TRIG}
    check_primitives(dtype, cases, *layouts(dtype), in_numpy=INVERSE_TRIG)
    check_primitives(dtype, {"atan2": binary(lambda x, y: bind(P.atan2, x, y))},
                     *binary_args(dtype), in_numpy=("atan2",))


@pytest.mark.parametrize("src,dst", [(fg.float32, fg.int32), (fg.int64, fg.float64),
                                     (fg.float16, fg.int16)], ids=str)
def test_bitcast_primitive(src, dst):
    # 16-bit floats compute in float32 registers, which do not hold their bits: numpy runs.
    in_numpy = ("bitcast",) if src.itemsize < 4 else ()
    check_primitives(src, {"bitcast": unary(lambda x: bind(P.bitcast, x, dtype=dst))},
                     *layouts(src, special=False), in_numpy=in_numpy)


def test_scatter_reduce_primitive():
    idx = np.array([[0, 2, 1, 0], [0, 2, 1, 1]])
    cases = {"scatter_reduce": lambda x, s: tuple(
        bind(P.scatter_reduce, x, fg.tensor(idx), s, axis=0, reduce=r, include_self=inc)
        for r in ("replace", "sum", "prod", "mean", "amax", "amin") for inc in (True, False))}
    check_primitives(fg.float32, cases, values((3, 4), fg.float32, 0),
                     values((2, 5), fg.float32, 1), in_numpy=("scatter_reduce",))


def test_pow_special_values():
    # Every pair of special values, as exponent tensor (exp/log lowering) and as literal.
    xs = np.array([math.nan, math.inf, -math.inf, -0.0, 0.0, 1.0, -1.0, 0.5, -2.5, 3.0, -3.0,
                   2.0], np.float64)
    base, expo = np.meshgrid(xs, xs, indexing="ij")
    for dt in (np.float32, np.float64):
        check_compiled(lambda x, y: bind(P.pow_, x, y), base.astype(dt), expo.astype(dt))
        check_compiled(lambda x: (x ** 3, x ** -1, x ** -2, x ** 0, x ** 0.5, x ** 2.5),
                       xs.astype(dt))


def test_pow_signed_zero_and_infinite_base():
    # Signs that a comparison with 0 misses: (-0)**-1 = -inf, (-0)**3 = -0, (-inf)**0.5 = inf.
    x = fg.tensor([-0.0, -0.0, -math.inf, -math.inf, -1.0, -1.0])
    y = fg.tensor([-1.0, 3.0, 0.5, -2.5, math.inf, -math.inf])
    got = fg.compile(lambda a, b: bind(P.pow_, a, b))(x, y).numpy()
    want = np.array([-math.inf, -0.0, math.inf, 0.0, 1.0, 1.0], np.float32)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_float_floordiv_matches_python_rounding():
    # 1 // 0.1 is 9 (the remainder is 0.1 - epsilon), where floor(1 / 0.1) would be 10.
    x = np.array([1.0, -1.0, 7.0, -7.0, 0.0, -0.0, math.inf, 5.0], np.float64)
    y = np.array([0.1, 0.1, -2.0, 2.0, -3.0, 3.0, 2.0, 0.0], np.float64)
    compiled = check_compiled(lambda a, b: bind(P.floordiv, a, b), x, y)
    np.testing.assert_array_equal(compiled(*tensors(x, y)).numpy()[:2], [9.0, -10.0])


# --------------------------------------------------------------------------- reductions


def reductions(prim):
    def f(t, s, z):
        r = lambda x, axes: bind(prim, x, axes=axes)  # noqa: E731
        return (r(t, (0,)), r(t, (1,)), r(s, (0, 1)), r(t, ()), r(z, ()), r(s.t(), (1,)),
                r(bind(P.reshape, t[:2], shape=(2, 1, 33)), (0, 2)))
    return f


def arg_reductions(prim):
    def f(t, s, z):
        r = lambda x, axis: bind(prim, x, axis=axis)  # noqa: E731
        return r(t, 0), r(t, 1), r(s.t(), 1), r(z, 0)
    return f


@pytest.mark.slow
@pytest.mark.parametrize("dtype", FLOATS + INTS + (B,), ids=str)
def test_reduce_primitives(dtype):
    cases = {n: reductions(PRIMITIVES[n]) for n in ("sum", "prod", "max", "min")}
    cases.update({n: arg_reductions(PRIMITIVES[n]) for n in ("argmax", "argmin")})
    check_primitives(dtype, cases, *layouts(dtype))


# --------------------------------------------------------------------------- movement

MOVEMENT_DTYPES = (fg.float32, fg.float16, fg.bfloat16, fg.int64, B)


def movement(op):
    """``op`` on a passed-in strided input, on a view inside the function, and on a
    computed value (which the view reads from memory or fuses into)."""
    def f(t, s):
        computed = bind(P.logical_not, s) if s.dtype is B else bind(P.neg, s)
        return op(t), op(computed), bind(P.copy, op(computed))
    return f


MOVEMENT_OPS = {
    "reshape": lambda x: bind(P.reshape, x, shape=(3, 1, 33)),
    "permute": lambda x: bind(P.permute, bind(P.reshape, x, shape=(3, 1, 33)), perm=(2, 0, 1)),
    "broadcast_to": lambda x: bind(P.broadcast_to, bind(P.reshape, x, shape=(3, 1, 33)),
                                   shape=(2, 3, 4, 33)),
    "slice": lambda x: bind(P.slice_, x, starts=(1, 2), stops=(3, 33), steps=(1, 3)),
    "pad": lambda x: bind(P.pad, x, widths=((1, 2), (0, 3)), value=1),
    "concat": lambda x: bind(P.concat, x, bind(P.slice_, x, starts=(0, 1), stops=(3, 3),
                                                steps=(1, 1)), x, axis=1),
}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", MOVEMENT_DTYPES, ids=str)
def test_movement_primitives(dtype):
    t, s, _ = layouts(dtype)
    check_primitives(dtype, {name: movement(op) for name, op in MOVEMENT_OPS.items()}, t, s)


def test_reshape_that_needs_a_copy():
    # A transposed value flattened: no strides express it, so the view chain ends in a copy.
    def f(x):
        y = bind(P.reshape, bind(P.permute, x, perm=(1, 0)), shape=(30,))
        return (y, bind(P.reshape, y, shape=(3, 10)) * 2.0,
                bind(P.reshape, x.t() + 1.0, shape=(5, 6)))
    check_compiled(f, values((6, 5), fg.float32))


def test_pad_and_concat_of_empty_operands():
    check_compiled(lambda x: (bind(P.pad, x[:, :0], widths=((1, 1), (2, 0)), value=3.0),
                              bind(P.concat, x[:0], x, x[:0], axis=0) * 2.0,
                              bind(P.concat, x[:0], x[:0], axis=0)),
                   values((4, 3), fg.float32))


# --------------------------------------------------------------------------- index, matmul


INDEX_DTYPES = (fg.float32, fg.float16, fg.int64)


@pytest.mark.parametrize("dtype", INDEX_DTYPES, ids=str)
def test_index_primitives(dtype):
    x, xt = values((5, 4), dtype), strided(values((5, 4), dtype, 1), "T")
    idx = np.array([0, 4, 2, 2, -1], np.int64)
    gidx = np.array([[0, 1, 2, 3], [4, 4, 0, 1]], np.int64)
    src, gsrc = values((5, 4), dtype, 2), values((2, 4), dtype, 3)
    cases = {
        "take": lambda x, xt, i, g, s, gs: (bind(P.take, x, i, axis=0),
                                            bind(P.take, xt * xt, i[:3] % 4, axis=1)),
        "index_add": lambda x, xt, i, g, s, gs: (bind(P.index_add, x, i, s, axis=0),
                                                 bind(P.index_add, xt.t(), i[:4] % 4, s.t()[:, :4],
                                                      axis=1) + xt.t()),
        "gather": lambda x, xt, i, g, s, gs: (bind(P.gather, x, g, axis=0),
                                              bind(P.gather, xt + x, g.t() % 4, axis=1)),
        "scatter_add": lambda x, xt, i, g, s, gs: (bind(P.scatter_add, x, g, gs, axis=0),
                                                   bind(P.scatter_add, xt, g, gs * gs, axis=0)),
    }
    check_primitives(dtype, cases, x, xt, idx, gidx, src, gsrc)


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
def test_matmul_primitive(dtype):
    a, b = values((3, 5), dtype, 0, special=False), values((5, 4), dtype, 1, special=False)
    at, bt = strided(a, "T"), strided(b, "T")
    batch, bias = values((2, 3, 5), dtype, 2, special=False), values((4,), dtype, 3)

    def f(a, b, at, bt, batch, bias):
        mm = lambda x, y: bind(P.matmul, x, y)  # noqa: E731
        return (mm(a, b), mm(at, bt), mm(a.t().t(), bt.t().t()), mm(batch, b),
                mm(a + a, b) * bias + bias, mm(b.t(), a.t()), mm(bind(P.neg, a), b)[1:])
    check_primitive("matmul", dtype, f, a, b, at, bt, batch, bias)


def test_matmul_nan_and_inf():
    a = values((4, 6), fg.float32)
    check_compiled(lambda x, y: bind(P.matmul, x, y), a, a.T.copy())


# --------------------------------------------------------------------------- sources, extern


@pytest.mark.parametrize("dtype", (fg.float32, fg.float16, fg.bfloat16, fg.int64, B), ids=str)
def test_source_primitives(dtype):
    x = values((3, 4), dtype)
    const = fg.from_numpy(values((3, 4), dtype, 9))
    cases = {
        "full": lambda x: (bind(P.full, shape=(3, 4), value=1, dtype=dtype),
                           bind(P.maximum, bind(P.full, shape=(3, 4), value=0, dtype=dtype), x)),
        "iota": lambda x: (bind(P.iota, shape=(3, 4), axis=1, dtype=dtype),
                           bind(P.eq, bind(P.iota, shape=(3, 4), axis=0, dtype=dtype), x)),
        "constant": lambda x: (bind(P.eq, x, const), const),
    }
    if dtype is B:      # numpy's arange makes no bool ramps longer than 2
        del cases["iota"]
    check_primitives(dtype, cases, x)


def test_random_uniform_primitive():
    key = np.array([7, 3], np.int64)
    check_primitive("random_uniform", fg.float32, lambda k: (
        bind(P.random_uniform, k, shape=(3, 4), dtype=fg.float32),
        bind(P.random_uniform, k, shape=(5,), dtype=fg.float64) * 2.0), key)


@pytest.mark.parametrize("dtype", (fg.float32, fg.int64, fg.bfloat16), ids=str)
def test_extern_primitives(dtype):
    t, s, z = layouts(dtype)
    check_primitives(dtype, {
        "argsort": lambda t, s, z: (bind(P.argsort, t, axis=1, descending=True),
                                    bind(P.argsort, s.t() * s.t(), axis=0, descending=False),
                                    bind(P.argsort, z, axis=0, descending=False)),
        "cumsum": lambda t, s, z: (bind(P.cumsum, t, axis=0),
                                   bind(P.cumsum, s.t() + s.t(), axis=1) * 2,
                                   bind(P.cumsum, z, axis=0))}, t, s, z)


def test_check_target_primitive():
    t = np.array([0, 4, -100, 2], np.int64)
    check_primitive("check_target", fg.int64, lambda t: bind(
        P.check_target, t, op="nll_loss", classes=5, ignore_index=-100, input="f32[4, 5]") * 2, t)
    f = fg.compile(lambda t: bind(P.check_target, t, op="nll_loss", classes=4,
                                  ignore_index=-100, input="f32[4, 4]") + 1)
    f(fg.from_numpy(t % 4))
    with pytest.raises(IndexError, match=r"^Target 4 is out of bounds\. \(nll_loss: input f32"):
        f(fg.from_numpy(t))


def test_check_index_primitive():
    """index_select, embedding, index_add, gather and scatter_add do not wrap negative
    indices (torch raises); the check runs when the compiled program reads the index."""
    t = np.array([0, 3, 1], np.int64)
    check_primitive("check_index", fg.int64,
                    lambda t: bind(P.check_index, t, op="gather", size=4, dim=1,
                                     wrap=False) * 2, t)
    emb = fg.nn.Embedding(4, 3)
    f = fg.compile(lambda i: emb(i) * 2)
    np.testing.assert_allclose(f(fg.from_numpy(t)).detach().numpy(),
                               emb.weight.detach().numpy()[t] * 2)
    with pytest.raises(IndexError, match=r"^embedding: index -1 is out of bounds for "
                                         r"dimension 0 with size 4"):
        f(fg.from_numpy(np.array([0, -1, 2])))
    x = fg.randn(4, 5)
    for name, call in [("index_select", lambda i: x.index_select(0, i)),
                       ("index_add", lambda i: x.index_add(0, i, fg.ones(3, 5))),
                       ("gather", lambda i: x.gather(0, i.reshape(3, 1))),
                       ("scatter_add", lambda i: x.scatter_add(0, i.reshape(3, 1), fg.ones(3, 1))),
                       ("embedding", lambda i: fg.nn.functional.embedding(i, x))]:
        for bad in (-1, 4):
            with pytest.raises(IndexError, match=rf"^{name}: index {bad} is out of bounds"):
                call(fg.tensor([0, bad, 1]))
    assert x[fg.tensor([-1])].shape == (1, 5)          # indexing still wraps, as in torch


def test_window_primitives_in_a_graph_run_their_numpy_reference():
    # The windows/overlap_add primitives reach a graph only when bound on traced tensors by
    # hand (conv and pooling trace their slice compositions): they run as numpy steps.
    from fusegrad.ops import windows as W
    x = values((2, 3, 5, 6), fg.float32, 0)
    b = values((2, 3, 4, 2, 2), fg.float32, 1)
    geometry = {"kernel": (2, 2), "stride": (2, 1), "dilation": (1, 2)}
    check_primitives(fg.float32, {
        "windows": lambda x, b: bind(W.windows_prim, x, positions=(2, 2), **geometry),
        "overlap_add": lambda x, b: bind(W.overlap_add_prim, b, padded=(5, 6), **geometry)},
        x, b, in_numpy=("windows", "overlap_add"))


def test_every_primitive_has_a_compiled_test():
    from tests.compiler.test_compile_extern_ops import EXTERN_PRIMITIVES
    tested = set(UNARY_FLOAT + UNARY_ANY) | set(BINARY_DTYPES) | set(MOVEMENT_OPS) | {
        "not", "cast", "where", "sum", "prod", "max", "min", "argmax", "argmin", "take",
        "index_add", "gather", "scatter_add", "matmul", "full", "iota", "constant",
        "random_uniform", "argsort", "cumsum", "check_target", "check_index", "atan2", "bitcast",
        "scatter_reduce", "windows", "overlap_add", *INVERSE_TRIG,
        # fusegrad.distributed's collectives: tests/distributed/test_distributed.py
        "allreduce_start", "allreduce_wait",
        # composites' own VJPs: tests/compiler/test_custom_vjp.py
        "custom_vjp",
        # the attention fusion's primitives: tests/compiler/test_fused_attention.py
        "fused_attention", "fused_attention_backward",
        # decompositions, special functions, mode: tests/compiler/test_compile_extern_ops.py
        *EXTERN_PRIMITIVES,
        # complex numbers and FFTs, compiled: tests/test_complex.py, tests/test_fft.py
        "real", "imag", "complex", "conj", "view_as_real", "view_as_complex", "fft_c2c",
        "fft_r2c", "fft_c2r"}
    assert sorted(set(PRIMITIVES) - tested) == []


# --------------------------------------------------------------------------- public ops
#
# Composite ops (fusegrad.ops.functional, fusegrad.nn.functional), grouped by the dtypes
# they accept. Each entry maps a name to a function of the arguments of ``op_args``:
#   x, y  float (3, 33) arrays with NaN/Inf/-0.0, passed in transposed and sliced
#   p     positive (3, 33) values, no specials (logs, roots, normalizations)
#   row   (33,) values, for broadcasting;  z  a 0-d value
#   ix    int64 class indices (3,);  m  a bool (3, 33) mask

OP_SHAPE = (3, 33)


def op_args(dtype) -> tuple:
    return (strided(values(OP_SHAPE, dtype, 10), "T"),
            strided(values(OP_SHAPE, dtype, 11), "slice"),
            values(OP_SHAPE, dtype, 12, special=False, low=0.25) if dtype.is_floating_point
            else values(OP_SHAPE, dtype, 12, low=1),
            values(OP_SHAPE[-1:], dtype, 13), values((), dtype, 14),
            np.array([0, 32, 7], np.int64), values(OP_SHAPE, B, 15))


F = fg  # the functional namespace: fusegrad.exp, fusegrad.sum, ...

ELEMENTWISE_ANY = {        # float and integer inputs
    "add": lambda x, y, p, row, z, ix, m: (F.add(x, y), F.add(x, row, alpha=2), x + 3, 2 + z),
    "sub": lambda x, y, p, row, z, ix, m: (F.sub(x, y, alpha=3), row - x, x - 1),
    "rsub": lambda x, y, p, row, z, ix, m: F._F.rsub(x, 2),
    "mul": lambda x, y, p, row, z, ix, m: (x * y, x * z, 3 * row),
    "div": lambda x, y, p, row, z, ix, m: (x / p, F.div(x, p, rounding_mode="floor"),
                                           F.div(x, p, rounding_mode="trunc"), x / 2),
    "floor_divide": lambda x, y, p, row, z, ix, m: (F.floor_divide(x, p), x // 3),
    "remainder": lambda x, y, p, row, z, ix, m: (F.remainder(x, p), x % 3, F.remainder(x, -2)),
    "fmod": lambda x, y, p, row, z, ix, m: (F.fmod(x, p), F.fmod(x, -3)),
    "pow": lambda x, y, p, row, z, ix, m: (x ** 2, x ** 3, p ** p if p.dtype.is_floating_point
                                           else p ** 2, 2 ** p),
    "maximum": lambda x, y, p, row, z, ix, m: (F.maximum(x, y), F.minimum(x, row)),
    "compare": lambda x, y, p, row, z, ix, m: (x > y, x >= row, x < 0, x <= z, x == y, x != 1,
                                               F.eq(x, x), F.ne(x, x)),
    "logical": lambda x, y, p, row, z, ix, m: (F.logical_and(x, m), F.logical_or(x, y),
                                               F.logical_xor(x, 0), F.logical_not(x)),
    "where": lambda x, y, p, row, z, ix, m: (F.where(m, x, y), F.where(x > 0, x, 0),
                                             F.where(m, 1, row)),
    "neg_abs_sign": lambda x, y, p, row, z, ix, m: (-x, F.abs(x), F.sign(x), F.square(x)),
    "clamp": lambda x, y, p, row, z, ix, m: (F.clamp(x, -1, 2), F.clamp(x, min=0),
                                             F.clamp(x, max=row), F.clip(x, y, p)),
    "float_of_int": lambda x, y, p, row, z, ix, m: (F.exp(p * 0), F.sqrt(p), F.sigmoid(p)),
    "round_family": lambda x, y, p, row, z, ix, m: (F.floor(x), F.ceil(x), F.trunc(x),
                                                    F.round(x)),
    "is": lambda x, y, p, row, z, ix, m: (F.isnan(x), F.isinf(x), F.isfinite(x),
                                          F.isclose(x, y), F.isclose(x, x, equal_nan=True)),
    "copy": lambda x, y, p, row, z, ix, m: (F.clone(x), x.to(fg.float32), p.to(fg.int64),
                                            x.type_as(p), x.contiguous(), x.to(fg.bool)),
    "masked_fill": lambda x, y, p, row, z, ix, m: (x.masked_fill(m, 5), x.masked_fill(m[0], z)),
    "tri": lambda x, y, p, row, z, ix, m: (F.tril(x), F.triu(x, 1), F.tril(x, -1)),
}
ELEMENTWISE_FLOAT = {
    "exp_log": lambda x, y, p, row, z, ix, m: (F.exp(x), F.exp2(x), F.expm1(x), F.log(x),
                                               F.log2(p), F.log10(p), F.log1p(x)),
    "trig": lambda x, y, p, row, z, ix, m: (F.sin(x), F.cos(x), F.tan(x), F.tanh(x),
                                            F.sigmoid(x), F.erf(x)),
    "roots": lambda x, y, p, row, z, ix, m: (F.sqrt(x), F.rsqrt(p), F.reciprocal(x),
                                             F.pow(p, 0.5), F.pow(x, -1)),
    "round_decimals": lambda x, y, p, row, z, ix, m: F.round(x, decimals=2),
    "activations": lambda x, y, p, row, z, ix, m: (
        NF.relu(x), NF.gelu(x), NF.gelu(x, approximate="tanh"), NF.silu(x), NF.softplus(x),
        NF.softplus(x, beta=2.0, threshold=5.0), NF.leaky_relu(x), NF.leaky_relu(x, 0.2),
        NF.sigmoid(x), NF.tanh(x), F.relu(z)),
}
REDUCTIONS_ANY = {
    "sum": lambda x, y, p, row, z, ix, m: (F.sum(x), F.sum(x, 1), F.sum(x, 0, keepdim=True),
                                           F.sum(z), F.sum(m, 1), x.sum_to_size(1, 33)),
    "prod": lambda x, y, p, row, z, ix, m: (F.prod(p, 1), F.prod(p), F.prod(x, 0, keepdim=True)),
    "max_min": lambda x, y, p, row, z, ix, m: (F.max(x), F.amax(x, 1), F.amin(x, 0),
                                               F.max(x, y), tuple(F.max(x, 1)),
                                               tuple(F.min(x, 0, True))),
    "arg": lambda x, y, p, row, z, ix, m: (F.argmax(x), F.argmax(x, 1), F.argmin(x, 0, True)),
    "all_any": lambda x, y, p, row, z, ix, m: (F.all(x), F.any(x, 1), F.all(m, 0),
                                               F.count_nonzero(x), F.count_nonzero(x, 1)),
    "cumsum": lambda x, y, p, row, z, ix, m: (F.cumsum(x, 1), F.cumsum(x, 0)),
    "sort": lambda x, y, p, row, z, ix, m: (tuple(F.sort(x)), tuple(F.sort(x, 0, True)),
                                            F.argsort(x, 1), tuple(F.topk(x, 4)),
                                            tuple(F.topk(x, 2, 0, largest=False))),
}
REDUCTIONS_FLOAT = {
    "mean_var": lambda x, y, p, row, z, ix, m: (
        F.mean(p, 1), F.var(p, 1), F.var(p, 0, unbiased=False), F.std(p, correction=0),
        tuple(F.var_mean(p, 1)), tuple(F.std_mean(p, 0))),
    "logsumexp": lambda x, y, p, row, z, ix, m: (F.logsumexp(x, 1), F.logsumexp(p, (0, 1))),
    "norm": lambda x, y, p, row, z, ix, m: (F.norm(p), F.norm(x, 1, 1), F.norm(p, float("inf")),
                                            F.norm(p, 0, 1), F.norm(p, 3, 1)),
    "softmax": lambda x, y, p, row, z, ix, m: (NF.softmax(x, -1), NF.softmax(p, 0),
                                               NF.log_softmax(x, 1), NF.log_softmax(p, 0)),
    "layer_norm": lambda x, y, p, row, z, ix, m: (
        NF.layer_norm(p, (33,), row, row), NF.layer_norm(x, (33,)),
        NF.layer_norm(p, (3, 33), eps=1e-3), NF.normalize(p)),
}
MOVEMENT_ANY = {
    "views": lambda x, y, p, row, z, ix, m: (
        x.reshape(9, 11), p.view(33, 3), x.permute(1, 0), x.transpose(0, 1), x.t(),
        F.movedim(x.reshape(3, 3, 11), 0, 2), x.unsqueeze(1).squeeze(), x.flatten(),
        x.reshape(3, 3, 11).flatten(1), x.unflatten(1, (3, 11)), x.narrow(1, 2, 5),
        x.select(0, 1), x.expand(2, 3, 33), F.broadcast_to(row, (3, 33)),
        F.broadcast_tensors(x, row)),
    "getitem": lambda x, y, p, row, z, ix, m: (
        x[1], x[:, 3], x[..., ::4], x[None, 1:, 2:9:3], x[-1, -5:], x[:, None, :2],
        x[ix[:2] % 3], x[:, ix], x[ix % 3, ix], x[(ix % 3)[None]]),
    "split": lambda x, y, p, row, z, ix, m: (x.split(10, 1), x.split([1, 2], 0), x.chunk(4, 1),
                                             x.unbind(0)),
    "join": lambda x, y, p, row, z, ix, m: (F.cat([x, y], 0), F.cat([x, y, p], 1),
                                            F.stack([x, y]), F.stack([x, y], 2),
                                            F.hstack([x, y]), F.vstack([x, row])),
    "tile": lambda x, y, p, row, z, ix, m: (x.repeat(2, 1), row.repeat(2, 2), F.flip(x, 1),
                                            F.flip(x, (0, 1)), F.roll(x, 2, 1), F.roll(x, -1)),
    "index": lambda x, y, p, row, z, ix, m: (
        F.index_select(x, 1, ix), F.index_add(x, 1, ix, y[:, :3]), F.gather(x, 1, ix[None] % 3),
        F.take_along_dim(x, ix[:, None], 1), F.scatter_add(x, 1, ix[:, None], y[:, :1])),
}
MATMUL_OPS = {
    "matmul": lambda x, y, p, row, z, ix, m: (
        x @ y.t(), F.matmul(row, y.t()), F.matmul(x, row), F.mm(x.t(), y), F.dot(row, row),
        F.mv(x, row), F.outer(row, row[:5]), F.bmm(x.reshape(3, 3, 11), y.reshape(3, 11, 3)),
        F.matmul(x.reshape(3, 1, 3, 11), y.reshape(3, 11, 3))),
}
NN_FLOAT = {
    "linear": lambda x, y, p, row, z, ix, m: (
        NF.linear(x, y), NF.linear(x, y, row[:3]), NF.linear(row, y), NF.linear(x.reshape(3, 3, 11),
                                                                                y[:, :11])),
    "losses": lambda x, y, p, row, z, ix, m: (
        NF.mse_loss(x, y), NF.mse_loss(p, y, reduction="sum"), NF.mse_loss(p, y, reduction="none"),
        NF.l1_loss(p, y), NF.l1_loss(x, p, reduction="none")),
    "cross_entropy": lambda x, y, p, row, z, ix, m: (
        NF.cross_entropy(p, ix), NF.cross_entropy(p, ix, weight=row.abs() + 1, ignore_index=7),
        NF.cross_entropy(p, ix, label_smoothing=0.1, reduction="none"),
        NF.cross_entropy(p, NF.softmax(y, 1), reduction="sum"),
        NF.cross_entropy(x, ix, reduction="none"), NF.nll_loss(p, ix, reduction="none")),
    "bce": lambda x, y, p, row, z, ix, m: (
        NF.binary_cross_entropy(NF.sigmoid(p), NF.sigmoid(y)),
        NF.binary_cross_entropy(NF.sigmoid(p), m.to(p.dtype), reduction="none"),
        NF.binary_cross_entropy_with_logits(x, NF.sigmoid(y)),
        NF.binary_cross_entropy_with_logits(p, m.to(p.dtype), pos_weight=row.abs(),
                                            reduction="sum")),
    "layers": lambda x, y, p, row, z, ix, m: (
        NF.embedding(ix, p.t()), NF.embedding(ix, p.t(), padding_idx=7), NF.one_hot(ix, 40),
        NF.pad(x, (1, 2)), NF.pad(x, (0, 1, 2, 0), value=-1.0), NF.pad(x, (-1, 1)),
        NF.dropout(x, 0.5, training=False), NF.dropout(x, 0.0)),
}

OP_GROUPS = {
    "elementwise": (ELEMENTWISE_ANY, ELEMENTWISE_FLOAT),
    "reductions": (REDUCTIONS_ANY, REDUCTIONS_FLOAT),
    "movement": (MOVEMENT_ANY, {}),
    "nn": (MATMUL_OPS, NN_FLOAT),
}
# Which dtypes each group runs in. Movement and the nn layers run the same code for every
# dtype of a width, so float64 and int32 leave them to float32 and int64, and float64
# reductions are the primitive tests' and test_compile_autograd's (all float64): an LLVM
# module per (group, dtype) is the cost of this file.
F16S = (fg.float16, fg.bfloat16)
GROUP_DTYPES = {
    "elementwise": (fg.float32, fg.float64) + F16S + INTS + (B,),
    "reductions": (fg.float32,) + F16S + INTS + (B,),
    "movement": (fg.float32,) + F16S + (fg.int64, B),
    "nn": (fg.float32,) + F16S + (fg.int64,),
}
# Per dtype: integer inputs skip the float-only ops, and bool keeps to the ops that take it.
BOOL_OPS = {"compare", "logical", "where", "copy", "masked_fill", "tri", "all_any", "sum",
            "max_min", "arg", "views", "getitem", "split", "join", "tile"}
# Eager 16-bit ops round after every op; compiled kernels compute in float32 and round once.
# Chains (normalizations, losses) therefore differ by a few 16-bit ulps of their operands, and
# where a chain rounds to an integer (fmod's trunc(a / b)) or divides by a difference of
# nearly equal values (layer_norm in bfloat16), by more: those are left out, as are the
# losses and norms, whose 16-bit code is their float32 code plus the conversions tested here.
CHAIN_TOL = {fg.float16: (1e-2, 1e-2), fg.bfloat16: (6e-2, 6e-2)}
LEFT_OUT = {fg.float16: {"fmod", "mean_var", "norm", "losses", "cross_entropy", "bce"},
            fg.bfloat16: {"fmod", "layer_norm", "mean_var", "norm", "losses", "cross_entropy",
                          "bce"}}
OP_CASES = [(g, d) for g, ds in GROUP_DTYPES.items() for d in ds]


@pytest.mark.slow
@pytest.mark.parametrize("group,dtype", OP_CASES, ids=[f"{g}-{d}" for g, d in OP_CASES])
def test_public_ops(group, dtype):
    any_ops, float_ops = OP_GROUPS[group]
    cases = dict(any_ops, **(float_ops if dtype.is_floating_point else {}))
    if not dtype.is_floating_point:
        cases.pop("round_family", None)
    if dtype is B:
        cases = {k: v for k, v in cases.items() if k in BOOL_OPS}
    for name in LEFT_OUT.get(dtype, ()):
        cases.pop(name, None)
    rtol, atol = CHAIN_TOL.get(dtype, (None, None))
    check_compiled(lambda *a: {name: fn(*a) for name, fn in cases.items()}, *op_args(dtype),
                   rtol=rtol, atol=atol)


# --------------------------------------------------------------------------- 16-bit floats


def test_float16_conversions_are_exact():
    # Every half to float; floats to half through every rounding case: just above, below
    # and halfway between halves, subnormals, overflow to inf, NaN.
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    check_compiled(lambda h: h.to(fg.float32), halves, rtol=0, atol=0)
    wide = halves.astype(np.float32)
    finite = wide[np.isfinite(wide)]
    with np.errstate(all="ignore"):
        floats = np.concatenate([
            wide, np.nextafter(finite, np.float32(np.inf)),
            np.nextafter(finite, np.float32(-np.inf)),
            ((halves[:-1].astype(np.float64) + halves[1:].astype(np.float64)) / 2)
            .astype(np.float32),
            np.array([65504, 65519.99, 65520, 1e-8, 2.98e-8, 5.97e-8, 1e30, -0.0], np.float32)])
        floats = floats[~np.isnan(floats)]
        want = floats.astype(np.float16)
    compiled = fg.compile(lambda x: x.to(fg.float16))(fg.from_numpy(floats)).numpy()
    np.testing.assert_array_equal(compiled.view(np.uint16), want.view(np.uint16))


def test_casts_to_16_bit_round_inside_fused_kernels():
    # x.to(float16) in a kernel rounds (it is not a float32 no-op), and float64 goes to
    # float16 in one rounding, as numpy converts (1 + 2**-11 + 2**-40 is above halfway).
    x = np.array([1 + 2 ** -12, 0.1, 1e-6, 7e4, -(1 + 2 ** -11 + 2 ** -40)], np.float64)
    check_compiled(lambda x: (x.to(fg.float16).to(fg.float64) - x,
                              x.to(fg.bfloat16).to(fg.float64) - x,
                              x.float().to(fg.float16).float() - x.float(), x.to(fg.float16)),
                   x, rtol=0, atol=0)


# --------------------------------------------------------------------------- generated code


@pytest.mark.parametrize("shapes,dtype,rolled", [
    (((300, 5, 6), (300, 1, 6)), fg.bool, True),       # a 30-element body of bytes
    (((300, 5, 6), (1, 5, 6)), fg.bool, True),
    (((300, 2, 6), (300, 1, 6)), fg.bool, False),      # 12 elements: unrolled
    (((300, 5, 6), (300, 1, 6)), fg.float32, False),   # 16 lanes: compiles fast unrolled
])
def test_short_inner_loops_over_bytes_stay_rolled(shapes, dtype, rolled):
    # Fuzzer finding 6: unrolled, the 5x6 body of a bool `a & b` made LLVM vectorize the
    # loop around it 64 lanes wide, 7 to 14 s of compile (see cpu_lowering's _wide_byte_body).
    a, b = (fg.ones(*s, dtype=dtype) for s in shapes)
    op = (lambda a, b: a & b) if dtype is fg.bool else (lambda a, b: a * b)
    compiled = fg.compile(op)
    assert ('"llvm.loop.unroll.disable"' in compiled.lower(a, b).llvm_ir) == rolled
    rng = np.random.default_rng(0)
    x, y = (rng.random(s) > 0.5 for s in shapes)
    if dtype is fg.bool:
        np.testing.assert_array_equal(compiled(fg.from_numpy(x), fg.from_numpy(y)).numpy(), x & y)


def test_float16_is_held_as_16_raw_bits():
    # LLVM 22 takes tens of seconds over `half` loads in some loops (a 3x40 negation: 30 s).
    ir_text = fg.compile(lambda x: -x).lower(fg.ones(3, 40, dtype=fg.float16)).llvm_ir
    assert "half" not in ir_text


@pytest.mark.parametrize("extent,rolled", [(7, False), (8, True), (33, True), (64, True),
                                           (65, False)])
def test_mid_sized_inner_loops_stay_rolled(extent, rolled):
    # Unrolled, a loop of 8 to 64 makes LLVM vectorize the loop around it with interleaved
    # accesses, which takes seconds to compile (see cpu_lowering's nest). The rows are a
    # slice, so the two axes do not loop as one.
    ir_text = fg.compile(lambda x: x[:, :-1].sign()).lower(fg.ones(3, extent + 1)).llvm_ir
    assert ('"llvm.loop.unroll.disable"' in ir_text) == rolled
