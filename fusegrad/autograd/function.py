"""``autograd.Function``: user-defined ops with a hand-written backward, as in torch."""

from __future__ import annotations

from fusegrad.autograd.engine import Node, _edge
from fusegrad.autograd.grad_mode import is_grad_enabled, no_grad

__all__ = ["Function", "FunctionCtx"]


class FunctionCtx:
    """The ``ctx`` of ``forward``/``backward``: ``save_for_backward`` and any attributes."""

    def __init__(self):
        self.saved_tensors: tuple = ()
        self.needs_input_grad: tuple = ()
        self._non_differentiable: set = set()

    def save_for_backward(self, *tensors) -> None:
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors) -> None:
        self._non_differentiable.update(id(t) for t in tensors)

    def set_materialize_grads(self, value: bool) -> None:
        pass


class _FunctionNode(Node):
    __slots__ = ("_cls", "_ctx", "_positions", "_n")

    def __init__(self, cls, ctx, tensor_args, positions, n_args):
        super().__init__(tuple(_edge(t) for t in tensor_args), f"{cls.__name__}Backward")
        self._cls, self._ctx, self._positions, self._n = cls, ctx, positions, n_args

    def apply(self, grad, create_graph, retain_graph):
        grads = self._cls.backward(self._ctx, grad)
        if not isinstance(grads, tuple):
            grads = (grads,)
        if len(grads) != self._n:
            raise RuntimeError(f"function {self._cls.__name__}Backward returned an incorrect "
                               f"number of gradients (expected {self._n}, got {len(grads)})")
        return tuple(grads[p] for p in self._positions)


class Function:
    """Subclass with static ``forward(ctx, *args)`` and ``backward(ctx, grad)``; call
    ``MyFunction.apply(*args)``. Single-output functions are supported."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError

    @classmethod
    def apply(cls, *args):
        from fusegrad.tensor import Tensor
        ctx = FunctionCtx()
        positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        tensors = [args[i] for i in positions]
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        with no_grad():
            out = cls.forward(ctx, *args)
        if is_grad_enabled() and any(t.requires_grad for t in tensors) and \
                id(out) not in ctx._non_differentiable:
            if out.grad_fn is not None or out.requires_grad:
                out = out.detach()
            out.grad_fn = _FunctionNode(cls, ctx, tensors, positions, len(args))
            out._requires_grad = True
        return out
