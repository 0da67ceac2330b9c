"""Special functions: ``lgamma``, ``digamma``, ``polygamma``, ``mvlgamma``, ``erfc``,
``erfinv``, ``i0``, ``igamma``/``igammac``, and the bit-level ``nextafter``, ``frexp``,
``gcd``, ``lcm``.

They are extern primitives computed in float64 with numpy and the standard library (no kernel
lowering: they run between kernels when compiled), each with its VJP in terms of the others
(``lgamma' = digamma``, ``digamma' = polygamma(1)``, ``erfinv' = sqrt(pi)/2 exp(erfinv^2)``).
"""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from fusegrad import dtypes
from fusegrad.ops.composite import _named
from fusegrad.ops.elementwise import add, exp, mul, sub
from fusegrad.ops.inplace import assign_
from fusegrad.ops.operands import _float_dtype, _promote, as_tensor_operand, cast
from fusegrad.ops.primitive import (
    Kind,
    Primitive,
    Rule,
    ShapeError,
    TensorType,
    bind,
    jvp_rule,
    no_jvp,
    register,
)
from fusegrad.ops.prims import broadcast_shapes
from fusegrad.ops.prims_common import elementwise_from_vjp
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor

FrexpResult = namedtuple("frexp", ["mantissa", "exponent"])


def _in_float64(fn):
    def impl(x, **attrs):
        with np.errstate(all="ignore"):  # poles and NaN give inf and NaN silently, as torch
            return np.asarray(fn(np.asarray(x, np.float64), **attrs)).astype(x.dtype)
    return impl


def _float_infer(name):
    def infer(x: TensorType, **attrs) -> TensorType:
        if not x.dtype.is_floating_point:
            raise ShapeError(f"{name}: expected a floating point tensor, got {x.dtype.name}")
        return x
    return infer


def _extern_unary(name, fn, vjp, grad_name, attrs=()):
    return register(Primitive(name, Kind.EXTERN, _float_infer(name), _in_float64(fn),
                              None if vjp is None else (Rule(vjp, (0,), True),), grad_name,
                              attrs=attrs))


# --------------------------------------------------------------------------- numpy references



def _lgamma_scalar_value(v: float) -> float:
    if not math.isfinite(v):
        return abs(v)                    # inf at +-inf, NaN at NaN
    if v <= 0 and v == math.floor(v):
        return math.inf                  # the poles, where math.lgamma raises
    return math.lgamma(v)


_lgamma_scalar = np.frompyfunc(_lgamma_scalar_value, 1, 1)
_erf_scalar = np.frompyfunc(math.erf, 1, 1)
_erfc_scalar = np.frompyfunc(math.erfc, 1, 1)

# Bernoulli numbers B_2 .. B_12 for the asymptotic series of digamma and Hurwitz zeta.
_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730)
_ASYMPTOTIC_FROM = 10.0
_ERFINV_NEWTON_STEPS = 4


def _lgamma_np(x):
    return np.asarray(_lgamma_scalar(x), np.float64)


def _digamma_np(x):
    """digamma: the reflection formula below 0, the recurrence up to 10, then the asymptotic
    series; -inf at +0, inf at -0 and NaN at the negative integers, as torch.

    The reflection's tan(pi x) is taken of the exact x - round(x) (tan has period pi):
    pi * x rounded lost all of x's fraction at x = -5.4e9 (digamma off in the 6th digit)."""
    pole = (x <= 0) & (x == np.floor(x))
    neg = (x < 0) & ~pole
    y = np.where(neg, 1.0 - x, x)
    result = np.where(neg, -np.pi / np.tan(np.pi * (x - np.round(x))), 0.0)
    for _ in range(int(_ASYMPTOTIC_FROM)):
        small = y < _ASYMPTOTIC_FROM
        result = result - np.where(small, 1.0 / np.where(small, y, 1.0), 0.0)
        y = np.where(small, y + 1.0, y)
    inv2 = 1.0 / (y * y)
    series = sum(b / (2 * (j + 1)) * inv2 ** (j + 1) for j, b in enumerate(_BERNOULLI))
    result = result + np.log(y) - 0.5 / y - series
    result = np.where(pole, np.where(x == 0, np.copysign(np.inf, -x), np.nan), result)
    return np.where(np.isposinf(x), np.inf, result)


