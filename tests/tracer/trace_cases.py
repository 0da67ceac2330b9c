"""The op table shared by the tracer and autodiff tests, and the harness that checks a case.

Each :class:`OpCase` is a function of tensors and the inputs to call it on. The tests check,
for every case, that

- ``interpret(trace(fn, *xs), *arrays)`` equals eager ``fn(*xs)`` (:func:`check_forward`);
- the gradient of a weighted sum of ``fn``'s float outputs from ``fusegrad.grad`` (the
  autodiff pass, replayed eagerly) and from ``interpret(grad_graph(trace(loss)))`` equals the
  gradient eager ``backward()`` gives (:func:`check_gradient`).

Inputs are float64 (so agreement is to rounding), in three layouts: contiguous, transposed
(``T``) and strided (``S``), the last two non-contiguous; 0-d inputs appear where meaningful.
A case's name is ``op`` or ``op-variant``; ``op`` (and ``covers``) name the public ops it
exercises, which ``test_trace_ops.py`` checks against the public API.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

import fusegrad as fg
import fusegrad.nn.functional as NF
from fusegrad.ir import interpret
from fusegrad.ops import functional as F
from fusegrad.passes.autodiff import grad_graph
from fusegrad.tracer.trace import tree_flatten

# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Arr:
    """A deferred input array: float in [low, high), or fixed integer/bool values."""

    shape: tuple[int, ...] = ()
    low: float = -2.0
    high: float = 2.0
    layout: str = ""               # "" contiguous, "T" transposed, "S" strided
    values: tuple | None = None    # fixed contents (integer indices, masks)
    dtype: str = "float64"

    def make(self, seed: int) -> np.ndarray:
        if self.values is not None:
            a = np.array(self.values, dtype=self.dtype)
        else:
            rng = np.random.default_rng(seed)
            a = rng.uniform(self.low, self.high, size=self.shape).astype(self.dtype)
        return _layout(a, self.layout)


def _layout(a: np.ndarray, kind: str) -> np.ndarray:
    a = np.array(a)          # a 0-d array stays 0-d (np.ascontiguousarray makes it 1-d)
    if kind == "" or a.ndim == 0:
        return a
    if kind == "T":
        return np.ascontiguousarray(a.T).T
    big = np.zeros(tuple(2 * d for d in a.shape), dtype=a.dtype)
    big[tuple(slice(None, None, 2) for _ in a.shape)] = a
    return big[tuple(slice(None, None, 2) for _ in a.shape)]


def X(*shape: int, layout: str = "") -> Arr:
    """Floats in [-2, 2)."""
    return Arr(tuple(shape), layout=layout)


def Pos(*shape: int, layout: str = "") -> Arr:
    """Floats in [0.5, 2.5): the domain of log, sqrt, reciprocal, fractional powers."""
    return Arr(tuple(shape), 0.5, 2.5, layout=layout)


def Unit(*shape: int) -> Arr:
    """Floats in [0.05, 0.95): probabilities."""
    return Arr(tuple(shape), 0.05, 0.95)


def Idx(values) -> Arr:
    """An int64 index tensor."""
    return Arr(values=_tuple(values), dtype="int64")


def Mask(values) -> Arr:
    """A bool tensor."""
    return Arr(values=_tuple(values), dtype="bool")


def _tuple(v):
    return tuple(_tuple(x) for x in v) if isinstance(v, (list, tuple)) else v


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class OpCase:
    """``fn`` applied to ``args``; ``grad=False`` where no float input has a gradient."""

    name: str
    fn: Callable
    args: tuple[Arr, ...]
    grad: bool = True
    covers: tuple[str, ...] = ()
    xfail_forward: str = ""   # a known bug, the reason; the test is a strict xfail
    xfail_grad: str = ""

    @property
    def op(self) -> str:
        """The public op exercised: ``nn.softmax-dim0`` -> softmax, ``inplace-add_`` -> add_."""
        parts = self.name.removeprefix("nn.").split("-")
        return parts[1] if parts[0] == "inplace" else parts[0]

    def arrays(self) -> list[np.ndarray]:
        return [a.make(seed) for seed, a in enumerate(self.args)]

    def float_args(self) -> tuple[int, ...]:
        return tuple(i for i, a in enumerate(self.args) if a.dtype == "float64")


CASES: list[OpCase] = []


def case(name: str, fn: Callable, *args: Arr, grad: bool = True, covers=(), xfail_forward="",
         xfail_grad="") -> None:
    """Add ``fn(*args)`` to the table as ``name`` (``op`` or ``op-variant``)."""
    CASES.append(OpCase(name, fn, args, grad, tuple(covers), xfail_forward, xfail_grad))


def _write_method(method: str, view: Callable, *consts) -> Callable:
    """``fn(x, *args)``: ``view(base).method(*args, *consts)`` on an intermediate
    ``base = x * 1``, returning the base (an in-place method writing through a view)."""
    def fn(x, *args):
        return _then_base(x, lambda b: getattr(view(b), method)(*args, *consts))
    return fn


# Eager autograd bugs (fusegrad/ops/functional.py, not the tracer): the traced gradient is
# right (test_autodiff_ops checks it against finite differences) and eager backward is not.
EAGER_LEAF_WRITE = ("eager bug: an in-place write of a leaf tensor (copy_/setitem of a value "
                    "with grad_fn None) drops its gradient and keeps the old one of the "
                    "overwritten region (functional._rebase_history returns early)")
# Tracer-side bugs in fusegrad/ops/functional.py.setitem (owned elsewhere).
TRACE_SETITEM_INDEX = ("functional.setitem under a trace: writes through integer-tensor "
                       "indices are lost (getitem gathers a copy with no base, and copy_ only "
                       "rebinds that copy)")
TRACE_SETITEM_MASK = ("functional.setitem under a trace: x[mask] = scalar raises "
                      "ConcretizationError although eager lowers it to where()")


S0 = X()                     # a 0-d input

# -- elementwise binary, with broadcasting, 0-d operands and Python scalars
case("add", lambda x, y: F.add(x, y), X(3, 4), X(4))
case("add-0d", lambda x, y: x + y, X(2, 3, layout="T"), S0)
case("add-alpha", lambda x, y: F.add(x, y, alpha=2.5), X(3, 1), X(1, 4))
case("add-scalar", lambda x: 3 + x, X(3, 4, layout="S"), covers=("__radd__",))
case("sub", lambda x, y: F.sub(x, y, alpha=0.5), X(2, 3, 4), X(3, 1))
case("sub-op", lambda x, y: x - y, S0, X(3, 4, layout="S"))
case("rsub", lambda x, y: F.rsub(x, y), X(3, 4), X(4))
case("rsub-scalar", lambda x: 1.5 - x, X(3, 4), covers=("__rsub__",))
case("mul", lambda x, y: F.mul(x, y), X(3, 4, layout="T"), X(3, 1))
case("mul-op", lambda x: x * x * 0.5, X(5))
case("div", lambda x, y: F.div(x, y), X(3, 4), Pos(4))
case("div-op", lambda x, y: 1.0 / y + x / 2, X(3, 4), Pos(3, 4, layout="S"),
     covers=("__rtruediv__",))
case("div-floor", lambda x, y: F.div(x, y, rounding_mode="floor") + x, X(3, 4), Pos(4))
case("div-trunc", lambda x, y: F.div(x, y, rounding_mode="trunc") * x, X(3, 4), Pos(4))
case("true_divide", lambda x, y: F.true_divide(x, y), X(2, 3), Pos(2, 3))
case("floor_divide", lambda x, y: F.floor_divide(x, y) + y * x, X(3, 4), Pos(3, 4))
case("floor_divide-op", lambda x: (x // 0.7) * x, X(3, 4))
case("remainder", lambda x, y: F.remainder(x, y), X(3, 4), Pos(4))
case("remainder-op", lambda x: x % 0.75, X(3, 4, layout="T"))
case("fmod", lambda x, y: F.fmod(x, y), X(3, 4), Pos(3, 4))
case("pow", lambda x, y: F.pow(x, y), Pos(3, 4), X(3, 4))
case("pow-square", lambda x: x ** 2, X(3, 4, layout="S"))
case("pow-cube", lambda x: F.pow(x, 3), X(3, 4))
case("pow-sqrt", lambda x: x ** 0.5, Pos(3, 4))
case("pow-one", lambda x: x ** 1, X(3))
case("pow-rpow", lambda x: 2.0 ** x, X(3, 4), covers=("__rpow__",))
case("maximum", lambda x, y: F.maximum(x, y), X(3, 4), X(4))
case("minimum", lambda x, y: F.minimum(x, y), X(3, 4, layout="T"), S0)
case("lt", lambda x, y: F.where(F.lt(x, y), x, y), X(3, 4), X(3, 4), covers=("less",))
case("le", lambda x, y: F.where(F.le(x, y), x * 2, y), X(3, 4), X(4), covers=("less_equal",))
case("gt", lambda x, y: F.where(F.gt(x, y), x, -y), X(3, 4), S0, covers=("greater",))
case("ge", lambda x, y: F.where(F.ge(x, 0.5), x, y), X(3, 4), X(3, 4),
     covers=("greater_equal",))
case("eq", lambda x: F.where(F.eq(x.floor(), 0), x, 0.0), X(3, 4))
case("ne", lambda x: F.where(F.ne(x.floor(), 0), x, x * 3), X(3, 4), covers=("not_equal",))
case("compare-ops", lambda x, y: ((x < y) | (x >= 1.0)) & ~(x == y) ^ (x != 0.5), X(3, 4), X(4),
     grad=False, covers=("__lt__", "__ge__", "__eq__", "__ne__", "__or__", "__and__",
                         "__xor__", "__invert__"))
case("logical_and", lambda x, y: F.logical_and(x > 0, y), X(3, 4), Mask([True, False, True, True]),
     grad=False)
case("logical_or", lambda x, y: F.logical_or(x, y > 0), X(3, 4), X(3, 4), grad=False)
case("logical_xor", lambda x, y: F.logical_xor(x > 0, y > 0), X(3, 4), X(4), grad=False)
case("logical_not", lambda x: F.where(F.logical_not(x > 0), x, 1.0), X(3, 4))
case("bitwise_and", lambda x, y: F.bitwise_and(x > 0, y > 0), X(3, 4), X(3, 4), grad=False)
case("bitwise_or", lambda x, y: F.bitwise_or(x > 0, y > 0), X(3, 4), X(3, 4), grad=False)
case("bitwise_xor", lambda x, y: F.bitwise_xor(x > 0, y > 0), X(3, 4), X(3, 4), grad=False)
case("bitwise_not", lambda x: F.bitwise_not(x > 0), X(3, 4), grad=False)
case("where", lambda c, x, y: F.where(c, x, y), Mask([[True], [False], [True]]), X(3, 4), X(4))
case("where-scalar", lambda x: F.where(x > 0, x, 0.5), X(3, 4, layout="T"))
case("where-method", lambda x, y: x.where(x > y, y * 2), X(3, 4), X(3, 4))

# -- elementwise unary
for _name in ("neg", "negative", "abs", "absolute", "sin", "cos", "tanh", "erf", "expm1",
              "sigmoid", "relu", "square", "sign", "floor", "ceil", "trunc", "fix", "round",
              "tan", "exp", "exp2"):
    case(_name, getattr(F, _name), X(3, 4, layout="T"))
for _name in ("log", "log1p", "sqrt", "reciprocal", "rsqrt", "log2", "log10"):
    case(_name, getattr(F, _name), Pos(3, 4, layout="S"))
case("exp-0d", F.exp, S0)
case("neg-op", lambda x: -x + abs(+x), X(3, 4), covers=("__neg__", "__abs__", "__pos__"))
case("round-decimals", lambda x: F.round(x, decimals=2) * x, X(3, 4))
case("sigmoid-large", F.sigmoid, Arr((6,), -120.0, 120.0))
case("clamp", lambda x: F.clamp(x, -0.5, 0.7), X(3, 4))
case("clamp-min", lambda x: F.clamp(x, min=0.1), X(3, 4, layout="T"))
case("clamp-tensor", lambda x, lo, hi: F.clamp(x, lo, hi), X(3, 4), Arr((4,), -2, -0.5),
     Arr((3, 1), 0.5, 2))
case("clip", lambda x: F.clip(x, max=0.3), X(3, 4))
case("isnan", lambda x: F.where(F.isnan(x.log()), 0.0, x), X(3, 4))
case("isinf", lambda x: F.where(F.isinf(1 / x.floor()), 1.0, x), X(3, 4))
case("isfinite", lambda x: F.where(F.isfinite(x.floor().reciprocal()), x, 2 * x), X(3, 4))
case("isclose", lambda x, y: F.where(F.isclose(x, x + y * 1e-9), x, y), X(3, 4), X(3, 4))
case("clone", lambda x: F.clone(x) * 2, X(3, 4, layout="S"))
case("contiguous", lambda x: F.contiguous(x.t()) + 1, X(3, 4))
case("to", lambda x: F.to(F.to(x, fg.float32), fg.float64) + F.to(x, x), X(3, 4))
case("cast", lambda x: F.cast(F.cast(x, fg.float32), fg.float64) * x, X(3, 4))
case("type_as", lambda x, i: F.type_as(i, x) * x, X(3), Idx([1, 2, 3]))
case("cast-methods", lambda x: x.float().double() + x.long().double() + x.bool().double()
     + x.int().double() + x.half().double(), X(3, 4),
     covers=("float", "double", "long", "bool", "int", "half"))
case("as_tensor_operand", lambda x: x * F.as_tensor_operand(np.arange(4.0)), X(3, 4))

# -- reductions
case("sum", lambda x: F.sum(x), X(3, 4, layout="T"))
case("sum-dim", lambda x: F.sum(x, 1), X(2, 3, 4))
case("sum-dims-keepdim", lambda x: F.sum(x, (0, -1), keepdim=True), X(2, 3, 4, layout="S"))
case("sum-0d", lambda x: F.sum(x), S0)
case("sum-dtype", lambda x: F.sum(x > 0, 0, dtype=fg.float64) * x, X(3, 4))
case("sum_to_size", lambda x: F.sum_to_size(x, (3, 1)), X(2, 3, 4))
case("prod", lambda x: F.prod(x), Pos(2, 3))
case("prod-dim", lambda x: F.prod(x, 1, keepdim=True), X(3, 4, layout="T"))
case("reduce_prod", lambda x: F.reduce_prod(x, (0,)), X(3, 4))
case("mean", lambda x: F.mean(x), X(3, 4, layout="S"))
case("mean-dim", lambda x: F.mean(x, (0, 2), keepdim=True), X(2, 3, 4))
case("mean-0d", lambda x: F.mean(x), S0)
case("var", lambda x: F.var(x), X(3, 4))
case("var-dim", lambda x: F.var(x, 1, keepdim=True), X(3, 4, layout="T"))
case("var-correction", lambda x: F.var(x, 0, correction=0), X(3, 4))
case("var-unbiased", lambda x: F.var(x, False), X(3, 4))
case("std", lambda x: F.std(x, -1), X(3, 4))
case("std-all", lambda x: F.std(x), X(3, 4, layout="S"))
case("var_mean", lambda x: F.var_mean(x, 1), X(3, 4))
case("std_mean", lambda x: F.std_mean(x, 0, keepdim=True), X(3, 4))
case("max", lambda x: F.max(x), X(3, 4, layout="T"))
case("max-dim", lambda x: F.max(x, 1), X(3, 4))
case("max-keepdim", lambda x: F.max(x, 0, keepdim=True), X(3, 4, layout="S"))
case("max-binary", lambda x, y: F.max(x, y), X(3, 4), X(4))
case("min", lambda x: F.min(x), X(3, 4))
case("min-dim", lambda x: F.min(x, -1, keepdim=True), X(3, 4))
case("min-binary", lambda x, y: F.min(x, y), X(3, 4), S0)
case("amax", lambda x: F.amax(x, (0, 2)), X(2, 3, 4))
case("amin", lambda x: F.amin(x, 1, keepdim=True), X(3, 4, layout="T"))
case("argmax", lambda x: F.argmax(x, 1), X(3, 4), grad=False)
case("argmax-all", lambda x: F.argmax(x, keepdim=True), X(3, 4, layout="T"), grad=False)
case("argmin", lambda x: F.argmin(x, 0, keepdim=True), X(3, 4), grad=False)
case("logsumexp", lambda x: F.logsumexp(x, 1), X(3, 4))
case("logsumexp-keepdim", lambda x: F.logsumexp(x, (0, 1), keepdim=True), X(3, 4, layout="S"))
case("all", lambda x: F.all(x > -1.5, 1), X(3, 4), grad=False)
case("any", lambda x: F.any(x > 1.5), X(3, 4), grad=False)
case("count_nonzero", lambda x: F.count_nonzero(x > 0, 0), X(3, 4), grad=False)
case("norm", lambda x: F.norm(x), X(3, 4))
case("norm-dim", lambda x: F.norm(x, 2, 1, keepdim=True), X(3, 4, layout="T"))
case("norm-1", lambda x: F.norm(x, 1, 0), X(3, 4))
case("norm-inf", lambda x: F.norm(x, math.inf, 1), X(3, 4))
case("norm-neginf", lambda x: F.norm(x, -math.inf), X(3, 4))
case("norm-3", lambda x: F.norm(x, 3, -1), X(3, 4))
case("norm-0", lambda x: F.norm(x, 0), X(3, 4), grad=False)
case("cumsum", lambda x: F.cumsum(x, 1), X(3, 4, layout="S"))
case("cumsum-0d", lambda x: F.cumsum(x, 0), S0)

# -- movement and views
case("reshape", lambda x: F.reshape(x, (4, -1)) * 2, X(2, 3, 2, layout="T"))
case("reshape_prim", lambda x: F.reshape_prim(x, (12,)), X(3, 4))
case("view", lambda x: F.view(x, 2, 6), X(3, 4))
case("view_as", lambda x, y: F.view_as(x, y) + y, X(3, 4), X(4, 3))
case("reshape_as", lambda x, y: F.reshape_as(x, y) * y, X(3, 4, layout="T"), X(2, 6))
case("permute", lambda x: F.permute(x, 2, 0, 1), X(2, 3, 4))
case("transpose", lambda x: F.transpose(x, 0, 2), X(2, 3, 4, layout="S"))
case("swapaxes", lambda x: F.swapaxes(x, 0, 1), X(3, 4), covers=("swapdims",))
case("t", lambda x: F.t(x), X(3, 4))
case("T", lambda x: x.T * x.mT.mT.T, X(2, 3, 4), covers=("mT",))
case("movedim", lambda x: F.movedim(x, 0, -1), X(2, 3, 4))
case("expand", lambda x: F.expand(x, 2, -1, 4), X(3, 1))
case("expand-0d", lambda x: F.expand(x, (3, 2)), S0)
case("expand_as", lambda x, y: F.expand_as(x, y) * y, X(4), X(3, 4))
case("broadcast_to", lambda x: F.broadcast_to(x, (2, 3, 4)), X(3, 1, layout="T"))
case("broadcast_tensors", lambda x, y: F.broadcast_tensors(x, y), X(3, 1), X(4))
case("squeeze", lambda x: F.squeeze(x), X(3, 1, 4, 1))
case("squeeze-dim", lambda x: F.squeeze(x, 1), X(3, 1, 4))
case("unsqueeze", lambda x: F.unsqueeze(x, -1), X(3, 4, layout="T"))
case("flatten", lambda x: F.flatten(x, 1), X(2, 3, 4, layout="T"))
case("flatten-0d", lambda x: F.flatten(x), S0)
case("unflatten", lambda x: F.unflatten(x, 1, (2, -1)), X(3, 4))
case("slice_axes", lambda x: F.slice_axes(x, (1, 0), (3, 4), (1, 2)), X(3, 4))
case("narrow", lambda x: F.narrow(x, 1, 1, 2), X(3, 4, layout="S"))
case("alias", lambda x: F.alias(x) * 2, X(3, 4, layout="T"))
case("split", lambda x: F.split(x, 3, 1), X(2, 7))
case("split-sizes", lambda x: F.split(x, [1, 2], 0), X(3, 4))
case("chunk", lambda x: F.chunk(x, 2, -1), X(3, 5, layout="T"))
case("unbind", lambda x: F.unbind(x, 1), X(3, 4))
case("select", lambda x: F.select(x, 0, -1), X(3, 4))
case("pad_axes", lambda x: F.pad_axes(x, [(1, 0), (2, 1)], 0.5), X(3, 4))
case("cat", lambda x, y: F.cat([x, y], 1), X(3, 2), X(3, 4, layout="T"),
     covers=("concat", "concatenate"))
case("cat-single", lambda x: F.cat([x]), X(3))
case("stack", lambda x, y: F.stack([x, y], 1), X(3, 4), X(3, 4))
case("hstack", lambda x, y: F.hstack([x, y]), X(3), X(2))
case("vstack", lambda x, y: F.vstack([x, y]), X(4), X(2, 4))
case("repeat", lambda x: F.repeat(x, 2, 1, 3), X(3, 2))
case("repeat_interleave", lambda x: F.repeat_interleave(x, 3, dim=1), X(3, 2))
case("repeat_interleave-flat", lambda x: F.repeat_interleave(x, 2), X(2, 2))
case("flip", lambda x: F.flip(x, (0, 1)), X(3, 4, layout="T"))
case("roll", lambda x: F.roll(x, (1, -2), (0, 1)), X(3, 4))
case("roll-flat", lambda x: F.roll(x, 5), X(3, 4))

# -- matmul
case("matmul", lambda a, b: F.matmul(a, b), X(3, 4), X(4, 5))
case("matmul-T", lambda a, b: a @ b, X(3, 4, layout="T"), X(4, 5, layout="T"),
     covers=("__matmul__",))
case("matmul-1d1d", lambda a, b: F.matmul(a, b), X(4), X(4))
case("matmul-1d2d", lambda a, b: F.matmul(a, b), X(4), X(4, 5))
case("matmul-2d1d", lambda a, b: F.matmul(a, b), X(3, 4), X(4))
case("matmul-batched", lambda a, b: F.matmul(a, b), X(2, 3, 4), X(2, 4, 5))
case("matmul-bcast", lambda a, b: F.matmul(a, b), X(2, 3, 4), X(4, 5))
case("matmul-bcast4d", lambda a, b: F.matmul(a, b), X(2, 1, 3, 4), X(3, 4, 2))
case("matmul-1dbatched", lambda a, b: F.matmul(a, b), X(4), X(2, 4, 3))
case("matmul_nd", lambda a, b: F.matmul_nd(a, b), X(2, 3, 4), X(1, 4, 2))
case("mm", lambda a, b: F.mm(a, b), X(3, 4, layout="S"), X(4, 2))
# (16-bit operands are its point; on float32 ones it is the product, with its own VJP.)
case("float32_sums", lambda a, b: F.float32_sums(a, b), X(3, 4), X(4, 2))
case("bmm", lambda a, b: F.bmm(a, b), X(2, 3, 4), X(2, 4, 2))
case("dot", lambda a, b: F.dot(a, b), X(5), X(5))
case("mv", lambda a, b: F.mv(a, b), X(3, 4, layout="T"), X(4))
case("outer", lambda a, b: F.outer(a, b), X(3), X(4))

# -- index ops
case("take", lambda x, i: F.take(x, i, 1), X(3, 4), Idx([[0, 3], [1, 1]]))
case("take_add", lambda x, i, s: F.take_add(x, i, s, 0), X(4, 2), Idx([1, 3, 1]), X(3, 2))
case("index_select", lambda x, i: F.index_select(x, 0, i), X(3, 4, layout="T"), Idx([2, 0, 2]))
case("index_select-0d", lambda x, i: F.index_select(x, 1, i), X(3, 4), Idx(1))
case("index_add", lambda x, i, s: F.index_add(x, 1, i, s, alpha=2.0), X(3, 4), Idx([0, 2, 0]),
     X(3, 3))
case("gather", lambda x, i: F.gather(x, 1, i), X(3, 4), Idx([[0, 3], [1, 1], [2, 0]]))
case("gather-smaller", lambda x, i: F.gather(x, 0, i), X(3, 4, layout="T"), Idx([[2, 0, 1]]))
case("take_along_dim", lambda x, i: F.take_along_dim(x, i, 1), X(3, 4), Idx([[0, 3]]))
case("scatter_add", lambda x, i, s: F.scatter_add(x, 1, i, s), X(3, 4),
     Idx([[0, 0], [3, 1], [2, 2]]), X(3, 2))
case("masked_fill", lambda x, m: F.masked_fill(x, m, -1.5), X(3, 4),
     Mask([True, False, False, True]))
case("masked_fill-tensor", lambda x, v: F.masked_fill(x, x > 0, v), X(3, 4, layout="T"), S0)
case("tril", lambda x: F.tril(x), X(3, 4))
case("tril-diag", lambda x: F.tril(x, -1), X(2, 4, 3, layout="S"))
case("triu", lambda x: F.triu(x, 1), X(4, 3))
case("zeros_like_scalar", lambda x: x + F.zeros_like_scalar(x), X(3))
case("argsort", lambda x: F.argsort(x, 1, descending=True), X(3, 4), grad=False)
case("sort", lambda x: F.sort(x, 0), X(3, 4))
case("sort-desc", lambda x: F.sort(x, descending=True), X(3, 4, layout="T"))
case("topk", lambda x: F.topk(x, 2, 1), X(3, 4))
case("topk-smallest", lambda x: F.topk(x, 3, 0, largest=False), X(4, 3, layout="S"))

# -- __getitem__ (basic indexing is a view, integer tensors gather)
case("getitem-int", lambda x: x[1], X(3, 4), covers=("getitem", "__getitem__"))
case("getitem-slice", lambda x: x[:, 1::2], X(3, 5, layout="T"))
case("getitem-neg", lambda x: x[-1, -3:-1], X(3, 4))
case("getitem-none", lambda x: x[None, ..., 0, None], X(2, 3, 4))
case("getitem-ellipsis", lambda x: x[..., 1:], X(2, 3, 4, layout="S"))
case("getitem-tensor", lambda x, i: x[i], X(4, 3), Idx([3, 0, 3, -1]))
case("getitem-tensor2d", lambda x, i: x[:, i], X(3, 4), Idx([[0, 1], [3, 3]]))
case("getitem-two-tensors", lambda x, i, j: x[i, j], X(3, 4), Idx([0, 2, 2]), Idx([3, 0, 3]))
case("getitem-nonadjacent", lambda x, i, j: x[i, :, j], X(3, 2, 4), Idx([0, 2]), Idx([1, 3]))
case("getitem-list", lambda x: x[[2, 0]], X(3, 4))
case("getitem-int-tensor-0d", lambda x, i: x[i], X(3, 4), Idx(2))

# -- in-place writes on intermediates (functionalized under the trace)
case("setitem", lambda x: _setitem(x, (slice(None), slice(1, 3)), 0.0), X(3, 4),
     covers=("__setitem__",))
case("setitem-tensor", lambda x, v: _setitem(x, (1,), v), X(3, 4), X(4))
case("setitem-tensor-nonleaf", lambda x, v: _setitem(x, (1,), v * 2), X(3, 4), X(4))
case("setitem-step", lambda x, v: _setitem(x, (slice(None, None, 2),), v * 3), X(5, 2),
     X(3, 2, layout="T"))
case("setitem-view-chain", lambda x, v: _setitem_chain(x, v), X(3, 4), X(2))
case("setitem-view-chain-nonleaf", lambda x, v: _setitem_chain(x, v.exp()), X(3, 4), X(2))
case("setitem-index", lambda x, v: _setitem(x, (fg.tensor([2, 0]),), v * 2), X(3, 4), X(4))
case("setitem-mask", lambda x: _setitem(x, (x > 0,), 0.0), X(3, 4))
# (not over exp's output: its backward reads it, and a copy_ over it is refused, as in torch)
case("copy_", lambda x, y: (x * 2).copy_(y), X(3, 4), X(4))
case("copy_-view", lambda x, y: _then_base(x, lambda b: b[1:].copy_(y)), X(3, 4), X(2, 4))
case("copy_-view-nonleaf", lambda x, y: _then_base(x, lambda b: b[1:].copy_(y.sin())), X(3, 4),
     X(2, 4))
case("fill_", lambda x: _then_base(x, lambda b: b[:, 0].fill_(2.0)), X(3, 4))
case("fill_-tensor", lambda x, v: _then_base(x, lambda b: b[0].fill_(v)), X(3, 4), S0)
case("zero_", lambda x: _then_base(x, lambda b: b.t()[1].zero_()), X(3, 4))
case("assign_", lambda x, y: F.assign_(x * 1, y), X(3, 4), X(3, 4))
case("assign_-nonleaf", lambda x, y: F.assign_(x * 1, y * y), X(3, 4), X(3, 4))
case("inplace-add_", lambda x, y: _then_base(x, lambda b: b[:2].add_(y, alpha=2)), X(3, 4),
     X(4))
case("inplace-mul_", _write_method("mul_", lambda b: b), X(3, 4), X(3, 1))
case("inplace-lerp_", _write_method("lerp_", lambda b: b), X(3, 4), X(3, 4), X(4))
case("inplace-addcmul_", _write_method("addcmul_", lambda b: b[1:]), X(3, 4), X(2, 4), X(4))
case("inplace-addcdiv_", _write_method("addcdiv_", lambda b: b), X(3, 4), X(3, 4), Pos(3, 4))
case("inplace-iops", lambda x, y: _iops(x, y), X(3, 4), Pos(4),
     covers=("__iadd__", "__isub__", "__imul__", "__itruediv__"))
case("inplace-clamp_", _write_method("clamp_", lambda b: b, -1, 1), X(3, 4))
case("inplace-masked_fill_", lambda x: _then_base(x, lambda b: b.masked_fill_(b < 0, 0.5)),
     X(3, 4))
case("nn.relu_", lambda x: NF.relu_(x * 2), X(3, 4))
case("inplace-scatter_add_", lambda x, i, s: _then_base(x, lambda b: b.scatter_add_(1, i, s)),
     X(3, 4), Idx([[1], [0], [1]]), X(3, 1))
case("inplace-index_add_", lambda x, i, s: _then_base(x, lambda b: b.index_add_(0, i, s)),
     X(3, 4), Idx([2, 2]), X(2, 4))
case("inplace-tril_", _write_method("tril_", lambda b: b), X(3, 4))
for _name in ("neg", "abs", "exp", "sin", "cos", "tanh", "sigmoid", "relu", "floor", "erf",
              "square", "sign", "trunc", "round", "ceil", "expm1"):
    case(f"inplace-{_name}_", _write_method(f"{_name}_", lambda b: b[1:]), X(3, 4))
for _name in ("sub", "div", "true_divide", "floor_divide", "remainder", "pow", "maximum",
              "minimum"):
    case(f"inplace-{_name}_", _write_method(f"{_name}_", lambda b: b[:, 1:]), Pos(3, 4), Pos(3))
case("inplace-logical_and_", lambda x, y: F.where((x > 0).logical_and_(y > 0), x, y), X(3, 4),
     X(4))
case("inplace-logical_or_", lambda x, y: F.where((x > 0).logical_or_(y > 0), x, y), X(3, 4),
     X(4))
case("inplace-logical_not_", lambda x: F.where((x > 0).logical_not_(), x, 0.0), X(3, 4))
case("inplace-clip_", lambda x: _then_base(x, lambda b: b[0].clip_(max=0.5)), X(3, 4))
case("inplace-triu_", _write_method("triu_", lambda b: b, -1), X(3, 4))
for _name in ("log", "sqrt", "rsqrt", "reciprocal", "log1p"):
    case(f"inplace-{_name}_", _write_method(f"{_name}_", lambda b: b[:, :2]), Pos(3, 4))

# -- creation from a tensor
case("zeros_like", lambda x: F.zeros_like(x) + x, X(3, 4))
case("ones_like", lambda x: F.ones_like(x, dtype=fg.float64) * x, X(3, 4))
case("new_zeros", lambda x: x.new_zeros(3, 4) + x, X(4))
case("new_ones", lambda x: F.new_ones(x, (3, 1)) * x, X(4))
case("new_full", lambda x: F.new_full(x, (3, 4), 2.5) * x, X(3, 4))
case("new_empty", lambda x: F.new_empty(x, 3, 4).zero_() + x, X(3, 4))
case("new_tensor", lambda x: x * F.new_tensor(x, [1.0, 2.0, 3.0]), X(3))

# -- nn.functional
case("nn.relu", lambda x: NF.relu(x), X(3, 4, layout="T"))
case("nn.gelu", lambda x: NF.gelu(x), X(3, 4))
case("nn.gelu-tanh", lambda x: NF.gelu(x, approximate="tanh"), X(3, 4, layout="S"))
case("nn.silu", lambda x: NF.silu(x), X(3, 4))
case("nn.silu-inplace", lambda x: NF.silu(x * 1, inplace=True), X(3, 4))
case("nn.softplus", lambda x: NF.softplus(x, beta=2.0, threshold=3.0), X(3, 4))
case("nn.leaky_relu", lambda x: NF.leaky_relu(x, 0.1), X(3, 4))
case("nn.leaky_relu-inplace", lambda x: NF.leaky_relu(x * 1, 0.2, inplace=True), X(3, 4))
case("nn.sigmoid", lambda x: NF.sigmoid(x), X(3, 4))
case("nn.tanh", lambda x: NF.tanh(x), X(3, 4))
case("nn.softmax", lambda x: NF.softmax(x, -1), X(3, 4))
case("nn.softmax-dim0", lambda x: NF.softmax(x, 0), X(3, 4, layout="T"))
case("nn.softmax-0d", lambda x: NF.softmax(x, 0), S0)
case("nn.log_softmax", lambda x: NF.log_softmax(x, 1), X(2, 3, 4))
case("nn.linear", lambda x, w, b: NF.linear(x, w, b), X(5, 4), X(3, 4), X(3))
case("nn.linear-nobias", lambda x, w: NF.linear(x, w), X(5, 4, layout="T"), X(3, 4))
case("nn.linear-3d", lambda x, w, b: NF.linear(x, w, b), X(2, 5, 4), X(3, 4), X(3))
case("nn.linear-3d-nobias", lambda x, w: NF.linear(x, w), X(2, 5, 4), X(3, 4))
case("nn.linear-1d", lambda x, w: NF.linear(x, w), X(4), X(3, 4))
case("nn.dropout-eval", lambda x: NF.dropout(x, 0.5, training=False) * 2, X(3, 4))
case("nn.dropout-p0", lambda x: NF.dropout(x, 0.0) * 2, X(3, 4))
case("nn.layer_norm", lambda x, w, b: NF.layer_norm(x, (4,), w, b), X(3, 4), X(4), X(4))
case("nn.layer_norm-2d", lambda x: NF.layer_norm(x, (3, 4)), X(2, 3, 4, layout="T"))
case("nn.conv2d", lambda x, w, b: NF.conv2d(x, w, b, stride=(2, 1), padding=1, groups=2),
     X(2, 4, 5, 4), X(4, 2, 3, 2), X(4))
case("nn.conv2d-same", lambda x, w: NF.conv2d(x, w, padding="same", dilation=2),
     X(1, 2, 5, 5, layout="T"), X(3, 2, 3, 3))
case("nn.conv1d", lambda x, w: NF.conv1d(x, w, stride=2, padding=1), X(2, 2, 7, layout="S"),
     X(3, 2, 3))
case("nn.conv_transpose2d", lambda x, w, b: NF.conv_transpose2d(x, w, b, stride=2, padding=1,
                                                                 output_padding=1, groups=2),
     X(1, 4, 3, 3), X(4, 1, 3, 2), X(2))
case("nn.conv_transpose1d", lambda x, w: NF.conv_transpose1d(x, w, stride=3, dilation=2),
     X(2, 2, 4), X(2, 3, 2))
case("nn.unfold", lambda x: NF.unfold(x, 2, padding=1, stride=2), X(1, 2, 5, 4, layout="T"))
case("nn.fold", lambda c: NF.fold(c, (4, 5), 2, padding=1, stride=2), X(1, 8, 9))
case("nn.max_pool2d", lambda x: NF.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True),
     X(2, 2, 5, 6), covers=("max_pool2d_with_indices",))
case("nn.max_pool1d", lambda x: NF.max_pool1d(x, 2, dilation=2, return_indices=True),
     X(2, 3, 7, layout="S"), covers=("max_pool1d_with_indices",))
case("nn.avg_pool2d", lambda x: NF.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
     X(2, 2, 5, 6))
case("nn.avg_pool1d", lambda x: NF.avg_pool1d(x, 3, 2, 1), X(2, 3, 7))
case("nn.adaptive_avg_pool2d", lambda x: NF.adaptive_avg_pool2d(x, (3, 2)), X(2, 2, 5, 7),
     covers=("adaptive_avg_pool1d",))
case("nn.adaptive_max_pool2d", lambda x: NF.adaptive_max_pool2d(x, (3, 2), return_indices=True),
     X(2, 2, 5, 7))
case("nn.adaptive_max_pool1d", lambda x: NF.adaptive_max_pool1d(x, 3), X(2, 2, 7))
case("nn.adaptive_avg_pool1d-5", lambda x: NF.adaptive_avg_pool1d(x, 5), X(2, 2, 7))
case("nn.batch_norm", lambda x, w, b: NF.batch_norm(x, None, None, w, b, training=True),
     X(4, 3, 2, layout="T"), X(3), X(3))
case("nn.batch_norm-eval", lambda x, m, v, w: NF.batch_norm(x, m, v, w, None, eps=1e-3),
     X(2, 3, 2, 2), X(3), Pos(3), X(3))
case("nn.group_norm", lambda x, w, b: NF.group_norm(x, 2, w, b), X(2, 4, 3), X(4), X(4))
case("nn.instance_norm", lambda x: NF.instance_norm(x), X(2, 3, 4, layout="S"))
case("nn.rms_norm", lambda x, w: NF.rms_norm(x, (4,), w), X(3, 4), X(4))
case("lerp", lambda a, b, w: F.lerp(a, b, w), X(3, 4), X(3, 4, layout="T"), X(4))
case("lerp-scalar", lambda a, b: F.lerp(a, b, 0.75), X(3, 4), X(3, 4))
case("addcmul", lambda a, b, c: F.addcmul(a, b, c, value=0.5), X(3, 4), X(4), X(3, 1))
case("addcdiv", lambda a, b, c: F.addcdiv(a, b, c, value=2), X(3, 4), X(3, 4), Pos(4))
case("diagonal", lambda x: F.diagonal(x, 1, 2, 0), X(3, 4, 5, layout="T"))
case("diagonal-neg", lambda x: F.diagonal(x, -1), X(4, 3, layout="S"))
case("diag", lambda v, m: (F.diag(v, -1), F.diag(m, 1)), X(3), X(3, 4))
case("trace", lambda m: F.trace(m), X(3, 4, layout="T"))
case("nn.hardtanh", lambda x: NF.hardtanh(x, -1.0, 0.5), X(3, 4))
case("nn.relu6", lambda x: NF.relu6(x * 4), X(3, 4))
case("nn.elu", lambda x: NF.elu(x, 0.7), X(3, 4))
case("nn.selu", lambda x: NF.selu(x), X(3, 4, layout="T"))
case("nn.celu", lambda x: NF.celu(x, 2.0), X(3, 4))
case("nn.mish", lambda x: NF.mish(x), X(3, 4))
case("nn.hardswish", lambda x: NF.hardswish(x * 3), X(3, 4))
case("nn.hardsigmoid", lambda x: NF.hardsigmoid(x * 3), X(3, 4))
case("nn.prelu", lambda x, w: NF.prelu(x, w), X(2, 3, 4), X(3))
case("nn.softsign", lambda x: NF.softsign(x), X(3, 4))
case("nn.tanhshrink", lambda x: NF.tanhshrink(x), X(3, 4))
case("nn.logsigmoid", lambda x: NF.logsigmoid(x), X(3, 4))
case("nn.softshrink", lambda x: NF.softshrink(x, 0.3), X(3, 4))
case("nn.hardshrink", lambda x: NF.hardshrink(x, 0.3), X(3, 4))
case("nn.pad-modes", lambda x: (NF.pad(x, (2, 1), mode="reflect"), NF.pad(x, (1, 2), mode="circular"),
                                NF.pad(x, (1, 1, 2, 0), mode="replicate")), X(2, 3, 4),
     covers=("pad",))
case("einsum", lambda a, b: F.einsum("bij,jk->bik", a, b), X(2, 3, 4), X(4, 5, layout="T"))
case("einsum-diag", lambda a, v: F.einsum("ii,i->", a, v), X(3, 3), X(3))
case("cumprod", lambda x: F.cumprod(x, 1), X(3, 4, layout="T"))
case("cummax", lambda x: F.cummax(x, 1), X(3, 4))
case("cummin", lambda x: F.cummin(x, 0), X(3, 4, layout="S"))
case("logcumsumexp", lambda x: F.logcumsumexp(x, -1), X(3, 4))
case("Tensor.unfold", lambda x: x.unfold(1, 3, 2), X(2, 7, layout="T"))
case("nn.conv3d", lambda x, w: NF.conv3d(x, w, stride=(1, 2, 1), padding=1), X(1, 2, 3, 4, 3),
     X(2, 2, 2, 2, 2))
case("nn.conv_transpose3d", lambda x, w: NF.conv_transpose3d(x, w, stride=2), X(1, 2, 2, 2, 2),
     X(2, 1, 2, 1, 2))
case("nn.max_pool3d", lambda x: NF.max_pool3d(x, 2, 1), X(1, 2, 3, 3, 3))
case("nn.avg_pool3d", lambda x: NF.avg_pool3d(x, 2, 2, 1), X(1, 2, 3, 3, 3))
case("nn.embedding", lambda i, w: NF.embedding(i, w), Idx([[0, 2], [3, 0]]), X(4, 3))
case("nn.embedding-padding", lambda i, w: NF.embedding(i, w, padding_idx=0),
     Idx([0, 2, 0, 1]), X(4, 3))
case("nn.one_hot", lambda i, x: NF.one_hot(i, 4).double() * x, Idx([0, 3, 1]), X(3, 4))
case("nn.mse_loss", lambda x, y: NF.mse_loss(x, y), X(3, 4), X(3, 4))
case("nn.mse_loss-sum", lambda x, y: NF.mse_loss(x, y, reduction="sum"), X(3, 4, layout="T"),
     X(3, 4))
case("nn.mse_loss-none", lambda x, y: NF.mse_loss(x, y, reduction="none"), X(3, 4), X(3, 4))
case("nn.l1_loss", lambda x, y: NF.l1_loss(x, y), X(3, 4), X(3, 4))
case("nn.cross_entropy", lambda x, t: NF.cross_entropy(x, t), X(3, 5), Idx([4, 0, 2]))
case("nn.cross_entropy-weight", lambda x, t, w: NF.cross_entropy(x, t, w), X(3, 5),
     Idx([4, 0, 2]), Pos(5))
case("nn.cross_entropy-ignore", lambda x, t: NF.cross_entropy(x, t, ignore_index=1), X(4, 3),
     Idx([1, 0, 2, 1]))
case("nn.cross_entropy-sum", lambda x, t: NF.cross_entropy(x, t, reduction="sum"),
     X(3, 5, layout="T"), Idx([1, 0, 2]))
case("nn.cross_entropy-none", lambda x, t: NF.cross_entropy(x, t, reduction="none"), X(3, 4),
     Idx([1, 0, 3]))
case("nn.cross_entropy-smooth", lambda x, t: NF.cross_entropy(x, t, label_smoothing=0.1),
     X(3, 4), Idx([1, 0, 3]))
case("nn.cross_entropy-probs", lambda x, p: NF.cross_entropy(x, p), X(3, 4), Unit(3, 4))
case("nn.cross_entropy-1d", lambda x, t: NF.cross_entropy(x, t), X(4), Idx(2))
case("nn.cross_entropy-3d", lambda x, t: NF.cross_entropy(x, t), X(2, 3, 4),
     Idx([[0, 1, 2, 2], [1, 1, 0, 2]]))
case("nn.nll_loss", lambda x, t: NF.nll_loss(NF.log_softmax(x, 1), t), X(3, 4), Idx([3, 0, 1]))
case("nn.nll_loss-weight", lambda x, t, w: NF.nll_loss(x, t, w, reduction="sum"), X(3, 4),
     Idx([3, 0, 1]), Pos(4))
case("nn.binary_cross_entropy", lambda x, t: NF.binary_cross_entropy(x, t), Unit(3, 4),
     Unit(3, 4))
case("nn.binary_cross_entropy-weight",
     lambda x, t, w: NF.binary_cross_entropy(x, t, w, reduction="sum"), Unit(3, 4), Unit(3, 4),
     Pos(4))
case("nn.binary_cross_entropy_with_logits",
     lambda x, t, pw: NF.binary_cross_entropy_with_logits(x, t, pos_weight=pw), X(3, 4),
     Unit(3, 4), Pos(4))
case("nn.normalize", lambda x: NF.normalize(x, dim=1), X(3, 4, layout="S"))
case("nn.pad", lambda x: NF.pad(x, (1, 2, 0, 1), value=0.5), X(3, 4))
case("nn.pad-crop", lambda x: NF.pad(x, (-1, 2)), X(3, 4, layout="T"))


def _setitem(x, key, value):
    y = x * 1.0          # an intermediate: writing to an input would make a mutation
    y[key] = value
    return y


def _setitem_chain(x, v):
    y = x + 0.0
    row = y[1]           # a view of y, then a view of the view
    row[1:3] = v
    return y, row


def _then_base(x, write):
    """Write through a view of an intermediate (``write(base)``); return the base."""
    base = x * 1.0
    write(base)
    return base


def _iops(x, y):
    z = x + 0
    z += y
    z -= 0.5
    z *= y
    z /= 2
    return z


# --------------------------------------------------------------------------- harness


def to_tensors(arrays, requires_grad: tuple[int, ...] = ()) -> list[fg.Tensor]:
    """Tensors over ``arrays`` (sharing their memory, so layouts are kept)."""
    out = []
    for i, a in enumerate(arrays):
        t = fg.from_numpy(a.copy() if not a.flags.writeable else a)
        out.append(t.requires_grad_(True) if i in requires_grad else t)
    return out


def _leaves(out) -> list[fg.Tensor]:
    return tree_flatten(out)[0]


def assert_same(got: np.ndarray, want: fg.Tensor | np.ndarray, what: str,
                rtol: float = 1e-12, atol: float = 1e-13) -> None:
    want = want.detach().numpy() if isinstance(want, fg.Tensor) else np.asarray(want)
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, eager {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, eager {want.dtype}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def check_forward(c: OpCase) -> None:
    """``interpret(trace(fn))`` equals eager ``fn`` on every output."""
    arrays = c.arrays()
    expected = _leaves(c.fn(*to_tensors([a.copy() for a in arrays])))
    graph = fg.trace(c.fn, *to_tensors(arrays))
    got = interpret(graph, *arrays)
    assert not graph.meta.mutations, "the case mutates its inputs"
    assert len(got) == len(expected)
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert_same(g, e, f"{c.name}: output {k}")


def _weights(shape: tuple[int, ...], k: int) -> np.ndarray:
    # Distinct weights per element: an all-ones cotangent hides transposition bugs.
    rng = np.random.default_rng(100 + k)
    return rng.uniform(0.5, 1.5, size=shape)


def scalar_loss(fn: Callable) -> Callable:
    """``sum_k (out_k * w_k).sum()`` over ``fn``'s float outputs, with fixed weights."""
    def loss(*xs):
        total = None
        for k, o in enumerate(_leaves(fn(*xs))):
            if not o.dtype.is_floating_point:
                continue
            term = (o * fg.from_numpy(_weights(tuple(o.shape), k))).sum()
            total = term if total is None else total + term
        return total
    loss.__name__ = "loss"
    return loss


