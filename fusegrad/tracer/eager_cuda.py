"""Eager tensors on ``cuda``: each primitive applied to a cuda tensor runs as a one-node
kernel graph through the same fusion, GPU lowering and CUDA runtime as a compiled program.

A cuda tensor is a :class:`fusegrad.tensor.Tensor` whose storage (``_data``) is a
:class:`fusegrad.runtime.cuda.DeviceArray` instead of an ndarray; its metadata reads the
same attributes (``shape``, ``ndim``, ``dtype``), so nothing above ``bind`` changes. This
handler lives in the tracer, beside the CPU's eager-kernel handler
(:mod:`fusegrad.tracer.eager_kernels`): it compiles graphs, so it stands above both the
passes and the runtime.

- **Dispatch**: :func:`device_apply` is installed as ``fusegrad.ops.primitive``'s device hook
  when the first cuda tensor is made (:func:`to_device`). Until then the CPU's eager path
  pays one test of that hook per op; after, one scan of the operands' storage types.
- **Views**: reshape, permute, slices and expand of a cuda tensor are views, as in torch:
  a :class:`DeviceArray` sharing its owner's allocation with its own offset and strides,
  made without a launch (:meth:`DeviceArray.view_by`). An in-place write through a view
  writes the owner's memory (:func:`copy_into`).
- **One program per signature**: a primitive applied to operands of given shapes and dtypes
  with given attributes compiles once; later calls launch the cached :class:`CudaProgram`.
  Kernels read contiguous inputs: a strided view operand is first copied by a strided-copy
  program (one per view geometry, :func:`strided_copy`); a contiguous view at an offset is
  passed as it is (its pointer is ``base + offset``).
- **Devices**: operands on the cpu and on cuda in one op raise torch's error, except 0-d cpu
  tensors (a Python scalar becomes one), which are copied to the device, as torch allows;
  so do operands on two cuda devices. A program runs on the device of its operands.
- **Strided writes**: kernels store contiguously, so a write into a non-contiguous view
  (``x[:, 0] = v``, ``x.t().add_(1)``) runs a store program over the row-major box that
  starts at the view's pointer: ``where(inside the view, new value, old value)``, copied
  back over the view's span (:func:`_strided_store`). A view whose strides do not nest as
  a box (a step that does not divide the row: ``x[:, ::2]`` of 5 columns) goes through the
  host (``STATS["strided_writes"]``); a store through a view in the GPU lowering would
  cover those too.
- **Bounded caches**: the compiled programs are kept in :class:`ProgramCache`, a
  least-recently-used cache of ``FUSEGRAD_CUDA_EAGER_CACHE`` programs; an evicted program's
  module is unloaded from the GPU.
- **Host fallback**: a primitive with no GPU lowering (an extern one: sort, cumsum, ...)
  runs its numpy reference on a host copy of its operands and copies its result back (the
  CUDA runtime's host steps); each such call is counted in ``STATS["host_fallbacks"]``.
- **Autograd**: the VJP rules are tensor ops, so a backward over cuda tensors runs on cuda
  and leaves cuda gradients; :class:`ToCopyBackward0` carries gradients across ``to()``.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from fusegrad import dtypes
from fusegrad.config import config
from fusegrad.device import device as Device
from fusegrad.dtypes import from_numpy_dtype
from fusegrad.grad_mode import is_grad_enabled
from fusegrad.ir.graph import Graph, Literal
from fusegrad.ir.kernel_graph import View
from fusegrad.ops import primitive as _primitive
from fusegrad.ops import prims as P
from fusegrad.ops.primitive import Kind, TensorType
from fusegrad.ops.tape import Node, _edge
from fusegrad.passes.fusion import fuse
from fusegrad.runtime import cuda as _cuda
from fusegrad.runtime import cuda_drivers
from fusegrad.runtime.cuda import (
    CudaProgram,
    DeviceArray,
    allocator_of,
    check_ordinal,
    current_device,
    driver,
    register_array_kernels,
)
from fusegrad.tensor import Tensor

__all__ = ["device_apply", "to_device", "to_host", "transfer", "add_into", "copy_into", "STATS",
           "clear_cache", "strided_copy", "cuda_device"]

CUDA0 = Device("cuda", 0)
_CUDA_DEVICES = [CUDA0]


def cuda_device(index: int) -> Device:
    """The (shared) device object ``cuda:index``."""
    while len(_CUDA_DEVICES) <= index:
        _CUDA_DEVICES.append(Device("cuda", len(_CUDA_DEVICES)))
    return _CUDA_DEVICES[index]


# Counters for tests and tuning: programs compiled, launches from the cache, calls that ran
# on the host for want of a GPU lowering, views made without a launch, strided operands
# copied on the device, writes into strided views on the device, and those done through
# the host.
STATS = {"compiled": 0, "cached": 0, "host_fallbacks": 0, "views": 0, "strided_copies": 0,
         "strided_stores": 0, "strided_writes": 0}


class ProgramCache(OrderedDict):
    """Compiled programs by signature, at most ``config.cuda_eager_cache``
    (``FUSEGRAD_CUDA_EAGER_CACHE``) of them: a lookup makes an entry the most recently
    used, and an insertion beyond the bound drops the least recently used, whose module is
    unloaded from the GPU when nothing else holds the program (its finalizer)."""

    def get(self, key, default=None):
        prog = super().get(key, default)
        if prog is not default:
            self.move_to_end(key)
        return prog

    def __setitem__(self, key, prog) -> None:
        super().__setitem__(key, prog)
        self.move_to_end(key)
        while len(self) > config.cuda_eager_cache:
            self.popitem(last=False)


# (primitive, operand (shape, dtype, on-device) triples, attributes) -> CudaProgram
_PROGRAMS = ProgramCache()


def clear_cache() -> None:
    """Forget the compiled single-op programs (tests switch drivers between cases)."""
    _PROGRAMS.clear()
    _STRIDED.clear()
    _STORES.clear()
    for k in STATS:
        STATS[k] = 0


def _on_device(t) -> bool:
    return t._data.__class__ is DeviceArray


def _mismatch(devices) -> RuntimeError:
    a, b = devices
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                        f"devices, {a} and {b}!")


def _program(prim, operands, attrs) -> tuple[CudaProgram, bool]:
    """The cached program of ``prim`` on operands like these (and whether it was cached)."""
    sig = tuple((op._data.shape, op._dtype, _on_device(op)) for op in operands)
    try:
        key = (prim, sig, tuple(attrs.items()))
        hash(key)
    except TypeError:             # an unhashable attribute (a list): compiled every time
        key = None
    prog = _PROGRAMS.get(key) if key is not None else None
    if prog is not None and prog.drv is cuda_drivers._driver:     # (not one of a replaced driver)
        return prog, True
    g = Graph(f"eager_{prim.name}")
    ins = [g.add_input(f"x{i}", TensorType(tuple(shape), dt)) for i, (shape, dt, _) in
           enumerate(sig)]
    out = g.add_node(prim, ins, attrs)
    if prim.kind is Kind.MOVEMENT or out in ins:
        # A view's result is a fresh contiguous buffer: the copy kernel reads through the
        # view's index map (a returned view would go through the host instead).
        out = g.add_node(P.copy, [out])
    g.set_outputs([out])
    prog = CudaProgram(fuse(g), driver(), name=f"eager_{prim.name}")
    STATS["compiled"] += 1
    if key is not None:
        _PROGRAMS[key] = prog
    return prog, False


# Movement primitives whose result is a view (pad and concat make new values).
_VIEW_PRIMS = {"reshape", "permute", "broadcast_to", "slice"}


def device_apply(prim, operands, attrs):
    """``prim`` on ``operands`` on the device when any operand is a cuda tensor, recording
    the autograd node as the CPU path does; None when every operand is on the cpu."""
    for op in operands:
        if op._data.__class__ is DeviceArray:
            device = op._data.allocator.device
            break
    else:
        return None
    for op in operands:
        data = op._data
        if data.__class__ is not DeviceArray:
            if data.ndim != 0:
                raise _mismatch((cuda_device(device), "cpu"))
        elif data.allocator.device != device:
            raise _mismatch((cuda_device(device), cuda_device(data.allocator.device)))
    out_type = _primitive._infer(prim, operands, attrs)
    if prim.name in _VIEW_PRIMS:
        result = _view(prim, operands[0]._data, attrs)
        if result is not None:
            STATS["views"] += 1
            out = Tensor._wrap(result, out_type.dtype)
            _primitive._record_eager_node(prim, operands, attrs, out)
            return out
    prog, cached = _program(prim, operands, attrs)
    STATS["cached"] += cached
    if prog.host_steps:
        STATS["host_fallbacks"] += 1
    result = prog(*[op._data for op in operands])[0]
    out = Tensor._wrap(result, out_type.dtype)
    _primitive._record_eager_node(prim, operands, attrs, out)
    return out


def _view(prim, data: DeviceArray, attrs) -> DeviceArray | None:
    """The view ``prim`` makes of ``data``, or None (a reshape its strides do not allow)."""
    if prim.name == "reshape":
        shape = attrs["shape"]
        try:
            return data.view_by(lambda a: np.reshape(a, shape, copy=False))
        except ValueError:
            return None
    return data.view_by(lambda a: prim.impl(a, **attrs))


# (shape, byte strides, dtype) -> the program copying such a view into a contiguous buffer
_STRIDED = ProgramCache()


def strided_copy(src: DeviceArray) -> DeviceArray:
    """A contiguous copy of the strided view ``src``, made by a copy kernel that reads it
    through its strides (the kernel graph's :class:`View` of the view's span)."""
    if src.size == 0:
        return DeviceArray.empty(src.shape, src.dtype, src.allocator)
    item = src.dtype.itemsize
    span = src.span()
    key = (src.shape, src.byte_strides, src.dtype, span.shape)
    prog = _STRIDED.get(key)
    if prog is None or prog.drv is not driver():
        g = Graph("strided_copy")
        x = g.add_input("x0", TensorType(span.shape, from_numpy_dtype(src.dtype)))
        # slice + broadcast_to give a movement value of the view's shape, which fusion folds
        # into the copy's loads as a View of x0; that View is then given the real strides.
        first = g.add_node(P.slice_, [x], {"starts": (0,), "stops": (1,), "steps": (1,)})
        moved = g.add_node(P.broadcast_to, [first], {"shape": src.shape})
        g.set_outputs([g.add_node(P.copy, [moved])])
        kg = fuse(g)
        if moved not in kg.views:
            raise AssertionError("strided_copy: fusion did not fold the view into the copy")
        kg.views[moved] = View(x, src.shape, tuple(s // item for s in src.byte_strides), 0)
        prog = _STRIDED[key] = CudaProgram(kg, driver(), name="strided_copy")
        STATS["compiled"] += 1
    STATS["strided_copies"] += 1
    return prog(span)[0]


def add_into(dst: DeviceArray, src: DeviceArray) -> None:
    """``dst += src`` on the device (same shape and dtype), written into ``dst``'s memory."""
    a = Tensor._wrap(dst, from_numpy_dtype(dst.dtype))
    b = Tensor._wrap(src, from_numpy_dtype(src.dtype))
    prog, _ = _program(P.add, (a, b), {})
    copy_into(dst, prog(dst, src)[0])


