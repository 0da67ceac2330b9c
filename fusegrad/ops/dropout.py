"""torch.nn.functional's dropout family: dropout, its channel-wise forms (dropout1d, 2d,
3d) and alpha dropout for SELU networks. The masks come from :func:`fusegrad.rand`
(counter-based), so ``manual_seed`` makes them reproducible and a compiled dropout fuses
like any elementwise op."""

from __future__ import annotations

import math
import warnings

from fusegrad.ops import functional as F
from fusegrad.ops.creation import rand
from fusegrad.tensor import Tensor

__all__ = ["dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d",
           "dropout3d"]


def _check_p(p: float) -> None:
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _dropout(input: Tensor, p: float, training: bool, inplace: bool,  # noqa: A002
             alpha: bool = False, channels: str = "") -> Tensor:
    """torch's ``_dropout_impl``: keep each element (or with ``channels`` "batched" or
    "unbatched", each channel: dim 1 or dim 0) with probability ``1 - p``. Plain dropout
    scales the kept values by ``1 / (1 - p)``; alpha dropout gives the dropped ones SELU's
    saturation value and keeps the mean and variance with an affine map ``a * x + b``
    (Klambauer et al., 2017)."""
    if not training or p == 0.0 or input.numel() == 0:
        return input
    if p == 1.0:
        scale = F.zeros_like(input)      # input * 0, as torch (an inf or NaN gives NaN)
        return input.mul_(scale) if inplace else F.mul(input, scale)
    noise_shape = _channel_noise_shape(input, channels) if channels else tuple(input.shape)
    keep = F.cast(F.lt(rand(noise_shape, dtype=input.dtype, device=input.device), 1.0 - p),
                  input.dtype)
    if not alpha:
        scale = F.mul(keep, 1.0 / (1.0 - p))
        return input.mul_(scale) if inplace else F.mul(input, scale)
    selu_saturation = 1.7580993408473766      # -SELU(-inf) = scale * alpha
    a = 1.0 / math.sqrt((selu_saturation ** 2 * p + 1) * (1 - p))
    scale = F.mul(keep, a)
    shift = F.add(F.mul(F.sub(keep, 1.0), selu_saturation * a), selu_saturation * a * p)
    return input.mul_(scale).add_(shift) if inplace else F.add(F.mul(input, scale), shift)


def _channel_noise_shape(input: Tensor, channels: str) -> tuple[int, ...]:  # noqa: A002
    """One draw per channel (dim 1 of a batch, dim 0 of one sample), spread over the rest."""
    if input.ndim < 2:
        raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
    lead = 2 if channels == "batched" else 1
    return tuple(input.shape[:lead]) + (1,) * (input.ndim - lead)


def dropout(input: Tensor, p: float = 0.5, training: bool = True,  # noqa: A002
            inplace: bool = False) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``.

    The mask comes from :func:`fusegrad.rand`, so ``manual_seed`` makes it reproducible.
    Outside training (or with ``p == 0``) the input is returned itself, as in torch.
    """
    _check_p(p)
    return _dropout(input, p, training, inplace)


def alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False,  # noqa: A002
                  inplace: bool = False) -> Tensor:
    """Dropout for SELU networks: dropped elements take SELU's negative saturation value and
    an affine map keeps the input's mean and variance. ``training`` defaults to False, as
    in torch."""
    _check_p(p)
    return _dropout(input, p, training, inplace, alpha=True)


def feature_alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False,  # noqa: A002
                          inplace: bool = False) -> Tensor:
    """:func:`alpha_dropout` of whole channels: dim 1 of (N, C, *)."""
    _check_p(p)
    return _dropout(input, p, training, inplace, alpha=True, channels="batched")


def dropout1d(input: Tensor, p: float = 0.5, training: bool = True,  # noqa: A002
              inplace: bool = False) -> Tensor:
    """Zero whole channels of (N, C, L) or (C, L) with probability ``p``, scaling the rest by
    ``1 / (1 - p)``."""
    _check_p(p)
    if input.ndim not in (2, 3):
        raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {input.ndim}D "
                           "input. Note that dropout1d exists to provide channel-wise dropout "
                           "on inputs with 1 spatial dimension, a channel dimension, and an "
                           "optional batch dimension (i.e. 2D or 3D inputs).")
    return _dropout(input, p, training, inplace,
                    channels="batched" if input.ndim == 3 else "unbatched")


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True,  # noqa: A002
              inplace: bool = False) -> Tensor:
    """Zero whole channels of (N, C, H, W) with probability ``p``, scaling the rest by
    ``1 / (1 - p)``. As torch, a 3-D input is read as (N, C, L), not as one sample."""
    _check_p(p)
    if input.ndim not in (3, 4):
        warnings.warn(f"dropout2d: Received a {input.ndim}-D input to dropout2d, which is "
                      "deprecated and will result in an error in a future release. To retain "
                      "the behavior and silence this warning, please use dropout instead.",
                      stacklevel=2)
    if input.ndim == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that "
                      "channel-wise 1D dropout behavior is desired - input is interpreted as "
                      "shape (N, C, L), where C is the channel dim.", stacklevel=2)
    return _dropout(input, p, training, inplace, channels="batched")


def dropout3d(input: Tensor, p: float = 0.5, training: bool = True,  # noqa: A002
              inplace: bool = False) -> Tensor:
    """Zero whole channels of (N, C, D, H, W) or (C, D, H, W) with probability ``p``, scaling
    the rest by ``1 / (1 - p)``."""
    _check_p(p)
    if input.ndim not in (4, 5):
        warnings.warn(f"dropout3d: Received a {input.ndim}-D input to dropout3d, which is "
                      "deprecated and will result in an error in a future release. To retain "
                      "the behavior and silence this warning, please use dropout instead.",
                      stacklevel=2)
    return _dropout(input, p, training, inplace,
                    channels="batched" if input.ndim == 5 else "unbatched")

