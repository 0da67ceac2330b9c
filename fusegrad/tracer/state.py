"""The tracer's per-thread state, and the slots of ``fusegrad.effects`` it fills.

Tracing is per thread, as torch's tracing and grad mode are: a function traced (or compiled)
in one thread must not record the ops another thread runs eagerly. :class:`TraceState` keeps
what tracing holds while it runs user code, one per thread; only the tracer reads it. Code
below the tracer sees it through ``bind`` and the effect functions of
``fusegrad.effects``, which consult lookups this module puts into its slots
while some thread holds a capture, a trace or a key source. While no thread does, a slot is
None, and an eager op pays one truth test for it instead of the thread-local lookup (which
costs an eager op several times more).
"""

from __future__ import annotations

import threading

from fusegrad import effects

__all__ = ["TraceState", "trace_state", "is_compiling", "current_capture", "push_capture",
           "pop_capture", "push_trace", "pop_trace", "push_key_source", "pop_key_source"]


class TraceState(threading.local):
    """What tracing keeps while it runs user code, one per thread; all empty outside tracing."""

    def __init__(self) -> None:
        # The state captures of compiled functions being traced, innermost last
        # (fusegrad.tracer.capture pushes them).
        self.captures: list = []
        # The GraphTraces running user code, innermost last (fusegrad.tracer.trace pushes
        # them): a symbolic tensor of one of them met by an inner trace is a free variable.
        self.traces: list = []
        # Where random ops take their keys while tracing, innermost last: callables
        # (generator, count) -> key tensor (fusegrad.tracer.trace and vmap push them).
        self.key_sources: list = []


_trace_state = TraceState()
_lock = threading.Lock()
# How many entries all threads hold on each stack: the effects slot for a stack is filled
# while its count is nonzero.
_held = {"captures": 0, "traces": 0, "key_sources": 0}


def trace_state() -> TraceState:
    """This thread's :class:`TraceState`."""
    return _trace_state


def current_capture():
    """The state capture of the innermost compiled function being traced in this thread
    (a :class:`~fusegrad.tracer.capture.StateCapture`), or None."""
    captures = _trace_state.captures
    return captures[-1] if captures else None


def is_compiling() -> bool:
    """Whether a compiled function is being traced now, in this thread
    (``torch.compiler.is_compiling``)."""
    return effects.compiling()


def _innermost_key_source():
    sources = _trace_state.key_sources
    return sources[-1] if sources else None


def _running_traces() -> list:
    return _trace_state.traces


_SLOTS = {
    "captures": (effects.set_capture_lookup, current_capture),
    "traces": (effects.set_traces_lookup, _running_traces),
    "key_sources": (effects.set_key_source_lookup, _innermost_key_source),
}


def _push(stack: str, entry) -> None:
    with _lock:
        _held[stack] += 1
        if _held[stack] == 1:
            fill, lookup = _SLOTS[stack]
            fill(lookup)
    getattr(_trace_state, stack).append(entry)


def _pop(stack: str):
    entry = getattr(_trace_state, stack).pop()
    with _lock:
        _held[stack] -= 1
        if _held[stack] == 0:
            fill, _ = _SLOTS[stack]
            fill(None)
    return entry


def push_capture(capture) -> None:
    """Make ``capture`` the innermost state capture of this thread."""
    _push("captures", capture)


def pop_capture():
    """Remove this thread's innermost state capture and return it."""
    return _pop("captures")


def push_trace(trace) -> None:
    """``trace`` (a GraphTrace) runs user code in this thread from now on."""
    _push("traces", trace)


def pop_trace():
    """This thread's innermost running trace is done: remove and return it."""
    return _pop("traces")


def push_key_source(source) -> None:
    """Random ops in this thread take their keys from ``source`` (a callable
    ``(generator, count) -> key tensor``) until :func:`pop_key_source`."""
    _push("key_sources", source)


def pop_key_source():
    """Remove this thread's innermost key source and return it."""
    return _pop("key_sources")
