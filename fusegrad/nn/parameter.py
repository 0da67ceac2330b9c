"""``nn.Parameter``: a tensor that a :class:`~fusegrad.nn.Module` registers as a parameter."""

from __future__ import annotations

import numpy as np

from fusegrad import dtypes
from fusegrad.ops.creation import empty
from fusegrad.tensor import Tensor

__all__ = ["Parameter"]


class Parameter(Tensor):
    """A leaf tensor that requires grad by default and that modules register when assigned.

    It shares storage (and the version counter) with ``data``, as torch's does; operations
    on it return plain tensors.

    >>> p = Parameter(fusegrad.tensor([1., 2.]))
    >>> p
    Parameter containing:
    tensor([1., 2.], requires_grad=True)
    """

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = True) -> "Parameter":
        if data is None:
            data = empty(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter(): expected a Tensor as data, got {type(data).__name__}")
        data._check_concrete("nn.Parameter()")
        p = object.__new__(cls)
        Tensor._init(p, data._data, data._dtype)
        p._version_counter = data._version_counter
        p.requires_grad_(requires_grad)
        return p

    def __init__(self, data: Tensor | None = None, requires_grad: bool = True) -> None:
        # Everything happens in __new__; Tensor.__init__ would copy the data.
        pass

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    __str__ = __repr__

    def __deepcopy__(self, memo):
        # torch's Parameter.__deepcopy__: a fresh parameter of cloned data; unlike a plain
        # tensor's deepcopy it leaves .grad (and attributes set on it) behind.
        if id(self) in memo:
            return memo[id(self)]
        out = type(self)(Tensor._wrap(self._data.copy(), self._dtype), self._requires_grad)
        memo[id(self)] = out
        return out

    def __reduce_ex__(self, protocol):
        return (_rebuild_parameter, (np.array(self._data), self._dtype.name, self._requires_grad))


def _rebuild_parameter(array: np.ndarray, dtype_name: str, requires_grad: bool) -> Parameter:
    return Parameter(Tensor._wrap(array, dtypes.as_dtype(dtype_name)), requires_grad)
