"""The IR verifier: checks that a graph is well formed, or says which node is not and why.

``verify(g)`` checks, in one pass over the nodes:

- inputs are distinct values with no producer and a valid :class:`TensorType`;
- every node applies a registered primitive to the number of operands it takes (a variadic
  one, such as ``concat``, to at least one);
- SSA: every value is produced once (by one node, or as an input), and an operand is an input
  or the result of an *earlier* node; a later one means the node list is out of order, or
  the graph has a cycle, which the message then shows;
- the attributes are exactly the primitive's ``attrs``;
- the node's result type is what the primitive's rule gives for its operand types and attrs;
- symbolic sizes (``f32[B,784]``) read only symbols that an input dim binds (a bare ``B``);
- literals have a fusegrad dtype and a value of that dtype's kind and range;
- outputs are defined values or legal literals.

Passes run it after every rewrite in tests and in debug mode, so it is linear in the graph.
"""

from __future__ import annotations

import inspect
from functools import lru_cache

import networkx as nx
import numpy as np

from fusegrad.dtypes import ALL_DTYPES, DType
from fusegrad.ir.graph import Graph, IRError, Literal, Node, Value
from fusegrad.ir.printer import print_node, value_names
from fusegrad.ops.primitive import PRIMITIVES, Primitive, TensorType, infer_type
from fusegrad.symint import SymInt, free_symbols

__all__ = ["verify", "VerificationError", "operand_count", "literal_problem", "type_problem"]


class VerificationError(IRError):
    """A malformed graph; the message names the node (as printed) and the broken rule."""


@lru_cache(maxsize=None)
def operand_count(prim: Primitive) -> int | None:
    """How many operands ``prim`` takes (from its rule's positional parameters); None when
    variadic."""
    if prim.variadic:
        return None
    params = inspect.signature(prim.infer).parameters.values()
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


_KNOWN_DTYPES = {id(d) for d in ALL_DTYPES}


def literal_problem(lit: Literal) -> str | None:
    """Why ``lit`` is not a legal literal, or None when it is."""
    dtype, value = lit.dtype, lit.value
    if not isinstance(dtype, DType) or id(dtype) not in _KNOWN_DTYPES:
        return f"literal {value!r} has dtype {dtype!r}, which is not a fusegrad dtype"
    is_bool = isinstance(value, (bool, np.bool_))
    if dtype.category == 0:
        ok = is_bool
    elif dtype.category == 1:
        ok = isinstance(value, (int, np.integer)) and not is_bool
        if ok:
            info = np.iinfo(dtype.np_dtype)
            if not info.min <= int(value) <= info.max:
                return f"literal {value} is out of range for {dtype.short}"
    elif dtype.category == 3:
        ok = isinstance(value, (int, float, complex, np.number)) and not is_bool
    else:
        ok = isinstance(value, (int, float, np.integer, np.floating)) and not is_bool
    if not ok:
        return f"literal {value!r} ({type(value).__name__}) is not a value of dtype {dtype.short}"
    return None


def type_problem(t) -> str | None:
    """Why ``t`` is not a valid TensorType (a tuple of non-negative ints or symbolic sizes, a
    fusegrad dtype)."""
    if not isinstance(t, TensorType):
        return f"type {t!r} is not a TensorType"
    if not isinstance(t.shape, tuple) or not all(
            isinstance(d, SymInt) or isinstance(d, int) and not isinstance(d, bool) and d >= 0
            for d in t.shape):
        return f"shape {t.shape!r} is not a tuple of non-negative ints and symbolic sizes"
    if not isinstance(t.dtype, DType) or id(t.dtype) not in _KNOWN_DTYPES:
        return f"dtype {t.dtype!r} is not a fusegrad dtype"
    return None


def _find_cycle(g: Graph) -> list[Node] | None:
    """A cycle among the nodes, as a list in which each node feeds the next, or None."""

    producer = {id(n.output): n for n in g.nodes}
    dg = nx.DiGraph()
    dg.add_nodes_from(range(len(g.nodes)))
    index = {id(n): i for i, n in enumerate(g.nodes)}
    for i, n in enumerate(g.nodes):
        for op in n.inputs:
            p = producer.get(id(op))
            if p is not None:
                dg.add_edge(index[id(p)], i)
    try:
        edges = nx.find_cycle(dg)
    except nx.NetworkXNoCycle:
        return None
    return [g.nodes[u] for u, _ in edges]


