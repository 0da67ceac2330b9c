"""LLVM IR for fused kernels, printed from the lowered kernel IR with llvmlite.ir.

A fused kernel is lowered for the CPU by :mod:`fusegrad.codegen.cpu_lowering` (loop nests,
the values of :mod:`fusegrad.codegen.values`, the scalar semantics of
:mod:`fusegrad.ops.lowering`); this module prints each :class:`LoweredKernel` it gives as
``void kN(i8** buffers, i64 start, i64 end)``: ``buffers`` holds the base pointers of the
buffers it reads and writes, at the ``slots`` numbers it is given (the CPU runtime numbers
each kernel's buffers on its own), and ``[start, end)`` is the part of the kernel's
outermost parallel loop this call runs, so the runtime can split a kernel across threads by
calling it on sub-ranges.

What is LLVM's alone is here: the :class:`LLVMScalars` builder (each scalar operation an
instruction, an intrinsic or :mod:`fusegrad.codegen.llvm.mathlib`'s inline code), allocas
for variables and local arrays (mem2reg turns accumulators into phis, so the loop vectorizer
sees reductions), loads ahead of the loops they do not depend on (:class:`KernelPrinter`),
and loop metadata: short constant loops unrolled, long ones that still hold an invariant
load not interleaved.

Floating-point: the graph's arithmetic carries no fast-math flags (each op rounds as numpy's
does; ``reassoc`` only on reduction combines), never ``nnan``/``ninf``, so NaN and Inf keep
their meaning. 16-bit floats compute in float32 (held as 16 raw bits in memory, converted
with integer code) and are rounded where they are stored or cast to. A primitive or dtype
with no lowering raises :class:`Unsupported`, and the runtime runs that kernel with numpy
instead.
"""

from __future__ import annotations

import llvmlite.ir as ir

from fusegrad import dtypes
from fusegrad.codegen import cpu_lowering
from fusegrad.codegen.kernel_ir import (
    INDEX,
    Assign,
    Declare,
    Expr,
    If,
    Local,
    Loop,
    LoweredKernel,
    Store,
    StoreLanes,
    StoreLocal,
)
from fusegrad.codegen.llvm import mathlib
from fusegrad.ir.graph import Value
from fusegrad.ir.kernel_graph import Kernel, KernelGraph
from fusegrad.ops import lowering
from fusegrad.ops.lowering import Unsupported

__all__ = ["Unsupported", "KernelPrinter", "emit_kernel", "module_text", "KERNEL_ARGS", "lltype",
           "LLVMScalars", "tuning"]

I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
VOID = ir.VoidType()
I8P = I8.as_pointer()
KERNEL_ARGS = (I8P.as_pointer(), I64, I64)

# Interleaving a loop body of transcendental math whose input is loop-invariant (a broadcast
# load: ``a.expand(8, 100).cos().erf()``, a concat of one-element tensors) takes LLVM 22's
# loop vectorizer time exponential in the body (cos+erf: 18 s, two of them: over 8 minutes).
# Codegen therefore emits a load whose address does not depend on a loop's index in that
# loop's preheader (KernelPrinter.value): LICM then moves the math out with it, and the
# vectorizer never sees it. A loop that still holds such a load (its address invariant but
# computed inside the loop) and whose body has more instructions than this is not
# interleaved (``llvm.loop.interleave.count`` 1); other loops keep interleaving, which long
# bodies gain from too (((x*1.5).tanh()*x).sum(): 15-40% slower with the cap).
MAX_INTERLEAVED_BODY = 48
# Constant loops this short are unrolled completely (see KernelPrinter.loop).
FULL_UNROLL_TRIPS = 8

# LLVM's loop vectorizer leaves loops of fewer known iterations alone unless asked.
MIN_VECTOR_TRIPS = 16

_REDUCE_FLAGS = ("reassoc",)


