"""The generated GEMM's LLVM IR: :mod:`fusegrad.codegen.gemm`'s kernel-IR program printed
by the LLVM kernel printer (see there for the algorithm, the parameters and which products
it takes)."""

from __future__ import annotations

from fusegrad.codegen.gemm import LANES, MAX_A_BYTES, MAX_K, PANEL, PARAMS, TILE_ROWS, Gemm, fits, gemm_kernel
from fusegrad.codegen.llvm.kernel import module_text

__all__ = ["Gemm", "PARAMS", "fits", "emit_gemm", "LANES", "TILE_ROWS", "PANEL", "MAX_K",
           "MAX_A_BYTES"]


def emit_gemm(name: str) -> str:
    """LLVM IR of ``void name(i8** bufs, i64 start, i64 end)``, computing panels ``[start,
    end)`` of a product (:func:`fusegrad.codegen.gemm.gemm_kernel`)."""
    return module_text("gemm", [gemm_kernel(name)])
