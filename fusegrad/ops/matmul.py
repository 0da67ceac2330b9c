"""Contractions: matmul and its torch spellings (mm, bmm, dot, mv, outer), and einsum."""

from __future__ import annotations

import builtins
import math

from fusegrad import dtypes
from fusegrad.ops import prims as P
from fusegrad.ops import reductions
from fusegrad.ops.composite import CustomVJP, _named, composite
from fusegrad.ops.elementwise import mul
from fusegrad.ops.movement import diagonal, permute, reshape, reshape_prim, unsqueeze
from fusegrad.ops.operands import _at_user_line, cast
from fusegrad.ops.primitive import bind
from fusegrad.ops.prims_reduce import gemm_enabled
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor


def matmul_nd(a: Tensor, b: Tensor) -> Tensor:
    return bind(P.matmul, a, b)


# The float32 sums of a product of 16-bit operands, before any rounding: what torch's
# bf16/f16 addmm and convolution add their bias to, rounding once (``round(a @ b + bias)``,
# where a product rounded first and the bias added to it would round twice). The value widens
# the operands (exactly) for a float32 product; the gradient is the 16-bit products': the
# cotangent of the sums rounded to the operands' dtype, times the other operand, summed in
# float32 and rounded once. It too is a float32 product of widened operands, so that fusion
# puts the roundings and widenings into the kernels around it (a weight's gradient is rounded
# and widened back for the optimizer in the product's epilogue) rather than in passes of
# their own. It reads the activation operand through a remat barrier (``recompute``), so a
# backward holds its 16-bit value, not the forward's float32 copy; the weight's float32
# widening is the forward's, kept (torch's autocast keeps a weight's cast for the step too).
def _widened_product_vjp(g: Tensor, out: Tensor, operands: tuple, params: tuple) -> tuple:
    a, b = operands
    (b_transposed,) = params
    if gemm_enabled():
        # The generated GEMM multiplies 16-bit operands as they are (vdpbf16ps at twice the
        # float32 rate where the CPU has it): the 16-bit products, each rounded once.
        g, b16 = cast(g, a.dtype), b.mT if b_transposed else b
        ga, gb = (P.matmul.cotangent(i, g, None, (a, b16), {}) for i in (0, 1))
        return ga, gb.mT if b_transposed else gb
    f32 = dtypes.float32
    g, wa, wb = cast(cast(g, a.dtype), f32), cast(a, f32), cast(b, f32)
    wide = (wa, wb.mT if b_transposed else wb)
    ga, gb = (cast(P.matmul.cotangent(i, g, None, wide, {}), a.dtype) for i in (0, 1))
    return ga, gb.mT if b_transposed else gb


_WIDENED_PRODUCTS = {i: CustomVJP(f"widened_product_{i}", reads_output=False, recompute=(i,))
                     for i in (0, 1)}
for _rule in _WIDENED_PRODUCTS.values():
    _rule.defvjp(_widened_product_vjp)


def float32_sums(a: Tensor, b: Tensor, activation: int = 0, b_transposed: bool = False) -> Tensor:
    """``a @ b`` (``a @ b.mT`` when ``b_transposed``) of two float16 or bfloat16 operands
    (batched as ``matmul``), in float32: the sums before the one rounding that a product
    with a bias added rounds them by. ``activation``: which operand (0 or 1) a backward
    reads in 16 bits (the other, a weight, it reads widened, as the forward widened it).
    ``b_transposed`` widens ``b`` in its own layout (a linear's weight: the product reads
    the transpose as a view; a widening of the transposed view would read it across)."""
    wb = cast(b, dtypes.float32)
    wide = matmul_nd(cast(a, dtypes.float32), wb.mT if b_transposed else wb)
    return _WIDENED_PRODUCTS[activation].mark(wide, (a, b), (b_transposed,))


