"""Eager tensors on ``cuda``: each primitive applied to a cuda tensor runs as a one-node
kernel graph through the same fusion, GPU lowering and CUDA runtime as a compiled program.

A cuda tensor is a :class:`fusegrad.tensor.Tensor` whose storage (``_data``) is a
:class:`fusegrad.runtime.cuda.DeviceArray` instead of an ndarray; its metadata reads the
same attributes (``shape``, ``ndim``, ``dtype``), so nothing above ``bind`` changes.

- **Dispatch**: :func:`device_apply` is installed as ``fusegrad.ops.primitive``'s device hook
  when the first cuda tensor is made (:func:`to_device`). Until then the CPU's eager path
  pays one test of that hook per op; after, one scan of the operands' storage types.
- **One program per signature**: a primitive applied to operands of given shapes and dtypes
  (device arrays are always contiguous, so the shape is the layout class) with given
  attributes compiles once; later calls launch the cached :class:`CudaProgram`.
- **Devices**: operands on the cpu and on cuda in one op raise torch's error, except 0-d cpu
  tensors (a Python scalar becomes one), which are copied to the device, as torch allows.
- **Movement ops** (reshape, permute, slices, expand) produce a new contiguous buffer: cuda
  tensors have no views, so an in-place write to a slice of a cuda tensor does not reach its
  base (``x[...] = v`` on the tensor itself writes through flat positions).
- **Host fallback**: a primitive with no GPU lowering (an extern one: sort, cumsum, ...)
  runs its numpy reference on a host copy of its operands and copies its result back (the
  CUDA runtime's host steps); each such call is counted in ``STATS["host_fallbacks"]``.
- **Autograd**: the VJP rules are tensor ops, so a backward over cuda tensors runs on cuda
  and leaves cuda gradients; :class:`ToCopyBackward0` carries gradients across ``to()``.
"""

from __future__ import annotations

import numpy as np

from fusegrad.autograd.engine import Node, _edge
from fusegrad.autograd.grad_mode import is_grad_enabled
from fusegrad.device import device as Device
from fusegrad.ops import primitive as _primitive
from fusegrad.ops import prims as P
from fusegrad.ops.primitive import Kind, TensorType
from fusegrad.runtime.cuda import CudaProgram, DeviceArray, allocator_of, driver

__all__ = ["device_apply", "to_device", "to_host", "transfer", "add_into", "copy_into", "STATS",
           "clear_cache"]

CUDA0 = Device("cuda", 0)

# Counters for tests and tuning: programs compiled, launches from the cache, and calls that
# ran on the host for want of a GPU lowering.
STATS = {"compiled": 0, "cached": 0, "host_fallbacks": 0}

# (primitive, operand (shape, dtype, on-device) triples, attributes) -> CudaProgram
_PROGRAMS: dict = {}


def clear_cache() -> None:
    """Forget the compiled single-op programs (tests switch drivers between cases)."""
    _PROGRAMS.clear()
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
    if prog is not None:
        return prog, True
    from fusegrad.ir.graph import Graph
    from fusegrad.passes.fusion import fuse
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


def device_apply(prim, operands, attrs):
    """``prim`` on ``operands`` on the device when any operand is a cuda tensor, recording
    the autograd node as the CPU path does; None when every operand is on the cpu."""
    for op in operands:
        if op._data.__class__ is DeviceArray:
            break
    else:
        return None
    for op in operands:
        if op._data.__class__ is not DeviceArray and op._data.ndim != 0:
            raise _mismatch((CUDA0, "cpu"))
    out_type = _primitive._infer(prim, operands, attrs)
    prog, cached = _program(prim, operands, attrs)
    STATS["cached"] += cached
    if prog.host_steps:
        STATS["host_fallbacks"] += 1
    result = prog(*[op._data for op in operands])[0]
    from fusegrad.tensor import Tensor
    out = Tensor._wrap(result, out_type.dtype)
    _primitive._record_eager_node(prim, operands, attrs, out)
    return out


def add_into(dst: DeviceArray, src: DeviceArray) -> None:
    """``dst += src`` on the device (same shape and dtype), written into ``dst``'s buffer."""
    from fusegrad.dtypes import from_numpy_dtype
    from fusegrad.tensor import Tensor
    a = Tensor._wrap(dst, from_numpy_dtype(dst.dtype))
    b = Tensor._wrap(src, from_numpy_dtype(src.dtype))
    prog, _ = _program(P.add, (a, b), {})
    total = prog(dst, src)[0]
    if dst.nbytes:
        dst.allocator.drv.dtod(dst.ptr, total.ptr, dst.nbytes)


def copy_into(dst, src) -> None:
    """Write ``src``'s values into the storage ``dst`` of the same shape and dtype, either
    being a host array or a device array (an in-place write to a cuda tensor, a compiled
    function's write-back)."""
    if isinstance(dst, np.ndarray):
        np.copyto(dst, src if isinstance(src, np.ndarray) else src.to_host())
    elif isinstance(src, np.ndarray):
        host = np.ascontiguousarray(np.broadcast_to(src, dst.shape), dtype=dst.dtype)
        dst.allocator.drv.htod(dst.ptr, host)
    elif dst.nbytes:
        dst.allocator.drv.dtod(dst.ptr, src.ptr, dst.nbytes)


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
        _primitive._device_apply = device_apply


def to_device(array: np.ndarray) -> DeviceArray:
    """A host array copied to the cuda device (its driver is made on first use)."""
    _install()
    return DeviceArray.from_host(np.ascontiguousarray(array), allocator_of(driver()))


def to_host(array: DeviceArray) -> np.ndarray:
    """A device array copied to a new host array."""
    return array.to_host()


def transfer(x, dev: Device):
    """``x`` on device ``dev`` (a new tensor when it moves; ``x`` itself when it is there
    already), differentiable as torch's ``to`` is."""
    from fusegrad.tensor import Tensor
    here = _on_device(x)
    there = dev.type == "cuda"
    if here == there:
        return x
    data = to_device(x._data) if there else to_host(x._data)
    out = Tensor._wrap(data, x._dtype)
    if x._requires_grad and is_grad_enabled():
        out.grad_fn = ToCopyBackward0(x, CUDA0 if here else Device("cpu"))
        out._requires_grad = True
    return out
