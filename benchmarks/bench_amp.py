"""Mixed-precision training steps: float32 against autocast-bf16, side by side.

Workloads (the medium ones):

- ``gpt``: the char transformer of ``examples/char_transformer.py`` with C=256, T=128, 4 heads,
  2 blocks, vocab 100, batch 8, AdamW.
- ``mlp``: a 1024-2048-2048-10 MLP (ReLU, cross-entropy), batch 256, Adam.
- ``cnn``: a ResNet-style CNN on 3x32x32 images (a 3x3 stem of 32 channels, two residual
  blocks of conv-BatchNorm-ReLU, a strided block to 64 channels, global average pool, a linear
  head), batch 32, SGD with momentum.

Systems: torch eager (when torch is importable) and fusegrad eager and with the whole step
compiled, each in float32 and with ``autocast("cpu", dtype=bfloat16)`` around the forward and
the loss. For each thread count (``--threads 1,2``) a worker process pins itself to that many
cores (``os.sched_setaffinity``) and sets the thread counts (``FUSEGRAD_NUM_THREADS``,
``torch.set_num_threads``) before importing anything; each figure is the median of several
steps after warm-up and the compiles.

Each row gives the step's GEMM FLOPs (the products and convolutions of the forward, times three
for the backward's two products per forward one) and the rate that makes of the median time,
and for the compiled steps the bytes the compiled program holds from its forward into its
backward (:func:`fusegrad.runtime.memory_plan.saved_between`): all of them, and the
activations among them (those computed from the step's data; the rest are copies of
parameters, such as the bf16 weights that an autocast backward reads). The first line is the machine
(``benchmarks/machine.py``): a rate means little without the CPU and its float32 peak.

The steps run interleaved: each round runs every system's float32 step and autocast step
once, so that a change in a shared machine's load falls on all of them; beside the ratio of the
medians (``vs float32``), ``paired`` is the median over the rounds of each round's float32
time over its autocast time, and ``load`` the load average before and after the rounds.

Run ``python benchmarks/bench_amp.py [--quick] [--threads 1,2] [--only gpt,mlp,cnn]
[--systems torch,eager,compiled] [--cpu-time] [--steps N]``. ``--quick`` is a short run: the
same workloads, fewer steps; ``--memory`` only compiles the steps and prints their saved
bytes; ``--cpu-time`` times each step by the process's CPU time (``time.process_time``), the
one stable measure on a loaded shared machine (at one thread, what the step computes; a
step's waits for a core are left out); the table's ``clock`` column says which.
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
WORKLOADS = ("gpt", "mlp", "cnn")
GPT = {"vocab": 100, "block": 128, "n_embd": 256, "n_head": 4, "n_layer": 2, "batch": 8}
MLP_SIZES, MLP_BATCH = (1024, 2048, 2048, 10), 256
CNN_BATCH = 32
RESULT_TAG = "RESULT "


def pin_threads(threads: int) -> None:
    """Thread counts and CPU affinity; before numpy, fusegrad or torch is imported."""
    for name in ("FUSEGRAD_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:threads]))


# --------------------------------------------------------------------------- models


def cnn(lib):
    """The ResNet-style CNN on ``lib`` (fusegrad or torch)."""
    nn = lib.nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.skip = None if stride == 1 and cin == cout else nn.Conv2d(cin, cout, 1, stride,
                                                                           bias=False)

        def forward(self, x):
            y = lib.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return lib.relu(y + (x if self.skip is None else self.skip(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 32, 3, 1, 1, bias=False)
            self.bn = nn.BatchNorm2d(32)
            self.blocks = nn.Sequential(Block(32, 32, 1), Block(32, 32, 1), Block(32, 64, 2))
            self.head = nn.Linear(64, 10)

        def forward(self, x):
            x = self.blocks(lib.relu(self.bn(self.stem(x))))
            return self.head(x.mean((2, 3)))
    return Net()


def gemm_flops(workload: str) -> int:
    """The training step's GEMM FLOPs: 2 per multiply-add of every product and convolution
    of the forward, times three (the backward's two products per forward one)."""
    if workload == "mlp":
        sizes = MLP_SIZES
        forward = sum(2 * MLP_BATCH * a * b for a, b in zip(sizes, sizes[1:]))
    elif workload == "gpt":
        b, t, c, v = GPT["batch"], GPT["block"], GPT["n_embd"], GPT["vocab"]
        per_block = 2 * b * t * 12 * c * c + 2 * 2 * b * t * t * c    # linears; q@kT and att@v
        forward = GPT["n_layer"] * per_block + 2 * b * t * c * v
    else:
        def conv(cin, cout, k, hw):
            return 2 * CNN_BATCH * hw * hw * cout * cin * k * k
        forward = (conv(3, 32, 3, 32) + 4 * conv(32, 32, 3, 32) + conv(32, 64, 3, 16)
                   + conv(64, 64, 3, 16) + conv(32, 64, 1, 16) + 2 * CNN_BATCH * 64 * 10)
    return 3 * forward


def build(lib, workload: str, weights: dict | None):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    if workload == "mlp":
        nn = lib.nn
        a, b, c, d = MLP_SIZES
        model = nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, c), nn.ReLU(), nn.Linear(c, d))
    elif workload == "gpt":
        from char_transformer import make_model
        model = make_model(lib, vocab=GPT["vocab"], block=GPT["block"], n_embd=GPT["n_embd"],
                           n_head=GPT["n_head"], n_layer=GPT["n_layer"])
    else:
        model = cnn(lib)
    if weights is not None:
        with lib.no_grad():
            for name, p in model.named_parameters():
                p.copy_(lib.tensor(weights[name]))
    params = model.parameters()
    if workload == "mlp":
        opt = lib.optim.Adam(params, lr=1e-3)
    elif workload == "gpt":
        opt = lib.optim.AdamW(params, lr=3e-4, weight_decay=0.1)
    else:
        opt = lib.optim.SGD(params, lr=0.01, momentum=0.9)
    return model, opt


