"""``fusegrad.distributions``: torch.distributions' probability distributions, built from
fusegrad's tensor ops, so that ``log_prob``, ``rsample``, ``entropy`` and ``kl_divergence``
differentiate and trace under ``fusegrad.compile``.

>>> import fusegrad as torch
>>> from fusegrad.distributions import Normal, kl_divergence
>>> kl_divergence(Normal(0.0, 1.0), Normal(1.0, 1.0))
tensor(0.5000)

Sampling uses fusegrad's generator (``fusegrad.manual_seed`` makes it reproducible; the
numbers differ from torch's). Gamma, Beta and Dirichlet draws come from a Marsaglia-Tsang
sampler with implicit reparameterization gradients.
"""

from fusegrad.distributions import constraints, transforms
from fusegrad.distributions.bernoulli import Bernoulli
from fusegrad.distributions.beta import Beta
from fusegrad.distributions.categorical import Categorical
from fusegrad.distributions.dirichlet import Dirichlet
from fusegrad.distributions.distribution import Distribution
from fusegrad.distributions.exp_family import ExponentialFamily
from fusegrad.distributions.exponential import Exponential
from fusegrad.distributions.gamma import Gamma
from fusegrad.distributions.independent import Independent
from fusegrad.distributions.kl import kl_divergence, register_kl
from fusegrad.distributions.laplace import Laplace
from fusegrad.distributions.multivariate_normal import MultivariateNormal
from fusegrad.distributions.normal import Normal
from fusegrad.distributions.one_hot_categorical import OneHotCategorical
from fusegrad.distributions.transformed_distribution import TransformedDistribution
from fusegrad.distributions.transforms import (
    AbsTransform,
    AffineTransform,
    ComposeTransform,
    ExpTransform,
    PowerTransform,
    SigmoidTransform,
    SoftmaxTransform,
    TanhTransform,
    Transform,
    identity_transform,
)
from fusegrad.distributions.uniform import Uniform

__all__ = ["AbsTransform", "AffineTransform", "Bernoulli", "Beta", "Categorical",
           "ComposeTransform", "Dirichlet", "Distribution", "ExpTransform", "Exponential",
           "ExponentialFamily", "Gamma", "Independent", "Laplace", "MultivariateNormal", "Normal",
           "OneHotCategorical", "PowerTransform", "SigmoidTransform", "SoftmaxTransform",
           "TanhTransform", "Transform", "TransformedDistribution", "Uniform", "constraints",
           "identity_transform", "kl_divergence", "register_kl", "transforms"]

# torch.distributions' other public names (torch 2.13): asking for one says that fusegrad
# does not have it yet, rather than that it does not exist.
_NOT_YET = frozenset("""
    Binomial CatTransform Cauchy Chi2 ContinuousBernoulli CorrCholeskyTransform
    CumulativeDistributionTransform FisherSnedecor GeneralizedPareto Geometric Gumbel
    HalfCauchy HalfNormal IndependentTransform InverseGamma Kumaraswamy LKJCholesky LogNormal
    LogisticNormal LowRankMultivariateNormal LowerCholeskyTransform MixtureSameFamily
    Multinomial NegativeBinomial OneHotCategoricalStraightThrough Pareto Poisson
    PositiveDefiniteTransform RelaxedBernoulli RelaxedOneHotCategorical ReshapeTransform
    SoftplusTransform StackTransform StickBreakingTransform StudentT VonMises Weibull Wishart
    biject_to transform_to""".split())


def __getattr__(name: str):
    plain = f"module 'fusegrad.distributions' has no attribute '{name}'"
    if name in _NOT_YET:
        raise AttributeError(f"{plain}: torch.distributions.{name} is not implemented in "
                             "fusegrad yet")
    raise AttributeError(plain)
