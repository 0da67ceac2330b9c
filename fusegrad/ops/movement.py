"""Movement ops (views where torch makes views): reshape, permute, expand, squeeze, slicing,
split, cat/stack, pad, repeat, flip, roll.
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from fusegrad import dtypes
from fusegrad.grad_mode import is_grad_enabled
from fusegrad.ops import primitive as _primitive
from fusegrad.ops import prims as P
from fusegrad.ops.composite import _named
from fusegrad.ops.elementwise import clone
from fusegrad.ops.operands import _dims, _index_tensor, cast, take
from fusegrad.ops.primitive import bind
from fusegrad.ops.prims import normalize_axis
from fusegrad.ops.prims_common import register_view_op
from fusegrad.ops.prims_movement import pad_axes
from fusegrad.ops.registry import public
from fusegrad.symint import SymInt, as_size, at_hints, is_symbolic, known_equal, stand_in
from fusegrad.tensor import Size, Tensor


def _mark_view(out: Tensor, src: Tensor, prim, attrs: dict) -> Tensor:
    """Record that ``out`` is a view of ``src``'s storage, for in-place writes through it."""
    # Bounds overlap (may_share_memory) is exact here and cheaper than shares_memory: the
    # view prims give either a view into src's elements or a fresh copy.
    # (A cuda tensor's storage is no ndarray: may_share_memory says False, and a test of
    # its allocation decides; the cpu path pays for that test only when it made a copy.)
    if out._trace is not None or np.may_share_memory(out._data, src._data) or (
            type(out._data) is not np.ndarray and out._data.shares_storage(src._data)):
        base = src._base if src._base is not None else src
        out._base = base
        out._view_ops = (src._view_ops or src._version_counter.layout) + ((prim, attrs),)
        out._version_counter = src._version_counter
        if out._trace is None and is_grad_enabled():
            # the version its history is valid for (see engine._refresh_view)
            out._view_version = out._version_counter.value
    return out


def _int_sequence(args: tuple, given, op: str, name: str) -> tuple[int, ...]:
    """Ints passed as one sequence, as varargs (torch's methods), or as the keyword ``name``."""
    if given is not None:
        if args:
            raise TypeError(f"{op}() got multiple values for argument '{name}'")
        args = (given,)
    if len(args) == 1 and not isinstance(args[0], (int, np.integer)):
        args = tuple(args[0])
    return tuple(as_size(d) for d in args)


def _view_prim(prim, x: Tensor, **attrs) -> Tensor:
    return _mark_view(bind(prim, x, **attrs), x, prim, attrs)


def reshape_prim(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    if tuple(x.shape) == tuple(shape):
        return x
    return _view_prim(P.reshape, x, shape=tuple(shape))


def alias(x: Tensor) -> Tensor:
    """A new tensor viewing all of ``x`` (its storage and history; torch's ``aten::alias``):
    what forward mode gives a tangent without giving it to ``x``."""
    return _view_prim(P.reshape, x, shape=tuple(x.shape))


def _infer_shape(x: Tensor, shape, op: str) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, Size)):
        shape = tuple(shape[0])
    shape = tuple(as_size(d) for d in shape)
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


@public(torch=True, method=True)
def reshape(x: Tensor, *shape) -> Tensor:
    """A tensor of ``shape`` with ``x``'s elements: a view when strides allow, else a copy."""
    shape = _infer_shape(x, shape, "reshape")
    if x._trace is None:
        if not _viewable(x._data, shape):
            x = clone(x)
        return reshape_prim(x, shape)
    if tuple(x.shape) != shape and not _viewable(_traced_layout(x), shape):
        # Eager copies here (a reshape of a transposed view): the result is a value of its
        # own, not a view, so that a write through it does not reach x. (No copy node: the
        # layout passes decide where the reshape's elements are gathered.)
        return bind(P.reshape, x, shape=shape)
    return reshape_prim(x, shape)


def _viewable(a: np.ndarray, shape) -> bool:
    if is_symbolic(shape):                  # a traced stand-in: its sizes at their hints
        shape = tuple(stand_in(d) for d in shape)
    try:
        # the method where it is an ndarray (numpy's wrapper costs a microsecond per call);
        # a device array's layout goes through numpy's function
        if type(a) is np.ndarray:
            a.reshape(shape, copy=False)
        else:
            np.reshape(a, shape, copy=False)
        return True
    except ValueError:
        return False


