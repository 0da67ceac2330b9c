"""The values of a fused kernel as lowered-IR expressions at a multi-index.

Both lowerings (:mod:`fusegrad.codegen.cpu_lowering`, :mod:`fusegrad.codegen.gpu_lowering`)
compute what a kernel stores the same way, and differ only in the loops around it: a value
computed in the kernel is its primitive applied to its operands at the matching (broadcast)
index (:func:`fusegrad.ops.lowering.lower_scalar`), a value in memory is a load through the
strides of its view, a reduction's result is its accumulator (``acc``), and reshapes,
broadcasts, pads and concatenations only change the index (:mod:`fusegrad.codegen.indexing`).
Values are memoized by (value, index), so a value used twice at one index is one expression.
"""

from __future__ import annotations

from typing import Sequence

from fusegrad.codegen import indexing
from fusegrad.codegen.kernel_ir import INDEX, Declare, ExprBuilder, Param, Var
from fusegrad.ir.graph import Graph, Literal, Node, Value
from fusegrad.ir.kernel_graph import Kernel, KernelGraph, View, identity_view
from fusegrad.ops import lowering
from fusegrad.ops.lowering import Unsupported
from fusegrad.symint import SymbolicDecisionError, SymInt, free_symbols

__all__ = ["KernelValues", "reductions", "MOVES_ELEMENTS", "SYMBOLS", "program_symbols"]

# ``Param.value`` of the sizes a kernel of symbolic shapes reads at run time: a buffer of
# one 64-bit integer per symbol of its program (:func:`program_symbols`, in that order).
SYMBOLS = "symbols"


def program_symbols(g: Graph) -> tuple[str, ...]:
    """The symbols of a graph's input shapes, sorted: the order of the sizes its kernels
    read at run time (every size in the graph is an expression of them)."""
    names: set[str] = set()
    for v in g.inputs:
        names |= free_symbols(v.type.shape)
    return tuple(sorted(names))

# Nodes that read their operand at other coordinates than their own, or make values of
# coordinates: in a kernel holding one, buffers are not read at the kernel's coordinates,
# so a lowering cannot merge, tile or vectorize its axes by the buffers' strides alone.
MOVES_ELEMENTS = frozenset({"reshape", "broadcast_to", "pad", "concat", "iota", "take"})


def reductions(kernel: Kernel) -> list[Node]:
    """The reductions a reduction kernel loops over (its own axes, row level), in order."""
    return [n for n in kernel.nodes if n.op in lowering.REDUCE_OPS and
            tuple(n.attrs["axes"]) == kernel.axes and kernel.level[n.output] == "row"]


