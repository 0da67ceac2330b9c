"""Discrete Fourier transforms: the three FFT primitives and torch.fft's functions on them.

The primitives are pocketfft's (numpy.fft's) transforms, with torch's ``norm`` modes:

- ``fft_c2c(x, axes, inverse, norm)``: complex to complex over ``axes``;
- ``fft_r2c(x, axis, norm)``: real to the ``n // 2 + 1`` non-negative frequencies along ``axis``;
- ``fft_c2r(x, axis, n, norm)``: those frequencies (Hermitian-completed) back to ``n`` reals.

The public functions resize their input to the signal length (``n``, ``s``) with slices and
zero padding, which carry their own gradients, so the primitives always transform the length
they are given. Their VJPs are the transforms' adjoints under torch's conjugate-Wirtinger
convention: c2c's is the c2c of the other direction with the swapped ``norm`` (the
unnormalized transform's adjoint is the unnormalized inverse); r2c's is the real part of the
inverse c2c of the zero-padded cotangent; c2r's is r2c of the cotangent with the frequencies
that stand for two (all but the zero and, for even ``n``, the Nyquist one) doubled, as torch's
``fft_c2r_backward``. They run as numpy extern steps in compiled programs.
"""

from __future__ import annotations

import numpy as np

from fusegrad import dtypes
from fusegrad.ops import prims as P
from fusegrad.ops.composite import composite
from fusegrad.ops.creation import tensor
from fusegrad.ops.elementwise import mul
from fusegrad.ops.movement import cat, flip, narrow, pad_axes, roll
from fusegrad.ops.operands import as_tensor_operand, cast
from fusegrad.ops.primitive import (
    Kind,
    Primitive,
    Rule,
    ShapeError,
    TensorType,
    bind,
    jvp_rule,
    register,
)
from fusegrad.ops.prims import normalize_axis
from fusegrad.ops.prims_common import applied_to_tangent
from fusegrad.tensor import Tensor

__all__ = ["fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft", "rfft2", "irfft2",
           "rfftn", "irfftn", "hfft", "ihfft", "hfft2", "ihfft2", "hfftn", "ihfftn", "fftfreq",
           "rfftfreq", "fftshift", "ifftshift"]

_NORMS = ("backward", "ortho", "forward")
# The adjoint of a transform normalized one way is the opposite transform normalized the other
# way ("backward" scales the inverse by 1/n, "forward" the forward transform).
_SWAP = {"backward": "forward", "ortho": "ortho", "forward": "backward"}


# --------------------------------------------------------------------------- primitives


def _check_axes(op: str, x: TensorType, axes: tuple[int, ...]) -> None:
    if not axes or any(not 0 <= a < x.ndim for a in axes) or len(set(axes)) != len(axes):
        raise ShapeError(f"{op}: axes {axes} are not distinct axes of {x}")
    if any(x.shape[a] == 0 for a in axes):
        raise ShapeError(f"{op}: Invalid number of data points (0) specified (operand {x})")


def _c2c_infer(x: TensorType, *, axes, inverse, norm) -> TensorType:
    if not x.dtype.is_complex:
        raise ShapeError(f"fft_c2c: expected a complex operand, got {x}")
    _check_axes("fft_c2c", x, axes)
    return x


def _c2c_impl(x, *, axes, inverse, norm):
    transform = np.fft.ifftn if inverse else np.fft.fftn
    return transform(x, axes=axes, norm=norm)


def _c2c_vjp(g, out, x, *, axes, inverse, norm):
    return bind(fft_c2c, g, axes=axes, inverse=not inverse, norm=_SWAP[norm])


fft_c2c = register(Primitive(
    "fft_c2c", Kind.EXTERN, _c2c_infer, _c2c_impl, (Rule(_c2c_vjp),), "FftC2CBackward0",
    attrs=("axes", "inverse", "norm")))


def _r2c_infer(x: TensorType, *, axis, norm) -> TensorType:
    if x.dtype not in (dtypes.float32, dtypes.float64):
        raise ShapeError(f"fft_r2c: expected a float32 or float64 operand, got {x}")
    _check_axes("fft_r2c", x, (axis,))
    shape = list(x.shape)
    shape[axis] = shape[axis] // 2 + 1
    return TensorType(tuple(shape), dtypes.to_complex(x.dtype))


def _r2c_vjp(g, out, x, *, axis, norm):
    n = x.shape[axis]
    widths = [(0, 0)] * g.ndim
    widths[axis] = (0, n - g.shape[axis])
    full = bind(fft_c2c, pad_axes(g, widths), axes=(axis,), inverse=True, norm=_SWAP[norm])
    return bind(P.real, full)


fft_r2c = register(Primitive(
    "fft_r2c", Kind.EXTERN, _r2c_infer, lambda x, *, axis, norm: np.fft.rfft(x, axis=axis, norm=norm),
    (Rule(_r2c_vjp),), "FftR2CBackward0", attrs=("axis", "norm")))


