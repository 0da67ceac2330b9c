"""``fusegrad.save`` / ``fusegrad.load``: checkpoints in a format that runs no code when read.

PyTorch's checkpoints are pickles, and unpickling a file runs whatever code it names. A
fusegrad checkpoint is data only:

```
 offset 0   magic  b"FGCKPT\\x00\\x01"                    (8 bytes)
        8   N      header length, u64 little-endian       (8 bytes)
       16   header N bytes of UTF-8 JSON
            pad    zero bytes up to a multiple of 64
        D   data   the tensors' raw little-endian bytes, each starting 64-byte aligned
   D+size   digest SHA-256 of every byte before it         (32 bytes)
```

The header is ``{"format": "fusegrad.checkpoint", "version": 1, "root": NODE,
"tensors": [{"dtype", "shape", "offset", "nbytes", "requires_grad", "parameter"}, ...],
"data_nbytes": size}``; a cuda tensor's entry also names its ``"device"`` (``"cuda:1"``),
where loading puts it back unless ``map_location`` says otherwise. A NODE is a JSON
string, integer, boolean or null standing for itself, or an object tagged by ``"type"``:
``float`` (its ``repr``, so inf and nan survive), ``tensor`` (an index into ``tensors``),
``list``, ``tuple``, ``size``, ``dict`` (``items`` as ``[key, value]`` pairs, so integer
keys such as an optimizer's state indices survive; ``ordered`` for an OrderedDict, ``counter``
for a Counter),
``dtype`` and ``device``. A tensor saved twice in one object is stored once and loads as
one tensor; views of one storage are stored separately.

Saving to a path writes a unique temporary file in the same folder, flushes it to disk and
renames it over the target (:func:`fusegrad.files.atomic_write`): processes saving to one
path at once leave one whole checkpoint, and a failed or interrupted save leaves the old
file and no temporary.

Loading reads a path only if it is a regular file (a FIFO or ``/dev/zero`` is refused at
once), checks the magic and the sizes the preamble and header declare against the file's
size before reading further, then reads exactly that much and checks the digest before
anything else, so a truncated or corrupted file is refused with a message that says which.
A header with a valid digest whose nodes or tensor entries are malformed (wrong types or
nesting, unknown dtypes, shapes that disagree with byte counts) raises
:class:`CheckpointError` too, never an error from inside the decoding.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
from collections import Counter, OrderedDict
from typing import Any, BinaryIO

import numpy as np

from fusegrad import dtypes
from fusegrad.device import CPU, check_device_available, cuda_device_count
from fusegrad.device import device as Device
from fusegrad.files import (
    atomic_write,
    from_little_endian_bytes,
    open_regular,
    read_exactly,
    remaining_size,
    to_little_endian_bytes,
)
from fusegrad.nn.parameter import Parameter
from fusegrad.ops.creation import tensor
from fusegrad.tensor import Size, Tensor

__all__ = ["save", "load", "CheckpointError"]

MAGIC = b"FGCKPT\x00\x01"
FORMAT = "fusegrad.checkpoint"
VERSION = 1
ALIGN = 64
DIGEST_SIZE = 32
# Refuse absurd header lengths before allocating them (a flipped high byte of N).
MAX_HEADER = 1 << 31

_DTYPES = {d.name: d for d in (dtypes.bool_, dtypes.uint8, dtypes.int8, dtypes.int16, dtypes.int32,
                               dtypes.int64, dtypes.float16, dtypes.bfloat16, dtypes.float32,
                               dtypes.float64, dtypes.complex64, dtypes.complex128)}


# What a dtype node may name: any dtype (an optimizer's or a module's setting), stored tensor
# or not.
_DTYPE_NAMES = {d.name: d for d in dtypes.ALL_DTYPES}


class CheckpointError(RuntimeError):
    """A checkpoint that is not one, is truncated, does not match its checksum, or whose
    contents do not form the objects and tensors they claim to."""


def _device(value) -> Device:
    """The device named by a checkpoint's string (a corrupt one: CheckpointError)."""
    if not isinstance(value, str):
        raise _corrupt(f"device {str(value)[:40]!r} is not a string")
    try:
        return Device(value)
    except (RuntimeError, ValueError):
        raise _corrupt(f"unknown device {value[:40]!r}") from None


# --------------------------------------------------------------------------- raw bytes


# --------------------------------------------------------------------------- encoding


