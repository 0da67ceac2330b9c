"""Checkpoints with a valid checksum but a malformed header (hand-made or from a buggy writer):
each is refused with CheckpointError, never ValueError, TypeError or RecursionError from
deep inside the decoding."""

from __future__ import annotations

import copy
import hashlib
import json
import random
from collections import OrderedDict

import pytest

import fusegrad as fg
from fusegrad.serialization import ALIGN, MAGIC, CheckpointError, dumps


def _split(blob: bytes) -> tuple[dict, bytes]:
    """(header, tensor data) of a checkpoint."""
    n = int.from_bytes(blob[8:16], "little")
    start = 16 + n + (-(16 + n) % ALIGN)
    return json.loads(blob[16:16 + n]), blob[start:-32]


def _seal(header_text: bytes, data: bytes) -> bytes:
    """A checkpoint with this header and data, framed and checksummed as save writes it."""
    start = MAGIC + len(header_text).to_bytes(8, "little") + header_text
    body = start + b"\0" * (-len(start) % ALIGN) + data
    return body + hashlib.sha256(body).digest()


def _reseal(header: dict, data: bytes) -> bytes:
    return _seal(json.dumps(header).encode(), data)


@pytest.fixture(scope="module")
def valid() -> bytes:
    fg.manual_seed(0)
    model = fg.nn.Sequential(fg.nn.Linear(3, 2), fg.nn.BatchNorm1d(2))
    opt = fg.optim.Adam(model.parameters())
    model(fg.randn(4, 3)).sum().backward()
    opt.step()
    return dumps({"model": model.state_dict(), "opt": opt.state_dict(), "step": 3,
                  "lr": 1e-3, "inf": float("inf"), "shape": fg.Size([2, 3]), "dtype": fg.int16,
                  "device": fg.device("cpu"), "pair": (1, "a", None, True),
                  "ordered": OrderedDict([(2, "b"), (1, "a")]),
                  "ints": fg.arange(5, dtype=fg.int32), "p": fg.nn.Parameter(fg.ones(2))})


def _load(blob: bytes):
    return fg.load(blob)


def test_the_valid_checkpoint_loads(valid):
    assert _load(valid)["step"] == 3
    header, data = _split(valid)
    assert _load(_reseal(header, data))["lr"] == 1e-3       # resealing keeps it valid


def _with_root(valid: bytes, root) -> bytes:
    header, data = _split(valid)
    header["root"] = root
    return _reseal(header, data)


def _with_entry(valid: bytes, index: int, **changes) -> bytes:
    header, data = _split(valid)
    header["tensors"][index].update(changes)
    return _reseal(header, data)


BAD_ROOTS = [
    [1, 2],                                           # a bare JSON list is no node
    {"type": "list"}, {"type": "list", "items": 3}, {"type": "tuple", "items": {"a": 1}},
    {"type": "dict", "items": [[1]]}, {"type": "dict", "items": [1, 2]},
    {"type": "dict", "items": [[{"type": "list", "items": []}, 1]]},    # unhashable key
    {"type": "dict", "items": "ab"},
    {"type": "float"}, {"type": "float", "value": 1.5}, {"type": "float", "value": "one"},
    {"type": "tensor"}, {"type": "tensor", "index": "0"}, {"type": "tensor", "index": 1.0},
    {"type": "tensor", "index": -1}, {"type": "tensor", "index": 10 ** 30},
    {"type": "tensor", "index": True},
    {"type": "size", "items": [2, -1]}, {"type": "size", "items": ["2"]},
    {"type": "size", "items": None},
    {"type": "dtype", "value": "float99"}, {"type": "dtype", "value": ["x"]},
    {"type": "dtype", "value": None}, {"type": "dtype", "value": 5},
    {"type": "device", "value": "tpu:0"}, {"type": "device", "value": 3},
    {"type": "device", "value": None},
    {"type": "module"}, {"type": ["list"]}, {"type": None}, 1.5,
]


@pytest.mark.parametrize("root", BAD_ROOTS, ids=[json.dumps(r)[:40] for r in BAD_ROOTS])
def test_malformed_nodes(valid, root):
    with pytest.raises(CheckpointError, match="corrupted"):
        _load(_with_root(valid, root))


BAD_ENTRIES = [
    {"dtype": "float99"}, {"dtype": ["float32"]}, {"dtype": None}, {"dtype": {"a": 1}},
    {"shape": "2"}, {"shape": [2.0]}, {"shape": [-2]}, {"shape": [10 ** 20]}, {"shape": None},
    {"shape": [[2]]}, {"shape": [True]},
    {"shape": [4]},                                    # disagrees with its byte count
    {"nbytes": 10 ** 12}, {"nbytes": -8}, {"nbytes": "8"}, {"offset": -64},
    {"offset": 10 ** 9}, {"offset": None}, {"offset": 0.5},
    {"device": "quantum"}, {"device": 7},
]


