"""Every hand-built graph the IR tests use, each with example inputs and a numpy reference.

A case builds a fresh graph on each call (tests mutate graphs to break them). Together the
cases apply every primitive in ``PRIMITIVES`` with its attributes; ``test_ir_zoo.py`` walks
all of them through verify, print/parse round trips, hashing and the interpreter, so a graph
added here is checked by every tool at once.

The references are written with numpy directly, not with the primitives' ``impl``, so the
interpreter is compared against an independent computation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import ml_dtypes
import numpy as np

from fusegrad import dtypes as D
from fusegrad.ir import Graph, Literal, TensorType, Value
from fusegrad.ops import philox
from fusegrad.ops.primitive import ConstantData


@dataclass
class Case:
    """A graph, inputs for it, and the outputs numpy computes for those inputs."""

    graph: Graph
    args: tuple[np.ndarray, ...]
    expected: Callable[..., list[np.ndarray]] | None = None


CASES: dict[str, Callable[[], Case]] = {}


def case(fn: Callable[[], Case]) -> Callable[[], Case]:
    """Register a case builder under its function name."""
    CASES[fn.__name__] = fn
    return fn


def T(*shape: int, dtype: D.DType = D.float32) -> TensorType:
    return TensorType(tuple(shape), dtype)


def rand(*shape: int, seed: int = 0, dtype=np.float32, low: float = -2.0,
         high: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(dtype)


def f32(v: float) -> Literal:
    return Literal(float(v), D.float32)


def one_node(name: str, op: str, in_types: list[TensorType], args: tuple, expected,
             attrs: dict | None = None, literals: dict[int, Literal] | None = None) -> Case:
    """A graph applying ``op`` once to its inputs (with ``literals`` spliced in at positions)."""
    g = Graph(name)
    operands: list = [g.add_input(f"x{i}", t) for i, t in enumerate(in_types)]
    for pos, lit in sorted((literals or {}).items()):
        operands.insert(pos, lit)
    g.set_outputs([g.add_node(op, operands, attrs)])
    return Case(g, args, expected)


# --------------------------------------------------------------------------- elementwise

_erf = np.vectorize(math.erf, otypes=[np.float64])

UNARY_FLOAT = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "log1p": np.log1p,
    "expm1": np.expm1, "sin": np.sin, "cos": np.cos, "tanh": np.tanh, "tan": np.tan,
    "exp2": np.exp2, "log2": np.log2, "log10": np.log10,
    "erf": lambda x: _erf(x).astype(x.dtype), "sqrt": np.sqrt,
    "reciprocal": lambda x: (1 / x).astype(x.dtype), "sign": np.sign, "floor": np.floor,
    "ceil": np.ceil, "round": np.round, "copy": lambda x: x.copy(), "stop_gradient": lambda x: x,
}


def _unary_case(op: str) -> Callable[[], Case]:
    def build() -> Case:
        x = rand(2, 3, low=0.1, high=3.0, seed=1)
        return one_node(op, op, [T(2, 3)], (x,), lambda x: [UNARY_FLOAT[op](x)])
    build.__name__ = f"unary_{op}"
    return build


for _op in UNARY_FLOAT:
    case(_unary_case(_op))


@case
def unary_not() -> Case:
    x = np.array([[True, False, True]])
    return one_node("not_", "not", [T(1, 3, dtype=D.bool_)], (x,), lambda x: [~x])


@case
def unary_cast() -> Case:
    g = Graph("casts")
    x = g.add_input("x", T(2, 3))
    outs = [g.add_node("cast", [x], {"dtype": dt}) for dt in (D.int32, D.bfloat16, D.bool_, D.float64)]
    g.set_outputs(outs)
    return Case(g, (rand(2, 3, seed=2) * 3,), lambda x: [
        x.astype(np.int32), x.astype(ml_dtypes.bfloat16), x != 0, x.astype(np.float64)])


BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum, "floordiv": np.floor_divide,
    "remainder": np.remainder, "fmod": np.fmod, "lt": np.less, "le": np.less_equal, "eq": np.equal,
    "ne": np.not_equal,
}


def _binary_case(op: str) -> Callable[[], Case]:
    def build() -> Case:
        # [2,3] with [3]: exercises broadcasting; a positive base keeps pow finite.
        x, y = rand(2, 3, seed=3, low=0.5, high=2.0), rand(3, seed=4, low=0.5, high=2.0)
        y[1] = x[0, 1]      # one tie, for eq/le/maximum
        return one_node(op, op, [T(2, 3), T(3)], (x, y), lambda x, y: [BINARY[op](x, y)])
    build.__name__ = f"binary_{op}"
    return build


for _op in BINARY:
    case(_binary_case(_op))


@case
def binary_and_or() -> Case:
    g = Graph("logic")
    a = g.add_input("a", T(4, dtype=D.bool_))
    b = g.add_input("b", T(4, dtype=D.bool_))
    g.set_outputs([g.add_node("and", [a, b]), g.add_node("or", [a, Literal(False, D.bool_)])])
    a_, b_ = np.array([True, True, False, False]), np.array([True, False, True, False])
    return Case(g, (a_, b_), lambda a, b: [a & b, a.copy()])


@case
def where_with_literals() -> Case:
    g = Graph("where")
    c = g.add_input("c", T(2, 3, dtype=D.bool_))
    x = g.add_input("x", T(3))
    w1 = g.add_node("where", [c, x, f32(0.0)])
    w2 = g.add_node("where", [c, f32(1.0), f32(-2.5)])     # no value operand: annotated
    g.set_outputs([w1, w2])
    c_ = np.array([[True, False, True], [False, False, True]])
    x_ = rand(3, seed=5)
    return Case(g, (c_, x_), lambda c, x: [np.where(c, x, np.float32(0)),
                                           np.where(c, np.float32(1), np.float32(-2.5))])


# --------------------------------------------------------------------------- reductions


def _reduce_case(op: str, fn) -> Callable[[], Case]:
    def build() -> Case:
        return one_node(op, op, [T(2, 3, 4)], (rand(2, 3, 4, seed=6),),
                        lambda x: [fn(x, axis=(0, 2))], attrs={"axes": (0, 2)})
    build.__name__ = f"reduce_{op}"
    return build


for _op, _fn in {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}.items():
    case(_reduce_case(_op, _fn))


@case
def reduce_all_and_none() -> Case:
    g = Graph("reduce_axes")
    x = g.add_input("x", T(2, 3))
    b = g.add_input("b", T(2, 3, dtype=D.bool_))
    everything = g.add_node("sum", [x], {"axes": (0, 1)})
    nothing = g.add_node("max", [x], {"axes": ()})
    count = g.add_node("sum", [b], {"axes": (1,)})         # bool sums to i64
    g.set_outputs([everything, nothing, count])
    b_ = np.array([[True, False, True], [True, True, True]])
    return Case(g, (rand(2, 3, seed=7), b_),
                lambda x, b: [x.sum(), x.copy(), b.sum(axis=1).astype(np.int64)])


@case
def reduce_arg() -> Case:
    g = Graph("arg")
    x = g.add_input("x", T(3, 4))
    g.set_outputs([g.add_node("argmax", [x], {"axis": 1}), g.add_node("argmin", [x], {"axis": 0})])
    return Case(g, (rand(3, 4, seed=8),), lambda x: [x.argmax(1), x.argmin(0)])


# --------------------------------------------------------------------------- movement


@case
def movement() -> Case:
    g = Graph("movement")
    x = g.add_input("x", T(2, 3, 4))
    r = g.add_node("reshape", [x], {"shape": (6, 4)})
    p = g.add_node("permute", [x], {"perm": (2, 0, 1)})
    b = g.add_node("broadcast_to", [g.add_node("reshape", [x], {"shape": (2, 1, 12)})],
                   {"shape": (5, 2, 3, 12)})
    s = g.add_node("slice", [x], {"starts": (0, 1, 0), "stops": (2, 3, 4), "steps": (1, 1, 2)})
    pd = g.add_node("pad", [x], {"widths": ((1, 0), (0, 2), (0, 0)), "value": -1.5})
    g.set_outputs([r, p, b, s, pd])
    return Case(g, (rand(2, 3, 4, seed=9),), lambda x: [
        x.reshape(6, 4), x.transpose(2, 0, 1), np.broadcast_to(x.reshape(2, 1, 12), (5, 2, 3, 12)),
        x[0:2, 1:3, 0:4:2], np.pad(x, ((1, 0), (0, 2), (0, 0)), constant_values=-1.5)])


@case
def concat3() -> Case:
    g = Graph("concat")
    xs = [g.add_input(f"x{i}", T(2, n)) for i, n in enumerate((1, 2, 3))]
    g.set_outputs([g.add_node("concat", xs, {"axis": 1})])
    args = tuple(rand(2, n, seed=10 + n) for n in (1, 2, 3))
    return Case(g, args, lambda *xs: [np.concatenate(xs, axis=1)])


@case
def custom_vjp_softmax() -> Case:
    """softmax over the last axis, marked with the registered softmax VJP."""
    g = Graph("custom_vjp")
    x = g.add_input("x", T(2, 3))
    e = g.add_node("exp", [x])
    p = g.add_node("div", [e, g.add_node("reshape", [g.add_node("sum", [e], {"axes": (1,)})],
                                         {"shape": (2, 1)})])
    g.set_outputs([g.add_node("custom_vjp", [p, x], {"rule": "softmax", "params": (-1,)})])
    return Case(g, (rand(2, 3, seed=12),),
                lambda x: [np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)])


_ATTENTION = {"scale": 0.5, "keep": True, "zero_dead": True}
_KEEP = np.array([[True, False, False], [True, True, False], [False, False, False]])


def _attention_weights(q, k, mask):
    s = np.where(mask, q @ k.transpose(0, 2, 1) * np.float32(0.5), -np.inf)
    live = mask.any(-1, keepdims=True)              # the last row is all masked: zeros
    e = np.where(mask, np.exp(s - np.where(live, s.max(-1, keepdims=True), 0)), 0)
    return e / np.where(live, e.sum(-1, keepdims=True), 1)


@case
def fused_attention() -> Case:
    """Masked self-attention as the attention fusion writes it: results, then weights."""
    g = Graph("attention")
    q, k, v = (g.add_input(n, T(2, 3, 4)) for n in ("q", "k", "v"))
    mask = g.add_input("mask", T(3, 3, dtype=D.bool_))
    g.set_outputs([g.add_node("fused_attention", [q, k, v, mask], dict(_ATTENTION))])

    def expected(q, k, v, mask):
        p = _attention_weights(q, k, mask)
        return [np.concatenate([p @ v, p], -1)]
    return Case(g, tuple(rand(2, 3, 4, seed=20 + i) for i in range(3)) + (_KEEP,), expected)


@case
def fused_attention_backward() -> Case:
    """Its gradients, from the weights the forward packed."""
    g = Graph("attention_backward")
    q, k, v, dout = (g.add_input(n, T(2, 3, 4)) for n in ("q", "k", "v", "dout"))
    packed = g.add_input("packed", T(2, 3, 7))
    mask = g.add_input("mask", T(3, 3, dtype=D.bool_))
    g.set_outputs([g.add_node("fused_attention_backward", [q, k, v, packed, dout, mask],
                              {"scale": 0.5, "keep": True})])

    def expected(q, k, v, dout, packed, mask):
        p = packed[..., 4:]
        dp = dout @ v.transpose(0, 2, 1)
        ds = np.where(mask, p * (dp - (p * dp).sum(-1, keepdims=True)), 0) * np.float32(0.5)
        return [np.stack([ds @ k, ds.transpose(0, 2, 1) @ q, p.transpose(0, 2, 1) @ dout])]
    q_, k_, v_ = (rand(2, 3, 4, seed=20 + i) for i in range(3))
    p = _attention_weights(q_, k_, _KEEP)
    packed_ = np.concatenate([p @ v_, p], -1).astype(np.float32)
    return Case(g, (q_, k_, v_, rand(2, 3, 4, seed=23), packed_, _KEEP), expected)


# --------------------------------------------------------------------------- index


@case
def index_ops() -> Case:
    g = Graph("index")
    x = g.add_input("x", T(4, 3))
    idx = g.add_input("idx", T(2, 2, dtype=D.int64))
    gidx = g.add_input("gidx", T(2, 3, dtype=D.int64))
    src = g.add_input("src", T(2, 2, 3))
    gsrc = g.add_input("gsrc", T(2, 3))
    take = g.add_node("take", [x, idx], {"axis": 0})
    index_add = g.add_node("index_add", [x, g.add_node("reshape", [idx], {"shape": (4,)}),
                                         g.add_node("reshape", [src], {"shape": (4, 3)})],
                           {"axis": 0})
    checked = g.add_node("check_target", [gidx], {"op": "nll_loss", "classes": 4,
                                                   "ignore_index": -100, "input": "f32[4, 3]"})
    gather = g.add_node("gather", [x, checked], {"axis": 0})
    in_range = g.add_node("check_index", [gidx], {"op": "scatter_add", "size": 4, "dim": 0,
                                                  "wrap": False})
    scatter = g.add_node("scatter_add", [x, in_range, gsrc], {"axis": 0})
    g.set_outputs([take, index_add, gather, scatter])
    idx_ = np.array([[3, 0], [1, 3]])
    gidx_ = np.array([[0, 3, 1], [2, 2, 0]])

    def expected(x, idx, gidx, src, gsrc):
        added = x.copy()
        for i, row in zip(idx.reshape(-1), src.reshape(4, 3), strict=True):
            added[i] += row
        scattered = x.copy()
        for r in range(2):
            for c in range(3):
                scattered[gidx[r, c], c] += gsrc[r, c]
        return [x[idx], added, np.take_along_axis(x, gidx, 0), scattered]

    return Case(g, (rand(4, 3, seed=11), idx_, gidx_, rand(2, 2, 3, seed=12), rand(2, 3, seed=13)),
                expected)


@case
def batched_matmul() -> Case:
    return one_node("matmul", "matmul", [T(2, 3, 4), T(4, 5)],
                    (rand(2, 3, 4, seed=14), rand(4, 5, seed=15)), lambda a, b: [a @ b])


# --------------------------------------------------------------------------- sources, extern


@case
def sources() -> Case:
    g = Graph("sources")
    key = g.add_input("key", T(2, dtype=D.int64))
    full = g.add_node("full", [], {"shape": (2, 2), "value": 1.5, "dtype": D.float64})
    full_inf = g.add_node("full", [], {"shape": (), "value": float("-inf"), "dtype": D.float32})
    iota = g.add_node("iota", [], {"shape": (2, 3), "axis": 1, "dtype": D.int32})
    rnd = g.add_node("random_uniform", [key], {"shape": (3, 2), "dtype": D.float32})
    g.set_outputs([full, full_inf, iota, rnd])
    return Case(g, (np.array([7, 3], np.int64),), lambda key: [
        np.full((2, 2), 1.5), np.array(-np.inf, np.float32),
        np.broadcast_to(np.arange(3, dtype=np.int32), (2, 3)),
        philox.uniform(7, 3, (3, 2))])


CONSTANTS = {
    "f32": np.array([[1.0, 2.0], [3.0, 0.1]], np.float32),
    "f64": np.array([0.1, 1 / 3, -0.0, np.inf, -np.inf, np.nan, 5e-324, 1.7976931348623157e308]),
    "f16": np.array([0.1, 65504, 6e-08, -np.inf], np.float16),
    "bf16": np.array([0.1, 3.0, 1e-8, 1e20], ml_dtypes.bfloat16),
    "i64": np.array([[-(2 ** 63), 2 ** 63 - 1]], np.int64),
    "u8": np.array([0, 255], np.uint8),
    "i1": np.array([True, False]),
    "c64": np.array([1 + 2j, -0.5j, complex(np.nan, 1), complex(0.1, -np.inf)], np.complex64),
    "c128": np.array([[1 / 3 + 0.1j]]),
    "empty": np.zeros((2, 0, 3), np.float32),
    "empty_lead": np.zeros((0, 2), np.int32),
}


@case
def constants() -> Case:
    g = Graph("constants")
    outs = [g.add_node("constant", [], {"value": ConstantData(a)}) for a in CONSTANTS.values()]
    g.set_outputs(outs)
    return Case(g, (), lambda: [a.copy() for a in CONSTANTS.values()])


@case
def extern_ops() -> Case:
    g = Graph("extern")
    x = g.add_input("x", T(2, 5))
    g.set_outputs([g.add_node("argsort", [x], {"axis": 1, "descending": True}),
                   g.add_node("argsort", [x], {"axis": 0, "descending": False}),
                   g.add_node("cumsum", [x], {"axis": 1})])
    x_ = np.array([[3, 1, 3, 0, 2], [1, 1, 1, 1, 1]], np.float32)       # ties: stable order
    return Case(g, (x_,), lambda x: [np.array([[0, 2, 4, 1, 3], [0, 1, 2, 3, 4]]),
                                     np.argsort(x, axis=0, kind="stable"), np.cumsum(x, axis=1)])


@case
def complex_ops() -> Case:
    # The parts, the conjugate, the views as pairs of reals, and the FFT primitives.
    import fusegrad.ops.spectral  # noqa: F401  (registers the FFT primitives)
    g = Graph("complex")
    re = g.add_input("re", T(2, 4))
    im = g.add_input("im", T(2, 4))
    z = g.add_node("complex", [re, im])
    w = g.add_node("mul", [z, Literal(complex(0.5, -1.0), D.complex64)])
    pairs = g.add_node("view_as_real", [w])
    back = g.add_node("view_as_complex", [pairs])
    spectrum = g.add_node("fft_c2c", [back], {"axes": (0, 1), "inverse": False, "norm": "ortho"})
    half = g.add_node("fft_r2c", [re], {"axis": 1, "norm": "backward"})
    g.set_outputs([g.add_node("real", [z]), g.add_node("imag", [w]), g.add_node("conj", [w]),
                   pairs, spectrum, half,
                   g.add_node("fft_c2r", [half], {"axis": 1, "n": 4, "norm": "backward"})])

    def expected(re, im):
        z = (re + 1j * im).astype(np.complex64)
        w = z * np.complex64(0.5 - 1j)
        return [re, w.imag, np.conj(w), np.stack([w.real, w.imag], -1),
                np.fft.fft2(w, norm="ortho").astype(np.complex64),
                np.fft.rfft(re, axis=1).astype(np.complex64), re]
    return Case(g, (rand(2, 4, seed=33), rand(2, 4, seed=34)), expected)


@case
def window_ops() -> Case:
    # im2col and its adjoint (fusegrad.ops.windows), checked against explicit loops.
    import fusegrad.ops.windows  # noqa: F401  (registers the primitives)
    g = Graph("windows")
    x = g.add_input("x", T(1, 2, 5, 6))
    b = g.add_input("b", T(1, 2, 4, 2, 2))
    geometry = {"kernel": (2, 2), "stride": (2, 1), "dilation": (1, 2)}
    g.set_outputs([g.add_node("windows", [x], {**geometry, "positions": (2, 2)}),
                   g.add_node("overlap_add", [b], {**geometry, "padded": (5, 6)})])

    def expected(x, b):
        w = np.zeros((1, 2, 4, 2, 2), np.float32)
        y = np.zeros((1, 2, 5, 6), np.float32)
        for k, (i, j) in enumerate(np.ndindex(2, 2)):
            for p, q in np.ndindex(2, 2):
                w[:, :, k, p, q] = x[:, :, 2 * p + i, q + 2 * j]
                y[:, :, 2 * p + i, q + 2 * j] += b[:, :, k, p, q]
        return [w, y]
    return Case(g, (rand(1, 2, 5, 6, seed=31), rand(1, 2, 4, 2, 2, seed=32)), expected)


@case
def collectives() -> Case:
    # fusegrad.distributed's all-reduce pair; outside mpiexec a job of one rank (identity).
    import fusegrad.distributed  # noqa: F401  (registers the primitives)
    g = Graph("collectives")
    x = g.add_input("x", T(2, 3))
    h = g.add_node("allreduce_start", [x], {"op": "sum"})
    g.set_outputs([g.add_node("allreduce_wait", [h], {})])
    return Case(g, (rand(2, 3),), lambda x: [x.copy()])


# --------------------------------------------------------------------------- whole graphs


def mlp_graph() -> Graph:
    """The example of the IR's docs: matmul, relu against a literal, a full reduction."""
    g = Graph("f")
    x = g.add_input("x", T(4, 8))
    w = g.add_input("w", T(8, 16))
    h = g.add_node("matmul", [x, w], loc="model.py:12")
    r = g.add_node("maximum", [h, f32(0.0)], loc="model.py:13")
    s = g.add_node("sum", [r], {"axes": (0, 1)}, loc="model.py:14")
    g.set_outputs([r, s])
    return g


