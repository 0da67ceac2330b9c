"""Erase the nodes that only steer differentiation, once a graph will not be differentiated.

``stop_gradient`` (``detach``, and every value a backward computes under no_grad from values
that require grad) and ``custom_vjp`` (a composite's own VJP) are the identity on values;
they only tell autodiff where not to go. A graph about to become kernels is past
differentiation (compiled functions differentiate the traced graph, never the optimized one),
and there the barriers hide equal computations from CSE: a backward that recomputes
``erf(x / sqrt(2))`` for GELU's derivative computes it on ``stop_gradient(x / sqrt(2))``, and
the forward's ``erf`` is not recognised as the same value. With the barriers erased first,
``cse`` merges them and the forward's kernel computes the erf once.

Not for graphs that will still be differentiated: without its barriers, autodiff would go
where the program said it must not. A barrier whose result is a graph output, and whose
operand is a graph input or a literal, is kept (an output stays a value the graph computes).
So is a ``remat`` barrier (``Node.remat``): it stands between a checkpointed region's
inputs and the backward's recomputed copies of the region, and there hiding equal
computations from CSE is the point (the forward's values are not kept for the backward).
Fusion reads a ``stop_gradient`` as a view, so a kept barrier costs no kernel.
"""

from __future__ import annotations

from fusegrad.ir.graph import Graph, Value
from fusegrad.ir.rewrite import GraphCopier
from fusegrad.passes.manager import Pass, register_pass

__all__ = ["strip_barriers", "StripBarriers", "BARRIERS"]

BARRIERS = frozenset({"stop_gradient", "custom_vjp"})


def strip_barriers(g: Graph) -> Graph:
    """A copy of ``g`` in which every barrier's result is replaced by its first operand."""
    if not any(node.op in BARRIERS for node in g.nodes):
        return g
    outputs = {o for o in g.outputs if isinstance(o, Value)}
    inputs = set(g.inputs)
    c = GraphCopier(g)
    for node in g.nodes:
        if node.op in BARRIERS and not node.remat:
            src = node.inputs[0]
            if node.output in outputs and (not isinstance(src, Value) or src in inputs):
                c.alias(node.output, c.new.add_node("stop_gradient", [c.get(src)], {},
                                                    loc=node.loc))
            else:
                c.alias(node.output, c.get(src))
            continue
        c.emit(node)
    return c.finish()


@register_pass
class StripBarriers(Pass):
    """Replace ``stop_gradient`` and ``custom_vjp`` by their operand, so that ``cse`` sees a
    backward's recomputations of forward values (only for graphs past differentiation)."""

    name = "strip-barriers"

    def run(self, graph: Graph) -> Graph:
        return strip_barriers(graph)
