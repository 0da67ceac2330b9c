"""Read the IR's text form (see :mod:`fusegrad.ir.printer` for the grammar) back into graphs.

``parse(text)`` reads one graph, ``parse_many(text)`` every graph in a text (graphs simply
follow each other; ``// -----`` lines between them are comments). The round trip is exact:
``print_graph(parse(print_graph(g))) == print_graph(g)``.

Errors are :class:`IRParseError`, located like MLIR's diagnostics::

    3:19: error: expected ':' and the result type after the operands, got 'f32'
      %1 = add %0, %x f32[4]
                      ^

A node is built with :meth:`Graph.add_node`, so the primitive's own rule checks it; a rule
that rejects its operands is reported at the node's line, and so is a written result type
that differs from the one the rule gives.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from fusegrad.dtypes import ALL_DTYPES, DType, complex128
from fusegrad.ir.graph import Graph, IRError, Literal, Operand, Value
from fusegrad.ir.verifier import operand_count
from fusegrad.ops.primitive import PRIMITIVES, ConstantData, Primitive, TensorType
from fusegrad.symint import SymbolicDecisionError, SymInt, ceil_div, symbol

__all__ = ["parse", "parse_many", "IRParseError"]

DTYPES_BY_SHORT: dict[str, DType] = {d.short: d for d in ALL_DTYPES}
# Identifiers that are never a symbolic size's name.
_RESERVED_WORDS = frozenset(DTYPES_BY_SHORT) | {"true", "false", "dense", "ceil", "floor"}


class IRParseError(IRError):
    """Text that is not a well-formed graph; ``line`` and ``col`` are 1-based."""

    def __init__(self, message: str, line: int, col: int, source_line: str | None = None):
        self.message = message
        self.line = line
        self.col = col
        text = f"{line}:{col}: error: {message}"
        if source_line is not None:
            text += f"\n{source_line}\n{' ' * (col - 1)}^"
        super().__init__(text)


# --------------------------------------------------------------------------- lexer


@dataclass(frozen=True)
class Token:
    kind: str      # value, global, ident, int, float, complex, string, punct, eof
    text: str
    line: int
    col: int


_TOKEN_RE = re.compile(r"""
    (?P<skip>[ \t\r\n]+|//[^\n]*)
  | (?P<value>%[A-Za-z0-9_.$]+)
  | (?P<global>@(?:[A-Za-z_][A-Za-z0-9_.$]*|"(?:[^"\\\n]|\\.)*"))
  | (?P<punct>->|[()\[\]{}<>,:=*+/])
  | (?P<float>-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|inf\b|nan\b))
  | (?P<int>-?\d+)
  | (?P<complex>complex\([^()\n]*\))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<minus>-)
""", re.VERBOSE)


def _tokenize(text: str, lines: list[str]) -> list[Token]:
    tokens = []
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            col = pos - line_start + 1
            what = "unterminated string" if text[pos] == '"' else f"unexpected character {text[pos]!r}"
            raise IRParseError(what, line, col, lines[line - 1])
        kind = m.lastgroup
        if kind != "skip":
            tokens.append(Token(kind, m.group(), line, pos - line_start + 1))
        newlines = m.group().count("\n")
        if newlines:
            line += newlines
            line_start = pos + m.group().rindex("\n") + 1
        pos = m.end()
    tokens.append(Token("eof", "", line, pos - line_start + 1))
    return tokens


# --------------------------------------------------------------------------- parser


@dataclass
class _Dense:
    """A ``dense<...>`` attribute before the node's result type gives its dtype and shape."""

    elements: Any      # nested lists of tokens
    token: Token


@dataclass
class _RawLiteral:
    token: Token
    dtype: DType | None     # its annotation, if written


def _describe(tok: Token) -> str:
    return "end of input" if tok.kind == "eof" else repr(tok.text)


