"""Random valid fusegrad programs, as data.

A :class:`Program` is a list of nodes in creation order: :class:`Input` records (shape, dtype,
which family of values, a seed) and :class:`Op` records (a kind from :data:`OPS`, the ids of
the values it reads, plain parameters). It prints as fusegrad Python (:meth:`Program.source`)
and runs as a Python function (:meth:`Program.function`)::

    def program(v0, v2):
        v1 = v0.exp()
        v3 = fg.maximum(v1, v2)
        return v3

:func:`generate` builds a program from a :class:`Choices` source, a stream of bounded
integers. The same generator serves hypothesis (each integer is a hypothesis draw, so a
failure shrinks to a small program), a seeded ``random.Random`` (the command-line fuzzer) and
a replayed list of integers (its own shrinker). Every op is checked as it is drawn by running
it eagerly on zero-valued tensors of the operands' types: an op that eager rejects is drawn
again, so programs are valid by construction and no shape rule is written twice.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

import ml_dtypes
import numpy as np

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import dtypes

__all__ = ["Input", "Op", "Program", "Choices", "RandomChoices", "ReplayChoices", "generate",
           "DTYPES", "FLOAT_DTYPES", "OPS", "NON_SMOOTH", "make_array", "namespace"]

DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "bool")
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
HALF_DTYPES = ("float16", "bfloat16")
# Families of input values. "special" mixes, per element, zeros, -0.0, negatives, huge and
# tiny magnitudes, denormals, NaN and ±Inf with normal values; "normal" has none of them.
VALUE_KINDS = ("normal", "special", "positive", "wide")

MAX_ELEMENTS = 256


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Input:
    """A program argument: its type, how its values are drawn, and whether it requires grad."""

    shape: tuple[int, ...]
    dtype: str
    values: str = "normal"
    seed: int = 0
    requires_grad: bool = False


@dataclass(frozen=True)
class Op:
    """One statement: ``kind`` (a key of :data:`OPS`) applied to the values ``args`` with
    ``params`` (plain Python values)."""

    kind: str
    args: tuple[int, ...]
    params: tuple = ()


@dataclass
class Program:
    """Inputs and ops in creation order (a node's id is its index) and the returned ids."""

    nodes: list = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    @property
    def input_ids(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if isinstance(n, Input)]

    @property
    def inputs(self) -> list[Input]:
        return [n for n in self.nodes if isinstance(n, Input)]

    @property
    def ops(self) -> list[Op]:
        return [n for n in self.nodes if isinstance(n, Op)]

    def op_kinds(self) -> set[str]:
        """The op names the program uses (``exp``, ``sum``, ``add_``, ``cast``, ...)."""
        return {op_name(op) for op in self.ops}

    def dtypes(self) -> set[str]:
        """Every dtype of an input or of a cast in the program."""
        out = {n.dtype for n in self.inputs}
        out |= {op.params[0] for op in self.ops if op.kind == "cast"}
        return out

    def source(self, name: str = "program") -> str:
        """The program as fusegrad Python code."""
        params = ", ".join(f"v{i}" for i in self.input_ids)
        lines = [f"def {name}({params}):"]
        for i, node in enumerate(self.nodes):
            if isinstance(node, Op):
                lines.append(f"    v{i} = {render(node)}")
        outs = [f"v{i}" for i in self.outputs]
        lines.append(f"    return {', '.join(outs)}" + ("," if len(outs) == 1 and
                                                         self.multi_output else ""))
        return "\n".join(lines)

    @property
    def multi_output(self) -> bool:
        return len(self.outputs) > 1

    def inputs_source(self) -> str:
        """Python code that builds the inputs (``make_array`` reproduces the values)."""
        lines = [f"v{i} = fg.from_numpy(make_array({n!r}))"
                 + (".requires_grad_()" if n.requires_grad else "")
                 for i, n in zip(self.input_ids, self.inputs)]
        return "\n".join(lines)

    def function(self, ns: dict | None = None) -> Callable:
        """The program as a Python function (in namespace ``ns``; default :func:`namespace`)."""
        scope = dict(namespace() if ns is None else ns)
        exec(compile(self.source(), "<fuzz program>", "exec"), scope)  # noqa: S102
        return scope["program"]

    def arrays(self) -> list[np.ndarray]:
        """Fresh input arrays, in argument order."""
        return [make_array(n) for n in self.inputs]

    def __str__(self) -> str:
        return self.source()


def namespace(fg_module=None) -> dict:
    """The names a program's source uses: ``fg`` (fusegrad) and ``F`` (fusegrad.nn.functional)."""
    return {"fg": fg if fg_module is None else fg_module, "F": F}


# --------------------------------------------------------------------------- values


def _finfo(dtype: str):
    return ml_dtypes.finfo(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.finfo(dtype)


def make_array(spec: Input) -> np.ndarray:
    """The values of input ``spec`` (deterministic in its seed)."""
    rng = np.random.default_rng(spec.seed)
    n = math.prod(spec.shape)
    dt = dtypes.as_dtype(spec.dtype)
    if spec.dtype == "bool":
        flat = rng.random(n) < 0.5
    elif not dt.is_floating_point:
        info = np.iinfo(spec.dtype)
        flat = rng.integers(-9, 10, n).astype(np.int64)
        if spec.values == "positive":
            flat = np.abs(flat) + 1
        elif spec.values in ("special", "wide"):
            extra = np.array([0, -1, 1, info.max, info.min, 10**6, -(10**6), 65537, 255], np.int64)
            mask = rng.random(n) < 0.4
            flat[mask] = rng.choice(extra, int(mask.sum()))
    else:
        fi = _finfo(spec.dtype)
        flat = rng.standard_normal(n)
        if spec.values == "positive":
            flat = np.abs(flat) + 0.25
        elif spec.values == "wide":
            # log-uniform magnitudes over most of the dtype's range, both signs
            lo, hi = math.log10(float(fi.tiny)), math.log10(float(fi.max)) - 0.5
            flat = np.sign(flat) * 10.0 ** rng.uniform(lo, hi, n)
        elif spec.values == "special":
            specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, -1.0, 1.0, -2.5,
                                 float(fi.max) * 0.5, -float(fi.max) * 0.25, 1e4, -3e4,
                                 float(fi.tiny), float(fi.tiny) * 3, float(fi.smallest_subnormal),
                                 -float(fi.smallest_subnormal) * 5, 1e-3, 100.0])
            mask = rng.random(n) < 0.5
            flat[mask] = rng.choice(specials, int(mask.sum()))
    np_dtype = dt.np_dtype
    # (not np.ascontiguousarray: it turns a 0-d array into a 1-d one)
    return flat.astype(np_dtype).reshape(spec.shape).copy(order="C")


