"""The eager autograd engine: reverse-mode execution of the tape.

The tape itself (:class:`Node`, :class:`PrimitiveNode`, :class:`AccumulateGrad`) is
:mod:`fusegrad.ops.tape`, below the ops that record it; its names are re-exported here.
Backward walks the nodes from the outputs in reverse creation order, once all of a node's
consumers have sent their gradient, summing gradients that meet. The VJP of a primitive node
is the primitive's own rule, so these gradients are the ones the autodiff pass builds on
graphs.

As in PyTorch, saved tensors are freed after a backward unless ``retain_graph=True``, a
version counter catches saved tensors modified in place, ``create_graph=True`` records the
backward itself so it can be differentiated again, and only the nodes that lead to the
requested inputs run in :func:`grad`.

At import this module fills two slots below it: ``Tensor.backward``'s handler
(:func:`fusegrad.tensor.register_handler`) and the tape's :func:`~fusegrad.ops.tape.run_backward`.
"""

from __future__ import annotations

import contextlib
import heapq
import operator
import threading
from typing import Sequence

from fusegrad import profiling
from fusegrad.grad_mode import set_grad_enabled
from fusegrad.ops import functional as F
from fusegrad.ops import tape
from fusegrad.ops.movement import stack
from fusegrad.ops.tape import (  # noqa: F401  (the tape's names, re-exported)
    _FREED_MESSAGE,
    AccumulateGrad,
    Node,
    PrimitiveNode,
    _call_hook,
    _edge,
    _Saved,
    _sequence,
    hook_result,
    keep_retained,
    retain,
)
from fusegrad.tensor import Tensor, register_handler

__all__ = ["Node", "PrimitiveNode", "AccumulateGrad", "run_backward", "backward", "grad",
           "is_checkpoint_valid"]

# Per thread, one entry per running backward, innermost last: whether it accumulates into
# every leaf it reaches (Tensor.backward without ``inputs``). A reentrant checkpoint's node
# runs a backward of its own that accumulates into the leaves of its region, which is only
# right then.
_backwards = threading.local()


def is_checkpoint_valid() -> bool:
    """Whether the backward running now (if any) accumulates into every leaf it reaches, so
    that a node may accumulate its region's leaf gradients itself
    (``torch.autograd._is_checkpoint_valid``)."""
    running = getattr(_backwards, "accumulating", None)
    return not running or running[-1]


@contextlib.contextmanager
def _running(accumulating: bool):
    running = _backwards.__dict__.setdefault("accumulating", [])
    running.append(accumulating)
    try:
        yield
    finally:
        running.pop()


