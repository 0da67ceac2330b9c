"""Inline, branch-free float32 approximations of transcendental functions for the LLVM backend.

Why this exists: the LLVM build we JIT with has no vector math library, so a loop that calls
``llvm.exp.f32`` or ``tanhf`` is either not vectorized or vectorized into a string of scalar libm
calls (about 50x slower than straight-line SIMD code).  Every f32 function here is emitted as plain
``fadd``/``fmul``/``llvm.fmuladd``/``select``/integer bit manipulation, which the loop and SLP
vectorizers turn into ``<8 x float>`` (AVX2) or ``<16 x float>`` (AVX-512) code.

Accuracy (measured against float64 numpy rounded to float32, see ``tests/codegen/test_mathlib.py``
and docs/numerics.md): every f32 function is within 2 ulp over its whole domain, with IEEE special
values (NaN in, NaN out; infinities; signed zeros where numpy keeps them) and gradual underflow
(denormal results are produced, never flushed; this assumes the default FTZ/DAZ-off floating-point
mode).  Measured max error (sampled bit patterns over the whole range; AVX-512, AVX2+FMA and no-FMA
builds alike): exp, exp2, log, log1p, expm1, tanh, erf, sin, tan 1 ulp; log2, log10 0 ulp (rounded once
from double); sigmoid, cos 2 ulp; pow (``emit_pow``) 1 ulp.  sin/cos/tan are exact for every finite
argument: Cody-Waite up to ``SINCOS_MAX_ARG`` (2**22), a Payne-Hanek reduction beyond; both are
computed and selected (branch-free), which makes sin/cos about twice as slow as a Cody-Waite-only
version.  log2, log10, tan and pow do part of their work in double (vectorized too).

Fast-math policy: only ``contract`` is used, and only on arithmetic whose rounding is not part of
an error-free transformation (polynomials, final combinations).  Cody-Waite reductions, Fast2Sum
corrections and the round-to-integer magic constant are emitted without flags, because
``reassoc`` would let LLVM fold ``(t + M) - M`` into ``t`` or merge the split constants.  ``nnan``,
``ninf`` and ``fast`` are never used, so NaN/Inf flow through the selects as written.

FMA: polynomials use ``llvm.fmuladd`` (fused when the target has FMA, mul+add otherwise; accuracy
holds both ways).  The sin/cos argument reduction uses ``llvm.fma`` because it needs the exact
product; on a target without FMA that lowers to a (correct but scalar) ``fmaf`` libm call.

float64: ``emit_unary`` also accepts double operands, but only ``sqrt``/``abs``/``sigmoid``'s
arithmetic are inline there; ``exp``/``log``/``sin``/``cos`` become ``llvm.<fn>.f64`` intrinsics and
``exp2``/``log2``/``log10``/``log1p``/``expm1``/``tan``/``tanh``/``erf``/``pow`` libm calls: correct
(libm accuracy) but scalar.
"""

from __future__ import annotations

import ctypes
import functools
import math
import re
from collections.abc import Callable, Sequence

import llvmlite.binding as llvm
import llvmlite.ir as ir
import numpy as np

from fusegrad.ops.lowering import MATH_FUNCTIONS, MATH_TABLE

__all__ = ["UNARY_FUNCTIONS", "SINCOS_MAX_ARG", "UnaryKernel", "build_unary_kernel", "emit_unary",
           "emit_pow"]

F32 = ir.FloatType()
F64 = ir.DoubleType()
I32 = ir.IntType(32)
I64 = ir.IntType(64)

# The math primitives (fusegrad.ops.lowering's table), and two more for tests and benchmarks.
UNARY_FUNCTIONS = MATH_FUNCTIONS + ("sigmoid", "abs")

# Largest |x| that sin/cos reduce with the fast Cody-Waite path (the quadrant must fit the 2**22
# magic rounding); larger finite |x| take the exact Payne-Hanek path, see _reduce_pio2_large.
SINCOS_MAX_ARG = float(2**22)

_POLY = ("contract",)  # rounding of these ops only feeds an error budget; fusing is welcome
_EXACT: tuple[str, ...] = ()  # error-free transformations: IEEE order must be kept

# Round-to-nearest-integer trick: adding 1.5 * 2**23 pushes the fraction bits out of a float in
# [2**23, 2**24); the low mantissa bits of the sum are then the integer in two's complement.
_MAGIC = 12582912.0
_MAGIC_BITS = 0x4B400000

_LOG2E = 1.4426950216293335
# Cody-Waite split of ln 2 (as in musl expf/logf): LN2_HI has 15 significant bits, so k * LN2_HI is
# exact for |k| < 2**9 and x - k * LN2_HI is exact by Sterbenz' lemma.
_LN2_HI = 0.693145751953125
_LN2_LO = 1.428606765330187e-06

# pi/2 as three float32s (72 bits): with an exact FMA the first step x - k * P1 is exact.
_PIO2_1 = 1.5707963705062866
_PIO2_2 = -4.371138828673793e-08
_PIO2_3 = -1.7151245100058819e-15
_TWO_OVER_PI = 0.6366197466850281
# log1p works on f = x directly when 1 + x lies in [sqrt(1/2), sqrt(2)) (musl's thresholds).
_SQRT2 = 1.4142135623730951
_SQRT1_2 = 0.7071067811865476

# Polynomial coefficients: near-minimax fits (Lawson-weighted least squares on Chebyshev nodes,
# relative error weight) rounded to float32; the fit error is quoted in ulp of the result.
# exp: e**r = 1 + r + r**2 * Q(r), |r| <= ln2/2; 0.06 ulp.
_EXP_Q = (0.4999999403953552, 0.16666515171527863, 0.04166845604777336, 0.008369418792426586,
          0.0013813144760206342)
# expm1: e**r - 1 = r + r**2 * Q(r), |r| <= ln2/2, relative to e**r - 1; 0.005 ulp.
_EXPM1_Q = (0.5, 0.1666666567325592, 0.04166634753346443, 0.008333391509950161, 0.001394165214151144,
            0.00019845958740916103)
# tanh: tanh(a) = a + a**3 * P(a**2), a <= 0.55; 0.02 ulp.
_TANH_P = (-0.33333316445350647, 0.13332585990428925, -0.05385230854153633, 0.021071678027510643,
           -0.006274238228797913)
