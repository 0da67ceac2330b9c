"""Guards on what a compiled function reads from its closure and its module's globals.

A trace bakes in every Python value the function reads: a float ``K`` becomes a literal, a
module's ``training`` flag decides whether Dropout is in the graph, a global tensor is read
through the object it names at trace time. So a compiled entry also records the names its
code reads (closure cells and globals, through nested functions and the global functions it
calls, a few levels deep) with what they held, and is only reused while they hold the same:

- numbers, strings, None and tuples of them: by value (``K = 2.0`` then ``K = 10.0``);
- modules: by identity and every submodule's ``training`` flag (``m[1].eval()``);
- anything else (tensors, optimizers, functions): by identity (``scale = fusegrad.ones(4)``
  rebinds the name to another tensor).

Python modules (``math``, ``fusegrad``) and builtins are not guarded. Attributes of objects
(``self.k``, ``cfg.lr``) are not seen: make such values arguments (``static_argnums``) or
tensors, which are read at call time.
"""

from __future__ import annotations

import types
from typing import Any, Callable

__all__ = ["ClosureGuard", "module_flags", "hashable"]

_MAX_DEPTH = 3
_SCALARS = (bool, int, float, complex, str, bytes, type(None))


def hashable(v):
    """``v`` if it can be part of a dict key, else a stand-in that compares by identity."""
    try:
        hash(v)
        return v
    except TypeError:
        return ("id", id(v))


def module_flags(module) -> tuple:
    """Every submodule's ``training`` flag, in order."""
    return tuple(m.training for m in module.modules())


def _is_module(v) -> bool:
    return hasattr(v, "_parameters") and hasattr(v, "modules") and hasattr(v, "training")


def _snapshot(v) -> tuple[str, Any]:
    if isinstance(v, _SCALARS) or (isinstance(v, tuple) and all(isinstance(x, _SCALARS)
                                                                for x in v)):
        return ("eq", v)
    if _is_module(v):
        return ("module", module_flags(v))
    return ("is", None)


def _holds(kind: str, saved, old, new) -> bool:
    if kind == "eq":
        return type(new) is type(old) and new == old
    if new is not old:
        return False
    return kind != "module" or module_flags(new) == saved


class ClosureGuard:
    """The closure cells and globals a function's code reads, with what they held."""

    __slots__ = ("cells", "globals_")

    def __init__(self):
        self.cells: list[tuple[Any, str, Any, Any]] = []       # cell, kind, saved, value
        self.globals_: list[tuple[dict, str, str, Any, Any]] = []   # dict, name, kind, ...

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
                    if isinstance(v, types.ModuleType):
                        continue
                    kind, saved = _snapshot(v)
                    self.globals_.append((glob, name, kind, saved, v))
                    self._follow(v, depth, seen)

    def _record_cell(self, cell, v, depth: int, seen: set) -> None:
        if isinstance(v, types.ModuleType):
            return
        kind, saved = _snapshot(v)
        self.cells.append((cell, kind, saved, v))
        self._follow(v, depth, seen)

    def _follow(self, v, depth: int, seen: set) -> None:
        if isinstance(v, (types.FunctionType, types.MethodType)) and \
                not getattr(v, "__module__", "").startswith("fusegrad"):
            self._add(v, depth + 1, seen)

    @property
    def empty(self) -> bool:
        return not self.cells and not self.globals_

    def holds(self) -> bool:
        """Whether every recorded name still holds what it held at trace time."""
        for cell, kind, saved, old in self.cells:
            try:
                new = cell.cell_contents
            except ValueError:
                return False
            if not _holds(kind, saved, old, new):
                return False
        missing = _MISSING
        for glob, name, kind, saved, old in self.globals_:
            if not _holds(kind, saved, old, glob.get(name, missing)):
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
