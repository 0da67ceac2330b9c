"""``Tensor``: an n-d array with a dtype, a device, strides, and define-by-run autograd.

An eager tensor holds a numpy array (possibly a view of another tensor's array: views share
storage as in PyTorch) and its autograd state. A cuda tensor holds a contiguous
:class:`fusegrad.runtime.cuda.DeviceArray` there instead (views of it share its device
memory, see :mod:`fusegrad.tracer.eager_cuda`); what reads its values copies them to the
host. The math methods are installed on the class by :mod:`fusegrad.ops.methods` (this
module sits below the ops), so a tracer's abstract tensor (a subclass) reuses every method
and only swaps how primitives are applied.
"""

from __future__ import annotations

import copy
import warnings
import weakref

import numpy as np

from fusegrad import dtypes
from fusegrad import effects as _effects
from fusegrad._tensor_str import format_tensor
from fusegrad.device import CPU
from fusegrad.dlpack import KDL_BFLOAT, export_capsule
from fusegrad.host_memory import keep_freed_heap
from fusegrad.tensor_type import TensorType, normalize_axis

__all__ = ["Tensor", "Size", "register_handler"]

# What Tensor's methods need from the layers above it (the ops, the tape, the engine, the
# device runtime), each filled by its owner at import through register_handler:
#   "array_from"   fusegrad.ops.creation: (data, dtype) -> (numpy array, DType), the copy
#                  that Tensor(data) makes;
#   "accumulator"  fusegrad.ops.tape: AccumulateGrad, called with a leaf to make its node;
#   "retain"       fusegrad.ops.tape: (non-leaf tensor) -> None, for retain_grad();
#   "backward"     fusegrad.autograd.engine: backward(tensor, gradient, retain_graph,
#                  create_graph, inputs), for Tensor.backward;
#   "cuda_device"  fusegrad.tracer.device_slots: (index) -> device, for a cuda tensor's
#                  .device (loads fusegrad.tracer.eager_cuda on its first call).
# The math methods and operators are not here: fusegrad.ops.methods installs them on the
# class, in one place.
_handlers: dict = dict.fromkeys(("array_from", "accumulator", "retain", "backward", "cuda_device"))


def register_handler(name: str, fn) -> None:
    """Fill the slot ``name`` of :data:`_handlers` (called once, by the module named there)."""
    if name not in _handlers:
        raise KeyError(f"Tensor has no handler slot {name!r} (slots: {', '.join(_handlers)})")
    _handlers[name] = fn

# Eager ops make and drop a numpy array each: keep freed heap pages for the next one.
keep_freed_heap()


class Size(tuple):
    """A tensor shape: a tuple that prints as ``fusegrad.Size([2, 3])``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"fusegrad.Size({list(self)})"

    __str__ = __repr__

    def numel(self) -> int:
        n = 1
        for d in self:
            n *= d
        return n

    def __getitem__(self, key):
        out = tuple.__getitem__(self, key)
        return Size(out) if isinstance(key, slice) else out

    def __add__(self, other):
        return Size(tuple(self) + tuple(other))

    # Shapes of different ranks differ without comparing sizes: tuple's == would compare
    # their leading sizes first, which for a symbolic size is an assumption
    # (fusegrad.symint), not a fact.
    def __eq__(self, other):
        if isinstance(other, tuple) and len(other) != len(self):
            return False
        return tuple.__eq__(self, other)

    def __ne__(self, other):
        if isinstance(other, tuple) and len(other) != len(self):
            return True
        return tuple.__ne__(self, other)

    __hash__ = tuple.__hash__


class _VersionCounter:
    """Shared by a tensor and its views: bumped by every in-place write. Where an in-place
    view op (``t_``, ``squeeze_``) changed the base's own layout, its views' ops start from
    the layout the base was made with: ``layout`` holds the view ops from there to the
    base's layout now, ``undo`` those back."""

    __slots__ = ("value", "layout", "undo")

    def __init__(self):
        self.value = 0
        self.layout = self.undo = ()


_TYPE_STRINGS = {
    "float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor",
    "bfloat16": "BFloat16Tensor", "int64": "LongTensor", "int32": "IntTensor",
    "int16": "ShortTensor", "int8": "CharTensor", "uint8": "ByteTensor", "bool": "BoolTensor",
    "complex64": "ComplexFloatTensor", "complex128": "ComplexDoubleTensor",
}


