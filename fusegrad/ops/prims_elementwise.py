"""The elementwise primitives: unary, binary and ternary math with numpy broadcasting, casts
and comparisons; each with its rule, numpy reference and VJP.
"""

from __future__ import annotations

import math
import warnings

import ml_dtypes
import numpy as np

from fusegrad import dtypes
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
from fusegrad.ops.prims_common import (
    _conj,
    _np_float_compute,
    _require_float,
    _require_real,
    _same_dtype,
    _sum_to,
    add_tangents,
    broadcast_shapes,
    elementwise_from_vjp,
    tangent_or_zeros,
)
from fusegrad.ops.prims_extern import complex_

# torch computes log(-1) = nan and 1/0 = inf silently; numpy warns. The filter is scoped to
# the numpy calls made in this module (warnings name the calling module), so user code keeps
# numpy's default; np.errstate per call would cost ~3 us on every eager op.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=__name__)


# --------------------------------------------------------------------------- elementwise


def _unary(name, impl, vjp=None, grad_name=None, float_only=True, out_dtype=None,
           complex_ok=False):
    def infer(x: TensorType) -> TensorType:
        if float_only:
            _require_float(name, x, complex_ok)
        elif not complex_ok:
            _require_real(name, x)
        return TensorType(x.shape, out_dtype or x.dtype)

    def run(x):
        return impl(_np_float_compute(x)) if float_only else impl(x)

    return register(Primitive(
        name, Kind.ELEMENTWISE, infer, run, None if vjp is None else (vjp,),
        grad_name or f"{name.capitalize()}Backward0"))


def _binary(name, impl, vjp=None, grad_name=None, out_dtype=None, float_only=False,
            complex_ok=False):
    def infer(x: TensorType, y: TensorType) -> TensorType:
        dt = _same_dtype(name, x, y)
        if float_only:
            _require_float(name, x)
        elif not complex_ok:
            _require_real(name, x)
        return TensorType(broadcast_shapes(x.shape, y.shape, op=name), out_dtype or dt)

    def run(x, y):
        if float_only:
            return impl(_np_float_compute(x), _np_float_compute(y))
        return impl(x, y)

    return register(Primitive(name, Kind.ELEMENTWISE, infer, run, vjp,
                              grad_name or f"{name.capitalize()}Backward0"))


def _zero_rule(argnum: int) -> Rule:
    """Piecewise-constant ops (sign, floor, ...) have a zero gradient, as in torch."""
    return Rule(lambda g, out, *primals, **attrs: g.new_zeros(primals[argnum].shape))


def _rule_x(fn, reads=(0,), reads_output=False) -> Rule:
    return Rule(fn, reads, reads_output)


def _rule_out(fn) -> Rule:
    return Rule(fn, (), True)


# Elements per block of _blockwise: float64 temporaries of 128 KiB stay in the L2 cache.
_BLOCK = 16384


def _blockwise(fn, x: np.ndarray, dtype) -> np.ndarray:
    """Elementwise ``fn`` on ``x`` a block at a time, into an array of ``dtype``: an evaluation
    that makes several passes over float64 temporaries reads them from the cache rather than
    from memory (float32 erf of 131072 elements: 4.6 ms whole, 1.8 ms in blocks, loaded
    machine). The same values as ``fn(x)``."""
    if x.size <= 2 * _BLOCK:
        return np.asarray(fn(x), dtype=dtype)
    flat = x.reshape(-1)                 # a copy when x is not contiguous
    out = np.empty(flat.shape, dtype)
    for i in range(0, flat.size, _BLOCK):
        out[i:i + _BLOCK] = fn(flat[i:i + _BLOCK])
    return out.reshape(x.shape)


def _float64_rounded(fn):
    def f(x):
        return fn(x.astype(np.float64)).astype(np.float32)
    return f