def eager_gradients(c: OpCase, arrays) -> list[np.ndarray]:
    wrt = c.float_args()
    xs = to_tensors([a.copy() for a in arrays], requires_grad=wrt)
    scalar_loss(c.fn)(*xs).backward()
    return [xs[i].grad.numpy() if xs[i].grad is not None else np.zeros_like(arrays[i])
            for i in wrt]


def check_gradient(c: OpCase) -> None:
    """The autodiff pass (through ``fusegrad.grad`` and through the interpreter) gives the
    gradients eager ``backward()`` gives."""
    arrays = c.arrays()
    wrt = c.float_args()
    expected = eager_gradients(c, arrays)
    loss = scalar_loss(c.fn)
    got = fg.grad(loss, wrt)(*to_tensors(arrays))
    for i, g, e in zip(wrt, got, expected, strict=True):
        assert_same(g.numpy(), e, f"{c.name}: fusegrad.grad wrt argument {i}", rtol=1e-10,
                    atol=1e-12)
    g2 = grad_graph(fg.trace(loss, *to_tensors(arrays)), wrt)
    got = interpret(g2, *arrays)[1:]
    for i, g, e in zip(wrt, got, expected, strict=True):
        assert_same(g, e, f"{c.name}: interpret(grad_graph) wrt argument {i}", rtol=1e-10,
                    atol=1e-12)

