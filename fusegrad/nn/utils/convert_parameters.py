"""One flat vector from many parameters and back (``torch.nn.utils.parameters_to_vector``)."""

from __future__ import annotations

from typing import Iterable

from fusegrad.autograd.grad_mode import no_grad
from fusegrad.ops import functional as F
from fusegrad.tensor import Tensor

__all__ = ["parameters_to_vector", "vector_to_parameters"]


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """The parameters flattened and concatenated in order into one 1-D tensor (a copy that
    is differentiable with respect to them)."""
    return F.cat([F.reshape(p, (-1,)) for p in parameters])


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Copy consecutive slices of the 1-D ``vec`` into ``parameters`` (their ``.data`` is
    replaced, as torch does, so the parameters stay leaves)."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected torch.Tensor, but got: {type(vec).__name__}")
    if vec.ndim != 1:
        raise RuntimeError(f"expected a 1-D vector, got shape {list(vec.shape)}")
    params = list(parameters)
    total = sum(p.numel() for p in params)
    if total != vec.numel():
        raise RuntimeError(f"vector_to_parameters: the vector has {vec.numel()} elements but the "
                           f"parameters have {total}")
    pointer = 0
    with no_grad():
        for p in params:
            n = p.numel()
            p.data = F.reshape(vec[pointer:pointer + n], tuple(p.shape)).to(p.dtype)
            pointer += n
