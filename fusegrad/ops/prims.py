"""The primitive set: each primitive's shape/dtype rule, numpy reference and VJP, in one place.

Elementwise primitives broadcast their operands (numpy's rules) and require equal dtypes:
promotion and casts belong to the public ops in :mod:`fusegrad.ops.functional`, so the IR
only ever sees explicit casts. VJP rules use tensor methods, so one rule serves eager
autograd (on concrete tensors) and the autodiff pass (on traced ones).

Adding a primitive: give it a rule, an impl and (if differentiable) a VJP below, then a
lowering in codegen. Nothing else needs to know about it.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable

import ml_dtypes
import numpy as np

from fusegrad import dtypes
from fusegrad.ops.primitive import (
    ConstantData,
    Kind,
    Primitive,
    Rule,
    ShapeError,
    TensorType,
    register,
)

# torch computes log(-1) = nan and 1/0 = inf silently; numpy warns. The filter is scoped to
# the numpy calls made in this module (warnings name the calling module), so user code keeps
# numpy's default; np.errstate per call would cost ~3 us on every eager op.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=__name__)

# --------------------------------------------------------------------------- shape helpers


def broadcast_shapes(*shapes: tuple[int, ...], op: str = "broadcast") -> tuple[int, ...]:
    """numpy/torch broadcasting of ``shapes``; raises with torch's message on a mismatch."""
    ndim = max((len(s) for s in shapes), default=0)
    result = [1] * ndim
    for s in shapes:
        offset = ndim - len(s)
        for i, d in enumerate(s):
            r = result[offset + i]
            if r == 1:
                result[offset + i] = d
            elif d != 1 and d != r:
                raise ShapeError(
                    f"{op}: the size of tensor a ({r}) must match the size of tensor b ({d}) at "
                    f"non-singleton dimension {offset + i} (shapes "
                    f"{', '.join(str(list(x)) for x in shapes)})")
    return tuple(result)


def normalize_axis(axis: int, ndim: int, op: str = "") -> int:
    """Wrap a negative axis; torch's IndexError when out of range."""
    lo, hi = (-ndim, ndim - 1) if ndim > 0 else (-1, 0)
    if not lo <= axis <= hi:
        raise IndexError(f"{op + ': ' if op else ''}Dimension out of range (expected to be in "
                         f"range of [{lo}, {hi}], but got {axis})")
    return axis % ndim if ndim > 0 else 0


def _types_str(types) -> str:
    return ", ".join(str(t) for t in types)


def _same_dtype(op: str, *types: TensorType) -> dtypes.DType:
    dt = types[0].dtype
    for t in types[1:]:
        if t.dtype is not dt:
            raise ShapeError(f"{op}: operands must have one dtype, got {_types_str(types)}")
    return dt


def _require_float(op: str, t: TensorType, complex_ok: bool = False) -> None:
    if not (t.dtype.is_floating_point or complex_ok and t.dtype.is_complex):
        raise ShapeError(f"{op}: expected a floating-point operand, got {t}")


def _require_real(op: str, t: TensorType) -> None:
    if t.dtype.is_complex:
        raise ShapeError(f"{op} is not implemented for complex tensors (got {t})")


def _conj(t):
    """``t``'s complex conjugate; ``t`` itself when real. VJP rules follow torch's
    convention: the cotangent of a complex value ``z`` is dL/d(conj z), so a holomorphic
    op's rule multiplies by the conjugate of its derivative (mul's ``g * conj(y)``)."""
    return _F().conj_physical(t) if t.dtype.is_complex else t


def _np_float_compute(a: np.ndarray) -> np.ndarray:
    """16-bit floats compute in float32 (as torch does on the CPU) and are rounded back."""
    if a.dtype == np.float16 or a.dtype == ml_dtypes.bfloat16:
        return a.astype(np.float32)
    return a


def _F():
    # VJP rules call public ops; imported on use because functional imports this module.
    from fusegrad.ops import functional
    return functional


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


def _sum_to(g, shape: tuple[int, ...]):
    """Reduce a broadcast gradient back to ``shape``."""
    return g.sum_to_size(shape) if g.shape != tuple(shape) else g


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
    return _F().complex(scale, scale.new_zeros(())) * x.where(nonzero, x.new_zeros(()))


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
        return _F().real(g).to(x.dtype)   # a real value's part of the gradient, no warning
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
    y_real = _F().real(y) if y.dtype.is_complex else y
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
    Rule(lambda g, out, x, y: _sum_to(-(g * _F().trunc(x / y)), y.shape), (0, 1))))


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


# --------------------------------------------------------------------------- reductions


def _check_axes(op: str, x: TensorType, axes: tuple[int, ...]) -> None:
    for a in axes:
        if not 0 <= a < max(x.ndim, 1):
            raise ShapeError(f"{op}: axis {a} out of range for {x}")
    if len(set(axes)) != len(axes):
        raise ShapeError(f"{op}: repeated axis in {axes}")


def _reduced_shape(x: TensorType, axes) -> tuple[int, ...]:
    return tuple(d for i, d in enumerate(x.shape) if i not in axes)