def tuning() -> str:
    """The printer's and the CPU lowering's tunable constants as text (the kernel cache
    keys on them: tests change them)."""
    return (f"{cpu_lowering.tuning()} MAX_INTERLEAVED_BODY={MAX_INTERLEAVED_BODY} "
            f"FULL_UNROLL_TRIPS={FULL_UNROLL_TRIPS} MIN_VECTOR_TRIPS={MIN_VECTOR_TRIPS}")


class _BFloatType(ir.types._BaseFloatType):
    """LLVM's ``bfloat`` (llvmlite has no type for it): the element of the vectors that
    AVX512_BF16's intrinsics take."""

    null = "0.0"
    intrinsic_name = "bf16"

    def __str__(self) -> str:
        return "bfloat"

    def format_constant(self, value) -> str:
        raise NotImplementedError("bfloat constants are written as 16-bit integers")


_BFloatType._create_instance()
BFLOAT = _BFloatType()


def _lanes(x: ir.Value) -> int:
    return x.type.count if isinstance(x.type, ir.VectorType) else 1


def lltype(dt: dtypes.DType, lanes: int = 1) -> ir.Type:
    """Register type of a dtype (bools are i1, 16-bit floats compute as float), a vector of
    ``lanes`` of them when ``lanes`` > 1."""
    if lanes > 1:
        return ir.VectorType(lltype(dt), lanes)
    if dt is dtypes.bool_:
        return I1
    if dt.is_floating_point:
        return F64 if dt is dtypes.float64 else F32
    return ir.IntType(dt.itemsize * 8)


