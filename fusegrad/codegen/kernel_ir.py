"""The lowered kernel IR: what a fused kernel is, per thread, before any backend prints it.

In the spirit of tinygrad's UOps and Triton's IR, but structured (loops and ifs nest, as the
CUDA C it becomes): a :class:`LoweredKernel` has buffer parameters, shared-memory arrays and a
body of statements; statements hold pure scalar expressions (:class:`Expr`, a DAG).

Expressions (``Expr.op``):

- ``const`` (``arg`` the value), ``special`` (``arg``: ``blockIdx``, ``threadIdx``,
  ``blockDim``, ``gridDim``, one dimension, x, on a GPU; ``start`` and ``end``, the range
  of the parallel loop a call of a CPU kernel runs), ``read`` (the current value of a
  :class:`Var`: a loop index or an accumulator);
- ``load`` (``src`` = (index,), ``arg`` the :class:`Param`), ``load_shared`` (``arg`` the
  :class:`Shared`), ``load_local`` (``arg`` the :class:`Local`);
- the :class:`fusegrad.ops.lowering.ScalarBuilder` operations: ``binary`` (``arg`` = (op,
  reassociable)), ``unary``, ``cmp``, ``select``, ``cast``, ``bitcast``, ``call``;
  and ``unary`` ``freeze``: the value itself, which a backend's optimizer must not look
  through (LLVM's ``freeze``; nothing elsewhere);
- ``shfl_xor`` (``src`` = (value,), ``arg`` the lane mask): the value of the lane whose
  index in the warp differs by ``arg`` (a warp shuffle; the whole warp must be converged);
- ``load_vec`` (``src`` = (vector index,), ``arg`` = (:class:`Param`, width)): ``width``
  consecutive elements at once (elements ``width * index`` on; a 16-byte load on a GPU),
  read lane by lane with ``extract`` (``arg`` the lane); ``aligned`` (``arg`` = (param,
  bytes)): whether the parameter's buffer starts at a multiple of ``bytes``; ``address``
  (``arg`` the :class:`Param`): the address of its buffer, an :data:`INDEX` (to tell
  whether two parameters are one buffer).

Vectors (a CPU kernel's register tiles): an expression or variable of ``lanes`` > 1 holds
that many values of its dtype, and arithmetic, comparisons, selects and ``call`` ``fma``
(and ``muladd``) work lane by lane on them (a select may pick whole vectors by a scalar
condition);
``broadcast`` (``src`` = (scalar,)) is a scalar in every lane, ``iota`` the lane numbers
0, 1, ...; ``load_lanes`` (``src`` = (element index,) or (element index, mask), ``arg`` the
:class:`Param` or :class:`Local`) reads ``lanes`` consecutive elements from an element
index, under a mask (a bool vector) when given: a lane whose mask is false reads 0 and
touches no memory; :class:`StoreLanes` writes a vector the same way. ``reduce`` (``arg``
``max`` or ``add``) combines the lanes of a vector into a scalar (a float max propagates
NaN, an integer one is unsigned; a float sum is reassociable, in any order); ``shuffle``
(``src`` = (a, b), ``arg`` lane numbers into a's lanes then b's) picks lanes of two vectors;
``extract`` (``arg`` the lane) one lane.

Statements: :class:`Declare` (a variable and its initial value), :class:`Assign`,
:class:`Store`, :class:`StoreVec` (``width`` consecutive elements at once, as ``load_vec``
reads them), :class:`StoreLanes`, :class:`StoreShared`, :class:`StoreLocal`, :class:`Loop`
(``for v = start; v < stop; v += step``; ``unroll=False`` forbids the backend to unroll it,
``unroll=None`` leaves it to the backend's own heuristics), :class:`If`, :class:`Barrier`
(``__syncthreads``), :class:`Fence` (``__threadfence``: this thread's global writes are
seen by the grid before its later ones) and :class:`AtomicInc` (a variable declared with an
element's old value, the element incremented atomically across the grid). A
:class:`Shared` of ``scope="grid"`` is one array for the whole grid (a ``__device__``
array in global memory that outlives the launch), where blocks meet.

A kernel is called with a table of buffer addresses and the range of its parallel loop;
one with ``c_abi`` is a plain function instead (a native helper the runtime calls directly:
its parameters, then its ``scalars``, returning the final value of its ``result``).

Kernels written by hand in it: the generated GEMM (:mod:`fusegrad.codegen.gemm`), the
attention kernels (:mod:`fusegrad.codegen.attention`), the native loops of extern steps
(:mod:`fusegrad.codegen.native_loops`). Two lowerings produce it from a fused kernel:
:mod:`fusegrad.codegen.gpu_lowering` (a grid of blocks and threads) and
:mod:`fusegrad.codegen.cpu_lowering` (loop nests whose outermost loop a thread pool
splits); both compute values with :mod:`fusegrad.codegen.values`.

Indices are of dtype :data:`INDEX` (64-bit, never negative where they address memory; the
unsigned comparison of ``shifted`` relies on wrap-around, as C's unsigned arithmetic does).
:func:`format_kernel` prints a kernel as text for tests; :mod:`fusegrad.codegen.interpret`
runs it on numpy, :mod:`fusegrad.codegen.cuda` prints it as CUDA C.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fusegrad import dtypes
from fusegrad.dtypes import DType
from fusegrad.symint import SymInt

__all__ = ["INDEX", "Expr", "Var", "Param", "Shared", "Local", "Declare", "Assign", "Store",
           "StoreVec", "StoreLanes", "StoreShared", "StoreLocal", "Loop", "If", "Barrier", "Fence",
           "AtomicInc",
           "LoweredKernel", "ExprBuilder", "format_kernel", "format_expr"]

# Index arithmetic: unsigned 64-bit (udiv/urem in LLVM; wraps like C's unsigned).
INDEX = DType("index", "idx", np.dtype(np.uint64), 1)


@dataclass(eq=False)
class Var:
    """A mutable register: a loop index or an accumulator (a vector of ``lanes`` values
    when ``lanes`` > 1)."""

    name: str
    dtype: DType
    lanes: int = 1


@dataclass(eq=False)
class Param:
    """A buffer parameter of the kernel: ``dtype`` is the element type in memory
    (:func:`fusegrad.ops.lowering.memory_dtype`); ``value`` the graph value it holds."""

    name: str
    dtype: DType
    value: Any = None
    writes: bool = False


@dataclass(eq=False)
class Shared:
    """A shared-memory array of a block, or with ``scope="grid"`` one global array of the
    whole grid (its elements start at zero and keep their values from launch to launch)."""

    name: str
    dtype: DType
    size: int
    scope: str = "block"


@dataclass(eq=False)
class Local:
    """An array of one thread's own (a CPU kernel's stack array: a row kept for a second
    pass, a tile of accumulators)."""

    name: str
    dtype: DType
    size: int


@dataclass(eq=False)
class Expr:
    """A pure expression, a scalar or a vector of ``lanes`` values (see the module
    docstring for the ops)."""

    op: str
    dtype: DType
    src: tuple = ()
    arg: Any = None
    lanes: int = 1


@dataclass(eq=False)
class Declare:
    var: Var
    init: Expr


@dataclass(eq=False)
class Assign:
    var: Var
    value: Expr


@dataclass(eq=False)
class Store:
    param: Param
    index: Expr
    value: Expr


@dataclass(eq=False)
class StoreShared:
    shared: Shared
    index: Expr
    value: Expr


@dataclass(eq=False)
class StoreVec:
    param: Param
    index: Expr          # in vectors of len(values) elements
    values: tuple


@dataclass(eq=False)
class StoreLanes:
    """The lanes of the vector ``value`` to consecutive elements of ``param`` (a
    :class:`Param` or a :class:`Local`) from the element ``index`` (only the lanes set in
    ``mask``, a bool vector, when given)."""

    param: Param | Local
    index: Expr
    value: Expr
    mask: Expr | None = None


@dataclass(eq=False)
class StoreLocal:
    local: Local
    index: Expr
    value: Expr


@dataclass(eq=False)
class Loop:
    var: Var
    start: Expr
    stop: Expr
    step: Expr
    body: list = field(default_factory=list)
    # False: never unrolled; None: as the backend's own heuristics decide (no hints).
    unroll: bool | None = True


@dataclass(eq=False)
class If:
    cond: Expr
    body: list = field(default_factory=list)


@dataclass(eq=False)
class Barrier:
    pass


@dataclass(eq=False)
class Fence:
    pass


@dataclass(eq=False)
class AtomicInc:
    """``var = shared[index]; shared[index] += 1`` as one atomic step of the grid (a
    ``scope="grid"`` array of an unsigned dtype)."""

    var: Var
    shared: Shared
    index: Expr


@dataclass(eq=False)
class LoweredKernel:
    """One kernel, per thread: launch ``grid`` blocks (at most; the body loops over the
    work with grid strides, so any grid of at least one block is correct) of ``block``
    threads. ``index_bits`` is 32 when every buffer and loop of the kernel has under 2**31
    elements: index arithmetic modulo 2**32 then gives the same addresses (GPUs divide 32-bit
    integers several times faster than 64-bit ones)."""

    name: str
    params: list[Param]
    shared: list[Shared]
    body: list
    block: int
    grid: int
    family: str = ""
    index_bits: int = 64      # 32 when every index fits: backends may use 32-bit registers
    locals: list[Local] = field(default_factory=list)
    # Whether a load whose index does not depend on a loop may be done ahead of it, even
    # when the loop would not run (every index the kernel computes is then in bounds).
    hoistable: bool = False
    # A plain function ``result name(params..., scalars...)`` (the buffers as pointers that
    # no two of which overlap where the kernel reads or writes them, then scalar arguments
    # read as variables), returning ``result``'s final value (void when None).
    c_abi: bool = False
    scalars: list[Var] = field(default_factory=list)
    result: Var | None = None
    # A kernel of symbolic sizes (its body reads them first, from the sizes buffer): the
    # blocks its work needs, an expression of the sizes; a launch then takes that many, at
    # most ``grid`` (see gpu_lowering.launch_grid). None when the grid is fixed.
    blocks: Any = None
    # A kernel of symbolic sizes with 32-bit indices: the sizes (expressions) that must stay
    # under 2**31 at a call for them to hold (see gpu_lowering.indices_fit).
    index_limits: tuple = ()

    def __str__(self) -> str:
        return format_kernel(self)


class ExprBuilder:
    """The :class:`fusegrad.ops.lowering.ScalarBuilder` that builds :class:`Expr` nodes.

    Pure nodes are hash-consed (one node per distinct operation on the same operands), so
    an expression used twice is one node and printed once."""

    def __init__(self):
        self._memo: dict = {}
        # A symbolic size's expression (see KernelValues.size_expr): what const() of an
        # INDEX that is a SymInt gives; None where sizes are constants.
        self.sizes = None

    def node(self, op: str, dtype: DType, src: tuple = (), arg=None,
             lanes: int | None = None) -> Expr:
        # An operation on vectors is a vector of as many lanes.
        lanes = max((s.lanes for s in src), default=1) if lanes is None else lanes
        key = (op, dtype.name, tuple(id(s) for s in src), _hashable(arg), lanes)
        hit = self._memo.get(key)
        if hit is not None:
            return hit[0]
        e = Expr(op, dtype, tuple(src), arg, lanes)
        self._memo[key] = (e, src)          # keeps the operands alive: their ids stay theirs
        return e

    def const(self, dt: DType, value) -> Expr:
        if self.sizes is not None and isinstance(value, SymInt):
            size = self.sizes(value)
            return size if dt is INDEX else self.cast(size, INDEX, dt)
        if dt.is_floating_point:
            value = float(value)
        else:
            value = int(value)
            if dt is not dtypes.bool_:
                bits = dt.np_dtype.itemsize * 8
                value &= (1 << bits) - 1
                if dt.np_dtype.kind == "i" and value >= 1 << (bits - 1):
                    value -= 1 << bits
        return self.node("const", dt, (), value)

    def binary(self, op, x, y, dt, reassociable=False) -> Expr:
        if dt is INDEX:
            # Fold the identities index arithmetic is full of (offset 0, stride 1).
            if op == "add" and _is_const(x, 0):
                return y
            if op in ("add", "sub") and _is_const(y, 0):
                return x
            if op in ("mul", "div") and _is_const(y, 1):
                return x
            if op == "mul" and _is_const(x, 1):
                return y
        return self.node("binary", dt, (x, y), (op, reassociable))

    def unary(self, op, x, dt) -> Expr:
        return self.node("unary", dt, (x,), op)

    def cmp(self, pred, x, y, dt) -> Expr:
        return self.node("cmp", dtypes.bool_, (x, y), (pred, dt.name, dt))

    def select(self, c, x, y, dt) -> Expr:
        return self.node("select", dt, (c, x, y))

    def cast(self, x, src, dst) -> Expr:
        return x if src is dst else self.node("cast", dst, (x,), src)

    def bitcast(self, x, src, dst) -> Expr:
        return x if src is dst else self.node("bitcast", dst, (x,), src)

    def call(self, fn, args, dt) -> Expr:
        return self.node("call", dt, tuple(args), fn)

    # -- kernel-level nodes
    def special(self, name: str) -> Expr:
        return self.node("special", INDEX, (), name)

    def read(self, var: Var) -> Expr:
        # Never hash-consed: a variable's value changes between statements.
        return Expr("read", var.dtype, (), var, var.lanes)

    def load(self, param: Param, index: Expr) -> Expr:
        return self.node("load", param.dtype, (index,), param)

    def load_shared(self, shared: Shared, index: Expr) -> Expr:
        # Never hash-consed: shared memory changes across barriers.
        return Expr("load_shared", shared.dtype, (index,), shared)

    def load_local(self, local: Local, index: Expr) -> Expr:
        # Never hash-consed: a local array changes between statements.
        return Expr("load_local", local.dtype, (index,), local)

    def load_vec(self, param: Param, index: Expr, width: int) -> Expr:
        return self.node("load_vec", param.dtype, (index,), (param, width))

    def extract(self, vec: Expr, lane: int) -> Expr:
        return self.node("extract", vec.dtype, (vec,), lane, 1)

    # A vector of one lane is a scalar: broadcast, iota and reduce are then the identity.
    def broadcast(self, x: Expr, lanes: int) -> Expr:
        return x if lanes == 1 else self.node("broadcast", x.dtype, (x,), None, lanes)

    def iota(self, dt: DType, lanes: int) -> Expr:
        return self.const(dt, 0) if lanes == 1 else self.node("iota", dt, (), None, lanes)

    def load_lanes(self, param: Param | Local, index: Expr, lanes: int,
                   mask: Expr | None = None) -> Expr:
        src = (index,) if mask is None else (index, mask)
        if isinstance(param, Local):
            # Never hash-consed: a local array changes between statements.
            return Expr("load_lanes", param.dtype, src, param, lanes)
        return self.node("load_lanes", param.dtype, src, param, lanes)

    def reduce(self, kind: str, x: Expr) -> Expr:
        return x if x.lanes == 1 else self.node("reduce", x.dtype, (x,), kind, 1)

    def shuffle(self, x: Expr, y: Expr, lanes: tuple) -> Expr:
        return self.node("shuffle", x.dtype, (x, y), tuple(lanes), len(lanes))

    def aligned(self, param: Param, size: int) -> Expr:
        return self.node("aligned", dtypes.bool_, (), (param, size))

    def address(self, param: Param) -> Expr:
        return self.node("address", INDEX, (), param)

    def shfl_xor(self, x: Expr, mask: int) -> Expr:
        return Expr("shfl_xor", x.dtype, (x,), mask)

    def index(self, value: int) -> Expr:
        return self.const(INDEX, value)

    def add(self, x, y):
        return self.binary("add", x, y, INDEX)

    def sub(self, x, y):
        return self.binary("sub", x, y, INDEX)

    def mul(self, x, y):
        return self.binary("mul", x, y, INDEX)

    def div(self, x, y):
        return self.binary("div", x, y, INDEX)

    def rem(self, x, y):
        return self.binary("rem", x, y, INDEX)


def _is_const(e: Expr, value) -> bool:
    return e.op == "const" and e.arg == value


def _hashable(arg):
    if isinstance(arg, (Param, Shared, Local, Var, DType)):
        return ("obj", id(arg))
    if isinstance(arg, tuple):
        return tuple(_hashable(a) for a in arg)
    if isinstance(arg, float):
        return ("f", repr(arg))               # tells -0.0 from 0.0, every NaN one key
    return arg


# --------------------------------------------------------------------------- printing


LEAVES = ("const", "special", "read")


class Linearizer:
    """Names the nodes of expressions as a printer emits them: each node that is not a
    leaf gets a temporary the first time a statement uses it, emitted just before that
    statement; a temporary made in an enclosing block is reused, one made in a closed block
    is not (``push``/``pop`` around nested bodies). ``render(e, args)`` gives the text of a
    node from its operands' text, ``define(name, e, text)`` the line that names it."""

    def __init__(self, render, define, leaf, prefix: str = "t"):
        self.render, self.define, self.leaf, self.prefix = render, define, leaf, prefix
        self.scopes: list[dict] = [{}]
        self.count = 0

    def push(self) -> None:
        self.scopes.append({})

    def pop(self) -> None:
        self.scopes.pop()

    def lookup(self, e: Expr):
        for scope in reversed(self.scopes):
            if id(e) in scope:
                return scope[id(e)][0]
        return None

    def text(self, e: Expr, lines: list) -> str:
        """The text of ``e``, appending the lines that define its new temporaries."""
        if e.op in LEAVES:
            return self.leaf(e)
        hit = self.lookup(e)
        if hit is not None:
            return hit
        # Iterative post-order: expression DAGs of fused kernels can be deep.
        stack = [(e, False)]
        while stack:
            node, ready = stack.pop()
            if node.op in LEAVES or self.lookup(node) is not None:
                continue
            if not ready:
                stack.append((node, True))
                stack.extend((s, False) for s in reversed(node.src))
                continue
            args = [self.leaf(s) if s.op in LEAVES else self.lookup(s) for s in node.src]
            name = f"{self.prefix}{self.count}"
            self.count += 1
            lines.append(self.define(name, node, self.render(node, args)))
            self.scopes[-1][id(node)] = (name, node)
        return self.lookup(e)


