"""fusegrad.utils.data: datasets, samplers, default_collate and the DataLoader, in the main
process and with worker processes (whose batches must equal num_workers=0's)."""

from __future__ import annotations

import collections
import os
import random
import time
import warnings

import numpy as np
import pytest

import fusegrad
from fusegrad.utils import data as D
from fusegrad.utils.data import _worker

N = 10


def make_tensor_dataset(n: int = N) -> D.TensorDataset:
    x = fusegrad.tensor(np.arange(n * 2, dtype=np.float32).reshape(n, 2))
    return D.TensorDataset(x, fusegrad.arange(n))


def labels(loader) -> list[list[int]]:
    return [batch[1].tolist() for batch in loader]


def seeded(seed: int) -> fusegrad.Generator:
    return fusegrad.Generator().manual_seed(seed)


# Module-level classes and functions: worker processes may need to pickle them.

class Squares(D.Dataset):
    """Sample i: a dict of numpy, float, int, str and tuple fields."""

    def __init__(self, n: int = N) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return {"x": np.full(3, i, dtype=np.float32), "y": float(i * i), "i": i,
                "name": f"s{i}", "pair": (i, np.int64(-i))}


class FailsAt(D.Dataset):
    def __init__(self, bad: int, exc=ValueError) -> None:
        self.bad, self.exc = bad, exc

    def __len__(self) -> int:
        return N

    def __getitem__(self, i):
        if i == self.bad:
            raise self.exc(f"sample {i} is broken")
        return i


class WhoLoaded(D.Dataset):
    """Sample i: (i, worker id, the value worker_init_fn set, a fusegrad random number)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        info = D.get_worker_info()
        return (i, -1 if info is None else info.id, _INIT_MARK.get("mark", 0),
                fusegrad.rand(1).item())


_INIT_MARK: dict = {}


def mark_worker(worker_id: int) -> None:
    _INIT_MARK["mark"] = 100 + worker_id


class Stream(D.IterableDataset):
    """0 .. n-1, split between workers by worker id."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = D.get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))

    def __len__(self) -> int:
        return self.n


class ExitsAt(D.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i):
        if i == 3:
            os._exit(1)
        return i


class Slow(D.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i):
        time.sleep(0.5)
        return i


def collate_to_lambda(batch):
    return lambda: batch


Point = collections.namedtuple("Point", ["x", "y"])


# --------------------------------------------------------------------------- datasets


def test_tensor_dataset():
    ds = make_tensor_dataset()
    assert len(ds) == N
    x, y = ds[3]
    np.testing.assert_array_equal(x.numpy(), [6.0, 7.0])
    assert y.item() == 3
    with pytest.raises(AssertionError, match="Size mismatch between tensors"):
        D.TensorDataset(fusegrad.zeros(3), fusegrad.zeros(4))


def test_subset_and_concat():
    base = list(range(100, 110))
    sub = D.Subset(base, [4, 0, 7])
    assert len(sub) == 3 and [sub[i] for i in range(3)] == [104, 100, 107]
    cat = D.ConcatDataset([D.Subset(base, [1, 2]), D.Subset(base, [5]), D.Subset(base, [0, 9])])
    assert len(cat) == 5 and cat.cumulative_sizes == [2, 3, 5]
    assert [cat[i] for i in range(5)] == [101, 102, 105, 100, 109]
    assert cat[-1] == 109 and cat[-5] == 101
    with pytest.raises(ValueError, match="absolute value of index should not exceed dataset "
                                         "length"):
        cat[-6]
    both = make_tensor_dataset(3) + make_tensor_dataset(2)
    assert isinstance(both, D.ConcatDataset) and len(both) == 5 and both[4][1].item() == 1
    with pytest.raises(AssertionError, match="ConcatDataset does not support IterableDataset"):
        D.ConcatDataset([Stream(3)])


def test_random_split_lengths_are_disjoint_and_reproducible():
    ds = list(range(N))
    a, b = D.random_split(ds, [7, 3], generator=seeded(1))
    assert (len(a), len(b)) == (7, 3)
    items = [a[i] for i in range(7)] + [b[i] for i in range(3)]
    assert sorted(items) == ds
    # The split is the generator's permutation of the indices, cut in order.
    assert items == fusegrad.randperm(N, generator=seeded(1)).tolist()
    again = D.random_split(ds, [7, 3], generator=seeded(1))
    assert again[0].indices == a.indices


