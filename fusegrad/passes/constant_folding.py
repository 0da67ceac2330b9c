"""Constant folding: evaluate, at compile time, nodes whose operands are all known.

An operand is *known* when it is a literal or the result of a ``constant`` node (or of a
node this pass already folded). Such a node is run with its primitive's numpy ``impl`` (the
one definition the interpreter and eager mode also run, with the result cast to the node's
type the same way), so the folded value is bit for bit what the graph would compute. The
result replaces the node as

- a :class:`~fusegrad.ir.graph.Literal` when it is 0-d (``add 1.0:f32, 2.0:f32`` -> ``3.0``);
- otherwise a ``constant`` node holding the array (``dense<...>``).

What it leaves alone, and why:

- source nodes (``full``, ``iota``, ``random_uniform``, ``constant`` itself) are not
  evaluated: they already are compact descriptions of their values, cheaper to compute in a
  kernel than to load from memory. Their values do count as known, so ``exp`` of a small
  ``full`` folds. The one exception: a 0-d ``full`` or ``constant`` becomes a literal.
- ``broadcast_to`` (a view that only makes its operand bigger) is never folded, and no
  node whose result or any operand has more than ``max_elements`` elements is: folding
  ``full {shape=[4096,4096]}`` into a 64 MiB ``dense<...>`` would make programs bigger and
  compile times longer for no gain.
- nodes whose evaluation raises (an integer division by zero, an out-of-bounds index) stay,
  so the program still fails where and how it did.

Constants the folded nodes read may be left without users; the pass removes every node no
output depends on (``prune=false`` keeps them for ``dce`` to take).
"""

from __future__ import annotations

import numpy as np

from fusegrad.dtypes import DType
from fusegrad.ir.graph import Graph, Literal, Node, Operand, Value
from fusegrad.ir.rewrite import GraphCopier
from fusegrad.ops.primitive import ConstantData, Kind
from fusegrad.passes.dce import dce
from fusegrad.passes.manager import Pass, register_pass
from fusegrad.symint import SymInt

__all__ = ["fold_constants", "ConstantFolding", "literal_of"]

# Sources whose values are known without running anything else.
_KNOWN_SOURCES = frozenset({"constant", "full", "iota"})
# Never evaluated: views that only grow their operand.
_NEVER_FOLD = frozenset({"broadcast_to"})


def literal_of(array: np.ndarray, dtype: DType) -> Literal:
    """The literal holding the one element of the 0-d ``array`` of ``dtype``."""
    scalar = np.asarray(array).reshape(())
    if dtype.category == 0:
        return Literal(bool(scalar), dtype)
    if dtype.category == 1:
        return Literal(int(scalar), dtype)
    if dtype.category == 3:
        return Literal(complex(scalar.astype(np.complex128)), dtype)
    # A double holds every 16/32-bit float exactly, so the literal reads back the same bits.
    return Literal(float(scalar.astype(np.float64)), dtype)


def _evaluate(node: Node, operands: list[np.ndarray]) -> np.ndarray | None:
    """``node`` run on ``operands`` as the interpreter runs it, or None when it raises."""
    try:
        result = np.asarray(node.prim.impl(*operands, **node.attrs))
    except Exception:     # the program's own error; it must still happen at run time
        return None
    out_type = node.output.type
    if result.dtype != out_type.dtype.np_dtype:
        result = result.astype(out_type.dtype.np_dtype)
    if result.shape != out_type.shape:
        return None
    # Numpy's float reductions associate differently over differently strided views of the
    # same values; one layout for every folded value keeps folding deterministic.
    return np.asarray(result, order="C")


def fold_constants(g: Graph, max_elements: int = 1024, prune: bool = True) -> Graph:
    """A copy of ``g`` with every foldable node replaced by its value (see the module doc)."""
    c = GraphCopier(g)
    known: dict[Value, np.ndarray] = {}      # new-graph values whose contents are known

    def value_of(op: Operand) -> np.ndarray | None:
        if isinstance(op, Literal):
            return np.asarray(op.value, dtype=op.dtype.np_dtype)
        return known.get(op)

    for node in g.nodes:
        operands = [c.get(op) for op in node.inputs]
        out_type = node.output.type
        # (A symbolic size is never small: its value is a call's, not the compiler's, and
        # comparing it with max_elements would make a guard of a folding heuristic.)
        small = not isinstance(out_type.numel, SymInt) and out_type.numel <= max_elements
        if node.op in _KNOWN_SOURCES and small and not node.inputs:
            if out_type.shape == () and node.op != "iota":
                value = _evaluate(node, [])
                if value is not None:
                    c.alias(node.output, literal_of(value, out_type.dtype))
                    continue
            new = c.emit(node, operands)
            value = _evaluate(node, [])
            if value is not None:
                known[new] = value
            continue
        arrays = [value_of(op) for op in operands]
        # A collective's value depends on the other ranks: never computed at compile time.
        foldable = (node.prim.kind is not Kind.SOURCE and node.op not in _NEVER_FOLD and small
                    and "collective" not in node.prim.extra
                    and all(a is not None and a.size <= max_elements for a in arrays))
        value = _evaluate(node, arrays) if foldable else None
        if value is None:
            c.emit(node, operands)
        elif value.shape == ():
            c.alias(node.output, literal_of(value, out_type.dtype))
        else:
            new = c.new.add_node("constant", [], {"value": ConstantData(value)}, loc=node.loc)
            c.alias(node.output, new)
            known[new] = value
    folded = c.finish()
    return dce(folded) if prune else folded


@register_pass
class ConstantFolding(Pass):
    """Replace nodes whose operands are all literals or constants by their values.

    Legal because the value is computed by the primitive's own numpy implementation, cast
    to the node's type as the interpreter does: the graph computes the same bits either way.
    """

    name = "fold"
    max_elements: int = 1024
    prune: bool = True

    def run(self, graph: Graph) -> Graph:
        return fold_constants(graph, self.max_elements, self.prune)