def _text_render(e: Expr, args: list[str]) -> str:
    joined = ", ".join(args)
    short = e.dtype.short + (f"x{e.lanes}" if e.lanes > 1 else "")    # f32x16: a vector
    if e.op in ("load", "load_shared", "load_local"):
        return f"{e.arg.name}[{joined}]"
    if e.op == "load_vec":
        return f"{e.arg[0].name}.v{e.arg[1]}[{joined}]"
    if e.op == "load_lanes":
        return f"{e.arg.name}.x{e.lanes}[{joined}]"
    if e.op == "extract":
        return f"{joined}.{e.arg}"
    if e.op == "aligned":
        return f"aligned({e.arg[0].name}, {e.arg[1]})"
    if e.op == "address":
        return f"address({e.arg.name})"
    if e.op == "binary":
        return f"{e.arg[0]}.{short}({joined})"
    if e.op == "cmp":
        return f"{e.arg[0]}.{e.arg[2].short}{short[len(e.dtype.short):]}({joined})"
    if e.op in ("unary", "call"):
        return f"{e.arg}.{short}({joined})"
    if e.op in ("cast", "bitcast"):
        return f"{e.op}.{e.arg.short}.{short}({joined})"
    if e.op == "shfl_xor":
        return f"shfl_xor.{short}({joined}, {e.arg})"
    return f"{e.op}.{short}({joined})"


