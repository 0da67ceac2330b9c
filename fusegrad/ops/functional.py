"""Public tensor ops: PyTorch's API, built from the primitives in :mod:`fusegrad.ops.prims`.

Each function here promotes dtypes, broadcasts, normalizes dims and checks arguments the way
torch does, then binds primitives. Ops that are compositions of several primitives are
wrapped by :func:`composite`, so that in eager mode they appear as the one autograd node
PyTorch shows (``MeanBackward0``), while the tracer sees the primitives (fusion sees through
them). These functions are also installed as ``Tensor`` methods.
"""

from __future__ import annotations

import builtins
import functools
import math
from collections import namedtuple
from typing import Sequence

import numpy as np

from fusegrad import dtypes
from fusegrad.autograd.engine import _FREED_MESSAGE, Node, _edge, _refresh_view, run_backward
from fusegrad.autograd.grad_mode import is_grad_enabled, no_grad
from fusegrad.ops import primitive as _primitive
from fusegrad.ops import prims as P
from fusegrad.ops.primitive import bind
from fusegrad.ops.prims import normalize_axis
from fusegrad.tensor import Size, Tensor

# --------------------------------------------------------------------------- composites


class AliasNode(Node):
    """Identity edge from a composite's inner graph to the composite's real operand."""

    __slots__ = ()

    def __init__(self, t: Tensor):
        super().__init__((_edge(t),), "AliasBackward0")

    def apply(self, grad, create_graph, retain_graph):
        return (grad,)


class CompositeNode(Node):
    """One autograd node for a public op made of several primitives.

    Its backward runs the VJPs of the primitives the op recorded on aliases of its operands;
    with ``create_graph`` those VJPs are recorded too, connected through the aliases to the
    real operands, so higher-order gradients see through the composite.
    """

    __slots__ = ("_aliases", "_inner")

    def __init__(self, name: str, operands: Sequence[Tensor], aliases: Sequence[Tensor], inner):
        super().__init__(tuple(_edge(t) for t in operands), name)
        self._aliases = list(aliases)
        self._inner = inner

    def apply(self, grad, create_graph, retain_graph):
        if self._inner is None:
            raise RuntimeError(_FREED_MESSAGE)
        return tuple(run_backward([self._inner], [grad], retain_graph, create_graph,
                                  inputs=self._aliases, accumulate=False, allow_unused=True,
                                  stop_at_inputs=True))

    def release(self) -> None:
        self._inner = None


def composite(grad_name: str):
    """Make an op built of several primitives one autograd node named ``grad_name``."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not is_grad_enabled():
                return fn(*args, **kwargs)
            operands = [a for a in args if isinstance(a, Tensor)]
            operands += [v for v in kwargs.values() if isinstance(v, Tensor)]
            if not builtins.any(t._requires_grad for t in operands) or \
                    builtins.any(t._trace for t in operands) or _primitive.CAPTURE:
                return fn(*args, **kwargs)
            alias_of = {}
            for t in operands:
                if t._requires_grad and id(t) not in alias_of:
                    a = Tensor._wrap(t._data, t._dtype)
                    a._version_counter = t._version_counter
                    a.grad_fn = AliasNode(t)
                    a._requires_grad = True
                    alias_of[id(t)] = (t, a)

            def swap(v):
                return alias_of[id(v)][1] if isinstance(v, Tensor) and id(v) in alias_of else v
            inner = fn(*[swap(a) for a in args], **{k: swap(v) for k, v in kwargs.items()})
            if not isinstance(inner, Tensor) or not inner._requires_grad:
                return inner
            real = [t for t, _ in alias_of.values()]
            out = Tensor._wrap(inner._data, inner._dtype)
            out._version_counter = inner._version_counter
            out.grad_fn = CompositeNode(grad_name, real, [a for _, a in alias_of.values()], inner)
            out._requires_grad = True
            return out
        return wrapper
    return decorate


def _named(out: Tensor, name: str, src: Tensor | None = None) -> Tensor:
    """Give the node that made ``out`` torch's name for the public op.

    ``src``: the op's input, when the op may return it unchanged (a no-op view), whose node
    must keep its own name.
    """
    if out.grad_fn is not None and out._trace is None and out is not src:
        out.grad_fn._name = name
    return out


# --------------------------------------------------------------------------- operands


def _is_scalar(v) -> bool:
    return isinstance(v, (bool, int, float, np.bool_, np.integer, np.floating))


def _scalar_tensor(value, dtype: dtypes.DType, like: Tensor | None = None) -> Tensor:
    """A 0-d constant of ``dtype`` holding a Python scalar."""
    return Tensor._wrap(np.asarray(value, dtype=dtype.np_dtype), dtype)


def as_tensor_operand(v, dtype: dtypes.DType | None = None) -> Tensor:
    if isinstance(v, Tensor):
        return v if dtype is None or v.dtype is dtype else cast(v, dtype)
    if _is_scalar(v):
        return _scalar_tensor(v, dtype or dtypes.result_type(v))
    if isinstance(v, np.ndarray):
        from fusegrad.ops.creation import tensor
        t = tensor(v)
        return t if dtype is None else cast(t, dtype)
    raise TypeError(f"expected a Tensor or a number, got {type(v).__name__}")


def _promote(op: str, *values, dtype: dtypes.DType | None = None) -> list[Tensor]:
    """Convert operands to tensors of their common (torch-promoted) dtype."""
    for v in values:
        if not isinstance(v, Tensor) and not _is_scalar(v):
            if isinstance(v, np.ndarray):
                continue
            raise TypeError(f"{op}(): argument 'other' must be Tensor or Number, not "
                            f"{type(v).__name__}")
    values = [as_tensor_operand(v) if isinstance(v, np.ndarray) else v for v in values]
    target = dtype or dtypes.result_type(*values)
    return [cast(v, target) if isinstance(v, Tensor) else _scalar_tensor(v, target)
            for v in values]


def _at_user_line(*tensors) -> str:
    """`` (at file:line)`` naming the user's line when a tensor is traced, else ``""``: for
    errors raised by an op before it binds a primitive (the tracer adds the line to errors
    raised by a primitive's own rule)."""
    for t in tensors:
        trace = getattr(t, "_trace", None)
        if trace is not None:
            loc = trace._location()
            return f" (at {loc})" if loc else ""
    return ""


def _float_dtype(dt: dtypes.DType) -> dtypes.DType:
    """Integer inputs of float-valued ops compute in the default float type, as in torch."""
    return dt if dt.is_floating_point else dtypes.get_default_dtype()


def cast(x: Tensor, dtype) -> Tensor:
    dtype = dtypes.as_dtype(dtype)
    if x.dtype is dtype:
        return x
    return bind(P.cast, x, dtype=dtype)


# --------------------------------------------------------------------------- elementwise


def _binary_op(prim, grad_name=None):
    def op(x, other, *, dtype=None):
        a, b = _promote(prim.name, x, other, dtype=dtype)
        out = bind(prim, a, b)
        return _named(out, grad_name) if grad_name else out
    return op


def add(x, other, *, alpha=1) -> Tensor:
    """``x + alpha * other``."""
    if isinstance(alpha, Tensor) or alpha != 1:
        other = mul(other, alpha)
    a, b = _promote("add", x, other)
    if a.dtype is dtypes.bool_:
        return bind(P.logical_or, a, b)
    return bind(P.add, a, b)


def sub(x, other, *, alpha=1) -> Tensor:
    """``x - alpha * other``."""
    if isinstance(alpha, Tensor) or alpha != 1:
        other = mul(other, alpha)
    a, b = _promote("sub", x, other)
    if a.dtype is dtypes.bool_:
        raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not supported. "
                           "Use the `^` or `logical_xor()` operator instead.")
    return bind(P.sub, a, b)


def rsub(x, other, *, alpha=1) -> Tensor:
    return sub(other, x, alpha=alpha) if isinstance(other, Tensor) else \
        sub(_promote("rsub", other, x)[0], x, alpha=alpha)


def mul(x, other) -> Tensor:
    a, b = _promote("mul", x, other)
    if a.dtype is dtypes.bool_:
        return bind(P.logical_and, a, b)
    return bind(P.mul, a, b)


def div(x, other, *, rounding_mode: str | None = None) -> Tensor:
    """True division (integers give floats); ``rounding_mode`` 'floor' or 'trunc'."""
    if rounding_mode is None:
        a, b = _promote("div", x, other)
        if not a.dtype.is_floating_point:
            a, b = cast(a, dtypes.get_default_dtype()), cast(b, dtypes.get_default_dtype())
        return bind(P.div, a, b)
    if rounding_mode == "floor":
        return floor_divide(x, other)
    if rounding_mode == "trunc":
        a, b = _promote("div", x, other)
        if a.dtype.is_floating_point:
            return trunc(bind(P.div, a, b))
        q = floor_divide(a, b)
        fix = ne(remainder(a, b), 0) & ne(lt(a, 0), lt(b, 0))
        return where(fix, q + 1, q)
    raise RuntimeError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but "
                       f"found '{rounding_mode}'")


true_divide = div


def floor_divide(x, other) -> Tensor:
    """Python's ``//``: for floats, torch's (and numpy's) floor of the exact quotient, so
    ``1 // 0.1`` is 9, ``1 // -inf`` is -1 and ``inf // 1`` is nan."""
    a, b = _promote("floor_divide", x, other)
    return bind(P.floordiv, a, b)


def remainder(x, other) -> Tensor:
    a, b = _promote("remainder", x, other)
    return bind(P.remainder, a, b)


def fmod(x, other) -> Tensor:
    """C's fmod: the exact remainder of the truncated quotient, with the sign of ``x``."""
    a, b = _promote("fmod", x, other)
    return bind(P.fmod, a, b)


