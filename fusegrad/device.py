"""Devices: ``fusegrad.device("cpu")``, ``"cuda"``, ``"cuda:0"``.

A CUDA request is validated against what the machine has, so that asking for a GPU on a
machine without one fails at once with a clear error, as in PyTorch, rather than later inside
a kernel launch. ``cuda`` without an index is the current device
(:func:`fusegrad.cuda.set_device`); ``cuda:N`` is device N (see
:mod:`fusegrad.tracer.eager_cuda`).
"""

from __future__ import annotations

__all__ = ["device", "cuda_is_available", "cuda_device_count", "check_device_available",
           "register_cuda_runtime"]

# What the CUDA runtime tells this base module: ``device_count() -> int`` (0 without a
# driver) and ``install_hint() -> str``, which the error for a missing driver quotes. Filled
# at import by fusegrad.tracer.device_slots (register_cuda_runtime), with functions that load
# the runtime on their first call.
_cuda_runtime: dict = {"device_count": None, "install_hint": None}


def register_cuda_runtime(device_count, install_hint) -> None:
    """Install the CUDA runtime's ``device_count()`` and ``install_hint()``."""
    _cuda_runtime["device_count"] = device_count
    _cuda_runtime["install_hint"] = install_hint


class device:  # noqa: N801 - the public name follows torch.device
    """A device: a type (``"cpu"`` or ``"cuda"``) and an optional index."""

    __slots__ = ("type", "index")

    def __init__(self, spec, index: int | None = None):
        if isinstance(spec, device):
            self.type, self.index = spec.type, spec.index
            return
        if isinstance(spec, int):
            spec, index = "cuda", spec
        if not isinstance(spec, str):
            raise TypeError(f"device() expects a string or a device, got {type(spec).__name__}")
        kind, _, idx = spec.partition(":")
        if kind not in ("cpu", "cuda"):
            raise RuntimeError(
                f"Expected one of cpu, cuda device type at start of device string: {spec}")
        if idx:
            if index is not None:
                raise RuntimeError(f"type (string) must not include an index because index was "
                                   f"passed explicitly: {spec}")
            if not idx.isdigit():
                raise RuntimeError(f"Invalid device string: '{spec}'")
            index = int(idx)
        self.type = kind
        self.index = index

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            other = device(other)
        if not isinstance(other, device):
            return NotImplemented
        return self.type == other.type and self.index == other.index

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"


CPU = device("cpu")


def cuda_device_count() -> int:
    """How many CUDA devices the driver reports; 0 when no CUDA package (cuda-python or
    pycuda) or no driver is installed. Imports a driver package only when called."""
    count = _cuda_runtime["device_count"]
    return 0 if count is None else count()


def cuda_is_available() -> bool:
    return cuda_device_count() > 0


def check_device_available(dev: device) -> device:
    """Return ``dev`` if this machine has it, else raise as torch does."""
    if dev.type == "cuda":
        count = cuda_device_count()
        if count == 0:
            raise RuntimeError(
                "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU "
                f"and installed a driver, and {_cuda_runtime['install_hint']()}.")
        if dev.index is not None and dev.index >= count:
            raise RuntimeError(f"CUDA error: invalid device ordinal {dev.index} ({count} available)")
    return dev
