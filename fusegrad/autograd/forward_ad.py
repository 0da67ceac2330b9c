"""``fusegrad.autograd.forward_ad``: forward-mode AD with dual tensors, as
``torch.autograd.forward_ad``.

>>> import fusegrad.autograd.forward_ad as fwAD
>>> x = fusegrad.tensor([1., 2.])
>>> with fwAD.dual_level():
...     y = fwAD.make_dual(x, fusegrad.ones(2)).sin()
...     fwAD.unpack_dual(y).tangent      # cos(x)
tensor([0.5403, -0.4161])

A dual tensor is a view of its primal that carries a tangent; every op on it computes the
result's tangent by its primitives' JVP rules (:mod:`fusegrad.ops.dual`), eagerly or while
fusegrad.compile traces. As in torch, one level is live at a time.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from fusegrad.ops import dual
from fusegrad.ops.movement import alias as _alias
from fusegrad.tensor import Tensor

__all__ = ["UnpackedDualTensor", "enter_dual_level", "exit_dual_level", "make_dual",
           "unpack_dual", "dual_level"]

# The id (fusegrad.ops.dual) of the live level this API made; torch numbers it 0.
_level: int | None = None


def enter_dual_level() -> int:
    """Enter a forward-mode level; returns its index (0). Only one may be live."""
    global _level
    if _level is not None:
        raise RuntimeError("Nested forward mode AD is not supported at the moment")
    _level = dual.enter_level()
    return 0


def exit_dual_level(*, level: int | None = None) -> None:
    """Exit the live forward-mode level: tangents set at it are no longer seen."""
    global _level
    current = -1 if _level is None else 0
    if level is None:
        level = current
    if level < 0:
        raise RuntimeError("Dual level must be a positive number.")
    if level != current:
        raise RuntimeError("Trying to exit a forward AD level that was not the last one that "
                           "was created. This is not supported.")
    dual.exit_level(_level)
    _level = None


def _level_id(level: int | None, op: str) -> int | None:
    if level is None or (level == 0 and _level is not None):
        return _level
    raise RuntimeError(f"Invalid level given to {op}")


def make_dual(tensor: Tensor, tangent: Tensor, *, level: int | None = None) -> Tensor:
    """A view of ``tensor`` that carries ``tangent`` (its direction of differentiation).

    ``tangent`` has the shape of ``tensor`` and is used as it is (cast to its dtype)."""
    if level is None and _level is None:
        raise RuntimeError("Trying to create a dual Tensor for forward AD but no level exists, "
                           "make sure to enter_dual_level() first.")
    lid = _level_id(level, "_make_dual")
    if not tensor.dtype.is_differentiable:
        raise ValueError(f"Expected primal to be floating point or complex, but got: "
                         f"{tensor.dtype}")
    if not tangent.dtype.is_differentiable:
        raise ValueError(f"Expected tangent to be floating point or complex, but got: "
                         f"{tangent.dtype}")
    if tuple(tangent.shape) != tuple(tensor.shape):
        raise RuntimeError(f"Trying to set a forward gradient that has a different size than "
                           f"that of the original Tensor, this is not supported. Tensor is of "
                           f"size {list(tensor.shape)} while the given forward gradient is of "
                           f"size {list(tangent.shape)}.")
    if tangent.dtype is not tensor.dtype:
        tangent = tangent.to(tensor.dtype)
    with dual.hidden(lid):
        out = _alias(tensor)
    dual.set_tangent(out, lid, tangent)
    return out


class UnpackedDualTensor(NamedTuple):
    """What :func:`unpack_dual` returns: the primal (a view without the tangent) and the
    tangent (None when the tensor has none)."""

    primal: Tensor
    tangent: Tensor | None


def unpack_dual(tensor: Tensor, *, level: int | None = None) -> UnpackedDualTensor:
    """``(primal, tangent)`` of ``tensor`` at the live level; ``(tensor, None)`` when no level
    is live."""
    if level is None and _level is None:
        return UnpackedDualTensor(tensor, None)
    lid = _level_id(level, "_unpack_dual")
    dual.refresh_view_tangents(tensor)
    tangent = dual.get_tangent(tensor, lid)
    if tangent is None:
        return UnpackedDualTensor(tensor, None)
    with dual.hidden(lid):
        primal = _alias(tensor)
    primal._fw_version = dual.PRIMAL_ONLY
    return UnpackedDualTensor(primal, tangent)


class dual_level:  # noqa: N801  (torch's name)
    """Context manager (and decorator) for a forward-mode level: ``with dual_level():``
    enters one, and exits it on leaving. Dual tensors made inside lose their tangents
    after."""

    def __enter__(self) -> int:
        return enter_dual_level()

    def __exit__(self, *exc) -> None:
        exit_dual_level()

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)
        return wrapper
