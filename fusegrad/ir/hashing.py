"""A structural hash of a graph: equal for graphs that differ only in names.

``structural_hash(g)`` is the hex sha256 of a canonical serialization: input types in order,
then each node (primitive, operands as input or node positions or literal ``value:dtype``,
attributes as printed, result type, checkpoint marks), then the outputs. Value names, the graph's name and
source locations are left out, so two graphs that print the same after renaming all values
(and the graph) hash the same; input order and node order are part of the structure.

Attribute values and literals go through the printer's spelling, so the hash agrees with the
text form (a tuple and a list attribute print, and hash, alike). Constant data is hashed from
its bytes (with NaNs made canonical, as the text form does) rather than printed, so hashing a
graph with large constants stays cheap.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fusegrad.ir.graph import Graph, IRError, Literal, Value
from fusegrad.ir.printer import format_attr, format_marks, format_scalar, format_type
from fusegrad.ops.primitive import ConstantData

__all__ = ["structural_hash"]


def _constant_digest(c: ConstantData) -> str:
    a = c.array
    if a.dtype.kind == "f" or a.dtype.kind == "V":
        as64 = a.astype(np.float64)
        nans = np.isnan(as64)
        if nans.any():
            # NaN payloads and signs do not survive printing; do not let them split hashes.
            a = np.where(nans, np.asarray(np.nan, dtype=a.dtype), a).astype(a.dtype)
    data = np.ascontiguousarray(a).tobytes()
    return f"dense {a.dtype.str} {list(a.shape)} {hashlib.sha256(data).hexdigest()}"


def _attr_text(value) -> str:
    if isinstance(value, ConstantData):
        return _constant_digest(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_attr_text(v) for v in value) + "]"
    return format_attr(value)


def _literal_text(lit: Literal) -> str:
    return f"{format_scalar(lit.value, lit.dtype)}:{lit.dtype.short}"


def structural_hash(g: Graph) -> str:
    """Hex sha256 of ``g``'s structure, independent of value names, the graph name and
    locations."""
    h = hashlib.sha256()

    def emit(line: str) -> None:
        # The printer never puts a newline inside a token, so lines cannot run together.
        h.update(line.encode("utf-8"))
        h.update(b"\n")

    position: dict[int, str] = {}
    emit(f"inputs {len(g.inputs)}")
    for i, v in enumerate(g.inputs):
        position[id(v)] = f"i{i}"
        emit(f"input {format_type(v.type)}")

    def ref(op, where: str) -> str:
        if isinstance(op, Literal):
            return _literal_text(op)
        if isinstance(op, Value) and id(op) in position:
            return position[id(op)]
        raise IRError(f"structural_hash @{g.name}: {where} uses a value that is not defined "
                      f"before it; verify(g) says why")

    for j, node in enumerate(g.nodes):
        operands = ", ".join(ref(op, f"node {j}") for op in node.inputs)
        order = [k for k in node.prim.attrs if k in node.attrs]
        order += sorted(k for k in node.attrs if k not in node.prim.attrs)
        attrs = ", ".join(f"{k}={_attr_text(node.attrs[k])}" for k in order)
        emit(f"node {node.prim.name} ({operands}) {{{attrs}}} : {format_type(node.output.type)}"
             f"{format_marks(node)}")
        position.setdefault(id(node.output), f"n{j}")
    emit("return " + ", ".join(ref(o, "an output") for o in g.outputs))
    return h.hexdigest()
