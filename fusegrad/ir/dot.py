"""Graphviz pictures of a graph, optionally with its kernels drawn as clusters.

``to_dot(g)`` gives graphviz text: one box per node (its printed line without the result
type, then the result type, then the source location), inputs as blue ``invhouse`` shapes,
each output as a green ``house`` fed by the value it returns, and an edge per use labelled
with the operand position when a node has several operands. With ``kernels`` (a list of lists
of nodes, as fusion produces them) each kernel becomes ``subgraph cluster_<k>``, so a picture
shows what fused with what. ``render(g, path)`` runs graphviz's ``dot`` on it.

Node ids (``in0``, ``n3``, ``out1``) are positions, so the text is deterministic.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Sequence

from fusegrad.ir.graph import Graph, IRError, Literal, Node, Value
from fusegrad.ir.printer import format_scalar, format_type, print_node, value_names

__all__ = ["to_dot", "render", "GraphvizNotFoundError"]

_MAX_LABEL = 60     # dense constants would make boxes pages wide


class GraphvizNotFoundError(RuntimeError):
    """graphviz's ``dot`` program is not on PATH."""


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _short(text: str) -> str:
    return text if len(text) <= _MAX_LABEL else text[:_MAX_LABEL - 3] + "..."


def _node_label(node: Node, names: dict[Value, str]) -> str:
    line = print_node(node, names, strict=False)
    head = line.rsplit(" : ", 1)[0]
    parts = [_short(head), format_type(node.output.type)]
    if node.loc:
        parts.append(_short(os.path.basename(node.loc)))
    return "\n".join(parts)


def to_dot(g: Graph, kernels: Sequence[Sequence[Node]] | None = None) -> str:
    """Graphviz text for ``g``; each list of nodes in ``kernels`` is drawn as one cluster.

    >>> print(to_dot(g))                                          # doctest: +SKIP
    digraph "f" {
      ...
    """
    names = value_names(g)
    ids: dict[int, str] = {}
    lines = [f"digraph {_quote(g.name)} {{", "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fillcolor=white, fontname="monospace"];']
    for i, v in enumerate(g.inputs):
        ids[id(v)] = f"in{i}"
        label = f"{names[v]}\n{format_type(v.type)}"
        lines.append(f"  in{i} [label={_quote(label)}, shape=invhouse, fillcolor=lightblue];")

    node_ids = {id(n): f"n{j}" for j, n in enumerate(g.nodes)}
    clustered: dict[int, int] = {}
    for k, kernel in enumerate(kernels or ()):
        for n in kernel:
            if id(n) not in node_ids:
                raise IRError(f"to_dot: kernel {k} holds {n!r}, which is not a node of @{g.name}")
            if id(n) in clustered:
                raise IRError(f"to_dot: {n!r} is in kernels {clustered[id(n)]} and {k}")
            clustered[id(n)] = k

    def node_line(j: int, n: Node) -> str:
        return f"n{j} [label={_quote(_node_label(n, names))}];"

    for k, kernel in enumerate(kernels or ()):
        lines.append(f"  subgraph cluster_{k} {{")
        lines.append(f"    label={_quote(f'kernel {k}')}; style=dashed; color=gray40;")
        members = sorted(kernel, key=lambda n: int(node_ids[id(n)][1:]))
        for n in members:
            lines.append("    " + node_line(int(node_ids[id(n)][1:]), n))
        lines.append("  }")
    for j, n in enumerate(g.nodes):
        ids.setdefault(id(n.output), f"n{j}")
        if id(n) not in clustered:
            lines.append("  " + node_line(j, n))

    for j, n in enumerate(g.nodes):
        values = [op for op in n.inputs if isinstance(op, Value)]
        for pos, op in enumerate(n.inputs):
            if not isinstance(op, Value) or id(op) not in ids:
                continue
            label = f" [label={pos}]" if len(values) > 1 else ""
            lines.append(f"  {ids[id(op)]} -> n{j}{label};")

    for k, o in enumerate(g.outputs):
        what = format_scalar(o.value, o.dtype) if isinstance(o, Literal) else names.get(o, "?")
        label = f"return {k}: {what}\n{format_type(o.type)}"
        lines.append(f"  out{k} [label={_quote(label)}, shape=house, fillcolor=palegreen];")
        if isinstance(o, Value) and id(o) in ids:
            lines.append(f"  {ids[id(o)]} -> out{k};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(g: Graph, path: str, kernels: Sequence[Sequence[Node]] | None = None,
           format: str | None = None) -> str:
    """Draw ``g`` into the image ``path`` with graphviz (format from the suffix: png, svg,
    pdf, ...); returns ``path``. Raises :class:`GraphvizNotFoundError` when graphviz is not
    installed."""
    dot = shutil.which("dot")
    if dot is None:
        raise GraphvizNotFoundError(
            "graphviz is not installed: the 'dot' program was not found on PATH. Install "
            "graphviz (apt install graphviz, brew install graphviz), or write to_dot(g) to a "
            ".dot file and render it elsewhere.")
    fmt = format or os.path.splitext(path)[1].lstrip(".") or "png"
    proc = subprocess.run([dot, f"-T{fmt}", "-o", path], input=to_dot(g, kernels).encode(),
                          capture_output=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"dot -T{fmt} failed: {proc.stderr.decode(errors='replace').strip()}")
    return path
