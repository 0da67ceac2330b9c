"""Trace slots and effects: how code below the tracer learns about tracing.

The tracer (:mod:`fusegrad.tracer.state`) owns the trace state, per thread, and fills the
slots of this module while some thread holds what they look up; they are None while no
thread does. Below the tracer, code never reads trace state: ``bind``
(:mod:`fusegrad.ops.primitive`) consults the capture slot, and everything else (tensor, ops,
nn, optim, distributed) asks the effect functions here, each of which costs one truth test
while nothing is traced. This module sits in the base layer, below ``Tensor``, so that every
layer can ask; it imports nothing of fusegrad.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["set_capture_lookup", "set_key_source_lookup", "set_traces_lookup", "compiling",
           "traced", "note_made", "note_created", "read_grad", "write_grad", "refuse_traced",
           "check_concrete", "assign_captured", "enter_optimizer", "exit_optimizer",
           "is_scalar_input", "note_module", "note_attribute", "key_source", "enclosing_traces"]

# () -> this thread's innermost state capture of a compiled function being traced
# (a fusegrad.tracer.capture.StateCapture), or None.
capture_lookup: Callable[[], Any] | None = None
# () -> this thread's innermost random key source (a callable (generator, count) -> key
# tensor that the tracer or vmap pushed), or None.
key_source_lookup: Callable[[], Any] | None = None
# () -> the GraphTraces running user code in this thread, innermost last.
traces_lookup: Callable[[], list] | None = None


def set_capture_lookup(lookup: Callable[[], Any] | None) -> None:
    """Fill (or empty, with None) the slot bind consults for a compiled function being
    traced. Only the tracer calls this (fusegrad.tracer.state)."""
    global capture_lookup
    capture_lookup = lookup


def set_key_source_lookup(lookup: Callable[[], Any] | None) -> None:
    """Fill (or empty) the slot :func:`key_source` reads (fusegrad.tracer.state)."""
    global key_source_lookup
    key_source_lookup = lookup


def set_traces_lookup(lookup: Callable[[], list] | None) -> None:
    """Fill (or empty) the slot :func:`enclosing_traces` reads (fusegrad.tracer.state)."""
    global traces_lookup
    traces_lookup = lookup


def _capture():
    # Read once: another thread may empty the slot between a test and a call.
    lookup = capture_lookup
    return lookup() if lookup is not None else None


def compiling() -> bool:
    """Whether a compiled function is being traced now, in this thread: every op is then
    recorded, so eager shortcuts (numpy on a tensor's data, effects kept in Python) are off."""
    lookup = capture_lookup
    return lookup is not None and lookup() is not None


def traced(*tensors) -> bool:
    """Whether an op on ``tensors`` is recorded rather than run: one of them belongs to a
    trace (``fusegrad.trace``), or a compiled function is being traced."""
    return compiling() or any(t._trace is not None for t in tensors)


def note_made(t) -> None:
    """``t`` is a new tensor object. While a compiled function is traced, it belongs to that
    trace: a constant of the graph unless its storage turns out to be older (``p.detach()``)."""
    lookup = capture_lookup
    if lookup is not None:
        capture = lookup()
        if capture is not None:
            capture.note_made(t)


def note_created(t) -> None:
    """Mark ``t``, made by a tensor factory, as created by the code being traced (a constant
    of the graph) rather than captured from outside it (an input read at call time)."""
    capture = _capture()
    if capture is not None:
        capture.note_created(t)


def read_grad(t):
    """``t.grad`` while a compiled function is traced (:func:`compiling`): the gradient
    present at call time (a graph input), or the one the trace wrote since."""
    return _capture().get_grad(t)


def write_grad(t, value) -> None:
    """``t.grad = value`` while a compiled function is traced: written back after each call."""
    _capture().set_grad(t, value)


def refuse_traced(what: str) -> None:
    """Raise ``ConcretizationError`` naming ``what`` (``"assigning f32[3].data"``) while a
    compiled function is traced: it would happen once, at trace time. Nothing otherwise."""
    capture = _capture()
    if capture is not None:
        capture.refuse(what)


def check_concrete(t, what: str) -> None:
    """Raise ``ConcretizationError`` when ``what`` (``"item()"``) needs the value of ``t``
    and a compiled function is traced that reads ``t`` at call time. Nothing otherwise."""
    capture = _capture()
    if capture is not None:
        capture.check_concrete(t, what)


def assign_captured(x, value, op: str):
    """The in-place write ``op`` of ``value`` into concrete ``x`` while a compiled function is
    traced: a write to a tensor from outside it (a parameter, an optimizer's state) becomes
    an output written back at call time. Returns ``x``'s new tensor."""
    return _capture().assign_concrete(x, value, op)


def enter_optimizer(opt):
    """``opt.step()`` begins. While a compiled function is traced, its learning rates become
    inputs read at each call and the structure of its state is guarded; returns what
    :func:`exit_optimizer` restores (None when nothing is traced)."""
    capture = _capture()
    return None if capture is None else (capture, capture.enter_optimizer(opt))


def exit_optimizer(token) -> None:
    """``opt.step()`` ends: undo what :func:`enter_optimizer` swapped in."""
    if token is not None:
        capture, replaced = token
        capture.exit_optimizer(replaced)


def is_scalar_input(value) -> bool:
    """Whether ``value`` is a hyperparameter a compiled function being traced reads at each
    call (a 0-d graph input whose value is unknown while tracing)."""
    capture = _capture()
    return capture is not None and capture.is_scalar_input(value)


def note_module(module) -> None:
    """``module`` is called: while a compiled function is traced, its hooks and state are
    part of what the graph's guards check."""
    capture = _capture()
    if capture is not None:
        capture.note_module(module)


def note_attribute(holder: dict, name: str, value, buffer: bool) -> None:
    """A traced tensor ``value`` is stored in ``holder[name]`` (a module's ``__dict__``, or
    its buffers when ``buffer``) while a compiled function is traced: the attribute is
    restored after the trace and written back after each call."""
    capture = _capture()
    if capture is not None:
        capture.note_attribute(holder, name, value, buffer)


def key_source():
    """Where random ops in this thread take their keys now: a callable
    ``(generator, count) -> key tensor`` (a trace's key input, vmap's recorded keys), or
    None for the generator itself."""
    lookup = key_source_lookup
    return lookup() if lookup is not None else None


def enclosing_traces() -> list:
    """The traces running user code in this thread, innermost last (empty when none): a
    symbolic tensor of one of them met by an inner trace is a free variable."""
    lookup = traces_lookup
    return lookup() if lookup is not None else []