# -- integer bitwise ops and shifts, inverse and hyperbolic trig (tests/test_ops_more.py)
_I = Idx([[5, -3, 7, 0], [-8, 2, 63, 1]])
_K = Idx([[1, 64, -1, 3], [2, 63, 0, 70]])
case("bitwise_and-int", lambda a, b: (a & b, a | b, a ^ b, ~a), _I, _K, grad=False,
     covers=("__and__", "__or__", "__xor__", "__invert__"))
case("bitwise_left_shift", lambda a, k: (a << k, a >> k, 3 << k, F.bitwise_right_shift(a, 2)),
     _I, _K, grad=False, covers=("bitwise_right_shift", "__lshift__", "__rshift__"))
case("inplace-bitwise_ops_", lambda a, k: a.clone().bitwise_and_(k).bitwise_or_(k)
     .bitwise_xor_(a).bitwise_not_().bitwise_left_shift_(2).bitwise_right_shift_(k),
     _I, _K, grad=False, covers=("bitwise_and_", "bitwise_or_", "bitwise_xor_", "bitwise_not_",
                                 "bitwise_left_shift_", "bitwise_right_shift_"))
for _name in ("atan", "sinh", "cosh", "asinh", "arctan", "arcsinh"):
    case(_name, getattr(F, _name), X(3, 4, layout="T"))
