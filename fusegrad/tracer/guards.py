"""Guards on what a compiled function reads from its closure, its module's globals and the
modules it calls.

A trace bakes in every Python value the function reads: a float ``K`` becomes a literal, a
module's ``training`` flag decides whether Dropout is in the graph, a BatchNorm's
``momentum`` is a literal of its update, a global tensor is read through the object it names
at trace time. So a compiled entry also records what those were, and is only reused while
they are the same:

- the closure cells and globals its code reads (the names its bytecode loads as globals,
  ``LOAD_GLOBAL``, not those it uses as attribute names: a global ``step`` is not read by
  ``opt.step()``), through nested functions and the functions it calls, a few levels deep:
  numbers, strings, None and tuples of them by value (``K = 2.0`` then ``K = 10.0``),
  anything else (tensors, modules, optimizers, functions) by identity (``scale =
  fusegrad.ones(4)`` rebinds the name to another tensor);
- of a user's Python module among them (``import config``), the attribute chains the code
  reads off it (``config.SCALE``, ``config.sub.f``), guarded and followed the same way;
- every module the trace called, however the function reached it (a closure, an argument,
  ``self.model`` of a method), and every module found among those names, with all their
  submodules: their plain attributes (``training``, ``momentum``, ``eps``, ``p``) by value or
  identity, and what their parameter, buffer, submodule and hook dicts hold by identity
  (:class:`ModuleGuard`). Any change to a module's attributes or registrations moves a
  counter (``fusegrad.nn.modules.module.STATE_VERSION``); the modules are compared only
  when it moved since the last call.

- attributes and items of the other objects reached that way, or given as non-tensor
  arguments (``self`` of a compiled method, a config object, a dict): those whose names the
  code mentions (``self.k``, ``cfg.lr``, ``cfg["clip"]``: an attribute name or a constant key
  in the code), by value or identity, and followed in turn (``self.cfg.lr``), but not an
  attribute holding no callable under a name the code only calls as a method (a
  ``self.step`` counter next to ``self.opt.step()``); a list of numbers and strings by its
  items. An attribute the object takes from its class is guarded
  where the MRO finds it, with its absence from the object and the classes before (setting
  ``cfg.k``, or ``Base.k``, hides or changes it); what properties and methods of the class
  read of the object is guarded too.

The items of a short list are followed too (``groups[0]["lr"]``), and so are optimizers and
schedulers like a user's objects: the learning rate that ``opt.step()`` reads is a graph input
read at each call, but one the function reads itself (``opt.param_groups[0]["lr"]``,
``sched.get_last_lr()``, to log or scale by it) is a constant of the trace, guarded by value.

The standard library's and fusegrad's modules (``math``, ``fusegrad``), builtins and
fusegrad's other objects are not followed; nor an item reached with a computed key
(``cfg[name]``), nor a list or dict attribute of a module changed in place: make such values
arguments or tensors, which are read at call time.
"""

from __future__ import annotations

import dis
import functools
import operator
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable

from fusegrad.nn.modules.module import STATE_VERSION

__all__ = ["ClosureGuard", "ModuleGuard", "CodeReads", "code_reads", "module_flags", "hashable"]

_MAX_DEPTH = 3
_MAX_ITEMS = 64        # a longer list of numbers is guarded by identity only
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


def _is_optimizer(attributes) -> bool:
    """Whether the attribute dict ``attributes`` is an optimizer's (fusegrad's or a user's)."""
    return isinstance(attributes.get("param_groups"), list) and "state" in attributes


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


def _module_state(m, skip=frozenset()) -> list:
    """What a trace may have read of module ``m``: each plain attribute (``training``,
    ``momentum``: by value if a number, string or tuple of them, else by identity) and what
    each dict attribute (parameters, buffers, submodules, hooks) holds, by identity. Not the
    attributes in ``skip`` ((id of the dict, name): those the compiled call itself sets)."""
    out = []
    d = m.__dict__
    for k, v in d.items():
        if skip and (id(d), k) in skip:
            continue
        if isinstance(v, dict):
            if skip and any((id(v), name) in skip for name in v):
                v = {name: x for name, x in v.items() if (id(v), name) not in skip}
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

    __slots__ = ("modules", "states", "version", "_counter", "_skip")

    def __init__(self, roots, skip=frozenset()):
        found: dict[int, Any] = {}
        for root in roots:
            for m in root.modules():
                found.setdefault(id(m), m)
        self.modules = list(found.values())
        self._skip = skip
        self.states = [_module_state(m, skip) for m in self.modules]
        self._counter = STATE_VERSION
        self.version = STATE_VERSION[0]

    @property
    def empty(self) -> bool:
        return not self.modules

    def holds(self) -> bool:
        version = self._counter[0]
        if version == self.version:
            return True
        skip = self._skip
        if not all(_same_state(s, _module_state(m, skip))
                   for m, s in zip(self.modules, self.states)):
            return False
        self.version = version
        return True