def _c2r_infer(x: TensorType, *, axis, n, norm) -> TensorType:
    if not x.dtype.is_complex:
        raise ShapeError(f"fft_c2r: expected a complex operand, got {x}")
    _check_axes("fft_c2r", x, (axis,))
    if n < 1 or x.shape[axis] != n // 2 + 1:
        raise ShapeError(f"fft_c2r: {n} outputs need {n // 2 + 1} frequencies along axis {axis}, "
                         f"got {x}")
    shape = list(x.shape)
    shape[axis] = n
    return TensorType(tuple(shape), dtypes.to_real(x.dtype))


def _c2r_vjp(g, out, x, *, axis, n, norm):
    half = bind(fft_r2c, g, axis=axis, norm=_SWAP[norm])
    m = half.shape[axis]
    twice = n - m            # frequencies 1 .. n - m stand for themselves and their mirror
    if twice <= 0:
        return half
    return cat([narrow(half, axis, 0, 1), mul(narrow(half, axis, 1, twice), 2.0),
                narrow(half, axis, 1 + twice, m - 1 - twice)], axis)


fft_c2r = register(Primitive(
    "fft_c2r", Kind.EXTERN, _c2r_infer,
    lambda x, *, axis, n, norm: np.fft.irfft(x, n=n, axis=axis, norm=norm),
    (Rule(_c2r_vjp),), "FftC2RBackward0", attrs=("axis", "n", "norm")))


# --------------------------------------------------------------------------- arguments


def _norm(norm: str | None) -> str:
    if norm is None:
        return "backward"
    if norm not in _NORMS:
        raise RuntimeError(f'Invalid normalization mode: "{norm}"')
    return norm


def _as_input(x, op: str) -> Tensor:
    """``x`` as a tensor an FFT takes: integers and bools in the default float type; 16-bit
    floats refused (torch's CPU FFTs have no half precision)."""
    x = as_tensor_operand(x)
    if x.dtype in (dtypes.float16, dtypes.bfloat16):
        raise RuntimeError(f"Unsupported dtype {'Half' if x.dtype is dtypes.float16 else 'BFloat16'}"
                           f" ({op} of {x.dtype.name}{list(x.shape)})")
    if not x.dtype.is_differentiable:
        x = cast(x, dtypes.get_default_dtype())
    return x


def _complex_input(x: Tensor) -> Tensor:
    return x if x.dtype.is_complex else cast(x, dtypes.to_complex(x.dtype))


def _real_input(x: Tensor, op: str) -> Tensor:
    if x.dtype.is_complex:
        raise RuntimeError(f"{op} expects a real input tensor, but got "
                           f"{'ComplexFloat' if x.dtype is dtypes.complex64 else 'ComplexDouble'}")
    return x


def _resize(x: Tensor, axis: int, n: int) -> Tensor:
    """``x`` cut or zero-padded to ``n`` along ``axis`` (torch's signal length)."""
    size = x.shape[axis]
    if n < 1:
        raise RuntimeError(f"Invalid number of data points ({n}) specified")
    if n < size:
        return narrow(x, axis, 0, n)
    if n > size:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, n - size)
        return pad_axes(x, widths)
    return x


def _dims_and_sizes(x: Tensor, s, dim, op: str, all_dims: bool) -> tuple[list[int], list[int]]:
    """torch's ``s``/``dim`` of an n-dimensional transform: the axes and the signal length
    along each (-1: the input's size there)."""
    if isinstance(dim, int):
        dim = (dim,)
    if s is not None:
        s = [int(v) for v in s]
        if dim is None:
            if len(s) > x.ndim:
                raise RuntimeError(f"Got shape with {len(s)} values but input tensor only has "
                                   f"{x.ndim} dimensions.")
            dim = range(x.ndim - len(s), x.ndim)
        elif len(s) != len(tuple(dim)):
            raise RuntimeError("When given, dim and shape arguments must have the same length")
    elif dim is None:
        dim = range(x.ndim) if all_dims else ()
    axes = [normalize_axis(d, x.ndim, op) for d in dim]
    if len(set(axes)) != len(axes):
        raise RuntimeError("FFT dims must be unique")
    if not axes and x.ndim == 0:
        raise RuntimeError(f"{op} expects a tensor with at least one dimension")
    sizes = [x.shape[a] if s is None or s[i] == -1 else s[i] for i, a in enumerate(axes)]
    return axes, sizes


# --------------------------------------------------------------------------- complex transforms


