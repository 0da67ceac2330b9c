"""``ExponentialFamily``: distributions of the form
``p(x; theta) = exp(<t(x), theta> - F(theta) + k(x))``."""

from __future__ import annotations

from fusegrad import autograd
from fusegrad.distributions.distribution import Distribution

__all__ = ["ExponentialFamily"]


class ExponentialFamily(Distribution):
    """An exponential family: its natural parameters ``_natural_params``, log normalizer
    ``_log_normalizer`` (F) and mean carrier measure (E[k(x)]) give the entropy and the KL
    divergence between two members as Bregman divergences of F."""

    @property
    def _natural_params(self):
        raise NotImplementedError

    def _log_normalizer(self, *natural_params):
        raise NotImplementedError

    @property
    def _mean_carrier_measure(self) -> float:
        raise NotImplementedError

    def entropy(self):
        """The entropy as ``F(theta) - <theta, grad F(theta)> - E[k(x)]``."""
        result = -self._mean_carrier_measure
        nparams = [p.detach().requires_grad_() for p in self._natural_params]
        lg_normal = self._log_normalizer(*nparams)
        gradients = autograd.grad(lg_normal.sum(), nparams, create_graph=True)
        result = result + lg_normal
        for nparam, g in zip(nparams, gradients):
            result = result - (nparam * g).reshape(tuple(self._batch_shape) + (-1,)).sum(-1)
        return result