class ClosureGuard:
    """The closure cells and globals a function's code reads, and the attributes and items
    of objects it reaches through them, with what they held."""

    __slots__ = ("cells", "globals_", "entries", "modules", "_seen", "_attributes", "_plain")

    def __init__(self):
        self.cells: list[tuple[Any, str, Any]] = []            # cell, kind, value
        self.globals_: list[tuple[dict, str, str, Any]] = []   # dict, name, kind, value
        # an object's __dict__ or a dict, the attribute name or key, kind, value, and
        # "attribute" or "item"; or a list, _LIST, its items' kinds, its items, "list"
        self.entries: list[tuple[Any, Any, Any, Any, str]] = []
        self.modules: list = []         # the modules among them, for a ModuleGuard
        self._seen: set = set()         # the code and objects followed
        # The attribute names the code followed reads, and those it reads other than as a
        # method to call (see _drop_uncalled).
        self._attributes: set = set()
        self._plain: set = set()

    @classmethod
    def of(cls, fn: Callable, args=()) -> "ClosureGuard":
        """The guard of ``fn`` called with the non-tensor values ``args`` (objects whose
        attributes the code may read)."""
        guard = cls()
        seen = guard._seen
        guard._add(fn, 0, seen)
        code = getattr(getattr(fn, "__func__", fn), "__code__", None)
        if code is not None:
            reads = code_reads(code)
            for v in args:
                guard._contents(v, reads.attributes, reads.keys, 0, seen)
        guard._drop_uncalled()
        return guard

    def _note(self, reads: "CodeReads") -> None:
        self._attributes |= reads.attributes
        self._plain |= reads.plain

    def _drop_uncalled(self) -> None:
        """Drop the guards on attributes that hold no callable and whose name the code only
        calls as a method (``opt.step()``, ``loss.backward()``): the code cannot be reading
        them (a ``trainer.step`` counter next to ``self.opt.step()``), it would call them."""
        called = self._attributes - self._plain
        if called:
            self.entries = [e for e in self.entries
                            if not (e[4] == "attribute" and e[1] in called and
                                    e[3] is not _MISSING and not callable(e[3]))]

    def _add(self, fn, depth: int, seen: set) -> None:
        owner = getattr(fn, "__self__", None)          # bound methods: self is read too
        fn = getattr(fn, "__func__", fn)
        code = getattr(fn, "__code__", None)
        if code is None or id(code) in seen or depth > _MAX_DEPTH:
            return
        seen.add(id(code))
        reads = code_reads(code)
        self._note(reads)
        names, keys = reads.attributes, reads.keys
        if owner is not None and not isinstance(owner, types.ModuleType):
            self._follow(owner, depth, seen, names, keys)
        for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
            try:
                v = cell.cell_contents
            except ValueError:                         # an empty cell (defined later)
                continue
            if isinstance(v, types.ModuleType):
                self._module_chains(v, reads.chains.get(name, ()), depth, seen, reads)
            else:
                self.cells.append((cell, _kind(v), v))
                self._follow(v, depth, seen, names, keys)
        glob = getattr(fn, "__globals__", None)
        if glob is not None:
            for name in reads.globals:
                if name in glob:
                    v = glob[name]
                    if isinstance(v, types.ModuleType):
                        self._module_chains(v, reads.chains.get(name, ()), depth, seen, reads)
                    else:
                        self.globals_.append((glob, name, _kind(v), v))
                        self._follow(v, depth, seen, names, keys)

    def _module_chains(self, module: types.ModuleType, chains, depth: int, seen: set,
                       reads: "CodeReads") -> None:
        """Guard what the code reads off a user's Python module: each attribute chain
        (``config.SCALE``, ``pkg.sub.helper``) down to the first value that is not a module,
        which is guarded and followed as a global is. The standard library's modules and
        those of fusegrad, numpy and the like are not followed."""
        for chain in chains:
            holder = module
            for name in chain:
                if not _is_users_module(holder):
                    break
                d = holder.__dict__
                v = d.get(name, _MISSING)
                if isinstance(v, types.ModuleType):
                    holder = v
                    continue
                self.entries.append((d, name, _kind(v), v, "attribute"))
                if v is not _MISSING:
                    self._follow(v, depth, seen, reads.attributes, reads.keys)
                break

    def _follow(self, v, depth: int, seen: set, names, keys) -> None:
        """A recorded value: a module is guarded by a ModuleGuard, a user's function read in
        turn, a user's object or container by the attributes and items the code names."""
        if _is_module(v):
            self.modules.append(v)
            self._contents(v, names, keys, depth, seen)     # a user's module: self.cfg.k
        elif isinstance(v, (types.FunctionType, types.MethodType)):
            # (a function made by exec into a namespace without __name__ has no __module__)
            if not (getattr(v, "__module__", None) or "").startswith("fusegrad"):
                self._add(v, depth + 1, seen)
        elif isinstance(v, property):
            if isinstance(v.fget, types.FunctionType):
                self._follow(v.fget, depth, seen, names, keys)
        else:
            self._contents(v, names, keys, depth, seen)

    def _contents(self, v, names: set, keys: set, depth: int, seen: set) -> None:
        """Guard what the code may read of ``v``: the items of a dict under the code's
        constant keys, the items of a short list, the attributes of a user's object, and of
        its class, that the code names; and follow those values."""
        if depth > _MAX_DEPTH or id(v) in seen or _is_scalar(v):
            return
        if isinstance(v, dict):
            seen.add(id(v))
            held, label = [k for k in keys if k in v], "item"
        elif type(v) is list:
            seen.add(id(v))
            if len(v) <= _MAX_ITEMS:
                self.entries.append((v, _LIST, tuple(map(_kind, v)), tuple(v), "list"))
                # and what the code reads of its items (``groups[0]["lr"]``)
                for item in v:
                    if not _is_scalar(item):
                        self._follow(item, depth + 1, seen, names, keys)
            return
        else:
            d = _user_dict(v)
            if d is None:
                return
            seen.add(id(v))
            if isinstance(v, type):
                self._class_attributes(v, names, keys, depth, seen)
                return
            # What the class's properties and methods read of the object counts too
            # (``self.scale`` behind a property); not an optimizer's: what its step() and
            # zero_grad() read has the optimizer's own guard.
            if not _is_optimizer(d):
                for reads in _accessor_reads(type(v), names):
                    self._note(reads)
                    names = names | reads.attributes
            for n in names:
                if n not in d and _class_owner(type(v), n) is not None:
                    # Read from the class now; an attribute set on the object would hide it.
                    self.entries.append((d, n, "is", _MISSING, "attribute"))
            self._contents(type(v), names, keys, depth, seen)
            v, label = d, "attribute"
            held = [n for n in names if n in d]
        for k in held:
            value = v[k]
            self.entries.append((v, k, _kind(value), value, label))
            self._follow(value, depth + 1, seen, names, keys)

    def _class_attributes(self, cls: type, names: set, keys: set, depth: int,
                          seen: set) -> None:
        """Guard each name the code mentions where ``cls`` finds it: its value in the first
        of the user's classes of the MRO that defines it, and its absence from those before
        (``Base.k = 3``, or a ``k`` defined later on the subclass, changes what it reads)."""
        mro = _user_mro(cls)
        for n in names:
            owner = _class_owner(cls, n)
            if owner is None:
                continue
            for c in mro[:mro.index(owner)]:
                self.entries.append((c.__dict__, n, "is", _MISSING, "attribute"))
            value = owner.__dict__[n]
            self.entries.append((owner.__dict__, n, _kind(value), value, "attribute"))
            self._follow(value, depth + 1, seen, names, keys)

    def add_modules(self, modules) -> None:
        """Follow the ``forward`` of each of the user's modules that a trace called: the
        globals it reads, and the attributes of the module that it names."""
        for m in modules:
            forward = getattr(type(m), "forward", None)
            code = getattr(forward, "__code__", None)
            if code is None or _user_dict(m) is None:
                continue
            # (m may have been followed already, for the names of the function's own code)
            reads = code_reads(code)
            self._note(reads)
            self._contents(m, reads.attributes, reads.keys, 1, {id(code)})
            self._add(forward, 1, self._seen)
        self._drop_uncalled()

    def forget(self, skip) -> None:
        """Stop guarding the attributes in ``skip`` ((id of the dict, name)): the compiled
        call sets them itself."""
        if skip:
            self.entries = [e for e in self.entries if (id(e[0]), e[1]) not in skip]

    @property
    def empty(self) -> bool:
        return not self.cells and not self.globals_ and not self.entries

    def changed(self) -> str | None:
        """What no longer holds what it held at trace time, in words; None if all holds."""
        for cell, kind, old in self.cells:
            try:
                new = cell.cell_contents
            except ValueError:
                return "a closure variable (now deleted)"
            if not _holds(kind, old, new):
                return f"a closure variable: {_show(old)} -> {_show(new)}"
        missing = _MISSING
        for glob, name, kind, old in self.globals_:
            new = glob.get(name, missing)
            if not _holds(kind, old, new):
                return f"global {name!r}: {_show(old)} -> {_show(new)}"
        for holder, key, kind, old, label in self.entries:
            if key is _LIST:
                if len(holder) != len(old) or not all(map(_holds, kind, old, holder)):
                    return f"a list: {_show(list(old))} -> {_show(holder)}"
            elif not _holds(kind, old, holder.get(key, missing)):
                return f"{label} {key!r}: {_show(old)} -> {_show(holder.get(key, missing))}"
        return None


    def restore(self) -> None:
        """Put back what changed since the guard was made (what a trace of a function with
        Python side effects changed), where it can be written."""
        for cell, kind, old in self.cells:
            try:
                if not _holds(kind, old, cell.cell_contents):
                    cell.cell_contents = old
            except ValueError:
                cell.cell_contents = old
        for glob, name, kind, old in self.globals_:
            if not _holds(kind, old, glob.get(name, _MISSING)):
                glob[name] = old
        for holder, key, kind, old, _ in self.entries:
            if key is _LIST:
                if len(holder) != len(old) or not all(map(_holds, kind, old, holder)):
                    holder[:] = old
            elif not _holds(kind, old, holder.get(key, _MISSING)) and isinstance(holder, dict):
                if old is _MISSING:
                    del holder[key]
                else:
                    holder[key] = old