def pow(x, exponent) -> Tensor:  # noqa: A001 - torch's name
    """``x ** exponent``; ``x ** 2`` and other small integer powers stay exact."""
    # Promote first: int_tensor ** 2.0 is float, bool_tensor ** 2 is int64.
    a, b = _promote("pow", x, exponent)
    if isinstance(x, Tensor) and _is_scalar(exponent) and not isinstance(exponent, bool):
        if exponent == 2:
            return _named(bind(P.mul, a, a), "PowBackward0")
        if exponent == 1:
            return _named(bind(P.mul, a, b), "PowBackward0")
    out = bind(P.pow_, a, b)
    name = "PowBackward0" if _is_scalar(exponent) else "PowBackward1"
    return _named(out, name)


def maximum(x, other) -> Tensor:
    a, b = _promote("maximum", x, other)
    return bind(P.maximum, a, b)


def minimum(x, other) -> Tensor:
    a, b = _promote("minimum", x, other)
    return bind(P.minimum, a, b)


def _compare(prim, swap=False):
    def op(x, other):
        a, b = _promote(prim.name, x, other)
        return bind(prim, b, a) if swap else bind(prim, a, b)
    return op


lt = _compare(P.lt)
le = _compare(P.le)
gt = _compare(P.lt, swap=True)
ge = _compare(P.le, swap=True)
eq = _compare(P.eq)
ne = _compare(P.ne)
less, less_equal, greater, greater_equal, not_equal = lt, le, gt, ge, ne


def _to_bool(x) -> Tensor:
    x = as_tensor_operand(x)
    return x if x.dtype is dtypes.bool_ else ne(x, 0)


def logical_and(x, other) -> Tensor:
    return bind(P.logical_and, _to_bool(x), _to_bool(other))


def logical_or(x, other) -> Tensor:
    return bind(P.logical_or, _to_bool(x), _to_bool(other))


def logical_xor(x, other) -> Tensor:
    return bind(P.ne, _to_bool(x), _to_bool(other))


def logical_not(x) -> Tensor:
    return bind(P.logical_not, _to_bool(x))


def _bitwise(name, logical):
    def op(x, other):
        a, b = _promote(name, x, other)
        if a.dtype is not dtypes.bool_:
            raise NotImplementedError(f"{name} is supported on bool tensors only, got {a.dtype}")
        return logical(a, b)
    return op


bitwise_and = _bitwise("bitwise_and", logical_and)
bitwise_or = _bitwise("bitwise_or", logical_or)
bitwise_xor = _bitwise("bitwise_xor", logical_xor)


def bitwise_not(x) -> Tensor:
    if x.dtype is not dtypes.bool_:
        raise NotImplementedError(f"bitwise_not is supported on bool tensors only, got {x.dtype}")
    return logical_not(x)


def where(condition, input=None, other=None) -> Tensor:  # noqa: A002
    """Elements of ``input`` where ``condition`` holds, else of ``other``."""
    if input is None and other is None:
        return nonzero(condition, as_tuple=True)
    cond = _to_bool(condition)
    a, b = _promote("where", input, other)
    return bind(P.where, cond, a, b)


def neg(x: Tensor) -> Tensor:
    if x.dtype is dtypes.bool_:
        raise RuntimeError("Negation, the `-` operator, on a bool tensor is not supported. If you "
                           "are trying to invert a mask, use the `~` or `logical_not()` operator "
                           "instead.")
    return bind(P.neg, x)


negative = neg


def abs(x: Tensor) -> Tensor:  # noqa: A001
    return x if x.dtype is dtypes.bool_ else bind(P.abs_, x)


absolute = abs


def _float_unary(prim):
    def op(x: Tensor) -> Tensor:
        x = as_tensor_operand(x)
        return bind(prim, cast(x, _float_dtype(x.dtype)))
    op.__name__ = prim.name
    op.__doc__ = f"Elementwise {prim.name}; integer inputs compute in the default float type."
    return op


exp = _float_unary(P.exp)
exp2 = _float_unary(P.exp2)
log = _float_unary(P.log)
log2 = _float_unary(P.log2)
log10 = _float_unary(P.log10)
log1p = _float_unary(P.log1p)
expm1 = _float_unary(P.expm1)
sin = _float_unary(P.sin)
cos = _float_unary(P.cos)
tan = _float_unary(P.tan)
tanh = _float_unary(P.tanh)
erf = _float_unary(P.erf)
sqrt = _float_unary(P.sqrt)
reciprocal = _float_unary(P.reciprocal)


@composite("RsqrtBackward0")
def rsqrt(x: Tensor) -> Tensor:
    return reciprocal(sqrt(x))





@composite("SigmoidBackward0")
def sigmoid(x: Tensor) -> Tensor:
    """``1 / (1 + exp(-x))``, computed as ``e / (1 + e)`` with ``e = exp(x)`` for x < 0.

    exp(-x) overflows for x < -88 (float32): its VJP then multiplies 0 by inf and the
    gradient is NaN. exp(-|x|) never overflows; -|x| is written with where() so that its
    gradient at 0 is -1 on the x >= 0 side (abs's would be 0 and lose sigmoid'(0) = 1/4).
    """
    x = cast(x, _float_dtype(x.dtype))
    nonneg = ge(x, 0)
    e = exp(where(nonneg, neg(x), x))
    return where(nonneg, reciprocal(add(e, 1)), div(e, add(e, 1)))


def relu(x: Tensor) -> Tensor:
    """``max(x, 0)`` with torch's gradient: 0 at x == 0 (maximum would split the tie), and
    NaN propagates."""
    a, zero = _promote("relu", x, 0)
    return _named(bind(P.where, bind(P.le, a, zero), zero, a), "ReluBackward0")


def square(x: Tensor) -> Tensor:
    return pow(x, 2)


def sign(x: Tensor) -> Tensor:
    return bind(P.sign, x)


def _rounding(prim):
    def op(x: Tensor) -> Tensor:
        return bind(prim, x) if x.dtype.is_floating_point else x
    return op


floor = _rounding(P.floor)
ceil = _rounding(P.ceil)


def trunc(x: Tensor) -> Tensor:
    if not x.dtype.is_floating_point:
        return x
    return _named(where(lt(x, 0), ceil(x), floor(x)), "TruncBackward0")


fix = trunc


def round(x: Tensor, *, decimals: int = 0) -> Tensor:  # noqa: A001
    """Round half to even, as torch; with ``decimals`` scale by ``10**decimals`` first."""
    if not x.dtype.is_floating_point:
        return x
    if decimals == 0:
        return bind(P.round_, x)
    scale = 10.0 ** decimals
    return _named(div(bind(P.round_, mul(x, scale)), scale), "RoundBackward1")


def clamp(x: Tensor, min=None, max=None) -> Tensor:  # noqa: A002
    """Clamp into [min, max]; either bound may be None, a number or a tensor.

    Values and gradients are torch's: a NaN input stays NaN with a zero gradient; a NaN
    bound gives NaN; at a bound the gradient goes to ``x`` (not split as in maximum); with
    tensor bounds, ``min`` gets the gradient where ``x < min < max`` and ``max`` where
    ``x > max`` or ``max < min``."""
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        return _named(_clamp_tensor(x, min, max), "ClampBackward0")
    out = x
    if min is not None:
        out = _clamp_scalar(out, min, P.maximum)
    if max is not None:
        out = _clamp_scalar(out, max, P.minimum)
    return _named(out, "ClampBackward1")


def _clamp_scalar(x, bound, prim):
    # torch's clamp_backward passes the gradient where min <= x (x <= max), so a gradient
    # of 1 at the bound itself, and 0 at NaN, whose value still passes through (detached).
    a, b = _promote("clamp", x, bound)
    inside = (bind(P.le, b, a) if prim is P.maximum else bind(P.le, a, b))
    return bind(P.where, inside, a, bind(P.where, bind(P.ne, a, a), a.detach(), b))


def _clamp_tensor(x, lo, hi):
    """clamp with a tensor bound: torch's value (``hi if hi < v else v`` for
    ``v = lo if x < lo else x``, NaN where a bound is NaN), computed detached, with its
    gradient routed by torch's masks (clamp_backward_min_max) through ``where``."""
    ops = [x] + [v for v in (lo, hi) if v is not None]
    vals = _promote("clamp", *ops)
    a = vals[0]
    mn = vals[1] if lo is not None else None
    mx = vals[-1] if hi is not None else None
    ad = a.detach()
    value = ad
    if mn is not None:
        value = bind(P.where, bind(P.lt, ad, mn.detach()), mn.detach(), value)
    if mx is not None:
        value = bind(P.where, bind(P.lt, mx.detach(), value), mx.detach(), value)
    if mn is not None and mx is not None:
        # torch's clamp kernel gives NaN for a NaN bound; so does the sum of the bounds.
        unordered = bind(P.logical_or, bind(P.ne, mn, mn), bind(P.ne, mx, mx))
        value = bind(P.where, unordered, bind(P.add, mn.detach(), mx.detach()), value)
        pass_x = bind(P.logical_and, bind(P.le, mn, a), bind(P.le, a, mx))
        take_lo = bind(P.logical_and, bind(P.lt, a, mn), bind(P.lt, mn, mx))
        take_hi = bind(P.logical_or, bind(P.lt, mx, a), bind(P.lt, mx, mn))
        return bind(P.where, pass_x, a,
                    bind(P.where, take_lo, mn, bind(P.where, take_hi, mx, value)))
    if mn is not None:
        value = bind(P.where, bind(P.ne, mn, mn), bind(P.add, ad, mn.detach()), value)
        return bind(P.where, bind(P.le, mn, a), a, bind(P.where, bind(P.lt, a, mn), mn, value))
    value = bind(P.where, bind(P.ne, mx, mx), bind(P.add, ad, mx.detach()), value)
    return bind(P.where, bind(P.le, a, mx), a, bind(P.where, bind(P.lt, mx, a), mx, value))


