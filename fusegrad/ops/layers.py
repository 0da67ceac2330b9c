"""torch.nn.functional's layers: ``linear``, ``bilinear``, ``embedding``, ``one_hot``,
``normalize``, ``pixel_shuffle``, ``pixel_unshuffle``, ``pairwise_distance``."""

from __future__ import annotations

import operator

from fusegrad import dtypes
from fusegrad.ops import functional as F
from fusegrad.ops import prims as P
from fusegrad.ops.autocast import wrap_namespace
from fusegrad.ops.composite import composite
from fusegrad.ops.creation import arange
from fusegrad.ops.matmul import float32_sums
from fusegrad.ops.products import _write_out
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor

__all__ = ["linear", "bilinear", "embedding", "one_hot", "normalize", "pixel_shuffle",
           "pixel_unshuffle", "pairwise_distance"]


def _int_factor(op: str, name: str, value) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{op}(): argument '{name}' (position 2) must be int, not "
                        f"{type(value).__name__}") from None


def _check_pixel_input(op: str, x: Tensor, name: str, factor: int) -> None:
    if x.ndim < 3:
        raise RuntimeError(f"{op} expects input to have at least 3 dimensions, but got input "
                           f"with {x.ndim} dimension(s)")
    if factor <= 0:
        raise RuntimeError(f"{op} expects a positive {name}, but got {factor}")