def _text_leaf(e: Expr) -> str:
    if e.op == "const":
        return repr(e.arg)
    if e.op == "special":
        return e.arg if e.arg in ("start", "end") else f"{e.arg}.x"
    return e.arg.name


def format_expr(e: Expr) -> str:
    """An expression as text: the lines naming its parts, then its own name."""
    lin = Linearizer(_text_render, lambda n, e, t: f"{n} = {t}", _text_leaf, "%")
    lines: list[str] = []
    last = lin.text(e, lines)
    return "\n".join(lines + [last])


def format_kernel(k: LoweredKernel) -> str:
    """The kernel as indented text, one operation a line (``%tN = op.dtype(args)``)."""
    args = [f"{p.name}: {p.dtype.short}*" for p in k.params] + \
        [f"{v.name}: {v.dtype.short}" for v in k.scalars]
    launch = f"-> {k.result.name}: {k.result.dtype.short}" if k.result is not None else \
        "-> void" if k.c_abi else f"grid<={k.grid} block={k.block}"
    lines = [f"kernel {k.name}({', '.join(args)}) {launch} {{"]
    for s in k.shared:
        lines.append(f"  shared {s.name}: {s.dtype.short}[{s.size}]")
    for s in k.locals:
        lines.append(f"  local {s.name}: {s.dtype.short}[{s.size}]")
    lin = Linearizer(_text_render, lambda n, e, t: f"{n} = {t}", _text_leaf, "%")
    _format_body(k.body, lines, 1, lin)
    lines.append("}")
    return "\n".join(lines)


