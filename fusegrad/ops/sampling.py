"""Sampling with fusegrad's generator: ``bernoulli``, ``multinomial`` from given
probabilities, and ``standard_gamma`` (the draws behind Gamma, Beta and Dirichlet)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from fusegrad import dtypes
from fusegrad.grad_mode import no_grad
from fusegrad.ops import philox
from fusegrad.ops.creation import _uniform01, default_generator
from fusegrad.ops.elementwise import lt, mul
from fusegrad.ops.inplace import assign_
from fusegrad.ops.operands import _index_tensor, cast
from fusegrad.ops.primitive import (
    Kind,
    Primitive,
    Rule,
    ShapeError,
    TensorType,
    bind,
    jvp_rule,
    register,
)
from fusegrad.ops.registry import public
from fusegrad.ops.special import _igamma_np, _lgamma_np
from fusegrad.tensor import Tensor


def _uniform(shape, dtype, generator) -> Tensor:
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


# --------------------------------------------------------------------------- Gamma

# Marsaglia-Tsang accepts at least 95% of its proposals for shapes >= 1 (and shapes below 1
# are boosted to shape + 1), so 8 rounds leave an element unsampled with probability below
# 0.05**8; those few go on drawing from a second stream (a different Philox key).
_GAMMA_ROUNDS = 8
_GAMMA_SPARE_SEED = 0x9E3779B97F4A7C15


def _gamma_counters(n: int) -> int:
    """Philox counters one standard_gamma of ``n`` elements reserves: per round two
    Box-Muller uniforms and an acceptance uniform, then one uniform for the boost of small
    shapes (float64 numbers, two words each)."""
    return _GAMMA_ROUNDS * philox.counters_used(6 * n) + philox.counters_used(2 * n)


def _marsaglia_tsang(seed: int, offset: int, shape: np.ndarray) -> np.ndarray:
    """Standard Gamma(``shape``) draws for shapes >= 1 (Marsaglia and Tsang, "A simple method
    for generating gamma variables", ACM TOMS 2000), from the counters at ``offset``."""
    n = shape.size
    d = shape - 1.0 / 3.0
    c = 1.0 / np.sqrt(9.0 * d)
    out = np.full(n, np.nan)
    todo = np.arange(n)
    for rounds in range(1 << 20):
        if rounds == _GAMMA_ROUNDS:
            seed = (seed + _GAMMA_SPARE_SEED) & 0xFFFFFFFFFFFFFFFF
        if not todo.size:
            break
        # Each round has counters for all n elements reserved; the elements still to draw
        # take the first of them, in order (deterministic, and later rounds are cheap).
        u = philox.uniform(seed, offset, (3, todo.size), np.float64)
        offset += philox.counters_used(6 * n)
        z = np.sqrt(-2.0 * np.log1p(-u[0])) * np.cos(2.0 * np.pi * u[1])
        v = (1.0 + c[todo] * z) ** 3
        with np.errstate(invalid="ignore", divide="ignore"):
            accept = (v > 0) & (np.log1p(-u[2]) < 0.5 * z * z + d[todo] * (1.0 - v + np.log(v)))
        out[todo[accept]] = (d[todo] * v)[accept]
        todo = todo[~accept]
    return out


def _standard_gamma_impl(key, alpha):
    seed, offset = int(key[0]), int(key[1])
    a = np.asarray(alpha, np.float64).reshape(-1)
    valid = (a > 0) & np.isfinite(a)
    boost = valid & (a < 1.0)
    safe = np.where(valid, a, 1.0) + np.where(boost, 1.0, 0.0)
    x = _marsaglia_tsang(seed, offset, safe)
    n = a.size
    # Gamma(a) = Gamma(a + 1) U^(1/a) for a < 1, U from the counters after the rounds'; in
    # logs, as U^(1/a) underflows for tiny a.
    boost_offset = offset + _GAMMA_ROUNDS * philox.counters_used(6 * n)
    u = philox.uniform(seed, boost_offset, (n,), np.float64)
    with np.errstate(divide="ignore"):
        x = np.where(boost, np.exp(np.log(x) + np.log1p(-u) / np.where(boost, a, 1.0)), x)
    x = np.where(valid, x, np.where(np.isposinf(a), np.inf, np.nan))
    # A draw that underflows is the smallest normal number of the dtype, as torch's.
    tiny = float(ml_dtypes.finfo(alpha.dtype).tiny)
    return np.maximum(x, tiny).astype(alpha.dtype).reshape(alpha.shape)


def _standard_gamma_infer(key: TensorType, alpha: TensorType) -> TensorType:
    if key.shape != (2,) or key.dtype is not dtypes.int64:
        raise ShapeError(f"standard_gamma: the key must be i64[2] (seed, offset), got {key}")
    if not alpha.dtype.is_floating_point:
        raise ShapeError(f"standard_gamma: expected a floating point concentration, got "
                         f"{alpha.dtype.name}")
    return alpha


def _gamma_cdf_alpha_derivative(a, x):
    """d/da of the regularized incomplete gamma function at (a, x): Richardson-extrapolated
    central differences of the float64 series / continued fraction, taken of P below the
    mode and of Q = 1 - P above it, where each has its relative accuracy."""
    upper = x > a
    # P varies in a on the scale of a below 1 and of sqrt(a) (the spread of Gamma(a)) above.
    h = 1e-3 * np.minimum(a, np.sqrt(a))

    def central(step):
        lo = np.where(upper, -_igamma_np(a - step, x, True), _igamma_np(a - step, x, False))
        hi = np.where(upper, -_igamma_np(a + step, x, True), _igamma_np(a + step, x, False))
        return (hi - lo) / (2.0 * step)
    return (4.0 * central(h / 2.0) - central(h)) / 3.0


def _standard_gamma_grad_impl(alpha, x):
    """dx/dalpha of a standard Gamma draw x held at a fixed CDF value (implicit
    reparameterization, Figurnov et al. 2018): -(dP/dalpha) / (dP/dx)."""
    a = np.asarray(alpha, np.float64)
    v = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        log_density = (a - 1.0) * np.log(v) - v - _lgamma_np(a)
        grad = -_gamma_cdf_alpha_derivative(a, v) / np.exp(log_density)
    return grad.astype(alpha.dtype)


def _standard_gamma_grad_infer(alpha: TensorType, x: TensorType) -> TensorType:
    if alpha.shape != x.shape or alpha.dtype is not x.dtype:
        raise ShapeError(f"standard_gamma_grad: concentration {alpha} and sample {x} differ")
    return alpha


standard_gamma_grad_prim = register(Primitive(
    "standard_gamma_grad", Kind.EXTERN, _standard_gamma_grad_infer, _standard_gamma_grad_impl,
    doc="The derivative of a standard Gamma draw with respect to its concentration, at a fixed "
        "CDF value."))

standard_gamma_prim = register(Primitive(
    "standard_gamma", Kind.EXTERN, _standard_gamma_infer, _standard_gamma_impl,
    (None, Rule(lambda g, out, key, alpha: mul(g, bind(standard_gamma_grad_prim, alpha, out)),
                (1,), True)),
    "StandardGammaBackward0",
    doc="Standard Gamma(alpha) draws keyed by (seed, offset): Marsaglia-Tsang rejection, with "
        "implicit reparameterization gradients."))


def standard_gamma(concentration: Tensor, *, generator=None) -> Tensor:
    """Gamma(concentration, 1) draws of ``concentration``'s shape, differentiable in the
    concentration (``torch._standard_gamma``): the gradient is the implicit
    reparameterization one, exact for each draw given its CDF value. Traces under
    ``fusegrad.compile`` (fresh draws on each call)."""
    gen = generator or default_generator
    key = gen.next_key(4 * _gamma_counters(max(concentration.numel(), 1)))
    return bind(standard_gamma_prim, key, concentration)


# --------------------------------------------------------------------------- JVP rules
# Forward mode (fusegrad.ops.dual): a draw moves with its concentration by the implicit
# reparameterization derivative (the VJP's); the derivative itself has none, as in torch.

jvp_rule(standard_gamma_prim)(
    lambda ts, out, key, alpha: mul(ts[1], bind(standard_gamma_grad_prim, alpha, out)))


# --------------------------------------------------------------------------- batching rules

from fusegrad.ops.batching import batching, fallback, leading_rule  # noqa: E402

batching(standard_gamma_grad_prim)(leading_rule(standard_gamma_grad_prim))   # same shapes
fallback(standard_gamma_prim, "one draw per example key (as random_uniform)")