def test_random_split_fractions_deal_out_the_remainder():
    parts = D.random_split(range(10), [0.33, 0.33, 0.34], generator=seeded(0))
    # floor gives 3, 3, 3; the one left over goes to the first split, as in torch.
    assert [len(p) for p in parts] == [4, 3, 3]
    with pytest.warns(UserWarning, match="Length of split at index 1 is 0"):
        D.random_split(range(2), [0.9, 0.1], generator=seeded(0))
    with pytest.raises(ValueError, match="Sum of input lengths does not equal the length of the "
                                         "input dataset!"):
        D.random_split(range(10), [3, 3])
    with pytest.raises(ValueError, match="Fraction at index 1 is not between 0 and 1"):
        D.random_split(range(10), [1.0, -0.0000001, 0.0000001])


# --------------------------------------------------------------------------- samplers


def test_sequential_and_random_sampler():
    assert list(D.SequentialSampler(range(5))) == [0, 1, 2, 3, 4]
    order = list(D.RandomSampler(range(N), generator=seeded(3)))
    assert order == fusegrad.randperm(N, generator=seeded(3)).tolist()
    assert sorted(order) == list(range(N))
    # More samples than items: a whole permutation, then part of the next one.
    long = list(D.RandomSampler(range(4), num_samples=6, generator=seeded(3)))
    assert sorted(long[:4]) == [0, 1, 2, 3] and len(long) == 6 and len(set(long[4:])) == 2
    drawn = list(D.RandomSampler(range(3), replacement=True, num_samples=70, generator=seeded(0)))
    assert len(drawn) == 70 and set(drawn) == {0, 1, 2}
    with pytest.raises(ValueError, match="num_samples should be a positive integer value, but "
                                         "got num_samples=0"):
        D.RandomSampler(range(3), num_samples=0)
    with pytest.raises(TypeError, match="replacement should be a boolean value, but got "
                                        "replacement=1"):
        D.RandomSampler(range(3), replacement=1)


def test_random_sampler_without_generator_follows_manual_seed():
    fusegrad.manual_seed(7)
    first = list(D.RandomSampler(range(20)))
    fusegrad.manual_seed(7)
    assert list(D.RandomSampler(range(20))) == first
    assert list(D.RandomSampler(range(20))) != first    # the next pass draws a new order


def test_subset_random_sampler():
    indices = [10, 20, 30, 40]
    got = list(D.SubsetRandomSampler(indices, generator=seeded(2)))
    perm = fusegrad.randperm(4, generator=seeded(2)).tolist()
    assert got == [indices[i] for i in perm]


def test_weighted_random_sampler():
    weights = [0.1, 0.9, 0.0]
    sampler = D.WeightedRandomSampler(weights, 2000, generator=seeded(0))
    drawn = list(sampler)
    assert len(sampler) == 2000 and len(drawn) == 2000
    assert 2 not in drawn and abs(drawn.count(1) / 2000 - 0.9) < 0.05
    assert drawn == list(D.WeightedRandomSampler(weights, 2000, generator=seeded(0)))
    once = list(D.WeightedRandomSampler([1, 1, 1, 1], 4, replacement=False, generator=seeded(1)))
    assert sorted(once) == [0, 1, 2, 3]
    loader = D.DataLoader(make_tensor_dataset(), batch_size=4,
                          sampler=D.WeightedRandomSampler([1.0] * N, 9, generator=seeded(2)))
    assert len(loader) == 3 and [len(b) for b in labels(loader)] == [4, 4, 1]
    with pytest.raises(ValueError, match="num_samples should be a positive integer value"):
        D.WeightedRandomSampler(weights, 0)
    with pytest.raises(ValueError, match="replacement should be a boolean value"):
        D.WeightedRandomSampler(weights, 2, replacement=1)
    with pytest.raises(ValueError, match="weights should be a 1d sequence"):
        D.WeightedRandomSampler([[1.0, 2.0]], 2)


