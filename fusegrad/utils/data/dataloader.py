"""``DataLoader`` (torch.utils.data.dataloader): batches from a dataset, in the main process
or in worker processes.

Requests go to each worker over its own one-way pipe, written synchronously: a queue's
feeder thread could be finalized by a garbage collection that also collects the iterator,
leaving the final "stop" request unsent and the worker waiting. Results come back on one
shared queue, whose feeder threads live in the workers, so a worker never blocks on a main
process that stopped reading.

With ``num_workers > 0``, batch ``i`` is sent to worker ``i mod num_workers`` (skipping
workers whose IterableDataset copy is exhausted), at most ``prefetch_factor`` batches per
worker ahead, and results are handed out in the order they were sent: the same batches in
the same order as ``num_workers=0``. A worker's exception is re-raised in the main process
with the worker's traceback in its message; a worker that dies is reported, and
``timeout`` bounds the wait for a batch.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import queue
import weakref
from typing import Any, Callable, Generic, Iterable, TypeVar

from fusegrad.ops.creation import Generator
from fusegrad.utils.data import _worker
from fusegrad.utils.data.collate import default_collate, default_convert
from fusegrad.utils.data.dataset import Dataset, IterableDataset
from fusegrad.utils.data.sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    _random_seed,
)

__all__ = ["DataLoader", "get_worker_info", "default_collate", "default_convert"]

get_worker_info = _worker.get_worker_info
T_co = TypeVar("T_co", covariant=True)


class _InfiniteConstantSampler(Sampler):
    """The sampler of an IterableDataset: None forever (the dataset decides when to stop)."""

    def __iter__(self):
        while True:
            yield None


class DataLoader(Generic[T_co]):
    """Iterate over ``dataset`` in batches (torch.utils.data.DataLoader).

    ``shuffle`` draws a new order every epoch from ``generator`` (seed it for a reproducible
    order); ``sampler`` or ``batch_sampler`` give the order explicitly. ``collate_fn``
    merges a list of samples into a batch (``default_collate``: stacked tensors).
    ``batch_size=None`` turns batching off: each sample is converted, not collated.
    ``num_workers > 0`` loads batches in that many processes; ``worker_init_fn(worker_id)``
    runs first in each, and ``persistent_workers`` keeps them across epochs.
    ``pin_memory`` is accepted and has no effect (there is no pinned memory on the CPU).
    Batches always come in the sampler's order; ``in_order=False`` is accepted and keeps it.
    """

    def __init__(self, dataset: Dataset[T_co], batch_size: int | None = 1,
                 shuffle: bool | None = None, sampler: Sampler | Iterable | None = None,
                 batch_sampler: Sampler | Iterable | None = None, num_workers: int = 0,
                 collate_fn: Callable[[list], Any] | None = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0,
                 worker_init_fn: Callable[[int], None] | None = None,
                 multiprocessing_context=None, generator: Generator | None = None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True) -> None:
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to "
                             "disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in "
                             "multiprocessing.let num_workers > 0 to enable multiprocessing, "
                             "otherwise set prefetch_factor to None.")
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order

        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable:
            if isinstance(shuffle, bool) and shuffle:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle "
                                 f"option, but got shuffle={shuffle}")
            if sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                 f"sampler option, but got sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                 f"batch_sampler option, but got batch_sampler={batch_sampler}")
        else:
            shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                                 "shuffle, sampler, and drop_last")
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")
        if sampler is None:
            if self._iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)  # type: ignore[arg-type]
            else:
                sampler = SequentialSampler(dataset)  # type: ignore[arg-type]
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        self._iterator: _BaseIter | None = None

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def __iter__(self):
        if self.num_workers == 0:
            return _SingleProcessIter(self)
        if self.persistent_workers:
            if self._iterator is None:
                self._iterator = _MultiProcessingIter(self)
            else:
                self._iterator._reset(self)
            return self._iterator
        return _MultiProcessingIter(self)

    def __len__(self) -> int:
        if self._iterable:
            length = len(self.dataset)  # type: ignore[arg-type]
            if self.batch_size is not None:
                if self.drop_last:
                    return length // self.batch_size
                return -(-length // self.batch_size)
            return length
        return len(self._index_sampler)  # type: ignore[arg-type]


class _BaseIter:
    """State shared by both iterators: the sampler's iterator and the worker base seed."""

    def __init__(self, loader: DataLoader) -> None:
        self._loader = loader
        self._dataset = loader.dataset
        self._iterable = loader._iterable
        self._auto_collation = loader._auto_collation
        self._drop_last = loader.drop_last
        self._index_sampler = loader._index_sampler
        self._collate_fn = loader.collate_fn
        self._num_workers = loader.num_workers
        self._timeout = loader.timeout
        # Drawn whatever num_workers is (torch does too), so that the sampler's draws from a
        # shared generator, and so the order, do not depend on num_workers.
        self._base_seed = _random_seed(loader.generator)
        _BaseIter._reset(self, loader, first_iter=True)

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0

    def _next_index(self):
        return next(self._sampler_iter)

    def __iter__(self):
        return self

    def __next__(self):
        data = self._next_data()
        self._num_yielded += 1
        return data

    def __len__(self) -> int:
        return len(self._loader)

    def _next_data(self):
        raise NotImplementedError


class _SingleProcessIter(_BaseIter):
    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        self._fetcher = _worker.create_fetcher(self._iterable, self._dataset,
                                               self._auto_collation, self._collate_fn,
                                               self._drop_last)

    def _next_data(self):
        index = self._next_index()
        return self._fetcher.fetch(index)


def _context(spec):
    if spec is None:
        return multiprocessing.get_context()
    if isinstance(spec, str):
        return multiprocessing.get_context(spec)
    return spec


