"""The eager autograd tape: the nodes that differentiable eager ops leave as ``grad_fn``.

Each differentiable eager op leaves a :class:`Node` as its output's ``grad_fn``; a node's
``next_functions`` are the edges to the nodes of its inputs (an :class:`AccumulateGrad` for a
leaf). :func:`record_eager_node` is what :func:`fusegrad.ops.primitive.bind` calls after an
eager primitive (it registers itself there); the composite and in-place ops build their own
nodes from these types. Running the tape backward is :mod:`fusegrad.autograd.engine`'s job,
above the ops: a node that runs a backward of its own (a composite's) calls it through
:func:`run_backward`, which the engine fills.

Here rather than in :mod:`fusegrad.autograd` because the ops record nodes: the tape sits
with the ops (below the public ops that record it), the engine above them.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from typing import Callable, Sequence

import numpy as np

from fusegrad.grad_mode import _state as _grad_state
from fusegrad.grad_mode import set_grad_enabled
from fusegrad.ops import primitive as _primitive
from fusegrad.tensor import register_handler
from fusegrad.tensor_type import TensorType

__all__ = ["Node", "PrimitiveNode", "AccumulateGrad", "record_eager_node", "retain",
           "keep_retained", "hook_result", "run_backward", "register_backward_runner"]

_sequence = itertools.count()

_FREED_MESSAGE = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward.")


class Node:
    """A node of the autograd tape with one output; ``apply`` maps its output's gradient to
    one gradient per edge in ``next_functions``."""

    __slots__ = ("next_functions", "_seq", "_name", "_pre_hooks", "_retained", "__weakref__")

    def __init__(self, next_functions: tuple, name: str):
        self.next_functions = next_functions
        self._seq = next(_sequence)
        self._name = name
        self._pre_hooks: list | None = None
        self._retained: list | None = None     # weakrefs to non-leaf tensors with retain_grad

    def name(self) -> str:
        return self._name

    def apply(self, grad, create_graph: bool, retain_graph: bool) -> tuple:
        raise NotImplementedError

    def release(self) -> None:
        """Free saved tensors after a backward without ``retain_graph``."""

    def register_prehook(self, fn) -> None:
        if self._pre_hooks is None:
            self._pre_hooks = []
        self._pre_hooks.append(fn)

    def __repr__(self) -> str:
        return f"<{self._name} object at {hex(id(self))}>"

    def __call__(self, *grads):
        return self.apply(grads[0], False, True)


def _refresh_view(t) -> None:
    """Give a view whose storage was written in place since its history was recorded (through
    its base or another view of the base) the base's current history, by replaying its view
    ops on the base; torch regenerates such a view's grad_fn the same way. Views made under
    no_grad carry no ``_view_version`` stamp and are left alone."""
    stamp = getattr(t, "_view_version", None)
    if stamp is None or stamp == t._version_counter.value:
        return
    t._view_version = t._version_counter.value
    base = t._base
    if not base._requires_grad:
        return
    with set_grad_enabled(True):
        v = base
        for prim, attrs in t._version_counter.undo + t._view_ops:
            v = _primitive.bind(prim, v, **attrs)
    t.grad_fn, t._requires_grad = v.grad_fn, v._requires_grad
    keep_retained(t)


def _edge(t) -> tuple:
    """The edge that gradients for tensor ``t`` flow along: its grad_fn, or its leaf node."""
    if t._base is not None:
        _refresh_view(t)
    node = t.grad_fn
    if node is not None:
        return (node, 0)
    if t._requires_grad:
        return (t._accumulator(), 0)
    return _NO_EDGE


_NO_EDGE = (None, 0)


class _Saved:
    """A tensor saved for backward, with the version it had when saved."""

    __slots__ = ("tensor", "version", "origin")

    def __init__(self, tensor, origin: str | None = None):
        self.tensor = tensor
        self.version = tensor._version_counter.value
        # The node that made the tensor, named only if the error below is raised (a name
        # looked up per saved tensor is a method call per recorded op).
        self.origin = origin if origin is not None else tensor.grad_fn

    def unpack(self, node: Node):
        t = self.tensor
        if t._version_counter.value != self.version:
            origin = self.origin
            if isinstance(origin, Node):
                origin = origin.name()
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: [{t._type_string()} {list(t.shape)}]"
                f"{', which is output 0 of ' + origin if origin else ''}, is at version "
                f"{t._version_counter.value}; expected version {self.version} instead. Hint: "
                "the operation that failed was the backward of "
                f"{node.name()}; use an out-of-place op (x = x + y instead of x += y) or "
                ".clone() the tensor before modifying it.")
        return t


def _reads(prim, needs: tuple) -> tuple[frozenset, bool]:
    """The operands, and whether the output, that the VJP rules of the operands in
    ``needs`` read."""
    reads: set[int] = set()
    reads_output = False
    for i, n in enumerate(needs):
        if n:
            rule = prim.rule(i)
            reads.update(rule.reads)
            reads_output |= rule.reads_output
    return frozenset(reads), reads_output


# (primitive, operands needing a gradient) -> what their rules read: a few entries per primitive.
_READS: dict = {}


class PrimitiveNode(Node):
    """Backward of one primitive: the primitive's VJP rule of each operand that needs one.

    Only the operands and output that those rules read are saved, as torch saves only what
    a derivative formula uses: ``x * 2`` saves nothing of ``x``, so ``x`` may be modified
    in place afterwards.
    """

    __slots__ = ("prim", "attrs", "_in_meta", "_needs", "_saved", "_out")

    def __init__(self, prim, attrs: dict, operands: Sequence, out):
        # One plain loop (a comprehension is a call of its own in Python 3.11), Node's fields
        # set here rather than by Node.__init__, no TensorType made: this runs once per
        # recorded eager op.
        rules = prim.vjp
        variadic = prim.variadic
        needs, edges, meta = [], [], []
        for i, op in enumerate(operands):
            n = op._requires_grad and (rules[0] if variadic else rules[i]) is not None
            needs.append(n)
            edges.append(_edge(op) if n else _NO_EDGE)
            # Operand shapes and dtypes: the rules get them for the operands not saved, and
            # the gradients are checked against them.
            meta.append((op._data.shape, op._dtype))
        self.next_functions = tuple(edges)
        self._seq = next(_sequence)
        self._name = name = prim.grad_name or prim.name
        self._pre_hooks = None
        self._retained = None
        self.prim = prim
        self.attrs = attrs
        self._needs = needs = tuple(needs)
        self._in_meta = tuple(meta)
        try:
            reads, reads_output = _READS[prim, needs]
        except KeyError:
            reads, reads_output = _READS.setdefault((prim, needs), _reads(prim, needs))
        # None when nothing is saved (such a node may run twice), _FREED after release.
        self._saved = tuple([_Saved(op) if i in reads else None
                             for i, op in enumerate(operands)]) if reads else None
        # Keep the output's data, not the output itself: the output holds this node as its
        # grad_fn, and a strong reference back would make a cycle.
        self._out = _Saved(out._detach_own_tape(), name) if reads_output else None

    def apply(self, grad, create_graph: bool, retain_graph: bool) -> tuple:
        saved = self._saved
        if saved is _FREED:
            raise RuntimeError(_FREED_MESSAGE)
        if saved is None:
            primals = tuple([TensorType(shape, dtype) for shape, dtype in self._in_meta])
        else:
            primals = tuple([s.unpack(self) if s is not None else TensorType(*meta)
                             for s, meta in zip(saved, self._in_meta)])
        out = None if self._out is None else self._saved_output(create_graph)
        # The rules called directly, as Primitive.cotangent calls them: two calls fewer per
        # gradient.
        prim, attrs = self.prim, self.attrs
        if prim.variadic:
            fn = prim.vjp[0].fn
            grads = [fn(grad, out, *primals, argnum=i, **attrs) if n else None
                     for i, n in enumerate(self._needs)]
        else:
            rules = prim.vjp
            grads = [rules[i].fn(grad, out, *primals, **attrs) if n else None
                     for i, n in enumerate(self._needs)]
        return _check_grads(self, grads)

    def _saved_output(self, create_graph: bool):
        """The saved output for the rules; under ``create_graph`` a tensor whose history is
        this node (a gradient of the output-reading rule is then differentiable), with the
        output's forward-mode tangents (forward over reverse through exp's rule)."""
        out = self._out.unpack(self)
        if create_graph:
            fw = out._fw_grads
            out = out._detach_own_tape()
            out._fw_grads = fw
            out.grad_fn = self
            out._requires_grad = True
        return out

    def release(self) -> None:
        if self._saved is not None or self._out is not None:
            self._saved = _FREED
            self._out = None


# PrimitiveNode._saved once its saved tensors are freed.
_FREED = ("freed",)


def _check_grads(node: Node, grads) -> tuple:
    """Match each gradient to its input's shape and dtype, as the engine of torch does."""
    meta = getattr(node, "_in_meta", None)
    if meta is None:
        return tuple(grads)
    fixed = []
    for g, (shape, dtype) in zip(grads, meta):
        if g is not None:
            # A gradient inside vmap is a batched tensor, with no storage of its own.
            if (g._data.shape if g._trace is None else tuple(g.shape)) != shape:
                raise RuntimeError(
                    f"Function {node.name()} returned an invalid gradient: got shape "
                    f"{list(g.shape)} but expected shape compatible with {list(shape)}")
            if g._dtype is not dtype and dtype.is_differentiable:
                g = g.to(dtype)
        fixed.append(g)
    return tuple(fixed)


