"""``torch._dynamo.utils.counters``: compile counts over all compiled functions.

``counters["frames"]["total"]`` traces started, ``["frames"]["ok"]`` those compiled,
``["stats"]["unique_graphs"]`` programs made, ``["graph_break"][reason]`` calls sent to eager
by a trace that failed. ``counters.clear()`` starts again; a single function's count is its
``compiles`` attribute.
"""

from fusegrad.tracer.compile import counters

__all__ = ["counters"]