MLP_TEXT = """\
graph @f(%x: f32[4,8], %w: f32[8,16]) -> (f32[4,16], f32[]) {
  %0 = matmul %x, %w : f32[4,16]
  %1 = maximum %0, 0.0 : f32[4,16]
  %2 = sum %1 {axes=[0, 1]} : f32[]
  return %1, %2
}"""


@case
def mlp() -> Case:
    return Case(mlp_graph(), (rand(4, 8, seed=16), rand(8, 16, seed=17)),
                lambda x, w: [np.maximum(x @ w, 0), np.maximum(x @ w, 0).sum()])


@case
def odd_names_and_outputs() -> Case:
    """Names the printer must rewrite, a value used twice, literal and input outputs."""
    g = Graph("odd graph")
    a = g.add_input("x", T(3))
    # add_input refuses duplicate names; a pass that copies inputs could still make one.
    b = Value(T(3), "x")
    g.inputs.append(b)
    c = Value(T(3), None)
    g.inputs.append(c)
    d = Value(T(3), "1st input-name")
    g.inputs.append(d)
    s = g.add_node("add", [a, a], name="s")
    t = g.add_node("mul", [s, b])
    u = g.add_node("sub", [t, c])
    v = g.add_node("div", [u, d])
    g.set_outputs([v, a, Literal(2, D.int64), Literal(float("nan"), D.float32), v])
    args = tuple(rand(3, seed=20 + i, low=0.5) for i in range(4))
    return Case(g, args, lambda a, b, c, d: [((a + a) * b - c) / d, a, np.array(2),
                                             np.array(np.nan, np.float32), ((a + a) * b - c) / d])


