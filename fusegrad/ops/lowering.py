"""How each primitive lowers to scalar code: one table, written once for every backend.

Codegen turns a fused kernel into scalar code per element. What a primitive *means* per
element (numpy-exact floor division and remainder, powers, casts with NaN and Inf going to
integers, 16-bit float rounding, reduction identities) is written here, once, against a
small backend-neutral :class:`ScalarBuilder`. The lowerings (``fusegrad.codegen.cpu_lowering``,
``fusegrad.codegen.gpu_lowering``) call it through the kernel IR's builder
(``fusegrad.codegen.kernel_ir``), whose nodes the LLVM printer (whose ``LLVMScalars``
implements the builder with llvmlite instructions), the CUDA C printer and the reference
interpreter read.

The builder's operations have C's meaning on registers of a dtype (bool, the integer types,
float32, float64; a 16-bit float computes in a float32 register and is rounded where it is
stored or cast to):

- ``const(dt, value)``;
- ``binary(op, x, y, dt)``: ``add sub mul div rem and or xor shl shr max min``. Integer
  ``div``/``rem`` truncate (C's ``/`` and ``%``; the divisor is never 0 or, signed, -1 here),
  float ``rem`` is C's ``fmod``; ``shr`` is logical on unsigned types and arithmetic on
  signed ones; float ``max``/``min`` propagate NaN and order -0 below +0 (IEEE 754-2019
  maximum/minimum), integer ones compare by the dtype's signedness. ``reassociable=True``
  marks a reduction's combine, whose order the backend may change. Every float operation
  rounds on its own, as numpy's does: a backend never fuses it with a multiplication that
  feeds it into one rounding (an FMA);
- ``unary(op, x, dt)``: ``neg fabs floor ceil roundeven`` and the transcendental functions
  of :data:`MATH_FUNCTIONS` (the backend's accuracy contract: the CPU mathlib's);
- ``cmp(pred, x, y, dt)``: ``lt le gt ge eq ne``, C's comparisons (``ne`` is true for NaN,
  the others false), signed or unsigned by ``dt``; the result is a bool register;
- ``select(c, x, y, dt)``; ``cast(x, src, dst)``: C's conversion between register types
  (float to int only for values the destination holds); ``bitcast(x, src, dst)``;
- ``call(fn, args, dt)``: ``pow`` (float power, numpy's special cases), ``ipow`` (integer
  power by a non-negative exponent, wrapping), ``copysign``, ``fma`` (``x * y + z`` rounded
  once: only a matmul's accumulation, as BLAS's), ``muladd`` (``x * y + z``, rounded once
  where the CPU has an FMA: a hand-written kernel's product terms, never a graph's).

The table: :data:`LOWERINGS` maps a primitive name to its :class:`Lowering` (its scalar
function, whether it is commutative, and for reductions the identity and the combine).
CSE reads commutativity from it, fusion and codegen the reductions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from fusegrad import dtypes
from fusegrad.dtypes import DType
from fusegrad.ops.prims import float_to_int_wide
from fusegrad.symint import SymInt

__all__ = ["ScalarBuilder", "Lowering", "LOWERINGS", "Unsupported", "MATH_FUNCTIONS",
           "MATH_TABLE", "MathFunction", "COMMUTATIVE", "REDUCE_OPS", "EXACT_ON_HALF",
           "HALF_TYPES", "BITS16", "lower_scalar",
           "constant", "convert", "from_memory", "to_memory", "round_half", "memory_dtype",
           "register_dtype", "reduction_identity", "combine", "unsigned", "wide_int"]


class Unsupported(NotImplementedError):
    """A primitive or dtype with no kernel lowering: the runtime runs its numpy reference."""




@dataclass(frozen=True)
class MathFunction:
    """A transcendental function primitive (``unary(name, x, dt)``) and how each target
    spells it: ``c`` is the C (CUDA) name of its double version (``f`` appended for float),
    ``llvm_f64`` the LLVM symbol of its float64 version (an ``llvm.*`` intrinsic, else a libm
    function called lane by lane; the float32 versions are the CPU mathlib's inline code),
    ``numpy`` the numpy function the reference interpreter evaluates it with (None: no
    numpy ufunc, the interpreter has its own)."""

    name: str
    c: str
    llvm_f64: str
    numpy: str | None


# The one list of math functions: the lowering of each of these primitives, the CUDA
# printer, the LLVM mathlib and the interpreter read it.
MATH_TABLE: dict[str, MathFunction] = {f.name: f for f in (
    MathFunction("exp", "exp", "llvm.exp", "exp"),
    MathFunction("exp2", "exp2", "exp2", "exp2"),
    MathFunction("log", "log", "llvm.log", "log"),
    MathFunction("log2", "log2", "log2", "log2"),
    MathFunction("log10", "log10", "log10", "log10"),
    MathFunction("log1p", "log1p", "log1p", "log1p"),
    MathFunction("expm1", "expm1", "expm1", "expm1"),
    MathFunction("tanh", "tanh", "tanh", "tanh"),
    MathFunction("erf", "erf", "erf", None),
    MathFunction("sin", "sin", "llvm.sin", "sin"),
    MathFunction("cos", "cos", "llvm.cos", "cos"),
    MathFunction("tan", "tan", "tan", "tan"),
    MathFunction("sqrt", "sqrt", "llvm.sqrt", "sqrt"),
)}
MATH_FUNCTIONS = tuple(MATH_TABLE)
HALF_TYPES = (dtypes.float16, dtypes.bfloat16)
# 16-bit float bits in a register: an unsigned 16-bit integer (internal, not a tensor dtype).
BITS16 = dtypes.DType("uint16", "u16", np.dtype(np.uint16), 1)
# Ops whose float32 result on 16-bit operands is already a 16-bit value (they select or
# move an operand, or round to an integer), so it needs no rounding back.
EXACT_ON_HALF = frozenset({"copy", "stop_gradient", "neg", "abs", "sign", "floor", "ceil",
                           "round", "maximum", "minimum", "where", "cast", "reshape",
                           "broadcast_to", "pad", "concat", "full", "fmod"})


class ScalarBuilder(Protocol):
    """What a backend implements for the table (see the module docstring for the meaning of
    each operation). Values are the backend's own (llvmlite values, kernel IR nodes)."""

    def const(self, dt: DType, value) -> Any: ...
    def binary(self, op: str, x, y, dt: DType, reassociable: bool = False) -> Any: ...
    def unary(self, op: str, x, dt: DType) -> Any: ...
    def cmp(self, pred: str, x, y, dt: DType) -> Any: ...
    def select(self, c, x, y, dt: DType) -> Any: ...
    def cast(self, x, src: DType, dst: DType) -> Any: ...
    def bitcast(self, x, src: DType, dst: DType) -> Any: ...
    def call(self, fn: str, args: list, dt: DType) -> Any: ...


def unsigned(dt: DType) -> bool:
    """Whether integer registers of ``dt`` compare, divide and widen as unsigned."""
    return dt.category == 1 and not dt.is_signed or dt is dtypes.bool_


def register_dtype(dt: DType) -> DType:
    """The register type ``dt`` computes in (16-bit floats compute in float32)."""
    return dtypes.float32 if dt in HALF_TYPES else dt


def memory_dtype(dt: DType) -> DType:
    """The element type ``dt`` is loaded and stored as: bool is a byte, a 16-bit float its
    16 raw bits."""
    if dt is dtypes.bool_:
        return dtypes.uint8
    return BITS16 if dt in HALF_TYPES else dt


def wide_int(dt: DType) -> tuple[DType, int]:
    """The signed type a float converts through on its way to ``dt`` and its width (see
    ``fusegrad.ops.prims.float_to_int_wide``, the eager definition)."""
    _, bits = float_to_int_wide(dt)
    return (dtypes.int64 if bits == 64 else dtypes.int32), bits


# --------------------------------------------------------------------------- constants


def constant(b: ScalarBuilder, dt: DType, value):
    """A register holding ``value`` as ``dt`` holds it: a 16-bit constant is the 16-bit value
    (full(0.1, float16) is float16(0.1)), a bool 0 or 1."""
    if dt is dtypes.bool_:
        return b.const(dt, int(bool(value)))
    if isinstance(value, SymInt):
        # A size (a mean's count): read at run time where the kernel reads its sizes.
        if dt in HALF_TYPES:
            return convert(b, b.const(dtypes.float32, value), dtypes.float32, dt)
        return b.const(dt, value)
    if dt in HALF_TYPES:
        return b.const(dtypes.float32, float(np.asarray(value, dtype=dt.np_dtype)
                                             .astype(np.float32)))
    if dt.is_floating_point:
        return b.const(dt, float(value))
    return b.const(dt, int(value))


# --------------------------------------------------------------------------- memory forms

U32 = dtypes.uint32
F32 = dtypes.float32


def from_memory(b: ScalarBuilder, raw, dt: DType):
    """A loaded element (in :func:`memory_dtype`) as a register of :func:`register_dtype`."""
    if dt is dtypes.bool_:
        return b.cmp("ne", raw, b.const(dtypes.uint8, 0), dtypes.uint8)
    if dt in HALF_TYPES and getattr(b, "half_conversions", False):
        return b.call(f"{dt.name}_to_float", [raw], F32)
    if dt is dtypes.float16:
        return half_to_float(b, raw)
    if dt is dtypes.bfloat16:
        wide = b.binary("shl", b.cast(raw, BITS16, U32), b.const(U32, 16), U32)
        return b.bitcast(wide, U32, F32)
    return raw


def to_memory(b: ScalarBuilder, x, dt: DType):
    """A register as the element stored for ``dt`` (16-bit floats rounded to nearest even).
    A builder with ``half_conversions`` set (the GPU's: the hardware converts in one
    instruction) gets calls ``float_to_float16``/``float_to_bfloat16`` (and
    ``float16_to_float``/``bfloat16_to_float`` from :func:`from_memory`) instead of the
    integer code."""
    if dt is dtypes.bool_:
        return b.cast(x, dtypes.bool_, dtypes.uint8)
    if dt in HALF_TYPES and getattr(b, "half_conversions", False):
        return b.call(f"float_to_{dt.name}", [x], BITS16)
    if dt is dtypes.float16:
        return float_to_half(b, x)
    if dt is dtypes.bfloat16:
        # Round to nearest even on the upper 16 bits; NaNs stay NaN (quiet bit set).
        bits = b.bitcast(x, F32, U32)
        lsb = b.binary("and", b.binary("shr", bits, b.const(U32, 16), U32), b.const(U32, 1), U32)
        rounded = b.binary("add", bits, b.binary("add", b.const(U32, 0x7FFF), lsb, U32), U32)
        is_nan = b.cmp("ne", x, x, F32)
        quiet = b.binary("or", bits, b.const(U32, 0x400000), U32)
        chosen = b.select(is_nan, quiet, rounded, U32)
        return b.cast(b.binary("shr", chosen, b.const(U32, 16), U32), U32, BITS16)
    return x


def round_half(b: ScalarBuilder, x, dt: DType):
    """``x`` (a float register) rounded to ``dt`` when ``dt`` is a 16-bit float."""
    if dt not in HALF_TYPES:
        return x
    return from_memory(b, to_memory(b, x, dt), dt)


# float16 goes through integer code, not a half type: with half loads LLVM 22's SLP vectorizer
# takes tens of seconds on short inner loops, and GPUs compute half in float32 anyway.


def half_to_float(b: ScalarBuilder, raw):
    """IEEE half bits to float: the exponent and mantissa shifted into place and scaled by
    2**112 (rebiasing normals and denormals alike), Inf/NaN patched, sign or'ed in."""
    def c(v):
        return b.const(U32, v)
    h = b.cast(raw, BITS16, U32)
    magnitude = b.binary("shl", b.binary("and", h, c(0x7FFF), U32), c(13), U32)
    scaled = b.bitcast(b.binary("mul", b.bitcast(magnitude, U32, F32), b.const(F32, 2.0 ** 112),
                                F32), F32, U32)
    special = b.cmp("ge", magnitude, c(0x7C00 << 13), U32)
    bits = b.select(special, b.binary("or", magnitude, c(0x7F800000), U32), scaled, U32)
    sign = b.binary("shl", b.binary("and", h, c(0x8000), U32), c(16), U32)
    return b.bitcast(b.binary("or", bits, sign, U32), U32, F32)


def float_to_half(b: ScalarBuilder, x):
    """float to IEEE half bits, rounding to nearest even (F. Giesen's float_to_half_fast3):
    overflow to Inf, NaN to a quiet NaN, subnormal results rounded by a float addition."""
    def c(v):
        return b.const(U32, v)
    bits = b.bitcast(x, F32, U32)
    sign = b.binary("and", bits, c(0x80000000), U32)
    f = b.binary("xor", bits, sign, U32)
    # Subnormal halves: adding 0.5 (as float) lines the mantissa up and rounds it.
    magic = (127 - 15 + 23 - 10 + 1) << 23
    added = b.binary("add", b.bitcast(f, U32, F32), b.bitcast(c(magic), U32, F32), F32)
    sub = b.binary("sub", b.bitcast(added, F32, U32), c(magic), U32)
    odd = b.binary("and", b.binary("shr", f, c(13), U32), c(1), U32)
    normal = b.binary("shr", b.binary("add", b.binary("add", f, c(((15 - 127) << 23) + 0xFFF),
                                                      U32), odd, U32), c(13), U32)
    out = b.select(b.cmp("lt", f, c(113 << 23), U32), sub, normal, U32)
    inf_or_nan = b.select(b.cmp("gt", f, c(255 << 23), U32), c(0x7E00), c(0x7C00), U32)
    out = b.select(b.cmp("ge", f, c((127 + 16) << 23), U32), inf_or_nan, out, U32)
    return b.cast(b.binary("or", out, b.binary("shr", sign, c(16), U32), U32), U32, BITS16)


# --------------------------------------------------------------------------- casts


def convert(b: ScalarBuilder, x, src: DType, dst: DType):
    """numpy's (and eager's) ``astype`` from ``src`` to ``dst`` on registers."""
    if dst in HALF_TYPES and src is not dst:
        # A 16-bit float computes in a float register but must hold a 16-bit value: a
        # fused x.to(float16) rounds, it is not a no-op. float64 goes to float16 through
        # float32 rounded to odd, which makes the two roundings one (as numpy's direct
        # conversion); ml_dtypes rounds float64 to bfloat16 through float32 as well.
        if src is dtypes.float64 and dst is dtypes.float16:
            wide = round_to_odd(b, x)
        else:
            wide = convert(b, x, src, F32)
        return from_memory(b, to_memory(b, wide, dst), dst)
    src, dst = register_dtype(src), register_dtype(dst)
    if src is dst:
        return x
    if dst is dtypes.bool_:
        return b.cmp("ne", x, b.const(src, 0.0 if src.is_floating_point else 0), src)
    if src.is_floating_point and not dst.is_floating_point:
        return float_to_int(b, x, src, dst)
    return b.cast(x, src, dst)


def float_to_int(b: ScalarBuilder, x, src: DType, dst: DType):
    """torch's float-to-int cast on x86 (see ``prims.float_to_int_wide``): exact truncation to
    a wide signed type in range, INT_MIN of it for NaN, Inf and out of range, then the low
    bits. C's conversion is undefined out of range, so it only ever sees in-range values
    (others are replaced by 0 first)."""
    wide, bits = wide_int(dst)
    limit = 2.0 ** (bits - 1)
    inside = b.binary("and", b.cmp("ge", x, b.const(src, -limit), src),
                      b.cmp("lt", x, b.const(src, limit), src), dtypes.bool_)
    safe = b.select(inside, x, b.const(src, 0.0), src)
    out = b.select(inside, b.cast(safe, src, wide), b.const(wide, -(2 ** (bits - 1))), wide)
    return out if dst is wide else b.cast(out, wide, dst)


def round_to_odd(b: ScalarBuilder, x):
    """double to float, rounded toward zero with the lowest bit set when inexact."""
    f64 = dtypes.float64
    t = b.cast(x, f64, F32)
    back = b.cast(t, F32, f64)
    inexact = b.cmp("ne", back, x, f64)         # NaN too: its bits stay a NaN's
    away = b.cmp("gt", b.unary("fabs", back, f64), b.unary("fabs", x, f64), f64)
    bits = b.bitcast(t, F32, U32)
    bits = b.select(b.binary("and", inexact, away, dtypes.bool_),
                    b.binary("sub", bits, b.const(U32, 1), U32), bits, U32)
    bits = b.select(inexact, b.binary("or", bits, b.const(U32, 1), U32), bits, U32)
    return b.bitcast(bits, U32, F32)


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Lowering:
    """A primitive's lowering: ``scalar(b, node, args, dt)`` gives its value per element from
    its operands' registers (``dt``: the first operand's dtype); ``commutative``: operand
    order never changes the result, bit for bit; for reductions, ``identity(dt)`` is the
    accumulator's start and ``combine(b, acc, x, dt)`` one step."""

    scalar: Callable | None = None
    commutative: bool = False
    identity: Callable[[DType], Any] | None = None
    combine: Callable | None = None


LOWERINGS: dict[str, Lowering] = {}


def lowering(*names: str, commutative: bool = False, identity=None, combine=None):
    """Register the decorated scalar function as the lowering of primitives ``names``."""
    def register(fn):
        for name in names:
            LOWERINGS[name] = Lowering(fn, commutative, identity, combine)
        return fn
    return register


def lower_scalar(b: ScalarBuilder, node, args: list):
    """The value of elementwise ``node`` per element, from its operands' registers ``args``,
    rounded to a 16-bit result type where the op needs it."""
    entry = LOWERINGS.get(node.op)
    in_dt = node.inputs[0].type.dtype if node.inputs else node.output.type.dtype
    if entry is None or entry.scalar is None:
        raise Unsupported(f"no scalar lowering for {node.op} on {in_dt}")
    out = entry.scalar(b, node, args, in_dt)
    if node.op not in EXACT_ON_HALF:
        # Eager rounds every 16-bit result; so must a fused chain (tanh(5.) is 1 in
        # float16, and .long() of it must give 1, not 0).
        out = round_half(b, out, node.output.type.dtype)
    return out


def _r(dt: DType) -> DType:
    return register_dtype(dt)


@lowering("copy", "stop_gradient")
def _copy(b, node, a, dt):
    return a[0]


@lowering("cast")
def _cast(b, node, a, dt):
    return convert(b, a[0], dt, node.attrs["dtype"])


@lowering("neg")
def _neg(b, node, a, dt):
    return b.unary("neg", a[0], _r(dt))


@lowering("abs")
def _abs(b, node, a, dt):
    x, r = a[0], _r(dt)
    if dt.is_floating_point:
        return b.unary("fabs", x, r)
    if unsigned(dt):
        return x
    return b.select(b.cmp("lt", x, b.const(r, 0), r), b.unary("neg", x, r), x, r)


@lowering(*MATH_FUNCTIONS)
def _math(b, node, a, dt):
    return b.unary(node.op, a[0], _r(dt))


@lowering("reciprocal")
def _reciprocal(b, node, a, dt):
    return b.binary("div", b.const(_r(dt), 1.0), a[0], _r(dt))


@lowering("floor", "ceil", "round")
def _rounding(b, node, a, dt):
    return b.unary("roundeven" if node.op == "round" else node.op, a[0], _r(dt))


@lowering("sign")
def _sign(b, node, a, dt):
    x, r = a[0], _r(dt)
    if dt.is_floating_point:
        # sign(nan) and sign(-0.) are +0., as in torch and eager
        pos = b.cmp("gt", x, b.const(r, 0.0), r)
        neg = b.cmp("lt", x, b.const(r, 0.0), r)
        return b.select(pos, b.const(r, 1.0), b.select(neg, b.const(r, -1.0), b.const(r, 0.0), r),
                        r)
    zero = b.const(r, 0)
    pos = b.cast(b.cmp("gt", x, zero, r), dtypes.bool_, r)
    if not dt.is_signed:
        return pos
    return b.binary("sub", pos, b.cast(b.cmp("lt", x, zero, r), dtypes.bool_, r), r)


@lowering("not")
def _not(b, node, a, dt):
    return b.binary("xor", a[0], b.const(dtypes.bool_, 1), dtypes.bool_)


@lowering("add", commutative=True)
def _add(b, node, a, dt):
    return b.binary("add", a[0], a[1], _r(dt))


@lowering("mul", commutative=True)
def _mul(b, node, a, dt):
    return b.binary("mul", a[0], a[1], _r(dt))


@lowering("sub")
def _sub(b, node, a, dt):
    return b.binary("sub", a[0], a[1], _r(dt))


@lowering("div")
def _div(b, node, a, dt):
    if not dt.is_floating_point:
        raise Unsupported("integer true division reaches codegen only after a cast")
    return b.binary("div", a[0], a[1], _r(dt))


# Not maximum/minimum: a tie of -0.0 and 0.0 gives the second operand (torch's and the
# primitive's definition), so maximum(-0.0, 0.0) is 0.0 and maximum(0.0, -0.0) is -0.0.
@lowering("maximum", "minimum")
def _extremum(b, node, a, dt):
    x, y, r = a[0], a[1], _r(dt)
    if dt.is_floating_point:
        # numpy's (eager's) maximum: NaN if either is NaN, else ``x`` only where it is
        # strictly greater, so a tie of -0. and 0. gives ``y`` (x86's maxps computes this).
        wins = b.cmp("gt" if node.op == "maximum" else "lt", x, y, r)
        return b.select(b.cmp("ne", x, x, r), x, b.select(wins, x, y, r), r)
    if dt is dtypes.bool_:
        return b.binary("or" if node.op == "maximum" else "and", x, y, r)
    return b.binary("max" if node.op == "maximum" else "min", x, y, r)


@lowering("eq", "ne", commutative=True)
@lowering("lt", "le")
def _compare(b, node, a, dt):
    return b.cmp(node.op, a[0], a[1], _r(dt))


@lowering("and", "or", commutative=True)
def _logical(b, node, a, dt):
    return b.binary(node.op, a[0], a[1], _r(dt))


@lowering("bitand", "bitor", "bitxor", commutative=True)
def _bitwise(b, node, a, dt):
    return b.binary(node.op[3:], a[0], a[1], _r(dt))


@lowering("shl", "shr")
def _shift(b, node, a, dt):
    """torch's shifts: out-of-range amounts (negative, or at least the width; for a signed
    right shift at least width - 1) give 0 to the left and the sign fill to the right. The
    amount is clamped before the machine shift, whose result C leaves undefined there."""
    r = _r(dt)
    bits = dt.itemsize * 8
    limit = bits if node.op == "shl" or unsigned(dt) else bits - 1
    zero = b.const(r, 0)
    out_of_range = b.cmp("ge", a[1], b.const(r, limit), r)
    if not unsigned(dt):
        out_of_range = b.binary("or", out_of_range, b.cmp("lt", a[1], zero, r), dtypes.bool_)
    amount = b.select(out_of_range, zero, a[1], r)
    shifted = b.binary(node.op, a[0], amount, r)
    if node.op == "shl":
        return b.select(out_of_range, zero, shifted, r)
    fill = b.binary("shr", a[0], b.const(r, bits - 1), r) if not unsigned(dt) else zero
    return b.select(out_of_range, fill, shifted, r)


@lowering("bitcast")
def _bitcast(b, node, a, dt):
    # Registers of bool (i1) and of 16-bit floats (float32) do not hold the stored bits.
    out = node.output.type.dtype
    if dt.itemsize < 4 or out.itemsize < 4:
        raise Unsupported(f"no scalar lowering for bitcast from {dt} to {out}")
    return b.bitcast(a[0], dt, out)


@lowering("where")
def _where(b, node, a, dt):
    return b.select(a[0], a[1], a[2], _r(node.output.type.dtype))


@lowering("full")
def _full(b, node, a, dt):
    return constant(b, node.attrs["dtype"], node.attrs["value"])


def _reduce_as_copy(b, node, a, dt):
    """A reduction over no axes (fusion makes it a copy kernel): sum and prod of bools and
    integers still widen to int64, and a float sum adds its identity +0.0 (sum(-0.) is +0.,
    as in numpy and torch)."""
    if node.attrs["axes"]:
        raise Unsupported(f"{node.op} over axes is a loop, not a scalar")
    out_dt = node.output.type.dtype
    x = convert(b, a[0], dt, out_dt)
    if node.op == "sum" and out_dt.is_floating_point:
        x = b.binary("add", x, b.const(_r(out_dt), 0.0), _r(out_dt))
    return x


def _int_division_by_tensor(node, dt):
    divisor = node.inputs[1]
    if not dt.is_floating_point and (not _is_literal(divisor) or divisor.value == 0):
        # Eager (and torch) raise ZeroDivisionError on an integer division by zero; a
        # kernel cannot raise, so this one runs its numpy reference, which does.
        raise Unsupported(f"integer {node.op} by a tensor (raises on division by zero)")


def _is_literal(v) -> bool:
    return not hasattr(v, "producer")


@lowering("floordiv")
def _floordiv(b, node, a, dt):
    _int_division_by_tensor(node, dt)
    if dt.is_floating_point:
        return float_floordiv(b, a[0], a[1], _r(dt))
    return int_floordiv(b, a[0], a[1], dt)


@lowering("remainder")
def _remainder(b, node, a, dt):
    _int_division_by_tensor(node, dt)
    x, y, r = a[0], a[1], _r(dt)
    if dt.is_floating_point:
        rem = b.binary("rem", x, y, r)
        zero = b.const(r, 0.0)
        fix = b.binary("and", b.cmp("ne", rem, zero, r),
                       b.binary("xor", b.cmp("lt", rem, zero, r), b.cmp("lt", y, zero, r),
                                dtypes.bool_), dtypes.bool_)
        return b.select(fix, b.binary("add", rem, y, r), rem, r)
    zero = b.const(dt, 0)
    safe = safe_divisor(b, y, dt)
    if unsigned(dt):
        return b.binary("rem", x, safe, dt)
    rem = b.binary("rem", x, safe, dt)
    fix = b.binary("and", b.cmp("ne", rem, zero, dt),
                   b.cmp("lt", b.binary("xor", rem, safe, dt), zero, dt), dtypes.bool_)
    return b.select(fix, b.binary("add", rem, safe, dt), rem, dt)


@lowering("fmod")
def _fmod(b, node, a, dt):
    _int_division_by_tensor(node, dt)
    if dt.is_floating_point:
        return b.binary("rem", a[0], a[1], _r(dt))      # exact: IEEE fmod, as numpy and C
    # C's ``%`` (numpy's integer fmod): the sign of ``x``.
    return b.binary("rem", a[0], safe_divisor(b, a[1], dt), dt)


def float_floordiv(b: ScalarBuilder, x, y, r: DType):
    """numpy's ``floor_divide`` (``npy_divmod``): the quotient of ``x - fmod(x, y)``, moved
    down when the remainder's sign differs from ``y``'s and snapped to the nearest integer,
    so that 1 // 0.1 is 9 as in Python, where floor(1 / 0.1) would be 10."""
    bool_ = dtypes.bool_

    def exact(op, x, y):
        return b.binary(op, x, y, r)
    zero, one = b.const(r, 0.0), b.const(r, 1.0)
    mod = b.binary("rem", x, y, r)
    div = exact("div", exact("sub", x, mod), y)
    adjust = b.binary("and", b.cmp("ne", mod, zero, r),
                      b.binary("xor", b.cmp("lt", y, zero, r), b.cmp("lt", mod, zero, r), bool_),
                      bool_)
    div = b.select(adjust, exact("sub", div, one), div, r)
    floored = b.unary("floor", div, r)
    floored = b.select(b.cmp("gt", exact("sub", div, floored), b.const(r, 0.5), r),
                       exact("add", floored, one), floored, r)
    quotient = exact("div", x, y)
    signed_zero = b.call("copysign", [zero, quotient], r)
    out = b.select(b.cmp("ne", div, zero, r), floored, signed_zero, r)
    return b.select(b.cmp("eq", y, zero, r), quotient, out, r)


def safe_divisor(b: ScalarBuilder, y, dt: DType):
    """``y`` with the divisors C leaves undefined replaced by 1: 0 (only a nonzero literal
    reaches here) and, for signed types, -1 (INT_MIN / -1 overflows; callers patch the -1
    case, where x // -1 is -x wrapped and x % -1 is 0)."""
    bad = b.cmp("eq", y, b.const(dt, 0), dt)
    if not unsigned(dt):
        bad = b.binary("or", bad, b.cmp("eq", y, b.const(dt, -1), dt), dtypes.bool_)
    return b.select(bad, b.const(dt, 1), y, dt)


def int_floordiv(b: ScalarBuilder, x, y, dt: DType):
    """Integer floor division (numpy's: rounds toward -inf; x // -1 is -x, wrapping)."""
    zero = b.const(dt, 0)
    safe = safe_divisor(b, y, dt)
    if unsigned(dt):
        return b.binary("div", x, safe, dt)
    q = b.binary("div", x, safe, dt)
    rem = b.binary("rem", x, safe, dt)
    fix = b.binary("and", b.cmp("ne", rem, zero, dt),
                   b.cmp("lt", b.binary("xor", rem, safe, dt), zero, dt), dtypes.bool_)
    q = b.binary("sub", q, b.cast(fix, dtypes.bool_, dt), dt)
    return b.select(b.cmp("eq", y, b.const(dt, -1), dt), b.unary("neg", x, dt), q, dt)


@lowering("pow")
def _pow(b, node, a, dt):
    x, y, r = a[0], a[1], _r(dt)
    lit = node.inputs[1]
    if dt is dtypes.bool_:
        # 1**y = 1 and 0**0 = 1, 0**1 = 0: x or not y.
        return b.binary("or", x, b.binary("xor", y, b.const(dt, 1), dt), dt)
    if not dt.is_floating_point and dt.is_signed and (not _is_literal(lit) or lit.value < 0):
        # A negative exponent gives torch's truncated 1 / x**n (0, or +-1 for x = +-1), which
        # the square-and-multiply loop does not: this one runs its numpy reference.
        raise Unsupported("integer pow by a tensor or a negative exponent (1 / x**n "
                          "truncated for a negative exponent)")
    # Float products stay within 1 ulp up to the cube (x**4 reaches 1.5 ulp, and 1 / (x * x)
    # loses bits where x * x is denormal), so other float powers go through the math pow.
    lo, hi = (-1, 3) if dt.is_floating_point else (0, 8)
    if _is_literal(lit) and float(lit.value).is_integer() and lo <= lit.value <= hi:
        n = int(lit.value)
        if n == 0:
            return b.const(r, 1.0 if dt.is_floating_point else 1)
        acc = x
        for _ in range(abs(n) - 1):
            acc = b.binary("mul", acc, x, r)
        if n < 0:
            acc = b.binary("div", b.const(r, 1.0), acc, r)
        return acc
    if _is_literal(lit) and lit.value == 0.5 and dt.is_floating_point:
        # numpy (the eager reference) and torch both take float32/float64 x**0.5 as
        # sqrt(x): NaN at -inf and -0 at -0. Their float16 and bfloat16 powers are C's pow
        # in float32, which gives +inf and +0 there.
        if dt in HALF_TYPES:
            root = b.unary("sqrt", b.binary("add", x, b.const(r, 0.0), r), r)
            neg_inf = b.cmp("eq", x, b.const(r, -math.inf), r)
            return b.select(neg_inf, b.const(r, math.inf), root, r)
        return b.unary("sqrt", x, r)
    if not dt.is_floating_point:
        return b.call("ipow", [x, y], r)
    return b.call("pow", [x, y], r)


# --------------------------------------------------------------------------- reductions


def _sum_identity(dt: DType):
    # A float sum starts at +0.0, as numpy's and torch's do: sum([]) and sum([-0.]) are +0.
    # (-0.0, the identity of IEEE addition, would keep sum([-0.]) == -0.)
    return 0.0 if dt.is_floating_point else 0


def _extreme_identity(op: str):
    def identity(dt: DType):
        if dt.is_floating_point:
            return float("-inf") if op == "max" else float("inf")
        if dt is dtypes.bool_:
            return 0 if op == "max" else 1
        info = np.iinfo(dt.np_dtype)
        return int(info.min) if op == "max" else int(info.max)
    return identity


def _combine(op: str):
    def step(b, acc, x, dt):
        r = register_dtype(dt)
        if dt is dtypes.bool_ and op in ("max", "min"):
            return b.binary("or" if op == "max" else "and", acc, x, r)
        name = {"sum": "add", "prod": "mul"}.get(op, op)
        return b.binary(name, acc, x, r, reassociable=True)
    return step


for _op, _identity in (("sum", _sum_identity), ("prod", lambda dt: 1.0 if dt.is_floating_point
                                                  else 1),
                       ("max", _extreme_identity("max")), ("min", _extreme_identity("min"))):
    LOWERINGS[_op] = Lowering(_reduce_as_copy, False, _identity, _combine(_op))

REDUCE_OPS = frozenset(op for op, entry in LOWERINGS.items() if entry.combine is not None)
COMMUTATIVE = frozenset(op for op, entry in LOWERINGS.items() if entry.commutative)


def reduction_identity(b: ScalarBuilder, op: str, dt: DType):
    """The accumulator's starting value for reduction ``op`` with result dtype ``dt``."""
    return constant(b, dt, LOWERINGS[op].identity(dt))


def combine(b: ScalarBuilder, op: str, acc, x, dt: DType):
    """One step of reduction ``op``: ``acc`` combined with ``x`` (both of dtype ``dt``)."""
    return LOWERINGS[op].combine(b, acc, x, dt)
