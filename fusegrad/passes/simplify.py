"""Algebraic simplification and canonicalization.

Each rewrite below replaces a node by a value that is *bit for bit* the same for every input
(NaN payloads aside) and of exactly the node's type; a rewrite that would change the type
(``x + 0.0`` where the zero broadcasts ``x`` to a larger shape) is skipped. The rules:

=================================  ==========================================================
arithmetic identities              ``x*1``, ``1*x``, ``x/1`` (floats), ``x-0``, ``x+0``,
                                   ``0+x`` -> ``x``
integer annihilator                ``x*0``, ``0*x`` -> ``0`` (integer and bool dtypes only)
involutions                        ``neg(neg(x))``, ``not(not(x))`` -> ``x``
reshape                            ``reshape(reshape(x))`` -> one reshape; to ``x``'s own
                                   shape -> ``x``
permute                            ``permute(permute(x))`` -> one permute (composed);
                                   identity permutation -> ``x``
broadcast_to                       ``broadcast_to(broadcast_to(x))`` -> one; to ``x``'s own
                                   shape -> ``x``
pad                                ``pad(pad(x))`` with one value -> one pad (widths added:
                                   a strided convolution's phase grid pads its padded input)
cast                               to ``x``'s own dtype -> ``x``; ``cast(cast(x, A), X)`` ->
                                   ``x`` when every value of X survives the trip through A
                                   (f32->f64->f32, i8->f16->i8, i8->u8->i8, bool->any->bool)
where                              ``where(c, x, x)`` -> ``x``; a constant condition picks
                                   its branch
index runs                         ``take(x, i)`` with a constant ``i`` of consecutive
                                   indices ``a, a+1, ...`` in range -> a ``slice`` (a view);
                                   ``index_add(x, i, s)`` with ``i`` every index in order
                                   -> ``x + s`` (positions: ``pos_emb(arange(T))`` and its
                                   gradient)
custom VJP                         ``custom_vjp(y, ...)`` -> ``y`` (the rule it carries is
                                   for differentiation, which is done by then)
canonical order                    a literal operand of a commutative op moves to the right
                                   (``add 1.0, %x`` -> ``add %x, 1.0``), so CSE and rules
                                   see one form
=================================  ==========================================================

"1" and "0" are literals, ``full`` nodes, or ``constant`` nodes whose elements all equal it.

Why some rewrites that look legal are not done, in IEEE arithmetic:

- ``x*0 -> 0`` for floats: ``inf*0`` and ``nan*0`` are NaN and ``-3.0*0`` is ``-0.0``.
- ``x + 0.0 -> x`` for floats: ``-0.0 + 0.0`` is ``+0.0``, so only ``x + -0.0`` is exact;
  likewise ``x - 0.0`` is exact but ``x - -0.0`` is not. ``ignore_signed_zeros=true``
  (LLVM's ``nsz``) allows both.
- ``x/1`` for integers: integer division computes in float64 and rounds back, which is not
  the identity above 2**53.
- ``neg``/``sub`` of booleans raise in numpy; they are left for the program to fail.
- ``cast(cast(x, A), B) -> cast(x, B)`` in general: float-to-int conversions of NaN, inf or
  out-of-range values are not defined alike for every pair of types.

Like MLIR's canonicalizer, the pass erases nodes its rewrites leave dead (``prune=false``
keeps every node for ``dce`` to take).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import ml_dtypes
import numpy as np

from fusegrad.dtypes import DType, to_real
from fusegrad.ir.graph import Graph, Literal, Node, Operand, Value
from fusegrad.ir.printer import format_scalar
from fusegrad.ir.rewrite import GraphCopier
from fusegrad.ops.primitive import PRIMITIVES, TensorType, infer_type
from fusegrad.passes.cse import COMMUTATIVE
from fusegrad.passes.dce import dce
from fusegrad.passes.manager import Pass, register_pass
from fusegrad.symint import SymInt, known_equal

__all__ = ["simplify", "simplify_node", "Simplify", "RULES", "RewriteOptions", "rule",
           "cast_is_exact"]

# A rule's answer: a replacement operand, a node to build instead (op, operands, attrs), or
# None when it does not apply.
NodeSpec = tuple[str, list, dict]
Rewrite = Union[Value, Literal, NodeSpec, None]

# --------------------------------------------------------------------------- matching helpers


def _producer(op: Operand) -> Node | None:
    return op.producer if isinstance(op, Value) else None


def _splat(op: Operand) -> np.ndarray | None:
    """The elements of ``op`` when it is a literal, a ``full`` or a non-empty ``constant``
    (not a ``full`` of a symbolic size: its value is the call's)."""
    if isinstance(op, Literal):
        return np.asarray(op.value, dtype=op.dtype.np_dtype)
    node = _producer(op)
    if node is None:
        return None
    if node.op == "full" and not isinstance(node.attrs["value"], SymInt):
        return np.asarray(node.attrs["value"], dtype=node.attrs["dtype"].np_dtype)
    if node.op == "constant" and node.attrs["value"].array.size:
        return node.attrs["value"].array
    return None


def _all_equal(op: Operand, target: float, sign_matters: bool = False) -> bool:
    """Whether every element of ``op`` equals ``target`` (and, for a zero whose sign
    matters, has the sign of ``target``)."""
    a = _splat(op)
    if a is None or a.dtype.kind == "c":    # complex values are left as they are
        return False
    if float(a.reshape(-1)[0]) != target:     # cheap test before a big constant
        return False
    a = a.astype(np.float64)
    if not np.all(a == target):
        return False
    return not sign_matters or bool(np.all(np.signbit(a) == np.signbit(target)))


def _is_one(op: Operand) -> bool:
    return _all_equal(op, 1.0)


def _is_zero(op: Operand, sign: float | None = None) -> bool:
    """A zero; with ``sign`` (``0.0`` or ``-0.0``) only that zero."""
    return _all_equal(op, 0.0 if sign is None else sign, sign_matters=sign is not None)


def _same_operand(a: Operand, b: Operand) -> bool:
    if isinstance(a, Literal) and isinstance(b, Literal):
        # The printed spelling tells -0.0 from 0.0 and makes every NaN the same.
        return a.dtype is b.dtype and format_scalar(a.value, a.dtype) == format_scalar(
            b.value, b.dtype)
    return a is b


def _zeros(out: TensorType) -> Operand | NodeSpec:
    value = False if out.dtype.category == 0 else 0
    if out.shape == ():
        return Literal(value, out.dtype)
    return ("full", [], {"shape": out.shape, "value": value, "dtype": out.dtype})


def _float_limits(dtype: DType) -> tuple[int, int, int]:
    info = ml_dtypes.finfo(dtype.np_dtype)
    return info.nmant, info.maxexp, info.minexp - info.nmant    # last: smallest subnormal


def cast_is_exact(src: DType, dst: DType) -> bool:
    """Whether every value of ``src`` survives a cast to ``dst`` and back:
    ``cast(cast(x, dst), src) == x``, bit for bit (NaN payloads aside)."""
    if src is dst or src.category == 0:
        return True     # bools become 0/1, and x != 0 brings them back
    if src.category == 3 or dst.category == 3:
        # a complex value keeps its imaginary part only in a complex type
        return dst.category == 3 and cast_is_exact(to_real(src), to_real(dst))
    if dst.category == 0 or (src.category == 2 and dst.category != 2):
        return False
    if src.category == 1:
        if dst.category == 1:
            # Integer casts wrap modulo 2**bits (numpy, and LLVM's trunc/sext/zext), so a
            # trip through at least as many bits comes back: i8 -> u8 -> i8 is exact.
            return dst.itemsize >= src.itemsize
        # Integers up to 2**(mantissa bits + 1) are exact in a float.
        lo, hi = np.iinfo(src.np_dtype).min, np.iinfo(src.np_dtype).max
        return max(-int(lo), int(hi)) <= 2 ** (_float_limits(dst)[0] + 1)
    mant_s, max_s, tiny_s = _float_limits(src)
    mant_d, max_d, tiny_d = _float_limits(dst)
    return mant_d >= mant_s and max_d >= max_s and tiny_d <= tiny_s


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class RewriteOptions:
    """What the rules may assume (the pass's options)."""

    ignore_signed_zeros: bool = False


RuleFn = Callable[[RewriteOptions, list, dict, TensorType], Rewrite]
RULES: dict[str, list[RuleFn]] = {}


def rule(*ops: str) -> Callable[[RuleFn], RuleFn]:
    """Register a rewrite rule for the primitives ``ops``."""
    def register(fn: RuleFn) -> RuleFn:
        for op in ops:
            RULES.setdefault(op, []).append(fn)
        return fn
    return register


@rule(*sorted(COMMUTATIVE))
def literal_to_the_right(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    x, y = ins
    if isinstance(x, Literal) and isinstance(y, Value):
        return (None, [y, x], attrs)     # None: the same primitive
    return None


@rule("add")
def add_zero(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    x, y = ins
    if out.dtype.category >= 2 and not opts.ignore_signed_zeros:
        # -0.0 + 0.0 is +0.0: only adding -0.0 is the identity.
        if _is_zero(y, -0.0):
            return x
        return y if _is_zero(x, -0.0) else None
    if _is_zero(y):
        return x
    return y if _is_zero(x) else None


@rule("sub")
def sub_zero(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    x, y = ins
    if out.dtype.category == 0:
        return None     # numpy refuses to subtract booleans
    if out.dtype.category >= 2 and not opts.ignore_signed_zeros:
        return x if _is_zero(y, 0.0) else None      # -0.0 - -0.0 is +0.0
    return x if _is_zero(y) else None


@rule("mul")
def mul_one_or_zero(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    x, y = ins
    if _is_one(y):
        return x
    if _is_one(x):
        return y
    # inf * 0 and nan * 0 are NaN, -1.0 * 0 is -0.0: only exact for integers and bools.
    if out.dtype.category < 2 and (_is_zero(x) or _is_zero(y)):
        return _zeros(out)
    return None


@rule("div")
def div_one(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    x, y = ins
    return x if out.dtype.category >= 2 and _is_one(y) else None


@rule("neg")
def neg_neg(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    inner = _producer(ins[0])
    if inner is not None and inner.op == "neg" and out.dtype.category != 0:
        return inner.inputs[0]
    return None


@rule("not")
def not_not(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    inner = _producer(ins[0])
    if inner is not None and inner.op == "not":
        return inner.inputs[0]       # kept only when it is bool: the type check decides
    return None


@rule("reshape")
def reshape_chain(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    (x,) = ins
    if tuple(attrs["shape"]) == x.type.shape:
        return x
    inner = _producer(x)
    if inner is not None and inner.op == "reshape":
        return ("reshape", [inner.inputs[0]], attrs)
    return None


@rule("permute")
def permute_chain(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    (x,) = ins
    perm = tuple(attrs["perm"])
    if perm == tuple(range(len(perm))):
        return x
    inner = _producer(x)
    if inner is not None and inner.op == "permute":
        # out[i] = x[perm[i]] = inner_x[inner_perm[perm[i]]]
        first = tuple(inner.attrs["perm"])
        return ("permute", [inner.inputs[0]], {"perm": tuple(first[p] for p in perm)})
    return None


@rule("broadcast_to")
def broadcast_chain(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    (x,) = ins
    if tuple(attrs["shape"]) == x.type.shape:
        return x
    inner = _producer(x)
    if inner is not None and inner.op == "broadcast_to":
        return ("broadcast_to", [inner.inputs[0]], attrs)
    return None


@rule("pad")
def pad_chain(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    inner = _producer(ins[0])
    if inner is None or inner.op != "pad" or not isinstance(inner.inputs[0], Value):
        return None
    value = attrs["value"]
    if inner.attrs["value"] != value or isinstance(value, float) and np.isnan(value):
        return None
    widths = tuple((a + c, b + d) for (a, b), (c, d) in zip(inner.attrs["widths"], attrs["widths"]))
    return ("pad", [inner.inputs[0]], {"widths": widths, "value": value})


@rule("cast")
def cast_chain(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    (x,) = ins
    if attrs["dtype"] is x.type.dtype:
        return x
    inner = _producer(x)
    if inner is not None and inner.op == "cast":
        source = inner.inputs[0]
        if attrs["dtype"] is source.type.dtype and cast_is_exact(source.type.dtype, x.type.dtype):
            return source
    return None


@rule("where")
def where_same_or_known(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    c, x, y = ins
    if _same_operand(x, y):
        return x
    cond = _splat(c)
    if cond is not None:
        if bool(np.all(cond)):
            return x
        if not np.any(cond):
            return y
    return None


def _index_run(op: Operand, size: int) -> int | None:
    """The first index of ``op`` when it is a 1-D integer constant of consecutive indices
    ``a, a+1, ...`` within ``[0, size)``; else None."""
    node = _producer(op)
    if node is None or node.op != "constant":
        return None
    a = node.attrs["value"].array
    if a.ndim != 1 or not a.size or a.dtype.kind not in "iu":
        return None
    start = int(a[0])
    if start < 0 or start + a.size > size or \
            not np.array_equal(a, np.arange(start, start + a.size)):
        return None
    return start


@rule("custom_vjp")
def drop_custom_vjp(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    return ins[0]


@rule("slice")
def slice_of_a_pad(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    """A slice that takes exactly what a pad padded (the gradient of a slice, sliced again)
    is the pad's input."""
    pad = _producer(ins[0])
    if pad is None or pad.op != "pad" or not isinstance(pad.inputs[0], Value):
        return None
    x = pad.inputs[0]
    lows = tuple(lo for lo, _ in pad.attrs["widths"])
    if attrs["starts"] == lows and all(s == 1 for s in attrs["steps"]) and \
            tuple(b - a for a, b in zip(attrs["starts"], attrs["stops"])) == x.type.shape:
        return x
    return None


@rule("take")
def take_of_a_run(opts: RewriteOptions, ins: list, attrs: dict, out: TensorType) -> Rewrite:
    x, idx = ins
    axis = attrs["axis"]
    start = _index_run(idx, x.type.shape[axis])
    if start is None:
        return None
    starts, stops = [0] * len(x.type.shape), list(x.type.shape)
    starts[axis], stops[axis] = start, start + idx.type.shape[0]
    return ("slice", [x], {"starts": tuple(starts), "stops": tuple(stops),
                           "steps": (1,) * len(starts)})


@rule("index_add")
def index_add_of_every_index(opts: RewriteOptions, ins: list, attrs: dict,
                             out: TensorType) -> Rewrite:
    # Each element gets one addition, as np.add.at with distinct indices does.
    x, idx, src = ins
    size = x.type.shape[attrs["axis"]]
    if known_equal(idx.type.shape, (size,)) and _index_run(idx, size) == 0:
        return ("add", [x, src], {})
    return None


# --------------------------------------------------------------------------- driver


def _infer(op: str, inputs: list, attrs: dict) -> TensorType | None:
    try:
        return infer_type(PRIMITIVES[op], [o.type for o in inputs], attrs)
    except (ValueError, TypeError, IndexError, KeyError):
        return None


def simplify_node(opts: RewriteOptions, op: str, inputs: list, attrs: dict,
                  out: TensorType, max_steps: int = 16) -> Operand | NodeSpec:
    """Apply rules to the node ``op(inputs){attrs} : out`` until none applies: a replacement
    operand, or the node to build (perhaps unchanged)."""
    for _ in range(max_steps):
        for fn in RULES.get(op, ()):
            r = fn(opts, inputs, attrs, out)
            if r is None:
                continue
            if isinstance(r, (Value, Literal)):
                if r.type == out:
                    return r
                continue       # it would change the type: not this rule
            new_op = r[0] or op
            if _infer(new_op, r[1], r[2]) == out and (new_op, r[1], r[2]) != (op, inputs, attrs):
                op, inputs, attrs = new_op, list(r[1]), dict(r[2])
                break
        else:
            break
    return op, inputs, attrs


def simplify(g: Graph, ignore_signed_zeros: bool = False, prune: bool = True) -> Graph:
    """A copy of ``g`` with the rewrites of the module docstring applied everywhere."""
    opts = RewriteOptions(ignore_signed_zeros)
    c = GraphCopier(g)
    for node in g.nodes:
        operands = [c.get(op) for op in node.inputs]
        # Operands are already simplified (topological order), so one sweep suffices.
        r = simplify_node(opts, node.op, operands, node.attrs, node.output.type)
        if isinstance(r, (Value, Literal)):
            c.alias(node.output, r)
            continue
        op, inputs, attrs = r
        if op == node.op and attrs is node.attrs and inputs == operands:
            c.emit(node, operands)
        else:
            c.alias(node.output, c.new.add_node(op, inputs, attrs, loc=node.loc))
    result = c.finish()
    return dce(result) if prune else result


@register_pass
class Simplify(Pass):
    """Algebraic identities and canonical forms (see the module docstring for the list).

    Legal because each rewrite gives the same bits, NaN and signed zeros included, and the
    same type; options: ``ignore_signed_zeros`` (also fold ``x + 0.0``, ``x - -0.0``),
    ``prune`` (erase nodes left dead).
    """

    name = "simplify"
    ignore_signed_zeros: bool = False
    prune: bool = True

    def run(self, graph: Graph) -> Graph:
        return simplify(graph, self.ignore_signed_zeros, self.prune)
