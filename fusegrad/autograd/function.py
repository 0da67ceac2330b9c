"""``autograd.Function``: user-defined ops with a hand-written backward, as in torch.

Eagerly, the output gets a node that calls ``backward``. Traced (inside ``fusegrad.compile``),
the output is a ``custom_vjp`` node over the function's tensor inputs and saved tensors: the
compiled backward calls the same ``backward`` on traced values, so compiled gradients are
the user's formula too (they were lost: the forward runs under ``no_grad``)."""

from __future__ import annotations

import copy
import functools
import inspect

from fusegrad.autograd.engine import _FREED_MESSAGE, Node, _edge, _Saved
from fusegrad.grad_mode import is_grad_enabled, no_grad
from fusegrad.ops import primitive as _primitive
from fusegrad.ops.composite import CustomVJP
from fusegrad.ops.reductions import sum_to_size
from fusegrad.tensor import Tensor

__all__ = ["Function", "FunctionCtx", "once_differentiable"]

# A traced call's rule: the user's backward (:func:`_traced_vjp`)
_TRACED_RULE = CustomVJP("autograd.Function")


class FunctionCtx:
    """The ``ctx`` of ``forward``/``backward``: ``save_for_backward`` and any attributes."""

    def __init__(self):
        self._saved: tuple = ()
        self._freed = False             # saved tensors released after a backward
        self._node = None               # the backward node, while it runs
        self.needs_input_grad: tuple = ()
        self._non_differentiable: set = set()

    def save_for_backward(self, *tensors) -> None:
        # Each with its version: backward refuses one modified in place since (as torch).
        self._saved = tuple(_Saved(t, origin="") if isinstance(t, Tensor) and t._trace is None
                            else t for t in tensors)

    @property
    def saved_tensors(self) -> tuple:
        if self._freed:
            raise RuntimeError(_FREED_MESSAGE)
        node = self._node
        return tuple(s.unpack(node) if isinstance(s, _Saved) and node is not None else
                     s.tensor if isinstance(s, _Saved) else s for s in self._saved)

    def mark_non_differentiable(self, *tensors) -> None:
        self._non_differentiable.update(id(t) for t in tensors)

    def mark_dirty(self, *tensors) -> None:
        raise NotImplementedError(
            "ctx.mark_dirty: custom Functions that modify their inputs in place are not "
            "implemented yet in fusegrad; return a new tensor instead")

    def set_materialize_grads(self, value: bool) -> None:
        # A single output: backward is called only with a gradient, so there is nothing to
        # materialize either way.
        pass


def once_differentiable(fn):
    """``backward`` decorated so that it runs under ``no_grad`` (as torch's: its result has
    no history, so it cannot be differentiated again)."""
    @functools.wraps(fn)
    def wrapper(ctx, *args):
        with no_grad():
            return fn(ctx, *args)
    return wrapper


def _input_grads(cls, ctx, grad, positions, n_args, inputs) -> tuple:
    """``cls.backward(ctx, grad)``, checked as torch checks it: one gradient per argument,
    each of its input's shape (summed down where the input broadcasts to it) and dtype."""
    grads = cls.backward(ctx, grad)
    if not isinstance(grads, tuple):
        grads = (grads,)
    if len(grads) > n_args and all(g is None for g in grads[n_args:]):
        grads = grads[:n_args]          # extra Nones are ignored, as torch ignores them
    if len(grads) != n_args:
        raise RuntimeError(f"function {cls.__name__}Backward returned an incorrect number of "
                           f"gradients (expected {n_args}, got {len(grads)})")
    out = []
    for p, x in zip(positions, inputs):
        g = grads[p]
        if g is not None and isinstance(g, Tensor):
            if tuple(g.shape) != tuple(x.shape):
                if not _expandable(tuple(x.shape), tuple(g.shape)):
                    raise RuntimeError(
                        f"Function {cls.__name__}Backward returned an invalid gradient at index "
                        f"{p} - got {list(g.shape)} but expected shape compatible with "
                        f"{list(x.shape)}")
                g = sum_to_size(g, tuple(x.shape))
            if g.dtype != x.dtype and x.dtype.is_floating_point:
                g = g.to(x.dtype)
        out.append(g)
    return tuple(out)


def _expandable(shape: tuple, to: tuple) -> bool:
    """Whether ``shape`` broadcasts to ``to`` (torch's is_expandable_to)."""
    if len(shape) > len(to):
        return False
    return all(s == t or s == 1 for s, t in zip(shape[::-1], to[::-1]))


