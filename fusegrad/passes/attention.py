"""Attention written out by the user, fused into one primitive before it is differentiated.

A model written for PyTorch spells attention as ::

    att = (q @ k.transpose(-2, -1)) * scale
    att = att.masked_fill(mask == 0, float("-inf"))
    y = F.softmax(att, dim=-1) @ v

(or calls ``F.scaled_dot_product_attention``, whose composition is the same). Traced, that is
a batched matmul, a multiply, a ``where``, the softmax's nodes and a second batched matmul,
and its gradient five more batched matmuls and the softmax's VJP: at small heads (32 queries
by 16 features) each product is one BLAS call per head and each score-sized array a trip
through memory. :func:`fuse_attention` finds the chain, ending at the product with ``v``,
and replaces that product's node by a slice of a
:data:`~fusegrad.ops.fused_attention.fused_attention` node, which computes the same value
(and packs the weights beside it for its VJP, one ``fused_attention_backward`` node). The
chain's own nodes stay in the graph: if nothing else reads them, dead code elimination
removes them; if something does (the weights are also returned), they still compute it, and
its gradient still flows through them, so the rewrite never changes a result beyond
rounding.

It applies to self-attention (``q``, ``k`` and ``v`` of one shape) of float32 or float64 on
the CPU, with a boolean mask or none, at sizes the native code takes
(:func:`fusegrad.codegen.attention.supported`); anything else is left as written. It
runs when a compiled function calls ``backward()``, on the graph recorded so far, unless the
backward is itself to be differentiated (``create_graph=True``), and on a copy of a compiled
function's graph before it is partitioned into a forward and a backward for eager autograd
(``fg.compile(model)``, then ``loss.backward()``). Inference graphs are not rewritten.
"""

from __future__ import annotations

import math

from fusegrad.codegen.attention import MAX_KEYS, MAX_TILE, supported
from fusegrad.ir.graph import Graph, Literal, Node, Value
from fusegrad.ir.rewrite import copy_graph
from fusegrad.ops.fused_attention import fused_attention
from fusegrad.ops.primitive import PRIMITIVES, TensorType
from fusegrad.passes.manager import Pass, register_pass
from fusegrad.symint import because

__all__ = ["fuse_attention", "FuseAttention"]


def _made_by(v, op: str) -> Node | None:
    if isinstance(v, Value) and v.producer is not None and v.producer.op == op:
        return v.producer
    return None


def _literal(v) -> float | None:
    return float(v.value) if isinstance(v, Literal) else None


def _split_scale(t: Value) -> tuple[Value, float]:
    """(the product, the scale) of ``product * scale``, ``product / d`` or a bare product."""
    node = t.producer
    if node is not None and node.op == "mul":
        a, b = node.inputs
        if _literal(b) is not None and isinstance(a, Value):
            return a, _literal(b)
        if _literal(a) is not None and isinstance(b, Value):
            return b, _literal(a)
    if node is not None and node.op == "div":
        a, b = node.inputs
        d = _literal(b)
        if d is not None and d != 0 and isinstance(a, Value):
            return a, 1.0 / d
    return t, 1.0


def _match(node: Node) -> tuple[list, dict] | None:
    """Operands and attributes of the fused node replacing ``node`` (``weights @ v``)."""
    weights, v = node.inputs
    cv = _made_by(weights, "custom_vjp")
    if cv is None or cv.attrs["rule"] != "softmax" or len(cv.inputs) != 2 or \
            not isinstance(v, Value):
        return None
    value, scores = cv.inputs
    (dim,) = cv.attrs["params"]
    if not isinstance(scores, Value) or dim not in (-1, scores.type.ndim - 1):
        return None
    div = _made_by(value, "div")
    if div is None:
        return None
    zero_dead = _made_by(div.inputs[1], "where") is not None    # sdpa: e / where(dead, 1, sum)
    mask, keep, t = None, False, scores
    where = _made_by(scores, "where")
    if where is not None:
        cond, a, b = where.inputs
        if not isinstance(cond, Value):
            return None
        if _literal(a) == -math.inf and isinstance(b, Value):
            mask, keep, t = cond, False, b
        elif _literal(b) == -math.inf and isinstance(a, Value):
            mask, keep, t = cond, True, a
        else:
            return None
        if t.type.shape != scores.type.shape:
            return None
    product, scale = _split_scale(t)
    mm = _made_by(product, "matmul")
    if mm is None or not all(isinstance(x, Value) for x in mm.inputs):
        return None
    q, kt = mm.inputs
    perm = _made_by(kt, "permute")
    n = q.type.ndim
    if perm is None or tuple(perm.attrs["perm"]) != tuple(range(n - 2)) + (n - 1, n - 2):
        return None
    k = perm.inputs[0]
    if not isinstance(k, Value) or not (q.type == k.type == v.type == node.output.type):
        return None
    L, E = q.type.shape[-2:] if n >= 2 else (0, 0)
    if q.type.device != "cpu" or not math.isfinite(scale):
        return None
    # (A symbolic length is assumed within what the kernels take, and guarded.)
    with because(f"the fused attention takes at most {MAX_KEYS} keys, and keys x features "
                  f"at most {MAX_TILE}"):
        if not supported(q.type.dtype.np_dtype, L, L, E):
            return None
    operands = [q, k, v] + ([mask] if mask is not None else [])
    return operands, {"scale": scale, "keep": keep, "zero_dead": zero_dead}


def fuse_attention(g: Graph) -> dict[Value, Value]:
    """Replace each attention chain of ``g`` ending at its product with ``v`` by one
    ``fused_attention`` node, in place: the product's node becomes a slice of the fused
    node's packed result (so its value keeps its identity). Returns {packed result: the
    product's value} of the chains fused: a trace marks a packed result as needing a
    gradient where the product did."""
    nodes: list[Node] = []
    fused: dict[Value, Value] = {}
    for node in g.nodes:
        found = _match(node) if node.op == "matmul" else None
        if found is None:
            nodes.append(node)
            continue
        operands, attrs = found
        y = node.output
        shape = y.type.shape
        packed = Value(TensorType(shape[:-1] + (shape[-1] + shape[-2],), y.type.dtype,
                                  y.type.device))
        new = Node(fused_attention, operands, attrs, packed, node.loc, node.region)
        packed.producer = new
        n = len(shape)
        take = Node(PRIMITIVES["slice"], [packed], {
            "starts": (0,) * n, "stops": shape, "steps": (1,) * n}, y, node.loc, node.region)
        y.producer = take
        nodes += [new, take]
        fused[packed] = y
    g.nodes[:] = nodes
    return fused


@register_pass
class FuseAttention(Pass):
    """Fuse the attention chains of a graph (:func:`fuse_attention`), on a copy: the input
    graph is returned unchanged when there is none."""

    name = "fuse-attention"

    def run(self, graph: Graph) -> Graph:
        fused = copy_graph(graph)
        return fused if fuse_attention(fused) else graph