class Tensor:
    """A multi-dimensional array with autograd, following ``torch.Tensor``."""

    __slots__ = ("_data", "_dtype", "_requires_grad", "_grad", "grad_fn", "_version_counter",
                 "_base", "_view_ops", "_grad_acc", "_hooks", "_retains_grad", "_view_version",
                 "__weakref__", "__dict__")

    # Set on the tracer's abstract tensors; ``bind`` hands their primitives to the trace.
    _trace = None
    # The state capture of the compiled function whose tracing created this tensor (see
    # fusegrad.tracer.capture); None for tensors created outside any such trace.
    _capture_owner = None
    # Forward mode's tangents: {level id: tangent} (see fusegrad.ops.dual); None for most.
    _fw_grads = None
    # A view's version counter when its tangents were last set (fusegrad.ops.dual): a later
    # write through its base or another view makes them stale.
    _fw_version = None
    # Hooks called with the tensor after backward accumulated its gradient (a list, set by
    # register_post_accumulate_grad_hook).
    _post_accumulate_grad_hooks = None
    # Lets numpy defer to Tensor's reflected operators (ndarray * tensor -> Tensor.__rmul__).
    __array_priority__ = 1000

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, data=None, *, dtype=None, requires_grad: bool = False):
        """``Tensor(data)`` copies ``data`` like ``fusegrad.tensor``; prefer the latter."""
        if data is None:
            data = []
        arr, dt = _handlers["array_from"](data, dtype)
        if dt.is_complex and isinstance(data, (list, tuple)) and dtype is None:
            raise TypeError("must be real number, not complex (torch.Tensor(...) makes the "
                            "default float type; use fusegrad.tensor for complex values)")
        if dt.is_floating_point is False and isinstance(data, (list, tuple)) and dtype is None:
            # torch.Tensor(...) always makes the default float type
            dt = dtypes.get_default_dtype()
            arr = arr.astype(dt.np_dtype)
        self._init(arr, dt)
        if requires_grad:
            self.requires_grad_(True)

    def _init(self, array: np.ndarray, dtype: dtypes.DType) -> None:
        self._data = array
        self._init_state(dtype)

    def _init_state(self, dtype: dtypes.DType) -> None:
        """Everything but the data: dtype and a fresh autograd state (no history)."""
        self._dtype = dtype
        _effects.note_made(self)
        self._requires_grad = False
        self._grad = None
        self.grad_fn = None
        self._version_counter = _VersionCounter()
        self._base = None
        self._view_ops = None
        self._grad_acc = None
        self._hooks = None
        self._retains_grad = False

    @classmethod
    def _wrap(cls, array: np.ndarray, dtype: dtypes.DType) -> "Tensor":
        """A tensor around ``array`` (no copy, no checks): the eager fast path."""
        # _init and _init_state spelled out: every eager op's result is made here.
        t = object.__new__(Tensor)
        t._data = array
        t._dtype = dtype
        _effects.note_made(t)
        t._requires_grad = False
        t._grad = None
        t.grad_fn = None
        t._version_counter = _VersionCounter()
        t._base = None
        t._view_ops = None
        t._grad_acc = None
        t._hooks = None
        t._retains_grad = False
        return t

    # ------------------------------------------------------------------ metadata

    @property
    def shape(self) -> Size:
        return Size(self._data.shape)

    def size(self, dim: int | None = None):
        """The shape, or the size of dimension ``dim``."""
        shape = self.shape
        if dim is None:
            return shape
        return shape[normalize_axis(dim, len(shape), "size")]

    @property
    def dtype(self) -> dtypes.DType:
        return self._dtype

    @property
    def device(self):
        # A traced tensor has no storage to ask; it reports the cpu, as its program's types do.
        if self._trace is None and not isinstance(self._data, np.ndarray):
            return _cuda_device(self._data.allocator.device)
        return CPU

    def _host(self) -> np.ndarray:
        """The values as a host array: the storage itself on the cpu, a copy from a device."""
        data = self._data
        return data if isinstance(data, np.ndarray) else data.to_host()

    def _check_host(self) -> None:
        if not isinstance(self._data, np.ndarray):
            raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use "
                            "Tensor.cpu() to copy the tensor to host memory first.")

    def get_device(self) -> int:
        """The index of a cuda tensor's device; -1 on the cpu (torch's convention)."""
        dev = self.device
        return -1 if dev.type == "cpu" else dev.index

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def ndim(self) -> int:
        return self._data.ndim

    def dim(self) -> int:
        return self.ndim

    def ndimension(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return self.shape.numel()

    def nelement(self) -> int:
        return self.numel()

    def element_size(self) -> int:
        return self._dtype.itemsize

    def stride(self, dim: int | None = None):
        """Strides in elements, as torch reports them."""
        item = self._data.itemsize
        strides = tuple(s // item for s in self._data.strides)
        if self._data.size <= 1 or 0 in self._data.shape:
            strides = _contiguous_strides(self._data.shape)
        return strides if dim is None else strides[dim]

    def is_contiguous(self, memory_format=None) -> bool:
        return self._data.flags.c_contiguous

    def is_floating_point(self) -> bool:
        return self._dtype.is_floating_point

    def is_complex(self) -> bool:
        return self._dtype.is_complex

    def data_ptr(self) -> int:
        data = self._data
        return data.ctypes.data if isinstance(data, np.ndarray) else data.ptr

    @property
    def itemsize(self) -> int:
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel() * self._dtype.itemsize

    def _type(self) -> TensorType:
        return TensorType(self._data.shape, self._dtype)

    def _type_string(self) -> str:
        return "fusegrad." + _TYPE_STRINGS.get(self._dtype.name, "Tensor")

    def type(self, dtype=None):
        """Without an argument the type name (``'fusegrad.FloatTensor'``), else a cast."""
        if dtype is None:
            return self._type_string()
        return self.to(dtype)

    @property
    def _version(self) -> int:
        return self._version_counter.value

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    # ------------------------------------------------------------------ autograd state

    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        """Set whether autograd records operations on this (leaf) tensor."""
        if self.grad_fn is not None and not requires_grad:
            raise RuntimeError(
                "you can only change requires_grad flags of leaf variables. If you want to use a "
                "computed variable in a subgraph that doesn't require differentiation use "
                "var_no_grad = var.detach().")
        if requires_grad and not self._dtype.is_differentiable:
            raise RuntimeError("only Tensors of floating point dtype can require gradients")
        self._requires_grad = bool(requires_grad)
        return self

    @property
    def grad(self):
        if _effects.compiling():
            return _effects.read_grad(self)
        if self.grad_fn is not None and not self._retains_grad and self._trace is None:
            warnings.warn(
                "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its "
                ".grad attribute won't be populated during autograd.backward(). If you indeed want "
                "the .grad field to be populated for a non-leaf Tensor, use .retain_grad() on the "
                "non-leaf Tensor. If you access the non-leaf Tensor by mistake, make sure you "
                "access the leaf Tensor instead.", UserWarning, stacklevel=2)
        return self._grad

    @grad.setter
    def grad(self, value) -> None:
        if _effects.compiling():
            _effects.write_grad(self, value)
            return
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of "
                                f"type {type(value).__name__}")
            if tuple(value.shape) != tuple(self.shape):
                raise RuntimeError(f"assigned grad has data of a different size: "
                                   f"{list(value.shape)} vs {list(self.shape)}")
            if value._dtype is not self._dtype:
                raise RuntimeError(f"attempting to assign a gradient with dtype {value.dtype} "
                                   f"to a tensor with dtype {self.dtype}")
        self._grad = value

    def register_post_accumulate_grad_hook(self, hook):
        """Call ``hook(tensor)`` after backward has accumulated this leaf's gradient into
        ``.grad`` (torch's hook of that name; data-parallel training starts its all-reduces
        from it). Inside a compiled function the hook runs while the backward is traced, on
        the traced gradient. Returns a handle with ``remove()``."""
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self.grad_fn is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
        if self._post_accumulate_grad_hooks is None:
            self._post_accumulate_grad_hooks = []
        self._post_accumulate_grad_hooks.append(hook)
        HOOK_VERSION[0] += 1
        return _HookHandle(self._post_accumulate_grad_hooks, hook)

    def retain_grad(self) -> None:
        """Keep this non-leaf tensor's gradient in ``.grad`` after backward."""
        if not self._requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self.grad_fn is None or self._retains_grad:
            return
        self._retains_grad = True
        _handlers["retain"](self)

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def _accumulator(self):
        """This leaf's AccumulateGrad node (made on first use, shared while alive)."""
        node = self._grad_acc() if self._grad_acc is not None else None
        if node is None:
            node = _handlers["accumulator"](self)
            self._grad_acc = weakref.ref(node)
        return node

    def register_hook(self, hook):
        """Call ``hook(grad)`` when this tensor's gradient is computed; it may return a
        replacement gradient. Returns a handle with ``remove()``."""
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self.grad_fn is not None:
            self.grad_fn.register_prehook(hook)
            hooks = self.grad_fn._pre_hooks
        else:
            if self._hooks is None:
                self._hooks = []
            self._hooks.append(hook)
            hooks = self._hooks
        HOOK_VERSION[0] += 1
        return _HookHandle(hooks, hook)

    def backward(self, gradient=None, retain_graph: bool | None = None,
                 create_graph: bool = False, inputs=None) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``."""
        _handlers["backward"](self, gradient, retain_graph, create_graph, inputs)

    def detach(self) -> "Tensor":
        """A tensor sharing this one's storage, cut from the autograd graph."""
        t = Tensor._wrap(self._data, self._dtype)
        t._version_counter = self._version_counter
        return t

    def _detach_own_tape(self) -> "Tensor":
        """``detach()`` from the tape this tensor's ops are recorded on, and only that one:
        what a transform cuts when it makes fresh leaves or returns its results, and what a
        node saves. The same as ``detach()`` here; a batched tensor inside ``vmap`` keeps
        its underlying tensor's history, which belongs to the transforms around the vmap
        (``jacrev(vmap(grad(f)))``)."""
        return self.detach()

    def detach_(self) -> "Tensor":
        if self._base is not None:
            # a view's history is its base's (an in-place write to the base gave it back,
            # silently), so torch refuses this
            raise RuntimeError("Can't detach views in-place. Use detach() instead.")
        self.grad_fn = None
        self._requires_grad = False
        return self

    @property
    def data(self) -> "Tensor":
        out = self.detach()
        if out is not self and out._trace is None and not _effects.compiling():
            # torch's .data: the same storage, a version of its own, so that a write through
            # it (w.data.clamp_(-c, c) between forward and backward) is not an error for the
            # tensors autograd saved (detach() shares the version and refuses)
            out._version_counter = _VersionCounter()
        return out

    @data.setter
    def data(self, value: "Tensor") -> None:
        _effects.refuse_traced(f"assigning {self._type_string()}.data")
        self._data = value._data
        self._dtype = value._dtype

    # ------------------------------------------------------------------ conversion

    def _check_concrete(self, what: str) -> None:
        """Eager tensors are concrete; the tracer's tensors override this to raise, and so
        does a compiled function's trace for tensors it reads at call time."""
        _effects.check_concrete(self, what)

    def numpy(self, *, force: bool = False) -> np.ndarray:
        """The numpy array sharing this tensor's storage."""
        self._check_concrete("numpy()")
        if self._requires_grad and not force:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use "
                               "tensor.detach().numpy() instead.")
        self._check_host()
        return self._data

    def __array__(self, dtype=None, copy=None):
        """numpy's protocol: ``np.asarray(t)`` shares the storage, ``np.array(t)`` (which
        passes ``copy=True``) copies it, and ``copy=False`` refuses a conversion."""
        self._check_concrete("np.asarray()")
        self._check_host()
        data = self._data
        if copy is False:
            if dtype is not None and np.dtype(dtype) != data.dtype:
                raise ValueError(f"Unable to avoid copy while converting a {self._dtype} tensor "
                                 f"to a numpy array of {np.dtype(dtype)}")
            return data
        return data.astype(data.dtype if dtype is None else dtype, copy=bool(copy))

    def item(self):
        """The value of a one-element tensor as a Python number."""
        self._check_concrete("item()")
        if self._data.size != 1:
            raise RuntimeError(f"a Tensor with {self._data.size} elements cannot be converted to "
                               "Scalar")
        data = self._host()
        return data.reshape(()).item() if self._dtype is not dtypes.bfloat16 else \
            float(data.reshape(()).astype(np.float32))

    def tolist(self):
        self._check_concrete("tolist()")
        data = self._host()
        if self._dtype is dtypes.bfloat16:
            return data.astype(np.float32).tolist()
        return data.tolist()

    def _python_scalar(self):
        if self.numel() != 1:
            raise ValueError("only one element tensors can be converted to Python scalars")
        return self.item()

    def __float__(self) -> float:
        value = self._python_scalar()
        if isinstance(value, complex):
            # torch reads a complex value as a double only when it has no imaginary part
            if value.imag != 0:
                raise RuntimeError("value cannot be converted to type double without overflow")
            value = value.real
        return float(value)

    def __int__(self) -> int:
        return int(self._python_scalar())

    def __complex__(self) -> complex:
        return complex(self._python_scalar())

    def __index__(self) -> int:
        if self._dtype.is_floating_point or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def __bool__(self) -> bool:
        self._check_concrete("bool()")
        if self._data.size != 1:
            many = "more than one value" if self._data.size else "no values"
            raise RuntimeError(f"Boolean value of Tensor with {many} is ambiguous")
        return bool(self.item())

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self, *, tensor_contents=None) -> str:
        self._check_concrete("repr()")
        suffixes = []
        data, device = self._data, None
        if not isinstance(data, np.ndarray):      # printed from a host copy, as torch does
            data, device = data.to_host(), str(self.device)
        if self.grad_fn is not None:
            suffixes.append(f"grad_fn=<{self.grad_fn.name()}>")
        elif self._requires_grad:
            suffixes.append("requires_grad=True")
        return format_tensor(data, dtype_name=self._dtype.name,
                             default_dtype=dtypes.get_default_dtype() is dtypes.float32,
                             suffixes=suffixes, device=device)

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        if self.ndim == 0:
            return format(self.item(), spec)
        return format(repr(self), spec)

    def __dlpack__(self, stream=None, **kwargs):
        """A DLPack capsule sharing this tensor's memory (``torch.from_dlpack`` and
        ``np.from_dlpack`` consume it). bfloat16 is exported as DLPack's kDLBfloat."""
        self._check_concrete("__dlpack__()")
        if self._requires_grad:
            raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")
        if self._dtype is dtypes.bfloat16:
            # numpy cannot export ml_dtypes' bfloat16; the struct is built by hand.
            return export_capsule(self._data.view(np.uint16), KDL_BFLOAT, 16)
        return self._data.__dlpack__(**{k: v for k, v in kwargs.items()
                                        if k in ("max_version", "copy", "dl_device")})

    def __dlpack_device__(self):
        return self._data.__dlpack_device__()

    def __reduce_ex__(self, protocol):
        return (_rebuild, (np.array(self._host()), self._dtype.name, self._requires_grad))

    def __deepcopy__(self, memo):
        if not self.is_leaf:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support "
                               "the deepcopy protocol at the moment.")
        t = type(self).__new__(type(self))
        Tensor._init(t, _deepcopy_storage(self._data, memo), self._dtype)
        t._requires_grad = self._requires_grad
        memo[id(self)] = t
        if self._grad is not None:
            t._grad = copy.deepcopy(self._grad, memo)
        for k, v in getattr(self, "__dict__", {}).items():
            t.__dict__[k] = copy.deepcopy(v, memo)
        return t

    def __copy__(self):
        """``copy.copy``: a new leaf over the same storage (torch's, through its reduce)."""
        t = type(self).__new__(type(self))
        Tensor._init(t, self._data, self._dtype)
        t._requires_grad = self._requires_grad
        t.__dict__.update(getattr(self, "__dict__", {}))
        return t


