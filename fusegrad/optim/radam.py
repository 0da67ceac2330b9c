"""RAdam: Adam with a rectified adaptive learning rate (torch/optim/radam.py)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops import functional as F
from fusegrad.ops.creation import tensor
from fusegrad.optim._checks import check_adam_args
from fusegrad.optim.optimizer import Optimizer, addcmul_, lerp_

__all__ = ["RAdam"]


class RAdam(Optimizer):
    """``torch.optim.RAdam``. Per parameter, with ``g`` its gradient (negated if
    ``maximize``) and ``t`` the step::

        g = g + weight_decay * p        (decoupled: p = p * (1 - lr * weight_decay))
        m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 t beta2**t / (1 - beta2**t)
        rho_t > 5:  p = p - m / (1 - beta1**t) * lr * adaptive * rect
                    adaptive = sqrt(1 - beta2**t) / (sqrt(v) + eps)
                    rect = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))
        otherwise:  p = p - m / (1 - beta1**t) * lr

    State per parameter: ``step`` (a float32 scalar tensor), ``exp_avg`` and ``exp_avg_sq``.
    ``capturable=True`` computes the step-dependent factors with tensor ops and selects the
    branch with ``where`` (torch's capturable branch).
    """

    graph_hyperparameters = ("lr", "betas")

    _capturable_when_compiled = True

    def __init__(self, params: Iterable, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, decoupled_weight_decay: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False) -> None:
        check_adam_args(lr, betas, eps, weight_decay)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "maximize": maximize, "foreach": foreach, "capturable": capturable,
                    "decoupled_weight_decay": decoupled_weight_decay,
                    "differentiable": differentiable}
        super().__init__(params, defaults)

    def _state(self, p) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = tensor(0.0, dtype=dtypes.float32)
            state["exp_avg"] = F.zeros_like(p)
            state["exp_avg_sq"] = F.zeros_like(p)
        return state

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One RAdam update of every parameter that has a gradient; returns the closure's
        loss."""
        loss = self._eval_closure(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            rho_inf = 2 / (1 - beta2) - 1
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = F.neg(p.grad) if group["maximize"] else p.grad
                state = self._state(p)
                exp_avg, exp_avg_sq, step_t = state["exp_avg"], state["exp_avg_sq"], state["step"]
                step_t.add_(1)
                if weight_decay != 0:
                    if group["decoupled_weight_decay"]:
                        p.mul_(1 - lr * weight_decay)
                    else:
                        grad = F.add(grad, p, alpha=weight_decay)
                lerp_(exp_avg, grad, 1 - beta1)
                addcmul_(exp_avg_sq.mul_(beta2), grad, grad, 1 - beta2)
                if group["capturable"]:
                    self._capturable_update(p, exp_avg, exp_avg_sq, step_t, group, rho_inf)
                    continue
                step = step_t.item()
                bias_correction1 = 1 - beta1 ** step
                bias_correction2 = 1 - beta2 ** step
                bias_corrected_exp_avg = F.div(exp_avg, bias_correction1)
                rho_t = rho_inf - 2 * step * (beta2 ** step) / bias_correction2
                if rho_t > 5.0:
                    rect = ((rho_t - 4) * (rho_t - 2) * rho_inf
                            / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
                    adaptive_lr = F.div(bias_correction2 ** 0.5,
                                        F.add(F.sqrt(exp_avg_sq), eps))
                    update = F.mul(F.mul(F.mul(bias_corrected_exp_avg, lr), adaptive_lr), rect)
                    p.sub_(update)
                else:
                    p.sub_(F.mul(bias_corrected_exp_avg, lr))
        return loss

    @staticmethod
    def _capturable_update(p, exp_avg, exp_avg_sq, step_t, group: dict, rho_inf: float) -> None:
        beta1, beta2 = group["betas"]
        lr, eps = group["lr"], group["eps"]
        # The step's factors in float64, as eager's Python floats: rho_t = rho_inf - (a number
        # close to it) cancels, and in float32 the rectifier was 0.5% off in early steps.
        step_t = F.cast(step_t, dtypes.float64)
        bias_correction1 = F.rsub(F.pow(beta1, step_t), 1)
        bias_correction2 = F.rsub(F.pow(beta2, step_t), 1)
        bias_corrected_exp_avg = F.div(exp_avg, bias_correction1)
        rho_t = F.rsub(F.div(F.mul(F.mul(step_t, 2), F.pow(beta2, step_t)), bias_correction2),
                       rho_inf)
        # Below rho_t = 5 the rectifier is a square root of a negative number: where() drops
        # that NaN, as in torch.
        rect = F.sqrt(F.div(F.mul(F.mul(F.sub(rho_t, 4), F.sub(rho_t, 2)), rho_inf),
                            F.mul(rho_t, (rho_inf - 4) * (rho_inf - 2))))
        adaptive_lr = F.div(F.sqrt(bias_correction2), F.add(F.sqrt(exp_avg_sq), eps))
        update = F.where(F.gt(rho_t, 5.0), F.mul(rect, adaptive_lr), 1.0)
        p.sub_(F.mul(F.mul(bias_corrected_exp_avg, lr), update))
