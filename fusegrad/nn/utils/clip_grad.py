"""Gradient clipping with ``torch.nn.utils``' formulas and messages."""

from __future__ import annotations

import math
import warnings
from typing import Iterable

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops import functional as F
from fusegrad.ops.creation import tensor
from fusegrad.tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_norm", "clip_grad_value_"]


def _grads(parameters: Tensor | Iterable[Tensor]) -> list[Tensor]:
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: bool | None = None) -> Tensor:
    """Scale the gradients of ``parameters`` in place so that their joint ``norm_type``-norm
    (the norm of all gradients concatenated) is at most ``max_norm``; return that norm,
    measured before clipping.

    As torch: the scale is ``max_norm / (total_norm + 1e-6)`` clamped to 1, so gradients
    already under the bound are multiplied by 1. ``norm_type`` may be ``inf``. ``foreach``
    is accepted for torch's signature; the result is the same either way.

    >>> fusegrad.nn.utils.clip_grad_norm_(model.parameters(), 1.0, norm_type=float("inf"))
    """
    grads = _grads(parameters)
    max_norm = float(max_norm)
    norm_type = float(norm_type)
    if not grads:
        return tensor(0.0)
    with no_grad():
        dtype = grads[0].dtype
        for g in grads[1:]:
            dtype = dtypes.promote_types(dtype, g.dtype)
        norms = [F.norm(g, norm_type).to(dtype) for g in grads]
        total_norm = F.norm(F.stack(norms), norm_type)
        if error_if_nonfinite and not math.isfinite(total_norm.item()):
            raise RuntimeError(
                f"The total norm of order {norm_type} for gradients from `parameters` is "
                "non-finite, so it cannot be clipped. To disable this error and scale the "
                "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")
        clip_coef = F.clamp(max_norm / (total_norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(clip_coef.to(g.dtype))
    return total_norm


def clip_grad_norm(parameters: Tensor | Iterable[Tensor], max_norm: float,
                   norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach: bool | None = None) -> Tensor:
    """Deprecated spelling of :func:`clip_grad_norm_` (as in torch)."""
    warnings.warn("`torch.nn.utils.clip_grad_norm` is now deprecated in favor of "
                  "`torch.nn.utils.clip_grad_norm_`.", FutureWarning, stacklevel=2)
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float,
                     foreach: bool | None = None) -> None:
    """Clamp every gradient of ``parameters`` in place to ``[-clip_value, clip_value]``."""
    clip_value = float(clip_value)
    with no_grad():
        for g in _grads(parameters):
            g.clamp_(min=-clip_value, max=clip_value)
