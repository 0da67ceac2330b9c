"""Matmul layout: compute a transposed product in the layout its user wants.

``permute(matmul(a, b))`` swapping the last two axes is ``matmul(bᵀ, aᵀ)``: the same
products, summed by the same BLAS call with transposed operands (a view of an operand is
folded into the call's strides for free). The rewrite matters for gradients: the VJP of
``x @ W.T`` (``nn.Linear``) with respect to ``W`` is ``(xᵀ @ g)ᵀ``, which left as it is
materializes ``xᵀ @ g`` and then reads it transposed, so an optimizer update cannot join
the matmul as its epilogue and a transposed copy is made for ``W.grad``. After the rewrite
the product is written in ``W``'s own layout.

The pass also places two other layouts for fusion: elementwise ops behind a reshape of a
product move before it, into the product's epilogue (:func:`epilogues_through_reshape`), and
a reshape of a view that no strides express (the axes of a permuted view merged) reads a
copy made in the view's shape (:func:`copies_before_reshape`).

Like any change of BLAS call, the summation order may differ from the unrewritten
program's in the last bits, so the pass is not part of ``simplify`` (which only makes
bit-exact rewrites); the default pipeline of ``fusegrad.compile`` runs it.
"""

from __future__ import annotations

import numpy as np

from fusegrad.ir.graph import Graph, Literal, Value
from fusegrad.ir.kernel_graph import identity_view, view_of
from fusegrad.ir.rewrite import GraphCopier, copy_marks
from fusegrad.ops.primitive import Kind
from fusegrad.passes.dce import dce
from fusegrad.passes.manager import Pass, register_pass
from fusegrad.symint import SymbolicDecisionError, at_hints, known_equal

__all__ = ["transpose_matmuls", "epilogues_through_reshape", "copies_before_reshape",
           "MatmulLayout"]


def _swap_last_two(ndim: int) -> tuple[int, ...]:
    return tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)


def transpose_matmuls(g: Graph) -> Graph:
    """A copy of ``g`` where each ``permute`` swapping the last two axes of a matmul's
    result (its only use), or of a cast of it, is a matmul of the transposed operands
    instead (cast after it)."""
    users: dict[Value, int] = {}
    for node in g.nodes:
        for op in node.inputs:
            if isinstance(op, Value):
                users[op] = users.get(op, 0) + 1
    for o in g.outputs:
        if isinstance(o, Value):
            users[o] = users.get(o, 0) + 1
    c = GraphCopier(g)
    for node in g.nodes:
        inner = node.inputs[0].producer if node.op == "permute" and \
            isinstance(node.inputs[0], Value) else None
        # A cast between them (a 16-bit operand's gradient, a float32 product rounded) is
        # elementwise: it is taken along, after the product.
        cast = None
        if inner is not None and inner.op == "cast" and users[inner.output] == 1 and \
                isinstance(inner.inputs[0], Value):
            cast, inner = inner, inner.inputs[0].producer
        if inner is not None and inner.op == "matmul" and users[inner.output] == 1:
            a, b = inner.inputs
            nd = node.output.type.ndim
            if nd >= 2 and a.type.ndim == nd and b.type.ndim == nd and \
                    tuple(node.attrs["perm"]) == _swap_last_two(nd):
                perm = {"perm": _swap_last_two(nd)}
                bt = c.new.add_node("permute", [c.get(b)], perm, loc=node.loc)
                at = c.new.add_node("permute", [c.get(a)], perm, loc=node.loc)
                out = c.new.add_node("matmul", [bt, at], {}, loc=inner.loc)
                if cast is not None:
                    out = c.new.add_node("cast", [out], cast.attrs, loc=cast.loc)
                c.alias(node.output, out)
                continue
        c.emit(node)
    return dce(c.finish())


def _strided_reshape(shape, target, into) -> bool:
    """Whether a value of ``shape`` broadcast to ``target`` and reshaped to ``into`` is a
    strided view (fusion folds it into loads instead of copying it). Symbolic sizes stand
    in at their hints: whether a reshape is a view depends on which sizes are 1 and how
    they group, which every size of a symbol (>= 2) shares."""
    stand = np.broadcast_to(np.empty(at_hints(shape), dtype=np.uint8), at_hints(target))
    try:
        np.reshape(stand, at_hints(into), copy=False)
    except ValueError:
        return False
    return True


