"""``fusegrad.autocast``: regions where listed ops run in a lower precision (torch.autocast).

::

    with fusegrad.autocast("cpu"):          # bfloat16 on the cpu, float16 on cuda
        loss = loss_fn(model(x), y)         # linear/conv/matmul in bfloat16, losses in float32
    loss.backward()                         # each op's backward in its forward's dtype

Which ops run in which dtype is :data:`fusegrad.ops.autocast.POLICIES` (torch 2.13's lists).
The settings are per thread, as torch's.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

from fusegrad import dtypes
from fusegrad.device import device
from fusegrad.ops import autocast as _ac
from fusegrad.tensor import Tensor

__all__ = ["autocast", "is_autocast_available", "custom_fwd", "custom_bwd"]

_SUPPORTED = ("cpu", "cuda")


def _check_device(device_type: str) -> str:
    """``device_type`` when it names a device fusegrad has; torch's errors otherwise."""
    device(device_type)         # a malformed string raises torch's RuntimeError
    if device_type not in _SUPPORTED:
        raise RuntimeError(f"User specified an unsupported autocast device_type '{device_type}'")
    return device_type


def is_autocast_available(device_type: str) -> bool:
    """Whether autocast is available for ``device_type`` (``"cpu"`` and ``"cuda"``)."""
    return device_type in _SUPPORTED


def is_autocast_enabled(device_type: str | None = None) -> bool:
    """Whether this thread's autocast is on for ``device_type`` (cuda's when None, as torch)."""
    return _ac.STATE.enabled[_check_device("cuda" if device_type is None else device_type)]


def set_autocast_enabled(device_type, enabled: bool | None = None) -> None:
    """Turn this thread's autocast for ``device_type`` on or off; ``set_autocast_enabled(flag)``
    is cuda's (torch's older form)."""
    if enabled is None:
        if not isinstance(device_type, bool):
            raise TypeError("set_autocast_enabled(): argument 'enabled' (position 1) must be bool, "
                            f"not {type(device_type).__name__}")
        device_type, enabled = "cuda", device_type
    if not isinstance(enabled, bool):
        raise TypeError("set_autocast_enabled(): argument 'enabled' (position 2) must be bool, "
                        f"not {type(enabled).__name__}")
    _ac.set_enabled(_check_device(device_type), enabled)


def get_autocast_dtype(device_type: str) -> dtypes.DType:
    """The lower-precision dtype of ``device_type``'s autocast on this thread."""
    return _ac.STATE.dtype[_check_device(device_type)]


def set_autocast_dtype(device_type: str, dtype: dtypes.DType) -> None:
    _ac.STATE.dtype[_check_device(device_type)] = dtype


def is_autocast_cache_enabled() -> bool:
    """Whether casts of leaves that require grad are kept for the rest of the region."""
    return _ac.STATE.cache_enabled


def set_autocast_cache_enabled(enabled: bool) -> None:
    _ac.STATE.cache_enabled = bool(enabled)


def clear_autocast_cache() -> None:
    """Drop this thread's cached casts (the outermost region's exit does it)."""
    _ac.STATE.cache.clear()


def autocast_increment_nesting() -> int:
    _ac.STATE.nesting += 1
    return _ac.STATE.nesting


def autocast_decrement_nesting() -> int:
    _ac.STATE.nesting -= 1
    return _ac.STATE.nesting


def _deprecated(old: str, new: str, fn: Callable) -> Callable:
    """torch's deprecated per-device spellings (``is_autocast_cpu_enabled``)."""
    @functools.wraps(fn)
    def wrapper(*args):
        warnings.warn(f"torch.{old}() is deprecated. Please use torch.{new} instead.",
                      DeprecationWarning, stacklevel=2)
        return fn(*args)
    wrapper.__name__ = old
    return wrapper


is_autocast_cpu_enabled = _deprecated("is_autocast_cpu_enabled", "is_autocast_enabled('cpu')",
                                      lambda: is_autocast_enabled("cpu"))
set_autocast_cpu_enabled = _deprecated("set_autocast_cpu_enabled",
                                       "set_autocast_enabled('cpu', enabled)",
                                       lambda enabled: set_autocast_enabled("cpu", enabled))
get_autocast_cpu_dtype = _deprecated("get_autocast_cpu_dtype", "get_autocast_dtype('cpu')",
                                     lambda: get_autocast_dtype("cpu"))
set_autocast_cpu_dtype = _deprecated("set_autocast_cpu_dtype", "set_autocast_dtype('cpu', dtype)",
                                     lambda dtype: set_autocast_dtype("cpu", dtype))
get_autocast_gpu_dtype = _deprecated("get_autocast_gpu_dtype", "get_autocast_dtype('cuda')",
                                     lambda: get_autocast_dtype("cuda"))
set_autocast_gpu_dtype = _deprecated("set_autocast_gpu_dtype", "set_autocast_dtype('cuda', dtype)",
                                     lambda dtype: set_autocast_dtype("cuda", dtype))


