"""How the C allocator serves the numpy arrays of eager code.

Every eager op returns a fresh numpy array, and many of a training step's temporaries are
freed as soon as the next op has read them. With glibc's defaults, a freed block at the top
of the heap is given back to the system once the free space there passes the trim threshold,
and the next op's array of the same size is mapped and zero-filled again, one page fault per
4 KiB: float32 ``exp`` of a (16, 32, 256) array (computed in float64, so two 1 MiB
temporaries) took 1.2 ms that way against 0.3 ms with the pages kept, and the char
transformer's eager step spent about a sixth of its time there.

:func:`keep_freed_heap` sets glibc's ``M_TOP_PAD`` (the heap grows by, and keeps when it
trims, that many bytes more than it needs; glibc's default is 128 KiB) once, when fusegrad is
imported: the process keeps up to that much freed memory to reuse instead of mapping it
anew. ``FUSEGRAD_MALLOC_TOP_PAD`` sets the amount (bytes, default 16 MiB; ``0`` leaves the
allocator alone), and a ``MALLOC_TOP_PAD_`` set for glibc itself wins. Other C libraries are
left alone.

Setting ``M_TOP_PAD`` also freezes glibc's mmap threshold, which otherwise rises to the size
of the largest mapped block freed so far (up to 32 MiB on 64-bit): frozen at its starting
128 KiB, every array of 128 KiB or more would be mapped and zero-filled afresh on each op,
the cost this module exists to avoid (an eager Adam step of a 784-256-256-10 MLP took 2.7 ms
instead of 0.9). So :func:`keep_freed_heap` sets ``M_MMAP_THRESHOLD`` to that 32 MiB
ceiling as well, unless the environment sets ``MALLOC_MMAP_THRESHOLD_``.
"""

from __future__ import annotations

import ctypes
import os

from fusegrad.config import _int

__all__ = ["keep_freed_heap", "DEFAULT_TOP_PAD"]

DEFAULT_TOP_PAD = 16 << 20
# glibc's ceiling for its sliding mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
_MMAP_THRESHOLD_MAX = 32 << 20
_M_TOP_PAD = -2          # glibc's malloc.h
_M_MMAP_THRESHOLD = -3


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False


def keep_freed_heap(pad: int | None = None) -> bool:
    """Set glibc's ``M_TOP_PAD`` to ``pad`` bytes (default: ``FUSEGRAD_MALLOC_TOP_PAD`` or
    16 MiB); True when it was set. Not on other C libraries, nor when the environment sets
    ``MALLOC_TOP_PAD_`` or the pad is 0."""
    if pad is None:
        if "MALLOC_TOP_PAD_" in os.environ:
            return False
        pad = _int("FUSEGRAD_MALLOC_TOP_PAD", DEFAULT_TOP_PAD)
    if pad <= 0 or not _glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
    return mallopt(_M_TOP_PAD, min(pad, 2**31 - 1)) == 1