def _keepdim_shape(shape, axes) -> tuple[int, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def _expand_back(g, x, axes):
    """Broadcast a reduced gradient back over the reduced axes of ``x``."""
    return g.reshape(_keepdim_shape(x.shape, axes)).expand(*x.shape)


def _reduce(name, impl, vjp: Rule, grad_name, out_dtype=None, identity_needed=False,
            complex_ok=True):
    def infer(x: TensorType, *, axes: tuple[int, ...]) -> TensorType:
        _check_axes(name, x, axes)
        if not complex_ok:
            _require_real(name, x)
        if identity_needed and x.numel == 0 and any(x.shape[a] == 0 for a in axes):
            raise ShapeError(f"{name}(): Expected reduction dim to have non-zero size "
                             f"(operand {x}, axes {axes})")
        dt = out_dtype(x.dtype) if out_dtype else x.dtype
        return TensorType(_reduced_shape(x, axes), dt)

    def run(x, *, axes):
        if x.ndim == 0:
            return impl(x, axis=None)
        return impl(_np_float_compute(x), axis=axes)

    return register(Primitive(name, Kind.REDUCE, infer, run, (vjp,), grad_name, attrs=("axes",)))


def _sum_dtype(dt):
    # torch sums bools and small integers to int64
    return dtypes.int64 if dt.category < 2 else dt


def _sum_vjp(g, out, x, *, axes):
    return _expand_back(g, x, axes)


sum_ = _reduce("sum", np.add.reduce, Rule(_sum_vjp), "SumBackward1", out_dtype=_sum_dtype)


def _prod_vjp(g, out, x, *, axes):
    # d prod / d x_i = prod_{j != i} x_j; computed as out / x away from zeros, and by an
    # explicit product of the others where x_i == 0 (one zero keeps a nonzero gradient).
    # Where x_i is one of exactly two zeros the value is 0, written P * (S - x_i) (P: the
    # product of the nonzeros, S: the sum of x over the zeros, 0 with gradient 1 at each) so
    # that its own derivative, P towards the other zero, is right (second derivatives).
    full = _expand_back(out, x, axes)
    zero_free = x.where(x != 0, x.new_ones(()))
    nonzeros = _expand_back(_F().reduce_prod(zero_free, axes), x, axes)
    others = nonzeros / zero_free
    zeros = (x == 0).to(x.dtype)
    at_zeros = x.where(x == 0, x.new_zeros(()))
    # (dim=() would be every dim, as in torch: a product over no axes counts each element.)
    nzeros = _expand_back(zeros.sum(dim=list(axes)), x, axes) if axes else zeros
    total = _expand_back(at_zeros.sum(dim=list(axes)), x, axes) if axes else at_zeros
    two = (nonzeros * (total - x)).where(nzeros == 2, x.new_zeros(()))
    only_zero_is_self = (x == 0) & (nzeros == 1)
    grad_x = (full / zero_free).where(x != 0, others.where(only_zero_is_self, two))
    return _expand_back(g, x, axes) * _conj(grad_x)


prod = _reduce("prod", np.multiply.reduce, Rule(_prod_vjp, (0,), True), "ProdBackward1",
               out_dtype=_sum_dtype)


def _extremum_vjp(g, out, x, *, axes):
    # Evenly split among ties, as torch's amax/amin (and max() without dim) do; a NaN result
    # is shared by the NaN elements (it was NaN everywhere: no element equals NaN).
    o = _expand_back(out, x, axes)
    mask = ((x == o) | ((x != x) & (o != o))).to(g.dtype)
    count = _expand_back(mask.sum(dim=list(axes)), x, axes) if axes else mask
    return _expand_back(g, x, axes) * mask / count


max_ = _reduce("max", np.maximum.reduce, Rule(_extremum_vjp, (0,), True), "AmaxBackward0",
               identity_needed=True, complex_ok=False)
min_ = _reduce("min", np.minimum.reduce, Rule(_extremum_vjp, (0,), True), "AminBackward0",
               identity_needed=True, complex_ok=False)


def _arg_reduce(name, impl):
    def infer(x: TensorType, *, axis: int) -> TensorType:
        _check_axes(name, x, (axis,))
        _require_real(name, x)
        if x.ndim and x.shape[axis] == 0:
            raise ShapeError(f"{name}(): Expected reduction dim {axis} to have non-zero size")
        return TensorType(_reduced_shape(x, (axis,)), dtypes.int64)

    def run(x, *, axis):
        return impl(_np_float_compute(x), axis=axis if x.ndim else None)

    return register(Primitive(name, Kind.REDUCE, infer, run, attrs=("axis",)))


argmax = _arg_reduce("argmax", np.argmax)
argmin = _arg_reduce("argmin", np.argmin)


# --------------------------------------------------------------------------- movement


def _reshape_infer(x: TensorType, *, shape: tuple[int, ...]) -> TensorType:
    n = 1
    for d in shape:
        n *= d
    if n != x.numel or any(d < 0 for d in shape):
        raise ShapeError(f"shape '{list(shape)}' is invalid for input of size {x.numel}")
    return TensorType(tuple(shape), x.dtype)


reshape = register(Primitive(
    "reshape", Kind.MOVEMENT, _reshape_infer, lambda x, *, shape: x.reshape(shape),
    (Rule(lambda g, out, x, *, shape: g.reshape(x.shape)),), "ViewBackward0", attrs=("shape",)))


def _permute_infer(x: TensorType, *, perm: tuple[int, ...]) -> TensorType:
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"permute: number of dims don't match or not a permutation: {perm} for {x}")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _permute_vjp(g, out, x, *, perm):
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return g.permute(*inverse)


permute = register(Primitive(
    "permute", Kind.MOVEMENT, _permute_infer, lambda x, *, perm: x.transpose(perm),
    (Rule(_permute_vjp),), "PermuteBackward0", attrs=("perm",)))


def _broadcast_infer(x: TensorType, *, shape: tuple[int, ...]) -> TensorType:
    if len(shape) < x.ndim:
        raise ShapeError(
            f"expand: the number of sizes provided ({len(shape)}) must be greater or equal to "
            f"the number of dimensions in the tensor ({x.ndim})")
    offset = len(shape) - x.ndim
    for i, d in enumerate(x.shape):
        if d != 1 and d != shape[offset + i]:
            raise ShapeError(
                f"expand: the expanded size of the tensor ({shape[offset + i]}) must match the "
                f"existing size ({d}) at non-singleton dimension {offset + i}.  Target sizes: "
                f"{list(shape)}.  Tensor sizes: {list(x.shape)}")
    return TensorType(tuple(shape), x.dtype)


