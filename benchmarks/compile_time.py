"""Compile time of fusegrad.compile: first calls in a fresh process, cold and warm disk cache.

Each workload runs in its own process (so the in-memory kernel cache starts empty), first
with ``FUSEGRAD_CACHE_DIR`` set to a fresh folder (cold), then again with the same folder
(warm: the kernels' object code comes from disk). A training step compiles twice: its first
call (no ``.grad``, no optimizer state yet) and its second (the steady step); both are shown.

    python benchmarks/compile_time.py                 # every workload, cold and warm
    python benchmarks/compile_time.py --only mlp --profile   # cProfile of one cold run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

WORKLOADS = ("mlp", "transformer", "gelu", "softmax")


def build(name: str):
    """(callable, list of argument tuples, one per call): the workload ``name``."""
    import numpy as np

    import fusegrad as fg
    rng = np.random.RandomState(0)
    if name == "mlp":
        fg.manual_seed(0)
        m = fg.nn.Sequential(fg.nn.Linear(784, 256), fg.nn.ReLU(), fg.nn.Linear(256, 256),
                             fg.nn.ReLU(), fg.nn.Linear(256, 10))
        opt = fg.optim.SGD(m.parameters(), lr=0.1)

        def step(x, y):
            opt.zero_grad()
            loss = fg.nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            return loss
        x = fg.tensor(rng.randn(128, 784).astype(np.float32))
        y = fg.tensor(rng.randint(0, 10, 128))
        return step, [(x, y), (x, y)]
    if name == "transformer":
        sys.path.insert(0, os.path.join(ROOT, "examples"))
        from char_transformer import TEXT, batches, make_model
        fg.manual_seed(0)
        model = make_model(fg, len(set(TEXT)))
        opt = fg.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)

        def step(x, y):
            opt.zero_grad()
            loss = model(x, y)
            loss.backward()
            opt.step()
            return loss
        data = batches(fg, TEXT, 32, 16)
        return step, [next(data), next(data)]
    if name == "gelu":
        a, b = fg.tensor(np.float32(1.5)), fg.tensor(np.float32(0.25))
        x = fg.tensor(rng.randn(1 << 16).astype(np.float32))
        return (lambda x: fg.nn.functional.gelu(x * a + b, approximate="tanh")), [(x,)]
    if name == "softmax":
        x = fg.tensor(rng.randn(256, 1024).astype(np.float32))
        return (lambda x: fg.nn.functional.softmax(x, dim=-1)), [(x,)]
    raise ValueError(name)


def child(name: str, profile: str | None) -> None:
    """Run in a fresh process: time each call of the compiled workload, print JSON."""
    sys.path.insert(0, ROOT)
    import fusegrad as fg
    from fusegrad.runtime import jit
    fn, calls = build(name)
    compiled = fg.compile(fn, fullgraph=True)
    times = []
    prof = None
    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    for args in calls:
        t0 = time.perf_counter()
        compiled(*args)
        times.append(time.perf_counter() - t0)
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    print(json.dumps({"calls_s": times, "stats": {k: jit.stats[k] for k in
                                                  ("compiles", "disk_hits", "memory_hits")}}))


def run(name: str, cache_dir: str, profile: str | None = None) -> dict:
    env = dict(os.environ, FUSEGRAD_CACHE_DIR=cache_dir, PYTHONPATH=ROOT)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name]
    if profile:
        cmd += ["--profile-out", profile]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=WORKLOADS)
    ap.add_argument("--profile", action="store_true", help="cProfile one cold run, print top")
    ap.add_argument("--child")
    ap.add_argument("--profile-out")
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.profile_out)
        return 0
    print(f"load: {os.getloadavg()}")
    print("| workload | cache | call 1 (s) | call 2 (s) | compiles | disk hits |")
    print("|---|---|---|---|---|---|")
    for name in [args.only] if args.only else WORKLOADS:
        with tempfile.TemporaryDirectory() as d:
            prof = os.path.join(d, "profile.out") if args.profile else None
            for label in ("cold", "warm"):
                r = run(name, os.path.join(d, "cache"), prof if label == "cold" else None)
                t = r["calls_s"] + [float("nan")]
                print(f"| {name} | {label} | {t[0]:.3f} | {t[1]:.3f} | "
                      f"{r['stats']['compiles']} | {r['stats']['disk_hits']} |", flush=True)
            if prof:
                import pstats
                pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    print(f"load: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