def _in_float64(fn):
    """numpy's float32 transcendentals are SIMD approximations of up to 4 ulp (np.log 3, np.tan 4
    measured with numpy 2.4 on AVX-512): float32 computes in float64 and rounds once (<= 0.5 ulp)."""
    rounded = _float64_rounded(fn)

    def impl(x):
        return _blockwise(rounded, x, np.float32) if x.dtype == np.float32 else fn(x)
    return impl


_erf_np = np.frompyfunc(math.erf, 1, 1)
_ERF_STEPS = 1024        # table points per unit of x
_ERF_LIMIT = 6.0         # erf(x) is 1.0 in float64 from here on
_ERF_TABLE: list = []
_ROUND_TO_INTEGER = 1.5 * 2.0 ** 52


def _erf_table() -> tuple[int, list]:
    """Taylor coefficients of erf, highest degree first, at the points k / _ERF_STEPS of
    [-6, 6]: erf itself from libm, the derivatives from erf' = 2/sqrt(pi) exp(-x^2)."""
    if not _ERF_TABLE:
        m = int(_ERF_LIMIT * _ERF_STEPS)
        x0 = np.arange(-m, m + 1) / _ERF_STEPS
        d1 = (2.0 / math.sqrt(math.pi)) * np.exp(-x0 * x0)
        c0 = np.array([math.erf(v) for v in x0.tolist()])
        _ERF_TABLE.extend([m, [(3.0 * x0 - 2.0 * x0 ** 3) / 6.0 * d1,
                               (2.0 * x0 * x0 - 1.0) / 3.0 * d1, -x0 * d1, d1,
                               # negated, +0.0 at 0: see _erf_impl
                               -c0 + 0.0]])
    return _ERF_TABLE[0], _ERF_TABLE[1]


def _erf_impl(x: np.ndarray) -> np.ndarray:
    """erf of float64 arrays by libm, element by element; of float32 arrays by a degree-4
    Taylor expansion around the nearest table point (|h| <= 2**-11), evaluated in float64:
    within 6e-15 relative of libm (measured), so the float32 result is libm's rounded, bar
    a double rounding about once in 10**7 elements, at a tenth of the per-element cost."""
    if x.dtype == np.float64:
        return np.asarray(_erf_np(x)).astype(x.dtype)
    return _blockwise(_erf_f32, x, x.dtype)


def _erf_f32(x: np.ndarray) -> np.ndarray:
    m, coeffs = _erf_table()
    a = np.asarray(np.clip(x, -_ERF_LIMIT, _ERF_LIMIT, dtype=np.float64))   # 0-d stays an array
    # kf = rint(a * steps) + m by adding and taking off 1.5 * 2**52: the sum rounds to an
    # integer (half to even; m is even), exactly, at a fifth of np.rint's cost on float64.
    kf = a * _ERF_STEPS
    kf += m + _ROUND_TO_INTEGER
    kf -= _ROUND_TO_INTEGER
    # h = a - x0 (exact), written (m - k) * step + a so that h, and erf, is -0.0 at -0.0.
    h = (kf - m) * (-1.0 / _ERF_STEPS) + a
    # NaN gives a valid index; h is NaN there, so is erf
    k = np.fmin(kf, 2 * m).astype(np.intp)
    r = np.asarray(np.take(coeffs[0], k))
    for c in coeffs[1:-1]:
        r *= h
        r += np.take(c, k)
    r *= h
    # r - (-erf(x0)) rather than r + erf(x0): at x = -0.0, -0.0 - (+0.0) keeps erf's sign.
    r -= np.take(coeffs[-1], k)
    return r.astype(x.dtype)


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)

neg = _unary("neg", np.negative, Rule(lambda g, out, x: -g), float_only=False, complex_ok=True)


def _abs_infer(x: TensorType) -> TensorType:
    return TensorType(x.shape, dtypes.to_real(x.dtype))


