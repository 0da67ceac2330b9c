"""fusegrad's benchmarks: speed against numpy (always) and torch / jax (when installed).

Every figure is a median of several timed repeats after warm-up, measured in this process
next to its baselines, and reported as a ratio. Run with ``make bench`` or
``python benchmarks/run_all.py [--quick] [--only NAME]``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from machine import describe  # noqa: E402  (benchmarks/machine.py)

import fusegrad as fg  # noqa: E402

try:  # optional peers
    import torch
except Exception:  # pragma: no cover - depends on the machine
    torch = None
try:
    import jax
    import jax.numpy as jnp
except Exception:  # pragma: no cover
    jax = None


def timeit(fn, repeats: int = 7, warmup: int = 2, inner: int = 1) -> float:
    """Median seconds per call of ``fn``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


class Table:
    def __init__(self, title: str, unit: str = "ms"):
        self.title, self.unit, self.rows = title, unit, []

    def add(self, name: str, seconds: float, base: float | None, extra: str = "") -> None:
        self.rows.append((name, seconds, base, extra))

    def show(self) -> None:
        scale = {"ms": 1e3, "us": 1e6}[self.unit]
        print(f"\n### {self.title}\n")
        print(f"| system | {self.unit} | vs numpy | notes |")
        print("|---|---|---|---|")
        for name, s, base, extra in self.rows:
            ratio = f"{s / base:.3f}" if base else "1"
            print(f"| {name} | {s * scale:.3f} | {ratio} | {extra} |")
        sys.stdout.flush()


# --------------------------------------------------------------------------- workloads


def gelu_tanh(x, a, b):
    y = x * a + b
    return 0.5 * y * (1 + ((y + 0.044715 * y ** 3) * math.sqrt(2 / math.pi)).tanh())


def bench_gelu(n: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    xn = rng.standard_normal(n, dtype=np.float32)
    a, b = 1.5, 0.25
    t = Table(f"GELU (tanh form) of x*a + b, float32, {n} elements")

    def np_gelu():
        y = xn * np.float32(a) + np.float32(b)
        return 0.5 * y * (1 + np.tanh((y + np.float32(0.044715) * y ** 3) *
                                      np.float32(math.sqrt(2 / math.pi))))
    base = timeit(np_gelu, repeats)
    t.add("numpy, unfused", base, base)
    x = fg.from_numpy(xn)
    f = fg.compile(lambda x: gelu_tanh(x, a, b))

    def steady():
        f(x)   # the output is dropped at once: the runtime reuses its buffer
    s = timeit(steady, repeats)
    gbs = 2 * n * 4 / s / 1e9
    t.add(f"fusegrad.compile, {fg.config.config.num_threads} threads, steady state", s, base,
          f"{gbs:.1f} GB/s effective; kernels: {len(f.lower(x).kernels)}")
    keep = []

    def fresh():
        keep.append(f(x))      # held: every call allocates a new output
        if len(keep) > 2:
            keep.pop(0)
    s2 = timeit(fresh, repeats)
    t.add("fusegrad.compile, fresh output each call", s2, base, f"{2 * n * 4 / s2 / 1e9:.1f} GB/s")
    if torch is not None:
        xt = torch.from_numpy(xn)
        t.add("torch eager", timeit(lambda: torch.nn.functional.gelu(xt * a + b, approximate="tanh"),
                                    repeats), base)
        tc = torch.compile(lambda x: torch.nn.functional.gelu(x * a + b, approximate="tanh"))
        t.add("torch.compile", timeit(lambda: tc(xt), repeats), base)
    if jax is not None:
        xj = jnp.asarray(xn)
        jf = jax.jit(lambda x: jax.nn.gelu(x * a + b, approximate=True))
        t.add("jax.jit", timeit(lambda: jf(xj).block_until_ready(), repeats), base)
    t.show()


def softmax(x):
    return fg.nn.functional.softmax(x, dim=-1)


def bench_rows(shape, repeats: int) -> None:
    rng = np.random.default_rng(0)
    xn = rng.standard_normal(shape, dtype=np.float32)
    wn = rng.standard_normal(shape[-1], dtype=np.float32)
    bn = rng.standard_normal(shape[-1], dtype=np.float32)
    for name in ("softmax", "layer_norm"):
        t = Table(f"last-axis {name}, {shape} float32")
        if name == "softmax":
            def np_fn():
                e = np.exp(xn - xn.max(-1, keepdims=True))
                return e / e.sum(-1, keepdims=True)
            f = fg.compile(lambda x: fg.nn.functional.softmax(x, dim=-1))
            args = (fg.from_numpy(xn),)
        else:
            def np_fn():
                mu = xn.mean(-1, keepdims=True)
                var = xn.var(-1, keepdims=True)
                return (xn - mu) / np.sqrt(var + 1e-5) * wn + bn
            f = fg.compile(lambda x, w, b: fg.nn.functional.layer_norm(x, (shape[-1],), w, b))
            args = (fg.from_numpy(xn), fg.from_numpy(wn), fg.from_numpy(bn))
        base = timeit(np_fn, repeats)
        t.add("numpy", base, base)
        t.add("fusegrad.compile", timeit(lambda: f(*args), repeats), base,
              f"kernels: {len(f.lower(*args).kernels)}")
        if torch is not None:
            xt, wt, bt = (torch.from_numpy(a) for a in (xn, wn, bn))
            if name == "softmax":
                eager = lambda: torch.softmax(xt, -1)  # noqa: E731
                comp = torch.compile(lambda x: torch.softmax(x, -1))
                t.add("torch eager", timeit(eager, repeats), base)
                t.add("torch.compile", timeit(lambda: comp(xt), repeats), base)
            else:
                ln = lambda x: torch.nn.functional.layer_norm(x, (shape[-1],), wt, bt)  # noqa: E731
                t.add("torch eager", timeit(lambda: ln(xt), repeats), base)
                comp = torch.compile(ln)
                t.add("torch.compile", timeit(lambda: comp(xt), repeats), base)
        if jax is not None:
            xj = jnp.asarray(xn)
            if name == "softmax":
                jf = jax.jit(lambda x: jax.nn.softmax(x, -1))
            else:
                def jln(x):
                    mu = x.mean(-1, keepdims=True)
                    return (x - mu) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5) * wn + bn
                jf = jax.jit(jln)
            t.add("jax.jit", timeit(lambda: jf(xj).block_until_ready(), repeats), base)
        t.show()