def _refs_of_param(t) -> int:
    return sys.getrefcount(t)


def _refs_of_local() -> int:
    t = object()
    return _refs_of_param(t)


def _refs_of_attr(holder) -> int:
    a = holder.x
    return sys.getrefcount(a)


class _Holder:
    __slots__ = ("x",)


def _refs_of_held() -> int:
    h = _Holder()
    h.x = object()
    return _refs_of_attr(h)


# The reference counts of a gradient that only the engine holds, seen from
# AccumulateGrad.apply: the tensor is run_backward's local and apply's argument; its array is
# the tensor's attribute and a local. Measured on functions of the same shape rather than
# written down, so that an interpreter that counts differently gets its own numbers.
_SOLE_TENSOR_REFS = _refs_of_local()
_SOLE_ARRAY_REFS = _refs_of_held()


def _sole_owner(grad) -> bool:
    """Whether ``grad``, arriving at a leaf, is held by the engine alone, so that it can become
    ``.grad`` as it is (torch's AccumulateGrad steals such a gradient instead of copying it).

    Anything else holding the tensor or its memory (another edge's buffer, a hook, a retained
    ``.grad``, the caller's ``gradient``, another view) shows in the reference counts, and the
    gradient is copied as before. A view is taken when it views, one level deep, an array that
    only its base tensor holds (the transposed product that a linear layer's weight gets)."""
    if sys.getrefcount(grad) != _SOLE_TENSOR_REFS + 1 or grad.grad_fn is not None or \
            grad._hooks or grad._trace is not None:
        return False
    a = grad._data
    if type(a) is not np.ndarray or not a.flags.writeable or \
            sys.getrefcount(a) != _SOLE_ARRAY_REFS:
        return False
    base = grad._base
    if base is None:
        return a.base is None
    # the base tensor: grad's attribute only; its array: the base tensor's and the view's
    if base._base is not None or sys.getrefcount(base) != _SOLE_ARRAY_REFS:
        return False
    b = base._data
    return a.base is b and b.base is None and sys.getrefcount(b) == _SOLE_ARRAY_REFS + 1


