"""Accuracy, special values and vectorization of fusegrad.codegen.llvm.mathlib.

Reference: numpy in float64 rounded to float32.  The sweep covers every 2039th float32 bit
pattern (all signs, exponents and NaN payloads, ~2.1M values) plus dense samples of each
function's interesting region; each f32 function must stay within MAX_ULP everywhere.
"""

from __future__ import annotations

import functools
import math
import re

import llvmlite.binding as llvm
import llvmlite.ir as ir
import numpy as np
import pytest

from fusegrad.codegen.llvm import mathlib
from fusegrad.codegen.llvm.mathlib import SINCOS_MAX_ARG, UNARY_FUNCTIONS, build_unary_kernel, emit_unary
from fusegrad.ops.lowering import MATH_FUNCTIONS

MAX_ULP = 2  # the module docstring's promise
TRANSCENDENTAL = ("exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "tanh", "sigmoid", "erf",
                  "sin", "cos", "tan")


def _erf64(x: np.ndarray) -> np.ndarray:
    """float64 erf: scipy's ufunc when available, else math.erf lane by lane."""
    try:
        from scipy.special import erf
    except ImportError:
        return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)
    return erf(x)


REF64 = {
    "exp": np.exp,
    "exp2": np.exp2,
    "log": np.log,
    "log2": np.log2,
    "log10": np.log10,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "erf": _erf64,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "sqrt": np.sqrt,
    "abs": np.abs,
}

# Dense samples where the approximations switch branches, cancel or underflow.
DENSE = {
    "exp": [(-104.0, 89.0), (-1.0, 1.0), (-104.0, -87.0), (88.0, 89.0)],
    "exp2": [(-151.0, 129.0), (-1.0, 1.0), (-151.0, -125.0), (127.0, 128.0)],
    "log": [(0.0, 4.0), (0.5, 2.0), (0.9, 1.1)],
    "log2": [(0.0, 4.0), (0.5, 2.0), (0.9, 1.1)],
    "log10": [(0.0, 4.0), (0.5, 2.0), (0.9, 1.1), (9.0, 11.0)],
    "log1p": [(-1.0, -0.9), (-0.3, 0.42), (0.4, 3.0), (-1e-3, 1e-3)],
    "expm1": [(-30.0, 89.0), (-0.5, 0.5), (-1e-3, 1e-3), (88.0, 89.0)],
    "tanh": [(-10.0, 10.0), (-0.6, 0.6), (-1e-2, 1e-2)],
    "sigmoid": [(-105.0, 30.0), (-5.0, 5.0), (-104.0, -87.0)],
    "erf": [(-4.5, 4.5), (-1.0, 1.0), (0.8, 0.95)],
    "sin": [(-10.0, 10.0), (-1e5, 1e5), (-SINCOS_MAX_ARG, SINCOS_MAX_ARG), (SINCOS_MAX_ARG, 1e10)],
    "cos": [(-10.0, 10.0), (-1e5, 1e5), (-SINCOS_MAX_ARG, SINCOS_MAX_ARG), (-1e10, -SINCOS_MAX_ARG)],
    "tan": [(-10.0, 10.0), (-1e5, 1e5), (-SINCOS_MAX_ARG, SINCOS_MAX_ARG), (SINCOS_MAX_ARG, 1e10)],
}


def ordered(a: np.ndarray) -> np.ndarray:
    """float32 -> int64 monotone in the float order, with +0 and -0 both mapped to 0."""
    b = a.view(np.int32).astype(np.int64)
    return np.where(b < 0, -(b & 0x7FFFFFFF), b)


