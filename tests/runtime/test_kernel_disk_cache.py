"""The disk cache (fusegrad.runtime.disk_cache) against what a shared folder can hold: FIFOs,
symlinks, directories and lying headers at an entry's path, eviction by size and age, and
concurrent processes writing and reading the same and different entries.

(tests/compiler/test_disk_cache.py covers the cache end to end across processes.)
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import signal
import stat
import struct
import time
from pathlib import Path

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import config as fg_config
from fusegrad.runtime import disk_cache, jit
from tests.runtime.cache_workers import compile_programs, payload, write_and_read

BIG = 1 << 30            # a budget no test reaches
DAY = 86400.0


def key_of(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging the suite) when the body blocks for ``seconds``."""
    def expire(signum, frame):
        raise TimeoutError(f"blocked for more than {seconds} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh cache folder used by fusegrad.compile, with an empty memory cache."""
    path = tmp_path / "kernels"
    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(path))
    fg_config.reload()
    jit.clear_memory_cache()
    yield path
    monkeypatch.undo()
    fg_config.reload()


def compile_once() -> dict:
    """Compile and run one function with an empty memory cache; the jit counters it moved."""
    jit.clear_memory_cache()
    before = dict(jit.stats)
    x = fg.arange(6.0) / 4
    out = fg.compile(lambda t: (t * 3 - 1).sin())(x)
    np.testing.assert_allclose(out.numpy(), np.sin(x.numpy() * 3 - 1), rtol=1e-5, atol=1e-6)
    return {k: jit.stats[k] - before[k] for k in ("compiles", "disk_hits")}


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.rglob("*.o"))


def the_entry(cache: Path) -> Path:
    found = entries(cache)
    assert len(found) == 1, found
    return found[0]


# --------------------------------------------------------------------------- entry format


def test_entry_roundtrip_and_header(tmp_path):
    key = key_of("a")
    assert disk_cache.read_entry(str(tmp_path), key, BIG) is None
    assert disk_cache.write_entry(str(tmp_path), key, b"object code", BIG, DAY)
    path = Path(disk_cache.entry_path(str(tmp_path), key))
    blob = path.read_bytes()
    assert blob.startswith(disk_cache.MAGIC + key.encode() + b"\n")
    assert struct.unpack("<Q", blob[72:80])[0] == len(b"object code")
    assert disk_cache.read_entry(str(tmp_path), key, BIG) == b"object code"
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "appended", "wrong key",
                                    "length lies", "empty"])