broadcast_to = register(Primitive(
    "broadcast_to", Kind.MOVEMENT, _broadcast_infer,
    lambda x, *, shape: np.broadcast_to(x, shape),
    (Rule(lambda g, out, x, *, shape: _sum_to(g, x.shape)),), "ExpandBackward0",
    attrs=("shape",)))


def _slice_infer(x: TensorType, *, starts, stops, steps) -> TensorType:
    if not len(starts) == len(stops) == len(steps) == x.ndim:
        raise ShapeError(f"slice: need one start/stop/step per axis of {x}")
    shape = []
    for d, a, b, s in zip(x.shape, starts, stops, steps):
        if s <= 0:
            raise ShapeError("slice step must be positive")
        if not 0 <= a <= b <= d:
            raise ShapeError(f"slice: bounds {a}:{b} out of range for size {d}")
        shape.append((b - a + s - 1) // s)
    return TensorType(tuple(shape), x.dtype)


def _slice_impl(x, *, starts, stops, steps):
    return x[tuple(map(slice, starts, stops, steps))]     # map: no Python frame per axis


def _slice_vjp(g, out, x, *, starts, stops, steps):
    # Scatter g back into zeros: for a step s, interleave s-1 zeros after each element by
    # padding a new trailing axis and merging it; then pad the ends to the input's extent.
    for axis, (d, a, s) in enumerate(zip(x.shape, starts, steps)):
        m = g.shape[axis]
        if s > 1 and m > 0:
            g = g.unsqueeze(axis + 1)
            widths = [(0, 0)] * g.ndim
            widths[axis + 1] = (0, s - 1)
            g = _F().pad_axes(g, widths)
            merged = list(g.shape[:axis]) + [m * s] + list(g.shape[axis + 2:])
            g = g.reshape(merged)
            keep = min(m * s, d - a)
            g = g.narrow(axis, 0, keep)
    # one pad for all axes: a pad of a pad is a copy, one pad folds into its consumer's loop
    widths = [(a, d - a - n) for d, a, n in zip(x.shape, starts, g.shape)]
    if any(w != (0, 0) for w in widths):
        g = _F().pad_axes(g, widths)
    return g


slice_ = register(Primitive(
    "slice", Kind.MOVEMENT, _slice_infer, _slice_impl, (Rule(_slice_vjp),), "SliceBackward0",
    attrs=("starts", "stops", "steps")))


def _pad_infer(x: TensorType, *, widths, value) -> TensorType:
    if len(widths) != x.ndim or any(lo < 0 or hi < 0 for lo, hi in widths):
        raise ShapeError(f"pad: need one non-negative (low, high) pair per axis of {x}")
    return TensorType(tuple(d + lo + hi for d, (lo, hi) in zip(x.shape, widths)), x.dtype)


def _pad_vjp(g, out, x, *, widths, value):
    starts = tuple(lo for lo, _ in widths)
    stops = tuple(lo + d for (lo, _), d in zip(widths, x.shape))
    return _F().slice_axes(g, starts, stops, (1,) * x.ndim)


def _pad_impl(x, *, widths, value):
    # np.pad's constant mode, without its per-call Python (it dominated the small padded
    # slices of convolution backward): fill, then copy the input into the middle.
    if not x.ndim:
        return x.copy()
    if x.dtype.kind in "iub":        # np.pad's own checks of the value's range
        return np.pad(x, widths, constant_values=value)
    out = np.empty(tuple(d + lo + hi for d, (lo, hi) in zip(x.shape, widths)), x.dtype)
    out[...] = value                 # the assignment np.pad casts the value with
    out[tuple(slice(lo, lo + d) for d, (lo, _) in zip(x.shape, widths))] = x
    return out


pad = register(Primitive(
    "pad", Kind.MOVEMENT, _pad_infer, _pad_impl,
    (Rule(_pad_vjp),), "ConstantPadNdBackward0", attrs=("widths", "value")))


def _concat_infer(*xs: TensorType, axis: int) -> TensorType:
    if not xs:
        raise ShapeError("cat(): expected a non-empty list of Tensors")
    dt = _same_dtype("cat", *xs)
    first = xs[0]
    for t in xs[1:]:
        if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape))
                                       if i != axis):
            raise ShapeError(
                f"Sizes of tensors must match except in dimension {axis}. Got {_types_str(xs)}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in xs)
    return TensorType(tuple(shape), dt)


def _concat_vjp(g, out, *xs, argnum, axis):
    start = 0
    for x in xs[:argnum]:
        start += x.shape[axis]
    return g.narrow(axis, start, xs[argnum].shape[axis])


concat = register(Primitive(
    "concat", Kind.MOVEMENT, _concat_infer, lambda *xs, axis: np.concatenate(xs, axis=axis),
    (Rule(_concat_vjp),), "CatBackward0", attrs=("axis",), variadic=True))


# --------------------------------------------------------------------------- index


def _check_index(op: str, idx: TensorType) -> None:
    if idx.dtype.category != 1:
        raise ShapeError(f"{op}: index must be an integer tensor, got {idx}")


def _take_infer(x: TensorType, idx: TensorType, *, axis: int) -> TensorType:
    _check_index("take", idx)
    _check_axes("take", x, (axis,))
    return TensorType(x.shape[:axis] + idx.shape + x.shape[axis + 1:], x.dtype)


def _bounds(op: str, idx: np.ndarray, size: int, axis: int | None = None,
            wrap: bool = True) -> np.ndarray:
    """``idx``, or torch's IndexError naming ``op`` when an index is out of range: ``[-size,
    size)`` where negative indices count from the end (``wrap``), else ``[0, size)``."""
    low = -size if wrap else 0
    if idx.size and (idx.min() < low or idx.max() >= size):
        bad = idx[(idx < low) | (idx >= size)].flat[0]
        dim = "dimension" if axis is None else f"dimension {axis}"
        raise IndexError(f"{op}: index {bad} is out of bounds for {dim} with size {size}")
    return idx


def _take_impl(x, idx, *, axis):
    return np.take(x, _bounds("take", idx, x.shape[axis], axis), axis=axis)


def _take_vjp(g, out, x, idx, *, axis):
    return _F().take_add(g.new_zeros(x.shape), idx, g, axis)


take = register(Primitive("take", Kind.INDEX, _take_infer, _take_impl, (Rule(_take_vjp, (1,)), None),
                          "IndexSelectBackward0", attrs=("axis",)))


def _index_add_infer(x: TensorType, idx: TensorType, src: TensorType, *, axis: int) -> TensorType:
    _check_index("index_add", idx)
    _same_dtype("index_add", x, src)
    want = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
    if src.shape != want:
        raise ShapeError(f"index_add: source {src} does not match {want} (input {x}, index {idx})")
    return x


def _index_add_impl(x, idx, src, *, axis):
    # Row-major whatever x's layout: the row loop below adds through out.reshape(-1), which of
    # a transposed (Fortran-ordered) copy is a new array, and the sums were lost.
    out = np.array(x, copy=True, order="C")
    _bounds("index_add", idx, x.shape[axis], axis)
    if axis == 0 and out.ndim > 1 and out.size:
        rows = idx.reshape(-1)
        rows = np.where(rows < 0, rows + out.shape[0], rows)
        # Rows (an embedding's gradient): a native loop (fusegrad.runtime.native), else
        # np.add.at on the flat array with one index per element, 2-4x faster than on rows;
        # both add in the same order.
        from fusegrad.runtime.native import index_add_rows
        if index_add_rows(out, out, np.ascontiguousarray(rows, dtype=np.int64),
                          np.ascontiguousarray(src.reshape((rows.size,) + out.shape[1:]))):
            return out
        inner = out.size // out.shape[0]
        lin = (rows[:, None] * inner + np.arange(inner)).reshape(-1)
        np.add.at(out.reshape(-1), lin, src.reshape(-1))
        return out
    # Move the axis to the front so np.add.at can accumulate repeated indices.
    moved = np.moveaxis(out, axis, 0)
    src_moved = np.moveaxis(src.reshape(x.shape[:axis] + (idx.size,) + x.shape[axis + 1:]), axis, 0)
    np.add.at(moved, idx.reshape(-1), src_moved)
    return out




index_add = register(Primitive("index_add", Kind.INDEX, _index_add_infer, _index_add_impl,
                               (Rule(lambda g, out, x, idx, src, *, axis: g), None,
                                Rule(lambda g, out, x, idx, src, *, axis: _F().take(g, idx, axis),
                                     (1,))),
                               "IndexAddBackward0", attrs=("axis",)))


def _gather_infer(x: TensorType, idx: TensorType, *, axis: int) -> TensorType:
    _check_index("gather", idx)
    if idx.ndim != x.ndim:
        raise ShapeError(f"gather(): Index tensor must have the same number of dimensions as "
                         f"input tensor (input {x}, index {idx})")
    for i, (a, b) in enumerate(zip(idx.shape, x.shape)):
        if i != axis and a > b:
            raise ShapeError(f"gather(): Size does not match at dimension {i} expected index "
                             f"{list(idx.shape)} to be smaller than self {list(x.shape)} apart "
                             f"from dimension {axis}")
    return TensorType(idx.shape, x.dtype)


def _gather_impl(x, idx, *, axis):
    _bounds("gather", idx, x.shape[axis], axis)
    sl = tuple(slice(0, d) if i != axis else slice(None) for i, d in enumerate(idx.shape))
    return np.take_along_axis(x[sl], idx, axis=axis)


def _gather_vjp(g, out, x, idx, *, axis):
    # The scatter_add primitive, not the public op: the forward read (and checked) idx.
    return _F().bind(scatter_add, g.new_zeros(x.shape), idx, g, axis=axis)


gather = register(Primitive("gather", Kind.INDEX, _gather_infer, _gather_impl,
                            (Rule(_gather_vjp, (1,)), None), "GatherBackward0", attrs=("axis",)))


def _check_target_infer(target: TensorType, *, op: str, classes: int, ignore_index: int,
                        input: str) -> TensorType:  # noqa: A002
    _check_index(op, target)
    return target


def _check_target_impl(target, *, op, classes, ignore_index, input):  # noqa: A002
    if not target.size or (target.min() >= 0 and target.max() < classes):
        return target           # every target a class (the common case: two reductions)
    bad = (target != ignore_index) & ((target < 0) | (target >= classes))
    if bad.any():
        raise IndexError(f"Target {target[bad].flat[0]} is out of bounds. ({op}: input {input} "
                         f"has {classes} classes, target {dtypes.from_numpy_dtype(target.dtype).name}"
                         f"{list(target.shape)}; class indices must be in [0, {classes}) or "
                         f"equal ignore_index={ignore_index})")
    return target


# Class-index targets of nll_loss and cross_entropy checked as torch checks them ("Target 7
# is out of bounds."): eager at the call, and inside a compiled program as a node of its
# graph, so the error there names the loss rather than the gather it feeds.
check_target = register(Primitive("check_target", Kind.EXTERN, _check_target_infer,
                                  _check_target_impl,
                                  attrs=("op", "classes", "ignore_index", "input")))


def _check_index_infer(idx: TensorType, *, op: str, size: int, dim: int,
                       wrap: bool = False) -> TensorType:
    _check_index(op, idx)
    return idx


def _check_index_impl(idx, *, op, size, dim, wrap=False):
    return _bounds(op, idx, size, dim, wrap=wrap)


# Indices of the ops that torch bounds-checks without wrapping negative values (index_select,
# embedding, index_add, gather, scatter_add): the primitives under them also serve indexing,
# where -1 means the last element, so the check is a node of its own, as check_target is.
# ``wrap``: ``[-size, size)`` is in range (an index tensor of ``x[i, j]`` in a compiled call,
# checked against its own dim before the dims are linearized).
check_index = register(Primitive("check_index", Kind.EXTERN, _check_index_infer,
                                 _check_index_impl, attrs=("op", "size", "dim", "wrap")))


def _scatter_add_infer(x: TensorType, idx: TensorType, src: TensorType, *, axis) -> TensorType:
    _check_index("scatter_add", idx)
    _same_dtype("scatter_add", x, src)
    if not idx.ndim == src.ndim == x.ndim:
        raise ShapeError(f"scatter_add(): Index tensor must have the same number of dimensions "
                         f"as self and src (self {x}, index {idx}, src {src})")
    return x


def _scatter_add_impl(x, idx, src, *, axis):
    out = np.array(x, copy=True)
    _bounds("scatter_add", idx, x.shape[axis], axis)
    coords = list(np.indices(idx.shape, sparse=True))
    coords[axis] = idx
    src = src[tuple(slice(0, d) for d in idx.shape)]
    np.add.at(out, tuple(coords), src)
    return out




scatter_add = register(Primitive("scatter_add", Kind.INDEX, _scatter_add_infer, _scatter_add_impl,
                                 (Rule(lambda g, out, x, idx, src, *, axis: g), None,
                                  Rule(lambda g, out, x, idx, src, *, axis: g.gather(axis, idx),
                                       (1,))),
                                 "ScatterAddBackward0", attrs=("axis",)))


SCATTER_REDUCTIONS = ("replace", "sum", "prod", "mean", "amax", "amin")


def _scatter_reduce_infer(x: TensorType, idx: TensorType, src: TensorType, *, axis, reduce,
                          include_self) -> TensorType:
    _check_index("scatter", idx)
    _same_dtype("scatter", x, src)
    if not idx.ndim == src.ndim == x.ndim:
        raise ShapeError(f"scatter(): Index tensor must have the same number of dimensions "
                         f"as self and src (self {x}, index {idx}, src {src})")
    for i, (a, b, c) in enumerate(zip(idx.shape, x.shape, src.shape)):
        if a > c or (i != axis and a > b):
            raise ShapeError(f"scatter(): Expected index {list(idx.shape)} to be smaller than "
                             f"self {list(x.shape)} apart from dimension {axis} and to be "
                             f"smaller size than src {list(src.shape)}")
    return x


def _scatter_reduce_impl(x, idx, src, *, axis, reduce, include_self):
    out = np.array(x, copy=True)
    _bounds("scatter", idx, x.shape[axis], axis)
    coords = list(np.indices(idx.shape, sparse=True))
    coords[axis] = idx
    coords = tuple(coords)
    src = src[tuple(slice(0, d) for d in idx.shape)]
    if reduce == "replace":
        out[coords] = src
        return out
    count = np.zeros(x.shape, np.int64)
    np.add.at(count, coords, 1)
    hit = count > 0
    if not include_self:
        if reduce in ("sum", "mean"):
            fill = 0
        elif reduce == "prod":
            fill = 1
        elif x.dtype.kind == "f":
            fill = -np.inf if reduce == "amax" else np.inf
        else:
            info = np.iinfo(x.dtype) if x.dtype.kind in "iu" else None
            fill = (info.min if reduce == "amax" else info.max) if info else reduce == "amin"
        out[hit] = fill
    ufunc = {"sum": np.add, "mean": np.add, "prod": np.multiply, "amax": np.maximum,
             "amin": np.minimum}[reduce]
    ufunc.at(out, coords, src)
    if reduce == "mean":
        n = np.maximum(count + int(include_self), 1).astype(x.dtype)
        out = np.where(hit, out // n if x.dtype.kind in "iu" else out / n, out).astype(x.dtype)
    return out


def _scatter_reduce_dx(g, out, x, idx, src, *, axis, reduce, include_self):
    hit = g.new_zeros(x.shape).scatter_add(axis, idx, g.new_ones(idx.shape)) > 0
    if reduce == "replace" or not include_self:
        return g.masked_fill(hit, 0)      # x's elements that were written over
    if reduce == "sum":
        return g
    if reduce == "mean":
        return g / g.new_ones(x.shape).scatter_add(axis, idx, g.new_ones(idx.shape))
    if reduce == "prod":
        # torch's rule (derivatives of scatter_reduce): the product of the others is the
        # reduction over x with its zeros replaced by 1, divided by x there.
        masked = x.masked_fill(x == 0, 1)
        return g * masked.scatter_reduce(axis, idx, src, "prod") / masked
    # amax/amin: the gradient is shared equally by the elements that equal the result.
    x_wins = x == out
    src_wins = _narrow_to(src, idx.shape) == out.gather(axis, idx)
    n = x_wins.to(g.dtype).scatter_add(axis, idx, src_wins.to(g.dtype))
    return (g / n).masked_fill(~x_wins, 0)


def _narrow_to(t, shape):
    for i, d in enumerate(shape):
        if t.shape[i] != d:
            t = t.narrow(i, 0, d)
    return t


def _pad_to(t, shape):
    if tuple(t.shape) == tuple(shape):
        return t
    return _F().pad_axes(t, [(0, b - a) for a, b in zip(t.shape, shape)])


def _scatter_reduce_dsrc(g, out, x, idx, src, *, axis, reduce, include_self):
    s = _narrow_to(src, idx.shape)
    if reduce in ("replace", "sum"):
        return _pad_to(g.gather(axis, idx), src.shape)
    if reduce == "mean":
        count = g.new_full(x.shape, int(include_self)).scatter_add(axis, idx, g.new_ones(idx.shape))
        return _pad_to((g / count).gather(axis, idx), src.shape)
    if reduce == "prod":
        zero = s == 0
        zeros = g.new_zeros(x.shape).scatter_add(axis, idx, zero.to(g.dtype)).gather(axis, idx)
        single = zero & (zeros == 1)
        others = x.scatter_reduce(axis, idx, s.masked_fill(single, 1), "prod",
                                  include_self=include_self)
        grad = ((g * out).gather(axis, idx) / s.masked_fill(zero, 1)).masked_fill(zero, 0)
        return _pad_to(grad.where(~single, (g * others).gather(axis, idx)), src.shape)
    x_wins = (x == out) if include_self else \
        (x == out) & ~(g.new_zeros(x.shape).scatter_add(axis, idx, g.new_ones(idx.shape)) > 0)
    src_wins = s == out.gather(axis, idx)
    n = x_wins.to(g.dtype).scatter_add(axis, idx, src_wins.to(g.dtype))
    return _pad_to((g / n).gather(axis, idx).masked_fill(~src_wins, 0), src.shape)


# scatter, scatter(reduce=) and scatter_reduce: the numpy reference runs in compiled programs.
scatter_reduce = register(Primitive(
    "scatter_reduce", Kind.EXTERN, _scatter_reduce_infer, _scatter_reduce_impl,
    (Rule(_scatter_reduce_dx, (0, 1, 2), True), None, Rule(_scatter_reduce_dsrc, (0, 1, 2), True)),
    "ScatterReduceBackward0", attrs=("axis", "reduce", "include_self")))


def _bitcast_infer(x: TensorType, *, dtype: dtypes.DType) -> TensorType:
    if x.dtype.itemsize != dtype.itemsize:
        raise ShapeError(f"bitcast: {x.dtype} and {dtype} differ in size")
    return TensorType(x.shape, dtype)


# x.view(dtype) between dtypes of one size: the same bits, read as another type.
bitcast = register(Primitive(
    "bitcast", Kind.ELEMENTWISE, _bitcast_infer,
    lambda x, *, dtype: np.array(x, order="C").view(dtype.np_dtype), attrs=("dtype",)))


# --------------------------------------------------------------------------- contraction


# torch's names for dtypes in its matmul errors (caffe2::TypeMeta names).
_TORCH_C_NAMES = {"float32": "float", "float64": "double", "float16": "c10::Half",
                  "bfloat16": "c10::BFloat16", "int64": "long int", "int32": "int",
                  "int16": "short int", "int8": "signed char", "uint8": "unsigned char",
                  "bool": "bool", "complex64": "c10::complex<float>",
                  "complex128": "c10::complex<double>"}


def matmul_dtype_message(a: TensorType, b: TensorType) -> str:
    """torch's error for a matmul of two dtypes (it never promotes), with the operands."""
    na, nb = (_TORCH_C_NAMES.get(t.dtype.name, t.dtype.name) for t in (a, b))
    return (f"expected m1 and m2 to have the same dtype, but got: {na} != {nb} (matmul of "
            f"{a.dtype.name}{list(a.shape)} and {b.dtype.name}{list(b.shape)})")


def _matmul_infer(a: TensorType, b: TensorType) -> TensorType:
    if a.dtype is not b.dtype:
        raise ShapeError(matmul_dtype_message(a, b))
    dt = a.dtype
    if a.ndim < 2 or b.ndim < 2:
        raise ShapeError(f"matmul primitive needs 2-D or batched operands, got {a} and {b}")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(
            f"mat1 and mat2 shapes cannot be multiplied ({a.shape[-2]}x{a.shape[-1]} and "
            f"{b.shape[-2]}x{b.shape[-1]})")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2], op=f"matmul (batch dims of {a} and {b})")
    return TensorType(batch + (a.shape[-2], b.shape[-1]), dt)