class _MultiProcessingIter(_BaseIter):
    """Worker processes fed by per-worker index pipes, results reordered by task index."""

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        self._prefetch_factor = loader.prefetch_factor
        self._persistent = loader.persistent_workers
        ctx = _context(loader.multiprocessing_context)
        self._result_queue = ctx.Queue()
        self._done_event = ctx.Event()
        self._index_pipes: list = []      # the main process's (write) ends
        self._workers: list = []
        # Not __del__: collected in a reference cycle (an exception's traceback makes one),
        # the iterator's pipes and queues may be finalized before it, and the stop requests
        # would be lost. A forked process that inherits the iterator must not run it either.
        self._stop = weakref.finalize(self, _stop_workers, os.getpid(), self._done_event,
                                      self._index_pipes, self._workers, self._result_queue)
        for worker_id in range(self._num_workers):
            reader, writer = ctx.Pipe(duplex=False)
            worker = ctx.Process(
                target=_worker.worker_loop,
                args=(self._iterable, self._dataset, reader, self._result_queue,
                      self._done_event, self._auto_collation, self._collate_fn, self._drop_last,
                      self._base_seed, loader.worker_init_fn, worker_id, self._num_workers),
                daemon=True)
            worker.start()
            reader.close()
            self._index_pipes.append(writer)
            self._workers.append(worker)
        self._reset(loader, first_iter=True)

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)
        self._send_idx = 0      # index of the next task to send
        self._rcvd_idx = 0      # index of the next task to return
        # task index -> (worker id,) while outstanding, (worker id, data) once received early
        self._task_info: dict[int, tuple] = {}
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        self._worker_cycle = itertools.cycle(range(self._num_workers))
        if not first_iter:
            # Persistent workers: every worker acknowledges the new epoch; whatever they
            # return before that (batches of an abandoned epoch) is dropped.
            for pipe in self._index_pipes:
                pipe.send(_worker.ResumeIteration())
            pending = self._num_workers
            while pending > 0:
                idx, _ = self._get_data()
                if isinstance(idx, _worker.ResumeIteration):
                    pending -= 1
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    def _try_put_index(self) -> None:
        try:
            index = self._next_index()
        except StopIteration:
            return
        for _ in range(self._num_workers):
            worker_id = next(self._worker_cycle)
            if self._workers_status[worker_id]:
                break
        else:
            return      # every worker's dataset is exhausted
        self._index_pipes[worker_id].send((self._send_idx, index))
        self._task_info[self._send_idx] = (worker_id,)
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _try_get_data(self, timeout: float):
        try:
            payload = self._result_queue.get(timeout=timeout)
        except queue.Empty:
            failed = [w for w, alive in zip(self._workers, self._workers_status, strict=True)
                      if alive and not w.is_alive()]
            if failed:
                pids = ", ".join(str(w.pid) for w in failed)
                self._shutdown_workers()
                raise RuntimeError(f"DataLoader worker (pid(s) {pids}) exited unexpectedly") \
                    from None
            return False, None
        return True, pickle.loads(payload)

    def _get_data(self):
        if self._timeout > 0:
            ok, data = self._try_get_data(self._timeout)
            if not ok:
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
            return data
        while True:
            ok, data = self._try_get_data(_worker.MP_STATUS_CHECK_INTERVAL)
            if ok:
                return data

    def _next_data(self):
        while True:
            # Skip tasks lost to workers whose IterableDataset copy ended.
            while self._rcvd_idx < self._send_idx:
                info = self._task_info.get(self._rcvd_idx)
                if info is not None:
                    if len(info) == 2 or self._workers_status[info[0]]:
                        break
                    del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
            else:
                if not self._persistent:
                    self._shutdown_workers()
                raise StopIteration
            if len(self._task_info[self._rcvd_idx]) == 2:
                data = self._task_info.pop(self._rcvd_idx)[1]
                self._rcvd_idx += 1
                return self._process_data(data)
            idx, data = self._get_data()
            if isinstance(idx, _worker.ResumeIteration):
                continue
            self._tasks_outstanding -= 1
            if isinstance(data, _worker.IterableDatasetStopIteration):
                self._mark_worker_done(data.worker_id)
                self._try_put_index()
                continue
            if idx != self._rcvd_idx:
                self._task_info[idx] += (data,)
            else:
                del self._task_info[idx]
                self._rcvd_idx += 1
                return self._process_data(data)

    def _process_data(self, data):
        self._try_put_index()
        if isinstance(data, _worker.ExceptionWrapper):
            data.reraise()
        return data

    def _mark_worker_done(self, worker_id: int) -> None:
        self._workers_status[worker_id] = False
        if not self._persistent:
            self._send_stop(worker_id)

    def _send_stop(self, worker_id: int) -> None:
        _send_stop(self._index_pipes[worker_id])

    def _shutdown_workers(self) -> None:
        self._stop()


def _send_stop(pipe) -> None:
    try:
        pipe.send(None)
    except OSError:
        pass        # the worker is gone already, or its pipe closed


def _stop_workers(owner_pid: int, done_event, index_pipes: list, workers: list,
                  result_queue) -> None:
    """Tell every worker to stop, wait for it (terminate it if it does not), close the
    pipes. Runs once per iterator, as a ``weakref.finalize`` callback: its arguments stay
    alive until it has run, even when the iterator is collected in a reference cycle."""
    if os.getpid() != owner_pid:
        return      # a forked process inherited the iterator: the workers are not its own
    done_event.set()
    for pipe in index_pipes:
        _send_stop(pipe)
    for worker in workers:
        worker.join(timeout=_worker.MP_STATUS_CHECK_INTERVAL)
        if worker.is_alive():
            worker.terminate()
    for pipe in index_pipes:
        pipe.close()
    result_queue.cancel_join_thread()
    result_queue.close()