def epilogues_through_reshape(g: Graph) -> Graph:
    """A copy of ``g`` where elementwise ops applied to ``reshape(matmul(...))`` are applied
    to the matmul's result and reshaped after: ``relu(reshape(x @ w + b))`` (a convolution's
    activation: the product is (N, 1, C, H*W), the conv's result (N, C, H, W)) becomes
    ``reshape(relu(x @ w + b))``, which fusion joins to the matmul as its epilogue. Only
    where every other operand is a literal, another such reshape, or a graph input whose
    broadcast reshapes to the product's shape as a strided view (so nothing is copied). A
    value computed elsewhere stays where it is: moving its users into the product's shape
    split them from the reductions they fused with in their own (the transformer step's
    residual adds and layer norms went from one kernel to two). Elementwise ops are
    bit-exact under any reshape of all their operands."""
    at_product: set[Value] = set()        # new values computed in a matmul's shape

    def product_shaped(v) -> bool:
        return isinstance(v, Value) and (v in at_product or (
            v.producer is not None and v.producer.op == "matmul"))

    def source(op):
        """The product-shaped value that new operand ``op`` reshapes, or None."""
        p = op.producer if isinstance(op, Value) else None
        if p is None or p.op != "reshape" or not product_shaped(p.inputs[0]):
            return None
        return p.inputs[0]

    c = GraphCopier(g)
    for node in g.nodes:
        if node.prim.kind is Kind.ELEMENTWISE and node.inputs:
            ins = [c.get(op) for op in node.inputs]
            sources = [source(op) for op in ins]
            shape = node.output.type.shape
            inner = next((s for s in sources if s is not None), None)
            if inner is not None and tuple(ins[sources.index(inner)].type.shape) == shape:
                into = inner.type.shape
                moved = []
                for op, src in zip(ins, sources):
                    if isinstance(op, Literal):
                        moved.append(op)
                    elif src is not None and src.type.shape == into:
                        moved.append(src)
                    elif op.producer is None and _strided_reshape(op.type.shape, shape, into):
                        # (A broadcast to its own shape is a copy: equal for every size
                        # or not, the program is right, and assumes nothing of the sizes.)
                        if not known_equal(tuple(op.type.shape), tuple(shape)):
                            op = c.new.add_node("broadcast_to", [op], {"shape": shape},
                                                loc=node.loc)
                        moved.append(c.new.add_node("reshape", [op], {"shape": into},
                                                    loc=node.loc))
                    else:
                        break
                else:
                    out = c.new.add_node(node.prim, moved, node.attrs, loc=node.loc)
                    # A moved remat barrier stays one (fusion keeps what it starts apart).
                    copy_marks(node, out.producer)
                    at_product.add(out)
                    c.alias(node.output, c.new.add_node("reshape", [out], {"shape": shape},
                                                        loc=node.loc))
                    continue
        out = c.emit(node)
        if node.prim.kind is Kind.ELEMENTWISE and any(
                product_shaped(op) and op.type.shape == out.type.shape for op in out.producer.inputs):
            at_product.add(out)         # the matmul's epilogue so far (its bias)
    return dce(c.finish())


# Users that read their operands from memory whatever computes them: a copy made before
# a reshape they read takes nothing away from them.
_READ_FROM_MEMORY = {"pad", "concat", "matmul"}


def copies_before_reshape(g: Graph) -> Graph:
    """A copy of ``g`` where a reshape of a view (a permute, slice, broadcast, ...) that no
    strides express reads a copy of the view made in the view's own shape:
    ``reshape(permute(x))`` becomes ``reshape(copy(permute(x)))``, where the reshape of the
    contiguous copy is a free view. Fusion would copy the view anyway, but in the reshape's
    shape, whose merged axes the loads take apart again by division (the attention heads'
    gradients, (B, H, T, D) -> (B, T, H * D): an unvectorized loop, 54 us per copy of 32K
    floats in the char transformer's step); in the view's shape the innermost axis is
    contiguous on both sides. Only where every user of the reshape reads it from memory
    anyway (a pad, a concatenation, a matmul, another view, the graph's outputs): an
    elementwise user would have joined the copy. Copies are bit-exact."""
    users = g.users()

    def is_view(p) -> bool:
        return p is not None and p.prim.kind is Kind.MOVEMENT and p.op not in ("pad", "concat")

    def strided(v):
        """``v`` as a view of the value its movement ops start from, or None (also when
        they start from a literal: a scalar broadcast, as a gradient of ``0.5 * y`` is)."""
        if not isinstance(v, Value):
            return None
        if not is_view(v.producer):
            return identity_view(v)
        src = strided(v.producer.inputs[0])
        return view_of(v.producer, src) if src is not None else None

    def wanted(node) -> bool:
        if node.op != "reshape":
            return False
        x = node.inputs[0]
        if not isinstance(x, Value) or not is_view(x.producer):
            return False
        try:
            source = strided(x)
            if source is None or view_of(node, source) is not None:
                return False
        except SymbolicDecisionError:
            return False            # symbolic strides: the copy is left to fusion

        return all(u.op in _READ_FROM_MEMORY or is_view(u) for u in users.get(node.output, []))

    targets = {n for n in g.nodes if wanted(n)}
    if not targets:
        return g
    c = GraphCopier(g)
    for node in g.nodes:
        if node in targets:
            copied = c.new.add_node("copy", [c.get(node.inputs[0])], {}, loc=node.loc)
            c.alias(node.output, c.new.add_node("reshape", [copied], node.attrs,
                                                loc=node.loc))
            continue
        c.emit(node)
    return c.finish()


@register_pass
class MatmulLayout(Pass):
    """``permute(matmul(a, b))`` (last two axes) -> ``matmul(bᵀ, aᵀ)``: transposed
    products written in their user's layout; and elementwise ops after a reshape of a
    product computed in the product's shape, so that they join it as its epilogue (see
    :func:`epilogues_through_reshape`); and a copy of a view in its own shape before a
    reshape that no strides express (see :func:`copies_before_reshape`)."""

    name = "matmul-layout"

    def run(self, graph: Graph) -> Graph:
        return copies_before_reshape(epilogues_through_reshape(transpose_matmuls(graph)))
