"""``fusegrad.cuda.amp``: torch.cuda.amp's deprecated spellings of :mod:`fusegrad.amp`."""

from fusegrad import dtypes
from fusegrad.amp.deprecated import device_autocast, device_grad_scaler

autocast = device_autocast("cuda", dtypes.float16)
GradScaler = device_grad_scaler("cuda")

__all__ = ["autocast", "GradScaler"]
