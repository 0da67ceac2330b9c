"""Property tests: every random graph from ``strategies.graphs`` goes through every IR tool."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings

from fusegrad.ir import interpret, parse, print_graph, structural_hash, to_networkx, verify
from fusegrad.ir.nx import topological_generations
from tests.ir.strategies import graphs_and_args

# Graphs are small: 100 examples take about a second.
PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(graphs_and_args())
def test_random_graphs_verify_round_trip_and_run(case):
    g, args = case
    verify(g)
    text = print_graph(g, locations=True)
    back = parse(text)
    verify(back)
    assert print_graph(back, locations=True) == text
    assert structural_hash(back) == structural_hash(g)
    want = interpret(g, *args)
    got = interpret(back, *args)
    assert len(want) == len(g.outputs)
    for w, o, t in zip(want, got, g.output_types, strict=True):
        assert w.shape == t.shape and w.dtype == t.dtype.np_dtype
        # Same graph, same data: the re-parsed graph computes bit-identical results.
        np.testing.assert_array_equal(w, o)


@settings(PROPERTY, max_examples=60)
@given(graphs_and_args(max_nodes=6))
def test_random_graphs_generations_cover_every_node_once(case):
    g, _ = case
    generations = topological_generations(g)
    flat = [n for gen in generations for n in gen]
    assert sorted(map(id, flat)) == sorted(map(id, g.nodes))
    level = {id(n): k for k, gen in enumerate(generations) for n in gen}
    for n in g.nodes:
        for op in n.inputs:
            if getattr(op, "producer", None) is not None:
                assert level[id(op.producer)] < level[id(n)]
    assert list(to_networkx(g).nodes) == list(to_networkx(g).nodes)
