"""In-place ops: version counters, leaf checks, view rebasing, ``copy_``/``fill_``/``setitem``,
and the wrapper that turns an out-of-place op into its ``op_`` variant.
"""

from __future__ import annotations

import numpy as np

from fusegrad import dtypes
from fusegrad.grad_mode import is_grad_enabled, no_grad
from fusegrad.ops import primitive as _primitive
from fusegrad.ops import prims as P
from fusegrad.ops.dual import assign_tangents, get_tangent, hidden, set_tangent
from fusegrad.ops.elementwise import mul, where
from fusegrad.ops.indexing import getitem
from fusegrad.ops.movement import expand, reshape, squeeze, t, transpose, unsqueeze
from fusegrad.ops.operands import _dtype_title, _index_tensor, _scalar_tensor, as_tensor_operand, cast, take
from fusegrad.ops.primitive import bind, device_copy_into
from fusegrad.ops.registry import public
from fusegrad.ops.slicing import index_copy, masked_scatter
from fusegrad.ops.tape import Node, _edge, _refresh_view, keep_retained
from fusegrad.tensor import Tensor


def _is_grad_leaf(t: Tensor) -> bool:
    """A leaf that requires grad; under a trace, an input standing for one (an argument,
    parameter or captured tensor; the trace records which), not yet written."""
    if not t._requires_grad:
        return False
    if t._trace is None:
        return t.is_leaf
    return t._value in t._trace.grad_leaves


def _check_inplace(x: Tensor, op: str, writes: bool = True) -> None:
    """torch's refusals of an in-place op on ``x``: on a leaf that requires grad (or a view
    of one) under grad mode, and, for an op that ``writes`` values, on memory that holds
    one element for several (an expand)."""
    if is_grad_enabled():
        if _is_grad_leaf(x):
            raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                               "operation.")
        base = x._base
        if base is not None and _is_grad_leaf(base):
            raise RuntimeError("a view of a leaf Variable that requires grad is being used in an "
                               "in-place operation.")
    if x._trace is not None or not writes:
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
    if value.dtype is not x.dtype and value.dtype.category > x.dtype.category and op != "copy_":
        # torch's refusal, eager and traced alike: int.add_(float) does not truncate.
        raise RuntimeError(f"{op}: result type {_dtype_title(value.dtype)} can't be cast to "
                           f"the desired output type {_dtype_title(x.dtype)}")
    if x._trace is not None:
        _check_inplace(x, op)
        out = x._trace.assign(x, value)
        assign_tangents(x, value)
        return out
    if _primitive.compiling():
        # Tracing a compiled function: a write to a tensor from outside it (a parameter, an
        # optimizer's state) becomes an output written back at call time.
        return _primitive.assign_captured(x, value, op)
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
        value = cast(value, x.dtype)
    grad = is_grad_enabled()
    if grad and x.grad_fn is not None and (not value._requires_grad or
                                            _overwrites(x, value, op)):
        # A value that does not depend on x written over a tensor with history (fill_,
        # zero_, copy_): x stays in the graph and passes a zero gradient to what it was
        # (torch's FillBackward0, CopyBackwards), rather than turning into a leaf, or
        # leaving what it was with no gradient (.grad None where torch has zeros).
        value = bind(P.where, _scalar_tensor(True, dtypes.bool_), value, x)
    if grad and value._requires_grad and x._base is not None:
        _check_part_views(x, op)
    if isinstance(x._data, np.ndarray):
        np.copyto(x._data, value._data)
    else:                               # a cuda tensor: into its device buffer
        device_copy_into(x._data, value._data)
    x._version_counter.value += 1
    if x._base is not None and (x._base._fw_grads is not None or value._fw_grads is not None):
        _assign_base_tangents(x, value)
    assign_tangents(x, value)
    # Under no_grad an in-place write leaves the history as it is, as in torch.
    if grad and value._requires_grad:
        if value.grad_fn is None:
            # A leaf written into x: x's new history is an identity edge to that leaf.
            value = bind(P.copy, value)
        _rebase_history(x, value)
    return x




