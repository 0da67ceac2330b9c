"""torch.backends: switches for the backends' libraries. ``fusegrad.backends.cuda.matmul
.allow_tf32`` lets float32 matmuls on CUDA use TF32 tensor cores (cuBLASLt's
``CUBLAS_COMPUTE_32F_FAST_TF32``), as does :func:`set_float32_matmul_precision` ``("high")``;
the two are one setting, as in torch."""

from __future__ import annotations

import warnings

from fusegrad.backends import cuda
from fusegrad.config import config

__all__ = ["cuda", "set_float32_matmul_precision", "get_float32_matmul_precision"]

_PRECISIONS = ("highest", "high", "medium")


def set_float32_matmul_precision(precision: str) -> None:
    """torch.set_float32_matmul_precision: ``"highest"`` computes float32 matmuls in
    float32; ``"high"`` and ``"medium"`` let them use TF32 (10-bit mantissas, float32
    accumulation) where the device has it. Another value warns and changes nothing, as in
    torch."""
    if precision not in _PRECISIONS:
        warnings.warn(f"{precision} is not one of 'highest', 'high', or 'medium'; the current"
                      f"setFloat32MatmulPrecision call has no effect.", UserWarning, stacklevel=2)
        return
    config.float32_matmul_precision = precision


def get_float32_matmul_precision() -> str:
    """torch.get_float32_matmul_precision: ``"highest"`` unless set otherwise."""
    return config.float32_matmul_precision