def _hurwitz_zeta_np(s: int, x):
    """zeta(s, x) = sum_k (x + k)^-s for an integer s >= 2: terms summed until x + k >= 10,
    then the Euler-Maclaurin tail."""
    total = np.zeros_like(x)
    a = x.copy()
    steps = int(np.max(np.ceil(_ASYMPTOTIC_FROM - x[np.isfinite(x)]), initial=0))
    for _ in range(max(steps, 0)):
        small = a < _ASYMPTOTIC_FROM
        total = total + np.where(small, np.where(small, a, 1.0) ** -s, 0.0)
        a = np.where(small, a + 1.0, a)
    tail = a ** (1 - s) / (s - 1) + 0.5 * a ** -s
    rising = float(s)                    # s (s+1) ... (s + 2j - 2)
    factorial = 2.0                      # (2j)!
    for j, b in enumerate(_BERNOULLI, start=1):
        tail = tail + b / factorial * rising * a ** (-s - 2 * j + 1)
        rising *= (s + 2 * j - 1) * (s + 2 * j)
        factorial *= (2 * j + 1) * (2 * j + 2)
    return total + tail


def _polygamma_np(x, *, n):
    if n == 0:
        return _digamma_np(x)
    pole = (x <= 0) & (x == np.floor(x))
    sign = 1.0 if n % 2 else -1.0
    out = sign * math.factorial(n) * _hurwitz_zeta_np(n + 1, np.where(pole, 1.0, x))
    out = np.where(np.isposinf(x), 0.0, out)
    return np.where(pole, sign * np.inf, out)


def _erfinv_np(x):
    """Giles' single-precision approximation, then Newton steps on erf (on log erfc for
    |x| > 0.5, whose 1 - |x| is exact, so the steps keep their accuracy near +-1)."""
    ax = np.abs(x)
    w = -np.log((1.0 - ax) * (1.0 + ax))
    central = w < 5.0
    wc, wt = w - 2.5, np.sqrt(np.where(central, 5.0, w)) - 3.0
    pc = 2.81022636e-08
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
              -0.00417768164, 0.246640727, 1.50140941):
        pc = c + pc * wc
    pt = -0.000200214257
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
              0.00943887047, 1.00167406, 2.83297682):
        pt = c + pt * wt
    y = np.where(central, pc, pt) * ax
    ok = ax < 1.0
    y = np.where(ok, y, 0.0)
    for _ in range(_ERFINV_NEWTON_STEPS):
        slope = 2.0 / math.sqrt(math.pi) * np.exp(-y * y)
        tail = np.asarray(_erfc_scalar(y), np.float64)
        head = np.asarray(_erf_scalar(y), np.float64)
        # Near 1: Newton on log(erfc(y)) = log(1 - |x|), which converges in a few steps even
        # from far off (erfc falls like exp(-y^2)); elsewhere on erf(y) = |x|.
        with np.errstate(all="ignore"):
            step = np.where(ax > 0.5, (np.log(tail) - np.log1p(-ax)) * tail / -slope,
                            (head - ax) / slope)
        y = y - np.where(ok, step, 0.0)
    y = np.where(ax == 1.0, np.inf, np.where((ax > 1.0) | np.isnan(ax), np.nan, y))
    return np.copysign(y, x)


def _i1_np(x):
    """The modified Bessel function I1 by its power series (all terms positive)."""
    half = np.abs(x) / 2.0
    term = half.copy()
    total = term.copy()
    for k in range(1, 1000):
        term = term * half * half / (k * (k + 1))
        total = total + term
        if np.all(term <= 1e-17 * total):
            break
    return np.sign(x) * total


def _igamma_np(a, x, upper: bool):
    """Regularized incomplete gamma P(a, x) (Q with ``upper``): the series for x < a + 1,
    the continued fraction (modified Lentz) otherwise, as in Numerical Recipes."""
    with np.errstate(all="ignore"):  # the edges below are set explicitly
        return _igamma_np_unchecked(a, x, upper)


