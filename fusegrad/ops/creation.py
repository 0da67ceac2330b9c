"""Tensor factories and random numbers, with torch's signatures and dtype inference.

Random numbers come from a counter-based generator (:mod:`fusegrad.ops.philox`): a
:class:`Generator` is a seed and an offset, and each request takes the next counters. The
numbers are a function of (seed, offset, index) only, so traced code draws the same ones.
"""

from __future__ import annotations

import functools
import math
import secrets
import threading

import numpy as np

from fusegrad import dtypes
from fusegrad.device import CPU, check_device_available
from fusegrad.device import device as Device
from fusegrad.dlpack import KDL_BFLOAT, import_capsule
from fusegrad.grad_mode import no_grad
from fusegrad.ops import philox, primitive
from fusegrad.ops import prims as P
from fusegrad.ops.primitive import bind, note_created
from fusegrad.symint import SymbolicDecisionError, SymInt, as_size, ceil_div
from fusegrad.tensor import Size, Tensor, register_handler

__all__ = [
    "tensor", "as_tensor", "from_numpy", "zeros", "ones", "full", "empty", "eye", "arange",
    "linspace", "rand", "randn", "randint", "randperm", "normal", "zeros_like", "ones_like",
    "full_like", "empty_like", "rand_like", "randn_like", "randint_like", "manual_seed",
    "seed", "initial_seed", "Generator", "default_generator", "get_rng_state", "set_rng_state",
    "from_dlpack", "scalar_tensor",
]


# --------------------------------------------------------------------------- conversion


def _check_device(device) -> None:
    if device is not None:
        dev = Device(device)
        if dev != CPU:
            check_device_available(dev)


def _flatten_tensors(data):
    """Replace tensors nested in lists with their Python values (torch.tensor([t1, t2]))."""
    if isinstance(data, Tensor):
        return data.tolist()
    if isinstance(data, (list, tuple)):
        return [_flatten_tensors(d) for d in data]
    return data


def _array_from(data, dtype) -> tuple[np.ndarray, dtypes.DType]:
    """A fresh numpy array and its fusegrad dtype, inferred as torch.tensor does."""
    if isinstance(data, Tensor):
        data._check_concrete("tensor()")
        arr = np.array(data._data, copy=True)
        dt = data.dtype
    elif isinstance(data, (np.ndarray, np.generic)):
        # numpy arrays and numpy scalars (np.float64(2.5)) keep their dtype, as in torch
        arr = np.array(data, copy=True)
        dt = dtypes.from_numpy_dtype(arr.dtype)
    else:
        arr = np.array(_flatten_tensors(data))
        if arr.dtype.kind == "f":
            dt = dtypes.get_default_dtype()
        elif arr.dtype.kind in "iu":
            dt = dtypes.int64
        elif arr.dtype.kind == "b":
            dt = dtypes.bool_
        elif arr.dtype.kind == "c":
            dt = dtypes.default_complex_dtype()
        elif arr.dtype.kind == "O" or arr.dtype.kind in "US":
            raise TypeError(f"Could not infer dtype of {type(data).__name__} "
                            f"(got elements of numpy kind {arr.dtype.kind!r})")
        else:
            raise TypeError(f"unsupported data of type {type(data).__name__}")
        if arr.size == 0 and arr.dtype.kind == "f":
            dt = dtypes.get_default_dtype()
    if dtype is not None:
        dt = dtypes.as_dtype(dtype)
        if arr.dtype.kind == "c" and not dt.is_complex and not isinstance(data, (np.ndarray,
                                                                                 np.generic)):
            raise TypeError(f"must be real number, not complex (tensor() of complex values "
                            f"with dtype={dt})")
    if arr.dtype != dt.np_dtype:
        if dt is dtypes.bool_:
            arr = arr != 0
        else:
            arr = arr.astype(dt.np_dtype)
    return arr, dt


def tensor(data, *, dtype=None, device=None, requires_grad: bool = False,
           pin_memory: bool = False) -> Tensor:
    """A new tensor holding a copy of ``data`` (nested lists, numbers, arrays, tensors).

    >>> fusegrad.tensor([1., 2.])
    tensor([1., 2.])
    """
    _check_device(device)
    arr, dt = _array_from(data, dtype)
    t = Tensor._wrap(arr, dt)
    note_created(t)
    if requires_grad:
        t.requires_grad_(True)
    return t


