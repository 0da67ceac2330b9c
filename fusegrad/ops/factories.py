"""``*_like`` and ``Tensor.new_*`` factories over :mod:`fusegrad.ops.creation`.
"""

from __future__ import annotations

from fusegrad.ops.creation import _device_of, _new_full, full_like, tensor
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor


def zeros_like(x: Tensor, *, dtype=None, requires_grad: bool = False, **_) -> Tensor:
    return full_like(x, 0, dtype=dtype, requires_grad=requires_grad)


def ones_like(x: Tensor, *, dtype=None, requires_grad: bool = False, **_) -> Tensor:
    return full_like(x, 1, dtype=dtype, requires_grad=requires_grad)


@public(method=True)
def new_zeros(x: Tensor, *size, dtype=None, requires_grad: bool = False, **_) -> Tensor:
    return _new_full(x, size, 0, dtype, requires_grad)


@public(method=True)
def new_ones(x: Tensor, *size, dtype=None, requires_grad: bool = False, **_) -> Tensor:
    return _new_full(x, size, 1, dtype, requires_grad)


@public(method=True)
def new_full(x: Tensor, size, fill_value, *, dtype=None, requires_grad: bool = False,
             **_) -> Tensor:
    return _new_full(x, (size,), fill_value, dtype, requires_grad)


@public(method=True)
def new_empty(x: Tensor, *size, dtype=None, requires_grad: bool = False, **_) -> Tensor:
    return new_zeros(x, *size, dtype=dtype, requires_grad=requires_grad)


@public(method=True)
def new_tensor(x: Tensor, data, *, dtype=None, requires_grad: bool = False, **_) -> Tensor:
    return tensor(data, dtype=dtype or x.dtype, device=_device_of(x), requires_grad=requires_grad)