class LLVMScalars:
    """The :class:`fusegrad.ops.lowering.ScalarBuilder` of the LLVM backend: each operation
    is one llvmlite instruction (or an intrinsic, or mathlib's inline code) at the position
    of ``printer.b``. Float arithmetic carries no fast-math flags (``reassoc`` on a
    reduction's combine), never ``nnan``/``ninf``."""

    def __init__(self, printer: "KernelPrinter"):
        self.em = printer

    @property
    def b(self) -> ir.IRBuilder:
        return self.em.b

    def const(self, dt: dtypes.DType, value) -> ir.Constant:
        t = lltype(dt)
        return ir.Constant(t, int(value) if isinstance(t, ir.IntType) else float(value))

    def binary(self, op: str, x, y, dt: dtypes.DType, reassociable: bool = False):
        b = self.b
        if dt.is_floating_point:
            if op in ("max", "min"):
                return self.em.intrinsic("llvm." + ("maximum" if op == "max" else "minimum"),
                                         [x, y])
            if op == "rem":
                return b.frem(x, y)           # exact: IEEE fmod, as numpy and C
            # No ``contract``: each op rounds as numpy's does. With it LLVM fused ``x*x - m``
            # into one FMA, which is not 0 where eager's is (softmax over a dim of size 1 of
            # x*x gave NaN where eager gives 1). The mathlib's polynomials keep their FMAs.
            return getattr(b, "f" + op)(x, y, flags=_REDUCE_FLAGS if reassociable else ())
        if dt is INDEX and op in ("add", "mul"):
            # Index arithmetic never wraps where its result is used (an index below a
            # window's start is selected away first): ``nsw`` lets SCEV see affine addresses.
            return getattr(b, op)(x, y, flags=("nsw",))
        u = lowering.unsigned(dt)
        if op in ("max", "min"):
            return self.em.intrinsic(f"llvm.{'u' if u else 's'}{op}", [x, y])
        if op == "div":
            return b.udiv(x, y) if u else b.sdiv(x, y)
        if op == "rem":
            return b.urem(x, y) if u else b.srem(x, y)
        if op == "shr":
            return b.lshr(x, y) if u else b.ashr(x, y)
        if op in ("and", "or"):
            return getattr(b, op + "_")(x, y)
        return getattr(b, op)(x, y)

    def unary(self, op: str, x, dt: dtypes.DType):
        b = self.b
        if op == "neg":
            return b.fneg(x) if dt.is_floating_point else b.neg(x)
        if op in ("fabs", "floor", "ceil", "roundeven"):
            return self.em.intrinsic(f"llvm.{op}", [x])
        if op == "freeze":
            # llvmlite's builder has no method for LLVM's ``freeze``.
            instr = ir.instructions.Instruction(b.block, x.type, "freeze", [x])
            b._insert(instr)
            return instr
        return mathlib.emit_unary(b, op, x)

    def cmp(self, pred: str, x, y, dt: dtypes.DType):
        sym = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[pred]
        b = self.b
        if dt.is_floating_point:
            if pred == "ne" and x is y:
                return b.fcmp_unordered("uno", x, x)      # isnan, as LLVM spells it
            return b.fcmp_unordered(sym, x, y) if pred == "ne" else b.fcmp_ordered(sym, x, y)
        if lowering.unsigned(dt):
            return b.icmp_unsigned(sym, x, y)
        return b.icmp_signed(sym, x, y)

    def select(self, c, x, y, dt: dtypes.DType):
        return self.b.select(c, x, y)

    def cast(self, x, src: dtypes.DType, dst: dtypes.DType):
        b = self.b
        st, dt_ = lltype(src), lltype(dst)
        # A vector converts lane by lane, to a vector of as many lanes.
        to = lltype(dst, _lanes(x))
        if src.is_floating_point and dst.is_floating_point:
            if st == dt_:
                return x
            return b.fpext(x, to) if isinstance(dt_, ir.DoubleType) else b.fptrunc(x, to)
        if src.is_floating_point:
            return b.fptoui(x, to) if lowering.unsigned(dst) else b.fptosi(x, to)
        if dst.is_floating_point:
            return b.uitofp(x, to) if lowering.unsigned(src) else b.sitofp(x, to)
        if st.width == dt_.width:
            return x
        if st.width > dt_.width:
            return b.trunc(x, to)
        return b.zext(x, to) if lowering.unsigned(src) else b.sext(x, to)

    def bitcast(self, x, src: dtypes.DType, dst: dtypes.DType):
        to = lltype(dst, _lanes(x))
        return x if lltype(src, _lanes(x)) == to else self.b.bitcast(x, to)

    def call(self, fn: str, args: list, dt: dtypes.DType):
        if fn == "pow":
            return mathlib.emit_pow(self.b, *args)
        if fn == "ipow":
            return self.int_power(*args)
        if fn == "copysign":
            return self.em.intrinsic("llvm.copysign", args)
        if fn == "fma":
            return self.em.intrinsic("llvm.fma", args)
        if fn == "muladd":
            # x * y + z, fused where the CPU has an FMA (a GEMM micro-kernel's term).
            return self.em.intrinsic("llvm.fmuladd", args)
        if fn == "dpbf16ps":
            return self.dot_bf16_pairs(*args)
        raise lowering.Unsupported(f"no LLVM lowering for {fn}")

    def dot_bf16_pairs(self, acc, x, y) -> ir.Value:
        """AVX512_BF16's ``vdpbf16ps``: ``acc`` (16 floats) plus, in each lane i, the
        products of the bf16 pairs ``2i`` and ``2i + 1`` of ``x`` and ``y`` (vectors of 32
        16-bit patterns, or of 16 32-bit words holding a pair each)."""
        name = "llvm.x86.avx512bf16.dpbf16ps.512"
        pairs = ir.VectorType(BFLOAT, 32)
        fn = self.em.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.em.module, ir.FunctionType(acc.type, [acc.type, pairs, pairs]),
                             name=name)
        return self.b.call(fn, [acc, self.b.bitcast(x, pairs), self.b.bitcast(y, pairs)])

    def int_power(self, x, y) -> ir.Value:
        """Integer ``x**y`` for ``y >= 0`` by square-and-multiply, wrapping as numpy does: a
        loop over the bits of ``y`` (unrolled over all 64 bits, LLVM takes seconds to
        vectorize it)."""
        b = self.b
        t = x.type
        zero, one = ir.Constant(t, 0), ir.Constant(t, 1)
        pre = b.block
        header = b.append_basic_block("ipow.header")
        body = b.append_basic_block("ipow.body")
        done = b.append_basic_block("ipow.exit")
        b.branch(header)
        b.position_at_end(header)
        acc, base, e = b.phi(t), b.phi(t), b.phi(t)
        acc.add_incoming(one, pre)
        base.add_incoming(x, pre)
        e.add_incoming(y, pre)
        b.cbranch(b.icmp_unsigned("!=", e, zero), body, done)
        b.position_at_end(body)
        bit = b.icmp_unsigned("!=", b.and_(e, one), zero)
        acc.add_incoming(b.select(bit, b.mul(acc, base), acc), body)
        base.add_incoming(b.mul(base, base), body)
        e.add_incoming(b.lshr(e, one), body)
        b.branch(header)
        b.position_at_end(done)
        return acc


