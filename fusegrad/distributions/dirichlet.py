"""``Dirichlet(concentration)``."""

from __future__ import annotations

import fusegrad.nn.functional as F
from fusegrad.distributions import constraints
from fusegrad.distributions.exp_family import ExponentialFamily
from fusegrad.ops import functional as _ops
from fusegrad.ops.sampling import standard_gamma
from fusegrad.tensor import Size

__all__ = ["Dirichlet"]


class Dirichlet(ExponentialFamily):
    """The Dirichlet distribution on the simplex of the last dim of ``concentration``.

    ``rsample`` normalizes independent Gamma(concentration_i) draws; its gradient goes
    through each draw's implicit reparameterization gradient (see :class:`Gamma`), an
    unbiased estimate of the gradient of any expectation (torch differentiates the
    Dirichlet CDF directly; both are exact in expectation)."""

    arg_constraints = {"concentration": constraints.independent(constraints.positive, 1)}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, concentration, validate_args: bool | None = None) -> None:
        if concentration.dim() < 1:
            raise ValueError("`concentration` parameter must be at least one-dimensional.")
        self.concentration = concentration
        batch_shape, event_shape = concentration.shape[:-1], concentration.shape[-1:]
        super().__init__(batch_shape, event_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Dirichlet, _instance)
        batch_shape = Size(batch_shape)
        new.concentration = self.concentration.expand(batch_shape + self.event_shape)
        super(Dirichlet, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def rsample(self, sample_shape=()):
        shape = tuple(self._extended_shape(sample_shape))
        gammas = standard_gamma(self.concentration.expand(shape))
        return gammas / gammas.sum(-1, keepdim=True)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return (_ops.xlogy(self.concentration - 1.0, value).sum(-1)
                + _ops.lgamma(self.concentration.sum(-1))
                - _ops.lgamma(self.concentration).sum(-1))

    @property
    def mean(self):
        return self.concentration / self.concentration.sum(-1, True)

    @property
    def mode(self):
        concentrationm1 = (self.concentration - 1).clamp(min=0.0)
        mode = concentrationm1 / concentrationm1.sum(-1, True)
        # All concentrations below 1: the density is highest at the corner of the largest.
        corner = F.one_hot(mode.argmax(dim=-1), concentrationm1.shape[-1]).to(mode.dtype)
        return _ops.where((self.concentration < 1).all(dim=-1, keepdim=True), corner, mode)

    @property
    def variance(self):
        con0 = self.concentration.sum(-1, True)
        return self.concentration * (con0 - self.concentration) / (con0.pow(2) * (con0 + 1))

    def entropy(self):
        k = self.concentration.size(-1)
        a0 = self.concentration.sum(-1)
        return (_ops.lgamma(self.concentration).sum(-1) - _ops.lgamma(a0)
                - (k - a0) * _ops.digamma(a0)
                - ((self.concentration - 1.0) * _ops.digamma(self.concentration)).sum(-1))

    @property
    def _natural_params(self):
        return (self.concentration,)

    def _log_normalizer(self, x):
        return x.lgamma().sum(-1) - _ops.lgamma(x.sum(-1))