for _name in ("asin", "acos", "atanh", "arcsin", "arccos", "arctanh"):
    case(_name, getattr(F, _name), Arr((3, 4), -0.9, 0.9, layout="S"))
for _name in ("acosh", "arccosh"):
    case(_name, getattr(F, _name), Arr((3, 4), 1.2, 3.0))
case("atan2", lambda y, x: F.atan2(y, x), X(3, 4), X(4), covers=("arctan2",))
for _name in ("asin", "acos", "atanh", "arcsin", "arccos", "arctanh"):
    case(f"inplace-{_name}_", _write_method(f"{_name}_", lambda b: b[1:]),
         Arr((3, 4), -0.9, 0.9))
for _name in ("atan", "sinh", "cosh", "asinh", "arctan", "arcsinh"):
    case(f"inplace-{_name}_", _write_method(f"{_name}_", lambda b: b[:, 1:]), X(3, 4))
for _name in ("acosh", "arccosh"):
    case(f"inplace-{_name}_", _write_method(f"{_name}_", lambda b: b[1:]), Arr((3, 4), 1.2, 3.0))
for _name in ("atan2", "arctan2"):
    case(f"inplace-{_name}_", _write_method(f"{_name}_", lambda b: b[:, :2]), X(3, 4), X(3, 2))

