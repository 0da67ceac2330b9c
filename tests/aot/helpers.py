"""Small models and training steps shared by the AOT tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

import fusegrad as fg
from fusegrad.aot import format

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_FRESH = """
import json, numpy as np
import fusegrad as fg
import fusegrad.tracer.trace as trace, fusegrad.runtime.jit as jit
def refuse(*a, **k):
    raise AssertionError("traced or compiled while loading")
trace._trace = refuse
jit._compile_object = refuse
run = fg.aot.load({path!r})
d = np.load({data!r})
arrays = [d[f"arr_{{i}}"] for i in range(len(d.files))]
losses = [run(fg.tensor(arrays[i]), fg.tensor(arrays[i + 1])).item()
          for i in range(0, len(arrays), 2)]
np.savez({state!r}, **run.state)
print(json.dumps({{"losses": losses, "compiles": jit.stats["compiles"]}}))
"""


def with_plan(blob: bytes, change) -> bytes:
    """``blob`` with ``change(plan)`` applied to its plan and the checksum recomputed."""
    decoded = format.decode(blob)
    plan = json.loads(decoded.sections["plan"])
    change(plan)
    sections = dict(decoded.sections, plan=json.dumps(plan).encode())
    header = {k: v for k, v in decoded.header.items() if k not in ("sections", "format")}
    return format.encode(header, sections)


def train_in_fresh_process(path, tmp_path, arrays: list) -> tuple[list, int, dict]:
    """Load the artifact at ``path`` in a new interpreter that cannot trace or run LLVM, with
    an empty kernel cache (the artifact alone holds all code), and call it on consecutive
    pairs of ``arrays``: its losses, how many kernels it compiled, and its state after."""
    data, state = tmp_path / "data.npz", tmp_path / "state.npz"
    np.savez(data, *arrays)
    env = dict(os.environ, PYTHONPATH=ROOT, FUSEGRAD_CACHE_DIR=str(tmp_path / "empty-cache"))
    code = _FRESH.format(path=str(path), data=str(data), state=str(state))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["losses"], result["compiles"], dict(np.load(state))


def mlp_step(optimizer: str = "sgd", seed: int = 0, sizes=(12, 16, 5)):
    """A small MLP training step (zero_grad, forward, cross-entropy, backward, step), its
    model and optimizer, and example inputs."""
    fg.manual_seed(seed)
    model = fg.nn.Sequential(fg.nn.Linear(sizes[0], sizes[1]), fg.nn.ReLU(),
                             fg.nn.Linear(sizes[1], sizes[2]))
    if optimizer == "sgd":
        opt = fg.optim.SGD(model.parameters(), lr=0.1)
    elif optimizer == "adamw":
        opt = fg.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    else:
        opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = fg.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    rng = np.random.default_rng(seed)
    x = fg.tensor(rng.standard_normal((8, sizes[0])).astype(np.float32))
    y = fg.tensor(rng.integers(0, sizes[-1], 8))
    return step, model, opt, x, y


def batches(n: int, sizes=(12, 16, 5), seed: int = 1):
    rng = np.random.default_rng(seed)
    return [(fg.tensor(rng.standard_normal((8, sizes[0])).astype(np.float32)),
             fg.tensor(rng.integers(0, sizes[-1], 8))) for _ in range(n)]
