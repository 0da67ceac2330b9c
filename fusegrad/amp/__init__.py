"""``fusegrad.amp``: automatic mixed precision, torch.amp's API.

:class:`autocast` runs the ops of torch's autocast lists in a lower precision inside a
region (:mod:`fusegrad.ops.autocast` holds the lists and the casts); :class:`GradScaler`
scales the loss so that float16 gradients do not underflow, and skips the steps whose
gradients overflowed.
"""

from fusegrad.amp.autocast_mode import autocast, custom_bwd, custom_fwd, is_autocast_available
from fusegrad.amp.grad_scaler import GradScaler

__all__ = ["autocast", "custom_bwd", "custom_fwd", "is_autocast_available", "GradScaler"]