# --------------------------------------------------------------------------- choices


class Choices:
    """A source of bounded integers; everything a program is made of is drawn from it.

    ``spans`` records, for the shrinker, where the draws of each op start and end, and
    ``count_at`` where the number of ops was drawn.
    """

    position = 0
    spans: list
    count_at: int = -1

    def integer(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def choice(self, seq: Sequence):
        return seq[self.integer(0, len(seq) - 1)]

    def boolean(self) -> bool:
        return self.integer(0, 1) == 1

    def recent(self, candidates: Sequence[int]) -> int:
        """One of ``candidates`` (ids), the most recent one when the draw is minimal."""
        return candidates[len(candidates) - 1 - self.integer(0, len(candidates) - 1)]


class RandomChoices(Choices):
    """Integers from a seeded ``random.Random``; the draws are recorded in ``.drawn``."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.drawn: list[int] = []
        self.spans = []

    def integer(self, lo: int, hi: int) -> int:
        v = self.rng.randint(lo, hi)
        self.drawn.append(v - lo)
        self.position += 1
        return v


class ReplayChoices(Choices):
    """Replays recorded draws (offsets from each draw's lower bound, clamped to its range);
    past the end of the record every draw is its minimum."""

    def __init__(self, drawn: Sequence[int]):
        self.drawn = list(drawn)
        self.used: list[int] = []
        self.spans = []

    def integer(self, lo: int, hi: int) -> int:
        k = len(self.used)
        v = min(lo + self.drawn[k], hi) if k < len(self.drawn) else lo
        self.used.append(v - lo)
        self.position += 1
        return v


class HypothesisChoices(Choices):
    """Integers drawn from hypothesis's ``data`` object (so failures shrink)."""

    def __init__(self, data):
        from hypothesis import strategies as st  # optional: hypothesis (the test extra)
        self.data = data
        self.st = st
        self.spans = []

    def integer(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))


# --------------------------------------------------------------------------- rendering

UNARY = ("neg", "abs", "exp", "tanh", "sigmoid", "relu", "sin", "cos", "log", "sqrt", "erf",
         "reciprocal", "square", "sign", "floor", "ceil", "trunc", "round", "exp2", "log2",
         "log10", "log1p", "expm1", "tan", "rsqrt", "isnan", "isinf", "isfinite", "logical_not",
         "bitwise_not")
ACTIVATIONS = ("F.gelu({a})", "F.gelu({a}, approximate='tanh')", "F.silu({a})",
               "F.softplus({a})", "F.leaky_relu({a}, 0.1)", "{a}.clamp(-1.5, 2.0)",
               "{a}.clamp(min=0.5)", "{a}.clamp(max=-0.25)")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "lt", "le", "gt", "ge", "eq", "ne",
          "pow", "floor_divide", "remainder", "fmod", "logical_and", "logical_or",
          "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor")