def make_data(np, workload: str):
    rng = np.random.default_rng(0)
    if workload == "mlp":
        return (rng.standard_normal((MLP_BATCH, MLP_SIZES[0]), dtype=np.float32),
                rng.integers(0, MLP_SIZES[-1], MLP_BATCH))
    if workload == "gpt":
        shape = (GPT["batch"], GPT["block"])
        return rng.integers(0, GPT["vocab"], shape), rng.integers(0, GPT["vocab"], shape)
    return (rng.standard_normal((CNN_BATCH, 3, 32, 32), dtype=np.float32),
            rng.integers(0, 10, CNN_BATCH))


def training_step(lib, workload: str, model, opt, amp: bool):
    """The user's step, the forward and loss under autocast when ``amp``."""
    F = lib.nn.functional

    def step(x, y):
        opt.zero_grad()
        with lib.autocast("cpu", dtype=lib.bfloat16, enabled=amp):
            loss = model(x, y) if workload == "gpt" else F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


# --------------------------------------------------------------------------- measuring


SYSTEMS = ("torch", "eager", "compiled")


def measure(workload: str, threads: int, steps: int, only: tuple = SYSTEMS,
            cpu_time: bool = False) -> list[dict]:
    """The systems ``only`` names on ``workload`` in this (pinned) process: median seconds per
    step, and the median of each round's float32 time over its autocast time. ``cpu_time``:
    the process's CPU time (``time.process_time``) instead of the wall clock: on a shared,
    loaded machine the time a step waits for a core is not the step's."""
    clock = time.process_time if cpu_time else time.perf_counter
    import numpy as np

    import fusegrad as fg
    fg.set_num_threads(threads)
    try:
        import torch
        torch.set_num_threads(threads)
    except ImportError:
        torch = None
    fg.manual_seed(0)
    reference, _ = build(fg, workload, None)
    weights = {n: p.detach().numpy().copy() for n, p in reference.named_parameters()}
    xs, ys = make_data(np, workload)
    systems = [("torch eager", torch, False)] if torch is not None and "torch" in only else []
    systems += [("fusegrad eager", fg, False)] if "eager" in only else []
    systems += [("fusegrad compiled", fg, True)] if "compiled" in only else []
    runs = []
    for name, lib, compiled in systems:
        for amp in (False, True):
            model, opt = build(lib, workload, weights)
            step = training_step(lib, workload, model, opt, amp)
            if compiled:
                step = fg.compile(step, fullgraph=True)
            x, y = lib.tensor(xs), lib.tensor(ys)
            t0 = time.perf_counter()
            for _ in range(2):            # the compiles: a first step, then the steady one
                step(x, y)
            runs.append({"system": name, "amp": amp, "step": step, "x": x, "y": y,
                         "first": time.perf_counter() - t0, "times": []})
    # Interleaved: each round runs every system's float32 and autocast step once, so that a
    # change in the machine's load (it is shared) falls on all of them alike; the ratio of a
    # float32 step to the autocast step after it is taken round by round.
    load = [os.getloadavg()[0]]
    for _ in range(steps):
        for run in runs:
            t0 = clock()
            run["loss"] = run["step"](run["x"], run["y"])
            run["loss"].item()
            run["times"].append(clock() - t0)
    load.append(os.getloadavg()[0])
    rows = []
    for i, run in enumerate(runs):
        row = {"workload": workload, "threads": threads, "system": run["system"],
               "precision": "autocast bf16" if run["amp"] else "float32",
               "median_s": statistics.median(run["times"]), "first_two_s": run["first"],
               "loss": float(run["loss"].item()), "load": load,
               "clock": "cpu" if cpu_time else "wall"}
        if run["amp"]:
            base = runs[i - 1]["times"]
            row["paired_speedup"] = statistics.median(f / a for f, a in zip(base, run["times"]))
        if run["system"] == "fusegrad compiled":
            row.update(saved_bytes(run["step"].entries()[-1].program))
        rows.append(row)
        print(f"  {workload} {threads}t {run['system']} {row['precision']}: "
              f"{row['median_s'] * 1e3:.1f} ms", file=sys.stderr, flush=True)
    return rows


