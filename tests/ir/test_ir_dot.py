"""Graphviz output: node labels, styles, kernel clusters, and rendering."""

from __future__ import annotations

import shutil

import pytest

from fusegrad.ir import IRError, to_dot
from fusegrad.ir.dot import GraphvizNotFoundError, render
from tests.ir.ir_zoo import CASES, mlp_graph


def test_nodes_inputs_outputs_and_edges():
    text = to_dot(mlp_graph())
    assert text.startswith('digraph "f" {\n')
    assert 'in0 [label="%x\\nf32[4,8]", shape=invhouse, fillcolor=lightblue];' in text
    assert 'n0 [label="%0 = matmul %x, %w\\nf32[4,16]\\nmodel.py:12"];' in text
    assert 'n2 [label="%2 = sum %1 {axes=[0, 1]}\\nf32[]\\nmodel.py:14"];' in text
    assert "in0 -> n0 [label=0];" in text and "in1 -> n0 [label=1];" in text
    assert "n0 -> n1;" in text
    assert 'out1 [label="return 1: %2\\nf32[]", shape=house, fillcolor=palegreen];' in text
    assert "n2 -> out1;" in text
    assert "cluster" not in text


def test_graph_method_delegates():
    g = mlp_graph()
    assert g.to_dot() == to_dot(g)
    assert g.to_dot([g.nodes[:2]]) == to_dot(g, [g.nodes[:2]])


def test_kernels_become_clusters():
    g = mlp_graph()
    text = to_dot(g, kernels=[[g.nodes[1], g.nodes[0]], [g.nodes[2]]])
    cluster0 = text[text.index("subgraph cluster_0 {"):text.index("subgraph cluster_1 {")]
    assert 'label="kernel 0"' in cluster0
    assert cluster0.index("n0 [") < cluster0.index("n1 [")         # graph order inside
    assert "n2 [" in text[text.index("subgraph cluster_1 {"):]
    drawn = [line.strip() for line in text.splitlines() if line.strip().startswith("n0 [")]
    assert len(drawn) == 1                                          # once, in its cluster


def test_kernel_errors():
    g = mlp_graph()
    with pytest.raises(IRError, match="not a node of @f"):
        to_dot(g, [[mlp_graph().nodes[0]]])
    with pytest.raises(IRError, match="is in kernels 0 and 1"):
        to_dot(g, [[g.nodes[0]], [g.nodes[0]]])


def test_labels_are_escaped_and_shortened():
    g = CASES["constants"]().graph
    text = to_dot(g)
    assert all(len(line) < 200 for line in text.splitlines())
    g = CASES["locations"]().graph
    assert 'weird \\"file\\" name.py' in to_dot(g)


def test_every_zoo_graph_draws():
    for build in CASES.values():
        g = build().graph
        text = to_dot(g, [g.nodes[:1]] if g.nodes else None)
        assert text.count(" -> out") == sum(1 for o in g.outputs if hasattr(o, "producer"))


@pytest.mark.skipif(shutil.which("dot") is not None, reason="graphviz is installed")
def test_render_without_graphviz_says_so(tmp_path):
    with pytest.raises(GraphvizNotFoundError, match="graphviz is not installed"):
        render(mlp_graph(), str(tmp_path / "g.png"))


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz is not installed")
def test_render_with_graphviz(tmp_path):
    path = render(mlp_graph(), str(tmp_path / "g.svg"))
    assert open(path).read().lstrip().startswith("<?xml")