def _abs_vjp(g, out, x):
    if not x.dtype.is_complex:
        return g * x.sign()
    # torch's g * sgn(z): z / |z|, and 0 at z == 0
    modulus = x.abs()
    nonzero = modulus != 0
    scale = g / modulus.where(nonzero, modulus.new_ones(()))
    return bind(complex_, scale, scale.new_zeros(())) * x.where(nonzero, x.new_zeros(()))


# abs of a complex tensor is real (its modulus): no _unary, whose result keeps the dtype.
abs_ = register(Primitive("abs", Kind.ELEMENTWISE, _abs_infer, np.abs,
                          (Rule(_abs_vjp, (0,)),), "AbsBackward0"))
exp = _unary("exp", _in_float64(np.exp), _rule_out(lambda g, out, x: g * _conj(out)),
             complex_ok=True)
log = _unary("log", _in_float64(np.log), _rule_x(lambda g, out, x: g / _conj(x)),
             complex_ok=True)
# exp2/log2/log10 are primitives, not exp(x * ln2) or log(x) / ln2: the rounding of the scaled
# argument costs float32 up to 67 ulp, and 16-bit types would round ln2 itself.
exp2 = _unary("exp2", _in_float64(np.exp2),
              _rule_out(lambda g, out, x: g * _conj(out) * math.log(2.0)), complex_ok=True)
log2 = _unary("log2", _in_float64(np.log2),
              _rule_x(lambda g, out, x: g / _conj(x * math.log(2.0))), complex_ok=True)
log10 = _unary("log10", _in_float64(np.log10),
               _rule_x(lambda g, out, x: g / _conj(x * math.log(10.0))), complex_ok=True)
log1p = _unary("log1p", _in_float64(np.log1p), _rule_x(lambda g, out, x: g / _conj(x + 1)),
               grad_name="Log1PBackward0", complex_ok=True)
expm1 = _unary("expm1", _in_float64(np.expm1), _rule_out(lambda g, out, x: g * _conj(out + 1)),
               complex_ok=True)
sin = _unary("sin", _in_float64(np.sin), _rule_x(lambda g, out, x: g * _conj(x.cos())),
             complex_ok=True)
cos = _unary("cos", _in_float64(np.cos), _rule_x(lambda g, out, x: -(g * _conj(x.sin()))),
             complex_ok=True)
tan = _unary("tan", _in_float64(np.tan),
             _rule_out(lambda g, out, x: g * _conj(1 + out * out)), complex_ok=True)
tanh = _unary("tanh", _in_float64(np.tanh),
              _rule_out(lambda g, out, x: g * _conj(1 - out * out)), complex_ok=True)
# np.asarray: frompyfunc gives a Python float, not an array, for a 0-d input
# Inverse and hyperbolic trig: primitives (not log/exp compositions, which lose accuracy
# near 0 and overflow early); they have no kernel lowering, so compiled programs run these
# numpy references. VJPs are torch's (derivatives.yaml).
asin = _unary("asin", _in_float64(np.arcsin),
              _rule_x(lambda g, out, x: g * _conj((1 - x * x).rsqrt())), complex_ok=True)
acos = _unary("acos", _in_float64(np.arccos),
              _rule_x(lambda g, out, x: -(g * _conj((1 - x * x).rsqrt()))), complex_ok=True)
atan = _unary("atan", _in_float64(np.arctan), _rule_x(lambda g, out, x: g / _conj(x * x + 1)),
              complex_ok=True)
sinh = _unary("sinh", _in_float64(np.sinh), _rule_x(lambda g, out, x: g * _conj(x.cosh())),
              complex_ok=True)
cosh = _unary("cosh", _in_float64(np.cosh), _rule_x(lambda g, out, x: g * _conj(x.sinh())),
              complex_ok=True)
asinh = _unary("asinh", _in_float64(np.arcsinh),
               _rule_x(lambda g, out, x: g * _conj((x * x + 1).rsqrt())), complex_ok=True)


