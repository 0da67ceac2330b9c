"""Fills the slots of the layers below that reach the CUDA runtime, without loading it.

:mod:`fusegrad.device` asks how many cuda devices there are, the ops copy tensors between the
host and a device, and ``Tensor.device`` names a cuda tensor's device: each through a slot
(``register_cuda_runtime``, ``register_device_copies``, ``register_handler("cuda_device")``).
``import fusegrad`` imports this module, which fills them with functions that import
:mod:`fusegrad.runtime.cuda` or :mod:`fusegrad.tracer.eager_cuda` on their first call, so
that a process that never asks for a cuda device loads neither (nor any CUDA package).
"""

from __future__ import annotations

from fusegrad.device import register_cuda_runtime
from fusegrad.ops.primitive import register_device_copies
from fusegrad.tensor import register_handler

__all__: list[str] = []


def _cuda():
    from fusegrad.runtime import cuda  # optional: the CUDA runtime loads on the first cuda request
    return cuda


def _eager_cuda():
    from fusegrad.tracer import eager_cuda  # optional: as above, once a cuda tensor is made
    return eager_cuda


def _device_count() -> int:
    return _cuda().device_count()


def _install_hint() -> str:
    return _cuda().INSTALL_HINT


def _transfer(t, device):
    return _eager_cuda().transfer(t, device)


def _copy_into(buffer, source) -> None:
    _eager_cuda().copy_into(buffer, source)


def _cuda_device(index: int):
    return _eager_cuda().cuda_device(index)


register_cuda_runtime(_device_count, _install_hint)
register_device_copies(_transfer, _copy_into)
register_handler("cuda_device", _cuda_device)
