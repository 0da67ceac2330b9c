"""Adam and AdamW with torch's update formulas (the single-tensor path of torch.optim)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops import functional as F
from fusegrad.ops import primitive
from fusegrad.ops.creation import tensor
from fusegrad.optim._checks import check_adam_args
from fusegrad.optim.optimizer import Optimizer, addcdiv_, addcmul_, eager_arrays, lerp_, plain_scalars

__all__ = ["Adam", "AdamW"]


class Adam(Optimizer):
    """``torch.optim.Adam``. Per parameter, with ``g`` its gradient and ``t`` the step::

        g = g + weight_decay * p           (AdamW instead: p = p * (1 - lr * weight_decay))
        m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
        v_hat = max(v_hat, v) with amsgrad, else v
        p = p - lr / (1 - beta1**t) * m / (sqrt(v_hat) / sqrt(1 - beta2**t) + eps)

    State per parameter: ``step`` (a float32 scalar tensor), ``exp_avg``, ``exp_avg_sq`` and
    with amsgrad ``max_exp_avg_sq``. With ``capturable=True`` the bias corrections are
    computed from the ``step`` tensor with tensor ops instead of Python floats (torch's
    capturable branch), which a traced, compiled step needs; torch allows that only on
    accelerators, here it works everywhere.
    """

    graph_hyperparameters = ("lr", "betas")

    def __init__(self, params: Iterable, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None,
                 decoupled_weight_decay: bool = False) -> None:
        check_adam_args(lr, betas, eps, weight_decay)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "amsgrad": amsgrad, "maximize": maximize, "foreach": foreach,
                    "capturable": capturable, "differentiable": differentiable, "fused": fused,
                    "decoupled_weight_decay": decoupled_weight_decay}
        super().__init__(params, defaults)

    def _state(self, p, amsgrad: bool) -> dict:
        state = self.state[p]
        if not state:
            # capturable: on the parameter's device, as torch's, so that a step replayed as a
            # CUDA graph counts on the device instead of copying the count back each step
            device = p.device if self.defaults.get("capturable") else None
            state["step"] = tensor(0.0, dtype=dtypes.float32, device=device)
            state["exp_avg"] = F.zeros_like(p)
            state["exp_avg_sq"] = F.zeros_like(p)
            if amsgrad:
                state["max_exp_avg_sq"] = F.zeros_like(p)
        return state

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One Adam update of every parameter that has a gradient; returns the closure's
        loss."""
        loss = self._eval_closure(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            amsgrad = group["amsgrad"]
            fast = (not amsgrad and not group["capturable"] and not primitive.compiling()
                    and plain_scalars(lr, eps, weight_decay, beta1, beta2))
            for p in group["params"]:
                if p.grad is None:
                    continue
                if fast and self._step_arrays(p, group):
                    continue
                grad = F.neg(p.grad) if group["maximize"] else p.grad
                state = self._state(p, amsgrad)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                step_t = state["step"]
                step_t.add_(1)
                if weight_decay != 0:
                    if group["decoupled_weight_decay"]:
                        p.mul_(1 - lr * weight_decay)
                    else:
                        grad = F.add(grad, p, alpha=weight_decay)
                lerp_(exp_avg, grad, 1 - beta1)
                addcmul_(exp_avg_sq.mul_(beta2), grad, grad, 1 - beta2)
                second = exp_avg_sq
                if amsgrad:
                    second = state["max_exp_avg_sq"].copy_(
                        F.maximum(state["max_exp_avg_sq"], exp_avg_sq))
                if primitive.compiling() and not group["capturable"]:
                    # Traced into a compiled step: the step count is a tensor whose value is
                    # known at call time only. The same formula as below, in float64 graph
                    # math instead of Python floats.
                    step = F.cast(step_t, dtypes.float64)
                    bias1 = F.rsub(F.pow(beta1, step), 1)
                    bias2 = F.rsub(F.pow(beta2, step), 1)
                    denom = F.add(F.div(F.sqrt(second), F.sqrt(bias2)), eps)
                    addcdiv_(p, exp_avg, denom, F.neg(F.div(lr, bias1)))
                elif group["capturable"]:
                    # torch's capturable branch: tensor math on the step, no .item().
                    bias1 = F.rsub(F.pow(beta1, step_t), 1)
                    bias2 = F.rsub(F.pow(beta2, step_t), 1)
                    step_size_neg = F.neg(F.div(lr, bias1))
                    denom = F.add(F.div(F.sqrt(second), F.mul(F.sqrt(bias2), step_size_neg)),
                                  F.div(eps, step_size_neg))
                    addcdiv_(p, exp_avg, denom)
                else:
                    step = step_t.item()
                    bias1 = 1 - beta1 ** step
                    bias2 = 1 - beta2 ** step
                    denom = F.add(F.div(F.sqrt(second), bias2 ** 0.5), eps)
                    addcdiv_(p, exp_avg, denom, -(lr / bias1))
        return loss

    def _step_arrays(self, p, group: dict) -> bool:
        """The eager update above (no amsgrad) on ``p``'s numpy arrays, in place (see
        ``eager_arrays``); False when it must take the tensor ops."""
        state = self._state(p, False)
        step_t, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
        if step_t._trace is not None or step_t._dtype is not dtypes.float32 \
                or step_t._base is not None:
            return False
        arrays = eager_arrays(p, p.grad, exp_avg, exp_avg_sq)
        if arrays is None:
            return False
        pd, grad, m, v = arrays
        beta1, beta2 = group["betas"]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        scalar = pd.dtype.type
        if group["maximize"]:
            grad = np.negative(grad)
        step_t._data += np.float32(1)
        if weight_decay != 0:
            if group["decoupled_weight_decay"]:
                pd *= scalar(1 - lr * weight_decay)
                p._version_counter.value += 1
            else:
                grad = grad + pd * scalar(weight_decay)
        # lerp_, addcmul_ and addcdiv_ of optimizer.py, in their order of operations
        weight = 1 - beta1
        if abs(weight) < 0.5:
            m += (grad - m) * scalar(weight)
        else:
            np.subtract(grad, (grad - m) * scalar(1 - weight), out=m)
        v *= scalar(beta2)
        v += grad * scalar(1 - beta2) * grad
        step = step_t._data.item()
        bias1 = 1 - beta1 ** step
        bias2 = 1 - beta2 ** step
        denom = np.sqrt(v)
        denom /= scalar(bias2 ** 0.5)
        denom += scalar(eps)
        pd += m * scalar(-(lr / bias1)) / denom
        step_t._version_counter.value += 1
        exp_avg._version_counter.value += 1
        exp_avg_sq._version_counter.value += 2
        p._version_counter.value += 1
        return True


class AdamW(Adam):
    """Adam with decoupled weight decay (``p *= 1 - lr * weight_decay`` before the Adam
    step), default ``weight_decay=1e-2``."""

    def __init__(self, params: Iterable, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=fused, decoupled_weight_decay=True)
