"""``ParameterList`` and ``ParameterDict``: parameters held in a list or a dict, registered
so that they belong to the owning module (``parameters()``, ``state_dict``, ``.to``)."""

from __future__ import annotations

import operator
from collections import OrderedDict
from typing import Any, Callable, Iterable, Iterator, Mapping

from fusegrad.nn.modules.module import Module
from fusegrad.nn.parameter import Parameter
from fusegrad.tensor import Tensor

__all__ = ["ParameterList", "ParameterDict"]


def _as_parameter(value: Any) -> Any:
    # torch wraps plain tensors into parameters (they would not be trained otherwise).
    if isinstance(value, Tensor) and not isinstance(value, Parameter):
        return Parameter(value)
    return value


def _describe(value: Any, type_name: Callable[[Tensor], str]) -> str:
    """torch's line for one entry: ``Parameter containing: [<type_name> of size 2x3]``."""
    if isinstance(value, Tensor):
        kind = "Parameter" if isinstance(value, Parameter) else "Tensor"
        size = "x".join(str(d) for d in value.shape)
        device = f" ({value.device})" if value.is_cuda else ""
        return f"{kind} containing: [{type_name(value)} of size {size}{device}]"
    return f"Object of type: {type(value).__name__}"


class ParameterList(Module):
    """A list of parameters, registered under the names "0", "1", ...

    >>> plist = ParameterList([Parameter(fusegrad.ones(2)) for _ in range(3)])
    >>> len(list(plist.parameters()))
    3
    """

    def __init__(self, values: Iterable[Any] | None = None) -> None:
        super().__init__()
        self._size = 0
        if values is not None:
            self += values

    def _index(self, idx: int) -> int:
        idx = operator.index(idx)
        if not -len(self) <= idx < len(self):
            raise IndexError(f"index {idx} is out of range")
        return idx % len(self)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return type(self)([self[i] for i in range(len(self))[idx]])
        return getattr(self, str(self._index(idx)))

    def __setitem__(self, idx: int, param: Any) -> None:
        setattr(self, str(self._index(idx)), _as_parameter(param))

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Any]:
        return iter(self[i] for i in range(len(self)))

    def __iadd__(self, parameters: Iterable[Any]) -> "ParameterList":
        return self.extend(parameters)

    def __dir__(self):
        return [k for k in super().__dir__() if not k.isdigit()]

    def append(self, value: Any) -> "ParameterList":
        """Add ``value`` (a tensor becomes a parameter) at the end."""
        self._size += 1
        setattr(self, str(self._size - 1), _as_parameter(value))
        return self

    def extend(self, values: Iterable[Any]) -> "ParameterList":
        """Append each of ``values``."""
        if not isinstance(values, Iterable) or isinstance(values, Tensor):
            raise TypeError("ParameterList.extend should be called with an iterable, but got "
                            + type(values).__name__)
        for value in values:
            self.append(value)
        return self

    def extra_repr(self) -> str:
        # torch names the dtype here (fusegrad.float32) and the tensor type in ParameterDict
        return "\n".join(f"  ({i}): {_describe(v, lambda t: str(t.dtype))}"
                         for i, v in enumerate(self))


class ParameterDict(Module):
    """An ordered dict of parameters keyed by strings, each registered under its key.

    >>> pdict = ParameterDict({"scale": Parameter(fusegrad.ones(3))})
    >>> pdict["scale"].shape
    fusegrad.Size([3])
    """

    def __init__(self, parameters: Any = None) -> None:
        super().__init__()
        self._keys: dict[str, None] = OrderedDict()
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"parameter name should be a string. Got {type(key).__name__}")
        self._keys[key] = None
        setattr(self, key, _as_parameter(value))

    def __delitem__(self, key: str) -> None:
        del self._keys[key]
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __reversed__(self) -> Iterator[str]:
        return reversed(list(self._keys))

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def keys(self):
        """The keys, in insertion order."""
        return list(self._keys)

    def values(self):
        """The parameters (and other values), in insertion order."""
        return [self[k] for k in self._keys]

    def items(self):
        """(key, value) pairs, in insertion order."""
        return [(k, self[k]) for k in self._keys]

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def pop(self, key: str) -> Any:
        """Remove ``key`` and return its value."""
        value = self[key]
        del self[key]
        return value

    def popitem(self) -> tuple[str, Any]:
        key = next(reversed(self._keys))
        return key, self.pop(key)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def clear(self) -> None:
        for key in list(self._keys):
            del self[key]

    def copy(self) -> "ParameterDict":
        """A new ParameterDict holding the same parameters."""
        return ParameterDict(OrderedDict(self.items()))

    def fromkeys(self, keys: Iterable[str], default: Any = None) -> "ParameterDict":
        return ParameterDict([(k, default) for k in keys])

    def update(self, parameters: Any) -> None:
        """Add the pairs of a mapping, a ParameterDict or an iterable of (key, value).

        As torch: an OrderedDict, a ParameterDict or an iterable keeps its order; the keys of
        any other mapping (a plain dict) are added in sorted order, which is the order of
        ``parameters()`` and ``state_dict()``.
        """
        if isinstance(parameters, (OrderedDict, ParameterDict)):
            pairs = list(parameters.items())
        elif isinstance(parameters, Mapping):
            pairs = sorted(parameters.items())
        else:
            pairs = []
            for j, p in enumerate(parameters):
                if not isinstance(p, (tuple, list)) or len(p) != 2:
                    raise ValueError(f"ParameterDict update sequence element #{j} has length "
                                     f"{len(p) if hasattr(p, '__len__') else '?'}; 2 is required")
                pairs.append(tuple(p))
        for key, value in pairs:
            self[key] = value

    def __or__(self, other: "ParameterDict") -> "ParameterDict":
        out = self.copy()
        out.update(other)
        return out

    def extra_repr(self) -> str:
        return "\n".join(f"  ({k}): {_describe(v, Tensor.type)}" for k, v in self.items())
