"""Grad modes (``torch.autograd.grad_mode``): defined in :mod:`fusegrad.grad_mode`, below the
ops that read them, and re-exported here under torch's name."""

from fusegrad.grad_mode import (  # noqa: F401
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)

__all__ = ["no_grad", "enable_grad", "set_grad_enabled", "inference_mode", "is_grad_enabled",
           "is_inference_mode_enabled"]
