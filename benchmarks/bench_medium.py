"""Medium training steps at 1 and 2 threads: how close each system comes to the machine's
float32 GEMM peak, and what a second core (or a busy neighbour) does to it.

Workloads (float32, one ``zero_grad(); loss.backward(); opt.step()`` per step):

- ``gpt``: the char transformer of ``examples/char_transformer.py`` as a block stack: C=256,
  4 layers, 4 heads, T=128, vocab 256, batch 8, AdamW (weight decay 0.1);
- ``mlp``: a 1024-2048-2048-10 MLP (ReLU, cross-entropy), batch 256, Adam;
- ``cnn``: a ResNet-style CNN on 3x32x32 images (a 3x3 stem to 32 channels, a residual
  block, a stride-2 3x3 convolution to 64 channels, a residual block, global average
  pooling, a linear classifier; batch norm and ReLU after every convolution), batch 32,
  SGD with momentum 0.9.

For each thread count a worker process pins itself to that many cores
(``os.sched_setaffinity``) and sets ``FUSEGRAD_NUM_THREADS``, ``OMP_NUM_THREADS``,
``OPENBLAS_NUM_THREADS`` and ``torch.set_num_threads`` before importing anything, then runs
fusegrad eager, fusegrad's compiled step, torch eager and torch.compile (when torch is
importable; its first call's time is reported) on the same weights, interleaved round by
round; each figure is the median of the rounds. Each step's FLOPs are counted from the
model's shapes (forward products times 3: the forward's and the backward's two), and the
share of the GEMM peak is the step's rate over the best float32 GEMM rate numpy or torch
reach at 1024^3 at that thread count, measured in the same run (``benchmarks/machine.py``).

``--busy`` runs the same with ``python -c 'while True: pass'`` pinned to the last core beside
the workers: one thread runs on a core of its own (the first), two share one with it.
``--only cnn`` runs one workload, ``--systems`` some of the systems. ``--quick`` is a smoke
run: smaller workloads, fewer rounds, no torch.compile.

    python benchmarks/bench_medium.py [--quick] [--busy] [--only gpt,mlp,cnn] [--threads 1,2]
                                      [--systems "fusegrad compiled,torch eager"]
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
sys.path.insert(0, HERE)

import bench_training  # noqa: E402
import machine  # noqa: E402

WORKLOADS = ("gpt", "mlp", "cnn")
SYSTEMS = ("torch eager", "torch.compile", "fusegrad eager", "fusegrad compiled")
FULL = {"gpt": {"vocab": 256, "block": 128, "n_embd": 256, "n_head": 4, "n_layer": 4, "batch": 8},
        "mlp": {"sizes": (1024, 2048, 2048, 10), "batch": 256},
        "cnn": {"channels": (32, 64), "batch": 32}}
QUICK = {"gpt": {"vocab": 64, "block": 32, "n_embd": 64, "n_head": 4, "n_layer": 2, "batch": 4},
         "mlp": {"sizes": (256, 512, 512, 10), "batch": 64},
         "cnn": {"channels": (8, 16), "batch": 4}}
RESULT_TAG = "RESULT "


# --------------------------------------------------------------------------- models


def cnn(lib, channels):
    nn = lib.nn
    c1, c2 = channels

    class Residual(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

        def forward(self, x):
            y = self.bn1(self.conv1(x)).relu()
            return (self.bn2(self.conv2(y)) + x).relu()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, c1, 3, padding=1, bias=False),
                                      nn.BatchNorm2d(c1), nn.ReLU())
            self.block1 = Residual(c1)
            self.down = nn.Sequential(nn.Conv2d(c1, c2, 3, stride=2, padding=1, bias=False),
                                      nn.BatchNorm2d(c2), nn.ReLU())
            self.block2 = Residual(c2)
            self.fc = nn.Linear(c2, 10)

        def forward(self, x):
            x = self.block2(self.down(self.block1(self.stem(x))))
            return self.fc(x.mean((2, 3)))
    return Net()


def build(lib, workload: str, sizes: dict, weights: dict | None):
    if workload == "gpt":
        sys.path.insert(0, os.path.join(ROOT, "examples"))
        from char_transformer import make_model
        g = sizes["gpt"]
        model = make_model(lib, vocab=g["vocab"], block=g["block"], n_embd=g["n_embd"],
                           n_head=g["n_head"], n_layer=g["n_layer"])
        opt = lambda p: lib.optim.AdamW(p, lr=3e-4, weight_decay=0.1)  # noqa: E731
    elif workload == "mlp":
        a, b, c, d = sizes["mlp"]["sizes"]
        nn = lib.nn
        model = nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, c), nn.ReLU(),
                              nn.Linear(c, d))
        opt = lambda p: lib.optim.Adam(p, lr=1e-3)  # noqa: E731
    else:
        model = cnn(lib, sizes["cnn"]["channels"])
        opt = lambda p: lib.optim.SGD(p, lr=0.01, momentum=0.9)  # noqa: E731
    if weights is not None:
        with lib.no_grad():
            for name, p in model.named_parameters():
                p.copy_(lib.tensor(weights[name]))
    return model, opt(model.parameters())


def make_data(np, workload: str, sizes: dict):
    rng = np.random.default_rng(0)
    if workload == "gpt":
        g = sizes["gpt"]
        shape = (g["batch"], g["block"])
        return rng.integers(0, g["vocab"], shape), rng.integers(0, g["vocab"], shape)
    if workload == "mlp":
        m = sizes["mlp"]
        return (rng.standard_normal((m["batch"], m["sizes"][0]), dtype=np.float32),
                rng.integers(0, 10, m["batch"]))
    b = sizes["cnn"]["batch"]
    return (rng.standard_normal((b, 3, 32, 32), dtype=np.float32), rng.integers(0, 10, b))


def step_flops(workload: str, sizes: dict) -> float:
    """Multiply-add FLOPs of one training step: each forward product's 2mnk, times 3."""
    if workload == "gpt":
        g = sizes["gpt"]
        tokens, c, t = g["batch"] * g["block"], g["n_embd"], g["block"]
        per_layer = 2 * tokens * 12 * c * c + 2 * 2 * tokens * t * c     # linears; QK^T and AV
        forward = g["n_layer"] * per_layer + 2 * tokens * c * g["vocab"]
    elif workload == "mlp":
        m = sizes["mlp"]
        s = m["sizes"]
        forward = 2 * m["batch"] * sum(a * b for a, b in zip(s, s[1:]))
    else:
        b = sizes["cnn"]["batch"]
        c1, c2 = sizes["cnn"]["channels"]
        convs = [(3, c1, 32), (c1, c1, 32), (c1, c1, 32), (c1, c2, 16), (c2, c2, 16),
                 (c2, c2, 16)]
        forward = sum(2 * b * co * hw * hw * ci * 9 for ci, co, hw in convs) + 2 * b * c2 * 10
    return 3.0 * forward