@public(method=True)
def view(x: Tensor, *shape) -> Tensor:
    """``reshape`` that never copies: torch's error when the strides do not allow a view."""
    if len(shape) == 1 and isinstance(shape[0], dtypes.DType):
        return _view_dtype(x, shape[0])
    shape = _infer_shape(x, shape, "view")
    layout = x._data if x._trace is None else _traced_layout(x)
    if not _viewable(layout, shape):
        raise RuntimeError(
            "view size is not compatible with input tensor's size and stride (at least one "
            "dimension spans across two contiguous subspaces). Use .reshape(...) instead. "
            f"(view({list(shape)}) of a tensor of size {list(x.shape)} and stride "
            f"{[st // layout.itemsize for st in layout.strides]})")
    return reshape_prim(x, shape)


def _view_dtype(x: Tensor, dt: dtypes.DType) -> Tensor:
    """``x.view(dtype)``: the same bytes read as ``dt``. Eager, it is a view: the same
    memory and version counter, so a write either way shows, as in torch. Traced, between
    dtypes of one size it is elementwise (a bitcast); between sizes the last dim scales
    (eager only). The result has no gradient (torch's neither, across dtypes)."""
    if dt is x.dtype:
        return reshape_prim(x, tuple(x.shape))
    src, dst = x.dtype.itemsize, dt.itemsize
    eager = x._trace is None and not _primitive.compiling() and isinstance(x._data, np.ndarray)
    if src == dst and not eager:
        return bind(P.bitcast, x.detach(), dtype=dt)
    a = x._data
    if src != dst:
        x._check_concrete("view(dtype) between dtypes of different sizes")
        if x.ndim == 0:
            raise RuntimeError(f"self.dim() cannot be 0 to view {x.dtype} as {dt} (different "
                               f"element sizes)")
        if src < dst and (x.shape[-1] * src) % dst:
            raise RuntimeError(f"self.size(-1) must be divisible by {dst // src} to view "
                               f"{x.dtype} as {dt} (different element sizes), but got "
                               f"{x.shape[-1]}")
        if not (a.flags.c_contiguous or (a.ndim and a.strides[-1] == a.itemsize)):
            raise RuntimeError(f"self.stride(-1) must be 1 to view {x.dtype} as {dt} (different "
                               f"element sizes), but got {a.strides[-1] // a.itemsize}")
        if not eager:
            return Tensor._wrap(np.ascontiguousarray(a).view(dt.np_dtype), dt)
    out = Tensor._wrap(a.view(dt.np_dtype), dt)
    out._version_counter = x._version_counter
    return out


def _layout_stand_in(shape) -> np.ndarray:
    """A contiguous array of ``shape`` over one byte: strides to reason about, no data (a
    symbolic size stands in at its hint: contiguity does not depend on its value)."""
    shape = tuple(stand_in(d) for d in shape)
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
                a = np.reshape(a, tuple(stand_in(d) for d in attrs["shape"]), copy=False)
            except ValueError:
                a = _layout_stand_in(attrs["shape"])
        else:
            a = prim.impl(a, **{k: at_hints(v) for k, v in attrs.items()})
    return a


@public(method=True)
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
    # (A cuda tensor's clone is a contiguous device buffer already.)
    if isinstance(out._data, np.ndarray):
        out._data = np.ascontiguousarray(out._data)
    return out


@public(method=True)
def view_as(x: Tensor, other: Tensor) -> Tensor:
    return view(x, tuple(other.shape))


@public(method=True)
def reshape_as(x: Tensor, other: Tensor) -> Tensor:
    return reshape(x, tuple(other.shape))


@public(torch=True, method=True)
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


@public(torch=True, method=True)
def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    if x.ndim == 0:
        return x
    a, b = normalize_axis(dim0, x.ndim, "transpose"), normalize_axis(dim1, x.ndim, "transpose")
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    if a == b:
        return x
    return _named(_view_prim(P.permute, x, perm=tuple(perm)), "TransposeBackward0")