def _c2c(x, s, dim, norm, op: str, inverse: bool, all_dims: bool) -> Tensor:
    x = _as_input(x, op)
    axes, sizes = _dims_and_sizes(x, s, dim, op, all_dims)
    for a, n in zip(axes, sizes):
        x = _resize(x, a, n)
    norm = _norm(norm)
    if len(axes) == 1 and not x.dtype.is_complex:
        # torch transforms a real signal along one axis by r2c: the inverse transform is the
        # conjugate of the forward one with the other normalization
        if inverse:
            return bind(P.conj, _real_to_full(x, axes[0], _SWAP[norm]))
        return _real_to_full(x, axes[0], norm)
    x = _complex_input(x)
    if not axes:
        return x
    return bind(fft_c2c, x, axes=tuple(sorted(axes)), inverse=inverse, norm=norm)


@composite("FftR2CBackward0")
def _real_to_full(x: Tensor, axis: int, norm: str) -> Tensor:
    """The transform of a real signal along ``axis`` as torch computes it: the non-negative
    frequencies by r2c, the others from Hermitian symmetry (``X[n - k] = conj(X[k])``)."""
    half = bind(fft_r2c, x, axis=axis, norm=norm)
    n, m = x.shape[axis], half.shape[axis]
    if n == m:
        return half
    return cat([half, bind(P.conj, flip(narrow(half, axis, 1, n - m), (axis,)))], axis)