_TANH_SMALL = 0.55
# log: 2 atanh(s) = 2s + s * z * L(z), z = s**2, |s| <= 3 - 2 sqrt(2) (musl's R(z) = z * L(z)); 0.01 ulp.
_LOG_L = (0.6666677594184875, 0.39977559447288513, 0.2987136244773865)
# sin(r) = r + r**3 * S(r**2) and cos(r) = 1 + r**2 * C(r**2), |r| <= 0.8; 1e-4 ulp.
_SIN_S = (-0.1666666716337204, 0.008333329111337662, -0.00019839162996504456, 2.716712060646387e-06)
_COS_C = (-0.5, 0.0416666679084301, -0.0013888879911974072, 2.4798757294774987e-05,
          -2.7160297122463817e-07)
# erf(a) = a + a * P(a**2) for a < 0.875 (P(0) = 2/sqrt(pi) - 1, so the leading term is exact); 0.004 ulp.
_ERF_SMALL = (0.12837916612625122, -0.37612634897232056, 0.11283732950687408, -0.026861583814024925,
              0.005206747446209192, -0.000821110385004431, 8.6753920186311e-05)
_ERF_SPLIT = 0.875
# erfc(a) = exp(H(a - 2.4375) - a**2) for 0.875 <= a <= 4 (H ~ log(erfc(a)) + a**2, smooth);
# 0.001 ulp of erf = 1 - erfc.  erf(a) rounds to 1 for a >= 3.92, so a is clamped at 4.
_ERF_LARGE = (-1.5345509052276611, -0.3598232567310333, 0.05819680914282799, -0.011409184895455837,
              0.002303777728229761, -0.00046497845323756337, 6.078465230530128e-05,
              -2.6820112907444127e-05, -9.388433568346954e-07)
_ERF_CENTER = 2.4375
_ERF_CLAMP = 4.0
# exp2: 2**r = 1 + r * P(r), |r| <= 1/2 (same Lawson fit as above); 0.78 ulp with the final rounding.
_EXP2_P = (0.6931471824645996, 0.24022650718688965, 0.055504102259874344, 0.009618038311600685,
           0.0013333935057744384, 0.00015466757758986205, 1.519614761491539e-05)

# float64 kernels used inside float32 log2/log10/pow: their error (< 2**-42 relative) is far below
# float32's, so the float32 result is rounded once from an almost exact double.
# log2(1 + f) = s * sum(c_n z**n), s = f / (2 + f), z = s**2 <= 0.0295, c_n = 2 / (ln2 (2n + 1))
# (the atanh series, truncation error below 2**-45).
_LOG2_ATANH = tuple(2.0 / (math.log(2.0) * (2 * n + 1)) for n in range(8))
# (2**r - 1) / r = sum(ln2**(n+1) r**n / (n+1)!) for |r| <= 1/2, truncation error below 2**-42.
_EXP2_TAYLOR = tuple(math.log(2.0) ** (n + 1) / math.factorial(n + 1) for n in range(10))
_MAGIC_F64 = 6755399441055744.0  # 1.5 * 2**52: rounds a double below 2**51 to an integer
_MAGIC_F64_BITS = 0x4338000000000000
_LOG10_2 = math.log10(2.0)

# Bits of 4/pi for the Payne-Hanek reduction (glibc's __inv_pio4): word i is floor(4/pi * 2**(7+8i))
# mod 2**32, so word i, i+4 and i+8 hold 96 consecutive bits starting at bit 8i (checked against a
# big-integer pi in tests/codegen/test_mathlib.py).
_INV_PIO4 = (0xa2, 0xa2f9, 0xa2f983, 0xa2f9836e, 0xf9836e4e, 0x836e4e44, 0x6e4e4415, 0x4e441529,
             0x441529fc, 0x1529fc27, 0x29fc2757, 0xfc2757d1, 0x2757d1f5, 0x57d1f534, 0xd1f534dd,
             0xf534ddc0, 0x34ddc0db, 0xddc0db62, 0xc0db6295, 0xdb629599, 0x6295993c, 0x95993c43,
             0x993c4390, 0x3c439041)
_PI_2_POW_M62 = math.pi / 2 * 2.0**-62  # one quadrant in units of the 2**-62 fixed-point fraction


# --------------------------------------------------------------------------------------------------
# Emission helpers
# --------------------------------------------------------------------------------------------------


def mangle(ty: ir.Type) -> str:
    """LLVM intrinsic name suffix of a type (``f32``, ``v8f32``, ``f16``, ``i64``...)."""
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{mangle(ty.element)}"
    if isinstance(ty, ir.FloatType):
        return "f32"
    if isinstance(ty, ir.DoubleType):
        return "f64"
    if isinstance(ty, ir.HalfType):
        return "f16"
    if isinstance(ty, ir.IntType):
        return f"i{ty.width}"
    raise TypeError(f"mathlib: unsupported type {ty}")


_mangle = mangle


def _element_type(ty: ir.Type) -> ir.Type:
    """Scalar element type of ``ty`` (``ty`` itself for scalars)."""
    return ty.element if isinstance(ty, ir.VectorType) else ty


def _declare(module: ir.Module, name: str, ret: ir.Type, args: Sequence[ir.Type]) -> ir.Function:
    """Get or declare an external function (intrinsic or libm symbol) in ``module``."""
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(ret, list(args)), name=name)


