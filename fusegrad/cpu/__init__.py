"""``fusegrad.cpu``: torch.cpu's ``amp`` spellings (:mod:`fusegrad.cpu.amp`)."""

from fusegrad.cpu import amp

__all__ = ["amp"]