def bench_matmul(n: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    an = rng.standard_normal((n, n), dtype=np.float32)
    bn = rng.standard_normal((n, n), dtype=np.float32)
    t = Table(f"matmul {n}x{n}x{n} float32")
    base = timeit(lambda: an @ bn, repeats)
    flops = 2 * n ** 3
    t.add("numpy (OpenBLAS)", base, base, f"{flops / base / 1e9:.0f} GFLOP/s")
    f = fg.compile(lambda a, b: a @ b)
    a, b = fg.from_numpy(an), fg.from_numpy(bn)
    s = timeit(lambda: f(a, b), repeats)
    t.add("fusegrad.compile", s, base, f"{flops / s / 1e9:.0f} GFLOP/s")
    t.show()

    xn = rng.standard_normal((128, 784), dtype=np.float32)
    wn = rng.standard_normal((784, 256), dtype=np.float32)
    bn2 = rng.standard_normal(256, dtype=np.float32)
    t = Table("Linear + bias + ReLU, (128, 784) x (784, 256) float32", "us")

    def np_lin():
        return np.maximum(xn @ wn + bn2, 0)
    base = timeit(np_lin, repeats, inner=20)
    t.add("numpy, three steps", base, base)
    g = fg.compile(lambda x, w, b: (x @ w + b).relu())
    x, w, b = fg.from_numpy(xn), fg.from_numpy(wn), fg.from_numpy(bn2)
    t.add("fusegrad.compile", timeit(lambda: g(x, w, b), repeats, inner=20), base,
          f"kernels: {len(g.lower(x, w, b).kernels)}")
    if torch is not None:
        xt, wt, bt = (torch.from_numpy(v) for v in (xn, wn, bn2))
        t.add("torch eager", timeit(lambda: torch.relu(xt @ wt + bt), repeats, inner=20), base)
    t.show()


def bench_overhead(repeats: int) -> None:
    t = Table("call overhead, 16-element input (x * 2 + 1)", "us")
    xn = np.ones(16, dtype=np.float32)
    base = timeit(lambda: xn * 2 + 1, repeats, inner=2000)
    t.add("numpy (two ufunc calls)", base, base)
    f = fg.compile(lambda x: x * 2 + 1)
    x = fg.from_numpy(xn)
    t.add("fusegrad.compile", timeit(lambda: f(x), repeats, inner=2000), base)
    if torch is not None:
        xt = torch.from_numpy(xn)
        tc = torch.compile(lambda x: x * 2 + 1)
        t.add("torch eager", timeit(lambda: xt * 2 + 1, repeats, inner=2000), base)
        t.add("torch.compile", timeit(lambda: tc(xt), repeats, inner=2000), base)
    if jax is not None:
        jf = jax.jit(lambda x: x * 2 + 1)
        xj = jnp.asarray(xn)
        t.add("jax.jit", timeit(lambda: jf(xj).block_until_ready(), repeats, inner=2000), base)
    t.show()


def bench_reductions(repeats: int, quick: bool = False) -> None:
    """Reductions over every layout against numpy in this process: a column sum (the
    reduced axis outermost), a full sum, bias-gradient-like sums over the batch axis (with
    and without the fused SGD update), and the reductions of losses."""
    rng = np.random.default_rng(0)
    big = (1024, 1024) if quick else (4096, 1024)
    xb = rng.standard_normal(big, dtype=np.float32)
    flat = xb.reshape(-1)
    g128 = rng.standard_normal((128, 256), dtype=np.float32)
    g784 = rng.standard_normal((784, 256), dtype=np.float32)
    bias = rng.standard_normal(256, dtype=np.float32)
    cases = [
        (f"sum(0) of {big}", lambda x: x.sum(0), lambda: xb.sum(0), xb),
        (f"sum(1) of {big}", lambda x: x.sum(1), lambda: xb.sum(1), xb),
        (f"amax(0) of {big}", lambda x: x.amax(0), lambda: xb.max(0), xb),
        (f"var(0) of {big}", lambda x: x.var(0), lambda: xb.var(0, ddof=1), xb),
        (f"x - x.mean(0) of {big}", lambda x: x - x.mean(0), lambda: xb - xb.mean(0), xb),
        (f"sum() of {flat.size}", lambda x: x.sum(), lambda: flat.sum(), flat),
        (f"(x*x).mean() of {flat.size}", lambda x: (x * x).mean(),
         lambda: (flat * flat).mean(), flat),
        (f"((x*1.5).tanh()*x).sum() of {flat.size}", lambda x: ((x * 1.5).tanh() * x).sum(),
         lambda: (np.tanh(flat * np.float32(1.5)) * flat).sum(), flat),
        ("bias grad: sum(0) of (128, 256)", lambda g: g.sum(0), lambda: g128.sum(0), g128),
        ("bias grad: sum(0) of (784, 256)", lambda g: g.sum(0), lambda: g784.sum(0), g784),
        ("bias update: b - 0.1 * g.sum(0), (128, 256)", lambda g: fg.from_numpy(bias) -
         0.1 * g.sum(0), lambda: bias - np.float32(0.1) * g128.sum(0), g128),
    ]
    t = Table(f"reductions, float32, {fg.config.config.num_threads} threads", "us")
    for name, fn, np_fn, xn in cases:
        inner = 20 if xn.size < 1 << 18 else 1
        base = timeit(np_fn, repeats, inner=inner)
        f = fg.compile(fn)
        x = fg.from_numpy(xn)
        s = timeit(lambda: f(x), repeats, inner=inner)
        kernels = f.lower(x).kernels
        t.add(f"{name}: numpy", base, base)
        t.add(f"{name}: fusegrad", s, base, f"kernels: {len(kernels)}")
    t.show()


_COMPILE_SCRIPT = textwrap.dedent("""
    import math, time, sys
    t0 = time.perf_counter()
    import fusegrad as fg
    t1 = time.perf_counter()
    x = fg.randn(1 << 12)
    f = fg.compile(lambda x: 0.5 * (x * 1.5 + 0.25) * (1 + (((x * 1.5 + 0.25) + 0.044715 *
                   (x * 1.5 + 0.25) ** 3) * math.sqrt(2 / math.pi)).tanh()))
    t2 = time.perf_counter()
    f(x)
    t3 = time.perf_counter()
    from fusegrad.runtime import jit
    print((t3 - t2) * 1e3, (t1 - t0) * 1e3, jit.stats["compiles"], jit.stats["disk_hits"])
""")


def bench_compile_time(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, FUSEGRAD_CACHE_DIR=cache)
        cold, warm = [], []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as empty:
                out = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], capture_output=True,
                                     text=True, env=dict(env, FUSEGRAD_CACHE_DIR=empty), check=True)
                cold.append(float(out.stdout.split()[0]))
        subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, check=True,
                       capture_output=True)
        for _ in range(repeats):
            out = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], capture_output=True,
                                 text=True, env=env, check=True)
            warm.append(float(out.stdout.split()[0]))
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"\n### first-call compile time of GELU, fresh process (median of {repeats})\n")
    print("| cache | ms |\n|---|---|")
    print(f"| empty disk cache | {c:.1f} |\n| warm disk cache | {w:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--only", default="", help="comma-separated: gelu,rows,matmul,overhead,"
                                                   "reductions,compile")
    opts = parser.parse_args()
    repeats = 3 if opts.quick else 7
    only = set(filter(None, opts.only.split(",")))
    print(f"fusegrad {fg.__version__}; numpy {np.__version__}; torch "
          f"{getattr(torch, '__version__', 'not installed')}; jax "
          f"{getattr(jax, '__version__', 'not installed')}; threads "
          f"{fg.config.config.num_threads}")
    print(describe())
    if not only or "gelu" in only:
        bench_gelu(1 << (20 if opts.quick else 24), repeats)
    if not only or "rows" in only:
        bench_rows((1024, 1024) if opts.quick else (4096, 1024), repeats)
    if not only or "matmul" in only:
        bench_matmul(512 if opts.quick else 1024, repeats)
    if not only or "overhead" in only:
        bench_overhead(repeats)
    if not only or "reductions" in only:
        bench_reductions(repeats, opts.quick)
    if not only or "compile" in only:
        bench_compile_time(3 if opts.quick else 5)


if __name__ == "__main__":
    main()