def ulp_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Distance in float32 ulps; 0 for NaN vs NaN, inf for NaN vs number."""
    err = np.abs(ordered(got) - ordered(ref)).astype(np.float64)
    got_nan, ref_nan = np.isnan(got), np.isnan(ref)
    err[got_nan & ref_nan] = 0.0
    err[got_nan ^ ref_nan] = np.inf
    return err


def reference(name: str, x: np.ndarray) -> np.ndarray:
    """numpy float64 result rounded to float32."""
    with np.errstate(all="ignore"):
        return REF64[name](x.astype(np.float64)).astype(np.float32)


@functools.lru_cache(maxsize=None)
def sweep_inputs(name: str) -> np.ndarray:
    """Strided bit patterns + dense uniform samples + the pi/2 multiples that stress sin/cos."""
    rng = np.random.default_rng(1234)
    parts = [np.arange(0, 2**32, 2039, dtype=np.uint64).astype(np.uint32).view(np.float32),
             np.arange(1, 1 << 23, 97, dtype=np.uint32).view(np.float32)]  # denormals
    for lo, hi in DENSE[name]:
        parts.append(rng.uniform(lo, hi, 100_000).astype(np.float32))
    if name in ("sin", "cos", "tan"):
        k = np.arange(1, 100_000, dtype=np.float64)
        near = (k * (np.pi / 2)).astype(np.float32)
        steps = np.arange(-2, 3, dtype=np.int32)
        parts.append((near.view(np.int32)[:, None] + steps).ravel().view(np.float32))
    return np.concatenate(parts)


@pytest.mark.parametrize("name", TRANSCENDENTAL)
def test_max_ulp_over_whole_range(name: str) -> None:
    x = sweep_inputs(name)
    err = ulp_error(build_unary_kernel(name)(x), reference(name, x))
    worst = int(np.argmax(err))
    print(f"{name}: max ulp {err[worst]:.0f} over {x.size} inputs")
    assert err[worst] <= MAX_ULP, f"{name}({x[worst]!r}): {err[worst]} ulp"


SPECIAL_INPUTS = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.0**-149, -(2.0**-149),
                  2.0**-126, 1e-30, -1e-30, 3.4028235e38, -3.4028235e38, 0.5, 100.0, -100.0]
EXTRA_SPECIALS = {
    "exp": [88.72283, 88.722839, 88.8, -87.33654, -103.97, -104.0, -150.0],
    "log": [2.0**-149, 1.17549435e-38, 1.0000001, 0.99999994],
    "log1p": [-0.99999994, -2.0, 1e-8, -1e-8, 0.41421354, -0.29289323],
    "expm1": [88.72283, 88.7, 88.8, -17.0, -30.0, -88.0, 2.0**-25, -(2.0**-25)],
    "tanh": [9.1, -9.1, 0.55, -0.55, 1e-5, -1e-5],
    "sigmoid": [-88.0, -95.0, -103.0, -103.97, -104.0, 17.0, 88.8],
    "erf": [3.92, 3.9, -3.9, 4.0, 10.0, 0.875, -0.875],
    "sin": [1e-20, -1e-20, math.pi, 1e4, -1e4, 3e7, 1e10, 1e30, -1e30, SINCOS_MAX_ARG, 4194305.0],
    "cos": [1e-20, -1e-20, math.pi, 1e4, -1e4, 3e7, 1e10, 1e30, -1e30, SINCOS_MAX_ARG, 4194305.0],
    "tan": [1e-20, -1e-20, math.pi / 2, -math.pi / 2, 1e4, 3e7, 1e30, -1e30, 4194305.0],
    "exp2": [128.0, 127.99999, 128.5, -126.0, -149.0, -149.5, -150.0, -150.5, -151.0, 1e-8],
    "log2": [2.0**-149, 1.17549435e-38, 1.0000001, 0.99999994, 1024.0, 0.125],
    "log10": [2.0**-149, 1.17549435e-38, 1.0000001, 0.99999994, 1000.0, 1e-30, 1e30],
}


@pytest.mark.parametrize("name", TRANSCENDENTAL + ("sqrt", "abs"))
def test_special_values(name: str) -> None:
    """NaN/Inf/signed zeros/denormals/overflow points: same value as numpy, zero signs included."""
    x = np.array(SPECIAL_INPUTS + EXTRA_SPECIALS.get(name, []), dtype=np.float32)
    got = build_unary_kernel(name)(x)
    ref = reference(name, x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=f"NaN mismatch for {name}({x})")
    exact = ~np.isfinite(ref) | (ref == 0) | (np.abs(ref) == 1)
    np.testing.assert_array_equal(got[exact], ref[exact], err_msg=f"{name}({x[exact]})")
    np.testing.assert_array_equal(np.signbit(got[exact & (ref == 0)]), np.signbit(ref[exact & (ref == 0)]),
                                  err_msg=f"sign of zero for {name}")
    assert ulp_error(got, ref).max() <= MAX_ULP


def _f32(values: list[float]) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_documented_special_cases() -> None:
    """The contract spelled out in the module docstring, independent of numpy."""
    inf, nan = np.inf, np.nan
    k = build_unary_kernel
    assert np.array_equal(k("exp")(_f32([-inf, inf, 88.8, -104.0])), _f32([0, inf, inf, 0]))
    assert np.array_equal(k("log")(_f32([0.0, inf])), _f32([-inf, inf]))
    assert np.isnan(k("log")(_f32([-1.0, -inf, nan]))).all()
    assert np.array_equal(k("tanh")(_f32([inf, -inf])), _f32([1, -1]))
    assert k("sigmoid")(_f32([-inf]))[0] == 0
    assert np.array_equal(k("erf")(_f32([inf, -inf])), _f32([1, -1]))
    for name in ("sin", "cos"):
        assert np.isnan(k(name)(_f32([inf, -inf, nan]))).all()
    for name in ("tanh", "sin", "erf", "expm1", "log1p"):
        assert np.signbit(k(name)(_f32([-0.0]))[0]), f"{name}(-0.) must be -0."
    for name in TRANSCENDENTAL:
        assert np.isnan(k(name)(_f32([nan]))[0]), f"{name}(nan)"


def test_gradual_underflow_not_flushed() -> None:
    """Denormal results are produced (flushing to zero would be up to 2**23 ulp off)."""
    x = np.linspace(-103.9, -87.4, 20_001, dtype=np.float32)
    for name in ("exp", "sigmoid"):
        got = build_unary_kernel(name)(x)
        ref = reference(name, x)
        assert (ref < np.finfo(np.float32).tiny).sum() > 10_000
        assert np.count_nonzero(got) == np.count_nonzero(ref)
        assert ulp_error(got, ref).max() <= MAX_ULP
    tiny = np.arange(1, 1 << 23, 4099, dtype=np.uint32).view(np.float32)
    for name in ("log", "log1p", "expm1", "tanh", "erf", "sin"):
        assert ulp_error(build_unary_kernel(name)(tiny), reference(name, tiny)).max() <= MAX_ULP, name


def test_below_underflow_is_exactly_plus_zero() -> None:
    """exp below -104, exp2 below -151 and sigmoid below -104 round to +0: those lanes select 0
    instead of scaling into an underflowing product (an FP assist per vector on Intel cores);
    just above the cut the denormal results are still produced."""
    x = _f32([-104.0001, -105.0, -150.0, -1e9, -3.4e38, -np.inf])
    for name in ("exp", "sigmoid"):
        got = build_unary_kernel(name)(x)
        assert got.view(np.uint32).tolist() == [0] * len(x), name
    x2 = _f32([-151.0001, -152.0, -1e9, -np.inf])
    assert build_unary_kernel("exp2")(x2).view(np.uint32).tolist() == [0] * len(x2)
    edge = np.linspace(-110.0, -100.0, 4001, dtype=np.float32)
    for name, cut in (("exp", -104.0), ("exp2", -151.0)):
        xs = edge if name == "exp" else edge - np.float32(47.0)
        got = build_unary_kernel(name)(xs)
        ref = reference(name, xs)
        assert ulp_error(got, ref).max() <= MAX_ULP, name
        assert not got[xs < cut].any()


def test_single_scaling_exp_equals_exp_where_results_are_normal(monkeypatch) -> None:
    """erf's exp(H(a) - a**2) scales by 2**k once (no clamp, no split): bit for bit the same as
    exp wherever the result is a normal float, which erf's arguments (>= -16 + H(4)) are."""
    x = np.concatenate([np.linspace(-87.0, 88.0, 400_001, dtype=np.float32),
                        np.arange(0, 1 << 32, 997, dtype=np.uint64).astype(np.uint32)
                        .view(np.float32)])
    x = x[(x >= -87.0) & (x <= 88.0)]
    ref = build_unary_kernel("exp")(x)
    monkeypatch.setitem(mathlib._F32_IMPLS, "exp", mathlib._exp_normal)
    got = mathlib.UnaryKernel("exp", "f32")(x)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


