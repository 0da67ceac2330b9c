"""``fusegrad.fft``: torch.fft's discrete Fourier transforms, their inverses and helpers.

Transforms of real and complex tensors with torch's ``n``/``s``/``dim``/``norm`` arguments,
result dtypes (``rfft`` of float32 is complex64) and gradients (see
:mod:`fusegrad.ops.spectral`). A torch name fusegrad lacks says so (see ``__getattr__``).

>>> import fusegrad as torch
>>> torch.fft.rfft(torch.tensor([1., 2., 3., 4.]))
tensor([10.+0.j, -2.+2.j, -2.+0.j])
"""

from __future__ import annotations

from fusegrad.ops import autocast as _autocast
from fusegrad.ops.spectral import (
    fft,
    fft2,
    fftfreq,
    fftn,
    fftshift,
    hfft,
    hfft2,
    hfftn,
    ifft,
    ifft2,
    ifftn,
    ifftshift,
    ihfft,
    ihfft2,
    ihfftn,
    irfft,
    irfft2,
    irfftn,
    rfft,
    rfft2,
    rfftfreq,
    rfftn,
)
from fusegrad.tensor import Tensor
from fusegrad.torch_api import missing_attribute as _missing_attribute

__all__ = ["Tensor", "fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft", "rfft2",
           "irfft2", "rfftn", "irfftn", "hfft", "ihfft", "hfft2", "ihfft2", "hfftn", "ihfftn",
           "fftfreq", "rfftfreq", "fftshift", "ifftshift"]


# The functions of torch's autocast lists are wrapped (fusegrad.ops.autocast).
_autocast.wrap_namespace(globals(), "fft.")


def __getattr__(name: str):
    raise _missing_attribute("torch.fft", "fusegrad.fft", name)