def copy_into(dst, src) -> None:
    """Write ``src``'s values into the storage ``dst`` of the same shape and dtype, either
    being a host array or a device array (an in-place write to a cuda tensor or a view of
    one, a compiled function's write-back)."""
    if isinstance(dst, np.ndarray):
        np.copyto(dst, src if isinstance(src, np.ndarray) else src.to_host())
        return
    if dst.size == 0:
        return
    if isinstance(src, np.ndarray):
        host = np.asarray(np.broadcast_to(src, dst.shape), dtype=dst.dtype, order="C")
    elif src.allocator.device != dst.allocator.device:
        host = src.to_host()                    # between devices: through the host
    else:
        host = None
        src = src.contiguous()
    if dst.c_contiguous:
        if host is not None:
            dst.allocator.activate().htod(dst.ptr, host)
        else:
            dst.allocator.activate().dtod(dst.ptr, src.ptr, dst.nbytes)
        return
    program = _strided_store(dst)
    if program is None:
        _write_strided(dst, host if host is not None else src.to_host())
        return
    if host is not None:
        src = DeviceArray.from_host(host, dst.allocator)
    span = dst.span()
    box = program(span, src)[0]
    STATS["strided_stores"] += 1
    dst.allocator.activate().dtod(span.ptr, box.ptr, span.nbytes)