def _acosh_vjp(g, out, x):
    if x.dtype.is_complex:
        # 1 / (sqrt(z - 1) sqrt(z + 1)): 1 / sqrt(z**2 - 1) has the wrong sign off the real line
        return g * _conj((x - 1).rsqrt() * (x + 1).rsqrt())
    return g * (x * x - 1).rsqrt()


acosh = _unary("acosh", _in_float64(np.arccosh), _rule_x(_acosh_vjp), complex_ok=True)
atanh = _unary("atanh", _in_float64(np.arctanh), _rule_x(lambda g, out, x: g / _conj(1 - x * x)),
               complex_ok=True)
erf = _unary("erf", lambda x: _erf_impl(x),
             _rule_x(lambda g, out, x: g * _TWO_OVER_SQRT_PI * (-(x * x)).exp()))
sqrt = _unary("sqrt", np.sqrt, _rule_out(lambda g, out, x: g / _conj(out * 2)), complex_ok=True)
reciprocal = _unary("reciprocal", np.reciprocal,
                    _rule_out(lambda g, out, x: -(g * _conj(out * out))), complex_ok=True)
def _sign_impl(x):
    # torch's (x > 0) - (x < 0): sign(nan) is 0 (numpy's is nan) and sign(-0.) is +0.
    # (ml_dtypes' bfloat16 gives -0.); abs's gradient g * sign(x) is then 0 at NaN too.
    if x.dtype.kind in "biu":
        return np.sign(x)
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


sign = _unary("sign", _sign_impl, _zero_rule(0), float_only=False)
floor = _unary("floor", np.floor, _zero_rule(0))
ceil = _unary("ceil", np.ceil, _zero_rule(0))
round_ = _unary("round", np.rint, _zero_rule(0))
copy = _unary("copy", np.copy, Rule(lambda g, out, x: g), grad_name="CloneBackward0",
              float_only=False, complex_ok=True)
stop_gradient = _unary("stop_gradient", lambda x: x, None, float_only=False, complex_ok=True)


def _not_infer(x: TensorType) -> TensorType:
    return TensorType(x.shape, dtypes.bool_)


logical_not = register(Primitive("not", Kind.ELEMENTWISE, _not_infer, np.logical_not))


def _cast_infer(x: TensorType, *, dtype: dtypes.DType) -> TensorType:
    return TensorType(x.shape, dtype)


def float_to_int_wide(dtype: dtypes.DType) -> tuple[type, int]:
    """The signed integer type a float converts through on its way to ``dtype``, and that
    type's width in bits: int32 for int8/int16/int32, int64 for int64, uint8 and uint32.

    C leaves an out-of-range float-to-int conversion undefined; torch on x86 gives what the
    CPU's truncating conversion (cvttss2si) gives: the conversion to the wide type is exact
    in range and INT_MIN of the wide type for NaN, +-Inf and out-of-range values, and the
    narrow type keeps the low bits (300.0 -> int8 is 44, -2.0 -> uint8 is 254). fusegrad
    defines every float-to-int cast this way, on every CPU, eager and compiled alike."""
    if dtype in (dtypes.int64, dtypes.uint8, dtypes.uint32):
        return np.int64, 64
    return np.int32, 32


def _float_to_int(x: np.ndarray, dtype: dtypes.DType) -> np.ndarray:
    wide, bits = float_to_int_wide(dtype)
    x = _np_float_compute(x)
    limit = x.dtype.type(2.0 ** (bits - 1))
    inside = (x >= -limit) & (x < limit)          # False at NaN
    if inside.all():
        out = x.astype(wide)
    else:
        out = np.where(inside, x, 0).astype(wide)
        out[~inside] = np.iinfo(wide).min
    return out.astype(dtype.np_dtype)


