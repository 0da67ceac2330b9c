"""Specialize a graph with symbolic sizes to one binding of its symbols.

:func:`specialize` copies a graph with every symbolic size (in the input types and in the
attributes that hold sizes, such as a reshape's shape) replaced by its value, the result
types inferred again by each primitive's rule. What cannot yet run symbolic sizes (the
kernel lowerings) runs the specialized copy: one symbolic graph (traced and optimized
once) stands for every size.

>>> specialize(parse("graph @f(%x: f32[B,4]) -> ..."), {"B": 3})  # doctest: +SKIP
"""

from __future__ import annotations

from fusegrad.ir.graph import Graph, Value
from fusegrad.ir.rewrite import GraphCopier
from fusegrad.symint import SymInt, evaluate_shape
from fusegrad.tensor_type import TensorType

__all__ = ["specialize", "concrete_attr"]


def concrete_attr(value, bindings: dict):
    """An attribute value with its symbolic sizes evaluated under ``bindings``."""
    if isinstance(value, SymInt):
        return value.evaluate(bindings)
    if isinstance(value, tuple):
        return tuple(concrete_attr(x, bindings) for x in value)
    if isinstance(value, list):
        return [concrete_attr(x, bindings) for x in value]
    return value


def specialize(g: Graph, bindings: dict[str, int]) -> Graph:
    """A copy of ``g`` with each symbol set to its value in ``bindings`` (name -> int)."""
    c = GraphCopier(g)
    for i, v in enumerate(g.inputs):
        t = v.type
        copy = Value(TensorType(evaluate_shape(t.shape, bindings), t.dtype, t.device), v.name)
        c.new.inputs[i] = copy
        c.map[v] = copy
    for node in g.nodes:
        c.emit(node, attrs={k: concrete_attr(a, bindings) for k, a in node.attrs.items()})
    return c.finish()
