"""Read and write safetensors files, the format PyTorch users share weights in.

Implemented here from the format's specification, so that the ``safetensors`` package is not
a dependency:

```
 8 bytes   N, the header length, u64 little-endian
 N bytes   UTF-8 JSON: {"__metadata__": {str: str}, NAME: {"dtype": "F32", "shape": [..],
           "data_offsets": [begin, end]}, ...}, padded with spaces to a multiple of 8 bytes
 rest      the byte buffer: each tensor's C-order little-endian bytes at [begin, end)
```

Writing follows the reference implementation byte for byte: tensors are laid out sorted by
dtype (in the order of its ``Dtype`` enum, largest first) and then by name, the header is
compact JSON with ``__metadata__`` first, and each entry lists dtype, shape, data_offsets.
Reading validates the header as the reference does (offsets in bounds, contiguous from 0
with no holes or overlap, sizes equal to dtype size times element count, the buffer fully
covered) and refuses a bad file with a message that names the tensor. ``load_file`` reads
only a regular file, and the data only once the header has been checked against the file's
size; ``save_file`` writes a unique temporary file and renames it over the target, so
concurrent saves to one path never leave a mix of both.

>>> fusegrad.safetensors.save_file({"w": fusegrad.ones(2, 3)}, "model.safetensors")
>>> fusegrad.safetensors.load_file("model.safetensors")["w"].shape
fusegrad.Size([2, 3])
"""

from __future__ import annotations

import json
import math
from typing import Mapping

from fusegrad import dtypes
from fusegrad.device import CPU, check_device_available
from fusegrad.device import device as Device
from fusegrad.files import (
    atomic_write,
    from_little_endian_bytes,
    open_regular,
    read_exactly,
    to_little_endian_bytes,
)
from fusegrad.tensor import Tensor

__all__ = ["save", "save_file", "load", "load_file", "SafetensorError"]

# fusegrad dtype <-> the format's dtype string.
_TO_CODE = {
    dtypes.float64: "F64", dtypes.float32: "F32", dtypes.float16: "F16", dtypes.bfloat16: "BF16",
    dtypes.int64: "I64", dtypes.int32: "I32", dtypes.int16: "I16", dtypes.int8: "I8",
    dtypes.uint8: "U8", dtypes.bool_: "BOOL",
}
_FROM_CODE = {code: dt for dt, code in _TO_CODE.items()}
# The reference implementation's Dtype enum order, which its writer sorts by (descending).
_ENUM_ORDER = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
               "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64"]
_RANK = {code: i for i, code in enumerate(_ENUM_ORDER)}
# Bytes per element of the byte-sized types (the 4- and 6-bit floats pack several per byte).
_ITEMSIZE = {"U8": 1, "I8": 1, "BOOL": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2,
             "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8,
             "U64": 8}
# The reference refuses headers above 100 MB before parsing them.
MAX_HEADER = 100_000_000


class SafetensorError(ValueError):
    """A safetensors file (or header) that breaks the format's rules."""


def _as_array(name: str, value):
    if not isinstance(value, Tensor):
        raise TypeError(f"safetensors.save: tensor {name!r} is a {type(value).__name__}, "
                        "expected a fusegrad Tensor")
    value._check_concrete("safetensors.save")
    if value.dtype not in _TO_CODE:
        raise TypeError(f"safetensors.save: tensor {name!r} has dtype {value.dtype}, which the "
                        "format does not store")
    return value._data


