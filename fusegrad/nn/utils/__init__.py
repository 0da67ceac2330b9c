"""``fusegrad.nn.utils``: gradient clipping and flat parameter vectors, as torch.nn.utils.

>>> loss.backward()
>>> total = fusegrad.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)

Packed sequences for recurrent layers are in :mod:`fusegrad.nn.utils.rnn`; tensors computed
from others on access (weight norm, spectral norm, orthogonal weights) in
:mod:`fusegrad.nn.utils.parametrize` and :mod:`fusegrad.nn.utils.parametrizations`, and the
older hook-based ``weight_norm`` and ``spectral_norm``.
"""

from fusegrad.nn.utils import parametrizations, parametrize, rnn
from fusegrad.nn.utils.clip_grad import clip_grad_norm, clip_grad_norm_, clip_grad_value_
from fusegrad.nn.utils.convert_parameters import parameters_to_vector, vector_to_parameters
from fusegrad.nn.utils.spectral_norm import remove_spectral_norm, spectral_norm
from fusegrad.nn.utils.weight_norm import remove_weight_norm, weight_norm
from fusegrad.torch_api import missing_attribute as _missing_attribute

__all__ = ["rnn", "parametrize", "parametrizations", "clip_grad_norm_", "clip_grad_norm",
           "clip_grad_value_", "parameters_to_vector", "vector_to_parameters", "weight_norm",
           "remove_weight_norm", "spectral_norm", "remove_spectral_norm"]


def __getattr__(name: str):
    raise _missing_attribute("torch.nn.utils", "fusegrad.nn.utils", name)