class _OpenLoop:
    """A loop being printed: its index, the block before its header (where loads that do
    not depend on it go), the memo scope that block belongs to, and what the latch's
    metadata depends on."""

    def __init__(self, index: ir.PhiInstr, preheader: ir.Block, scope: int):
        self.index, self.preheader, self.scope = index, preheader, scope
        self.invariant_load = False      # holds a load whose index does not vary in it
        self.outer = False               # holds another loop


class KernelPrinter:
    """Prints one :class:`LoweredKernel` of the CPU lowering as an LLVM function
    ``void name(i8** bufs, i64 start, i64 end)``: ``bufs[slot_of(param)]`` is each
    parameter's buffer, ``start`` and ``end`` are the ``special`` expressions of those names
    (a ``c_abi`` kernel is ``result name(params..., scalars...)`` instead).

    Statements print in order; an expression prints where a statement first needs it, once
    per enclosing loop body (a memo per scope; a ``read`` of a variable is a fresh load of
    its alloca each time, which mem2reg turns into SSA values). A ``load`` whose index does
    not depend on the innermost open loops prints in the preheader of the outermost loop it
    does not depend on, when the kernel is ``hoistable`` (its address is then in bounds
    even where that loop would not run); otherwise the loops it sits in are marked (see
    :data:`MAX_INTERLEAVED_BODY`)."""

    def __init__(self, module: ir.Module, kernel: LoweredKernel, slot_of=None):
        self.module, self.kernel, self.slot_of = module, kernel, slot_of
        self.args: dict[int, ir.Argument] = {}     # a c_abi kernel's Param or scalar Var
        if kernel.c_abi:
            owners = kernel.params + kernel.scalars
            ret = VOID if kernel.result is None else lltype(kernel.result.dtype)
            types = [lltype(p.dtype).as_pointer() for p in kernel.params] + \
                [lltype(v.dtype) for v in kernel.scalars]
            self.fn = ir.Function(module, ir.FunctionType(ret, types), name=kernel.name)
            for owner, arg in zip(owners, self.fn.args):
                arg.name = owner.name
                if isinstance(arg.type, ir.PointerType):
                    arg.add_attribute("noalias")
                self.args[id(owner)] = arg
        else:
            self.fn = ir.Function(module, ir.FunctionType(VOID, KERNEL_ARGS), name=kernel.name)
            self.fn.args[0].name, self.fn.args[1].name = "bufs", "start"
            self.fn.args[2].name = "end"
        # Allocas and buffer pointers go to "entry", which jumps to "body" once the kernel is
        # complete; keeping the two apart lets both builders append without clashing.
        entry = self.fn.append_basic_block("entry")
        self.body_block = self.fn.append_basic_block("body")
        self.b = ir.IRBuilder(self.body_block)
        self.entry = ir.IRBuilder(entry)
        self.sb = LLVMScalars(self)
        self.ptrs: dict[int, ir.Value] = {}
        self.slots: dict[int, ir.Value] = {}         # Var or Local -> its alloca
        self.indices: dict[int, tuple[int, ir.Value]] = {}   # loop Var -> (depth, phi)
        self.scopes: list[dict] = [{}]
        self.loops: list[_OpenLoop] = []
        self._deps: dict[int, int] = {}

    def print(self) -> ir.Function:
        self.block(self.kernel.body)
        result = self.kernel.result
        if result is None:
            self.b.ret_void()
        else:
            self.b.ret(self.b.load(self.slot(result)))
        self.entry.branch(self.body_block)
        return self.fn

    # -- storage
    def ptr(self, param) -> ir.Value:
        """Typed base pointer of a parameter's buffer (loaded once, in the entry block)."""
        if id(param) in self.args:
            return self.args[id(param)]
        if id(param) not in self.ptrs:
            eb = self.entry
            slot = ir.Constant(I64, self.slot_of(param))
            raw = eb.load(eb.gep(self.fn.args[0], [slot], inbounds=True))
            self.ptrs[id(param)] = eb.bitcast(raw, lltype(param.dtype).as_pointer())
        return self.ptrs[id(param)]

    def slot(self, owner, size: int | None = None) -> ir.Value:
        """The alloca of a variable or a local array (in the entry block)."""
        if id(owner) not in self.slots:
            n = None if size is None else ir.Constant(I64, size)
            t = lltype(owner.dtype, getattr(owner, "lanes", 1))
            self.slots[id(owner)] = self.entry.alloca(t, size=n, name=owner.name)
        return self.slots[id(owner)]

    # -- statements
    def block(self, body: list) -> None:
        b = self.b
        for k, st in enumerate(body):
            if isinstance(st, (Declare, Assign)):
                value = st.init if isinstance(st, Declare) else st.value
                b.store(self.value(value), self.slot(st.var))
            elif isinstance(st, Store):
                if k and isinstance(body[k - 1], Store):
                    continue                    # printed with the first store of its run
                # A run of stores (a kernel's outputs at one index) computes every value
                # before the first store: an output may write the buffer of an input
                # (donation) that another output of the run still reads.
                run = []
                for nxt in body[k:]:
                    if not isinstance(nxt, Store):
                        break
                    run.append((nxt, self.value(nxt.index), self.value(nxt.value)))
                for nxt, index, value in run:
                    b.store(value, b.gep(self.ptr(nxt.param), [index], inbounds=True,
                                         name="addr"))
            elif isinstance(st, StoreLanes):
                index, value = self.value(st.index), self.value(st.value)
                at = self.lanes_at(st.param, index, value.type)
                if st.mask is None:
                    b.store(value, at, align=st.param.dtype.itemsize)
                else:
                    self.masked("store", value.type, [value, at, self.align(st.param),
                                                      self.value(st.mask)])
            elif isinstance(st, StoreLocal):
                index, value = self.value(st.index), self.value(st.value)
                b.store(value, b.gep(self.slot(st.local, st.local.size), [index]))
            elif isinstance(st, Loop):
                self.loop(st)
            elif isinstance(st, If):
                then = b.append_basic_block("then")
                done = b.append_basic_block("endif")
                b.cbranch(self.value(st.cond), then, done)
                b.position_at_end(then)
                self.scopes.append({})
                self.block(st.body)
                self.scopes.pop()
                b.branch(done)
                b.position_at_end(done)
            else:
                raise Unsupported(f"{type(st).__name__} in a CPU kernel")

    def loop(self, st: Loop) -> None:
        """A canonical counted loop; an innermost loop of at most ``FULL_UNROLL_TRIPS``
        constant iterations is unrolled completely (``llvm.loop.unroll.full``: the pipeline
        runs no unroller of its own, see :func:`fusegrad.runtime.jit._optimize`), so that
        the loop around it is innermost and vectorizes across rows (a softmax over 3
        classes, a (4000, 3) broadcast); ``unroll=False`` forbids unrolling, and asks LLVM
        to vectorize the loop when it is innermost and short."""
        b = self.b
        if not (st.step.op == "const" and st.step.arg == 1):
            raise Unsupported("CPU loops step by 1")
        trips = st.stop.arg - st.start.arg if st.start.op == st.stop.op == "const" else None
        start, stop = self.value(st.start), self.value(st.stop)
        first_block = len(self.fn.blocks)
        pre = b.block
        header = b.append_basic_block(f"{st.var.name}.header")
        body = b.append_basic_block(f"{st.var.name}.body")
        done = b.append_basic_block(f"{st.var.name}.exit")
        b.branch(header)
        b.position_at_end(header)
        i = b.phi(I64, name=st.var.name)
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", i, stop), body, done)
        b.position_at_end(body)
        if self.loops:
            self.loops[-1].outer = True
        self.indices[id(st.var)] = (len(self.loops), i)
        self.loops.append(_OpenLoop(i, pre, len(self.scopes) - 1))
        self.scopes.append({})
        self.block(st.body)
        self.scopes.pop()
        open_loop = self.loops.pop()
        nxt = b.add(i, ir.Constant(I64, 1), name=f"{st.var.name}.next", flags=("nsw",))
        i.add_incoming(nxt, b.block)
        latch = b.branch(header)
        if st.unroll is None:
            b.position_at_end(done)
            return
        short = trips is not None and 1 < trips <= FULL_UNROLL_TRIPS and not open_loop.outer
        flags: list = ["llvm.loop.unroll.disable"] if not st.unroll else \
            ["llvm.loop.unroll.full"] if short else []
        if not st.unroll and trips is not None and trips < MIN_VECTOR_TRIPS and \
                not open_loop.outer:
            # A rolled short loop (a (4000, 10) broadcast's rows): LLVM does not vectorize
            # loops of fewer than 16 known iterations unless asked (exp of (4000, 10) by
            # (10,): 332 us scalar, 98 us asked). Unrolled instead, the loop around it would
            # vectorize, but compiling that takes up to seconds (see _CPULowering.nest).
            flags.append(("llvm.loop.vectorize.enable", ir.Constant(I1, 1)))
        size = sum(len(block.instructions) for block in self.fn.blocks[first_block:])
        if size > MAX_INTERLEAVED_BODY and open_loop.invariant_load:
            flags.append(("llvm.loop.interleave.count", ir.Constant(I32, 1)))
        if flags:
            latch.set_metadata("llvm.loop", self.loop_id(*flags))
        b.position_at_end(done)

    def loop_id(self, *flags) -> ir.Value:
        """Loop metadata ``!N = !{!N, !{!"flag"}, !{!"flag", value}, ...}`` (a flag is a
        name or a (name, constant) pair): LLVM wants the node to refer to itself, which
        llvmlite cannot build, so the self-reference replaces a placeholder."""
        m = self.module
        props = [m.add_metadata([ir.MetaDataString(m, f)] if isinstance(f, str) else
                                [ir.MetaDataString(m, f[0]), f[1]]) for f in flags]
        node = m.add_metadata([ir.MetaDataString(m, f"loop{len(m.metadata)}")] + props)
        node.operands = (node,) + node.operands[1:]
        return node

    # -- expressions
    def depth(self, e: Expr) -> int:
        """How many of the open loops ``e`` may not be printed ahead of: one more than the
        deepest loop whose index it reads, all of them if it reads a variable or a local
        array (which statements change)."""
        key = id(e)
        hit = self._deps.get(key)
        if hit is not None:
            return hit
        if e.op == "read":
            if id(e.arg) in self.args:
                return 0
            entry = self.indices.get(id(e.arg))
            return entry[0] + 1 if entry is not None else len(self.loops)
        if e.op == "load_local":
            return len(self.loops)
        out = max((self.depth(s) for s in e.src), default=0)
        # Only expressions of loop indices and constants are cached: the loops they read
        # stay open while they are used.
        if not _reads_state(e):
            self._deps[key] = out
        return out

    def lookup(self, e: Expr, scope: int):
        for memo in reversed(self.scopes[:scope + 1]):
            hit = memo.get(id(e))
            if hit is not None:
                return hit[0]
        return None

    def value(self, e: Expr, scope: int | None = None) -> ir.Value:
        """The register of ``e`` at the builder's position (``scope``: the memo scope that
        position belongs to, the innermost by default)."""
        op = e.op
        if op == "const":
            return self.sb.const(e.dtype, e.arg)
        if op == "special":
            if e.arg not in ("start", "end") or self.kernel.c_abi:
                raise Unsupported(f"{e.arg} in a CPU kernel")
            return self.fn.args[1 if e.arg == "start" else 2]
        if op == "read":
            if id(e.arg) in self.args:
                return self.args[id(e.arg)]
            entry = self.indices.get(id(e.arg))
            return entry[1] if entry is not None else self.b.load(self.slot(e.arg))
        scope = len(self.scopes) - 1 if scope is None else scope
        hit = self.lookup(e, scope)
        if hit is not None:
            return hit
        if op == "load" and scope == len(self.scopes) - 1 and self.loops:
            depth = self.depth(e)
            if depth < len(self.loops):
                if self.kernel.hoistable:
                    target = self.loops[depth]
                    with self.b.goto_block(target.preheader):
                        out = self.value(e, target.scope)
                    return out
                for entry in self.loops[depth:]:
                    entry.invariant_load = True
        out = self.compute(e, [self.value(s, scope) for s in e.src])
        self.scopes[scope][id(e)] = (out, e)
        return out

    def compute(self, e: Expr, args: list) -> ir.Value:
        b, sb, op, dt = self.b, self.sb, e.op, e.dtype
        if op == "load":
            return b.load(b.gep(self.ptr(e.arg), args, inbounds=True, name="addr"))
        if op == "load_local":
            return b.load(b.gep(self.slot(e.arg, e.arg.size), args))
        if op == "address":
            return b.ptrtoint(self.ptr(e.arg), I64)
        if op == "broadcast":
            t = lltype(dt, e.lanes)
            if isinstance(args[0], ir.Constant):
                return ir.Constant(t, [args[0]] * e.lanes)
            one = b.insert_element(ir.Constant(t, ir.Undefined), args[0], ir.Constant(I32, 0))
            return b.shuffle_vector(one, ir.Constant(t, ir.Undefined),
                                    ir.Constant(ir.VectorType(I32, e.lanes), [0] * e.lanes))
        if op == "extract":
            return b.extract_element(args[0], ir.Constant(I32, e.arg))
        if op == "shuffle":
            return b.shuffle_vector(args[0], args[1],
                                    ir.Constant(ir.VectorType(I32, e.lanes), list(e.arg)))
        if op == "reduce":
            return self.reduce(e.arg, args[0], e.src[0].dtype)
        if op == "iota":
            return ir.Constant(lltype(dt, e.lanes), list(range(e.lanes)))
        if op == "load_lanes":
            t = lltype(dt, e.lanes)
            at = self.lanes_at(e.arg, args[0], t)
            if len(args) == 1:
                return b.load(at, align=e.arg.dtype.itemsize)
            return self.masked("load", t, [at, self.align(e.arg), args[1],
                                          ir.Constant(t, [ir.Constant(t.element, 0)] * e.lanes)])
        if op == "binary":
            return sb.binary(e.arg[0], *args, dt, e.arg[1])
        if op == "unary":
            return sb.unary(e.arg, *args, dt)
        if op == "cmp":
            return sb.cmp(e.arg[0], *args, e.arg[2])
        if op == "select":
            return sb.select(*args, dt)
        if op in ("cast", "bitcast"):
            return getattr(sb, op)(*args, e.arg, dt)
        if op == "call":
            return sb.call(e.arg, args, dt)
        raise Unsupported(f"{op} in a CPU kernel")

    def lanes_at(self, owner, index: ir.Value, t: ir.VectorType) -> ir.Value:
        """Pointer to the vector of type ``t`` at element ``index`` of a parameter's buffer or
        a local array."""
        base = self.slot(owner, owner.size) if isinstance(owner, Local) else self.ptr(owner)
        return self.b.bitcast(self.b.gep(base, [index], inbounds=True, name="addr"),
                              t.as_pointer())

    def reduce(self, kind: str, x: ir.Value, dt: dtypes.DType) -> ir.Value:
        """``llvm.vector.reduce.*`` of the lanes of ``x`` (see the kernel IR's ``reduce``)."""
        t = x.type.element
        if dt.is_floating_point:
            name = "fmaximum" if kind == "max" else "fadd"
        else:
            name = "umax" if kind == "max" else "add"
        full = f"llvm.vector.reduce.{name}.{_mangle(x.type)}"
        args = [ir.Constant(t, -0.0), x] if name == "fadd" else [x]
        fn = self.module.globals.get(full)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(t, [a.type for a in args]), name=full)
        return self.b.call(fn, args, fastmath=("reassoc",) if name == "fadd" else ())

    def align(self, param) -> ir.Constant:
        return ir.Constant(I32, param.dtype.itemsize)

    def masked(self, kind: str, t: ir.VectorType, args: list) -> ir.Value:
        """``llvm.masked.load`` or ``llvm.masked.store`` of vectors of type ``t``."""
        name = f"llvm.masked.{kind}.{_mangle(t)}.p0"
        fn = self.module.globals.get(name)
        if fn is None:
            ret = t if kind == "load" else VOID
            fn = ir.Function(self.module, ir.FunctionType(ret, [a.type for a in args]), name=name)
        return self.b.call(fn, args)

    def intrinsic(self, name: str, args: list, ret: ir.Type | None = None) -> ir.Value:
        t = args[0].type
        ret = ret or t
        suffix = _mangle(ret) if name.endswith(".sat") else _mangle(t)
        full = f"{name}.{suffix}" if not name.endswith(".sat") else \
            f"{name}.{_mangle(ret)}.{_mangle(t)}"
        fn = self.module.globals.get(full)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, [a.type for a in args]), name=full)
        return self.b.call(fn, args)


