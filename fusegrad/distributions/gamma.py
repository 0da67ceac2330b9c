"""``Gamma(concentration, rate)``."""

from __future__ import annotations

import numbers

from fusegrad import special, type_info
from fusegrad.distributions import constraints
from fusegrad.distributions.exp_family import ExponentialFamily
from fusegrad.distributions.utils import broadcast_all
from fusegrad.ops import creation
from fusegrad.ops import functional as _ops
from fusegrad.ops.sampling import standard_gamma
from fusegrad.tensor import Size

__all__ = ["Gamma"]


def _clamp_tiny(value):
    """``value`` with draws that underflowed raised to the dtype's smallest normal number,
    keeping their gradient (torch clamps the detached value in place)."""
    tiny = type_info.finfo(value.dtype).tiny
    return value + (value.detach().clamp(min=tiny) - value.detach())


class Gamma(ExponentialFamily):
    """The Gamma distribution with shape ``concentration`` and ``rate`` (1 / scale).

    ``rsample`` is reparameterized: draws come from Marsaglia and Tsang's rejection sampler
    on fusegrad's generator, and their gradient with respect to the concentration is the
    implicit one, ``-(dF/dconcentration) / (dF/dx)`` for the CDF ``F`` (Figurnov et al.,
    "Implicit reparameterization gradients", 2018), as torch's."""

    arg_constraints = {"concentration": constraints.positive, "rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True
    _mean_carrier_measure = 0

    @property
    def mean(self):
        return self.concentration / self.rate

    @property
    def mode(self):
        return ((self.concentration - 1) / self.rate).clamp(min=0)

    @property
    def variance(self):
        return self.concentration / self.rate.pow(2)

    def __init__(self, concentration, rate, validate_args: bool | None = None) -> None:
        self.concentration, self.rate = broadcast_all(concentration, rate)
        if isinstance(concentration, numbers.Number) and isinstance(rate, numbers.Number):
            batch_shape = Size()
        else:
            batch_shape = self.concentration.size()
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Gamma, _instance)
        batch_shape = Size(batch_shape)
        new.concentration = self.concentration.expand(batch_shape)
        new.rate = self.rate.expand(batch_shape)
        super(Gamma, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def rsample(self, sample_shape=()):
        shape = tuple(self._extended_shape(sample_shape))
        value = standard_gamma(self.concentration.expand(shape)) / self.rate.expand(shape)
        return _clamp_tiny(value)

    def log_prob(self, value):
        value = creation.as_tensor(value, dtype=self.rate.dtype)
        if self._validate_args:
            self._validate_sample(value)
        return (_ops.xlogy(self.concentration, self.rate)
                + _ops.xlogy(self.concentration - 1, value)
                - self.rate * value - _ops.lgamma(self.concentration))

    def entropy(self):
        return (self.concentration - _ops.log(self.rate) + _ops.lgamma(self.concentration)
                + (1.0 - self.concentration) * _ops.digamma(self.concentration))

    @property
    def _natural_params(self):
        return (self.concentration - 1, -self.rate)

    def _log_normalizer(self, x, y):
        return _ops.lgamma(x + 1) + (x + 1) * _ops.log(-y.reciprocal())

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return special.gammainc(self.concentration, self.rate * value)
