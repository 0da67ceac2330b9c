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

from fusegrad.ops import functional as _ops
from fusegrad.ops.softmax import log_softmax, softmax
from fusegrad.tensor import Tensor
from fusegrad.torch_api import missing_attribute as _missing_attribute

__all__ = ["digamma", "erf", "erfc", "erfinv", "exp2", "expit", "expm1", "gammainc", "gammaincc",
           "gammaln", "i0", "log1p", "log_softmax", "logit", "logsumexp", "multigammaln", "ndtr",
           "polygamma", "psi", "round", "sinc", "softmax", "xlogy"]

digamma = psi = _ops.digamma
erf, erfc, erfinv = _ops.erf, _ops.erfc, _ops.erfinv
exp2, expm1, log1p = _ops.exp2, _ops.expm1, _ops.log1p
expit = _ops.sigmoid
gammainc, gammaincc = _ops.igamma, _ops.igammac
gammaln = _ops.lgamma
i0 = _ops.i0
logit = _ops.logit
logsumexp = _ops.logsumexp
multigammaln = _ops.mvlgamma
polygamma = _ops.polygamma
round = _ops.round
sinc = _ops.sinc
xlogy = _ops.xlogy


def ndtr(x: Tensor) -> Tensor:
    """The standard normal CDF, ``erfc(-x / sqrt(2)) / 2`` (accurate in the lower tail, where
    ``(1 + erf(x / sqrt(2))) / 2`` cancels to 0)."""
    return _ops.erfc(x * -math.sqrt(0.5)) * 0.5


def __getattr__(name: str):
    raise _missing_attribute("torch.special", "fusegrad.special", name)