# -- scatter, products and distances, grids, sampling (tests/test_ops_more.py)
_SI = Idx([[0, 2, 1, 0], [2, 0, 0, 1]])
_SD = Idx([[0, 2, 1, 0], [0, 2, 1, 1]])
case("scatter", lambda x, i, s: x.scatter(0, i, s), X(3, 4), _SI, X(2, 5))
case("scatter-value", lambda x, i: F.scatter(x, 0, i, 1.5), X(3, 4), _SI)
case("scatter-add", lambda x, i, s: F.scatter(x, 0, i, s, reduce="add"), X(3, 4), _SD, X(2, 4))
case("scatter-multiply", lambda x, i, s: F.scatter(x, 0, i, s, reduce="multiply"), X(3, 4), _SD,
     X(2, 4))
for _r in ("sum", "prod", "mean", "amax", "amin"):
    case(f"scatter_reduce-{_r}", lambda x, i, s, r=_r: F.scatter_reduce(x, 0, i, s, r), X(3, 4),
         _SD, X(2, 4, layout="T"))
    case(f"scatter_reduce-{_r}-exclude", lambda x, i, s, r=_r: x.scatter_reduce(
        1, i.T, s, r, include_self=False), X(4, 3), _SD, X(4, 2))
case("inplace-scatter_", lambda x, i, s: _then_base(x, lambda b: b[1:].scatter_(0, i, s)),
     X(4, 4), Idx([[0, 2, 1, 0]]), X(1, 4))
