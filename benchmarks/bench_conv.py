"""Convolution benchmarks: fusegrad eager and compiled against torch eager (when installed).

Workloads (float32):

- ``conv2d``: forward and backward of ``conv2d(x, w, b, padding=1)``, x (64, 32, 28, 28),
  w (64, 32, 3, 3): the gradients of ``sum(conv2d(x, w, b) * g)`` with respect to x, w and b.
  fusegrad compiled is ``fusegrad.compile(fusegrad.value_and_grad(...))``.
- ``lenet``: one training step (``zero_grad``, forward, cross-entropy, ``backward``, SGD with
  momentum) of the CNN of ``examples/train_lenet.py`` on a batch of 64 8x8 images; fusegrad
  compiled is the whole step in ``fusegrad.compile``.

For each thread count (``--threads 1,2``) a worker process pins itself to that many cores and
sets every library's thread count (``fusegrad.set_num_threads``, ``torch.set_num_threads``,
and ``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS``/``MKL_NUM_THREADS`` for numpy's BLAS, before
numpy is imported). Each figure is the median over rounds of the time per call, after warm-up
(compiles included in the warm-up, not in the figure); the systems alternate round by round.

    python benchmarks/bench_conv.py [--threads 1,2] [--rounds 7] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULT_TAG = "RESULT "
SYSTEMS = ("fusegrad eager", "fusegrad compiled", "torch eager")


def _median_time(fn, rounds: int, calls: int) -> list[float]:
    """Seconds per call for each round of ``calls`` calls."""
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - start) / calls)
    return out


def _conv_workload(lib, np, batch, quick):
    """``run()`` closures for fusegrad eager/compiled and torch eager, on the same arrays."""
    rng = np.random.default_rng(0)
    shape_x, shape_w = ((8, 8, 14, 14), (16, 8, 3, 3)) if quick else \
        ((batch, 32, 28, 28), (64, 32, 3, 3))
    x = rng.standard_normal(shape_x).astype(np.float32)
    w = (rng.standard_normal(shape_w) * 0.05).astype(np.float32)
    b = rng.standard_normal(shape_w[0]).astype(np.float32)
    g = rng.standard_normal((shape_x[0], shape_w[0]) + shape_x[2:]).astype(np.float32)
    runs = {}
    if lib == "fusegrad":
        import fusegrad
        from fusegrad.nn import functional as F
        tx, tw, tb, tg = (fusegrad.tensor(a) for a in (x, w, b, g))

        def loss(x, w, b):
            return (F.conv2d(x, w, b, padding=1) * tg).sum()
        # the loss too, so that the compiled function computes the forward as torch does
        compiled = fusegrad.compile(fusegrad.value_and_grad(loss, argnums=(0, 1, 2)))
        runs["fusegrad compiled"] = lambda: compiled(tx, tw, tb)
        # eager: the autograd tape, as users run it (fusegrad.grad would replay the autodiff pass)
        ex, ew, eb = (fusegrad.tensor(a, requires_grad=True) for a in (x, w, b))

        def tape():
            ex.grad = ew.grad = eb.grad = None
            F.conv2d(ex, ew, eb, padding=1).backward(tg)
        runs["fusegrad eager"] = tape
    else:
        import torch
        tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
        tg = torch.tensor(g)

        def step():
            tx.grad = tw.grad = tb.grad = None
            torch.nn.functional.conv2d(tx, tw, tb, padding=1).backward(tg)
        runs["torch eager"] = step
    return runs


def _lenet_model(nn):
    return nn.Sequential(
        nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 3), nn.ReLU(), nn.Flatten(),
        nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def _lenet_workload(lib, np, batch, quick):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    runs = {}
    mod = __import__(lib)
    mod.manual_seed(0)
    for name in (("fusegrad eager", "fusegrad compiled") if lib == "fusegrad"
                 else ("torch eager",)):
        model = _lenet_model(mod.nn)
        opt = mod.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = mod.nn.CrossEntropyLoss()

        def step(x, y, model=model, opt=opt, loss_fn=loss_fn):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            return loss
        if name == "fusegrad compiled":
            step = mod.compile(step)
        tx, ty = mod.tensor(x), mod.tensor(y)
        runs[name] = (lambda step=step, tx=tx, ty=ty: step(tx, ty))
    return runs


WORKLOADS = {"conv2d": _conv_workload, "lenet": _lenet_workload}


def worker(threads: int, rounds: int, quick: bool) -> None:
    """Measure every system on every workload with ``threads`` threads; print one JSON line."""
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:threads]))
    import numpy as np

    import fusegrad
    fusegrad.set_num_threads(threads)
    try:
        import torch
        torch.set_num_threads(threads)
        libs = ("fusegrad", "torch")
    except ImportError:
        libs = ("fusegrad",)
    results = {}
    for workload, make in WORKLOADS.items():
        runs = {}
        for lib in libs:
            runs.update(make(lib, np, 64, quick))
        calls = {name: 1 for name in runs}
        for name, fn in runs.items():       # warm-up (compiles) and calls per round
            for _ in range(3):
                fn()
            start = time.perf_counter()
            fn()
            once = time.perf_counter() - start
            calls[name] = max(1, min(50, int(0.2 / max(once, 1e-6))))
        times = {name: [] for name in runs}
        for _ in range(rounds):
            for name, fn in runs.items():
                times[name] += _median_time(fn, 1, calls[name])
        results[workload] = {name: statistics.median(t) for name, t in times.items()}
    print(RESULT_TAG + json.dumps({"threads": threads, "results": results}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="small shapes, 3 rounds (smoke run)")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    if args.worker:
        worker(args.worker, rounds, args.quick)
        return
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        env = dict(os.environ, FUSEGRAD_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                   OPENBLAS_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(threads),
               "--rounds", str(rounds)] + (["--quick"] if args.quick else [])
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith(RESULT_TAG)]
        if out.returncode or not lines:
            sys.exit(f"worker with {threads} thread(s) failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(lines[-1][len(RESULT_TAG):]))
    shapes = "small shapes (--quick)" if args.quick else \
        "conv2d: x (64, 32, 28, 28), w (64, 32, 3, 3), pad 1; lenet: batch 64 of 1x8x8"
    from machine import describe  # here: it imports numpy, which workers pin first
    print(describe())
    print(f"milliseconds per call, median of {rounds} rounds after warm-up; {shapes}")
    print(f"{'workload':10s} {'threads':>7s} " + " ".join(f"{s:>18s}" for s in SYSTEMS)
          + f" {'compiled/torch':>15s}")
    for row in rows:
        for workload, res in row["results"].items():
            cells = " ".join(f"{res[s] * 1e3:18.3f}" if s in res else f"{'-':>18s}"
                             for s in SYSTEMS)
            ratio = (f"{res['fusegrad compiled'] / res['torch eager']:15.2f}"
                     if "torch eager" in res else f"{'-':>15s}")
            print(f"{workload:10s} {row['threads']:7d} {cells} {ratio}")


if __name__ == "__main__":
    main()
