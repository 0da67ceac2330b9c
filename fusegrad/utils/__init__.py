"""``fusegrad.utils``: helpers around training, under torch.utils's names."""

from fusegrad.utils import checkpoint, data

__all__ = ["checkpoint", "data"]