class _Encoder:
    """Turns an object tree into JSON nodes, collecting its tensors once each."""

    def __init__(self) -> None:
        self.tensors: list[Tensor] = []
        self._index: dict[int, int] = {}

    def node(self, obj: Any, path: str):
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, np.bool_):
            return bool(obj)
        if isinstance(obj, Tensor):
            return {"type": "tensor", "index": self._tensor(obj)}
        if isinstance(obj, (int, np.integer)):
            return int(obj)
        if isinstance(obj, (float, np.floating)):
            return {"type": "float", "value": repr(float(obj))}
        if isinstance(obj, dtypes.DType):
            return {"type": "dtype", "value": obj.name}
        if isinstance(obj, Device):
            return {"type": "device", "value": str(obj)}
        if isinstance(obj, Size):
            return {"type": "size", "items": [int(d) for d in obj]}
        if isinstance(obj, np.ndarray):
            # torch.save keeps arrays as arrays; here they come back as tensors.
            return {"type": "tensor", "index": self._tensor(tensor(obj))}
        if isinstance(obj, (list, tuple)):
            kind = "list" if isinstance(obj, list) else "tuple"
            return {"type": kind, "items": [self.node(v, f"{path}[{i}]")
                                            for i, v in enumerate(obj)]}
        if isinstance(obj, dict):
            items = [[self.key(k, path), self.node(v, f"{path}[{k!r}]")] for k, v in obj.items()]
            node = {"type": "dict", "ordered": isinstance(obj, OrderedDict), "items": items}
            if isinstance(obj, Counter):
                node["counter"] = True      # MultiStepLR's milestones (step(epoch) reads them)
            return node
        module = type(obj).__module__
        what = type(obj).__name__ if module == "builtins" else f"{module}.{type(obj).__name__}"
        hint = " (a torch tensor: convert it with fusegrad.tensor(t.numpy()))" \
            if what.startswith("torch.") and hasattr(obj, "numpy") else ""
        raise TypeError(f"fusegrad.save can't store an object of type {what}{hint} (at "
                        f"{path or 'the top level'}): checkpoints hold fusegrad tensors, numbers, "
                        "strings, None, dtypes, devices and lists, tuples and dicts of them")

    def key(self, k: Any, path: str):
        if isinstance(k, Tensor):
            raise TypeError(f"fusegrad.save can't use a tensor as a dict key (in {path or 'obj'})")
        return self.node(k, path)

    def _tensor(self, t: Tensor) -> int:
        t._check_concrete("fusegrad.save")
        key = id(t)
        if key not in self._index:
            self._index[key] = len(self.tensors)
            self.tensors.append(t)
        return self._index[key]


