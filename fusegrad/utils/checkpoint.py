"""``torch.utils.checkpoint``: activation checkpointing. A checkpointed region keeps none of
its intermediate values for backward; its backward runs the region again, with the random
number state of the forward, and differentiates that.

Eagerly both of torch's variants are autograd nodes over the region:

- ``use_reentrant=True`` (torch's ``CheckpointFunction``): the forward runs under
  ``no_grad``; the node's edges are the tensor arguments that require grad. Its backward
  reruns the region on detached arguments and calls ``backward`` on the rerun: the region's
  parameters get their ``.grad`` there, so ``autograd.grad`` and ``backward(inputs=...)``
  are refused, as torch refuses them.
- ``use_reentrant=False``: the forward records the region as usual, then keeps only what the
  record leads to outside the region (its arguments, parameters and captured tensors) as the
  node's edges and drops the rest, with the values the region saved, when the region returns.
  Its backward reruns the region and runs the rerun's graph down to those edges, returning
  their gradients to the engine: ``autograd.grad`` of parameters, keyword arguments and
  arguments that do not require grad work as in torch. The region's saved values live while
  it runs (torch's version never keeps them), and are freed when it returns.

In both the backward is the same ops in the same order as without checkpointing, so the
gradients are equal, not merely close.

Traced (``fusegrad.compile``) the region is inlined and its nodes are marked as one region
(``Node.region``). The compiled backward, in a whole training step or in the backward of a
partitioned forward, differentiates the region on copies of its nodes recomputed right
before the region's backward (:mod:`fusegrad.passes.autodiff`): the program keeps the
region's inputs and outputs, not its intermediate values, and a random op in the region
draws the forward's numbers again. The values and gradients are the unchecked program's.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, ContextManager

# Imported under private names: this module's public names are torch.utils.checkpoint's.
from fusegrad.autograd import engine as _engine
from fusegrad.autograd.grad_mode import enable_grad as _enable_grad
from fusegrad.autograd.grad_mode import is_grad_enabled as _is_grad_enabled
from fusegrad.autograd.grad_mode import no_grad as _no_grad
from fusegrad.ir.symbolic import innermost_trace as _innermost_trace
from fusegrad.nn import Sequential as _Sequential
from fusegrad.ops import primitive as _primitive
from fusegrad.ops.composite import _made_by
from fusegrad.ops.creation import get_rng_state as _get_rng_state
from fusegrad.ops.creation import set_rng_state as _set_rng_state
from fusegrad.tensor import Tensor as _Tensor
from fusegrad.torch_api import missing_attribute as _missing_attribute
from fusegrad.tracer.compiled_autograd import _OutputBackward
from fusegrad.tracer.trace import tree_flatten as _tree_flatten
from fusegrad.tracer.trace import tree_unflatten as _tree_unflatten

__all__ = ["checkpoint", "checkpoint_sequential", "CheckpointError", "noop_context_fn",
           "detach_variable", "check_backward_validity"]

_NAME = "CheckpointFunctionBackward"

class CheckpointError(RuntimeError):
    """The region computed differently when it ran again in backward (torch's)."""


def noop_context_fn() -> tuple[ContextManager, ContextManager]:
    """The default ``context_fn``: no context around the forward or the recomputation."""
    return contextlib.nullcontext(), contextlib.nullcontext()


def _default_metadata(t: _Tensor) -> dict:
    return {"shape": t.shape, "dtype": t.dtype, "device": t.device}


_DETERMINISM_CHECKS: dict[str, Callable[[_Tensor], Any]] = {
    "default": _default_metadata,
    "none": lambda _: None,
}


def detach_variable(inputs: tuple) -> tuple:
    """Each tensor of ``inputs`` detached, requiring grad as it did (torch's)."""
    if not isinstance(inputs, tuple):
        raise RuntimeError("Only tuple of tensors is supported. Got Unsupported input type: "
                           f"{type(inputs).__name__}")
    out = []
    for a in inputs:
        if isinstance(a, _Tensor):
            d = a.detach()
            d.requires_grad = a.requires_grad
            a = d
        out.append(a)
    return tuple(out)


def check_backward_validity(inputs) -> None:
    """Warn, as torch does, when no tensor of ``inputs`` requires grad."""
    if not any(a.requires_grad for a in inputs if isinstance(a, _Tensor)):
        warnings.warn("None of the inputs have requires_grad=True. Gradients will be None",
                      stacklevel=3)


@contextlib.contextmanager
def _rng_state(state: _Tensor | None):
    """The forward's random number state while the region reruns; the caller's after."""
    if state is None:
        yield
        return
    outer = _get_rng_state()
    _set_rng_state(state)
    try:
        yield
    finally:
        _set_rng_state(outer)


class _Region:
    """What a backward needs to run the region again: the function, its arguments (tensors
    saved with their versions: one written in place since raises, as a saved tensor does), the
    random number state, and the metadata of its outputs that carry gradients."""

    def __init__(self, function, args: tuple, kwargs: dict, rng, recompute_context,
                 metadata_fn, outputs: dict):
        self.function, self.rng, self.context = function, rng, recompute_context
        leaves, self.tree = _tree_flatten((args, kwargs))
        self.saved = [_engine._Saved(t, origin="") for t in leaves]
        self.metadata_fn = metadata_fn
        self.metadata = {k: metadata_fn(t) for k, t in outputs.items()}
        self.freed = False

    def arguments(self, node: _engine.Node) -> tuple[tuple, dict]:
        if self.freed:
            raise RuntimeError(_engine._FREED_MESSAGE)
        return _tree_unflatten(self.tree, [s.unpack(node) for s in self.saved])

    def check(self, recomputed: list) -> None:
        """Raise :class:`CheckpointError` where the rerun's outputs differ in metadata."""
        different = ""
        for k, meta in self.metadata.items():
            again = self.metadata_fn(recomputed[k]) if k < len(recomputed) else None
            if again != meta:
                different += (f"tensor at position {k}:\nsaved metadata: {meta}\n"
                              f"recomputed metadata: {again}\n")
        if different:
            raise CheckpointError(
                "torch.utils.checkpoint: Recomputed values for the following tensors have "
                f"different metadata than during the forward pass.\n{different}.")
            # (torch's message goes on with a tip to pass debug=True, which fusegrad lacks)

    def release(self) -> None:
        self.saved = []
        self.freed = True


class _CheckpointBackward(_engine.Node):
    """The backward of one checkpointed call: reruns the region and differentiates the rerun.

    It receives the gradients of the region's outputs as the compiled call's node does
    (``_OutputGrads`` by output position, from one ``_OutputBackward`` per output), or, with
    a single output, that output's gradient."""

    __slots__ = ("region", "reentrant")

    def __init__(self, region: _Region, edges: tuple, reentrant: bool):
        super().__init__(edges, _NAME)
        self.region, self.reentrant = region, reentrant

    def apply(self, grad, create_graph, retain_graph):
        if self.reentrant and not _engine.is_checkpoint_valid():
            raise RuntimeError(
                "When use_reentrant=True, torch.utils.checkpoint is incompatible with .grad() or "
                "passing an `inputs` parameter to .backward(). To resolve this error, you can "
                "either set use_reentrant=False, or call .backward() without passing the "
                "`inputs` argument.")
        region = self.region
        if isinstance(grad, _Tensor):
            (k,) = region.metadata
            grads = {k: grad}
        else:
            grads = dict(sorted(grad.items()))
        args, kwargs = region.arguments(self)
        if self.reentrant:
            args = detach_variable(args)
        with _rng_state(region.rng), _enable_grad(), region.context:
            out = region.function(*args, **kwargs)
        if self.reentrant:
            return self._accumulated(out, args, grads, create_graph)
        recomputed = _tree_flatten(out)[0]
        region.check(recomputed)
        outs = [recomputed[k] for k in grads]
        # The rerun's graph reaches the same nodes outside the region as the forward's did:
        # its gradients are taken there and handed to the engine, which runs those nodes
        # (their hooks, retained gradients and leaves' accumulation) once, after this.
        stops = [_made_by(outs[0], node) for node, _ in self.next_functions]
        with _quiet([node for node, _ in self.next_functions]):
            return tuple(_engine.run_backward(outs, list(grads.values()), create_graph, create_graph,
                                      inputs=stops, accumulate=False, allow_unused=True,
                                      stop_at_inputs=True))

    def _accumulated(self, out, args: tuple, grads: dict, create_graph: bool) -> tuple:
        """The reentrant backward: ``backward`` on the rerun (the region's parameters get their
        gradients there), the arguments' gradients returned."""
        outs = out if isinstance(out, tuple) else (out,)
        pairs = [(outs[k], g) for k, g in grads.items()
                 if isinstance(outs[k], _Tensor) and outs[k].requires_grad]
        if not pairs:
            raise RuntimeError(
                "none of output has requires_grad=True, this checkpoint() is not necessary")
        _engine.backward([o for o, _ in pairs], [g for _, g in pairs], create_graph=create_graph)
        return tuple(a.grad for a in args if isinstance(a, _Tensor) and a.requires_grad)

    def release(self) -> None:
        self.region.release()


@contextlib.contextmanager
def _quiet(nodes: list):
    """The hooks and retained gradients of ``nodes`` switched off: the rerun's backward stops
    at them, and the engine runs them afterwards with the whole gradient."""
    kept = []
    for node in nodes:
        var = node.variable if isinstance(node, _engine.AccumulateGrad) else None
        kept.append((node._pre_hooks, node._retained, var._hooks if var is not None else None))
        node._pre_hooks = node._retained = None
        if var is not None:
            var._hooks = None
    try:
        yield
    finally:
        for node, (pre, retained, hooks) in zip(nodes, kept):
            node._pre_hooks, node._retained = pre, retained
            if isinstance(node, _engine.AccumulateGrad):
                node.variable._hooks = hooks


def _with_nodes(leaves: list, flagged: list[int], joint: _CheckpointBackward) -> list:
    """``leaves`` with each flagged tensor replaced by one whose grad_fn leads to ``joint``."""
    leaves = list(leaves)
    if len(flagged) == 1:
        (k,) = flagged
        leaves[k] = _made_by(leaves[k], joint)
    else:
        for k in flagged:
            leaves[k] = _made_by(leaves[k], _OutputBackward(joint, k, _NAME))
    return leaves


def _reentrant(function, preserve: bool, args: tuple):
    check_backward_validity(args)
    rng = _get_rng_state() if preserve else None
    with _no_grad():
        out = function(*args)
    tensors = [a for a in args if isinstance(a, _Tensor) and a.requires_grad]
    if not (_is_grad_enabled() and tensors):
        return out
    # As a custom Function's outputs: the top-level tensors of a returned tuple, those of a
    # floating dtype (an integer output is not differentiable).
    outs = out if isinstance(out, tuple) else (out,)
    flagged = {k: t for k, t in enumerate(outs)
               if isinstance(t, _Tensor) and t.dtype.is_floating_point}
    if not flagged:
        return out
    region = _Region(function, args, {}, rng, contextlib.nullcontext(), _default_metadata,
                     flagged)
    joint = _CheckpointBackward(region, tuple(_engine._edge(t) for t in tensors), reentrant=True)
    outs = _with_nodes(list(outs), list(flagged), joint)
    return tuple(outs) if isinstance(out, tuple) else outs[0]


def _boundary(outputs: list[_Tensor], start: int) -> list[_engine.Node]:
    """The nodes outside a region recorded after node number ``start`` that its outputs'
    graph leads to: leaves' accumulators and nodes recorded before the region."""
    stack = [t.grad_fn for t in outputs]
    seen = set(stack)
    boundary = []
    while stack:
        node = stack.pop()
        for child, _ in node.next_functions:
            if child is None or child in seen:
                continue
            seen.add(child)
            if isinstance(child, _engine.AccumulateGrad) or child._seq < start:
                boundary.append(child)
            else:
                stack.append(child)
    return boundary


def _non_reentrant(function, preserve: bool, context_fn, determinism_check: str,
                   args: tuple, kwargs: dict):
    if determinism_check not in _DETERMINISM_CHECKS:
        raise ValueError(f"determinism_check should be one of {list(_DETERMINISM_CHECKS)}, "
                         f"but got {determinism_check}")
    forward_context, recompute_context = context_fn()
    if not _is_grad_enabled():
        with forward_context:
            return function(*args, **kwargs)
    rng = _get_rng_state() if preserve else None
    start = next(_engine._sequence)
    with forward_context:
        out = function(*args, **kwargs)
    leaves, tree = _tree_flatten(out)
    # The outputs recorded inside the region; one returned as it came in (an argument, a
    # parameter) keeps its own history.
    flagged = {k: t for k, t in enumerate(leaves)
               if t.grad_fn is not None and t.grad_fn._seq > start}
    if not flagged:
        return out
    boundary = _boundary(list(flagged.values()), start)
    region = _Region(function, args, kwargs, rng, recompute_context,
                     _DETERMINISM_CHECKS[determinism_check], flagged)
    joint = _CheckpointBackward(region, tuple((node, 0) for node in boundary), reentrant=False)
    return _tree_unflatten(tree, _with_nodes(leaves, list(flagged), joint))


def _traced(function, leaves: list, args: tuple, kwargs: dict):
    """The region inlined into the trace, its nodes marked as one checkpointed region
    (``Node.region``: the position of its first node, unique in the graph); an inner region
    of an outer one belongs to the outer (it is recomputed with it)."""
    graph = _innermost_trace([t for t in leaves if isinstance(t, _Tensor)]).graph
    start = len(graph.nodes)
    out = function(*args, **kwargs)
    for node in graph.nodes[start:]:
        node.region = start
    return out


def checkpoint(function, *args, use_reentrant: bool | None = None,
               context_fn: Callable[[], tuple[ContextManager, ContextManager]] = noop_context_fn,
               determinism_check: str = "default", debug: bool = False,
               early_stop: bool = True, **kwargs):
    """``function(*args, **kwargs)``, keeping none of its intermediate values for backward:
    backward runs it again (with the forward's random number state when
    ``preserve_rng_state``, the default) and differentiates that.

    ``use_reentrant`` should be given: True is torch's older variant (positional arguments
    only, no ``autograd.grad``), False the recommended one. ``context_fn`` returns the
    contexts of the forward and of the recomputation; ``determinism_check="default"``
    compares the shapes, dtypes and devices of the outputs the two runs computed. ``early_stop``
    is accepted for torch's signature (the whole region is always rerun, as with
    ``early_stop=False``: the same values); ``debug=True`` warns that it is not implemented.

    Example::

        h = checkpoint(block, h, use_reentrant=False)
    """
    if use_reentrant is None:
        warnings.warn(
            "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly. "
            "Starting in PyTorch 2.9, calling checkpoint without use_reentrant will raise an "
            "exception. use_reentrant=False is recommended, but if you need to preserve the "
            "current default behavior, you can pass use_reentrant=True. Refer to docs for more "
            "details on the differences between the two variants.", stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs and use_reentrant:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))
    if use_reentrant and (context_fn is not noop_context_fn or debug is not False):
        raise ValueError("Passing `context_fn` or `debug` is only supported when "
                         "use_reentrant=False.")
    if debug:
        warnings.warn("checkpoint(debug=True) is not implemented in fusegrad: a recomputation "
                      "that differs from the forward raises CheckpointError without the traces "
                      "of both runs", UserWarning, stacklevel=2)
    leaves = _tree_flatten((args, kwargs))[0]
    if _primitive.traced(*leaves):
        return _traced(function, leaves, args, kwargs)
    if use_reentrant:
        return _reentrant(function, preserve, args)
    return _non_reentrant(function, preserve, context_fn, determinism_check, args, kwargs)


