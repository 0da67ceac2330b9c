"""Adadelta with torch's update formula (torch/optim/adadelta.py, single-tensor path)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops import functional as F
from fusegrad.ops.creation import tensor
from fusegrad.optim._checks import check_tensor_lr
from fusegrad.optim.optimizer import Optimizer, addcmul_

__all__ = ["Adadelta"]


class Adadelta(Optimizer):
    """``torch.optim.Adadelta``. Per parameter, with ``g`` its gradient (negated if
    ``maximize``)::

        g = g + weight_decay * p
        v = rho * v + (1 - rho) * g * g
        delta = sqrt(u + eps) / sqrt(v + eps) * g
        u = rho * u + (1 - rho) * delta * delta
        p = p - lr * delta

    State per parameter: ``step`` (a float32 scalar tensor), ``square_avg`` (v) and
    ``acc_delta`` (u).
    """

    def __init__(self, params: Iterable, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0, foreach: bool | None = None, *,
                 capturable: bool = False, maximize: bool = False,
                 differentiable: bool = False) -> None:
        check_tensor_lr(lr)
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        # foreach/capturable/differentiable are kept for torch's state-dict layout; there is
        # one implementation here.
        defaults = {"lr": lr, "rho": rho, "eps": eps, "weight_decay": weight_decay,
                    "maximize": maximize, "capturable": capturable, "foreach": foreach,
                    "differentiable": differentiable}
        super().__init__(params, defaults)

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One Adadelta update of every parameter that has a gradient; returns the closure's
        loss."""
        loss = self._eval_closure(closure)
        for group in self.param_groups:
            lr, rho, eps = group["lr"], group["rho"], group["eps"]
            weight_decay = group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = tensor(0.0, dtype=dtypes.float32)
                    state["square_avg"] = F.zeros_like(p)
                    state["acc_delta"] = F.zeros_like(p)
                square_avg, acc_delta = state["square_avg"], state["acc_delta"]
                state["step"].add_(1)
                grad = F.neg(p.grad) if group["maximize"] else p.grad
                if weight_decay != 0:
                    grad = F.add(grad, p, alpha=weight_decay)
                addcmul_(square_avg.mul_(rho), grad, grad, 1 - rho)
                std = F.sqrt(F.add(square_avg, eps))
                delta = F.mul(F.div(F.sqrt(F.add(acc_delta, eps)), std), grad)
                addcmul_(acc_delta.mul_(rho), delta, delta, 1 - rho)
                p.add_(delta, alpha=-lr)
        return loss
