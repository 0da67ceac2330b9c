"""The worker threads that split kernels and native calls across cores: one pool, remade
when the thread count changes, and :func:`run_in_parts`, which cuts a range of work into
parts run on the caller's thread and the pool."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from fusegrad.config import config

__all__ = ["thread_pool", "run_in_parts"]

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_pool_workers = 0


def thread_pool() -> ThreadPoolExecutor:
    """The kernel worker pool: ``config.num_threads - 1`` workers beside the caller's thread,
    remade when the thread count changed (``set_num_threads``, a config reload)."""
    global _pool, _pool_workers
    with _pool_lock:
        workers = max(1, config.num_threads - 1)
        if _pool is None or _pool_workers != workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fusegrad")
            _pool_workers = workers
        return _pool


def run_in_parts(fn, args: tuple, extent: int, threads: int) -> None:
    """``fn(*args, start, end)`` over ``[0, extent)`` cut into ``min(threads, extent)`` equal
    parts: the first on the calling thread, the others on the pool, all finished on return."""
    chunks = min(threads, extent)
    bounds = [extent * i // chunks for i in range(chunks + 1)]
    pool = thread_pool()
    futures = [pool.submit(fn, *args, bounds[i], bounds[i + 1]) for i in range(1, chunks)]
    fn(*args, bounds[0], bounds[1])
    for f in futures:
        f.result()
