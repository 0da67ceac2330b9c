"""``Laplace(loc, scale)``."""

from __future__ import annotations

import numbers

from fusegrad import type_info
from fusegrad.distributions import constraints
from fusegrad.distributions.distribution import Distribution
from fusegrad.distributions.utils import broadcast_all
from fusegrad.ops import creation
from fusegrad.ops import functional as _ops
from fusegrad.tensor import Size

__all__ = ["Laplace"]


class Laplace(Distribution):
    """The Laplace (double exponential) distribution with location ``loc`` and scale
    ``scale``: density ``exp(-|x - loc| / scale) / (2 scale)``."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        return 2 * self.scale.pow(2)

    @property
    def stddev(self):
        return 2 ** 0.5 * self.scale

    def __init__(self, loc, scale, validate_args: bool | None = None) -> None:
        self.loc, self.scale = broadcast_all(loc, scale)
        if isinstance(loc, numbers.Number) and isinstance(scale, numbers.Number):
            batch_shape = Size()
        else:
            batch_shape = self.loc.size()
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Laplace, _instance)
        batch_shape = Size(batch_shape)
        new.loc = self.loc.expand(batch_shape)
        new.scale = self.scale.expand(batch_shape)
        super(Laplace, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        finfo = type_info.finfo(self.loc.dtype)
        # u uniform in [eps - 1, 1): |u| < 1, so log1p(-|u|) stays finite.
        u = creation.rand(tuple(shape), dtype=self.loc.dtype, device=self.loc.device)
        u = u * (2 - finfo.eps) + (finfo.eps - 1)
        return self.loc - self.scale * u.sign() * _ops.log1p(-u.abs())

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return -_ops.log(2 * self.scale) - _ops.abs(value - self.loc) / self.scale

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 0.5 - 0.5 * (value - self.loc).sign() * \
            _ops.expm1(-(value - self.loc).abs() / self.scale)

    def icdf(self, value):
        term = value - 0.5
        return self.loc - self.scale * term.sign() * _ops.log1p(-2 * term.abs())

    def entropy(self):
        return 1 + _ops.log(2 * self.scale)