def _tensor_entries(tensors: list[Tensor]) -> tuple[list[dict], int]:
    entries, offset = [], 0
    for t in tensors:
        nbytes = t.numel() * t.dtype.itemsize
        entry = {"dtype": t.dtype.name, "shape": list(t.shape), "offset": offset,
                 "nbytes": nbytes, "requires_grad": t.requires_grad,
                 "parameter": isinstance(t, Parameter)}
        if t.is_cuda:
            entry["device"] = str(t.device)
        entries.append(entry)
        offset += -(-nbytes // ALIGN) * ALIGN
    return entries, offset


def _padding(position: int) -> bytes:
    return b"\x00" * (-position % ALIGN)


def save(obj: Any, f, pickle_module=None, pickle_protocol: int = 2,
         _use_new_zipfile_serialization: bool = True) -> None:
    """Write ``obj`` (tensors, state dicts, optimizer state, numbers, strings, None, and
    lists, tuples and dicts of them) to ``f``, a path or a binary file object.

    The pickle arguments are accepted for torch's signature and ignored: nothing is pickled.

    >>> fusegrad.save({"w": fusegrad.ones(2), "step": 3}, "ckpt.fg")
    >>> fusegrad.load("ckpt.fg")["step"]
    3
    """
    enc = _Encoder()
    root = enc.node(obj, "")
    entries, data_nbytes = _tensor_entries(enc.tensors)
    header = json.dumps({"format": FORMAT, "version": VERSION, "root": root, "tensors": entries,
                         "data_nbytes": data_nbytes}, separators=(",", ":"),
                        ensure_ascii=False, allow_nan=False).encode("utf-8")
    digest = hashlib.sha256()

    def emit(out: BinaryIO, chunk: bytes) -> None:
        digest.update(chunk)
        out.write(chunk)

    def write(out: BinaryIO) -> None:
        start = MAGIC + len(header).to_bytes(8, "little") + header
        emit(out, start + _padding(len(start)))
        for t in enc.tensors:
            chunk = to_little_endian_bytes(t._host())   # cuda tensors: a host copy
            emit(out, chunk + _padding(len(chunk)))
        out.write(digest.digest())

    if isinstance(f, (str, os.PathLike)):
        # A unique temporary beside the target, renamed over it: concurrent saves to one path
        # leave one of them whole, and an interrupted save leaves the old file as it was.
        with atomic_write(f) as out:
            write(out)
    else:
        write(f)


# --------------------------------------------------------------------------- decoding


def _read_checkpoint(f) -> bytes:
    """The bytes of the checkpoint in ``f`` (a path, bytes, or a binary file object), read
    within bounds: a path must be a regular file, and past the preamble and the header only
    as many bytes are read as the header declares, after checking the file holds them."""
    if isinstance(f, (bytes, bytearray, memoryview)):
        return bytes(f)
    if isinstance(f, (str, os.PathLike)):
        fh, size = open_regular(f, CheckpointError)
        with fh:
            return _read_framed(fh, size)
    return _read_framed(f, remaining_size(f))


def _read_framed(f: BinaryIO, size: int | None) -> bytes:
    """Preamble, header, then the rest the header declares (``size``: the bytes ``f`` holds,
    None for a stream whose length is unknown)."""
    start = read_exactly(f, 16)
    n = _check_preamble(start, len(start) if size is None and len(start) < 16 else size)
    head = read_exactly(f, n)
    if len(head) < n:
        raise CheckpointError(f"checkpoint is truncated: the header alone needs {16 + n} "
                              f"bytes and the file has {16 + len(head)}")
    expected = _expected_size(_parse_header(head), n)
    if size is not None:
        _check_size(expected, size)
    rest = read_exactly(f, expected - 16 - n)
    _check_size(expected, 16 + n + len(rest))
    return start + head + rest


def _check_preamble(start: bytes, size: int | None) -> int:
    """The header length from the first 16 bytes; refuses what is no fusegrad checkpoint,
    naming what it looks like (``size``: the whole file's, None when unknown)."""
    if len(start) < len(MAGIC) + 8 or not start.startswith(MAGIC):
        if start.startswith(b"PK\x03\x04") or start.startswith(b"\x80"):
            raise CheckpointError(
                "this is a PyTorch (pickle-based) checkpoint: fusegrad.load never unpickles, "
                "because unpickling runs code from the file. Save the weights with "
                "safetensors in PyTorch and read them with fusegrad.safetensors.load_file")
        if len(start) >= 9 and 0 < int.from_bytes(start[:8], "little") < (size or 0) and \
                start[8:9] == b"{":
            raise CheckpointError("this is a safetensors file: read it with "
                                  "fusegrad.safetensors.load_file")
        if len(start) < len(MAGIC) + 8 and MAGIC.startswith(start[:len(MAGIC)]):
            raise CheckpointError(f"checkpoint is truncated: {len(start)} bytes, shorter than "
                                  "its 16-byte preamble")
        raise CheckpointError("not a fusegrad checkpoint: the file does not start with the "
                              f"magic bytes {MAGIC!r}")
    n = int.from_bytes(start[8:16], "little")
    if n > MAX_HEADER:
        raise CheckpointError(f"checkpoint is corrupted: header length {n} is implausible")
    if size is not None and size < 16 + n + DIGEST_SIZE:
        raise CheckpointError(f"checkpoint is truncated: the header alone needs {16 + n} "
                              f"bytes and the file has {size}")
    return n


def _parse_header(raw: bytes) -> dict:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"checkpoint is corrupted: its header does not parse ({e})") from None
    except RecursionError:
        raise CheckpointError("checkpoint is corrupted: its header nests too deeply") from None
    if not isinstance(header, dict) or not _is_int(header.get("data_nbytes")) or \
            header["data_nbytes"] < 0:
        raise CheckpointError("checkpoint is corrupted: its header does not parse (no "
                              "data_nbytes)")
    return header


def _expected_size(header: dict, n: int) -> int:
    """The file size the header declares (preamble, header, padding, data, digest)."""
    body_start = 16 + n
    return body_start + (-body_start % ALIGN) + header["data_nbytes"] + DIGEST_SIZE