class _Capture:
    """Where :func:`run_backward` collects the gradient of one requested input."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def run_backward(outputs: Sequence, grad_outputs: Sequence, retain_graph: bool,
                 create_graph: bool, inputs: Sequence | None = None,
                 accumulate: bool = True, allow_unused: bool = False,
                 stop_at_inputs: bool = False) -> list | None:
    """Reverse-mode execution from ``outputs`` seeded with ``grad_outputs``.

    With ``accumulate`` the gradients go into leaves' ``.grad`` (``Tensor.backward``),
    restricted to ``inputs`` when given; without it the gradients of ``inputs`` are returned
    (``autograd.grad``). ``stop_at_inputs`` skips discovering the graph beyond the inputs,
    which composite nodes use: their inner graph ends at their operands' aliases.
    """
    roots = []
    for i, (out, g) in enumerate(zip(outputs, grad_outputs)):
        node, _ = _edge(out)
        if node is None:
            raise RuntimeError(
                f"element {i} of tensors does not require grad and does not have a grad_fn")
        roots.append((node, g))

    input_index: dict[Node, int] = {}        # the node of each input -> its index
    repeats: list[tuple[int, int]] = []      # an input given twice: (its index, the first's)
    if inputs is not None:
        for i, t in enumerate(inputs):
            node, _ = _edge(t)
            if node is None:
                raise RuntimeError("One of the differentiated Tensors does not require grad")
            first = input_index.setdefault(node, i)
            if first != i:
                repeats.append((i, first))

    # Discover the graph: how many edges point at each node, and which nodes lead to a
    # captured input (only those need to run when gradients are requested).
    deps: dict[Node, int] = {}
    order: list[Node] = []
    seen = set()
    # Each node once, though an output be passed twice (its gradients add up): a node on the
    # stack twice would count its children's edges twice and they would never run.
    stack = list({n: None for n, _ in roots})
    for n in stack:
        seen.add(n)
    while stack:
        node = stack.pop()
        order.append(node)
        if stop_at_inputs and node in input_index:
            continue
        for child, _ in node.next_functions:
            if child is None:
                continue
            deps[child] = deps.get(child, 0) + 1
            if child not in seen:
                seen.add(child)
                stack.append(child)

    restrict = inputs is not None
    if restrict:
        needed = set(input_index)
        # Reverse creation order visits every consumer before the nodes it consumes.
        for node in sorted(order, key=_seq_of):
            if stop_at_inputs and node in input_index:
                continue
            for c, _ in node.next_functions:
                if c in needed:          # None never is
                    needed.add(node)
                    break
    else:
        needed = None

    buffers: dict[Node, object] = {}
    for node, g in roots:
        _accumulate(buffers, node, g, create_graph)
    ready = []
    for node in {n: None for n, _ in roots}:
        if deps.get(node, 0) == 0:
            heapq.heappush(ready, (-node._seq, id(node), node))
    results: list = [None] * (len(inputs) if inputs is not None else 0)

    heappop, heappush = heapq.heappop, heapq.heappush
    with set_grad_enabled(create_graph), _running(accumulate and inputs is None):
        while ready:
            node = heappop(ready)[2]
            grad = buffers.pop(node, None)
            if grad is not None:
                if node._pre_hooks:
                    for hook in node._pre_hooks:
                        grad = _call_hook(hook, grad)
                if node._retained:
                    _fill_retained(node, grad, create_graph)
            if input_index and node in input_index:
                if grad is not None:
                    i = input_index[node]
                    if accumulate and isinstance(node, AccumulateGrad):
                        node.apply(grad, create_graph, retain_graph)
                    elif not accumulate:
                        if isinstance(node, AccumulateGrad):
                            # a leaf's own hooks see its gradient (torch runs them here too)
                            for hook in node.variable._hooks or ():
                                grad = _call_hook(hook, grad)
                        results[i] = grad
                    elif accumulate:
                        _accumulate_into(inputs[i], grad, create_graph)
                if stop_at_inputs:
                    continue
            run = grad is not None and (needed is None or node in needed)
            if run and not (restrict and isinstance(node, AccumulateGrad)):
                if profiling.recorder is None:
                    in_grads = node.apply(grad, create_graph, retain_graph)
                else:
                    with profiling.Span(profiling.recorder, node._name):
                        in_grads = node.apply(grad, create_graph, retain_graph)
            else:
                in_grads = ()
            if not retain_graph:
                node.release()
            n_grads = len(in_grads)
            for k, (child, _) in enumerate(node.next_functions):
                if child is None:
                    continue
                gi = in_grads[k] if k < n_grads else None
                if gi is not None and (needed is None or child in needed):
                    prev = buffers.get(child)
                    buffers[child] = gi if prev is None else prev + gi
                left = deps[child] - 1
                deps[child] = left
                if left == 0:
                    heappush(ready, (-child._seq, id(child), child))
            # No stale references to gradients: a leaf's gradient held by nothing else is
            # taken as its .grad without a copy (see _sole_owner).
            in_grads = gi = prev = None

    if not accumulate and inputs is not None:
        for i, first in repeats:
            results[i] = results[first]
        for i, r in enumerate(results):
            if r is None and not allow_unused:
                raise RuntimeError(
                    f"The differentiated Tensor at index {i} appears to not have been used in the "
                    "graph. Set allow_unused=True if this is the desired behavior.")
        return results
    return None


# A node's creation number; attrgetter rather than a function: a C call per sorted node.
_seq_of = operator.attrgetter("_seq")


def _accumulate(buffers: dict, node: Node, g, create_graph: bool) -> None:
    prev = buffers.get(node)
    buffers[node] = g if prev is None else prev + g


def _fill_retained(node: Node, grad, create_graph: bool) -> None:
    for ref in node._retained:
        t = ref()
        if t is None or t.grad_fn is not node:
            continue
        if t.grad is None:
            t.grad = grad.clone() if create_graph else grad.detach().clone()
        else:
            t.grad = t.grad + grad


def _accumulate_into(t, grad, create_graph: bool) -> None:
    """``backward(inputs=...)`` on a non-leaf: its ``.grad`` gets the gradient."""
    if t.grad is None:
        t.grad = grad.clone() if create_graph else grad.detach().clone()
    else:
        t.grad = t.grad + grad


def _make_grads(outputs: Sequence, grad_outputs) -> list:
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs]
    grads = []
    for out, g in zip(outputs, grad_outputs):
        if g is None:
            if out.requires_grad and out.numel() != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            if out.requires_grad and not out.dtype.is_floating_point:
                raise RuntimeError(
                    f"grad can be implicitly created only for real scalar outputs but got "
                    f"{out.dtype}")
            g = F.ones_like(out)
        else:
            if not isinstance(g, Tensor):
                raise TypeError(f"gradient must be a Tensor or None, got {type(g).__name__}")
            if tuple(g.shape) != tuple(out.shape):
                raise RuntimeError(
                    f"Mismatch in shape: grad_output[0] has a shape of {g.shape} and output[0] "
                    f"has a shape of {out.shape}.")
        grads.append(g)
    return grads


def _as_seq(x) -> list:
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]


def backward(tensors, grad_tensors=None, retain_graph: bool | None = None,
             create_graph: bool = False, inputs=None) -> None:
    """Accumulate the gradients of ``tensors`` into the ``.grad`` of leaves
    (``torch.autograd.backward``)."""
    tensors = _as_seq(tensors)
    if any(t._trace is not None for t in tensors):
        # loss.backward() inside a traced function: the trace differentiates its own graph.
        return tensors[0]._trace.backward(tensors, grad_tensors, create_graph, inputs,
                                          accumulate=True)
    grads = _make_grads(tensors, None if grad_tensors is None else _as_seq(grad_tensors))
    if retain_graph is None:
        retain_graph = create_graph
    if inputs is not None:
        inputs = _as_seq(inputs)
        if not inputs:
            raise RuntimeError("'inputs' argument to backward() cannot be empty.")
    run_backward(tensors, grads, retain_graph, create_graph, inputs=inputs, accumulate=True)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
         create_graph: bool = False, only_inputs: bool = True,
         allow_unused: bool | None = None, is_grads_batched: bool = False,
         materialize_grads: bool = False) -> tuple:
    """The gradients of ``outputs`` with respect to ``inputs``, returned rather than
    accumulated (``torch.autograd.grad``; ``only_inputs`` is ignored, as torch ignores it)."""
    outputs = _as_seq(outputs)
    inputs = _as_seq(inputs)
    if not inputs:
        raise RuntimeError("`inputs` argument to `grad()` cannot be empty.")
    if is_grads_batched:
        return _batched_grad(outputs, inputs, _as_seq(grad_outputs), retain_graph, create_graph,
                             allow_unused, materialize_grads)
    if any(t._trace is not None for t in outputs):
        results = outputs[0]._trace.backward(outputs, grad_outputs, create_graph, inputs,
                                             accumulate=False, allow_unused=bool(
                                                 allow_unused or materialize_grads))
        if materialize_grads:
            results = [F.zeros_like(t) if r is None else r for r, t in zip(results, inputs)]
        return tuple(results)
    grads = _make_grads(outputs, None if grad_outputs is None else _as_seq(grad_outputs))
    if retain_graph is None:
        retain_graph = create_graph
    if allow_unused is None:
        allow_unused = materialize_grads
    results = run_backward(outputs, grads, retain_graph, create_graph, inputs=inputs,
                           accumulate=False, allow_unused=allow_unused)
    if materialize_grads:
        results = [F.zeros_like(t) if r is None else r for r, t in zip(results, inputs)]
    return tuple(results)


def _batched_grad(outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused,
                  materialize_grads) -> tuple:
    """``grad(..., is_grads_batched=True)``: the first dimension of each grad_output is a
    batch; one backward per row (torch vmaps over them), the gradients stacked."""
    n = grad_outputs[0].shape[0]
    keep = create_graph if retain_graph is None else retain_graph
    rows = [grad(outputs, inputs, [g[i] for g in grad_outputs], keep or i < n - 1,
                 create_graph, allow_unused=allow_unused, materialize_grads=materialize_grads)
            for i in range(n)]
    return tuple(None if col[0] is None else stack(list(col)) for col in zip(*rows))


tape.register_backward_runner(run_backward)
register_handler("backward", backward)