def _cast_impl(x, *, dtype):
    if dtype is dtypes.bool_:
        return x != 0
    if x.dtype.kind == "c" and dtype.category < 3:
        # the real part (the public cast warns, as torch); numpy's own cast warns again
        x = x.real
    if x.dtype.kind == "f" or x.dtype == ml_dtypes.bfloat16:
        if dtype.category == 1:
            return _float_to_int(x, dtype)
    with np.errstate(over="ignore"):          # float32 1e5 to float16 is inf, silently
        return x.astype(dtype.np_dtype)


def _cast_rule(g, out, x, *, dtype):
    if g.dtype.is_complex and not x.dtype.is_complex:
        return g.real.to(x.dtype)   # a real value's part of the gradient, no warning
    return g.to(x.dtype)


cast = register(Primitive("cast", Kind.ELEMENTWISE, _cast_infer, _cast_impl, (Rule(_cast_rule),),
                          "ToCopyBackward0", attrs=("dtype",)))


add = _binary("add", np.add, (Rule(lambda g, out, x, y: _sum_to(g, x.shape)),
                              Rule(lambda g, out, x, y: _sum_to(g, y.shape))), complex_ok=True)
sub = _binary("sub", np.subtract, (Rule(lambda g, out, x, y: _sum_to(g, x.shape)),
                                   Rule(lambda g, out, x, y: _sum_to(-g, y.shape))),
              complex_ok=True)
mul = _binary("mul", np.multiply, (
    Rule(lambda g, out, x, y: _sum_to(g * _conj(y), x.shape), (1,)),
    Rule(lambda g, out, x, y: _sum_to(g * _conj(x), y.shape), (0,))), complex_ok=True)
div = _binary("div", np.divide, (
    Rule(lambda g, out, x, y: _sum_to(g / _conj(y), x.shape), (1,)),
    Rule(lambda g, out, x, y: _sum_to(-(g * _conj(x / (y * y))), y.shape), (0, 1))),
    complex_ok=True)


def _pow_dx(g, out, x, y):
    # y * x**(y-1), taken as 0 where y == 0 (torch's convention: keeps 0**0 finite)
    return _sum_to((g * _conj(y * x.pow(y - 1))).where(y != 0, g.new_zeros(())), x.shape)


def _pow_dy(g, out, x, y):
    # x**y * log(x), taken as 0 where x == 0 and y >= 0 (for a complex y: its real part)
    y_real = y.real if y.dtype.is_complex else y
    return _sum_to((g * _conj(out * x.log())).where((x != 0) | (y_real < 0), g.new_zeros(())),
                   y.shape)


def _pow_impl(x, y):
    if x.dtype.kind in "iu" and np.any(y < 0):
        # torch's integer pow with a negative exponent tensor: 1 / x**n truncated, so 1 for
        # x = 1, +-1 for x = -1 (by the exponent's parity), 0 otherwise
        x, y = np.broadcast_arrays(x, y)
        out = np.power(x, np.maximum(y, 0))
        ones = np.where(x == -1, np.where(y % 2 == 0, 1, -1), np.where(x == 1, 1, 0))
        return np.where(y < 0, ones, out).astype(out.dtype)
    return np.power(x, y)


pow_ = _binary("pow", _pow_impl, (Rule(_pow_dx, (0, 1)), Rule(_pow_dy, (0, 1), True)),
               complex_ok=True)


def _extremum_share(g, x, y, loses):
    """torch's maximum/minimum backward for one operand: nothing where it ``loses``, half on
    a tie, all of ``g`` otherwise, NaN included (torch gives both operands the full gradient
    where either is NaN)."""
    zero = g.new_zeros(())
    return zero.where(loses, (g / 2).where(x == y, g))


def _extremum_impl(numpy_op, wins):
    def impl(x, y):
        # One definition for every float type and CPU, the one x86's maxps/minps gives and
        # the compiled kernel uses: NaN if either is NaN, else x only where it strictly wins,
        # so a tie of -0. and 0. gives y. (numpy's own maximum differs between its float16
        # and its SIMD float32 loops there.)
        if x.dtype.kind in "biu":
            return numpy_op(x, y)
        return np.where(wins(x, y) | np.isnan(x), x, y)
    return impl


