"""Running a compiled entry: the call's inputs, its program, and the write-backs after it.

:func:`call_inputs` assembles the graph's input list (module state, arguments, the random
key, captured tensors, ``.grad`` slots); :func:`run_program` runs the entry's program (or the
forward half of its partition, or the interpreter) and copies the outputs that would share a
buffer with an input or another output; :func:`write_back` writes in-place updates into the
caller's tensors, ``.grad`` slots and state made while tracing; :func:`user_outputs` builds
the function's result. :func:`_fast_call` is the whole call for an entry with nothing to do
around its program.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import is_grad_enabled, no_grad
from fusegrad.config import config
from fusegrad.ir.graph import Graph, Value
from fusegrad.ir.interpreter import bind_symbols
from fusegrad.ir.specialize import concrete_attr
from fusegrad.ir.symbolic import replay
from fusegrad.ops import creation, functional
from fusegrad.ops import prims as P
from fusegrad.ops.movement import _view_prim
from fusegrad.tensor import Tensor
from fusegrad.tracer.call_cache import _Entry, _SplitPrograms
from fusegrad.tracer.trace import module_state, tree_unflatten

__all__ = ["call_inputs", "run_inputs", "run_program", "write_back", "user_outputs"]


def call_inputs(entry: _Entry, leaves, module, read_only: bool = False) -> list[Tensor]:
    """The input list of ``entry``'s graph for a call with tensor arguments ``leaves``:
    ``module``'s state, the arguments, the random key, captured tensors, ``.grad`` slots
    and scalars the trace read (``read_only``: without advancing the generator)."""
    info = entry.info
    if entry.plain_inputs:
        return leaves
    tensors = [t for _, t in module_state(module)] if module is not None else []
    tensors += list(leaves)
    n = len(entry.graph.inputs)
    full: list = tensors + [None] * (n - len(tensors))
    if info.rng_input is not None:
        gen = creation.default_generator
        # The key for rng_counters counters (4 numbers each), advancing the generator as
        # the traced ops would have.
        full[info.rng_input] = gen.get_state() if read_only else \
            gen.next_key(4 * info.rng_counters)
    for start, stop, captured in entry.lifted_runs:
        full[start:stop] = captured
    cap = info.capture
    if cap is not None:
        for leaf, index in cap.grad_inputs:
            full[index] = full[leaf]._grad
        for getter, index, np_dtype in cap.scalar_inputs:
            full[index] = Tensor._wrap(np.asarray(_scalar(getter()), dtype=np_dtype),
                                       dtypes.float64)
    return full


def run_inputs(entry: _Entry, leaves, module) -> list[Tensor]:
    """:func:`call_inputs` for a call that runs: the ``.grad`` slots that the function sets
    to None (``zero_grad()``) are cleared, after the input list read them."""
    inputs = call_inputs(entry, leaves, module)
    if entry.info.capture is not None:
        for leaf in entry.info.capture.grad_drops:
            inputs[leaf]._grad = None
    return inputs


def run_program(entry: _Entry, inputs: list, split: _SplitPrograms | None) -> tuple[list, list]:
    """The outputs of ``entry`` for ``inputs`` and, when ``split`` (the forward half of its
    partition) runs, the residuals that the backward reads."""
    arrays = [t._data for t in inputs]
    residuals = None
    if split is not None:
        outs = split.forward(*arrays)
        n = split.partition.n_forward_outputs
        results = [Tensor._wrap(a, dt) for a, dt in zip(outs[:n], entry.out_dtypes)]
        residuals = outs[n:]
        copies = _copies(entry, split.forward.graph, n)
    elif entry.program is not None:
        results = _Outputs(entry.program(*arrays), entry.out_dtypes)
        copies = _copies(entry, entry.program.graph, len(results))
    else:
        with no_grad():
            results = replay(entry.optimized, [t.detach() for t in inputs])
        copies = _replayed_copies(entry.info, results, arrays)
    for k in copies:
        # An output in an input's buffer, or in another output's: its own copy, taken
        # before the write-backs change those buffers.
        if isinstance(results, _Outputs):
            results.arrays[k] = results.arrays[k].copy()
        else:
            results[k] = Tensor._wrap(results[k]._data.copy(), results[k]._dtype)
    return results, residuals


def write_back(entry: _Entry, inputs: list, results: list) -> None:
    """In-place writes to inputs land in the caller's tensors. A parameter (a leaf that
    requires grad: an optimizer step) is written as is; any other input is written the way
    eager in-place ops write, so that its history becomes the compiled backward. Then the
    ``.grad`` slots and the tensors made while tracing get their new values."""
    info = entry.info
    out_arrays = _output_arrays(results)
    for in_index, out_index in info.mutations or ():
        target = inputs[in_index]
        if out_arrays[out_index] is target._data:
            target._version_counter.value += 1      # written in place by the kernel
            continue
        value = results[out_index]
        if not is_grad_enabled() or not value._requires_grad or (
                target.is_leaf and target._requires_grad):
            # A value without history (a buffer's running statistics, a parameter's
            # update) is copied in; one with history is written as eager would.
            _copy_into(target._data, value._data)
            target._version_counter.value += 1
        else:
            functional.assign_(target, value)
    if info.capture is not None:
        _write_state(info.capture, inputs, results)


def user_outputs(entry: _Entry, inputs: list, results: list):
    """The function's result: its outputs (not the write-backs after them) in its output
    structure, with those it returned as an input or a view of one made from that input."""
    info = entry.info
    user = results[:info.n_user_outputs] if len(results) > info.n_user_outputs else results
    if any(info.output_aliases):
        # A symbolic entry's views have symbolic sizes in their attributes: this call's.
        sizes = bind_symbols(entry.graph, [t.shape for t in inputs]) \
            if entry.symbolic is not None else None
        user = _alias_outputs(list(user), info.output_aliases, inputs, sizes)
    return tree_unflatten(info.out_tree, user)


class _Outputs(list):
    """A program's outputs as tensors, each wrapped when first read: a training step returns
    every parameter, gradient and optimizer state it updates, most of them written in place
    and never read as tensors."""

    def __init__(self, arrays: list, out_dtypes: list):
        super().__init__([None] * len(arrays))
        self.arrays, self.out_dtypes = arrays, out_dtypes

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        t = list.__getitem__(self, k)
        if t is None:
            t = Tensor._wrap(self.arrays[k], self.out_dtypes[k])
            list.__setitem__(self, k, t)
        return t

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _outputs_to_copy(graph: Graph, info, n: int) -> tuple[int, ...]:
    """The outputs among the first ``n`` of ``graph`` (a program of a traced call; a
    partition's forward saves more after those) that a call must copy: each
    that is an input's own buffer (a value the passes reduced to an input, ``x * 1``), but
    an input's in-place update of itself; and each user output in the buffer of an earlier
    one (``(x * 2, x * 2)`` after CSE). Not the outputs the function returned as an input or
    a view (``TraceInfo.output_aliases``): those are made from the input after the call."""
    position = {v: i for i, v in enumerate(graph.inputs)}
    aliases = info.output_aliases
    mutations = set(info.mutations or ())
    seen: set = set()
    out = []
    for k, o in enumerate(graph.outputs[:n]):
        if not isinstance(o, Value) or (k < len(aliases) and aliases[k] is not None):
            continue
        i = position.get(o)
        if i is not None:
            if (i, k) not in mutations:
                out.append(k)
        elif k < info.n_user_outputs:
            if o in seen:
                out.append(k)
            seen.add(o)
    return tuple(out)


def _copies(entry: _Entry, graph: Graph, n: int) -> tuple[int, ...]:
    hit = entry.copies.get((id(graph), n))
    if hit is None:
        hit = entry.copies[id(graph), n] = _outputs_to_copy(graph, entry.info, n)
    return hit


def _replayed_copies(info, results: list, arrays: list) -> list[int]:
    """:func:`_outputs_to_copy` for the results of an interpreted graph, by their memory."""
    aliases, mutations = info.output_aliases, set(info.mutations or ())
    out = []
    for k, r in enumerate(results):
        if k < len(aliases) and aliases[k] is not None:
            continue
        shared = [i for i, a in enumerate(arrays) if np.may_share_memory(r._data, a)]
        if any((i, k) not in mutations for i in shared) or any(
                np.may_share_memory(r._data, results[j]._data) for j in range(k)
                if k < info.n_user_outputs):
            out.append(k)
    return out


def _alias_outputs(user: list, aliases: list, inputs: list, sizes: dict | None = None) -> list:
    """The outputs that the function returned as an input or an earlier output, or a view
    of one, made so from that tensor (after the call's in-place writes), as eager returns
    them: ``f(x) is x``, and ``f(x)[0] = 1`` writes into x. ``sizes``: the values of the
    symbolic sizes in the views' attributes."""
    for k, alias in enumerate(aliases):
        if alias is None:
            continue
        source, index, view_ops = alias
        t = inputs[index] if source == "input" else user[index]
        for prim, attrs in view_ops:
            if sizes:
                attrs = {name: concrete_attr(a, sizes) for name, a in attrs.items()}
            t = t.detach() if prim is P.stop_gradient else \
                _view_prim(prim, t, **attrs)
        user[k] = t
    return user


def _output_arrays(results) -> list:
    """The outputs' arrays, without wrapping them as tensors."""
    return results.arrays if isinstance(results, _Outputs) else [r._data for r in results]



def _copy_into(dst, src) -> None:
    """Write ``src``'s values into the storage ``dst`` (host arrays, or device arrays of cuda
    tensors)."""
    if isinstance(dst, np.ndarray) and isinstance(src, np.ndarray):
        np.copyto(dst, src)
    else:
        from fusegrad.tracer.eager_cuda import copy_into  # optional: CUDA loads with a cuda tensor
        copy_into(dst, src)


def _write_state(cap, inputs: list, results: list) -> None:
    """After a call: ``.grad`` slots and tensors made while tracing get their new values."""
    arrays = _output_arrays(results)
    for leaf in cap.grad_clears:
        inputs[leaf]._grad = None
    taken: set[int] = set()         # arrays given to a .grad this call: each .grad owns one
    for leaf, out, in_place in cap.grad_writes:
        target = inputs[leaf]
        old = target._grad
        if in_place and old is not None:
            value = arrays[out]
            if value is not old._data:
                _copy_into(old._data, value)
            old._version_counter.value += 1
        else:
            if not target.is_leaf:
                raise RuntimeError("a compiled function's backward() reached a tensor that is "
                                   "not a leaf at this call; its gradient cannot be written")
            grad = results[out]
            if id(grad._data) in taken:
                grad = Tensor._wrap(grad._data.copy(), grad._dtype)
            taken.add(id(grad._data))
            target._grad = grad
    for t, out in cap.internal_writes:
        _copy_into(t._data, arrays[out])
        t._version_counter.value += 1
    for holder, name, out in cap.attribute_writes:
        holder[name] = results[out]            # self.weights = att: this call's tensor



def _fast_call(entry: _Entry) -> Callable | None:
    """The whole call for an entry with nothing to do around its program: inputs are the
    arguments, no autograd, no write-backs, outputs are the program's buffers."""
    info = entry.info
    if entry.program is None or not entry.plain_inputs or info.mutations or config.debug >= 2 \
            or (info.capture is not None and info.capture.attribute_writes) or \
            any(info.output_aliases) or \
            _copies(entry, entry.program.graph, len(entry.program.graph.outputs)):
        return None
    run = entry.program.fast_runner()
    if run is None:
        return None
    dtypes_ = entry.out_dtypes
    wrap = Tensor._wrap
    tree = info.out_tree
    if tree.kind == "leaf":
        dt = dtypes_[0]
        return lambda args: wrap(run([a._data for a in args])[0], dt)
    return lambda args: tree_unflatten(
        tree, [wrap(o, d) for o, d in zip(run([a._data for a in args]), dtypes_)])




def _scalar(v) -> float:
    if isinstance(v, Tensor):
        return float(v._data)
    return float(v)
