"""Define-by-run autograd: the tape engine, grad modes and gradient checking."""

from fusegrad.autograd.engine import Node, backward, grad
from fusegrad.autograd.grad_mode import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)

# Imported here, after the submodule of the same name: importing fusegrad.autograd.gradcheck
# binds the module to this name, and fg.autograd.gradcheck(...) then called a module.
from fusegrad.autograd.gradcheck import gradcheck, gradgradcheck

# isort: split
from fusegrad.autograd import forward_ad, functional, profiler
from fusegrad.autograd.function import Function

__all__ = ["Node", "backward", "grad", "no_grad", "enable_grad", "set_grad_enabled",
           "inference_mode", "is_grad_enabled", "is_inference_mode_enabled", "gradcheck",
           "gradgradcheck", "Function", "forward_ad", "functional", "profiler"]