case("inplace-scatter_reduce_", lambda x, i, s: _then_base(
    x, lambda b: b.scatter_reduce_(0, i, s, "amax")), X(3, 4), _SD, X(2, 4))
case("nan_to_num", lambda x: F.nan_to_num(F.log(x), posinf=5.0), Arr((3, 4), -0.5, 1.5))
case("inplace-nan_to_num_", lambda x: _then_base(F.log(x), lambda b: b[1:].nan_to_num_(1.0)),
     Arr((3, 4), -0.5, 1.5))
case("tensordot", lambda a, b: F.tensordot(a, b, dims=([0, 2], [2, 1])), X(2, 3, 4),
     X(5, 4, 2, layout="T"))
case("tensordot-int", lambda a, b: F.tensordot(a, b, 1), X(2, 3), X(3, 4))
case("meshgrid", lambda a, b, c: F.meshgrid(a, b, c, indexing="xy"), X(3), X(2), X(4))
case("diag_embed", lambda x: F.diag_embed(x, 1, 0, 2), X(2, 3, layout="T"))
case("cdist", lambda a, b: (F.cdist(a, b), F.cdist(a, b, p=1), F.cdist(a, b, p=3),
                            F.cdist(a, b, p=math.inf)), X(2, 3, 4), X(2, 5, 4))
case("nn.cosine_similarity", lambda a, b: NF.cosine_similarity(a, b, dim=-1), X(3, 4), X(4))
case("view-dtype", lambda x: x.view(fg.int64) ^ 3, X(3, 4), grad=False)

# -- interpolate (tests/test_ops_interpolate.py)
case("nn.interpolate", lambda x: (NF.interpolate(x, size=(5, 3), mode="bicubic"),
                                  NF.interpolate(x, scale_factor=2, mode="bilinear",
                                                 align_corners=True),
                                  NF.interpolate(x, size=(3, 7)), NF.upsample(x, scale_factor=1.5)),
     X(1, 2, 4, 5, layout="T"), covers=("upsample",))
case("nn.interpolate-linear", lambda x: NF.interpolate(x, scale_factor=0.7, mode="linear"),
     X(2, 3, 6))

