"""The primitive set: each primitive's shape/dtype rule, numpy reference and VJP, in one place.

Elementwise primitives broadcast their operands (numpy's rules) and require equal dtypes:
promotion and casts belong to the public ops in :mod:`fusegrad.ops.functional`, so the IR
only ever sees explicit casts. VJP rules use tensor methods, so one rule serves eager
autograd (on concrete tensors) and the autodiff pass (on traced ones).

The definitions live in one module per kind (``prims_elementwise``, ``prims_reduce``,
``prims_movement``, ``prims_index``, ``prims_sources``, ``prims_extern``; shared checks in
``prims_common``); this module gathers them, so that ``P.add`` names every primitive.

Adding a primitive: give it a rule, an impl and (if differentiable) a VJP in the module of
its kind, then a lowering in codegen. Nothing else needs to know about it.
"""

from fusegrad.ops.prims_common import (  # noqa: F401
    broadcast_shapes,
)
from fusegrad.ops.prims_elementwise import (  # noqa: F401
    _BLOCK,
    abs_,
    acos,
    acosh,
    add,
    asin,
    asinh,
    atan,
    atan2,
    atanh,
    bitwise_and,
    bitwise_or,
    bitwise_xor,
    cast,
    ceil,
    copy,
    cos,
    cosh,
    div,
    eq,
    erf,
    exp,
    exp2,
    expm1,
    float_to_int_wide,
    floor,
    floordiv,
    fmod,
    le,
    log,
    log1p,
    log2,
    log10,
    logical_and,
    logical_not,
    logical_or,
    lt,
    maximum,
    minimum,
    mul,
    ne,
    neg,
    pow_,
    reciprocal,
    remainder,
    round_,
    shift_left,
    shift_right,
    sign,
    sin,
    sinh,
    sqrt,
    stop_gradient,
    sub,
    tan,
    tanh,
    where,
)
from fusegrad.ops.prims_extern import (  # noqa: F401
    CUSTOM_VJP_READS,
    CUSTOM_VJP_RECOMPUTES,
    CUSTOM_VJPS,
    argsort,
    complex_,
    conj,
    cumsum,
    custom_vjp,
    imag,
    real,
    register_vjp,
    view_as_complex,
    view_as_real,
)
from fusegrad.ops.prims_index import (  # noqa: F401
    SCATTER_REDUCTIONS,
    _bounds,
    _index_add_impl,
    bitcast,
    check_index,
    check_target,
    gather,
    index_add,
    register_index_add_rows,
    scatter_add,
    scatter_reduce,
    take,
)
from fusegrad.ops.prims_movement import (  # noqa: F401
    broadcast_to,
    concat,
    pad,
    permute,
    reshape,
    slice_,
)
from fusegrad.ops.prims_reduce import (  # noqa: F401
    _keepdim_shape,
    argmax,
    argmin,
    matmul,
    matmul_dtype_message,
    max_,
    min_,
    prod,
    sum_,
)
from fusegrad.ops.prims_sources import (  # noqa: F401
    constant,
    full,
    iota,
    random_uniform,
)
from fusegrad.tensor_type import normalize_axis  # noqa: F401