maximum = _binary("maximum", _extremum_impl(np.maximum, np.greater), (
    Rule(lambda g, out, x, y: _sum_to(_extremum_share(g, x, y, x < y), x.shape), (0, 1)),
    Rule(lambda g, out, x, y: _sum_to(_extremum_share(g, x, y, y < x), y.shape), (0, 1))))
minimum = _binary("minimum", _extremum_impl(np.minimum, np.less), (
    Rule(lambda g, out, x, y: _sum_to(_extremum_share(g, x, y, y < x), x.shape), (0, 1)),
    Rule(lambda g, out, x, y: _sum_to(_extremum_share(g, x, y, x < y), y.shape), (0, 1))))


def _raise_on_int_zero(x, y, what: str) -> None:
    # torch raises RuntimeError("ZeroDivisionError"); numpy would warn and give 0.
    if x.dtype.kind in "iu" and np.any(y == 0):
        raise ZeroDivisionError(f"ZeroDivisionError: integer {what} by zero")


def _floordiv_impl(x, y):
    # Floats: numpy's floor_divide is torch's div_floor_floating bit for bit (the quotient
    # of x - fmod(x, y), snapped to an integer): 1 // -inf is -1, inf // 1 is nan.
    _raise_on_int_zero(x, y, "division")
    return np.floor_divide(_np_float_compute(x), _np_float_compute(y))


floordiv = _binary("floordiv", _floordiv_impl, (_zero_rule(0), _zero_rule(1)),
                   grad_name="DivBackward1")


def _fmod_impl(x, y):
    # np.fmod is exact (IEEE fmod; C's % for integers). 16-bit floats compute in float32,
    # where fmod of two 16-bit values is exact and representable in the 16-bit type.
    _raise_on_int_zero(x, y, "modulo")
    return np.fmod(_np_float_compute(x), _np_float_compute(y))


fmod = _binary("fmod", _fmod_impl, (
    Rule(lambda g, out, x, y: _sum_to(g, x.shape)),
    Rule(lambda g, out, x, y: _sum_to(-(g * (x / y).trunc()), y.shape), (0, 1))))


def _remainder_impl(x, y):
    """Python's modulo with torch's rule: fmod(x, y), plus y where the two signs differ.

    A zero result keeps the sign of fmod (of x), as in torch; numpy's remainder gives it
    the sign of y. Computing through fmod keeps it exact for huge quotients."""
    _raise_on_int_zero(x, y, "modulo")
    if x.dtype.kind in "iu":
        return np.remainder(x, y)
    x, y = _np_float_compute(x), _np_float_compute(y)
    mod = np.fmod(x, y)
    fix = (mod != 0) & ((y < 0) != (mod < 0))
    return np.where(fix, mod + y, mod)


remainder = _binary("remainder", _remainder_impl, (
    Rule(lambda g, out, x, y: _sum_to(g, x.shape)),
    Rule(lambda g, out, x, y: _sum_to(-(g * (x / y).floor()), y.shape), (0, 1))))

lt = _binary("lt", np.less, out_dtype=dtypes.bool_)
le = _binary("le", np.less_equal, out_dtype=dtypes.bool_)
eq = _binary("eq", np.equal, out_dtype=dtypes.bool_, complex_ok=True)
ne = _binary("ne", np.not_equal, out_dtype=dtypes.bool_, complex_ok=True)
logical_and = _binary("and", np.logical_and, out_dtype=dtypes.bool_)
logical_or = _binary("or", np.logical_or, out_dtype=dtypes.bool_)


def _atan2_impl(y, x):
    if y.dtype == np.float32:
        return np.arctan2(y.astype(np.float64), x.astype(np.float64)).astype(np.float32)
    return np.arctan2(y, x)


