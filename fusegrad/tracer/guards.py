"""Guards on what a compiled function reads from its closure, its module's globals and the
modules it calls.

A trace bakes in every Python value the function reads: a float ``K`` becomes a literal, a
module's ``training`` flag decides whether Dropout is in the graph, a BatchNorm's
``momentum`` is a literal of its update, a global tensor is read through the object it names
at trace time. So a compiled entry also records what those were, and is only reused while
they are the same:

- the names its code reads (closure cells and globals, through nested functions and the
  global functions it calls, a few levels deep): numbers, strings, None and tuples of them
  by value (``K = 2.0`` then ``K = 10.0``), anything else (tensors, modules, optimizers,
  functions) by identity (``scale = fusegrad.ones(4)`` rebinds the name to another tensor);
- every module the trace called, however the function reached it (a closure, an argument,
  ``self.model`` of a method), and every module found among those names, with all their
  submodules: their plain attributes (``training``, ``momentum``, ``eps``, ``p``) by value or
  identity, and what their parameter, buffer, submodule and hook dicts hold by identity
  (:class:`ModuleGuard`). Any change to a module's attributes or registrations moves a
  counter (``fusegrad.nn.modules.module.STATE_VERSION``); the modules are compared only
  when it moved since the last call.

Python modules (``math``, ``fusegrad``) and builtins are not guarded. Attributes of other
objects (``self.k``, ``cfg.lr``) are not seen, nor a list or dict attribute of a module
changed in place: make such values arguments (``static_argnums``) or tensors, which are read
at call time.
"""

from __future__ import annotations

import operator
import types
from typing import Any, Callable

__all__ = ["ClosureGuard", "ModuleGuard", "module_flags", "hashable"]

_MAX_DEPTH = 3
_SCALARS = (bool, int, float, complex, str, bytes, type(None))


def hashable(v):
    """``v`` as part of a dict key, with its type: ``2``, ``2.0`` and ``True`` are equal in
    Python but trace differently (``x // 2`` is an integer tensor, ``x // 2.0`` a float one).
    Tuples key element by element; what cannot be hashed, by identity."""
    if type(v) is tuple:
        return (tuple, tuple(hashable(x) for x in v))
    try:
        hash(v)
        return (type(v), v)
    except TypeError:
        return ("id", id(v))


def module_flags(module) -> tuple:
    """Every submodule's ``training`` flag, in order."""
    return tuple(m.training for m in module.modules())


def _is_module(v) -> bool:
    return hasattr(v, "_parameters") and hasattr(v, "modules") and hasattr(v, "training")


def _is_scalar(v) -> bool:
    return isinstance(v, _SCALARS) or (isinstance(v, tuple) and
                                       all(isinstance(x, _SCALARS) for x in v))


def _kind(v) -> str:
    """How a value is compared with what it was: numbers, strings and tuples of them by value
    ("eq"), anything else by identity ("is")."""
    return "eq" if _is_scalar(v) else "is"


def _holds(kind: str, old, new) -> bool:
    if kind == "eq":
        return type(new) is type(old) and (new == old or new != new and old != old)  # NaN
    return new is old


def _module_state(m) -> list:
    """What a trace may have read of module ``m``: each plain attribute (``training``,
    ``momentum``: by value if a number, string or tuple of them, else by identity) and what
    each dict attribute (parameters, buffers, submodules, hooks) holds, by identity."""
    out = []
    for k, v in m.__dict__.items():
        if isinstance(v, dict):
            out.append((k, "dict", tuple(v), tuple(v.values())))
        elif _is_scalar(v):
            out.append((k, "eq", v, None))
        else:
            out.append((k, "is", v, None))
    return out


def _same_state(old: list, new: list) -> bool:
    if len(old) != len(new):
        return False
    for (k, kind, a, values), (k2, kind2, b, values2) in zip(old, new):
        if k != k2 or kind != kind2:
            return False
        if kind == "dict":
            if a != b or len(values) != len(values2) or \
                    not all(map(operator.is_, values, values2)):
                return False
        elif not _holds(kind, a, b):
            return False
    return True


class ModuleGuard:
    """The state of some modules and all their submodules (:func:`_module_state`), as a
    trace saw it. Compared only when ``STATE_VERSION`` moved since the last call that held:
    a call of a step whose modules nobody touched costs one integer comparison."""

    __slots__ = ("modules", "states", "version", "_counter")

    def __init__(self, roots):
        from fusegrad.nn.modules.module import STATE_VERSION
        found: dict[int, Any] = {}
        for root in roots:
            for m in root.modules():
                found.setdefault(id(m), m)
        self.modules = list(found.values())
        self.states = [_module_state(m) for m in self.modules]
        self._counter = STATE_VERSION
        self.version = STATE_VERSION[0]

    @property
    def empty(self) -> bool:
        return not self.modules

    def holds(self) -> bool:
        version = self._counter[0]
        if version == self.version:
            return True
        if not all(_same_state(s, _module_state(m)) for m, s in zip(self.modules, self.states)):
            return False
        self.version = version
        return True


class ClosureGuard:
    """The closure cells and globals a function's code reads, with what they held."""

    __slots__ = ("cells", "globals_", "modules")

    def __init__(self):
        self.cells: list[tuple[Any, str, Any]] = []            # cell, kind, value
        self.globals_: list[tuple[dict, str, str, Any]] = []   # dict, name, kind, value
        self.modules: list = []         # the modules among them, for a ModuleGuard

    @classmethod
    def of(cls, fn: Callable) -> "ClosureGuard":
        guard = cls()
        guard._add(fn, 0, set())
        return guard

    def _add(self, fn, depth: int, seen: set) -> None:
        fn = getattr(fn, "__func__", fn)              # bound methods
        code = getattr(fn, "__code__", None)
        if code is None or id(code) in seen or depth > _MAX_DEPTH:
            return
        seen.add(id(code))
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                v = cell.cell_contents
            except ValueError:                         # an empty cell (defined later)
                continue
            self._record_cell(cell, v, depth, seen)
        glob = getattr(fn, "__globals__", None)
        if glob is not None:
            for name in _names(code):
                if name in glob:
                    v = glob[name]
                    if not isinstance(v, types.ModuleType):
                        self.globals_.append((glob, name, _kind(v), v))
                        self._follow(v, depth, seen)

    def _record_cell(self, cell, v, depth: int, seen: set) -> None:
        if not isinstance(v, types.ModuleType):
            self.cells.append((cell, _kind(v), v))
            self._follow(v, depth, seen)

    def _follow(self, v, depth: int, seen: set) -> None:
        """A recorded value: a module is guarded by a ModuleGuard, a user's function read in
        turn."""
        if _is_module(v):
            self.modules.append(v)
        if isinstance(v, (types.FunctionType, types.MethodType)) and \
                not getattr(v, "__module__", "").startswith("fusegrad"):
            self._add(v, depth + 1, seen)

    @property
    def empty(self) -> bool:
        return not self.cells and not self.globals_

    def holds(self) -> bool:
        """Whether every recorded name still holds what it held at trace time."""
        for cell, kind, old in self.cells:
            try:
                new = cell.cell_contents
            except ValueError:
                return False
            if not _holds(kind, old, new):
                return False
        missing = _MISSING
        for glob, name, kind, old in self.globals_:
            if not _holds(kind, old, glob.get(name, missing)):
                return False
        return True


_MISSING = object()


def _names(code) -> set[str]:
    """Global names read by ``code`` and the code nested in it (lambdas, inner functions)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names
