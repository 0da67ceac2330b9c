"""The file format of ahead-of-time artifacts: one versioned, checksummed file, no pickle.

Layout (every integer little endian)::

    0   magic           8 bytes   b"FGAO\\r\\n\\x1a\\n" (a text-mode copy or a truncated first
                                  line changes it, as PNG's signature does)
    8   format version  u32       FORMAT_VERSION; another value is refused before anything
                                  else is read
    12  header length   u32       bytes of the JSON header that follows
    16  file length     u64       the whole file, checksum included (truncation is named)
    24  header          JSON      utf-8; versions, target, the section table
    ..  sections        bytes     in the order of the section table, back to back
    -32 checksum        32 bytes  SHA-256 of every byte before it

The header is a JSON object: ``format`` (the version again), ``fusegrad`` (the version
that wrote it: object code and plan are only read by that version), ``codegen`` (the first
16 hex digits of the digest of the code generator's source, which must match too), ``llvm``,
``triple``,
``cpu`` (the LLVM CPU name the code was generated for), ``features`` (the CPU features the
code may use, LLVM's names without ``+``) and ``sections``: a list of ``{"name", "offset",
"length"}`` with offsets counted from the end of the header. The sections are ``graph``
(the IR's text form), ``plan`` (JSON: signature, state, kernels, memory plan), ``code``
(the kernels' object code, back to back; the plan gives each kernel's range) and ``state``
(raw little-endian tensor data; the plan gives each tensor's dtype, shape and range).

Nothing is interpreted before the checksum over the whole file has been verified, except
the fixed-size prefix that says how long the file should be and which format it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass

from fusegrad.files import open_regular, read_exactly

__all__ = ["ArtifactError", "FORMAT_VERSION", "MAGIC", "SECTIONS", "encode", "decode",
           "Decoded", "read_file"]

MAGIC = b"FGAO\r\n\x1a\n"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sIIQ")           # magic, format version, header length, file length
_DIGEST = 32
SECTIONS = ("graph", "plan", "code", "state")
# A header is a few hundred bytes; a bound keeps a corrupt length from reading gigabytes.
_MAX_HEADER = 1 << 20


class ArtifactError(Exception):
    """An ahead-of-time artifact that cannot be used here, and why.

    ``reason`` is one of ``"truncated"``, ``"corrupt"``, ``"format"`` (not an artifact, or
    another format version), ``"version"`` (another fusegrad version), ``"target"`` (built
    for another architecture or for CPU features this machine lacks), ``"plan"`` (the plan
    does not match the graph) or ``"signature"`` (a call with inputs of the wrong number,
    shape or dtype)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class Decoded:
    """A verified artifact file: its header and its sections' bytes."""

    header: dict
    sections: dict[str, bytes]


def encode(header: dict, sections: dict[str, bytes]) -> bytes:
    """The file bytes of ``header`` (without its section table, which is added here) and
    ``sections`` (each of :data:`SECTIONS`)."""
    table, offset = [], 0
    for name in SECTIONS:
        table.append({"name": name, "offset": offset, "length": len(sections[name])})
        offset += len(sections[name])
    head = json.dumps({**header, "format": FORMAT_VERSION, "sections": table},
                      sort_keys=True).encode()
    total = _PREFIX.size + len(head) + offset + _DIGEST
    body = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(head), total) + head + \
        b"".join(sections[name] for name in SECTIONS)
    return body + hashlib.sha256(body).digest()


def read_file(path: str | os.PathLike) -> bytes:
    """The bytes of the artifact at ``path``, read within bounds: only a regular file, and
    only once its fixed header's file length has been checked against the file's size (a
    FIFO, ``/dev/zero`` or a file shorter or longer than it says is refused unread)."""
    what = os.fspath(path)
    f, size = open_regular(path, lambda message: ArtifactError("format", message))
    with f:
        prefix = read_exactly(f, _PREFIX.size)
        total = _check_prefix(prefix, what) if len(prefix) == _PREFIX.size else size
        _check_length(size, total, what)
        return prefix + read_exactly(f, total - len(prefix))


def _check_prefix(prefix: bytes, what: str) -> int:
    """The file length the fixed header announces, once magic and version are right."""
    magic, version, _, total = _PREFIX.unpack_from(prefix)
    if magic != MAGIC:
        raise ArtifactError("format", f"{what} is not a fusegrad AOT artifact (its first bytes "
                            f"are {magic!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise ArtifactError("format", f"{what} has AOT format version {version}; this fusegrad "
                            f"reads version {FORMAT_VERSION} only: rebuild it with "
                            "fusegrad.aot.compile")
    return total


def _check_length(size: int, total: int, what: str) -> None:
    if size < total:
        raise ArtifactError("truncated", f"{what} is truncated: {size} bytes of the "
                            f"{total} its header announces")
    if size > total:
        raise ArtifactError("corrupt", f"{what} has {size - total} bytes after its end "
                            f"({total} bytes announced)")


def decode(blob: bytes, what: str = "artifact") -> Decoded:
    """Check ``blob`` (magic, format version, length, checksum, header, section table) and
    split it; raise :class:`ArtifactError` saying what is wrong."""
    if len(blob) < _PREFIX.size:
        if MAGIC.startswith(blob[:len(MAGIC)]):
            raise ArtifactError("truncated", f"{what} is truncated: {len(blob)} bytes, shorter "
                                "than the fixed header")
        raise ArtifactError("format", f"{what} is not a fusegrad AOT artifact (too short)")
    total = _check_prefix(blob, what)
    head_len = _PREFIX.unpack_from(blob)[2]
    _check_length(len(blob), total, what)
    if head_len > _MAX_HEADER or _PREFIX.size + head_len + _DIGEST > total:
        raise ArtifactError("corrupt", f"{what} has an impossible header length {head_len}")
    body, digest = blob[:-_DIGEST], blob[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise ArtifactError("corrupt", f"{what} is corrupt: its SHA-256 checksum does not match "
                            "its contents (a changed or damaged byte)")
    try:
        header = json.loads(body[_PREFIX.size:_PREFIX.size + head_len])
        if not isinstance(header, dict) or header.get("format") != FORMAT_VERSION:
            raise ValueError("format field")
        table = header["sections"]
        if not isinstance(table, list):
            raise ValueError("section table")
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise ArtifactError("corrupt", f"{what} has an unreadable header ({e})") from None
    data = body[_PREFIX.size + head_len:]
    sections, expect = {}, 0
    for entry, name in zip(table, SECTIONS):
        if not isinstance(entry, dict) or entry.get("name") != name or \
                entry.get("offset") != expect or not isinstance(entry.get("length"), int) or \
                entry["length"] < 0:
            raise ArtifactError("corrupt", f"{what} has a bad section table entry {entry!r}")
        sections[name] = data[expect:expect + entry["length"]]
        expect += entry["length"]
    if len(table) != len(SECTIONS) or expect != len(data):
        raise ArtifactError("corrupt", f"{what}'s sections do not cover its data")
    return Decoded(header, sections)
