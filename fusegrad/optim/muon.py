"""Muon: momentum orthogonalized by a Newton-Schulz iteration (torch/optim/_muon.py)."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops import functional as F
from fusegrad.optim._checks import check_tensor_lr
from fusegrad.optim.optimizer import Optimizer, eager_scalar, lerp_
from fusegrad.tensor import Tensor

__all__ = ["Muon"]

_ADJUST_LR_FNS = ("original", "match_rms_adamw")


def zeropower_via_newtonschulz(grad: Tensor, ns_coefficients: tuple[float, float, float],
                               ns_steps: int, eps: float) -> Tensor:
    """An approximately orthogonal matrix ``U S' V^T`` with ``S'`` near 1 (in 0.5 to 1.5) for
    the 2-D ``grad = U S V^T``: ``ns_steps`` steps of the quintic iteration
    ``X = a X + (b A + c A A) X``, ``A = X X^T``, on ``grad / ||grad||`` in bfloat16 (on the
    wide orientation, so that ``A`` is the smaller Gram matrix), as torch's Muon does."""
    if ns_steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if len(grad.shape) != 2:
        raise ValueError("Input tensor gradient must be a 2D matrix")
    if len(ns_coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    a, b, c = ns_coefficients
    tall = grad.shape[0] > grad.shape[1]
    x = F.cast(grad, dtypes.bfloat16)
    if tall:
        x = x.T
    x = F.div(x, F.clamp(x.norm(), min=eps))
    for _ in range(ns_steps):
        gram = F.matmul(x, x.T)
        gram_update = _addmm_rounded_once(gram, gram, gram, b, c)
        x = _addmm_rounded_once(x, gram_update, x, a, 1.0)
    return x.T if tall else x


def _addmm_rounded_once(x: Tensor, mat1: Tensor, mat2: Tensor, beta: float,
                        alpha: float) -> Tensor:
    """``beta * x + alpha * (mat1 @ mat2)`` of bfloat16 matrices computed in float32 and
    rounded to bfloat16 once, as torch's CPU ``addmm`` does (products of bfloat16 values are
    exact in float32). Rounding the product, then each term, moved the iteration's result by
    several bfloat16 ulps after five steps."""
    f32 = dtypes.float32
    product = F.matmul(F.cast(mat1, f32), F.cast(mat2, f32))
    return F.cast(F.add(F.mul(F.cast(x, f32), beta), F.mul(product, alpha)), x.dtype)


def adjusted_lr(lr, adjust_lr_fn: str | None, shape) -> Any:
    """``lr`` scaled for a ``shape[0] x shape[1]`` matrix so that updates of rectangular
    matrices have a like RMS: ``sqrt(max(1, A / B))`` ("original", Keller Jordan's), or
    ``0.2 * sqrt(max(A, B))`` ("match_rms_adamw", Moonshot's, the RMS of an AdamW update)."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        ratio = math.sqrt(max(1, rows / cols))
    elif adjust_lr_fn == "match_rms_adamw":
        ratio = 0.2 * math.sqrt(max(rows, cols))
    else:
        ratio = 1.0
    return lr * ratio


class Muon(Optimizer):
    """``torch.optim.Muon``, for the 2-D weights of hidden layers (biases, embeddings and
    other parameters take another optimizer, such as AdamW). Per parameter, with ``g`` its
    gradient::

        B = lerp(B, g, 1 - momentum)                       (the momentum buffer)
        U = lerp(g, B, momentum) if nesterov else B
        O = NS(U)            (zeropower_via_newtonschulz, in bfloat16)
        p = p * (1 - lr * weight_decay)
        p = p - adjusted_lr(lr, adjust_lr_fn, p.shape) * O

    State per parameter: ``momentum_buffer``.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315),
                 eps: float = 1e-7, ns_steps: int = 5, adjust_lr_fn: str | None = None) -> None:
        check_tensor_lr(lr)
        if not 0.0 <= lr:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not 0.0 <= momentum:
            raise ValueError(f"momentum should be >= 0 but is: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"weight decay should be >= 0 but is: {weight_decay}")
        if adjust_lr_fn is not None and adjust_lr_fn not in _ADJUST_LR_FNS:
            raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported")
        defaults = {"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                    "nesterov": nesterov, "ns_coefficients": ns_coefficients, "eps": eps,
                    "ns_steps": ns_steps, "adjust_lr_fn": adjust_lr_fn}
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon only supports 2D parameters whereas we found a "
                                     f"parameter with size: torch.Size({list(p.shape)})")

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One Muon update of every parameter that has a gradient; returns the closure's
        loss."""
        loss = self._eval_closure(closure)
        for group in self.param_groups:
            lr, weight_decay = eager_scalar(group["lr"]), group["weight_decay"]
            momentum = group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.ndim != 2:
                    raise ValueError("Param gradient must be a 2D matrix")
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = F.zeros_like(grad)
                buf = lerp_(state["momentum_buffer"], grad, 1 - momentum)
                update = F.lerp(grad, buf, momentum) if group["nesterov"] else buf
                update = zeropower_via_newtonschulz(update, group["ns_coefficients"],
                                                    group["ns_steps"], group["eps"])
                p.mul_(1 - lr * weight_decay)
                # in the parameter's dtype (exact from bfloat16), as torch's add_ of a
                # bfloat16 update to a float32 parameter
                step_size = adjusted_lr(lr, group["adjust_lr_fn"], p.shape)
                p.add_(F.mul(F.cast(update, p.dtype), -step_size))
        return loss