class KernelValues:
    """Expression building for one kernel: its buffer parameters, variables, and values."""

    # The element type the sizes buffer is read as: the index type (64-bit on the CPU); a
    # lowering whose indices may be 32-bit reads the buffer's 64-bit integers and narrows.
    sizes_dtype = INDEX

    def __init__(self, kernel: Kernel, kg: KernelGraph):
        self.k, self.kg = kernel, kg
        self.b = ExprBuilder()
        self.internal = set(kernel.nodes)
        self.params: dict[Value, Param] = {}
        self.acc: dict[Value, object] = {}       # reduction result -> its expression
        self.memo: dict = {}
        self.nvars = 0
        self.symbols: dict[str, Var] = {}        # symbol -> the variable holding its size
        self.b.sizes = self.size_expr
        for v in kernel.inputs:
            self.param(v)
        for v in kernel.outputs:
            self.param(v).writes = True

    def param(self, v: Value) -> Param:
        if v not in self.params:
            self.params[v] = Param(f"p{len(self.params)}", lowering.memory_dtype(v.type.dtype), v)
        return self.params[v]

    def fresh(self, name: str) -> str:
        """``name`` numbered from the kernel's one counter: locals and shared arrays live in
        one scope in CUDA C, so a local ``red4`` beside a shared ``red4[32]`` would shadow it."""
        self.nvars += 1
        return f"{name}{self.nvars}"

    def var(self, name: str, dt) -> Var:
        return Var(self.fresh(name), dt)

    def idx(self, n):
        """An index constant, or a symbolic size as the expression of its symbols (read at
        run time: see :meth:`prologue`)."""
        if isinstance(n, SymInt):
            return self.size_expr(n)
        return self.b.const(INDEX, n)

    def size_expr(self, n: SymInt):
        """The value of the symbolic size ``n`` from the kernel's symbol variables. Index
        arithmetic wraps modulo 2**64, so negative coefficients (``T-1``) are exact; a
        division needs a numerator that is never negative."""
        b = self.b
        total = None
        for monomial, coefficient in n._terms:
            term = None
            for atom in monomial:
                x = b.read(self.symbol_var(atom)) if isinstance(atom, str) else \
                    self.div_expr(atom)
                term = x if term is None else b.mul(term, x)
            c = self.b.const(INDEX, coefficient)
            term = c if term is None else b.mul(term, c)
            total = term if total is None else b.add(total, term)
        return total

    def div_expr(self, atom):
        lo = atom.num.lower_bound()
        if lo is None or lo < 0:
            raise SymbolicDecisionError(f"{atom}: a numerator that may be negative")
        num = self.size_expr(atom.num)
        if atom.ceil:
            num = self.b.add(num, self.b.const(INDEX, atom.den - 1))
        return self.b.div(num, self.b.const(INDEX, atom.den))

    def symbol_var(self, name: str) -> Var:
        var = self.symbols.get(name)
        if var is None:
            var = self.symbols[name] = self.var(f"sym_{name}_", INDEX)
        return var

    def prologue(self) -> list:
        """The statements that read the symbols the kernel's sizes use, to put first in
        its body (none for a kernel of static shapes: its code is as it was)."""
        if not self.symbols:
            return []
        order = program_symbols(self.kg.graph)
        param = self.params.get(SYMBOLS)
        if param is None:
            param = self.params[SYMBOLS] = Param(f"p{len(self.params)}", self.sizes_dtype,
                                                 SYMBOLS)
        b = self.b
        return [Declare(var, b.cast(b.load(param, b.const(INDEX, order.index(name))),
                                    self.sizes_dtype, INDEX))
                for name, var in self.symbols.items()]

    def view(self, v: Value) -> View:
        return self.kg.views.get(v) or identity_view(v)

    def outputs_at(self, level: str) -> list[Value]:
        """The outputs stored at ``level`` ("row" or "full"); a matmul's own product is in
        memory already (BLAS wrote it)."""
        return [v for v in self.k.outputs if self.k.level.get(v) == level and
                (v.producer is None or v.producer.op != "matmul")]

    def emit(self, v, coords: Sequence):
        """The register of ``v`` at index ``coords`` (one INDEX expression per dim)."""
        b = self.b
        if isinstance(v, Literal):
            return lowering.constant(b, v.dtype, v.value)
        if v in self.acc:
            # A 16-bit sum accumulates in float32; eager rounds the result to 16 bits.
            return lowering.round_half(b, self.acc[v], v.type.dtype)
        key = (v, tuple(id(c) for c in coords))
        hit = self.memo.get(key)
        if hit is not None:
            return hit[0]
        node = v.producer
        if node is None or node not in self.internal or node.op == "matmul":
            out = self.load(v, coords)
        else:
            out = self.emit_node(node, coords)
        # The coordinates stay alive with the entry, so their ids stay theirs.
        self.memo[key] = (out, tuple(coords))
        return out

    def address(self, view: View, coords: Sequence):
        """The element index of ``coords`` in ``view``'s buffer."""
        b = self.b
        offset = self.idx(view.offset)
        for c, s, d in zip(coords, view.strides, view.shape):
            if s == 0 or d == 1:
                continue
            offset = b.add(offset, c if s == 1 else b.mul(c, self.idx(s)))
        return offset

    def load(self, v: Value, coords: Sequence):
        view = self.view(v)
        producer = view.base.producer
        if producer in self.internal and producer.op != "matmul":
            # Its buffer is written after this kernel's loops: the load would read stale
            # memory. Fusion must not build such a kernel (_Partitioner.reads_own_view).
            raise AssertionError(f"{self.k.describe()} reads its own {producer.op} from memory")
        raw = self.b.load(self.param(view.base), self.address(view, coords))
        return lowering.from_memory(self.b, raw, v.type.dtype)

    def emit_node(self, node: Node, coords: Sequence):
        b, op = self.b, node.op
        out_shape = node.output.type.shape
        if op == "reshape":
            return self.emit(node.inputs[0], indexing.reshape_coords(
                b, node.inputs[0].type.shape, out_shape, coords))
        if op == "broadcast_to":
            return self.emit(node.inputs[0], indexing.operand_coords(
                b, node.inputs[0], out_shape, coords))
        if op == "iota":
            return lowering.convert(b, coords[node.attrs["axis"]], INDEX, node.attrs["dtype"])
        if op == "pad":
            return indexing.pad_value(b, node, coords, self.emit)
        if op == "concat":
            return indexing.concat_value(b, node, coords, self.emit)
        if op == "take":
            return indexing.take_value(b, node, coords, self.emit)
        if op in lowering.REDUCE_OPS and node.attrs["axes"]:
            raise Unsupported(f"{op} over axes outside a reduction kernel")
        args = [self.emit(x, indexing.operand_coords(b, x, out_shape, coords))
                for x in node.inputs]
        return lowering.lower_scalar(b, node, args)

    def reused_operand(self, node: Node | None, full_outs: list) -> Value | None:
        """``node``'s operand when it is computed in this kernel at the kernel's shape and
        the full-size outputs read it again (softmax's ``exp(x - max)``, the last
        reduction's input): a lowering can keep its row rather than compute it twice."""
        if node is None or not full_outs:
            return None
        src = node.inputs[0]
        if not isinstance(src, Value) or src.producer not in self.internal or \
                src.type.shape != self.k.shape:
            return None
        seen, stack = set(), list(full_outs)
        while stack:
            v = stack.pop()
            if v is src:
                return src
            if v.producer in self.internal and self.k.level.get(v) != "row" and v not in seen:
                seen.add(v)
                stack.extend(op for op in v.producer.inputs if isinstance(op, Value))
        return None

    def stored(self, v: Value, coords: Sequence):
        """(index, memory value) of ``v``'s element at ``coords`` in its own buffer."""
        value = lowering.to_memory(self.b, self.emit(v, coords), v.type.dtype)
        return self.address(identity_view(v), coords), value