def test_damaged_entries_are_misses(tmp_path, damage):
    key = key_of("b")
    disk_cache.write_entry(str(tmp_path), key, bytes(range(256)) * 8, BIG, DAY)
    path = Path(disk_cache.entry_path(str(tmp_path), key))
    blob = path.read_bytes()
    broken = {
        "flipped byte": blob[:-5] + bytes([blob[-5] ^ 1]) + blob[-4:],
        "truncated": blob[:len(blob) // 2],
        "appended": blob + b"junk",
        "wrong key": blob.replace(key.encode(), key_of("c").encode()),
        "length lies": blob[:72] + struct.pack("<Q", 1 << 40) + blob[80:],
        "empty": b"",
    }[damage]
    path.write_bytes(broken)
    assert disk_cache.read_entry(str(tmp_path), key, BIG) is None


def test_a_sparse_file_claiming_a_huge_length_is_not_read(tmp_path):
    # A regular file of 8 GiB (sparse, nothing on disk) whose header is consistent with its
    # size: over the cache's budget, so it is refused from fstat alone.
    key = key_of("huge")
    path = Path(disk_cache.entry_path(str(tmp_path), key))
    path.parent.mkdir(parents=True)
    length = (8 << 30) - 112
    with open(path, "wb") as f:
        f.write(disk_cache.MAGIC + key.encode() + b"\n" + struct.pack("<Q", length) + bytes(32))
        f.truncate(8 << 30)
    assert disk_cache.read_entry(str(tmp_path), key, 256 << 20) is None


# --------------------------------------------------------------------------- hostile paths


def test_a_fifo_at_the_entry_path_neither_hangs_nor_breaks_the_compile(cache):
    assert compile_once() == {"compiles": 1, "disk_hits": 0}
    path = the_entry(cache)
    path.unlink()
    os.mkfifo(path)
    with deadline(20):
        assert compile_once() == {"compiles": 1, "disk_hits": 0}
    # The rebuilt entry replaced the FIFO with a regular file, which the next run loads.
    assert stat.S_ISREG(path.lstat().st_mode)
    assert compile_once() == {"compiles": 0, "disk_hits": 1}


def test_a_symlink_to_dev_zero_is_not_followed(cache):
    compile_once()
    path = the_entry(cache)
    path.unlink()
    path.symlink_to("/dev/zero")
    with deadline(20):
        assert compile_once() == {"compiles": 1, "disk_hits": 0}
    assert not path.is_symlink() and path.is_file()
    assert compile_once() == {"compiles": 0, "disk_hits": 1}


def test_a_symlink_to_a_valid_entry_is_not_trusted_either(tmp_path):
    key = key_of("link")
    elsewhere = tmp_path / "elsewhere"
    disk_cache.write_entry(str(elsewhere), key, b"code", BIG, DAY)
    path = Path(disk_cache.entry_path(str(tmp_path / "cache"), key))
    path.parent.mkdir(parents=True)
    path.symlink_to(disk_cache.entry_path(str(elsewhere), key))
    assert disk_cache.read_entry(str(tmp_path / "cache"), key, BIG) is None


def test_a_directory_at_the_entry_path_leaves_no_temporary_behind(cache):
    compile_once()
    path = the_entry(cache)
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("not ours")
    assert compile_once() == {"compiles": 1, "disk_hits": 0}      # compiles, cannot store
    assert not list(cache.rglob("*.tmp"))
    assert (path / "inside").read_text() == "not ours"            # left alone


def test_a_read_only_cache_folder_only_costs_recompiles(tmp_path):
    key = key_of("ro")
    folder = Path(disk_cache.entry_path(str(tmp_path), key)).parent
    folder.mkdir(parents=True)
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        assert not disk_cache.write_entry(str(tmp_path), key, b"code", BIG, DAY)
        assert disk_cache.read_entry(str(tmp_path), key, BIG) is None
    finally:
        folder.chmod(0o700)


# --------------------------------------------------------------------------- eviction


def age(path: Path, seconds_ago: float) -> None:
    t = time.time() - seconds_ago
    os.utime(path, (t, t))


def fresh_usage(folder: Path, used: int = 0) -> None:
    """A usage counter that says a sweep just ran, so that only the byte budget triggers one."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "usage").write_text(f"{used} {time.time():.0f}")


def test_eviction_keeps_the_cache_under_its_budget_least_recently_used_first(tmp_path):
    budget = 40_000
    fresh_usage(tmp_path)
    keys = [key_of(f"k{i}") for i in range(30)]
    for i, key in enumerate(keys):
        assert disk_cache.write_entry(str(tmp_path), key, bytes(2000), budget, 30 * DAY)
        age(Path(disk_cache.entry_path(str(tmp_path), key)), 1000 - i)   # k0 the oldest
        if i == 10:
            # Reading k0 makes it the most recently used: it must outlive k1, k2, ...
            assert disk_cache.read_entry(str(tmp_path), keys[0], budget) is not None
        total = sum(p.stat().st_size for p in tmp_path.rglob("*.o"))
        assert total <= budget
    alive = {p.stem for p in tmp_path.rglob("*.o")}
    assert keys[0] in alive and keys[-1] in alive
    assert keys[1] not in alive and keys[2] not in alive
    assert disk_cache.stats["evicted"] > 0


def test_entries_unused_for_the_maximum_age_are_evicted(tmp_path):
    old, recent = key_of("old"), key_of("recent")
    for key in (old, recent):
        disk_cache.write_entry(str(tmp_path), key, b"code", BIG, 30 * DAY)
    age(Path(disk_cache.entry_path(str(tmp_path), old)), 31 * DAY)
    age(Path(disk_cache.entry_path(str(tmp_path), recent)), 29 * DAY)
    # The last sweep was two days ago: the next write sweeps by age.
    (tmp_path / "usage").write_text(f"0 {time.time() - 2 * DAY:.0f}")
    disk_cache.write_entry(str(tmp_path), key_of("new"), b"code", BIG, 30 * DAY)
    alive = {p.stem for p in tmp_path.rglob("*.o")}
    assert alive == {recent, key_of("new")}


def test_abandoned_temporaries_are_removed_and_fresh_ones_kept(tmp_path):
    shard = tmp_path / "ab"
    shard.mkdir()
    abandoned, busy = shard / ".abandoned.tmp", shard / ".busy.tmp"
    abandoned.write_bytes(b"x" * 10)
    busy.write_bytes(b"x" * 10)
    age(abandoned, 2 * 3600)
    disk_cache.sweep(str(tmp_path), BIG, 30 * DAY)
    assert not abandoned.exists() and busy.exists()


def test_writes_under_budget_do_not_scan_the_folder(tmp_path, monkeypatch):
    fresh_usage(tmp_path)
    sweeps = []
    monkeypatch.setattr(disk_cache, "sweep", lambda *a: sweeps.append(a) or 0)
    for i in range(20):
        disk_cache.write_entry(str(tmp_path), key_of(f"n{i}"), bytes(1000), 1 << 20, DAY)
    assert sweeps == []
    used = int((tmp_path / "usage").read_text().split()[0])
    assert used == sum(p.stat().st_size for p in tmp_path.rglob("*.o"))


def test_the_sweep_corrects_a_drifted_counter(tmp_path):
    for i in range(5):
        disk_cache.write_entry(str(tmp_path), key_of(f"d{i}"), bytes(1000), BIG, DAY)
    fresh_usage(tmp_path, used=BIG)     # someone deleted files by hand: the counter is stale
    disk_cache.write_entry(str(tmp_path), key_of("d5"), bytes(1000), BIG, DAY)
    used = int((tmp_path / "usage").read_text().split()[0])
    assert used == sum(p.stat().st_size for p in tmp_path.rglob("*.o"))
    assert len(list(tmp_path.rglob("*.o"))) == 6


def test_compile_honours_the_configured_budget(cache, monkeypatch):
    budget = 24_000
    monkeypatch.setenv("FUSEGRAD_CACHE_MAX_BYTES", str(budget))
    fg_config.reload()
    assert fg.config.cache_max_bytes == budget
    x = fg.ones(5)
    evicted = disk_cache.stats["evicted"]
    for i in range(12):                  # 12 distinct kernels, each a few KB of object code
        fg.compile(lambda t, i=i: (t * (i + 0.5)).exp().sum())(x)
    total = sum(p.stat().st_size for p in entries(cache))
    assert 0 < total <= budget
    assert disk_cache.stats["evicted"] > evicted
    usage = int((cache / "usage").read_text().split()[0])
    assert usage >= total


# --------------------------------------------------------------------------- concurrency


@pytest.mark.slow
def test_four_processes_writing_the_same_and_different_entries_never_read_a_torn_one(tmp_path):
    shared = [key_of(f"shared{i}") for i in range(6)]
    jobs = [(str(tmp_path), shared + [key_of(f"own{p}-{i}") for i in range(4)], 10)
            for p in range(4)]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.starmap(write_and_read, jobs)
    for seen in results:
        assert seen == {"bad": 0, "missing": 0, "ok": 10 * 10, "rejected": 0}
    for p in tmp_path.rglob("*.o"):
        assert disk_cache.read_entry(str(tmp_path), p.stem, BIG) == payload(p.stem)
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.slow
def test_four_processes_compiling_at_once_all_succeed(tmp_path):
    cache_dir = str(tmp_path / "kernels")
    # Each worker compiles two kernels of its own, two that another worker also compiles,
    # and one that all four share.
    jobs = [(cache_dir, [float(p), float(p + 1), 10.0 + p, 10.0 + (p + 1) % 4]) for p in range(4)]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.starmap(compile_programs, jobs)
    for r in results:
        assert r["wrong"] == 0 and r["rejected"] == 0, r
    # Every entry left is whole; a fresh process finds all of them.
    for p in Path(cache_dir).rglob("*.o"):
        assert disk_cache.read_entry(cache_dir, p.stem, BIG) is not None
    with ctx.Pool(1) as pool:
        again = pool.apply(compile_programs, (cache_dir, [0.0, 1.0, 2.0, 3.0]))
    assert again["wrong"] == 0 and again["compiles"] == 0 and again["disk_hits"] > 0


# --------------------------------------------------------------------------- memory cache


def test_the_memory_cache_keeps_the_most_recently_used_modules(cache, monkeypatch):
    monkeypatch.setattr(jit._memory, "limit", 2)
    x = fg.ones(3)
    fns = [fg.compile(lambda t, i=i: t * (i + 2)) for i in range(3)]
    for i, f in enumerate(fns):
        np.testing.assert_array_equal(f(x).numpy(), [i + 2] * 3)
        assert len(jit._memory) <= 2
    before = dict(jit.stats)
    # The first module was evicted from the cache, but its program holds it: still runs.
    np.testing.assert_array_equal(fns[0](x).numpy(), [2] * 3)
    assert jit.stats["compiles"] == before["compiles"]
    lru = jit._LRU(2)
    lru["a"], lru["b"] = 1, 2
    assert lru.get("a") == 1                      # a is now the most recently used
    lru["c"] = 3
    assert list(lru) == ["a", "c"]