@public(torch=True, method=True)
def matmul(x: Tensor, other: Tensor) -> Tensor:
    """Matrix product with torch's rules for 1-D, 2-D and batched (broadcast) operands."""
    for position, (name, t) in enumerate((("input", x), ("other", other)), 1):
        if not isinstance(t, Tensor):
            raise TypeError(f"matmul(): argument '{name}' (position {position}) must be Tensor, "
                            f"not {type(t).__name__}")
    if x.ndim == 0 or other.ndim == 0:
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are "
                           f"{x.ndim}D and {other.ndim}D")
    if x.dtype is not other.dtype:
        # torch promotes no matmul operand (float32 @ float64 is an error, not a float64).
        raise RuntimeError(P.matmul_dtype_message(x._type(), other._type()) + _at_user_line(x, other))
    a, b = x, other
    if a.dtype is dtypes.bool_:
        raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Bool\'')
    if a.ndim == 1 and b.ndim == 1:
        if a.shape[0] != b.shape[0]:
            raise RuntimeError(f"inconsistent tensor size, expected tensor [{a.shape[0]}] and src "
                               f"[{b.shape[0]}] to have the same number of elements, but got "
                               f"{a.shape[0]} and {b.shape[0]} elements respectively")
        return _named(_dot(a, b), "DotBackward0")
    if a.ndim == 1:
        out = matmul_nd(reshape_prim(a, (1, a.shape[0])), b)
        return reshape_prim(out, tuple(out.shape[:-2]) + (out.shape[-1],))
    if b.ndim == 1:
        _check_mm(a, b)
        out = matmul_nd(a, reshape_prim(b, (b.shape[0], 1)))
        return _named(reshape_prim(out, tuple(out.shape[:-1])), "MvBackward0")
    _check_mm(a, b)
    out = matmul_nd(a, b)
    if a.ndim > 2 or b.ndim > 2:
        _named(out, "BmmBackward0")
    return out


@composite("DotBackward0")
def _dot(a, b):
    return reshape_prim(matmul_nd(reshape_prim(a, (1, a.shape[0])), reshape_prim(b, (b.shape[0], 1))),
                        ())


def _check_mm(a: Tensor, b: Tensor) -> None:
    k_b = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if a.shape[-1] != k_b:
        if b.ndim == 1:
            raise RuntimeError(f"size mismatch, got input ({a.shape[-2]}), mat ({a.shape[-2]}x"
                               f"{a.shape[-1]}), vec ({b.shape[0]})")
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({a.shape[-2]}x"
                           f"{a.shape[-1]} and {b.shape[-2]}x{b.shape[-1]})")


@public(torch=True, method=True)
def mm(x: Tensor, other: Tensor) -> Tensor:
    if x.ndim != 2 or other.ndim != 2:
        raise RuntimeError(f"{'self' if x.ndim != 2 else 'mat2'} must be a matrix")
    return matmul(x, other)


@public(torch=True, method=True)
def bmm(x: Tensor, other: Tensor) -> Tensor:
    if x.ndim != 3 or other.ndim != 3:
        raise RuntimeError("batch1 must be a 3D tensor" if x.ndim != 3 else
                           "batch2 must be a 3D tensor")
    if x.shape[0] != other.shape[0]:
        raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: "
                           f"[{x.shape[0]}, {x.shape[2]}] but got: [{other.shape[0]}, "
                           f"{other.shape[1]}].")
    return matmul(x, other)


@public(torch=True, method=True)
def dot(x: Tensor, other: Tensor) -> Tensor:
    if x.ndim != 1 or other.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {x.ndim}D and {other.ndim}D tensors")
    return matmul(x, other)


@public(torch=True, method=True)
def mv(x: Tensor, vec: Tensor) -> Tensor:
    if x.ndim != 2 or vec.ndim != 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got 1, {x.ndim}, {vec.ndim}")
    return matmul(x, vec)


@public(torch=True, method=True)
def outer(x: Tensor, other: Tensor) -> Tensor:
    for name, t in (("self", x), ("vec2", other)):
        if t.ndim != 1:
            raise RuntimeError(f"outer: Expected 1-D argument {name}, but got {t.ndim}-D")
    return mul(unsqueeze(x, 1), unsqueeze(other, 0))


