"""Index arithmetic of the values a kernel reads, written once for every backend.

A value inside a kernel is computed at a multi-index (one index register per dimension).
Broadcasting, reshapes, pads and concatenations only change that index; these functions
compute the operand's index from the result's with the builder's integer operations on
:data:`INDEX` registers (unsigned 64-bit: an index below a window's start wraps to a huge
value, so one unsigned comparison tests both bounds). ``b`` is a
:class:`fusegrad.ops.lowering.ScalarBuilder`.
"""

from __future__ import annotations

from typing import Callable, Sequence

from fusegrad.codegen.kernel_ir import INDEX
from fusegrad.ir.graph import Literal, Node
from fusegrad.ops import lowering

__all__ = ["operand_coords", "reshape_coords", "shifted", "pad_value", "take_value", "concat_value",
           "unravel", "linear_index"]


def operand_coords(b, op, out_shape: Sequence[int], coords: Sequence) -> list:
    """Coordinates of a broadcast operand: right-aligned, size-1 dims at index 0."""
    if isinstance(op, Literal):
        return []
    shape = op.type.shape
    lead = len(out_shape) - len(shape)
    zero = b.const(INDEX, 0)
    return [zero if d == 1 and out_shape[lead + i] != 1 else coords[lead + i]
            for i, d in enumerate(shape)]


def reshape_coords(b, src: Sequence[int], dst: Sequence[int], coords: Sequence) -> list:
    """Index of a reshape's operand (shape ``src``) from the result's (``dst``): unit dims
    dropped or inserted, else the linear index split again."""
    if [d for d in src if d != 1] == [d for d in dst if d != 1]:
        real = iter(c for c, d in zip(coords, dst) if d != 1)
        zero = b.const(INDEX, 0)
        return [zero if d == 1 else next(real) for d in src]
    return unravel(b, linear_index(b, coords, dst), src)


def linear_index(b, coords: Sequence, shape: Sequence[int]):
    """The row-major linear index of ``coords`` in ``shape``."""
    flat = b.const(INDEX, 0)
    for c, d in zip(coords, shape):
        flat = b.binary("add", b.binary("mul", flat, b.const(INDEX, d), INDEX), c, INDEX)
    return flat


def unravel(b, flat, shape: Sequence[int], bounded: bool = False) -> list:
    """The coordinates of linear index ``flat`` in ``shape`` (row-major). ``bounded``: the
    index is known to be below ``prod(shape)``, so the outermost coordinate needs no
    remainder and unit dims are 0."""
    out = []
    for i in range(len(shape) - 1, -1, -1):
        d = shape[i]
        if bounded and d == 1:
            out.append(b.const(INDEX, 0))
            continue
        if bounded and all(x == 1 for x in shape[:i]):
            out.append(flat)
            break
        out.append(b.binary("rem", flat, b.const(INDEX, d), INDEX))
        flat = b.binary("div", flat, b.const(INDEX, d), INDEX)
    out += [b.const(INDEX, 0)] * (len(shape) - len(out))
    return list(reversed(out))


def shifted(b, c, start: int, size: int):
    """``(c - start, whether 0 <= c - start < size)``, the index clamped to 0 outside, so
    that a load at it stays in bounds and a select can discard it."""
    if size == 1:
        # Index 0 as a constant: a load through it is seen to be invariant in loops.
        return b.const(INDEX, 0), b.cmp("eq", c, b.const(INDEX, start), INDEX)
    i = b.binary("sub", c, b.const(INDEX, start), INDEX) if start else c
    inside = b.cmp("lt", i, b.const(INDEX, size), INDEX)
    return b.select(inside, i, b.const(INDEX, 0), INDEX), inside


def pad_value(b, node: Node, coords: Sequence, emit: Callable):
    """The value of a ``pad`` at ``coords``: its operand inside, the pad value outside.
    ``emit(value, coords)`` gives an operand's register."""
    src = node.inputs[0]
    dt = node.output.type.dtype
    fill = lowering.constant(b, dt, node.attrs["value"])
    if 0 in src.type.shape:
        return fill
    inside, src_coords = None, []
    for c, (lo, _), d in zip(coords, node.attrs["widths"], src.type.shape, strict=True):
        i, ok = shifted(b, c, lo, d)
        src_coords.append(i)
        inside = ok if inside is None else b.binary("and", inside, ok, _BOOL)
    x = emit(src, src_coords)
    return x if inside is None else b.select(inside, x, fill, lowering.register_dtype(dt))


def take_value(b, node: Node, coords: Sequence, emit: Callable):
    """The value of a ``take`` at ``coords``: its operand at the index read from the index
    operand. Fusion lowers only takes whose indices a ``check_index`` of the axis's size
    produced (the check runs first and raises for any index outside ``[0, size)``), so the
    load stays in bounds without a test of its own."""
    x, idx = node.inputs
    axis = node.attrs["axis"]
    n = len(idx.type.shape)
    i = emit(idx, list(coords[axis:axis + n]))
    at = lowering.convert(b, i, idx.type.dtype, INDEX)
    return emit(x, list(coords[:axis]) + [at] + list(coords[axis + n:]))


def concat_value(b, node: Node, coords: Sequence, emit: Callable):
    """The value of a ``concat`` at ``coords``: a select over its operands, each loaded at
    an index clamped into its bounds."""
    axis = node.attrs["axis"]
    dt = node.output.type.dtype
    parts, start = [], 0
    for x in node.inputs:
        size = x.type.shape[axis]
        if size:
            parts.append((x, start, size))
        start += size
    if len(parts) > 16:
        raise lowering.Unsupported("concat of more than 16 operands (every element would "
                                   "load all)")
    c = coords[axis]
    if c.op == "const":
        # A constant index (a loop cut per operand, of one iteration): that operand alone.
        for x, start, size in parts:
            if start <= c.arg < start + size:
                at = b.const(INDEX, c.arg - start)
                return emit(x, list(coords[:axis]) + [at] + list(coords[axis + 1:]))
    out = None
    for x, start, size in reversed(parts):
        i, inside = shifted(b, c, start, size)
        value = emit(x, list(coords[:axis]) + [i] + list(coords[axis + 1:]))
        out = value if out is None else b.select(inside, value, out,
                                                 lowering.register_dtype(dt))
    # An empty result: the loop body that would use this never runs.
    return out if out is not None else lowering.constant(b, dt, 0)


_BOOL = lowering.dtypes.bool_