def _serialize(tensors: Mapping[str, Tensor], metadata: Mapping[str, str] | None) -> list:
    """The chunks of a safetensors file: header bytes then each tensor's bytes."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"safetensors.save expects a dict of name -> tensor, got "
                        f"{type(tensors).__name__}")
    for name in tensors:
        if not isinstance(name, str):
            raise TypeError(f"safetensors.save: tensor names must be strings, got {name!r}")
    if "__metadata__" in tensors:
        raise SafetensorError("'__metadata__' is reserved for the metadata and cannot name a "
                              "tensor")
    if metadata is not None:
        bad = [k for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise TypeError(f"safetensors metadata must map str to str; offending keys: {bad}")
    arrays = {name: _as_array(name, t) for name, t in tensors.items()}   # validates first
    order = sorted(tensors, key=lambda n: (-_RANK[_TO_CODE[tensors[n].dtype]], n))
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    chunks, offset = [], 0
    for name in order:
        t = tensors[name]
        data = to_little_endian_bytes(arrays[name])
        header[name] = {"dtype": _TO_CODE[t.dtype], "shape": [int(d) for d in t.shape],
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        chunks.append(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return [len(text).to_bytes(8, "little"), text, *chunks]


def save(tensors: Mapping[str, Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """The safetensors bytes of ``tensors`` (a dict of name -> tensor)."""
    return b"".join(_serialize(tensors, metadata))


def save_file(tensors: Mapping[str, Tensor], filename, metadata: Mapping[str, str] | None = None
              ) -> None:
    """Write ``tensors`` to ``filename`` in the safetensors format."""
    chunks = _serialize(tensors, metadata)
    # A unique temporary beside the target, renamed over it: concurrent saves to one path
    # leave one of them whole (never a mix of both), an interrupted one the old file.
    with atomic_write(filename) as f:
        for chunk in chunks:
            f.write(chunk)


def _header_length(buf, size: int) -> int:
    """The header length from the first 8 bytes of a file of ``size`` bytes, checked."""
    if size < 8:
        raise SafetensorError(f"safetensors file is truncated: {size} bytes, shorter than "
                              "the 8-byte header length")
    n = int.from_bytes(bytes(buf[:8]), "little")
    if n > MAX_HEADER:
        raise SafetensorError(f"safetensors header is too large ({n} bytes)")
    if 8 + n > size:
        raise SafetensorError(f"safetensors file is truncated: the header needs {8 + n} bytes and "
                              f"the file has {size}")
    return n


def _parse_header(buf, size: int | None = None) -> tuple[dict, dict | None, int]:
    """Validate the header at the start of ``buf`` for a file of ``size`` bytes (default
    ``len(buf)``; ``buf`` need hold only the header then); return (entries by name,
    metadata, buffer start)."""
    size = len(buf) if size is None else size
    n = _header_length(buf, size)
    raw = bytes(buf[8:8 + n])
    if not raw.startswith(b"{"):
        raise SafetensorError("invalid safetensors header: it does not start with '{'")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SafetensorError(f"invalid safetensors header: not UTF-8 JSON ({e})") from None
    except RecursionError:
        raise SafetensorError("invalid safetensors header: it nests too deeply") from None
    if not isinstance(header, dict):
        raise SafetensorError("invalid safetensors header: not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and (not isinstance(metadata, dict) or not all(
            isinstance(v, str) for v in metadata.values())):
        raise SafetensorError("invalid safetensors header: __metadata__ must map str to str")
    data_len = size - 8 - n
    entries = {}
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise SafetensorError(f"invalid safetensors header entry for tensor {name!r}: "
                                  f"expected dtype, shape and data_offsets, got {info!r}")
        code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(code, str) or code not in _RANK:
            raise SafetensorError(f"tensor {name!r} has unknown dtype {code!r}")
        if (not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                   and d >= 0 for d in shape)):
            raise SafetensorError(f"tensor {name!r} has an invalid shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0
                           for o in offsets) or offsets[0] > offsets[1]):
            raise SafetensorError(f"tensor {name!r} has invalid data_offsets {offsets!r}")
        entries[name] = (code, tuple(shape), tuple(offsets))
    # Contiguous from 0, no holes, no overlap, every size consistent: as the reference checks.
    expected_begin = 0
    for name, (code, shape, (begin, end)) in sorted(entries.items(), key=lambda kv: kv[1][2]):
        if begin != expected_begin:
            what = "overlaps the previous tensor" if begin < expected_begin else "leaves a hole"
            raise SafetensorError(f"tensor {name!r}: data_offsets [{begin}, {end}) {what} (the "
                                  f"previous tensor ends at {expected_begin})")
        if code in _ITEMSIZE:
            itemsize = _ITEMSIZE[code]
            if math.prod(shape) * itemsize != end - begin:
                raise SafetensorError(
                    f"tensor {name!r}: {code} with shape {list(shape)} needs "
                    f"{math.prod(shape) * itemsize} bytes but data_offsets [{begin}, {end}) hold "
                    f"{end - begin}")
        expected_begin = end
    if expected_begin != data_len:
        if expected_begin > data_len:
            raise SafetensorError(f"safetensors file is truncated: the tensors need {expected_begin} "
                                  f"bytes of data and the file has {data_len}")
        raise SafetensorError(f"safetensors file has {data_len - expected_begin} bytes after its "
                              "last tensor: the buffer must be fully indexed")
    return entries, metadata, 8 + n


def load(data: bytes) -> dict[str, Tensor]:
    """The tensors in safetensors ``data`` (bytes), by name in the file's order."""
    entries, _, start = _parse_header(data)
    view = memoryview(data)
    out = {}
    for name, (code, shape, (begin, end)) in entries.items():
        dt = _FROM_CODE.get(code)
        if dt is None:
            raise SafetensorError(f"tensor {name!r} has dtype {code}, which fusegrad does not "
                                  "support")
        out[name] = Tensor._wrap(from_little_endian_bytes(view[start + begin:start + end], dt,
                                                          shape), dt)
    return out


def load_file(filename, device="cpu") -> dict[str, Tensor]:
    """The tensors in the safetensors file ``filename``, by name."""
    dev = Device(device)
    if dev != CPU:
        check_device_available(dev)
    return load(_read_file(filename, whole=True))


def load_metadata(filename) -> dict[str, str] | None:
    """The ``__metadata__`` map of a safetensors file (None when it has none)."""
    return _parse_header(*_read_file(filename, whole=False))[1]


def _read_file(filename, whole: bool):
    """A safetensors file's bytes (``whole``), or its header's bytes and the file's size,
    read within bounds: only a regular file, and the data only once the header has been
    checked against the file's size."""
    f, size = open_regular(filename, SafetensorError)
    with f:
        head = read_exactly(f, 8)
        head += read_exactly(f, _header_length(head, size))
        if not whole:
            return head, size
        _parse_header(head, size)        # declared sizes against the real one, before reading
        return head + read_exactly(f, size - len(head))
