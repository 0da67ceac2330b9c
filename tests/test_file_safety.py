"""Saves by several writers at once, interrupted saves, and loads of files that are no regular
file or claim more than they hold: checkpoints, safetensors and AOT artifacts alike."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import tracemalloc

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import files, serialization
from fusegrad import safetensors as st
from fusegrad.aot.format import ArtifactError
from fusegrad.serialization import CheckpointError

# --------------------------------------------------------------------------- concurrent saves


def _contents(which: int) -> dict:
    # Different sizes, so that a mix of the two writers' bytes cannot be either file.
    n = 400_000 if which == 0 else 500_000
    return {"w": fg.full((n,), float(which + 1)), "b": fg.arange(7 + which)}


def _save_many(folder: str, which: int, times: int, start) -> None:
    start.wait()
    for _ in range(times):
        fg.save(_contents(which), os.path.join(folder, "ckpt.fg"))
        st.save_file(_contents(which), os.path.join(folder, "ckpt.safetensors"))


def _which(loaded: dict) -> int:
    """Which writer's contents ``loaded`` equals (an AssertionError if neither's)."""
    for which in (0, 1):
        want = _contents(which)
        if sorted(loaded) == sorted(want) and all(
                np.array_equal(loaded[k].numpy(), want[k].numpy()) for k in want):
            return which
    raise AssertionError(f"a mix of both writers: {({k: v.shape for k, v in loaded.items()})}")


@pytest.mark.slow
def test_two_processes_saving_to_one_path(tmp_path):
    """Each load while two processes save to one path over and over, and the file left at
    the end, is one writer's whole file, for checkpoints and safetensors (regression test:
    both wrote ``<path>.tmp``, leaving corrupt files and, in safetensors, a silent mix)."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    writers = [ctx.Process(target=_save_many, args=(str(tmp_path), w, 25, start))
               for w in (0, 1)]
    for p in writers:
        p.start()
    start.set()
    loaders = {"ckpt.fg": fg.load, "ckpt.safetensors": st.load_file}
    while any(p.is_alive() for p in writers):
        for name, load in loaders.items():
            try:
                _which(load(tmp_path / name))
            except FileNotFoundError:
                pass                                  # before the first rename
    for p in writers:
        p.join(timeout=120)
        assert p.exitcode == 0
    for name, load in loaders.items():
        _which(load(tmp_path / name))
    assert sorted(os.listdir(tmp_path)) == sorted(loaders)      # no temporary left behind


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def test_interrupted_save_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.fg"
    fg.save({"step": 1}, path)
    # Killed while writing the tensors' bytes (regression test: it left ckpt.fg.tmp, as
    # large as the checkpoint).
    monkeypatch.setattr(serialization, "to_little_endian_bytes", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        fg.save({"w": fg.ones(1000), "step": 2}, path)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["ckpt.fg"]
    assert fg.load(path) == {"step": 1}


@pytest.mark.parametrize("kind", ["fg", "safetensors", "aot"])
def test_a_failure_while_flushing_removes_the_temporary(tmp_path, monkeypatch, kind):
    path = tmp_path / "out"
    if kind == "aot":
        art = fg.aot.compile(lambda x: x * 2, fg.ones(3))
    save = {"fg": lambda: fg.save({"w": fg.ones(3)}, path),
            "safetensors": lambda: st.save_file({"w": fg.ones(3)}, path),
            "aot": lambda: art.save(path)}[kind]
    monkeypatch.setattr(files.os, "fsync", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        save()
    assert os.listdir(tmp_path) == []


def test_stale_temporaries_are_ignored_then_removed(tmp_path):
    path = tmp_path / "ckpt.fg"
    stale = tmp_path / ".ckpt.fg.dead1234.tmp"      # a writer killed outright, long ago
    fresh = tmp_path / ".ckpt.fg.live5678.tmp"      # a writer still at work
    for f in (stale, fresh):
        f.write_bytes(serialization.MAGIC + b"\xff" * 100)
    old = time.time() - 2 * files.STALE_TMP_S
    os.utime(stale, (old, old))
    fg.save({"w": fg.arange(4)}, path)
    assert fg.load(path)["w"].tolist() == [0, 1, 2, 3]
    assert sorted(os.listdir(tmp_path)) == sorted([".ckpt.fg.live5678.tmp", "ckpt.fg"])


def test_save_to_a_file_object_and_a_relative_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fg.save([1, 2], "plain.fg")
    st.save_file({"x": fg.ones(2)}, "plain.safetensors")
    assert fg.load("plain.fg") == [1, 2]
    assert st.load_file("plain.safetensors")["x"].tolist() == [1.0, 1.0]
    with open("stream.fg", "wb") as f:
        fg.save({"a": 1}, f)
    with open("stream.fg", "rb") as f:
        assert fg.load(f) == {"a": 1}


# --------------------------------------------------------------------------- bounded loads


def _aot_load(path):
    return fg.aot.load(path)


LOADERS = [(fg.load, CheckpointError), (st.load_file, st.SafetensorError),
           (st.load_metadata, st.SafetensorError), (_aot_load, ArtifactError)]


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
@pytest.mark.parametrize("load, error", LOADERS)
def test_dev_zero_is_refused_unread(load, error):
    """(regression test: the whole endless file was read, MemoryError after seconds and
    gigabytes)"""
    with pytest.raises(error, match="character device, not a regular file"):
        load("/dev/zero")


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="directory, not a regular file"):
        fg.load(tmp_path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("writes", ["forever", "nothing", "no writer"])
@pytest.mark.parametrize("load, error", LOADERS)
def test_a_fifo_is_refused_at_once(tmp_path, load, error, writes):
    fifo = str(tmp_path / "pipe")
    os.mkfifo(fifo)
    stop = threading.Event()

    def writer():
        try:
            with open(fifo, "wb", buffering=0) as w:      # blocks until a reader opens it
                sent = 0
                while not stop.is_set():
                    if writes == "forever" and sent < 1 << 26:   # bounded, should it be read
                        sent += w.write(b"\0" * 65536)
                    else:
                        stop.wait(0.01)
        except (BrokenPipeError, OSError):
            pass                                      # the reader closed its end

    thread = threading.Thread(target=writer, daemon=True)
    if writes != "no writer":
        thread.start()
    outcome = []

    def reader():
        try:
            load(fifo)
        except BaseException as e:                    # noqa: BLE001 (reported below)
            outcome.append(e)

    reading = threading.Thread(target=reader, daemon=True)
    reading.start()
    reading.join(timeout=20)
    hung = reading.is_alive()
    stop.set()                                        # the writer closes: a reader sees EOF
    if thread.is_alive():
        # Release a writer still waiting in open() for a reader.
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
    reading.join(timeout=20)
    if writes != "no writer":
        thread.join(timeout=20)
    assert not hung, "the load blocked on a FIFO"
    assert len(outcome) == 1 and isinstance(outcome[0], error), outcome
    assert "FIFO (named pipe), not a regular file" in str(outcome[0])


def _sparse(path, prefix: bytes, size: int) -> None:
    with open(path, "wb") as f:
        f.write(prefix)
        f.truncate(size)                              # a hole: no disk, reads as zeros


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


HUGE = 1 << 33                                         # 8 GiB, sparse


def test_a_checkpoint_with_a_huge_tail_is_refused_unread(tmp_path):
    path = tmp_path / "big.fg"
    _sparse(path, serialization.dumps({"w": fg.ones(4)}), HUGE)

    def load():
        with pytest.raises(CheckpointError, match="trailing data"):
            fg.load(path)
    assert _peak_bytes(load) < 1 << 24


def test_a_checkpoint_header_declaring_more_than_the_file_holds(tmp_path):
    good = serialization.dumps({"w": fg.ones(4)})
    n = int.from_bytes(good[8:16], "little")
    header = good[16:16 + n].replace(b'"data_nbytes":64', b'"data_nbytes":99999999999999')
    bad = good[:8] + len(header).to_bytes(8, "little") + header + good[16 + n:]
    path = tmp_path / "bad.fg"
    path.write_bytes(bad)
    for source in (path, bad):
        with pytest.raises(CheckpointError, match="truncated: expected 100000000000351 bytes"):
            fg.load(source)
    # The header length itself beyond the file.
    path.write_bytes(good[:8] + (1 << 30).to_bytes(8, "little") + good[16:])
    with pytest.raises(CheckpointError, match="the header alone needs 1073741840 bytes"):
        fg.load(path)
    # A stream whose length is unknown is read as far as the header declares, in chunks.
    r, w = os.pipe()
    with os.fdopen(w, "wb") as out:
        out.write(bad[:4096])
    with os.fdopen(r, "rb") as f:
        with pytest.raises(CheckpointError, match="truncated"):
            fg.load(f)


def test_safetensors_declaring_more_than_the_file_holds(tmp_path):
    path = tmp_path / "big.safetensors"
    header = b'{"w":{"dtype":"F32","shape":[1073741824],"data_offsets":[0,4294967296]}}'
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 16)
    with pytest.raises(st.SafetensorError, match="truncated: the tensors need 4294967296"):
        st.load_file(path)
    path.write_bytes((1 << 26).to_bytes(8, "little") + b"{}")
    with pytest.raises(st.SafetensorError, match="the header needs 67108872 bytes"):
        st.load_file(path)
    good = st.save({"w": fg.ones(4)})
    _sparse(path, good, HUGE)

    def load():
        with pytest.raises(st.SafetensorError, match="bytes after its last tensor"):
            st.load_file(path)
    assert _peak_bytes(load) < 1 << 24


def test_artifact_declaring_another_length_is_refused_unread(tmp_path):
    blob = fg.aot.compile(lambda x: x + 1, fg.ones(2)).to_bytes()
    path = tmp_path / "a.fgaot"
    _sparse(path, blob, HUGE)

    def load():
        with pytest.raises(ArtifactError, match="bytes after its end") as e:
            fg.aot.load(path)
        assert e.value.reason == "corrupt"
    assert _peak_bytes(load) < 1 << 24
    path.write_bytes(blob[:-100])
    with pytest.raises(ArtifactError, match="truncated") as e:
        fg.aot.load(path)
    assert e.value.reason == "truncated"
    path.write_bytes(blob)
    assert fg.aot.load(path)(fg.ones(2)).tolist() == [2.0, 2.0]
