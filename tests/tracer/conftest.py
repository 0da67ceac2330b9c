"""Every graph the tracer tests build must round-trip through the text form.

A session fixture wraps ``Graph.__init__`` so that each :class:`~fusegrad.ir.graph.Graph`
constructed while a test in this folder runs is recorded; at the test's teardown (when the
graph is complete) it is printed. At the end of the session every distinct text is parsed and
printed again and must come back unchanged: ``print_graph(parse(print_graph(g))) ==
print_graph(g)``; a failure names the test that built the graph and shows both texts (as an
error at the teardown of the session's last test). Graphs that fail
:func:`~fusegrad.ir.verifier.verify` (malformed on purpose) and tests marked ``no_roundtrip``
are skipped.

Run with ``-s`` to see how many graphs were checked. When the whole folder runs, fewer than
``MIN_GRAPHS`` is itself a failure: the hook broke. (Parsing dominates the cost, so the text
with source locations is round-tripped by a test of its own in ``test_trace_capture.py``.)
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from fusegrad.ir import graph as graph_module
from tests.tracer.graph_roundtrip import GraphRecorder, roundtrip_failures

MIN_GRAPHS = 100
HERE = Path(__file__).parent


def pytest_configure(config):
    config.addinivalue_line("markers", "no_roundtrip: graphs built by this test are not "
                                       "round-tripped (malformed on purpose)")


@pytest.fixture(scope="session")
def graph_recorder(request):
    """Record every Graph constructed during tracer tests; round-trip them at session end."""
    recorder = GraphRecorder()
    original = graph_module.Graph.__init__

    @functools.wraps(original)
    def recording_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        recorder.record(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graph_module.Graph, "__init__", recording_init)
        yield recorder
    failures = roundtrip_failures(recorder.texts)
    n_graphs = len(recorder.texts)
    print(f"\n[tracer round-trip] {n_graphs} distinct graphs printed, parsed and printed back "
          f"({recorder.skipped} skipped as unverifiable): {len(failures)} failed")
    assert not failures, "\n\n".join(failures[:5])
    if _whole_folder_ran(request.session, recorder):
        assert n_graphs > MIN_GRAPHS, (f"only {n_graphs} graphs were recorded: is the "
                                       "Graph.__init__ hook still in place?")


def _whole_folder_ran(session, recorder: GraphRecorder) -> bool:
    """True when every test of this folder ran (no -k/-m selection, no single file)."""
    files = {p.name for p in HERE.glob("test_*.py")}
    ran = {nodeid.split("::")[0].rsplit("/", 1)[-1] for nodeid in recorder.tests_run}
    here = [item for item in session.items if Path(item.path).parent == HERE]
    opts = session.config.option
    return (files <= ran and len(here) == len(recorder.tests_run)
            and not getattr(opts, "keyword", "") and not getattr(opts, "markexpr", ""))


@pytest.fixture(autouse=True)
def _record_graphs(graph_recorder, request):
    graph_recorder.active = True
    graph_recorder.pending = []
    try:
        yield
    finally:
        graph_recorder.active = False
        check = request.node.get_closest_marker("no_roundtrip") is None
        graph_recorder.finish_test(request.node.nodeid, check)
