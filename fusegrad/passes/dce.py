"""Dead code elimination: drop nodes whose results no output depends on."""

from __future__ import annotations

from fusegrad.ir.graph import Graph, Value
from fusegrad.ir.rewrite import GraphCopier
from fusegrad.passes.manager import Pass, register_pass

__all__ = ["dce", "DeadCodeElimination"]


def live_nodes(g: Graph) -> set:
    """Nodes that some graph output depends on (one reverse sweep)."""
    live_values = {o for o in g.outputs if isinstance(o, Value)}
    live = set()
    for node in reversed(g.nodes):
        if node.output in live_values:
            live.add(node)
            live_values.update(op for op in node.inputs if isinstance(op, Value))
    return live


def dce(g: Graph) -> Graph:
    """A copy of ``g`` without dead nodes. Graph inputs are kept (they are the signature)."""
    live = live_nodes(g)
    c = GraphCopier(g)
    for node in g.nodes:
        if node in live:
            c.emit(node)
    return c.finish()


@register_pass
class DeadCodeElimination(Pass):
    """Remove nodes with no path to an output."""

    name = "dce"

    def run(self, graph: Graph) -> Graph:
        return dce(graph)