def _format_body(body: list, lines: list, depth: int, lin: Linearizer) -> None:
    pad = "  " * depth

    def t(e):
        new: list[str] = []
        out = lin.text(e, new)
        lines.extend(pad + line for line in new)
        return out

    for st in body:
        if isinstance(st, Declare):
            init = t(st.init)
            vec = f"{st.var.lanes}x" if st.var.lanes > 1 else ""
            lines.append(f"{pad}var {st.var.name}: {vec}{st.var.dtype.short} = {init}")
        elif isinstance(st, Assign):
            value = t(st.value)
            lines.append(f"{pad}{st.var.name} = {value}")
        elif isinstance(st, StoreVec):
            index = t(st.index)
            values = ", ".join(t(v) for v in st.values)
            lines.append(f"{pad}{st.param.name}.v{len(st.values)}[{index}] = ({values})")
        elif isinstance(st, StoreLanes):
            index, value = t(st.index), t(st.value)
            mask = f" if {t(st.mask)}" if st.mask is not None else ""
            lines.append(f"{pad}{st.param.name}.x{st.value.lanes}[{index}] = {value}{mask}")
        elif isinstance(st, (Store, StoreShared, StoreLocal)):
            target = st.param.name if isinstance(st, Store) else \
                st.shared.name if isinstance(st, StoreShared) else st.local.name
            index, value = t(st.index), t(st.value)
            lines.append(f"{pad}{target}[{index}] = {value}")
        elif isinstance(st, Loop):
            start, stop, step = t(st.start), t(st.stop), t(st.step)
            rolled = "" if st.unroll else " rolled"
            lines.append(f"{pad}for {st.var.name} in [{start}, {stop}) step {step}{rolled} {{")
            lin.push()
            _format_body(st.body, lines, depth + 1, lin)
            lin.pop()
            lines.append(f"{pad}}}")
        elif isinstance(st, If):
            cond = t(st.cond)
            lines.append(f"{pad}if {cond} {{")
            lin.push()
            _format_body(st.body, lines, depth + 1, lin)
            lin.pop()
            lines.append(f"{pad}}}")
        elif isinstance(st, Barrier):
            lines.append(f"{pad}barrier")
        elif isinstance(st, Fence):
            lines.append(f"{pad}fence")
        elif isinstance(st, AtomicInc):
            index = t(st.index)
            lines.append(f"{pad}var {st.var.name}: {st.var.dtype.short} = atomic_inc "
                         f"{st.shared.name}[{index}]")
        else:
            raise TypeError(f"not a statement: {st!r}")