class autocast:  # noqa: N801 - torch's name
    """Run the ops of torch's autocast lists in ``dtype`` (or float32, or their widest input
    type) inside the region; a context manager and a decorator.

    ``dtype`` defaults to the device's autocast dtype (bfloat16 on the cpu, float16 on cuda);
    ``enabled=False`` turns autocast off inside (a float32 island in an autocast region);
    ``cache_enabled`` keeps each parameter's cast for the rest of the outermost region.
    """

    def __init__(self, device_type: str, dtype: dtypes.DType | None = None, enabled: bool = True,
                 cache_enabled: bool | None = None):
        if not isinstance(device_type, str):
            raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
        self.fast_dtype = get_autocast_dtype(device_type) if dtype is None else dtype
        self.device = device_type
        if not is_autocast_available(device_type):
            raise RuntimeError(f"User specified an unsupported autocast device_type '{device_type}'")
        self._cache_enabled = is_autocast_cache_enabled() if cache_enabled is None else cache_enabled
        if enabled:
            if device_type == "cuda":
                from fusegrad.runtime import cuda as cuda_runtime  # optional: loads the CUDA runtime
                if not cuda_runtime.is_available():
                    warnings.warn("CUDA is not available or torch_xla is imported. Disabling autocast.",
                                  stacklevel=2)
                    enabled = False
            elif self.fast_dtype not in (dtypes.bfloat16, dtypes.float16):
                name = device_type.upper()
                warnings.warn(f"In {name} autocast, but the target dtype is not supported. Disabling "
                              f"autocast.\n{name} Autocast only supports dtypes of torch.bfloat16, "
                              "torch.float16 currently.", stacklevel=2)
                enabled = False
        self._enabled = enabled

    def __enter__(self):
        self.prev_cache_enabled = is_autocast_cache_enabled()
        self.prev = is_autocast_enabled(self.device)
        self.prev_fastdtype = get_autocast_dtype(self.device)
        set_autocast_enabled(self.device, bool(self._enabled))
        set_autocast_dtype(self.device, self.fast_dtype)
        autocast_increment_nesting()
        set_autocast_cache_enabled(self._cache_enabled)
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> bool:
        # Drop the cache on leaving the outermost region.
        if autocast_decrement_nesting() == 0:
            clear_autocast_cache()
        set_autocast_enabled(self.device, self.prev)
        set_autocast_dtype(self.device, self.prev_fastdtype)
        set_autocast_cache_enabled(self.prev_cache_enabled)
        return False

    def __call__(self, func: Callable) -> Callable:
        if not callable(func):
            raise TypeError(
                f"autocast()(func) requires a callable, but got {type(func).__name__}. "
                "Did you mean to use autocast as a context manager? For example:\n"
                "    with torch.autocast(device_type=...):\n"
                "        output = model(input)")

        @functools.wraps(func)
        def decorate_autocast(*args, **kwargs):
            with self:
                return func(*args, **kwargs)
        return decorate_autocast


def _cast(value, device_type: str, dtype: dtypes.DType):
    """Floating tensors of ``value`` (nested in lists, tuples and dicts) cast to ``dtype``."""
    if isinstance(value, Tensor):
        is_eligible = value.is_floating_point() and value.device.type == device_type \
            and value.dtype != dtypes.float64
        return value.to(dtype) if is_eligible else value
    if isinstance(value, dict):
        return {_cast(k, device_type, dtype): _cast(v, device_type, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out = (_cast(v, device_type, dtype) for v in value)
        return list(out) if isinstance(value, list) else tuple(out)
    return value


def custom_fwd(fwd: Callable | None = None, *, device_type: str, cast_inputs: dtypes.DType | None = None):
    """Decorate a custom autograd Function's ``forward``: with ``cast_inputs``, run it with
    autocast off and its floating inputs cast to ``cast_inputs`` when autocast is on;
    without, under the autocast state it was called with (torch.amp.custom_fwd)."""
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)

    @functools.wraps(fwd)
    def decorate_fwd(*args, **kwargs):
        args[0]._dtype = get_autocast_dtype(device_type)
        if cast_inputs is None:
            args[0]._fwd_used_autocast = is_autocast_enabled(device_type)
            return fwd(*args, **kwargs)
        autocast_context = is_autocast_enabled(device_type)
        args[0]._fwd_used_autocast = False
        if autocast_context:
            with autocast(device_type=device_type, enabled=False):
                return fwd(*_cast(args, device_type, cast_inputs),
                           **_cast(kwargs, device_type, cast_inputs))
        return fwd(*args, **kwargs)
    return decorate_fwd


def custom_bwd(bwd: Callable | None = None, *, device_type: str):
    """Decorate a custom autograd Function's ``backward``: it runs under the autocast state
    its forward ran under (torch.amp.custom_bwd)."""
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)

    @functools.wraps(bwd)
    def decorate_bwd(*args, **kwargs):
        with autocast(device_type=device_type, enabled=args[0]._fwd_used_autocast,
                      dtype=args[0]._dtype):
            return bwd(*args, **kwargs)
    return decorate_bwd
