"""The softmax formula and its VJP, written once over a small set of array operations
(:class:`SoftmaxMath`): the tensor ops of :mod:`fusegrad.ops.softmax` (softmax, attention)
evaluate them on tensors, the numpy reference of the fused attention
(:mod:`fusegrad.ops.fused_attention`) on arrays, so that both compute the same expression.
This module needs numpy alone: the primitives' layer imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["SoftmaxMath", "NUMPY_MATH", "shift_by_max", "softmax_formula", "softmax_vjp_formula"]


@dataclass(frozen=True)
class SoftmaxMath:
    """The operations the softmax formulas use, on one kind of array. ``amax`` and ``sum``
    keep the reduced dim; ``amax``'s result carries no gradient (the shift by the max cancels
    out of softmax, so its gradient is zero anyway, and recording it would only cost time)."""

    amax: Callable
    sum: Callable
    exp: Callable
    where: Callable
    eq: Callable
    sub: Callable
    mul: Callable
    div: Callable


NUMPY_MATH = SoftmaxMath(lambda x, dim: x.max(dim, keepdims=True),
                         lambda x, dim: x.sum(dim, keepdims=True),
                         np.exp, np.where, np.equal, np.subtract, np.multiply, np.divide)


def shift_by_max(m: SoftmaxMath, x, dim: int):
    """``x - max(x)`` along ``dim`` (exp() of it cannot overflow), and where the max is -inf.

    A slice that is all -inf is shifted by 0 (not -inf, which would make -inf - -inf = NaN)
    so softmax gives NaN there as torch does, via 0/0, while log_softmax's -inf entries stay
    -inf in mixed slices.
    """
    top = m.amax(x, dim)
    dead = m.eq(top, -math.inf)
    return m.sub(x, m.where(dead, 0.0, top)), dead


def softmax_formula(m: SoftmaxMath, x, dim: int, zero_dead: bool = False):
    """``exp(x - max) / sum(exp(x - max))`` along ``dim``. A slice that is all -inf gives NaN
    (torch's softmax) or, with ``zero_dead``, zeros (torch's ``_safe_softmax``: attention's
    rows that attend to nothing)."""
    shifted, dead = shift_by_max(m, x, dim)
    e = m.exp(shifted)
    total = m.sum(e, dim)
    return m.div(e, m.where(dead, 1.0, total) if zero_dead else total)


def softmax_vjp_formula(m: SoftmaxMath, g, out, dim: int):
    """torch's SoftmaxBackward: ``out * (g - sum(g * out))``, which reads the output alone."""
    return m.mul(out, m.sub(g, m.sum(m.mul(g, out), dim)))
