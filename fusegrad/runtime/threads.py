"""The worker threads that split kernels and native calls across cores: one pool, remade
when the thread count changes, and :func:`run_in_parts`, which cuts a range of work into
parts run on the caller's thread and the pool; and the thread count of numpy's BLAS, which
runs the products that are not generated code (:func:`set_blas_threads`)."""

from __future__ import annotations

import ctypes
import threading
from concurrent.futures import ThreadPoolExecutor

from fusegrad.config import config

__all__ = ["thread_pool", "run_in_parts", "set_blas_threads", "blas_threads"]

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


# The thread-count functions of the BLAS libraries numpy ships with or links: OpenBLAS as
# numpy's wheels bundle it (symbol-suffixed, 64-bit ints), a system OpenBLAS, MKL.
_BLAS_NAMES = (("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
               ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
               ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
               ("openblas_set_num_threads", "openblas_get_num_threads"),
               ("MKL_Set_Num_Threads", "MKL_Get_Max_Threads"))
_blas: object = None             # None: not looked up yet; False: none found; else (set, get)


def _find_blas():
    """The thread-count setter and getter of the BLAS loaded in this process (found among
    the shared libraries it has mapped: numpy loaded its BLAS when it was imported), or
    False."""
    import numpy  # noqa: F401  (its BLAS is what is looked for)
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split(None, 5)[-1].strip() for line in maps
                            if "blas" in line.lower() or "mkl_rt" in line.lower()})
    except OSError:                  # not Linux: the BLAS keeps its own setting
        return False
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _BLAS_NAMES:
            setter, getter = getattr(lib, set_name, None), getattr(lib, get_name, None)
            if setter is not None and getter is not None:
                setter.argtypes, setter.restype = [ctypes.c_int], None
                getter.argtypes, getter.restype = [], ctypes.c_int
                return setter, getter
    return False


def _blas_functions():
    global _blas
    if _blas is None:
        _blas = _find_blas()
    return _blas


def set_blas_threads(num: int) -> bool:
    """Run numpy's BLAS on ``num`` threads, as ``torch.set_num_threads`` sets the threads of
    torch's BLAS: with one thread asked for, a product must not start a second (beside a busy
    core, OpenBLAS's two threads made a 128x784 product 30 times slower than one). Returns
    whether a BLAS that takes the setting was found."""
    functions = _blas_functions()
    if not functions:
        return False
    functions[0](int(num))
    return True


def blas_threads() -> int | None:
    """The thread count of numpy's BLAS (None when it is not one :func:`set_blas_threads`
    knows)."""
    functions = _blas_functions()
    return functions[1]() if functions else None
