"""Symbolic sizes: a dimension of a :class:`~fusegrad.tensor_type.TensorType` known by name.

A :class:`SymInt` is a symbol (``B``) or an integer expression of symbols built with ``+``,
``-``, ``*``, ``//`` and :func:`ceil_div` (printed ``B*T``, ``T-1``, ``floor(T/2)``,
``ceil(T/2)``). Expressions are
kept canonical (a sum of monomials with integer coefficients, sorted), so two spellings of
one size are equal and hash alike (``B*T == T*B``, ``B+B == 2*B``); an expression with no
symbol left is a plain ``int``, so static shapes stay tuples of ints.

Every symbol stands for a size of at least 2: as torch's 0/1 specialization, a dimension
seen with size 0 or 1 stays static (a size of 1 changes broadcasting), and whoever makes a
symbol guards that assumption when a call binds it. The assumption decides the comparisons
shape rules make: ``B == 1`` is False, ``B >= 2`` True; a comparison it cannot decide
(``B < 784``) raises :class:`SymbolicDecisionError` instead of guessing. ``B == 784`` is
False as well, and is a real assumption (the program may differ where B is 784): inside
:func:`record_assumptions` each such answer is recorded, for a compiled function to guard.

>>> B, T = symbol("B"), symbol("T")
>>> str(B * T + 1), (B * T).evaluate({"B": 4, "T": 8})
('B*T+1', 32)
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Union

__all__ = ["SymInt", "SymbolicDecisionError", "SizesOutOfRange", "symbol", "ceil_div", "is_symbolic",
           "evaluate_dim", "evaluate_shape", "free_symbols", "as_size", "size_hint", "stand_in",
           "at_hints",
           "known_equal", "known_multiple",
           "slice_indices",
           "holds_symbol",
           "record_assumptions", "strict_decisions", "hashable_sizes", "because", "Assumption",
           "MIN_SYMBOL_SIZE"]

# Sizes 0 and 1 are specialized (see the module docstring): a symbol is at least this.
MIN_SYMBOL_SIZE = 2

Dim = Union[int, "SymInt"]


class SymbolicDecisionError(TypeError):
    """A shape rule needed a fact about a symbolic size that its assumptions do not give."""


class SizesOutOfRange(SymbolicDecisionError):
    """A program made once for every size cannot run a call's sizes (the 32-bit indices of
    a CUDA kernel, chosen at the sizes traced at, would overflow): the caller runs a program
    built for them."""


class _Div:
    """An atom ``num // den`` (``ceil``: rounded up) of a symbolic numerator and an int."""

    __slots__ = ("num", "den", "ceil", "_key")

    def __init__(self, num: "SymInt", den: int, ceil: bool):
        self.num, self.den, self.ceil = num, den, ceil
        self._key = ("ceil" if ceil else "floor", num._terms, den)

    def __eq__(self, other) -> bool:
        return isinstance(other, _Div) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __lt__(self, other) -> bool:
        return _atom_order(self) < _atom_order(other)

    def __str__(self) -> str:
        # floor(...) rather than //, which the IR text reads as a comment.
        return f"{'ceil' if self.ceil else 'floor'}({_paren(self.num)}/{self.den})"

    def evaluate(self, bindings: dict) -> int:
        n = self.num.evaluate(bindings)
        return -(-n // self.den) if self.ceil else n // self.den

    def lower_bound(self) -> int | None:
        lo = self.num.lower_bound()
        if lo is None:
            return None
        return -(-lo // self.den) if self.ceil else lo // self.den


def _atom_order(a) -> tuple:
    return (0, a) if isinstance(a, str) else (1, str(a))


def _paren(e: "SymInt") -> str:
    text = str(e)
    return text if len(e._terms) == 1 and e._terms[0][1] == 1 else f"({text})"


class SymInt:
    """An integer expression of named sizes (see the module docstring).

    Build one with :func:`symbol` and arithmetic; ``int(s)`` raises (a symbol has no value
    until a call binds it: :meth:`evaluate`)."""

    # ((monomial, coefficient), ...): a monomial is a sorted tuple of atoms (symbol names
    # and _Div), () for the constant term; no zero coefficients; sorted. ``_hints``: the
    # sizes the symbols had where the expression was made (a trace's example call), as
    # torch's size hints; not part of the value (equality and hash ignore them).
    __slots__ = ("_terms", "_hash", "_hints")

    def __init__(self, terms, hints: dict | None = None):
        self._terms = terms
        self._hash = hash(terms)
        self._hints = hints or {}

    # -- construction

    @staticmethod
    def _make(poly: dict, hints: dict | None = None) -> Dim:
        terms = tuple(sorted(((m, c) for m, c in poly.items() if c != 0),
                             key=lambda mc: (-len(mc[0]), [_atom_order(a) for a in mc[0]])))
        if not terms:
            return 0
        if len(terms) == 1 and terms[0][0] == ():
            return terms[0][1]
        return SymInt(terms, hints)

    def _poly(self) -> dict:
        return dict(self._terms)

    # -- arithmetic

    def __add__(self, other) -> Dim:
        if not isinstance(other, (int, SymInt)) or isinstance(other, bool):
            return NotImplemented
        poly = self._poly()
        for m, c in _terms_of(other):
            poly[m] = poly.get(m, 0) + c
        return SymInt._make(poly, _merged_hints(self, other))

    __radd__ = __add__

    def __neg__(self) -> Dim:
        return SymInt._make({m: -c for m, c in self._terms}, self._hints)

    def __sub__(self, other) -> Dim:
        if not isinstance(other, (int, SymInt)) or isinstance(other, bool):
            return NotImplemented
        return self + (-other)

    def __rsub__(self, other) -> Dim:
        if not isinstance(other, int) or isinstance(other, bool):
            return NotImplemented
        return (-self) + other

    def __mul__(self, other) -> Dim:
        if not isinstance(other, (int, SymInt)) or isinstance(other, bool):
            return NotImplemented
        poly: dict = {}
        for m1, c1 in self._terms:
            for m2, c2 in _terms_of(other):
                m = tuple(sorted(m1 + m2, key=_atom_order))
                poly[m] = poly.get(m, 0) + c1 * c2
        return SymInt._make(poly, _merged_hints(self, other))

    __rmul__ = __mul__

    def __floordiv__(self, other) -> Dim:
        return _div(self, other, ceil=False)

    def __mod__(self, other) -> int:
        # Decidable when every coefficient is a multiple (B*64 % 64 is 0), or every term a
        # multiple of a monomial (B*T*64 % (B*T) is 0): a reshape's -1.
        if isinstance(other, int) and not isinstance(other, bool) and other > 0 and \
                all(c % other == 0 for _, c in self._terms):
            return 0
        if isinstance(other, SymInt) and _exact_quotient(self, other) is not None:
            return 0
        if isinstance(other, int) and not isinstance(other, bool) and other > 0 and \
                _recording_active() and self.hint() is not None:
            # Divisibility (a reshape to literal sizes: 3*B % 6): answered at the hints and
            # recorded as the remainder's value, as torch guards it.
            rem = self - other * (self // other)
            at = rem if isinstance(rem, int) else rem.hint()
            if not isinstance(rem, int):
                _record(rem, at, "==")
            return at
        raise SymbolicDecisionError(f"cannot decide {self} % {other}: a symbolic size is only "
                                    f"known to be >= {MIN_SYMBOL_SIZE}")

    def __rmod__(self, other):
        raise SymbolicDecisionError(f"cannot decide {other} % {self} for a symbolic size")

    def __rfloordiv__(self, other):
        raise SymbolicDecisionError(f"{other} // {self}: a size divided by a symbolic size is "
                                    "not a supported symbolic expression")

    # -- facts

    def __eq__(self, other) -> bool:
        if isinstance(other, float):
            # x.shape[0] == 16.0: Python would fall back to identity (False, unrecorded).
            if not other.is_integer():
                return False                     # a fact: sizes are integers
            other = int(other)
        if isinstance(other, SymInt):
            if self._terms == other._terms:
                return True
            # Two expressions that differ may still be equal at some sizes (s0//2*2 == s0,
            # s0-1 == s1): unless their difference is never 0, that is an assumption,
            # answered at the hints and recorded, as a comparison with < is.
            diff = self - other
            if isinstance(diff, int) or \
                    any(lo is not None and lo > 0 for lo in (diff.lower_bound(),
                                                             (-diff).lower_bound())):
                return False
            _refuse_in_strict(self, "==", other)
            if not _recording_active() or _compiling():
                return False
            at = diff.hint()
            if at is None:
                return False
            _record(self, other, "==" if at == 0 else "!=")
            return at == 0
        if isinstance(other, int) and not isinstance(other, bool):
            # Not equal: a fact for an int below every value the expression can take, an
            # assumption (recorded) for any other.
            lo = self.lower_bound()
            if lo is None or other >= lo:
                _refuse_in_strict(self, "==", other)
                if not _compiling():
                    _record(self, other, "!=")
            return False
        return NotImplemented

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        # A user's dict or set lookup of a size ({32: a}.get(x.shape[0])) compares by hash
        # first, so it would take a branch with no comparison to record. While a function
        # is traced, hashing a size raises (torch's SymInt is unhashable), and the function
        # compiles static shapes; the IR hashes sizes only after the trace.
        if _recording_active() and not getattr(_recording, "hashable", False):
            raise SymbolicDecisionError(f"unhashable type: symbolic size {self} (a dict key or "
                                        "set member needs the size's value)")
        return self._hash

    def _compare(self, other, op: str) -> bool:
        diff = self - other
        if isinstance(diff, int):
            return {"<": diff < 0, "<=": diff <= 0, ">": diff > 0, ">=": diff >= 0}[op]
        lo = diff.lower_bound()
        neg_lo = (-diff).lower_bound()
        if op in (">", ">=") and lo is not None and (lo > 0 or op == ">=" and lo >= 0):
            return True
        if op in ("<", "<=") and neg_lo is not None and (neg_lo > 0 or op == "<=" and neg_lo >= 0):
            return True
        if op in (">", ">=") and neg_lo is not None and (neg_lo > 0 if op == ">=" else neg_lo >= 0):
            return False
        if op in ("<", "<=") and lo is not None and (lo > 0 if op == "<=" else lo >= 0):
            return False
        # Not a fact: inside record_assumptions, decided at the hints (the sizes traced at)
        # and recorded, as torch guards a comparison of sizes; elsewhere an error.
        _refuse_in_strict(self, op, other)
        at = diff.hint()
        if at is not None and _recording_active():
            truth = {"<": at < 0, "<=": at <= 0, ">": at > 0, ">=": at >= 0}[op]
            _record(self, other, op if truth else _NEGATED[op])
            return truth
        raise SymbolicDecisionError(
            f"cannot decide {self} {op} {other}: a symbolic size is only known to be "
            f">= {MIN_SYMBOL_SIZE}")

    def __lt__(self, other) -> bool:
        return self._compare(other, "<")

    def __le__(self, other) -> bool:
        return self._compare(other, "<=")

    def __gt__(self, other) -> bool:
        return self._compare(other, ">")

    def __ge__(self, other) -> bool:
        return self._compare(other, ">=")

    def __bool__(self) -> bool:
        # Sizes are never negative: non-zero is > 0.
        return self._compare(0, ">")

    def __int__(self) -> int:
        raise SymbolicDecisionError(f"symbolic size {self} has no value until a call binds "
                                    f"{', '.join(sorted(self.free_symbols()))}")

    __index__ = __int__

    def lower_bound(self) -> int | None:
        """The least value over bindings of every symbol to >= MIN_SYMBOL_SIZE, when the
        coefficients make it the value at the least sizes (all positive); else None."""
        total = 0
        for m, c in self._terms:
            if m == ():
                total += c
                continue
            if c < 0:
                return None
            v = c
            for a in m:
                lo = MIN_SYMBOL_SIZE if isinstance(a, str) else a.lower_bound()
                if lo is None or lo < 0:
                    return None
                v *= lo
            total += v
        return total

    def free_symbols(self) -> set[str]:
        """The names of the symbols the expression reads."""
        out: set[str] = set()
        for m, _ in self._terms:
            for a in m:
                out |= {a} if isinstance(a, str) else a.num.free_symbols()
        return out

    @property
    def name(self) -> str | None:
        """The symbol's name when the expression is one bare symbol, else None."""
        if len(self._terms) == 1:
            (m, c), = self._terms
            if c == 1 and len(m) == 1 and isinstance(m[0], str):
                return m[0]
        return None

    def hint(self) -> int | None:
        """The value at the sizes where the symbols were made (None without hints)."""
        try:
            return self.evaluate(self._hints)
        except KeyError:
            return None

    def evaluate(self, bindings: dict) -> int:
        """The value for ``bindings`` (symbol name -> int); KeyError names a missing one."""
        total = 0
        for m, c in self._terms:
            v = c
            for a in m:
                v *= bindings[a] if isinstance(a, str) else a.evaluate(bindings)
            total += v
        return total

    def __str__(self) -> str:
        parts = []
        for m, c in self._terms:
            body = "*".join(str(a) for a in m)
            if not body:
                text = str(abs(c))
            elif abs(c) == 1:
                text = body
            else:
                text = f"{abs(c)}*{body}"
            parts.append(("-" if c < 0 else "+", text))
        first_sign, first = parts[0]
        out = ("-" if first_sign == "-" else "") + first
        return out + "".join(sign + text for sign, text in parts[1:])

    # As torch prints a SymInt: its expression (shapes in messages read [B, 784]).
    __repr__ = __str__


_recording = threading.local()


_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "!=": "=="}
COMPARE = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
           ">=": lambda a, b: a >= b, "!=": lambda a, b: a != b, "==": lambda a, b: a == b}


@contextlib.contextmanager
def record_assumptions() -> Iterator[list]:
    """Collect, in the list this yields, each ``(expression, op, value)`` that a comparison
    inside the block assumed true: ``B == 784`` answered False records ``(B, "!=", 784)``;
    a comparison the >= 2 assumption cannot decide (``T <= 32``) is answered at the sizes
    the symbols were traced at (their hints) and recorded. What a program traced with
    symbolic sizes assumed about them, for a compiled function to guard."""
    stack = getattr(_recording, "stack", None)
    if stack is None:
        stack = _recording.stack = []
    found: list = []
    stack.append(found)
    try:
        yield found
    finally:
        stack.pop()


@contextlib.contextmanager
def _flag(name: str) -> Iterator[None]:
    """Set this thread's recording flag ``name`` inside the block (nested blocks restore)."""
    previous = getattr(_recording, name, False)
    setattr(_recording, name, True)
    try:
        yield
    finally:
        setattr(_recording, name, previous)


def strict_decisions():
    """Inside the block, an equality of sizes that the >= 2 assumption does not decide
    (``B == 784``, ``B == T``) raises :class:`SymbolicDecisionError`, as an undecided ``<``
    always does, instead of answering False: for code made once for every size (kernels
    that read their sizes at run time), where an answer true at some sizes only would be
    wrong there."""
    return _flag("strict")


def hashable_sizes():
    """Inside the block sizes hash, and an equality of sizes is a fact (False unless the
    two are equal for every size, and not recorded), while an order comparison is still
    decided at the hints and recorded: for the compiler after a trace, whose tables of
    shapes and tests of "the same shape" only ever save work (the user's code, which could
    branch on them, is not running)."""
    return _flag("hashable")


def _compiling() -> bool:
    return getattr(_recording, "hashable", False)


def _refuse_in_strict(expr, op: str, other) -> None:
    if getattr(_recording, "strict", False):
        raise SymbolicDecisionError(f"cannot decide {expr} {op} {other} for every size")


def _recording_active() -> bool:
    return bool(getattr(_recording, "stack", None))


class Assumption(tuple):
    """A recorded ``(expression, op, value)``, and ``reason``: why the code that compared
    assumed it, where that code said (:func:`because`), else None."""

    reason: str | None = None


@contextlib.contextmanager
def because(reason: str) -> Iterator[None]:
    """Comparisons recorded inside the block (:func:`record_assumptions`) carry ``reason``
    (what the code that compares can take: "the fused attention takes at most 128 keys"),
    for a refusal of sizes to say why."""
    previous = getattr(_recording, "reason", None)
    _recording.reason = reason
    try:
        yield
    finally:
        _recording.reason = previous


def _record(expr: "SymInt", value, op: str) -> None:
    stack = getattr(_recording, "stack", None)
    # Compared by structure: == of two expressions would itself be a comparison to record.
    if stack and not any(op == o and _same(expr, e) and _same(value, v) for e, o, v in stack[-1]):
        found = Assumption((expr, op, value))
        found.reason = getattr(_recording, "reason", None)
        stack[-1].append(found)


def _same(a, b) -> bool:
    if isinstance(a, SymInt) or isinstance(b, SymInt):
        return isinstance(a, SymInt) and isinstance(b, SymInt) and a._terms == b._terms
    return a == b


def _merged_hints(a: "SymInt", b) -> dict:
    if isinstance(b, SymInt) and b._hints and b._hints is not a._hints:
        return {**a._hints, **b._hints}
    return a._hints


def _terms_of(x: Dim) -> tuple:
    return x._terms if isinstance(x, SymInt) else (((), x),)


def _exact_quotient(num, den: "SymInt") -> Dim | None:
    """``num / den`` when ``den`` is one monomial (``c*B*T``) that divides every term of
    ``num`` (``B*T*64 / (B*T)`` is 64: a reshape's -1 beside symbolic sizes); else None."""
    if len(den._terms) != 1:
        return None
    (dm, dc), = den._terms
    poly: dict = {}
    for m, c in _terms_of(num):
        rest = list(m)
        for a in dm:
            if a not in rest:
                return None
            rest.remove(a)
        if c % dc:
            return None
        poly[tuple(rest)] = c // dc
    return SymInt._make(poly, _merged_hints(num, den) if isinstance(num, SymInt) else den._hints)


def _div(num, den, ceil: bool) -> Dim:
    if isinstance(den, SymInt):
        exact = _exact_quotient(num, den)
        if exact is not None:
            return exact
    if isinstance(den, SymInt) or not isinstance(den, int) or isinstance(den, bool):
        raise SymbolicDecisionError(f"{num} divided by {den}: only division by a positive "
                                    "integer is a symbolic size")
    if den <= 0:
        raise SymbolicDecisionError(f"{num} divided by {den}: the divisor must be positive")
    if isinstance(num, int):
        return -(-num // den) if ceil else num // den
    if den == 1:
        return num
    # Exact when every coefficient divides: (4*B+8)//4 is B+2.
    if all(c % den == 0 for _, c in num._terms):
        return SymInt._make({m: c // den for m, c in num._terms}, num._hints)
    return SymInt((((_Div(num, den, ceil),), 1),), num._hints)


def symbol(name: str, hint: int | None = None) -> SymInt:
    """The symbolic size called ``name`` (an identifier: ``B``, ``s0``); ``hint``: its size
    in the example the symbol was made from (see :func:`size_hint`)."""
    if not name.isidentifier():
        raise ValueError(f"a symbol's name must be an identifier, got {name!r}")
    return SymInt(((((name,), 1),)), {name: hint} if hint is not None else None)


def size_hint(d: Dim) -> int:
    """A size's value in the example call a trace was made from: for reasoning that needs a
    number but whose result does not depend on it (a stand-in array's strides)."""
    if not isinstance(d, SymInt):
        return d
    value = d.hint()
    if value is None:
        raise SymbolicDecisionError(f"symbolic size {d} has no hint")
    return value


# What a symbol with no hint (a graph read from text) stands in as in :func:`stand_in`: a
# large size, as a batch or a sequence length is.
NOMINAL_SIZE = 1024


def stand_in(d: Dim) -> int:
    """:func:`size_hint`, or for a size whose symbols have no hint (a graph parsed from
    text), its value with each symbol at :data:`NOMINAL_SIZE`: for a stand-in array's strides
    or a cost, which hold at any size."""
    if not isinstance(d, SymInt):
        return d
    value = d.hint()
    return value if value is not None else d.evaluate(dict.fromkeys(d.free_symbols(),
                                                                    NOMINAL_SIZE))


def ceil_div(num: Dim, den: int) -> Dim:
    """``ceil(num / den)`` for a size ``num`` and a positive int ``den``."""
    return _div(num, den, ceil=True)


def is_symbolic(shape_or_dim) -> bool:
    """Whether a dim, or any dim of a shape, is symbolic."""
    if isinstance(shape_or_dim, SymInt):
        return True
    return isinstance(shape_or_dim, tuple) and any(isinstance(d, SymInt) for d in shape_or_dim)


def free_symbols(shape: tuple) -> set[str]:
    """The symbols a shape's dims read."""
    out: set[str] = set()
    for d in shape:
        if isinstance(d, SymInt):
            out |= d.free_symbols()
    return out


def as_size(d) -> Dim:
    """``int(d)`` for a size a user or a rule gave, keeping a symbolic size symbolic."""
    return d if isinstance(d, SymInt) else int(d)


def slice_indices(start, stop, step, size: Dim) -> tuple:
    """``slice(start, stop, step).indices(size)`` where a bound or ``size`` may be symbolic
    (a positive step; a clamp that the >= 2 assumption cannot decide raises)."""
    step = 1 if step is None else step
    if isinstance(step, SymInt) or step <= 0:
        raise SymbolicDecisionError(f"a slice of a symbolic size needs a positive integer step, "
                                    f"got {step}")

    def bound(v, default):
        if v is None:
            return default
        if not isinstance(v, SymInt) and v < 0:
            v = size + v
            return 0 if v < 0 else v
        return size if v > size else v
    return bound(start, 0), bound(stop, size), step


def known_equal(a, b) -> bool:
    """Whether sizes (or shapes) ``a`` and ``b`` are equal for every binding: a fact, never
    an assumption (a symbol and an int are not known equal). For choices that only save
    work (a no-op slice, a simplification), where assuming would cost a guard."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and \
            all(known_equal(x, y) for x, y in zip(a, b))
    return _same(a, b)


def known_multiple(d: Dim, n: int) -> bool:
    """Whether size (or stride, offset) ``d`` is a multiple of ``n`` for every binding: a
    fact, never an assumption (``B*64`` is a multiple of 4, ``B`` is not known to be). For
    code made once for every size, where a guard would cost a program per size."""
    if isinstance(d, SymInt):
        return all(c % n == 0 for _, c in d._terms)
    return d % n == 0


def at_hints(value):
    """An attribute value (a size, or tuples of them) with each symbolic size at its hint."""
    if isinstance(value, SymInt):
        return size_hint(value)
    if isinstance(value, (tuple, list)):
        return type(value)(at_hints(x) for x in value)
    return value


def holds_symbol(value) -> bool:
    """Whether an attribute value (a size, or tuples of them) holds a symbolic size."""
    if isinstance(value, SymInt):
        return True
    return isinstance(value, (tuple, list)) and any(holds_symbol(x) for x in value)


def evaluate_dim(d: Dim, bindings: dict) -> int:
    """``d``'s value under ``bindings`` (an int stays itself)."""
    return d.evaluate(bindings) if isinstance(d, SymInt) else d


def evaluate_shape(shape: tuple, bindings: dict) -> tuple[int, ...]:
    """A shape with every symbolic dim evaluated under ``bindings``."""
    return tuple(evaluate_dim(d, bindings) for d in shape)
