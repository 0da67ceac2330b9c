"""Schedule collectives for overlap: start each all-reduce early, wait for it late.

A traced data-parallel training step records its gradient all-reduces after the whole
backward (the gradient hooks run once the reverse pass is recorded), one
``allreduce_start`` / ``allreduce_wait`` pair per bucket. Run in that order, nothing
overlaps. This pass reorders the nodes (the kernel order follows the node order) by a
list scheduling with priorities:

- the nodes that bucket *b*'s start needs, and the start itself, get priority *b* (the
  buckets in the order their starts were recorded, which is the order their gradients
  are complete in the backward): the first bucket's gradients are computed and its
  reduction started before the backward work the later buckets need;
- everything else (the waits, the optimizer's update, values only returned) keeps its
  place after all starts, in the original order.

So bucket *b*'s all-reduce runs while the backward kernels of buckets *b+1, ...* run, as
PyTorch's DDP overlaps its bucket all-reduces with the rest of the backward. Graphs without
collectives come back unchanged (the same object).
"""

from __future__ import annotations

import heapq

from fusegrad.ir.graph import Graph, Value
from fusegrad.ir.rewrite import GraphCopier
from fusegrad.passes.manager import Pass, register_pass

__all__ = ["overlap_collectives", "OverlapCollectives"]


def overlap_collectives(g: Graph) -> Graph:
    """A copy of ``g`` with its collectives scheduled for overlap (module doc)."""
    starts = [n for n in g.nodes if n.prim.extra.get("collective") == "start"]
    if not starts:
        return g
    position = {n: i for i, n in enumerate(g.nodes)}
    late = len(starts)
    priority = {n: late for n in g.nodes}
    for b, s in enumerate(starts):
        priority[s] = b
    # One reverse sweep: a node's priority is the earliest bucket any of its users needs.
    for node in reversed(g.nodes):
        p = priority[node]
        if p == late:
            continue
        for op in node.inputs:
            if isinstance(op, Value) and op.producer is not None:
                q = op.producer
                if priority[q] > p:
                    priority[q] = p
    users: dict = {n: [] for n in g.nodes}
    missing = {}
    for node in g.nodes:
        producers = {op.producer for op in node.inputs
                     if isinstance(op, Value) and op.producer is not None}
        missing[node] = len(producers)
        for q in producers:
            users[q].append(node)
    ready = [(priority[n], position[n], n) for n in g.nodes if missing[n] == 0]
    heapq.heapify(ready)
    c = GraphCopier(g)
    while ready:
        _, _, node = heapq.heappop(ready)
        c.emit(node)
        for u in users[node]:
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(ready, (priority[u], position[u], u))
    return c.finish()


@register_pass
class OverlapCollectives(Pass):
    """Start all-reduces as early and wait for them as late as the graph allows."""

    name = "overlap-collectives"

    def run(self, graph: Graph) -> Graph:
        return overlap_collectives(graph)
