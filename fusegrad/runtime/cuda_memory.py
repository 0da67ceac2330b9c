"""CUDA device memory: the caching allocator and :class:`DeviceArray`, a tensor's storage on
the device.

:class:`CachingAllocator` rounds requests and carves them from segments as torch's caching
allocator does, keeps freed blocks for reuse (so steady-state calls allocate nothing from the
driver), and on out-of-memory empties its cache and retries once before raising
:class:`OutOfMemoryError` with torch's message. A :class:`DeviceArray` is a strided view of
an allocation, with ndarray's metadata.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from fusegrad.runtime import cuda_drivers
from fusegrad.runtime.cuda_drivers import Driver, current_device, unload_pending
from fusegrad.runtime.errors import OutOfMemoryError

__all__ = ["CachingAllocator", "round_size", "allocation_size", "format_size", "allocator_of",
           "memory_stats", "reset_peak_memory_stats", "empty_cache", "DeviceArray",
           "register_array_kernels"]

# --------------------------------------------------------------------------- memory


# torch's block and segment sizes (c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize,
# kSmallSize, kSmallBuffer, kMinLargeAlloc, kLargeBuffer, kRoundLarge).
MIN_BLOCK_SIZE = 512              # every block is a multiple of 512 bytes
SMALL_SIZE = 1 << 20              # the largest "small" request: 1 MiB
SMALL_BUFFER = 2 << 20            # small requests are packed into 2 MiB segments
MIN_LARGE_ALLOC = 10 << 20        # requests between 1 and 10 MiB split a 20 MiB segment
LARGE_BUFFER = 20 << 20
ROUND_LARGE = 2 << 20             # larger requests get a segment rounded up to 2 MiB


def round_size(nbytes: int) -> int:
    """The block size of a request: a multiple of 512 bytes, at least 512 (torch's
    ``round_size`` without ``roundup_power2_divisions``)."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return MIN_BLOCK_SIZE * ((nbytes + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """The segment asked of the driver for a block of ``size`` bytes that no cached block
    fits (torch's ``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


def format_size(nbytes: int) -> str:
    """A byte count as torch's allocator prints it ("20.00 MiB", "512 bytes")."""
    if nbytes <= 1024:
        return f"{nbytes} bytes"
    if nbytes <= 1 << 20:
        return f"{nbytes / 1024:.2f} KiB"
    if nbytes <= 1 << 30:
        return f"{nbytes / (1 << 20):.2f} MiB"
    return f"{nbytes / (1 << 30):.2f} GiB"


class _Block:
    """A piece of a segment: free or in use, linked to its neighbours in the segment."""

    __slots__ = ("ptr", "size", "small", "allocated", "prev", "next")

    def __init__(self, ptr: int, size: int, small: bool):
        self.ptr, self.size, self.small = ptr, size, small
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


class CachingAllocator:
    """Device memory of one device, as torch's CUDA caching allocator manages it: requests
    are rounded to 512-byte blocks (:func:`round_size`) cut from segments asked of the
    driver (2 MiB for requests up to 1 MiB, 20 MiB for those up to 10 MiB, else the request
    rounded to 2 MiB: :func:`allocation_size`); the best-fitting free block of the request's
    pool (small or large) is reused and split, a freed block merges with its free
    neighbours, and ``release()`` (``empty_cache``) returns the segments that are wholly free.

    When the driver is out of memory the cached segments are released and the request tried
    once more; then :class:`~fusegrad.runtime.errors.OutOfMemoryError` says, as torch's
    does, what was asked and what is held. ``allocated`` counts the bytes of blocks in use
    (``torch.cuda.memory_allocated``), ``peak`` its maximum, ``reserved`` the bytes of the
    segments held (``memory_reserved``) and ``peak_reserved`` theirs."""

    def __init__(self, drv: Driver, device: int = 0):
        self.drv = drv
        self.device = device
        self.pools: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # (size, ptr)
        self.blocks: dict[int, _Block] = {}         # ptr -> block, free or in use
        self.lock = threading.RLock()
        self.allocated = self.peak = self.reserved = self.peak_reserved = 0

    def activate(self) -> Driver:
        """The driver, with this allocator's device current."""
        self.drv.use(self.device)
        return self.drv

    def alloc(self, nbytes: int) -> int:
        """A pointer to at least ``nbytes`` bytes of this device's memory."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        with self.lock:
            block = self._best_fit(size, small)
            if block is None:
                block = self._new_segment(size, small)
            remaining = block.size - size
            # torch's should_split: a small block keeps any 512-byte remainder, a large one
            # only a remainder larger than a small request (the rest stays in the block).
            if remaining >= MIN_BLOCK_SIZE if small else remaining > SMALL_SIZE:
                rest = _Block(block.ptr + size, remaining, small)
                rest.prev, rest.next = block, block.next
                if block.next is not None:
                    block.next.prev = rest
                block.next, block.size = rest, size
                self.blocks[rest.ptr] = rest
                self._insert(rest)
            block.allocated = True
            self.allocated += block.size
            self.peak = max(self.peak, self.allocated)
            return block.ptr

    def _best_fit(self, size: int, small: bool) -> _Block | None:
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (size, 0))
        if i == len(pool):
            return None
        return self.blocks[pool.pop(i)[1]]

    def _insert(self, block: _Block) -> None:
        bisect.insort(self.pools[block.small], (block.size, block.ptr))

    def _remove(self, block: _Block) -> None:
        pool = self.pools[block.small]
        del pool[bisect.bisect_left(pool, (block.size, block.ptr))]

    def _new_segment(self, size: int, small: bool) -> _Block:
        nbytes = allocation_size(size)
        drv = self.activate()
        try:
            ptr = drv.malloc(nbytes)
        except OutOfMemoryError:
            # torch frees its cached blocks and tries once more before giving up.
            self.release()
            try:
                ptr = drv.malloc(nbytes)
            except OutOfMemoryError:
                raise self._out_of_memory(nbytes) from None
        block = _Block(ptr, nbytes, small)
        self.blocks[ptr] = block
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def _out_of_memory(self, nbytes: int) -> OutOfMemoryError:
        """torch's message (its ``malloc`` in CUDACachingAllocator.cpp), naming fusegrad where
        torch names itself, without the advice on ``PYTORCH_CUDA_ALLOC_CONF``, which has no
        counterpart here."""
        try:
            free, total = self.drv.mem_get_info()
        except Exception:                      # a driver that cannot tell
            free = total = 0
        return OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {format_size(nbytes)}. GPU {self.device} "
            f"has a total capacity of {format_size(total)} of which {format_size(free)} is "
            f"free. Of the allocated memory {format_size(self.allocated)} is allocated by "
            f"fusegrad, and {format_size(self.reserved - self.allocated)} is reserved by "
            f"fusegrad but unallocated.")

    def free(self, ptr: int) -> None:
        """Give the block at ``ptr`` back to the cache, merged with its free neighbours."""
        with self.lock:
            block = self.blocks[ptr]
            block.allocated = False
            self.allocated -= block.size
            for neighbour in (block.prev, block.next):
                if neighbour is None or neighbour.allocated:
                    continue
                self._remove(neighbour)
                first, second = (neighbour, block) if neighbour is block.prev else \
                    (block, neighbour)
                first.size += second.size
                first.next = second.next
                if second.next is not None:
                    second.next.prev = first
                del self.blocks[second.ptr]
                block = first
            self._insert(block)

    def release(self) -> None:
        """Return every wholly free segment to the driver (``torch.cuda.empty_cache``)."""
        with self.lock:
            for small, pool in self.pools.items():
                keep = []
                for size, ptr in pool:
                    block = self.blocks[ptr]
                    if block.prev is None and block.next is None:
                        self.activate().free(ptr)
                        del self.blocks[ptr]
                        self.reserved -= size
                    else:
                        keep.append((size, ptr))
                self.pools[small] = keep


_allocators: dict[tuple[int, int], CachingAllocator] = {}


def allocator_of(drv: Driver, device: int = 0) -> CachingAllocator:
    """The caching allocator of device ``device`` of driver ``drv`` (shared by its
    programs and tensors)."""
    key = (id(drv), device)
    alloc = _allocators.get(key)
    if alloc is None or alloc.drv is not drv:
        with cuda_drivers._driver_lock:
            alloc = _allocators[key] = CachingAllocator(drv, device)
    return alloc


def memory_stats(device: int | None = None) -> dict[str, int]:
    """``allocated``, ``peak``, ``reserved`` and ``peak_reserved`` bytes of ``device``'s
    caching allocator (zeros when CUDA was never used)."""
    if cuda_drivers._driver is None:
        return {"allocated": 0, "peak": 0, "reserved": 0, "peak_reserved": 0}
    a = allocator_of(cuda_drivers._driver, current_device() if device is None else device)
    return {"allocated": a.allocated, "peak": a.peak, "reserved": a.reserved,
            "peak_reserved": a.peak_reserved}


def reset_peak_memory_stats(device: int | None = None) -> None:
    """Restart the peak counts of ``device``'s allocator from what is allocated and
    reserved now."""
    if cuda_drivers._driver is not None:
        a = allocator_of(cuda_drivers._driver, current_device() if device is None else device)
        a.peak, a.peak_reserved = a.allocated, a.reserved


def empty_cache() -> None:
    """Return every cached free block of every device to the driver (and unload the
    modules of collected programs)."""
    unload_pending()
    for a in list(_allocators.values()):
        if a.drv is cuda_drivers._driver:
            a.release()


# The device kernels DeviceArray's contiguous() and += run (a strided copy, an add into a
# buffer): fusegrad.tracer.eager_cuda, which builds kernels on this memory, registers them
# when it is imported.
_ARRAY_KERNELS: dict[str, Callable] = {}


def register_array_kernels(*, strided_copy: Callable, add_into: Callable) -> None:
    """Install ``strided_copy(array) -> array`` and ``add_into(dst, src)``, the kernels of
    :meth:`DeviceArray.contiguous` and ``DeviceArray.__iadd__``; eager_cuda registers its own."""
    _ARRAY_KERNELS.update(strided_copy=strided_copy, add_into=add_into)


def _array_kernel(name: str) -> Callable:
    try:
        return _ARRAY_KERNELS[name]
    except KeyError:
        raise RuntimeError(
            f"DeviceArray: no {name} kernel is registered; import fusegrad (its eager CUDA "
            "handler, fusegrad.tracer.eager_cuda, registers the array kernels)") from None


class _Flags:
    """The part of numpy's ``flags`` a tensor reads."""

    __slots__ = ("c_contiguous", "writeable")
    f_contiguous = False

    def __init__(self, c_contiguous: bool, writeable: bool):
        self.c_contiguous, self.writeable = c_contiguous, writeable


_CONTIGUOUS_FLAGS = _Flags(True, True)


def _contiguous_byte_strides(shape, itemsize: int) -> tuple[int, ...]:
    strides, acc = [], itemsize
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


@dataclass(eq=False)
class DeviceArray:
    """An array in device memory: an allocation of its own (``owner`` None), or a strided
    view of another's (``owner`` is the allocation, kept alive by the view). ``ptr`` is
    the address of the first element; ``byte_strides`` None means row-major contiguous.

    Views are what torch's views are: slicing, reshape, permute and expand of a cuda tensor
    make one (:func:`fusegrad.tracer.eager_cuda.device_apply`) and an in-place write
    through it changes the owner's memory. Kernels read contiguous buffers: a program
    given a strided view first copies it (:meth:`contiguous`)."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    allocator: CachingAllocator
    byte_strides: tuple[int, ...] | None = None
    owner: "DeviceArray | None" = None

    @classmethod
    def empty(cls, shape, dtype, allocator: CachingAllocator) -> "DeviceArray":
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return cls(allocator.alloc(n), tuple(shape), dtype, allocator)

    @classmethod
    def from_host(cls, host: np.ndarray, allocator: CachingAllocator) -> "DeviceArray":
        host = np.asarray(host, order="C")       # (ascontiguousarray makes 0-d arrays 1-d)
        out = cls.empty(host.shape, host.dtype, allocator)
        if host.nbytes:
            allocator.activate().htod(out.ptr, host)
        return out

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    # The part of numpy's array interface that a tensor's metadata reads (``Tensor.shape``,
    # ``ndim``, ``numel``, ``stride()``, ``is_contiguous()``, eager type inference), so a
    # cuda tensor's storage is this object where a cpu tensor's is an ndarray.

    @property
    def device(self) -> str:
        return f"cuda:{self.allocator.device}"

    @property
    def base(self) -> "DeviceArray | None":
        return self.owner

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        if self.byte_strides is None:
            return _contiguous_byte_strides(self.shape, self.dtype.itemsize)
        return self.byte_strides

    @property
    def c_contiguous(self) -> bool:
        """Row-major without gaps (the strides of size-1 dims do not matter, as in numpy):
        what a kernel can read through ``ptr`` alone."""
        if self.byte_strides is None:
            return True
        expected = _contiguous_byte_strides(self.shape, self.dtype.itemsize)
        return self.size == 0 or all(s == e for s, e, d in zip(self.byte_strides, expected,
                                                                 self.shape) if d > 1)

    @property
    def flags(self):
        if self.byte_strides is None:
            return _CONTIGUOUS_FLAGS
        # Writes through a view that maps two elements to one address (an expand) are
        # refused, as torch refuses them.
        overlapping = any(s == 0 and d > 1 for s, d in zip(self.byte_strides, self.shape))
        return _Flags(self.c_contiguous, not overlapping)

    def shares_storage(self, other) -> bool:
        """Whether ``self`` and ``other`` read the same allocation."""
        return (other.__class__ is DeviceArray and
                (self.owner or self) is (other.owner or other))

    # -- views

    def _stand_in(self) -> np.ndarray:
        # An array with this layout over one element: numpy computes the strides of a
        # reshape / transpose / slice / broadcast of it without reading memory.
        return np.lib.stride_tricks.as_strided(np.zeros(1, self.dtype), self.shape,
                                               self.strides)

    def view_by(self, fn) -> "DeviceArray":
        """The view of this array that ``fn`` (numpy movement ops that give views) makes of
        an ndarray of the same layout."""
        stand = self._stand_in()
        out = fn(stand)
        shift = out.__array_interface__["data"][0] - stand.__array_interface__["data"][0]
        strides = tuple(out.strides)
        if strides == _contiguous_byte_strides(out.shape, self.dtype.itemsize):
            strides = None
        return DeviceArray(self.ptr + shift, tuple(out.shape), self.dtype, self.allocator,
                           strides, self.owner or self)

    def reshape(self, shape, order: str = "C", copy=None) -> "DeviceArray":
        """A view of ``shape``; ValueError when the strides allow none (numpy's rule)."""
        return self.view_by(lambda a: np.reshape(a, shape, copy=False))

    def contiguous(self) -> "DeviceArray":
        """This array when it is contiguous, else a contiguous copy made on the device."""
        if self.c_contiguous:
            return self
        return _array_kernel("strided_copy")(self)

    def span(self) -> "DeviceArray":
        """The bytes from the first element to the last one this view reads, as a flat
        contiguous view (what a strided copy reads, and a strided write rewrites)."""
        item = self.dtype.itemsize
        extent = sum((d - 1) * s for d, s in zip(self.shape, self.strides)) + item
        return DeviceArray(self.ptr, (extent // item,), self.dtype, self.allocator, None,
                           self.owner or self)

    def copy(self) -> "DeviceArray":
        """A new contiguous device array with the same contents (made on the device)."""
        if not self.c_contiguous:
            return self.contiguous()
        out = DeviceArray.empty(self.shape, self.dtype, self.allocator)
        if self.nbytes:
            self.allocator.activate().dtod(out.ptr, self.ptr, self.nbytes)
        return out

    def __iadd__(self, other: "DeviceArray") -> "DeviceArray":
        """In-place ``self += other`` by an add kernel, written back into this buffer (so
        that every tensor sharing it sees the sum, as with an ndarray). Autograd accumulates
        a leaf's ``.grad`` this way on both devices."""
        _array_kernel("add_into")(self, other)
        return self

    def to_host(self) -> np.ndarray:
        """The values in a new contiguous host array (a strided view copies its span and
        picks its elements on the host)."""
        host = np.empty(self.shape, dtype=self.dtype)
        if not host.nbytes:
            return host
        drv = self.allocator.activate()
        if self.c_contiguous:
            drv.dtoh(host, self.ptr)
            return host
        raw = np.empty(self.span().shape, dtype=self.dtype)
        drv.dtoh(raw, self.ptr)
        host[...] = np.lib.stride_tricks.as_strided(raw, self.shape, self.byte_strides)
        return host

    def __del__(self):
        if self.owner is not None:
            return
        try:
            self.allocator.free(self.ptr)
        except Exception:     # interpreter shutdown
            pass
