"""Forward-mode AD: tensors that carry tangents, and the dispatch that applies JVP rules.

A level (:func:`enter_level`) is one forward-mode differentiation. A tensor carries its
tangents in ``_fw_grads``, ``{level id: tangent}``; while a level is live,
:func:`fusegrad.ops.primitive.bind` hands every primitive to :func:`apply_jvp`, which computes
the primal result with that level hidden and then the result's tangent by the primitive's JVP
rule (:func:`fusegrad.ops.primitive.jvp_rule`, written beside each primitive).

Tangents are ordinary tensors and the rules are tensor ops, so forward mode composes with the
rest as JAX's JVP trace does, without a tensor type of its own:

- reverse over forward: the rules' ops are recorded on the tape (or, traced, in the graph),
  so a tangent can be differentiated (``grad`` of a ``jvp``);
- forward over reverse: the VJP rules that backward runs are primitives on the saved
  operands, which carry their tangents, so a gradient gets its tangent (``jvp`` of
  ``grad``, a Hessian-vector product);
- nested levels: a level hides itself while its rules run, so the rules' ops carry the
  tangents of the enclosing levels only (no perturbation confusion), as JAX's levels do;
- fusegrad.compile: primals and tangents are symbolic tensors and both end up in one graph.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Callable

from fusegrad.ops import primitive as _primitive
from fusegrad.ops.creation import zeros_like
from fusegrad.ops.movement import alias
from fusegrad.ops.primitive import Primitive, bind
from fusegrad.ops.prims_elementwise import cast
from fusegrad.ops.prims_movement import broadcast_to

__all__ = ["enter_level", "exit_level", "live_levels", "get_tangent", "set_tangent",
           "assign_tangents", "forward_product", "detach_keeping_tangents", "hidden",
           "apply_jvp", "missing_rule_message", "refresh_view_tangents",
           "PRIMAL_ONLY"]

_ids = itertools.count(1)
_levels: list[int] = []          # live level ids, outermost first; ids grow inward
_visible: frozenset = frozenset()  # the live levels not hidden by a rule being applied


def _set_visible(levels) -> None:
    global _visible
    _visible = frozenset(levels)
    _primitive.register_jvp_apply(apply_jvp if _visible else None)


def enter_level() -> int:
    """Start a forward-mode level; returns its id (tangents are set and read by it)."""
    level = next(_ids)
    _levels.append(level)
    _set_visible(_levels)
    return level


def exit_level(level: int) -> None:
    """End ``level`` (the innermost one): tangents set at it are no longer seen."""
    if not _levels or _levels[-1] != level:
        raise RuntimeError("Trying to exit a forward AD level that was not the last one that "
                           "was created. This is not supported.")
    _levels.pop()
    _set_visible(_levels)


def live_levels() -> tuple[int, ...]:
    """The live level ids, outermost first."""
    return tuple(_levels)


@contextlib.contextmanager
def hidden(level: int):
    """Hide ``level`` and the levels inside it: ops see only the enclosing levels' tangents."""
    before = _visible
    _set_visible(lv for lv in before if lv < level)
    try:
        yield
    finally:
        _set_visible(before)


def get_tangent(t, level: int):
    """``t``'s tangent at ``level``, or None."""
    fw = t._fw_grads
    return None if fw is None else fw.get(level)


def set_tangent(t, level: int, tangent) -> None:
    """Give ``t`` the ``tangent`` at ``level`` (None removes it). A new dict each time: a
    tensor made from another (detach of a saved output) may share the old one."""
    fw = dict(t._fw_grads or {})
    if tangent is None:
        fw.pop(level, None)
    else:
        fw[level] = tangent
    t._fw_grads = fw or None
    _stamp(t)
    _note_traced(t)


# The ``_fw_version`` of a view that never takes its base's tangents: the primal that
# ``unpack_dual`` returns (torch's ``_fw_primal`` view).
PRIMAL_ONLY = object()


def _view_key(t):
    """What changes when a view's storage is written: the version counter it shares with its
    base, or, traced (writes rebind values instead), the base's current graph value."""
    return t._version_counter.value if t._trace is None else t._base._val


def _stamp(t) -> None:
    if t._base is not None:
        t._fw_version = _view_key(t)


def refresh_view_tangents(t) -> None:
    """A view whose storage was written since its tangents were set (through its base or
    another view) gets its base's tangents seen through its view ops: in torch a view's
    tangent is a view of its base's."""
    base = t._base
    if (base is None or not base._fw_grads or t._fw_version is _view_key(t)
            or t._fw_version is PRIMAL_ONLY):
        return
    fw = dict(t._fw_grads or {})
    for level, tangent in base._fw_grads.items():
        with hidden(level):
            for prim, attrs in t._version_counter.undo + t._view_ops:
                tangent = bind(prim, tangent, **attrs)
        fw[level] = tangent
    t._fw_grads = fw
    _stamp(t)
    _note_traced(t)