def _deepcopy_storage(data, memo: dict):
    """A copy of ``data`` for ``copy.deepcopy``. Arrays that view one numpy allocation
    become views of one copy of it (torch's deepcopy keeps tensors that share a storage
    sharing their copy), so deepcopy([x, x.t()]) still writes through."""
    if not isinstance(data, np.ndarray):
        return data.copy()
    root = data
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root.base is not None or not root.flags.c_contiguous or root.size == 0:
        return data.copy()                        # memory numpy does not own: no alias to keep
    root_copy = memo.get(id(root))
    if root_copy is None:
        root_copy = memo[id(root)] = root.copy(order="K")
        memo.setdefault(id(memo), []).append(root)     # keeps id(root) from being reused
    if root is data:
        return root_copy
    offset = data.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    out = np.ndarray(data.shape, data.dtype, buffer=root_copy, offset=offset,
                     strides=data.strides)
    out.flags.writeable = data.flags.writeable
    return out


def _cuda_device(index: int):
    return _handlers["cuda_device"](index)


def _rebuild(array, dtype_name, requires_grad):
    t = Tensor._wrap(array, dtypes.as_dtype(dtype_name))
    t._requires_grad = requires_grad
    return t


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


# Moved by every registration and removal of a tensor's gradient hooks: a compiled step
# compares its captured tensors' hooks only when it moved.
HOOK_VERSION = [0]


class _HookHandle:
    def __init__(self, hooks: list, hook):
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)
            HOOK_VERSION[0] += 1

    def __enter__(self) -> "_HookHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