class _Parser:
    def __init__(self, text: str, hints: dict[str, int] | None = None):
        self.hints = hints or {}              # symbol -> its size hint (see symint.symbol)
        self.lines = text.split("\n")
        self.tokens = _tokenize(text, self.lines)
        self.pos = 0
        self.names: dict[str, Value] = {}     # the current graph's values by their text

    # -- token helpers

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def next(self) -> Token:
        tok = self.peek()
        self.pos += 1
        return tok

    def at(self, text: str, ahead: int = 0) -> bool:
        tok = self.peek(ahead)
        return tok.text == text and tok.kind in ("punct", "ident")

    def error(self, message: str, tok: Token | None = None) -> IRParseError:
        tok = tok or self.peek()
        source = self.lines[tok.line - 1] if tok.line <= len(self.lines) else None
        return IRParseError(message, tok.line, tok.col, source)

    def expect(self, text: str, what: str | None = None) -> Token:
        if not self.at(text):
            raise self.error(f"expected {what or repr(text)}, got {_describe(self.peek())}")
        return self.next()

    def expect_kind(self, kind: str, what: str) -> Token:
        if self.peek().kind != kind:
            raise self.error(f"expected {what}, got {_describe(self.peek())}")
        return self.next()

    # -- graphs

    def parse_graphs(self) -> list[Graph]:
        graphs = []
        while self.peek().kind != "eof":
            graphs.append(self.parse_graph())
        return graphs

    def parse_graph(self) -> Graph:
        self.expect("graph", "'graph'")
        name_tok = self.expect_kind("global", "the graph's name, like @f")
        name = name_tok.text[1:]
        g = Graph(json.loads(name) if name.startswith('"') else name)
        self.names = {}
        self.expect("(", "'(' before the graph's inputs")
        if not self.at(")"):
            while True:
                tok = self.expect_kind("value", "an input name like %x")
                if tok.text in self.names:
                    raise self.error(f"redefinition of value {tok.text}", tok)
                self.expect(":", "':' and the input's type")
                self.define(tok, g.add_input(tok.text[1:], self.parse_type()))
                if not self.at(","):
                    break
                self.next()
        self.expect(")", "',' or ')' after an input")
        self.expect("->", "'->' and the output types")
        self.expect("(", "'(' before the output types")
        out_types: list[tuple[TensorType, Token]] = []
        if not self.at(")"):
            while True:
                tok = self.peek()
                out_types.append((self.parse_type(), tok))
                if not self.at(","):
                    break
                self.next()
        self.expect(")", "',' or ')' after an output type")
        self.expect("{", "'{' before the graph's body")
        while not self.at("return"):
            if self.peek().kind != "value":
                raise self.error(f"expected a node ('%name = op ...') or 'return', got "
                                 f"{_describe(self.peek())}")
            self.parse_node(g)
        self.parse_return(g, out_types)
        self.expect("}", "'}' after the return")
        return g

    def define(self, tok: Token, value: Value) -> None:
        if tok.text in self.names:
            raise self.error(f"redefinition of value {tok.text}", tok)
        self.names[tok.text] = value

    def parse_type(self) -> TensorType:
        tok = self.peek()
        if tok.kind != "ident" or tok.text not in DTYPES_BY_SHORT:
            raise self.error(f"expected a tensor type like f32[4,8], got {_describe(tok)}")
        self.next()
        dtype = DTYPES_BY_SHORT[tok.text]
        self.expect("[", f"'[' and the shape after {tok.text}")
        dims = []
        if not self.at("]"):
            while True:
                d = self.peek()
                if d.kind not in ("int", "ident", "minus") and not self.at("("):
                    raise self.error(f"expected a dimension size, got {_describe(d)}")
                dim = self.parse_size()
                if isinstance(dim, int) and dim < 0:
                    raise self.error("dimension sizes cannot be negative", d)
                dims.append(dim)
                if not self.at(","):
                    break
                self.next()
        self.expect("]", "',' or ']' in the shape")
        device = "cpu"
        if self.peek().kind == "global":            # f32[4]@cuda, f32[4]@"cuda:1"
            text = self.next().text[1:]
            device = text[1:-1] if text.startswith('"') else text
        return TensorType(tuple(dims), dtype, device)

    # -- symbolic sizes: B, B*T+1, T-1, ceil(T/2), floor(T/2)

    def parse_size(self) -> int | SymInt:
        """A size expression: terms joined by ``+`` and ``-`` (``T-1`` lexes as ``T`` and
        the integer ``-1``)."""
        value = self.parse_size_term()
        while True:
            if self.at("+"):
                self.next()
                value = value + self.parse_size_term()
            elif self.peek().kind == "minus":
                self.next()
                value = value - self.parse_size_term()
            elif self.peek().kind == "int" and self.peek().text.startswith("-"):
                value = value + self.parse_size_term()
            else:
                return value

    def parse_size_term(self) -> int | SymInt:
        value = self.parse_size_atom()
        while self.at("*"):
            self.next()
            value = value * self.parse_size_atom()
        return value

    def parse_size_atom(self) -> int | SymInt:
        tok = self.next()
        if tok.kind == "int":
            return int(tok.text)
        if tok.text == "(":
            value = self.parse_size()
            self.expect(")", "')' closing a size expression")
            return value
        if tok.kind == "ident" and tok.text in ("ceil", "floor") and self.at("("):
            self.next()
            num = self.parse_size()
            self.expect("/", f"'/' and the divisor in {tok.text}(...)")
            den = self.expect_kind("int", "an integer divisor")
            self.expect(")", f"')' closing {tok.text}(...)")
            try:
                return ceil_div(num, int(den.text)) if tok.text == "ceil" else num // int(den.text)
            except SymbolicDecisionError as e:
                raise self.error(str(e), den) from None
        if tok.kind == "ident" and tok.text not in _RESERVED_WORDS:
            return symbol(tok.text, self.hints.get(tok.text))
        raise self.error(f"expected a size (an integer, a symbol or an expression of them), "
                         f"got {_describe(tok)}", tok)

    # -- nodes

    def parse_node(self, g: Graph) -> None:
        result_tok = self.next()
        self.expect("=", f"'=' after {result_tok.text}")
        op_tok = self.expect_kind("ident", "a primitive name")
        prim = PRIMITIVES.get(op_tok.text)
        if prim is None:
            raise self.error(f"unknown primitive '{op_tok.text}'", op_tok)
        operands: list[Value | _RawLiteral] = []
        if not (self.at("{") or self.at(":")):
            while True:
                operands.append(self.parse_operand())
                if not self.at(","):
                    break
                self.next()
        inputs = self.resolve_literals(operands)
        self.check_arity(prim, len(inputs), op_tok)
        attrs: dict[str, Any] = {}
        if self.at("{"):
            attrs = self.parse_attr_dict(prim)
        if not self.at(":"):
            after = "attributes" if attrs else "operands"
            raise self.error(f"expected ':' and the result type after the {after}, got "
                             f"{_describe(self.peek())}")
        self.next()
        type_tok = self.peek()
        result_type = self.parse_type()
        region = None
        if self.at("region"):
            self.next()
            self.expect("(", "'(' after region")
            number = self.expect_kind("int", "a region number")
            region = int(number.text)
            self.expect(")", "')' after the region number")
        remat = self.at("remat")
        if remat:
            self.next()
        loc = self.parse_loc() if self.at("loc") else None
        missing = [a for a in prim.attrs if a not in attrs]
        if missing:
            raise self.error(f"{prim.name} needs attribute{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(missing)}", op_tok)
        for key, value in attrs.items():
            attrs[key] = self.resolve_dense(value, result_type)
        name = result_tok.text[1:]
        try:
            out = g.add_node(prim, inputs, attrs, loc=loc, name=None if name.isdigit() else name)
        except (IRError, ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            # add_node prefixes the op's name, which most rules' messages already start with.
            message = str(e.__cause__ or e)
            if not message.startswith(prim.name):
                message = f"{prim.name}: {message}"
            raise self.error(message, op_tok) from e
        if out.type != result_type:
            raise self.error(f"result type {result_type} does not match {out.type} given by "
                             f"{prim.name}'s rule", type_tok)
        if region is not None or remat:
            g.nodes[-1].region, g.nodes[-1].remat = region, remat
        self.define(result_tok, out)

    def check_arity(self, prim: Primitive, count: int, tok: Token) -> None:
        want = operand_count(prim)
        if want is None and count == 0:
            raise self.error(f"{prim.name} takes one or more operands, got none", tok)
        if want is not None and count != want:
            raise self.error(f"{prim.name} takes {want} operand{'s' if want != 1 else ''}, got "
                             f"{count}", tok)

    def parse_operand(self) -> Value | _RawLiteral:
        tok = self.peek()
        if tok.kind == "value":
            self.next()
            if tok.text not in self.names:
                raise self.error(f"use of undefined value {tok.text}", tok)
            return self.names[tok.text]
        if tok.kind in ("int", "float", "complex") or self.at("true") or self.at("false"):
            self.next()
            dtype = None
            # '2.0:f16' annotates the literal; '2.0 : f32[4]' is the node's result type.
            if (self.at(":") and self.peek(1).kind == "ident" and self.peek(1).text in
                    DTYPES_BY_SHORT and not self.at("[", 2)):
                self.next()
                dtype = DTYPES_BY_SHORT[self.next().text]
            return _RawLiteral(tok, dtype)
        raise self.error(f"expected an operand (a %value or a literal), got {_describe(tok)}")

    def resolve_literals(self, operands: list[Value | _RawLiteral]) -> list[Operand]:
        """Give each literal its dtype: its annotation, else the last Value operand's."""
        default = None
        for op in operands:
            if isinstance(op, Value):
                default = op.type.dtype
        resolved: list[Operand] = []
        for op in operands:
            if isinstance(op, _RawLiteral):
                dtype = op.dtype or default
                if dtype is None:
                    raise self.error(f"cannot tell the dtype of literal {op.token.text}: the node "
                                     f"has no value operand; write it as {op.token.text}:f32 "
                                     f"(or another dtype)", op.token)
                op = Literal(self.scalar(op.token, dtype, annotated=op.dtype is not None), dtype)
            resolved.append(op)
        return resolved

    def scalar(self, tok: Token, dtype: DType,
               annotated: bool = True) -> bool | int | float | complex:
        """The Python value of a literal token as an element of ``dtype``."""
        how = "" if annotated else " (the dtype of the node's last value operand)"
        hint = "" if annotated else f"; write {tok.text}:<dtype> for a literal of another dtype"
        if dtype.category == 0:
            if tok.text in ("true", "false"):
                return tok.text == "true"
            raise self.error(f"expected true or false for {dtype.short}{how}, got {tok.text}{hint}",
                             tok)
        if dtype.category == 1:
            if tok.kind != "int":
                raise self.error(f"expected an integer for {dtype.short}{how}, got {tok.text}{hint}",
                                 tok)
            value = int(tok.text)
            info = np.iinfo(dtype.np_dtype)
            if not info.min <= value <= info.max:
                raise self.error(f"{value} is out of range for {dtype.short}", tok)
            return value
        if dtype.category == 3 and tok.kind == "complex":
            parts = tok.text[len("complex("):-1].split(",")
            try:
                re_, im = (float(p) for p in parts)
            except ValueError:
                raise self.error(f"expected complex(<real>, <imag>), got {tok.text}", tok) from None
            return complex(re_, im)
        if tok.kind not in ("int", "float"):
            raise self.error(f"expected a number for {dtype.short}{how}, got {tok.text}{hint}", tok)
        return complex(float(tok.text)) if dtype.category == 3 else float(tok.text)

    # -- attributes

    def parse_attr_dict(self, prim: Primitive) -> dict[str, Any]:
        self.expect("{")
        attrs: dict[str, Any] = {}
        while True:
            key = self.expect_kind("ident", "an attribute name")
            if key.text not in prim.attrs:
                known = ", ".join(prim.attrs) or "none"
                raise self.error(f"{prim.name} has no attribute '{key.text}' (its attributes: "
                                 f"{known})", key)
            if key.text in attrs:
                raise self.error(f"attribute '{key.text}' given twice", key)
            self.expect("=", f"'=' after attribute name {key.text}")
            attrs[key.text] = self.parse_attr_value()
            if not self.at(","):
                break
            self.next()
        self.expect("}", "',' or '}' after an attribute")
        return attrs

    def parse_attr_value(self) -> Any:
        tok = self.peek()
        if tok.kind == "int":
            if self.peek(1).text in ("*", "+") or self.peek(1).kind == "minus":
                return self.parse_size()        # a symbolic size: 784*B
            self.next()
            return int(tok.text)
        if tok.kind == "float":
            self.next()
            return float(tok.text)
        if tok.kind == "complex":
            self.next()
            return self.scalar(tok, complex128)
        if tok.kind == "string":
            self.next()
            return json.loads(tok.text)
        if tok.kind == "ident":
            if tok.text in ("true", "false"):
                self.next()
                return tok.text == "true"
            if tok.text in DTYPES_BY_SHORT:
                self.next()
                return DTYPES_BY_SHORT[tok.text]
            if tok.text == "dense":
                self.next()
                self.expect("<", "'<' after dense")
                elements = self.parse_dense_elements()
                self.expect(">", "'>' after the dense elements")
                return _Dense(elements, tok)
            return self.parse_size()            # a symbolic size in a shape attribute
        if self.at("["):
            self.next()
            items = []
            if not self.at("]"):
                while True:
                    items.append(self.parse_attr_value())
                    if not self.at(","):
                        break
                    self.next()
            self.expect("]", "',' or ']' in a list")
            return tuple(items)
        raise self.error(f"expected an attribute value, got {_describe(tok)}")

    def parse_dense_elements(self) -> Any:
        if self.at("["):
            self.next()
            items = []
            if not self.at("]"):
                while True:
                    items.append(self.parse_dense_elements())
                    if not self.at(","):
                        break
                    self.next()
            self.expect("]", "',' or ']' in dense elements")
            return items
        tok = self.peek()
        if tok.kind in ("int", "float", "complex") or self.at("true") or self.at("false"):
            return self.next()
        raise self.error(f"expected a dense element or '[', got {_describe(tok)}")

    def resolve_dense(self, value: Any, result_type: TensorType) -> Any:
        if not isinstance(value, _Dense):
            if isinstance(value, tuple):
                return tuple(self.resolve_dense(v, result_type) for v in value)
            return value
        shape = result_type.shape
        # An empty array prints as [] at the first zero-sized axis; compare up to there.
        zero = next((i for i, d in enumerate(shape) if d == 0), None)
        want = shape if zero is None else shape[:zero + 1]
        got = self.nested_shape(value.elements, value.token)
        if got == () and shape != ():       # a splat: one element for every position
            dtype = result_type.dtype
            one = self.scalar(value.elements, dtype)
            one = np.asarray(one).astype(dtype.np_dtype) if dtype.category >= 2 else one
            return ConstantData(np.full(shape, one, dtype=dtype.np_dtype))
        if got != want:
            raise self.error(f"dense elements have shape {list(got)} but the result type is "
                             f"{result_type}", value.token)
        flat: list[Token] = []
        self.flatten(value.elements, flat)
        dtype = result_type.dtype
        scalars = [self.scalar(t, dtype) for t in flat]
        if dtype.category >= 2:
            # Decimal -> double -> element type: what the printer checks round-trips.
            wide = np.complex128 if dtype.category == 3 else np.float64
            array = np.array(scalars, dtype=wide).astype(dtype.np_dtype)
        else:
            array = np.array(scalars, dtype=dtype.np_dtype)
        return ConstantData(array.reshape(shape))

    def nested_shape(self, elements: Any, tok: Token) -> tuple[int, ...]:
        if not isinstance(elements, list):
            return ()
        if not elements:
            return (0,)
        inner = [self.nested_shape(e, tok) for e in elements]
        if any(s != inner[0] for s in inner):
            raise self.error("dense elements are not rectangular", tok)
        return (len(elements),) + inner[0]

    def flatten(self, elements: Any, out: list[Token]) -> None:
        if isinstance(elements, list):
            for e in elements:
                self.flatten(e, out)
        else:
            out.append(elements)

    # -- locations, return

    def parse_loc(self) -> str:
        self.next()
        self.expect("(", "'(' after loc")
        text = json.loads(self.expect_kind("string", "a quoted file name").text)
        if self.at(":"):
            self.next()
            line = self.expect_kind("int", "a line number")
            if line.text.startswith("-"):
                raise self.error("line numbers cannot be negative", line)
            text = f"{text}:{int(line.text)}"
        self.expect(")", "')' after the location")
        return text

    def parse_return(self, g: Graph, out_types: list[tuple[TensorType, Token]]) -> None:
        ret = self.next()
        operands: list[tuple[Any, Token]] = []
        if not self.at("}"):
            while True:
                tok = self.peek()
                operands.append((self.parse_operand(), tok))
                if not self.at(","):
                    break
                self.next()
        if len(operands) != len(out_types):
            raise self.error(f"return has {len(operands)} operand(s) but the signature declares "
                             f"{len(out_types)} output(s)", ret)
        outputs: list[Operand] = []
        for i, ((op, tok), (declared, _)) in enumerate(zip(operands, out_types, strict=True)):
            if isinstance(op, _RawLiteral):
                if op.dtype is not None and op.dtype is not declared.dtype:
                    raise self.error(f"literal {tok.text} is {op.dtype.short} but output {i} is "
                                     f"declared {declared}", tok)
                if declared.shape != ():
                    raise self.error(f"a literal output is a scalar, but output {i} is declared "
                                     f"{declared}", tok)
                op = Literal(self.scalar(op.token, declared.dtype), declared.dtype)
            elif op.type != declared:
                raise self.error(f"output {i} ({tok.text}) has type {op.type} but the signature "
                                 f"declares {declared}", tok)
            outputs.append(op)
        g.set_outputs(outputs)


def parse_many(text: str, hints: dict[str, int] | None = None) -> list[Graph]:
    """Every graph in ``text``, in order (``// -----`` separators are comments); ``hints``
    as :func:`parse`'s."""
    return _Parser(text, hints).parse_graphs()


def parse(text: str, hints: dict[str, int] | None = None) -> Graph:
    """The one graph in ``text``. ``hints`` gives symbolic sizes the values they had where
    the graph was traced (:func:`~fusegrad.symint.symbol`'s hint): decisions the compiler
    makes at the traced sizes are then made as they were there.

    >>> g = parse("graph @f(%x: f32[2]) -> (f32[2]) {\\n  %0 = exp %x : f32[2]\\n"
    ...           "  return %0\\n}")
    >>> [n.op for n in g.nodes]
    ['exp']
    """
    parser = _Parser(text, hints)
    g = parser.parse_graph()
    if parser.peek().kind != "eof":
        raise parser.error("expected end of input after the graph (use parse_many for several "
                           f"graphs), got {_describe(parser.peek())}")
    return g
