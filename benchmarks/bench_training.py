"""Training-step benchmarks: fusegrad eager and with the whole step compiled, against torch
eager, torch.compile and jax.jit (when installed), side by side in one process.

Workloads (float32):

- ``mlp-sgd``, ``mlp-adam``: a 784-256-256-10 MLP (ReLU, cross-entropy), batch 128, one
  ``opt.zero_grad(); loss.backward(); opt.step()`` per step, SGD (lr 0.01) or Adam.
- ``gpt``: the char transformer of ``examples/char_transformer.py`` (vocab 100, T 32, C 64,
  4 heads, 2 blocks), batch 16, AdamW with weight decay.

For each thread count (``--threads 1,2``) a worker process pins itself to that many cores and
sets every library's thread count (``FUSEGRAD_NUM_THREADS``, ``OMP_NUM_THREADS``,
``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``, XLA's flags) before numpy, torch or jax is
imported, then measures every system on the same workload, interleaved round by round:
each figure is the median of several rounds after warm-up (and after the compiles).

Fresh-process probes (one thread) give two more figures:

- first-call compile time of the compiled MLP step, with an empty kernel cache
  (``FUSEGRAD_CACHE_DIR`` a new folder) and then warm (a second process, same folder). A
  compiled step compiles twice: the first call sees no ``.grad`` and no optimizer state, the
  second is the steady step; both are reported. Python's bytecode cache is on in these
  processes (``PYTHONDONTWRITEBYTECODE`` removed), as for an installed package.
- peak memory per step, from the kernel's count of resident pages: after warm-up the probe
  resets its peak (``/proc/self/clear_refs``), runs steady steps and reads ``VmHWM``. Two
  figures: that peak minus the resident size just before those steps (what a step needs
  beyond what stays allocated between steps), and that plus the anonymous resident memory
  (``RssAnon``: data, not the code pages a library maps in) gained from before the model was
  built to after warm-up: model, gradients, optimizer state, buffers kept between steps,
  one-time library set-up, and for the compiled step what compiling left behind (the
  compile's own peak is not counted).
  ``MALLOC_MMAP_THRESHOLD_`` is fixed at 64 KiB so that freed buffers go back to the system
  instead of hiding in malloc's free lists.

Run ``python benchmarks/bench_training.py [--quick] [--threads 1,2] [--only mlp-sgd,...]``
(``make bench-training``). ``--quick`` is a smoke run: a tiny transformer, one thread, fewer
repeats, no torch.compile.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKLOADS = ("mlp-sgd", "mlp-adam", "gpt")
SYSTEMS = ("fusegrad eager", "fusegrad compiled step", "torch eager", "torch.compile step",
           "jax.jit step")
MLP_SIZES = (784, 256, 256, 10)
MLP_BATCH = 128
GPT_FULL = {"vocab": 100, "block": 32, "n_embd": 64, "n_head": 4, "n_layer": 2, "batch": 16}
GPT_QUICK = {"vocab": 20, "block": 8, "n_embd": 16, "n_head": 2, "n_layer": 1, "batch": 4}
RESULT_TAG = "RESULT "


def thread_env(threads: int) -> dict[str, str]:
    """Environment that fixes every library's thread count (read when each is imported)."""
    env = {name: str(threads) for name in ("FUSEGRAD_NUM_THREADS", "OMP_NUM_THREADS",
                                            "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads == 1:
        # XLA's CPU client runs its Eigen pool on all cores unless told otherwise.
        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    return env


def pin_threads(threads: int) -> None:
    """Set the thread environment and this process's CPU affinity; call before importing
    numpy, torch or jax (their thread pools are sized at import)."""
    os.environ.update(thread_env(threads))
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, set(cpus[:threads]))


def import_libs(threads: int):
    """numpy, fusegrad, torch and jax (None when not installed), threads set."""
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import numpy as np
    import run_all  # noqa: F401  (imports numpy, fusegrad and the optional peers)

    import fusegrad as fg
    fg.set_num_threads(threads)
    if run_all.torch is not None:
        run_all.torch.set_num_threads(threads)
    return np, fg, run_all.torch, run_all.jax


# --------------------------------------------------------------------------- models


def mlp(nn):
    """The 784-256-256-10 MLP on ``nn`` (fusegrad's or torch's)."""
    a, b, c, d = MLP_SIZES
    return nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, c), nn.ReLU(), nn.Linear(c, d))