def _igamma_np_unchecked(a, x, upper: bool):
    a, x = np.broadcast_arrays(a, x)
    a, x = a.astype(np.float64), x.astype(np.float64)
    safe_a = np.where(a > 0, a, 1.0)
    safe_x = np.where(x > 0, x, 1.0)
    log_front = safe_a * np.log(safe_x) - safe_x - np.asarray(_lgamma_scalar(safe_a), np.float64)
    use_series = safe_x < safe_a + 1.0
    # Series: P = front * sum x^n / (a (a+1) ... (a+n)).
    term = 1.0 / safe_a
    total = term.copy()
    ap = safe_a.copy()
    for _ in range(500):
        ap = ap + 1.0
        term = term * safe_x / ap
        total = total + term
        if np.all(np.abs(term) <= np.abs(total) * 1e-17):
            break
    p_series = total * np.exp(log_front)
    # Continued fraction for Q.
    tiny = 1e-300
    b = safe_x + 1.0 - safe_a
    c = np.full_like(b, 1.0 / tiny)
    d = 1.0 / b
    h = d.copy()
    for i in range(1, 500):
        an = -i * (i - safe_a)
        b = b + 2.0
        d = an * d + b
        d = np.where(np.abs(d) < tiny, tiny, d)
        c = b + an / c
        c = np.where(np.abs(c) < tiny, tiny, c)
        d = 1.0 / d
        delta = d * c
        h = h * delta
        if np.all(np.abs(delta - 1.0) <= 1e-16):
            break
    q_cf = np.exp(log_front) * h
    p = np.where(use_series, p_series, 1.0 - q_cf)
    q = np.where(use_series, 1.0 - p_series, q_cf)
    out = q if upper else p
    # Edges: x == 0 gives P = 0; x == inf gives P = 1; a <= 0 or x < 0 is NaN, as torch.
    out = np.where(x == 0, 1.0 if upper else 0.0, out)
    out = np.where(np.isposinf(x), 0.0 if upper else 1.0, out)
    return np.where((a <= 0) | (x < 0) | np.isnan(a) | np.isnan(x), np.nan, out)


# --------------------------------------------------------------------------- primitives

def _polygamma_vjp(g, out, x, *, n):
    return mul(g, bind(polygamma_prim, x, n=n + 1))


lgamma_prim = _extern_unary("lgamma", _lgamma_np,
                            lambda g, out, x: mul(g, bind(polygamma_prim, x, n=0)),
                            "LgammaBackward0")
polygamma_prim = _extern_unary("polygamma", _polygamma_np, _polygamma_vjp, "PolygammaBackward0",
                               attrs=("n",))
erfc_prim = _extern_unary(
    "erfc", lambda x: np.asarray(_erfc_scalar(x), np.float64),
    lambda g, out, x: mul(g, mul(exp(mul(x, x).neg()), -2.0 / math.sqrt(math.pi))),
    "ErfcBackward0")
erfinv_prim = register(Primitive(
    "erfinv", Kind.EXTERN, _float_infer("erfinv"), _in_float64(_erfinv_np),
    (Rule(lambda g, out, x: mul(g, mul(exp(mul(out, out)), math.sqrt(math.pi) / 2)), (), True),),
    "ErfinvBackward0"))
i1_prim = _extern_unary("i1", _i1_np, None, "SpecialI1Backward0")
i0_prim = _extern_unary("i0", np.i0, lambda g, out, x: mul(g, bind(i1_prim, x)), "I0Backward0")


def _binary_infer(name, float_only):
    def infer(x: TensorType, y: TensorType) -> TensorType:
        if x.dtype is not y.dtype:
            raise ShapeError(f"{name}: operands of {x.dtype.name} and {y.dtype.name}")
        if float_only and not x.dtype.is_floating_point:
            raise ShapeError(f"{name}: expected floating point tensors, got {x.dtype.name}")
        if not float_only and (x.dtype.is_floating_point or x.dtype is dtypes.bool_):
            raise ShapeError(f"{name}: expected integer tensors, got {x.dtype.name}")
        return TensorType(broadcast_shapes(x.shape, y.shape, op=name), x.dtype)
    return infer


nextafter_prim = register(Primitive("nextafter", Kind.EXTERN, _binary_infer("nextafter", True),
                                    lambda x, y: np.nextafter(x, y), None, "NextafterBackward0"))
