"""The eager autograd engine: nodes of the tape, and reverse-mode execution.

Each differentiable eager op leaves a :class:`Node` as its output's ``grad_fn``; a node's
``next_functions`` are the edges to the nodes of its inputs (an :class:`AccumulateGrad` for a
leaf). Backward walks the nodes from the outputs in reverse creation order, once all of a
node's consumers have sent their gradient, summing gradients that meet. The VJP of a
primitive node is the primitive's own rule, so these gradients are the ones the autodiff
pass builds on graphs.

As in PyTorch, saved tensors are freed after a backward unless ``retain_graph=True``, a
version counter catches saved tensors modified in place, ``create_graph=True`` records the
backward itself so it can be differentiated again, and only the nodes that lead to the
requested inputs run in :func:`grad`.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import operator
import sys
import threading
import weakref
from typing import Sequence

import numpy as np

from fusegrad import profiling
from fusegrad.autograd.grad_mode import _state as _grad_state
from fusegrad.autograd.grad_mode import set_grad_enabled
from fusegrad.ops import primitive as _primitive
from fusegrad.ops.primitive import TensorType

__all__ = ["Node", "PrimitiveNode", "AccumulateGrad", "run_backward", "backward", "grad",
           "is_checkpoint_valid"]

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
        self._out = _Saved(out.detach(), name) if reads_output else None

    def apply(self, grad, create_graph: bool, retain_graph: bool) -> tuple:
        saved = self._saved
        if saved is _FREED:
            raise RuntimeError(_FREED_MESSAGE)
        if saved is None:
            primals = tuple([TensorType(shape, dtype) for shape, dtype in self._in_meta])
        else:
            primals = tuple([s.unpack(self) if s is not None else TensorType(*meta)
                             for s, meta in zip(saved, self._in_meta)])
        out = None
        if self._out is not None:
            out = self._out.unpack(self)
            if create_graph:
                out = out.detach()
                out.grad_fn = self
                out._requires_grad = True
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
            if g._data.shape != shape:
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
            grad._hooks:
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
    from fusegrad.tensor import Tensor
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
            from fusegrad.ops import functional as F
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
            from fusegrad.ops import functional as F
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
        from fusegrad.ops import functional as F
        results = [F.zeros_like(t) if r is None else r for r, t in zip(results, inputs)]
    return tuple(results)


def _batched_grad(outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused,
                  materialize_grads) -> tuple:
    """``grad(..., is_grads_batched=True)``: the first dimension of each grad_output is a
    batch; one backward per row (torch vmaps over them), the gradients stacked."""
    from fusegrad.ops.movement import stack
    n = grad_outputs[0].shape[0]
    keep = create_graph if retain_graph is None else retain_graph
    rows = [grad(outputs, inputs, [g[i] for g in grad_outputs], keep or i < n - 1,
                 create_graph, allow_unused=allow_unused, materialize_grads=materialize_grads)
            for i in range(n)]
    return tuple(None if col[0] is None else stack(list(col)) for col in zip(*rows))


def _record_eager_node(prim, operands, attrs, out) -> None:
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


_primitive._record_eager_node = _record_eager_node


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