# A bf16 x bf16 product of 2-D arrays with float32 sums, rounded once (the generated GEMM,
# registered by fusegrad.runtime.cpu where compiled programs use it); returns None for a
# product it does not take.
bf16_matmul_2d: Callable | None = None


def _matmul_impl(a, b):
    if a.dtype.kind in "iub":
        return np.matmul(a, b)
    if bf16_matmul_2d is not None and a.dtype == ml_dtypes.bfloat16 == b.dtype and a.ndim == b.ndim == 2:
        out = bf16_matmul_2d(a, b)
        if out is not None:
            return out
    return np.matmul(_np_float_compute(a), _np_float_compute(b))


matmul = register(Primitive("matmul", Kind.CONTRACTION, _matmul_infer, _matmul_impl, (
    Rule(lambda g, out, a, b: _sum_to(_F().matmul_nd(g, _conj(b).mT), a.shape), (1,)),
    Rule(lambda g, out, a, b: _sum_to(_F().matmul_nd(_conj(a).mT, g), b.shape), (0,))),
    "MmBackward0"))


# --------------------------------------------------------------------------- sources


def _full_infer(*, shape, value, dtype) -> TensorType:
    # An integer the dtype cannot hold would wrap in compiled code and raise in numpy (a
    # fraction truncates in both, as torch's fill does; any number is a bool).
    if isinstance(dtype, dtypes.DType) and dtype.category == 1 and \
            isinstance(value, (int, float, np.integer, np.floating)):
        info = np.iinfo(dtype.np_dtype)
        if not (math.isfinite(value) and info.min <= math.trunc(value) <= info.max):
            raise ShapeError(f"full: value {value!r} is not a value of dtype {dtype.short}")
    return TensorType(tuple(shape), dtype)