# -- more losses, 3-d adaptive pooling, unpooling (tests/test_nn_more.py)
case("nn.smooth_l1_loss", lambda x, y: (NF.smooth_l1_loss(x, y, beta=0.5),
                                        NF.smooth_l1_loss(x, y, reduction="none", beta=0.0)),
     X(3, 4), X(3, 4, layout="T"))
case("nn.huber_loss", lambda x, y: NF.huber_loss(x, y, reduction="sum", delta=0.7), X(3, 4),
     X(3, 4))
case("nn.kl_div", lambda x, y: (NF.kl_div(x, y, reduction="batchmean"),
                                NF.kl_div(x, y.log(), reduction="sum", log_target=True)),
     X(3, 4), Unit(3, 4))
case("nn.cosine_embedding_loss", lambda a, b: NF.cosine_embedding_loss(
    a, b, fg.tensor([1, -1, 1]), margin=0.1), X(3, 4), X(3, 4))
case("nn.adaptive_avg_pool3d", lambda x: NF.adaptive_avg_pool3d(x, (2, 3, 2)), X(1, 2, 3, 4, 5))
case("nn.adaptive_max_pool3d", lambda x: NF.adaptive_max_pool3d(x, 2), X(1, 2, 3, 4, 3))
case("nn.max_unpool2d", lambda x, i: NF.max_unpool2d(x, i, 2), X(1, 1, 2, 2),
     Idx([[[[1, 6], [8, 15]]]]))
case("nn.max_unpool1d", lambda x, i: NF.max_unpool1d(x, i, 2, output_size=(5,)), X(2, 1, 2),
     Idx([[[1, 2]], [[0, 3]]]))
case("nn.max_unpool3d", lambda x, i: NF.max_unpool3d(x, i, 2), X(1, 1, 1, 1, 2),
     Idx([[[[[1, 7]]]]]))

case("nn.scaled_dot_product_attention",
     lambda q, k, v, m: (NF.scaled_dot_product_attention(q, k, v, attn_mask=m),
                         NF.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)),
     X(2, 3, 4), X(2, 5, 4, layout="T"), X(2, 5, 2), X(3, 5))

# -- torch.f / Tensor.f parity (fusegrad.ops.pointwise, blas, slicing, statistics, special,
# decompositions): elementwise compositions, products, slice writes, order statistics, and the
# extern primitives of special functions and decompositions, traced and differentiated.
case("copysign", lambda x, y: (F.copysign(x, y), F.frac(x), F.sgn(x), F.positive(x),
                               F.deg2rad(x), F.rad2deg(x), F.fmax(x, y), F.fmin(x, y)),
     X(3, 4), X(4), covers=("frac", "sgn", "positive", "deg2rad", "rad2deg", "fmax", "fmin",
                            "signbit", "divide", "multiply", "subtract", "clamp_min",
                            "clamp_max"))
case("hypot", lambda x, y: (F.hypot(x, y), F.logaddexp(x, y), F.logaddexp2(x, y),
                            F.xlogy(x, y), F.ldexp(x, y), F.float_power(y, x), F.sinc(x),
                            F.logit(y / 3, 0.1), F.hardshrink(x, 0.5),
                            F.clamp_min(x, 0.1) + F.clamp_max(x, 0.2) + F.divide(x, y)
                            + F.multiply(x, y) + F.subtract(x, y) + F.signbit(x)),
     X(3, 4, layout="T"), Pos(3, 4),
     covers=("logaddexp", "logaddexp2", "xlogy", "ldexp", "float_power", "sinc", "logit",
             "hardshrink"))
case("heaviside", lambda x, y: (F.heaviside(x, y), F.isposinf(x / 0), F.isneginf(x / 0),
                                F.isreal(x)), X(3, 4), X(4), grad=False,
     covers=("isposinf", "isneginf", "isreal"))
case("addmm", lambda m, a, b, v: (F.addmm(m, a, b, beta=0.5, alpha=2), F.addmv(m[:, 0], a, v),
                                  F.addr(m, a[:, 0], b[0]), F.inner(a, b.mT), F.vdot(v, v),
                                  F.ger(v, v), F.kron(a, b), F.adjoint(a)),
     X(3, 5), X(3, 2), X(2, 5), X(2),
     covers=("addmv", "addr", "inner", "vdot", "ger", "kron", "adjoint"))
case("baddbmm", lambda m, a, b: (F.baddbmm(m, a, b), F.addbmm(m, a, b)), X(3, 5), X(2, 3, 4),
     X(2, 4, 5, layout="T"), covers=("addbmm",))
case("cross", lambda x, y: (F.cross(x, y, dim=1), F.dist(x, y, 3), F.diff(x, 2, 0),
                            F.cov(x), F.corrcoef(x), F.matrix_power(y[:3], 3)),
     X(4, 3), X(4, 3, layout="S"), covers=("dist", "diff", "cov", "corrcoef", "matrix_power"))
case("tensor_split", lambda x: (*F.tensor_split(x, 3, 1), *F.hsplit(x, [1]), *F.vsplit(x, 2),
                                *F.split_with_sizes(x, [1, 3]), F.ravel(x), F.tile(x, (2, 1)),
                                F.fliplr(x), F.flipud(x), F.moveaxis(x, 0, 1),
                                F.narrow_copy(x, 1, 1, 2), F.msort(x), F.diagflat(x[0]),
                                fg.take(x, fg.tensor([0, 7, -1])), *F.unsafe_chunk(x, 2),
                                *F.unsafe_split(x, 2), *F.unsafe_split_with_sizes(x, [3, 1])),
     X(4, 5),
     covers=("hsplit", "vsplit", "split_with_sizes", "ravel", "tile", "fliplr", "flipud",
             "moveaxis", "narrow_copy", "msort", "diagflat", "take", "unsafe_chunk",
             "unsafe_split", "unsafe_split_with_sizes"))
case("dsplit", lambda x: (*F.dsplit(x, 2), F.detach(x) * x, F.histc(x, 4, -1, 1)), X(2, 3, 4),
     covers=("detach", "histc"))
case("index_copy", lambda x, s, i: (F.index_copy(x, 0, i, s), F.index_fill(x, 1, i, 2.0),
                                    F.index_put(x, (i, i), s[:, 0], True), F.put(x, i, s[0, :2]),
                                    F.masked_scatter(x, x > 0, s.flip(0)),
                                    F.select_scatter(x, s[0], 0, 1),
                                    F.slice_scatter(x, s, 0, 1, 3),
                                    F.diagonal_scatter(x, s[0, :3], 1),
                                    F.index_reduce(x, 0, i, s, "amax")),
     X(3, 4), X(2, 4), Idx([2, 0]),
     covers=("index_fill", "index_put", "put", "masked_scatter", "select_scatter",
             "slice_scatter", "diagonal_scatter", "index_reduce"))
case("median", lambda x: (F.median(x), F.median(x, 1).values, F.nanmedian(x, 0).values,
                          F.kthvalue(x, 2, 1).values, F.mode(x.round(), 1).values,
                          F.quantile(x, fg.tensor([0.2, 0.7]), 1), F.nanquantile(x, 0.5),
                          F.nansum(x), F.nanmean(x, 0), F.aminmax(x, dim=1).max,
                          F.renorm(x, 2, 0, 1.0), F.rot90(x, 1)),
     X(3, 5),
     covers=("nanmedian", "kthvalue", "mode", "quantile", "nanquantile", "nansum", "nanmean",
             "aminmax", "renorm", "rot90"))
case("lgamma", lambda p, u: (F.lgamma(p), F.digamma(p), F.polygamma(2, p), F.mvlgamma(p + 1, 2),
                             F.erfc(u), F.erfinv(u), F.i0(p), F.igamma(p, u), F.igammac(p, u),
                             F.frexp(p).mantissa, F.nextafter(p, u)),
     Pos(3, 4), Unit(3, 4),
     covers=("digamma", "polygamma", "mvlgamma", "erfc", "erfinv", "i0", "igamma", "igammac",
             "frexp", "nextafter"))
case("gcd", lambda i, j: (F.gcd(i, j), F.lcm(i, j), F.frexp(i * 1.5).exponent), Idx([[4, 6], [9, 3]]),
     Idx([2, 3]), grad=False, covers=("lcm",))
case("det", lambda a, b: (F.det(a), F.slogdet(a).logabsdet, F.logdet(a @ a.mT), F.inverse(a),
                          F.cholesky(a @ a.mT + fg.eye(3, dtype=a.dtype)),
                          F.qr(a).R, F.svd(a).S, F.pinverse(a), F.matrix_exp(a),
                          F.triangular_solve(b, a).solution, F.lu_solve(b, *F.lu(a)),
                          F.cholesky_solve(b, F.cholesky(a @ a.mT + fg.eye(3, dtype=a.dtype))),
                          F.cholesky_inverse(F.tril(a) + 3 * fg.eye(3, dtype=a.dtype))),
     X(3, 3), X(3, 2),
     covers=("slogdet", "logdet", "inverse", "cholesky", "qr", "svd", "pinverse", "matrix_exp",
             "triangular_solve", "lu_solve", "lu", "cholesky_solve", "cholesky_inverse"))
case("geqrf", lambda a, c: (F.orgqr(*F.geqrf(a.detach())), F.ormqr(*F.geqrf(a.detach()), c),
                            F.householder_product(a, F.geqrf(a.detach()).tau)),
     X(4, 3), X(4, 2), covers=("orgqr", "ormqr", "householder_product"))
