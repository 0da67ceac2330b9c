"""More of torch.nn.functional's layers: ``pixel_shuffle``, ``pixel_unshuffle``,
``pairwise_distance``, ``bilinear`` (re-exported by :mod:`fusegrad.nn.functional`)."""

from __future__ import annotations

import operator

from fusegrad.ops import functional as F
from fusegrad.ops.composite import composite
from fusegrad.ops.registry import public
from fusegrad.tensor import Tensor


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
