"""``Categorical(probs=None, logits=None)``."""

from __future__ import annotations

import math

from fusegrad import dtypes, type_info
from fusegrad.autograd.grad_mode import no_grad
from fusegrad.distributions import constraints
from fusegrad.distributions.distribution import Distribution
from fusegrad.distributions.utils import lazy_property, logits_to_probs, probs_to_logits
from fusegrad.ops import creation
from fusegrad.ops import functional as _ops
from fusegrad.tensor import Size

__all__ = ["Categorical"]


class Categorical(Distribution):
    """A category index in ``0 .. K-1`` drawn with the probabilities of the last dim of
    ``probs`` (normalized to sum to 1) or ``logits`` (unnormalized log probabilities).

    >>> m = Categorical(logits=fusegrad.zeros(4))
    >>> m.log_prob(fusegrad.tensor(2))
    tensor(-1.3863)
    """

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}
    has_enumerate_support = True

    def __init__(self, probs=None, logits=None, validate_args: bool | None = None) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        if probs is not None:
            if probs.dim() < 1:
                raise ValueError("`probs` parameter must be at least one-dimensional.")
            self.probs = probs / probs.sum(-1, keepdim=True)
        else:
            if logits.dim() < 1:
                raise ValueError("`logits` parameter must be at least one-dimensional.")
            self.logits = logits - logits.logsumexp(dim=-1, keepdim=True)
        self._param = self.probs if probs is not None else self.logits
        self._num_events = self._param.size()[-1]
        batch_shape = self._param.size()[:-1] if self._param.ndimension() > 1 else Size()
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Categorical, _instance)
        batch_shape = Size(batch_shape)
        param_shape = batch_shape + Size((self._num_events,))
        if "probs" in self.__dict__:
            new.probs = self.probs.expand(param_shape)
            new._param = new.probs
        if "logits" in self.__dict__:
            new.logits = self.logits.expand(param_shape)
            new._param = new.logits
        new._num_events = self._num_events
        super(Categorical, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return constraints.integer_interval(0, self._num_events - 1)

    @lazy_property
    def logits(self):
        return probs_to_logits(self.probs)

    @lazy_property
    def probs(self):
        return logits_to_probs(self.logits)

    @property
    def param_shape(self) -> Size:
        return self._param.size()

    @property
    def mean(self):
        return _ops.full(tuple(self._extended_shape()), math.nan, dtype=self.probs.dtype)

    @property
    def mode(self):
        return self.probs.argmax(dim=-1)

    @property
    def variance(self):
        return _ops.full(tuple(self._extended_shape()), math.nan, dtype=self.probs.dtype)

    def sample(self, sample_shape=()):
        """Indices by inversion of the cumulative probabilities: one uniform per draw, the
        number of categories whose cumulative probability it passes. Unlike a multinomial
        call this traces, so a compiled step can sample its actions."""
        sample_shape = Size(sample_shape)
        with no_grad():
            probs = self.probs.reshape(-1, self._num_events)
            cdf = probs.cumsum(-1)
            u = creation.rand((sample_shape.numel(), probs.shape[0]), dtype=probs.dtype,
                          device=probs.device)
            passed = cdf <= (u * cdf[:, -1]).unsqueeze(-1)
            index = passed.sum(-1).clamp(max=self._num_events - 1)
            return index.reshape(tuple(self._extended_shape(sample_shape)))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        value = value.long().unsqueeze(-1)
        value, log_pmf = _ops.broadcast_tensors(value, self.logits)
        value = value[..., :1]
        return log_pmf.gather(-1, value).squeeze(-1)

    def entropy(self):
        min_real = type_info.finfo(self.logits.dtype).min
        logits = _ops.clamp(self.logits, min=min_real)
        return -(logits * self.probs).sum(-1)

    def enumerate_support(self, expand: bool = True):
        values = creation.arange(self._num_events, dtype=dtypes.int64)
        values = values.view((-1,) + (1,) * len(self._batch_shape))
        if expand:
            values = values.expand((-1,) + tuple(self._batch_shape))
        return values