for _name in ("fmod", "lt", "le", "gt", "ge", "eq", "ne", "less", "less_equal", "greater",
              "greater_equal", "not_equal", "logical_xor", "divide", "multiply", "subtract",
              "copysign", "hypot", "xlogy", "ldexp", "heaviside", "nextafter", "igamma",
              "igammac"):
    case(f"inplace-{_name}_", _write_method(f"{_name}_", lambda b: b[:, 1:]), Pos(3, 4), Pos(3))
# Complex values made from real inputs, every output real (the gradient checks weigh real
# outputs): the parts, the conjugate, polar form, and the views as pairs of reals.
case("complex", lambda x, y: (
    F.view_as_real(F.complex(x, y) * F.complex(y, x)), F.polar(x.abs(), y).real,
    F.angle(F.complex(x, y)), F.sgn(F.complex(x, y)).imag, F.conj(F.complex(x, y)).imag,
    F.conj_physical(F.complex(x, y) * 2).imag, F.imag(F.complex(x, y).exp()),
    F.real(F.complex(x, y).sqrt()), F.view_as_complex(F.stack([x, y], -1)).abs(),
    F.resolve_conj(x), F.resolve_neg(y)),
     X(3, 4), X(3, 4), covers=("polar", "angle", "sgn", "conj", "conj_physical", "imag", "real",
                               "view_as_real", "view_as_complex", "resolve_conj", "resolve_neg"))
case("inplace-conj_physical_", _write_method("conj_physical_", lambda b: b[1:]), X(3, 4))
for _name in ("negative", "absolute", "exp2", "log2", "log10", "tan", "fix", "sgn", "frac",
              "deg2rad", "rad2deg", "sinc", "lgamma", "digamma", "erfc", "i0"):
    case(f"inplace-{_name}_", _write_method(f"{_name}_", lambda b: b[1:]), Pos(3, 4))
case("inplace-logit_", _write_method("logit_", lambda b: b), Unit(3, 4))
case("inplace-erfinv_", _write_method("erfinv_", lambda b: b), Unit(3, 4))
case("inplace-cumsum_", _write_method("cumsum_", lambda b: b, 1), X(3, 4))
case("inplace-cumprod_", _write_method("cumprod_", lambda b: b, 0), X(3, 4))
case("inplace-clamp_min_", _write_method("clamp_min_", lambda b: b, 0.2), X(3, 4))
case("inplace-clamp_max_", _write_method("clamp_max_", lambda b: b, 0.2), X(3, 4))
case("inplace-mvlgamma_", _write_method("mvlgamma_", lambda b: b, 2), Pos(3, 4))
case("inplace-renorm_", _write_method("renorm_", lambda b: b, 2, 0, 1.0), X(3, 4))
case("inplace-addmm_", _write_method("addmm_", lambda b: b), X(3, 4), X(3, 2), X(2, 4))
case("inplace-addmv_", _write_method("addmv_", lambda b: b[0]), X(3, 4), X(4, 2), X(2))
case("inplace-addr_", _write_method("addr_", lambda b: b), X(3, 4), X(3), X(4))
case("inplace-baddbmm_", _write_method("baddbmm_", lambda b: b), X(2, 3, 4), X(2, 3, 2),
     X(2, 2, 4))
case("inplace-addbmm_", _write_method("addbmm_", lambda b: b), X(3, 4), X(2, 3, 2), X(2, 2, 4))
case("inplace-index_fill_", _write_method("index_fill_", lambda b: b, 0, fg.tensor([1]), 2.0),
     X(3, 4))
case("inplace-index_copy_", lambda x, s: _then_base(x, lambda b: b.index_copy_(
    0, fg.tensor([2, 0]), s)), X(3, 4), X(2, 4))
case("inplace-index_put_", lambda x, s: _then_base(x, lambda b: b.index_put_(
    (fg.tensor([2, 0]),), s, True)), X(3, 4), X(2, 4))
case("inplace-put_", lambda x, s: _then_base(x, lambda b: b.put_(fg.tensor([2, 5]), s)),
     X(3, 4), X(2))
case("inplace-masked_scatter_", lambda x, s: _then_base(x, lambda b: b.masked_scatter_(
    b > 0, s)), X(3, 4), X(12))
case("inplace-index_reduce_", lambda x, s: _then_base(x, lambda b: b.index_reduce_(
    0, fg.tensor([2, 0]), s, "prod")), X(3, 4), X(2, 4))
case("inplace-gcd_", lambda i, j: _int_write(i, lambda b: b[1:].gcd_(j)), Idx([[4, 6], [9, 3]]),
     Idx([2, 3]), grad=False)
case("inplace-lcm_", lambda i, j: _int_write(i, lambda b: b[:, 1].lcm_(j[0])),
     Idx([[4, 6], [9, 3]]), Idx([2, 3]), grad=False)


def _int_write(i, write):
    """Write through a view of an integer intermediate; return it."""
    base = i + 0
    write(base)
    return base
case("inv", lambda a, b, s: (F.inv(a), F.solve(a, b), F.solve(a, b[:, 0]), F.qr_q(a), F.qr_r(a),
                             F.svd_part(a, 1, False), F.linalg_svd(a, False).S,
                             F.eigh_values(s + s.mT), F.eigh(s + s.mT).eigenvalues,
                             (F.eigh_vectors(s + s.mT) ** 2).sum(0),
                             F.solve_triangular(a, b, upper=False),
                             F.linalg_lu(a).U, F.lu_factor(a).LU,
                             F.linalg_lu_solve(*F.lu_factor(a), b)),
     X(3, 3), X(3, 2), X(3, 3, layout="T"),
     covers=("qr_q", "qr_r", "svd_part", "linalg_svd", "eigh_values", "eigh", "eigh_vectors",
             "solve", "solve_triangular", "linalg_lu", "lu_factor", "linalg_lu_solve"))

# -- dropout variants (their random draws: tests/tracer/test_trace_random.py), layers and
# losses added with torch's names (tests/test_nn_layers.py)
case("nn.dropout1d", lambda x: NF.dropout1d(x, 0.5, training=False) * 2, X(2, 3, 4))
case("nn.dropout2d", lambda x: NF.dropout2d(x, 0.0) * 2, X(2, 3, 4, 2))
case("nn.dropout3d", lambda x: NF.dropout3d(x, 0.5, training=False) * 2, X(2, 3, 2, 2, 2))
case("nn.alpha_dropout", lambda x: NF.alpha_dropout(x, 0.5, training=False) * 2, X(3, 4))
case("nn.feature_alpha_dropout", lambda x: NF.feature_alpha_dropout(x, 0.0) * 2, X(2, 3, 4))
case("nn.threshold", lambda x: NF.threshold(x, 0.3, -1.0), X(3, 4))
case("nn.threshold_", lambda x: NF.threshold_(x * 1, 0.3, -1.0), X(3, 4))
case("nn.softmin", lambda x: NF.softmin(x, dim=1), X(3, 4))
case("nn.glu", lambda x: NF.glu(x, dim=-1), X(3, 4))
case("nn.pixel_shuffle", lambda x: NF.pixel_shuffle(x, 2), X(1, 8, 2, 3))
case("nn.pixel_unshuffle", lambda x: NF.pixel_unshuffle(x, 2), X(1, 2, 4, 6))
case("nn.pairwise_distance", lambda a, b: NF.pairwise_distance(a, b, p=3.0), X(3, 4), X(3, 4))
case("nn.bilinear", lambda a, b, w, c: NF.bilinear(a, b, w, c), X(3, 2), X(3, 4), X(5, 2, 4),
     X(5))
case("nn.poisson_nll_loss", lambda x, y: NF.poisson_nll_loss(x, y, full=True), X(3, 4),
     Pos(3, 4))
case("nn.gaussian_nll_loss", lambda x, y, v: NF.gaussian_nll_loss(x, y, v), X(3, 4), X(3, 4),
     Pos(3, 4))
case("nn.margin_ranking_loss", lambda a, b: NF.margin_ranking_loss(
    a, b, fg.tensor([1.0, -1.0, 1.0]), margin=0.2), X(3), X(3))
case("nn.hinge_embedding_loss", lambda x: NF.hinge_embedding_loss(
    x, fg.tensor([[1.0, -1.0, 1.0, -1.0]] * 3), margin=0.5), X(3, 4))
case("nn.soft_margin_loss", lambda x: NF.soft_margin_loss(
    x, fg.tensor([[1.0, -1.0, 1.0, -1.0]] * 3)), X(3, 4))
case("nn.multilabel_soft_margin_loss", lambda x: NF.multilabel_soft_margin_loss(
    x, fg.tensor([[1.0, 0.0, 1.0, 0.0]] * 3)), X(3, 4))
case("nn.multi_margin_loss", lambda x: NF.multi_margin_loss(x, fg.tensor([0, 3, 1]), margin=0.7),
     X(3, 4))
case("nn.triplet_margin_loss", lambda a, p, n: NF.triplet_margin_loss(a, p, n, margin=0.5),
     X(3, 4), X(3, 4), X(3, 4))
case("nn.triplet_margin_with_distance_loss", lambda a, p, n: NF.triplet_margin_with_distance_loss(
    a, p, n, margin=0.5, swap=True), X(3, 4), X(3, 4), X(3, 4))
