"""What runs inside a DataLoader worker process (torch.utils.data._utils.worker).

A worker reads ``(task index, sample indices)`` from its own index pipe, fetches and
collates the batch, and puts ``(task index, batch)`` on the shared result queue. Tensors
cross the process boundary as numpy arrays (``Tensor.__reduce_ex__``). An exception
becomes an :class:`ExceptionWrapper` carrying the worker's traceback text, which the main
process re-raises.
"""

from __future__ import annotations

import os
import pickle
import random
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fusegrad.ops.creation import manual_seed

# How often (seconds) a blocked worker checks that its parent is alive, and a blocked main
# process that its workers are (torch's MP_STATUS_CHECK_INTERVAL).
MP_STATUS_CHECK_INTERVAL = 5.0


@dataclass
class WorkerInfo:
    """What :func:`get_worker_info` returns inside a worker."""

    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """In a DataLoader worker: its ``id``, ``num_workers``, ``seed`` and its copy of the
    ``dataset`` (to split an IterableDataset between workers). In the main process: None."""
    return _worker_info


class ExceptionWrapper:
    """An exception caught in a worker, with its traceback as text (tracebacks do not
    pickle)."""

    def __init__(self, exc_info=None, where: str = "in background") -> None:
        exc_info = exc_info or sys.exc_info()
        self.exc_type = exc_info[0]
        self.exc_msg = "".join(traceback.format_exception(*exc_info))
        self.where = where

    def reraise(self):
        """Raise an exception of the original type whose message holds the worker's
        traceback."""
        msg = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {self.exc_msg}"
        if self.exc_type is KeyError:
            # KeyError quotes its message with repr(); this keeps the traceback readable.
            msg = KeyErrorMessage(msg)
        try:
            exception = self.exc_type(msg)
        except Exception:
            # The type needs other constructor arguments; fall back to a RuntimeError.
            raise RuntimeError(msg) from None
        raise exception


class KeyErrorMessage(str):
    """A str whose repr is itself, so that ``KeyError(msg)`` prints the traceback as is."""

    def __repr__(self) -> str:
        return self


@dataclass
class IterableDatasetStopIteration:
    """Sent by a worker whose copy of an IterableDataset is exhausted."""

    worker_id: int


@dataclass
class ResumeIteration:
    """Sent to persistent workers at the start of a new epoch; echoed back as an ack."""


class MapDatasetFetcher:
    """Fetch and collate the samples at the given indices of a map-style dataset."""

    def __init__(self, dataset, auto_collation: bool, collate_fn: Callable,
                 drop_last: bool) -> None:
        self.dataset, self.auto_collation, self.collate_fn = dataset, auto_collation, collate_fn

    def fetch(self, possibly_batched_index):
        if self.auto_collation:
            getitems = getattr(self.dataset, "__getitems__", None)
            if getitems:
                data = getitems(possibly_batched_index)
            else:
                data = [self.dataset[idx] for idx in possibly_batched_index]
        else:
            data = self.dataset[possibly_batched_index]
        return self.collate_fn(data)


class IterableDatasetFetcher:
    """Take the next sample (or the next batch of samples) from an IterableDataset; raises
    StopIteration when it is exhausted (or would give a short batch under drop_last)."""

    def __init__(self, dataset, auto_collation: bool, collate_fn: Callable,
                 drop_last: bool) -> None:
        self.dataset_iter = iter(dataset)
        self.auto_collation, self.collate_fn, self.drop_last = auto_collation, collate_fn, drop_last
        self.ended = False

    def fetch(self, possibly_batched_index):
        if self.ended:
            raise StopIteration
        if self.auto_collation:
            data = []
            for _ in possibly_batched_index:
                try:
                    data.append(next(self.dataset_iter))
                except StopIteration:
                    self.ended = True
                    break
            if not data or (self.drop_last and len(data) < len(possibly_batched_index)):
                raise StopIteration
        else:
            data = next(self.dataset_iter)
        return self.collate_fn(data)


def create_fetcher(iterable: bool, dataset, auto_collation: bool, collate_fn: Callable,
                   drop_last: bool):
    cls = IterableDatasetFetcher if iterable else MapDatasetFetcher
    return cls(dataset, auto_collation, collate_fn, drop_last)


def numpy_seed(base_seed: int, worker_id: int) -> int:
    """A 32-bit numpy seed for worker ``worker_id``, different per worker and per epoch."""
    return int(np.random.SeedSequence([worker_id, base_seed]).generate_state(1)[0])


def put_result(data_queue, idx, data, where: str) -> None:
    """Pickle ``(idx, data)`` here rather than in the queue's feeder thread, so that a batch
    that cannot be pickled is reported to the main process instead of being dropped."""
    try:
        payload = pickle.dumps((idx, data), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        payload = pickle.dumps((idx, ExceptionWrapper(where=where)),
                               protocol=pickle.HIGHEST_PROTOCOL)
    data_queue.put(payload)


def worker_loop(iterable: bool, dataset, index_pipe, data_queue, done_event,
                auto_collation: bool, collate_fn: Callable, drop_last: bool, base_seed: int,
                init_fn: Callable[[int], None] | None, worker_id: int, num_workers: int) -> None:
    """The body of a worker process: seed, run ``init_fn``, then serve fetch requests until
    it gets None."""
    global _worker_info

    try:
        seed = base_seed + worker_id
        random.seed(seed)
        manual_seed(seed)
        np.random.seed(numpy_seed(base_seed, worker_id))
        _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                  dataset=dataset)
        where = f"in DataLoader worker process {worker_id}"
        init_exception = None
        fetcher = None
        try:
            if init_fn is not None:
                init_fn(worker_id)
            fetcher = create_fetcher(iterable, dataset, auto_collation, collate_fn, drop_last)
        except Exception:
            init_exception = ExceptionWrapper(where=where)
        iteration_end = False
        parent = os.getppid()
        while os.getppid() == parent:      # exit when the main process is gone
            try:
                if not index_pipe.poll(MP_STATUS_CHECK_INTERVAL):
                    continue
                request = index_pipe.recv()
            except EOFError:
                break       # the main process closed its end
            if isinstance(request, ResumeIteration):
                put_result(data_queue, request, None, where)
                iteration_end = False
                if init_exception is None:
                    fetcher = create_fetcher(iterable, dataset, auto_collation, collate_fn,
                                             drop_last)
                continue
            if request is None:
                break
            if done_event.is_set() or iteration_end:
                continue
            idx, index = request
            if init_exception is not None:
                data: Any = init_exception
                init_exception = None
            else:
                try:
                    data = fetcher.fetch(index)  # type: ignore[union-attr]
                except StopIteration:
                    if not iterable:
                        data = ExceptionWrapper(where=where)
                    else:
                        data = IterableDatasetStopIteration(worker_id)
                        iteration_end = True
                except Exception:
                    data = ExceptionWrapper(where=where)
            put_result(data_queue, idx, data, where)
            del data, idx, index, request
    except KeyboardInterrupt:
        pass
    if done_event.is_set():
        # Do not block on flushing results that the main process no longer reads.
        data_queue.cancel_join_thread()
        data_queue.close()
