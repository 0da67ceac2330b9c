"""The generated GEMM's LLVM IR: :mod:`fusegrad.codegen.gemm`'s kernel-IR program printed
by the LLVM kernel printer (see there for the algorithm, the parameters and which products
it takes)."""

from __future__ import annotations

from fusegrad import dtypes
from fusegrad.codegen.gemm import LANES, MAX_A_BYTES, MAX_K, PANEL, PARAMS, TILE_ROWS, Gemm, fits, gemm_kernel
from fusegrad.codegen.llvm.kernel import module_text
from fusegrad.dtypes import DType

__all__ = ["Gemm", "PARAMS", "fits", "emit_gemm", "LANES", "TILE_ROWS", "PANEL", "MAX_K",
           "MAX_A_BYTES"]


def emit_gemm(name: str, dtype: DType = dtypes.float32, bf16_pairs: bool = False) -> str:
    """LLVM IR of ``void name(i8** bufs, i64 start, i64 end)``, computing panels ``[start,
    end)`` of a product in ``dtype`` (:func:`fusegrad.codegen.gemm.gemm_kernel`; a bf16
    one with AVX512_BF16's ``vdpbf16ps`` when ``bf16_pairs``)."""
    return module_text("gemm", [gemm_kernel(name, dtype, bf16_pairs)])
