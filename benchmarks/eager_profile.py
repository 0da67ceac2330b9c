"""Where an eager training step spends its time: deterministic counts and a profile.

For the three small steps the eager-speed target is measured on (the 784-256-256-10 MLP with
SGD, the char transformer with AdamW, the LeNet-style CNN with SGD and momentum), one step is
counted after warm-up:

- ``binds``: primitives applied (each one Python dispatch, an inference lookup, a numpy
  call and, under grad, an autograd node);
- ``py calls``: Python function calls (``sys.setprofile`` "call" events);
- ``c calls``: calls of builtins and C methods (numpy's ufunc calls are not among them);
- ``in impls``: the wall time inside the primitives' numpy references, against the whole
  step's: what is left is dispatch, autograd bookkeeping and the optimizer's Python.

Counts do not depend on the machine's load, unlike times; compare them across changes.
``--profile NAME`` prints cProfile's table of one workload instead.

Run ``python benchmarks/eager_profile.py [--only mlp,gpt,lenet] [--profile gpt]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
              "FUSEGRAD_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402

import fusegrad as fg  # noqa: E402
from fusegrad.ops import primitive  # noqa: E402

WORKLOADS = ("mlp", "gpt", "lenet")


def make_step(name: str):
    """The training step of workload ``name``, on fixed data, as the benchmarks build it."""
    fg.manual_seed(0)
    rng = np.random.default_rng(0)
    nn, F = fg.nn, fg.nn.functional
    if name == "mlp":
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 10))
        opt = fg.optim.SGD(model.parameters(), lr=0.01)
        x = fg.tensor(rng.standard_normal((128, 784), dtype=np.float32))
        y = fg.tensor(rng.integers(0, 10, 128))

        def loss():
            return F.cross_entropy(model(x), y)
    elif name == "gpt":
        from char_transformer import make_model
        model = make_model(fg, vocab=100, block=32, n_embd=64, n_head=4, n_layer=2)
        opt = fg.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
        x = fg.tensor(rng.integers(0, 100, (16, 32)))
        y = fg.tensor(rng.integers(0, 100, (16, 32)))

        def loss():
            return model(x, y)
    else:
        model = nn.Sequential(
            nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 3), nn.ReLU(), nn.Flatten(),
            nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        opt = fg.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = fg.tensor(rng.standard_normal((64, 1, 8, 8)).astype(np.float32))
        y = fg.tensor(rng.integers(0, 10, 64))
        loss_fn = nn.CrossEntropyLoss()

        def loss():
            return loss_fn(model(x), y)

    def step():
        opt.zero_grad()
        out = loss()
        out.backward()
        opt.step()
        return out
    return step


def count(step) -> dict[str, int]:
    """Primitive binds, Python calls and C calls of one call of ``step``."""
    n = {"binds": 0, "py calls": 0, "c calls": 0}
    apply = primitive._eager_apply

    def counted(prim, operands, attrs):
        n["binds"] += 1
        return apply(prim, operands, attrs)

    def trace(frame, event, arg):
        if event == "call":
            n["py calls"] += 1
        elif event == "c_call":
            n["c calls"] += 1

    primitive._eager_apply = counted
    try:
        sys.setprofile(trace)
        step()
    finally:
        sys.setprofile(None)
        primitive._eager_apply = apply
    n["py calls"] -= n["binds"]          # the counting wrapper's own calls
    return n


def impl_share(step, rounds: int = 9) -> tuple[float, float]:
    """Median ms of the whole step and of the time inside primitives' numpy references."""
    inside = [0.0]
    originals = {}
    for prim in primitive.PRIMITIVES.values():
        originals[prim] = impl = prim.impl

        def timed(*args, _impl=impl, **kwargs):
            start = time.perf_counter()
            try:
                return _impl(*args, **kwargs)
            finally:
                inside[0] += time.perf_counter() - start
        object.__setattr__(prim, "impl", timed)     # Primitive is frozen
    totals, impls = [], []
    try:
        for _ in range(rounds):
            inside[0] = 0.0
            start = time.perf_counter()
            step()
            totals.append(time.perf_counter() - start)
            impls.append(inside[0])
    finally:
        for prim, impl in originals.items():
            object.__setattr__(prim, "impl", impl)
    return statistics.median(totals) * 1e3, statistics.median(impls) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--profile", choices=WORKLOADS, help="print cProfile's table instead")
    args = parser.parse_args()
    fg.set_num_threads(1)
    if args.profile:
        import cProfile
        import pstats
        step = make_step(args.profile)
        for _ in range(3):
            step()
        prof = cProfile.Profile()
        prof.runcall(lambda: [step() for _ in range(10)])
        pstats.Stats(prof).sort_stats("tottime").print_stats(40)
        return
    print(f"{'workload':10s} {'loss':>10s} {'binds':>7s} {'py calls':>9s} {'c calls':>8s} "
          f"{'step ms':>8s} {'in impls':>9s}")
    for name in args.only.split(","):
        step = make_step(name)
        for _ in range(3):
            step()
        loss = float(step())
        n = count(step)
        total, inside = impl_share(step)
        print(f"{name:10s} {loss:10.6f} {n['binds']:7d} {n['py calls']:9d} {n['c calls']:8d} "
              f"{total:8.2f} {inside:9.2f}")


if __name__ == "__main__":
    main()