full = register(Primitive(
    "full", Kind.SOURCE, _full_infer,
    lambda *, shape, value, dtype: np.full(shape, value, dtype=dtype.np_dtype),
    attrs=("shape", "value", "dtype")))


def _constant_infer(*, value: ConstantData) -> TensorType:
    return TensorType(value.array.shape, dtypes.from_numpy_dtype(value.array.dtype))


constant = register(Primitive(
    "constant", Kind.SOURCE, _constant_infer, lambda *, value: value.array.copy(),
    attrs=("value",), doc="A tensor constant captured while tracing (numpy array)."))


def _iota_infer(*, shape, axis, dtype) -> TensorType:
    if not 0 <= axis < len(shape):
        raise ShapeError(f"iota: axis {axis} is out of range for shape {list(shape)}")
    return TensorType(tuple(shape), dtype)


def _iota_impl(*, shape, axis, dtype):
    ramp = np.arange(shape[axis], dtype=dtype.np_dtype)
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return np.broadcast_to(ramp.reshape(view), shape).copy()


iota = register(Primitive("iota", Kind.SOURCE, _iota_infer, _iota_impl,
                          attrs=("shape", "axis", "dtype")))


def _rand_infer(key: TensorType, *, shape, dtype) -> TensorType:
    if key.shape != (2,) or key.dtype is not dtypes.int64:
        raise ShapeError(f"random: the key must be i64[2] (seed, offset), got {key}")
    return TensorType(tuple(shape), dtype)