def _assign_base_tangents(x: Tensor, value: Tensor) -> None:
    """Forward mode's side of a write through a view: at each level, the base's tangent
    becomes its old tangent (zeros if it had none) with the view's region replaced by
    ``value``'s tangent (zeros if it has none), as torch's tangent of the base is."""
    base = x._base
    levels = set(base._fw_grads or ()) | set(value._fw_grads or ())
    n = int(np.prod(base.shape, dtype=np.int64))
    positions = _apply_view_ops(np.arange(n).reshape(tuple(base.shape)),
                                x._version_counter.undo + x._view_ops).reshape(-1)
    covered = np.zeros(n, dtype=bool)
    covered[positions] = True
    source = np.zeros(n, dtype=np.int64)       # each covered base element's place in the view
    source[positions] = np.arange(positions.size)
    for level in sorted(levels):
        with hidden(level):
            old = get_tangent(base, level)
            new = get_tangent(value, level)
            flat_old = (reshape(old, (n,)) if old is not None else
                        Tensor._wrap(np.zeros(n, base.dtype.np_dtype), base.dtype))
            if new is None:
                new = Tensor._wrap(np.zeros(tuple(x.shape), base.dtype.np_dtype), base.dtype)
            if new.dtype is not base.dtype:
                new = cast(new, base.dtype)
            spread = take(reshape(expand(new, tuple(x.shape)), (positions.size,)),
                          _index_tensor(source, like=flat_old), 0)
            mask = Tensor._wrap(covered, dtypes.bool_)
            merged = reshape(where(mask, spread, flat_old), tuple(base.shape))
        set_tangent(base, level, merged)


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
        g_view = reshape(take(flat, _index_tensor(positions.reshape(-1), like=grad), 0),
                         positions.shape)
        keep = Tensor._wrap(keep.reshape(self._shape), grad.dtype)
        if grad._trace is None and not isinstance(grad._data, np.ndarray):
            keep = keep.to(grad.device)          # a cuda gradient
        g_base = mul(grad, keep)
        return g_base, g_view


def _apply_view_ops(a: np.ndarray, view_ops) -> np.ndarray:
    for prim, attrs in view_ops:
        a = prim.impl(a, **attrs)
    return a


# In-place ops whose written value need not depend on the tensor written.
_OVERWRITES = frozenset({"copy_", "fill_"})


def _overwrites(x: Tensor, value: Tensor, op: str) -> bool:
    """Whether ``op`` writes a value not computed from ``x`` itself: a copy or fill, unless
    the value is made directly from x (the in-place activations copy their result into x,
    and x's history already gets its gradient through that result's node)."""
    if op not in _OVERWRITES:
        return False
    node = value.grad_fn
    return node is None or all(n is not x.grad_fn for n, _ in node.next_functions)


# Views of a complex tensor's parts (their elements are halves of the base's elements).
_PART_VIEWS = frozenset({P.real, P.imag, P.view_as_real, P.view_as_complex})


def _check_part_views(x: Tensor, op: str) -> None:
    """Refuse, before writing, an in-place op that autograd records through a view of a
    complex tensor's parts: CopySlices routes the gradient by element positions, and such a
    view splits the base's elements, which positions cannot say."""
    parts = [prim.name for prim, _ in x._version_counter.undo + x._view_ops
             if prim in _PART_VIEWS]
    if parts:
        raise NotImplementedError(
            f"{op}: an in-place write through {parts[0]}() of a tensor that autograd records is "
            f"not supported by fusegrad; build the new value out of place (torch.complex(re, "
            f"im), torch.view_as_complex) instead")