def _note_traced(t) -> None:
    # A traced value: its trace keeps the tangents for tensors made again for the value (the
    # reverse pass of a compiled backward), forward over reverse.
    tangents = getattr(t._trace, "tangents", None)
    if tangents is not None:
        tangents[t._value] = t._fw_grads


def detach_keeping_tangents(t):
    """``t`` cut from the tape its ops are recorded on (``Tensor._detach_own_tape``: a
    batched tensor inside vmap keeps its underlying history), with its forward-mode
    tangents: what a transform returns when it cuts its own reverse-mode history, which
    enclosing forward levels must still see."""
    out = t._detach_own_tape()
    if t._fw_grads is not None:
        out._fw_grads = t._fw_grads
        _note_traced(out)
    return out


def assign_tangents(x, value) -> None:
    """After an in-place write of ``value`` into ``x``: ``x`` has ``value``'s tangents."""
    if x._fw_grads is not None or value._fw_grads is not None:
        x._fw_grads = value._fw_grads
        _stamp(x)
        _note_traced(x)


def forward_product(flat: Callable, inputs, tangents, zeros: bool = True) -> tuple[tuple, tuple]:
    """``(flat(*inputs), J tangents)`` by forward mode: one call of ``flat`` (which returns a
    tuple of tensors) at a level of its own, on aliases of
    ``inputs`` carrying ``tangents``. An output that does not depend on the inputs has a
    zero tangent (None unless ``zeros``). The outputs keep the tangents of enclosing levels,
    not this one's."""
    level = enter_level()
    try:
        duals = []
        for p, t in zip(inputs, tangents):
            with hidden(level):
                x = alias(p)
            set_tangent(x, level, t.to(p.dtype) if t.dtype is not p.dtype else t)
            duals.append(x)
        outs = flat(*duals)
        jvps = []
        for o in outs:
            t = get_tangent(o, level)
            jvps.append(zeros_like(o) if t is None and zeros else t)
            if t is not None:
                set_tangent(o, level, None)
    finally:
        exit_level(level)
    return tuple(outs), tuple(jvps)


def missing_rule_message(prim: Primitive) -> str:
    return (f"Trying to use forward AD with {prim.name} that does not support it because it has "
            f"not been implemented yet.")


def _fit(tangent, out):
    """The rule's tangent with the result's shape and dtype (rules of broadcasting ops give
    the tangent at the operands' shape)."""
    if tuple(tangent.shape) != tuple(out.shape):
        tangent = bind(broadcast_to, tangent, shape=tuple(out.shape))
    if tangent.dtype is not out.dtype:
        tangent = bind(cast, tangent, dtype=out.dtype)
    return tangent


def apply_jvp(prim: Primitive, operands, attrs):
    """``bind(prim, *operands, **attrs)`` with the tangent of the innermost visible level
    that an operand has; None when no operand has a visible tangent."""
    level = 0
    for op in operands:
        if op._base is not None:
            refresh_view_tangents(op)
        fw = op._fw_grads
        if fw:
            for lv in fw:
                if lv > level and lv in _visible:
                    level = lv
    if not level:
        return None
    for op in operands:
        # An operand of a trace that started inside this level (a vmap inside the jvp) goes
        # to that trace first: its rule hands the underlying tensors down, and the tangents
        # of this level ride on those (JAX's order of the levels).
        trace = op._trace
        if trace is not None and getattr(trace, "forward_level_at_entry", 0) >= level:
            return None
    tangents = [get_tangent(op, level) for op in operands]
    with hidden(level):
        out = bind(prim, *operands, **attrs)
        if not out.dtype.is_differentiable:
            return out                      # integers and bools have no tangent
        try:
            rule = prim.extra["jvp"]
        except KeyError:
            raise NotImplementedError(missing_rule_message(prim)) from None
        if rule is None:
            return out
        tangent = rule(tangents, out, *operands, **attrs)
        if tangent is not None:
            tangent = _fit(tangent, out)
    if tangent is not None:
        set_tangent(out, level, tangent)
        # The output saved for backward is a detached copy made before the tangent existed:
        # give it the tangent too, so a backward under this level sees it (forward over
        # reverse through a rule that reads the output, exp's).
        saved = getattr(out.grad_fn, "_out", None)
        if saved is not None and saved.tensor is not out:
            saved.tensor._fw_grads = out._fw_grads
    return out