def _rand_impl(key, *, shape, dtype):
    from fusegrad.ops import philox
    return philox.uniform(int(key[0]), int(key[1]), shape, dtype.np_dtype)


random_uniform = register(Primitive(
    "random_uniform", Kind.SOURCE, _rand_infer, _rand_impl, attrs=("shape", "dtype"),
    doc="Uniform [0, 1) numbers from a counter-based generator keyed by (seed, offset)."))


# --------------------------------------------------------------------------- extern


def _argsort_infer(x: TensorType, *, axis, descending) -> TensorType:
    _check_axes("argsort", x, (axis,))
    _require_real("argsort", x)            # torch's sort has no order of complex numbers
    return TensorType(x.shape, dtypes.int64)


def _argsort_impl(x, *, axis, descending):
    if x.ndim == 0:
        return np.zeros((), np.int64)
    x = _np_float_compute(x)
    if descending:
        return _stable_desc(x, axis)
    return np.argsort(x, axis=axis, kind="stable")


def _stable_desc(x, axis):
    # Negating breaks ties the wrong way; sort on the reversed sequence and flip back.
    n = x.shape[axis]
    rev = np.flip(x, axis=axis)
    idx = np.argsort(rev, axis=axis, kind="stable")
    idx = np.flip(idx, axis=axis)
    return n - 1 - idx


