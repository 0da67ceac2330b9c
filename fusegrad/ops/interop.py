"""Values from other array libraries as fusegrad tensors, for loading their checkpoints.

``Module.load_state_dict`` and ``Optimizer.load_state_dict`` accept a torch checkpoint's
tensors (the layout is the same); :func:`checkpoint_tensor` copies each into a fusegrad tensor.
"""

from __future__ import annotations

import numpy as np

from fusegrad.ops.creation import from_dlpack, tensor
from fusegrad.tensor import Tensor

__all__ = ["checkpoint_tensor"]


def checkpoint_tensor(value):
    """A checkpoint entry as a fusegrad tensor: torch tensors (any object with ``__dlpack__``
    or ``.numpy()``) and numpy arrays are copied into one; anything else is returned as is,
    for the caller to report."""
    if isinstance(value, Tensor) or value is None or isinstance(value, (str, bytes, int, float)):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu()    # torch: dlpack refuses tensors that require grad
    if hasattr(value, "__dlpack__"):
        try:
            return tensor(from_dlpack(value))
        except (BufferError, RuntimeError, TypeError):
            pass    # e.g. a dtype DLPack cannot carry: try the array protocols below
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        try:
            value = value.numpy()
        except (RuntimeError, TypeError, ValueError):
            return value
    if isinstance(value, np.ndarray) or hasattr(value, "__array__"):
        try:
            return tensor(np.asarray(value))
        except TypeError:
            return value
    return value
