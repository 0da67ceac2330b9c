"""The on-disk kernel cache: object code by key, safe against what a shared folder can hold.

Layout: ``<cache_dir>/<key[:2]>/<key>.o``. An entry is

    FGOBJ2\\n <key (64 hex)> \\n <length: 8 bytes, little endian> <sha256 of the payload> <payload>

and is never unpickled. What the folder may contain is not trusted:

- an entry is opened with ``O_NOFOLLOW | O_NONBLOCK`` and accepted only if ``fstat`` says it
  is a regular file, so a symlink (to ``/dev/zero``, say) or a FIFO at its path is a miss, not
  an endless read or a hang;
- a read is bounded by the length in the header, which must match the file's size and stay
  under the cache's byte budget; a wrong key, length or checksum is a miss, and the caller
  rebuilds and rewrites the entry;
- a write goes to a temporary file in the entry's folder and is renamed over the entry
  (atomic: a reader sees the old file or the new one, never half of one); the temporary is
  removed on any failure, e.g. a directory sitting at the entry's path.

Eviction (``FUSEGRAD_CACHE_MAX_BYTES``, default 256 MiB; ``FUSEGRAD_CACHE_MAX_AGE_DAYS``,
default 30): every write adds its size to a small shared counter file (``usage``, updated
under an ``flock``), so the check costs one locked read-modify-write of a few bytes, not a
directory scan. When the counter passes the budget, or a day after the last sweep, one
process sweeps: it measures the folder, deletes entries unused for longer than the maximum
age and then the least recently used ones (a disk hit refreshes an entry's mtime) until the
cache is under 3/4 of the budget, deletes temporaries abandoned for over an hour, and
rewrites the counter with the measured total. Concurrent processes stay safe: they never
write a name another process reads from except by rename, and an entry deleted while another
process reads it stays readable through that process's open descriptor.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import time

try:                                  # POSIX; elsewhere the counter is updated unlocked
    import fcntl
except ImportError:                   # pragma: no cover
    fcntl = None

from fusegrad.files import STALE_TMP_S as _STALE_TMP_S
from fusegrad.files import TMP_SUFFIX as _TMP_SUFFIX
from fusegrad.files import atomic_write

__all__ = ["read_entry", "write_entry", "entry_path", "sweep", "stats"]

MAGIC = b"FGOBJ2\n"
_KEY_LEN = 64                                     # sha256 hex digest
_HEADER = len(MAGIC) + _KEY_LEN + 1 + 8 + 32
_SUFFIX = ".o"
_SWEEP_EVERY_S = 86400.0                          # age eviction at least daily
_LOW_WATER = 0.75                                 # a sweep leaves the cache at this fraction
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))

stats = {"evicted": 0, "sweeps": 0, "rejected": 0}


def entry_path(cache_dir: str, key: str) -> str:
    """Where the entry for ``key`` lives."""
    return os.path.join(cache_dir, key[:2], key + _SUFFIX)


def _header(key: str, length: int, digest: bytes) -> bytes:
    return MAGIC + key.encode() + b"\n" + struct.pack("<Q", length) + digest


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None                   # shorter than its header says: truncated
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_entry(cache_dir: str, key: str, max_bytes: int) -> bytes | None:
    """The payload stored for ``key``, or None when there is no valid entry (missing, not a
    regular file, a symlink, truncated, corrupt, or larger than ``max_bytes``)."""
    if len(key) != _KEY_LEN:
        raise ValueError(f"disk cache keys are sha256 hex digests, got {key!r}")
    path = entry_path(cache_dir, key)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None                       # missing, a symlink (ELOOP), unreadable
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < _HEADER or st.st_size > max_bytes:
            stats["rejected"] += 1
            return None
        head = _read_exactly(fd, _HEADER)
        if head is None or not head.startswith(MAGIC + key.encode() + b"\n"):
            stats["rejected"] += 1
            return None
        (length,) = struct.unpack("<Q", head[-40:-32])
        if _HEADER + length != st.st_size:
            stats["rejected"] += 1
            return None
        payload = _read_exactly(fd, length)
        if payload is None or hashlib.sha256(payload).digest() != head[-32:]:
            stats["rejected"] += 1
            return None               # corrupt: the caller rebuilds and rewrites it
        try:
            os.utime(fd if os.utime in os.supports_fd else path)   # recently used (LRU)
        except OSError:
            pass
        return payload
    except OSError:
        return None
    finally:
        os.close(fd)


def write_entry(cache_dir: str, key: str, payload: bytes, max_bytes: int,
                max_age_s: float) -> bool:
    """Store ``payload`` for ``key`` atomically; evict old entries when the cache is over
    its budget. Returns whether the entry was written. Never raises for a cache folder that
    cannot take the entry (read-only, full, a directory at the entry's path): that only costs
    a recompile next time."""
    if len(key) != _KEY_LEN:
        raise ValueError(f"disk cache keys are sha256 hex digests, got {key!r}")
    blob = _header(key, len(payload), hashlib.sha256(payload).digest()) + payload
    if len(blob) > max_bytes:
        return False                      # would be evicted at once
    path = entry_path(cache_dir, key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # Not flushed to disk: an entry a crash tore is refused by its checksum and rebuilt.
        with atomic_write(path, durable=False) as f:
            f.write(blob)
    except OSError:
        return False
    _account(cache_dir, len(blob), max_bytes, max_age_s)
    return True


# --------------------------------------------------------------------------- eviction


def _account(cache_dir: str, added: int, max_bytes: int, max_age_s: float) -> None:
    """Add ``added`` bytes to the shared usage counter; sweep when it is over budget or the
    last sweep is a day old. The counter file holds ``<bytes> <time of last sweep>``."""
    try:
        fd = os.open(os.path.join(cache_dir, "usage"),
                     os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError:
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        used, last_sweep = _parse_usage(os.read(fd, 64))
        used += added
        now = time.time()
        if used > max_bytes or now - last_sweep > _SWEEP_EVERY_S:
            # Under the lock: one process sweeps, the others wait for its total.
            used = sweep(cache_dir, max_bytes, max_age_s)
            last_sweep = now
        text = f"{used} {last_sweep:.0f}".encode().ljust(32)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, text)
        os.ftruncate(fd, len(text))
    except OSError:
        pass
    finally:
        os.close(fd)                      # releases the lock


def _parse_usage(raw: bytes) -> tuple[int, float]:
    try:
        used, last = raw.split()[:2]
        return max(0, int(used)), float(last)
    except ValueError:
        return 0, 0.0                     # new or garbled: a sweep measures the truth


def sweep(cache_dir: str, max_bytes: int, max_age_s: float) -> int:
    """Evict entries older than ``max_age_s``, then the least recently used ones until the
    cache holds at most 3/4 of ``max_bytes``; remove abandoned temporaries. Returns the bytes
    the remaining entries hold."""
    stats["sweeps"] += 1
    now = time.time()
    entries: list[tuple[float, int, str]] = []
    try:
        shards = list(os.scandir(cache_dir))
    except OSError:
        return 0
    for shard in shards:
        if len(shard.name) != 2 or not shard.is_dir(follow_symlinks=False):
            continue
        try:
            files = list(os.scandir(shard.path))
        except OSError:
            continue
        for f in files:
            try:
                st = f.stat(follow_symlinks=False)
            except OSError:
                continue
            if f.name.endswith(_TMP_SUFFIX):
                if now - st.st_mtime > _STALE_TMP_S:
                    _remove(f.path)
                continue
            if not f.name.endswith(_SUFFIX) or not stat.S_ISREG(st.st_mode):
                continue
            if now - st.st_mtime > max_age_s:
                _remove(f.path)
                stats["evicted"] += 1
                continue
            entries.append((st.st_mtime, st.st_size, f.path))
    total = sum(size for _, size, _ in entries)
    target = int(max_bytes * _LOW_WATER)
    entries.sort()                        # oldest (least recently used) first
    for _, size, path in entries:
        if total <= target:
            break
        if _remove(path):
            stats["evicted"] += 1
        total -= size
    return total


def _remove(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False
