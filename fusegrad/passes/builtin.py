"""Imports every pass module so that their passes are registered by name."""

from fusegrad.passes import autodiff, constant_folding, cse, dce, fusion, partition, simplify  # noqa: F401
