"""Primitives (the one definition of each op) and the public ops built on them.

Importing the package joins the tensor class to :func:`~fusegrad.ops.primitive.bind` (eager
results are made with ``Tensor._wrap``) and loads the tape that records eager autograd nodes.
"""

from fusegrad.ops import primitive
from fusegrad.tensor import Tensor

primitive.register_tensor_maker(Tensor._wrap)

from fusegrad.ops import (  # noqa: E402
    fused_attention,  # noqa: F401  (and the fused attention's)
    prims,  # noqa: F401  (registers the primitives)
    tape,  # noqa: F401  (records eager autograd nodes)
)
from fusegrad.ops.primitive import PRIMITIVES, Kind, Primitive, ShapeError, TensorType, bind  # noqa: E402

__all__ = ["PRIMITIVES", "Kind", "Primitive", "ShapeError", "TensorType", "bind"]