gcd_prim = register(Primitive("gcd", Kind.EXTERN, _binary_infer("gcd", False),
                              lambda x, y: np.gcd(x, y), None, "GcdBackward0"))
lcm_prim = register(Primitive("lcm", Kind.EXTERN, _binary_infer("lcm", False),
                              lambda x, y: np.lcm(x, y), None, "LcmBackward0"))


def _igamma_x_vjp(upper: bool):
    # d/dx P(a, x) = x^(a-1) e^-x / Gamma(a); Q = 1 - P. torch has no gradient for a.
    def vjp(g, out, a, x):
        density = exp(sub(sub(mul(sub(a, 1.0), x.log()), x), bind(lgamma_prim, a)))
        grad = mul(g, density.neg() if upper else density)
        # x may have been broadcast against a: its cotangent sums over the broadcast dims.
        return grad.sum_to_size(tuple(x.shape)) if tuple(grad.shape) != tuple(x.shape) else grad
    return Rule(vjp, (0, 1))


igamma_prim = register(Primitive(
    "igamma", Kind.EXTERN, _binary_infer("igamma", True),
    lambda a, x: _igamma_np(a, x, False).astype(a.dtype), (None, _igamma_x_vjp(False)),
    "IgammaBackward0"))
igammac_prim = register(Primitive(
    "igammac", Kind.EXTERN, _binary_infer("igammac", True),
    lambda a, x: _igamma_np(a, x, True).astype(a.dtype), (None, _igamma_x_vjp(True)),
    "IgammacBackward0"))


def _frexp_mantissa(x):
    return np.frexp(x)[0]


frexp_mantissa_prim = register(Primitive(
    "frexp_mantissa", Kind.EXTERN, _float_infer("frexp"), _frexp_mantissa,
    (Rule(lambda g, out, x: mul(g, bind(frexp_mantissa_prim, x) / x), (0,)),), "FrexpBackward0"))
frexp_exponent_prim = register(Primitive(
    "frexp_exponent", Kind.EXTERN,
    lambda x: TensorType(_float_infer("frexp")(x).shape, dtypes.int32),
    lambda x: np.frexp(x)[1].astype(np.int32), None, "FrexpBackward0"))


# --------------------------------------------------------------------------- public ops

def _as_float(x) -> Tensor:
    x = as_tensor_operand(x)
    return cast(x, _float_dtype(x.dtype))


@public(torch=True, method=True, inplace=True)
def lgamma(x: Tensor) -> Tensor:
    """``log |Gamma(x)|`` (inf at the poles)."""
    return bind(lgamma_prim, _as_float(x))


@public(torch=True, method=True, inplace=True)
def digamma(x: Tensor) -> Tensor:
    """The logarithmic derivative of Gamma (-inf at 0, NaN at the negative integers)."""
    return _named(bind(polygamma_prim, _as_float(x), n=0), "DigammaBackward0")


@public(torch=True)
def polygamma(n: int, x: Tensor) -> Tensor:
    """The ``n``-th derivative of digamma."""
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")
    return bind(polygamma_prim, _as_float(x), n=int(n))


def _polygamma_method(x: Tensor, n: int) -> Tensor:
    """``x.polygamma(n)``: torch's method takes ``n`` after the tensor."""
    return polygamma(n, x)


def _polygamma_inplace(x: Tensor, n: int) -> Tensor:
    return assign_(x, polygamma(n, x), "polygamma_")


# torch's method puts ``n`` after the tensor, which the registry's "function with the tensor
# first" cannot express: installed here instead.
Tensor.polygamma = _polygamma_method
Tensor.polygamma_ = _polygamma_inplace


@public(torch=True, method=True, inplace=True)
def mvlgamma(x: Tensor, p: int) -> Tensor:
    """The multivariate log-gamma of dimension ``p``:
    ``p (p - 1) / 4 log(pi) + sum_i lgamma(x - i / 2)``; every element must exceed
    ``(p - 1) / 2``."""
    x = _as_float(x)
    if x._trace is None and x.numel() and bool((x.detach() <= (p - 1) / 2).any()):
        raise RuntimeError("All elements must be greater than (p-1)/2")
    out = mul(x, 0.0) + p * (p - 1) / 4 * math.log(math.pi)
    for i in range(p):
        out = add(out, lgamma(sub(x, i / 2)))
    return out