def _reads_state(e: Expr) -> bool:
    return any(s.op in ("read", "load_local") or _reads_state(s) for s in e.src)


_mangle = mathlib.mangle


def emit_kernel(module: ir.Module, kernel: Kernel, kg: KernelGraph,
                slots: dict[Value, int], scratch: int | None = None) -> ir.Function:
    """Emit ``kernel`` as functions of ``module`` (those of
    :func:`fusegrad.codegen.cpu_lowering.kernel_phases`); raises :class:`Unsupported` if
    some primitive or dtype in it has no lowering. A split full reduction keeps its partial
    results in the buffer of slot ``scratch``. Returns the last function."""
    lowered = cpu_lowering.lower_kernel(kernel, kg)

    def slot_of(param) -> int:
        if param.value is cpu_lowering.SCRATCH:
            if scratch is None:
                raise ValueError(f"{kernel.describe()} is split: it needs a scratch slot")
            return scratch
        return slots[param.value]
    fn = None
    for lk in lowered:
        fn = KernelPrinter(module, lk, slot_of).print()
    return fn




def module_text(name: str, kernels: list[LoweredKernel]) -> str:
    """LLVM IR text of a module holding ``kernels`` (written in the kernel IR, not lowered
    from a graph: the GEMM, the attention kernels, native helpers): a ``c_abi`` kernel is a
    plain function, any other is called with a table of its parameters' buffers in order."""
    module = ir.Module(name=name)
    for k in kernels:
        slots = {id(p): i for i, p in enumerate(k.params)}
        KernelPrinter(module, k, None if k.c_abi else lambda p, slots=slots: slots[id(p)]).print()
    return str(module)