def make_optimizer(lib, workload: str, params):
    if workload == "mlp-sgd":
        return lib.optim.SGD(params, lr=0.01)
    if workload == "mlp-adam":
        return lib.optim.Adam(params, lr=1e-3)
    return lib.optim.AdamW(params, lr=3e-3, weight_decay=0.1)


def make_data(np, workload: str, gpt: dict):
    rng = np.random.default_rng(0)
    if workload.startswith("mlp"):
        return (rng.standard_normal((MLP_BATCH, MLP_SIZES[0]), dtype=np.float32),
                rng.integers(0, MLP_SIZES[-1], MLP_BATCH))
    shape = (gpt["batch"], gpt["block"])
    return rng.integers(0, gpt["vocab"], shape), rng.integers(0, gpt["vocab"], shape)


def build(lib, workload: str, gpt: dict, weights: dict | None):
    """Model and optimizer on ``lib`` (fusegrad or torch), loaded with ``weights`` (numpy
    arrays by parameter name) so that every system starts from the same point."""
    if workload.startswith("mlp"):
        model = mlp(lib.nn)
    else:
        from char_transformer import make_model
        model = make_model(lib, vocab=gpt["vocab"], block=gpt["block"], n_embd=gpt["n_embd"],
                           n_head=gpt["n_head"], n_layer=gpt["n_layer"])
    if weights is not None:
        with lib.no_grad():
            for name, p in model.named_parameters():
                p.copy_(lib.tensor(weights[name]))
    return model, make_optimizer(lib, workload, model.parameters())


def training_step(lib, workload: str, model, opt):
    """The user's step: zero_grad, forward, loss, backward, update."""
    F = lib.nn.functional

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y) if workload.startswith("mlp") else model(x, y)
        loss.backward()
        opt.step()
        return loss
    return step


# --------------------------------------------------------------------------- jax, by hand