def _call_hook(hook, grad):
    """``hook(grad)``, or ``grad`` when it returns None."""
    return hook_result(hook, grad, hook(grad))


def hook_result(hook, grad, out):
    """The gradient after a tensor hook that returned ``out``: ``grad`` when None; a
    replacement of another dtype or shape is refused, as torch refuses it (it would become
    ``.grad`` or reach the VJP rules as it is, silently)."""
    if out is None:
        return grad
    name = getattr(hook, "__name__", type(hook).__name__)
    if out.dtype != grad.dtype:
        raise RuntimeError(f"hook '{name}' has changed the type of value (was {grad.dtype} "
                           f"got {out.dtype})")
    if tuple(out.shape) != tuple(grad.shape):
        raise RuntimeError(f"hook '{name}' has changed the size of value (was "
                           f"{list(grad.shape)} got {list(out.shape)})")
    return out


class AccumulateGrad(Node):
    """The node of a leaf tensor: adds incoming gradients into ``variable.grad``."""

    __slots__ = ("variable",)

    def __init__(self, variable):
        super().__init__((), "AccumulateGrad")
        self.variable = variable

    def apply(self, grad, create_graph: bool, retain_graph: bool) -> tuple:
        var = self.variable
        for hook in var._hooks or ():
            grad = _call_hook(hook, grad)
        if not var._requires_grad:
            return ()       # frozen (requires_grad_(False)) after the forward: no .grad
        if var.grad is None:
            if create_graph:
                # a recorded copy, as torch's: the gradient may be the caller's `gradient`,
                # another leaf's or a retained one, which writes into .grad must not reach
                var.grad = grad.clone()
            elif _sole_owner(grad):
                # nobody else can see it: no copy (a view becomes a tensor of its own)
                var.grad = grad if grad._base is None else type(grad)._wrap(grad._data, grad._dtype)
            else:
                var.grad = grad.detach().clone()
            if not var.grad.is_contiguous() and var.is_contiguous():
                # torch's layout contract: a row-major leaf gets a row-major .grad, whatever
                # layout the backward made (a linear layer's weight gets a transposed
                # product), so that p.grad.view(-1) works as in torch.
                var.grad = var.grad.contiguous()
        elif create_graph or var.grad.requires_grad:
            var.grad = var.grad + grad
        else:
            var.grad._data += grad._data
            var.grad._version_counter.value += 1
        for hook in var._post_accumulate_grad_hooks or ():
            hook(var)
        return ()