argsort = register(Primitive("argsort", Kind.EXTERN, _argsort_infer, _argsort_impl,
                             attrs=("axis", "descending")))


def _cumsum_infer(x: TensorType, *, axis) -> TensorType:
    _check_axes("cumsum", x, (axis,))
    return TensorType(x.shape, _sum_dtype(x.dtype))


def _cumsum_vjp(g, out, x, *, axis):
    # Gradient of an inclusive prefix sum is the suffix sum: total - prefix + g.
    total = g.sum(dim=axis, keepdim=True)
    return total - g.cumsum(axis) + g


cumsum = register(Primitive(
    "cumsum", Kind.EXTERN, _cumsum_infer,
    lambda x, *, axis: np.cumsum(_np_float_compute(x), axis=axis) if x.ndim else x.copy(),
    (Rule(_cumsum_vjp),), "CumsumBackward0", attrs=("axis",)))


# --------------------------------------------------------------------------- custom VJPs

# name -> fn(ct, out, operands, params) -> one cotangent (or None) per operand: the backward
# formula of a composite op (softmax, gelu), registered by the module defining the op.
CUSTOM_VJPS: dict[str, Callable] = {}
# name -> (whether the VJP reads the output, whether it reads the operands): what an eager
# backward checks for in-place writes since the forward, as torch checks what it saved.
CUSTOM_VJP_READS: dict[str, tuple[bool, bool]] = {}


def register_vjp(name: str, reads_output: bool = False, reads_operands: bool = True):
    """Register ``fn(ct, out, operands, params)`` as the VJP named ``name`` of
    :data:`custom_vjp` nodes; ``reads_output`` and ``reads_operands`` say what it reads."""
    def decorate(fn):
        CUSTOM_VJPS[name] = fn
        CUSTOM_VJP_READS[name] = (reads_output, reads_operands)
        return fn
    return decorate


def _custom_vjp_infer(y: TensorType, *operands: TensorType, rule, params) -> TensorType:
    if rule not in CUSTOM_VJPS:
        raise ShapeError(f"custom_vjp: no VJP named {rule!r} is registered "
                         f"(known: {', '.join(sorted(CUSTOM_VJPS))})")
    if not isinstance(params, tuple):
        raise ShapeError(f"custom_vjp: params must be a tuple, got {params!r}")
    return y


def _custom_vjp_rule(ct, out, y, *operands, argnum, rule, params):
    if argnum == 0:
        return None     # the value's own computation gets no cotangent: the rule replaces it
    return CUSTOM_VJPS[rule](ct, out, operands, params)[argnum - 1]