def training_step(lib, workload: str, model, opt):
    F = lib.nn.functional

    def step(x, y):
        opt.zero_grad()
        loss = model(x, y) if workload == "gpt" else F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


# --------------------------------------------------------------------------- worker


def measure(workload: str, threads: int, quick: bool, systems: tuple = SYSTEMS) -> list[dict]:
    np, fg, torch, _ = bench_training.import_libs(threads)
    sizes = QUICK if quick else FULL
    fg.manual_seed(0)
    ref, _ = build(fg, workload, sizes, None)
    weights = {k: p.detach().numpy().copy() for k, p in ref.named_parameters()}
    xn, yn = make_data(np, workload, sizes)
    steps, notes = {}, {}

    def first_calls(name, fn, calls):
        t0 = time.perf_counter()
        try:
            for _ in range(calls):
                fn()
        except Exception as e:     # a system's failure is a result, not a crash
            notes[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
            steps.pop(name, None)
            return
        notes[name] = f"first {calls} calls {time.perf_counter() - t0:.1f} s"

    if torch is not None and {"torch eager", "torch.compile"} & set(systems):
        xt, yt = torch.from_numpy(xn), torch.from_numpy(yn)
        for name in ("torch eager", "torch.compile"):
            if name == "torch.compile" and quick or name not in systems:
                continue
            model, opt = build(torch, workload, sizes, weights)
            fn = training_step(torch, workload, model, opt)
            if name == "torch.compile":
                torch._dynamo.reset()
                fn = torch.compile(fn)
            steps[name] = (lambda fn=fn: fn(xt, yt))
            if name == "torch.compile":
                first_calls(name, steps[name], 3)
    x, y = fg.tensor(xn), fg.tensor(yn)
    for name in ("fusegrad eager", "fusegrad compiled"):
        if name not in systems:
            continue
        model, opt = build(fg, workload, sizes, weights)
        fn = training_step(fg, workload, model, opt)
        if name == "fusegrad compiled":
            fn = fg.compile(fn, fullgraph=True)
        steps[name] = (lambda fn=fn: fn(x, y))
        if name == "fusegrad compiled":
            first_calls(name, steps[name], 2)
    rounds = 3 if quick else 7
    inner = {}
    for name, fn in steps.items():
        fn()
        inner[name] = bench_training.adaptive_inner(fn, 0.05 if quick else 0.3)
    times = {name: [] for name in steps}
    for _ in range(rounds):          # interleaved: a load change hits every system alike
        for name, fn in steps.items():
            t0 = time.perf_counter()
            for _ in range(inner[name]):
                fn()
            times[name].append((time.perf_counter() - t0) / inner[name])
    flops = step_flops(workload, sizes)
    return [{"workload": workload, "system": name, "threads": threads,
             "ms": statistics.median(times[name]) * 1e3 if name in times else None,
             "gflops": flops / statistics.median(times[name]) / 1e9 if name in times else None,
             "note": notes.get(name, "")} for name in SYSTEMS if name in times or name in notes]


# --------------------------------------------------------------------------- driver


def run_worker(args: list[str], threads: int) -> list[dict]:
    env = dict(os.environ, **bench_training.thread_env(threads))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True,
                          text=True, timeout=3600)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    print(f"worker {args} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
    return []


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def print_table(rows: list[dict], peaks: dict, title: str) -> None:
    print(f"\n{title}\n")
    print("| step | threads | " + " | ".join(f"{s} ms" for s in SYSTEMS) +
          " | compiled / torch eager | compiled GFLOP/s | share of GEMM peak |")
    print("|---|---|" + "---|" * (len(SYSTEMS) + 3))
    by = {(r["workload"], r["threads"], r["system"]): r for r in rows}
    for w in [w for w in WORKLOADS if any(r["workload"] == w for r in rows)]:
        for t in sorted({r["threads"] for r in rows}):
            cells = [by.get((w, t, s), {}).get("ms") for s in SYSTEMS]
            comp, torch_ms = by.get((w, t, "fusegrad compiled"), {}), cells[0]
            ratio = comp.get("ms") / torch_ms if comp.get("ms") and torch_ms else None
            peak = max(peaks.get(t, {}).values(), default=None)
            share = comp.get("gflops") / peak if comp.get("gflops") and peak else None
            print(f"| {w} | {t} | " + " | ".join(fmt(c) for c in cells) +
                  f" | {fmt(ratio, 2)} | {fmt(comp.get('gflops'))} | "
                  f"{'-' if share is None else f'{share:.0%}'} |")
    notes = [f"{r['workload']} {r['threads']}t {r['system']}: {r['note']}" for r in rows if r["note"]]
    if notes:
        print("\n" + "\n".join(notes))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--busy", action="store_true")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--only", default=",".join(WORKLOADS))
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help="which of: " + ", ".join(SYSTEMS))
    p.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        workload, threads, quick = a.worker[0], int(a.worker[1]), a.worker[2] == "1"
        bench_training.pin_threads(threads)
        systems = tuple(s for s in a.worker[3].split(",") if s)
        print(RESULT_TAG + json.dumps(measure(workload, threads, quick, systems)))
        return
    threads = [int(t) for t in a.threads.split(",") if int(t) <= (os.cpu_count() or 1)]
    peaks = machine.measured_peaks(tuple(threads))
    host, features = machine.llvm_host()
    print(f"CPU: {machine.cpu_model()} (LLVM host {host}; "
          f"{', '.join(f for f, on in features.items() if on)}); {os.cpu_count()} cores; "
          f"float32 GEMM peak (1024^3, measured now), GFLOP/s: {json.dumps(peaks)}")
    with open("/proc/loadavg") as f:
        print(f"load average before: {f.read().split()[:3]}")
    busy = None
    if a.busy:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                preexec_fn=lambda: os.sched_setaffinity(0, {max(os.sched_getaffinity(0))}))
    try:
        rows = [r for w in a.only.split(",") for t in threads
                for r in run_worker(["--worker", w, str(t), str(int(a.quick)), a.systems], t)]
        title = "ms per step, medians" + (", busy neighbour on the last core" if a.busy else "") + \
            (" (--quick sizes)" if a.quick else "")
        print_table(rows, peaks, title)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    with open("/proc/loadavg") as f:
        print(f"\nload average after: {f.read().split()[:3]}")


if __name__ == "__main__":
    main()