def _rebase_history(x: Tensor, value: Tensor) -> None:
    if x._base is None:
        x.grad_fn = value.grad_fn if value._requires_grad else None
        x._requires_grad = value._requires_grad or x._requires_grad
        keep_retained(x)
        return
    # Written through a view: the base's new history routes the view's region to the
    # in-place op's graph and the rest to the base's old history (torch's CopySlices).
    base = x._base
    if value.grad_fn is None:
        return
    ops = x._version_counter.undo + x._view_ops          # from the base's layout

    base.grad_fn = _CopySlices(base, ops, value.grad_fn)
    base._requires_grad = True
    keep_retained(base)
    # The view now reads from the base's new history.
    v = base
    for prim, attrs in ops:
        v = bind(prim, v, **attrs)
    x.grad_fn = v.grad_fn
    x._requires_grad = True
    x._view_version = x._version_counter.value
    keep_retained(x)


def _original_self(x: Tensor, operands=()) -> Tensor:
    """The operand an in-place op computes from. Under autograd it is a copy of x's values
    carrying x's history: the op's backward may read x (log_, mul_ by a tensor, pow_), and
    the write that follows would otherwise invalidate it (torch saves ``original_self``).
    That holds too when x needs no gradient but one of the other ``operands`` does
    (``a.mul_(w)``, ``a.scatter_(0, i, w)``: w's gradient may read a)."""
    if x._trace is not None or not is_grad_enabled():
        return x
    if x._base is not None:
        _refresh_view(x)
    if not x._requires_grad:
        if not any(isinstance(a, Tensor) and a._requires_grad for a in operands):
            return x
        s = Tensor._wrap(x._data.copy(), x._dtype)
        s._fw_grads = x._fw_grads            # forward mode's tangents: the values' own
        return s
    if x.grad_fn is None:   # a leaf requiring grad: assign_ refuses
        return x
    s = Tensor._wrap(x._data.copy(), x._dtype)
    s.grad_fn, s._requires_grad = x.grad_fn, True
    s._fw_grads = x._fw_grads
    return s


def _inplace(fn, name):
    def op(x, *args, **kwargs):
        self = _original_self(x, (*args, *kwargs.values()))
        return assign_(x, fn(self, *args, **kwargs), name)
    op.__name__ = name
    op.__doc__ = f"In-place :func:`{fn.__name__}`."
    return op


