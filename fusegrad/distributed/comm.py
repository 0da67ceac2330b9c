"""The process group: MPI's world communicator, and collectives on fusegrad tensors.

Data parallelism runs on MPI (mpi4py over Open MPI or MPICH), as Horovod does: ``mpiexec``
starts the processes and MPI's environment tells each its rank. mpi4py is imported on first
use only, so ``import fusegrad`` never needs it.

Collectives work on a tensor's own numpy buffer: MPI reads it and writes the result into it,
with no copy in between. Every wait is a polling loop on a nonblocking request with a
deadline (``timeout``, ``FUSEGRAD_DIST_TIMEOUT`` seconds, 120 by default): a peer that left
without an error (a clean ``sys.exit`` in one rank) would otherwise hang the others forever.
A rank that raises aborts the whole job (``MPI_Abort`` from ``sys.excepthook``), and
``mpiexec`` stops every rank when one dies, so a fault stops the job within seconds.

With ``FUSEGRAD_DIST_DEBUG=1`` every collective first checks that all ranks pass the same
dtype and shape (:func:`agree_on_layout`, one all-gather of a digest), as torch's
``TORCH_DISTRIBUTED_DEBUG=DETAIL`` does; ``DataParallel`` makes the same check once for
its whole bucket layout, always.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fusegrad import dtypes

__all__ = ["ProcessGroup", "DistributedError", "ReduceOp", "Work", "CommStats", "init",
           "is_initialized", "launched_by_mpi", "rank", "world_size", "group",
           "comm_stats", "wait", "poll", "MPI_MISSING", "allgather_array",
           "allgather_bytes", "agree_on_layout", "layout_disagreement", "debug_enabled"]

MPI_MISSING = ("fusegrad.distributed needs mpi4py and an MPI library: "
               "pip install fusegrad[mpi] (mpi4py with Open MPI), or mpi4py built against "
               "the cluster's own MPI")


class DistributedError(RuntimeError):
    """A collective could not complete (a peer died, hung, or called another collective)."""


class ReduceOp:
    """Reductions of :func:`all_reduce` (torch.distributed's names); plain strings work too."""

    SUM = "sum"
    MEAN = "mean"
    AVG = "mean"
    MAX = "max"


_REDUCE_OPS = ("sum", "mean", "max")


@dataclass
class CommStats:
    """What the collectives of this process did since the last :meth:`reset`: all-reduce
    calls, the bytes each rank contributed to them, the seconds spent blocked waiting for
    them to finish, and the seconds spent in any MPI call of theirs (starting, testing,
    waiting: with MPI libraries that move data inside those calls, the part of the
    communication the calling thread paid for, which no computation hid)."""

    allreduce_calls: int = 0
    allreduce_bytes: int = 0
    wait_seconds: float = 0.0
    mpi_seconds: float = 0.0

    def reset(self) -> None:
        self.allreduce_calls = 0
        self.allreduce_bytes = 0
        self.wait_seconds = 0.0
        self.mpi_seconds = 0.0


@dataclass
class ProcessGroup:
    """The processes of a job: an MPI communicator, this process's rank, and the timeout
    of every wait."""

    comm: Any                      # mpi4py.MPI.Comm
    mpi: Any                       # the mpi4py.MPI module
    rank: int
    size: int
    timeout: float
    stats: CommStats = field(default_factory=CommStats)
    # FUSEGRAD_DIST_DEBUG=1: every collective first checks that all ranks pass the same
    # dtype and shape (torch's TORCH_DISTRIBUTED_DEBUG=DETAIL), at one more message a call.
    debug: bool = False

    def mpi_op(self, op: str):
        return self.mpi.MAX if op == "max" else self.mpi.SUM


# The default group, made by init(); torch.distributed keeps its default group the same way.
_GROUP: ProcessGroup | None = None


def _import_mpi():
    try:
        from mpi4py import MPI  # optional: mpi4py (fusegrad[mpi])
    except ImportError as e:
        raise ImportError(MPI_MISSING) from e
    return MPI


def init(timeout: float | None = None, abort_on_exception: bool = True) -> ProcessGroup:
    """Join the job ``mpiexec`` started (``torch.distributed.init_process_group``).

    Rank and world size come from MPI's environment; a plain ``python script.py`` is a job
    of one rank (collectives before any ``init()`` in a process no launcher started use a
    group of one rank without importing mpi4py). ``timeout`` bounds every wait on a collective (default
    ``FUSEGRAD_DIST_TIMEOUT`` or 120 s); past it the wait raises :class:`DistributedError`.
    With ``abort_on_exception`` an uncaught exception in any rank prints its traceback and
    calls ``MPI_Abort``, which stops every rank of the job instead of leaving them waiting.
    Calling ``init`` again returns the same group.
    """
    global _GROUP
    if _GROUP is not None and _GROUP.comm is not None:
        return _GROUP
    MPI = _import_mpi()
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    comm = MPI.COMM_WORLD
    if timeout is None:
        timeout = float(os.environ.get("FUSEGRAD_DIST_TIMEOUT", "120"))
    _GROUP = ProcessGroup(comm, MPI, comm.Get_rank(), comm.Get_size(), float(timeout),
                          debug=debug_enabled())
    if abort_on_exception and _GROUP.size > 1:
        _install_excepthook(_GROUP)
    return _GROUP


def debug_enabled() -> bool:
    """Whether ``FUSEGRAD_DIST_DEBUG`` asks for the per-call layout checks (``1``;
    torch's ``DETAIL`` also works)."""
    return os.environ.get("FUSEGRAD_DIST_DEBUG", "").strip().upper() not in ("", "0", "OFF")


def _install_excepthook(g: ProcessGroup) -> None:
    previous = sys.excepthook

    def abort_job(tp, value, tb):
        previous(tp, value, tb)
        sys.stderr.write(f"fusegrad.distributed: rank {g.rank} of {g.size} raised "
                         f"{tp.__name__}: {value}; stopping all ranks (MPI_Abort)\n")
        sys.stderr.flush()
        g.comm.Abort(1)

    sys.excepthook = abort_job


def is_initialized() -> bool:
    """Whether :func:`init` has run in this process."""
    return _GROUP is not None and _GROUP.comm is not None


# Set by the MPI launchers (Open MPI, PMIx, MPICH's Hydra, Intel MPI, MVAPICH) in each rank.
_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                       "MV2_COMM_WORLD_SIZE")


