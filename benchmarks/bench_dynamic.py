"""Symbolic shapes against specialized ones: the same programs compiled with
``dynamic=True`` (one trace for every size of the batch dim) and ``dynamic=False``.

Workloads: a 784-256-10 MLP training step (Linear, ReLU, cross-entropy, SGD; batch 128) and
row softmax of a 4096x1024 float32 matrix. Rows (median milliseconds per call, after
warm-up and the compiles), symbolic and specialized in the same process, and for the
symbolic programs the time their first call at a new size takes (the kernels of a size are
built on its first call: the CPU lowering reads sizes as constants).

The first line is the machine (``benchmarks/machine.py``).

Run ``python benchmarks/bench_dynamic.py [--quick] [--repeats N]``; ``--quick`` makes a few
calls of each, to check that the benchmark runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from machine import median_ms  # noqa: E402

BATCH, SOFTMAX = 128, (4096, 1024)




def once_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - start)


def mlp_rows(repeats: int) -> dict:
    import fusegrad as fg

    rows = {}
    for dynamic in (True, False):
        fg.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(784, 256), fg.nn.ReLU(), fg.nn.Linear(256, 10))
        opt = fg.optim.SGD(model.parameters(), lr=0.01)

        def step(x, y):
            opt.zero_grad()
            loss = fg.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        compiled = fg.compile(step, dynamic=dynamic)
        x, y = fg.randn(BATCH, 784), fg.randint(0, 10, (BATCH,))
        name = "symbolic" if dynamic else "specialized"
        rows[f"MLP step, {name}"] = median_ms(lambda: compiled(x, y), repeats)
        if dynamic:
            short_x, short_y = fg.randn(BATCH - 27, 784), fg.randint(0, 10, (BATCH - 27,))
            rows["MLP step, symbolic, first call at a new size"] = \
                once_ms(lambda: compiled(short_x, short_y))
            assert compiled.compiles == 1
    return rows


def softmax_rows(repeats: int) -> dict:
    import fusegrad as fg

    x = fg.randn(*SOFTMAX)
    rows = {}
    for dynamic in (True, False):
        f = fg.compile(lambda t: t.softmax(-1), dynamic=dynamic)
        name = "symbolic" if dynamic else "specialized"
        rows[f"softmax {SOFTMAX[0]}x{SOFTMAX[1]}, {name}"] = median_ms(lambda: f(x), repeats)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few calls of each")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 50)
    import machine
    print(machine.describe(threads=(1,), n=256 if args.quick else 1024))
    print(f"symbolic (dynamic=True) against specialized (dynamic=False): median ms of "
          f"{repeats} calls")
    rows = mlp_rows(repeats)
    rows.update(softmax_rows(repeats))
    width = max(map(len, rows))
    for name, ms in rows.items():
        print(f"  {name:<{width}}  {ms:9.3f} ms")


if __name__ == "__main__":
    main()