@public(method=True)
def masked_scatter_(x: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """In-place :func:`masked_scatter`: the mask expands to ``x`` (torch's expand error when it
    cannot; ``x`` does not grow)."""
    if mask.dtype is dtypes.bool_ and tuple(mask.shape) != tuple(x.shape):
        mask = expand(mask, tuple(x.shape))
    return _inplace(masked_scatter, "masked_scatter_")(x, mask, source)


@public(method=True)
def copy_(x: Tensor, src, non_blocking: bool = False) -> Tensor:
    src = as_tensor_operand(src)
    return assign_(x, src, "copy_")


@public(method=True)
def fill_(x: Tensor, value) -> Tensor:
    if isinstance(value, Tensor):
        return assign_(x, expand(cast(value, x.dtype), tuple(x.shape)), "fill_")
    with no_grad():
        filled = _scalar_tensor(value, x.dtype)
    return assign_(x, expand(filled, tuple(x.shape)), "fill_")


@public(method=True)
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
        # into x's flat positions instead, the last write to a position winning as in eager
        # (the differences of the others are dropped, not added up).
        flat_idx = reshape(getitem(_index_tensor(np.arange(x.numel()).reshape(tuple(x.shape))),
                                   key), (-1,))
        values = reshape(expand(as_tensor_operand(value, x.dtype), tuple(target.shape)), (-1,))
        updated = index_copy(reshape(x, (x.numel(),)), 0, flat_idx, values)
        assign_(x, reshape(updated, tuple(x.shape)), "index_put_")
        return
    if target._base is None and target._trace is None and not np.shares_memory(target._data,
                                                                               x._data):
        # Advanced indexing produced a copy: write it back elementwise via a mask of flat
        # positions (eager only).
        # (On a cuda tensor, whose slices are copies too, the positions live on the device.)
        flat_idx = getitem(_index_tensor(np.arange(x.numel()).reshape(tuple(x.shape)), like=x),
                           key)
        value = as_tensor_operand(value, x.dtype)
        if value.device != x.device:        # copied in, as torch's copy_ does
            value = value.to(x.device)
        value = expand(value, tuple(flat_idx.shape))
        updated = index_copy(reshape(x, (x.numel(),)), 0, reshape(flat_idx, (-1,)),
                             reshape(value, (-1,)))
        assign_(x, reshape(updated, tuple(x.shape)), "index_put_")
        return
    value = as_tensor_operand(value, x.dtype) if not isinstance(value, Tensor) else value
    copy_(target, expand(cast(value, x.dtype), tuple(target.shape)))


# --------------------------------------------------------------------------- in-place views
# torch's in-place shape methods change a tensor's own sizes and strides, not its values:
# the tensor takes the layout of the out-of-place view (same storage), its version is
# bumped, and a tensor with history gets the view's node (named as torch names the
# in-place variant). Eager only: a traced value cannot change its type in place.


def _take_view(x: Tensor, out: Tensor, name: str) -> Tensor:
    if out is x:                     # nothing to change (a squeeze of no size-1 dim)
        x._version_counter.value += 1
        return x
    if x._base is None:
        # The base's own layout changes: its views' ops start from the layout before, so
        # the way back is kept (a permute's inverse, a reshape to the old shape).
        prim, attrs = out._view_ops[-1]
        back = (P.permute, {"perm": tuple(int(i) for i in np.argsort(attrs["perm"]))}) \
            if prim is P.permute else (P.reshape, {"shape": tuple(x.shape)})
        counter = x._version_counter
        counter.layout, counter.undo = out._view_ops, (back,) + counter.undo
    x._data = out._data
    x._version_counter.value += 1
    if out.grad_fn is not None:
        out.grad_fn._name = name
        x.grad_fn = out.grad_fn
        keep_retained(x)
    if x._base is not None:          # still a view of its base, through one more op
        x._view_ops = out._view_ops
        x._view_version = getattr(out, "_view_version", x._version_counter.value)
    return x


def _inplace_view(op: str, name: str, view_fn):
    def method(x: Tensor, *args, **kwargs) -> Tensor:
        if _primitive.traced(x):
            raise NotImplementedError(
                f"{op}: an in-place change of a tensor's shape is not traced by "
                f"fusegrad.compile; use the out-of-place {op[:-1]}()")
        _check_inplace(x, op, writes=False)
        return _take_view(x, view_fn(x, *args, **kwargs), name)
    method.__name__ = op
    method.__doc__ = (f"In-place :func:`{view_fn.__name__}`: ``x`` takes the view's shape and "
                      f"strides (its storage stays), as torch's ``{op}``.")
    return method


def _squeeze_name(x: Tensor, dim=None) -> str:
    return "SqueezeBackward3" if dim is None else (
        "SqueezeBackward4" if isinstance(dim, (int, np.integer)) else "SqueezeBackward5")


def squeeze_(x: Tensor, dim=None) -> Tensor:
    """In-place :func:`squeeze`: ``x`` drops its size-1 dims (those of ``dim``)."""
    return _inplace_view("squeeze_", _squeeze_name(x, dim), squeeze)(x, dim)


unsqueeze_ = public(_inplace_view("unsqueeze_", "UnsqueezeBackward1", unsqueeze),
                    name="unsqueeze_", method=True)
t_ = public(_inplace_view("t_", "TBackward1", t), name="t_", method=True)
transpose_ = public(_inplace_view("transpose_", "TransposeBackward1", transpose),
                    name="transpose_", method=True)
swapaxes_ = public(_inplace_view("swapaxes_", "TransposeBackward1", transpose),
                   name="swapaxes_", method=True)
swapdims_ = public(_inplace_view("swapdims_", "TransposeBackward1", transpose),
                   name="swapdims_", method=True)
public(squeeze_, name="squeeze_", method=True)
