"""The IR's text form: a stable, readable, deterministic printing of a :class:`Graph`.

::

    graph @f(%x: f32[4,8], %w: f32[8,16]) -> (f32[4,16], f32[]) {
      %0 = matmul %x, %w : f32[4,16]
      %1 = maximum %0, 0.0 : f32[4,16]
      %2 = sum %1 {axes=[0, 1]} : f32[]
      return %1, %2
    }

:func:`fusegrad.ir.parser.parse` reads it back exactly: ``print_graph(parse(t)) == t`` for
any ``t`` that ``print_graph`` produced. The grammar (``[]`` optional, ``*`` repeated)::

    graph    := 'graph' '@' NAME '(' [arg (',' arg)*] ')' '->' '(' [type (',' type)*] ')'
                '{' node* 'return' [operand (',' operand)*] '}'
    arg      := '%' NAME ':' type
    node     := '%' NAME '=' OP [operand (',' operand)*] ['{' attr (',' attr)* '}'] ':' type
                ['region' '(' INT ')'] ['remat'] [loc]
    type     := DTYPE '[' [size (',' size)*] ']'          f32[4,8], i1[], bf16[2], f32[B,784]
    size     := INT | sizeexpr                         symbolic sizes: B, B*T, T-1, ceil(T/2)
    sizeexpr := term (('+' | '-') term)*;  term := atom ('*' atom)*
    atom     := INT | SYMBOL | '(' sizeexpr ')' | ('ceil' | 'floor') '(' sizeexpr '/' INT ')'
    operand  := '%' NAME | literal [':' DTYPE]
    literal  := INT | FLOAT | 'true' | 'false'           2, -1.5, 1e-05, inf, -inf, nan
    attr     := NAME '=' value
    value    := INT | FLOAT | 'true' | 'false' | DTYPE | STRING
              | '[' [value (',' value)*] ']'             tuples: [0, 1], pad widths [[1, 2], [0, 0]]
              | 'dense' '<' elements '>'                 constants: dense<[[1.0, 2.0], [3.0, 4.0]]>
              | sizeexpr                                 a symbolic size in a shape: [B*T, 64]
    loc      := 'loc' '(' STRING [':' INT] ')'           loc("model.py":12)

``//`` starts a comment that runs to the end of the line (``// -----`` separates graphs in a
file of several, as MLIR's ``--split-input-file`` does).

Naming. Graph inputs keep their names; a name that is missing, not an identifier
(``[A-Za-z_][A-Za-z0-9_.]*``) or taken by an earlier input is replaced: invalid characters
become ``_``, a leading digit gets a ``_`` prefix, a missing name becomes ``arg<i>`` (its
position), and a duplicate gets the first free suffix ``_1``, ``_2``, ... Node results are
renumbered ``%0``, ``%1``, ... in node order, whatever their names, so they never clash with
inputs (which never start with a digit).

Literal dtypes. A literal operand prints bare when its dtype is the *default* of its node:
the dtype of the node's last :class:`Value` operand (``add %x, 2.0`` has %x's dtype,
``where %c, %x, 0.0`` has %x's). Otherwise, and in nodes without value operands, it carries
its dtype: ``where %c, 1.0:f32, 0.0:f32``, ``add %h, 2.0:f16``. A literal in ``return`` takes
the dtype the signature declares for that output. Values are spelled canonically for their
dtype: ``true``/``false`` for i1, an integer for integer dtypes, Python's ``repr`` of the float
for floating dtypes (so ``2`` of dtype f32 prints ``2.0``); floats round-trip exactly, and
``inf``, ``-inf``, ``nan`` are spelled so.

Attributes print in the primitive's ``attrs`` order (any other keys follow, sorted, so a
malformed node still prints). Tuples and lists print as ``[...]`` and parse back as tuples.
``dense<...>`` holds a constant's elements exactly (each float as the shortest decimal that
reads back to the same bits; NaN payloads are not kept); its dtype and shape are the node's
result type, so an empty constant prints ``dense<[]>`` and its shape comes from the type.
A constant of at least ``SPLAT_MIN`` elements that are all the same prints as that one
element, a splat (``dense<0.0>`` for a zero f32[64,256]), as MLIR's dense attributes do.

A node recorded inside a checkpointed region carries ``region(N)`` after its type, and the
copies the reverse pass recomputes for that region's backward carry ``remat``
(:class:`~fusegrad.ir.graph.Node`'s ``region`` and ``remat``): passes treat them apart, so
they print always. Source locations print as a trailing ``loc("file.py":12)`` only with
``locations=True``.
"""

