"""``fusegrad.utils``: helpers around training, under torch.utils's names."""

from fusegrad.utils import data

__all__ = ["data"]
