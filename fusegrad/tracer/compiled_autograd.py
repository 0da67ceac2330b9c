"""The compiled-autograd nodes: what a compiled call records on the eager autograd tape.

A call whose inputs require grad under grad mode gives each differentiable output an
:class:`_OutputBackward`; they feed one :class:`_CompiledBackward` of the call, which runs
the partition's backward program from the residuals the forward saved
(:func:`~fusegrad.tracer.programs.split_programs`), or the compiled VJP of the outputs that
received a gradient (:func:`~fusegrad.tracer.programs.vjp_program`); with
``create_graph=True`` that VJP's graph is replayed eagerly instead, so higher-order gradients
still work. :func:`differentiated` says which outputs get a node and which inputs a
gradient; :func:`record_backward` attaches the nodes.
"""

from __future__ import annotations

import numpy as np

from fusegrad import dtypes
from fusegrad.autograd.engine import _FREED_MESSAGE, Node, _edge
from fusegrad.autograd.grad_mode import is_grad_enabled
from fusegrad.ir.graph import Graph, Value
from fusegrad.ir.interpreter import bind_symbols
from fusegrad.ir.specialize import specialize
from fusegrad.ir.symbolic import replay
from fusegrad.symint import evaluate_shape
from fusegrad.tensor import Tensor
from fusegrad.tracer.call_cache import _Entry, _SplitPrograms

__all__ = ["differentiated", "record_backward"]


def differentiated(entry: _Entry, inputs: list) -> tuple[tuple | None, list | None]:
    """For a call that autograd records (not a training step, whose gradients were taken
    inside): the inputs that get a gradient and, per output, whether it is differentiable;
    (None, None) for other calls."""
    cap = entry.info.capture
    if (cap is not None and cap.did_backward) or not is_grad_enabled() or \
            not any(t is not None and t._requires_grad for t in inputs):
        return None, None
    wrt = tuple(i for i, t in enumerate(inputs) if t is not None and t._requires_grad
                and t.dtype.is_differentiable)
    found = entry.differentiable.get(wrt)
    if found is None:
        flags = _differentiable_outputs(entry.graph, wrt)
        found = entry.differentiable[wrt] = (_reaching(entry.graph, wrt, flags), flags)
    # Only the inputs some differentiable output depends on get a gradient: a parameter the
    # forward does not use keeps .grad None, as in eager.
    return found


def record_backward(cf, entry: _Entry, wrt: tuple, flags: list[bool], inputs: list,
                    results: list, split: _SplitPrograms | None, residuals: list | None) -> None:
    """Give the differentiable outputs among ``results`` their nodes, saving ``inputs`` (as
    the call saw them: before its write-backs) and the forward's ``residuals``."""
    mutations = entry.info.mutations or ()
    saved = _SavedInputs(inputs, {i for i, _ in mutations}, split, residuals)
    saved.outputs = _saved_outputs(results, residuals)
    flagged = tuple(k for k, f in enumerate(flags) if f)
    joint = _CompiledBackward(cf, entry, wrt, saved, inputs, flagged)
    for k in flagged:
        results[k].grad_fn = _OutputBackward(joint, k, cf.grad_name)
        results[k]._requires_grad = True


class _SavedInputs:
    """What a compiled call keeps for its backward: its inputs with their versions (the
    tensors themselves, so a ``create_graph`` backward stays connected to them) and, when the
    forward ran as a partition's first half, the residuals it saved."""

    def __init__(self, inputs: list, mutated: set[int] = frozenset(),
                 split: _SplitPrograms | None = None, residuals: list | None = None):
        # An input the call writes in place is kept as a copy of its values before the
        # write: the VJP program computes from what the forward read.
        self.tensors = [Tensor._wrap(t._data.copy(), t._dtype) if i in mutated and t is not None
                        else t for i, t in enumerate(inputs)]
        self.versions = [t._version_counter.value if t is not None else 0 for t in self.tensors]
        self.freed = False
        self.split = split
        self.residuals = residuals
        self.outputs: list = []         # (output, its version): those saved as residuals

    def backward_arrays(self) -> list:
        """The partition's saved values, in the backward program's input order."""
        # The forward's outputs after its own are every saved value, inputs passed through
        # included; an input is read from the kept tensor (a copy if the call wrote it).
        return [self.tensors[s.input_index]._data if s.kind == "input" else self.residuals[k]
                for k, s in enumerate(self.split.partition.saved)]

    def unpack(self, name: str) -> list:
        if self.freed:
            raise RuntimeError(_FREED_MESSAGE)
        for t, v in list(zip(self.tensors, self.versions)) + self.outputs:
            if t is not None and t._version_counter.value != v:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified by "
                    f"an inplace operation: [{t._type_string()} {list(t.shape)}] is at version "
                    f"{t._version_counter.value}; expected version {v} instead (saved by {name})")
        return self.tensors


def _saved_outputs(results, residuals) -> list:
    """The outputs whose buffers the backward reads as saved values (softmax's output), with
    their versions: written in place before the backward, they raise, as torch's saved
    outputs do (the gradient was computed from the written values, silently)."""
    if not residuals:
        return []
    saved = {id(r) for r in residuals} | {id(r.base) for r in residuals if r.base is not None}
    return [(t, t._version_counter.value) for t in results if id(t._data) in saved]




class _OutputGrads(dict):
    """Gradients of some outputs of one compiled call, by output index; the engine adds what
    the outputs' nodes pass on, so the call's node receives all of them together."""

    def __add__(self, other: "_OutputGrads") -> "_OutputGrads":
        total = _OutputGrads(self)
        for k, g in other.items():
            total[k] = total[k] + g if k in total else g
        return total


