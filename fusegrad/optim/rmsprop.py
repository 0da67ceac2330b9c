"""RMSprop with torch's momentum, centering and weight decay (torch/optim/rmsprop.py)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops import functional as F
from fusegrad.ops.creation import tensor
from fusegrad.optim.optimizer import Optimizer, addcdiv_, addcmul_, is_nonzero, lerp_

__all__ = ["RMSprop"]


class RMSprop(Optimizer):
    """``torch.optim.RMSprop``. Per parameter, with ``g`` its gradient (negated if
    ``maximize``)::

        g = g + weight_decay * p
        v = alpha * v + (1 - alpha) * g * g
        centered: m = lerp(m, g, 1 - alpha);  avg = sqrt(v - m * m) + eps
        else:     avg = sqrt(v) + eps
        momentum > 0: buf = momentum * buf + g / avg;  p = p - lr * buf
        else:         p = p - lr * g / avg

    State per parameter: ``step`` (a float32 scalar tensor), ``square_avg``, and
    ``momentum_buffer`` (momentum > 0) and ``grad_avg`` (centered).
    """

    graph_hyperparameters = ("lr", "momentum")

    def __init__(self, params: Iterable, lr: float = 1e-2, alpha: float = 0.99,
                 eps: float = 1e-8, weight_decay: float = 0, momentum: float = 0,
                 centered: bool = False, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False) -> None:
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= alpha:
            raise ValueError(f"Invalid alpha value: {alpha}")
        # The update never reads the step count, so capturable needs no separate branch.
        defaults = {"lr": lr, "momentum": momentum, "alpha": alpha, "eps": eps,
                    "centered": centered, "weight_decay": weight_decay, "capturable": capturable,
                    "foreach": foreach, "maximize": maximize, "differentiable": differentiable}
        super().__init__(params, defaults)

    def _state(self, p, group: dict) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = tensor(0.0, dtype=dtypes.float32)
            state["square_avg"] = F.zeros_like(p)
            if is_nonzero(group["momentum"]):   # validated >= 0
                state["momentum_buffer"] = F.zeros_like(p)
            if group["centered"]:
                state["grad_avg"] = F.zeros_like(p)
        return state

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One RMSprop update of every parameter that has a gradient; returns the closure's
        loss."""
        loss = self._eval_closure(closure)
        for group in self.param_groups:
            lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
            weight_decay, momentum = group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = F.neg(p.grad) if group["maximize"] else p.grad
                state = self._state(p, group)
                state["step"].add_(1)
                if weight_decay != 0:
                    grad = F.add(grad, p, alpha=weight_decay)
                square_avg = state["square_avg"]
                addcmul_(square_avg.mul_(alpha), grad, grad, 1 - alpha)
                if group["centered"]:
                    grad_avg = lerp_(state["grad_avg"], grad, 1 - alpha)
                    avg = F.sqrt(F.sub(square_avg, F.mul(grad_avg, grad_avg)))
                else:
                    avg = F.sqrt(square_avg)
                avg = F.add(avg, eps)
                if is_nonzero(momentum):
                    buf = state["momentum_buffer"]
                    addcdiv_(buf.mul_(momentum), grad, avg)
                    p.add_(buf, alpha=-lr)
                else:
                    addcdiv_(p, grad, avg, -lr)
        return loss
