"""torch's per-device spellings ``torch.cpu.amp`` and ``torch.cuda.amp``: ``autocast`` and
``GradScaler`` with the device fixed, each warning as torch's do that they are deprecated."""

from __future__ import annotations

import warnings

from fusegrad import dtypes
from fusegrad.amp.autocast_mode import autocast as _autocast
from fusegrad.amp.grad_scaler import GradScaler as _GradScaler


def device_autocast(device: str, default_dtype: dtypes.DType) -> type:
    """``torch.<device>.amp.autocast``: ``autocast(device, ...)`` that warns on construction."""
    message = (f"`torch.{device}.amp.autocast(args...)` is deprecated. "
               f"Please use `torch.amp.autocast('{device}', args...)` instead.")

    class autocast(_autocast):  # noqa: N801 - torch's name
        __doc__ = f"See :class:`fusegrad.autocast`. {message}"

        def __init__(self, enabled: bool = True, dtype: dtypes.DType = default_dtype,
                     cache_enabled: bool = True):
            warnings.warn(message, FutureWarning, stacklevel=2)
            super().__init__(device, enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)

    autocast.__module__ = f"fusegrad.{device}.amp"
    return autocast


def device_grad_scaler(device: str) -> type:
    """``torch.<device>.amp.GradScaler``: ``GradScaler(device, ...)`` that warns on construction."""
    message = (f"`torch.{device}.amp.GradScaler(args...)` is deprecated. "
               f"Please use `torch.amp.GradScaler('{device}', args...)` instead.")

    class GradScaler(_GradScaler):
        __doc__ = f"See :class:`fusegrad.amp.GradScaler`. {message}"

        def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                     backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True):
            warnings.warn(message, FutureWarning, stacklevel=2)
            super().__init__(device, init_scale=init_scale, growth_factor=growth_factor,
                             backoff_factor=backoff_factor, growth_interval=growth_interval,
                             enabled=enabled)

    GradScaler.__module__ = f"fusegrad.{device}.amp"
    return GradScaler
