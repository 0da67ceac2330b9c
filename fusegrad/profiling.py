"""The profiler's recorder, and the one switch that the hot paths test.

``recorder`` is None unless a :class:`fusegrad.profiler.profile` is recording: eager ops
(``bind``), composite ops, autograd nodes, optimizer steps and compiled programs test it once
per call (``if profiling.recorder is not None``) and pay nothing more when it is None. While
it is set they time themselves with :func:`time.perf_counter_ns` and append one event each.

An event is a plain tuple ``(name, category, start_ns, end_ns, thread, shapes, stack, bytes,
args)``; which event is inside which is worked out afterwards from the intervals of each
thread (:mod:`fusegrad.profiler`), so recording needs no per-thread stack. A compiled
program's run records its steps as one list of clock readings (:meth:`Recorder.add_steps`),
two per step: the steps' names (made once per program) and the tuples are made when the
recording is read (:meth:`Recorder.all_events`), outside the profiled calls. Timing a step
costs two clock reads and two appends (about 0.3 us), where building its event took 1.5 us
more, inside the program's run.

This module sits at the base of the package (it imports nothing of fusegrad) so that every
layer can reach it.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from time import perf_counter_ns

__all__ = ["Recorder", "Span", "recorder", "user_stack"]

# The active recorder, or None (the common case).
recorder: "Recorder | None" = None

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_thread = threading.local()


class Recorder:
    """Collects the events of one profiling window (between a profiler's start and stop)."""

    __slots__ = ("events", "runs", "record_shapes", "with_stack", "profile_memory", "closed",
                 "start_ns")

    def __init__(self, record_shapes: bool = False, with_stack: bool = False,
                 profile_memory: bool = False):
        self.events: list[tuple] = []
        # (names, times, thread) of each program run: see add_steps
        self.runs: list[tuple[Callable, list[int], int]] = []
        self.record_shapes = record_shapes
        self.with_stack = with_stack
        self.profile_memory = profile_memory
        self.closed = False
        self.start_ns = perf_counter_ns()

    def add(self, name: str, category: str, start_ns: int, end_ns: int, shapes=None,
            stack=None, nbytes: int = 0, args: dict | None = None) -> None:
        """Record one event that ran on this thread from ``start_ns`` to ``end_ns``. An event
        that ends after the window closed (a range entered before stop) is dropped."""
        if not self.closed:
            self.events.append((name, category, start_ns, end_ns, _thread_id(), shapes, stack,
                                nbytes, args))

    def add_steps(self, names: Callable[[], list[tuple[str, str, dict | None]]],
                  times: list[int]) -> None:
        """Record the steps of one program run on this thread: step ``i`` ran from
        ``times[2 * i]`` to ``times[2 * i + 1]`` (``perf_counter_ns`` readings; a run that
        raised has fewer), and ``names()[i]`` is its name, category and trace arguments.
        ``names`` is called when the recording is read: naming a program's steps (2 ms for
        the 108 of a small transformer's training step, once per program) is no part of
        the first profiled call's time."""
        if not self.closed:
            self.runs.append((names, times, _thread_id()))

    def all_events(self) -> list[tuple]:
        """Every event recorded, as tuples: those added one by one, then the steps of each
        program run."""
        out = list(self.events)
        for names, times, tid in self.runs:
            # zip: a run stopped by a step that raised has the steps before it
            out += [(name, category, start, end, tid, None, None, 0, args) for
                    (name, category, args), start, end in zip(names(), times[::2], times[1::2])]
        return out

    def stack(self) -> tuple[str, ...] | None:
        """The caller's Python stack outside fusegrad, innermost first, as torch prints it
        (``file(line): function``); None unless the profiler records stacks."""
        return user_stack() if self.with_stack else None


def _thread_id() -> int:
    """The OS id of the calling thread, asked once per thread (a system call: 0.7 us on a
    VM)."""
    try:
        return _thread.id
    except AttributeError:
        tid = _thread.id = threading.get_native_id()
        return tid


def user_stack() -> tuple[str, ...]:
    """The current Python stack without fusegrad's own frames, innermost first."""
    out = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if not code.co_filename.startswith(_PACKAGE_DIR):
            out.append(f"{code.co_filename}({frame.f_lineno}): {code.co_name}")
        frame = frame.f_back
    return tuple(out)


class Span:
    """A timed range on ``rec``: ``with Span(rec, "aten::softmax"): ...`` records one event
    around the block (also when it raises)."""

    __slots__ = ("rec", "name", "category", "shapes", "args", "stack", "start")

    def __init__(self, rec: Recorder, name: str, category: str = "cpu_op", shapes=None,
                 args: dict | None = None):
        self.rec, self.name, self.category, self.shapes, self.args = rec, name, category, \
            shapes, args

    def __enter__(self) -> "Span":
        self.stack = self.rec.stack()
        self.start = perf_counter_ns()
        return self

    def __exit__(self, *exc) -> None:
        self.rec.add(self.name, self.category, self.start, perf_counter_ns(), self.shapes,
                     self.stack, 0, self.args)
