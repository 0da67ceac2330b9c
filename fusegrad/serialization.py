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

Loading checks the magic, the sizes and the digest before anything else, so a truncated or
corrupted file is refused with a message that says which.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import sys
from collections import Counter, OrderedDict
from typing import Any, BinaryIO

import numpy as np

from fusegrad import dtypes
from fusegrad.device import CPU, check_device_available
from fusegrad.device import device as Device
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


class CheckpointError(RuntimeError):
    """A checkpoint that is not one, is truncated, or does not match its checksum."""


# --------------------------------------------------------------------------- raw bytes


def to_little_endian_bytes(array: np.ndarray) -> bytes:
    """The C-order bytes of ``array`` in little-endian order (shared with safetensors)."""
    a = np.ascontiguousarray(array)
    if a.dtype.kind == "c":
        a = a.view(a.real.dtype)        # the parts, each swapped on its own
    if sys.byteorder == "big" and a.dtype.itemsize > 1:
        a = a.view(np.dtype(f"u{a.dtype.itemsize}")).byteswap()
    return a.tobytes()


def from_little_endian_bytes(buf, dtype: dtypes.DType, shape: tuple[int, ...]) -> np.ndarray:
    """A fresh, writable array of ``dtype`` and ``shape`` from little-endian ``buf``."""
    np_dtype = dtype.np_dtype
    if sys.byteorder == "big" and np_dtype.itemsize > 1:
        part = np_dtype.itemsize // 2 if np_dtype.kind == "c" else np_dtype.itemsize
        raw = np.frombuffer(buf, dtype=np.dtype(f"<u{part}")).astype(np.dtype(f"u{part}"))
        arr = raw.view(np_dtype)
    else:
        arr = np.frombuffer(buf, dtype=np_dtype).copy()
    return arr.reshape(shape)


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
            from fusegrad.ops.creation import tensor
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
    from fusegrad.nn.parameter import Parameter
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
        # Write beside the target and rename, so an interrupted save never leaves a torn file.
        tmp = os.fspath(f) + ".tmp"
        with open(tmp, "wb") as out:
            write(out)
        os.replace(tmp, f)
    else:
        write(f)


# --------------------------------------------------------------------------- decoding


def _read_all(f) -> bytes:
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:
            return fh.read()
    if isinstance(f, (bytes, bytearray, memoryview)):
        return bytes(f)
    return f.read()


def _check_framing(buf: bytes) -> dict:
    """Validate magic, lengths and digest; return the parsed header."""
    if len(buf) < len(MAGIC) + 8 or not buf.startswith(MAGIC):
        if buf.startswith(b"PK\x03\x04") or buf.startswith(b"\x80"):
            raise CheckpointError(
                "this is a PyTorch (pickle-based) checkpoint: fusegrad.load never unpickles, "
                "because unpickling runs code from the file. Save the weights with "
                "safetensors in PyTorch and read them with fusegrad.safetensors.load_file")
        if len(buf) >= 8 and 0 < int.from_bytes(buf[:8], "little") < len(buf) and buf[8:9] == b"{":
            raise CheckpointError("this is a safetensors file: read it with "
                                  "fusegrad.safetensors.load_file")
        if len(buf) < len(MAGIC) + 8 and MAGIC.startswith(buf[:len(MAGIC)]):
            raise CheckpointError(f"checkpoint is truncated: {len(buf)} bytes, shorter than its "
                                  "16-byte preamble")
        raise CheckpointError("not a fusegrad checkpoint: the file does not start with the "
                              f"magic bytes {MAGIC!r}")
    n = int.from_bytes(buf[8:16], "little")
    if n > MAX_HEADER:
        raise CheckpointError(f"checkpoint is corrupted: header length {n} is implausible")
    body_start = 16 + n
    if len(buf) < body_start + DIGEST_SIZE:
        raise CheckpointError(f"checkpoint is truncated: the header alone needs {body_start} "
                              f"bytes and the file has {len(buf)}")
    try:
        header = json.loads(buf[16:body_start].decode("utf-8"))
        data_nbytes = int(header["data_nbytes"])
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint is corrupted: its header does not parse ({e})") from None
    data_start = body_start + (-body_start % ALIGN)
    expected = data_start + data_nbytes + DIGEST_SIZE
    if len(buf) < expected:
        raise CheckpointError(f"checkpoint is truncated: expected {expected} bytes, the file has "
                              f"{len(buf)}")
    if len(buf) > expected:
        raise CheckpointError(f"checkpoint is corrupted: expected {expected} bytes, the file has "
                              f"{len(buf)} (trailing data)")
    digest = hashlib.sha256(memoryview(buf)[:expected - DIGEST_SIZE]).digest()
    if digest != buf[expected - DIGEST_SIZE:]:
        raise CheckpointError("checkpoint is corrupted: its SHA-256 checksum does not match the "
                              "contents (the file was modified or damaged after it was saved)")
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise CheckpointError(f"unsupported checkpoint format {header.get('format')!r} version "
                              f"{header.get('version')!r}; this fusegrad reads {FORMAT} "
                              f"version {VERSION}")
    header["_data_start"] = data_start
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
        from fusegrad.device import cuda_device_count
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


