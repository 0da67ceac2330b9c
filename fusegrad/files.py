"""Writing files atomically and reading them within bounds: what every saver and loader of
fusegrad (checkpoints, safetensors, AOT artifacts, the kernel cache) shares.

- :func:`atomic_write` writes through a temporary file with a unique name in the target's
  folder (so the rename stays on one file system), flushes it to disk and renames it over
  the target: a reader sees the old file or the new one, never half of one, however many
  processes save to the same path at once. The temporary is removed on any failure,
  KeyboardInterrupt included. A writer killed outright (SIGKILL, a power cut) leaves its
  temporary behind under a name no loader opens; the next save to the same path removes
  such temporaries once they are an hour old.
- :func:`open_regular` opens a file for reading only if it is a regular file (a FIFO,
  ``/dev/zero`` or a directory is refused at once, without blocking), and tells its size,
  so that a loader checks the sizes its header declares against the real size before it
  reads more than the header; :func:`read_exactly` then reads what was declared, in chunks.
- :func:`to_little_endian_bytes` and :func:`from_little_endian_bytes`: tensor data as the
  files store it, little-endian whatever the machine's byte order.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
import time
from typing import BinaryIO, Callable, Iterator

import numpy as np

from fusegrad import dtypes

__all__ = ["atomic_write", "open_regular", "read_exactly", "remaining_size", "TMP_SUFFIX",
           "STALE_TMP_S", "to_little_endian_bytes", "from_little_endian_bytes"]

TMP_SUFFIX = ".tmp"
# A temporary of a save to the same path untouched this long belongs to a dead writer (a live
# one writes continuously, which keeps its mtime fresh).
STALE_TMP_S = 3600.0
_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_BINARY", 0))
_CHUNK = 1 << 24


def _tmp_prefix(path: str) -> str:
    return "." + os.path.basename(path) + "."


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, *, durable: bool = True) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new contents to; when the block ends without an
    exception the contents replace ``path`` in one rename, else ``path`` is left as it was
    and the temporary is removed.

    ``durable`` flushes the file (and then its folder) to disk before and after the rename,
    so that a crash right after a save cannot leave an empty or partial file under the
    target's name; the kernel cache, whose entries are checked and rebuilt, skips it.

    >>> with atomic_write("weights.bin") as f:     # doctest: +SKIP
    ...     f.write(data)
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=_tmp_prefix(path), suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    finally:
        if tmp is not None:               # any failure, KeyboardInterrupt included
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    if durable:
        _fsync_folder(folder)
        _remove_stale_temporaries(folder, path)


def _fsync_folder(folder: str) -> None:
    """Make the rename itself durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_stale_temporaries(folder: str, path: str) -> None:
    """Delete temporaries of saves to ``path`` that dead writers left (an hour untouched)."""
    prefix, now = _tmp_prefix(path), time.time()
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix) and n.endswith(TMP_SUFFIX)]
    except OSError:
        return
    for name in names:
        full = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime > STALE_TMP_S:
                os.unlink(full)


def open_regular(path: str | os.PathLike, error: Callable[[str], Exception]) -> tuple[BinaryIO, int]:
    """``path`` opened for binary reading, and its size in bytes; raises ``error(message)``
    unless it is a regular file. Opening never blocks (a FIFO with no writer is refused, not
    waited for); ``OSError`` for a missing or unreadable file propagates as ``open`` raises it."""
    fd = os.open(os.fspath(path), _READ_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else
                    "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else
                    "a character device" if stat.S_ISCHR(st.st_mode) else
                    "a block device" if stat.S_ISBLK(st.st_mode) else
                    "a socket" if stat.S_ISSOCK(st.st_mode) else "not a file")
            raise error(f"{os.fspath(path)!s} is {kind}, not a regular file: only regular files "
                        "are read, since their size bounds what a read can take")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    return f, st.st_size


def read_exactly(f: BinaryIO, n: int) -> bytes:
    """``n`` bytes from ``f``, read in chunks (so a wrong ``n`` costs no allocation up front);
    fewer only when the file ends first."""
    chunks, left = [], n
    while left > 0:
        chunk = f.read(min(left, _CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def remaining_size(f) -> int | None:
    """The bytes left in file object ``f`` when that can be known without reading (a regular
    file behind it, or a seekable stream); None otherwise (a pipe, a socket)."""
    try:
        fileno = f.fileno()
    except (AttributeError, OSError, ValueError):
        fileno = None
    try:
        if fileno is not None:
            st = os.fstat(fileno)
            if not stat.S_ISREG(st.st_mode):
                return None
        if f.seekable():
            here = f.tell()
            end = f.seek(0, os.SEEK_END)
            f.seek(here)
            return max(0, end - here)
    except (AttributeError, OSError, ValueError):
        return None
    return None


def to_little_endian_bytes(array: np.ndarray) -> bytes:
    """The C-order bytes of ``array`` in little-endian order (the byte order of checkpoints
    and safetensors files on any machine)."""
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
