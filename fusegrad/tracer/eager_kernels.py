"""Eager composite ops run as the fused kernels ``fusegrad.compile`` makes of them.

A composite op (``gelu``, ``softmax``, ``layer_norm``, ``cross_entropy``, ``linear``,
``conv2d``, ``max_pool2d``...) runs eagerly as a chain of primitives: a numpy pass over the
whole tensor and an autograd node each, forward and backward. GELU of a 512x256 float32
tensor, forward and backward, costs 4.7 ms that way and 0.85 ms as the compiled function of the
same definition. So a composite made with
``composite(name, kernel=True)``, called eagerly on CPU tensors whose floating ones are
float32 and of which one has at least ``config.eager_kernel_threshold`` elements
(``FUSEGRAD_EAGER_KERNELS``; 0 turns this off), runs through a compiled function of its own
definition:

- the forward is one program of fused kernels; under grad it saves what the backward needs
  (the min-cut partition of ``fusegrad.compile``), and the backward is one compiled program;
  with ``create_graph=True`` the reverse graph is replayed eagerly, so higher-order
  gradients work;
- the output's ``grad_fn`` has the composite's torch name (``GeluBackward0``);
- values are the kernels' (the CPU math library's accuracy, as a compiled function's), not
  the numpy references', which round float32 transcendentals through float64.

Each signature (shapes, which tensors require grad, the non-tensor arguments) compiles once
per process, from the disk cache after the first run. A signature whose trace or run raises
runs eagerly from then on, so a user's mistake gets the eager op's own error; a composite
keeps at most ``SIGNATURE_LIMIT`` compiled signatures, dropping the oldest.
"""

from __future__ import annotations

import traceback

import numpy as np

from fusegrad import dtypes
from fusegrad.config import config
from fusegrad.ops import primitive as _primitive
from fusegrad.ops.composite import register_eager_kernel_maker
from fusegrad.tensor import Tensor
from fusegrad.tracer.compile import CompiledFunction
from fusegrad.tracer.guards import ClosureGuard

__all__ = ["EagerKernel", "SIGNATURE_LIMIT"]

SIGNATURE_LIMIT = 64          # compiled signatures per composite and non-tensor arguments


class _Bound:
    """A composite's definition with its non-tensor arguments fixed: called with its tensor
    arguments alone, in order."""

    __slots__ = ("definition", "layout", "static_kwargs", "__name__")

    def __init__(self, fn, layout: tuple, kwargs: dict):
        # No __dict__: functools.update_wrapper would copy it onto the compiled function.
        self.definition, self.layout, self.static_kwargs = fn, layout, kwargs
        self.__name__ = getattr(fn, "__name__", "composite").lstrip("_")

    def __call__(self, *tensors):
        args = [tensors[v] if is_tensor else v for is_tensor, v in self.layout]
        return self.definition(*args, **self.static_kwargs)


class _KernelFunction(CompiledFunction):
    """The compiled function of one composite with fixed non-tensor arguments."""

    def __init__(self, bound: _Bound, grad_name: str):
        # Static shapes: a signature's kernels are its own, whatever automatic dynamic
        # shapes says when it is first called (a symbolic program sums rows in other blocks).
        super().__init__(bound, fullgraph=True, dynamic=False)
        self.grad_name = grad_name
        self.failed: set = set()
        self.seen: set = set()           # signatures called

    def _closure_guard(self, args, kwargs) -> ClosureGuard:
        # fusegrad's own definitions: nothing they read changes between calls.
        return ClosureGuard()

    def _recompile_limit(self) -> int:
        return 1 << 30                   # never eager: EagerKernel bounds the compiles


def _static(v):
    """``v`` as part of a dict key, with its type (``1``, ``1.0`` and ``True`` are equal keys
    but may trace differently; a list is keyed by its items); TypeError if it cannot be one."""
    if isinstance(v, (list, tuple)):
        if all(type(x) is int for x in v):          # sizes, strides, axes: the common case
            return (type(v), int, tuple(v))
        return (type(v), tuple(_static(x) for x in v))
    if isinstance(v, Tensor):        # inside a container: not a constant of the kernel
        raise TypeError("a tensor is not a static argument")
    hash(v)
    return (type(v), v)


class EagerKernel:
    """Runs one composite's eager calls through compiled functions of its definition."""

    def __init__(self, fn, grad_name: str):
        self.fn, self.grad_name = fn, grad_name
        self.functions: dict = {}

    def __call__(self, args: tuple, kwargs: dict):
        """The composite's result, or NotImplemented when this call runs eagerly."""
        threshold = config.eager_kernel_threshold
        if threshold <= 0:
            return NotImplemented
        if _primitive.compiling():
            return NotImplemented
        tensors, layout, big = [], [], False
        for a in args:
            if isinstance(a, Tensor):
                if a._trace is not None:
                    return NotImplemented
                d = a._data
                if type(d) is not np.ndarray or (
                        a._dtype.is_floating_point and a._dtype is not dtypes.float32):
                    return NotImplemented
                big = big or d.size >= threshold
                layout.append((True, len(tensors)))
                tensors.append(a)
            else:
                layout.append((False, a))
        if not big or any(isinstance(v, Tensor) for v in kwargs.values()):
            return NotImplemented
        try:
            # a tensor argument must not share a key with a None (layer_norm with and
            # without its weight)
            key = (tuple((is_tensor, v if is_tensor else _static(v)) for is_tensor, v in layout),
                   tuple(sorted((k, _static(v)) for k, v in kwargs.items())))
        except TypeError:
            return NotImplemented
        signature = tuple((t._data.shape, t._dtype, t._requires_grad, t._data.flags.c_contiguous)
                          for t in tensors)
        cf = self.functions.get(key)
        # Past SIGNATURE_LIMIT the oldest compiled functions are dropped and the new call is
        # compiled, never run unfused: a call's bits depend on its op and shapes alone, not
        # on what the process ran before (the fused and unfused chains round differently).
        if cf is not None and signature not in cf.seen and cf.compiles >= SIGNATURE_LIMIT:
            del self.functions[key]
            cf = None
        if cf is None:
            if len(self.functions) >= SIGNATURE_LIMIT:
                del self.functions[next(iter(self.functions))]
            cf = self.functions[key] = _KernelFunction(
                _Bound(self.fn, tuple(layout), dict(kwargs)), self.grad_name)
        if signature in cf.failed:
            return NotImplemented
        try:
            out = cf(*tensors)
            cf.seen.add(signature)
            return out
        except Exception:        # noqa: BLE001 - the eager op raises the user's error
            if config.debug:
                traceback.print_exc()
            cf.failed.add(signature)
            return NotImplemented


register_eager_kernel_maker(EagerKernel)
