"""How close the fuzzer's results must be: :func:`tolerance` and :func:`compare`, and the
analysis of a program's values that decides where a difference is rounding, not a defect.

Values must agree exactly for integers and bools; NaN where eager has NaN and nowhere else;
infinities of the same sign; floats within a relative tolerance per dtype (:data:`RTOL`),
grown with the number of ops and with the square root of the elements summed, plus an
absolute tolerance proportional to the largest finite magnitude the output depends on (what
cancellation can leave). The analysis finds the values near a pole, a jump (a step function,
a division's wrap) or an overflow, where runs that round differently may legitimately part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

import fusegrad as fg
from fusegrad.testing.programs import Op, Program, namespace, op_name

__all__ = ["RTOL", "tolerance", "compare"]

# Base relative tolerance per float dtype: a few units in the last place of one op.
RTOL = {"float64": 1e-11, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


# --------------------------------------------------------------------------- comparison


def _np64(t) -> np.ndarray:
    a = t.detach().numpy() if isinstance(t, fg.Tensor) else np.asarray(t)
    if a.dtype == ml_dtypes.bfloat16 or a.dtype == np.float16:
        a = a.astype(np.float32)
    return a


def tolerance(dtype: str, n_ops: int, n_summed: int, magnitude: float) -> tuple[float, float]:
    """(rtol, atol) for a float output of ``dtype`` computed by ``n_ops`` ops, summing up to
    ``n_summed`` elements into one, from values of at most ``magnitude`` (finite)."""
    rtol = RTOL[dtype] * (1 + 0.5 * n_ops) * math.sqrt(max(n_summed, 1))
    tiny = float(fg.finfo(getattr(fg, dtype)).tiny)
    return rtol, rtol * magnitude + 4 * tiny


def compare(got, want, rtol: float, atol: float, unordered: bool = False) -> str | None:
    """None if tensor ``got`` matches ``want``; else what differs, at the worst element.
    ``unordered``: the output depends on a product that can overflow or underflow on the way,
    whose order decides whether it ends at inf, 0 or NaN. Float elements where either side is
    inf, NaN or 0 are not compared and the others by sign only: a partial product that passes
    through the subnormals keeps only its leading bits (in float32 ``2.2e-35 * 2.5e-8`` is 398
    times 2**-149, one more factor of 3.5e-3 makes 1.4 times 2**-149, rounded to 1: 29% low).
    An integer or bool output (``isnan`` of such a product) is not compared."""
    if got is None or want is None:
        return None if got is want else f"got {got!r}, expected {want!r}"
    if got.dtype is not want.dtype:
        return f"dtype {got.dtype.name}, expected {want.dtype.name}"
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    g, w = _np64(got), _np64(want)
    if not want.dtype.is_floating_point:
        if unordered:
            return None     # isnan of such a product, say: the order decides every element
        bad = np.argwhere(g != w)
        if len(bad):
            i = tuple(bad[0])
            return f"{len(bad)} of {w.size} differ; at {list(i)}: {g[i]!r}, expected {w[i]!r}"
        return None
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    nan_g, nan_w = np.isnan(g64), np.isnan(w64)
    finite = np.isfinite(g64) & np.isfinite(w64)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(finite, np.abs(g64 - w64) - (atol + rtol * np.abs(w64)), 0.0)
    bad = (nan_g != nan_w) | (~finite & ~nan_g & ~nan_w & (g64 != w64)) | (err > 0)
    if unordered:
        bad &= finite & (g64 != 0) & (w64 != 0) & (np.sign(g64) != np.sign(w64))
    if not bad.any():
        return None
    score = np.where(bad, np.where(finite, err, np.inf), -np.inf)
    i = np.unravel_index(int(np.argmax(score)), w.shape) if w.ndim else ()
    return (f"{int(bad.sum())} of {w.size} differ; worst at {list(i)}: {g64[i]!r}, expected "
            f"{w64[i]!r} (rtol {rtol:.2g}, atol {atol:.2g})")


def _flat(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


# --------------------------------------------------------------------------- analysis


def _ancestors(program: Program, i: int) -> set[int]:
    seen, stack = set(), [i]
    while stack:
        j = stack.pop()
        if j in seen:
            continue
        seen.add(j)
        node = program.nodes[j]
        if isinstance(node, Op):
            stack.extend(node.args)
    return seen


def _finite_max(t) -> float:
    if t is None or not isinstance(t, fg.Tensor) or not t.dtype.is_floating_point:
        return 0.0
    a = _np64(t).astype(np.float64)
    a = np.abs(a[np.isfinite(a)])
    return float(a.max()) if a.size else 0.0


def _all_values(program: Program, arrays: list[np.ndarray], fg_module=None) -> list:
    """Every node's value, eagerly (after the whole program ran: in-place ops show)."""
    every = Program(program.nodes, list(range(len(program.nodes))))
    body = every.source().replace("def program(", "def program_all(")
    scope = dict(namespace(fg_module))
    exec(compile(body, "<fuzz program>", "exec"), scope)  # noqa: S102
    ins = [fg.from_numpy(a.copy()) for a in arrays]
    with fg.no_grad():
        return list(scope["program_all"](*ins))


