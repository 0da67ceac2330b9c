"""Adafactor: factored second moments (torch/optim/_adafactor.py, single-tensor path)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops import functional as F
from fusegrad.ops import primitive
from fusegrad.ops.creation import tensor
from fusegrad.optim._checks import check_tensor_lr
from fusegrad.optim.optimizer import Optimizer, eager_scalar, lerp_
from fusegrad.type_info import finfo

__all__ = ["Adafactor"]


class Adafactor(Optimizer):
    """``torch.optim.Adafactor`` (Shazeer and Stern, 2018, with torch's use of ``lr`` and
    ``eps1``). Per parameter, with ``g`` its gradient (negated if ``maximize``) and ``t`` the
    step::

        beta2_hat = 1 - t**beta2_decay;  rho = min(lr, 1 / sqrt(t))
        alpha = max(eps2, rms(p)) * rho
        p = p * (1 - lr * weight_decay)
        dim > 1:  R = lerp(R, mean(g*g, dim=-1), 1 - beta2_hat)     (row variances)
                  C = lerp(C, mean(g*g, dim=-2), 1 - beta2_hat)     (column variances)
                  V = (R @ C) / max(mean(R, dim=-2), eps1)
        else:     V = lerp(V, g*g, 1 - beta2_hat)
        U = g / sqrt(max(V, eps1**2))
        p = p - alpha / max(1, rms(U) / d) * U

    ``eps1=None`` is the parameter dtype's machine epsilon. State per parameter: ``step`` (a
    float32 scalar tensor), and ``row_var`` (``g``'s shape with a last dim of 1) and
    ``col_var`` (second-to-last dim 1) for tensors of two or more dims, else ``variance``.
    Eager steps read the step count and the two norms with ``.item()`` as torch does; a traced
    step computes the same factors with tensor ops in float64.
    """

    def __init__(self, params: Iterable, lr: float = 1e-2, beta2_decay: float = -0.8,
                 eps: tuple[float | None, float] = (None, 1e-3), d: float = 1.0,
                 weight_decay: float = 0.0, *, foreach: bool | None = None,
                 maximize: bool = False) -> None:
        check_tensor_lr(lr)
        if not 0.0 <= lr:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not 0.0 >= beta2_decay:
            raise ValueError(f"beta2_decay should be <= 0 but is: {beta2_decay}")
        if eps[0] is not None and not 0.0 <= eps[0]:
            raise ValueError(f"epsilon1 should be >= 0 but is: {eps[0]}")
        if not 0.0 <= eps[1]:
            raise ValueError(f"epsilon2 should be >= 0 but is: {eps[1]}")
        if not 1.0 <= d:
            raise ValueError(f"Clipping threshold d should be >= 1 but is: {d}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"weight_decay should be >= 0 but is: {weight_decay}")
        defaults = {"lr": lr, "beta2_decay": beta2_decay, "eps": eps, "d": d,
                    "weight_decay": weight_decay, "foreach": foreach, "maximize": maximize}
        super().__init__(params, defaults)

    def _state(self, p, grad) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = tensor(0.0, dtype=dtypes.float32)
            if grad.dim() > 1:
                state["row_var"] = F.zeros((*grad.shape[:-1], 1), dtype=grad.dtype,
                                           device=grad.device)
                state["col_var"] = F.zeros((*grad.shape[:-2], 1, grad.shape[-1]),
                                           dtype=grad.dtype, device=grad.device)
            else:
                state["variance"] = F.zeros_like(grad)
        return state

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One Adafactor update of every parameter that has a gradient; returns the
        closure's loss."""
        loss = self._eval_closure(closure)
        traced = primitive.compiling()
        for group in self.param_groups:
            lr, d, weight_decay = eager_scalar(group["lr"]), group["d"], group["weight_decay"]
            beta2_decay = group["beta2_decay"]
            eps1, eps2 = group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = F.neg(p.grad) if group["maximize"] else p.grad
                state = self._state(p, grad)
                step_t = state["step"]
                step_t.add_(1)
                p_eps1 = finfo(p.dtype).eps if eps1 is None else eps1
                root_numel = p.numel() ** 0.5
                if traced:
                    # The step count and the norms are known at call time only: the same
                    # factors in float64 tensor math instead of Python floats.
                    step = F.cast(step_t, dtypes.float64)
                    one_minus_beta2_t = F.pow(step, beta2_decay)
                    rho_t = F.clamp(F.rsqrt(step), max=lr)
                    rms_p = F.div(F.cast(p.norm(2), dtypes.float64), root_numel)
                    alpha = F.mul(F.clamp(rms_p, min=eps2), rho_t)
                else:
                    step = step_t.item()
                    one_minus_beta2_t = step ** beta2_decay
                    rho_t = min(lr, 1 / (step ** 0.5))
                    alpha = max(eps2, p.norm(2).item() / root_numel) * rho_t
                if weight_decay != 0:
                    p.mul_(1 - lr * weight_decay)
                if grad.dim() > 1:
                    row_var, col_var = state["row_var"], state["col_var"]
                    row_mean = F.div(F.square(grad.norm(dim=-1, keepdim=True)), grad.shape[-1])
                    lerp_(row_var, row_mean, one_minus_beta2_t)
                    col_mean = F.div(F.square(grad.norm(dim=-2, keepdim=True)), grad.shape[-2])
                    lerp_(col_var, col_mean, one_minus_beta2_t)
                    var_estimate = F.div(F.matmul(row_var, col_var),
                                         F.clamp(row_var.mean(dim=-2, keepdim=True), min=p_eps1))
                else:
                    var_estimate = lerp_(state["variance"], F.mul(grad, grad), one_minus_beta2_t)
                update = F.mul(F.rsqrt(F.clamp(var_estimate, min=p_eps1 * p_eps1)), grad)
                if traced:
                    rms_u = F.div(F.cast(update.norm(2), dtypes.float64), root_numel * d)
                    p.add_(F.mul(update, F.neg(F.div(alpha, F.clamp(rms_u, min=1.0)))))
                else:
                    denom = max(1.0, update.norm(2).item() / (root_numel * d))
                    p.add_(update, alpha=-alpha / denom)
        return loss