from __future__ import annotations

import json
import re
from typing import Iterable, Iterator

import ml_dtypes
import numpy as np

from fusegrad.dtypes import DType
from fusegrad.ir.graph import Graph, IRError, Literal, Node, Operand, Value
from fusegrad.ops.primitive import ConstantData, device_suffix
from fusegrad.symint import SymInt

__all__ = ["print_graph", "print_node", "value_names", "format_type", "format_literal",
           "format_attr", "format_attrs", "format_scalar", "format_dense", "format_loc", "format_marks",
           "literal_default_dtype"]

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
_LOC_LINE_RE = re.compile(r"(.*):(0|[1-9][0-9]*)\Z", re.DOTALL)


# --------------------------------------------------------------------------- names


def _sanitize(name: str | None, position: int) -> str:
    if not name:
        return f"arg{position}"
    name = re.sub(r"[^A-Za-z0-9_.]", "_", name)
    return name if NAME_RE.match(name) else "_" + name


def value_names(g: Graph) -> dict[Value, str]:
    """The printed name (with ``%``) of every input and node result of ``g``.

    Inputs keep their (sanitized, deduplicated) names; node results are numbered by position.
    A value produced twice (an SSA violation) keeps its first name.
    """
    names: dict[Value, str] = {}
    taken: set[str] = set()
    for i, v in enumerate(g.inputs):
        if not isinstance(v, Value):
            continue        # malformed; the verifier reports it
        base = _sanitize(v.name, i)
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        names.setdefault(v, "%" + name)
    for j, node in enumerate(g.nodes):
        out = getattr(node, "output", None)
        if isinstance(out, Value):
            names.setdefault(out, f"%{j}")
    return names


def _operand_name(v: Value, names: dict[Value, str]) -> str:
    if not isinstance(v, Value):
        return f"<{v!r}>"
    # A value from outside the graph: spelled so that it can never parse, for error messages.
    return names.get(v) or f"%?{v.name or 'undefined'}"


# --------------------------------------------------------------------------- scalars


def _dim_text(d) -> str:
    # A symbolic size prints as its expression (B, B*T, ceil(T/2)); any other dim as an int.
    return str(d) if isinstance(d, SymInt) else str(int(d))


def format_type(t) -> str:
    """``f32[4,8]``; anything that is not a TensorType is shown as ``<repr>``."""
    try:
        text = f"{t.dtype.short}[{','.join(_dim_text(d) for d in t.shape)}]"
        device = getattr(t, "device", "cpu")
        return text if device == "cpu" else text + device_suffix(device)
    except (AttributeError, TypeError, ValueError):
        return f"<{t!r}>"


def _float_text(x: float) -> str:
    # repr is the shortest string that reads back to the same double; it spells inf, -inf
    # and nan the way the grammar wants.
    return repr(float(x))


def format_scalar(value, dtype: DType) -> str:
    """The canonical spelling of a scalar of ``dtype``: ``true``, ``3``, ``2.0``, ``-inf``.

    Values that do not belong to the dtype's category (an illegal literal, which the
    verifier rejects) print as their Python repr, which never parses as the dtype.
    """
    category = getattr(dtype, "category", None)
    is_bool = isinstance(value, (bool, np.bool_))
    if category == 0 and is_bool:
        return "true" if value else "false"
    if category == 1 and isinstance(value, (int, np.integer)) and not is_bool:
        return str(int(value))
    if category == 2 and isinstance(value, (int, float, np.integer, np.floating)) and not is_bool:
        return _float_text(float(value))
    if category == 3 and isinstance(value, (int, float, complex, np.number)) and not is_bool:
        return _complex_text(complex(value))
    return repr(value)


def _complex_text(z: complex) -> str:
    """``complex(1.0, -2.0)``: one token of the grammar, each part as a double's repr."""
    return f"complex({_float_text(z.real)}, {_float_text(z.imag)})"