@public(torch=True, method=True, inplace=True)
def erfc(x: Tensor) -> Tensor:
    """``1 - erf(x)``, accurate where erf is close to 1."""
    return bind(erfc_prim, _as_float(x))


@public(torch=True, method=True, inplace=True)
def erfinv(x: Tensor) -> Tensor:
    """The inverse of erf on (-1, 1) (+-inf at +-1, NaN outside)."""
    return bind(erfinv_prim, _as_float(x))


@public(torch=True, method=True, inplace=True)
def i0(x: Tensor) -> Tensor:
    """The modified Bessel function of the first kind, order 0."""
    return bind(i0_prim, _as_float(x))


@public(torch=True, method=True, inplace=True)
def nextafter(x, other) -> Tensor:
    """The next float after ``x`` towards ``other``."""
    a, b = _promote("nextafter", x, other)
    return bind(nextafter_prim, a, b)


@public(torch=True, method=True, inplace=True)
def gcd(x, other) -> Tensor:
    """The greatest common divisor of integers (non-negative)."""
    a, b = _promote("gcd", x, other)
    return bind(gcd_prim, a, b)


@public(torch=True, method=True, inplace=True)
def lcm(x, other) -> Tensor:
    """The least common multiple of integers (non-negative)."""
    a, b = _promote("lcm", x, other)
    return bind(lcm_prim, a, b)


@public(torch=True, method=True, inplace=True)
def igamma(x, other) -> Tensor:
    """The regularized lower incomplete gamma function ``P(x, other)``; differentiable in
    ``other`` only, as torch."""
    a, b = _promote("igamma", x, other)
    dt = _float_dtype(a.dtype)
    return bind(igamma_prim, cast(a, dt), cast(b, dt))


@public(torch=True, method=True, inplace=True)
def igammac(x, other) -> Tensor:
    """The regularized upper incomplete gamma function ``Q(x, other) = 1 - P(x, other)``."""
    a, b = _promote("igammac", x, other)
    dt = _float_dtype(a.dtype)
    return bind(igammac_prim, cast(a, dt), cast(b, dt))


@public(torch=True, method=True)
def frexp(x: Tensor):
    """(mantissa, exponent) with ``x = mantissa * 2**exponent`` and ``0.5 <= |mantissa| < 1``."""
    if not x.dtype.is_floating_point:
        raise RuntimeError("torch.frexp() only supports floating-point dtypes")
    return FrexpResult(bind(frexp_mantissa_prim, x), bind(frexp_exponent_prim, x))


# --------------------------------------------------------------------------- JVP rules
# Forward mode (fusegrad.ops.dual): elementwise, so an operand's VJP applied to its tangent
# is its JVP term (elementwise_from_vjp). i1's derivative, which its VJP lacks, is written
# out; nextafter has none, as in torch.

for _prim in (lgamma_prim, polygamma_prim, erfc_prim, erfinv_prim, i0_prim, igamma_prim,
              igammac_prim, frexp_mantissa_prim):
    jvp_rule(_prim)(elementwise_from_vjp(_prim))


@jvp_rule(i1_prim)
def _i1_jvp(ts, out, x):
    # i1'(x) = i0(x) - i1(x) / x, 1/2 at 0
    nonzero = x != 0
    safe = x.where(nonzero, x.new_ones(()))
    return mul(ts[0], (bind(i0_prim, x) - out / safe).where(nonzero, x.new_full((), 0.5)))


no_jvp(gcd_prim, "integer operands and result")
no_jvp(lcm_prim, "integer operands and result")
no_jvp(frexp_exponent_prim, "an integer result")


# --------------------------------------------------------------------------- batching rules
# Elementwise, with broadcasting: as the elementwise primitives batch.

from fusegrad.ops.batching import batching, elementwise_rule  # noqa: E402

for _prim in (lgamma_prim, polygamma_prim, erfc_prim, erfinv_prim, i1_prim, i0_prim,
              nextafter_prim, gcd_prim, lcm_prim, igamma_prim, igammac_prim,
              frexp_mantissa_prim, frexp_exponent_prim):
    batching(_prim)(elementwise_rule(_prim))
del _prim