def _einsum_terms(equation: str, operands) -> tuple[list[str], str]:
    """Input terms and the output term of ``equation``, with ``...`` spelled out as one label
    per broadcast dim (labels from a private range, right-aligned as numpy broadcasts)."""
    _check_einsum_subscripts(equation)
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise RuntimeError(f"einsum(): {len(terms)} operands in the equation, but "
                           f"{len(operands)} were given")
    spans = []
    for term, x in zip(terms, operands):
        if "..." in term:
            spans.append(x.ndim - (len(term) - 3))
            if spans[-1] < 0:
                raise RuntimeError(f"einsum(): the operand of '{term}' has only {x.ndim} dims")
        elif len(term) != x.ndim:
            raise RuntimeError(f"einsum(): the number of subscripts in the equation ({len(term)}) "
                               f"does not match the number of dimensions ({x.ndim}) for operand "
                               f"{len(spans)}")
        else:
            spans.append(0)
    width = builtins.max(spans, default=0)
    dots = "".join(chr(0x2460 + i) for i in range(width))
    terms = [t.replace("...", dots[width - s:]) for t, s in zip(terms, spans)]
    if arrow:
        out = out.replace("...", dots)
    else:
        counts = {c: sum(t.count(c) for t in terms) for t in terms for c in t}
        out = dots + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in dots))
    for c in out:
        if not builtins.any(c in t for t in terms):
            raise RuntimeError(f"einsum(): output subscript {c} does not appear in the equation "
                               "for any input operand")
        if out.count(c) > 1:
            raise RuntimeError(f"einsum(): output subscript {c} appears more than once in the "
                               "output")
    _check_einsum_sizes(terms, operands, dots)
    return terms, out


def _check_einsum_subscripts(equation: str) -> None:
    """torch's alphabet: letters, and ``,`` ``...`` spaces and one ``->`` between them."""
    arrow = equation.find("->")
    for i, c in enumerate(equation):
        if c.isascii() and c.isalpha() or c in " ,." or arrow >= 0 and i in (arrow, arrow + 1):
            continue
        raise RuntimeError(f"einsum(): invalid subscript given at index {i} in the equation "
                           "string, subscripts must be in [a-zA-Z]")


def _check_einsum_sizes(terms: list[str], operands, dots: str) -> None:
    """torch's size rules for a label: equal sizes where it repeats within an operand (a
    diagonal), and sizes that broadcast (equal, or 1) across operands; else the products
    below would take a diagonal of a non-square block or reshape to a wrong size. (``dots``:
    the labels ``...`` was spelled out as.)"""
    seen: dict[str, int] = {}
    for i, (term, x) in enumerate(zip(terms, operands)):
        own: dict[str, int] = {}
        for c, n in zip(term, x.shape):
            if own.setdefault(c, n) != n:
                raise RuntimeError(f"einsum(): subscript {c} is repeated for operand {i} but "
                                   f"the sizes don't match, {n} != {own[c]}")
        for c, n in own.items():
            prev = seen.setdefault(c, n)
            if n != prev and 1 not in (n, prev):
                label = "..." if c in dots else c
                raise RuntimeError(f"einsum(): subscript {label} has size {n} for operand {i} which "
                                   f"does not broadcast with previously seen size {prev}")
            if prev == 1:
                seen[c] = n


def _einsum_diagonals(x: Tensor, term: str) -> tuple[Tensor, str]:
    """Take the diagonal for each label repeated within one term (``'ii->i'``)."""
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        i = term.index(c)
        j = term.index(c, i + 1)
        x = diagonal(x, 0, i, j)
        term = term[:i] + term[i + 1:j] + term[j + 1:] + c
    return x, term


def _sum_labels(x: Tensor, term: str, labels) -> tuple[Tensor, str]:
    axes = tuple(i for i, c in enumerate(term) if c in labels)
    if not axes:
        return x, term
    return reductions.sum(x, axes), "".join(c for c in term if c not in labels)