def saved_bytes(prog) -> dict:
    """What a compiled step's program holds from its forward into its backward: all of it
    (``saved_bytes``), and the part computed from the step's data arguments, or the data
    itself where the backward reads it (``activation_bytes``: what grows with the batch, as
    torch's saved tensors count it; the rest are copies of parameters, the bf16 weights
    under autocast)."""
    from fusegrad.runtime.memory_plan import saved_between
    g = prog.kg.graph
    data = set(g.inputs[g.meta.n_state:g.meta.n_state + 2])        # the step's x and y
    reaches: dict = {}

    def from_data(v) -> bool:
        todo = [v]
        while todo:             # post-order over the producers, memoized
            u = todo[-1]
            if u in reaches:
                todo.pop()
                continue
            producer = getattr(u, "producer", None)
            if producer is None:
                reaches[u] = u in data
                todo.pop()
                continue
            pending = [w for w in producer.inputs if hasattr(w, "producer") and w not in reaches]
            if pending:
                todo += pending
                continue
            reaches[u] = any(reaches.get(w, False) for w in producer.inputs if hasattr(w, "producer"))
            todo.pop()
        return reaches[v]
    saved = saved_between(prog.kg, g.outputs[0], inputs=data)
    return {"saved_bytes": sum(saved.values()),
            "activation_bytes": sum(b for v, b in saved.items() if from_data(v))}


