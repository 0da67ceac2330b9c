"""Adamax: Adam with the infinity norm (torch/optim/adamax.py, single-tensor path)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops import functional as F
from fusegrad.ops.creation import tensor
from fusegrad.optim._checks import check_adam_args
from fusegrad.optim.optimizer import Optimizer, addcdiv_, lerp_

__all__ = ["Adamax"]


class Adamax(Optimizer):
    """``torch.optim.Adamax``. Per parameter, with ``g`` its gradient (negated if
    ``maximize``) and ``t`` the step::

        g = g + weight_decay * p
        m = lerp(m, g, 1 - beta1)
        u = max(beta2 * u, |g| + eps)
        p = p - lr / (1 - beta1**t) * m / u

    State per parameter: ``step`` (a float32 scalar tensor), ``exp_avg`` and ``exp_inf``.
    ``capturable=True`` computes the bias correction from the step tensor with tensor ops,
    as torch's capturable branch does (what a traced step needs).
    """

    graph_hyperparameters = ("lr", "betas")

    _capturable_when_compiled = True

    def __init__(self, params: Iterable, lr: float = 2e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False) -> None:
        check_adam_args(lr, betas, eps, weight_decay)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "foreach": foreach, "maximize": maximize, "differentiable": differentiable,
                    "capturable": capturable}
        super().__init__(params, defaults)

    def _state(self, p) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = tensor(0.0, dtype=dtypes.float32)
            state["exp_avg"] = F.zeros_like(p)
            state["exp_inf"] = F.zeros_like(p)
        return state

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One Adamax update of every parameter that has a gradient; returns the closure's
        loss."""
        loss = self._eval_closure(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = F.neg(p.grad) if group["maximize"] else p.grad
                state = self._state(p)
                exp_avg, exp_inf, step_t = state["exp_avg"], state["exp_inf"], state["step"]
                step_t.add_(1)
                if weight_decay != 0:
                    grad = F.add(grad, p, alpha=weight_decay)
                lerp_(exp_avg, grad, 1 - beta1)
                exp_inf.copy_(F.maximum(exp_inf.mul_(beta2), F.add(F.abs(grad), eps)))
                if group["capturable"]:
                    neg_bias_correction = F.div(F.sub(F.pow(beta1, step_t), 1), lr)
                    addcdiv_(p, exp_avg, F.mul(exp_inf, neg_bias_correction))
                else:
                    clr = lr / (1 - beta1 ** step_t.item())
                    addcdiv_(p, exp_avg, exp_inf, -clr)
        return loss
