"""Recording the graphs a test session builds, and checking that their text round-trips.

Used by ``tests/tracer/conftest.py`` (the session hook) and tested by
``test_trace_roundtrip.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fusegrad.ir.parser import parse
from fusegrad.ir.printer import print_graph
from fusegrad.ir.verifier import VerificationError, verify


@dataclass
class GraphRecorder:
    """Graphs built by the running test, and the printed texts of finished tests."""

    active: bool = False
    pending: list = field(default_factory=list)            # graphs of the running test
    texts: dict[str, str] = field(default_factory=dict)    # printed text -> test that built it
    skipped: int = 0                                       # graphs failing verify()
    tests_run: list[str] = field(default_factory=list)

    def record(self, graph) -> None:
        if self.active:
            self.pending.append(graph)

    def finish_test(self, nodeid: str, check: bool = True) -> None:
        """Print the test's graphs (complete now); skip those that fail verification."""
        graphs, self.pending = self.pending, []
        self.tests_run.append(nodeid)
        if not check:
            return
        for g in graphs:
            try:
                verify(g)
            except VerificationError:
                self.skipped += 1
                continue
            self.texts.setdefault(print_graph(g), nodeid)


def roundtrip_failures(texts: dict[str, str]) -> list[str]:
    """Messages for the printed graphs that do not print back identically after parsing."""
    failures = []
    for text, nodeid in texts.items():
        try:
            again = print_graph(parse(text))
        except Exception as e:  # noqa: BLE001 - any parser error is a failure to report
            again = f"<{type(e).__name__}: {e}>"
        if again != text:
            failures.append(f"graph built by {nodeid}:\n{text}\n-- parsed and printed "
                            f"again:\n{again}")
    return failures
