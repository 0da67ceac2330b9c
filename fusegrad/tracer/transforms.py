"""Functional transforms built on tracing and the autodiff pass: ``grad``,
``value_and_grad`` and ``vjp``, as in JAX.

Each call traces the function, differentiates the graph (:mod:`fusegrad.passes.autodiff`)
and replays the result on the arguments: concrete arguments run it eagerly, symbolic ones
(inside another trace or transform) inline it, so transforms nest: ``grad(grad(f))``.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

from fusegrad.ir.symbolic import replay
from fusegrad.ops import creation
from fusegrad.passes.autodiff import grad_graph, vjp_graph
from fusegrad.tensor import Tensor
from fusegrad.tracer.trace import arg_input_ranges, trace, tree_flatten, tree_unflatten

__all__ = ["grad", "value_and_grad", "vjp"]


def _argnum_inputs(graph, args, argnums: Sequence[int]) -> list[int]:
    """Graph input indices of the tensor leaves of the positional ``args`` in ``argnums``."""
    ranges = arg_input_ranges(graph, args)
    out = []
    for n in argnums:
        if not ranges[n]:
            raise TypeError(f"argument {n} has no tensors to differentiate")
        out += list(ranges[n])
    return out


def _call_inputs(graph, args, kwargs) -> list[Tensor]:
    """The graph's inputs for a call on ``args``: the tensor leaves, then the tensors the
    trace lifted (captured tensors that require grad, free variables of an enclosing trace)
    and the random key, at the positions the trace gave them."""
    info = graph.meta
    leaves, _ = tree_flatten((args, kwargs))
    full: list = list(leaves) + [None] * (len(graph.inputs) - len(leaves))
    for t, index in info.lifted:
        full[index] = t
    if info.rng_input is not None:
        # The key for rng_counters counters (4 numbers each), advancing the generator as the
        # eager call would; inside another trace this is that trace's key, so nesting works.
        full[info.rng_input] = creation.default_generator.next_key(4 * info.rng_counters)
    return full


def value_and_grad(fn: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False):
    """``fn``'s value and its gradient with respect to the arguments ``argnums``.

    ``fn`` must return a real scalar tensor (or ``(scalar, aux)`` with ``has_aux``).
    """
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)

    def wrapped(*args, **kwargs):
        # The graph and its inputs take fn's name and parameter names (updated=(): a module's
        # __dict__ must not be copied onto the function).
        @functools.wraps(fn, updated=())
        def target(*a, **k):
            out = fn(*a, **k)
            return out if not has_aux else (out[0], out[1])
        graph = trace(target, *args, **kwargs)
        wrt = _argnum_inputs(graph, args, nums)
        for i in wrt:
            if not graph.inputs[i].type.dtype.is_floating_point:
                # Its "gradient" would be a silent zeros tensor of an integer dtype.
                raise TypeError(f"grad requires floating-point inputs, but input %"
                                f"{graph.inputs[i].name} (argnums={argnums}) is "
                                f"{graph.inputs[i].type}; leave it out of argnums")
        g2 = grad_graph(graph, wrt)
        results = replay(g2, _call_inputs(graph, args, kwargs))
        n_out = len(graph.outputs)
        values = tree_unflatten(graph.meta.out_tree, results[:n_out])
        flat_grads = results[n_out:]
        grads, pos = [], 0
        for n in nums:
            leaves, tree = tree_flatten(args[n])
            grads.append(tree_unflatten(tree, flat_grads[pos:pos + len(leaves)]))
            pos += len(leaves)
        grads = grads[0] if single else tuple(grads)
        return values, grads

    wrapped.__name__ = f"value_and_grad({getattr(fn, '__name__', 'f')})"
    return wrapped


def grad(fn: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False):
    """The gradient of scalar-valued ``fn`` with respect to arguments ``argnums``.

    >>> df = fusegrad.grad(lambda x: (x ** 3).sum())
    >>> df(fusegrad.tensor([1., 2.]))
    tensor([ 3., 12.])
    """
    vg = value_and_grad(fn, argnums, has_aux)

    def wrapped(*args, **kwargs):
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    wrapped.__name__ = f"grad({getattr(fn, '__name__', 'f')})"
    return wrapped


def vjp(fn: Callable, *primals):
    """``(outputs, vjp_fn)`` where ``vjp_fn(*cotangents)`` gives the cotangents of ``primals``."""
    graph = trace(fn, *primals)
    wrt = _argnum_inputs(graph, primals, range(len(primals)))
    g2 = vjp_graph(graph, wrt)
    inputs = _call_inputs(graph, primals, {})
    n_out = len(graph.outputs)
    outputs = replay(graph, inputs)

    def vjp_fn(*cotangents):
        cts, _ = tree_flatten(cotangents)
        results = replay(g2, list(inputs) + list(cts))
        flat, grads, pos = results[n_out:], [], 0
        for p in primals:
            leaves, tree = tree_flatten(p)
            grads.append(tree_unflatten(tree, flat[pos:pos + len(leaves)]))
            pos += len(leaves)
        return tuple(grads)

    return tree_unflatten(graph.meta.out_tree, outputs), vjp_fn
