"""CUDA C from the lowered kernel IR: one ``extern "C" __global__`` function per kernel.

The printer is a printer: every decision (loop structure, what each primitive computes)
was made by the lowering (:mod:`fusegrad.codegen.gpu_lowering`, :mod:`fusegrad.ops.lowering`).
It chooses C spellings that keep the builder's contract:

- integer arithmetic that C leaves undefined on overflow (signed add, sub, mul, neg, shl)
  is done in the unsigned type and converted back, so it wraps as numpy's does;
- float add, sub, mul and div use the ``__fadd_rn``-style intrinsics, which the compiler
  never fuses into an FMA: each rounds on its own, as numpy's and the CPU kernels' do (the
  one FMA is the lowering's own ``fma``, a matmul's accumulation, as BLAS's);
- float max/min propagate NaN and order -0 below +0 (small device functions), unlike
  ``fmaxf``;
- constants are printed exactly (a float32 constant as the decimal of its float32 value,
  Inf and NaN by their bits);
- 16-bit floats are 16-bit integers in memory and float in registers; the conversions
  are the hardware's (``cvt.f32.f16``, ``cvt.rn.f16.f32``, ``cvt.rn.bf16.f32``: the
  instructions ``cuda_fp16.h``'s ``__half2float``/``__float2half_rn`` and ``cuda_bf16.h``'s
  ``__float2bfloat16_rn`` are, with ``__bfloat162float`` a shift) as small inline-PTX
  device functions, since NVRTC has no ``cuda_fp16.h`` without the toolkit's include
  directory: the source needs no header.

Read-only buffers are loaded through ``__ldg`` (the read-only data cache); ``load_vec`` and
``StoreVec`` of 4 lanes are ``float4``/``int4``/``uint4`` accesses, and ``ushort4`` (8 bytes)
for 16-bit floats.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from fusegrad import dtypes
from fusegrad.codegen.kernel_ir import (
    INDEX,
    LEAVES,
    Assign,
    AtomicInc,
    Barrier,
    Declare,
    Expr,
    Fence,
    If,
    Linearizer,
    Loop,
    LoweredKernel,
    Store,
    StoreShared,
    StoreVec,
)
from fusegrad.ops.lowering import BITS16, MATH_TABLE, Unsupported, unsigned

__all__ = ["cuda_source", "cuda_parts", "join_parts", "ctype", "PRELUDE"]

_CTYPES = {
    "bool": "bool", "uint8": "unsigned char", "int8": "signed char", "int16": "short",
    "uint16": "unsigned short", "int32": "int", "uint32": "unsigned int", "int64": "long long",
    "index": "unsigned long long", "float32": "float", "float64": "double",
}
_UNSIGNED_OF = {"signed char": "unsigned char", "short": "unsigned short", "int": "unsigned int",
                "long long": "unsigned long long"}
# Vectors of 4 elements (load_vec / StoreVec with 4 lanes): 16 bytes of 4-byte elements, 8
# bytes of 16-bit floats (stored as unsigned short): one vector load or store each.
_VEC4 = {"float": "float4", "int": "int4", "unsigned int": "uint4", "unsigned short": "ushort4"}
_LANES = "xyzw"
_LDG = {"unsigned char", "signed char", "short", "unsigned short", "int", "unsigned int",
        "long long", "unsigned long long", "float", "double"}

PRELUDE = """\
// fusegrad: kernels printed from the lowered kernel IR (fusegrad.codegen.cuda).
// Float max/min as numpy's reductions (and LLVM's llvm.maximum): NaN wins, -0 < +0.
__device__ __forceinline__ float fg_maxf(float a, float b) {
  if (a != a || b != b) return a + b;
  if (a == b) return __float_as_int(a) < 0 ? b : a;
  return a > b ? a : b;
}
__device__ __forceinline__ float fg_minf(float a, float b) {
  if (a != a || b != b) return a + b;
  if (a == b) return __float_as_int(a) < 0 ? a : b;
  return a < b ? a : b;
}
__device__ __forceinline__ double fg_max(double a, double b) {
  if (a != a || b != b) return a + b;
  if (a == b) return __double_as_longlong(a) < 0 ? b : a;
  return a > b ? a : b;
}
__device__ __forceinline__ double fg_min(double a, double b) {
  if (a != a || b != b) return a + b;
  if (a == b) return __double_as_longlong(a) < 0 ? a : b;
  return a < b ? a : b;
}
"""


def ctype(dt) -> str:
    """The C type of a register or memory dtype."""
    if dt is INDEX:
        return _CTYPES["index"]
    if dt is BITS16:
        return _CTYPES["uint16"]
    try:
        return _CTYPES[dt.name]
    except KeyError:
        raise Unsupported(f"no CUDA type for {dt.name}") from None


def _float_const(value: float, dt) -> str:
    if dt is dtypes.float64:
        if math.isfinite(value):
            return repr(float(value))
        bits = struct.unpack("<q", struct.pack("<d", value))[0]
        return f"__longlong_as_double({bits}LL)"
    f = np.float32(value)
    if np.isfinite(f):
        text = repr(float(f))
        return text + ("f" if ("." in text or "e" in text) else ".0f")
    bits = int(f.view(np.int32))
    return f"__int_as_float({bits})"


def _int_const(value: int, dt) -> str:
    t = ctype(dt)
    if dt is dtypes.bool_:
        return "true" if value else "false"
    if t in ("unsigned long long",):
        return f"{value}ULL"
    if t == "long long":
        return f"{value}LL" if value != -(1 << 63) else "(-9223372036854775807LL - 1)"
    if t == "unsigned int":
        return f"{value}u"
    if t == "int":
        return str(value) if value != -(1 << 31) else "(-2147483647 - 1)"
    return f"(({t}){value})"




# The hardware's 16-bit float conversions, as cuda_fp16.h and cuda_bf16.h write them (sm_80+).
_HALF_CONVERSIONS = {
    "float16_to_float": "__device__ __forceinline__ float fg_float16_to_float(unsigned short h) {\n"
                        "  float f;\n  asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));\n"
                        "  return f;\n}\n",
    "float_to_float16": "__device__ __forceinline__ unsigned short fg_float_to_float16(float f) {\n"
                        "  unsigned short h;\n"
                        "  asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n"
                        "  return h;\n}\n",
    "bfloat16_to_float": "__device__ __forceinline__ float fg_bfloat16_to_float(unsigned short h) {\n"
                         "  return __uint_as_float(((unsigned int)h) << 16);\n}\n",
    "float_to_bfloat16": "__device__ __forceinline__ unsigned short fg_float_to_bfloat16(float f) {\n"
                         "  unsigned short h;\n"
                         "  asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n"
                         "  return h;\n}\n",
}

_EXACT = {"add": "__fadd_rn", "sub": "__fsub_rn", "mul": "__fmul_rn", "div": "__fdiv_rn"}
_EXACT_D = {"add": "__dadd_rn", "sub": "__dsub_rn", "mul": "__dmul_rn", "div": "__ddiv_rn"}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_INT_OPS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "rem": "%", "and": "&", "or": "|",
            "xor": "^", "shl": "<<", "shr": ">>"}


# Expressions that read memory or talk to other lanes stay where they are.
_PINNED = {"load", "load_shared", "load_vec", "load_local", "load_lanes", "shfl_xor", "aligned",
           "address"}


def _loop_invariants(loop: Loop) -> list[Expr]:
    """The largest pure subexpressions of ``loop``'s body that read neither memory nor a
    variable the loop changes, for the printer to name before the loop: a row's
    ``1 / sqrt(var + eps)`` is then computed once per row, not once per element (and a
    double division's slow-path call no longer sits in the loop, where ptxas spills
    around it)."""
    changed: set[int] = {id(loop.var)}
    exprs: list[Expr] = []

    def collect(body: list) -> None:
        for st in body:
            if isinstance(st, (Declare, Assign)):
                changed.add(id(st.var))
            elif isinstance(st, AtomicInc):
                changed.add(id(st.var))
            if isinstance(st, Loop):
                changed.add(id(st.var))
                exprs.extend((st.start, st.stop, st.step))
                collect(st.body)
            elif isinstance(st, If):
                exprs.append(st.cond)
                collect(st.body)
            else:
                for name in ("init", "value", "index"):
                    if hasattr(st, name):
                        exprs.append(getattr(st, name))
                exprs.extend(getattr(st, "values", ()))
    collect(loop.body)
    invariant: dict[int, bool] = {}

    def is_invariant(root: Expr) -> bool:
        # Iterative post-order: fused kernels' expression DAGs can be deep.
        stack = [(root, False)]
        while stack:
            e, ready = stack.pop()
            if id(e) in invariant:
                continue
            if e.op == "read":
                invariant[id(e)] = id(e.arg) not in changed
            elif e.op in _PINNED:
                invariant[id(e)] = False
            elif not ready:
                stack.append((e, True))
                stack.extend((s, False) for s in e.src)
            else:
                invariant[id(e)] = all(invariant[id(s)] for s in e.src)
        return invariant[id(root)]

    out: list[Expr] = []
    seen: set[int] = set()
    stack = list(reversed(exprs))
    while stack:
        e = stack.pop()
        if id(e) in seen or e.op in LEAVES:
            continue
        seen.add(id(e))
        if is_invariant(e):
            out.append(e)
        else:
            stack.extend(reversed(e.src))
    return out


class _Printer:
    def __init__(self, k: LoweredKernel):
        self.k = k
        self.readonly = {id(p) for p in k.params if not p.writes}
        self.helpers: dict[str, str] = {}
        self.index_t = "unsigned int" if k.index_bits == 32 else "unsigned long long"
        self.lin = Linearizer(self.render, self.define, self.leaf)

    def ct(self, dt) -> str:
        return self.index_t if dt is INDEX else ctype(dt)

    def leaf(self, e: Expr) -> str:
        if e.op == "const":
            if e.dtype.is_floating_point:
                return _float_const(e.arg, e.dtype)
            if e.dtype is INDEX:
                return f"{e.arg & (1 << self.k.index_bits) - 1}{'u' if self.k.index_bits == 32 else 'ULL'}"
            return _int_const(e.arg, e.dtype)
        if e.op == "special":
            return f"({self.index_t}){e.arg}.x"
        return e.arg.name

    def define(self, name: str, e: Expr, text: str) -> str:
        t = self.vec_type(e.arg[0].dtype, e.arg[1]) if e.op == "load_vec" else self.ct(e.dtype)
        return f"const {t} {name} = {text};"

    def load(self, p, pointer: str, t: str, index: str) -> str:
        """``pointer[index]``, through ``__ldg`` (the read-only data cache) when ``p`` is
        read-only and ``__ldg`` takes type ``t``."""
        if id(p) in self.readonly and (t in _LDG or t in _VEC4.values()):
            return f"__ldg({pointer} + {index})"
        return f"{pointer}[{index}]"

    def shared_name(self, s) -> str:
        """A grid-scope array is a ``__device__`` array of the translation unit: its name
        carries the kernel's."""
        return f"{self.k.name}_{s.name}" if s.scope == "grid" else s.name

    def vec_type(self, dt, width: int) -> str:
        t = self.ct(dt)
        if width != 4 or t not in _VEC4:
            raise Unsupported(f"no CUDA vector of {width} {t}")
        return _VEC4[t]

    def render(self, e: Expr, a: list[str]) -> str:
        op, dt = e.op, e.dtype
        if e.lanes > 1:
            # The kernel IR's vectors are a CPU kernel's registers (the GEMM's, attention's).
            raise Unsupported(f"a vector of {e.lanes} lanes ({op}) in a CUDA kernel")
        if op == "load":
            return self.load(e.arg, e.arg.name, self.ct(e.arg.dtype), a[0])
        if op == "load_shared":
            if e.arg.scope == "grid":
                # Written by other blocks: read past the (incoherent) L1 cache.
                return f"__ldcg({self.shared_name(e.arg)} + {a[0]})"
            return f"{e.arg.name}[{a[0]}]"
        if op == "load_vec":
            p, width = e.arg
            vt = self.vec_type(p.dtype, width)
            return self.load(p, f"reinterpret_cast<const {vt}*>({p.name})", vt, a[0])
        if op == "extract":
            return f"{a[0]}.{_LANES[e.arg]}"
        if op == "aligned":
            p, size = e.arg
            return f"((((unsigned long long){p.name}) & {size - 1}ULL) == 0ULL)"
        if op == "shfl_xor":
            t = self.ct(dt)
            if t in ("int", "unsigned int", "long long", "unsigned long long", "float",
                     "double"):  # the types __shfl_xor_sync takes
                return f"__shfl_xor_sync(0xffffffffu, {a[0]}, {e.arg})"
            return f"({t})__shfl_xor_sync(0xffffffffu, (int){a[0]}, {e.arg})"
        if op == "binary":
            return self.binary(e.arg[0], a[0], a[1], dt)
        if op == "unary":
            return self.unary(e.arg, a[0], dt)
        if op == "cmp":
            return f"({a[0]} {_CMP[e.arg[0]]} {a[1]})"
        if op == "select":
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if op == "cast":
            return f"(({self.ct(dt)}){a[0]})"
        if op == "bitcast":
            src, t = self.ct(e.arg), self.ct(dt)
            if src == "float" and t == "unsigned int":
                return f"__float_as_uint({a[0]})"
            if src == "unsigned int" and t == "float":
                return f"__uint_as_float({a[0]})"
            if src == "double" and t in ("long long", "unsigned long long"):
                return f"(({t})__double_as_longlong({a[0]}))"
            if t == "double":
                return f"__longlong_as_double((long long){a[0]})"
            return f"(({t}){a[0]})"
        if op == "call":
            return self.call(e.arg, a, dt)
        raise Unsupported(f"no CUDA spelling for {op}")

    def binary(self, op: str, x: str, y: str, dt) -> str:
        t = self.ct(dt)
        if dt.is_floating_point:
            single = dt is not dtypes.float64
            if op in _EXACT:
                return f"{(_EXACT if single else _EXACT_D)[op]}({x}, {y})"
            if op == "rem":
                return f"fmod{'f' if single else ''}({x}, {y})"
            if op in ("max", "min"):
                return f"fg_{op}{'f' if single else ''}({x}, {y})"
            raise Unsupported(f"float {op}")
        if dt is dtypes.bool_:
            return {"and": f"({x} && {y})", "or": f"({x} || {y})", "xor": f"({x} != {y})",
                    "max": f"({x} || {y})", "min": f"({x} && {y})"}[op]
        if op in ("max", "min"):
            return f"({x} {'>' if op == 'max' else '<'} {y} ? {x} : {y})"
        if not unsigned(dt) and op in ("add", "sub", "mul", "shl"):
            # Signed overflow is undefined in C: wrap in the unsigned type, as numpy does.
            u = _UNSIGNED_OF[t]
            return f"(({t})(({u}){x} {_INT_OPS[op]} ({u}){y}))"
        return f"(({t})({x} {_INT_OPS[op]} {y}))"

    def unary(self, op: str, x: str, dt) -> str:
        t = self.ct(dt)
        f = "f" if dt is not dtypes.float64 else ""
        if op == "neg":
            if dt.is_floating_point:
                return f"(-{x})"
            if unsigned(dt):
                return f"(({t})(0 - {x}))"
            return f"(({t})(0 - ({_UNSIGNED_OF[t]}){x}))"
        if op == "fabs":
            return f"fabs{f}({x})"
        if op == "roundeven":
            return f"rint{f}({x})"
        if op in ("floor", "ceil"):
            return f"{op}{f}({x})"
        if op in MATH_TABLE:
            return f"{MATH_TABLE[op].c}{f}({x})"
        raise Unsupported(f"no CUDA function for {op}")

    def call(self, fn: str, a: list[str], dt) -> str:
        f = "f" if dt is not dtypes.float64 else ""
        if fn == "pow":
            return f"pow{f}({a[0]}, {a[1]})"
        if fn == "copysign":
            return f"copysign{f}({a[0]}, {a[1]})"
        if fn == "fma":
            return f"__fma{'f' if f else ''}_rn({a[0]}, {a[1]}, {a[2]})"
        if fn in _HALF_CONVERSIONS:
            self.helpers[fn] = _HALF_CONVERSIONS[fn]
            return f"fg_{fn}({a[0]})"
        if fn == "ipow":
            t = self.ct(dt)
            name = f"fg_ipow_{t.replace(' ', '_')}"
            u = _UNSIGNED_OF.get(t, t)
            self.helpers[name] = (
                f"__device__ __forceinline__ {t} {name}({t} x, {t} y) {{\n"
                f"  {u} acc = 1, base = ({u})x, e = ({u})y;\n"
                f"  while (e) {{ if (e & 1) acc = ({u})(acc * base); base = ({u})(base * base);"
                f" e >>= 1; }}\n"
                f"  return ({t})acc;\n}}\n")
            return f"{name}({a[0]}, {a[1]})"
        raise Unsupported(f"no CUDA function for {fn}")

    # -- statements
    def body(self, stmts: list, lines: list, depth: int) -> None:
        pad = "  " * depth

        def t(e):
            new: list[str] = []
            text = self.lin.text(e, new)
            lines.extend(pad + line for line in new)
            return text

        for st in stmts:
            if isinstance(st, Declare):
                init = t(st.init)
                lines.append(f"{pad}{self.ct(st.var.dtype)} {st.var.name} = {init};")
            elif isinstance(st, Assign):
                value = t(st.value)
                lines.append(f"{pad}{st.var.name} = {value};")
            elif isinstance(st, Store):
                index, value = t(st.index), t(st.value)
                lines.append(f"{pad}{st.param.name}[{index}] = {value};")
            elif isinstance(st, StoreShared):
                index, value = t(st.index), t(st.value)
                lines.append(f"{pad}{self.shared_name(st.shared)}[{index}] = {value};")
            elif isinstance(st, AtomicInc):
                index = t(st.index)
                lines.append(f"{pad}const {self.ct(st.var.dtype)} {st.var.name} = "
                             f"atomicAdd(&{self.shared_name(st.shared)}[{index}], 1u);")
            elif isinstance(st, Fence):
                lines.append(f"{pad}__threadfence();")
            elif isinstance(st, StoreVec):
                index = t(st.index)
                values = ", ".join(t(v) for v in st.values)
                vt = self.vec_type(st.param.dtype, len(st.values))
                lines.append(f"{pad}reinterpret_cast<{vt}*>({st.param.name})[{index}] = "
                             f"make_{vt}({values});")
            elif isinstance(st, Loop):
                start, stop, step = t(st.start), t(st.stop), t(st.step)
                for e in _loop_invariants(st):
                    t(e)        # named before the loop: the body reuses the temporary
                v = st.var.name
                lines.append(f"{pad}for ({self.ct(st.var.dtype)} {v} = {start}; {v} < {stop}; "
                             f"{v} += {step}) {{")
                self.lin.push()
                self.body(st.body, lines, depth + 1)
                self.lin.pop()
                lines.append(f"{pad}}}")
            elif isinstance(st, If):
                cond = t(st.cond)
                lines.append(f"{pad}if ({cond}) {{")
                self.lin.push()
                self.body(st.body, lines, depth + 1)
                self.lin.pop()
                lines.append(f"{pad}}}")
            elif isinstance(st, Barrier):
                lines.append(f"{pad}__syncthreads();")
            else:
                raise TypeError(f"not a statement: {st!r}")

    def kernel(self) -> str:
        k = self.k
        params = ", ".join(
            f"{'const ' if id(p) in self.readonly else ''}{self.ct(p.dtype)}* __restrict__ {p.name}"
            if id(p) in self.readonly else f"{self.ct(p.dtype)}* {p.name}" for p in k.params)
        lines = [f"__device__ {self.ct(s.dtype)} {self.shared_name(s)}[{s.size}];"
                 for s in k.shared if s.scope == "grid"]
        lines += [f"// {k.family}: grid <= {k.grid} blocks of {k.block} threads",
                 f'extern "C" __global__ void __launch_bounds__({k.block}, {_min_blocks(k.block)}) '
                 f'{k.name}({params}) {{']
        for s in k.shared:
            if s.scope == "grid":
                continue
            lines.append(f"  __shared__ {self.ct(s.dtype)} {s.name}[{s.size}];")
        self.body(k.body, lines, 1)
        lines.append("}")
        return "\n".join(lines)