@case
def half_precision_literals() -> Case:
    """f16 and bf16 nodes, and literals whose dtype differs from their node's default."""
    g = Graph("half")
    h = g.add_input("h", T(4, dtype=D.float16))
    b = g.add_input("b", T(4, dtype=D.bfloat16))
    i = g.add_input("i", T(4, dtype=D.int64))
    y = g.add_node("mul", [h, Literal(0.1, D.float16)])
    z = g.add_node("add", [b, Literal(1e-3, D.bfloat16)])
    k = g.add_node("add", [i, Literal(-3, D.int64)])
    idx = g.add_node("take", [h, Literal(2, D.int64)], {"axis": 0})   # literal of another dtype
    g.set_outputs([y, z, k, idx])
    h_ = np.array([1, 2, 3, 4], np.float16)
    b_ = np.array([1, 2, 3, 4], ml_dtypes.bfloat16)
    i_ = np.arange(4, dtype=np.int64)
    return Case(g, (h_, b_, i_), lambda h, b, i: [
        (h.astype(np.float32) * np.float32(np.float16(0.1))).astype(np.float16),
        (b.astype(np.float32) + np.float32(ml_dtypes.bfloat16(1e-3))).astype(ml_dtypes.bfloat16),
        i - 3, h[2]])


@case
def empty_graph() -> Case:
    return Case(Graph("empty"), (), lambda: [])


