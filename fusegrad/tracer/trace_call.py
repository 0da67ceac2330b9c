"""The capture stage of a compiled call: trace the function under a guard of what it reads.

:func:`guard_reads` records what the function reads from its closure, globals and the
objects among its arguments (a :class:`~fusegrad.tracer.guards.ClosureGuard`);
:func:`capture_call` traces it (:func:`~fusegrad.tracer.trace.trace_with_state`) and checks
that tracing changed none of those values: a compiled call runs no Python, so such a change
would happen once. What cannot be guarded, or changed while traced, raises
:class:`~fusegrad.ir.symbolic.ConcretizationError`, which sends the call to eager (or, with
``fullgraph=True``, to the user).
"""

from __future__ import annotations

from typing import Callable

from fusegrad.ir.graph import Graph
from fusegrad.ir.symbolic import ConcretizationError
from fusegrad.tracer.call_cache import _static_values
from fusegrad.tracer.guards import ClosureGuard
from fusegrad.tracer.trace import trace_with_state, tree_flatten

__all__ = ["guard_reads", "capture_call", "closure_guard_of"]


def closure_guard_of(fn: Callable, module, args, kwargs) -> ClosureGuard:
    """What ``fn`` (or ``module``'s forward) reads from its closure and globals, and of the
    objects among its arguments, guarded on each call."""
    statics = _static_values(tree_flatten((args, kwargs))[1])
    if module is None:
        return ClosureGuard.of(fn, statics)
    return ClosureGuard.of(type(module).forward, [module] + statics)


def guard_reads(make_guard: Callable[[], ClosureGuard], name: str) -> ClosureGuard:
    """``make_guard()``; what it reads cannot be guarded: eager, never a crash."""
    try:
        return make_guard()
    except Exception as e:
        raise _unguardable(name, e) from e


def capture_call(fn: Callable, args, kwargs, closure: ClosureGuard, name: str,
                 symbols: dict | None = None) -> Graph:
    """The graph of ``fn(*args, **kwargs)``; its ``meta`` is the trace's
    :class:`~fusegrad.tracer.trace.TraceInfo` (``name``: the function's, for messages;
    ``symbols``: {leaf index: {dim: SymInt}}, the dims traced as symbols)."""
    graph = trace_with_state(fn, args, kwargs, symbols)
    effect = closure.changed()
    if effect is not None:
        # The function changed a Python value it reads (a counter, a list it appends
        # to) while it was traced: a compiled call runs no Python, so the change would
        # happen once. The trace's changes are undone and the function runs eagerly.
        closure.restore()
        graph.meta.capture.rollback()
        raise ConcretizationError(
            f"{name} changes a Python value it reads ({effect}) when it runs; a compiled "
            "call runs no Python, so the change would happen only once, when the function "
            "is traced. Keep such state in tensors, or change it outside the compiled "
            "function")
    return graph


def _unguardable(name: str, error: Exception) -> ConcretizationError:
    """The error that sends a call to eager (or, with fullgraph=True, to the user) when what
    the function reads cannot be guarded."""
    return ConcretizationError(
        f"fusegrad.compile cannot guard what {name} reads from its globals, closure or "
        f"objects ({type(error).__name__}: {error}); it runs eagerly")