def scalar_tensor(value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return tensor(value, dtype=dtype or dtypes.get_default_dtype(), device=device,
                  requires_grad=requires_grad)


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """Like :func:`tensor`, but shares memory with a tensor or array when the dtype allows."""
    _check_device(device)
    if isinstance(data, Tensor):
        return data if dtype is None else data.to(dtype)
    if isinstance(data, np.ndarray):
        dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.from_numpy_dtype(data.dtype)
        if data.dtype == dt.np_dtype:
            return Tensor._wrap(data, dt)
    return tensor(data, dtype=dtype)


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor that shares ``array``'s memory: writes to either show in both."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(array).__name__})")
    return Tensor._wrap(array, dtypes.from_numpy_dtype(array.dtype))


def from_dlpack(ext) -> Tensor:
    """Zero-copy import of any object with ``__dlpack__`` (numpy, torch, jax arrays)."""
    if isinstance(ext, Tensor):
        return ext
    try:
        arr = np.from_dlpack(ext)
    except (BufferError, RuntimeError) as numpy_error:
        # numpy has no bfloat16: read DLPack's kDLBfloat (code 4, 16 bits) by hand.
        if not hasattr(ext, "__dlpack__"):
            raise
        raw, code, bits = import_capsule(ext.__dlpack__())
        if (code, bits) != (KDL_BFLOAT, 16):
            raise BufferError(f"from_dlpack: unsupported DLPack type code {code} with {bits} "
                              f"bits ({numpy_error})") from None
        return Tensor._wrap(raw.view(dtypes.bfloat16.np_dtype), dtypes.bfloat16)
    return Tensor._wrap(arr, dtypes.from_numpy_dtype(arr.dtype))


# --------------------------------------------------------------------------- factories


def _shape(size, extra: dict | None = None) -> tuple[int, ...]:
    if extra and "size" in extra:
        # zeros(size=(2, 3)): the keyword form; other unknown keywords (layout, pin_memory,
        # memory_format) are accepted and ignored.
        if size:
            raise TypeError("got multiple values for argument 'size'")
        size = (extra["size"],)
    if len(size) == 1 and isinstance(size[0], (tuple, list, Size)):
        size = tuple(size[0])
    for d in size:
        if not isinstance(d, (int, np.integer, SymInt)) and not (
                isinstance(d, Tensor) and d.ndim == 0):
            raise TypeError(f"size must be a tuple of ints, but got {type(d).__name__}")
    shape = tuple(as_size(d) for d in size)
    for d in shape:
        if d < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {d}: {list(shape)}")
    return shape


def _source(prim, like: Tensor | None, **attrs) -> Tensor:
    """Apply a primitive with no operands; under a trace when ``like`` is traced."""
    if like is not None and like._trace is not None:
        return like._trace.process_primitive(prim, (), attrs)
    return bind(prim, **attrs)


def _created(t: Tensor) -> Tensor:
    note_created(t)
    return t


def _finish(t: Tensor, requires_grad: bool) -> Tensor:
    if requires_grad:
        t.requires_grad_(True)
    return t


def full(size, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of ``size`` filled with ``fill_value`` (dtype inferred from the value)."""
    _check_device(device)
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.result_type(fill_value)
    shape = _shape((size,)) if not isinstance(size, (int, np.integer)) else (int(size),)
    t = bind(P.full, shape=shape, value=_py_value(fill_value, dt), dtype=dt)
    return _finish(t, requires_grad)


def _py_value(v, dt: dtypes.DType):
    if isinstance(v, Tensor):
        v = v.item()
    if dt.is_floating_point:
        return float(v)
    if dt.is_complex:
        return complex(v)
    if dt is dtypes.bool_:
        return bool(v)
    return int(v)


def zeros(*size, dtype=None, device=None, requires_grad: bool = False, **_) -> Tensor:
    """A tensor of zeros (float32 unless ``dtype`` says otherwise)."""
    _check_device(device)
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.get_default_dtype()
    return _finish(bind(P.full, shape=_shape(size, _), value=_py_value(0, dt), dtype=dt),
                   requires_grad)


def ones(*size, dtype=None, device=None, requires_grad: bool = False, **_) -> Tensor:
    _check_device(device)
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.get_default_dtype()
    return _finish(bind(P.full, shape=_shape(size, _), value=_py_value(1, dt), dtype=dt),
                   requires_grad)


def empty(*size, dtype=None, device=None, requires_grad: bool = False, **_) -> Tensor:
    """Uninitialized in torch; zero-filled here, which is one valid uninitialized value."""
    return zeros(*_shape(size, _), dtype=dtype, device=device, requires_grad=requires_grad)


def full_like(x: Tensor, fill_value, *, dtype=None, device=None, requires_grad: bool = False,
              **_) -> Tensor:
    """Filled like ``x``: its shape, and its dtype and device unless given."""
    dt = dtypes.as_dtype(dtype) if dtype is not None else x.dtype
    t = _source(P.full, x, shape=tuple(x.shape), value=_py_value(fill_value, dt), dtype=dt)
    if device is not None or x._trace is None and not isinstance(x._data, np.ndarray):
        dev = Device(device) if device is not None else x.device
        if dev.type != "cpu":
            t = primitive.device_transfer(t, dev)
    return _finish(t, requires_grad)


def zeros_like(x: Tensor, *, dtype=None, device=None, requires_grad: bool = False, **_) -> Tensor:
    return full_like(x, 0, dtype=dtype, device=device, requires_grad=requires_grad)


def ones_like(x: Tensor, *, dtype=None, device=None, requires_grad: bool = False, **_) -> Tensor:
    return full_like(x, 1, dtype=dtype, device=device, requires_grad=requires_grad)


def empty_like(x: Tensor, *, dtype=None, device=None, requires_grad: bool = False, **_) -> Tensor:
    return zeros_like(x, dtype=dtype, device=device, requires_grad=requires_grad)


def _new_full(x: Tensor, size, value, dtype, requires_grad: bool) -> Tensor:
    dt = dtypes.as_dtype(dtype) if dtype is not None else x.dtype
    t = _source(P.full, x, shape=_shape(size), value=_py_value(value, dt), dtype=dt)
    dev = _device_of(x)
    if dev is not None:                  # x.new_zeros(...) is made where x is
        t = primitive.device_transfer(t, dev)
    return _finish(t, requires_grad)


def eye(n: int, m: int | None = None, *, dtype=None, device=None,
        requires_grad: bool = False) -> Tensor:
    _check_device(device)
    m = n if m is None else m
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.get_default_dtype()
    rows = bind(P.iota, shape=(n, m), axis=0, dtype=dtypes.int64)
    cols = bind(P.iota, shape=(n, m), axis=1, dtype=dtypes.int64)
    with no_grad():
        t = (rows == cols).to(dt)
    return _finish(t, requires_grad)


def arange(start=0, end=None, step=1, *, dtype=None, device=None,
           requires_grad: bool = False) -> Tensor:
    """``[start, end)`` by ``step``; int64 for integer arguments, else the default float."""
    _check_device(device)
    if end is None:
        start, end = 0, start
    vals = [v.item() if isinstance(v, Tensor) else v for v in (start, end, step)]
    start, end, step = vals
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if (end - start) * step < 0:
        raise RuntimeError(f"arange: upper bound and lower bound inconsistent with step sign "
                           f"(start={start}, end={end}, step={step})")
    is_int = all(isinstance(v, (int, np.integer, SymInt)) for v in vals)
    dt = dtypes.as_dtype(dtype) if dtype is not None else (
        dtypes.int64 if is_int else dtypes.get_default_dtype())
    if any(isinstance(v, SymInt) for v in vals):
        return _finish(_symbolic_arange(start, end, step, dt), requires_grad)
    n = max(0, math.ceil((end - start) / step))
    arr = (start + np.arange(n, dtype=np.float64 if not is_int else np.int64) * step)
    return _finish(_created(Tensor._wrap(arr.astype(dt.np_dtype), dt)), requires_grad)


def _symbolic_arange(start, end, step, dt) -> Tensor:
    """arange with a symbolic bound (``torch.arange(T)`` while tracing): an iota node of
    ``ceil((end - start) / step)`` elements."""
    if not all(isinstance(v, (int, SymInt)) for v in (start, end, step)) or isinstance(step, SymInt) \
            or step <= 0:
        raise SymbolicDecisionError(f"arange({start}, {end}, {step}): a symbolic bound needs "
                                    "integer arguments and a positive integer step")
    t = bind(P.iota, shape=(ceil_div(end - start, step),), axis=0, dtype=dtypes.int64)
    with no_grad():
        if step != 1:
            t = t * step
        if not (isinstance(start, int) and start == 0):
            t = t + start
        return t.to(dt)


def linspace(start, end, steps: int, *, dtype=None, device=None,
             requires_grad: bool = False) -> Tensor:
    _check_device(device)
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.get_default_dtype()
    arr = np.linspace(float(start), float(end), steps, dtype=np.float64)
    return _finish(_created(Tensor._wrap(arr.astype(dt.np_dtype), dt)), requires_grad)


def logspace(start, end, steps: int, base: float = 10.0, *, dtype=None, **kw) -> Tensor:
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.get_default_dtype()
    arr = np.power(base, np.linspace(float(start), float(end), steps))
    return _created(Tensor._wrap(arr.astype(dt.np_dtype), dt))


# --------------------------------------------------------------------------- random


class Generator:
    """A counter-based random generator: a seed and an offset (torch.Generator's API)."""

    def __init__(self, device="cpu"):
        self._seed = 67280421310721   # torch's default seed
        self._offset = 0

    def manual_seed(self, seed: int) -> "Generator":
        _refuse_rng_state("manual_seed()")
        seed = int(seed)
        if not -(1 << 63) <= seed < (1 << 64):
            raise ValueError(f"Overflow when unpacking long long: manual_seed takes a seed in "
                             f"[-2**63, 2**64 - 1], got {seed}")
        # Kept as torch reports it (an unsigned 64-bit seed: -1 is 2**64 - 1), and stored in
        # the int64 key as the same 64 bits.
        self._seed, self._offset = seed & 0xFFFFFFFFFFFFFFFF, 0
        return self

    def _key(self) -> np.ndarray:
        seed = self._seed - (1 << 64) if self._seed >= (1 << 63) else self._seed
        return np.array([seed, self._offset], dtype=np.int64)

    def seed(self) -> int:
        self.manual_seed(secrets.randbits(63))
        return self._seed

    def initial_seed(self) -> int:
        return self._seed

    def get_state(self) -> Tensor:
        _refuse_rng_state("get_state()")
        return Tensor._wrap(self._key(), dtypes.int64)

    def set_state(self, state: Tensor) -> None:
        _refuse_rng_state("set_state()")
        seed, self._offset = (int(v) for v in state._data[:2])
        self._seed = seed & 0xFFFFFFFFFFFFFFFF

    def next_key(self, count: int) -> Tensor:
        """The (seed, offset) key for ``count`` numbers, advancing the offset past them.

        While a function is being traced, the tracer installs a key source that returns the
        key as a graph value instead, so compiled code draws fresh numbers on every call.
        """
        source = primitive.key_source()
        if source is not None:
            return source(self, count)
        with _next_key_lock:        # threads drawing at once never share numbers
            key = self._key()
            self._offset += philox.counters_used(count)
        return Tensor._wrap(key, dtypes.int64)


def _refuse_rng_state(what: str) -> None:
    # A compiled function reads the generator's state at each call and advances it; setting
    # or reading it while tracing would happen once, at trace time.
    primitive.refuse_traced(f"the random generator's {what}")


default_generator = Generator()
# One for all generators (a lock per generator would keep them from being pickled); held for
# a few arithmetic operations.
_next_key_lock = threading.Lock()


def manual_seed(seed: int) -> Generator:
    """Seed the default generator; the same seed gives the same numbers."""
    return default_generator.manual_seed(seed)


def seed() -> int:
    return default_generator.seed()


def initial_seed() -> int:
    return default_generator.initial_seed()


def get_rng_state() -> Tensor:
    return default_generator.get_state()


def set_rng_state(state: Tensor) -> None:
    default_generator.set_state(state)


def _uniform01(shape: tuple[int, ...], dt: dtypes.DType, generator: Generator | None) -> Tensor:
    gen = generator or default_generator
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    key = gen.next_key(n * philox.words_per_number(dt.np_dtype))
    return bind(P.random_uniform, key, shape=shape, dtype=dt)


def _float_dt(dtype) -> dtypes.DType:
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.get_default_dtype()
    if not dt.is_floating_point:
        raise RuntimeError(f'"check_uniform_bounds" not implemented for \'{dt.name}\'')
    return dt


def rand(*size, generator: Generator | None = None, dtype=None, device=None,
         requires_grad: bool = False) -> Tensor:
    """Uniform numbers in [0, 1)."""
    _check_device(device)
    return _finish(_uniform01(_shape(size), _float_dt(dtype), generator), requires_grad)


def _box_muller(shape, dt, generator) -> Tensor:
    # Two uniforms per normal; 1 - u keeps the log argument in (0, 1].
    u1 = _uniform01(shape, dt, generator)
    u2 = _uniform01(shape, dt, generator)
    radius = ((1 - u1).log() * -2).sqrt()
    return radius * (u2 * (2 * math.pi)).cos()


def randn(*size, generator: Generator | None = None, dtype=None, device=None,
          requires_grad: bool = False) -> Tensor:
    """Standard normal numbers (Box-Muller over the counter-based uniforms)."""
    _check_device(device)
    dt = dtypes.as_dtype(dtype) if dtype is not None else None
    with no_grad():
        if dt is not None and dt.is_complex:
            # torch's complex normal: real and imaginary parts each of variance 1/2
            real, imag = (_box_muller(_shape(size), dtypes.to_real(dt), generator) *
                          math.sqrt(0.5) for _ in range(2))
            t = bind(P.complex_, real, imag)
        else:
            t = _box_muller(_shape(size), _float_dt(dtype), generator)
    return _finish(t, requires_grad)


def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, device=None,
           requires_grad: bool = False) -> Tensor:
    """Normal numbers with ``mean`` and ``std`` (numbers or tensors, broadcast)."""
    if size is None:
        shapes = [tuple(v.shape) for v in (mean, std) if isinstance(v, Tensor)]
        if not shapes:
            raise TypeError("normal() needs tensors for mean or std, or a size")
        size = P.broadcast_shapes(*shapes)
    with no_grad():
        z = _box_muller(_shape((size,)), _float_dt(dtype), generator)
        t = z * std + mean
    return _finish(t, requires_grad)


def randint(low, high=None, size=None, *, generator=None, dtype=None, device=None,
            requires_grad: bool = False) -> Tensor:
    """Integers in [low, high), int64 by default."""
    _check_device(device)
    if high is None:
        low, high = 0, low
    elif size is None and isinstance(high, (tuple, list, Size)):
        low, high, size = 0, low, high      # randint(high, size)
    if size is None:
        raise TypeError("randint() missing required argument 'size'")
    if high <= low:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} "
                           f">= to={high}")
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.int64
    with no_grad():
        # 63 random bits per number, reduced to the range (a float64 uniform has 53: the
        # low bits of a range of 2**62 were always 0).
        bits = _uniform01(_shape((size,)), dtypes.int64, generator)
        t = bits % (high - low) + low
    return t.to(dt)


