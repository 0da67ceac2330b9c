"""``Exponential(rate)``."""

from __future__ import annotations

import numbers

from fusegrad.distributions import constraints
from fusegrad.distributions.exp_family import ExponentialFamily
from fusegrad.distributions.utils import broadcast_all
from fusegrad.ops import creation
from fusegrad.ops import functional as _ops
from fusegrad.tensor import Size

__all__ = ["Exponential"]


class Exponential(ExponentialFamily):
    """The exponential distribution with rate ``rate``: density ``rate exp(-rate x)`` on
    ``x >= 0``."""

    arg_constraints = {"rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True
    _mean_carrier_measure = 0

    @property
    def mean(self):
        return self.rate.reciprocal()

    @property
    def mode(self):
        return creation.zeros_like(self.rate)

    @property
    def stddev(self):
        return self.rate.reciprocal()

    @property
    def variance(self):
        return self.rate.pow(-2)

    def __init__(self, rate, validate_args: bool | None = None) -> None:
        (self.rate,) = broadcast_all(rate)
        batch_shape = Size() if isinstance(rate, numbers.Number) else self.rate.size()
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Exponential, _instance)
        batch_shape = Size(batch_shape)
        new.rate = self.rate.expand(batch_shape)
        super(Exponential, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        u = creation.rand(tuple(shape), dtype=self.rate.dtype, device=self.rate.device)
        return -_ops.log1p(-u) / self.rate     # u < 1: a finite standard exponential

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return self.rate.log() - self.rate * value

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 1 - _ops.exp(-self.rate * value)

    def icdf(self, value):
        return -_ops.log1p(-value) / self.rate

    def entropy(self):
        return 1.0 - _ops.log(self.rate)

    @property
    def _natural_params(self):
        return (-self.rate,)

    def _log_normalizer(self, x):
        return -_ops.log(-x)
