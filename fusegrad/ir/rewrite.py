"""Helpers for passes that build a new graph from an old one.

Passes never mutate their input graph (tests compare before and after), so most passes copy:
:class:`GraphCopier` maps old values to new ones while a pass emits nodes, possibly
replacing or dropping some.
"""

from __future__ import annotations

from fusegrad.ir.graph import Graph, Literal, Node, Operand, Value

__all__ = ["GraphCopier", "copy_graph", "copy_marks"]


def copy_marks(old: Node, new: Node) -> None:
    """Give ``new`` the checkpoint marks of ``old`` (``Node.region``, ``Node.remat``)."""
    new.region, new.remat = old.region, old.remat


class GraphCopier:
    """Copy a graph node by node; ``emit`` a node with remapped operands, or ``alias`` an old
    value to a new operand (a replacement)."""

    def __init__(self, old: Graph, name: str | None = None):
        self.old = old
        self.new = Graph(name or old.name)
        self.map: dict[Value, Operand] = {}
        for v in old.inputs:
            # Copied as they are (names may repeat: the printer disambiguates them).
            copy = Value(v.type, v.name)
            self.new.inputs.append(copy)
            self.map[v] = copy
        self.new.meta = getattr(old, "meta", None)

    def get(self, op: Operand) -> Operand:
        return op if isinstance(op, Literal) else self.map[op]

    def emit(self, node: Node, inputs: list[Operand] | None = None, attrs: dict | None = None,
             prim=None) -> Value:
        """Append a copy of ``node`` (optionally with other operands/attrs/primitive)."""
        ins = [self.get(op) for op in node.inputs] if inputs is None else inputs
        if attrs is None and (prim is None or prim is node.prim) and all(
                a.type == b.type for a, b in zip(ins, node.inputs)) and \
                len(ins) == len(node.inputs):
            # The same primitive, attributes and operand types: the same result type (type
            # rules are pure), so the copy skips inferring it again.
            out = self.new.append_node(node.prim, ins, node.attrs, node.output.type, node.loc)
        else:
            out = self.new.add_node(prim or node.prim, ins,
                                    node.attrs if attrs is None else attrs, loc=node.loc)
        copy_marks(node, out.producer)
        self.map[node.output] = out
        return out

    def alias(self, old: Value, new: Operand) -> None:
        self.map[old] = new

    def finish(self) -> Graph:
        self.new.set_outputs([self.get(o) for o in self.old.outputs])
        return self.new


def copy_graph(g: Graph) -> Graph:
    """A deep copy of ``g`` (new values, same structure)."""
    c = GraphCopier(g)
    for node in g.nodes:
        c.emit(node)
    return c.finish()