def _check_size(expected: int, size: int) -> None:
    if size < expected:
        raise CheckpointError(f"checkpoint is truncated: expected {expected} bytes, the file has "
                              f"{size}")
    if size > expected:
        raise CheckpointError(f"checkpoint is corrupted: expected {expected} bytes, the file has "
                              f"{size} (trailing data)")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_framing(buf: bytes) -> dict:
    """Validate magic, lengths and digest; return the parsed header."""
    n = _check_preamble(buf[:16], len(buf))
    header = _parse_header(buf[16:16 + n])
    expected = _expected_size(header, n)
    _check_size(expected, len(buf))
    digest = hashlib.sha256(memoryview(buf)[:expected - DIGEST_SIZE]).digest()
    if digest != buf[expected - DIGEST_SIZE:]:
        raise CheckpointError("checkpoint is corrupted: its SHA-256 checksum does not match the "
                              "contents (the file was modified or damaged after it was saved)")
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise CheckpointError(f"unsupported checkpoint format {header.get('format')!r} version "
                              f"{header.get('version')!r}; this fusegrad reads {FORMAT} "
                              f"version {VERSION}")
    if not isinstance(header.get("tensors"), list) or "root" not in header:
        raise CheckpointError("checkpoint is corrupted: its header lacks the tensor table or "
                              "the root object")
    header["_data_start"] = 16 + n + (-(16 + n) % ALIGN)
    return header


def _resolve_location(map_location):
    """What ``map_location`` becomes: None (each tensor to its saved device), a device, a
    dict from saved location strings to devices, or a callable ``(tensor, location)``."""
    if map_location is None:
        return None
    if callable(map_location) and not isinstance(map_location, (str, Device)):
        return map_location
    if isinstance(map_location, dict):
        return {str(k): Device(v) for k, v in map_location.items()}
    dev = Device(map_location)
    if dev != CPU:
        check_device_available(dev)
    return dev


def _check_restorable(location: str) -> Device:
    """The device a tensor saved on ``location`` loads to with no ``map_location``;
    torch's errors when this machine lacks it."""
    dev = Device(location)
    if dev.type == "cuda":
        count = cuda_device_count()
        if count == 0:
            raise RuntimeError(
                "Attempting to deserialize object on a CUDA device but "
                "fusegrad.cuda.is_available() is False. If you are running on a CPU-only "
                "machine, please use fusegrad.load with map_location=fusegrad.device('cpu') "
                "to map your storages to the CPU.")
        if (dev.index or 0) >= count:
            raise RuntimeError(
                f"Attempting to deserialize object on CUDA device {dev.index} but "
                f"fusegrad.cuda.device_count() is {count}. Please use fusegrad.load with "
                f"map_location to map your storages to an existing device.")
    return dev


def _corrupt(what: str) -> CheckpointError:
    return CheckpointError(f"checkpoint is corrupted: {what}")


def _node_items(n: dict, kind: str) -> list:
    items = n.get("items")
    if not isinstance(items, list):
        raise _corrupt(f"a {kind} node without a list of items")
    return items