def _write_strided(dst: DeviceArray, values: np.ndarray) -> None:
    """Write ``values`` into the strided view ``dst`` through the host: its span read
    back, updated there, and written again (the views :func:`_store_box` refuses)."""
    STATS["strided_writes"] += 1
    span = dst.span()
    raw = span.to_host()
    np.lib.stride_tricks.as_strided(raw, dst.shape, dst.byte_strides)[...] = values
    dst.allocator.activate().htod(span.ptr, raw)


def _store_box(dst: DeviceArray):
    """``(box, dims)`` when the strided view ``dst`` is a sub-box of the row-major box that
    starts at its pointer: ``dims`` its dims of size above 1 as (stride, size, view dim),
    outermost first, and ``box`` the box's shape (the outermost size, each stride over the
    next, and the innermost stride). None when strides do not nest that way (a step that
    does not divide the row: the host writes those)."""
    item = dst.dtype.itemsize
    dims = sorted(((st // item, d, k) for k, (d, st) in enumerate(zip(dst.shape, dst.strides))
                   if d > 1), reverse=True)
    if not dims or dims[-1][0] < 1 or len({st for st, _, _ in dims}) != len(dims):
        return None
    for (outer, _, _), (inner, size, _) in zip(dims, dims[1:]):
        if outer % inner or size * inner > outer:
            return None
    box = [dims[0][1]] + [dims[i - 1][0] // dims[i][0] for i in range(1, len(dims))]
    return tuple(box + [dims[-1][0]]), dims


# (shape, byte strides, dtype) -> the program writing a view's values into its span
_STORES = ProgramCache()


def _strided_store(dst: DeviceArray):
    """The program that writes a contiguous ``src`` into the strided view ``dst`` on the
    device, or None (see :func:`_store_box`). It runs over the box from the view's pointer:
    ``where(inside the view, src read through a View, the span's old value)``, the span
    read padded to the box, the result a fresh box buffer whose first ``span`` elements
    are copied back. Kernels store contiguously, so the box stands in for a strided store."""
    key = (dst.shape, dst.byte_strides, dst.dtype)
    prog = _STORES.get(key)
    if prog is not None and prog.drv is cuda_drivers._driver:
        return prog
    found = _store_box(dst)
    if found is None:
        return None
    box, dims = found
    dt = from_numpy_dtype(dst.dtype)
    span_len = dst.span().shape[0]
    total = int(np.prod(box))
    g = Graph("strided_store")
    old = g.add_input("span", TensorType((span_len,), dt))
    src = g.add_input("src", TensorType(dst.shape, dt))
    padded = g.add_node(P.pad, [old], {"widths": ((0, total - span_len),), "value": 0})
    old_box = g.add_node(P.reshape, [padded], {"shape": box})
    nd = len(dst.shape)
    first = g.add_node(P.slice_, [src], {"starts": (0,) * nd, "stops": (1,) * nd,
                                         "steps": (1,) * nd})
    ones = g.add_node(P.reshape, [first], {"shape": (1,) * len(box)})
    new_box = g.add_node(P.broadcast_to, [ones], {"shape": box})
    # Inside the view: each box coordinate below the view's size, the innermost one 0.
    limits = [(axis, size) for axis, (_, size, _) in enumerate(dims) if size < box[axis]]
    if box[-1] > 1:
        limits.append((len(box) - 1, 1))
    inside = None
    for axis, size in limits:
        coord = g.add_node(P.iota, [], {"shape": box, "axis": axis, "dtype": dtypes.int64})
        test = g.add_node(P.lt, [coord, Literal(size, dtypes.int64)])
        inside = test if inside is None else g.add_node(P.logical_and, [inside, test])
    out = g.add_node(P.where, [inside, new_box, old_box]) if inside is not None else \
        g.add_node(P.copy, [new_box])
    g.set_outputs([out])
    kg = fuse(g)
    if new_box not in kg.views:
        return None                              # fusion did not fold it: the host writes
    contiguous = [st // dst.dtype.itemsize for st in _cuda._contiguous_byte_strides(
        dst.shape, dst.dtype.itemsize)]
    strides = tuple(contiguous[k] for _, _, k in dims) + (0,)
    kg.views[new_box] = View(src, box, strides, 0)
    prog = _STORES[key] = CudaProgram(kg, driver(), name="strided_store")
    STATS["compiled"] += 1
    return prog


# --------------------------------------------------------------------------- transfers


class ToCopyBackward0(Node):
    """The backward of a copy between devices: the gradient goes back where it came from."""

    __slots__ = ("source",)

    def __init__(self, x, source: Device):
        super().__init__((_edge(x),), "ToCopyBackward0")
        self.source = source

    def apply(self, grad, create_graph: bool, retain_graph: bool) -> tuple:
        return (transfer(grad, self.source),)


def _install() -> None:
    if _primitive._device_apply is None:
        _primitive.register_device_apply(device_apply)


def to_device(array: np.ndarray, index: int | None = None) -> DeviceArray:
    """A host array copied to cuda device ``index`` (the current one by default; the
    driver is made on first use)."""
    _install()
    drv = driver()
    index = current_device() if index is None else check_ordinal(index)
    return DeviceArray.from_host(array, allocator_of(drv, index))


def to_host(array: DeviceArray) -> np.ndarray:
    """A device array copied to a new host array."""
    return array.to_host()


def device_of(x) -> Device:
    """The device of tensor ``x``'s storage."""
    data = x._data
    return cuda_device(data.allocator.device) if data.__class__ is DeviceArray else \
        Device("cpu")


def resolve(dev: Device) -> Device:
    """``dev`` with an index: ``cuda`` means the current device."""
    if dev.type == "cuda" and dev.index is None:
        return cuda_device(current_device())
    return dev


def transfer(x, dev: Device):
    """``x`` on device ``dev`` (a new tensor when it moves; ``x`` itself when it is there
    already), differentiable as torch's ``to`` is."""
    source, dev = device_of(x), resolve(Device(dev))
    if source == dev:
        return x
    host = to_host(x._data) if source.type == "cuda" else x._data
    data = to_device(host, dev.index) if dev.type == "cuda" else host
    out = Tensor._wrap(data, x._dtype)
    if x._requires_grad and is_grad_enabled():
        out.grad_fn = ToCopyBackward0(x, source)
        out._requires_grad = True
    return out


register_array_kernels(strided_copy=strided_copy, add_into=add_into)   # DeviceArray's kernels
