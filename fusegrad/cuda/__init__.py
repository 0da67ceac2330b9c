"""``fusegrad.cuda``: what a torch training script asks of ``torch.cuda``.

Every function here answers without a GPU: with no NVIDIA driver (or no CUDA package)
``is_available()`` is False and ``device_count()`` 0, and no CUDA package is imported (the
driver library is looked for first, see :func:`fusegrad.runtime.cuda.driver`). The runtime
module itself is imported on first call, so ``import fusegrad`` stays free of it.

Random numbers on cuda are drawn by the cpu generator and copied (a seed gives the same
values on both devices), so :func:`manual_seed` and :func:`manual_seed_all` seed that one.
``fusegrad.cuda.amp`` holds torch.cuda.amp's deprecated spellings of :mod:`fusegrad.amp`.

Memory comes from a caching allocator with torch's block rounding and statistics
(:class:`fusegrad.runtime.cuda.CachingAllocator`); when the device is full it empties its
cache, tries again, then raises :class:`OutOfMemoryError` with torch's message.
"""

from __future__ import annotations

import contextlib

from fusegrad.device import device as _device
from fusegrad.ops.creation import manual_seed as _manual_seed
from fusegrad.profiler_core import ProfilerActivity, register_device_activity
from fusegrad.runtime.errors import OutOfMemoryError

__all__ = ["is_available", "device_count", "current_device", "set_device", "device",
           "synchronize", "manual_seed", "manual_seed_all", "get_device_name",
           "get_device_capability", "get_arch_list", "memory_allocated",
           "max_memory_allocated", "memory_reserved", "max_memory_reserved", "empty_cache",
           "reset_peak_memory_stats", "OutOfMemoryError"]


def _rt():
    from fusegrad.runtime import cuda  # optional: the CUDA runtime loads on first use
    return cuda


def _index(dev) -> int | None:
    """The ordinal ``dev`` names (an int, ``"cuda:1"``, a device), None for the current."""
    if dev is None or isinstance(dev, int):
        return dev
    d = _device(dev)
    if d.type != "cuda":
        raise ValueError(f"Expected a cuda device, but got: {d}")
    return d.index


def is_available() -> bool:
    """Whether a CUDA device can be used (False without a driver or a CUDA package)."""
    return _rt().is_available()


def device_count() -> int:
    """How many CUDA devices there are; 0 without a driver or a CUDA package."""
    return _rt().device_count()


def current_device() -> int:
    """The index of the device ``"cuda"`` without an index means."""
    return _rt().current_device()


def set_device(dev) -> None:
    """Make ``dev`` (an index, ``"cuda:1"``, a device) the device ``"cuda"`` means; torch's
    error for an index the machine does not have."""
    index = _index(dev)
    if index is not None:
        _rt().set_device(index)


@contextlib.contextmanager
def device(dev):
    """``with fusegrad.cuda.device(1):`` runs its body with device 1 current."""
    rt = _rt()
    before = rt.current_device()
    set_device(dev)
    try:
        yield
    finally:
        if rt.is_available():
            rt.set_device(before)


def synchronize(device=None) -> None:
    """Wait for the work launched on ``device`` (the current one by default)."""
    _rt().synchronize(_index(device))


def manual_seed(seed: int) -> None:
    """Seed the generator cuda tensors draw from (the cpu one, see the module's notes)."""
    _manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """:func:`manual_seed`: every device draws from the one generator."""
    manual_seed(seed)


def get_device_name(device=None) -> str:
    """The name of ``device`` (the current one by default), as the driver reports it."""
    rt = _rt()
    index = rt.current_device() if _index(device) is None else rt.check_ordinal(_index(device))
    return rt.driver().device_name(index)


def get_device_capability(device=None) -> tuple[int, int]:
    """(major, minor) compute capability of ``device`` (the current one by default): (9, 0)
    for an H100."""
    rt = _rt()
    index = rt.current_device() if _index(device) is None else rt.check_ordinal(_index(device))
    return tuple(rt.driver().compute_capability(index))


def get_arch_list() -> list[str]:
    """The architectures kernels can be compiled for (``["sm_75", ..., "sm_120"]``: what the
    installed NVRTC supports; torch lists those its kernels were built for); empty when CUDA
    is not available."""
    rt = _rt()
    if not rt.is_available():
        return []
    return rt.nvrtc_arch_list()


def memory_allocated(device=None) -> int:
    """Bytes of device memory held by tensors and programs on ``device`` (by allocator
    block, as torch counts them); 0 when CUDA was never used."""
    return _rt().memory_stats(_index(device))["allocated"]


def max_memory_allocated(device=None) -> int:
    """The most :func:`memory_allocated` has been since the start or the last
    :func:`reset_peak_memory_stats`."""
    return _rt().memory_stats(_index(device))["peak"]


def memory_reserved(device=None) -> int:
    """Bytes the caching allocator holds from the driver on ``device`` (in use or cached)."""
    return _rt().memory_stats(_index(device))["reserved"]


def max_memory_reserved(device=None) -> int:
    """The most :func:`memory_reserved` has been since the start or the last
    :func:`reset_peak_memory_stats`."""
    return _rt().memory_stats(_index(device))["peak_reserved"]


def reset_peak_memory_stats(device=None) -> None:
    """Restart :func:`max_memory_allocated` and :func:`max_memory_reserved` from what is
    allocated and reserved now."""
    _rt().reset_peak_memory_stats(_index(device))


def empty_cache() -> None:
    """Return the allocator's cached free blocks to the driver (memory in use stays)."""
    _rt().empty_cache()


# A profiler records CUDA activity by default where a device is present.
register_device_activity(ProfilerActivity.CUDA, is_available)
