"""Rprop: resilient backpropagation with torch's update formula (torch/optim/rprop.py)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops import functional as F
from fusegrad.ops.creation import full_like, tensor
from fusegrad.optim._checks import check_tensor_lr
from fusegrad.optim.optimizer import Optimizer
from fusegrad.tensor import Tensor

__all__ = ["Rprop"]


class Rprop(Optimizer):
    """``torch.optim.Rprop``. Per parameter and element, with ``g`` its gradient (negated
    if ``maximize``) and ``g_prev`` the one the last step kept::

        s = etaplus if g * g_prev > 0, etaminus if < 0, else 1
        step_size = clamp(step_size * s, *step_sizes)
        g = 0 where s == etaminus (the sign flipped: skip this element once)
        p = p - sign(g) * step_size;  g_prev = g

    State per parameter: ``step`` (a float32 scalar tensor), ``prev`` and ``step_size``
    (starting at ``lr``). The selections are ``where`` ops (torch's capturable branch,
    equal to its eager masked writes), so a traced step needs no other path.
    """

    def __init__(self, params: Iterable, lr: float = 1e-2,
                 etas: tuple[float, float] = (0.5, 1.2),
                 step_sizes: tuple[float, float] = (1e-6, 50), *, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False) -> None:
        check_tensor_lr(lr)
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]}")
        defaults = {"lr": lr, "etas": etas, "step_sizes": step_sizes, "foreach": foreach,
                    "maximize": maximize, "differentiable": differentiable,
                    "capturable": capturable}
        super().__init__(params, defaults)

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One Rprop update of every parameter that has a gradient; returns the closure's
        loss."""
        loss = self._eval_closure(closure)
        for group in self.param_groups:
            etaminus, etaplus = group["etas"]
            step_size_min, step_size_max = group["step_sizes"]
            lr = group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = tensor(0.0, dtype=dtypes.float32)
                    state["prev"] = F.zeros_like(p)
                    # a compiled step's lr is a float64 input: broadcast, in p's dtype
                    state["step_size"] = (F.add(F.zeros_like(p), lr) if isinstance(lr, Tensor)
                                          else full_like(p, lr))
                prev, step_size = state["prev"], state["step_size"]
                state["step"].add_(1)
                grad = F.neg(p.grad) if group["maximize"] else p.grad
                sign = F.sign(F.mul(grad, prev))
                sign = F.where(F.gt(sign, 0), etaplus, sign)
                sign = F.where(F.lt(sign, 0), etaminus, sign)
                sign = F.where(F.eq(sign, 0), 1, sign)
                step_size.mul_(sign).clamp_(step_size_min, step_size_max)
                grad = F.where(F.eq(sign, etaminus), 0, grad)
                p.add_(F.mul(F.mul(F.sign(grad), -1), step_size))
                prev.copy_(grad)
        return loss
