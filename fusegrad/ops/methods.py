"""Install the public ops as ``Tensor`` methods and operators.

Kept apart from :mod:`fusegrad.tensor` so that the tensor class does not import the op
library (which imports the tensor class); ``import fusegrad`` runs this once.
"""

from __future__ import annotations

from fusegrad import dtypes
from fusegrad.ops import autocast, creation, registry
from fusegrad.ops import functional as F
from fusegrad.tensor import Tensor


def install_registered_methods() -> None:
    """Install the registry's ``Tensor`` methods and ``op_`` in-place variants. Run when this
    module is imported, and again by :mod:`fusegrad` once ops defined above the ops layer
    (``nn.functional``'s softmax) have registered."""
    # Methods that are exactly the functional op with the tensor first.
    for name, fn in registry.tensor_methods().items():
        setattr(Tensor, name, fn)
    # In-place variants: compute out of place, then write back (see functional.assign_).
    # torch's autocast lists name no in-place op: those of listed ops run uncast.
    for name, fn in registry.inplace_methods().items():
        if getattr(fn, "_autocast", False):
            fn = autocast.without_autocast(fn)
        setattr(Tensor, name + "_", F._inplace(fn, name + "_"))


install_registered_methods()


def _where_method(self, condition, other):
    """``x.where(cond, y)``: elements of ``x`` where ``cond`` holds, else of ``y``."""
    return F.where(condition, self, other)


Tensor.where = _where_method


def _binop(fn, reflected=False):
    if reflected:
        def op(self, other):
            # Each op takes a scalar on either side with its own rule (0.1 * float16 is
            # torch's mul(x, 0.1): the scalar in float32; 1 + float16 rounds it first).
            return fn(other, self)
    else:
        def op(self, other):
            try:
                return fn(self, other)
            except TypeError:
                return NotImplemented
    return op


for _dunder, _fn in [("add", F.add), ("sub", F.sub), ("mul", F.mul), ("truediv", F.div),
                     ("floordiv", F.floor_divide), ("mod", F.remainder), ("pow", F.pow),
                     ("matmul", F.matmul), ("and", F.bitwise_and), ("or", F.bitwise_or),
                     ("xor", F.bitwise_xor), ("lshift", F.bitwise_left_shift),
                     ("rshift", F.bitwise_right_shift)]:
    setattr(Tensor, f"__{_dunder}__", _binop(_fn))
    setattr(Tensor, f"__r{_dunder}__", _binop(_fn, reflected=True))
    if _dunder != "matmul":     # torch has no __imatmul__: ``x @= w`` rebinds x to x @ w
        setattr(Tensor, f"__i{_dunder}__", F._inplace(_fn, f"__i{_dunder}__"))

for _dunder, _fn in [("lt", F.lt), ("le", F.le), ("gt", F.gt), ("ge", F.ge), ("eq", F.eq),
                     ("ne", F.ne)]:
    setattr(Tensor, f"__{_dunder}__", _binop(_fn))

Tensor.__neg__ = F.neg
Tensor.__pos__ = lambda self: self
Tensor.__abs__ = F.abs
Tensor.__invert__ = F.bitwise_not
Tensor.__getitem__ = F.getitem
Tensor.__setitem__ = F.setitem
Tensor.__hash__ = lambda self: id(self)


def _rpow(self, other):
    return F.pow(F.as_tensor_operand(other, dtypes.result_type(self, other)), self)


Tensor.__rpow__ = _rpow


def _cast_method(dt):
    def method(self, memory_format=None):
        return F.cast(self, dt)
    method.__name__ = dt.name
    return method


for _name, _dt in [("float", dtypes.float32), ("double", dtypes.float64), ("half", dtypes.float16),
                   ("bfloat16", dtypes.bfloat16), ("long", dtypes.int64), ("int", dtypes.int32),
                   ("short", dtypes.int16), ("char", dtypes.int8), ("byte", dtypes.uint8),
                   ("bool", dtypes.bool_), ("cfloat", dtypes.complex64),
                   ("cdouble", dtypes.complex128)]:
    setattr(Tensor, _name, _cast_method(_dt))


def _cpu(self):
    return F.to(self, "cpu")


def _cuda(self, device=None, non_blocking=False):
    if isinstance(device, int):           # x.cuda(1): an index
        device = f"cuda:{device}"
    return F.to(self, "cuda" if device is None else device)


Tensor.cpu = _cpu
Tensor.cuda = _cuda
Tensor.T = property(lambda self: F.permute(self, *reversed(range(self.ndim))))
Tensor.mT = property(lambda self: F.transpose(self, -2, -1))
Tensor.mH = property(lambda self: F.conj(F.transpose(self, -2, -1)))


def _h(self):
    """The conjugate transpose of a matrix (torch's ``Tensor.H``)."""
    if self.ndim not in (0, 2):
        raise RuntimeError(f"tensor.H is only supported on matrices (2-D tensors). Got "
                           f"{self.ndim}-D tensor.")
    return F.conj(self.T)


Tensor.H = property(_h)


def _set_part(part):
    def setter(self, value):
        # ``z.real = v`` writes v into the part (torch's setter copies into the view)
        F.copy_(part(self), value)
    return setter


# torch's .real and .imag are attributes: views of a complex tensor's parts.
Tensor.real = property(F.real, _set_part(F.real))
Tensor.imag = property(F.imag, _set_part(F.imag))


def _uniform_(self, a: float = 0.0, b: float = 1.0, *, generator=None):
    """Fill with uniform numbers in [a, b)."""
    if self.dtype.itemsize >= 4 or not self.dtype.is_floating_point:
        u = creation.rand(tuple(self.shape), generator=generator, dtype=self.dtype)
        return F.assign_(self, u * (b - a) + a, "uniform_")
    # 16-bit floats: scaled in float32, then rounded; a value that rounds up to b becomes the
    # largest one below it (b itself is outside [a, b)).
    u = creation.rand(tuple(self.shape), generator=generator, dtype=dtypes.float32)
    v = F.cast(u * (b - a) + a, self.dtype)
    if b > a:
        top = creation.full((), b, dtype=self.dtype)
        v = F.where(F.ge(v, top), F.nextafter(top, creation.full((), a, dtype=self.dtype)), v)
    return F.assign_(self, v, "uniform_")


def _normal_(self, mean: float = 0.0, std: float = 1.0, *, generator=None):
    """Fill with normal numbers of ``mean`` and ``std``."""
    z = creation.randn(tuple(self.shape), generator=generator, dtype=self.dtype)
    return F.assign_(self, z * std + mean, "normal_")


def _bernoulli_(self, p: float = 0.5, *, generator=None):
    u = creation.rand(tuple(self.shape), generator=generator)
    return F.assign_(self, (u < p).to(self.dtype), "bernoulli_")


Tensor.uniform_ = _uniform_
Tensor.normal_ = _normal_
Tensor.bernoulli_ = _bernoulli_
