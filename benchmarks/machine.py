"""The machine a benchmark ran on, and its float32 GEMM peak measured in the same run.

Machines of one kind differ: a Zen 4 core peaks near 100 GFLOP/s in float32, others near
175-214, and numpy's BLAS runs AVX2 or AVX-512 kernels depending on ``OPENBLAS_CORETYPE``. A
time means little without the limit beside it, so every benchmark that states a speed prints
:func:`describe` first: the CPU model (``lscpu``'s "Model name"), LLVM's name for it, the
vector features that decide fusegrad's kernels, the BLAS setting, and the best float32 GEMM
rate numpy (and torch, when installed) reach here now.

    python benchmarks/machine.py        # the line alone
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np


def cpu_model() -> str:
    """``lscpu``'s "Model name": the ``model name`` field of /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def llvm_host() -> tuple[str, dict[str, bool]]:
    """LLVM's name for this CPU and whether it has the features fusegrad's kernels use."""
    import llvmlite.binding as llvm
    features = llvm.get_host_cpu_features()
    return llvm.get_host_cpu_name(), {f: bool(features.get(f, False))
                                      for f in ("avx2", "fma", "avx512f", "avx512bf16")}


def gemm_rate(n: int = 1024, repeats: int = 7, framework: str = "numpy") -> float:
    """The best float32 GFLOP/s of an ``n``-cubed product, with the BLAS threads as set for
    this process (``OPENBLAS_NUM_THREADS``, ``torch.set_num_threads``)."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    if framework == "torch":
        import torch
        a, b = torch.from_numpy(a), torch.from_numpy(b)
    times = []
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / min(times[2:]) / 1e9


def measured_peaks(threads: tuple[int, ...] = (1, 2), n: int = 1024) -> dict[int, dict]:
    """GFLOP/s of numpy's (and torch's, when installed) float32 ``n``-cubed GEMM at each
    thread count, each in a fresh process pinned to that many cores (BLAS thread pools are
    sized when the library is imported)."""
    peaks = {}
    for t in threads:
        if t > (os.cpu_count() or 1):
            continue
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(t), OMP_NUM_THREADS=str(t),
                   MKL_NUM_THREADS=str(t))
        done = subprocess.run([sys.executable, __file__, "--rates", str(t), str(n)], env=env,
                              capture_output=True, text=True, timeout=300)
        peaks[t] = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 \
            else {}
    return peaks


def _rates(threads: int, n: int) -> dict:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:threads]))
    rates = {"numpy": gemm_rate(n)}
    try:
        import torch
        torch.set_num_threads(threads)
        rates["torch"] = gemm_rate(n, framework="torch")
    except ImportError:
        pass
    return rates


def describe(threads: tuple[int, ...] = (1, 2), n: int = 1024) -> str:
    """One line: CPU model, LLVM host name and features, BLAS setting, and the float32 GEMM
    peak measured now at each thread count."""
    host, features = llvm_host()
    have = ", ".join(f for f, on in features.items() if on) or "none of avx2/avx512"
    blas = os.environ.get("OPENBLAS_CORETYPE")
    peaks = "; ".join(f"{t} thread{'s' * (t > 1)}: " + ", ".join(
        f"{k} {v:.0f}" for k, v in rates.items()) for t, rates in measured_peaks(threads, n).items())
    return (f"CPU: {cpu_model()} (LLVM host {host}; {have}); {os.cpu_count()} cores; "
            f"OPENBLAS_CORETYPE={blas if blas else 'unset'}; float32 GEMM peak ({n}^3, best "
            f"of 7, measured now) in GFLOP/s: {peaks}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rates"]:
        print(json.dumps(_rates(int(sys.argv[2]), int(sys.argv[3]))))
    else:
        print(describe())


def median_ms(fn, repeats: int, warmup: int = 2) -> float:
    """The median of ``repeats`` timed calls of ``fn()``, in milliseconds, after ``warmup``
    untimed ones (compiles and first-touch allocations)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)

