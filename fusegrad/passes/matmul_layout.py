"""Matmul layout: compute a transposed product in the layout its user wants.

``permute(matmul(a, b))`` swapping the last two axes is ``matmul(bᵀ, aᵀ)``: the same
products, summed by the same BLAS call with transposed operands (a view of an operand is
folded into the call's strides for free). The rewrite matters for gradients: the VJP of
``x @ W.T`` (``nn.Linear``) with respect to ``W`` is ``(xᵀ @ g)ᵀ``, which left as it is
materializes ``xᵀ @ g`` and then reads it transposed, so an optimizer update cannot join
the matmul as its epilogue and a transposed copy is made for ``W.grad``. After the rewrite
the product is written in ``W``'s own layout.

Like any change of BLAS call, the summation order may differ from the unrewritten
program's in the last bits, so the pass is not part of ``simplify`` (which only makes
bit-exact rewrites); the default pipeline of ``fusegrad.compile`` runs it.
"""

from __future__ import annotations

from fusegrad.ir.graph import Graph, Value
from fusegrad.ir.rewrite import GraphCopier
from fusegrad.passes.dce import dce
from fusegrad.passes.manager import Pass, register_pass

__all__ = ["transpose_matmuls", "MatmulLayout"]


def _swap_last_two(ndim: int) -> tuple[int, ...]:
    return tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)


def transpose_matmuls(g: Graph) -> Graph:
    """A copy of ``g`` where each ``permute`` swapping the last two axes of a matmul's
    result (its only use) is a matmul of the transposed operands instead."""
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
        if inner is not None and inner.op == "matmul" and users[inner.output] == 1:
            a, b = inner.inputs
            nd = node.output.type.ndim
            if nd >= 2 and a.type.ndim == nd and b.type.ndim == nd and \
                    tuple(node.attrs["perm"]) == _swap_last_two(nd):
                perm = {"perm": _swap_last_two(nd)}
                bt = c.new.add_node("permute", [c.get(b)], perm, loc=node.loc)
                at = c.new.add_node("permute", [c.get(a)], perm, loc=node.loc)
                c.alias(node.output, c.new.add_node("matmul", [bt, at], {}, loc=inner.loc))
                continue
        c.emit(node)
    return dce(c.finish())


@register_pass
class MatmulLayout(Pass):
    """``permute(matmul(a, b))`` (last two axes) -> ``matmul(bᵀ, aᵀ)``: transposed
    products written in their user's layout (see the module docstring)."""

    name = "matmul-layout"

    def run(self, graph: Graph) -> Graph:
        return transpose_matmuls(graph)