class _FunctionNode(Node):
    __slots__ = ("_cls", "_ctx", "_positions", "_n", "_inputs")

    def __init__(self, cls, ctx, tensor_args, positions, n_args):
        super().__init__(tuple(_edge(t) for t in tensor_args), f"{cls.__name__}Backward")
        self._cls, self._ctx, self._positions, self._n = cls, ctx, positions, n_args
        # shapes and dtypes only, for the checks of backward's result
        self._inputs = [_Meta(t) for t in tensor_args]

    def apply(self, grad, create_graph, retain_graph):
        ctx = self._ctx
        ctx._node = self            # saved_tensors checks versions, naming this node
        try:
            return _input_grads(self._cls, ctx, grad, self._positions, self._n, self._inputs)
        finally:
            ctx._node = None        # (no reference cycle between the node and its ctx)

    def release(self) -> None:
        """After a backward without ``retain_graph``: the saved tensors are freed, and a
        second backward that reads them raises, as torch's does."""
        if any(isinstance(s, _Saved) for s in self._ctx._saved):
            self._ctx._freed = True


class _Meta:
    __slots__ = ("shape", "dtype")

    def __init__(self, t):
        self.shape, self.dtype = tuple(t.shape), t.dtype


class _Traced:
    """What the traced rule needs of one call (a ``custom_vjp`` parameter, by identity)."""

    __slots__ = ("cls", "ctx", "positions", "n_args", "n_inputs", "inputs")

    def __init__(self, cls, ctx, positions, n_args, inputs):
        self.cls, self.ctx, self.positions, self.n_args = cls, ctx, positions, n_args
        self.n_inputs = len(inputs)
        self.inputs = [_Meta(t) for t in inputs]

    def __repr__(self) -> str:
        return f"{self.cls.__name__}.backward"


def _traced_vjp(g, out, operands, params) -> tuple:
    """The compiled backward of an ``autograd.Function``: the user's ``backward`` on traced
    values, with the saved tensors as the graph has them now."""
    (call,) = params
    inputs, saved = operands[:call.n_inputs], iter(operands[call.n_inputs:])
    ctx = copy.copy(call.ctx)
    ctx._saved = tuple(next(saved) if isinstance(s, Tensor) else s for s in call.ctx._saved)
    ctx._node = None
    grads = _input_grads(call.cls, ctx, g, call.positions, call.n_args, call.inputs)
    return grads + (None,) * (len(operands) - len(inputs))


class Function:
    """Subclass with static ``forward(ctx, *args)`` and ``backward(ctx, grad)``; call
    ``MyFunction.apply(*args)``. Single-output functions are supported."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError

    @staticmethod
    def setup_context(ctx, inputs: tuple, output):
        """Override to write a ``forward`` without ``ctx`` (torch 2's style): it is then
        called as ``forward(*args)``, and this fills ``ctx`` from its inputs and output."""
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        ctx = FunctionCtx()
        separate = cls.setup_context is not Function.setup_context
        if separate:
            # as torch: keyword and default arguments become positional ones, each with a
            # gradient slot in backward's result
            bound = inspect.signature(cls.forward).bind(*args, **kwargs)
            bound.apply_defaults()
            args, kwargs = bound.args, {}
        positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        tensors = [args[i] for i in positions]
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        with no_grad():
            if separate:
                out = cls.forward(*args)
                cls.setup_context(ctx, args, out)
            else:
                out = cls.forward(ctx, *args, **kwargs)
        if isinstance(out, tuple):
            raise NotImplementedError(
                f"{cls.__name__}.forward returned {len(out)} outputs: custom Functions with "
                "several outputs are not implemented yet in fusegrad; return one tensor")
        if not (is_grad_enabled() and any(t.requires_grad for t in tensors) and
                id(out) not in ctx._non_differentiable):
            return out
        if _primitive.traced(out, *tensors):
            saved = [s for s in ctx._saved if isinstance(s, Tensor)]
            return _TRACED_RULE.mark(out, tensors + saved,
                                     (_Traced(cls, ctx, positions, len(args), tensors),))
        if out.grad_fn is not None or out.requires_grad:
            out = out.detach()
        out.grad_fn = _FunctionNode(cls, ctx, tensors, positions, len(args))
        out._requires_grad = True
        return out


_TRACED_RULE.defvjp(_traced_vjp)