SCALAR_OPS = ("+", "*", "-", "/", "**", "//", "%")
SCALARS = (2, 0.5, -1.5, 3, 0, 1e-3, -7, 1e4, 2.5)
REDUCTIONS = ("sum", "mean", "amax", "amin", "var", "std", "prod", "logsumexp", "argmax",
              "max", "all", "any", "argmin", "min")
INPLACE = ("add_", "mul_", "clamp_", "sub_", "relu_", "neg_")

# Ops whose result is not differentiable everywhere: finite differences skip programs that
# use them (a difference across a kink or a jump is not a derivative).
NON_SMOOTH = {"abs", "sign", "floor", "ceil", "trunc", "round", "relu", "relu_", "clamp",
              "clamp_", "maximum", "minimum", "amax", "amin", "max", "min", "argmax", "argmin",
              "floor_divide", "remainder", "fmod", "leaky_relu", "lt", "le", "gt", "ge", "eq",
              "ne", "where", "//", "%", "cast", "sqrt", "rsqrt", "log", "log2", "log10",
              "log1p", "pow", "**", "/", "div", "reciprocal", "tan", "std", "var", "prod",
              "layer_norm", "isnan", "isinf", "isfinite", "logical_not", "bitwise_not",
              "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
              "bitwise_xor", "all", "any", "gelu", "sort"}


def op_name(op: Op) -> str:
    """The user-level name of ``op`` (``exp``, ``+``, ``sum``, ``add_``, ``softmax``...)."""
    if op.kind in ("unary", "binary", "reduce", "inplace", "scalar"):
        return op.params[0]
    if op.kind == "activation":
        text = op.params[0]
        return text.split("(")[0].replace("F.", "").replace("{a}.", "")
    return op.kind


def _tuple(xs) -> str:
    xs = list(xs)
    return "(" + ", ".join(map(str, xs)) + ("," if len(xs) == 1 else "") + ")"


def _slice_text(s: tuple) -> str:
    start, stop, step = s
    text = ("" if start is None else str(start)) + ":" + ("" if stop is None else str(stop))
    return text + (f":{step}" if step not in (None, 1) else "")


