"""The caching allocator: torch's block rounding and segments, reuse, splitting and merging,
the out-of-memory retry and message, and the statistics ``fusegrad.cuda`` reports."""

from __future__ import annotations

import pytest

import fusegrad as fg
from fusegrad.runtime import cuda as rt
from fusegrad.testing.simulated_cuda import SimulatedDriver

MiB = 1 << 20


@pytest.mark.parametrize("nbytes, block", [(0, 512), (1, 512), (512, 512), (513, 1024),
                                           (1000, 1024), (5000, 5120), (MiB + 1, MiB + 512)])
def test_blocks_are_512_byte_multiples_not_powers_of_two(nbytes, block):
    assert rt.round_size(nbytes) == block


@pytest.mark.parametrize("size, segment", [(512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB),
                                           (10 * MiB - 512, 20 * MiB), (10 * MiB, 10 * MiB),
                                           (10 * MiB + 512, 12 * MiB)])
def test_segments_follow_torchs_small_large_and_rounded_sizes(size, segment):
    assert rt.allocation_size(size) == segment


def test_small_requests_share_a_2_mib_segment_and_are_counted_by_block():
    drv = SimulatedDriver()
    alloc = rt.CachingAllocator(drv)
    a, b = alloc.alloc(1000), alloc.alloc(5000)
    assert drv.mallocs == 1 and b == a + 1024            # cut from one segment
    assert (alloc.allocated, alloc.reserved) == (1024 + 5120, 2 * MiB)
    alloc.free(a)
    assert alloc.alloc(900) == a and drv.mallocs == 1     # the freed block, reused
    alloc.free(a)
    alloc.free(b)
    assert alloc.allocated == 0 and alloc.peak == 6144
    assert alloc.alloc(MiB) == a                          # the blocks merged back whole
    assert drv.mallocs == 1


def test_a_large_block_is_split_only_when_more_than_1_mib_is_left():
    drv = SimulatedDriver()
    alloc = rt.CachingAllocator(drv)
    a = alloc.alloc(3 * MiB)                              # a 20 MiB segment, split
    b = alloc.alloc(9 * MiB)
    assert drv.mallocs == 1 and b == a + 3 * MiB and alloc.reserved == 20 * MiB
    c = alloc.alloc(7 * MiB + 512)                        # takes the 8 MiB rest whole: the
    assert c == b + 9 * MiB and drv.mallocs == 1          # 1 MiB - 512 left is no block
    assert alloc.allocated == 20 * MiB
    d = alloc.alloc(5 * MiB)                              # a new 20 MiB segment, split
    assert drv.mallocs == 2 and alloc.allocated == 25 * MiB
    alloc.free(d)
    e = alloc.alloc(15 * MiB)                             # its two halves merged
    assert e == d and drv.mallocs == 2


def test_empty_cache_returns_wholly_free_segments_only():
    drv = SimulatedDriver()
    alloc = rt.CachingAllocator(drv)
    keep, gone = alloc.alloc(100), alloc.alloc(12 * MiB)
    alloc.free(gone)
    extra = alloc.alloc(200)
    alloc.free(extra)                                     # free, but its segment is in use
    alloc.release()
    assert alloc.reserved == 2 * MiB and len(drv.memory) == 1
    alloc.free(keep)
    alloc.release()
    assert alloc.reserved == 0 and not drv.memory and drv.in_use == [0]


def test_out_of_memory_empties_the_cache_and_retries_once():
    drv = SimulatedDriver(memory=30 * MiB)
    alloc = rt.CachingAllocator(drv)
    alloc.free(alloc.alloc(16 * MiB))                     # 16 MiB cached, free
    ptr = alloc.alloc(20 * MiB)                           # fits only once the cache is gone
    assert alloc.reserved == 20 * MiB and drv.in_use == [20 * MiB] and ptr in drv.memory


def test_out_of_memory_raises_torchs_error_and_message():
    drv = SimulatedDriver(memory=30 * MiB)
    alloc = rt.CachingAllocator(drv)
    held = alloc.alloc(3 * MiB)                           # a 20 MiB segment
    with pytest.raises(fg.OutOfMemoryError) as info:
        alloc.alloc(18 * MiB)                             # the 17 MiB left do not fit
    assert isinstance(info.value, RuntimeError) and fg.cuda.OutOfMemoryError is fg.OutOfMemoryError
    assert str(info.value) == (
        "CUDA out of memory. Tried to allocate 18.00 MiB. GPU 0 has a total capacity of 30.00 "
        "MiB of which 10.00 MiB is free. Of the allocated memory 3.00 MiB is allocated by "
        "fusegrad, and 17.00 MiB is reserved by fusegrad but unallocated.")
    assert alloc.allocated == 3 * MiB and alloc.reserved == 20 * MiB   # nothing leaked
    alloc.free(held)


def test_format_size_is_torchs():
    assert [rt.format_size(n) for n in (512, 1024, 1025, MiB, 3 << 30)] == [
        "512 bytes", "1024 bytes", "1.00 KiB", "1024.00 KiB", "3.00 GiB"]


def test_fusegrad_cuda_memory_statistics_are_exact(simulated):
    fg.cuda.reset_peak_memory_stats()
    base = fg.cuda.memory_allocated()
    x = fg.zeros(1000, device="cuda")                     # 4000 bytes: a 4096-byte block
    assert fg.cuda.memory_allocated() - base == 4096
    reserved = fg.cuda.memory_reserved()
    assert reserved % (2 * MiB) == 0 and fg.cuda.max_memory_reserved() == reserved
    y = fg.zeros(3 * MiB // 4, device="cuda")             # 3 MiB: a large block
    assert fg.cuda.memory_allocated() - base == 4096 + 3 * MiB
    assert fg.cuda.memory_reserved() == reserved + 20 * MiB
    del y
    assert fg.cuda.memory_allocated() - base == 4096
    assert fg.cuda.max_memory_allocated() - base == 4096 + 3 * MiB
    fg.cuda.empty_cache()
    assert fg.cuda.memory_reserved() == reserved and fg.cuda.max_memory_reserved() == reserved + 20 * MiB
    fg.cuda.reset_peak_memory_stats()
    assert fg.cuda.max_memory_reserved() == reserved
    assert fg.cuda.max_memory_allocated() == fg.cuda.memory_allocated()
    del x
