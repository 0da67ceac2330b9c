"""The networkx view and the analyses built on it."""

from __future__ import annotations

import networkx as nx
import pytest

from fusegrad.ir import Graph, IRError, Value, to_networkx
from fusegrad.ir.nx import ancestors, descendants, topological_generations
from tests.ir.ir_zoo import CASES, T, f32, mlp_graph


def diamond() -> Graph:
    """x -> a, b (independent) -> c -> outputs; plus a source node independent of x."""
    g = Graph("diamond")
    x = g.add_input("x", T(3))
    a = g.add_node("exp", [x], loc="d.py:1")
    b = g.add_node("neg", [x])
    c = g.add_node("add", [b, a])
    k = g.add_node("full", [], {"shape": (3,), "value": 1.0, "dtype": x.dtype})
    d = g.add_node("mul", [c, c])
    e = g.add_node("sub", [d, k])
    g.set_outputs([e, a, f32(2.0)])
    return g


def test_nodes_edges_and_attributes():
    G = to_networkx(diamond())
    assert list(G.nodes) == ["%x", "%0", "%1", "%2", "%3", "%4", "%5"]
    assert G.nodes["%x"]["op"] == "input" and G.nodes["%x"]["node"] is None
    assert G.nodes["%0"]["op"] == "exp" and G.nodes["%0"]["loc"] == "d.py:1"
    assert str(G.nodes["%0"]["type"]) == "f32[3]" and G.nodes["%0"]["output"] == [1]
    assert sorted(G.edges) == sorted([("%x", "%0"), ("%x", "%1"), ("%1", "%2"), ("%0", "%2"),
                                      ("%2", "%4"), ("%4", "%5"), ("%3", "%5")])
    assert G.edges["%1", "%2"]["operands"] == [0] and G.edges["%0", "%2"]["operands"] == [1]
    assert G.edges["%2", "%4"]["operands"] == [0, 1]        # mul %2, %2: one edge
    assert G.graph["name"] == "diamond" and G.graph["outputs"] == ["%5", "%0", "2.0:f32"]
    assert nx.is_directed_acyclic_graph(G)


def test_topological_generations_are_deterministic_and_in_graph_order():
    g = diamond()
    gens = topological_generations(g)
    assert [[n.op for n in gen] for gen in gens] == [["exp", "neg", "full"], ["add"], ["mul"],
                                                     ["sub"]]
    assert topological_generations(to_networkx(g)) == gens
    for _ in range(3):
        assert [[id(n) for n in gen] for gen in topological_generations(g)] == \
            [[id(n) for n in gen] for gen in gens]


def test_ancestors_and_descendants():
    g = diamond()
    by_op = {n.op: n for n in g.nodes}
    assert [n.op for n in ancestors(g, by_op["mul"].output)] == ["exp", "neg", "add"]
    assert [n.op for n in ancestors(g, by_op["sub"])] == ["exp", "neg", "add", "full", "mul"]
    assert ancestors(g, by_op["full"]) == []
    assert [n.op for n in descendants(g, g.inputs[0])] == ["exp", "neg", "add", "mul", "sub"]
    assert [n.op for n in descendants(to_networkx(g), by_op["full"])] == ["sub"]
    with pytest.raises(IRError, match="is not a value of graph @diamond"):
        descendants(g, Value(T(3)))


def test_every_zoo_graph_converts():
    for build in CASES.values():
        g = build().graph
        G = to_networkx(g)
        assert G.number_of_nodes() == len(g.inputs) + len(g.nodes)
        assert [d["index"] for _, d in G.nodes(data=True)] == list(range(G.number_of_nodes()))


def test_undefined_operand_is_an_error():
    g = mlp_graph()
    g.nodes[1].inputs[0] = Value(T(4, 16))
    with pytest.raises(IRError, match="node 1 \\(maximum\\) uses a value that is not defined"):
        to_networkx(g)
