"""``vmap``: map a function over a batch dimension of its inputs, with torch.func's in_dims,
out_dims, randomness and chunk_size semantics and messages.

The function runs once, on batched tensors (:mod:`fusegrad.func._batching`): each primitive
it applies runs on the whole batch through its batching rule, so under
:func:`fusegrad.compile` a ``vmap`` is one batched graph whatever the batch size. A
primitive with no rule runs once per example (``FUSEGRAD_DEBUG=1`` names it).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

from fusegrad.func._batching import BatchTrace, current_level
from fusegrad.func._pytree import tree_flatten, tree_str, tree_unflatten
from fusegrad.ops import creation, philox
from fusegrad.ops import functional as F
from fusegrad.ops.batching import expand_batch
from fusegrad.tensor import Tensor
from fusegrad.tracer.state import pop_key_source, push_key_source

__all__ = ["vmap", "randomness_mode"]

_RANDOMNESS = ("error", "different", "same")
_RANDOM_IN_ERROR_MODE = (
    "vmap: called random operation while in randomness error mode. Please either use the 'same' "
    "or 'different' randomness flags on vmap or perform the randomness operation out of vmap")


def check_randomness(randomness: str) -> None:
    if randomness not in _RANDOMNESS:
        raise RuntimeError(f"Only allowed values for randomness are 'error', 'different', or "
                           f"'same'. Got {randomness}")


def _refuse_random(gen, count: int):
    raise RuntimeError(_RANDOM_IN_ERROR_MODE)


class _BatchedKeys:
    """The key source of a vmap with randomness="different": each draw reserves the numbers
    of every example from the source below (the generator, the tracer's key input, or an
    outer vmap's source) and gives example ``i`` the key at ``i`` times one example's
    counters past them, a batched key."""

    def __init__(self, trace: BatchTrace):
        self.trace = trace

    def __call__(self, gen, count: int) -> Tensor:
        size = self.trace.size
        step = philox.counters_used(count)
        me = pop_key_source()          # next_key asks the top of the stack, which is this one
        try:
            base = gen.next_key(4 * step * max(size, 1))
        finally:
            push_key_source(me)
        offsets = creation.arange(size, dtype=base.dtype) * step
        rows = base.reshape(1, 2) + F.stack([F.zeros_like(offsets), offsets], 1)
        return self.trace.wrap(rows, 0)


class _ReplayedKeys:
    """The key source of a chunked vmap with randomness="same": the first chunk draws from
    the source below and every later chunk gets the same keys in the same order, so that all
    examples see the same numbers, as in one call."""

    def __init__(self):
        self.keys: list[tuple[int, Tensor]] = []
        self.position: int | None = None      # None while the first chunk records

    def rewind(self) -> None:
        if self.keys or self.position is not None:
            self.position = 0

    def __call__(self, gen, count: int) -> Tensor:
        if self.position is None:
            me = pop_key_source()
            try:
                key = gen.next_key(count)
            finally:
                push_key_source(me)
            self.keys.append((count, key))
            return key
        if self.position >= len(self.keys) or self.keys[self.position][0] != count:
            raise RuntimeError("vmap(randomness='same', chunk_size=...): the chunks drew "
                               "different random numbers; use randomness='different'")
        key = self.keys[self.position][1]
        self.position += 1
        return key


@contextlib.contextmanager
def _key_source(source):
    if source is None:
        yield
        return
    push_key_source(source)
    try:
        yield
    finally:
        pop_key_source()


@contextlib.contextmanager
def randomness_mode(randomness: str):
    """Random draws inside the block follow ``randomness`` for a function that runs once
    (jacfwd's): "error" refuses them, "same" and "different" draw freely."""
    check_randomness(randomness)
    with _key_source(_refuse_random if randomness == "error" else None):
        yield


def _func_name(func) -> str:
    return getattr(func, "__name__", repr(func))


def _leaf_dims(dims, obj, error) -> list:
    """The dim for each leaf of ``obj`` in tree_flatten's order;
    ``dims`` is an int or None for a whole subtree, or a container matching ``obj``'s."""
    if dims is None or (isinstance(dims, int) and not isinstance(dims, bool)):
        out = []
        _, tree = tree_flatten(obj)
        _collect(tree, dims, out)
        return out
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        obj = tuple(obj)
    if isinstance(dims, (tuple, list)) and isinstance(obj, (tuple, list)) and \
            isinstance(dims, tuple) == isinstance(obj, tuple) and len(dims) == len(obj):
        return [d for sub, o in zip(dims, obj) for d in _leaf_dims(sub, o, error)]
    if isinstance(dims, dict) and isinstance(obj, dict) and list(dims) == list(obj):
        return [d for k in obj for d in _leaf_dims(dims[k], obj[k], error)]
    raise error()


def _collect(tree, dim, out: list) -> None:
    if tree.kind == "leaf":
        out.append(dim)
    elif tree.kind == "static":
        out.append((dim, tree.meta))         # a non-tensor leaf: (dim, value)
    else:
        for child in tree.children:
            _collect(child, dim, out)


def vmap(func: Callable, in_dims=0, out_dims=0, randomness: str = "error", *,
         chunk_size: int | None = None) -> Callable:
    """``func`` mapped over a dimension of its inputs (``torch.func.vmap``).

    ``in_dims`` says which dimension of each input is the batch: an int for all, or a
    (nested) tuple matching the positional arguments with an int or None (not mapped) per
    input; keyword arguments are passed unmapped. ``out_dims`` says where the batch
    dimension goes in each output (None: the output is the same for every example).
    ``randomness``: "error" refuses random ops inside ``func``, "different" gives each
    example its own numbers, "same" the same numbers for all.

    ``func`` runs once, on batched tensors: each primitive runs on the whole batch through
    its batching rule. ``chunk_size`` runs the batch in chunks of that many examples (one
    call of ``func`` each) and joins the results. An output with out_dim None must not
    depend on a mapped input, as in torch.

    >>> fusegrad.vmap(lambda x: x.sum())(fusegrad.ones(3, 2))
    tensor([2., 2., 2.])
    """
    check_randomness(randomness)
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"vmap: chunk_size should be None or greater than 0. (got {chunk_size})")
    name = _func_name(func)

    @functools.wraps(func, updated=())
    def wrapped(*args, **kwargs):
        if not args:
            raise ValueError(f"vmap({name})(<inputs>): got no inputs. Maybe you forgot to add "
                             f"inputs, or you are trying to vmap over a function with no "
                             f"inputs. The latter is unsupported.")
        prefix = f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): "
        if not (isinstance(in_dims, int) or isinstance(in_dims, tuple)):
            raise ValueError(f"{prefix}expected `in_dims` to be int or a (potentially nested) "
                             f"tuple matching the structure of inputs, got: {type(in_dims)}.")

        def structure_error():
            _, dims_tree = tree_flatten(in_dims)
            _, args_tree = tree_flatten(args)
            return ValueError(f"{prefix}in_dims is not compatible with the structure of "
                              f"`inputs`. in_dims has structure {tree_str(dims_tree)} but "
                              f"inputs has structure {tree_str(args_tree)}.")

        leaves, tree = tree_flatten(args)
        dims = []
        for d in _leaf_dims(in_dims, args, structure_error):
            if isinstance(d, tuple):      # a non-tensor input
                if d[0] is not None:
                    raise ValueError(f"{prefix}Got in_dim={d[0]} for an input but the input is "
                                     f"of type {type(d[1])}. We cannot vmap over non-Tensor "
                                     f"arguments, please use None as the respective in_dim")
                continue
            dims.append(d)
        sizes = []
        for t, d in zip(leaves, dims):
            if d is None:
                continue
            if not -t.ndim <= d < t.ndim:
                raise ValueError(f"{prefix}Got in_dim={d} for some input, but that input is a "
                                 f"Tensor of dimensionality {t.ndim} so expected in_dim to "
                                 f"satisfy -{t.ndim} <= in_dim < {t.ndim}.")
            sizes.append(t.shape[d])
        if not sizes:
            raise ValueError("vmap: Expected at least one Tensor to vmap over")
        if any(n != sizes[0] for n in sizes[1:]):      # (sizes may be symbolic: no set)
            raise ValueError(f"vmap: Expected all tensors to have the same size in the mapped "
                             f"dimension, got sizes {sizes} for the mapped dimension")
        batch = sizes[0]

        if chunk_size is None or chunk_size >= batch:
            return _run_batched(func, leaves, dims, tree, kwargs, batch, out_dims, randomness,
                                name)
        parts = []
        replay = _ReplayedKeys() if randomness == "same" else None
        with _key_source(replay):
            for start in range(0, batch, chunk_size):
                n = min(chunk_size, batch - start)
                chunk = [t if d is None else t.narrow(d, start, n) for t, d in zip(leaves, dims)]
                if replay is not None:
                    replay.rewind()
                parts.append(_run_batched(func, chunk, dims, tree, kwargs, n, out_dims,
                                          randomness, name))
        return _concat_chunks(parts, out_dims)

    return wrapped


