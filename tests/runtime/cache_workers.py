"""Worker functions for the concurrent disk-cache tests (importable by spawned processes)."""

from __future__ import annotations

import hashlib
import os


def payload(key: str) -> bytes:
    """The deterministic object code stand-in for ``key``: sizes vary from 1 KB to ~130 KB,
    so that a torn write would show as a short or mixed entry."""
    size = 1000 + int(key[:4], 16) * 2
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // 32 + 1))[:size]


def write_and_read(cache_dir: str, keys: list[str], rounds: int) -> dict:
    """Write and read ``keys`` ``rounds`` times; every read after this process's own write must
    give the exact payload. Returns counts of what was seen."""
    from fusegrad.runtime import disk_cache
    seen = {"bad": 0, "missing": 0, "ok": 0}
    for _ in range(rounds):
        for key in keys:
            disk_cache.write_entry(cache_dir, key, payload(key), 1 << 30, 1e9)
            got = disk_cache.read_entry(cache_dir, key, 1 << 30)
            if got is None:
                seen["missing"] += 1
            elif got != payload(key):
                seen["bad"] += 1
            else:
                seen["ok"] += 1
    seen["rejected"] = disk_cache.stats["rejected"]
    return seen


def compile_programs(cache_dir: str, scales: list[float]) -> dict:
    """Compile one kernel per scale (the scale is baked into the kernel as a constant, so
    each scale is a distinct kernel) and one shared by all workers; check every result."""
    os.environ["FUSEGRAD_CACHE_DIR"] = cache_dir
    import numpy as np

    import fusegrad as fg
    from fusegrad import config
    from fusegrad.runtime import disk_cache, jit
    config.reload()
    x = fg.arange(24.0).reshape(4, 6) / 10
    wrong = 0
    for s in scales:
        got = fg.compile(lambda t, s=s: (t * s + 1).tanh().sum(-1))(x).numpy()
        want = np.tanh(x.numpy() * np.float32(s) + 1).sum(-1)
        wrong += not np.allclose(got, want, rtol=1e-5, atol=1e-6)
        shared = fg.compile(lambda t: (t - 0.5).exp() * 3)(x).numpy()
        wrong += not np.allclose(shared, np.exp(x.numpy() - 0.5) * 3, rtol=1e-5)
    return {"wrong": wrong, "rejected": disk_cache.stats["rejected"],
            "compiles": jit.stats["compiles"], "disk_hits": jit.stats["disk_hits"]}