class _Decoder:
    def __init__(self, buf: bytes, header: dict, map_location) -> None:
        self.buf = buf
        self.data_start = header["_data_start"]
        self.data_nbytes = int(header["data_nbytes"])
        self.entries = header["tensors"]
        self.loaded: dict[int, Tensor] = {}
        self.location = _resolve_location(map_location)

    def node(self, n):
        if n is None or isinstance(n, (bool, str, int)):
            return n
        if not isinstance(n, dict) or "type" not in n:
            raise CheckpointError(f"checkpoint is corrupted: unexpected node {str(n)[:80]}")
        kind = n["type"]
        if kind == "float":
            return float(n["value"])
        if kind == "tensor":
            return self.tensor(int(n["index"]))
        if kind == "list":
            return [self.node(v) for v in n["items"]]
        if kind == "tuple":
            return tuple(self.node(v) for v in n["items"])
        if kind == "size":
            return Size(int(d) for d in n["items"])
        if kind == "dict":
            out = Counter() if n.get("counter") else OrderedDict() if n.get("ordered") else {}
            for k, v in n["items"]:
                out[self.node(k)] = self.node(v)
            return out
        if kind == "dtype":
            return dtypes.as_dtype(n["value"])
        if kind == "device":
            return Device(n["value"])
        raise CheckpointError(f"checkpoint is corrupted: unknown node type {kind!r}")

    def tensor(self, index: int) -> Tensor:
        if index in self.loaded:
            return self.loaded[index]
        if not 0 <= index < len(self.entries):
            raise CheckpointError(f"checkpoint is corrupted: tensor index {index} out of range")
        e = self.entries[index]
        dt = _DTYPES.get(e["dtype"])
        if dt is None:
            raise CheckpointError(f"checkpoint holds a tensor of unknown dtype {e['dtype']!r}")
        shape = tuple(int(d) for d in e["shape"])
        offset, nbytes = int(e["offset"]), int(e["nbytes"])
        if (any(d < 0 for d in shape) or math.prod(shape) * dt.itemsize != nbytes
                or offset < 0 or offset + nbytes > self.data_nbytes):
            raise CheckpointError(f"checkpoint is corrupted: tensor {index} ({e['dtype']}, shape "
                                  f"{list(shape)}) does not fit its {nbytes} bytes at {offset}")
        start = self.data_start + offset
        arr = from_little_endian_bytes(memoryview(self.buf)[start:start + nbytes], dt, shape)
        t = Tensor._wrap(arr, dt)
        t = self._place(t, str(e.get("device", "cpu")))
        if e.get("parameter"):
            from fusegrad.nn.parameter import Parameter
            t = Parameter(t, requires_grad=bool(e.get("requires_grad")))
        elif e.get("requires_grad"):
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
        from fusegrad.runtime.eager_cuda import transfer
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
    buf = _read_all(f)
    header = _check_framing(buf)
    return _Decoder(buf, header, map_location).node(header["root"])


def dumps(obj: Any) -> bytes:
    """The bytes :func:`save` would write for ``obj``."""
    out = io.BytesIO()
    save(obj, out)
    return out.getvalue()