def verify(g: Graph) -> None:
    """Return None when ``g`` is well formed; else raise :class:`VerificationError` naming the
    first bad node (as printed, with its location) and the rule it breaks."""
    names = value_names(g)

    def fail(why: str, node: Node | None = None, index: int | None = None) -> VerificationError:
        if node is None:
            return VerificationError(f"verify @{g.name}: {why}")
        text = print_node(node, names, strict=False)
        where = f" (at {node.loc})" if node.loc else ""
        return VerificationError(f"verify @{g.name}: node {index} `{text}`{where}: {why}")

    defined: set[int] = set()       # ids of values defined so far
    for i, v in enumerate(g.inputs):
        if not isinstance(v, Value):
            raise fail(f"input {i} is {v!r}, not a Value")
        if id(v) in defined:
            raise fail(f"input {i} ({names[v]}) appears twice among the inputs")
        if v.producer is not None:
            raise fail(f"input {i} ({names[v]}) has a producer node; inputs have none")
        problem = type_problem(v.type)
        if problem:
            raise fail(f"input {i} ({names[v]}): {problem}")
        defined.add(id(v))
    # A call binds a symbol from an input dim that is that bare symbol; every other size
    # expression must read only symbols bound so.
    bound = {d.name for v in g.inputs for d in v.type.shape if isinstance(d, SymInt) and d.name}
    for i, v in enumerate(g.inputs):
        unbound = sorted(free_symbols(v.type.shape) - bound)
        if unbound:
            raise fail(f"input {i} ({names[v]}) of type {v.type} reads symbol(s) "
                       f"{', '.join(unbound)} that no input dim binds")

    produced_later = {id(n.output): j for j, n in enumerate(g.nodes) if isinstance(n, Node)}
    for i, node in enumerate(g.nodes):
        if not isinstance(node, Node):
            raise fail(f"node {i} is {node!r}, not a Node")
        prim = node.prim
        if not isinstance(prim, Primitive) or PRIMITIVES.get(prim.name) is not prim:
            raise fail(f"{prim!r} is not a registered primitive", node, i)
        out = node.output
        if not isinstance(out, Value):
            raise fail(f"its output is {out!r}, not a Value", node, i)
        for k, op in enumerate(node.inputs):
            if isinstance(op, Literal):
                problem = literal_problem(op)
                if problem:
                    raise fail(f"operand {k}: {problem}", node, i)
            elif not isinstance(op, Value):
                raise fail(f"operand {k} is {op!r}, not a Value or Literal", node, i)
            elif id(op) not in defined:
                raise fail(_undefined_operand(g, op, k, produced_later, names), node, i)
        if id(out) in defined:
            again = "a graph input" if out.producer is None or out in g.inputs else "an earlier node"
            raise fail(f"its result is already defined by {again} (SSA: one definition per value)",
                       node, i)
        if out.producer is not node:
            raise fail("its result's producer is another node", node, i)
        want = operand_count(prim)
        if want is None and not node.inputs:
            raise fail(f"{prim.name} takes one or more operands, got none", node, i)
        if want is not None and len(node.inputs) != want:
            raise fail(f"{prim.name} takes {want} operand{'s' if want != 1 else ''}, got "
                       f"{len(node.inputs)}", node, i)
        if not isinstance(node.attrs, dict) or set(node.attrs) != set(prim.attrs):
            missing = [a for a in prim.attrs if a not in node.attrs]
            extra = sorted(a for a in node.attrs if a not in prim.attrs)
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
                [f"unexpected {', '.join(extra)}"] if extra else [])
            raise fail(f"attributes of {prim.name} must be ({', '.join(prim.attrs)}): "
                       f"{'; '.join(parts)}", node, i)
        try:
            expected = infer_type(prim, [op.type for op in node.inputs], node.attrs)
        except (ValueError, TypeError, IndexError, KeyError, AttributeError) as e:
            # (SymbolicDecisionError is a TypeError: a rule that cannot decide a fact about
            # a symbolic size rejects the node, naming the fact.)
            raise fail(f"{prim.name}'s rule rejects it: {e}", node, i) from e
        if out.type != expected:
            raise fail(f"result type {out.type} does not match {expected} given by "
                       f"{prim.name}'s rule", node, i)
        unbound = sorted(free_symbols(out.type.shape) - bound)
        if unbound:
            raise fail(f"its type reads symbol(s) {', '.join(unbound)} that no input dim binds",
                       node, i)
        defined.add(id(out))

    for k, op in enumerate(g.outputs):
        if isinstance(op, Literal):
            problem = literal_problem(op)
            if problem:
                raise fail(f"output {k}: {problem}")
        elif not isinstance(op, Value):
            raise fail(f"output {k} is {op!r}, not a Value or Literal")
        elif id(op) not in defined:
            raise fail(f"output {k} ({names.get(op, op.name)}) is not defined in this graph")


def _undefined_operand(g: Graph, op: Value, k: int, produced_later: dict[int, int],
                       names: dict[Value, str]) -> str:
    name = names.get(op) or f"%?{op.name or 'undefined'}"
    if id(op) not in produced_later:
        return f"operand {k} ({name}) is not defined in this graph"
    cycle = _find_cycle(g)
    if cycle:
        path = " -> ".join(names.get(n.output, "?") for n in cycle + cycle[:1])
        return f"operand {k} ({name}) is defined by a later node; the graph has a cycle: {path}"
    return (f"operand {k} ({name}) is used before it is defined (by node "
            f"{produced_later[id(op)]}); nodes must be in topological order")