def _run_batched(func, leaves: list, dims: list, tree, kwargs, batch: int, out_dims,
                 randomness: str, name: str) -> Any:
    """``func`` run once on the inputs as batched tensors of a new level; the outputs with
    their batch dimension at ``out_dims``."""
    trace = BatchTrace(current_level() + 1, batch)
    source = {"error": _refuse_random, "same": None, "different": _BatchedKeys(trace)}
    with trace, _key_source(source[randomness]):
        args = [t if d is None else trace.wrap(t, d % t.ndim) for t, d in zip(leaves, dims)]
        out = func(*tree_unflatten(tree, args), **kwargs)
        return _unbatch_outputs(trace, out, out_dims, name)


def _concat_chunks(parts: list, out_dims) -> Any:
    """The outputs of the chunks of a chunked vmap, joined along their out_dims."""
    leaves, tree = tree_flatten(parts[0])
    dims = [d for d in _leaf_dims(out_dims, parts[0], lambda: AssertionError())
            if not isinstance(d, tuple)]
    columns = zip(*[tree_flatten(p)[0] for p in parts])
    joined = [col[0] if d is None else F.cat(list(col), d) for col, d in zip(columns, dims)]
    return tree_unflatten(tree, joined)


def _unbatch_outputs(trace: BatchTrace, out, out_dims, name: str) -> Any:
    """The outputs of the vmapped function as plain (or outer-level) tensors, each with the
    batch dimension at its out_dim."""
    prefix = f"vmap({name}, ..., out_dims={out_dims})(<inputs>): "
    if not (out_dims is None or isinstance(out_dims, (int, tuple, list))):
        raise ValueError(f"vmap({name}, ..., out_dims={out_dims}): `out_dims` must be an int, "
                         f"None or a python collection of ints representing where in the "
                         f"outputs the vmapped dimension should appear.")
    leaves, tree = tree_flatten(out)

    def structure_error():
        _, dims_tree = tree_flatten(out_dims)
        return ValueError(f"{prefix}out_dims is not compatible with the structure of `outputs`. "
                          f"out_dims has structure {tree_str(dims_tree)} but outputs has "
                          f"structure {tree_str(tree)}.")

    dims = []
    for d in _leaf_dims(out_dims, out, structure_error):
        if isinstance(d, tuple):
            if d[0] is not None:
                raise ValueError(f"vmap({name}, ...): `{name}` must only return Tensors, got "
                                 f"type {type(d[1])}. Did you mean to set out_dims= to None for "
                                 f"output?")
            continue
        dims.append(d)
    results = []
    for t, d in zip(leaves, dims):
        value, bdim = trace.unwrap(t)
        if d is None:
            if bdim is not None:
                raise ValueError(f"vmap({name}, ...): `{name}` can not return a BatchedTensor "
                                 f"when out_dim is None")
            results.append(value)
            continue
        if bdim is None:
            value, bdim = expand_batch(value, trace.size), 0
        ndim = value.ndim
        if not -ndim <= d < ndim:
            raise IndexError(f"Dimension out of range (expected to be in range of "
                             f"[{-ndim}, {ndim - 1}], but got {d})")
        d %= ndim
        results.append(value if d == bdim else value.movedim(bdim, d))
    return tree_unflatten(tree, results)
