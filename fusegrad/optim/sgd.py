"""Stochastic gradient descent with torch's momentum, Nesterov and weight decay."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops import functional as F
from fusegrad.optim.optimizer import Optimizer, eager_arrays, is_nonzero, plain_scalars
from fusegrad.tensor import Tensor

__all__ = ["SGD"]


class SGD(Optimizer):
    """``torch.optim.SGD``. Per parameter, with ``g`` its gradient (negated if ``maximize``)::

        g = g + weight_decay * p
        buf = g (first step), else buf = momentum * buf + (1 - dampening) * g
        g = g + momentum * buf (nesterov), else g = buf
        p = p - lr * g
    """

    graph_hyperparameters = ("lr", "momentum")
    # every step of the update is linear in the gradient and the parameter: right for
    # complex parameters as it stands
    _takes_complex_params = True

    def __init__(self, params: Iterable, lr: float = 1e-3, momentum: float = 0,
                 dampening: float = 0, weight_decay: float = 0, nesterov: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        # foreach/differentiable/fused are kept for torch's state-dict layout; there is one
        # implementation here.
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening,
                    "weight_decay": weight_decay, "nesterov": nesterov, "maximize": maximize,
                    "foreach": foreach, "differentiable": differentiable, "fused": fused}
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, defaults)

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One SGD update of every parameter that has a gradient; returns the closure's
        loss."""
        loss = self._eval_closure(closure)
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            dampening, weight_decay = group["dampening"], group["weight_decay"]
            fast = plain_scalars(lr, momentum, dampening, weight_decay)
            for p in group["params"]:
                if p.grad is None:
                    continue
                if fast and self._step_arrays(p, group):
                    continue
                grad = F.neg(p.grad) if group["maximize"] else p.grad
                if weight_decay != 0:
                    grad = F.add(grad, p, alpha=weight_decay)
                if is_nonzero(momentum):
                    state = self.state[p]
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = F.clone(grad.detach())
                        state["momentum_buffer"] = buf
                    else:
                        buf.mul_(momentum).add_(grad, alpha=1 - dampening)
                    grad = F.add(grad, buf, alpha=momentum) if group["nesterov"] else buf
                p.add_(grad, alpha=-lr)
        return loss

    def _step_arrays(self, p, group: dict) -> bool:
        """The update above on ``p``'s numpy arrays, in place (see ``eager_arrays``); False
        when it must take the tensor ops."""
        state = self.state.get(p)     # not self.state[p]: no empty entry without momentum
        buf = state.get("momentum_buffer") if state else None
        arrays = eager_arrays(p, p.grad, buf)
        if arrays is None:
            return False
        pd, grad, bd = arrays
        lr, momentum = group["lr"], group["momentum"]
        dampening, weight_decay = group["dampening"], group["weight_decay"]
        scalar = pd.dtype.type
        if group["maximize"]:
            grad = np.negative(grad)
        if weight_decay != 0:
            grad = grad + pd * scalar(weight_decay)
        if momentum != 0:
            if bd is None:
                buf = self.state[p]["momentum_buffer"] = Tensor._wrap(np.array(grad), p._dtype)
                bd = buf._data
            else:
                bd *= scalar(momentum)
                bd += grad * scalar(1 - dampening) if 1 - dampening != 1 else grad
                buf._version_counter.value += 2
            grad = grad + bd * scalar(momentum) if group["nesterov"] else bd
        pd += grad * scalar(-lr) if -lr != 1 else grad
        p._version_counter.value += 1
        return True
