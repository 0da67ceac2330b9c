"""Symbolic shapes against specialized ones: the same programs compiled with a symbolic
batch (and sequence length) and compiled static (``dynamic=False``).

A symbolic program is fused and lowered once: its kernels read their sizes at run time
(see ``fusegrad/runtime/cpu.py``), so it should run as fast as the program built for one
size. Workloads: a 784-256-10 MLP training step (Linear, ReLU, cross-entropy, SGD; batch
128, symbolic batch), row softmax of a 4096x1024 float32 matrix (symbolic rows), and the
char transformer's training step (examples/char_transformer.py; batch 16, sequence 64, both
symbolic). Each pair's calls are interleaved (symbolic, specialized, symbolic, ...), so load
on the machine reaches both alike; rows are medians of milliseconds per call, after warm-up
and the compiles, and the symbolic/specialized ratio. For the symbolic programs, the first
call at a new size is timed too: it builds nothing (neither fused kernels nor, for the
char transformer, the attention kernels, which read the sequence length at run time), so
it measures what a call at new sizes does besides the steady call (sizing the memory plan,
preparing the native calls anew).

The first line is the machine (``benchmarks/machine.py``).

Run ``python benchmarks/bench_dynamic.py [--quick] [--repeats N] [--cpu-time] [--cuda]``;
``--quick`` makes a few calls of each, to check that the benchmark runs; ``--cpu-time`` runs
on one thread (kernels and BLAS) and times the CPU time of that thread instead of the wall
clock: on a machine that other work keeps busy, wall-clock medians of one program varied
tenfold between runs, the CPU time by a few percent. ``--cuda`` runs the programs on the GPU
(cuda tensors in and out, ``fusegrad/runtime/cuda.py``), each call timed to the end of its
work on the device.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

BATCH, SOFTMAX = 128, (4096, 1024)
LM_BATCH, LM_BLOCK = 16, 64


_clock = time.perf_counter
DEVICE = "cpu"      # "cuda" with --cuda


def _on_device(*tensors):
    """``tensors`` moved to the benchmark's device (one tensor alone, not a tuple)."""
    moved = tuple(t.to(DEVICE) for t in tensors)
    return moved[0] if len(moved) == 1 else moved


def _backend() -> str:
    return "cuda" if DEVICE == "cuda" else "llvm"


def _timed(fn):
    """``fn``, waiting for the device at its end on the GPU (launches are asynchronous)."""
    if DEVICE == "cpu":
        return fn
    import fusegrad as fg

    def call():
        fn()
        fg.cuda.synchronize()
    return call


def once_ms(fn) -> float:
    start = _clock()
    fn()
    return 1000 * (_clock() - start)


def paired_ms(symbolic, specialized, repeats: int, warmup: int = 2) -> tuple[float, float]:
    """Medians (ms) of ``repeats`` calls of each, interleaved, after ``warmup`` of each."""
    for _ in range(warmup):
        symbolic()
        specialized()
    times: tuple[list, list] = ([], [])
    for _ in range(repeats):
        for fn, out in ((symbolic, times[0]), (specialized, times[1])):
            start = _clock()
            fn()
            out.append(_clock() - start)
    return 1000 * statistics.median(times[0]), 1000 * statistics.median(times[1])


def _pair_rows(rows: dict, name: str, symbolic, specialized, repeats: int) -> None:
    sym, spec = paired_ms(_timed(symbolic), _timed(specialized), repeats)
    rows[f"{name}, symbolic"] = sym
    rows[f"{name}, specialized"] = spec
    rows[f"{name}, symbolic / specialized"] = sym / spec


def mlp_rows(repeats: int) -> dict:
    import fusegrad as fg

    steps = {}
    for dynamic in (True, False):
        fg.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(784, 256), fg.nn.ReLU(),
                                 fg.nn.Linear(256, 10)).to(DEVICE)
        opt = fg.optim.SGD(model.parameters(), lr=0.01)

        def step(x, y, model=model, opt=opt):
            opt.zero_grad()
            loss = fg.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        steps[dynamic] = fg.compile(step, dynamic=dynamic, backend=_backend())
    x, y = _on_device(fg.randn(BATCH, 784), fg.randint(0, 10, (BATCH,)))
    rows: dict = {}
    _pair_rows(rows, "MLP step", lambda: steps[True](x, y), lambda: steps[False](x, y), repeats)
    short_x, short_y = _on_device(fg.randn(BATCH - 27, 784), fg.randint(0, 10, (BATCH - 27,)))
    rows["MLP step, symbolic, first call at a new size"] = \
        once_ms(_timed(lambda: steps[True](short_x, short_y)))
    assert steps[True].compiles == 1
    return rows


def softmax_rows(repeats: int) -> dict:
    import fusegrad as fg

    x = _on_device(fg.randn(*SOFTMAX))
    fg.mark_dynamic(x, 0)
    symbolic = fg.compile(lambda t: t.softmax(-1), backend=_backend())
    specialized = fg.compile(lambda t: t.softmax(-1), dynamic=False, backend=_backend())
    rows: dict = {}
    _pair_rows(rows, f"softmax {SOFTMAX[0]}x{SOFTMAX[1]}", lambda: symbolic(x),
               lambda: specialized(x), repeats)
    assert symbolic.compiles == 1
    return rows


def transformer_rows(repeats: int) -> dict:
    import fusegrad as fg
    from examples.char_transformer import make_model

    steps = {}
    for dynamic in (True, False):
        fg.manual_seed(0)
        model = make_model(fg, vocab=64, block=LM_BLOCK).to(DEVICE)
        opt = fg.optim.SGD(model.parameters(), lr=0.1)

        def step(x, y, model=model, opt=opt):
            opt.zero_grad()
            loss = model(x, y)
            loss.backward()
            opt.step()
            return loss
        steps[dynamic] = fg.compile(step, dynamic=dynamic, backend=_backend())
    x, y = _on_device(*(fg.randint(0, 64, (LM_BATCH, LM_BLOCK)) for _ in range(2)))
    rows: dict = {}
    _pair_rows(rows, "char transformer step", lambda: steps[True](x, y),
               lambda: steps[False](x, y), repeats)
    short = _on_device(*(fg.randint(0, 64, (LM_BATCH - 5, LM_BLOCK - 9)) for _ in range(2)))
    rows["char transformer step, symbolic, first call at a new size"] = \
        once_ms(_timed(lambda: steps[True](*short)))
    assert steps[True].compiles == 1
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few calls of each")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--cpu-time", action="store_true",
                        help="one thread, timed by its CPU time (for a busy machine)")
    parser.add_argument("--cuda", action="store_true", help="on the GPU (cuda tensors)")
    args = parser.parse_args()
    clock = "wall clock"
    if args.cuda:
        global DEVICE
        DEVICE = "cuda"
    if args.cpu_time:
        import fusegrad as fg
        fg.set_num_threads(1)
        global _clock
        _clock = time.thread_time
        clock = "CPU time of the one thread"
    repeats = args.repeats or (3 if args.quick else 50)
    import machine
    print(machine.describe(threads=(1,), n=256 if args.quick else 1024))
    print(f"symbolic against specialized (dynamic=False) on {DEVICE}: median ms ({clock}) of "
          f"{repeats} calls each, interleaved")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    rows = mlp_rows(repeats)
    rows.update(softmax_rows(repeats))
    rows.update(transformer_rows(repeats))
    width = max(map(len, rows))
    for name, value in rows.items():
        unit = "" if name.endswith("specialized") and "/" in name else " ms"
        print(f"  {name:<{width}}  {value:9.3f}{unit}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