swapaxes = public(transpose, name="swapaxes", torch=True, method=True)
swapdims = public(transpose, name="swapdims", torch=True, method=True)


@public(torch=True, method=True)
def t(x: Tensor) -> Tensor:
    if x.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {x.ndim}D")
    return _named(transpose(x, 0, 1), "TBackward0") if x.ndim == 2 else x


@public(torch=True, method=True)
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


@public(method=True)
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
    shape = tuple(x.shape[i - offset] if d == -1 and i >= offset else as_size(d)
                  for i, d in enumerate(sizes))
    if shape == tuple(x.shape):
        return x
    return _view_prim(P.broadcast_to, x, shape=shape)


def _type_name(x: Tensor) -> str:
    return x._type_string().split(".")[-1]


@public(method=True)
def expand_as(x: Tensor, other: Tensor) -> Tensor:
    return expand(x, tuple(other.shape))


@public(torch=True, method=True)
def broadcast_to(x: Tensor, shape) -> Tensor:
    return expand(x, tuple(shape))


@public(torch=True)
def broadcast_tensors(*tensors):
    shape = P.broadcast_shapes(*(tuple(t.shape) for t in tensors))
    return tuple(expand(t, shape) for t in tensors)


@public(torch=True, method=True)
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


@public(torch=True, method=True)
def unsqueeze(x: Tensor, dim: int) -> Tensor:
    axis = normalize_axis(dim, x.ndim + 1, "unsqueeze")
    shape = list(x.shape)
    shape.insert(axis, 1)
    return _named(reshape_prim(x, tuple(shape)), "UnsqueezeBackward0")


@public(torch=True, method=True)
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


@public(torch=True, method=True)
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
    if builtins.all(known_equal(a, 0) and known_equal(b, d) and known_equal(s, 1)
                    for a, b, s, d in zip(starts, stops, steps, x.shape)):
        return x
    return _view_prim(P.slice_, x, starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))


@public(torch=True, method=True)
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


@public(torch=True, method=True)
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