def _atan2_dy(g, out, y, x):
    # at the origin (0 / 0) the gradient is 0, as torch's
    r2 = x * x + y * y
    return _sum_to((g * x / r2).where(r2 != 0, g.new_zeros(())), y.shape)


def _atan2_dx(g, out, y, x):
    r2 = x * x + y * y
    return _sum_to((-(g * y) / r2).where(r2 != 0, g.new_zeros(())), x.shape)


atan2 = _binary("atan2", _atan2_impl, (Rule(_atan2_dy, (0, 1)), Rule(_atan2_dx, (0, 1))),
                float_only=True)


def _require_integral(name, impl):
    def run(x, y):
        if x.dtype.kind not in "biu":
            raise ShapeError(f"{name}: expected integer or bool operands, got {x.dtype}")
        return impl(x, y)
    return run


def _shift_impl(left: bool):
    """torch's shifts (BinaryOpsKernel.cpp): a shift by a negative amount or by at least the
    width gives 0 to the left; to the right, the sign fill (0 for unsigned types)."""
    def impl(x, y):
        bits = x.dtype.itemsize * 8
        signed = x.dtype.kind == "i"
        out_of_range = (y < 0) | (y >= bits - (0 if left else int(signed)))
        amount = np.where(out_of_range, 0, y).astype(x.dtype)
        if left:
            u = x.view(f"u{x.dtype.itemsize}")
            out = np.left_shift(u, amount.astype(u.dtype)).view(x.dtype)
            return np.where(out_of_range, np.zeros((), x.dtype), out)
        out = np.right_shift(x, amount)
        fill = np.right_shift(x, bits - 1) if signed else np.zeros((), x.dtype)
        return np.where(out_of_range, fill, out)
    return impl


# Bitwise ops of integer tensors (bool ones use the logical primitives), not differentiable.
bitwise_and = _binary("bitand", _require_integral("bitand", np.bitwise_and))
bitwise_or = _binary("bitor", _require_integral("bitor", np.bitwise_or))
bitwise_xor = _binary("bitxor", _require_integral("bitxor", np.bitwise_xor))
shift_left = _binary("shl", _require_integral("shl", _shift_impl(True)))
shift_right = _binary("shr", _require_integral("shr", _shift_impl(False)))


def _where_infer(c: TensorType, x: TensorType, y: TensorType) -> TensorType:
    if c.dtype is not dtypes.bool_:
        raise ShapeError(f"where: condition must be bool, got {c}")
    dt = _same_dtype("where", x, y)
    return TensorType(broadcast_shapes(c.shape, x.shape, y.shape, op="where"), dt)


_UNSIGNED_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _where_impl(c, x, y):
    """np.where's result, bit for bit, selected with integer bit operations: np.where
    branches per element, and on a random mask (ReLU's) mispredicts about half of them, which
    made it ten times slower than a ufunc pass. y ^ ((x ^ y) & mask), mask all ones where c."""
    if not (type(c) is type(x) is type(y) is np.ndarray) or c.dtype != np.bool_ \
            or x.dtype != y.dtype or x.dtype.itemsize not in _UNSIGNED_OF_SIZE \
            or c.ndim == x.ndim == y.ndim == 0:
        return np.where(c, x, y)          # scalars, mixed types, 0-d: nothing to gain
    u = _UNSIGNED_OF_SIZE[x.dtype.itemsize]
    mask = c.astype(u)
    np.negative(mask, out=mask)          # 1 -> all ones (unsigned negation wraps)
    yb = y.view(u)
    out = np.bitwise_and(np.bitwise_xor(x.view(u), yb, order="C"), mask, order="C")
    np.bitwise_xor(out, yb, out=out)
    return out.view(x.dtype)


