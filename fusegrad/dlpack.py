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
import functools

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


# Takes the DLManagedTensor's address (a plain integer: no conversion that could fail).
_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", _DELETER)]

def _capi(name: str, restype, *argtypes):
    # Private prototypes: setting argtypes on ctypes.pythonapi's shared attributes would
    # change them for every other user of ctypes in the process.
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_capsule_new = _capi("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p,
                     ctypes.c_void_p)
_capsule_pointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object,
                         ctypes.c_char_p)
_capsule_set_name = _capi("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_capsule_is_valid = _capi("PyCapsule_IsValid", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
# Exported tensors alive on the consumer's side, by the address of their DLManagedTensor: the
# struct, its shape and strides arrays and the numpy array whose memory it lends.
_exported: dict[int, tuple] = {}
_NAME_BUFFER = ctypes.create_string_buffer(_CAPSULE)
_NAME_ADDRESS = ctypes.addressof(_NAME_BUFFER)


def _release(managed_addr: int) -> None:
    _exported.pop(managed_addr, None)


_release_fn = _DELETER(_release)

# The capsule destructor runs while the capsule is freed, possibly with an exception pending
# (a consumer that refused the capsule, as np.from_dlpack does for bfloat16). A Python
# callback cannot run then (ctypes reports and clears the pending error), so the destructor
# is compiled: it saves the error, calls the tensor's deleter if the capsule is unconsumed
# (still named "dltensor"), and restores the error, as dlpack.h's reference destructor does.
_DESTRUCTOR_IR = """
@table = internal global [5 x i8*] zeroinitializer

define void @fg_dlpack_set_table(i8** %t) {
entry:
  %dst = bitcast [5 x i8*]* @table to i8**
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  %src.p = getelementptr i8*, i8** %t, i64 %i
  %v = load i8*, i8** %src.p
  %dst.p = getelementptr i8*, i8** %dst, i64 %i
  store i8* %v, i8** %dst.p
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, 5
  br i1 %done, label %exit, label %loop
exit:
  ret void
}

define void @fg_dlpack_capsule_destructor(i8* %capsule) {
entry:
  %err = alloca [3 x i8*]
  %e0 = getelementptr [3 x i8*], [3 x i8*]* %err, i64 0, i64 0
  %e1 = getelementptr [3 x i8*], [3 x i8*]* %err, i64 0, i64 1
  %e2 = getelementptr [3 x i8*], [3 x i8*]* %err, i64 0, i64 2
  %tab = bitcast [5 x i8*]* @table to i8**
  %fetch.p = getelementptr i8*, i8** %tab, i64 0
  %fetch.raw = load i8*, i8** %fetch.p
  %fetch = bitcast i8* %fetch.raw to void (i8**, i8**, i8**)*
  call void %fetch(i8** %e0, i8** %e1, i8** %e2)
  %valid.p = getelementptr i8*, i8** %tab, i64 2
  %valid.raw = load i8*, i8** %valid.p
  %valid.fn = bitcast i8* %valid.raw to i32 (i8*, i8*)*
  %name.p = getelementptr i8*, i8** %tab, i64 4
  %name = load i8*, i8** %name.p
  %valid = call i32 %valid.fn(i8* %capsule, i8* %name)
  %is.valid = icmp ne i32 %valid, 0
  br i1 %is.valid, label %free, label %restore
free:
  %getp.p = getelementptr i8*, i8** %tab, i64 3
  %getp.raw = load i8*, i8** %getp.p
  %getp = bitcast i8* %getp.raw to i8* (i8*, i8*)*
  %managed = call i8* %getp(i8* %capsule, i8* %name)
  %deleter.addr = getelementptr i8, i8* %managed, i64 DELETER_OFFSET
  %deleter.pp = bitcast i8* %deleter.addr to void (i8*)**
  %deleter = load void (i8*)*, void (i8*)** %deleter.pp
  %has.deleter = icmp ne void (i8*)* %deleter, null
  br i1 %has.deleter, label %call, label %restore
call:
  call void %deleter(i8* %managed)
  br label %restore
restore:
  %r.p = getelementptr i8*, i8** %tab, i64 1
  %r.raw = load i8*, i8** %r.p
  %restore.fn = bitcast i8* %r.raw to void (i8*, i8*, i8*)*
  %v0 = load i8*, i8** %e0
  %v1 = load i8*, i8** %e1
  %v2 = load i8*, i8** %e2
  call void %restore.fn(i8* %v0, i8* %v1, i8* %v2)
  ret void
}
"""


# The LLVM JIT, ``compile_ir(ir_text, names)`` -> a module with ``address(name)``: filled by
# fusegrad.runtime.jit at import (register_ir_compiler); the destructor below is compiled
# with it on the first bfloat16 export.
_ir_compiler = None


def register_ir_compiler(compile_ir) -> None:
    """Install the runtime's LLVM JIT (fusegrad.runtime.jit's ``compile_ir``)."""
    global _ir_compiler
    _ir_compiler = compile_ir


@functools.lru_cache(maxsize=1)
def _capsule_destructor() -> int:
    """Address of the compiled capsule destructor (compiled on the first bfloat16 export)."""
    compile_ir = _ir_compiler
    ir_text = _DESTRUCTOR_IR.replace("DELETER_OFFSET", str(DLManagedTensor.deleter.offset))
    module = compile_ir(ir_text, ["fg_dlpack_set_table", "fg_dlpack_capsule_destructor"])
    api = ctypes.pythonapi
    table = (ctypes.c_void_p * 5)(*(ctypes.cast(getattr(api, name), ctypes.c_void_p).value
                                    for name in ("PyErr_Fetch", "PyErr_Restore",
                                                 "PyCapsule_IsValid", "PyCapsule_GetPointer")),
                                  _NAME_ADDRESS)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(module.address("fg_dlpack_set_table"))(
        ctypes.addressof(table))
    _keep_alive.append(module)
    return module.address("fg_dlpack_capsule_destructor")


_keep_alive: list = []


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
    return _capsule_new(address, _NAME_ADDRESS, _capsule_destructor())


class _Owner:
    """Holds a consumed DLManagedTensor; calls its deleter when the last view is gone."""

    def __init__(self, managed_addr: int, interface: dict) -> None:
        self._managed = managed_addr
        self.__array_interface__ = interface

    def __del__(self) -> None:
        managed = DLManagedTensor.from_address(self._managed)
        if managed.deleter:
            managed.deleter(self._managed)


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
            managed.deleter(addr)
        return np.empty(shape, dtype=f"<u{itemsize}"), code, bits
    interface = {"shape": shape, "typestr": f"<u{itemsize}", "data": (t.data + t.byte_offset, False),
                 "strides": strides, "version": 3}
    return np.asarray(_Owner(addr, interface)), code, bits
