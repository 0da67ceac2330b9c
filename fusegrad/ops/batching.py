"""Batching rules: how each primitive runs on a batch of examples at once (``vmap``).

A rule ``rule(args, dims, **attrs) -> (out, out_dim)`` gets the primitive's operands with
their batch dimension (``dims[i]``, or None for an operand that is the same for every
example) and returns the batched result and where its batch dimension is (None: the same
for every example). It binds primitives on the operands, so eager autograd records the
batched ops and, under :func:`fusegrad.compile`, the operands are symbolic and the batch is
one graph. Rules are written beside each primitive's definition (the "batching rules"
section at the end of the ``prims_*`` modules) and registered with :func:`batching`, as
JAX's ``batching.primitive_batchers`` are.

A primitive without a rule runs once per example (:func:`loop_rule`); ``FALLBACK`` names the
ones that do so on purpose and why. The helpers here are the shapes of rule most primitives
share: elementwise with broadcasting, a reduction over axes, an op that maps over leading
dimensions.
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence

from fusegrad.config import config
from fusegrad.ops.primitive import Primitive, bind

__all__ = ["BATCHING_RULES", "FALLBACK", "batching", "batching_rule", "loop_rule",
           "batch_size", "to_front", "expand_batch", "elementwise_rule", "axes_rule",
           "leading_rule", "unbatched_rule"]

# A rule: (operands, their batch dims, attributes) -> (result, its batch dim).
BatchingRule = Callable[..., tuple]

BATCHING_RULES: dict[Primitive, BatchingRule] = {}

# Primitives that run once per example under vmap, with the reason (a rule would not be
# exact, or batching means nothing for them).
FALLBACK: dict[str, str] = {}


def batching(*prims: Primitive) -> Callable[[BatchingRule], BatchingRule]:
    """Register the decorated function as the batching rule of ``prims``."""
    def register_rule(rule: BatchingRule) -> BatchingRule:
        for prim in prims:
            if prim in BATCHING_RULES:
                raise ValueError(f"primitive {prim.name} has two batching rules")
            BATCHING_RULES[prim] = rule
        return rule
    return register_rule


def fallback(prim: Primitive, reason: str) -> None:
    """Declare that ``prim`` runs once per example under vmap, and why."""
    FALLBACK[prim.name] = reason


def batching_rule(prim: Primitive) -> BatchingRule:
    """``prim``'s rule, or the per-example loop when it has none."""
    rule = BATCHING_RULES.get(prim)
    return rule if rule is not None else loop_rule(prim)


# --------------------------------------------------------------------------- helpers


def batch_size(args: Sequence, dims: Sequence) -> int:
    """The size of the batch dimension of the batched operands."""
    return next(a.shape[d] for a, d in zip(args, dims) if d is not None)


def to_front(x, d: int | None, size: int | None = None):
    """``x`` with its batch dimension ``d`` first; an unbatched ``x`` (``d`` None) is
    broadcast to a batch of ``size`` when a size is given, else returned as is."""
    if d is None:
        return x if size is None else expand_batch(x, size)
    return x if d == 0 else x.movedim(d, 0)


def expand_batch(x, size: int):
    """An unbatched ``x`` as a batch of ``size`` equal examples (a broadcast, no copy)."""
    return x.reshape((1,) + tuple(x.shape)).expand((size,) + tuple(x.shape))


def _rank_to(x, ndim: int):
    """A front-batched ``x`` with size-1 axes after the batch so each example has ``ndim``
    axes: per-example broadcasting then lines up as it did without the batch."""
    missing = ndim - (x.ndim - 1)
    if missing <= 0:
        return x
    return x.reshape((x.shape[0],) + (1,) * missing + tuple(x.shape[1:]))


def elementwise_rule(prim: Primitive) -> BatchingRule:
    """Elementwise with broadcasting: batched operands go batch-first, with size-1 axes
    so that every example has the rank of the largest; unbatched ones broadcast as they
    are."""
    def rule(args, dims, **attrs):
        ndim = max(a.ndim - (d is not None) for a, d in zip(args, dims))
        ops = [a if d is None else _rank_to(to_front(a, d), ndim) for a, d in zip(args, dims)]
        return bind(prim, *ops, **attrs), 0
    return rule


def unbatched_rule(prim: Primitive) -> BatchingRule:
    """An op that maps element by element over its only operand whatever its shape (a
    check that returns its operand): applied to the batch as it is."""
    def rule(args, dims, **attrs):
        (x,), (d,) = args, dims
        return bind(prim, x, **attrs), d
    return rule


def axes_rule(prim: Primitive, name: str = "axes") -> BatchingRule:
    """An op of one operand over the axes (or axis) named by attribute ``name``: the batch
    goes first and the axes move up by one."""
    def rule(args, dims, **attrs):
        (x,), (d,) = args, dims
        axes = attrs[name]
        attrs = dict(attrs)
        attrs[name] = tuple(a + 1 for a in axes) if isinstance(axes, tuple) else axes + 1
        return bind(prim, to_front(x, d), **attrs), 0
    return rule


def leading_rule(prim: Primitive) -> BatchingRule:
    """An op that maps over any leading dimensions of its operands (linear algebra, the
    trailing-axis kernels): every operand goes batch-first, the unbatched ones broadcast to
    the batch."""
    def rule(args, dims, **attrs):
        size = batch_size(args, dims)
        return bind(prim, *[to_front(a, d, size) for a, d in zip(args, dims)], **attrs), 0
    return rule


def loop_rule(prim: Primitive) -> BatchingRule:
    """The fallback: ``prim`` once per example, the results stacked along a new first
    axis. Said on stderr under ``FUSEGRAD_DEBUG``, naming the primitive."""
    def rule(args, dims, **attrs):
        size = batch_size(args, dims)
        if size == 0:
            return _empty_batch(prim, args, dims, attrs), 0
        if config.debug:
            why = FALLBACK.get(prim.name, "no batching rule")
            print(f"[fusegrad] vmap: {prim.name} runs once per example ({size} calls): {why}",
                  file=sys.stderr)
        outs = [bind(prim, *[a if d is None else a.select(d, i) for a, d in zip(args, dims)],
                     **attrs)
                for i in range(size)]
        return _stack(outs), 0
    return rule


def _empty_batch(prim: Primitive, args, dims, attrs):
    """A batch of no examples of ``prim``'s result (its type from the per-example types)."""
    from fusegrad.ops.primitive import TensorType
    from fusegrad.ops.prims_sources import full
    types = [a._type() if d is None else
             TensorType(tuple(s for k, s in enumerate(a.shape) if k != d), a.dtype)
             for a, d in zip(args, dims)]
    out = prim.infer(*types, **attrs)
    return bind(full, shape=(0,) + tuple(out.shape), value=0, dtype=out.dtype)


def _stack(outs: list):
    from fusegrad.ops.movement import stack  # the public op: concat of unsqueezed
    return stack(outs, 0)