def record_eager_node(prim, operands, attrs, out) -> None:
    # Integer and bool results (x.long(), x // y on ints) are not differentiable, as in torch.
    # (is_grad_enabled and is_differentiable spelled out: this runs for every eager op.)
    if prim.vjp is None or not getattr(_grad_state, "enabled", True) or \
            out._dtype.category < 2:
        return
    for op in operands:
        if op._base is not None:
            _refresh_view(op)
        if op._requires_grad:
            break
    else:
        return
    out.grad_fn = PrimitiveNode(prim, attrs, operands, out)
    out._requires_grad = True     # a float result with a grad_fn: requires_grad_'s checks pass



def retain(tensor) -> None:
    """Make ``tensor`` (a non-leaf) keep its gradient in ``.grad``."""
    node = tensor.grad_fn
    if node._retained is None:
        node._retained = []
    if not any(ref() is tensor for ref in node._retained):
        node._retained.append(weakref.ref(tensor))


def keep_retained(tensor) -> None:
    """After an in-place op gave ``tensor`` a new grad_fn: if it retains its gradient, its
    ``.grad`` is now the new node's, the gradient of the value written (torch moves the
    retains_grad hook to the new grad_fn; it was left on the old node, and .grad stayed
    None)."""
    if tensor._retains_grad and tensor.grad_fn is not None:
        retain(tensor)


# The engine's reverse execution, ``run_backward(outputs, grad_outputs, retain_graph,
# create_graph, inputs=None, accumulate=True, allow_unused=False, stop_at_inputs=False)``:
# filled by fusegrad.autograd.engine at import (register_backward_runner), called by nodes that
# run a backward of their own (a composite's inner graph).
_backward_runner: Callable | None = None


def register_backward_runner(fn: Callable) -> None:
    """Install the engine's ``run_backward`` (fusegrad.autograd.engine does, at import)."""
    global _backward_runner
    _backward_runner = fn


def run_backward(*args, **kwargs):
    """The engine's :func:`fusegrad.autograd.engine.run_backward`."""
    return _backward_runner(*args, **kwargs)


_primitive.register_eager_node_recorder(record_eager_node)
register_handler("accumulator", AccumulateGrad)
register_handler("retain", retain)
