"""Ahead-of-time artifacts against ``fusegrad.compile``: what a fresh process pays before
its first training step.

Workloads (from ``bench_training.py``): ``mlp-sgd`` (784-256-256-10 MLP, batch 128, SGD) and
``gpt`` (the char transformer of ``examples/char_transformer.py``, batch 16, AdamW). Every
figure comes from a fresh process, one thread (``FUSEGRAD_NUM_THREADS=1``):

- ``fg.compile, empty cache``: the first call (trace, passes, LLVM, run) with
  ``FUSEGRAD_CACHE_DIR`` an empty folder, and the second call (a step whose first call made
  optimizer state compiles again: AdamW's steady step);
- ``fg.compile, warm cache``: the same in a second process on the same folder (kernels'
  object code read from disk; tracing, passes and fusion still run);
- ``aot``: ``fusegrad.aot.load`` of the saved artifact (verify, parse, plan, link) and its
  first and second calls; the artifact's size and the build time (in the parent process).

``import fusegrad`` itself is reported apart (it is the same for every row). Run
``python benchmarks/bench_aot.py [--only mlp-sgd,gpt] [--repeat 3]``; each figure is the
median over ``--repeat`` fresh processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TAG = "RESULT "


def _setup(workload: str):
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import bench_training as bt
    import numpy as np

    import fusegrad as fg
    fg.manual_seed(0)
    model, opt = bt.build(fg, workload, bt.GPT_FULL, None)
    xn, yn = bt.make_data(np, workload, bt.GPT_FULL)
    return fg, bt.training_step(fg, workload, model, opt), fg.tensor(xn), fg.tensor(yn)


def probe(mode: str, workload: str, path: str) -> dict:
    """One measurement in this (fresh) process."""
    t0 = time.perf_counter()
    import fusegrad as fg
    out = {"import_s": time.perf_counter() - t0}
    if mode == "compile":
        fg, step, x, y = _setup(workload)
        step = fg.compile(step)
    else:
        t = time.perf_counter()
        step = fg.aot.load(path)
        out["load_s"] = time.perf_counter() - t
        _, _, x, y = _setup(workload)
    for key in ("first_s", "second_s"):
        t = time.perf_counter()
        step(x, y).item()
        out[key] = time.perf_counter() - t
    return out


def build(workload: str, path: str) -> dict:
    fg, step, x, y = _setup(workload)
    t = time.perf_counter()
    art = fg.aot.compile(step, x, y)
    build_s = time.perf_counter() - t
    art.save(path)
    kernels = sum(len(p["kernels"]) for p in art.plan["programs"])
    return {"build_s": build_s, "bytes": os.path.getsize(path), "kernels": kernels,
            "programs": len(art.plan["programs"])}


def _spawn(args: list[str], env: dict) -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), *args], env=env,
                         capture_output=True, text=True, check=True)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith(TAG))
    return json.loads(line[len(TAG):])


def _median(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def measure(workload: str, repeat: int) -> list[tuple[str, dict]]:
    env = dict(os.environ, FUSEGRAD_NUM_THREADS="1", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", PYTHONPATH=ROOT)
    cold, warm, aot = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{workload}.fgaot")
        built = _spawn(["--build", workload, path], dict(env, FUSEGRAD_CACHE_DIR="off"))
        for r in range(repeat):
            cache = os.path.join(tmp, f"cache{r}")
            os.mkdir(cache)
            cold.append(_spawn(["--probe", "compile", workload, ""],
                               dict(env, FUSEGRAD_CACHE_DIR=cache)))
            warm.append(_spawn(["--probe", "compile", workload, ""],
                               dict(env, FUSEGRAD_CACHE_DIR=cache)))
            aot.append(_spawn(["--probe", "aot", workload, path],
                              dict(env, FUSEGRAD_CACHE_DIR="off")))
    return [("fg.compile, empty cache", _median(cold)), ("fg.compile, warm cache", _median(warm)),
            ("aot load", dict(_median(aot), **built))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="mlp-sgd,gpt")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--probe", nargs=3, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--build", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(TAG + json.dumps(probe(*args.probe)))
        return
    if args.build:
        print(TAG + json.dumps(build(*args.build)))
        return
    print(f"{'workload':<9} {'system':<24} {'import':>7} {'load':>7} {'1st call':>9} "
          f"{'2nd call':>9} {'to 1st step':>11} {'file':>9}")
    for workload in args.only.split(","):
        for name, r in measure(workload, args.repeat):
            load = r.get("load_s", 0.0)
            size = f"{r['bytes'] / 1e6:.2f} MB" if "bytes" in r else ""
            print(f"{workload:<9} {name:<24} {r['import_s']:>6.2f}s "
                  f"{(f'{load * 1e3:.0f}ms' if load else '-'):>7} {r['first_s'] * 1e3:>7.0f}ms "
                  f"{r['second_s'] * 1e3:>7.0f}ms {(load + r['first_s']) * 1e3:>9.0f}ms "
                  f"{size:>9}")
            if "build_s" in r:
                print(f"{'':<9} {'':<24} (artifact: {r['programs']} program(s), "
                      f"{r['kernels']} kernels, built in {r['build_s']:.2f} s)")


if __name__ == "__main__":
    main()