@pytest.mark.slow
def test_sincos_large_arguments_exact() -> None:
    """Regression: sin([3e7, 1e10, 1e30]) was [1, -0, 0]; the Payne-Hanek path is exact up to FLT_MAX.

    Every 97th float32 from SINCOS_MAX_ARG to the largest finite one, both signs.
    """
    x = np.float32([3e7, 1e10, 1e30])
    np.testing.assert_allclose(build_unary_kernel("sin")(x), np.sin(x.astype(np.float64)), rtol=1e-6)
    bits = np.arange(np.float32(SINCOS_MAX_ARG).view(np.int32), 0x7F800000, 97, dtype=np.int32)
    x = np.concatenate([bits.view(np.float32), -bits.view(np.float32)])
    for name in ("sin", "cos"):
        err = ulp_error(build_unary_kernel(name)(x), reference(name, x))
        assert err.max() <= MAX_ULP, f"{name}({x[np.argmax(err)]!r}): {err.max()} ulp"


def _pi_fixed_point(bits: int) -> int:
    """floor(pi * 2**bits) from Machin's formula in integers (independent of the table)."""
    def arctan_inv(n: int) -> int:
        total, term, k, sign = 0, (1 << bits) // n, 1, 1
        while term:
            total += sign * (term // k)
            term //= n * n
            k, sign = k + 2, -sign
        return total
    return 4 * (4 * arctan_inv(5) - arctan_inv(239))


def test_inv_pio4_table_matches_pi() -> None:
    """Word i of the Payne-Hanek table is floor(4/pi * 2**(7+8i)) mod 2**32."""
    guard = 300
    pi = _pi_fixed_point(guard)
    for i, word in enumerate(mathlib._INV_PIO4):
        assert ((4 << (guard + 7 + 8 * i)) // pi) & 0xFFFFFFFF == word, i


def _call_targets(optimized_ir: str) -> set[str]:
    return set(re.findall(r"\bcall\b[^@\n]*@\"?([\w.$]+)", optimized_ir))


def _has_avx() -> bool:
    mathlib._init_llvm()
    return "+avx," in llvm.get_host_cpu_features().flatten() + ","


@pytest.mark.parametrize("name", TRANSCENDENTAL)
def test_vectorized_without_libm_calls(name: str) -> None:
    """The loop must be vectorized and call nothing but inline-lowered intrinsics."""
    text = build_unary_kernel(name).optimized_ir
    widths = {int(n) for n in re.findall(r"<(\d+) x float>", text)}
    assert widths, f"{name}: loop not vectorized"
    assert max(widths) >= (8 if _has_avx() else 4)
    # f64 arithmetic: log2/log10 and the Payne-Hanek path of sin/cos; gathers and funnel shifts: its
    # 4/pi table and 64-bit fixed point
    allowed = re.compile(r"llvm\.(fmuladd|fma|fabs|copysign|sqrt)\.(v\d+)?f(32|64)"
                         r"|llvm\.masked\.gather\.v\d+i32\.v\d+p0|llvm\.fshl\.(v\d+)?i64")
    assert all(allowed.fullmatch(t) for t in _call_targets(text)), _call_targets(text)
    assert not re.search(r"@(expf|logf|tanhf|erff|sinf|cosf|expm1f|log1pf)\b", text)


def test_exp_tanh_use_wide_vectors() -> None:
    """The two functions the brief singles out: <8 x float> (AVX2) or <16 x float> (AVX-512)."""
    if not _has_avx():
        pytest.skip("host has no AVX: 4-wide vectors are the best possible")
    for name in ("exp", "tanh"):
        text = build_unary_kernel(name).optimized_ir
        assert "<8 x float>" in text or "<16 x float>" in text
        assert "prefer-vector-width" in text


def test_accuracy_without_fma() -> None:
    """fmuladd falls back to mul+add; the error budgets must still hold (sin/cos call fmaf)."""
    mathlib._init_llvm()
    host = llvm.get_host_cpu_features().flatten()
    if "+fma" not in host.split(","):
        pytest.skip("host has no FMA: the default build already covers this")
    features = re.sub(r"\+fma\b", "-fma", host)
    rng = np.random.default_rng(7)
    bits = np.arange(0, 2**32, 65_537, dtype=np.uint64).astype(np.uint32).view(np.float32)
    for name in ("exp", "exp2", "log", "log2", "log1p", "expm1", "tanh", "sigmoid", "erf", "sin"):
        kernel = build_unary_kernel(name, "f32", features)
        if name != "sin":
            assert "vfmadd" not in kernel.assembly
        lo, hi = DENSE[name][0]
        x = np.concatenate([bits, rng.uniform(lo, hi, 50_000).astype(np.float32)])
        assert ulp_error(kernel(x), reference(name, x)).max() <= MAX_ULP, name


@pytest.mark.parametrize("name", UNARY_FUNCTIONS)
def test_float64_fallbacks(name: str) -> None:
    x = np.concatenate([np.linspace(-20, 20, 4001), [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300, 700.0]])
    got = build_unary_kernel(name, "f64")(x)
    with np.errstate(all="ignore"):
        ref = REF64[name](x)
    # libm is within an ulp of numpy; sigmoid's e / (1 + e) form rounds differently from numpy's.
    rtol = 1e-15 if name == "sigmoid" else 4e-16
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=0, equal_nan=True)
    zero = ref == 0
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(ref[zero]))