def literal_default_dtype(operands: Iterable[Operand]) -> DType | None:
    """The dtype a bare literal among ``operands`` has: that of the last Value operand."""
    default = None
    for op in operands:
        if isinstance(op, Value):
            default = getattr(op.type, "dtype", None)
    return default


def format_literal(lit: Literal, default: DType | None = None) -> str:
    """``2.0`` when ``lit.dtype`` is ``default``, else ``2.0:f16``."""
    text = format_scalar(lit.value, lit.dtype)
    if lit.dtype is default:
        return text
    return f"{text}:{getattr(lit.dtype, 'short', repr(lit.dtype))}"


# --------------------------------------------------------------------------- dense constants


def _shortest_bf16(x: float) -> str:
    # ml_dtypes prints bfloat16 with %g's six digits, which is neither short nor always
    # exact; take the fewest significant digits that read back to the same value.
    if not np.isfinite(x):
        return repr(x)
    target = ml_dtypes.bfloat16(x)
    for digits in range(1, 10):
        s = f"{x:.{digits}g}"
        if ml_dtypes.bfloat16(float(s)) == target:
            return s
    return repr(x)


def _float_element_texts(a: np.ndarray) -> list[str]:
    flat = a.reshape(-1)
    if a.dtype == np.float64:
        return [repr(x) for x in flat.tolist()]
    if a.dtype == ml_dtypes.bfloat16:
        texts = [_shortest_bf16(x) for x in flat.astype(np.float64).tolist()]
    else:
        # numpy's str of a float16/float32 scalar is the shortest round-tripping decimal.
        texts = [str(x) for x in flat]
    texts = [t if any(c in t for c in ".eni") else t + ".0" for t in texts]
    # The parser reads a decimal into a double, then rounds to the element type. Double
    # rounding can in principle land on a neighbour; fall back to the exact double then.
    back = np.array([float(t) for t in texts], dtype=np.float64).astype(a.dtype)
    same = (back.view(_uint_of(a.dtype)) == flat.view(_uint_of(a.dtype))) | (
        np.isnan(back.astype(np.float64)) & np.isnan(flat.astype(np.float64)))
    for i in np.flatnonzero(~same).tolist():
        texts[i] = repr(float(flat[i]))
    return ["nan" if t in ("-nan", "nan") else t for t in texts]


def _uint_of(dtype: np.dtype) -> type:
    return {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]


def _element_texts(a: np.ndarray) -> list[str]:
    if a.dtype == np.bool_:
        return ["true" if x else "false" for x in a.reshape(-1).tolist()]
    if a.dtype.kind in "iu":
        return [str(x) for x in a.reshape(-1).tolist()]
    if a.dtype.kind == "f" or a.dtype == ml_dtypes.bfloat16:
        return _float_element_texts(a)
    if a.dtype.kind == "c":
        # each part a double's repr: exact for complex64's float32 parts too
        return [_complex_text(z) for z in a.reshape(-1).astype(np.complex128).tolist()]
    raise IRError(f"cannot print a constant of numpy dtype {a.dtype}")


def _nest(items: Iterator[str], shape: tuple[int, ...]) -> str:
    if not shape:
        return next(items)
    return "[" + ", ".join(_nest(items, shape[1:]) for _ in range(shape[0])) + "]"


SPLAT_MIN = 16


def format_dense(array: np.ndarray) -> str:
    """The elements of ``array`` as nested brackets: ``[[1.0, 2.0], [3.0, 4.0]]``, or a
    splat (one element) when there are at least ``SPLAT_MIN`` and all print the same."""
    texts = _element_texts(array)
    if len(texts) >= SPLAT_MIN and texts.count(texts[0]) == len(texts):
        return texts[0]     # large uniform constants (zeros) would dominate a graph's text
    return _nest(iter(texts), array.shape)


# --------------------------------------------------------------------------- attributes


def format_attr(value) -> str:
    """One attribute value in the text grammar (see the module docstring)."""
    if isinstance(value, DType):
        return value.short
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, SymInt):
        return str(value)
    if isinstance(value, (float, np.floating)):
        return _float_text(float(value))
    if isinstance(value, (complex, np.complexfloating)):
        return _complex_text(complex(value))
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(format_attr(v) for v in value) + "]"
    if isinstance(value, ConstantData):
        return f"dense<{format_dense(value.array)}>"
    raise IRError(f"cannot print attribute value {value!r} of type {type(value).__name__}")


