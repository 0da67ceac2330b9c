"""The worker pool's parallel loops (fusegrad.runtime.threads.run_in_parts): every element of
the range is covered once, in parts the caller and the workers take in turn; a worker that
cannot start does not hold the caller; an error in a part reaches the caller."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from fusegrad.runtime import threads


@pytest.mark.parametrize("extent,count", [(1, 2), (2, 2), (7, 2), (8, 2), (1000, 2), (5, 3),
                                          (1001, 4)])
def test_every_index_is_covered_once(extent, count):
    hits = np.zeros(extent, np.int64)
    parts = []
    lock = threading.Lock()

    def part(start, end):
        with lock:
            hits[start:end] += 1
            parts.append((start, end))

    threads.run_in_parts(part, (), extent, count)
    np.testing.assert_array_equal(hits, np.ones(extent, np.int64))
    assert len(parts) == min(extent, count * threads.PARTS_PER_THREAD) or \
        (min(extent, count * threads.PARTS_PER_THREAD) < 2 and len(parts) == 1)


def test_the_caller_does_not_wait_for_a_worker_that_cannot_start(monkeypatch):
    # Every worker of the pool is held: the caller takes every part itself and returns.
    monkeypatch.setattr(threads.config, "num_threads", 2)
    release = threading.Event()
    held = threads.thread_pool().submit(release.wait)
    seen = []
    caller = threading.Thread(target=threads.run_in_parts,
                              args=(lambda start, end: seen.append((start, end)), (), 100, 2))
    try:
        caller.start()
        caller.join(timeout=30)
        assert not caller.is_alive(), "run_in_parts waited for a worker that had not started"
        n = 2 * threads.PARTS_PER_THREAD
        assert sorted(seen) == [(100 * i // n, 100 * (i + 1) // n) for i in range(n)]
    finally:
        release.set()
        held.result()
        caller.join()


def test_an_error_in_a_part_is_raised_after_the_others_finish():
    done = []

    def part(start, end):
        if start == 0:
            raise ValueError("part 0 failed")
        done.append(start)

    with pytest.raises(ValueError, match="part 0 failed"):
        threads.run_in_parts(part, (), 80, 2)
    assert len(done) == 2 * threads.PARTS_PER_THREAD - 1


@pytest.mark.parametrize("shape_a,shape_b", [
    ((600, 64), (64, 40)),          # rows split
    ((40, 64), (64, 600)),          # columns split
    ((12, 30, 64), (12, 64, 50)),   # batch split
    ((3, 4, 30, 64), (3, 4, 64, 50)),
    ((12, 30, 64), (64, 50)),       # batch split, shared right operand
    ((30, 64), (2, 6, 64, 50)),     # batch split, shared left operand (convolution)
    ((1, 600, 64), (64, 40)),       # one product of a batch of one: rows split
    ((3, 30, 64), (8, 3, 64, 50)),  # broadcast batch dims (grouped convolution's product)
    ((1, 30, 64), (8, 64, 50)),
    ((8, 1, 30, 64), (1, 2, 64, 50)),
    ((20, 300), (300, 12)),         # long sums of a short result: terms split, then added
    ((8, 8), (8, 8)),               # small: one call
    ((700, 64), (64,)),             # a vector: one call
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_split_products_equal_one_blas_call(monkeypatch, shape_a, shape_b, dtype):
    monkeypatch.setattr(threads.config, "num_threads", 2)
    monkeypatch.setattr(threads, "SPLIT_PRODUCT", 1)
    monkeypatch.setattr(threads, "PRODUCT_PART", 16)
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape_a).astype(dtype)
    b = rng.standard_normal(shape_b).astype(dtype)
    want = a.astype(np.float64) @ b.astype(np.float64)
    before = threads.blas_threads()
    got = threads.matmul(a, b)
    out = np.full(want.shape, np.nan, dtype)
    assert threads.matmul(a, b, out=out) is out
    # Each element is one BLAS dot product of length K: float rounding of K terms.
    k = shape_a[-1]
    tol = 4 * k * np.finfo(dtype).eps * (np.abs(a).max() * np.abs(b).max())
    for result in (got, out):
        assert result.dtype == dtype and result.shape == want.shape
        np.testing.assert_allclose(result, want, rtol=0, atol=tol)
    assert threads.blas_threads() == before          # restored


def test_a_transposed_operand_and_a_strided_output(monkeypatch):
    monkeypatch.setattr(threads.config, "num_threads", 2)
    monkeypatch.setattr(threads, "SPLIT_PRODUCT", 1)
    monkeypatch.setattr(threads, "PRODUCT_PART", 16)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 700)).astype(np.float32).T      # (700, 64), columns apart
    b = rng.standard_normal((64, 30)).astype(np.float32)
    want = a.astype(np.float64) @ b
    tol = 4 * 64 * np.finfo(np.float32).eps * np.abs(a).max() * np.abs(b).max()
    dense = np.zeros((700, 30), np.float32)                        # split by rows
    strided = np.zeros((700, 60), np.float32)[:, ::2]              # not contiguous: one call
    for out in (dense, strided):
        threads.matmul(a, b, out=out)
        np.testing.assert_allclose(out, want, rtol=0, atol=tol)
