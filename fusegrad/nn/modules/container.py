"""Containers: ``Sequential``, ``ModuleList`` and ``ModuleDict``."""

from __future__ import annotations

import operator
from collections import OrderedDict
from itertools import islice
from typing import Iterable, Iterator, Mapping

from fusegrad.nn.modules.module import Module, _addindent

__all__ = ["Sequential", "ModuleList", "ModuleDict"]


def _index(idx: int, size: int) -> int:
    idx = operator.index(idx)
    if not -size <= idx < size:
        raise IndexError(f"index {idx} is out of range")
    return idx % size


class _NumberedModules(Module):
    """What Sequential and ModuleList share: submodules keyed "0".."n-1", in order."""

    def __delitem__(self, idx) -> None:
        keys = list(self._modules)
        targets = keys[idx] if isinstance(idx, slice) else [keys[_index(idx, len(self))]]
        for key in targets:
            delattr(self, key)
        # torch renumbers the remaining modules so that indices stay 0..n-1
        remaining = list(self._modules.values())
        self._modules.clear()
        for i, module in enumerate(remaining):
            self._modules[str(i)] = module

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


class Sequential(_NumberedModules):
    """Modules applied in order: ``Sequential(a, b)(x) == b(a(x))``.

    Built from modules (named "0", "1", ...) or from one OrderedDict of named modules;
    indexable (a slice is a new Sequential), iterable and growable like a list.
    """

    def __init__(self, *args: Module) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for i, module in enumerate(args):
                self.add_module(str(i), module)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return type(self)(OrderedDict(list(self._modules.items())[idx]))
        i = _index(idx, len(self))
        return next(islice(self._modules.values(), i, None))

    def __setitem__(self, idx: int, module: Module) -> None:
        key = list(self._modules)[_index(idx, len(self))]
        setattr(self, key, module)


    def __add__(self, other: "Sequential") -> "Sequential":
        if not isinstance(other, Sequential):
            raise ValueError(f"add operator supports only objects of Sequential class, but "
                             f"{type(other)} is given.")
        out = Sequential()
        for module in list(self) + list(other):
            out.append(module)
        return out

    def append(self, module: Module) -> "Sequential":
        """Add ``module`` at the end."""
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> "Sequential":
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> "Sequential":
        """Insert ``module`` before position ``index``."""
        if not isinstance(module, Module):
            raise AssertionError(f"module should be of type: {Module}")
        n = len(self._modules)
        if not -n <= index <= n:
            raise IndexError(f"Index out of range: {index}")
        if index < 0:
            index += n
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(modules):
            self._modules[str(i)] = m
        return self

    def pop(self, key: int) -> Module:
        v = self[key]
        del self[key]
        return v

    def forward(self, input):  # noqa: A002
        for module in self:
            input = module(input)
        return input


class ModuleList(_NumberedModules):
    """A list of modules, registered so that their parameters belong to the owner."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return type(self)(list(self._modules.values())[idx])
        return self._modules[str(_index(idx, len(self)))]

    def __setitem__(self, idx: int, module: Module) -> None:
        setattr(self, str(_index(idx, len(self))), module)


    def __iadd__(self, modules: Iterable[Module]) -> "ModuleList":
        return self.extend(modules)

    def __add__(self, other: Iterable[Module]) -> "ModuleList":
        return ModuleList(list(self) + list(other))

    def append(self, module: Module) -> "ModuleList":
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> "ModuleList":
        if isinstance(modules, Module) and not isinstance(modules, (ModuleList, Sequential)):
            raise TypeError("ModuleList.extend should be called with an iterable, but got "
                            + type(modules).__name__)
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def pop(self, key: int) -> Module:
        v = self[key]
        del self[key]
        return v

    def __repr__(self) -> str:
        # torch compresses runs of identical reprs: "(0-2): 3 x Linear(...)".
        reprs = [repr(m) for m in self]
        if not reprs:
            return self._get_name() + "()"
        spans, blocks = [[0, 0]], [reprs[0]]
        for i, r in enumerate(reprs[1:], 1):
            if r == blocks[-1]:
                spans[-1][1] += 1
                continue
            spans.append([i, i])
            blocks.append(r)
        lines = []
        for (start, end), block in zip(spans, blocks, strict=True):
            text = f"({start}): {block}" if start == end else \
                f"({start}-{end}): {end - start + 1} x {block}"
            lines.append(_addindent(text, 2))
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"


class ModuleDict(Module):
    """An ordered dict of named modules, registered with the owner."""

    def __init__(self, modules: Mapping[str, Module] | Iterable | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def clear(self) -> None:
        self._modules.clear()

    def pop(self, key: str) -> Module:
        v = self[key]
        del self[key]
        return v

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def update(self, modules) -> None:
        """Add (or replace) modules from a mapping or an iterable of (name, module) pairs."""
        items = modules.items() if isinstance(modules, Mapping) else modules
        for j, item in enumerate(items):
            if not isinstance(modules, Mapping) and len(item) != 2:
                raise ValueError(f"ModuleDict update sequence element #{j} has length "
                                 f"{len(item)}; 2 is required")
            key, module = item
            self[key] = module