class _Decoder:
    """Rebuilds the object tree from the header's nodes. Every node and tensor entry is
    checked for its type and structure, so that a hand-made header with a valid checksum
    raises :class:`CheckpointError`, never an error from deep inside the decoding."""

    def __init__(self, buf: bytes, header: dict, map_location) -> None:
        self.buf = buf
        self.data_start = header["_data_start"]
        self.data_nbytes = header["data_nbytes"]
        self.entries = header["tensors"]
        self.loaded: dict[int, Tensor] = {}
        self.location = _resolve_location(map_location)

    def node(self, n):
        if n is None or isinstance(n, (bool, str, int)):
            return n
        if not isinstance(n, dict) or "type" not in n:
            raise _corrupt(f"unexpected node {str(n)[:80]}")
        kind = n["type"]
        if kind == "float":
            value = n.get("value")
            try:
                return float(value) if isinstance(value, str) else float("")
            except ValueError:
                raise _corrupt(f"float node {str(value)[:40]!r} is not a number") from None
        if kind == "tensor":
            index = n.get("index")
            if not _is_int(index):
                raise _corrupt(f"tensor node with index {str(index)[:40]!r}")
            return self.tensor(index)
        if kind == "list":
            return [self.node(v) for v in _node_items(n, kind)]
        if kind == "tuple":
            return tuple(self.node(v) for v in _node_items(n, kind))
        if kind == "size":
            items = _node_items(n, kind)
            if not all(_is_int(d) and d >= 0 for d in items):
                raise _corrupt(f"size node {str(items)[:80]}")
            return Size(items)
        if kind == "dict":
            out = Counter() if n.get("counter") else OrderedDict() if n.get("ordered") else {}
            for pair in _node_items(n, kind):
                if not isinstance(pair, list) or len(pair) != 2:
                    raise _corrupt(f"dict item {str(pair)[:80]} is not a [key, value] pair")
                key = self.node(pair[0])
                try:
                    hash(key)
                except TypeError:
                    raise _corrupt(f"dict key of type {type(key).__name__}") from None
                out[key] = self.node(pair[1])
            return out
        if kind == "dtype":
            value = n.get("value")
            if not isinstance(value, str) or value not in _DTYPE_NAMES:
                raise _corrupt(f"unknown dtype {str(value)[:40]!r}")
            return _DTYPE_NAMES[value]
        if kind == "device":
            return _device(n.get("value"))
        raise _corrupt(f"unknown node type {str(kind)[:40]!r}")

    def tensor(self, index: int) -> Tensor:
        if index in self.loaded:
            return self.loaded[index]
        if not 0 <= index < len(self.entries):
            raise _corrupt(f"tensor index {index} out of range")
        e = self.entries[index]
        if not isinstance(e, dict):
            raise _corrupt(f"tensor entry {index} is not an object")
        name = e.get("dtype")
        dt = _DTYPES.get(name) if isinstance(name, str) else None
        if dt is None:
            raise CheckpointError(f"checkpoint holds a tensor of unknown dtype {str(name)[:40]!r}")
        shape, offset, nbytes = e.get("shape"), e.get("offset"), e.get("nbytes")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape) or \
                not _is_int(offset) or not _is_int(nbytes):
            raise _corrupt(f"tensor {index} has shape {str(shape)[:80]}, offset "
                           f"{str(offset)[:20]} and size {str(nbytes)[:20]}")
        shape = tuple(shape)
        if math.prod(shape) * dt.itemsize != nbytes or offset < 0 or \
                offset + nbytes > self.data_nbytes:
            raise _corrupt(f"tensor {index} ({name}, shape {list(shape)}) does not fit its "
                           f"{nbytes} bytes at {offset}")
        saved = e.get("device", "cpu")
        _device(saved)
        start = self.data_start + offset
        arr = from_little_endian_bytes(memoryview(self.buf)[start:start + nbytes], dt, shape)
        t = Tensor._wrap(arr, dt)
        t = self._place(t, saved)
        if e.get("parameter"):
            t = Parameter(t, requires_grad=bool(e.get("requires_grad")))
        elif e.get("requires_grad"):
            if not dt.is_floating_point:
                raise _corrupt(f"tensor {index} of dtype {name} requires grad")
            t.requires_grad_(True)
        self.loaded[index] = t
        return t

    def _place(self, t: Tensor, saved: str) -> Tensor:
        """``t`` (read on the cpu) where ``map_location`` sends a tensor saved on ``saved``."""
        where = self.location
        if where is None:
            target = _check_restorable(saved)
        elif isinstance(where, Device):
            target = where
        elif isinstance(where, dict):
            target = where[saved] if saved in where else _check_restorable(saved)
        else:
            moved = where(t, saved)
            if isinstance(moved, Tensor):
                return moved
            target = _check_restorable(saved)       # torch: None means the saved device
        if target.type == "cpu":
            return t
        check_device_available(target)
        from fusegrad.tracer.eager_cuda import transfer  # optional: the CUDA runtime loads on first use
        return transfer(t, target)


def load(f, map_location=None, pickle_module=None, *, weights_only: bool | None = None,
         mmap: bool | None = None, **pickle_load_args) -> Any:
    """Read an object written by :func:`save` from a path, a binary file object or bytes.

    Tensors load on the device they were saved from. ``map_location`` may be ``None``,
    ``"cpu"``, a device (every tensor goes there), a dict from saved location to device
    (``{"cuda:1": "cuda:0"}``; locations it does not name stay), or a callable
    ``(tensor on the cpu, saved location) -> tensor`` (None: the saved device), as in torch.
    A tensor saved on a cuda device this machine lacks raises torch's error unless
    ``map_location`` moves it. ``weights_only`` is accepted: the format holds data only, so
    loading never runs code whatever its value. A truncated or corrupted file raises
    :class:`CheckpointError` (a RuntimeError) saying which.
    """
    buf = _read_checkpoint(f)
    header = _check_framing(buf)
    decoder = _Decoder(buf, header, map_location)
    try:
        return decoder.node(header["root"])
    except RecursionError:
        raise _corrupt("its objects nest too deeply to rebuild") from None


def dumps(obj: Any) -> bytes:
    """The bytes :func:`save` would write for ``obj``."""
    out = io.BytesIO()
    save(obj, out)
    return out.getvalue()