@dataclass
class _Scale:
    n_ops: int
    n_summed: int
    magnitude: float
    dtype: str | None = None     # the least precise float dtype the output depends on
    unordered: bool = False      # depends on a product whose order decides inf, 0 or NaN
    jump: bool = False           # depends on a step, or a pole or comparison at rounding noise


# Ops whose result can cancel: an error of one ulp of their operands is an absolute error
# of that size in the result, however small the result. A remainder is its dividend less a
# multiple of the divisor: cos(x) % 0.001 keeps cos's error of 6e-8, 6e-5 of a 1e-3 result.
# So do sin, cos and tan, whose argument is reduced by multiples of pi/2: an error of one ulp
# of an argument of 158 (seed 20261205, program 3509: sin(-7 ** layer_norm(x))) is 1.5e-5 in
# the result, 2.6e-5 of a result of 0.59.
CANCELLING = {"add", "sub", "+", "-", "sum", "mean", "var", "std", "logsumexp", "matmul",
              "softmax", "log_softmax", "layer_norm", "add_", "sub_", "where", "cat",
              "fmod", "remainder", "%", "sin", "cos", "tan"}


def _summed(program: Program, values: list) -> dict[int, int]:
    """Per reducing node: how many elements it sums into one."""
    summed = {}
    for i, node in enumerate(program.nodes):
        if isinstance(node, Op):
            src = values[node.args[0]]
            if node.kind == "reduce":
                summed[i] = max(1, src.numel() // max(1, values[i].numel()))
            elif node.kind == "softmax":
                summed[i] = int(src.shape[node.params[1]]) if src.ndim else 1
            elif node.kind == "layer_norm":
                summed[i] = math.prod(src.shape[-node.params[0]:])
            elif node.kind == "matmul":
                summed[i] = int(src.shape[-1])
    return summed


def _magnitude(program: Program, values: list, i: int, memo: dict) -> float:
    """The largest finite magnitude among the operands of the cancelling ops node ``i``
    depends on, times what multiplies their results on the way to ``i`` where that is more
    than 1: cancellation leaves an absolute error of an ulp of that size, and a product
    scales it (seed 20261211, program 680: log_softmax's -0.0009, 1e-4 off in relative
    terms from the order of its sum, times a 1e32 input)."""
    if i in memo:
        return memo[i]
    node = program.nodes[i]
    if not isinstance(node, Op):
        memo[i] = 0.0
        return 0.0
    inner = [_magnitude(program, values, a, memo) for a in node.args]
    m = max(inner, default=0.0)
    name = op_name(node)
    if name in CANCELLING:
        m = max([m] + [_finite_max(values[a]) for a in node.args])
    elif name in ("mul", "*", "mul_") and inner:
        if node.kind == "scalar":
            m = inner[0] * max(1.0, abs(float(node.params[1])))
        elif len(node.args) >= 2:
            m = max(inner[0] * max(1.0, _finite_max(values[node.args[1]])),
                    inner[1] * max(1.0, _finite_max(values[node.args[0]])))
    memo[i] = m
    return m


def _scale_of(program: Program, values: list, summed: dict, i: int) -> _Scale:
    """The ops node ``i`` depends on, the elements they sum, and the magnitude of the
    cancellation error it may carry (:func:`_magnitude`)."""
    anc = _ancestors(program, i)
    ops = [j for j in anc if isinstance(program.nodes[j], Op)]
    magnitude = _magnitude(program, values, i, {})
    floats = [values[j].dtype.name for j in anc if isinstance(values[j], fg.Tensor)
              and values[j].dtype.is_floating_point]
    least = max(floats, key=RTOL.__getitem__, default=None)
    return _Scale(len(ops), math.prod(summed.get(j, 1) for j in ops), magnitude, least)


def _scales(program: Program, values: list) -> list[_Scale]:
    """Per output: its :func:`_scale_of`, whether it depends on a product that can overflow
    on the way, and whether on a step or a pole met by a value within its rounding of it."""
    summed = _summed(program, values)
    out = []
    for i in program.outputs:
        scale = _scale_of(program, values, summed, i)
        ops = [j for j in _ancestors(program, i) if isinstance(program.nodes[j], Op)]
        scale.unordered = any(_overflows_on_the_way(program.nodes[j], values) for j in ops)
        scale.jump = any(_at_a_jump(program, values, j) or
                         _at_a_pole(program, values, summed, j) for j in ops)
        out.append(scale)
    return out


# Ops with a jump or a pole where an operand is 0 (a comparison: where the operands meet;
# sqrt: the edge of its domain, NaN below it).
POLES = {"log", "log2", "log10", "reciprocal", "rsqrt", "sqrt", "sign", "div", "/", "lt", "le",
         "gt", "ge", "eq", "ne", "where"}


def _at_a_pole(program: Program, values: list, summed: dict, j: int) -> bool:
    """Whether node ``j`` is a logarithm, reciprocal, sign, division or comparison whose
    operand (the divisor; for a comparison, the difference of its operands; for ``where``,
    its condition ``x > 0``) is within the absolute error that cancellation leaves in it of
    0: that operand is rounding noise whose sign and size depend on the order of a sum. Seed
    31415, program 2070 (max-ops 16): the mean of a layer norm's output, 0 up to rounding,
    selects in ``where(mean > 0, mean, y)`` a different side in the CUDA kernel's order than
    in eager's; ``log`` of the same sum is -17.3 in one order and -inf in another. Seed
    20261207, program 372: ``sqrt`` of a layer norm's output, an element 0 in one order
    and below 0 (NaN) in the other."""
    node = program.nodes[j]
    name = op_name(node)
    if name not in POLES:
        return False
    if node.kind == "where":
        if node.params[0]:
            return False            # a bool condition: exact, or flagged where it was made
        args, sub = node.args[:1], False
    elif name in ("div", "/"):
        if node.kind == "scalar":
            sym, c, reflected = node.params
            if not reflected:
                return False        # x / c: no pole
            args, sub = node.args[:1], False
        else:
            args, sub = node.args[1:2], False
    elif node.kind == "binary":
        args, sub = node.args[:2], True
    elif node.kind == "unary":
        args, sub = node.args[:1], False
    else:
        return False
    operands = [values[a] for a in args]
    if not all(isinstance(t, fg.Tensor) and t.dtype.is_floating_point for t in operands):
        return False
    scales = [_scale_of(program, values, summed, a) for a in args]
    if not any(s.magnitude for s in scales):
        return False                # no cancelling op on the way: no cancellation noise
    atol = sum(tolerance(s.dtype or "float32", s.n_ops, s.n_summed, s.magnitude)[1]
               for s in scales)
    with np.errstate(all="ignore"):
        arrays = [_np64(t).astype(np.float64) for t in operands]
        d = np.subtract(*np.broadcast_arrays(*arrays)) if sub else arrays[0]
    return bool((np.abs(d[np.isfinite(d)]) <= atol).any())


# Ops whose float result is rounded (not exact): a few ulp apart between eager and compiled.
INEXACT = {"exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sin", "cos", "tan",
           "tanh", "sigmoid", "erf", "sqrt", "rsqrt", "pow", "**", "/", "div", "reciprocal",
           "gelu", "silu", "softplus", "softmax", "log_softmax", "layer_norm", "mean", "var",
           "std", "logsumexp", "sum", "prod", "matmul"}
# Float-to-integer steps: where their float operand is within a few ulp of an integer, a
# correctly rounded difference of one ulp moves the result by one.
STEPS = {"cast", "floor", "ceil", "trunc", "round"}


DIVISIONS = {"fmod", "remainder", "floor_divide", "//", "%"}


def _inexact(program: Program, i: int) -> bool:
    return any(op_name(program.nodes[a]) in INEXACT for a in _ancestors(program, i)
               if isinstance(program.nodes[a], Op))


def _division_at_a_jump(program: Program, values: list, j: int) -> bool:
    """Whether node ``j`` (fmod, remainder, floor division) divides operands from inexact
    math where the quotient is within tolerance of an integer (the floor can take either
    side) or so large that one ulp of the divisor moves the remainder by more than its size
    (``remainder(x, y)`` with ``x / y`` ~ 1e8 in float32)."""
    node = program.nodes[j]
    if not any(_inexact(program, a) for a in node.args):
        return False
    operands = [_np64(values[a]).astype(np.float64) for a in node.args]
    if node.kind == "scalar":
        sym, c, reflected = node.params
        operands = [np.float64(c), operands[0]] if reflected else [operands[0], np.float64(c)]
    if len(operands) != 2:
        return False
    dt = values[j].dtype.name if values[j].dtype.is_floating_point else "float32"
    rtol = RTOL.get(dt, RTOL["float32"]) * (1 + 0.5 * len(program.ops))
    with np.errstate(all="ignore"):
        q = np.asarray(operands[0] / operands[1])
    q = q[np.isfinite(q)]
    # A quotient near 0 keeps its sign (and floor) under a rounding error: no jump there.
    near = (np.abs(q - np.round(q)) <= rtol * np.maximum(1.0, np.abs(q))) & (np.round(q) != 0)
    return bool((np.abs(q) * rtol >= 0.5).any() or near.any())


def _at_a_jump(program: Program, values: list, j: int) -> bool:
    """Whether node ``j`` is a float-to-integer step whose float operand comes from inexact
    math and holds a value within the float tolerance of an integer (or, for ``round``, of
    a half-integer): ``log(exp(1))`` is 0.99999994 in eager, 1.0 compiled, within 1 ulp,
    and truncates to 0 and 1."""
    node = program.nodes[j]
    if op_name(node) in DIVISIONS:
        return _division_at_a_jump(program, values, j)
    if op_name(node) not in STEPS:
        return False
    src = values[node.args[0]]
    if not isinstance(src, fg.Tensor) or not src.dtype.is_floating_point or \
            not _inexact(program, node.args[0]):
        return False
    a = _np64(src).astype(np.float64)
    a = a[np.isfinite(a)]
    if op_name(node) == "round":
        a = a * 2
    rtol = RTOL[src.dtype.name] * (1 + 0.5 * len(program.ops))
    return bool((np.abs(a - np.round(a)) <= rtol * np.maximum(1.0, np.abs(a))).any())


def _product_overflows(t, dims=None) -> bool:
    """Whether a product of elements of ``t`` (over ``dims``; None: all) can leave its float
    dtype's range on the way: then inf, 0 or NaN (inf * 0) depends on the order of the
    multiplications, which numpy, torch and a vectorized or tree reduction choose
    differently. The order that multiplies the large factors first reaches the product of
    all factors above 1 (and the small ones first, that of all below 1): seed 1202, program
    1533, a float32 product of 32 values holding two 9.2e18 and two -9.2e17 and a zero is 0
    in eager and NaN in the CUDA kernel's order, though no two factors overflow together."""
    if not isinstance(t, fg.Tensor) or not t.dtype.is_floating_point:
        return False
    a = np.abs(_np64(t).astype(np.float64))
    if np.isinf(a).any() or np.isnan(a).any():
        return True
    if a.ndim and dims is not None:
        axes = [d % a.ndim for d in dims]
        a = np.moveaxis(a, axes, list(range(a.ndim - len(axes), a.ndim)))
        a = a.reshape(-1, math.prod(a.shape[a.ndim - len(axes):]))
    else:
        a = a.reshape(1, -1)
    info = fg.finfo(t.dtype)
    nonzero = a[a > 0]
    with np.errstate(over="ignore", under="ignore"):
        # The rule's first form, kept: the largest (or smallest) factor of the whole tensor
        # squared leaves the range. It flags more than any order can reach (1e30, 1e-30
        # and 2 in bfloat16), which only makes the comparison looser.
        if nonzero.size >= 2 and (nonzero.max() ** 2 > float(info.max) or
                                  nonzero.min() ** 2 < float(info.tiny)):
            return True
    logs = np.log(np.where(a > 0, a, 1.0))
    return bool((np.where(logs > 0, logs, 0.0).sum(axis=1) > math.log(float(info.max))).any()
                or (np.where(logs < 0, logs, 0.0).sum(axis=1) <
                    math.log(float(info.tiny))).any())


# Ops that square their input on the way (a variance).
SQUARING = {"var", "std", "layer_norm"}


def _overflows_on_the_way(node, values: list) -> bool:
    """Whether ``node`` is a product (``prod``) or a matmul whose terms can leave the float
    range: a matmul's sum of an overflowing +inf and -inf term is NaN with separate
    multiplies and adds (the CUDA kernels, spelled without contraction) and -inf or +inf
    in a BLAS that fuses them (the exact product never rounds to inf inside an FMA). Or a
    variance whose sum of squares can overflow: after it, ``rstd = 0`` meets terms that
    overflowed too, and whether a gradient is 0 or NaN depends on the formula (seed 1207,
    program 662: a float32 ``layer_norm`` over a window holding 2**127; its gradient is 0
    in eager, NaN compiled and in torch)."""
    if op_name(node) == "prod":
        dims = node.params[1] if node.kind == "reduce" else None
        return _product_overflows(values[node.args[0]], dims)
    if op_name(node) in SQUARING:
        x = values[node.args[0]]
        if not (isinstance(x, fg.Tensor) and x.dtype.is_floating_point):
            return False
        m = _finite_max(x)
        return m * m * max(x.numel(), 1) > float(fg.finfo(x.dtype).max)
    if node.kind != "matmul":
        return False
    a = values[node.args[0]]
    b = values[node.args[1]] if len(node.args) > 1 else a     # x @ x.mT
    if not all(isinstance(t, fg.Tensor) and t.dtype.is_floating_point for t in (a, b)):
        return False
    mags = [np.abs(_np64(t).astype(np.float64)) for t in (a, b)]
    if not all(np.isfinite(m).all() for m in mags):
        return True
    with np.errstate(over="ignore"):
        largest = mags[0].max(initial=0.0) * mags[1].max(initial=0.0)
    return bool(largest > fg.finfo(a.dtype).max)
