"""``fusegrad.finfo`` and ``fusegrad.iinfo``: the numeric limits of a dtype, as torch gives them.

>>> fusegrad.finfo(fusegrad.bfloat16).eps
0.0078125
>>> fusegrad.iinfo(fusegrad.int8).min
-128
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from fusegrad import dtypes

__all__ = ["finfo", "iinfo"]


class finfo:  # noqa: N801 - torch.finfo
    """Limits of a floating-point dtype: ``bits``, ``eps``, ``max``, ``min``, ``tiny`` (=
    ``smallest_normal``), ``resolution`` and ``dtype`` (its name). Without an argument, the
    default dtype's."""

    def __init__(self, type=None) -> None:  # noqa: A002 - torch's parameter name
        dt = dtypes.get_default_dtype() if type is None else dtypes.as_dtype(type)
        dt = dtypes.to_real(dt)            # a complex type's limits are its parts' (torch's)
        if not dt.is_floating_point:
            raise TypeError("torch.finfo() requires a floating point input type. Use torch.iinfo "
                            "to handle 'torch.finfo'")
        # numpy knows float16/32/64; ml_dtypes supplies the same record for bfloat16.
        info = ml_dtypes.finfo(dt.np_dtype) if dt is dtypes.bfloat16 else np.finfo(dt.np_dtype)
        self.bits = int(info.bits)
        self.eps = float(info.eps)
        self.max = float(info.max)
        self.min = float(info.min)
        self.tiny = float(info.smallest_normal)
        self.smallest_normal = self.tiny
        # 10**-precision as a Python float (numpy rounds it to the dtype: 0.0010004 for f16).
        self.resolution = 10.0 ** -int(info.precision)
        self.dtype = dt.name

    def __eq__(self, other) -> bool:
        return isinstance(other, finfo) and other.dtype == self.dtype

    def __hash__(self) -> int:
        return hash(("finfo", self.dtype))

    def __repr__(self) -> str:
        return (f"finfo(resolution={self.resolution:g}, min={self.min:g}, max={self.max:g}, "
                f"eps={self.eps:g}, smallest_normal={self.tiny:g}, tiny={self.tiny:g}, "
                f"dtype={self.dtype})")


class iinfo:  # noqa: N801 - torch.iinfo
    """Limits of an integer dtype: ``bits``, ``max``, ``min`` and ``dtype`` (its name)."""

    def __init__(self, type) -> None:  # noqa: A002 - torch's parameter name
        dt = dtypes.as_dtype(type)
        if dt is dtypes.bool_:
            raise TypeError(f"{dt} is not supported by torch.iinfo")
        if dt.category != 1:
            raise TypeError("torch.iinfo() requires an integer input type. Use torch.finfo to "
                            "handle 'torch.iinfo'")
        info = np.iinfo(dt.np_dtype)
        self.bits = int(info.bits)
        self.max = int(info.max)
        self.min = int(info.min)
        self.dtype = dt.name

    def __eq__(self, other) -> bool:
        return isinstance(other, iinfo) and other.dtype == self.dtype

    def __hash__(self) -> int:
        return hash(("iinfo", self.dtype))

    def __repr__(self) -> str:
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype})"