def _user_dict(v):
    """The attribute dict of a user's object or class, or of an optimizer or scheduler (not
    of fusegrad's other objects, numpy's, a tensor's or a builtin's), or None."""
    t = v if isinstance(v, type) else type(v)
    module = getattr(t, "__module__", "") or ""
    if module == "builtins" or (module.split(".")[0] in _FOREIGN and
                                not module.startswith(_FOLLOWED)):
        return None
    d = getattr(v, "__dict__", None)
    return d if isinstance(d, (dict, types.MappingProxyType)) else None


def _user_mro(cls: type) -> list[type]:
    """The user's classes among ``cls.__mro__`` (not ``object``, not fusegrad's)."""
    return [c for c in cls.__mro__ if _user_dict(c) is not None]


def _class_owner(cls: type, name: str) -> type | None:
    """The first of the user's classes in ``cls``'s MRO that defines ``name``, or None."""
    for c in _user_mro(cls):
        if name in c.__dict__:
            return c
    return None


def _accessor_reads(cls: type, names) -> list["CodeReads"]:
    """What the code of the properties and methods of ``cls`` among ``names`` reads, and of
    those they name in turn, a few levels deep."""
    found: list = []
    seen: set = set()
    known = set(names)
    todo = set(names)
    for _ in range(_MAX_DEPTH):
        more: set = set()
        for n in todo:
            owner = _class_owner(cls, n)
            if owner is None:
                continue
            v = owner.__dict__[n]
            fn = v.fget if isinstance(v, property) else getattr(v, "__func__", v)
            code = getattr(fn, "__code__", None)
            if code is None or id(code) in seen:
                continue
            seen.add(id(code))
            reads = code_reads(code)
            found.append(reads)
            more |= reads.attributes
        todo = more - known
        known |= more
    return found


