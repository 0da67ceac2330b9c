"""The IR: a typed SSA graph of primitives.

A :class:`Graph` has named inputs, nodes in topological order, and outputs. Each
:class:`Node` applies one primitive (from :mod:`fusegrad.ops.prims`, the one definition of
each op) to operands and produces one :class:`Value` whose type the primitive's rule gives.
An operand is a :class:`Value` or a :class:`Literal` (a scalar constant written inline, as
``max %0, 0.0``). Nodes keep the user's source location for error messages and dumps.

Building a graph by hand::

    g = Graph("f")
    x = g.add_input("x", TensorType((4, 8), float32))
    w = g.add_input("w", TensorType((8, 16), float32))
    y = g.add_node("matmul", [x, w])
    z = g.add_node("maximum", [y, Literal(0.0, float32)])
    g.set_outputs([z])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence, Union

from fusegrad.dtypes import DType
from fusegrad.ops.primitive import (
    PRIMITIVES,
    ConstantData,
    Primitive,
    ShapeError,
    TensorType,
    infer_type,
)

__all__ = ["Value", "Literal", "Node", "Graph", "Operand", "IRError", "ConstantData"]


class IRError(ValueError):
    """A malformed graph, or a graph operation that cannot apply."""


@dataclass(frozen=True)
class Literal:
    """A scalar constant used inline as an operand: its Python value and dtype."""

    value: Union[bool, int, float]
    dtype: DType

    @property
    def type(self) -> TensorType:
        return TensorType((), self.dtype)

    def __str__(self) -> str:
        return repr(self.value)


class Value:
    """An SSA value: a graph input (``producer`` None) or the result of a node."""

    __slots__ = ("type", "name", "producer", "__weakref__")

    def __init__(self, type: TensorType, name: str | None = None, producer: "Node | None" = None):
        self.type = type
        self.name = name
        self.producer = producer

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    def __repr__(self) -> str:
        return f"<Value {self.name or hex(id(self))}: {self.type}>"


Operand = Union[Value, Literal]


@dataclass(eq=False)
class Node:
    """One primitive applied to operands, producing ``output``.

    Two marks steer activation checkpointing (``fusegrad.utils.checkpoint`` under a trace):
    ``region`` numbers the checkpointed region whose forward recorded the node, and the
    reverse pass (:mod:`fusegrad.passes.autodiff`) differentiates that region on copies of
    its nodes, marked ``remat``, recomputed right before the region's backward; those
    copies read the region's inputs through ``stop_gradient`` barriers (also ``remat``),
    which ``strip-barriers`` keeps, so that ``cse`` does not merge a copy back into the
    forward's node, and the partitioner never saves a copy. Passes that copy a node keep
    its marks (``GraphCopier.emit``)."""

    prim: Primitive
    inputs: list[Operand]
    attrs: dict
    output: Value = field(repr=False)
    loc: str | None = None
    region: int | None = None
    remat: bool = False

    @property
    def op(self) -> str:
        return self.prim.name

    def __repr__(self) -> str:
        return f"<Node {self.prim.name} -> {self.output.type}>"


class Graph:
    """A typed SSA DAG: ``inputs``, ``nodes`` in topological order, ``outputs``."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.inputs: list[Value] = []
        self.nodes: list[Node] = []
        self.outputs: list[Operand] = []

    # -- building

    def add_input(self, name: str, type: TensorType) -> Value:
        """Append a graph input called ``name``."""
        if any(v.name == name for v in self.inputs):
            raise IRError(f"graph @{self.name} already has an input %{name}")
        v = Value(type, name)
        self.inputs.append(v)
        return v

    def add_node(self, prim: Primitive | str, inputs: Sequence[Operand], attrs: dict | None = None,
                 loc: str | None = None, name: str | None = None) -> Value:
        """Append a node applying ``prim``; its result type comes from the primitive's rule."""
        prim = PRIMITIVES[prim] if isinstance(prim, str) else prim
        attrs = attrs or {}
        try:
            out_type = infer_type(prim, [op.type for op in inputs], attrs)
        except (ShapeError, TypeError, IndexError) as e:
            where = f" (at {loc})" if loc else ""
            raise IRError(f"{prim.name}: {e}{where}") from e
        return self.append_node(prim, inputs, attrs, out_type, loc, name)

    def append_node(self, prim: Primitive, inputs: Sequence[Operand], attrs: dict,
                    out_type: TensorType, loc: str | None = None,
                    name: str | None = None) -> Value:
        """Append a node whose result type is already known (``add_node`` infers it; a copy
        of a node whose operands have the types of the original's keeps it: see
        ``GraphCopier.emit``)."""
        out = Value(out_type, name)
        node = Node(prim, list(inputs), dict(attrs), out, loc)
        out.producer = node
        self.nodes.append(node)
        return out

    def set_outputs(self, outputs: Iterable[Operand]) -> None:
        self.outputs = list(outputs)

    # -- queries

    def users(self) -> dict[Value, list[Node]]:
        """For each value, the nodes that use it (graph outputs not included)."""
        uses: dict[Value, list[Node]] = {v: [] for v in self.inputs}
        for n in self.nodes:
            uses.setdefault(n.output, [])
            for op in n.inputs:
                if isinstance(op, Value):
                    uses.setdefault(op, []).append(n)
        return uses

    @property
    def input_types(self) -> list[TensorType]:
        return [v.type for v in self.inputs]

    @property
    def output_types(self) -> list[TensorType]:
        return [v.type for v in self.outputs]

    def __iter__(self):
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    # ``str(graph)`` (the IR text) and ``graph.to_dot(kernels=None)`` (Graphviz text) are
    # installed by fusegrad.ir's __init__ from the printer and the dot writer, which build on
    # this module.

    def __repr__(self) -> str:
        return f"<Graph @{self.name}: {len(self.inputs)} inputs, {len(self.nodes)} nodes>"
