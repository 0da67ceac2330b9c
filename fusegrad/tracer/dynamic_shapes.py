"""Symbolic dimensions of a compiled function's arguments: which dims a call traces as
symbols, the call-cache key that matches every size of them, and what the trace assumed.

Which dims are symbolic (torch.compile's ``dynamic`` option):

- ``dynamic=False``: none; every shape is static (a new size is a new compile).
- ``dynamic=True``: every dim of every tensor argument, from the first call.
- ``dynamic=None`` (the default, torch's "automatic dynamic"): the dims marked with
  :func:`mark_dynamic`, and each dim that a later compile sees with another size than the
  first compile did: that recompile traces it as a symbol, and later sizes reuse it.

A dim of size 0 or 1 is never a symbol (torch's 0/1 specialization: a size of 1 changes
broadcasting); equal sizes among the symbolic dims of one call share one symbol (torch's
duck sizing: ``x: [s0, 784]`` and ``y: [s0]``), named ``s0``, ``s1``, ... in order. The
call-cache key (:func:`symbolic_key`) writes those names for the sizes, so it matches every
call with sizes of at least 2 in the same equality pattern. What the trace assumed beyond
that (a comparison ``s0 == 784`` that it took to be False) is guarded per call
(:class:`SymbolicSignature`); a failing assumption names the dim, and that call compiles
specialized to its sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fusegrad.symint import COMPARE, MIN_SYMBOL_SIZE, SymInt, evaluate_dim, symbol
from fusegrad.tensor import Tensor

__all__ = ["mark_dynamic", "marked_dims", "choose_symbols", "symbolic_key", "SymbolicSignature",
           "dim_name"]


def mark_dynamic(t: Tensor, index, *, min: int | None = None,  # noqa: A002
                 max: int | None = None) -> None:              # noqa: A002
    """Mark dim ``index`` (an int or a list of ints) of ``t`` dynamic: a compiled function
    called with ``t`` traces that dim as a symbol, so one compile serves every size of it
    (torch's ``torch._dynamo.mark_dynamic``). ``min``/``max`` are accepted as bounds of the
    size; a size below 2 still specializes."""
    indices = [index] if isinstance(index, int) else list(index)
    for i in indices:
        if not -t.dim() <= i < t.dim():
            raise IndexError(f"mark_dynamic: Dimension out of range (expected to be in range of "
                             f"[{-t.dim()}, {t.dim() - 1}], but got {i})")
    marks = set(getattr(t, "_dynamo_dynamic_indices", ()))
    marks.update(i % t.dim() for i in indices)
    t._dynamo_dynamic_indices = marks


def marked_dims(leaves) -> set[tuple[int, int]]:
    """``(leaf index, dim)`` of the dims the arguments were marked dynamic in."""
    out = set()
    for i, t in enumerate(leaves):
        marks = getattr(t, "_dynamo_dynamic_indices", None)
        if marks:
            out.update((i, d) for d in marks)
    return out


def dim_name(names: list[str], i: int, d: int) -> str:
    """``x.size(0)``: the dim in words, by the argument's name."""
    return f"{names[i] if i < len(names) else f'argument {i}'}.size({d})"


def choose_symbols(leaves, dims: set[tuple[int, int]]) -> dict[int, dict[int, SymInt]]:
    """The symbols of a call whose ``dims`` ((leaf index, dim)) are symbolic: {leaf index:
    {dim: symbol}}; sizes below 2 stay static, equal sizes share a symbol."""
    by_size: dict[int, SymInt] = {}
    out: dict[int, dict[int, SymInt]] = {}
    for i, d in sorted(dims):
        if i >= len(leaves) or d >= leaves[i].dim():
            continue
        n = leaves[i].shape[d]
        if n < MIN_SYMBOL_SIZE:
            continue
        s = by_size.get(n)
        if s is None:
            s = by_size[n] = symbol(f"s{len(by_size)}", n)
        out.setdefault(i, {})[d] = s
    return out


def symbolic_key(key: tuple, first_leaf: int, symbols: dict[int, dict[int, SymInt]]) -> tuple:
    """``key`` (see :func:`~fusegrad.tracer.call_cache.call_key`; tensor argument ``i`` is
    part ``first_leaf + i``, its shape first) with each symbolic size written as its
    symbol's name."""
    if not symbols:
        return key
    parts = list(key)
    for i, dims in symbols.items():
        part = parts[first_leaf + i]
        shape = tuple(dims[d].name if d in dims else n for d, n in enumerate(part[0]))
        parts[first_leaf + i] = (shape,) + tuple(part[1:])
    return tuple(parts)


@dataclass
class SymbolicSignature:
    """What a symbolic entry was traced with: the symbols of its arguments' dims, their
    names in words (``x.size(0)``), and what the trace assumed of them (``(expression, op,
    value)``, see :func:`~fusegrad.symint.record_assumptions`)."""

    symbols: dict[int, dict[int, SymInt]]
    names: dict[str, str] = field(default_factory=dict)      # symbol -> "x.size(0)"
    assumptions: list = field(default_factory=list)
    # The sizes (sorted (symbol, int) pairs) whose programs are built.
    ready: set = field(default_factory=set)

    def bindings(self, leaves) -> dict[str, int]:
        """Each symbol's size in a call with tensor arguments ``leaves``."""
        out: dict[str, int] = {}
        for i, dims in self.symbols.items():
            shape = leaves[i].shape
            for d, s in dims.items():
                out.setdefault(s.name, shape[d])
        return out

    def failing(self, leaves) -> str | None:
        """The first assumption a call with ``leaves`` breaks, in words; None if all hold."""
        if not self.assumptions:
            return None
        values = self.bindings(leaves)
        for expr, op, other in self.assumptions:
            got = expr.evaluate(values)
            if not COMPARE[op](got, evaluate_dim(other, values)):
                return (f"the symbolic trace assumed {self.describe(expr)} {op} "
                        f"{self.describe(other)}, but {self.describe(expr)} is {got} in this call")
        return None

    def failing_at_hints(self) -> str | None:
        """An assumption that the traced call itself breaks (the trace compared a size with
        its own value): such a trace is not valid for its own sizes."""
        for expr, op, other in self.assumptions:
            at = other.hint() if isinstance(other, SymInt) else other
            if not COMPARE[op](expr.hint(), at):
                return (f"the trace took {self.describe(expr)} {op} {self.describe(other)} at "
                        f"size {expr.hint()}")
        return None

    def describe(self, expr) -> str:
        """``x.size(0)`` for a bare symbol, else the expression with the dims it reads."""
        if not isinstance(expr, SymInt):
            return str(expr)
        name = expr.name
        if name is not None and name in self.names:
            return f"{self.names[name]} ({name})"
        reads = ", ".join(f"{s} = {self.names.get(s, s)}" for s in sorted(expr.free_symbols()))
        return f"{expr} (with {reads})"
