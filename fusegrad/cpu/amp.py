"""``fusegrad.cpu.amp``: torch.cpu.amp's deprecated spellings of :mod:`fusegrad.amp`."""

from fusegrad import dtypes
from fusegrad.amp.deprecated import device_autocast, device_grad_scaler

autocast = device_autocast("cpu", dtypes.bfloat16)
GradScaler = device_grad_scaler("cpu")

__all__ = ["autocast", "GradScaler"]
