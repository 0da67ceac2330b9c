"""The one list of fusegrad's public op names.

Each public op is recorded once, where it is defined, with where torch has it::

    @public(torch=True, method=True, inplace=True)
    def exp(x): ...

``torch=True``: a function of the top-level namespace (``fusegrad.exp``); ``method=True``: a
``Tensor`` method that is the function with the tensor first (``x.exp()``); ``inplace=True``:
also the ``x.exp_()`` variant, computed out of place and written back. :mod:`fusegrad` and
:mod:`fusegrad.ops.methods` install what this registry holds, so a new op is one decorator.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Callable

from fusegrad.ops.autocast import autocast_op


@dataclass(frozen=True)
class PublicOp:
    """One public name and the places it is installed."""

    name: str
    fn: Callable
    torch: bool
    method: bool
    inplace: bool


PUBLIC_OPS: dict[str, PublicOp] = {}


def public(fn: Callable | None = None, *, name: str | None = None, torch: bool = False,
           method: bool = False, inplace: bool = False):
    """Record ``fn`` as a public op; usable as ``@public(...)`` or ``alias = public(fn, name=...)``.

    Returns ``fn``, or, when it takes a ``dim`` argument, ``fn`` accepting ``axis=`` as its
    alias (torch's argument parser accepts both names); an op of torch's autocast lists
    comes back wrapped by :func:`fusegrad.ops.autocast.autocast_op`. Recording a name twice is an error
    (one definition per name).
    """
    def record(f: Callable) -> Callable:
        key = name or f.__name__
        if key in PUBLIC_OPS:
            raise ValueError(f"public op {key!r} is recorded twice")
        f = autocast_op(accept_axis(f), name=key)
        PUBLIC_OPS[key] = PublicOp(key, f, torch, method, inplace)
        return f
    return record if fn is None else record(fn)


def accept_axis(fn: Callable) -> Callable:
    """``fn`` with ``axis=`` accepted for its ``dim`` argument (numpy's name, which torch
    accepts too); ``fn`` itself when it has no ``dim`` or already takes ``axis``."""
    if getattr(fn, "_accepts_axis", False):
        return fn
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn
    if "dim" not in params or "axis" in params:
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "axis" in kwargs:
            if "dim" in kwargs:
                raise TypeError(f"{fn.__name__}() got both 'dim' and its alias 'axis'")
            kwargs["dim"] = kwargs.pop("axis")
        return fn(*args, **kwargs)
    wrapper._accepts_axis = True
    return wrapper


def torch_functions() -> dict[str, Callable]:
    """Names of the top-level namespace (``fusegrad.name``) and their functions."""
    return {op.name: op.fn for op in PUBLIC_OPS.values() if op.torch}


def tensor_methods() -> dict[str, Callable]:
    """``Tensor`` methods that are the function with the tensor first."""
    return {op.name: op.fn for op in PUBLIC_OPS.values() if op.method}


def inplace_methods() -> dict[str, Callable]:
    """Ops that also have an ``op_`` in-place ``Tensor`` method."""
    return {op.name: op.fn for op in PUBLIC_OPS.values() if op.inplace}
