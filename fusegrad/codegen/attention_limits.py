"""Which attention heads the native attention kernels take.

The attention fusion (:mod:`fusegrad.passes.attention`) asks before it fuses, and the runtime
that runs the kernels (:mod:`fusegrad.runtime.native_attention`) before it calls one; the
limits sit here, below both, so that neither imports the other.
"""

from __future__ import annotations

import numpy as np

__all__ = ["supported", "MAX_KEYS", "MAX_FEATURES", "MAX_TILE", "DTYPES"]

MAX_KEYS = 128          # a row of scores is one vector of S lanes: 16 AVX2 registers at most
MAX_FEATURES = 128
MAX_TILE = 8192         # S * E: a stack tile of K or V transposed is at most 64 KiB
DTYPES = frozenset({np.dtype(np.float32), np.dtype(np.float64)})


def supported(dtype, L: int, S: int, E: int) -> bool:
    """Whether heads of ``L`` queries, ``S`` keys and ``E`` features of ``dtype`` run natively."""
    return (np.dtype(dtype) in DTYPES and 1 <= L and 1 <= S <= MAX_KEYS and
            1 <= E <= MAX_FEATURES and S * E <= MAX_TILE)