# ``custom_vjp(y, *operands, rule, params)`` is ``y``, computed from ``operands`` by the
# primitives before it, with the gradient of ``operands`` given by the registered VJP
# ``rule`` instead of by differentiating those primitives. Composites (softmax, gelu) emit it
# when traced, so a compiled backward uses torch's formula (softmax: out * (g - sum(g * out)),
# saving only ``out``) rather than the chain of the forward's primitives, which saves more.
# ``simplify`` replaces it by ``y`` (after differentiation nothing reads the rule); a graph
# differentiated after that differentiates the primitives computing ``y``, which is correct.
custom_vjp = register(Primitive(
    "custom_vjp", Kind.EXTERN, _custom_vjp_infer, lambda y, *operands, rule, params: y,
    (Rule(_custom_vjp_rule, tuple(range(1, 65)), reads_output=True),), "CustomVjpBackward0",
    attrs=("rule", "params"), variadic=True))


# --------------------------------------------------------------------------- complex numbers
# A complex value's parts and its conjugate. These have no kernel lowering (nor has any op on
# a complex value): compiled programs run their numpy references as extern steps. ``real``,
# ``imag`` and ``view_as_real`` give numpy views of their operand, which the public ops mark
# as views of its storage (writes through them change it, as in torch).


def _require_complex(op: str, t: TensorType) -> None:
    if not t.dtype.is_complex:
        raise ShapeError(f"{op}: expected a complex operand, got {t}")


def _part_infer(name):
    def infer(x: TensorType) -> TensorType:
        _require_complex(name, x)
        return TensorType(x.shape, dtypes.to_real(x.dtype))
    return infer


def _real_vjp(g, out, x):
    return _F().complex(g, g.new_zeros(()).expand(*g.shape))


def _imag_vjp(g, out, x):
    return _F().complex(g.new_zeros(()).expand(*g.shape), g)


real = register(Primitive("real", Kind.EXTERN, _part_infer("real"), lambda x: x.real,
                          (Rule(_real_vjp),), "RealBackward0"))
imag = register(Primitive("imag", Kind.EXTERN, _part_infer("imag"), lambda x: x.imag,
                          (Rule(_imag_vjp),), "ImagBackward0"))


def _complex_infer(re: TensorType, im: TensorType) -> TensorType:
    if not (re.dtype.is_floating_point and im.dtype.is_floating_point) or \
            re.dtype not in (dtypes.float32, dtypes.float64) or \
            im.dtype not in (dtypes.float32, dtypes.float64):
        raise ShapeError(f"Expected both inputs to be Float or Double tensors but got "
                         f"{re.dtype.name} and {im.dtype.name} (complex of {re} and {im})")
    if re.dtype is not im.dtype:
        raise ShapeError(f"Expected object of scalar type {re.dtype.name} but got scalar type "
                         f"{im.dtype.name} for second argument (complex of {re} and {im})")
    return TensorType(broadcast_shapes(re.shape, im.shape, op="complex"),
                      dtypes.to_complex(re.dtype))


def _complex_impl(re, im):
    out = np.empty(np.broadcast_shapes(re.shape, im.shape),
                   np.complex64 if re.dtype == np.float32 else np.complex128)
    out.real, out.imag = re, im
    return out


complex_ = register(Primitive("complex", Kind.EXTERN, _complex_infer, _complex_impl, (
    Rule(lambda g, out, re, im: _sum_to(_F().real(g), re.shape)),
    Rule(lambda g, out, re, im: _sum_to(_F().imag(g), im.shape))), "ComplexBackward0"))


def _conj_infer(x: TensorType) -> TensorType:
    _require_complex("conj", x)
    return x


conj = register(Primitive("conj", Kind.EXTERN, _conj_infer, np.conjugate,
                          (Rule(lambda g, out, x: _F().conj_physical(g)),), "ConjBackward0"))


def _view_as_real_infer(x: TensorType) -> TensorType:
    if not x.dtype.is_complex:
        raise ShapeError(f"view_as_real is only supported for complex tensors (got {x})")
    return TensorType(x.shape + (2,), dtypes.to_real(x.dtype))


def _view_as_real_impl(x):
    if x.dtype.kind != "c":
        # the one-byte stand-in whose strides a traced view's layout is worked out on
        return np.broadcast_to(x[..., None], x.shape + (2,))
    part = x.real                             # a view: x's strides, the parts' itemsize
    return np.lib.stride_tricks.as_strided(part, x.shape + (2,), part.strides + (part.itemsize,))


def _view_as_complex_infer(x: TensorType) -> TensorType:
    if x.dtype not in (dtypes.float32, dtypes.float64):
        raise ShapeError(f"view_as_complex is only supported for float and double tensors, but "
                         f"got a tensor of scalar type: {x.dtype.name}")
    if not x.ndim or x.shape[-1] != 2:
        raise ShapeError(f"Tensor must have a last dimension of size 2 (got {x})")
    return TensorType(x.shape[:-1], dtypes.to_complex(x.dtype))


def _view_as_complex_impl(x):
    if x.dtype.kind not in "f":
        return x[..., 0]                       # a layout stand-in, as above
    if x.strides[-1] != x.itemsize:
        x = np.ascontiguousarray(x)
    return x.view(np.complex64 if x.dtype == np.float32 else np.complex128)[..., 0]


view_as_real = register(Primitive(
    "view_as_real", Kind.EXTERN, _view_as_real_infer, _view_as_real_impl,
    (Rule(lambda g, out, x: _F().view_as_complex(g.contiguous())),), "ViewAsRealBackward0"))
view_as_complex = register(Primitive(
    "view_as_complex", Kind.EXTERN, _view_as_complex_infer, _view_as_complex_impl,
    (Rule(lambda g, out, x: _F().view_as_real(g)),), "ViewAsComplexBackward0"))