def test_batch_sampler():
    assert list(D.BatchSampler(range(7), 3, drop_last=False)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(D.BatchSampler(range(7), 3, drop_last=True)) == [[0, 1, 2], [3, 4, 5]]
    assert len(D.BatchSampler(range(7), 3, False)) == 3
    assert len(D.BatchSampler(range(7), 3, True)) == 2
    with pytest.raises(ValueError, match="batch_size should be a positive integer value, but "
                                         "got batch_size=0"):
        D.BatchSampler(range(7), 0, False)
    with pytest.raises(ValueError, match="drop_last should be a boolean value, but got "
                                         "drop_last=1"):
        D.BatchSampler(range(7), 2, 1)


# --------------------------------------------------------------------------- collate


def test_default_collate_types():
    batch = D.default_collate([Squares()[i] for i in (1, 2)])
    assert set(batch) == {"x", "y", "i", "name", "pair"}
    assert batch["x"].dtype is fusegrad.float32 and batch["x"].shape == (2, 3)
    np.testing.assert_array_equal(batch["x"].numpy(), [[1, 1, 1], [2, 2, 2]])
    assert batch["y"].dtype is fusegrad.float64 and batch["y"].tolist() == [1.0, 4.0]
    assert batch["i"].dtype is fusegrad.int64 and batch["i"].tolist() == [1, 2]
    assert batch["name"] == ["s1", "s2"]
    # A tuple of fields becomes a list of batches; numpy scalars become a tensor.
    assert isinstance(batch["pair"], list) and batch["pair"][1].tolist() == [-1, -2]
    assert batch["pair"][1].dtype is fusegrad.int64

    flags = D.default_collate([True, False])
    assert flags.dtype is fusegrad.bool and flags.tolist() == [True, False]
    points = D.default_collate([Point(1, 2.0), Point(3, 4.0)])
    assert isinstance(points, Point) and points.x.tolist() == [1, 3]
    lists = D.default_collate([[1, 2], [3, 4]])
    assert [t.tolist() for t in lists] == [[1, 3], [2, 4]]
    stacked = D.default_collate([fusegrad.ones(2, 2), fusegrad.zeros(2, 2)])
    assert stacked.shape == (2, 2, 2) and stacked.sum().item() == 4
    # strings in a tuple sample stay the tuple zip makes (torch's); in a dict, a list
    assert D.default_collate([(0.0, "a"), (1.0, "b")])[1] == ("a", "b")


def test_default_collate_infers_the_dtype_of_python_ints_from_the_whole_batch():
    # torch.tensor(batch): a float after an int makes the batch float32, not truncated ints
    mixed = D.default_collate([1, 2.5])
    assert mixed.dtype is fusegrad.float32 and mixed.tolist() == [1.0, 2.5]
    widened = D.default_collate([True, 2])
    assert widened.dtype is fusegrad.int64 and widened.tolist() == [1, 2]
    assert D.default_collate([3, 4]).dtype is fusegrad.int64


def test_default_collate_errors_match_torch():
    with pytest.raises(RuntimeError, match="each element in list of batch should be of equal "
                                           "size"):
        D.default_collate([[1, 2], [3]])
    with pytest.raises(TypeError, match="default_collate: batch must contain tensors, numpy "
                                        "arrays, numbers, dicts or lists; found <U1"):
        D.default_collate([np.array(["a"]), np.array(["b"])])
    with pytest.raises(TypeError, match="found <class 'object'>"):
        D.default_collate([object(), object()])
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        D.default_collate([fusegrad.zeros(2), fusegrad.zeros(3)])


def test_default_convert_does_not_batch():
    sample = Squares()[2]
    converted = D.default_convert(sample)
    assert isinstance(converted["x"], fusegrad.Tensor) and converted["x"].shape == (3,)
    assert converted["y"] == 4.0 and converted["name"] == "s2"
    assert isinstance(converted["pair"], list) and converted["pair"][1].item() == -2


# --------------------------------------------------------------------------- DataLoader


def test_batches_in_order_with_and_without_drop_last():
    loader = D.DataLoader(make_tensor_dataset(), batch_size=4)
    assert len(loader) == 3
    batches = list(loader)
    assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    np.testing.assert_array_equal(batches[2][0].numpy(), [[16, 17], [18, 19]])
    dropped = D.DataLoader(make_tensor_dataset(), batch_size=4, drop_last=True)
    assert len(dropped) == 2 and labels(dropped) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_batch_size_none_converts_samples():
    loader = D.DataLoader(Squares(3), batch_size=None)
    samples = list(loader)
    assert len(loader) == 3 and len(samples) == 3
    assert samples[1]["x"].shape == (3,) and samples[1]["i"] == 1
    with pytest.raises(ValueError, match="batch_size=None option disables auto-batching and is "
                                         "mutually exclusive with drop_last"):
        D.DataLoader(Squares(3), batch_size=None, drop_last=True)


def test_shuffle_is_reproducible_with_a_seeded_generator():
    def epochs(seed):
        loader = D.DataLoader(make_tensor_dataset(), batch_size=3, shuffle=True,
                              generator=seeded(seed))
        return [sum(labels(loader), []) for _ in range(3)]

    first = epochs(5)
    assert epochs(5) == first
    assert all(sorted(order) == list(range(N)) for order in first)
    assert first[0] != first[1]          # a new order each epoch
    assert epochs(6) != first


def test_shuffle_without_generator_follows_manual_seed():
    loader = D.DataLoader(make_tensor_dataset(), batch_size=5, shuffle=True)
    fusegrad.manual_seed(11)
    first = labels(loader)
    fusegrad.manual_seed(11)
    assert labels(loader) == first


def test_sampler_batch_sampler_and_collate_fn():
    ds = make_tensor_dataset()
    assert labels(D.DataLoader(ds, batch_size=2, sampler=[9, 0, 5])) == [[9, 0], [5]]
    assert labels(D.DataLoader(ds, batch_sampler=[[1, 2, 3], [7]])) == [[1, 2, 3], [7]]
    loader = D.DataLoader(list(range(5)), batch_size=2, collate_fn=lambda b: sum(b))
    assert list(loader) == [1, 5, 4]


def test_loader_argument_errors_match_torch():
    ds = make_tensor_dataset()
    cases = [
        (lambda: D.DataLoader(ds, sampler=[0], shuffle=True),
         "sampler option is mutually exclusive with shuffle"),
        (lambda: D.DataLoader(ds, batch_sampler=[[0]], batch_size=2),
         "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
         "drop_last"),
        (lambda: D.DataLoader(ds, num_workers=-1),
         "num_workers option should be non-negative; use num_workers=0 to disable "
         "multiprocessing."),
        (lambda: D.DataLoader(ds, persistent_workers=True),
         "persistent_workers option needs num_workers > 0"),
        (lambda: D.DataLoader(Stream(3), shuffle=True),
         "DataLoader with IterableDataset: expected unspecified shuffle option, but got "
         "shuffle=True"),
    ]
    for make, message in cases:
        with pytest.raises(ValueError) as err:
            make()
        assert str(err.value) == message


def test_iterable_dataset():
    loader = D.DataLoader(Stream(7), batch_size=3)
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5], [6]]
    assert len(loader) == 3
    assert [b.tolist() for b in D.DataLoader(Stream(7), batch_size=3, drop_last=True)] == \
        [[0, 1, 2], [3, 4, 5]]
    assert list(D.DataLoader(Stream(3), batch_size=None)) == [0, 1, 2]