@pytest.mark.parametrize("change", BAD_ENTRIES, ids=[json.dumps(c) for c in BAD_ENTRIES])
def test_malformed_tensor_entries(valid, change):
    header, _ = _split(valid)
    index = next(i for i, e in enumerate(header["tensors"]) if e["dtype"] == "float32")
    with pytest.raises(CheckpointError, match="corrupted|unknown dtype"):
        _load(_with_entry(valid, index, **change))


def test_malformed_tables(valid):
    header, data = _split(valid)
    for bad in ({**header, "tensors": {"0": 1}}, {**header, "tensors": [1, 2]},
                {**header, "tensors": None}, {k: v for k, v in header.items() if k != "root"},
                [header], {**header, "data_nbytes": "64"}, {**header, "data_nbytes": -1}):
        with pytest.raises(CheckpointError):
            _load(_reseal(bad, data))
    with pytest.raises(CheckpointError, match="corrupted"):
        _load(_seal(b'"just a string"', data))
    with pytest.raises(CheckpointError, match="corrupted"):
        _load(_seal(b"\xff\xfe not utf-8", data))


def _nested(valid: bytes, depth: int) -> bytes:
    header, data = _split(valid)
    root = '{"type":"list","items":[' * depth + "1" + "]}" * depth
    return _seal(json.dumps({**header, "root": "ROOT"}).replace('"ROOT"', root).encode(), data)


@pytest.mark.parametrize("depth", [5000, 200_000])
def test_deep_nesting(valid, depth):
    """A header nested beyond what Python's recursion allows (regression test:
    RecursionError escaped)."""
    with pytest.raises(CheckpointError, match="too deeply"):
        _load(_nested(valid, depth))


def test_nesting_loads_or_is_refused_whatever_the_depth(valid):
    """Between what loads and what the JSON parser refuses lies a range the parser takes and
    rebuilding the objects (two frames a level) does not: refused as well."""
    for depth in [1, 50, *range(100, 1100, 50)]:
        try:
            got = _load(_nested(valid, depth))
        except CheckpointError as e:
            assert "too deeply" in str(e)
            continue
        for _ in range(depth):
            got = got[0]
        assert got == 1


# --------------------------------------------------------------------------- fuzzing


def _random_value(rng: random.Random, depth: int = 0):
    choices = [None, True, 0, -1, 2 ** 70, 1.5, "", "float32", "cuda:0", "x" * 3, [], {},
               {"type": "tensor", "index": rng.randrange(-2, 40)},
               {"type": "float", "value": rng.choice(["nan", "1e999", "-", "0x1p3"])},
               {"type": rng.choice(["list", "tuple", "dict", "size", "dtype", "device"])}]
    v = rng.choice(choices)
    if depth < 3 and rng.random() < 0.3:
        v = rng.choice([[v, _random_value(rng, depth + 1)],
                        {"type": rng.choice(["list", "dict", "tuple"]),
                         "items": [v, _random_value(rng, depth + 1)]}])
    return copy.deepcopy(v)


def _places(node, path=()):
    """Every (container, key) in a JSON tree."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield node, k
            yield from _places(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield node, i
            yield from _places(v, path + (i,))


def _mutate(header: dict, rng: random.Random) -> dict:
    header = copy.deepcopy(header)
    places = list(_places({k: header[k] for k in ("root", "tensors")}))
    for _ in range(rng.randint(1, 3)):
        container, key = rng.choice(places)
        action = rng.random()
        if action < 0.6:
            container[key] = _random_value(rng)
        elif action < 0.8 and isinstance(container, dict):
            del container[key]
            places = list(_places({k: header[k] for k in ("root", "tensors")}))
        else:
            container[key] = [container[key]] if rng.random() < 0.5 else {"type": "list",
                                                                         "items": container[key]}
    return header


def test_fuzzed_structure_raises_only_checkpoint_error(valid):
    """Random structural mutations of a valid checkpoint's header, resealed: each loads or
    raises CheckpointError (a RuntimeError), nothing else."""
    header, data = _split(valid)
    rng = random.Random(1234)
    outcomes = {"loaded": 0, "refused": 0}
    for _ in range(250):
        blob = _reseal(_mutate(header, rng), data)
        try:
            _load(blob)
            outcomes["loaded"] += 1
        except CheckpointError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 60, outcomes