@public(torch=True, method=True)
def chunk(x: Tensor, chunks: int, dim: int = 0):
    _has_dims(x, dim, "chunk")
    axis = normalize_axis(dim, x.ndim, "chunk")
    if chunks <= 0:
        raise RuntimeError("chunk expects `chunks` to be greater than 0, got: " + str(chunks))
    if not x.shape[axis]:
        return tuple(narrow(x, axis, 0, 0) for _ in range(chunks))     # torch: chunks empties
    return split(x, -(-x.shape[axis] // chunks), axis)


@public(torch=True, method=True)
def unbind(x: Tensor, dim: int = 0):
    _has_dims(x, dim, "unbind")
    axis = normalize_axis(dim, x.ndim, "unbind")
    return tuple(_named(select(x, axis, i), "UnbindBackward0") for i in range(x.shape[axis]))


@public(torch=True, method=True)
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


@public(torch=True)
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


concat = public(cat, name="concat", torch=True)
concatenate = public(cat, name="concatenate", torch=True)


@public(torch=True)
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


@public(torch=True)
def hstack(tensors) -> Tensor:
    tensors = list(tensors)
    return cat(tensors, 0 if tensors[0].ndim == 1 else 1)


@public(torch=True)
def vstack(tensors) -> Tensor:
    return cat([t if t.ndim >= 2 else reshape(t, (1, -1)) for t in tensors], 0)


@public(method=True)
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
    if np.shares_memory(out._data, x._data) if out._trace is None else out._base is not None:
        # Repeats of 1 (or of a size-1 dim) leave a view; repeat always owns its memory.
        out = clone(out)
    return _named(out, "RepeatBackward0")


@public(torch=True, method=True)
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


def _positions(n, of) -> Tensor:
    """The index tensor ``of(arange(n), n)`` over a dim of size ``n``: a constant for a
    static size, the graph's iota for a symbolic one (its values read at call time)."""
    if isinstance(n, SymInt):
        return of(bind(P.iota, shape=(n,), axis=0, dtype=dtypes.int64), n)
    return _index_tensor(of(np.arange(n), n))


@public(torch=True, method=True)
def flip(x: Tensor, *args, dims=None) -> Tensor:
    """``x`` reversed along ``dims`` (a list, or ``x.flip(0, 1)`` as torch's method takes)."""
    dims = _int_sequence(args, dims, "flip", "dims")
    axes = [normalize_axis(d, x.ndim, "flip") for d in dims]
    if len(set(axes)) != len(axes):
        raise RuntimeError(f"flip: dim {list(dims)} appears multiple times in the list of dims")
    out = x
    for d in dims:
        axis = normalize_axis(d, x.ndim, "flip")
        out = take(out, _positions(x.shape[axis], lambda i, n: n - 1 - i), axis)
    return _named(out, "FlipBackward0", src=x)


@public(torch=True, method=True)
def roll(x: Tensor, shifts, dims=None) -> Tensor:
    if dims is None:
        return reshape(roll(flatten(x), shifts, 0), tuple(x.shape))
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    out = x
    for s, d in zip(shifts, dims):
        axis = normalize_axis(d, x.ndim, "roll")
        out = take(out, _positions(x.shape[axis], lambda i, n, s=s: (i - s) % n), axis)
    return _named(out, "RollBackward0", src=x)


@public(torch=True, method=True)
def diagonal(x: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal ``offset`` (above the main one when positive) of the matrices in dims
    ``dim1`` and ``dim2``, as a last dim: a strided slice of the flattened matrices."""
    d1, d2 = normalize_axis(dim1, x.ndim, "diagonal"), normalize_axis(dim2, x.ndim, "diagonal")
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    m = movedim(x, (d1, d2), (-2, -1))
    layout = m._data if m._trace is None else _traced_layout(m)
    if not _viewable(layout, tuple(m.shape[:-2]) + (m.shape[-2] * m.shape[-1],)) and \
            _viewable(np.swapaxes(layout, -1, -2), tuple(m.shape[:-2]) +
                      (m.shape[-2] * m.shape[-1],)):
        # A transposed matrix: the same elements are the diagonal -offset of its transpose,
        # whose rows flatten in place (so the result stays a view, as torch's is).
        m, offset = transpose(m, -1, -2), -offset
    rows, cols = m.shape[-2:]
    batch = tuple(m.shape[:-2])
    # The diagonal as a strided slice of the flattened matrices, starting at its first
    # element (not of a narrowed matrix, whose flattening would be a copy).
    if offset >= 0:
        k = builtins.max(builtins.min(rows, cols - offset), 0)
        first = offset
    else:
        k = builtins.max(builtins.min(rows + offset, cols), 0)
        first = -offset * cols
    flat = reshape(m, batch + (rows * cols,))
    start = first if k else 0
    stop = start + (k - 1) * (cols + 1) + 1 if k else 0
    return _named(slice_axes(flat, (0,) * len(batch) + (start,), batch + (stop,),
                             (1,) * len(batch) + (cols + 1,)), "DiagonalBackward0")


@public(torch=True, method=True)
def diag(x: Tensor, diagonal: int = 0) -> Tensor:
    """1-D: the square matrix with ``x`` on diagonal ``diagonal``; 2-D: that diagonal."""
    if x.ndim == 2:
        return _named(globals()["diagonal"](x, diagonal), "DiagBackward0")
    if x.ndim != 1:
        raise RuntimeError("diag(): Supports 1D or 2D tensors. Got " + f"{x.ndim}D")
    n = x.shape[0]
    # rows [x_i, 0 ... 0] of length n + 1, flattened and cut to n * n: x lands on the diagonal
    rows = pad_axes(unsqueeze(x, 1), [(0, 0), (0, n)])
    square = reshape(narrow(reshape(rows, (n * (n + 1),)), 0, 0, n * n), (n, n))
    k = builtins.abs(diagonal)
    widths = [(0, k), (k, 0)] if diagonal > 0 else [(k, 0), (0, k)]
    return _named(pad_axes(square, widths), "DiagBackward0")


@public(torch=True, method=True)
def diag_embed(x: Tensor, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """Matrices with the last dim of ``x`` on diagonal ``offset``, in dims ``dim1`` and
    ``dim2`` of the result (which has one dim more than ``x``)."""
    nd = x.ndim + 1
    d1, d2 = normalize_axis(dim1, nd, "diag_embed"), normalize_axis(dim2, nd, "diag_embed")
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    if x.ndim == 0:
        x = reshape(x, (1,))
    batch, n = tuple(x.shape[:-1]), x.shape[-1]
    # rows [x_i, 0 ... 0] of length n + 1, flattened and cut to n * n: x lands on the diagonal
    rows = pad_axes(unsqueeze(x, -1), [(0, 0)] * (x.ndim) + [(0, n)])
    flat = reshape(rows, batch + (n * (n + 1),))
    square = reshape(narrow(flat, -1, 0, n * n), batch + (n, n))
    k = builtins.abs(offset)
    widths = [(0, k), (k, 0)] if offset > 0 else [(k, 0), (0, k)]
    square = pad_axes(square, [(0, 0)] * len(batch) + widths)
    return _named(movedim(square, (-2, -1), (d1, d2)), "DiagEmbedBackward0")


@public(torch=True)
def meshgrid(*tensors, indexing: str = "ij") -> tuple[Tensor, ...]:
    """Coordinate grids of 0-d or 1-D ``tensors``: each expanded over the others' lengths;
    ``indexing='xy'`` swaps the first two dims (Cartesian, as numpy's default)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"):
        raise RuntimeError(f"torch.meshgrid: indexing must be one of \"xy\" or \"ij\", but "
                           f"received: {indexing}")
    for t in tensors:
        if t.ndim > 1:
            raise RuntimeError(f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list but "
                               f"got: {t}")
    if len({t.dtype for t in tensors}) > 1:
        raise RuntimeError("torch.meshgrid: expects all tensors to have the same dtype")
    ts = [reshape(t, (-1,)) for t in tensors]
    swap = indexing == "xy" and len(ts) >= 2
    if swap:
        ts[0], ts[1] = ts[1], ts[0]
    shape = tuple(t.shape[0] for t in ts)
    grids = []
    for i, t in enumerate(ts):
        view_shape = [1] * len(ts)
        view_shape[i] = shape[i]
        grids.append(expand(reshape(t, tuple(view_shape)), shape))
    if swap:
        grids[0], grids[1] = grids[1], grids[0]
    return tuple(grids)


def _tensor_unfold(x: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """``Tensor.unfold``: the windows of ``size`` elements every ``step`` along ``dimension``,
    as a new last dim (``dimension`` becomes the window count)."""
    axis = normalize_axis(dimension, builtins.max(x.ndim, 1), "unfold")
    if x.ndim == 0:
        # torch: a 0-dim tensor is one window of ``size`` (1 or 0) elements, shape [size]
        windows = _tensor_unfold(reshape(x, (1,)), 0, size, step)
        return _named(reshape(narrow(windows, 0, 0, 1), (size,)), "UnfoldBackward0")
    n = x.shape[axis]
    if size > n:
        raise RuntimeError(f"maximum size for tensor at dimension {axis} is {n} but size is {size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    count = (n - size) // step + 1
    if step >= size and count * step <= n:
        # Windows that do not overlap are a view, as torch's are (writes through them reach
        # x): the dim split into (count, step), each row cut to its first ``size``.
        rows = reshape(narrow(x, axis, 0, count * step),
                       tuple(x.shape[:axis]) + (count, step) + tuple(x.shape[axis + 1:]))
        rows = narrow(rows, axis + 1, 0, size)
        return _named(movedim(rows, axis + 1, x.ndim), "UnfoldBackward0")
    views = []
    if size == 0:
        # empty windows, one every ``step`` elements (the last starts at the end): an empty
        # view of x, whose gradient is zeros
        shape = tuple(x.shape[:axis]) + (count,) + tuple(x.shape[axis + 1:]) + (0,)
        return _named(reshape(narrow(x, axis, 0, 0), shape), "UnfoldBackward0")
    for i in range(size):
        starts = [0] * x.ndim
        stops = list(x.shape)
        steps = [1] * x.ndim
        starts[axis], stops[axis], steps[axis] = i, i + step * (count - 1) + 1, step
        views.append(unsqueeze(slice_axes(x, starts, stops, steps), x.ndim))
    return _named(cat(views, x.ndim) if size > 1 else views[0], "UnfoldBackward0")


public(_tensor_unfold, name="unfold", method=True)


register_view_op("slice_axes", slice_axes)
