"""Trace state lives in the tracer; the code below it sees it only through ``bind`` and the
effect functions of ``fusegrad.effects`` (which ``fusegrad.ops.primitive`` re-exports), whose
slots the tracer fills while some thread traces and empties when none does."""

from __future__ import annotations

import re
from pathlib import Path

import fusegrad as fg
from fusegrad import effects
from fusegrad.tracer import state

PACKAGE = Path(fg.__file__).parent
# Names of the trace state and of the tracer's handles on it; the slots are fusegrad.effects'.
TRACE_STATE = re.compile(
    r"current_capture|is_compiling|trace_state\(|_trace_state|\.captures\b|TraceState|key_sources"
    r"|push_capture|pop_capture|capture_lookup|key_source_lookup|traces_lookup"
    r"|set_(capture|key_source|traces)_lookup")
ALLOWED = (PACKAGE / "ops" / "primitive.py", PACKAGE / "effects.py", PACKAGE / "tracer")


def _allowed(path: Path) -> bool:
    return path in ALLOWED[:2] or ALLOWED[2] in path.parents


def test_only_bind_and_the_tracer_read_trace_state():
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if _allowed(path):
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if TRACE_STATE.search(line):
                hits.append(f"{path.relative_to(PACKAGE.parent)}:{lineno}: {line.strip()}")
    assert hits == [], "trace state read outside bind, fusegrad.effects and the tracer " \
        "(use effects.compiling(), traced(), note_created() ...):\n" + "\n".join(hits)


def _slots() -> tuple:
    return effects.capture_lookup, effects.key_source_lookup, effects.traces_lookup


def test_slots_are_filled_only_while_tracing():
    assert _slots() == (None, None, None)        # an eager op pays one truth test each
    seen = {}

    @fg.compile(fullgraph=True)
    def f(x):
        seen["compiling"] = state.is_compiling()
        seen["slots"] = [s is not None for s in _slots()]
        seen["traces"] = len(effects.enclosing_traces())
        return x * 2

    f(fg.ones(3))
    assert seen == {"compiling": True, "slots": [True, True, True], "traces": 1}
    assert not state.is_compiling() and not effects.compiling()
    assert _slots() == (None, None, None)
    assert state.trace_state().captures == [] and state.trace_state().key_sources == []


def test_slots_are_emptied_when_a_trace_fails():
    @fg.compile(fullgraph=True)
    def f(x):
        return x.sum().item()

    try:
        f(fg.ones(3))
    except fg.tracer.ConcretizationError:
        pass
    assert _slots() == (None, None, None)


def test_fusegrad_trace_fills_the_trace_and_key_slots_but_not_bind_s():
    seen = {}

    def f(x):
        seen["slots"] = [s is not None for s in _slots()]
        seen["compiling"] = effects.compiling()
        return x + 1

    fg.trace(f, fg.ones(2))
    assert seen == {"slots": [False, True, True], "compiling": False}
    assert _slots() == (None, None, None)


def test_effect_functions_are_no_ops_when_nothing_is_traced():
    t = fg.ones(2)
    assert not effects.compiling() and not effects.traced(t)
    effects.note_made(t)
    effects.note_created(t)
    effects.refuse_traced("nothing")
    effects.check_concrete(t, "item()")
    effects.note_module(fg.nn.Identity())
    effects.note_attribute({}, "w", t, False)
    assert effects.enter_optimizer(object()) is None
    effects.exit_optimizer(None)
    assert effects.is_scalar_input(0.1) is False
    assert effects.key_source() is None and effects.enclosing_traces() == []
