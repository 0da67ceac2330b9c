"""Argument checks shared by the optimizers, with torch's messages."""

from __future__ import annotations

from fusegrad.tensor import Tensor


def check_tensor_lr(lr) -> None:
    """torch's check of a tensor learning rate (one element)."""
    if isinstance(lr, Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")


def check_adam_args(lr: float, betas: tuple[float, float], eps: float,
                    weight_decay: float) -> None:
    """Raise torch's ``ValueError`` for a negative lr/eps/weight_decay or a beta out of
    [0, 1)."""
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