def memory_only(workloads: list[str]) -> None:
    """The compiled steps' saved and activation bytes, float32 and autocast, without timing."""
    import numpy as np

    import fusegrad as fg
    print("| workload | precision | saved MiB | activations MiB |")
    print("|---|---|---|---|")
    for workload in workloads:
        fg.manual_seed(0)
        xs, ys = make_data(np, workload)
        for amp in (False, True):
            model, opt = build(fg, workload, None)
            step = fg.compile(training_step(fg, workload, model, opt, amp), fullgraph=True)
            x, y = fg.tensor(xs), fg.tensor(ys)
            step(x, y)
            prog = step.lower(x, y).program
            m = saved_bytes(prog)
            print(f"| {workload} | {'autocast bf16' if amp else 'float32'} | "
                  f"{m['saved_bytes'] / 2 ** 20:.1f} | {m['activation_bytes'] / 2 ** 20:.1f} |",
                  flush=True)


def worker(workload: str, threads: int, steps: int, only: tuple, cpu_time: bool) -> None:
    pin_threads(threads)
    print(RESULT_TAG + json.dumps(measure(workload, threads, steps, only, cpu_time)), flush=True)


def run_worker(workload: str, threads: int, steps: int, only: tuple,
               cpu_time: bool = False) -> list[dict]:
    path = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, __file__, "--worker", workload, str(threads), str(steps),
                           ",".join(only), "cpu" if cpu_time else "wall"],
                          capture_output=True, text=True, timeout=3600,
                          env=dict(os.environ, PYTHONPATH=path))
    sys.stderr.write(done.stderr[-4000:] if done.returncode else "")
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise RuntimeError(f"{workload} at {threads} threads failed:\n{done.stderr[-2000:]}")


def print_table(rows: list[dict]) -> None:
    print("| workload | threads | system | precision | median ms | vs float32 | paired | GEMM GFLOP | "
          "GFLOP/s | saved MiB | activations MiB | loss | load | clock |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    base = {(r["workload"], r["threads"], r["system"]): r["median_s"] for r in rows
            if r["precision"] == "float32"}
    for r in rows:
        flops = gemm_flops(r["workload"])
        speed = base[(r["workload"], r["threads"], r["system"])] / r["median_s"]
        saved = (f"{r['saved_bytes'] / 2 ** 20:.1f} | {r['activation_bytes'] / 2 ** 20:.1f}"
                 if "saved_bytes" in r else "- | -")
        paired = f"{r['paired_speedup']:.2f}x" if "paired_speedup" in r else "-"
        print(f"| {r['workload']} | {r['threads']} | {r['system']} | {r['precision']} | "
              f"{r['median_s'] * 1e3:.1f} | {speed:.2f}x | {paired} | {flops / 1e9:.2f} | "
              f"{flops / r['median_s'] / 1e9:.1f} | {saved} | {r['loss']:.4f} | "
              f"{r['load'][0]:.1f}-{r['load'][1]:.1f} | {r.get('clock', 'wall')} |")


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), tuple(sys.argv[5].split(",")),
               sys.argv[6] == "cpu")
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps per figure")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help="which of torch, eager, compiled to run")
    parser.add_argument("--memory", action="store_true",
                        help="only the compiled steps' saved bytes, no timing")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time steps by the process's CPU time, not the wall clock")
    parser.add_argument("--steps", type=int, default=None, help="rounds per figure")
    args = parser.parse_args()
    if args.memory:
        memory_only(args.only.split(","))
        return
    sys.path.insert(0, HERE)
    import machine
    threads = tuple(int(t) for t in args.threads.split(","))
    print(machine.describe(threads))
    print()
    steps = args.steps or (3 if args.quick else 10)
    rows = []
    for workload in args.only.split(","):
        for t in threads:
            rows += run_worker(workload, t, steps, tuple(args.systems.split(",")), args.cpu_time)
    print_table(rows)


if __name__ == "__main__":
    main()