def render(op: Op) -> str:
    """The Python expression of ``op`` (operands named ``v<id>``)."""
    a = [f"v{i}" for i in op.args]
    p = op.params
    k = op.kind
    if k == "unary":
        return f"{a[0]}.{p[0]}()"
    if k == "activation":
        return p[0].format(a=a[0])
    if k == "binary":
        return f"fg.{p[0]}({a[0]}, {a[1]})"
    if k == "scalar":
        sym, c, reflected = p
        return f"{c!r} {sym} {a[0]}" if reflected else f"{a[0]} {sym} {c!r}"
    if k == "where":
        cond = a[0] if p[0] else f"{a[0]} > 0"
        return f"fg.where({cond}, {a[1]}, {a[2]})"
    if k == "reduce":
        name, dims, keepdim, extra = p
        one = len(dims or ()) == 1 and name in _ONE_DIM
        args = [] if dims is None else [f"dim={dims[0] if one else _tuple(dims)}"]
        if keepdim:
            args.append("keepdim=True")
        if extra is not None:
            args.append(extra)
        call = f"{a[0]}.{name}({', '.join(args)})"
        return call + ("[0]" if name in ("max", "min") and dims is not None else "")
    if k == "reshape":
        return f"{a[0]}.reshape{_tuple(p[0])}"
    if k == "permute":
        return f"{a[0]}.permute{_tuple(p[0])}"
    if k == "transpose":
        return f"{a[0]}.transpose({p[0]}, {p[1]})"
    if k == "expand":
        return f"{a[0]}.expand{_tuple(p[0])}"
    if k == "slice":
        return f"{a[0]}[{', '.join(_slice_text(s) for s in p[0])}]"
    if k == "narrow":
        return f"{a[0]}.narrow({p[0]}, {p[1]}, {p[2]})"
    if k == "squeeze":
        return f"{a[0]}.squeeze()" if p[0] is None else f"{a[0]}.squeeze({p[0]})"
    if k == "unsqueeze":
        return f"{a[0]}.unsqueeze({p[0]})"
    if k == "flatten":
        return f"{a[0]}.flatten()"
    if k == "flip":
        return f"{a[0]}.flip({_tuple(p[0])})"
    if k == "select":
        return f"{a[0]}[{', '.join([':'] * p[0] + [str(p[1])])}]"
    if k == "cat":
        return f"fg.cat([{', '.join(a)}], dim={p[0]})"
    if k == "stack":
        return f"fg.stack([{', '.join(a)}], dim={p[0]})"
    if k == "pad":
        return f"F.pad({a[0]}, {_tuple(p[0])}, value={p[1]!r})"
    if k == "matmul":
        return f"{a[0]} @ {a[1]}" if len(a) == 2 else f"{a[0]} @ {a[0]}.mT"
    if k == "cast":
        return f"{a[0]}.to(fg.{p[0]})"
    if k == "softmax":
        return f"F.{p[0]}({a[0]}, dim={p[1]})"
    if k == "layer_norm":
        return f"F.layer_norm({a[0]}, {a[0]}.shape[-{p[0]}:])"
    if k == "inplace":
        name = p[0]
        if name == "clamp_":
            return f"{a[0]}.clamp_(min={p[1]!r}, max={p[2]!r})"
        if name in ("relu_", "neg_"):
            return f"{a[0]}.{name}()"
        other = a[1] if len(a) > 1 else repr(p[1])
        return f"{a[0]}.{name}({other})"
    raise ValueError(f"unknown op kind {k!r}")


_ONE_DIM = ("argmax", "argmin", "max", "min", "all", "any", "logsumexp")


# --------------------------------------------------------------------------- generation


# Sizes drawn for new dims (the minimal draw is 1); a 0-size dim one time in 16.
DIMS = (1, 2, 3, 4, 5, 7, 2, 3, 4, 6, 1, 2, 3, 8, 5, 0)


