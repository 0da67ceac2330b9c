"""Common subexpression elimination: one node per distinct computation.

Two nodes compute the same value when they apply the same primitive to the same operands
with the same attributes. Every primitive is a pure function of its operands and attributes,
so the later node can be replaced by the earlier one's result. Sameness is exact:

- operands: the same SSA value, or literals with the same dtype and the same spelling
  (``0.0`` and ``-0.0`` differ, two ``nan`` literals are the same computation);
- attributes: compared by their printed form, so ``full {value=0.0}`` and ``{value=-0.0}``
  stay apart (Python's ``0.0 == -0.0`` would merge them), and constants by their bytes
  (:class:`~fusegrad.ops.primitive.ConstantData` compares by content);
- result type: the same too (implied by the rest, kept as a safety net).

Commutative primitives (``add``, ``mul``, ``maximum``, ``minimum``, ``eq``, ``ne``, ``and``,
``or``) compare their operands as an unordered pair, so ``a + b`` and ``b + a`` are one
node: IEEE addition and multiplication are commutative (NaN payloads aside, which nothing in
fusegrad keeps), and so are the others.

``random_uniform`` is keyed by its key operand (seed, offset): two draws with the same key
give the same bits by construction of the counter-based generator, so merging them is
legal. Programs that want independent draws must use different keys, which the tracer does.

>>> print(cse(parse('''graph @f(%x: f32[4]) -> (f32[4]) {
...   %0 = exp %x : f32[4]
...   %1 = exp %x : f32[4]
...   %2 = add %0, %1 : f32[4]
...   return %2
... }''')))                                                            # doctest: +SKIP
graph @f(%x: f32[4]) -> (f32[4]) {
  %0 = exp %x : f32[4]
  %1 = add %0, %0 : f32[4]
  return %1
}
"""

from __future__ import annotations

from typing import Hashable

from fusegrad.ir.graph import Graph, Literal, Node, Operand, Value
from fusegrad.ir.printer import format_attr, format_scalar, format_type
from fusegrad.ir.rewrite import GraphCopier
from fusegrad.ops.lowering import COMMUTATIVE
from fusegrad.ops.primitive import ConstantData
from fusegrad.passes.manager import Pass, register_pass

__all__ = ["cse", "CommonSubexpressionElimination", "COMMUTATIVE"]

# COMMUTATIVE (operand order does not change the result, bit for bit) is registered with each
# primitive's lowering in fusegrad.ops.lowering; re-exported here for the passes that read it.


def _operand_key(op: Operand) -> Hashable:
    if isinstance(op, Literal):
        # The printed spelling tells -0.0 from 0.0 and makes every NaN the same literal.
        return ("literal", format_scalar(op.value, op.dtype), op.dtype.short)
    return ("value", id(op))


def _attr_key(value) -> Hashable:
    if isinstance(value, ConstantData):
        return value                  # hashed and compared by dtype, shape and bytes
    if isinstance(value, (tuple, list)):
        return tuple(_attr_key(v) for v in value)
    return format_attr(value)


def node_key(node: Node, operands: list[Operand], commutative: bool = True) -> Hashable:
    """What makes ``node`` (with its operands already remapped to ``operands``) the same
    computation as another: primitive, operands, attributes and result type."""
    keys = [_operand_key(op) for op in operands]
    if commutative and node.op in COMMUTATIVE:
        keys.sort(key=repr)
    attrs = tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items()))
    return (node.op, tuple(keys), attrs, format_type(node.output.type))


def cse(g: Graph, commutative: bool = True) -> Graph:
    """A copy of ``g`` in which each distinct computation appears once (the first one)."""
    c = GraphCopier(g)
    seen: dict[Hashable, Value] = {}
    for node in g.nodes:
        operands = [c.get(op) for op in node.inputs]
        key = node_key(node, operands, commutative)
        # Operand keys hold ids of values in the new graph; those values live as long as
        # ``c``, so an id is never reused for another value while ``seen`` is in use.
        earlier = seen.get(key)
        if earlier is not None:
            c.alias(node.output, earlier)
        else:
            seen[key] = c.emit(node, operands)
    return c.finish()


@register_pass
class CommonSubexpressionElimination(Pass):
    """Merge nodes that apply the same primitive to the same operands and attributes.

    Legal because primitives are pure; ``random_uniform`` is a function of its key, so
    equal keys may merge too. ``commutative=false`` keeps ``a+b`` and ``b+a`` apart.
    """

    name = "cse"
    commutative: bool = True

    def run(self, graph: Graph) -> Graph:
        return cse(graph, self.commutative)
