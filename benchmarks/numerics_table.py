"""Measure each transcendental's max ulp error per dtype, eager and compiled; print docs/numerics.md.

For every function and dtype (float32, float16, bfloat16, float64) the inputs are: every bit pattern
for the 16-bit types (all 65,536), and for float32/float64 a stride through all bit patterns (every
sign, exponent, denormal, inf and NaN payload) plus dense uniform samples of the function's
interesting region and the edge values listed in EDGES.  The reference is numpy in long double
(x86 80-bit, 64-bit mantissa) rounded to the dtype; erf uses scipy's float64 erf (the float64 row of
erf is therefore relative to a float64 reference).  Errors are distances in the dtype's ulps
(consecutive representable values); NaN where the reference is NaN counts 0, NaN vs a number inf.

Eager runs fusegrad's numpy references (``fg.tensor(x).sin()``), compiled runs
``fg.compile(lambda t: t.sin())`` through the LLVM backend.

Run: ``python benchmarks/numerics_table.py [--quick] [--out docs/numerics.md]`` (a few minutes;
``--quick`` samples 16x fewer float32/float64 inputs).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fusegrad as fg  # noqa: E402

LD = np.longdouble


def _erf_ref(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf
    return erf(x.astype(np.float64)).astype(LD)


def _sigmoid_ref(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return LD(1) / (LD(1) + np.exp(-x))


# name -> (fusegrad function of a tensor, long-double reference, dense sampling ranges)
UNARY: dict[str, tuple[Callable, Callable, list[tuple[float, float]]]] = {
    "exp": (fg.exp, np.exp, [(-104, 89), (-1, 1)]),
    "exp2": (fg.exp2, np.exp2, [(-151, 129), (-1, 1)]),
    "expm1": (fg.expm1, np.expm1, [(-30, 89), (-0.5, 0.5)]),
    "log": (fg.log, np.log, [(0, 4), (0.9, 1.1)]),
    "log2": (fg.log2, np.log2, [(0, 4), (0.9, 1.1)]),
    "log10": (fg.log10, np.log10, [(0, 4), (0.9, 1.1)]),
    "log1p": (fg.log1p, np.log1p, [(-1, 3), (-1e-3, 1e-3)]),
    "sin": (fg.sin, np.sin, [(-10, 10), (-1e5, 1e5), (-1e10, 1e10)]),
    "cos": (fg.cos, np.cos, [(-10, 10), (-1e5, 1e5), (-1e10, 1e10)]),
    "tan": (fg.tan, np.tan, [(-10, 10), (-1e5, 1e5)]),
    "tanh": (fg.tanh, np.tanh, [(-10, 10), (-0.6, 0.6)]),
    "sigmoid": (fg.sigmoid, _sigmoid_ref, [(-105, 30), (-5, 5)]),
    "erf": (fg.erf, _erf_ref, [(-4.5, 4.5), (-1, 1)]),
    "sqrt": (fg.sqrt, np.sqrt, [(0, 4)]),
    "rsqrt": (fg.rsqrt, lambda x: LD(1) / np.sqrt(x), [(0, 4)]),
}

# pow cases: (label, fusegrad function of a tensor, long-double reference, dense ranges)
POW: list[tuple[str, Callable, Callable, list[tuple[float, float]]]] = [
    ("x ** 2", lambda t: t ** 2, lambda x: x * x, [(-10, 10)]),
    ("x ** 3", lambda t: t ** 3, lambda x: x * x * x, [(-10, 10)]),
    ("x ** 1.5", lambda t: t ** 1.5, lambda x: np.power(x, LD(1.5)), [(0, 10)]),
    ("x ** 2.5", lambda t: t ** 2.5, lambda x: np.power(x, LD(2.5)), [(0, 10)]),
    ("x ** -1.5", lambda t: t ** -1.5, lambda x: np.power(x, LD(-1.5)), [(0, 10)]),
    ("x ** 7", lambda t: t ** 7, lambda x: np.power(x, LD(7)), [(-10, 10)]),
    ("2.5 ** x", lambda t: 2.5 ** t, lambda x: np.power(LD(2.5), x), [(-100, 100)]),
    ("x ** y", None, None, [(0, 10)]),  # both random: see measure_pow_xy
]

EDGES = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, 2.0, 1e-30, -1e-30, 1e30, -1e30,
         1e-45, 1e-40, 1e-8, 3e7, 1e10, math.pi, 88.7, -88.7, 100.0, -100.0]

DTYPES = {"float32": (fg.float32, np.float32), "float16": (fg.float16, np.float16),
          "bfloat16": (fg.bfloat16, ml_dtypes.bfloat16), "float64": (fg.float64, np.float64)}
_INT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def ulp_distance(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Distance in ulps of got's dtype between two arrays of that dtype (+0 and -0 are equal)."""
    ity = _INT[got.dtype.itemsize]
    bits = got.dtype.itemsize * 8

    def ordered(a: np.ndarray) -> np.ndarray:
        b = a.view(ity).astype(object if bits == 64 else np.int64)
        mask = (1 << (bits - 1)) - 1
        return np.where(b < 0, -(b & mask), b)

    err = np.abs(ordered(got) - ordered(ref)).astype(np.float64)
    gn, rn = np.isnan(got.astype(np.float64)), np.isnan(ref.astype(np.float64))
    err[gn & rn] = 0.0
    err[gn ^ rn] = np.inf
    return err


