"""The worker threads that split kernels and native calls across cores: one pool, remade
when the thread count changes, and :func:`run_in_parts`, which cuts a range of work into
parts run on the caller's thread and the pool; and the thread count of numpy's BLAS, which
runs the products that are not generated code (:func:`set_blas_threads`)."""

from __future__ import annotations

import ctypes
import itertools
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from fusegrad.config import config

__all__ = ["thread_pool", "run_in_parts", "matmul", "set_blas_threads", "blas_threads"]

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


# A parallel loop is cut into this many parts per thread, which the threads take one at a
# time: a thread that lost its core to another process takes fewer of them instead of
# holding the loop until its equal share is done.
PARTS_PER_THREAD = 4


def run_in_parts(fn, args: tuple, extent: int, threads: int, parts: int | None = None) -> None:
    """``fn(*args, start, end)`` over ``[0, extent)``, cut into up to ``PARTS_PER_THREAD``
    parts per thread that the calling thread and ``threads - 1`` pool workers take in turn;
    all finished on return. The caller starts at once and waits only for parts a worker
    took: a worker that wakes after the last part was taken finds nothing to do, so a slow
    hand-off costs the caller nothing. An exception raised by a part is raised here (after
    the other parts are finished). ``parts`` overrides the number of parts."""
    parts = min(extent, parts or threads * PARTS_PER_THREAD)
    if threads < 2 or parts < 2:
        fn(*args, 0, extent)
        return
    bounds = [extent * i // parts for i in range(parts + 1)]
    claim = itertools.count().__next__       # atomic under the GIL
    lock = threading.Lock()
    finished = threading.Event()
    state = {"done": 0, "error": None}

    def take() -> None:
        while (i := claim()) < parts:
            try:
                fn(*args, bounds[i], bounds[i + 1])
            except BaseException as e:  # noqa: BLE001 - raised by the caller
                state["error"] = state["error"] or e
            with lock:
                state["done"] += 1
                if state["done"] == parts:
                    finished.set()

    pool = thread_pool()
    for _ in range(threads - 1):
        pool.submit(take)
    take()
    finished.wait()
    if state["error"] is not None:
        raise state["error"]


# A product of fewer multiply-adds is one call (about 50 us at 80 GFLOP/s: a pool hand-off
# would not pay).
SPLIT_PRODUCT = 1 << 21
# Rows (or columns, or terms of the sums) of a product per part at least: each part's BLAS
# call packs the other operand whole again.
PRODUCT_PART = 64


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``np.matmul(a, b, out=out)`` for float arrays, on ``config.num_threads`` threads of
    fusegrad's own: numpy's BLAS runs on one thread during the call, and the product is cut
    into parts that :func:`run_in_parts` hands out: products of a batch (over its first
    dim, a broadcast operand whole in every part), else the rows of ``a`` or the columns of
    ``b`` (whichever is longer: the other operand is the one each part packs again), else,
    for long sums of a short result (a weight's gradient), the terms of the sums, added at
    the end. BLAS's own threads take equal static shares and spin while they wait: beside a
    busy core a 256x256x256 product took 50 times as long on two threads as on one, and a
    BLAS thread spinning after its call took half a core from the next kernel. Small
    products are one call on the calling thread."""
    threads = config.num_threads
    if (threads < 2 or a.ndim < 2 or b.ndim < 2 or a.dtype.kind != "f" or b.dtype.kind != "f"
            or a.shape[-1] != b.shape[-2] or (out is not None and not out.flags.c_contiguous)
            or not _blas_functions()):
        return np.matmul(a, b, out=out)
    m, n = a.shape[-2], b.shape[-1]
    try:
        lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return np.matmul(a, b, out=out)         # (which raises numpy's error)
    if out is None:
        out = np.empty(lead + (m, n), np.result_type(a, b))
    part, extent, parts, finish = _product_parts(a, b, out, lead, threads)
    before = blas_threads()
    set_blas_threads(1)
    try:
        if part is None:
            np.matmul(a, b, out=out)
        else:
            run_in_parts(part, (), extent, threads, parts)
            if finish is not None:
                finish()
    finally:
        set_blas_threads(before)
    return out


def _product_parts(a, b, out, lead: tuple, threads: int):
    """How :func:`matmul` cuts ``a @ b`` into ``out``: ``(part(start, end), extent, parts,
    finish)``, or Nones for one call."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = math.prod(lead)
    most = threads * PARTS_PER_THREAD
    if batch * m * k * n < SPLIT_PRODUCT:
        return None, 0, 0, None
    if lead and lead[0] >= 2 * threads:
        def first(x: np.ndarray):
            return (lambda s, e: x[s:e]) if x.ndim - 2 == len(lead) and x.shape[0] > 1 else \
                (lambda s, e: x)
        take_a, take_b = first(a), first(b)

        def part(start: int, end: int) -> None:
            np.matmul(take_a(start, end), take_b(start, end), out=out[start:end])
        return part, lead[0], min(lead[0], most), None
    if batch != 1:
        return None, 0, 0, None
    # (``out`` is C-contiguous: its reshape is a view.)
    a2, b2, out2 = a.reshape(m, k), b.reshape(k, n), out.reshape(m, n)
    if max(m, n) >= 2 * PRODUCT_PART:
        extent = max(m, n)

        def part(start: int, end: int) -> None:
            if m >= n:
                np.matmul(a2[start:end], b2, out=out2[start:end])
            else:
                np.matmul(a2, b2[:, start:end], out=out2[:, start:end])
        # (Two parts per thread: each packs the other operand again, a cost that more parts
        # made visible in a 256x1024x2048 product.)
        return part, extent, max(2, min(2 * threads, extent // PRODUCT_PART)), None
    if k >= 2 * PRODUCT_PART:
        count = max(2, min(threads, k // PRODUCT_PART))
        bounds = [k * i // count for i in range(count + 1)]
        partial = np.empty((count, m, n), out.dtype)

        def part(start: int, end: int) -> None:
            for i in range(start, end):
                np.matmul(a2[:, bounds[i]:bounds[i + 1]], b2[bounds[i]:bounds[i + 1]],
                          out=partial[i])

        def finish() -> None:
            np.sum(partial, axis=0, out=out2)
        return part, count, count, finish
    return None, 0, 0, None


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
