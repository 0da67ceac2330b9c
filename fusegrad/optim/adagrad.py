"""Adagrad with torch's learning-rate decay and initial accumulator (torch/optim/adagrad.py)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops import functional as F
from fusegrad.ops import primitive
from fusegrad.ops.creation import full_like, tensor
from fusegrad.optim.optimizer import Optimizer, addcdiv_, addcmul_
from fusegrad.tensor import Tensor

__all__ = ["Adagrad"]


class Adagrad(Optimizer):
    """``torch.optim.Adagrad``. Per parameter, with ``g`` its gradient (negated if
    ``maximize``) and ``t`` the step::

        g = g + weight_decay * p
        clr = lr / (1 + (t - 1) * lr_decay)
        s = s + g * g
        p = p - clr * g / (sqrt(s) + eps)

    State per parameter (created in the constructor, as torch does): ``step`` (a float32
    scalar tensor) and ``sum``, which starts at ``initial_accumulator_value``.
    """

    def __init__(self, params: Iterable, lr: float = 1e-2, lr_decay: float = 0,
                 weight_decay: float = 0, initial_accumulator_value: float = 0,
                 eps: float = 1e-10, foreach: bool | None = None, *, maximize: bool = False,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= lr_decay:
            raise ValueError(f"Invalid lr_decay value: {lr_decay}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= initial_accumulator_value:
            raise ValueError(f"Invalid initial_accumulator_value value: "
                             f"{initial_accumulator_value}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        defaults = {"lr": lr, "lr_decay": lr_decay, "eps": eps, "weight_decay": weight_decay,
                    "initial_accumulator_value": initial_accumulator_value, "foreach": foreach,
                    "maximize": maximize, "differentiable": differentiable, "fused": fused}
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["step"] = tensor(0.0, dtype=dtypes.float32)
                state["sum"] = full_like(p, group["initial_accumulator_value"])

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One Adagrad update of every parameter that has a gradient; returns the closure's
        loss."""
        loss = self._eval_closure(closure)
        for group in self.param_groups:
            lr, lr_decay = group["lr"], group["lr_decay"]
            weight_decay, eps = group["weight_decay"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = F.neg(p.grad) if group["maximize"] else p.grad
                state = self.state[p]
                if not state:   # a parameter added later with add_param_group
                    state["step"] = tensor(0.0, dtype=dtypes.float32)
                    state["sum"] = full_like(p, group["initial_accumulator_value"])
                step_t = state["step"].add_(1)
                if weight_decay != 0:
                    grad = F.add(grad, p, alpha=weight_decay)
                if primitive.compiling():
                    # Traced into a compiled step: the same float64 formula in graph math.
                    step = F.cast(step_t, dtypes.float64)
                    clr = F.div(lr, F.add(F.mul(F.sub(step, 1), lr_decay), 1))
                else:
                    step = step_t.item()
                    clr = lr / (1 + (step - 1) * lr_decay)
                state_sum = addcmul_(state["sum"], grad, grad)
                std = F.add(F.sqrt(state_sum), eps)
                addcdiv_(p, grad, std, F.neg(clr) if isinstance(clr, Tensor) else -clr)
        return loss