@case
def locations() -> Case:
    g = mlp_graph()
    g.nodes[1].loc = "weird \"file\" name.py"        # no line: printed as one string
    g.nodes[2].loc = "/tmp/a:b.py:007"               # not a canonical line number
    return Case(g, (rand(4, 8, seed=16), rand(8, 16, seed=17)), None)


@case
def trig_bitwise_scatter() -> Case:
    """Inverse and hyperbolic trig, integer bitwise ops and shifts, bitcast, scatter_reduce."""
    g = Graph("more_elementwise")
    u = g.add_input("u", T(2, 3))
    x = g.add_input("x", T(2, 3))
    i = g.add_input("i", T(2, 3, dtype=D.int32))
    k = g.add_input("k", T(2, 3, dtype=D.int32))
    idx = g.add_input("idx", T(2, 3, dtype=D.int64))
    trig = [g.add_node(op, [u]) for op in ("asin", "acos", "atanh")]
    trig += [g.add_node(op, [x]) for op in ("atan", "sinh", "cosh", "asinh")]
    trig += [g.add_node("acosh", [g.add_node("add", [g.add_node("abs", [x]), f32(1.5)])]),
             g.add_node("atan2", [u, x])]
    bits = [g.add_node(op, [i, k]) for op in ("bitand", "bitor", "bitxor", "shl", "shr")]
    cast = g.add_node("bitcast", [x], {"dtype": D.int32})
    scatter = g.add_node("scatter_reduce", [x, idx, u],
                         {"axis": 0, "reduce": "amax", "include_self": False})
    g.set_outputs(trig + bits + [cast, scatter])
    i_ = np.array([[5, -3, 7], [0, -8, 1]], np.int32)
    k_ = np.array([[1, 2, 0], [3, 31, 4]], np.int32)
    idx_ = np.array([[1, 0, 1], [1, 0, 0]])

    def expected(u, x, i, k, idx):
        f = np.float32
        out = [np.arcsin(u), np.arccos(u), np.arctanh(u), np.arctan(x), np.sinh(x), np.cosh(x),
               np.arcsinh(x), np.arccosh(np.abs(x) + f(1.5)), np.arctan2(u, x)]
        out = [o.astype(np.float32) for o in out]
        out += [i & k, i | k, i ^ k, i << k, i >> k, x.view(np.int32)]
        scattered = x.copy()
        for c in range(3):
            rows = {}
            for r in range(2):
                rows.setdefault(idx[r, c], []).append(u[r, c])
            for target, vals in rows.items():
                scattered[target, c] = max(vals)
        return out + [scattered]

    return Case(g, (rand(2, 3, seed=20, low=-0.9, high=0.9), rand(2, 3, seed=21), i_, k_, idx_),
                expected)


