"""Imports every pass module so that their passes are registered by name."""

from fusegrad.passes import (  # noqa: F401
    attention,
    autodiff,
    barriers,
    constant_folding,
    cse,
    dce,
    fusion,
    matmul_layout,
    partition,
    schedule,
    simplify,
)
