"""``vmap``: map a function over a batch dimension of its inputs, with torch.func's in_dims,
out_dims, randomness and chunk_size semantics and messages.

This first version runs ``func`` once per example (slicing each mapped input with
``select``; ``FUSEGRAD_DEBUG=1`` says so on each call) and stacks the per-example outputs
along ``out_dims``; per-primitive batching rules, which would run the batch as one call of
each op, are future work. Results are the same; only speed differs. Under
:func:`fusegrad.compile` the loop is traced, so a compiled ``vmap`` is one graph with one
copy of ``func``'s ops per example.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable

from fusegrad.config import config
from fusegrad.func._pytree import tree_flatten, tree_str, tree_unflatten
from fusegrad.ops import creation
from fusegrad.ops import functional as F
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


class _RandomKeys:
    """A key source for the random generator while a vmapped function runs one example.

    "error" refuses every draw, as torch's vmap does; "same" lets the first example draw
    from the source below (the generator, or the tracer's key input) and gives every later
    example the same keys in the same order, so all examples see the same numbers."""

    def __init__(self, mode: str):
        self.mode = mode
        self.keys: list[tuple[int, Tensor]] = []
        self.position: int | None = None      # None while recording (the first example)

    def rewind(self) -> None:
        if self.keys or self.position is not None:
            self.position = 0

    def __call__(self, gen, count: int) -> Tensor:
        if self.mode == "error":
            raise RuntimeError(_RANDOM_IN_ERROR_MODE)
        if self.position is None:
            key = self._draw_below(gen, count)
            self.keys.append((count, key))
            return key
        if self.position >= len(self.keys) or self.keys[self.position][0] != count:
            raise RuntimeError("vmap(randomness='same'): the examples drew different random "
                               "numbers (data-dependent random ops); use randomness='different'")
        key = self.keys[self.position][1]
        self.position += 1
        return key

    def _draw_below(self, gen, count: int) -> Tensor:
        # next_key asks the top of the stack, which is this source while it is called.
        me = pop_key_source()
        try:
            return gen.next_key(count)
        finally:
            push_key_source(me)


@contextlib.contextmanager
def randomness_mode(randomness: str):
    """Random draws inside the block follow vmap's ``randomness`` ("different" draws freely);
    yields the key source (None for "different") so a loop can rewind it per example."""
    check_randomness(randomness)
    if randomness == "different":
        yield None
        return
    source = _RandomKeys(randomness)
    push_key_source(source)
    try:
        yield source
    finally:
        pop_key_source()


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

    It runs ``func`` once per example and stacks the results; the results equal a batched
    run's (per-primitive batching rules are future work). ``chunk_size`` is checked and
    otherwise changes nothing. An output with out_dim None is accepted when it is equal for
    all examples (torch asks instead whether it depends on a mapped input).

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
        if len(set(sizes)) > 1:
            raise ValueError(f"vmap: Expected all tensors to have the same size in the mapped "
                             f"dimension, got sizes {sizes} for the mapped dimension")
        batch = sizes[0]

        def example(i: int):
            # Batch size 0: run func once on a zero example for the output structure.
            ex = [t if d is None else t.select(d, i) if batch else
                  creation.zeros(tuple(s for k, s in enumerate(t.shape) if k != d % t.ndim),
                                 dtype=t.dtype)
                  for t, d in zip(leaves, dims)]
            return func(*tree_unflatten(tree, ex), **kwargs)

        if config.debug:
            print(f"[fusegrad] vmap({name}): {batch} calls of {name}, one per example "
                  f"(no batching rules yet)", file=sys.stderr)
        outputs = []
        with randomness_mode(randomness) as source:
            for i in range(max(batch, 1)):
                if source is not None:
                    source.rewind()
                outputs.append(example(i))
        return _stack_outputs(outputs, out_dims, batch, name)

    return wrapped


def _stack_outputs(outputs: list, out_dims, batch: int, name: str) -> Any:
    """The per-example outputs stacked along ``out_dims`` into one pytree."""
    prefix = f"vmap({name}, ..., out_dims={out_dims})(<inputs>): "
    if not (out_dims is None or isinstance(out_dims, (int, tuple, list))):
        raise ValueError(f"vmap({name}, ..., out_dims={out_dims}): `out_dims` must be an int, "
                         f"None or a python collection of ints representing where in the "
                         f"outputs the vmapped dimension should appear.")
    first_leaves, tree = tree_flatten(outputs[0])

    def structure_error():
        _, dims_tree = tree_flatten(out_dims)
        return ValueError(f"{prefix}out_dims is not compatible with the structure of `outputs`. "
                          f"out_dims has structure {tree_str(dims_tree)} but outputs has "
                          f"structure {tree_str(tree)}.")

    dims = _leaf_dims(out_dims, outputs[0], structure_error)
    tensor_dims = []
    for d in dims:
        if isinstance(d, tuple):
            if d[0] is not None:
                raise ValueError(f"vmap({name}, ...): `{name}` must only return Tensors, got "
                                 f"type {type(d[1])}. Did you mean to set out_dims= to None for "
                                 f"output?")
            continue
        tensor_dims.append(d)
    per_example = []
    for out in outputs:
        leaves, t = tree_flatten(out)
        if t != tree:
            raise ValueError(f"vmap({name}, ...): `{name}` returned outputs of different "
                             f"structures for different examples: {tree_str(tree)} and "
                             f"{tree_str(t)}")
        per_example.append(leaves)
    stacked = []
    for k, d in enumerate(tensor_dims):
        column = [leaves[k] for leaves in per_example]
        if d is None:
            if any(not F.equal(column[0], c) for c in column[1:]):
                raise ValueError(f"vmap({name}, ...): `{name}` can not return a BatchedTensor "
                                 f"when out_dim is None")
            stacked.append(column[0])
            continue
        out = F.stack(column, d)
        stacked.append(out if batch else out.narrow(d, 0, 0))
    return tree_unflatten(tree, stacked)