def jax_step(jax, workload: str, gpt: dict, weights: dict):
    """A jitted step equivalent to the torch one: (params, state, x, y) -> (params, state,
    loss), params and state donated, written with jax.numpy and a hand-written optimizer."""
    jnp = jax.numpy

    def cross_entropy(logits, y):
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))

    def linear(p, name, x):
        return x @ p[name + ".weight"].T + p[name + ".bias"]

    def layer_norm(p, name, x):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5) * p[name + ".weight"] + p[name + ".bias"]

    def mlp_loss(p, x, y):
        h = jax.nn.relu(linear(p, "0", x))
        h = jax.nn.relu(linear(p, "2", h))
        return cross_entropy(linear(p, "4", h), y)

    C, H = gpt["n_embd"], gpt["n_head"]
    T = gpt["block"]
    causal = jnp.tril(jnp.ones((T, T), bool))

    def gpt_loss(p, idx, tgt):
        B, T = idx.shape
        x = p["tok.weight"][idx] + p["pos.weight"][:T]
        for i in range(gpt["n_layer"]):
            b = f"blocks.{i}."
            q, k, v = jnp.split(linear(p, b + "qkv", layer_norm(p, b + "ln1", x)), 3, axis=2)
            q, k, v = (t.reshape(B, T, H, C // H).transpose(0, 2, 1, 3) for t in (q, k, v))
            att = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(C // H))
            att = jax.nn.softmax(jnp.where(causal[:T, :T], att, -jnp.inf), axis=-1)
            y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
            x = x + linear(p, b + "proj", y)
            h = jax.nn.gelu(linear(p, b + "fc", layer_norm(p, b + "ln2", x)), approximate=False)
            x = x + linear(p, b + "out", h)
        logits = linear(p, "head", layer_norm(p, "ln", x))
        return cross_entropy(logits.reshape(B * T, -1), tgt.reshape(B * T))

    loss_fn = mlp_loss if workload.startswith("mlp") else gpt_loss
    tmap = jax.tree_util.tree_map
    params = {k: jnp.asarray(v) for k, v in weights.items()}

    if workload == "mlp-sgd":
        def update(p, g, s):
            return tmap(lambda w, d: w - 0.01 * d, p, g), s
        state = 0
    else:
        lr, b1, b2, eps = (1e-3 if workload == "mlp-adam" else 3e-3), 0.9, 0.999, 1e-8
        wd = 0.0 if workload == "mlp-adam" else 0.1

        def update(p, g, s):
            m, v, t = s
            t = t + 1
            m = tmap(lambda a, d: b1 * a + (1 - b1) * d, m, g)
            v = tmap(lambda a, d: b2 * a + (1 - b2) * d * d, v, g)
            c1, c2 = 1 - b1 ** t, 1 - b2 ** t
            p = tmap(lambda w: w * (1 - lr * wd), p)     # AdamW's decoupled decay
            p = tmap(lambda w, a, b: w - lr * (a / c1) / (jnp.sqrt(b / c2) + eps), p, m, v)
            return p, (m, v, t)
        zeros = tmap(jnp.zeros_like, params)
        state = (zeros, tmap(jnp.zeros_like, params), jnp.zeros((), jnp.float32))

    def step(p, s, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        p, s = update(p, g, s)
        return p, s, loss
    return jax.jit(step, donate_argnums=(0, 1)), params, state


# --------------------------------------------------------------------------- worker


def adaptive_inner(fn, target_s: float) -> int:
    """Calls per timed repeat so that one repeat takes about ``target_s``."""
    t0 = time.perf_counter()
    fn()
    return max(1, min(50, int(target_s / max(time.perf_counter() - t0, 1e-6))))


def measure_workload(workload: str, threads: int, quick: bool) -> list[dict]:
    """Every system's step time on ``workload``, interleaved round by round."""
    np, fg, torch, jax = import_libs(threads)
    from run_all import timeit
    gpt = GPT_QUICK if quick else GPT_FULL
    fg.manual_seed(0)
    ref, _ = build(fg, workload, gpt, None)
    weights = {k: p.detach().numpy().copy() for k, p in ref.named_parameters()}
    xn, yn = make_data(np, workload, gpt)
    steps: dict[str, object] = {}
    notes: dict[str, str] = {}

    def first_calls(name, fn, calls=2):
        """Run the compiling calls; record their time; drop the system if it fails."""
        t0 = time.perf_counter()
        try:
            for _ in range(calls):
                fn()
        except Exception as e:   # a peer's failure is a result, not a crash of the benchmark
            notes[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
            steps.pop(name, None)
            return
        notes[name] = f"first {calls} calls {time.perf_counter() - t0:.2f} s"

    x, y = fg.tensor(xn), fg.tensor(yn)
    for name, compiled in (("fusegrad eager", False), ("fusegrad compiled step", True)):
        model, opt = build(fg, workload, gpt, weights)
        step = training_step(fg, workload, model, opt)
        fn = fg.compile(step, fullgraph=True) if compiled else step
        steps[name] = (lambda fn=fn: fn(x, y))
        if compiled:
            first_calls(name, steps[name])
            if name in steps:
                notes[name] += f"; {fn.compiles} graphs, {len(fn.lower(x, y).kernels)} kernels"
    if torch is not None:
        xt, yt = torch.from_numpy(xn), torch.from_numpy(yn)
        for name in ("torch eager", "torch.compile step"):
            model, opt = build(torch, workload, gpt, weights)
            step = training_step(torch, workload, model, opt)
            if name == "torch eager":
                steps[name] = (lambda step=step: step(xt, yt))
                continue
            if quick:       # Inductor's first compile takes 10-100 s: not in a smoke run
                notes[name] = "skipped in --quick"
                continue
            import torch._dynamo
            torch._dynamo.reset()
            counters = torch._dynamo.utils.counters
            counters.clear()
            comp = torch.compile(step)
            steps[name] = (lambda comp=comp: comp(xt, yt))
            first_calls(name, steps[name], calls=3)
            if name in steps:
                notes[name] += (f"; {counters['stats']['unique_graphs']} graphs, "
                                f"{sum(counters['graph_break'].values())} graph breaks")
    if jax is not None:
        jstep, params, state = jax_step(jax, workload, gpt, weights)
        xj, yj = jax.numpy.asarray(xn), jax.numpy.asarray(yn.astype(np.int32))
        box = [params, state]

        def run_jax():
            box[0], box[1], loss = jstep(box[0], box[1], xj, yj)
            loss.block_until_ready()
        steps["jax.jit step"] = run_jax
        first_calls("jax.jit step", run_jax, calls=1)

    rounds = 3 if quick else 7
    inner = {}
    for name, fn in steps.items():
        fn()                      # warm-up
        inner[name] = adaptive_inner(fn, 0.02 if quick else 0.1)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):       # interleaved: a load change hits every system alike
        for name, fn in steps.items():
            times[name].append(timeit(fn, repeats=1, warmup=0, inner=inner[name]))
    rows = []
    for name in SYSTEMS:
        if name in times:
            rows.append({"workload": workload, "system": name, "threads": threads,
                         "ms": statistics.median(times[name]) * 1e3, "note": notes.get(name, "")})
        elif name in notes:
            rows.append({"workload": workload, "system": name, "threads": threads, "ms": None,
                         "note": notes[name]})
    return rows


# --------------------------------------------------------------------------- fresh-process probes


def rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current resident size (Linux >= 4.0); False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def probe(system: str, workload: str, quick: bool) -> dict:
    """In a fresh process: import, build, first calls (timed), then the peak resident memory
    of steady steps above the resident size before them."""
    t0 = time.perf_counter()
    np, fg, torch, _ = import_libs(1)
    out = {"import_s": time.perf_counter() - t0}
    gpt = GPT_QUICK if quick else GPT_FULL
    lib = fg if system.startswith("fusegrad") else torch
    lib.manual_seed(0)
    xn, yn = make_data(np, workload, gpt)
    x, y = (fg.tensor(xn), fg.tensor(yn)) if lib is fg else (torch.from_numpy(xn),
                                                            torch.from_numpy(yn))
    import gc
    gc.collect()
    start_anon = rss_kib("RssAnon")
    model, opt = build(lib, workload, gpt, None)
    step = training_step(lib, workload, model, opt)
    fn = fg.compile(step, fullgraph=True) if system == "fusegrad compiled step" else step
    for i in (1, 2, 3):
        t = time.perf_counter()
        fn(x, y)
        out[f"call{i}_s"] = time.perf_counter() - t
    if system == "fusegrad compiled step":
        from fusegrad.runtime import jit
        out["graph_compile_ms"] = [e.compile_ms for es in fn.cache.values() for e in es]
        out["kernel_compiles"], out["disk_hits"] = jit.stats["compiles"], jit.stats["disk_hits"]
    for _ in range(3):
        fn(x, y)
    gc.collect()
    out["peak_reset"] = reset_peak_rss()
    before, anon = rss_kib("VmRSS"), rss_kib("RssAnon")
    for _ in range(10):
        fn(x, y)
    out["step_peak_mib"] = (rss_kib("VmHWM") - before) / 1024
    # Anonymous pages only: the code pages a library maps in on first use are not data.
    out["total_peak_mib"] = out["step_peak_mib"] + (anon - start_anon) / 1024
    return out


def run_probe(system: str, workload: str, quick: bool, cache_dir: str) -> dict:
    env = dict(os.environ, **thread_env(1), FUSEGRAD_CACHE_DIR=cache_dir,
               MALLOC_MMAP_THRESHOLD_="65536")
    # Python's bytecode cache on, as in an installed package: the first call imports the
    # compiler's passes, and compiling their source on every run would be timed with it.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = [sys.executable, __file__, "--probe", system, workload] + (["--quick"] if quick else [])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    return parse_result(done, f"probe {system} {workload}")


def parse_result(done: subprocess.CompletedProcess, what: str):
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
    print(f"{what} failed (exit {done.returncode}):\n  " + "\n  ".join(tail), file=sys.stderr)
    return None


# --------------------------------------------------------------------------- report


def fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def ratio(v: float | None, base: float | None) -> str:
    return "-" if v is None or not base else f"{v / base:.2f}"


def print_table(rows: list[dict], threads: list[int], probes: dict, quick: bool) -> None:
    gpt = GPT_QUICK if quick else GPT_FULL
    titles = {"mlp-sgd": "MLP 784-256-256-10, SGD, batch 128",
              "mlp-adam": "MLP 784-256-256-10, Adam, batch 128",
              "gpt": "char transformer (vocab {vocab}, T {block}, C {n_embd}, {n_head} heads, "
                     "{n_layer} blocks), AdamW, batch {batch}".format(**gpt)}
    head = "| measurement | system | " + " | ".join(
        f"{t} thread{'s' * (t > 1)} | vs torch eager" for t in threads) + " | notes |"
    print("\n" + head)
    print("|" + "---|" * (3 + 2 * len(threads)))
    by = {(r["workload"], r["system"], r["threads"]): r for r in rows}
    for w in WORKLOADS:
        for s in SYSTEMS:
            cells = [by.get((w, s, t)) for t in threads]
            if not any(cells):
                continue
            vals = []
            for t, r in zip(threads, cells):
                base = by.get((w, "torch eager", t))
                ms = r["ms"] if r else None
                vals += [fmt(ms), ratio(ms, base["ms"] if base else None)]
            note = "; ".join(f"{t}t: {r['note']}" if len(threads) > 1 else r["note"]
                             for t, r in zip(threads, cells) if r and r["note"])
            print(f"| {titles[w]}: step ms | {s} | " + " | ".join(vals) + f" | {note} |")
    blank = " | ".join(["-"] * (2 * len(threads) - 1))
    for label, p in probes.get("compile", []):
        if p is None:
            continue
        calls = ", ".join(f"{v:.0f}" for v in p["graph_compile_ms"])
        print(f"| first calls of the compiled step, {label}, fresh process: ms | fusegrad "
              f"compiled step | {p['call1_s'] * 1e3:.0f} + {p['call2_s'] * 1e3:.0f} | {blank} | "
              f"call 1 (no .grad, no optimizer state) + call 2 (steady graph); of which graph "
              f"compile {calls} ms; {p['kernel_compiles']} LLVM modules compiled, {p['disk_hits']} "
              f"from disk; call 3 {p['call3_s'] * 1e3:.1f} ms; import {p['import_s']:.2f} s |")
    memory_rows = (("step_peak_mib", "one step's peak above the RSS before it"),
                   ("total_peak_mib", "that peak plus the anonymous RSS gained from before the "
                                      "model was built to after warm-up"))
    for w, per_system in probes.get("memory", {}).items():
        for field, what in memory_rows:
            base = per_system.get("torch eager")
            for s, p in per_system.items():
                if p is None:
                    continue
                r = ratio(p[field], base[field] if base else None)
                note = "" if p["peak_reset"] else "VmHWM could not be reset: peak since start"
                cells = [f"{p[field]:.1f}", r] + ["-"] * (2 * len(threads) - 2)
                print(f"| {titles[w]}: {what}, MiB, 1 thread | {s} | "
                      + " | ".join(cells) + f" | {note} |")
    sys.stdout.flush()


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: tiny transformer, one thread, fewer repeats, "
                        "no torch.compile")
    parser.add_argument("--threads", default=None, help="comma-separated thread counts (1,2)")
    parser.add_argument("--only", default="", help="comma-separated: mlp-sgd,mlp-adam,gpt,"
                                                   "compile,memory")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--probe", nargs=2, default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:                                   # one workload, one thread count
        threads = int(opts.threads)
        pin_threads(threads)
        print(RESULT_TAG + json.dumps(measure_workload(opts.worker, threads, opts.quick)))
        return
    if opts.probe:
        pin_threads(1)
        print(RESULT_TAG + json.dumps(probe(*opts.probe, opts.quick)))
        return

    start = time.perf_counter()
    threads = [int(t) for t in (opts.threads or ("1" if opts.quick else "1,2")).split(",")]
    only = set(filter(None, opts.only.split(","))) or set(WORKLOADS) | {"compile", "memory"}
    rows: list[dict] = []
    for w in WORKLOADS:
        if w not in only:
            continue
        for t in threads:
            print(f"[bench_training] {w}, {t} thread(s) ...", file=sys.stderr, flush=True)
            cmd = [sys.executable, __file__, "--worker", w, "--threads", str(t)]
            env = dict(os.environ, **thread_env(t))
            done = subprocess.run(cmd + (["--quick"] if opts.quick else []), env=env,
                                  capture_output=True, text=True)
            rows += parse_result(done, f"{w}, {t} threads") or []
    probes: dict = {}
    if "compile" in only or "memory" in only:
        print("[bench_training] fresh-process probes ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory() as cache:
            cold = run_probe("fusegrad compiled step", "mlp-sgd", opts.quick, cache)
            warm = run_probe("fusegrad compiled step", "mlp-sgd", opts.quick, cache)
            probes["compile"] = [("MLP SGD, empty kernel cache", cold),
                                 ("MLP SGD, warm kernel cache", warm)]
            if "memory" in only:
                memory: dict = {}
                for w in ("mlp-adam",) if opts.quick else WORKLOADS:
                    memory[w] = {s: run_probe(s, w, opts.quick, cache) for s in
                                 ("fusegrad eager", "fusegrad compiled step", "torch eager")
                                 if s != "torch eager" or importable("torch")}
                probes["memory"] = memory
    from machine import describe  # here: it imports numpy, which workers pin first
    versions = {m: module_version(m) for m in ("numpy", "torch", "jax")}
    print(f"\nfusegrad training steps; load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(describe())
    print_table(rows, threads, probes, opts.quick)
    print(f"\n({time.perf_counter() - start:.0f} s; step times: median of rounds after warm-up; "
          "memory: fresh processes, one thread, VmHWM reset after warm-up; see the docstring)")


def importable(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


def module_version(name: str) -> str:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    main()