@case
def decompositions() -> Case:
    """The linear-algebra extern primitives (fusegrad.ops.decompositions) and their attributes."""
    import fusegrad.ops.decompositions  # noqa: F401  (registers the primitives)
    g = Graph("decompositions")
    a = g.add_input("a", T(2, 3, 3, dtype=D.float64))
    b = g.add_input("b", T(2, 3, 2, dtype=D.float64))
    spd = g.add_input("spd", T(3, 3, dtype=D.float64))
    piv = g.add_input("piv", T(2, 3, dtype=D.int32))
    outs = [g.add_node(op, [a]) for op in ("inv", "det", "slogdet_sign", "logabsdet", "matrix_exp",
                                           "lu_p", "lu_l", "lu_u", "lu_pivots", "geqrf_a",
                                           "geqrf_tau")]
    outs.append(g.add_node("solve", [a, b]))
    outs.append(g.add_node("cholesky", [spd], {"upper": True}))
    outs += [g.add_node(op, [a], {"mode": "complete"}) for op in ("qr_q", "qr_r")]
    outs += [g.add_node(op, [a], {"full_matrices": False}) for op in ("svd_u", "svd_s", "svd_vh")]
    outs += [g.add_node(op, [spd], {"uplo": "U"}) for op in ("eigh_values", "eigh_vectors")]
    outs.append(g.add_node("pivots_to_p", [piv], {"m": 3, "dtype": D.float64}))
    g.set_outputs(outs)
    rng = np.random.default_rng(40)
    a_ = rng.standard_normal((2, 3, 3)) + 3 * np.eye(3)
    m = rng.standard_normal((3, 3))
    spd_ = m @ m.T + np.eye(3)
    piv_ = np.array([[3, 2, 3], [1, 3, 3]], np.int32)

    def permutation(p):
        perm = np.arange(3)
        for j, k in enumerate(p):
            perm[[j, k - 1]] = perm[[k - 1, j]]
        return np.eye(3)[perm].T

    def lu(m):
        # Doolittle elimination with partial pivoting, written out.
        u, perm, low, pivots = m.copy(), np.arange(3), np.eye(3), []
        for c in range(3):
            p = c + int(np.argmax(np.abs(u[c:, c])))
            pivots.append(p + 1)
            u[[c, p]], perm[[c, p]] = u[[p, c]], perm[[p, c]]
            low[[c, p], :c] = low[[p, c], :c]
            for r in range(c + 1, 3):
                low[r, c] = u[r, c] / u[c, c]
                u[r] -= low[r, c] * u[c]
        return np.eye(3)[perm].T, low, np.triu(u), np.array(pivots, np.int32)

    def expected(a, b, spd, piv):
        sign, logabs = np.linalg.slogdet(a)
        w, v = np.linalg.eig(a)
        factors = [lu(m) for m in a]
        raw = [np.linalg.qr(m, mode="raw") for m in a]
        u, s, vh = np.linalg.svd(a, full_matrices=False)
        lam, vec = np.linalg.eigh(spd, UPLO="U")
        return [np.linalg.inv(a), np.linalg.det(a), sign, logabs,
                ((v * np.exp(w)[..., None, :]) @ np.linalg.inv(v)).real,
                *[np.stack([f[k] for f in factors]) for k in range(4)],
                np.stack([h.T for h, _ in raw]), np.stack([t for _, t in raw]),
                np.linalg.solve(a, b), np.linalg.cholesky(spd).T, *np.linalg.qr(a, mode="complete"),
                u, s, vh, lam, vec, np.stack([permutation(p) for p in piv])]

    return Case(g, (a_, rng.standard_normal((2, 3, 2)), spd_, piv_), expected)