def launched_by_mpi() -> bool:
    """Whether an MPI launcher (``mpiexec``, ``srun``) started this process."""
    return any(v in os.environ for v in _LAUNCHER_VARIABLES)


def group() -> ProcessGroup:
    """The default process group. Made by :func:`init` on first use when an MPI launcher
    started this process; otherwise, before any ``init()``, a group of one rank that needs
    no MPI (single-process runs of a data-parallel script, the IR interpreter)."""
    global _GROUP
    if _GROUP is None:
        if launched_by_mpi():
            return init()
        _GROUP = ProcessGroup(None, None, 0, 1, 0.0)
    return _GROUP


def rank() -> int:
    """This process's rank, 0 to ``world_size() - 1``."""
    return group().rank


def world_size() -> int:
    """The number of processes in the job."""
    return group().size


def comm_stats() -> CommStats:
    """Counters of this process's collectives (calls, bytes, seconds blocked)."""
    return group().stats


def wait(request, what: str) -> None:
    """Wait for a nonblocking MPI ``request``; raise :class:`DistributedError` past the
    group's timeout. Spins briefly (a collective of a small bucket finishes within
    microseconds), then sleeps between tests to leave the core to the other ranks."""
    g = group()
    start = time.perf_counter()
    if request.Test():
        g.stats.mpi_seconds += time.perf_counter() - start
        return
    deadline = start + g.timeout
    spins = 0
    while not request.Test():
        spins += 1
        if spins > 200:
            time.sleep(2e-5 if spins < 5000 else 5e-4)
            if time.perf_counter() > deadline:
                raise DistributedError(
                    f"fusegrad.distributed: rank {g.rank} of {g.size} waited {g.timeout:g} s for "
                    f"{what}; another rank has died, hangs, or runs a different collective "
                    "(set FUSEGRAD_DIST_TIMEOUT to wait longer)")
    g.stats.wait_seconds += time.perf_counter() - start
    g.stats.mpi_seconds += time.perf_counter() - start


def poll(request) -> bool:
    """Whether ``request`` has completed; lets MPI move it forward (counted in
    ``mpi_seconds``)."""
    stats = group().stats
    start = time.perf_counter()
    done = request.Test()
    stats.mpi_seconds += time.perf_counter() - start
    return done


def _buffer(tensor, what: str) -> np.ndarray:
    arr = tensor._data
    if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous or not arr.flags.writeable:
        raise ValueError(f"{what}: the tensor's memory must be contiguous and writable "
                         f"(got a tensor of shape {list(tensor.shape)}); call .contiguous()")
    # float16 and bfloat16 have no MPI datatype that every MPI library reduces.
    if arr.dtype.kind not in "fiu" or (arr.dtype.kind == "f" and arr.dtype.itemsize < 4):
        raise TypeError(f"{what}: MPI has no datatype for {tensor.dtype}")
    return arr


def allgather_array(arr: np.ndarray, what: str) -> np.ndarray:
    """Every rank's ``arr`` (same shape and dtype on all ranks), stacked by rank: blocking,
    with the group's timeout."""
    g = group()
    arr = np.ascontiguousarray(arr)
    out = np.empty((g.size, *arr.shape), arr.dtype)
    if g.size == 1:
        out[0] = arr
        return out
    wait(g.comm.Iallgather(arr, out), what)
    return out


