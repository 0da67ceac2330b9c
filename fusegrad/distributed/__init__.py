"""``fusegrad.distributed``: data-parallel training over MPI (torch.distributed's names).

Launch with ``mpiexec -n N python train.py``; in the script::

    import fusegrad as fg
    fg.distributed.init()
    model = fg.distributed.DataParallel(model)      # the one changed line
    sampler = fg.utils.data.DistributedSampler(dataset)

Collectives (:func:`all_reduce`, :func:`broadcast`, :func:`barrier`) work in place on
tensors' buffers; inside a compiled function an all-reduce is a pair of graph nodes
(:mod:`fusegrad.distributed.prims`). mpi4py is imported by :func:`init` (or the first
collective), never by ``import fusegrad``; without it the error says to
``pip install fusegrad[mpi]``. See docs/distributed.md.
"""

import importlib.util

from fusegrad.distributed import prims  # registers allreduce_start / allreduce_wait
from fusegrad.distributed.collectives import all_reduce, barrier, broadcast
from fusegrad.distributed.comm import (
    CommStats,
    DistributedError,
    ProcessGroup,
    ReduceOp,
    Work,
    comm_stats,
    group,
    init,
    is_initialized,
    rank,
    world_size,
)
from fusegrad.distributed.data_parallel import DataParallel, DistributedDataParallel

# torch.distributed's spellings.
init_process_group = init
get_rank = rank
get_world_size = world_size


def is_available() -> bool:
    """Whether mpi4py can be imported (torch.distributed.is_available)."""
    return importlib.util.find_spec("mpi4py") is not None


__all__ = ["init", "init_process_group", "is_initialized", "is_available", "rank", "get_rank",
           "world_size", "get_world_size", "all_reduce", "broadcast", "barrier", "ReduceOp",
           "Work", "DataParallel", "DistributedDataParallel", "DistributedError", "ProcessGroup",
           "CommStats", "comm_stats", "group", "prims"]