def _min_blocks(block: int) -> int:
    """``__launch_bounds__``'s blocks per multiprocessor: enough for a budget of 64
    registers a thread (65536 registers / 1024 threads: four blocks of 256 threads, half of
    an H100's threads, stay resident). With the block size alone ptxas picks a budget of its
    own: it spilled registers of a small column reduction for sm_90 at 40, and with a budget
    of 128 some kernels took all 128 (a quarter of the threads resident)."""
    return max(1, 1024 // block)


def cuda_parts(kernel: LoweredKernel) -> tuple[dict[str, str], str]:
    """``kernel`` printed: the device functions it needs, by name, and its own text (the
    pieces :func:`cuda_source` puts after :data:`PRELUDE`)."""
    if kernel.c_abi:
        raise Unsupported(f"{kernel.name} is a native helper of the host (c_abi), not a CUDA kernel")
    p = _Printer(kernel)
    body = p.kernel()
    return p.helpers, body


def join_parts(parts: list[tuple[dict[str, str], str]]) -> str:
    """One translation unit of kernels printed by :func:`cuda_parts`: the prelude, each
    device function once, then the kernels."""
    helpers: dict[str, str] = {}
    for h, _ in parts:
        helpers.update(h)
    return "\n".join([PRELUDE] + [helpers[n] for n in sorted(helpers)] +
                     [body for _, body in parts]) + "\n"


def cuda_source(kernels: list[LoweredKernel]) -> str:
    """One CUDA C translation unit holding ``kernels`` (compile it with NVRTC or
    ``nvcc -ptx``; no headers needed)."""
    return join_parts([cuda_parts(k) for k in kernels])