def checkpoint_sequential(functions, segments: int, input, use_reentrant: bool | None = None,
                          **kwargs):
    """Run ``functions`` (an ``nn.Sequential`` or a list of modules or functions) one after
    another on ``input``, split into ``segments`` chunks, each but the last checkpointed."""
    if use_reentrant is None:
        warnings.warn(
            "torch.utils.checkpoint.checkpoint_sequential: the use_reentrant parameter should be "
            "passed explicitly. In version 2.9 we will raise an exception if use_reentrant is "
            "not passed. use_reentrant=False is recommended, but if you need to preserve the "
            "current default behavior, you can pass use_reentrant=True. Refer to docs for more "
            "details on the differences between the two variants.", stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))

    def run_function(start: int, end: int, functions):
        def forward(input):
            for j in range(start, end + 1):
                input = functions[j](input)
            return input
        return forward

    if isinstance(functions, _Sequential):
        functions = list(functions.children())
    # As torch's: segments of len // segments functions, the rest in the last, unchecked one.
    segment_size = len(functions) // segments
    end = -1
    for start in range(0, segment_size * (segments - 1), segment_size):
        end = start + segment_size - 1
        input = checkpoint(run_function(start, end, functions), input,
                           use_reentrant=use_reentrant, preserve_rng_state=preserve)
    return run_function(end + 1, len(functions) - 1, functions)(input)


def __getattr__(name: str):
    raise _missing_attribute("torch.utils.checkpoint", "fusegrad.utils.checkpoint", name)
