"""Primitives (the one definition of each op) and the public ops built on them."""

from fusegrad.ops import (
    fused_attention,  # noqa: F401  (and the fused attention's)
    prims,  # noqa: F401  (registers the primitives)
)
from fusegrad.ops.primitive import PRIMITIVES, Kind, Primitive, ShapeError, TensorType, bind

__all__ = ["PRIMITIVES", "Kind", "Primitive", "ShapeError", "TensorType", "bind"]