class _Emitter:
    """Emits constants and float/int operations shaped like ``x`` (scalar or vector).

    Keeps the algorithm code below readable: ``em.mul(a, b)`` instead of builder calls with
    explicit constant splats and flags.
    """

    def __init__(self, builder: ir.IRBuilder, ty: ir.Type):
        self.b = builder
        self.ty = ty
        self.count = ty.count if isinstance(ty, ir.VectorType) else 0
        self.ity = ir.VectorType(I32, self.count) if self.count else I32
        self.lty = ir.VectorType(I64, self.count) if self.count else I64

    def like(self, elt: ir.Type) -> _Emitter:
        """An emitter for ``elt`` (F32, F64) with this one's vector shape."""
        return _Emitter(self.b, ir.VectorType(elt, self.count) if self.count else elt)

    # constants ------------------------------------------------------------------------------
    def _splat(self, ty: ir.Type, value: float | int) -> ir.Constant:
        elt = _element_type(ty)
        if self.count:
            return ir.Constant(ty, [ir.Constant(elt, value)] * self.count)
        return ir.Constant(elt, value)

    def c(self, value: float) -> ir.Constant:
        """Float constant (rounded to the element type by llvmlite)."""
        return self._splat(self.ty, value)

    def ci(self, value: int) -> ir.Constant:
        """i32 constant (two's complement for values >= 2**31)."""
        return self._splat(self.ity, value - (1 << 32) if value >= 1 << 31 else value)

    def cl(self, value: int) -> ir.Constant:
        """i64 constant (two's complement for values >= 2**63)."""
        return self._splat(self.lty, value - (1 << 64) if value >= 1 << 63 else value)

    # float arithmetic -----------------------------------------------------------------------
    def add(self, a: ir.Value, b: ir.Value, flags: Sequence[str] = _POLY) -> ir.Value:
        return self.b.fadd(a, b, flags=list(flags))

    def sub(self, a: ir.Value, b: ir.Value, flags: Sequence[str] = _POLY) -> ir.Value:
        return self.b.fsub(a, b, flags=list(flags))

    def mul(self, a: ir.Value, b: ir.Value, flags: Sequence[str] = _POLY) -> ir.Value:
        return self.b.fmul(a, b, flags=list(flags))

    def div(self, a: ir.Value, b: ir.Value) -> ir.Value:
        # No 'arcp': a * (1/b) would cost an extra rounding the error budgets do not include.
        return self.b.fdiv(a, b)

    def neg(self, a: ir.Value) -> ir.Value:
        return self.b.fneg(a)

    def intrinsic(self, name: str, *args: ir.Value, flags: Sequence[str] = ()) -> ir.Value:
        """Call ``llvm.<name>.<type>`` on operands of the emitter's float type."""
        fn = _declare(self.b.module, f"llvm.{name}.{_mangle(self.ty)}", self.ty, [self.ty] * len(args))
        return self.b.call(fn, list(args), fastmath=tuple(flags))

    def mad(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        """a * b + c, fused only if the target makes it cheap (``llvm.fmuladd``)."""
        return self.intrinsic("fmuladd", a, b, c)

    def fma(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        """a * b + c with a single rounding (``llvm.fma``): needed where the product must be exact."""
        return self.intrinsic("fma", a, b, c)

    def fabs(self, a: ir.Value) -> ir.Value:
        return self.intrinsic("fabs", a)

    def copysign(self, mag: ir.Value, sign: ir.Value) -> ir.Value:
        return self.intrinsic("copysign", mag, sign)

    def poly(self, x: ir.Value, coeffs: Sequence[float]) -> ir.Value:
        """``sum(coeffs[i] * x**i)`` with fmuladd, by Estrin's scheme: pairs ``c[i] + c[i+1] x``,
        then pairs of those in ``x**2``, and so on. Its chain of dependent operations grows
        with the log of the degree instead of the degree (Horner's), which is what bounds a
        vectorized loop of polynomials (compiled float32 functions of 2**17 elements on one
        thread: exp 20-25% faster than with Horner's scheme, tanh 25%, GELU 5%); the test
        sweep's maximum errors are the same as with Horner's."""
        terms: list[ir.Value] = [self.c(coef) for coef in coeffs]
        power = x
        while len(terms) > 1:
            terms = [self.mad(terms[i + 1], power, terms[i]) if i + 1 < len(terms) else terms[i]
                     for i in range(0, len(terms), 2)]
            if len(terms) > 1:
                power = self.mul(power, power)
        return terms[0]

    # comparisons and selection --------------------------------------------------------------
    def fcmp(self, op: str, a: ir.Value, b: ir.Value) -> ir.Value:
        """Ordered comparison: false whenever an operand is NaN."""
        return self.b.fcmp_ordered(op, a, b)

    def fcmp_u(self, op: str, a: ir.Value, b: ir.Value) -> ir.Value:
        """Unordered comparison: true whenever an operand is NaN."""
        return self.b.fcmp_unordered(op, a, b)

    def select(self, cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.select(cond, a, b)

    def clamp(self, x: ir.Value, lo: float, hi: float) -> ir.Value:
        """min(max(x, lo), hi) that lets NaN through (both compares are false for NaN)."""
        x = self.select(self.fcmp(">", x, self.c(hi)), self.c(hi), x)
        return self.select(self.fcmp("<", x, self.c(lo)), self.c(lo), x)

    # integer views ---------------------------------------------------------------------------
    def bits(self, x: ir.Value) -> ir.Value:
        """The bit pattern of ``x`` as i32 (float) or i64 (double)."""
        return self.b.bitcast(x, self.lty if isinstance(_element_type(self.ty), ir.DoubleType) else self.ity)

    def from_bits(self, i: ir.Value) -> ir.Value:
        return self.b.bitcast(i, self.ty)

    def to_float(self, i: ir.Value) -> ir.Value:
        return self.b.sitofp(i, self.ty)


# --------------------------------------------------------------------------------------------------
# Shared building blocks
# --------------------------------------------------------------------------------------------------


def _round_to_int(em: _Emitter, t: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Round ``t`` (|t| < 2**22) to nearest: returns (k as float, k as i32) via the magic constant.

    Returns garbage (but no poison) for larger |t|; callers clamp or select that case away.
    """
    shifted = em.add(t, em.c(_MAGIC), _EXACT)
    return _unmagic(em, shifted)


def _unmagic(em: _Emitter, shifted: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Split ``t + MAGIC`` (already rounded) into the integer as float and as i32."""
    kf = em.sub(shifted, em.c(_MAGIC), _EXACT)
    ki = em.b.sub(em.bits(shifted), em.ci(_MAGIC_BITS))
    return kf, ki


def _pow2(em: _Emitter, k: ir.Value) -> ir.Value:
    """2**k as float for an i32 ``k`` in [-126, 127], built in the exponent field."""
    return em.from_bits(em.b.shl(em.b.add(k, em.ci(127)), em.ci(23)))


def _ldexp(em: _Emitter, p: ir.Value, k: ir.Value, zero: ir.Value | None = None) -> ir.Value:
    """p * 2**k for k in [-252, 254] with one final rounding (gradual underflow, overflow to inf);
    +0 (for p >= 0) where the mask ``zero`` is set.

    2**k alone is not representable over that range, so k is split into two halves that are
    (cf. SLEEF's ldexp2k); p * 2**k1 is exact for p near 1, the second product rounds once.
    ``zero`` replaces the second factor by 0: callers set it where p * 2**k is known to
    round to +0, because a product that underflows costs a floating-point assist of about a
    hundred cycles per vector on Intel cores, and a product with 0 costs nothing extra.
    """
    k1 = em.b.ashr(k, em.ci(1))
    k2 = em.b.sub(k, k1)
    s2 = _pow2(em, k2)
    if zero is not None:
        s2 = em.select(zero, em.c(0.0), s2)
    return em.mul(em.mul(p, _pow2(em, k1), _EXACT), s2, _EXACT)


def _reduce_ln2(em: _Emitter, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """x = k * ln2 + r with |r| <= ln2/2 (Cody-Waite, two constants); returns (r, k as i32).

    Needs |x| < 2**9 * ln2 for k * LN2_HI to be exact; callers clamp x to that range first.
    """
    kf, ki = _round_to_int(em, em.mul(x, em.c(_LOG2E), _EXACT))
    r = em.mad(kf, em.c(-_LN2_HI), x)  # exact product and exact difference: fusing changes nothing
    r = em.mad(kf, em.c(-_LN2_LO), r)
    return r, ki


def _expm1_poly(em: _Emitter, r: ir.Value) -> ir.Value:
    """e**r - 1 for |r| <= ln2/2 with small relative error (r + r**2 * Q(r))."""
    r2 = em.mul(r, r)
    return em.mad(r2, em.poly(r, _EXPM1_Q), r)


def _is_tiny(em: _Emitter, x: ir.Value, bound: float) -> ir.Value:
    """|x| < bound (false for NaN)."""
    return em.fcmp("<", em.fabs(x), em.c(bound))


# --------------------------------------------------------------------------------------------------
# float32 functions
# --------------------------------------------------------------------------------------------------


def _exp(em: _Emitter, x: ir.Value) -> ir.Value:
    """exp(x): Cody-Waite reduction by ln2, degree-6 polynomial, 2**k scaling by exponent bits.

    x is clamped to [-104, 89]: outside, exp is already 0 (below 2**-150) or inf in float32, and
    the clamp keeps k within _ldexp's range.  Overflow and gradual underflow then happen in the
    final multiply of _ldexp, so exp(88.8) = inf and exp(-100) is the correctly scaled denormal.
    Below -104 that multiply is by 0 instead (see _ldexp: masked softmax rows, exp(-inf - max),
    ran 3x slower through underflowing products).
    """
    below = em.fcmp("<", x, em.c(-104.0))
    xc = em.select(em.fcmp(">", x, em.c(89.0)), em.c(89.0), x)
    xc = em.select(below, em.c(-104.0), xc)
    p, k = _exp_parts(em, xc)
    return _ldexp(em, p, k, zero=below)


def _exp_parts(em: _Emitter, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(p, k) with exp(x) = p * 2**k, p = e**r for the reduced argument r (|r| <= ln2/2)."""
    r, k = _reduce_ln2(em, x)
    return em.add(em.c(1.0), em.mad(em.mul(r, r), em.poly(r, _EXP_Q), r)), k


def _exp_normal(em: _Emitter, x: ir.Value) -> ir.Value:
    """exp(x) for callers whose x keeps the result a normal float (-87 <= x <= 88): no clamp
    and a single scaling by 2**k (exact there, so equal to _exp bit for bit). Other x give
    garbage (no poison), for lanes a select discards."""
    p, k = _exp_parts(em, x)
    return em.mul(p, _pow2(em, k), _EXACT)


def _expm1_core(em: _Emitter, x: ir.Value) -> ir.Value:
    """expm1(x) without the tiny-|x| fix-up (used by tanh, which only calls it for |x| >= 1.1).

    With h = 2**(k-1): expm1(x) = 2 * (h * (e**r - 1) + (h - 1/2)).  h - 1/2 is exact for the
    k where it matters (k <= 25) and the final doubling is exact, so for k = 0 this returns the
    polynomial unchanged and for k > 0 nothing cancels.  Using 2**(k-1) instead of 2**k keeps
    k = 128 (x up to 88.72) finite before the doubling.  x < -30 gives -1 exactly, like libm.
    """
    xc = em.clamp(x, -30.0, 89.0)
    r, k = _reduce_ln2(em, xc)
    u = _expm1_poly(em, r)
    h = _pow2(em, em.b.sub(k, em.ci(1)))
    y = em.mad(h, u, em.sub(h, em.c(0.5), _EXACT))
    return em.mul(y, em.c(2.0), _EXACT)


def _expm1(em: _Emitter, x: ir.Value) -> ir.Value:
    """expm1(x); for |x| < 2**-25 the result is x itself (keeps -0 and denormals exact)."""
    return em.select(_is_tiny(em, x, 2.0**-25), x, _expm1_core(em, x))


def _log_core(em: _Emitter, f: ir.Value, k: ir.Value, c: ir.Value | None) -> ir.Value:
    """k * ln2 + log(1 + f) + c for f in [sqrt(2)/2 - 1, sqrt(2) - 1] (musl logf/log1pf scheme).

    log(1 + f) = 2 atanh(s), s = f / (2 + f), written as f - hfsq + s * (hfsq + R(s**2)) so the
    large terms f and k * ln2 are added last, exactly (k * LN2_HI is exact).
    """
    s = em.div(f, em.add(em.c(2.0), f))
    z = em.mul(s, s)
    rz = em.mul(z, em.poly(z, _LOG_L))
    hfsq = em.mul(em.mul(em.c(0.5), f), f)
    dk = em.to_float(k)
    low = em.mul(dk, em.c(_LN2_LO))
    if c is not None:
        low = em.add(low, c)
    t = em.mad(s, em.add(hfsq, rz), low)
    t = em.add(em.sub(t, hfsq), f)
    return em.mad(dk, em.c(_LN2_HI), t)


def _split_mantissa(em: _Emitter, ix: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Bits of a positive normal float -> (k, m) with value = 2**k * m, m in [sqrt(2)/2, sqrt(2)).

    Offsetting by 1 - sqrt(2)/2 in the bit pattern makes the exponent field roll over exactly at
    the mantissa sqrt(2) (musl's frexp-free trick); then the mantissa is re-biased around it.
    """
    ix = em.b.add(ix, em.ci(0x3F800000 - 0x3F3504F3))
    k = em.b.sub(em.b.ashr(ix, em.ci(23)), em.ci(127))
    m = em.from_bits(em.b.add(em.b.and_(ix, em.ci(0x007FFFFF)), em.ci(0x3F3504F3)))
    return k, m


def _log_specials(em: _Emitter, x: ir.Value, y: ir.Value, pole: float) -> ir.Value:
    """Patch log-like results: x == inf -> inf, x == pole -> -inf, x < pole or NaN -> NaN."""
    inf = float("inf")
    y = em.select(em.fcmp("==", x, em.c(inf)), em.c(inf), y)
    y = em.select(em.fcmp("==", x, em.c(pole)), em.c(-inf), y)
    return em.select(em.fcmp_u("<", x, em.c(pole)), em.c(float("nan")), y)


def _log(em: _Emitter, x: ir.Value) -> ir.Value:
    """log(x): exponent/mantissa split, then _log_core; denormals are pre-scaled by 2**23."""
    denorm = em.fcmp("<", x, em.c(2.0**-126))
    xs = em.select(denorm, em.mul(x, em.c(2.0**23), _EXACT), x)
    k, m = _split_mantissa(em, em.bits(xs))
    k = em.b.sub(k, em.select(denorm, em.ci(23), em.ci(0)))
    y = _log_core(em, em.sub(m, em.c(1.0), _EXACT), k, None)
    return _log_specials(em, x, y, 0.0)


def _log1p(em: _Emitter, x: ir.Value) -> ir.Value:
    """log1p(x), musl log1pf made branch-free.

    For 1 + x in [sqrt(2)/2, sqrt(2)) the core runs on f = x directly.  Otherwise u = fl(1 + x)
    is split like log, and the rounding error of 1 + x is recovered exactly by Fast2Sum
    (c = x - (u - 1) or 1 - (u - x), whichever operand is larger) and added as c / u.
    """
    one = em.c(1.0)
    u = em.add(one, x, _EXACT)
    k, m = _split_mantissa(em, em.bits(u))
    big_x = em.b.icmp_signed(">=", k, em.ci(2))
    c_big = em.sub(one, em.sub(u, x, _EXACT), _EXACT)  # x >= 1 is the larger addend
    c_small = em.sub(x, em.sub(u, one, _EXACT), _EXACT)  # 1 is the larger addend
    c = em.select(big_x, c_big, c_small)
    c = em.select(em.b.icmp_signed("<", k, em.ci(25)), em.div(c, u), em.c(0.0))
    near_one = em.b.and_(em.fcmp("<", x, em.c(_SQRT2 - 1.0)), em.fcmp(">=", x, em.c(_SQRT1_2 - 1.0)))
    f = em.select(near_one, x, em.sub(m, one, _EXACT))
    k = em.select(near_one, em.ci(0), k)
    c = em.select(near_one, em.c(0.0), c)
    y = _log_core(em, f, k, c)
    y = em.select(_is_tiny(em, x, 2.0**-25), x, y)  # log1p(x) rounds to x there; keeps -0
    return _log_specials(em, x, y, -1.0)


def _tanh(em: _Emitter, x: ir.Value) -> ir.Value:
    """tanh(x): odd polynomial for |x| < 0.55, else 1 - 2 / (expm1(2|x|) + 2); sign restored last.

    The expm1 form has no cancellation for tanh >= 0.5; |x| is clamped to 10 (tanh rounds to 1
    from 9.01 on), which also maps +-inf to +-1.
    """
    a = em.fabs(x)
    a = em.select(em.fcmp(">", a, em.c(10.0)), em.c(10.0), a)
    z = em.mul(a, a)
    small = em.mad(a, em.mul(z, em.poly(z, _TANH_P)), a)
    t = _expm1_core(em, em.add(a, a, _EXACT))
    large = em.sub(em.c(1.0), em.div(em.c(2.0), em.add(t, em.c(2.0))))
    y = em.select(em.fcmp("<", a, em.c(_TANH_SMALL)), small, large)
    return em.copysign(y, x)


def _sigmoid(em: _Emitter, x: ir.Value) -> ir.Value:
    """1 / (1 + exp(-x)), evaluated as e / (1 + e) with e = exp(-|x|) for x < 0.

    exp(-|x|) never overflows, and for very negative x the result is e itself, so sigmoid keeps
    gradual underflow down to x = -103.9 instead of flushing at exp's overflow point (-88.7).
    """
    e = _exp(em, em.neg(em.fabs(x)))
    num = em.select(em.fcmp(">=", x, em.c(0.0)), em.c(1.0), e)
    return em.div(num, em.add(em.c(1.0), e))


def _erf(em: _Emitter, x: ir.Value) -> ir.Value:
    """erf(x) on a = |x|: a + a * P(a**2) below 0.875, else 1 - exp(H(a) - a**2); sign restored last.

    The large branch needs erfc only to an absolute 2**-25 or so because erf is close to 1, so the
    rounding of a**2 (fused into the subtraction) is harmless.
    """
    a = em.fabs(x)
    a = em.select(em.fcmp(">", a, em.c(_ERF_CLAMP)), em.c(_ERF_CLAMP), a)
    small = em.mad(a, em.poly(em.mul(a, a), _ERF_SMALL), a)
    h = em.poly(em.sub(a, em.c(_ERF_CENTER), _EXACT), _ERF_LARGE)
    # a <= 4 keeps the argument >= -16 + H(4): e**-16 is far from underflow.
    erfc = _exp_normal(em, em.mad(em.neg(a), a, h))
    large = em.sub(em.c(1.0), erfc)
    y = em.select(em.fcmp("<", a, em.c(_ERF_SPLIT)), small, large)
    return em.copysign(y, x)


def _reduce_pio2(em: _Emitter, x: ir.Value, wide: bool = False) -> tuple[ir.Value, ir.Value]:
    """x = q * pi/2 + r, |r| <= ~pi/4, for |x| <= 2**22; returns (r, q as i32).

    ``wide``: r is returned as a double (the low parts of pi/2 subtracted in double), for tan.

    Cody-Waite with a 3-float pi/2 and exact FMAs: x - q * P1 is exact (both are multiples of
    2**-23 and the difference is below 2), so only the two small corrections round, relative to r.
    The first q comes from x * fl(2/pi), whose rounding can pick the wrong quadrant by one for large
    x; it is corrected from the exact x - q * P1 before the low parts are subtracted.
    """
    shifted = em.fma(x, em.c(_TWO_OVER_PI), em.c(_MAGIC))
    qf, qi = _unmagic(em, shifted)
    r1 = em.fma(qf, em.c(-_PIO2_1), x)
    df, di = _round_to_int(em, em.mul(r1, em.c(_TWO_OVER_PI), _EXACT))
    r1 = em.fma(df, em.c(-_PIO2_1), r1)
    qf = em.add(qf, df, _EXACT)
    if wide:
        ed = em.like(F64)
        r = ed.mad(em.b.fpext(qf, ed.ty), ed.c(-(_PIO2_2 + _PIO2_3)), em.b.fpext(r1, ed.ty))
        return r, em.b.add(qi, di)
    r = em.fma(qf, em.c(-_PIO2_2), r1)
    r = em.fma(qf, em.c(-_PIO2_3), r)
    return r, em.b.add(qi, di)


def _inv_pio4_table(module: ir.Module) -> ir.GlobalVariable:
    """The module's constant copy of _INV_PIO4 (one per module, shared by all kernels in it)."""
    name = "fusegrad.mathlib.inv_pio4"
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    ty = ir.ArrayType(I32, len(_INV_PIO4))
    table = ir.GlobalVariable(module, ty, name=name)
    table.global_constant = True
    table.linkage = "internal"
    table.initializer = ir.Constant(ty, [ir.Constant(I32, w - (1 << 32) if w >= 1 << 31 else w)
                                         for w in _INV_PIO4])
    return table


def _reduce_pio2_large(em: _Emitter, x: ir.Value, wide: bool = False) -> tuple[ir.Value, ir.Value]:
    """|x| = n * pi/2 + r, |r| <= ~pi/4, exact for every finite |x| >= 2; returns (r, n as i32).

    Payne-Hanek as in glibc's sinf (reduce_large): the 24-bit mantissa, pre-shifted by the low 3
    exponent bits, times the 96 bits of 4/pi that matter for this exponent (the bits above them
    only add multiples of 8 quadrants), gives the quadrant count in the top 2 bits and the
    fraction in the low 62 bits of a 64-bit integer; the fraction times pi/2 * 2**-62 is r in
    double, rounded once to float (unless ``wide``).  Integer code throughout, so it vectorizes
    (the three table words become gathers).
    """
    b = em.b
    table = _inv_pio4_table(b.module)
    ai = b.and_(em.bits(x), em.ci(0x7FFFFFFF))
    idx = b.and_(b.lshr(ai, em.ci(26)), em.ci(15))
    shift = b.and_(b.lshr(ai, em.ci(23)), em.ci(7))
    m = b.shl(b.or_(b.and_(ai, em.ci(0xFFFFFF)), em.ci(0x800000)), shift)

    def word(offset: int) -> ir.Value:
        def load(i: ir.Value) -> ir.Value:
            return b.load(b.gep(table, [ir.Constant(I32, 0), b.add(i, ir.Constant(I32, offset))],
                                inbounds=True))
        return _map_scalar(em, [idx], load, em.ity)

    m64 = b.zext(m, em.lty)
    lo = b.mul(m, word(0))  # only its low 32 bits land inside the 64-bit window
    mid = b.mul(m64, b.zext(word(4), em.lty))
    high = b.mul(m64, b.zext(word(8), em.lty))
    frac = b.add(b.or_(b.lshr(high, em.cl(32)), b.shl(b.zext(lo, em.lty), em.cl(32))), mid)
    n = b.lshr(b.add(frac, em.cl(1 << 61)), em.cl(62))
    frac = b.sub(frac, b.shl(n, em.cl(62)))
    ed = em.like(F64)
    r = ed.mul(b.sitofp(frac, ed.ty), ed.c(_PI_2_POW_M62), _EXACT)
    return (r if wide else b.fptrunc(r, em.ty)), b.trunc(n, em.ity)


def _reduce_pio2_any(em: _Emitter, x: ir.Value, wide: bool = False) -> tuple[ir.Value, ir.Value]:
    """x = q * pi/2 + r for every float32: Cody-Waite up to SINCOS_MAX_ARG, Payne-Hanek beyond.

    Both are computed and selected, so the loop stays branch-free (the Payne-Hanek part is about
    half the cost of sin).  inf gives r = x * 0 = NaN.  ``wide``: r as a double.
    """
    r, q = _reduce_pio2(em, x, wide)
    r_big, n_big = _reduce_pio2_large(em, x, wide)
    er = em.like(F64) if wide else em
    neg = em.fcmp("<", x, em.c(0.0))  # x = -(n pi/2 + r) = (-n) pi/2 + (-r)
    r_big = er.select(neg, er.neg(r_big), r_big)
    n_big = em.select(neg, em.b.neg(n_big), n_big)
    is_inf = em.fcmp("==", em.fabs(x), em.c(float("inf")))
    r_big = er.select(is_inf, er.c(float("nan")), r_big)
    big = em.fcmp(">", em.fabs(x), em.c(SINCOS_MAX_ARG))
    return er.select(big, r_big, r), em.select(big, n_big, q)


def _sin_cos_kernels(em: _Emitter, r: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(sin r, cos r) for |r| <= ~pi/4 (float or double; the fits are good to ~2**-37)."""
    z = em.mul(r, r)
    sin_r = em.mad(r, em.mul(z, em.poly(z, _SIN_S)), r)  # r + r*(...): keeps sin(-0) = -0
    cos_r = em.mad(z, em.poly(z, _COS_C), em.c(1.0))
    return sin_r, cos_r


def _sin_cos(em: _Emitter, x: ir.Value, cosine: bool) -> ir.Value:
    """sin(x) or cos(x): reduce by pi/2, evaluate both kernels, pick by quadrant, flip sign bit."""
    r, q = _reduce_pio2_any(em, x)
    sin_r, cos_r = _sin_cos_kernels(em, r)
    if cosine:
        q = em.b.add(q, em.ci(1))  # cos(x) = sin(x + pi/2)
    odd = em.b.icmp_signed("!=", em.b.and_(q, em.ci(1)), em.ci(0))
    y = em.select(odd, cos_r, sin_r)
    sign = em.b.shl(em.b.and_(q, em.ci(2)), em.ci(30))  # quadrants 2 and 3 negate
    return em.from_bits(em.b.xor(em.bits(y), sign))


def _sin(em: _Emitter, x: ir.Value) -> ir.Value:
    """sin(x); for |x| < 2**-12 the result is x itself (sin(x) rounds to x; keeps -0, denormals).

    Needed because the reduction's q * P2 term is +0 for q = 0 and would turn -0 into +0.
    """
    return em.select(_is_tiny(em, x, 2.0**-12), x, _sin_cos(em, x, cosine=False))


def _exp2(em: _Emitter, x: ir.Value) -> ir.Value:
    """exp2(x): x = k + r with r = x - round(x) exact, 2**r by polynomial, 2**k by exponent bits.

    x is clamped to [-151, 129] (0 and inf beyond, as in exp); NaN passes the clamp and the rest.
    """
    below = em.fcmp("<", x, em.c(-151.0))
    xc = em.select(em.fcmp(">", x, em.c(129.0)), em.c(129.0), x)
    xc = em.select(below, em.c(-151.0), xc)
    kf, ki = _round_to_int(em, xc)
    r = em.sub(xc, kf, _EXACT)
    p = em.mad(r, em.poly(r, _EXP2_P), em.c(1.0))
    return _ldexp(em, p, ki, zero=below)


def _log2_wide(em: _Emitter, x: ir.Value) -> ir.Value:
    """log2|x| as a double accurate to ~2**-42 relative, for float32 ``x`` (any value).

    The exponent/mantissa split is the float32 one of _log (exact); log2 of the mantissa is the
    atanh series in double.  |x| = 0, inf, NaN give -inf, inf, NaN.
    """
    ed = em.like(F64)
    a = em.fabs(x)
    denorm = em.fcmp("<", a, em.c(2.0**-126))
    xs = em.select(denorm, em.mul(a, em.c(2.0**23), _EXACT), a)
    k, m = _split_mantissa(em, em.bits(xs))
    k = em.b.sub(k, em.select(denorm, em.ci(23), em.ci(0)))
    f = em.b.fpext(em.sub(m, em.c(1.0), _EXACT), ed.ty)
    s = ed.div(f, ed.add(ed.c(2.0), f))
    y = ed.mad(s, ed.poly(ed.mul(s, s), _LOG2_ATANH), em.b.sitofp(k, ed.ty))
    inf = float("inf")
    y = ed.select(em.fcmp("==", a, em.c(inf)), ed.c(inf), y)
    y = ed.select(em.fcmp("==", a, em.c(0.0)), ed.c(-inf), y)
    return ed.select(em.fcmp_u("!=", x, x), ed.c(float("nan")), y)


def _exp2_wide(em: _Emitter, t: ir.Value) -> ir.Value:
    """2**t for a double ``t``, rounded once to float32 (gradual underflow and overflow included).

    t is clamped to [-160, 130], where 2**t is a normal double, so the double result is exact up to
    the polynomial error and the conversion to float32 is the only rounding that matters.
    """
    ed = em.like(F64)
    tc = ed.clamp(t, -160.0, 130.0)
    shifted = ed.add(tc, ed.c(_MAGIC_F64), _EXACT)
    kf = ed.sub(shifted, ed.c(_MAGIC_F64), _EXACT)
    k = em.b.sub(ed.bits(shifted), ed.cl(_MAGIC_F64_BITS))
    r = ed.sub(tc, kf, _EXACT)
    p = ed.mad(r, ed.poly(r, _EXP2_TAYLOR), ed.c(1.0))
    scale = ed.from_bits(em.b.shl(em.b.add(k, ed.cl(1023)), ed.cl(52)))
    return em.b.fptrunc(ed.mul(p, scale, _EXACT), em.ty)


def _log2(em: _Emitter, x: ir.Value) -> ir.Value:
    """log2(x) rounded once from the double log2|x|; x < 0 gives NaN."""
    y = em.b.fptrunc(_log2_wide(em, x), em.ty)
    return em.select(em.fcmp("<", x, em.c(0.0)), em.c(float("nan")), y)


def _log10(em: _Emitter, x: ir.Value) -> ir.Value:
    """log10(x) = log2(x) * log10(2), the product taken in double and rounded once."""
    ed = em.like(F64)
    y = em.b.fptrunc(ed.mul(_log2_wide(em, x), ed.c(_LOG10_2), _EXACT), em.ty)
    return em.select(em.fcmp("<", x, em.c(0.0)), em.c(float("nan")), y)


def _pow_f32(em: _Emitter, x: ir.Value, y: ir.Value) -> ir.Value:
    """x**y = 2**(y * log2|x|) with the logarithm and the product in double, rounded once.

    The double product has an absolute error below 2**-32 wherever the result is a finite nonzero
    float32, so the float32 result is within 0.51 ulp.  IEEE/numpy special cases are patched:
    pow(x, 0) = pow(1, y) = pow(-1, +-inf) = 1; a finite negative base with a non-integral
    exponent is NaN; the sign of an odd integral power comes from the sign bit of x.
    """
    ed = em.like(F64)
    t = ed.mul(em.b.fpext(y, ed.ty), _log2_wide(em, x), _EXACT)
    r = _exp2_wide(em, t)
    inf = em.c(float("inf"))
    one = em.c(1.0)
    y_int = em.fcmp("==", em.intrinsic("floor", y), y)
    half = em.mul(y, em.c(0.5), _EXACT)
    odd = em.b.and_(y_int, em.fcmp("!=", em.intrinsic("floor", half), half))
    negx = em.b.and_(em.fcmp("<", x, em.c(0.0)), em.fcmp("!=", x, em.neg(inf)))
    r = em.select(em.b.and_(negx, em.b.not_(y_int)), em.c(float("nan")), r)
    sign_bit = em.b.icmp_signed("<", em.bits(x), em.ci(0))
    r = em.select(em.b.and_(sign_bit, odd), em.neg(r), r)
    r = em.select(em.fcmp("==", y, em.c(0.0)), one, r)
    unit = em.b.or_(em.fcmp("==", x, one),
                    em.b.and_(em.fcmp("==", em.fabs(x), one), em.fcmp("==", em.fabs(y), inf)))
    return em.select(unit, one, r)


def _tan(em: _Emitter, x: ir.Value) -> ir.Value:
    """tan(x) = sin(r) / cos(r), or -cos(r) / sin(r) in odd quadrants, from one reduction.

    Reduction, kernels and quotient are in double (tan's condition number is up to 1.6 at pi/4,
    so a float32 r alone would cost 1.5 ulp) and rounded once; for |x| < 2**-12 the result is x
    itself (keeps -0 and denormals).
    """
    ed = em.like(F64)
    r, q = _reduce_pio2_any(em, x, wide=True)
    sin_r, cos_r = _sin_cos_kernels(ed, r)
    odd = em.b.icmp_signed("!=", em.b.and_(q, em.ci(1)), em.ci(0))
    num = ed.select(odd, ed.neg(cos_r), sin_r)
    den = ed.select(odd, sin_r, cos_r)
    y = em.b.fptrunc(ed.div(num, den), em.ty)
    return em.select(_is_tiny(em, x, 2.0**-12), x, y)


_F32_IMPLS: dict[str, Callable[[_Emitter, ir.Value], ir.Value]] = {
    "exp": _exp,
    "exp2": _exp2,
    "log": _log,
    "log2": _log2,
    "log10": _log10,
    "log1p": _log1p,
    "expm1": _expm1,
    "tanh": _tanh,
    "sigmoid": _sigmoid,
    "erf": _erf,
    "sin": _sin,
    "cos": lambda em, x: _sin_cos(em, x, cosine=True),
    "tan": _tan,
    "sqrt": lambda em, x: em.intrinsic("sqrt", x),
    "abs": lambda em, x: em.fabs(x),
}


# --------------------------------------------------------------------------------------------------
# float64: correct but mostly scalar fallbacks
# --------------------------------------------------------------------------------------------------

def _map_scalar(em: _Emitter, args: Sequence[ir.Value], fn: Callable[..., ir.Value],
                out_ty: ir.Type | None = None) -> ir.Value:
    """Apply a scalar emitter to each lane of vectors (libm and table loads have no vector form)."""
    if not em.count:
        return fn(*args)
    out: ir.Value = ir.Constant(out_ty or em.ty, ir.Undefined)
    for lane in range(em.count):
        idx = ir.Constant(I32, lane)
        out = em.b.insert_element(out, fn(*(em.b.extract_element(a, idx) for a in args)), idx)
    return out


def _emit_f64(em: _Emitter, name: str, x: ir.Value) -> ir.Value:
    """float64 version of ``name``: intrinsics / libm calls, inline only for sqrt, abs, sigmoid."""
    if name == "abs":
        return em.fabs(x)
    if name == "sigmoid":
        e = _emit_f64(em, "exp", em.neg(em.fabs(x)))
        num = em.select(em.fcmp(">=", x, em.c(0.0)), em.c(1.0), e)
        return em.div(num, em.add(em.c(1.0), e))
    symbol = MATH_TABLE[name].llvm_f64
    if symbol.startswith("llvm."):
        return em.intrinsic(symbol[len("llvm."):], x)
    fn = _declare(em.b.module, symbol, F64, [F64])
    return _map_scalar(em, [x], lambda v: em.b.call(fn, [v]))


def emit_unary(builder: ir.IRBuilder, name: str, x: ir.Value) -> ir.Value:
    """Emit ``name(x)`` at the builder's position and return the result value.

    ``x`` may be float, double, or a vector of either.  Supported names: ``UNARY_FUNCTIONS``.
    float32 versions are inline, branch-free and vectorizable (see the module docstring for the
    accuracy contract); float64 versions call LLVM intrinsics or libm (scalar).
    """
    if name not in _F32_IMPLS:
        raise ValueError(f"mathlib: unknown unary function {name!r}; supported: {UNARY_FUNCTIONS}")
    em = _Emitter(builder, x.type)
    elt = _element_type(x.type)
    if isinstance(elt, ir.FloatType):
        return _F32_IMPLS[name](em, x)
    if isinstance(elt, ir.DoubleType):
        return _emit_f64(em, name, x)
    raise TypeError(f"mathlib: {name} needs a float or double operand, got {x.type}")


def emit_pow(builder: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """Emit ``x ** y`` (numpy's ``power`` on floats, IEEE special cases included).

    float32 (scalar or vector): inline and vectorizable, within 1 ulp (see _pow_f32).  float64:
    libm's ``pow`` lane by lane (scalar, correctly rounded in practice).
    """
    em = _Emitter(builder, x.type)
    elt = _element_type(x.type)
    if isinstance(elt, ir.FloatType):
        return _pow_f32(em, x, y)
    if isinstance(elt, ir.DoubleType):
        fn = _declare(builder.module, "pow", F64, [F64, F64])
        return _map_scalar(em, [x, y], lambda a, b: builder.call(fn, [a, b]))
    raise TypeError(f"mathlib: pow needs float or double operands, got {x.type}")


# --------------------------------------------------------------------------------------------------
# Testing / benchmarking utility: one JIT-compiled elementwise kernel per function
# --------------------------------------------------------------------------------------------------

_DTYPES = {"f32": (F32, np.float32), "f64": (F64, np.float64)}
_KERNEL_SIG = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


@functools.lru_cache(maxsize=1)
def _init_llvm() -> None:
    """Initialize the native target once (llvmlite 0.50: ``llvm.initialize()`` must not be called)."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


def _target_machine(features: str | None) -> llvm.TargetMachine:
    """A fresh host target machine at O3 (MCJIT takes ownership, so one per engine)."""
    _init_llvm()
    target = llvm.Target.from_default_triple()
    feats = llvm.get_host_cpu_features().flatten() if features is None else features
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=feats, opt=3)


def _kernel_ir(name: str, ftype: ir.Type) -> str:
    """Textual IR of ``void kernel(T* in, T* out, i64 n) { out[i] = name(in[i]) }``."""
    module = ir.Module(name=f"mathlib_{name}")
    ptr = ir.PointerType(ftype)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, I64]), name="kernel")
    src, dst, n = fn.args
    entry, body, done = (fn.append_basic_block(label) for label in ("entry", "body", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", n, ir.Constant(I64, 0)), body, done)
    b.position_at_end(body)
    i = b.phi(I64, name="i")
    y = emit_unary(b, name, b.load(b.gep(src, [i], inbounds=True)))
    b.store(y, b.gep(dst, [i], inbounds=True))
    nxt = b.add(i, ir.Constant(I64, 1), name="i.next")
    i.add_incoming(ir.Constant(I64, 0), entry)
    i.add_incoming(nxt, body)
    b.cbranch(b.icmp_signed("<", nxt, n), body, done)
    b.position_at_end(done)
    b.ret_void()
    # llvmlite.ir cannot express string attributes; without this LLVM sticks to 256-bit vectors
    # on AVX-512 machines.
    header = re.compile(r'(define void @"?kernel"?\([^)]*\))')
    return header.sub(r'\1 "prefer-vector-width"="512"', str(module), count=1)


def _optimize(mod: llvm.ModuleRef, tm: llvm.TargetMachine) -> None:
    """O3 with loop and SLP vectorization through the new pass manager."""
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


class UnaryKernel:
    """A JIT-compiled elementwise kernel: ``kernel(x)`` returns a new array of ``name(x)``.

    ``optimized_ir`` holds the module after O3 (to check vectorization); the MCJIT engine is kept
    alive by this object.
    """

    def __init__(self, name: str, dtype: str, features: str | None = None):
        ftype, self.np_dtype = _DTYPES[dtype]
        self.name = name
        tm = _target_machine(features)
        mod = llvm.parse_assembly(_kernel_ir(name, ftype))
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        mod.verify()
        _optimize(mod, tm)
        self.optimized_ir = str(mod)
        self.assembly = tm.emit_assembly(mod)
        self._engine = llvm.create_mcjit_compiler(mod, _target_machine(features))
        self._engine.finalize_object()
        self._fn = _KERNEL_SIG(self._engine.get_function_address("kernel"))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        src = np.require(x, dtype=self.np_dtype, requirements="C")
        out = np.empty_like(src)
        self._fn(src.ctypes.data, out.ctypes.data, src.size)
        return out


@functools.lru_cache(maxsize=None)
def build_unary_kernel(name: str, dtype: str = "f32", features: str | None = None) -> UnaryKernel:
    """Build (and cache) a vectorized, JIT-compiled kernel applying ``name`` elementwise.

    ``dtype`` is ``"f32"`` or ``"f64"``; ``features`` overrides the host CPU feature string (e.g. to
    check the no-FMA lowering).  The result is callable on any array, converted to a contiguous
    array of that dtype.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"mathlib: dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return UnaryKernel(name, dtype, features)

