"""torch.nn.functional's ``pad``: constant padding (negative amounts crop) and the modes that
copy from the data (reflect, replicate, circular)."""

from __future__ import annotations

from typing import Sequence

from fusegrad.ops import functional as F
from fusegrad.ops.composite import composite
from fusegrad.tensor import Tensor

__all__ = ["pad"]


def pad(input: Tensor, pad: Sequence[int], mode: str = "constant",  # noqa: A002
        value: float | None = None) -> Tensor:
    """Pad the last dims: ``pad = (left, right, top, bottom, ...)`` starts from the last dim.

    ``mode``: ``'constant'`` (``value``, default 0; negative amounts crop), ``'reflect'``
    (mirror without the edge), ``'replicate'`` (repeat the edge), ``'circular'`` (wrap).
    """
    pad = tuple(int(v) for v in pad)
    if len(pad) % 2:
        raise RuntimeError("Padding length must be divisible by 2")
    if len(pad) // 2 > input.ndim:
        raise RuntimeError(f"Padding length should be less than or equal to two times the input "
                           f"dimension but got padding length {len(pad)} and input of dimension "
                           f"{input.ndim}")
    widths = [(0, 0)] * input.ndim
    for i in range(len(pad) // 2):
        widths[input.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    if mode != "constant":
        if mode not in _PAD_MODES:
            raise NotImplementedError(f"Unrecognised padding mode {mode}")
        if value:
            raise RuntimeError(f"Padding mode \"{mode}\" doesn't take in value argument")
        _check_copy_pad(input, len(pad) // 2, mode)
        if mode != "circular":
            _check_copy_pad_output(input, widths, mode, len(pad) // 2)
        return _pad_by_copies(input, widths, mode)
    fill = 0 if value is None else value
    if all(lo >= 0 and hi >= 0 for lo, hi in widths):
        return F.pad_axes(input, widths, fill)
    return _pad_crop(input, tuple(widths), fill)


def _check_copy_pad(x: Tensor, nd: int, mode: str) -> None:
    """torch's checks of a non-constant pad of the last ``nd`` dims: the input is one of them
    plus a channel dim and maybe a batch dim; reflect and replicate need non-empty dims past
    the first."""
    if x.ndim not in (nd + 1, nd + 2):
        raise NotImplementedError(
            f"Padding size {2 * nd} is not supported for {x.ndim}D input tensor.\n"
            "Supported combinations for non-constant padding:\n"
            "  - 2D or 3D input: padding size = 2 (pads last dimension)\n"
            "  - 3D or 4D input: padding size = 4 (pads last 2 dimensions)\n"
            "  - 4D or 5D input: padding size = 6 (pads last 3 dimensions)")
    if mode != "circular" and 0 in x.shape[1:]:
        raise RuntimeError(f"Expected {nd + 1}D or {nd + 2}D (batch mode) tensor with possibly 0 "
                           f"batch size and other non-zero dimensions for input, but got: "
                           f"{list(x.shape)}")


def _edge_block(x: Tensor, dim: int, count: int, side: str, mode: str) -> Tensor:
    """The ``count`` elements that ``mode`` puts before (``side='lo'``) or after the data."""
    n = x.shape[dim]
    if mode == "circular":
        if count > n:
            raise RuntimeError("Padding value causes wrapping around more than once.")
        return F.narrow(x, dim, n - count, count) if side == "lo" else F.narrow(x, dim, 0, count)
    if mode == "replicate":
        if n == 0:
            raise RuntimeError("padding size should be less than the corresponding input "
                               "dimension")
        edge = F.narrow(x, dim, 0 if side == "lo" else n - 1, 1)
        shape = list(x.shape)
        shape[dim] = count
        return F.expand(edge, *shape)
    if count >= n:   # reflect
        raise RuntimeError(f"Argument #4: Padding size should be less than the corresponding "
                           f"input dimension, but got: padding ({count}, {count}) at dimension "
                           f"{dim} of input {list(x.shape)}")
    block = F.narrow(x, dim, 1, count) if side == "lo" else F.narrow(x, dim, n - 1 - count, count)
    return F.flip(block, (dim,))


_PAD_MODES = ("reflect", "replicate", "circular")


def _check_copy_pad_output(x: Tensor, widths, mode: str, nd: int) -> None:
    """torch's checks of the output size of reflect and replicate padding with negative amounts:
    a negative size raises, and so do sizes all below 1."""
    dims = range(x.ndim - nd, x.ndim)
    out = [x.shape[d] + lo + hi for d, (lo, hi) in enumerate(widths)]
    if all(out[d] < 1 for d in dims):
        names = "DHW"[3 - nd:]
        sizes = [f"{n}: {x.shape[d]}" for n, d in zip(names, dims)]
        given = (", ".join(sizes) if nd < 3 else f"{sizes[0]} {sizes[1]}, {sizes[2]}") + (
            " " if mode == "replicate" and nd == 2 else "")
        calculated = " ".join(f"{n}: {out[d]}" for n, d in zip(names, dims))
        raise RuntimeError(f"input ({given}) is too small. Calculated output {calculated}")
    if any(n < 0 for n in out):
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(out)}: {out}")


def _pad_by_copies(x: Tensor, widths, mode: str) -> Tensor:
    """Non-constant padding: per padded dim, concatenate the edge blocks that ``mode`` copies
    from the data and crop negative amounts. Reflect and replicate index the whole input, as
    torch's do (``pad(x, (-1, 2), 'reflect')`` of ``[0, 1, 2, 3, 4]`` is ``[1, 2, 3, 4, 3, 2]``):
    they pad first and crop after; circular wraps around what is left after the crop."""
    if mode == "reflect":
        for dim in reversed(range(x.ndim)):   # torch checks the last dim first
            lo, hi = widths[dim]
            if lo >= x.shape[dim] or hi >= x.shape[dim]:
                # torch numbers the pad amounts as arguments: the last dim's are #4, then #6, #8
                raise RuntimeError(f"Argument #{4 + 2 * (x.ndim - 1 - dim)}: Padding size should "
                                   f"be less than the corresponding input dimension, but got: "
                                   f"padding ({lo}, {hi}) at dimension {dim} of input "
                                   f"{list(x.shape)}")
    for dim, (lo, hi) in enumerate(widths):
        if lo == 0 and hi == 0:
            continue
        crop_first = mode == "circular"
        if crop_first and (lo < 0 or hi < 0):
            x = _crop(x, dim, lo, hi)
        parts = []
        if lo > 0:
            parts.append(_edge_block(x, dim, lo, "lo", mode))
        parts.append(x)
        if hi > 0:
            parts.append(_edge_block(x, dim, hi, "hi", mode))
        x = F.cat(parts, dim) if len(parts) > 1 else x
        if not crop_first and (lo < 0 or hi < 0):
            x = _crop(x, dim, lo, hi)
    return x


def _crop(x: Tensor, dim: int, lo: int, hi: int) -> Tensor:
    """``x`` without ``-lo`` leading and ``-hi`` trailing elements of ``dim`` (where negative)."""
    start = max(-lo, 0)
    return F.narrow(x, dim, start, x.shape[dim] - start - max(-hi, 0))


@composite("ConstantPadNdBackward0")
def _pad_crop(x: Tensor, widths, value) -> Tensor:
    padded = F.pad_axes(x, [(max(lo, 0), max(hi, 0)) for lo, hi in widths], value)
    starts = [max(-lo, 0) for lo, _ in widths]
    stops = [d - max(-hi, 0) for d, (_, hi) in zip(padded.shape, widths, strict=True)]
    if any(b < a for a, b in zip(starts, stops, strict=True)):
        raise RuntimeError(f"The input size {list(x.shape)}, plus negative padding "
                           f"{[w for pair in widths for w in pair]} resulted in a negative output "
                           "size, which is invalid. Check dimension of your input.")
    return F.slice_axes(padded, starts, stops, [1] * x.ndim)