def _contract(a: Tensor, ta: str, b: Tensor, tb: str, keep: str) -> tuple[Tensor, str]:
    """``a`` and ``b`` multiplied and summed over their shared labels not in ``keep``: one
    batched matmul (batch: shared labels kept; rows: a's own; columns: b's own)."""
    shared = [c for c in ta if c in tb]
    for c in shared:   # a size-1 dim against a size-n one: sum the n side first (broadcast)
        na, nb = a.shape[ta.index(c)], b.shape[tb.index(c)]
        if na != nb and c not in keep:
            if na == 1:
                b = reductions.sum(b, tb.index(c), keepdim=True)
            elif nb == 1:
                a = reductions.sum(a, ta.index(c), keepdim=True)
    batch = [c for c in shared if c in keep]
    inner = [c for c in shared if c not in keep]
    if inner and a.dtype is dtypes.bool_:
        raise NotImplementedError('"bmm" not implemented for \'Bool\'')     # as torch
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    sa = dict(zip(ta, a.shape))
    sb = dict(zip(tb, b.shape))
    a = permute(a, [ta.index(c) for c in batch + left + inner])
    b = permute(b, [tb.index(c) for c in batch + inner + right])
    rows = math.prod(sa[c] for c in left)
    cols = math.prod(sb[c] for c in right)
    depth = math.prod(sa[c] for c in inner)
    a = reshape(a, tuple(sa[c] for c in batch) + (rows, depth))
    b = reshape(b, tuple(sb[c] for c in batch) + (depth, cols))
    out = matmul_nd(a, b)
    shape = tuple(out.shape[:len(batch)]) + tuple(sa[c] for c in left) + \
        tuple(sb[c] for c in right)
    return reshape(out, shape), "".join(batch + left + right)


def _einsum_sublists(*args) -> tuple[str, tuple]:
    """torch's sublist form, ``einsum(a, [0, 1], b, [1, 2], [0, 2])``, as an equation and
    its operands: labels are integers in [0, 52) (A-Z, then a-z, as torch spells them, which
    orders an implicit output as torch does) or ``...``."""
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

    def term(sublist) -> str:
        if not all(x is Ellipsis or isinstance(x, int) and 0 <= x < 52 for x in sublist):
            raise RuntimeError("einsum(): subscript in subscript list is not within the valid "
                               f"range [0, 52): {list(sublist)}")
        return "".join("..." if x is Ellipsis else letters[x] for x in sublist)

    pairs = len(args) // 2
    operands, sublists = args[0:2 * pairs:2], args[1:2 * pairs:2]
    equation = ",".join(term(sub) for sub in sublists)
    if len(args) % 2:           # an output sublist last
        equation += "->" + term(args[-1])
    return equation, operands


@public(torch=True)
def einsum(equation: str, *operands) -> Tensor:
    """Einstein summation, as ``torch.einsum``: ``einsum('bij,bjk->bik', a, b)``.

    Labels repeated within an operand take its diagonal; labels in no other operand and not
    in the output are summed first; then the operands are contracted left to right, each
    pair as one batched matmul; ``...`` broadcasts like numpy.
    """
    if not isinstance(equation, str):
        equation, operands = _einsum_sublists(equation, *operands)
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise RuntimeError("einsum(): must provide at least one operand")
    terms, out = _einsum_terms(equation, operands)
    ops = []
    for i, (x, term) in enumerate(zip(operands, terms)):
        x, term = _einsum_diagonals(x, term)
        others = out + "".join(t for j, t in enumerate(terms) if j != i)
        x, term = _sum_labels(x, term, [c for c in term if c not in others])
        ops.append((x, term))
    x, term = ops[0]
    for k in range(1, len(ops)):
        later = out + "".join(t for _, t in ops[k + 1:])
        x, term = _contract(x, term, ops[k][0], ops[k][1], later)
    x, term = _sum_labels(x, term, [c for c in term if c not in out])
    return permute(x, [term.index(c) for c in out]) if term != out else x
