"""DLPack exchange for the dtypes numpy cannot export or import: bfloat16.

numpy's ``__dlpack__`` and ``from_dlpack`` handle the standard integer and float types (float16
included) and are used for them. numpy has no bfloat16 (fusegrad's comes from ml_dtypes), so
for it this module builds and reads the DLPack structs itself with ctypes, following
``dlpack.h`` (v0.8 unversioned ``DLManagedTensor`` in a capsule named ``"dltensor"``; the
consumer renames the capsule ``"used_dltensor"`` and becomes responsible for calling the
deleter). bfloat16 is type code ``kDLBfloat`` = 4 with 16 bits and 1 lane, as in PyTorch.
"""

from __future__ import annotations

import ctypes

import numpy as np

__all__ = ["export_capsule", "import_capsule", "KDL_BFLOAT", "KDL_CPU"]

KDL_CPU = 1
KDL_BFLOAT = 4
_CAPSULE = b"dltensor"
_USED_CAPSULE = b"used_dltensor"


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", _DELETER)]

def _capi(name: str, restype, *argtypes):
    # Private prototypes: setting argtypes on ctypes.pythonapi's shared attributes would
    # change them for every other user of ctypes in the process.
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_capsule_new = _capi("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                     ctypes.c_void_p)
_capsule_pointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object,
                         ctypes.c_char_p)
_capsule_set_name = _capi("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_capsule_is_valid = _capi("PyCapsule_IsValid", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
# The capsule destructor receives the capsule while it is being freed: these take it as a
# plain address (a py_object argument would resurrect the dying capsule).
_raw_name = _capi("PyCapsule_GetName", ctypes.c_char_p, ctypes.c_void_p)
_raw_pointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)

# Exported tensors alive on the consumer's side, by the address of their DLManagedTensor: the
# struct, its shape and strides arrays and the numpy array whose memory it lends.
_exported: dict[int, tuple] = {}


def _release(managed_ptr) -> None:
    _exported.pop(ctypes.cast(managed_ptr, ctypes.c_void_p).value, None)


def _destroy_capsule(capsule_addr) -> None:
    # An unconsumed capsule (still named "dltensor"): nobody took ownership, so free it here.
    if _raw_name(capsule_addr) == _CAPSULE:
        _exported.pop(_raw_pointer(capsule_addr, _CAPSULE), None)


_release_fn = _DELETER(_release)
_destroy_capsule_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_destroy_capsule)


def export_capsule(array: np.ndarray, code: int, bits: int):
    """A ``"dltensor"`` capsule lending ``array``'s memory as DLPack type (code, bits).

    The array stays alive until the consumer calls the deleter (or the capsule is freed
    unused)."""
    ndim = array.ndim
    shape = (ctypes.c_int64 * max(ndim, 1))(*array.shape)
    itemsize = array.dtype.itemsize
    if any(s % itemsize for s in array.strides):
        array = np.ascontiguousarray(array)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(s // itemsize for s in array.strides))
    managed = DLManagedTensor()
    t = managed.dl_tensor
    t.data = array.ctypes.data if array.size else None
    t.device = DLDevice(KDL_CPU, 0)
    t.ndim = ndim
    t.dtype = DLDataType(code, bits, 1)
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _release_fn
    address = ctypes.addressof(managed)
    _exported[address] = (managed, shape, strides, array)
    return _capsule_new(address, _CAPSULE, ctypes.cast(_destroy_capsule_fn, ctypes.c_void_p))


class _Owner:
    """Holds a consumed DLManagedTensor; calls its deleter when the last view is gone."""

    def __init__(self, managed_addr: int, interface: dict) -> None:
        self._managed = managed_addr
        self.__array_interface__ = interface

    def __del__(self) -> None:
        managed = DLManagedTensor.from_address(self._managed)
        if managed.deleter:
            managed.deleter(ctypes.pointer(managed))


def import_capsule(capsule) -> tuple[np.ndarray, int, int]:
    """Consume a ``"dltensor"`` capsule; return a numpy array of raw unsigned integers over
    its memory (zero-copy) with the DLPack type code and bits, for the caller to view."""
    if not _capsule_is_valid(capsule, _CAPSULE):
        raise BufferError("expected an unconsumed DLPack capsule named 'dltensor' (it may have "
                          "been consumed already)")
    addr = _capsule_pointer(capsule, _CAPSULE)
    managed = DLManagedTensor.from_address(addr)
    t = managed.dl_tensor
    if t.device.device_type != KDL_CPU:
        raise BufferError(f"from_dlpack: only CPU tensors can be imported (DLPack device type "
                          f"{t.device.device_type})")
    if t.dtype.lanes != 1 or t.dtype.bits % 8:
        raise BufferError(f"from_dlpack: unsupported DLPack type (code {t.dtype.code}, bits "
                          f"{t.dtype.bits}, lanes {t.dtype.lanes})")
    itemsize = t.dtype.bits // 8
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] * itemsize for i in range(t.ndim))
    else:
        strides = None
    code, bits = t.dtype.code, t.dtype.bits
    # From here on the deleter is ours to call.
    _capsule_set_name(capsule, _USED_CAPSULE)
    if 0 in shape:
        if managed.deleter:
            managed.deleter(ctypes.pointer(managed))
        return np.empty(shape, dtype=f"<u{itemsize}"), code, bits
    interface = {"shape": shape, "typestr": f"<u{itemsize}", "data": (t.data + t.byte_offset, False),
                 "strides": strides, "version": 3}
    return np.asarray(_Owner(addr, interface)), code, bits