@case
def special_functions() -> Case:
    """The special-function extern primitives (fusegrad.ops.special), and mode's index."""
    import fusegrad.ops.special  # noqa: F401
    import fusegrad.ops.statistics  # noqa: F401
    g = Graph("special")
    x = g.add_input("x", T(4, dtype=D.float64))
    y = g.add_input("y", T(4, dtype=D.float64))
    e = g.add_input("e", T(4, dtype=D.float64))
    i = g.add_input("i", T(4, dtype=D.int64))
    j = g.add_input("j", T(4, dtype=D.int64))
    rows = g.add_input("rows", T(2, 5))
    outs = [g.add_node("polygamma", [x], {"n": 0}), g.add_node("polygamma", [x], {"n": 1})]
    outs += [g.add_node(op, [x]) for op in ("lgamma", "erfc", "i0", "i1")]
    outs.append(g.add_node("erfinv", [e]))
    outs += [g.add_node(op, [g.add_node("div", [x, x]), y]) for op in ("igamma", "igammac")]
    outs.append(g.add_node("nextafter", [x, y]))
    outs += [g.add_node(op, [y]) for op in ("frexp_mantissa", "frexp_exponent")]
    outs += [g.add_node(op, [i, j]) for op in ("gcd", "lcm")]
    outs.append(g.add_node("mode_index", [rows]))
    g.set_outputs(outs)
    x_ = np.array([1.0, 0.5, 2.0, 3.5])
    y_ = np.array([0.25, 1.0, 3.0, -6.5])
    v = np.array([-1.5, -0.2, 0.3, 2.0])
    e_ = np.array([math.erf(t) for t in v])
    gamma = 0.5772156649015329

    def bessel(x, order):
        # I_n(x) = 1/pi * integral_0^pi exp(x cos t) cos(n t) dt; the trapezoid rule on a
        # periodic analytic integrand converges geometrically.
        t = np.linspace(0.0, np.pi, 2001)
        f = np.exp(x[:, None] * np.cos(t)) * np.cos(order * t)
        return (f[:, 1:-1].sum(1) + (f[:, 0] + f[:, -1]) / 2) * (t[1] - t[0]) / np.pi

    def expected(x, y, e, i, j, rows):
        mantissa, exponent = np.frexp(y)
        # digamma and trigamma at 1 and 1/2 are known; 2 and 7/2 follow by the recurrence.
        return [np.array([-gamma, -gamma - 2 * math.log(2), 1 - gamma,
                          -gamma - 2 * math.log(2) + 2 + 2 / 3 + 2 / 5]),
                np.array([math.pi ** 2 / 6, math.pi ** 2 / 2, math.pi ** 2 / 6 - 1,
                          math.pi ** 2 / 2 - 4 - 4 / 9 - 4 / 25]),
                np.array([math.lgamma(t) for t in x]), np.array([math.erfc(t) for t in x]),
                bessel(x, 0), bessel(x, 1), v, 1 - np.exp(-y.clip(0)) + np.where(y < 0, np.nan, 0),
                np.exp(-y.clip(0)) + np.where(y < 0, np.nan, 0), np.nextafter(x, y), mantissa,
                exponent.astype(np.int32), np.gcd(i, j), np.lcm(i, j),
                np.array([[3], [3]])]

    rows_ = np.array([[3, 1, 3, 1, 2], [5, 5, 2, 2, 7]], np.float32)
    return Case(g, (x_, y_, e_, np.array([12, -18, 0, 7]), np.array([8, 12, 5, 0]), rows_),
                expected)


