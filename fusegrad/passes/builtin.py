"""Imports every pass module so that their passes are registered by name."""

from fusegrad.passes import dce, fusion  # noqa: F401