def format_attrs(node: Node, strict: bool = True) -> str:
    """``{axes=[0, 1]}`` in the primitive's attribute order, or ``""`` without attributes.

    With ``strict=False`` a value the grammar cannot spell shows as ``<repr>`` (for messages
    about malformed nodes) instead of raising.
    """
    if not node.attrs:
        return ""
    declared = getattr(node.prim, "attrs", ())
    order = [k for k in declared if k in node.attrs]
    order += sorted(k for k in node.attrs if k not in declared)
    parts = []
    for key in order:
        try:
            text = format_attr(node.attrs[key])
        except IRError:
            if strict:
                raise
            text = f"<{node.attrs[key]!r}>"
        parts.append(f"{key}={text}")
    return "{" + ", ".join(parts) + "}"


def format_marks(node) -> str:
    """A node's checkpoint marks as they print after its type: `` region(2) remat``."""
    text = f" region({node.region})" if getattr(node, "region", None) is not None else ""
    return text + (" remat" if getattr(node, "remat", False) else "")


def format_loc(loc: str) -> str:
    """``loc("file.py":12)`` for ``file.py:12``; any other string as ``loc("text")``."""
    m = _LOC_LINE_RE.match(loc)
    if m:
        return f"loc({json.dumps(m.group(1), ensure_ascii=False)}:{m.group(2)})"
    return f"loc({json.dumps(loc, ensure_ascii=False)})"


# --------------------------------------------------------------------------- nodes, graphs


def _format_operand(op, names: dict[Value, str], default: DType | None) -> str:
    if isinstance(op, Value):
        return _operand_name(op, names)
    if isinstance(op, Literal):
        return format_literal(op, default)
    return f"<{op!r}>"


def print_node(node: Node, names: dict[Value, str] | None = None, locations: bool = False,
               strict: bool = True) -> str:
    """One node's line (without indentation): ``%1 = maximum %0, 0.0 : f32[4,16]``.

    ``names`` comes from :func:`value_names` of the node's graph; without it, values print
    by their own names. ``strict=False`` never raises (for error messages).
    """
    if names is None:
        names = {}
        for op in [*node.inputs, node.output]:
            if isinstance(op, Value):
                names[op] = "%" + _sanitize(op.name, 0) if op.name else "%?"
    default = literal_default_dtype(node.inputs)
    op_name = getattr(node.prim, "name", None) or f"<{node.prim!r}>"
    line = f"{_operand_name(node.output, names)} = {op_name}"
    operands = ", ".join(_format_operand(op, names, default) for op in node.inputs)
    if operands:
        line += " " + operands
    attrs = format_attrs(node, strict)
    if attrs:
        line += " " + attrs
    line += " : " + format_type(getattr(node.output, "type", None))
    line += format_marks(node)
    if locations and node.loc:
        line += " " + format_loc(node.loc)
    return line


def _format_graph_name(name: str) -> str:
    return "@" + (name if NAME_RE.match(name or "") else json.dumps(name, ensure_ascii=False))


def print_graph(g: Graph, locations: bool = False) -> str:
    """The text form of ``g`` (no trailing newline); see the module docstring.

    >>> print(print_graph(g))                                   # doctest: +SKIP
    graph @f(%x: f32[4]) -> (f32[4]) {
      %0 = exp %x : f32[4]
      return %0
    }
    """
    names = value_names(g)
    args = ", ".join(f"{names[v]}: {format_type(v.type)}" for v in g.inputs)
    results = ", ".join(format_type(o.type) for o in g.outputs)
    lines = [f"graph {_format_graph_name(g.name)}({args}) -> ({results}) {{"]
    for node in g.nodes:
        lines.append("  " + print_node(node, names, locations))
    # A literal output takes its dtype from the signature, so it always prints bare.
    outs = ", ".join(_operand_name(o, names) if isinstance(o, Value)
                     else format_scalar(o.value, o.dtype) if isinstance(o, Literal)
                     else f"<{o!r}>" for o in g.outputs)
    lines.append("  return" + (" " + outs if outs else ""))
    lines.append("}")
    return "\n".join(lines)
