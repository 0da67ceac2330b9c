"""Micro-benchmark: ns/element of the inline mathlib kernels vs numpy float32 (2**22 elements).

Not a test.  Run: ``.venv/bin/python benchmarks/bench_mathlib.py [--n LOG2N] [--repeat R]``.
The JIT kernels are single-threaded, like numpy's ufuncs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fusegrad.codegen.llvm.mathlib import UNARY_FUNCTIONS, build_unary_kernel  # noqa: E402


def _scipy_erf() -> Callable[[np.ndarray], np.ndarray] | None:
    """scipy.special.erf if scipy is installed (numpy has no erf ufunc)."""
    try:
        from scipy.special import erf
    except ImportError:
        return None
    return erf


NUMPY_F32: dict[str, Callable[[np.ndarray], np.ndarray] | None] = {
    "exp": np.exp,
    "exp2": np.exp2,
    "log": np.log,
    "log2": np.log2,
    "log10": np.log10,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "tanh": np.tanh,
    "sigmoid": lambda x: np.float32(1) / (np.float32(1) + np.exp(-x)),
    "erf": _scipy_erf(),
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "sqrt": np.sqrt,
    "abs": np.abs,
}

# Input ranges that exercise the interesting (non-saturated) part of each function.
RANGES = {"log": (1e-3, 100.0), "log2": (1e-3, 100.0), "log10": (1e-3, 100.0),
          "log1p": (-0.9, 100.0), "sqrt": (0.0, 100.0), "sin": (-100.0, 100.0),
          "cos": (-100.0, 100.0), "tan": (-100.0, 100.0), "erf": (-4.0, 4.0)}


def best_time(fn: Callable[[], object], repeat: int) -> float:
    """Smallest wall time of ``repeat`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    """Print one line per function: mathlib and numpy ns/element and the speed ratio."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=22, help="log2 of the number of elements")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = 1 << args.n
    rng = np.random.default_rng(0)
    print(f"{'function':<8} {'mathlib ns/el':>14} {'numpy ns/el':>12} {'speedup':>8}")
    for name in UNARY_FUNCTIONS:
        lo, hi = RANGES.get(name, (-10.0, 10.0))
        x = rng.uniform(lo, hi, n).astype(np.float32)
        kernel = build_unary_kernel(name)
        ours = best_time(lambda k=kernel, x=x: k(x), args.repeat) / n * 1e9
        ref = NUMPY_F32.get(name)
        if ref is None:
            print(f"{name:<8} {ours:14.2f} {'n/a':>12} {'':>8}")
            continue
        with np.errstate(all="ignore"):
            theirs = best_time(lambda r=ref, x=x: r(x), args.repeat) / n * 1e9
        print(f"{name:<8} {ours:14.2f} {theirs:12.2f} {theirs / ours:7.1f}x")


if __name__ == "__main__":
    main()
