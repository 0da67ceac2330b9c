"""The on-disk kernel cache (fusegrad.runtime.jit): a second process loads the machine code
the first one compiled; a corrupt entry is rebuilt; ``FUSEGRAD_CACHE_DIR=off`` disables it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fusegrad as fg
from fusegrad import config as fg_config
from fusegrad.runtime import jit

# Compiles one function, checks its result and prints the jit counters as JSON.
PROGRAM = """
import json, numpy as np, fusegrad as fg
from fusegrad.runtime import jit
f = fg.compile(lambda x, y: (x * y + 1).exp().sum(-1))
x = fg.arange(12.0).reshape(3, 4) / 10
out = f(x, x)
assert np.allclose(out.numpy(), np.exp(x.numpy() * x.numpy() + 1).sum(-1), rtol=1e-5)
print(json.dumps({k: jit.stats[k] for k in ("compiles", "disk_hits", "memory_hits")}))
"""


def run_fresh_process(cache_dir: Path) -> dict:
    env = dict(os.environ, FUSEGRAD_CACHE_DIR=str(cache_dir))
    env.pop("FUSEGRAD_DEBUG", None)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_here(cache_dir: Path, monkeypatch) -> dict:
    """PROGRAM in this process, with an empty memory cache; the counters it moved."""
    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(cache_dir))
    fg_config.reload()
    jit.clear_memory_cache()
    before = dict(jit.stats)
    exec(PROGRAM, {"print": lambda *a: None})
    return {k: jit.stats[k] - before[k] for k in ("compiles", "disk_hits", "memory_hits")}


def cache_files(cache_dir: Path) -> list[Path]:
    return sorted(p for p in cache_dir.rglob("*") if p.is_file())


@pytest.mark.slow
def test_second_process_loads_from_disk_and_corrupt_entries_are_rebuilt(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = run_fresh_process(cache)
    assert first["compiles"] >= 1 and first["disk_hits"] == 0
    files = [p for p in cache_files(cache) if p.name != "usage"]     # the eviction counter
    assert files and all(p.suffix == ".o" for p in files), files

    second = run_fresh_process(cache)
    assert second["disk_hits"] >= 1 and second["compiles"] == 0

    # A flipped byte (the digest no longer matches) and a truncated file: both rebuilt.
    blob = files[0].read_bytes()
    for broken in (blob[:-10] + bytes([blob[-10] ^ 0xFF]) + blob[-9:], blob[: len(blob) // 2]):
        files[0].write_bytes(broken)
        rebuilt = run_here(cache, monkeypatch)
        assert rebuilt["compiles"] == 1 and rebuilt["disk_hits"] == 0
        assert files[0].read_bytes() == blob
    assert run_here(cache, monkeypatch) == {"compiles": 0, "disk_hits": 1, "memory_hits": 0}
    assert not list(cache.rglob("*.tmp"))                  # atomic writes leave no temporaries


def test_cache_dir_off_disables_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", "off")
    monkeypatch.setenv("HOME", str(tmp_path))              # the default location, if used
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fg_config.reload()
    assert fg_config.config.cache_dir is None
    jit.clear_memory_cache()
    before = dict(jit.stats)
    fg.compile(lambda x: (x - 3).abs().exp())(fg.ones(5))
    assert jit.stats["compiles"] == before["compiles"] + 1
    assert jit.stats["disk_hits"] == before["disk_hits"]
    assert cache_files(tmp_path) == []


def test_memory_cache_shares_machine_code_between_programs():
    jit.clear_memory_cache()
    before = dict(jit.stats)
    for _ in range(2):
        fg.compile(lambda x: x * 5 - 1)(fg.ones(7))
    assert jit.stats["compiles"] + jit.stats["disk_hits"] == \
        before["compiles"] + before["disk_hits"] + 1
    assert jit.stats["memory_hits"] == before["memory_hits"] + 1


def test_tests_never_write_to_the_home_cache():
    home_default = os.path.join(os.path.expanduser("~"), ".cache", "fusegrad")
    assert fg_config.config.cache_dir is not None
    assert not os.path.abspath(fg_config.config.cache_dir).startswith(home_default)


# A training step of symbolic batch size, its reductions over the batch included (they read
# the sizes buffer): run at three batch sizes; the losses and the jit counters it moved.
SYMBOLIC_STEP = """
import numpy as np, fusegrad as fg
fg.manual_seed(0)
model = fg.nn.Sequential(fg.nn.Linear(6, 8), fg.nn.ReLU(), fg.nn.Linear(8, 3))
opt = fg.optim.SGD(model.parameters(), lr=0.1)

@fg.compile(dynamic=True)
def step(x, y):
    opt.zero_grad()
    loss = fg.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss

rng = np.random.default_rng(0)
losses = [step(fg.tensor(rng.standard_normal((b, 6), dtype=np.float32)),
               fg.tensor(rng.integers(0, 3, b))).item() for b in (5, 9, 2)]
"""


def test_kernels_of_symbolic_sizes_are_loaded_from_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(tmp_path / "cache"))
    fg_config.reload()
    runs = []
    for _ in range(2):
        jit.clear_memory_cache()
        before = dict(jit.stats)
        scope: dict = {}
        exec(SYMBOLIC_STEP, scope)
        runs.append(({k: jit.stats[k] - before[k] for k in ("compiles", "disk_hits")},
                     scope["losses"]))
    (first, losses), (second, again) = runs
    assert first["compiles"] >= 3 and first["disk_hits"] == 0
    # (A kernel whose machine code another kernel of the first run shared was not compiled
    # for it, but has its own entry: the second run loads at least what the first compiled.)
    assert second["compiles"] == 0 and second["disk_hits"] >= first["compiles"]
    assert again == losses                      # the same machine code on the same numbers