class _OutputBackward(Node):
    """The grad_fn of output ``k`` of a compiled call: passes its gradient on to the call's
    :class:`_CompiledBackward`, which the engine runs after every output's node (as torch
    runs one node with several outputs)."""

    __slots__ = ("k", "freed")

    def __init__(self, joint: "_CompiledBackward", k: int,
                 name: str = "CompiledFunctionBackward"):
        super().__init__(((joint, 0),), name)
        self.k, self.freed = k, False

    def apply(self, grad, create_graph, retain_graph):
        if self.freed:
            raise RuntimeError(_FREED_MESSAGE)
        return (_OutputGrads({self.k: grad}),)

    def release(self) -> None:
        # A second backward through this output raises, as for any freed node; the call's
        # node stays usable for its other outputs (it holds the saved inputs until they die).
        self.freed = True


class _CompiledBackward(Node):
    """Backward of a compiled call: runs the compiled VJP of the outputs that received a
    gradient, seeded with those gradients (``cf``: the compiled function, which builds that
    VJP's program on first use, ``cf.backward_program``)."""

    __slots__ = ("cf", "entry", "wrt", "saved", "flagged")

    def __init__(self, cf, entry: _Entry, wrt: tuple, saved: _SavedInputs,
                 inputs: list, flagged: tuple = ()):
        super().__init__(tuple(_edge(inputs[i]) for i in wrt), "CompiledFunctionBackward")
        self.cf, self.entry, self.wrt, self.saved = cf, entry, wrt, saved
        self.flagged = flagged          # the outputs that carry gradients, in order

    def apply(self, grad: _OutputGrads, create_graph, retain_graph):
        inputs = self.saved.unpack(self._name)
        seeded = tuple(sorted(grad))
        split = self.saved.split
        if split is not None and not create_graph and seeded == self.flagged:
            # Every output that can carry a gradient got one: the partition's backward, from
            # the residuals the forward saved. (Others get zero cotangents there; they carry
            # no gradient to the inputs.)
            outs = self.entry.graph.outputs
            sizes = bind_symbols(self.entry.graph, [t.shape for t in inputs]) \
                if self.entry.symbolic is not None else None
            cts = [grad[i] if i in grad else _zeros(o.type, sizes) for i, o in enumerate(outs)]
            arrays = self.saved.backward_arrays() + [c._data for c in cts]
            return tuple(Tensor._wrap(a, dtypes.from_numpy_dtype(a.dtype))
                         for a in split.backward(*arrays))
        # Some outputs got no gradient (a zero cotangent down their paths could meet 0 * inf),
        # create_graph (the backward is recorded), or the interpreter backend: the VJP of the
        # seeded outputs, recomputing the forward from the inputs.
        sizes = bind_symbols(self.entry.graph, [t.shape for t in inputs]) \
            if self.entry.symbolic is not None else None
        program, g, reached = self.cf.backward_program(self.entry, self.wrt, seeded, sizes)
        cts = [grad[k] for k in seeded]
        if create_graph or program is None:
            if self.entry.symbolic is not None:      # replayed at this call's sizes
                g = specialize(g, bind_symbols(self.entry.graph, [t.shape for t in inputs]))
            grads = replay(g, list(inputs) + cts)
        else:
            arrays = [t._data for t in inputs] + [c._data for c in cts]
            grads = [Tensor._wrap(a, dtypes.from_numpy_dtype(a.dtype)) for a in program(*arrays)]
        # An input only the outputs without a gradient depend on gets none, not zeros (as
        # eager: its .grad stays None, and an optimizer skips it rather than stepping it)
        return tuple(gi if i in reached else None for i, gi in zip(self.wrt, grads))



def _differentiable_outputs(graph: Graph, wrt: tuple) -> list[bool]:
    """Which outputs of ``graph`` depend on the inputs ``wrt`` through operands that have a
    VJP rule: not the results of comparisons, argmax or stop_gradient (detach), which eager
    autograd gives ``requires_grad=False``, as it does integer results, and so not what is
    computed from an integer result either (a float cast back from an int cast)."""
    live = {graph.inputs[i] for i in wrt}
    for node in graph.nodes:
        if node.output.type.dtype.is_differentiable and any(
                isinstance(op, Value) and op in live and node.prim.rule(j) is not None
                for j, op in enumerate(node.inputs)):
            live.add(node.output)
    return [isinstance(o, Value) and o in live and o.type.dtype.is_differentiable
            for o in graph.outputs]



def _reaching(graph: Graph, wrt: tuple, flags: list[bool]) -> tuple:
    """The inputs of ``wrt`` that the outputs ``flags`` marks depend on through operands with
    a VJP rule (the others get no gradient from this call, not a zero one)."""
    need = {o for o, f in zip(graph.outputs, flags) if f}
    for node in reversed(graph.nodes):
        if node.output in need:
            need.update(op for j, op in enumerate(node.inputs)
                        if isinstance(op, Value) and node.prim.rule(j) is not None)
    return tuple(i for i in wrt if graph.inputs[i] in need)




def _zeros(t, sizes: dict | None = None) -> Tensor:
    """Zeros of type ``t`` (``sizes``: the values of its symbolic sizes)."""
    shape = evaluate_shape(t.shape, sizes) if sizes else t.shape
    return Tensor._wrap(np.zeros(shape, dtype=t.dtype.np_dtype), t.dtype)
