"""Helpers over the ``.grad`` of many tensors (modules and optimizers share them)."""

from __future__ import annotations

from typing import Iterable

from fusegrad.ops import primitive

__all__ = ["clear_grads"]


def clear_grads(params: Iterable, set_to_none: bool = True) -> None:
    """Reset each tensor's ``.grad``: drop it (torch 2's default) or zero it in place, first
    cutting it from any graph it was made in (``create_graph=True`` backward)."""
    if set_to_none and primitive.compiling():
        # Traced into a compiled step: clear the slots without reading them, so the graph
        # does not depend on whether a gradient was there (and its buffer can be reused).
        for p in params:
            p.grad = None
        return
    for p in params:
        if p.grad is None:
            continue
        if set_to_none:
            p.grad = None
        else:
            if p.grad.grad_fn is not None:
                p.grad.detach_()
            else:
                p.grad.requires_grad_(False)
            p.grad.zero_()
