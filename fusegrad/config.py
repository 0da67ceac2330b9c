"""Configuration read from the environment, in one place.

``FUSEGRAD_DEBUG``: 1 prints one line per compile, 2 one line per kernel launch, 3 the IR
after each pass, 4 the generated LLVM IR. ``FUSEGRAD_DUMP_DIR``: write the IR after each
pass there. ``FUSEGRAD_VERIFY``: verify the IR after every pass (on in the test suite).
``FUSEGRAD_NUM_THREADS``: kernel threads (default: the number of cores).
``FUSEGRAD_CACHE_DIR``: the on-disk kernel cache (default under the user's cache folder;
``0`` or ``off`` disables it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _cache_dir() -> str | None:
    value = os.environ.get("FUSEGRAD_CACHE_DIR")
    if value is not None:
        return None if value.lower() in ("", "0", "off", "none") else value
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fusegrad")


@dataclass
class Config:
    debug: int
    dump_dir: str | None
    verify: bool
    num_threads: int
    cache_dir: str | None

    @classmethod
    def from_env(cls) -> "Config":
        return cls(
            debug=_int("FUSEGRAD_DEBUG", 0),
            dump_dir=os.environ.get("FUSEGRAD_DUMP_DIR") or None,
            verify=os.environ.get("FUSEGRAD_VERIFY", "0") not in ("", "0", "false"),
            num_threads=max(1, _int("FUSEGRAD_NUM_THREADS", os.cpu_count() or 1)),
            cache_dir=_cache_dir(),
        )


config = Config.from_env()


def reload() -> Config:
    """Re-read the environment (tests change it)."""
    global config
    new = Config.from_env()
    for field in new.__dataclass_fields__:
        setattr(config, field, getattr(new, field))
    return config