where = register(Primitive("where", Kind.ELEMENTWISE, _where_infer, _where_impl, (
    None,
    Rule(lambda g, out, c, x, y: _sum_to(g.where(c, g.new_zeros(())), x.shape), (0,)),
    Rule(lambda g, out, c, x, y: _sum_to(g.new_zeros(()).where(c, g), y.shape), (0,))),
    "WhereBackward0"))


# --------------------------------------------------------------------------- JVP rules
# Forward mode (fusegrad.ops.dual). The linear ops and the common products are written out;
# the other differentiable elementwise ops take their VJP applied to the tangent, which is
# their JVP (elementwise_from_vjp: a diagonal Jacobian is its own transpose).

jvp_rule(neg)(lambda ts, out, x: -ts[0])
jvp_rule(copy)(lambda ts, out, x: bind(copy, ts[0]))
jvp_rule(cast)(lambda ts, out, x, *, dtype: bind(cast, ts[0], dtype=dtype))
jvp_rule(add)(lambda ts, out, x, y: add_tangents(*ts))
jvp_rule(sub)(lambda ts, out, x, y: add_tangents(ts[0], None if ts[1] is None else -ts[1]))
jvp_rule(mul)(lambda ts, out, x, y: add_tangents(None if ts[0] is None else ts[0] * y,
                                                 None if ts[1] is None else x * ts[1]))


@jvp_rule(div)
def _div_jvp(ts, out, x, y):
    # (tx - out * ty) / y: d(x / y) = dx / y - x dy / y^2
    tx, ty = ts
    return add_tangents(tx, None if ty is None else -(out * ty)) / y


@jvp_rule(where)
def _where_jvp(ts, out, c, x, y):
    _, tx, ty = ts
    return bind(where, c, tangent_or_zeros(tx, x), tangent_or_zeros(ty, y))


@jvp_rule(abs_)
def _abs_jvp(ts, out, x):
    (t,) = ts
    if not x.dtype.is_complex:
        return t * x.sign()
    # d|z| = Re(conj(z) dz) / |z|, and 0 at z == 0 (torch's sgn convention)
    nonzero = out != 0
    return (x.conj_physical() * t).real / out.where(nonzero, out.new_ones(())) * \
        nonzero.to(out.dtype)


for _prim in (exp, log, exp2, log2, log10, log1p, expm1, sin, cos, tan, tanh, asin, acos, atan,
              sinh, cosh, asinh, acosh, atanh, erf, sqrt, reciprocal, sign, floor, ceil, round_,
              pow_, maximum, minimum, floordiv, fmod, remainder, atan2):
    jvp_rule(_prim)(elementwise_from_vjp(_prim))

no_jvp(stop_gradient, "cut from differentiation (detach): its result has no tangent, as torch's")
for _prim in (logical_not, lt, le, eq, ne, logical_and, logical_or):
    no_jvp(_prim, "a bool result")
for _prim in (bitwise_and, bitwise_or, bitwise_xor, shift_left, shift_right):
    no_jvp(_prim, "integer operands and result")


# --------------------------------------------------------------------------- batching rules
# Every elementwise primitive batches as it broadcasts: batched operands batch-first, with
# size-1 axes so that each example has the rank of the largest (fusegrad.ops.batching).

from fusegrad.ops.batching import batching, elementwise_rule  # noqa: E402

for _prim in (neg, abs_, exp, log, exp2, log2, log10, log1p, expm1, sin, cos, tan, tanh, asin,
              acos, atan, sinh, cosh, asinh, acosh, atanh, erf, sqrt, reciprocal, sign, floor,
              ceil, round_, copy, stop_gradient, logical_not, cast, add, sub, mul, div, pow_,
              maximum, minimum, floordiv, fmod, remainder, lt, le, eq, ne, logical_and,
              logical_or, atan2, bitwise_and, bitwise_or, bitwise_xor, shift_left, shift_right,
              where):
    batching(_prim)(elementwise_rule(_prim))
del _prim