@case
def gamma_draws() -> Case:
    """Standard Gamma draws keyed like random_uniform (their statistics are checked in
    tests/test_distributions.py; here every IR tool runs them)."""
    import fusegrad.ops.sampling  # noqa: F401
    g = Graph("gamma_draws")
    key = g.add_input("key", T(2, dtype=D.int64))
    alpha = g.add_input("alpha", T(3, dtype=D.float64))
    g.set_outputs([g.add_node("standard_gamma", [key, alpha])])
    return Case(g, (np.array([7, 3], np.int64), np.array([0.3, 1.0, 4.0])), None)


@case
def gamma_draw_gradient() -> Case:
    """dx/dalpha of a Gamma draw at a fixed CDF value, against -(dP/dalpha) / density with
    dP/dalpha summed from the series P = sum_n x^(a+n) e^-x / Gamma(a+n+1), term by term."""
    import fusegrad.ops.sampling  # noqa: F401
    g = Graph("gamma_draw_gradient")
    alpha = g.add_input("alpha", T(3, dtype=D.float64))
    x = g.add_input("x", T(3, dtype=D.float64))
    g.set_outputs([g.add_node("standard_gamma_grad", [alpha, x])])
    euler = 0.5772156649015329
    digamma_a1 = {1.0: 1 - euler, 2.0: 1.5 - euler, 0.5: 2 - euler - 2 * math.log(2)}

    def expected(alpha, x):
        out = []
        for a, v in zip(alpha, x):
            psi, total = digamma_a1[float(a)], 0.0
            for n in range(60):
                if n:
                    psi += 1 / (a + n)
                term = math.exp((a + n) * math.log(v) - v - math.lgamma(a + n + 1))
                total += term * (math.log(v) - psi)
            density = math.exp((a - 1) * math.log(v) - v - math.lgamma(a))
            out.append(-total / density)
        return [np.array(out)]

    return Case(g, (np.array([1.0, 2.0, 0.5]), np.array([0.5, 1.0, 0.2])), expected)


def all_cases() -> dict[str, Case]:
    """A fresh instance of every case."""
    return {name: build() for name, build in CASES.items()}
