"""Sampling from given probabilities with fusegrad's generator: ``bernoulli``,
``multinomial``."""

from __future__ import annotations

import numpy as np

from fusegrad import dtypes
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops.elementwise import lt
from fusegrad.ops.operands import _index_tensor, cast
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor


def _uniform(shape, dtype, generator) -> Tensor:
    from fusegrad.ops.creation import _uniform01  # creation builds on the op modules
    return _uniform01(tuple(shape), dtype, generator)


@public(torch=True, method=True)
def bernoulli(x: Tensor, p=None, *, generator=None) -> Tensor:
    """1 with probability ``x`` (or the number ``p``), else 0, in ``x``'s dtype; no gradient."""
    if not x.dtype.is_floating_point:
        raise NotImplementedError(f'"bernoulli_tensor_cpu_self_" not implemented for '
                                  f"'{x.dtype.name}'")
    with no_grad():
        probs = x if p is None else p
        return cast(lt(_uniform(x.shape, x.dtype, generator), probs), x.dtype)


def _bernoulli_(x: Tensor, p=0.5, *, generator=None) -> Tensor:
    """``x.bernoulli_(p)``: fill ``x`` with 1 with probability ``p`` (a number or tensor)."""
    from fusegrad.ops.inplace import assign_
    with no_grad():
        return assign_(x, cast(lt(_uniform(x.shape, x.dtype, generator), p), x.dtype))


public(_bernoulli_, name="bernoulli_", method=True)


@public(torch=True, method=True)
def multinomial(x: Tensor, num_samples: int, replacement: bool = False, *,
                generator=None) -> Tensor:
    """``num_samples`` category indices per row of the non-negative weights ``x`` (1-D or
    2-D), with or without replacement. Eager only (the uniforms come from ``generator``)."""
    x._check_concrete("multinomial()")
    if x.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: "
                           f"{x.dtype.name}")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    w = x._data.astype(np.float64).reshape(-1, x.shape[-1])
    n = w.shape[1]
    if not replacement and num_samples > n:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without "
                           "replacement")
    if not np.isfinite(w).all() or (w < 0).any():
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if (w.sum(1) <= 0).any():
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    if not replacement and ((w > 0).sum(1) < num_samples).any():
        raise RuntimeError("invalid multinomial distribution (with replacement=False, not "
                           "enough non-negative category to sample)")
    rows = w.shape[0]
    if replacement:
        u = _uniform((rows, num_samples), dtypes.float64, generator)._data
        cdf = np.cumsum(w, axis=1)
        cdf /= cdf[:, -1:]
        out = np.stack([np.searchsorted(cdf[r], u[r], side="right") for r in range(rows)])
        out = np.minimum(out, n - 1)
    else:
        # Exponential races: the k smallest E_i / w_i are a weighted sample without
        # replacement (zero weights never win while positive ones remain).
        u = _uniform((rows, n), dtypes.float64, generator)._data
        with np.errstate(divide="ignore"):
            keys = -np.log1p(-u) / w
        out = np.argsort(keys, axis=1, kind="stable")[:, :num_samples]
    return _index_tensor(out.reshape(tuple(x.shape[:-1]) + (num_samples,)))
