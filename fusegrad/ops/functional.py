"""Public tensor ops: PyTorch's API, built from the primitives in :mod:`fusegrad.ops.prims`.

The ops live in one module per kind; this module gathers them, so that ``F.exp``,
``F.reshape``, ``F.assign_`` ... keep one import for the rest of the package:

- :mod:`~fusegrad.ops.composite`: one eager autograd node for an op made of several primitives;
- :mod:`~fusegrad.ops.operands`: scalars to tensors, torch's promotion, casts;
- :mod:`~fusegrad.ops.elementwise`, :mod:`~fusegrad.ops.reductions`,
  :mod:`~fusegrad.ops.movement`, :mod:`~fusegrad.ops.matmul`, :mod:`~fusegrad.ops.indexing`,
  :mod:`~fusegrad.ops.inplace`, :mod:`~fusegrad.ops.factories`: the ops themselves;
- :mod:`~fusegrad.ops.registry`: which names are public, and where (``fusegrad.f``,
  ``Tensor.f``, ``Tensor.f_``); :mod:`fusegrad` and :mod:`fusegrad.ops.methods` install them.

Each function promotes dtypes, broadcasts, normalizes dims and checks arguments the way
torch does, then binds primitives. Compositions of several primitives are wrapped by
:func:`composite`, so that in eager mode they appear as the one autograd node PyTorch shows
(``MeanBackward0``), while the tracer sees the primitives (fusion sees through them).
"""

# ruff: noqa: F401, F403
from fusegrad.ops.blas import *
from fusegrad.ops.complex import *
from fusegrad.ops.composite import *
from fusegrad.ops.composite import _named
from fusegrad.ops.convolution import *
from fusegrad.ops.decompositions import *
from fusegrad.ops.elementwise import *
from fusegrad.ops.factories import *
from fusegrad.ops.indexing import *
from fusegrad.ops.inplace import *
from fusegrad.ops.inplace import _check_inplace, _inplace, _rebase_history
from fusegrad.ops.matmul import *
from fusegrad.ops.movement import *
from fusegrad.ops.movement import _mark_view
from fusegrad.ops.normalization import *
from fusegrad.ops.operands import *
from fusegrad.ops.operands import (
    _at_user_line,
    _dims,
    _dtype_title,
    _float_dtype,
    _index_tensor,
    _is_scalar,
    _promote,
    _scalar_tensor,
)
from fusegrad.ops.pointwise import *
from fusegrad.ops.pooling import *
from fusegrad.ops.products import *
from fusegrad.ops.reductions import *
from fusegrad.ops.sampling import *
from fusegrad.ops.scatter import *
from fusegrad.ops.slicing import *
from fusegrad.ops.special import *
from fusegrad.ops.statistics import *
from fusegrad.ops.trig import *