@pytest.mark.parametrize("elt", [ir.FloatType(), ir.DoubleType()])
def test_emit_unary_accepts_vectors(elt: ir.Type) -> None:
    """emit_unary also works on an already-vector operand (e.g. from an SLP-style emitter)."""
    vec = ir.VectorType(elt, 4)
    module = ir.Module(name="vec_test")
    for name in UNARY_FUNCTIONS:
        fn = ir.Function(module, ir.FunctionType(vec, [vec]), name=f"f_{name}")
        builder = ir.IRBuilder(fn.append_basic_block())
        builder.ret(emit_unary(builder, name, fn.args[0]))
    mathlib._init_llvm()
    llvm.parse_assembly(str(module)).verify()


def test_rejects_unknown_inputs() -> None:
    fn = ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), []), "f")
    builder = ir.IRBuilder(fn.append_basic_block())
    with pytest.raises(ValueError):
        emit_unary(builder, "gamma", ir.Constant(ir.FloatType(), 1.0))
    with pytest.raises(TypeError):
        emit_unary(builder, "exp", ir.Constant(ir.IntType(32), 1))
    with pytest.raises(ValueError):
        build_unary_kernel("exp", "f16")


def test_every_math_primitive_has_an_inline_float32_version() -> None:
    """The math table of fusegrad.ops.lowering is the one list: the mathlib implements each
    of its functions (and the CUDA printer spells each, see test_cuda_codegen)."""
    assert set(mathlib._F32_IMPLS) == set(UNARY_FUNCTIONS) >= set(MATH_FUNCTIONS)
