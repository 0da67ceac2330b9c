"""A networkx view of a graph, for the analyses networkx already does well.

``to_networkx(g)`` gives a :class:`networkx.DiGraph` whose node ids are the printed value
names (``"%x"`` for an input, ``"%3"`` for the result of node 3), so they match
:func:`print_graph` and are the same on every run. Each networkx node carries:

- ``op``: the primitive's name, or ``"input"``;
- ``type``: the value's :class:`TensorType`; ``loc``: the source location (or None);
- ``index``: position in ``g.inputs + g.nodes`` (the order everything here sorts by);
- ``value``: the IR :class:`Value`; ``node``: the IR :class:`Node` (None for inputs);
- ``attrs``: the node's attributes; ``output``: the output positions it fills (maybe empty).

An edge ``u -> v`` means that node ``v`` uses ``u``'s value; its ``operands`` attribute lists
the operand positions (``add %0, %0`` is one edge with ``operands=[0, 1]``). Literals are not
nodes. ``G.graph`` holds ``name`` and ``outputs`` (ids, or the literal's text).

The helpers below take a :class:`Graph` or, to amortize building the view across many
queries, the DiGraph ``to_networkx`` returned; they return IR nodes in graph order, so output
is deterministic.
"""

from __future__ import annotations

from typing import Union

import networkx as nx

from fusegrad.ir.graph import Graph, IRError, Literal, Node, Value
from fusegrad.ir.printer import format_literal, value_names

__all__ = ["to_networkx", "topological_generations", "ancestors", "descendants"]

GraphLike = Union[Graph, nx.DiGraph]


def to_networkx(g: Graph) -> nx.DiGraph:
    """The dataflow DiGraph of ``g`` (see the module docstring for its attributes)."""
    names = value_names(g)
    G = nx.DiGraph(name=g.name)
    outputs_of: dict[int, list[int]] = {}
    for k, o in enumerate(g.outputs):
        if isinstance(o, Value):
            outputs_of.setdefault(id(o), []).append(k)
    for i, v in enumerate(g.inputs):
        G.add_node(names[v], op="input", type=v.type, loc=None, index=i, value=v, node=None,
                   attrs={}, output=outputs_of.get(id(v), []))
    base = len(g.inputs)
    for j, n in enumerate(g.nodes):
        nid = names[n.output]
        G.add_node(nid, op=n.op, type=n.output.type, loc=n.loc, index=base + j, value=n.output,
                   node=n, attrs=dict(n.attrs), output=outputs_of.get(id(n.output), []))
        for k, op in enumerate(n.inputs):
            if not isinstance(op, Value):
                continue
            src = names.get(op)
            if src is None or G.nodes.get(src) is None:
                raise IRError(f"to_networkx @{g.name}: node {j} ({n.op}) uses a value that is "
                              f"not defined before it; verify(g) says why")
            if G.has_edge(src, nid):
                G.edges[src, nid]["operands"].append(k)
            else:
                G.add_edge(src, nid, operands=[k])
    G.graph["outputs"] = [names.get(o, "?") if isinstance(o, Value) else
                          format_literal(o) if isinstance(o, Literal) else repr(o)
                          for o in g.outputs]
    return G


def _view(g: GraphLike) -> nx.DiGraph:
    return g if isinstance(g, nx.DiGraph) else to_networkx(g)


def _nodes_in_order(G: nx.DiGraph, ids) -> list[Node]:
    ids = sorted(ids, key=lambda i: G.nodes[i]["index"])
    return [G.nodes[i]["node"] for i in ids if G.nodes[i]["node"] is not None]


def _id_of(G: nx.DiGraph, target: Value | Node) -> str:
    value = target.output if isinstance(target, Node) else target
    for nid, data in G.nodes(data=True):
        if data["value"] is value:
            return nid
    raise IRError(f"{target!r} is not a value of graph @{G.graph.get('name')}")


def topological_generations(g: GraphLike) -> list[list[Node]]:
    """The nodes in generations: generation 0 uses only inputs and literals, generation k
    uses a result of generation k-1 (and nothing later). Each generation is in graph order;
    the nodes of one generation are independent of each other."""
    G = _view(g)
    ops = G.subgraph(n for n, d in G.nodes(data=True) if d["node"] is not None)
    return [_nodes_in_order(G, gen) for gen in nx.topological_generations(ops)]


def ancestors(g: GraphLike, target: Value | Node) -> list[Node]:
    """The nodes whose results ``target`` depends on, transitively, in graph order (its own
    producer excluded)."""
    G = _view(g)
    return _nodes_in_order(G, nx.ancestors(G, _id_of(G, target)))


def descendants(g: GraphLike, target: Value | Node) -> list[Node]:
    """The nodes that depend on ``target``, transitively, in graph order."""
    G = _view(g)
    return _nodes_in_order(G, nx.descendants(G, _id_of(G, target)))