@dataclass
class _Builder:
    """A program being drawn, with eager zero-valued stand-ins to validate each op."""

    choices: Choices
    program: Program = field(default_factory=Program)
    probes: list = field(default_factory=list)        # eager tensor per node id
    users: dict = field(default_factory=dict)         # id -> number of ops reading it
    allow_grad: bool = True

    def shape(self, i: int) -> tuple[int, ...]:
        return tuple(self.probes[i].shape)

    def dtype(self, i: int) -> str:
        return self.probes[i].dtype.name

    def ids(self) -> list[int]:
        return list(range(len(self.program.nodes)))

    def new_input(self, shape=None, dtype=None) -> int:
        c = self.choices
        if shape is None:
            shape = self.draw_shape()
        if dtype is None:
            dtype = c.choice(DTYPES)
        values = c.choice(VALUE_KINDS)
        seed = c.integer(0, 2**16)
        rg = self.allow_grad and dtype in ("float32", "float64") and c.integer(0, 2) > 0
        spec = Input(tuple(shape), dtype, values, seed, rg)
        self.program.nodes.append(spec)
        self.probes.append(fg.zeros(spec.shape, dtype=dtypes.as_dtype(dtype)))
        return len(self.program.nodes) - 1

    def draw_shape(self) -> tuple[int, ...]:
        c = self.choices
        rank = c.choice((1, 2, 0, 3, 4))
        shape = [c.choice(DIMS) for _ in range(rank)]
        while math.prod(shape) > MAX_ELEMENTS:
            shape[shape.index(max(shape))] //= 2
        return tuple(shape)

    def broadcastable_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts with ``shape`` (dims kept, set to 1, or leading ones
        dropped)."""
        c = self.choices
        drop = c.integer(0, len(shape)) if shape and c.integer(0, 3) == 0 else 0
        return tuple(d if c.integer(0, 3) else 1 for d in shape[drop:])

    def operand_like(self, shape: tuple[int, ...], dtype: str | None = None) -> int:
        """An existing value that broadcasts with ``shape``, or a new input that does."""
        c = self.choices
        if c.integer(0, 2) == 0:
            fits = [i for i in self.ids() if _broadcasts(self.shape(i), shape)]
            if fits:
                return c.recent(fits)
        dt = dtype if dtype is not None and c.integer(0, 2) else c.choice(DTYPES)
        return self.new_input(self.broadcastable_shape(shape), dt)

    def add(self, op: Op) -> bool:
        """Append ``op`` if eager accepts it on the stand-ins; False if it raises."""
        scope = {f"v{i}": t for i, t in enumerate(self.probes)}
        scope.update(namespace())
        try:
            with fg.no_grad():
                out = eval(render(op), scope)  # noqa: S307
        except Exception:  # noqa: BLE001 - any rejection means: draw another op
            return False
        if not isinstance(out, fg.Tensor) or out.numel() > 4 * MAX_ELEMENTS:
            return False
        self.program.nodes.append(op)
        # A fresh stand-in: an in-place op must not change the zeros other ops see.
        self.probes.append(fg.zeros(tuple(out.shape), dtype=out.dtype))
        for i in set(op.args):
            self.users[i] = self.users.get(i, 0) + 1
        return True


def _broadcasts(a: tuple, b: tuple) -> bool:
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


def _dims_subset(c: Choices, ndim: int) -> tuple[int, ...]:
    dims = tuple(d for d in range(ndim) if c.boolean())
    return dims or (c.integer(0, ndim - 1),)


def _factor(c: Choices, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A random shape with as many elements as ``shape``."""
    n = math.prod(shape)
    if n == 0:
        return c.choice(((0,), (0, 3), (2, 0), (0, 1, 1)))
    out, rest = [], n
    for _ in range(c.integer(0, 3)):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        d = c.choice(divisors)
        out.append(d)
        rest //= d
    out.append(rest)
    if c.integer(0, 3) == 0:
        out[c.integer(0, len(out) - 1)] = -1
    return tuple(out)