def _show(v) -> str:
    if v is _MISSING:
        return "(deleted)"
    text = repr(v) if _is_scalar(v) or type(v) is list else f"<{type(v).__name__} object>"
    return text if len(text) <= 60 else text[:57] + "..."


# Packages whose objects the guards do not follow: their state that a trace reads has its
# own guards (modules, optimizers) or is read at call time (tensors).
_FOREIGN = frozenset({"fusegrad", "numpy", "torch", "jax", "jaxlib", "ml_dtypes"})
_LIST = object()          # the key of an entry that guards a whole list by its items
# fusegrad's objects that are followed all the same: a learning rate the function reads
# itself (``opt.param_groups[0]["lr"]``, ``sched.get_last_lr()``) is baked into the trace;
# only the one ``opt.step()`` reads is a graph input.
_FOLLOWED = "fusegrad.optim."


_MISSING = object()


# The bytecode that reads or writes a name as a global (LOAD_NAME: a class body's, or code
# run by exec), and as an attribute (LOAD_METHOD is LOAD_ATTR's method form up to 3.11; 3.12
# merged them). Writes count as reads: a trace that writes a global or an attribute is found
# out by the guard (ClosureGuard.changed) and refused.
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS",
                         "STORE_GLOBAL", "DELETE_GLOBAL"})