@composite("PixelShuffleBackward0")
def _pixel_shuffle(x: Tensor, r: int) -> Tensor:
    *lead, c, h, w = x.shape
    blocks = F.reshape(x, (*lead, c // (r * r), r, r, h, w))
    n = len(lead)
    moved = F.permute(blocks, (*range(n), n, n + 3, n + 1, n + 4, n + 2))
    return F.reshape(moved, (*lead, c // (r * r), h * r, w * r))


@public(torch=True)
def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:  # noqa: A002
    """(*, C * r * r, H, W) to (*, C, H * r, W * r): each channel block of r * r becomes an
    r x r patch (sub-pixel convolution's upsampling)."""
    r = _int_factor("pixel_shuffle", "upscale_factor", upscale_factor)
    _check_pixel_input("pixel_shuffle", input, "upscale_factor", r)
    if input.shape[-3] % (r * r):
        raise RuntimeError(f"pixel_shuffle expects its input's 'channel' dimension to be "
                           f"divisible by the square of upscale_factor, but input.size(-3)="
                           f"{input.shape[-3]} is not divisible by {r * r}")
    return _pixel_shuffle(input, r)


@composite("PixelUnshuffleBackward0")
def _pixel_unshuffle(x: Tensor, r: int) -> Tensor:
    *lead, c, h, w = x.shape
    patches = F.reshape(x, (*lead, c, h // r, r, w // r, r))
    n = len(lead)
    moved = F.permute(patches, (*range(n), n, n + 2, n + 4, n + 1, n + 3))
    return F.reshape(moved, (*lead, c * r * r, h // r, w // r))


@public(torch=True)
def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:  # noqa: A002
    """The inverse of :func:`pixel_shuffle`: (*, C, H * r, W * r) to (*, C * r * r, H, W)."""
    r = _int_factor("pixel_unshuffle", "downscale_factor", downscale_factor)
    _check_pixel_input("pixel_unshuffle", input, "downscale_factor", r)
    for dim, side in ((-2, "height"), (-1, "width")):
        if input.shape[dim] % r:
            raise RuntimeError(f"pixel_unshuffle expects {side} to be divisible by "
                               f"downscale_factor, but input.size({dim})={input.shape[dim]} is "
                               f"not divisible by {r}")
    return _pixel_unshuffle(input, r)


@public(torch=True)
def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6,
                      keepdim: bool = False) -> Tensor:
    """``||x1 - x2 + eps||_p`` over the last dim (of the broadcast shape), as torch computes
    it: ``eps`` keeps the gradient finite where the inputs are equal."""
    last = max(x1.ndim, x2.ndim) - 1
    diff = F.add(F.sub(x1, x2), eps)
    if last < 0:   # two 0-d tensors: torch takes the norm of the scalar
        return F.norm(diff, p)
    return F.norm(diff, p, last, keepdim)


@public(torch=True)
def bilinear(input1: Tensor, input2: Tensor, weight: Tensor,
             bias: Tensor | None = None) -> Tensor:
    """``y[..., o] = sum_ij x1[..., i] * weight[o, i, j] * x2[..., j] + bias[o]``."""
    if input1.ndim != input2.ndim:
        raise RuntimeError(f"bilinear(): input dimensions do not match: got {input1.ndim} and "
                           f"{input2.ndim}")
    for d in range(input1.ndim - 1):
        if input1.shape[d] != input2.shape[d]:
            raise RuntimeError(f"bilinear(): input batch dimensions do not match at dim {d}: "
                               f"got {input1.shape[d]} and {input2.shape[d]}")
    if input1.shape[-1] != weight.shape[1]:
        raise RuntimeError(f"bilinear(): input1 size does not match weight size: got "
                           f"{input1.shape[-1]} but expected {weight.shape[1]}")
    if input2.shape[-1] != weight.shape[2]:
        raise RuntimeError(f"bilinear(): input2 size does not match weight size: got "
                           f"{input2.shape[-1]} but expected {weight.shape[2]}")
    if bias is not None and bias.ndim and bias.shape[0] != weight.shape[0]:
        raise RuntimeError(f"bilinear(): bias size does not match weight size: got "
                           f"{bias.shape[0]} but expected {weight.shape[0]}")
    operands = {"input1": input1, "input2": input2, "weight": weight,
                **({"bias": bias} if bias is not None else {})}
    if len({t.dtype for t in operands.values()}) > 1:     # the bias's add would promote
        raise RuntimeError("All tensors must have the same dtype, got " + ", ".join(
            f"{name}: {t.dtype.name}" for name, t in operands.items()))
    out = F.einsum("...i,oij,...j->...o", input1, weight, input2)
    return out if bias is None else F.add(out, bias)


def _linear_2d(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    if bias is not None and x.dtype in (dtypes.bfloat16, dtypes.float16):
        # torch's 16-bit addmm adds the bias to the float32 sums and rounds once.
        sums = float32_sums(x, weight, b_transposed=True)
        return F.cast(F.add(sums, F.cast(bias, dtypes.float32)), x.dtype)
    out = F.matmul(x, F.t(weight))
    return out if bias is None else F.add(out, bias)


def _linear_nd(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    # Fold the batch dims into one so the product is a single 2-D matmul (as torch does).
    lead = tuple(x.shape[:-1])
    out = _linear_2d(F.reshape(x, (-1, x.shape[-1])), weight, bias)
    return F.reshape(out, lead + (weight.shape[0],))


_addmm = composite("AddmmBackward0", kernel=True)(_linear_2d)
_linear_view = composite("ViewBackward0", kernel=True)(_linear_nd)
_linear_unsafe_view = composite("UnsafeViewBackward0")(_linear_nd)
_linear_squeeze = composite("SqueezeBackward4")(_linear_nd)


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:  # noqa: A002
    """``input @ weight.T + bias``; ``weight`` is (out_features, in_features)."""
    if input.ndim == 0:
        raise RuntimeError("both arguments to linear need to be at least 1D, but they are 0D "
                           f"and {weight.ndim}D")
    if input.shape[-1] != weight.shape[-1]:
        rows = input.shape[-2] if input.ndim > 1 else 1
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({rows}x"
                           f"{input.shape[-1]} and {weight.shape[-1]}x{weight.shape[0]})")
    if bias is not None and bias.dtype is not weight.dtype:
        # torch adds the bias in its product (addmm), which promotes nothing.
        raise RuntimeError(f"linear: self and mat2 must have the same dtype, but got "
                           f"{bias.dtype.name} and {weight.dtype.name} (bias "
                           f"{bias.dtype.name}{list(bias.shape)}, weight "
                           f"{weight.dtype.name}{list(weight.shape)})")
    if bias is not None and bias.ndim > 1:
        # A bias with more than a row: torch expands it to the product's shape, which it
        # never enlarges (the kernels below add a row, or a bias in the folded 2-D shape).
        out = linear(input, weight)
        return F.add(out, F.broadcast_to(bias, tuple(out.shape)))
    if input.ndim == 2:
        return _addmm(input, weight, bias) if bias is not None else F.matmul(input, F.t(weight))
    if bias is not None:
        return _linear_view(input, weight, bias)
    return (_linear_squeeze if input.ndim == 1 else _linear_unsafe_view)(input, weight, None)


@composite("EmbeddingBackward0")
def _embedding(indices: Tensor, weight: Tensor, padding_idx: int | None) -> Tensor:
    rows = F.take(weight, indices, 0)
    if padding_idx is None:
        return rows
    # The padding row gets no gradient: read it from the detached weight.
    is_pad = F.unsqueeze(F.eq(indices, padding_idx), -1)
    return F.where(is_pad, F.take(weight.detach(), indices, 0), rows)


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None,  # noqa: A002
              max_norm: float | None = None, norm_type: float = 2.0,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """Rows of ``weight`` at the integer ``input``: shape ``input.shape + (dim,)``."""
    if input.dtype not in (dtypes.int64, dtypes.int32):
        raise RuntimeError("Expected tensor for argument #1 'indices' to have one of the "
                           f"following scalar types: Long, Int; but got {input.type()} instead "
                           "(while checking arguments for embedding)")
    if max_norm is not None or scale_grad_by_freq or sparse:
        raise NotImplementedError("embedding: max_norm, scale_grad_by_freq and sparse are not "
                                  "supported")
    if padding_idx is not None:
        n = weight.shape[0]
        if not -n <= padding_idx < n:
            raise AssertionError("Padding_idx must be within num_embeddings")
        padding_idx %= n
    input = F.bind(P.check_index, input, op="embedding", size=weight.shape[0], dim=0,
                   wrap=False)
    return _embedding(input, weight, padding_idx)


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """int64 tensor of shape ``tensor.shape + (num_classes,)`` with ones at the indices;
    ``num_classes=-1`` takes ``max + 1``."""
    if tensor.dtype is not dtypes.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if num_classes == -1:
        if tensor.numel() == 0:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        num_classes = int(F.amax(tensor)) + 1
    if tensor._trace is None and tensor.numel():    # values of a traced one are unknown
        if bool(F.any(F.lt(tensor, 0))):
            raise RuntimeError("Class values must be non-negative.")
        if bool(F.any(F.ge(tensor, num_classes))):
            raise RuntimeError("Class values must be smaller than num_classes.")
    return F.cast(F.eq(F.unsqueeze(tensor, -1), arange(num_classes)), dtypes.int64)


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12,  # noqa: A002
              out=None) -> Tensor:
    """``input / max(||input||_p, eps)`` along ``dim`` (into ``out`` when given)."""
    denom = F.expand_as(F.clamp(F.norm(input, p, dim, keepdim=True), min=eps), input)
    return _write_out(F.div(input, denom), out, "normalize")


# torch's autocast lists name linear and normalize (bilinear is a public op, wrapped by the
# registry): wrapped once, here.
wrap_namespace(globals())