def _draw_op(b: _Builder) -> Op | None:
    """One op over existing values (and possibly new inputs); None if not applicable."""
    c = b.choices
    kind = c.choice(KINDS)
    x = c.recent(b.ids())
    shape, ndim = b.shape(x), len(b.shape(x))
    if kind == "unary":
        return Op("unary", (x,), (c.choice(UNARY),))
    if kind == "activation":
        return Op("activation", (x,), (c.choice(ACTIVATIONS),))
    if kind == "binary":
        y = b.operand_like(shape, b.dtype(x))
        return Op("binary", (x, y) if c.integer(0, 3) else (y, x), (c.choice(BINARY),))
    if kind == "scalar":
        return Op("scalar", (x,), (c.choice(SCALAR_OPS), c.choice(SCALARS), c.integer(0, 3) == 0))
    if kind == "where":
        cond = c.recent(b.ids()) if c.boolean() else x
        cond_ok = _broadcasts(b.shape(cond), shape)
        if not cond_ok:
            cond = x
        y = b.operand_like(shape, b.dtype(x))
        return Op("where", (cond, x, y), (b.dtype(cond) == "bool",))
    if kind == "reduce":
        name = c.choice(REDUCTIONS)
        dims = None if ndim == 0 or c.integer(0, 3) == 0 else _dims_subset(c, ndim)
        if name in _ONE_DIM and dims is not None:
            dims = dims[:1]
        if name == "logsumexp" and dims is None:
            dims = tuple(range(ndim)) or None
            if dims is None:
                return None
        extra = None
        if name in ("var", "std") and c.boolean():
            extra = f"correction={c.choice((0, 1, 2))}"
        keepdim = dims is not None and c.boolean()
        return Op("reduce", (x,), (name, dims, keepdim, extra))
    if kind == "reshape":
        return Op("reshape", (x,), (_factor(c, shape),))
    if kind == "permute" and ndim >= 2:
        perm = list(range(ndim))
        for i in range(ndim - 1, 0, -1):
            j = c.integer(0, i)
            perm[i], perm[j] = perm[j], perm[i]
        return Op("permute", (x,), (tuple(perm),))
    if kind == "transpose" and ndim >= 2:
        return Op("transpose", (x,), (c.integer(-ndim, ndim - 1), c.integer(-ndim, ndim - 1)))
    if kind == "expand":
        lead = c.integer(0, 1)
        sizes = [c.choice((2, 3)) for _ in range(lead)]
        sizes += [c.choice((d, 3, -1)) if d == 1 else c.choice((d, -1)) for d in shape]
        return Op("expand", (x,), (tuple(sizes),))
    if kind == "slice" and ndim >= 1:
        slices = []
        for d in shape[:c.integer(1, ndim)]:
            start = c.choice((None, 1, 0, -2, 2))
            stop = c.choice((None, -1, d, 3, 0))
            slices.append((start, stop, c.choice((1, 2, 3))))
        return Op("slice", (x,), (tuple(slices),))
    if kind == "narrow" and ndim >= 1:
        dim = c.integer(0, ndim - 1)
        start = c.integer(0, shape[dim])
        return Op("narrow", (x,), (dim, start, c.integer(0, shape[dim] - start)))
    if kind == "squeeze":
        return Op("squeeze", (x,), (None if ndim == 0 or c.boolean() else c.integer(0, ndim - 1),))
    if kind == "unsqueeze":
        return Op("unsqueeze", (x,), (c.integer(-ndim - 1, ndim),))
    if kind == "flatten":
        return Op("flatten", (x,))
    if kind == "flip" and ndim >= 1:
        return Op("flip", (x,), (_dims_subset(c, ndim),))
    if kind == "select" and ndim >= 1:
        dim = c.integer(0, ndim - 1)
        if shape[dim] == 0:
            return None
        return Op("select", (x,), (dim, c.integer(-shape[dim], shape[dim] - 1)))
    if kind in ("cat", "stack") and ndim >= 1:
        dim = c.integer(0, ndim - 1)
        if c.boolean():
            y = x           # a diamond: the value used twice
        else:
            other = list(shape)
            if kind == "cat":
                other[dim] = c.choice((1, 2, 0, 3))
            same = [i for i in b.ids() if b.shape(i) == tuple(other)]
            y = c.recent(same) if same and c.boolean() else b.new_input(tuple(other),
                                                                          b.dtype(x))
        return Op(kind, (x, y), (dim,))
    if kind == "pad" and ndim >= 1:
        widths = tuple(c.choice((0, 1, 2, -1)) for _ in range(2 * c.integer(1, min(ndim, 2))))
        return Op("pad", (x,), (widths, c.choice((0.0, -1.5, 2.0))))
    if kind == "matmul" and ndim >= 1:
        if ndim >= 2 and c.boolean():
            return Op("matmul", (x,))
        k = shape[-1]
        rhs = c.choice(((k,), (k, c.choice((1, 2, 3, 5))), (2, k, 3)))
        if ndim == 1 and len(rhs) == 3:
            rhs = (k, 2)
        y = b.new_input(rhs, b.dtype(x))
        return Op("matmul", (x, y))
    if kind == "cast":
        return Op("cast", (x,), (c.choice(DTYPES),))
    if kind == "softmax" and ndim >= 1:
        return Op("softmax", (x,), (c.choice(("softmax", "log_softmax")), c.integer(-ndim, ndim - 1)))
    if kind == "layer_norm" and ndim >= 1:
        return Op("layer_norm", (x,), (c.integer(1, min(ndim, 2)),))
    if kind == "inplace":
        return _draw_inplace(b)
    return None


