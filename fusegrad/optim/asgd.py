"""ASGD: averaged stochastic gradient descent with torch's update formula
(torch/optim/asgd.py)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops import functional as F
from fusegrad.ops.creation import tensor
from fusegrad.optim._checks import check_tensor_lr
from fusegrad.optim.optimizer import Optimizer
from fusegrad.tensor import Tensor

__all__ = ["ASGD"]


class ASGD(Optimizer):
    """``torch.optim.ASGD``. Per parameter, with ``g`` its gradient (negated if
    ``maximize``) and ``t`` the step::

        g = g + weight_decay * p
        p = p * (1 - lambd * eta) - eta * g
        ax = ax + mu * (p - ax)         (ax = p while mu is 1)
        eta = lr / (1 + lambd * lr * t) ** alpha;  mu = 1 / max(1, t - t0)

    State per parameter: ``step``, ``eta`` (starting at ``lr``) and ``mu`` (float32 scalar
    tensors) and ``ax``, the average. With ``capturable=True`` (and in a compiled step) eta
    and mu are updated with tensor math instead of ``.item()`` (torch's capturable branch).
    """

    _capturable_when_compiled = True

    def __init__(self, params: Iterable, lr: float = 1e-2, lambd: float = 1e-4,
                 alpha: float = 0.75, t0: float = 1e6, weight_decay: float = 0,
                 foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False, capturable: bool = False) -> None:
        check_tensor_lr(lr)
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = {"lr": lr, "lambd": lambd, "alpha": alpha, "t0": t0,
                    "weight_decay": weight_decay, "foreach": foreach, "maximize": maximize,
                    "differentiable": differentiable, "capturable": capturable}
        super().__init__(params, defaults)

    def _state(self, p, lr) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = tensor(0.0, dtype=dtypes.float32)
            # A copy: eta is updated in place, and a float32 lr tensor would be cast to itself.
            state["eta"] = (F.clone(F.cast(lr, dtypes.float32)) if isinstance(lr, Tensor)
                            else tensor(float(lr), dtype=dtypes.float32))
            state["mu"] = tensor(1.0, dtype=dtypes.float32)
            state["ax"] = F.zeros_like(p)
        return state

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One ASGD update of every parameter that has a gradient; returns the closure's
        loss."""
        loss = self._eval_closure(closure)
        for group in self.param_groups:
            lr, lambd, alpha, t0 = group["lr"], group["lambd"], group["alpha"], group["t0"]
            weight_decay = group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._state(p, lr)
                step_t, eta, mu, ax = state["step"], state["eta"], state["mu"], state["ax"]
                grad = F.neg(p.grad) if group["maximize"] else p.grad
                step_t.add_(1)
                if weight_decay != 0:
                    grad = F.add(grad, p, alpha=weight_decay)
                if group["capturable"]:
                    # Float64 graph math on the float32 state, as eager's Python floats.
                    eta64 = F.cast(eta, dtypes.float64)
                    p.mul_(F.rsub(F.mul(eta64, lambd), 1))
                    p.add_(grad, alpha=F.neg(eta64))
                    ax.add_(F.mul(F.sub(p, ax), mu))
                    step = F.cast(step_t, dtypes.float64)
                    eta.copy_(F.div(lr, F.pow(F.add(F.mul(F.mul(lr, lambd), step), 1), alpha)))
                    mu.copy_(F.div(1, F.clamp(F.sub(step, t0), min=1)))
                    continue
                eta_value = eta.item()
                p.mul_(1 - lambd * eta_value)
                p.add_(grad, alpha=-eta_value)
                if mu.item() != 1:
                    ax.add_(F.mul(F.sub(p, ax), mu))
                else:
                    ax.copy_(p)
                step = step_t.item()
                # through a tensor of the default dtype, as torch's as_tensor: a float64 eta
                # (a float64 parameter's resumed state) holds float32-rounded values
                eta.copy_(tensor(lr / ((1 + lambd * lr * step) ** alpha)))
                mu.copy_(tensor(1 / max(1, step - t0)))
        return loss
