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
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ProcessGroup", "DistributedError", "ReduceOp", "Work", "CommStats", "init",
           "is_initialized", "launched_by_mpi", "rank", "world_size", "group", "all_reduce",
           "broadcast", "barrier", "comm_stats", "wait", "poll", "MPI_MISSING"]

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

    def mpi_op(self, op: str):
        return self.mpi.MAX if op == "max" else self.mpi.SUM


# The default group, made by init(); torch.distributed keeps its default group the same way.
_GROUP: ProcessGroup | None = None


def _import_mpi():
    try:
        from mpi4py import MPI
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
    _GROUP = ProcessGroup(comm, MPI, comm.Get_rank(), comm.Get_size(), float(timeout))
    if abort_on_exception and _GROUP.size > 1:
        _install_excepthook(_GROUP)
    return _GROUP


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


def start_allreduce(arr: np.ndarray, op: str):
    """Start an in-place all-reduce of numpy ``arr`` (``op`` "sum" or "max"); returns the
    MPI request. ``arr`` must stay alive and untouched until the request completes."""
    g = group()
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


def all_reduce(tensor, op: str = ReduceOp.SUM, async_op: bool = False):
    """Reduce ``tensor`` over all ranks, in place: every rank gets the sum, mean or max.

    On a concrete tensor MPI reads and writes its buffer directly. Inside a compiled function
    (a traced tensor, or a parameter read by one) the all-reduce becomes two nodes of the
    graph, a start and a wait, which the runtime runs as a nonblocking MPI all-reduce.
    With ``async_op`` returns a :class:`Work` to ``wait()`` on (eager tensors only).
    """
    if op not in _REDUCE_OPS:
        raise ValueError(f"all_reduce: op must be one of {_REDUCE_OPS}, got {op!r}")
    from fusegrad.ops import primitive
    if tensor._trace is not None or primitive.CAPTURE:
        if async_op:
            raise ValueError("all_reduce: async_op=True is for eager tensors; inside a compiled "
                             "function the graph's scheduler overlaps the all-reduce")
        from fusegrad.distributed.prims import traced_all_reduce
        from fusegrad.ops.composite import custom_vjp
        # Autograd does not record the eager (and torch's) in-place all-reduce: the tensor
        # keeps its history and its gradient passes through unchanged. So does the traced
        # one's, though the primitive's own VJP sums the ranks' cotangents.
        reduced = custom_vjp(traced_all_reduce(tensor, op), (tensor,), "all_reduce_in_place")
        return tensor.copy_(reduced)
    g = group()
    what = f"all_reduce({op}) of {tensor.numel()} {tensor.dtype.short} elements"
    arr = _buffer(tensor, "all_reduce")
    if op == "mean" and arr.dtype.kind != "f":
        raise TypeError(f"all_reduce: op 'mean' needs a floating-point tensor, got {tensor.dtype}")

    def finish():
        if op == "mean":
            np.divide(arr, g.size, out=arr)
        tensor._version_counter.value += 1

    request = start_allreduce(arr, op) if g.size > 1 else None
    return _complete(Work(request, what, finish), async_op)


def broadcast(tensor, src: int = 0, async_op: bool = False):
    """Copy ``tensor`` from rank ``src`` into the same tensor on every other rank, in place
    (MPI writes the tensor's buffer). Eager tensors only."""
    from fusegrad.ops import primitive
    if tensor._trace is not None or primitive.CAPTURE:
        raise ValueError("broadcast runs outside compiled functions (at setup, on parameters)")
    g = group()
    if not 0 <= src < g.size:
        raise ValueError(f"broadcast: src {src} is not a rank of a group of {g.size}")
    arr = _buffer(tensor, "broadcast")
    request = g.comm.Ibcast(arr, root=src) if g.size > 1 else None
    def finish():
        tensor._version_counter.value += 1     # written in place, as an in-place op would

    return _complete(Work(request, f"broadcast of {arr.size} {arr.dtype} elements from rank {src}",
                          finish), async_op)


def _complete(work: Work, async_op: bool) -> Work | None:
    """``work`` for an async call; else None once it is done."""
    if async_op:
        return work
    work.wait()
    return None


def barrier() -> None:
    """Wait until every rank has reached this call (with the group's timeout)."""
    g = group()
    if g.size > 1:
        wait(g.comm.Ibarrier(), "barrier")