# Values an in-place op may write to: results of ops that autograd does not save (so eager
# backward stays valid) and that are not views of anything.
_INPLACE_TARGETS = {"add", "sub", "mul", "neg", "+", "-", "*", "where", "cat", "stack",
                    "square", "exp2"}


def _draw_inplace(b: _Builder) -> Op | None:
    c = b.choices
    targets = [i for i, n in enumerate(b.program.nodes)
               if isinstance(n, Op) and op_name(n) in _INPLACE_TARGETS and not b.users.get(i)]
    if not targets:
        return None
    t = c.recent(targets)
    name = c.choice(INPLACE)
    if name == "clamp_":
        return Op("inplace", (t,), (name, c.choice((-1.0, 0.0, -2.5)), c.choice((1.0, 2.0, 0.5))))
    if name in ("relu_", "neg_"):
        return Op("inplace", (t,), (name,))
    if name == "mul_" or c.boolean():
        # (x.mul_(y) saves x for y's gradient and then overwrites it: eager rightly raises
        # in backward, so a tensor operand only goes to add_ and sub_)
        return Op("inplace", (t,), (name, c.choice(SCALARS)))
    shape = b.shape(t)
    fits = [i for i in b.ids() if i != t and _broadcasts(b.shape(i), shape)
            and np.broadcast_shapes(b.shape(i), shape) == shape]
    y = c.recent(fits) if fits and c.boolean() else b.new_input(b.broadcastable_shape(shape),
                                                                b.dtype(t))
    return Op("inplace", (t, y), (name,))


# The op kinds, the most common first: a minimal draw (0) picks "unary". Elementwise math
# and reductions are where the numerics live, so they come up more often.
KINDS = ("unary", "binary", "scalar", "reduce", "unary", "binary", "reduce", "activation",
         "unary", "where", "binary", "unary", "scalar", "reduce", "reshape", "permute",
         "transpose", "expand", "slice", "narrow", "squeeze", "unsqueeze", "flatten", "flip",
         "select", "cat", "stack", "pad", "matmul", "cast", "softmax", "layer_norm", "inplace",
         "cast", "inplace", "matmul", "softmax")

OPS = tuple(dict.fromkeys(KINDS))


def generate(choices: Choices, max_ops: int = 8, grads: bool = True) -> Program:
    """A random valid program drawn from ``choices``: 1 to ``max_ops`` ops over 1 or more
    inputs, returning the last value and, sometimes, one or two earlier ones."""
    b = _Builder(choices, allow_grad=grads)
    b.new_input()
    if choices.integer(0, 2) == 2:     # a second input (the minimal draw: none)
        b.new_input()
    choices.count_at = choices.position
    n_ops = choices.integer(1, max_ops)
    for _ in range(n_ops):
        start = choices.position
        for _attempt in range(6):
            op = _draw_op(b)
            if op is not None and b.add(op):
                break
        choices.spans.append((start, choices.position))
    nodes = b.program.nodes
    op_ids = [i for i, n in enumerate(nodes) if isinstance(n, Op)]
    if not op_ids:
        # Nothing drew: the simplest program over the first input.
        b.add(Op("unary", (0,), ("neg",))) or b.add(Op("cast", (0,), ("float32",)))
        op_ids = [len(nodes) - 1]
    # The last value, and up to two values nothing reads (a multi-output program).
    outputs = [op_ids[-1]]
    unused = [i for i in op_ids[:-1] if not b.users.get(i)]
    for _ in range(min(len(unused), choices.integer(0, 2))):
        extra = choices.recent(unused)
        if extra not in outputs:
            outputs.append(extra)
    b.program.outputs = outputs
    return b.program


def describe(program: Program) -> str:
    """The program's source after the code that builds its inputs: a script to paste."""
    head = ("import fusegrad as fg\nimport fusegrad.nn.functional as F\n"
            "from fusegrad.testing.programs import Input, make_array\n")
    call = ", ".join(f"v{i}" for i in program.input_ids)
    return f"{head}{program.inputs_source()}\n{program.source()}\nprint(program({call}))\n"