def randperm(n: int, *, generator=None, dtype=None, device=None,
             requires_grad: bool = False) -> Tensor:
    """A random permutation of 0..n-1 (the argsort of uniform numbers)."""
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.int64
    with no_grad():
        u = _uniform01((n,), dtypes.float32, generator)
        return bind(P.argsort, u, axis=0, descending=False).to(dt)


def rand_like(x: Tensor, *, dtype=None, device=None, **kw) -> Tensor:
    return rand(tuple(x.shape), dtype=dtype or x.dtype, device=device or _device_of(x))


def randn_like(x: Tensor, *, dtype=None, device=None, **kw) -> Tensor:
    return randn(tuple(x.shape), dtype=dtype or x.dtype, device=device or _device_of(x))


def randint_like(x: Tensor, low, high=None, *, dtype=None, device=None, **kw) -> Tensor:
    return randint(low, high, tuple(x.shape), dtype=dtype or x.dtype,
                   device=device or _device_of(x))


# --------------------------------------------------------------------------- devices


def _device_of(x: Tensor):
    """``x``'s device, or None on the cpu (and for traced tensors, which have none yet)."""
    if x._trace is not None or isinstance(x._data, np.ndarray):
        return None
    return x.device


def _placed(factory):
    """``factory`` with ``device=``: a cuda tensor is made on the host and copied to the
    device (the numbers are the ones the cpu draws, so a seed gives the same values on both
    devices), then marked ``requires_grad`` there so that it is a leaf."""
    def make(*args, device=None, **kwargs):
        dev = Device(device) if device is not None else None
        if dev is None or dev.type == "cpu":
            return factory(*args, **kwargs)
        check_device_available(dev)
        requires_grad = kwargs.pop("requires_grad", False)
        t = primitive.device_transfer(factory(*args, **kwargs), dev)
        note_created(t)
        return _finish(t, requires_grad)
    functools.update_wrapper(make, factory)
    return make


for _name in ("tensor", "scalar_tensor", "as_tensor", "full", "zeros", "ones", "empty", "eye",
              "arange", "linspace", "logspace", "rand", "randn", "randint", "randperm", "normal"):
    globals()[_name] = _placed(globals()[_name])


register_handler("array_from", _array_from)