# --------------------------------------------------------------------------- worker processes


def test_workers_give_the_same_batches_as_the_main_process():
    def run(num_workers):
        loader = D.DataLoader(Squares(11), batch_size=3, shuffle=True, generator=seeded(4),
                              num_workers=num_workers)
        return [list(loader) for _ in range(2)]

    main, workers = run(0), run(2)
    assert len(main[0]) == 4
    for epoch_main, epoch_workers in zip(main, workers, strict=True):
        for a, b in zip(epoch_main, epoch_workers, strict=True):
            assert a["i"].tolist() == b["i"].tolist() and a["name"] == b["name"]
            assert b["x"].dtype is fusegrad.float32 and b["y"].dtype is fusegrad.float64
            np.testing.assert_array_equal(a["x"].numpy(), b["x"].numpy())
            assert [t.tolist() for t in a["pair"]] == [t.tolist() for t in b["pair"]]


def test_workers_with_a_tensor_dataset_and_persistent_workers():
    ds = make_tensor_dataset()
    expected = [labels(D.DataLoader(ds, batch_size=3, shuffle=True, generator=seeded(9)))
                for _ in range(1)]
    loader = D.DataLoader(ds, batch_size=3, shuffle=True, generator=seeded(9), num_workers=2,
                          persistent_workers=True)
    assert labels(loader) == expected[0]
    workers = loader._iterator._workers
    for i, _ in enumerate(loader):         # abandon an epoch half-way
        if i == 1:
            break
    second = labels(loader)                # the next epoch is whole, from the same processes
    assert sorted(sum(second, [])) == list(range(N)) and len(second) == 4
    assert loader._iterator._workers is workers and all(w.is_alive() for w in workers)
    loader._iterator._shutdown_workers()
    assert not any(w.is_alive() for w in workers)


