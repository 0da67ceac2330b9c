"""``fusegrad.special``: torch.special's names for fusegrad's special functions.

Most are the same functions as at the top level under torch.special's names (``expit`` is
``sigmoid``, ``gammaln`` is ``lgamma``, ``psi`` is ``digamma``). A torch name fusegrad lacks
says so (see ``__getattr__``).

>>> import fusegrad as torch
>>> torch.special.expit(torch.tensor([0.0]))
tensor([0.5000])
"""

from __future__ import annotations

import math

import fusegrad as _fg
from fusegrad.tensor import Tensor
from fusegrad.torch_api import missing_attribute as _missing_attribute

__all__ = ["digamma", "erf", "erfc", "erfinv", "exp2", "expit", "expm1", "gammainc", "gammaincc",
           "gammaln", "i0", "log1p", "log_softmax", "logit", "logsumexp", "multigammaln", "ndtr",
           "polygamma", "psi", "round", "sinc", "softmax", "xlogy"]

digamma = psi = _fg.digamma
erf, erfc, erfinv = _fg.erf, _fg.erfc, _fg.erfinv
exp2, expm1, log1p = _fg.exp2, _fg.expm1, _fg.log1p
expit = _fg.sigmoid
gammainc, gammaincc = _fg.igamma, _fg.igammac
gammaln = _fg.lgamma
i0 = _fg.i0
log_softmax, softmax = _fg.log_softmax, _fg.softmax
logit = _fg.logit
logsumexp = _fg.logsumexp
multigammaln = _fg.mvlgamma
polygamma = _fg.polygamma
round = _fg.round
sinc = _fg.sinc
xlogy = _fg.xlogy


def ndtr(x: Tensor) -> Tensor:
    """The standard normal CDF, ``erfc(-x / sqrt(2)) / 2`` (accurate in the lower tail, where
    ``(1 + erf(x / sqrt(2))) / 2`` cancels to 0)."""
    return _fg.erfc(x * -math.sqrt(0.5)) * 0.5


def __getattr__(name: str):
    raise _missing_attribute("torch.special", "fusegrad.special", name)
