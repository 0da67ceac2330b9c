"""NAdam: Adam with Nesterov momentum and momentum decay (torch/optim/nadam.py)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops import functional as F
from fusegrad.ops.creation import tensor
from fusegrad.optim._checks import check_adam_args
from fusegrad.optim.optimizer import Optimizer, addcdiv_, addcmul_, lerp_

__all__ = ["NAdam"]


class NAdam(Optimizer):
    """``torch.optim.NAdam``. Per parameter, with ``g`` its gradient (negated if
    ``maximize``) and ``t`` the step::

        g = g + weight_decay * p        (decoupled: p = p * (1 - lr * weight_decay))
        mu_t = beta1 * (1 - 0.5 * 0.96**(t * momentum_decay));  mu_{t+1} likewise
        mu_product = mu_product * mu_t                 (a float32 scalar, as in torch)
        m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
        denom = sqrt(v / (1 - beta2**t)) + eps
        p = p - lr * (1 - mu_t) / (1 - mu_product) * g / denom
        p = p - lr * mu_{t+1} / (1 - mu_product * mu_{t+1}) * m / denom

    State per parameter: ``step`` and ``mu_product`` (float32 scalar tensors), ``exp_avg``
    and ``exp_avg_sq``. ``capturable=True`` computes the step-dependent factors with tensor
    ops (torch's capturable branch).
    """

    graph_hyperparameters = ("lr", "betas")

    _capturable_when_compiled = True

    def __init__(self, params: Iterable, lr: float = 2e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False) -> None:
        check_adam_args(lr, betas, eps, weight_decay)
        if not 0.0 <= momentum_decay:
            raise ValueError(f"Invalid momentum_decay value: {momentum_decay}")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "momentum_decay": momentum_decay,
                    "decoupled_weight_decay": decoupled_weight_decay, "maximize": maximize,
                    "foreach": foreach, "capturable": capturable,
                    "differentiable": differentiable}
        super().__init__(params, defaults)

    def _state(self, p) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = tensor(0.0, dtype=dtypes.float32)
            state["mu_product"] = tensor(1.0, dtype=dtypes.float32)
            state["exp_avg"] = F.zeros_like(p)
            state["exp_avg_sq"] = F.zeros_like(p)
        return state

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One NAdam update of every parameter that has a gradient; returns the closure's
        loss."""
        loss = self._eval_closure(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            momentum_decay = group["momentum_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = F.neg(p.grad) if group["maximize"] else p.grad
                state = self._state(p)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                step_t, mu_product = state["step"], state["mu_product"]
                step_t.add_(1)
                if weight_decay != 0:
                    if group["decoupled_weight_decay"]:
                        p.mul_(1 - lr * weight_decay)
                    else:
                        grad = F.add(grad, p, alpha=weight_decay)
                if group["capturable"]:
                    # in float64, as eager's Python floats (float32 was 2e-5 off per update)
                    step = F.cast(step_t, dtypes.float64)
                    bias_correction2 = F.rsub(F.pow(beta2, step), 1)
                    mu = F.mul(F.rsub(F.mul(F.pow(0.96, F.mul(step, momentum_decay)), 0.5), 1),
                               beta1)
                    mu_next = F.mul(F.rsub(F.mul(F.pow(0.96, F.mul(F.add(step, 1),
                                                                    momentum_decay)), 0.5), 1),
                                    beta1)
                else:
                    step = step_t.item()
                    bias_correction2 = 1 - beta2 ** step
                    mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))
                    mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * momentum_decay)))
                mu_product.mul_(mu)
                lerp_(exp_avg, grad, 1 - beta1)
                addcmul_(exp_avg_sq.mul_(beta2), grad, grad, 1 - beta2)
                denom = F.add(F.sqrt(F.div(exp_avg_sq, bias_correction2)), eps)
                if group["capturable"]:
                    mu_product_next = F.mul(mu_product, mu_next)
                    grad_scale = F.div(F.mul(F.rsub(mu, 1), -lr), F.rsub(mu_product, 1))
                    avg_scale = F.div(F.mul(mu_next, -lr), F.rsub(mu_product_next, 1))
                    addcdiv_(p, F.mul(grad, grad_scale), denom)
                    addcdiv_(p, F.mul(exp_avg, avg_scale), denom)
                else:
                    mu_product_value = mu_product.item()
                    mu_product_next = mu_product_value * mu_next
                    addcdiv_(p, grad, denom, -lr * (1.0 - mu) / (1.0 - mu_product_value))
                    addcdiv_(p, exp_avg, denom, (-lr * mu_next) / (1.0 - mu_product_next))
        return loss