def test_worker_info_init_fn_and_seeds():
    loader = D.DataLoader(WhoLoaded(), batch_size=2, num_workers=2, worker_init_fn=mark_worker,
                          generator=seeded(0))
    rows = [row for batch in loader for row in zip(*(t.tolist() for t in batch))]
    assert [r[0] for r in rows] == list(range(8))
    # Batch b goes to worker b mod 2; worker_init_fn ran in each worker, not here.
    assert [r[1] for r in rows] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [r[2] for r in rows] == [100, 100, 101, 101, 100, 100, 101, 101]
    assert "mark" not in _INIT_MARK and D.get_worker_info() is None
    # Each worker seeds fusegrad's generator from the loader's generator: distinct per worker,
    # the same on a rerun.
    loader = D.DataLoader(WhoLoaded(), batch_size=2, num_workers=2, generator=seeded(0),
                          worker_init_fn=mark_worker)
    again = [row for batch in loader for row in zip(*(t.tolist() for t in batch))]
    assert [r[3] for r in rows] == pytest.approx([r[3] for r in again])
    assert rows[0][3] != rows[2][3]
    main = list(D.DataLoader(WhoLoaded(), batch_size=2, worker_init_fn=mark_worker))
    assert main[0][1].tolist() == [-1, -1]


def test_iterable_dataset_split_between_workers():
    loader = D.DataLoader(Stream(9), batch_size=2, num_workers=2)
    batches = [b.tolist() for b in loader]
    # Worker 0 streams 0, 2, 4, 6, 8 and worker 1 streams 1, 3, 5, 7; batches alternate.
    assert batches == [[0, 2], [1, 3], [4, 6], [5, 7], [8]]


def test_worker_error_is_reraised_with_the_worker_traceback():
    loader = D.DataLoader(FailsAt(5), batch_size=2, num_workers=2)
    got = []
    with pytest.raises(ValueError) as err:
        for batch in loader:
            got.append(batch.tolist())
    assert got == [[0, 1], [2, 3]]          # batches before the failing one arrive first
    message = str(err.value)
    assert message.startswith("Caught ValueError in DataLoader worker process 0.\n"
                              "Original Traceback (most recent call last):")
    assert "in __getitem__" in message and "ValueError: sample 5 is broken" in message
    with pytest.raises(KeyError, match="Caught KeyError in DataLoader worker process 1"):
        list(D.DataLoader(FailsAt(2, KeyError), batch_size=2, num_workers=2))


def test_unpicklable_batch_is_reported():
    loader = D.DataLoader(list(range(4)), batch_size=2, num_workers=1,
                          collate_fn=collate_to_lambda)
    with pytest.raises(Exception, match="in DataLoader worker process 0"):
        next(iter(loader))


def test_dead_worker_and_timeout_are_reported(monkeypatch):
    monkeypatch.setattr(_worker, "MP_STATUS_CHECK_INTERVAL", 0.05)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid\(s\) \d+\) exited "
                                           "unexpectedly"):
        list(D.DataLoader(ExitsAt(), batch_size=2, num_workers=1))
    with pytest.raises(RuntimeError, match="DataLoader timed out after 0.1 seconds"):
        list(D.DataLoader(Slow(), batch_size=1, num_workers=1, timeout=0.1))


def test_workers_are_shut_down_after_an_epoch():
    it = iter(D.DataLoader(make_tensor_dataset(), batch_size=4, num_workers=2))
    workers = it._workers
    assert len(list(it)) == 3
    assert not any(w.is_alive() for w in workers)


def _collect_in_another_process(iterator) -> None:
    iterator._shutdown_workers()


def test_an_inherited_iterator_is_not_shut_down_by_a_forked_process():
    # Regression: a worker of a later loader inherited an abandoned iterator, collected it,
    # and shut down (and locked the queues of) workers it did not own.
    import multiprocessing
    it = iter(D.DataLoader(make_tensor_dataset(), batch_size=2, num_workers=1, timeout=20))
    assert next(it)[1].tolist() == [0, 1]
    child = multiprocessing.get_context("fork").Process(target=_collect_in_another_process,
                                                        args=(it,))
    child.start()
    child.join()
    assert child.exitcode == 0 and it._workers[0].is_alive()
    assert [b[1].tolist() for b in it] == [[2, 3], [4, 5], [6, 7], [8, 9]]