def allgather_bytes(data: bytes, what: str) -> list[bytes]:
    """Every rank's ``data`` (any length), by rank."""
    lengths = allgather_array(np.array([len(data)], np.int64), what)[:, 0]
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[:len(data)] = np.frombuffer(data, np.uint8)
    rows = allgather_array(padded, what)
    return [rows[r, :n].tobytes() for r, n in enumerate(lengths)]


def layout_disagreement(layouts: list[list[tuple[str, str]]]) -> str | None:
    """Where the ranks' layouts (per rank, a list of (tensor name, layout text)) first
    differ from rank 0's, in words; None when all agree. Every rank computes the same."""
    base = layouts[0]
    for r, mine in enumerate(layouts[1:], 1):
        if mine == base:
            continue
        for k in range(max(len(base), len(mine))):
            a = base[k] if k < len(base) else None
            b = mine[k] if k < len(mine) else None
            if a != b:
                break
        name = (a or b)[0] if a is None or b is None or a[0] == b[0] else f"{a[0]} / {b[0]}"
        return (f"rank 0 and rank {r} disagree on tensor {k} ({name}): rank 0 has "
                f"{_entry_text(a)}, rank {r} has {_entry_text(b)}")
    return None


def _entry_text(entry: tuple[str, str] | None) -> str:
    return "no such tensor" if entry is None else f"{entry[0]}: {entry[1]}"


def agree_on_layout(layout: list[tuple[str, str]], what: str) -> list | None:
    """Compare ``layout`` (a list of (tensor name, layout text), e.g. dtype and shape) across
    the ranks: one all-gather of its SHA-256 digest, and only when the digests differ one of
    the layouts themselves. None when all ranks agree, else every rank's layout, by rank."""
    g = group()
    if g.size == 1:
        return None
    text = json.dumps(layout).encode()
    digest = np.frombuffer(hashlib.sha256(text).digest(), np.uint8)
    digests = allgather_array(digest, f"the layout check of {what}")
    if (digests == digests[0]).all():
        return None
    return [[tuple(e) for e in json.loads(b)]
            for b in allgather_bytes(text, f"the layout check of {what}")]


def layout_text(arr: np.ndarray) -> str:
    """``arr``'s dtype and shape as the IR writes them (``f32[2,3]``)."""
    return f"{dtypes.from_numpy_dtype(arr.dtype).short}[{','.join(map(str, arr.shape))}]"


def _check_call_layout(arr: np.ndarray, what: str) -> None:
    """Under FUSEGRAD_DIST_DEBUG: raise on every rank unless all pass ``arr``'s dtype and
    shape to this collective."""
    layouts = agree_on_layout([("tensor", layout_text(arr))], what)
    if layouts is not None:
        r = next(r for r, lay in enumerate(layouts) if lay != layouts[0])
        raise DistributedError(
            f"{what}: the ranks pass tensors of other dtypes or shapes: rank 0 passes "
            f"{layouts[0][0][1]}, rank {r} passes {layouts[r][0][1]} (FUSEGRAD_DIST_DEBUG "
            "checks every collective; without it their bytes would have been mixed)")


def start_allreduce(arr: np.ndarray, op: str):
    """Start an in-place all-reduce of numpy ``arr`` (``op`` "sum" or "max"); returns the
    MPI request. ``arr`` must stay alive and untouched until the request completes. With
    ``FUSEGRAD_DIST_DEBUG`` the ranks first check they all pass the same dtype and shape."""
    g = group()
    if g.debug:
        _check_call_layout(arr, f"all_reduce({op})")
    g.stats.allreduce_calls += 1
    g.stats.allreduce_bytes += arr.nbytes
    start = time.perf_counter()
    request = g.comm.Iallreduce(g.mpi.IN_PLACE, arr, g.mpi_op(op))
    g.stats.mpi_seconds += time.perf_counter() - start
    return request


def allreduce_array(arr: np.ndarray, op: str) -> np.ndarray:
    """A new array: the all-reduce of ``arr`` over the group, blocking (with the timeout)."""
    out = np.array(arr, copy=True, order="C")
    if group().size > 1:
        wait(start_allreduce(out, op), f"all_reduce({op}) of {out.size} {out.dtype} elements")
    return out


class Work:
    """A collective in flight (``async_op=True``): ``wait()`` finishes it. Without a
    request (a group of one rank) it is finished when made."""

    def __init__(self, request, what: str, finish=None):
        self._request, self._what, self._finish = request, what, finish
        if request is None and finish is not None:
            finish()

    def is_completed(self) -> bool:
        return self._request is None or bool(self._request.Test())

    def wait(self) -> bool:
        if self._request is not None:
            wait(self._request, self._what)
            self._request = None
            if self._finish is not None:
                self._finish()
        return True
