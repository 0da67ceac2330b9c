"""The abstract value of a tensor (:class:`TensorType`: shape, dtype, device) and the axis
rule every op shares.

A base module: :mod:`fusegrad.tensor` describes its values with it and sits below the ops,
so it cannot take it from :mod:`fusegrad.ops.primitive` (which re-exports both names).
"""

from __future__ import annotations

from dataclasses import dataclass

from fusegrad.dtypes import DType
from fusegrad.symint import SymInt

__all__ = ["TensorType", "device_suffix", "normalize_axis"]


@dataclass(frozen=True)
class TensorType:
    """The abstract value of a tensor: its shape, dtype and device, no data.

    ``device`` is a device string (``"cpu"``, ``"cuda"``, ``"cuda:1"``); the IR text shows
    it only when it is not the CPU (``f32[4,8]@cuda``), so CPU programs print as before.

    A dim may be a :class:`~fusegrad.symint.SymInt` (``f32[B,784]``): a size that a call
    binds; ``numel`` is then an expression too."""

    shape: tuple[int | SymInt, ...]
    dtype: DType
    device: str = "cpu"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int | SymInt:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __str__(self) -> str:
        text = f"{self.dtype.short}[{','.join(map(str, self.shape))}]"
        return text if self.device == "cpu" else f"{text}{device_suffix(self.device)}"


def device_suffix(device: str) -> str:
    """The IR spelling of a non-CPU device after a type: ``@cuda``, ``@"cuda:1"`` (a global
    token of the IR's lexer, quoted when it holds a colon)."""
    return f'@"{device}"' if ":" in device else f"@{device}"


def normalize_axis(axis: int, ndim: int, op: str = "") -> int:
    """Wrap a negative axis; torch's IndexError when out of range."""
    lo, hi = (-ndim, ndim - 1) if ndim > 0 else (-1, 0)
    if not lo <= axis <= hi:
        raise IndexError(f"{op + ': ' if op else ''}Dimension out of range (expected to be in "
                         f"range of [{lo}, {hi}], but got {axis})")
    return axis % ndim if ndim > 0 else 0