def test_an_iterator_collected_in_a_reference_cycle_stops_its_workers():
    # Regression: collected together with its queues, the iterator's stop requests stayed in
    # a finalized queue's buffer; the workers never got them and were killed after a wait.
    import gc
    it = iter(D.DataLoader(FailsAt(5), batch_size=2, num_workers=2))
    with pytest.raises(ValueError):
        list(it)
    it.cycle = it
    workers = it._workers
    del it
    gc.collect()
    assert [w.exitcode for w in workers] == [0, 0]      # exited when told, not terminated


def test_reachable_through_the_torch_namespace():
    import fusegrad as torch
    assert torch.utils.data.DataLoader is D.DataLoader
    from fusegrad.utils.data import DataLoader, TensorDataset  # noqa: F401


def test_worker_seed_does_not_touch_the_main_process_rngs():
    state = random.getstate()
    np_state = np.random.get_state()[1].copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(D.DataLoader(make_tensor_dataset(), batch_size=5, num_workers=2))
    assert random.getstate() == state
    np.testing.assert_array_equal(np.random.get_state()[1], np_state)


def test_a_training_loop_with_loader_optimizer_and_scheduler():
    from fusegrad import nn, optim
    fusegrad.manual_seed(0)
    x = fusegrad.randn(64, 3)
    y = x @ fusegrad.tensor([[1.0], [-2.0], [0.5]]) + 0.3
    loader = D.DataLoader(D.TensorDataset(x, y), batch_size=16, shuffle=True,
                          generator=seeded(0))
    model = nn.Linear(3, 1)
    opt = optim.RMSprop(model.parameters(), lr=0.1, momentum=0.9)     # OneCycle cycles momentum
    sched = optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, epochs=30,
                                          steps_per_epoch=len(loader))
    losses = []
    for _ in range(30):
        total = 0.0
        for xb, yb in loader:
            opt.zero_grad()
            loss = ((model(xb) - yb) ** 2).mean()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item()
        losses.append(total / len(loader))
    assert losses[-1] < 1e-2 * losses[0]
    np.testing.assert_allclose(model.weight.detach().numpy(), [[1.0, -2.0, 0.5]], atol=0.02)


class HalfPrecision(D.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i):
        return fusegrad.full((2,), i + 0.5, dtype=fusegrad.bfloat16)


def test_tensors_keep_their_dtype_across_the_process_boundary():
    main = list(D.DataLoader(HalfPrecision(), batch_size=2))
    workers = list(D.DataLoader(HalfPrecision(), batch_size=2, num_workers=2))
    for a, b in zip(main, workers, strict=True):
        assert b.dtype is fusegrad.bfloat16 and b.shape == (2, 2)
        assert a.tolist() == b.tolist()


def test_loader_over_a_subset_uses_its_batch_fetch():
    train, _ = D.random_split(make_tensor_dataset(), [6, 4], generator=seeded(0))
    got = sum(labels(D.DataLoader(train, batch_size=4)), [])
    assert got == [train.indices[i] for i in range(6)]


COLLATE_SAMPLES = [
    [(1, 2.0, True), (3, 4.0, False)],
    [{"a": np.ones(2, dtype=np.float32), "b": [np.int32(1), 2]},
     {"a": np.zeros(2, dtype=np.float32), "b": [np.int32(3), 4]}],
    [np.float64(1.5), np.float64(2.5)],
    [Point(np.arange(3), "p"), Point(np.arange(3) * 2, "q")],
]


@pytest.mark.parametrize("batch", COLLATE_SAMPLES, ids=range(len(COLLATE_SAMPLES)))
def test_default_collate_matches_torch(batch):
    torch = pytest.importorskip("torch")
    from torch.utils.data import default_collate as torch_collate

    def plain(value):
        if isinstance(value, (fusegrad.Tensor, torch.Tensor)):
            return ("tensor", str(value.dtype).split(".")[-1], value.tolist())
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return (type(value).__name__, [plain(v) for v in value])
        return value

    assert plain(D.default_collate(batch)) == plain(torch_collate(batch))
