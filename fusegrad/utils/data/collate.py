"""``default_collate`` and ``default_convert`` (torch.utils.data._utils.collate): how a list
of samples becomes a batch.

Tensors are stacked along a new first dimension; numpy arrays become tensors and are
stacked; Python floats become a float64 tensor; ints and bools a tensor of the dtype
inferred from the whole batch (int64, bool, or float32 when a later sample is a float);
strings stay a list; dicts, named tuples, tuples and lists are collated field by field
(a tuple of fields becomes a list, as in torch).
"""

from __future__ import annotations

import collections.abc
import copy
import re
from typing import Any

import numpy as np

from fusegrad import dtypes
from fusegrad.ops import functional as F
from fusegrad.ops.creation import as_tensor, tensor
from fusegrad.tensor import Tensor

__all__ = ["default_collate", "default_convert"]

np_str_obj_array_pattern = re.compile(r"[SaUO]")

default_collate_err_msg_format = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; "
    "found {}")


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def default_convert(data: Any) -> Any:
    """Turn numpy arrays and numpy scalars in ``data`` into tensors, recursively through
    dicts and sequences, without batching (what a DataLoader with ``batch_size=None``
    does)."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, (np.ndarray, np.generic)) and not isinstance(data, (np.str_, np.bytes_)):
        if isinstance(data, np.ndarray) and np_str_obj_array_pattern.search(data.dtype.str):
            return data
        return as_tensor(data)
    if isinstance(data, collections.abc.Mapping):
        converted = {key: default_convert(data[key]) for key in data}
        return _rebuild_mapping(data, converted)
    if _is_namedtuple(data):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        return _rebuild_sequence(data, [default_convert(d) for d in data])
    return data


def _rebuild_mapping(elem: collections.abc.Mapping, values: dict) -> Any:
    """A mapping of ``elem``'s type holding ``values`` (a plain dict when the type cannot be
    built from one)."""
    if isinstance(elem, collections.abc.MutableMapping):
        clone = copy.copy(elem)
        clone.update(values)
        return clone
    try:
        return type(elem)(values)  # type: ignore[call-arg]
    except TypeError:
        return values


def _rebuild_sequence(elem: collections.abc.Sequence, values: list) -> Any:
    try:
        if isinstance(elem, collections.abc.MutableSequence):
            clone = copy.copy(elem)
            for i, v in enumerate(values):
                clone[i] = v
            return clone
        return type(elem)(values)  # type: ignore[call-arg]
    except TypeError:
        # The sequence type may not support copy() / __setitem__ or building from a list.
        return values


def default_collate(batch: list) -> Any:
    """Merge a list of samples into a batch, as torch's ``default_collate``.

    >>> default_collate([(1, 2.0), (3, 4.0)])
    [tensor([1, 3]), tensor([2., 4.], dtype=fusegrad.float64)]
    """
    elem = batch[0]
    if isinstance(elem, Tensor):
        return F.stack(list(batch), 0)
    if isinstance(elem, np.ndarray) and not isinstance(elem, np.str_):
        if np_str_obj_array_pattern.search(elem.dtype.str) is not None:
            raise TypeError(default_collate_err_msg_format.format(elem.dtype))
        return default_collate([as_tensor(b) for b in batch])
    if isinstance(elem, np.generic) and not isinstance(elem, (np.str_, np.bytes_)):
        return as_tensor(np.array(batch))
    if isinstance(elem, float):
        return tensor(batch, dtype=dtypes.float64)
    if isinstance(elem, int):
        # dtype inferred from all samples, as torch.tensor(batch): [1, 2.5] is float32,
        # [True, 2] int64 (a dtype fixed by the first sample would truncate the others).
        return tensor(batch)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        return _rebuild_mapping(elem, {key: default_collate([d[key] for d in batch])
                                       for key in elem})
    if _is_namedtuple(elem):
        return type(elem)(*(default_collate(samples) for samples in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        size = len(elem)
        if not all(len(e) == size for e in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        transposed = list(zip(*batch))
        # each field as the tuple zip gives (strings stay a tuple, as torch returns them)
        collated = [default_collate(samples) for samples in transposed]
        if isinstance(elem, tuple):
            return collated
        return _rebuild_sequence(elem, collated)
    raise TypeError(default_collate_err_msg_format.format(type(elem)))