_ATTRIBUTE_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR", "STORE_ATTR",
                            "DELETE_ATTR"})
_CHAIN_START_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF"})
_CHAIN_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_METHOD_BIT = sys.version_info >= (3, 12)


@dataclass(frozen=True)
class CodeReads:
    """What a code object (and the code nested in it: lambdas, inner functions,
    comprehensions) may read by name, from its bytecode.

    ``globals``: the names it loads (or stores) as globals; ``attributes``: the names it
    reads as attributes (``opt.step`` reads the attribute ``step``, not the global), and
    ``plain`` those of them it reads other than as a method it calls (``opt.step()``);
    ``keys``: its constant strings and ints (the keys that ``cfg["clip"]`` or ``sizes[0]``
    read); ``chains``: per global or closure variable name, the attribute chains read off
    it (``config.sub.SCALE`` gives ``{"config": {("sub", "SCALE")}}``), for Python modules.
    """

    globals: frozenset
    attributes: frozenset
    plain: frozenset
    keys: frozenset
    chains: dict


@functools.lru_cache(maxsize=4096)
def code_reads(code: types.CodeType) -> CodeReads:
    """The :class:`CodeReads` of ``code`` (``dis`` gives each instruction's name as
    ``argval`` on every Python version: LOAD_GLOBAL's argument encoding changed in 3.11)."""
    globals_, attributes, plain = set(), set(), set()
    chains: dict[str, set] = {}
    keys = {c for c in code.co_consts if type(c) in (str, int)}
    chain: list | None = None
    for ins in dis.get_instructions(code):
        op = ins.opname
        if chain is not None and op in _CHAIN_OPS:
            chain.append(ins.argval)
        elif chain is not None:
            if len(chain) > 1:
                chains.setdefault(chain[0], set()).add(tuple(chain[1:]))
            chain = None
        if op in _GLOBAL_OPS:
            globals_.add(ins.argval)
        elif op in _ATTRIBUTE_OPS:
            attributes.add(ins.argval)
            # A method load (``x.f(...)``): LOAD_METHOD up to 3.11, LOAD_ATTR with the low
            # bit of its argument set from 3.12 (documented in dis).
            if not (op == "LOAD_METHOD" or op == "LOAD_ATTR" and _METHOD_BIT and ins.arg & 1):
                plain.add(ins.argval)
        if op in _CHAIN_START_OPS:
            chain = [ins.argval]
    if chain is not None and len(chain) > 1:
        chains.setdefault(chain[0], set()).add(tuple(chain[1:]))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            inner = code_reads(const)
            globals_ |= inner.globals
            attributes |= inner.attributes
            plain |= inner.plain
            keys |= inner.keys
            for name, found in inner.chains.items():
                chains.setdefault(name, set()).update(found)
    return CodeReads(frozenset(globals_), frozenset(attributes), frozenset(plain), frozenset(keys),
                     {name: frozenset(found) for name, found in chains.items()})


def _is_users_module(module) -> bool:
    """Whether a Python module is the user's (``config``, ``__main__``, a package of theirs):
    not the standard library's, nor fusegrad's, numpy's or torch's."""
    if not isinstance(module, types.ModuleType):
        return False
    top = (getattr(module, "__name__", None) or "").split(".")[0]
    return bool(top) and top not in _FOREIGN and top not in sys.stdlib_module_names and \
        top not in sys.builtin_module_names