def fft(input, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:  # noqa: A002
    """The one-dimensional discrete Fourier transform along ``dim`` (``torch.fft.fft``)."""
    return _c2c(input, None if n is None else (n,), (dim,), norm, "fft", False, False)


def ifft(input, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:  # noqa: A002
    """The inverse of :func:`fft`."""
    return _c2c(input, None if n is None else (n,), (dim,), norm, "ifft", True, False)


def fft2(input, s=None, dim=(-2, -1), norm: str | None = None) -> Tensor:  # noqa: A002
    """The two-dimensional transform over ``dim``."""
    return _c2c(input, s, dim, norm, "fft2", False, False)


def ifft2(input, s=None, dim=(-2, -1), norm: str | None = None) -> Tensor:  # noqa: A002
    return _c2c(input, s, dim, norm, "ifft2", True, False)


def fftn(input, s=None, dim=None, norm: str | None = None) -> Tensor:  # noqa: A002
    """The n-dimensional transform over ``dim`` (all dims, or the last ``len(s)``)."""
    return _c2c(input, s, dim, norm, "fftn", False, True)


def ifftn(input, s=None, dim=None, norm: str | None = None) -> Tensor:  # noqa: A002
    return _c2c(input, s, dim, norm, "ifftn", True, True)


# --------------------------------------------------------------------------- real transforms


def _r2c(x, s, dim, norm, op: str, all_dims: bool) -> Tensor:
    """rfftn: r2c along the last of ``dim``, then c2c along the others (numpy's order)."""
    x = _real_input(_as_input(x, op), op)
    axes, sizes = _dims_and_sizes(x, s, dim, op, all_dims)
    for a, n in zip(axes, sizes):
        x = _resize(x, a, n)
    norm = _norm(norm)
    out = bind(fft_r2c, x, axis=axes[-1], norm=norm)
    if len(axes) > 1:
        out = bind(fft_c2c, out, axes=tuple(sorted(axes[:-1])), inverse=False, norm=norm)
    return out


def _c2r(x, s, dim, norm, op: str, all_dims: bool) -> Tensor:
    """irfftn: c2c inverse along all but the last of ``dim``, then c2r along the last, to
    ``s[-1]`` outputs (by default ``2 * (m - 1)`` of ``m`` frequencies)."""
    x = _complex_input(_as_input(x, op))
    axes, sizes = _dims_and_sizes(x, s, dim, op, all_dims)
    last = axes[-1]
    if s is None or s[-1] == -1:
        sizes[-1] = 2 * (x.shape[last] - 1)
    n = sizes[-1]
    if n < 1:
        raise RuntimeError(f"Invalid number of data points ({n}) specified")
    for a, size in zip(axes[:-1], sizes[:-1]):
        x = _resize(x, a, size)
    x = _resize(x, last, n // 2 + 1)
    norm = _norm(norm)
    if len(axes) > 1:
        x = bind(fft_c2c, x, axes=tuple(sorted(axes[:-1])), inverse=True, norm=norm)
    return bind(fft_c2r, x, axis=last, n=n, norm=norm)


def rfft(input, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:  # noqa: A002
    """The transform of a real signal: its ``n // 2 + 1`` non-negative frequencies."""
    return _r2c(input, None if n is None else (n,), (dim,), norm, "rfft", False)


def irfft(input, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:  # noqa: A002
    """The inverse of :func:`rfft`: ``n`` real values (``2 * (m - 1)`` by default)."""
    return _c2r(input, None if n is None else (n,), (dim,), norm, "irfft", False)


def rfft2(input, s=None, dim=(-2, -1), norm: str | None = None) -> Tensor:  # noqa: A002
    return _r2c(input, s, dim, norm, "rfft2", False)


def irfft2(input, s=None, dim=(-2, -1), norm: str | None = None) -> Tensor:  # noqa: A002
    return _c2r(input, s, dim, norm, "irfft2", False)


def rfftn(input, s=None, dim=None, norm: str | None = None) -> Tensor:  # noqa: A002
    return _r2c(input, s, dim, norm, "rfftn", True)


def irfftn(input, s=None, dim=None, norm: str | None = None) -> Tensor:  # noqa: A002
    return _c2r(input, s, dim, norm, "irfftn", True)


def _hermitian(op: str, x, s, dim, norm, all_dims: bool) -> Tensor:
    # The transform of a Hermitian-symmetric signal is real: irfftn of its conjugate with
    # the opposite normalization (numpy's hfft, extended to n dimensions as torch's).
    x = _complex_input(_as_input(x, op))
    return _c2r(bind(P.conj, x), s, dim, _SWAP[_norm(norm)], op, all_dims)


def _inverse_hermitian(op: str, x, s, dim, norm, all_dims: bool) -> Tensor:
    x = _real_input(_as_input(x, op), op)
    return bind(P.conj, _r2c(x, s, dim, _SWAP[_norm(norm)], op, all_dims))


def hfft(input, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:  # noqa: A002
    """The transform of a Hermitian-symmetric signal given by its first half: ``n`` reals
    (``2 * (m - 1)`` by default)."""
    return _hermitian("hfft", input, None if n is None else (n,), (dim,), norm, False)


def ihfft(input, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:  # noqa: A002
    """The inverse of :func:`hfft`: the first half of the inverse transform of a real signal."""
    return _inverse_hermitian("ihfft", input, None if n is None else (n,), (dim,), norm, False)


def hfft2(input, s=None, dim=(-2, -1), norm: str | None = None) -> Tensor:  # noqa: A002
    return _hermitian("hfft2", input, s, dim, norm, False)


def ihfft2(input, s=None, dim=(-2, -1), norm: str | None = None) -> Tensor:  # noqa: A002
    return _inverse_hermitian("ihfft2", input, s, dim, norm, False)


def hfftn(input, s=None, dim=None, norm: str | None = None) -> Tensor:  # noqa: A002
    return _hermitian("hfftn", input, s, dim, norm, True)


def ihfftn(input, s=None, dim=None, norm: str | None = None) -> Tensor:  # noqa: A002
    return _inverse_hermitian("ihfftn", input, s, dim, norm, True)


# --------------------------------------------------------------------------- helpers


def fftfreq(n: int, d: float = 1.0, *, dtype=None, layout=None, device=None,
            requires_grad: bool = False) -> Tensor:
    """The sample frequencies of an ``n``-point transform with sample spacing ``d``:
    ``[0, 1, ..., (n - 1) // 2, -(n // 2), ..., -1] / (d * n)``."""
    k = np.concatenate([np.arange(0, (n - 1) // 2 + 1), np.arange(-(n // 2), 0)])
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.get_default_dtype()
    return tensor(k / (d * n), dtype=dt, device=device, requires_grad=requires_grad)


def rfftfreq(n: int, d: float = 1.0, *, dtype=None, layout=None, device=None,
             requires_grad: bool = False) -> Tensor:
    """The non-negative sample frequencies of :func:`rfft`: ``[0, ..., n // 2] / (d * n)``."""
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.get_default_dtype()
    return tensor(np.arange(0, n // 2 + 1) / (d * n), dtype=dt, device=device,
                  requires_grad=requires_grad)


def _shift_dims(x: Tensor, dim) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(x.ndim))
    return (dim,) if isinstance(dim, int) else tuple(dim)


def fftshift(input: Tensor, dim=None) -> Tensor:  # noqa: A002
    """The zero frequency moved to the middle: a roll by ``size // 2`` along ``dim``."""
    dims = _shift_dims(input, dim)
    return roll(input, [input.shape[d] // 2 for d in dims], dims)


def ifftshift(input: Tensor, dim=None) -> Tensor:  # noqa: A002
    """The inverse of :func:`fftshift`."""
    dims = _shift_dims(input, dim)
    return roll(input, [-(input.shape[d] // 2) for d in dims], dims)


# --------------------------------------------------------------------------- JVP rules
# Forward mode (fusegrad.ops.dual): the transforms are linear, applied to the tangent.

for _prim in (fft_c2c, fft_r2c, fft_c2r):
    jvp_rule(_prim)(applied_to_tangent(_prim))


# --------------------------------------------------------------------------- batching rules

from fusegrad.ops.batching import axes_rule, batching  # noqa: E402

batching(fft_c2c)(axes_rule(fft_c2c))
for _prim in (fft_r2c, fft_c2r):
    batching(_prim)(axes_rule(_prim, "axis"))
del _prim
