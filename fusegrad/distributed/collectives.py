"""torch.distributed's collectives on tensors: ``all_reduce``, ``broadcast``, ``barrier``.

Eager tensors go to MPI directly (:mod:`fusegrad.distributed.comm`); inside a compiled function
``all_reduce`` becomes the graph's start and wait nodes (:mod:`fusegrad.distributed.prims`).
"""

from __future__ import annotations

import numpy as np

from fusegrad.distributed.comm import (
    _REDUCE_OPS,
    ReduceOp,
    Work,
    _buffer,
    _check_call_layout,
    group,
    start_allreduce,
    wait,
)
from fusegrad.distributed.prims import all_reduce_in_place, traced_all_reduce
from fusegrad.ops import primitive

__all__ = ["all_reduce", "broadcast", "barrier"]


def all_reduce(tensor, op: str = ReduceOp.SUM, async_op: bool = False):
    """Reduce ``tensor`` over all ranks, in place: every rank gets the sum, mean or max.

    On a concrete tensor MPI reads and writes its buffer directly. Inside a compiled function
    (a traced tensor, or a parameter read by one) the all-reduce becomes two nodes of the
    graph, a start and a wait, which the runtime runs as a nonblocking MPI all-reduce.
    With ``async_op`` returns a :class:`Work` to ``wait()`` on (eager tensors only).
    """
    if op not in _REDUCE_OPS:
        raise ValueError(f"all_reduce: op must be one of {_REDUCE_OPS}, got {op!r}")
    if primitive.traced(tensor):
        if async_op:
            raise ValueError("all_reduce: async_op=True is for eager tensors; inside a compiled "
                             "function the graph's scheduler overlaps the all-reduce")
        # Autograd does not record the eager (and torch's) in-place all-reduce: the tensor
        # keeps its history and its gradient passes through unchanged. So does the traced
        # one's, though the primitive's own VJP sums the ranks' cotangents.
        reduced = all_reduce_in_place.mark(traced_all_reduce(tensor, op), (tensor,))
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
    if primitive.traced(tensor):
        raise ValueError("broadcast runs outside compiled functions (at setup, on parameters)")
    g = group()
    if not 0 <= src < g.size:
        raise ValueError(f"broadcast: src {src} is not a rank of a group of {g.size}")
    arr = _buffer(tensor, "broadcast")
    if g.debug and g.size > 1:
        _check_call_layout(arr, f"broadcast from rank {src}")
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
