"""Exceptions of the runtime that the top-level API names (``fusegrad.OutOfMemoryError``),
in a module that imports nothing, so that naming them loads no runtime."""

from __future__ import annotations

__all__ = ["OutOfMemoryError"]


class OutOfMemoryError(RuntimeError):
    """Exception raised when device is out of memory (torch's ``torch.OutOfMemoryError``,
    also ``torch.cuda.OutOfMemoryError``: a RuntimeError, so ``except RuntimeError`` still
    catches it)."""
