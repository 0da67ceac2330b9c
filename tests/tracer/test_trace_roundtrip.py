"""The session-wide round-trip check itself (``conftest.py``, ``graph_roundtrip.py``).

The check runs at the end of the session over every graph the tracer tests build; these
tests make sure it would notice: graphs are recorded, non-canonical text is reported, and
deliberately malformed graphs are skipped rather than failing the session.
"""

from __future__ import annotations

import pytest

import fusegrad as fg
from fusegrad.dtypes import float32
from fusegrad.ir import Graph, Literal, TensorType, print_graph
from tests.tracer.graph_roundtrip import GraphRecorder, roundtrip_failures


def test_graphs_built_in_a_test_are_recorded(graph_recorder):
    before = len(graph_recorder.pending)
    graph = fg.trace(lambda x: x.exp(), fg.randn(2))
    assert graph_recorder.pending[before:] == [graph]


def test_text_that_does_not_print_back_is_reported():
    good = print_graph(fg.trace(lambda x: x * 2.0, fg.randn(2)))
    # A non-canonical spelling parses, but prints back canonically: a mismatch to report.
    odd = good.replace("mul %x, 2.0", "mul %x, 2.0:f32")
    assert odd != good
    assert roundtrip_failures({good: "test_a"}) == []
    failures = roundtrip_failures({odd: "test_b", "graph @broken(": "test_c"})
    assert len(failures) == 2
    assert "test_b" in failures[0] and "mul %x, 2.0 : f32[2]" in failures[0]
    assert "IRParseError" in failures[1]


def _malformed() -> Graph:
    g = Graph("malformed")
    x = g.add_input("x", TensorType((2,), float32))
    other = Graph("other").add_input("y", TensorType((2,), float32))
    g.add_node("add", [x, other])                  # uses a value of another graph
    g.set_outputs([g.nodes[0].output, Literal(1.0, float32)])
    return g


def test_unverifiable_graphs_are_skipped():
    recorder = GraphRecorder(active=True)
    recorder.record(_malformed())
    recorder.record(fg.trace(lambda x: x + 1, fg.randn(2)))
    recorder.finish_test("test_x")
    assert recorder.skipped == 1 and len(recorder.texts) == 1
    assert recorder.tests_run == ["test_x"]


@pytest.mark.no_roundtrip
def test_marked_tests_are_not_round_tripped(graph_recorder):
    _malformed()
    assert graph_recorder.pending, "still recorded; skipped at teardown by the marker"