def inputs(dtype: str, ranges: list[tuple[float, float]], quick: bool, seed: int = 0) -> np.ndarray:
    """All 16-bit patterns, or a bit-pattern stride plus dense samples for float32/float64."""
    npdt = DTYPES[dtype][1]
    rng = np.random.default_rng(seed)
    if dtype in ("float16", "bfloat16"):
        return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(npdt)
    scale = 16 if quick else 1
    if dtype == "float32":
        parts = [np.arange(0, 2**32, 2039 * scale, dtype=np.uint64).astype(np.uint32).view(np.float32)]
    else:
        parts = [rng.integers(0, 2**64, (1 << 21) // scale, dtype=np.uint64).view(np.float64)]
    for lo, hi in ranges:
        parts.append(rng.uniform(lo, hi, 200_000 // scale).astype(npdt))
    parts.append(np.array(EDGES, dtype=npdt))
    return np.concatenate(parts)


def reference(ref: Callable, x: np.ndarray) -> np.ndarray:
    """ref in long double, rounded to x's dtype (16-bit types through float64, one rounding)."""
    with np.errstate(all="ignore"):
        y = ref(x.astype(np.float64).astype(LD))
        return y.astype(np.float64).astype(x.dtype) if x.dtype.itemsize == 2 else y.astype(x.dtype)


def run(fn: Callable, x: np.ndarray, dtype: str, compiled: bool) -> np.ndarray:
    t = fg.tensor(x)
    if compiled:
        return fg.compile(fn)(t).numpy()
    with np.errstate(all="ignore"):
        return fn(t).numpy()


def measure(fn: Callable, ref: Callable, ranges, dtype: str, quick: bool) -> tuple[float, float]:
    """(eager, compiled) max ulp error of fn on dtype."""
    x = inputs(dtype, ranges, quick)
    r = reference(ref, x)
    return tuple(float(ulp_distance(run(fn, x, dtype, c), r).max()) for c in (False, True))


def measure_pow_xy(dtype: str, quick: bool) -> tuple[float, float]:
    """x ** y for random positive x (all bit patterns) and y in [-40, 40] or random bits."""
    npdt = DTYPES[dtype][1]
    rng = np.random.default_rng(1)
    x = np.abs(inputs(dtype, [(0, 10)], quick))
    y = np.where(rng.random(x.size) < 0.5, rng.uniform(-40, 40, x.size),
                 rng.permutation(inputs(dtype, [(-3, 3)], quick)[:x.size].astype(np.float64)))
    y = y.astype(npdt)
    with np.errstate(all="ignore"):
        r = np.power(x.astype(np.float64).astype(LD), y.astype(np.float64).astype(LD))
        r = r.astype(np.float64).astype(npdt) if x.dtype.itemsize == 2 else r.astype(npdt)
    tx, ty = fg.tensor(x), fg.tensor(y)
    with np.errstate(all="ignore"):
        eager = (tx ** ty).numpy()
    compiled = fg.compile(lambda a, b: a ** b)(tx, ty).numpy()
    return float(ulp_distance(eager, r).max()), float(ulp_distance(compiled, r).max())


def _fmt(v: float) -> str:
    return "inf" if math.isinf(v) else f"{v:.0f}"


def table(quick: bool) -> str:
    """The markdown table: one row per function, eager/compiled per dtype."""
    head = "| function | " + " | ".join(f"{d} eager | {d} compiled" for d in DTYPES) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(DTYPES))]
    rows = [(name, fn, ref, rg) for name, (fn, ref, rg) in UNARY.items()] + POW
    for name, fn, ref, rg in rows:
        t0 = time.perf_counter()
        cells = []
        for dtype in DTYPES:
            e, c = measure_pow_xy(dtype, quick) if fn is None else measure(fn, ref, rg, dtype, quick)
            cells += [_fmt(e), _fmt(c)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        print(lines[-1], f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return "\n".join(lines)


PREAMBLE = """# Numerics: measured accuracy of fusegrad's transcendental functions

Max error in ulps (units in the last place of the result's dtype) over each function's whole
range, for eager execution (numpy references in `fusegrad/ops/prims.py`) and compiled execution
(`fg.compile`, LLVM backend: inline vectorized float32 code from
`fusegrad/codegen/llvm/mathlib.py`; libm for float64 exp2/log2/log10/log1p/expm1/tanh/erf/pow).
float16 and bfloat16 compute in float32 and round once to the 16-bit type, as torch does on the
CPU, so 16-bit rows are 0 or 1 ulp unless a composite rounds an intermediate to 16 bits.

Inputs: all 65,536 bit patterns for the 16-bit types; for float32 every 2039th bit pattern (2.1M
values: every sign, exponent, denormal, inf, NaN) and for float64 2M random bit patterns, each
plus dense samples of the interesting region and edge values (0, -0, inf, nan, denormals, 1e30,
3e7, ...). Reference: numpy in x86 long double (64-bit mantissa) rounded to the dtype (erf:
scipy's float64 erf). NaN where the reference is NaN counts as 0; a number where NaN is expected
(or the reverse) as inf. In the float64 columns the reference is rounded twice (64-bit, then
53-bit mantissa), so 1 ulp there may be the reference's own; erf's float64 column compares two
float64 implementations (math.erf or libm against scipy), not against a wider reference.

The promise (tested in `tests/codegen/test_mathlib.py` and `tests/codegen/test_numerics.py`): every
transcendental within 2 ulp over its whole range, eager and compiled. Composites (tan = sin / cos,
rsqrt = 1 / sqrt, sigmoid) round their intermediate steps, which can add an ulp; x ** n for a
literal integer n in -1..3 is computed by products (within 1 ulp).
Eager composite ops on float32 tensors of at least `FUSEGRAD_EAGER_KERNELS` elements (gelu,
softmax, layer_norm, cross_entropy, ...) run as compiled kernels and get the compiled column's
accuracy (see `docs/design.md`).

Regenerate with `python benchmarks/numerics_table.py --out docs/numerics.md` (a few minutes).

"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16x fewer float32/float64 samples")
    parser.add_argument("--out", type=Path, help="write the markdown page here (else print it)")
    args = parser.parse_args()
    text = PREAMBLE + table(args.quick) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