clip = clamp


def isnan(x: Tensor) -> Tensor:
    return ne(x, x) if x.dtype.is_floating_point else zeros_like(x, dtype=dtypes.bool_)


def isinf(x: Tensor) -> Tensor:
    return eq(abs(x), math.inf) if x.dtype.is_floating_point else zeros_like(x, dtype=dtypes.bool_)


def isfinite(x: Tensor) -> Tensor:
    if not x.dtype.is_floating_point:
        return ones_like(x, dtype=dtypes.bool_)
    return logical_not(logical_or(isnan(x), isinf(x)))


def isclose(x, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> Tensor:
    a, b = _promote("isclose", x, other)
    close = le(abs(sub(a, b)), add(mul(abs(b), rtol), atol)) | eq(a, b)
    if equal_nan:
        close = close | (isnan(a) & isnan(b))
    return close


def allclose(x, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
    return bool(all(isclose(x, other, rtol, atol, equal_nan)))


def equal(x: Tensor, other: Tensor) -> bool:
    """True when both have the same shape and elements."""
    return tuple(x.shape) == tuple(other.shape) and bool(all(eq(x, other)))


def clone(x: Tensor, *, memory_format=None) -> Tensor:
    return bind(P.copy, x)


def contiguous(x: Tensor, memory_format=None) -> Tensor:
    """``x`` itself when already contiguous, else a contiguous copy."""
    if x._trace is not None:
        # A traced view whose eager layout would not be row-major (a transpose) becomes a
        # value of its own, so that a later view() sees the layout eager would.
        if x._base is None or not x._view_ops or _traced_layout(x).flags.c_contiguous:
            return x
        return bind(P.copy, x)
    if x.is_contiguous():
        return x
    out = clone(x)
    # clone keeps a transposed layout (torch's preserve_format); contiguous means row-major.
    out._data = np.ascontiguousarray(out._data)
    return out


def parse_to_args(args, kwargs) -> tuple[dtypes.DType | None, object]:
    """(dtype, device) out of torch's ``to`` arguments: ``to(dtype)``, ``to(device)``,
    ``to(device, dtype)``, ``to(other)``, keywords; a positional bool (non_blocking) is
    ignored. Shared by ``Tensor.to`` and ``Module.to``."""
    from fusegrad.device import device as Device
    dtype, dev = kwargs.get("dtype"), kwargs.get("device")
    for a in args:
        if isinstance(a, Tensor):
            dtype, dev = a.dtype, a.device
        elif isinstance(a, dtypes.DType):
            dtype = a
        elif isinstance(a, (str, Device)):
            dev = a
        elif isinstance(a, bool):
            continue
        else:
            raise TypeError(f"to() received an invalid combination of arguments: {a!r}")
    return (dtypes.as_dtype(dtype) if dtype is not None else None), dev


def to(x: Tensor, *args, **kwargs) -> Tensor:
    """``to(dtype)``, ``to(device)``, ``to(device, dtype)``, ``to(other)``; ``copy=True``."""
    from fusegrad.device import check_device_available
    from fusegrad.device import device as Device
    dtype, dev = parse_to_args(args, kwargs)
    copy = kwargs.get("copy", False)
    if dev is not None:
        dev = Device(dev)
        if dev != x.device:
            check_device_available(dev)
    out = x if dtype is None else cast(x, dtype)
    if copy and out is x:
        out = clone(x)
    return out


def type_as(x: Tensor, other: Tensor) -> Tensor:
    return cast(x, other.dtype)


# --------------------------------------------------------------------------- reductions


def _dims(x: Tensor, dim, op: str) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(x.ndim))
    if isinstance(dim, (int, np.integer)):
        dim = (int(dim),)
    axes = tuple(sorted({normalize_axis(d, x.ndim, op) for d in dim}))
    if len(axes) != len(tuple(dim)):
        raise RuntimeError(f"{op}: dim {list(dim)} appears multiple times in the list of dims")
    return axes if x.ndim else ()


def _keep(out: Tensor, x: Tensor, axes, keepdim: bool) -> Tensor:
    if keepdim and x.ndim:
        return reshape_prim(out, P._keepdim_shape(tuple(x.shape), axes))
    return out


def _reduce(prim, x: Tensor, dim, keepdim: bool, op: str) -> Tensor:
    axes = _dims(x, dim, op)
    return _keep(bind(prim, x, axes=axes), x, axes, keepdim)


def sum(x: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:  # noqa: A001
    """Sum over ``dim`` (all dims when None); bools and integers sum to int64."""
    if dtype is not None:
        x = cast(x, dtype)
    out = _reduce(P.sum_, x, dim, keepdim, "sum")
    return _named(out, "SumBackward0" if dim is None else "SumBackward1")


def sum_to_size(x: Tensor, *size) -> Tensor:
    """Sum broadcast dims so the result has shape ``size``."""
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    lead = x.ndim - len(shape)
    if lead < 0 or builtins.any(d not in (1, x.shape[lead + i]) for i, d in enumerate(shape)):
        raise RuntimeError(f"sum_to_size: size {{{list(shape)}}} is not expandable to size "
                           f"{{{list(x.shape)}}}.")
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
    if not axes:
        return x
    out = bind(P.sum_, x, axes=axes)
    out = reshape_prim(out, tuple(shape)) if tuple(out.shape) != tuple(shape) else out
    return _named(out, "SumBackward1")


def reduce_prod(x: Tensor, axes: tuple[int, ...]) -> Tensor:
    return bind(P.prod, x, axes=tuple(axes))


def prod(x: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    if dtype is not None:
        x = cast(x, dtype)
    if dim is not None and not isinstance(dim, (int, np.integer)):
        raise TypeError("prod(): argument 'dim' must be int")
    out = _reduce(P.prod, x, dim, keepdim, "prod")
    return _named(out, "ProdBackward0" if dim is None else "ProdBackward1")


def _count(x: Tensor, axes) -> int:
    n = 1
    for a in axes:
        n *= x.shape[a]
    return n


@composite("MeanBackward1")
def _mean(x: Tensor, dim, keepdim: bool) -> Tensor:
    axes = _dims(x, dim, "mean")
    return _keep(div(bind(P.sum_, x, axes=axes), _count(x, axes)), x, axes, keepdim)


def mean(x: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Arithmetic mean; floating-point inputs only, as in torch."""
    if dtype is not None:
        x = cast(x, dtype)
    if not x.dtype.is_floating_point:
        raise RuntimeError(
            f"mean(): could not infer output dtype. Input dtype must be either a floating point "
            f"or complex dtype. Got: {_dtype_title(x.dtype)}")
    out = _mean(x, dim, keepdim)
    return _named(out, "MeanBackward0" if dim is None else "MeanBackward1")


def _correction(unbiased, correction) -> float:
    if correction is not None:
        return correction
    return 1 if unbiased is None or unbiased else 0


@composite("VarBackward0")
def _var(x: Tensor, dim, correction: float, keepdim: bool) -> Tensor:
    axes = _dims(x, dim, "var")
    n = _count(x, axes)
    mu = reshape_prim(div(bind(P.sum_, x, axes=axes), n), P._keepdim_shape(tuple(x.shape), axes))
    d = sub(x, mu)
    out = div(bind(P.sum_, mul(d, d), axes=axes), builtins.max(n - correction, 0))
    return _keep(out, x, axes, keepdim)


def _require_float_input(x: Tensor, op: str) -> None:
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"{op}(): std and var only support floating point and complex dtypes, "
                           f"got {x.dtype}")


def var(x: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> Tensor:
    """Variance with Bessel's ``correction`` (1 by default)."""
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    _require_float_input(x, "var")
    return _var(x, dim, _correction(unbiased, correction), keepdim)


def _root_with_zero_grad(s: Tensor, root) -> Tensor:
    """``root(s)`` whose gradient is 0 where ``s == 0`` instead of inf * 0 = nan: torch's
    convention for the norm and std of an all-zero (or constant) input. The inner where keeps
    the infinite derivative of the root at 0 out of the graph."""
    zero = eq(s, 0)
    return where(zero, 0.0, root(where(zero, 1.0, s)))


@composite("StdBackward0")
def _std(x, dim, correction, keepdim):
    return _root_with_zero_grad(_var(x, dim, correction, keepdim), sqrt)


def std(x: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> Tensor:
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    _require_float_input(x, "std")
    return _std(x, dim, _correction(unbiased, correction), keepdim)


def var_mean(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return var(x, dim, unbiased, keepdim, correction=correction), mean(x, dim, keepdim)


def std_mean(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return std(x, dim, unbiased, keepdim, correction=correction), mean(x, dim, keepdim)


ValuesIndices = namedtuple("ValuesIndices", ["values", "indices"])
_MAX_RESULT = namedtuple("max", ["values", "indices"])
_MIN_RESULT = namedtuple("min", ["values", "indices"])


def _extremum_with_dim(x: Tensor, dim: int, keepdim: bool, arg_prim, result_type):
    axis = normalize_axis(dim, x.ndim, "max") if x.ndim else 0
    idx = bind(arg_prim, x, axis=axis)
    index = reshape_prim(idx, P._keepdim_shape(tuple(x.shape), (axis,))) if x.ndim else idx
    values = bind(P.gather, x, index, axis=axis) if x.ndim else x
    if not keepdim and x.ndim:
        values = reshape_prim(values, tuple(idx.shape))
        index = idx
    return result_type(values, index)


def max(x: Tensor, dim=None, keepdim: bool = False):  # noqa: A001
    """``max(x)``: the largest element; ``max(x, dim)``: (values, indices); ``max(x, y)``."""
    if isinstance(dim, Tensor):
        return maximum(x, dim)
    if dim is None:
        if x.numel() == 0:
            raise RuntimeError("max(): Expected reduction dim to be specified for input.numel() "
                               "== 0. Specify the reduction dim with the 'dim' argument.")
        return _named(_reduce(P.max_, x, None, False, "max"), "MaxBackward1")
    out = _extremum_with_dim(x, dim, keepdim, P.argmax, _MAX_RESULT)
    _named(out.values, "MaxBackward0", src=x)
    return out


def min(x: Tensor, dim=None, keepdim: bool = False):  # noqa: A001
    """``min(x)``, ``min(x, dim)`` -> (values, indices), or ``min(x, y)``."""
    if isinstance(dim, Tensor):
        return minimum(x, dim)
    if dim is None:
        if x.numel() == 0:
            raise RuntimeError("min(): Expected reduction dim to be specified for input.numel() "
                               "== 0. Specify the reduction dim with the 'dim' argument.")
        return _named(_reduce(P.min_, x, None, False, "min"), "MinBackward1")
    out = _extremum_with_dim(x, dim, keepdim, P.argmin, _MIN_RESULT)
    _named(out.values, "MinBackward0", src=x)
    return out


def amax(x: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    return _reduce(P.max_, x, dim if dim != () else None, keepdim, "amax")


def amin(x: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    return _reduce(P.min_, x, dim if dim != () else None, keepdim, "amin")


def _arg(prim, x: Tensor, dim, keepdim: bool) -> Tensor:
    if dim is None:
        flat = reshape_prim(x, (x.numel(),))
        out = bind(prim, flat, axis=0)
        return reshape_prim(out, (1,) * x.ndim) if keepdim else out
    axis = normalize_axis(dim, x.ndim, prim.name) if x.ndim else 0
    return _keep(bind(prim, x, axis=axis), x, (axis,), keepdim)


def argmax(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _arg(P.argmax, x, dim, keepdim)


def argmin(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _arg(P.argmin, x, dim, keepdim)


@composite("LogsumexpBackward0")
def logsumexp(x: Tensor, dim, keepdim: bool = False) -> Tensor:
    """``log(sum(exp(x)))`` computed stably by subtracting the max first."""
    x = cast(x, _float_dtype(x.dtype))
    axes = _dims(x, dim, "logsumexp")
    if builtins.any(x.shape[a] == 0 for a in axes):
        # max has no identity on an empty slice; unshifted, log(sum(exp(x))) = log(0) = -inf
        # there, torch's result.
        return _keep(log(bind(P.sum_, exp(x), axes=axes)), x, axes, keepdim)
    m = bind(P.max_, x, axes=axes)
    # An all -inf (or inf) slice would make x - m NaN: shift by 0 there instead.
    m = where(isinf(m), 0.0, m.detach())
    mk = reshape_prim(m, P._keepdim_shape(tuple(x.shape), axes))
    out = add(log(bind(P.sum_, exp(sub(x, mk)), axes=axes)), m)
    return _keep(out, x, axes, keepdim)


def all(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    if x.numel():
        return _reduce(P.min_, _to_bool(x), dim, keepdim, "all")
    # min has no identity on an empty reduction; counting the False elements does.
    return eq(sum(logical_not(x), dim, keepdim), 0)


def any(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    if x.numel():
        return _reduce(P.max_, _to_bool(x), dim, keepdim, "any")
    return ne(sum(_to_bool(x), dim, keepdim), 0)


def count_nonzero(x: Tensor, dim=None) -> Tensor:
    return sum(_to_bool(x), dim)


@composite("LinalgVectorNormBackward0")
def norm(x: Tensor, p="fro", dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    """Vector p-norm over ``dim`` (all elements by default): 2 ('fro'), 1, inf, -inf, or any p."""
    if dtype is not None:
        x = cast(x, dtype)
    if p in ("fro", None):
        p = 2
    if p == math.inf:
        return amax(abs(x), dim if dim is not None else (), keepdim)
    if p == -math.inf:
        return amin(abs(x), dim if dim is not None else (), keepdim)
    if p == 2:
        return _root_with_zero_grad(sum(mul(x, x), dim, keepdim), sqrt)
    if p == 1:
        return sum(abs(x), dim, keepdim)
    if p == 0:
        return sum(cast(ne(x, 0), x.dtype), dim, keepdim)
    return _root_with_zero_grad(sum(pow(abs(x), p), dim, keepdim), lambda s: pow(s, 1.0 / p))


def cumsum(x: Tensor, dim: int, *, dtype=None) -> Tensor:
    if dtype is not None:
        x = cast(x, dtype)
    return bind(P.cumsum, x, axis=normalize_axis(dim, x.ndim, "cumsum") if x.ndim else 0)


# --------------------------------------------------------------------------- movement (views)


def _mark_view(out: Tensor, src: Tensor, prim, attrs: dict) -> Tensor:
    """Record that ``out`` is a view of ``src``'s storage, for in-place writes through it."""
    if out._trace is not None or np.shares_memory(out._data, src._data):
        base = src._base if src._base is not None else src
        out._base = base
        out._view_ops = (src._view_ops or ()) + ((prim, attrs),)
        out._version_counter = src._version_counter
        if out._trace is None and is_grad_enabled():
            # the version its history is valid for (see engine._refresh_view)
            out._view_version = out._version_counter.value
    return out


def _view_prim(prim, x: Tensor, **attrs) -> Tensor:
    return _mark_view(bind(prim, x, **attrs), x, prim, attrs)


def reshape_prim(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    if tuple(x.shape) == tuple(shape):
        return x
    return _view_prim(P.reshape, x, shape=tuple(shape))


def _infer_shape(x: Tensor, shape, op: str) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, Size)):
        shape = tuple(shape[0])
    shape = tuple(int(d) for d in shape)
    if shape.count(-1) > 1:
        raise RuntimeError("only one dimension can be inferred")
    n = x.numel()
    if -1 in shape:
        known = 1
        for d in shape:
            if d != -1:
                known *= d
        if known == 0 or n % known:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {n}")
        shape = tuple(n // known if d == -1 else d for d in shape)
    prod_ = 1
    for d in shape:
        if d < 0:
            raise RuntimeError(f"invalid shape dimension {d}")
        prod_ *= d
    if prod_ != n:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {n}")
    return shape


def reshape(x: Tensor, *shape) -> Tensor:
    """A tensor of ``shape`` with ``x``'s elements: a view when strides allow, else a copy."""
    shape = _infer_shape(x, shape, "reshape")
    if x._trace is None and not _viewable(x._data, shape):
        x = clone(x)
    return reshape_prim(x, shape)


def _viewable(a: np.ndarray, shape) -> bool:
    try:
        np.reshape(a, shape, copy=False)
        return True
    except ValueError:
        return False


def view(x: Tensor, *shape) -> Tensor:
    """``reshape`` that never copies: torch's error when the strides do not allow a view."""
    if len(shape) == 1 and isinstance(shape[0], dtypes.DType):
        raise NotImplementedError("view(dtype) is not supported; use .to(dtype)")
    shape = _infer_shape(x, shape, "view")
    layout = x._data if x._trace is None else _traced_layout(x)
    if not _viewable(layout, shape):
        raise RuntimeError(
            "view size is not compatible with input tensor's size and stride (at least one "
            "dimension spans across two contiguous subspaces). Use .reshape(...) instead. "
            f"(view({list(shape)}) of a tensor of size {list(x.shape)} and stride "
            f"{[st // layout.itemsize for st in layout.strides]})")
    return reshape_prim(x, shape)


def _layout_stand_in(shape) -> np.ndarray:
    """A contiguous array of ``shape`` over one byte: strides to reason about, no data."""
    shape = tuple(shape)
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * builtins.max(shape[i + 1], 1)
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape, strides)


def _traced_layout(x: Tensor) -> np.ndarray:
    """The strides eager would give a traced tensor, on a stand-in (never read): its view
    ops replayed on a contiguous base. A reshape that eager would copy starts a contiguous
    layout again. Computed values count as contiguous (eager's numpy may keep a transposed
    operand's layout; that case is not modelled)."""
    if x._base is None or not x._view_ops:
        return _layout_stand_in(x.shape)
    a = _layout_stand_in(x._base.shape)
    for prim, attrs in x._view_ops:
        if prim is P.reshape:
            try:
                a = np.reshape(a, attrs["shape"], copy=False)
            except ValueError:
                a = _layout_stand_in(attrs["shape"])
        else:
            a = prim.impl(a, **attrs)
    return a


def view_as(x: Tensor, other: Tensor) -> Tensor:
    return view(x, tuple(other.shape))


def reshape_as(x: Tensor, other: Tensor) -> Tensor:
    return reshape(x, tuple(other.shape))


def permute(x: Tensor, *dims) -> Tensor:
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    if len(dims) != x.ndim:
        raise RuntimeError(f"permute(sparse_coo): number of dimensions in the tensor input does "
                           f"not match the length of the desired ordering of dimensions i.e. "
                           f"input.dim() = {x.ndim} is not equal to len(dims) = {len(dims)}")
    perm = tuple(normalize_axis(d, x.ndim, "permute") for d in dims)
    if len(set(perm)) != len(perm):
        raise RuntimeError("permute(): duplicate dims are not allowed.")
    if perm == tuple(range(x.ndim)):
        return x
    return _view_prim(P.permute, x, perm=perm)


def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    if x.ndim == 0:
        return x
    a, b = normalize_axis(dim0, x.ndim, "transpose"), normalize_axis(dim1, x.ndim, "transpose")
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    if a == b:
        return x
    return _named(_view_prim(P.permute, x, perm=tuple(perm)), "TransposeBackward0")


swapaxes = swapdims = transpose


def t(x: Tensor) -> Tensor:
    if x.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {x.ndim}D")
    return _named(transpose(x, 0, 1), "TBackward0") if x.ndim == 2 else x


def movedim(x: Tensor, source, destination) -> Tensor:
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    src = [normalize_axis(s, x.ndim, "movedim") for s in src]
    dst = [normalize_axis(d, x.ndim, "movedim") for d in dst]
    if len(src) != len(dst):
        raise RuntimeError(f"movedim: Invalid source or destination dims: source ({src} dims) "
                           f"should contain the same number of dims as destination ({dst} dims)")
    for name, dims in (("source", src), ("destination", dst)):
        if len(set(dims)) != len(dims):
            raise RuntimeError(f"movedim: repeated dim in `{name}` ({dims})")
    order = [i for i in range(x.ndim) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return permute(x, *order)


def expand(x: Tensor, *sizes) -> Tensor:
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list, Size)):
        sizes = tuple(sizes[0])
    offset = len(sizes) - x.ndim
    if offset < 0:
        raise RuntimeError(
            f"expand(fusegrad.{_type_name(x)}{{{list(x.shape)}}}, size={list(sizes)}): the number "
            f"of sizes provided ({len(sizes)}) must be greater or equal to the number of "
            f"dimensions in the tensor ({x.ndim})")
    for i, d in enumerate(sizes):
        if d == -1 and i < offset:
            raise RuntimeError(f"expand: the expanded size of the tensor (-1) isn't allowed in a "
                               f"leading, non-existing dimension {i} (size={list(sizes)}, tensor "
                               f"size {list(x.shape)})")
        if d < -1:
            raise RuntimeError(f"expand: the expanded size of the tensor ({d}) must be "
                               f"non-negative (size={list(sizes)}, tensor size {list(x.shape)})")
    shape = tuple(x.shape[i - offset] if d == -1 and i >= offset else int(d)
                  for i, d in enumerate(sizes))
    if shape == tuple(x.shape):
        return x
    return _view_prim(P.broadcast_to, x, shape=shape)


def _type_name(x: Tensor) -> str:
    return x._type_string().split(".")[-1]


def expand_as(x: Tensor, other: Tensor) -> Tensor:
    return expand(x, tuple(other.shape))


def broadcast_to(x: Tensor, shape) -> Tensor:
    return expand(x, tuple(shape))


def broadcast_tensors(*tensors):
    shape = P.broadcast_shapes(*(tuple(t.shape) for t in tensors))
    return tuple(expand(t, shape) for t in tensors)


def squeeze(x: Tensor, dim=None) -> Tensor:
    if dim is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    else:
        axes = tuple(a for a in _dims(x, dim, "squeeze") if x.shape[a] == 1)
    if not axes:
        return x
    shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    name = "SqueezeBackward0" if dim is None else (
        "SqueezeBackward1" if isinstance(dim, (int, np.integer)) else "SqueezeBackward2")
    return _named(reshape_prim(x, shape), name)


def unsqueeze(x: Tensor, dim: int) -> Tensor:
    axis = normalize_axis(dim, x.ndim + 1, "unsqueeze")
    shape = list(x.shape)
    shape.insert(axis, 1)
    return _named(reshape_prim(x, tuple(shape)), "UnsqueezeBackward0")


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if x.ndim == 0:
        return reshape(x, (1,))
    s = normalize_axis(start_dim, x.ndim, "flatten")
    e = normalize_axis(end_dim, x.ndim, "flatten")
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    n = 1
    for d in x.shape[s:e + 1]:
        n *= d
    return reshape(x, tuple(x.shape[:s]) + (n,) + tuple(x.shape[e + 1:]))


def unflatten(x: Tensor, dim: int, sizes) -> Tensor:
    axis = normalize_axis(dim, x.ndim, "unflatten")
    given = list(sizes)
    sizes = list(sizes)
    if -1 in sizes:
        known = math.prod(d for d in sizes if d != -1)
        sizes[sizes.index(-1)] = x.shape[axis] // known if known else -1
    if math.prod(sizes) != x.shape[axis] or builtins.any(d < 0 for d in sizes):
        raise RuntimeError(f"unflatten: Provided sizes {given} don't multiply up to the size "
                           f"of dim {dim} ({x.shape[axis]}) in the input tensor of size "
                           f"{list(x.shape)}")
    return reshape(x, tuple(x.shape[:axis]) + tuple(sizes) + tuple(x.shape[axis + 1:]))


def slice_axes(x: Tensor, starts, stops, steps) -> Tensor:
    """The primitive slice; a no-op slice returns ``x`` itself."""
    if builtins.all(a == 0 and b == d and s == 1
                    for a, b, s, d in zip(starts, stops, steps, x.shape)):
        return x
    return _view_prim(P.slice_, x, starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))


def narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    _has_dims(x, dim, "narrow")
    axis = normalize_axis(dim, x.ndim, "narrow")
    size = x.shape[axis]
    if isinstance(start, Tensor):
        start = int(start)
    if start < 0:
        start += size
    if length < 0:
        raise RuntimeError(f"narrow(): length must be non-negative, got {length}.")
    if not 0 <= start <= size or start + length > size:
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({size}).")
    starts = [0] * x.ndim
    stops = list(x.shape)
    starts[axis], stops[axis] = start, start + length
    return slice_axes(x, starts, stops, [1] * x.ndim)


def _has_dims(x: Tensor, dim, op: str) -> None:
    """Ops that pick along a dim need one: a 0-d tensor has none (reductions accept dim 0)."""
    if x.ndim == 0:
        raise IndexError(f"{op}(): Dimension specified as {dim} but tensor has no dimensions")


def split(x: Tensor, split_size_or_sections, dim: int = 0):
    _has_dims(x, dim, "split")
    axis = normalize_axis(dim, x.ndim, "split")
    size = x.shape[axis]
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        if step < 0 or step == 0 and size:
            raise RuntimeError(f"split expects split_size be non-negative and nonzero unless the "
                               f"dimension size is 0, but got split_size={step} for dimension "
                               f"{dim} of size {size}")
        sizes = [builtins.min(step, size - i) for i in range(0, size, step)] if size else [0]
    else:
        sizes = list(split_size_or_sections)
        if builtins.sum(sizes) != size:
            raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {size} "
                               f"(input tensor's size at dimension {dim}), but got split_sizes="
                               f"{sizes}")
    name = "SplitBackward0" if isinstance(split_size_or_sections, int) else \
        "SplitWithSizesBackward0"
    out, start = [], 0
    for s in sizes:
        out.append(_named(narrow(x, axis, start, s), name, src=x))
        start += s
    return tuple(out)


def chunk(x: Tensor, chunks: int, dim: int = 0):
    _has_dims(x, dim, "chunk")
    axis = normalize_axis(dim, x.ndim, "chunk")
    if chunks <= 0:
        raise RuntimeError("chunk expects `chunks` to be greater than 0, got: " + str(chunks))
    step = -(-x.shape[axis] // chunks) if x.shape[axis] else 1
    return split(x, step, axis)


def unbind(x: Tensor, dim: int = 0):
    _has_dims(x, dim, "unbind")
    axis = normalize_axis(dim, x.ndim, "unbind")
    return tuple(_named(select(x, axis, i), "UnbindBackward0") for i in range(x.shape[axis]))


def select(x: Tensor, dim: int, index: int) -> Tensor:
    _has_dims(x, dim, "select")
    axis = normalize_axis(dim, x.ndim, "select")
    size = x.shape[axis]
    if not -size <= index < size:
        raise IndexError(f"index {index} is out of bounds for dimension {axis} with size {size}")
    index %= size
    part = narrow(x, axis, index, 1)
    shape = tuple(d for i, d in enumerate(x.shape) if i != axis)
    return _named(reshape_prim(part, shape), "SelectBackward0")


def pad_axes(x: Tensor, widths, value=0.0) -> Tensor:
    widths = tuple((int(lo), int(hi)) for lo, hi in widths)
    if builtins.all(w == (0, 0) for w in widths):
        return x
    return bind(P.pad, x, widths=widths, value=value)


def cat(tensors, dim: int = 0) -> Tensor:
    """Concatenate along an existing ``dim``."""
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("cat(): expected a non-empty list of Tensors")
    for i, t in enumerate(tensors):
        if t.ndim == 0:
            raise RuntimeError(f"zero-dimensional tensor (at position {i}) cannot be concatenated")
    ref = builtins.max(tensors, key=lambda t: t.ndim)
    tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0) or t is ref]
    axis = normalize_axis(dim, ref.ndim, "cat")
    target = dtypes.result_type(*tensors)
    tensors = [cast(t, target) for t in tensors]
    if len(tensors) == 1:
        return clone(tensors[0])
    return bind(P.concat, *tensors, axis=axis)


concat = concatenate = cat


def stack(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("stack expects a non-empty TensorList")
    shape = tuple(tensors[0].shape)
    for i, t in enumerate(tensors):
        if tuple(t.shape) != shape:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got {list(shape)} "
                               f"at entry 0 and {list(t.shape)} at entry {i}")
    axis = normalize_axis(dim, len(shape) + 1, "stack")
    return _named(cat([unsqueeze(t, axis) for t in tensors], axis), "StackBackward0")


def hstack(tensors) -> Tensor:
    tensors = list(tensors)
    return cat(tensors, 0 if tensors[0].ndim == 1 else 1)


def vstack(tensors) -> Tensor:
    return cat([t if t.ndim >= 2 else reshape(t, (1, -1)) for t in tensors], 0)


def repeat(x: Tensor, *sizes) -> Tensor:
    """Tile ``x``: ``repeat(2, 3)`` repeats dim -2 twice and dim -1 three times."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list, Size)):
        sizes = tuple(sizes[0])
    if len(sizes) < x.ndim:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of "
                           "dimensions of tensor")
    if builtins.any(r < 0 for r in sizes):
        raise RuntimeError(f"repeat: Trying to create tensor with negative dimension: repeats "
                           f"{list(sizes)} of a tensor of size {list(x.shape)}")
    x = reshape_prim(x, (1,) * (len(sizes) - x.ndim) + tuple(x.shape))
    # Broadcast a new axis in front of each dim, then merge each pair.
    inter = []
    for d in x.shape:
        inter += [1, d]
    y = reshape_prim(x, tuple(inter))
    full = []
    for r, d in zip(sizes, x.shape):
        full += [r, d]
    y = expand(y, tuple(full))
    out = reshape(y, tuple(r * d for r, d in zip(sizes, x.shape)))
    if out._trace is None and np.shares_memory(out._data, x._data):
        # Repeats of 1 (or of a size-1 dim) leave a view; repeat always owns its memory.
        out = clone(out)
    return _named(out, "RepeatBackward0")


def repeat_interleave(x: Tensor, repeats, dim: int | None = None) -> Tensor:
    """Repeat each element ``repeats`` times along ``dim`` (the flattened input if None)."""
    if isinstance(repeats, Tensor):
        if repeats.numel() != 1:
            counts = repeats._data.reshape(-1) if repeats._trace is None else None
            if counts is None:
                raise NotImplementedError("repeat_interleave with per-element repeats under a "
                                          "trace (the output shape depends on data)")
            axis = 0 if dim is None else normalize_axis(dim, x.ndim, "repeat_interleave")
            src = flatten(x) if dim is None else x
            return take(src, _index_tensor(np.repeat(np.arange(src.shape[axis]), counts)), axis)
        repeats = int(repeats.item())
    if dim is None:
        x, dim = flatten(x), 0
    axis = normalize_axis(dim, x.ndim, "repeat_interleave")
    shape = list(x.shape)
    y = unsqueeze(x, axis + 1)
    expanded = shape[:axis + 1] + [repeats] + shape[axis + 1:]
    y = expand(y, tuple(expanded))
    shape[axis] *= repeats
    return reshape(y, tuple(shape))


def flip(x: Tensor, dims) -> Tensor:
    if isinstance(dims, int):
        dims = (dims,)
    axes = [normalize_axis(d, x.ndim, "flip") for d in dims]
    if len(set(axes)) != len(axes):
        raise RuntimeError(f"flip: dim {list(dims)} appears multiple times in the list of dims")
    out = x
    for d in dims:
        axis = normalize_axis(d, x.ndim, "flip")
        n = x.shape[axis]
        idx = _index_tensor(np.arange(n - 1, -1, -1))
        out = take(out, idx, axis)
    return _named(out, "FlipBackward0", src=x)


def roll(x: Tensor, shifts, dims=None) -> Tensor:
    if dims is None:
        return reshape(roll(flatten(x), shifts, 0), tuple(x.shape))
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    out = x
    for s, d in zip(shifts, dims):
        axis = normalize_axis(d, x.ndim, "roll")
        n = x.shape[axis]
        out = take(out, _index_tensor((np.arange(n) - s) % n), axis)
    return _named(out, "RollBackward0", src=x)


# --------------------------------------------------------------------------- matmul


def matmul_nd(a: Tensor, b: Tensor) -> Tensor:
    return bind(P.matmul, a, b)


def matmul(x: Tensor, other: Tensor) -> Tensor:
    """Matrix product with torch's rules for 1-D, 2-D and batched (broadcast) operands."""
    if not isinstance(other, Tensor) or not isinstance(x, Tensor):
        raise TypeError(f"matmul(): argument 'other' must be Tensor, not {type(other).__name__}")
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


def mm(x: Tensor, other: Tensor) -> Tensor:
    if x.ndim != 2 or other.ndim != 2:
        raise RuntimeError(f"{'self' if x.ndim != 2 else 'mat2'} must be a matrix")
    return matmul(x, other)


def bmm(x: Tensor, other: Tensor) -> Tensor:
    if x.ndim != 3 or other.ndim != 3:
        raise RuntimeError("batch1 must be a 3D tensor" if x.ndim != 3 else
                           "batch2 must be a 3D tensor")
    if x.shape[0] != other.shape[0]:
        raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: "
                           f"[{x.shape[0]}, {x.shape[2]}] but got: [{other.shape[0]}, "
                           f"{other.shape[1]}].")
    return matmul(x, other)


def dot(x: Tensor, other: Tensor) -> Tensor:
    if x.ndim != 1 or other.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {x.ndim}D and {other.ndim}D tensors")
    return matmul(x, other)


def mv(x: Tensor, vec: Tensor) -> Tensor:
    return matmul(x, vec)


def outer(x: Tensor, other: Tensor) -> Tensor:
    return mul(unsqueeze(x, 1), unsqueeze(other, 0))


# --------------------------------------------------------------------------- index ops


def _index_tensor(values) -> Tensor:
    return Tensor._wrap(np.asarray(values, dtype=np.int64), dtypes.int64)


def take(x: Tensor, idx: Tensor, axis: int) -> Tensor:
    return bind(P.take, x, cast(idx, dtypes.int64), axis=axis)


def take_add(x: Tensor, idx: Tensor, src: Tensor, axis: int) -> Tensor:
    return bind(P.index_add, x, cast(idx, dtypes.int64), src, axis=axis)


def index_select(x: Tensor, dim: int, index: Tensor) -> Tensor:
    if index.ndim > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    if index.dtype.category != 1:
        raise IndexError(f"index_select(): Expected dtype int32/int64 for index but got: "
                         f"{index.dtype}")
    axis = normalize_axis(dim, x.ndim, "index_select") if x.ndim else 0
    return take(x, reshape_prim(index, (index.numel(),)) if index.ndim == 0 else index, axis)


def index_add(x: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1) -> Tensor:
    axis = normalize_axis(dim, x.ndim, "index_add")
    if alpha != 1:
        source = mul(source, alpha)
    return take_add(x, index, cast(source, x.dtype), axis)


def gather(x: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    if index.dtype.category != 1:
        raise RuntimeError(f"gather(): Expected dtype int64 for index, got {index.dtype}")
    index = cast(index, dtypes.int64)
    axis = normalize_axis(dim, x.ndim, "gather") if x.ndim else 0
    return bind(P.gather, x, index, axis=axis)


def take_along_dim(x: Tensor, indices: Tensor, dim: int) -> Tensor:
    axis = normalize_axis(dim, x.ndim, "take_along_dim")
    if indices.ndim != x.ndim:
        raise RuntimeError(f"take_along_dim(): input and indices should have the same number of "
                           f"dimensions, but got {x.ndim} dimensions for input, and {indices.ndim} "
                           f"dimensions for indices")
    # Broadcast all dims but ``axis``, where the two sizes differ by design.
    shape = list(P.broadcast_shapes(
        tuple(1 if i == axis else d for i, d in enumerate(x.shape)),
        tuple(1 if i == axis else d for i, d in enumerate(indices.shape)), op="take_along_dim"))
    shape_x, shape_i = list(shape), list(shape)
    shape_x[axis], shape_i[axis] = x.shape[axis], indices.shape[axis]
    return gather(expand(x, shape_x), axis, expand(indices, shape_i))


def scatter_add(x: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    axis = normalize_axis(dim, x.ndim, "scatter_add")
    return bind(P.scatter_add, x, index, cast(src, x.dtype), axis=axis)


def masked_fill(x: Tensor, mask: Tensor, value) -> Tensor:
    if mask.dtype is not dtypes.bool_:
        raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype "
                           f"{mask.dtype.name}")
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but got "
                               f"tensor with {value.ndim} dimension(s).")
        value = cast(value, x.dtype)
    else:
        value = _scalar_tensor(value, x.dtype)
    out = bind(P.where, mask, value, x)
    if tuple(out.shape) != tuple(x.shape):
        raise RuntimeError(f"masked_fill: mask of shape {list(mask.shape)} broadcasts the input "
                           f"of shape {list(x.shape)} to {list(out.shape)}")
    return _named(out, "MaskedFillBackward0")


def _tri_mask(x: Tensor, diagonal: int, upper: bool) -> Tensor:
    from fusegrad.ops.creation import _source
    rows, cols = x.shape[-2], x.shape[-1]
    r = _source(P.iota, x, shape=(rows, cols), axis=0, dtype=dtypes.int64)
    c = _source(P.iota, x, shape=(rows, cols), axis=1, dtype=dtypes.int64)
    d = sub(c, r)
    return ge(d, diagonal) if upper else le(d, diagonal)


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    if x.ndim < 2:
        raise RuntimeError("tril: input tensor must have at least 2 dimensions")
    return _named(where(_tri_mask(x, diagonal, False), x, zeros_like_scalar(x)), "TrilBackward0")


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    if x.ndim < 2:
        raise RuntimeError("triu: input tensor must have at least 2 dimensions")
    return _named(where(_tri_mask(x, diagonal, True), x, zeros_like_scalar(x)), "TriuBackward0")


def zeros_like_scalar(x: Tensor) -> Tensor:
    return _scalar_tensor(0, x.dtype)


SortResult = namedtuple("sort", ["values", "indices"])
TopkResult = namedtuple("topk", ["values", "indices"])


def argsort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    axis = normalize_axis(dim, x.ndim, "argsort") if x.ndim else 0
    return bind(P.argsort, x, axis=axis, descending=bool(descending))


def sort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False):
    """(values, indices) sorted along ``dim``; the values are a gather, so differentiable."""
    idx = argsort(x, dim, descending)
    if x.ndim == 0:
        return SortResult(x, idx)
    axis = normalize_axis(dim, x.ndim)
    return SortResult(_named(gather(x, axis, idx), "SortBackward0"), idx)


def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):  # noqa: A002
    axis = normalize_axis(dim, x.ndim, "topk") if x.ndim else 0
    size = x.shape[axis] if x.ndim else 1
    if not 0 <= k <= size:
        raise RuntimeError("selected index k out of range")
    idx = argsort(x, axis, descending=largest)
    idx = narrow(idx, axis, 0, k) if x.ndim else idx
    values = gather(x, axis, idx) if x.ndim else x
    return TopkResult(_named(values, "TopkBackward0", src=x), idx)


def nonzero(x: Tensor, *, as_tuple: bool = False):
    """Indices of nonzero elements (data-dependent shape: eager only)."""
    x._check_concrete("nonzero()")
    idx = np.nonzero(x._data)
    if as_tuple:
        return tuple(_index_tensor(i) for i in idx)
    return _index_tensor(np.stack(idx, axis=1) if idx else np.zeros((1, 0)))


def argwhere(x: Tensor) -> Tensor:
    return nonzero(x)


def masked_select(x: Tensor, mask: Tensor) -> Tensor:
    x, mask = broadcast_tensors(x, mask)
    return _named(getitem(x, mask), "MaskedSelectBackward0")


# --------------------------------------------------------------------------- __getitem__


def _normalize_key(key) -> tuple:
    if not isinstance(key, tuple):
        key = (key,)
    return key


def getitem(x: Tensor, key) -> Tensor:
    """Basic indexing (ints, slices with positive steps, None, ...) is a view; integer-tensor
    and boolean-mask indexing gathers a copy, following numpy's (and torch's) rules."""
    key = _normalize_key(key)
    # Expand the Ellipsis and count the dims each entry consumes.
    def consumes(k):
        if k is None:
            return 0
        if isinstance(k, Tensor) and k.dtype is dtypes.bool_:
            return builtins.max(k.ndim, 1) if k.ndim else 0
        if isinstance(k, np.ndarray) and k.dtype == np.bool_:
            return k.ndim
        return 1
    n_ell = builtins.sum(1 for k in key if k is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = builtins.sum(consumes(k) for k in key if k is not Ellipsis)
    if used > x.ndim:
        raise IndexError(f"too many indices for tensor of dimension {x.ndim}")
    if n_ell:
        i = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (x.ndim - used) + key[i + 1:]
    else:
        key = key + (slice(None),) * (x.ndim - used)

    # Pass 1: slices and integers as a strided slice; None and ints reshape.
    starts, stops, steps = [], [], []
    out_shape: list[int] = []
    advanced: list[tuple[int, object]] = []   # (position in the sliced result, index)
    view_name = None     # torch names a basic index by its last non-trivial entry
    dim = 0
    for k in key:
        if k is None:
            out_shape.append(1)
            view_name = "UnsqueezeBackward0"
            continue
        size = x.shape[dim]
        if isinstance(k, (bool, np.bool_)):
            raise IndexError("boolean scalar indices are not supported")
        if isinstance(k, (int, np.integer)) or (isinstance(k, Tensor) and k.ndim == 0 and
                                                k.dtype.category == 1 and k._trace is None):
            i = int(k)
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")
            i %= size
            starts.append(i), stops.append(i + 1), steps.append(1)
            view_name = "SelectBackward0"
            dim += 1
            continue
        if isinstance(k, slice):
            if k.step is not None and int(k.step) <= 0:
                raise ValueError("step must be greater than zero")
            a, b, s = k.indices(size)
            b = builtins.max(b, a)
            starts.append(a), stops.append(b), steps.append(s)
            out_shape.append((b - a + s - 1) // s)
            if (a, b, s) != (0, size, 1):
                view_name = "SliceBackward0"
            dim += 1
            continue
        if isinstance(k, (list, np.ndarray)) and not isinstance(k, Tensor):
            from fusegrad.ops.creation import tensor as make_tensor
            k = make_tensor(k)
        if isinstance(k, Tensor):
            if k.dtype is dtypes.bool_:
                nd = builtins.max(k.ndim, 1)
                if tuple(k.shape) != tuple(x.shape[dim:dim + k.ndim]):
                    raise IndexError(f"The shape of the mask {list(k.shape)} at index {dim} does "
                                     f"not match the shape of the indexed tensor "
                                     f"{list(x.shape[dim:dim + k.ndim])}")
                for _ in range(nd):
                    starts.append(0), stops.append(x.shape[dim]), steps.append(1)
                    dim += 1
                advanced.append((len(out_shape), k))
                out_shape.extend(x.shape[dim - nd:dim])
                continue
            if k.dtype.category != 1:
                raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
            starts.append(0), stops.append(size), steps.append(1)
            advanced.append((len(out_shape), k))
            out_shape.append(size)
            dim += 1
            continue
        raise IndexError(f"only integers, slices (`:`), ellipsis (`...`), None and long or byte "
                         f"tensors are valid indices (got {type(k).__name__})")
    out = slice_axes(x, starts, stops, steps)
    out = reshape_prim(out, tuple(out_shape))
    if not advanced:
        return _named(out, view_name, src=x) if view_name else out
    return _advanced_index(out, advanced)


def _advanced_index(x: Tensor, advanced: list) -> Tensor:
    """Gather with integer/boolean index tensors at the given positions of ``x``."""
    # Boolean masks become integer index tensors, one per masked dim (data-dependent).
    items = []
    for pos, k in advanced:
        if k.dtype is dtypes.bool_:
            k._check_concrete("boolean mask indexing")
            nz = np.nonzero(k._data.reshape(k.shape if k.ndim else (1,)))
            for j, idx in enumerate(nz):
                items.append((pos + j, _index_tensor(idx)))
        else:
            items.append((pos, k))
    positions = [p for p, _ in items]
    idx_shape = P.broadcast_shapes(*(tuple(k.shape) for _, k in items), op="index")
    adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
    if not adjacent:
        # numpy's rule: non-adjacent advanced indices put the result dims first.
        rest = [i for i in range(x.ndim) if i not in positions]
        x = permute(x, *(positions + rest))
        positions = list(range(len(positions)))
    first = positions[0]
    sizes = [x.shape[p] for p in positions]
    # Linearize the indexed dims into one and take along it.
    linear = None
    stride = 1
    for (p, k), size in reversed(list(zip(items, sizes))):
        if k._trace is None:
            # Check each index against its own dim: once linearized, an index past the end
            # of one dim would silently land in the next row.
            P._bounds("index", k._data, size, p)
        k = expand(cast(k, dtypes.int64), idx_shape)
        k = where(lt(k, 0), add(k, size), k)
        term = mul(k, stride) if stride != 1 else k
        linear = term if linear is None else add(linear, term)
        stride *= size
    merged_shape = tuple(x.shape[:first]) + (stride,) + tuple(x.shape[first + len(positions):])
    flat = reshape(x, merged_shape)
    return _named(take(flat, linear, first), "IndexBackward0")


# --------------------------------------------------------------------------- in-place


def _is_grad_leaf(t: Tensor) -> bool:
    """A leaf that requires grad; under a trace, an input standing for one (an argument,
    parameter or captured tensor; the trace records which), not yet written."""
    if not t._requires_grad:
        return False
    if t._trace is None:
        return t.is_leaf
    return t._value in t._trace.grad_leaves


def _check_inplace(x: Tensor, op: str) -> None:
    if is_grad_enabled():
        if _is_grad_leaf(x):
            raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                               "operation.")
        base = x._base
        if base is not None and _is_grad_leaf(base):
            raise RuntimeError("a view of a leaf Variable that requires grad is being used in an "
                               "in-place operation.")
    if x._trace is not None:
        return
    if not x._data.flags.writeable:
        raise RuntimeError(
            f"{op}: unsupported operation: more than one element of the written-to tensor refers "
            "to a single memory location. Please clone() the tensor before performing the "
            "operation.")


def assign_(x: Tensor, value: Tensor, op: str = "copy_") -> Tensor:
    """Write ``value`` (a result of x's shape) into ``x``; rebase x's autograd history.

    This is how every in-place op works: compute out of place, then write back. Under a
    trace, the tracer rebinds ``x`` to the new value (functionalization).
    """
    if x._trace is not None:
        _check_inplace(x, op)
        return x._trace.assign(x, value)
    if _primitive.CAPTURE:
        # Tracing a compiled function: a write to a tensor from outside it (a parameter, an
        # optimizer's state) becomes an output written back at call time.
        return _primitive.CAPTURE[-1].assign_concrete(x, value, op)
    if value._trace is not None:
        value._check_concrete(
            f"{op}: an in-place write into a tensor captured from outside the traced function "
            f"({x.dtype.short}[{','.join(map(str, x.shape))}])",
            "and a graph made by fusegrad.trace cannot update a tensor it does not take as an "
            "argument. Pass the tensor as an argument (in-place updates of arguments become "
            "outputs), or compile the function with fusegrad.compile, which writes such "
            "updates back on each call.")
    if x._base is not None:
        _refresh_view(x)
    _check_inplace(x, op)
    if tuple(value.shape) != tuple(x.shape):
        shape = P.broadcast_shapes(tuple(value.shape), tuple(x.shape), op=op)
        if shape != tuple(x.shape):
            raise RuntimeError(f"{op}: output with shape {list(x.shape)} doesn't match the "
                               f"broadcast shape {list(shape)}")
        value = expand(value, tuple(x.shape))
    if value.dtype is not x.dtype:
        if value.dtype.category > x.dtype.category and op != "copy_":
            raise RuntimeError(f"result type {_dtype_title(value.dtype)} can't be cast to the "
                               f"desired output type {_dtype_title(x.dtype)}")
        value = cast(value, x.dtype)
    grad = is_grad_enabled()
    if grad and not value._requires_grad and x.grad_fn is not None:
        # A constant written over a tensor with history (fill_, zero_, copy_ of a constant):
        # x stays in the graph and passes a zero gradient to what it was (torch's
        # FillBackward0), rather than turning into a leaf.
        value = bind(P.where, _scalar_tensor(True, dtypes.bool_), value, x)
    np.copyto(x._data, value._data)
    x._version_counter.value += 1
    # Under no_grad an in-place write leaves the history as it is, as in torch.
    if grad and value._requires_grad:
        if value.grad_fn is None:
            # A leaf written into x: x's new history is an identity edge to that leaf.
            value = bind(P.copy, value)
        _rebase_history(x, value)
    return x


def _dtype_title(dt: dtypes.DType) -> str:
    return {"float32": "Float", "float64": "Double", "int64": "Long", "int32": "Int",
            "float16": "Half", "bool": "Bool"}.get(dt.name, dt.name)


class _CopySlices(Node):
    """New history of a base tensor after an in-place op wrote through one of its views."""

    __slots__ = ("_view_ops", "_op_node", "_shape")

    def __init__(self, base: Tensor, view_ops, op_node):
        super().__init__((_edge(base), (op_node, 0)), "CopySlices")
        self._view_ops = view_ops
        self._op_node = op_node
        self._shape = tuple(base.shape)

    def apply(self, grad, create_graph, retain_graph):
        # Which base elements the view covers: the view ops applied to an array of flat
        # positions. (Applied to the gradient itself, a reshape that meets a layout other than
        # the base's silently copies, and zeroing the copy would zero nothing.) Tensor ops, so
        # that create_graph records this backward too.
        n = int(np.prod(self._shape, dtype=np.int64))
        positions = _apply_view_ops(np.arange(n).reshape(self._shape), self._view_ops)
        keep = np.ones(n, dtype=grad.dtype.np_dtype)
        keep[positions.reshape(-1)] = 0
        flat = reshape(grad, (n,))
        g_view = reshape(take(flat, _index_tensor(positions.reshape(-1)), 0), positions.shape)
        g_base = mul(grad, Tensor._wrap(keep.reshape(self._shape), grad.dtype))
        return g_base, g_view


def _apply_view_ops(a: np.ndarray, view_ops) -> np.ndarray:
    for prim, attrs in view_ops:
        a = prim.impl(a, **attrs)
    return a


def _rebase_history(x: Tensor, value: Tensor) -> None:
    if x._base is None:
        x.grad_fn = value.grad_fn if value._requires_grad else None
        x._requires_grad = value._requires_grad or x._requires_grad
        return
    # Written through a view: the base's new history routes the view's region to the
    # in-place op's graph and the rest to the base's old history (torch's CopySlices).
    base = x._base
    if value.grad_fn is None:
        return
    base.grad_fn = _CopySlices(base, x._view_ops, value.grad_fn)
    base._requires_grad = True
    # The view now reads from the base's new history.
    v = base
    for prim, attrs in x._view_ops:
        v = bind(prim, v, **attrs)
    x.grad_fn = v.grad_fn
    x._requires_grad = True
    x._view_version = x._version_counter.value


def _original_self(x: Tensor) -> Tensor:
    """The operand an in-place op computes from. Under autograd it is a copy of x's values
    carrying x's history: the op's backward may read x (log_, mul_ by a tensor, pow_), and
    the write that follows would otherwise invalidate it (torch saves ``original_self``)."""
    if x._trace is not None or not is_grad_enabled():
        return x
    if x._base is not None:
        _refresh_view(x)
    if not x._requires_grad or x.grad_fn is None:   # a leaf requiring grad: assign_ refuses
        return x
    s = Tensor._wrap(x._data.copy(), x._dtype)
    s.grad_fn, s._requires_grad = x.grad_fn, True
    return s


def _inplace(fn, name):
    def op(x, *args, **kwargs):
        return assign_(x, fn(_original_self(x), *args, **kwargs), name)
    op.__name__ = name
    op.__doc__ = f"In-place :func:`{fn.__name__}`."
    return op


def copy_(x: Tensor, src, non_blocking: bool = False) -> Tensor:
    src = as_tensor_operand(src)
    return assign_(x, src, "copy_")


def fill_(x: Tensor, value) -> Tensor:
    if isinstance(value, Tensor):
        return assign_(x, expand(cast(value, x.dtype), tuple(x.shape)), "fill_")
    with no_grad():
        filled = _scalar_tensor(value, x.dtype)
    return assign_(x, expand(filled, tuple(x.shape)), "fill_")


def zero_(x: Tensor) -> Tensor:
    return fill_(x, 0)


def setitem(x: Tensor, key, value) -> None:
    """``x[key] = value``: writes through the view ``x[key]`` (or scatters for tensor keys)."""
    if isinstance(key, tuple) and len(key) == 1:
        key = key[0]
    if isinstance(key, Tensor) and key.dtype is dtypes.bool_ and key.shape == x.shape:
        # x[mask] = scalar; a tensor of values fills the selected elements in order (below).
        single = as_tensor_operand(value, x.dtype)
        if single.numel() == 1:
            assign_(x, where(key, reshape(single, ()), x), "index_put_")
            return
    target = getitem(x, key)
    if x._trace is not None and target._base is None:
        # Under a trace an advanced index gathers a symbolic copy: scatter the new values
        # into x's flat positions instead (a position given twice gets the sum of the
        # differences, where eager lets the last write win).
        flat_idx = reshape(getitem(_index_tensor(np.arange(x.numel()).reshape(tuple(x.shape))),
                                   key), (-1,))
        values = reshape(expand(as_tensor_operand(value, x.dtype), tuple(target.shape)), (-1,))
        flat = reshape(x, (x.numel(),))
        updated = bind(P.index_add, flat, flat_idx, sub(cast(values, x.dtype),
                                                       take(flat, flat_idx, 0)), axis=0)
        assign_(x, reshape(updated, tuple(x.shape)), "index_put_")
        return
    if target._base is None and target._trace is None and not np.shares_memory(target._data,
                                                                               x._data):
        # Advanced indexing produced a copy: write it back elementwise via a mask of flat
        # positions (eager only).
        flat_idx = getitem(_index_tensor(np.arange(x.numel()).reshape(tuple(x.shape))), key)
        value = expand(as_tensor_operand(value, x.dtype), tuple(flat_idx.shape))
        flat = reshape(x, (x.numel(),))
        idx, values = reshape(flat_idx, (-1,)), reshape(value, (-1,))
        positions = idx._data
        _, last = np.unique(positions[::-1], return_index=True)
        if len(last) != positions.size:
            # A position written twice: the last write wins, as on torch's CPU (adding the
            # differences below would sum them instead).
            keep = _index_tensor(np.sort(positions.size - 1 - last))
            idx, values = take(idx, keep, 0), take(values, keep, 0)
        updated = bind(P.index_add, mul(flat, 1), idx, sub(values, take(flat, idx, 0)), axis=0)
        assign_(x, reshape(updated, tuple(x.shape)), "index_put_")
        return
    value = as_tensor_operand(value, x.dtype) if not isinstance(value, Tensor) else value
    copy_(target, expand(cast(value, x.dtype), tuple(target.shape)))


# --------------------------------------------------------------------------- creation helpers


def zeros_like(x: Tensor, *, dtype=None, requires_grad: bool = False, **_) -> Tensor:
    from fusegrad.ops.creation import full_like
    return full_like(x, 0, dtype=dtype, requires_grad=requires_grad)


def ones_like(x: Tensor, *, dtype=None, requires_grad: bool = False, **_) -> Tensor:
    from fusegrad.ops.creation import full_like
    return full_like(x, 1, dtype=dtype, requires_grad=requires_grad)


def new_zeros(x: Tensor, *size, dtype=None, requires_grad: bool = False, **_) -> Tensor:
    from fusegrad.ops.creation import _new_full
    return _new_full(x, size, 0, dtype, requires_grad)


def new_ones(x: Tensor, *size, dtype=None, requires_grad: bool = False, **_) -> Tensor:
    from fusegrad.ops.creation import _new_full
    return _new_full(x, size, 1, dtype, requires_grad)


def new_full(x: Tensor, size, fill_value, *, dtype=None, requires_grad: bool = False,
             **_) -> Tensor:
    from fusegrad.ops.creation import _new_full
    return _new_full(x, (size,), fill_value, dtype, requires_grad)


def new_empty(x: Tensor, *size, dtype=None, requires_grad: bool = False, **_) -> Tensor:
    return new_zeros(x, *size, dtype=dtype, requires_grad=requires_grad)


def new_tensor(x: Tensor, data, *, dtype=None, requires_grad: bool = False, **_) -> Tensor:
    from fusegrad.ops.creation import tensor
    return tensor(data, dtype=dtype or x.dtype, requires_grad=requires_grad)
