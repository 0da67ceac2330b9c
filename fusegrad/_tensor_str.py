"""Format tensors exactly the way PyTorch 2.x's ``repr(tensor)`` does.

The single entry point is :func:`format_tensor`, which takes the tensor's values as a numpy array
plus a little metadata (dtype name, device, extra suffixes) and returns strings such as
``tensor([1.0000e-05, 1.0000e+05])`` or ``tensor(9., grad_fn=<PowBackward0>)``.

The layout rules follow the print options (:data:`PRINT_OPTS`, set by :func:`set_printoptions`;
by default precision 4, summarization threshold 1000 elements, 3 edge items, line width 80)
and the behaviour of torch's element formatter:

* integer and bool tensors print ``str(value)`` right-aligned to the widest element;
* float tensors pick one of three modes from their *nonzero finite* values only: "integer"
  (``2.``), fixed point (``0.1000``) or scientific (``1.0000e-05``); scientific is chosen when
  max/min > 1000, max > 1e8 or min < 1e-4 (all on absolute values), unless ``sci_mode`` says
  which;
* when the tensor has more than ``threshold`` elements, each dimension longer than twice
  ``edgeitems`` is cut to its first and last ``edgeitems`` entries around ``...``, and the
  element width is computed on that subset.

Only numpy, ml_dtypes and the standard library are used, so this module can be imported (and
tested) without the rest of the package.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

import ml_dtypes
import numpy as np

__all__ = ["format_tensor", "PrintOptions", "PRINT_OPTS", "set_printoptions",
           "get_printoptions"]


@dataclass
class PrintOptions:
    """torch's print options: digits after the point, the element count above which a tensor
    is summarized, the entries kept at each end of a summarized dimension, the characters per
    line, and scientific notation forced on (True), off (False) or chosen per tensor (None)."""

    precision: int = 4
    threshold: float = 1000
    edgeitems: int = 3
    linewidth: int = 80
    sci_mode: bool | None = None


PRINT_OPTS = PrintOptions()
_PROFILES = {"default": PrintOptions(), "short": PrintOptions(precision=2, edgeitems=2),
             "full": PrintOptions(threshold=math.inf)}


def set_printoptions(precision: int | None = None, threshold: float | None = None,
                     edgeitems: int | None = None, linewidth: int | None = None,
                     profile: str | None = None, sci_mode: bool | None = None) -> None:
    """Set the print options, as ``torch.set_printoptions``: a ``profile`` ("default",
    "short" or "full") first, then each option given; ``sci_mode`` is always set (None: the
    automatic choice).

    >>> import fusegrad as torch
    >>> torch.set_printoptions(precision=2)
    >>> torch.tensor([1.23456])
    tensor([1.23])
    >>> torch.set_printoptions(profile="default")
    """
    if profile is not None:
        if profile not in _PROFILES:
            raise ValueError(f"set_printoptions: profile must be one of {sorted(_PROFILES)}, "
                             f"got {profile!r}")
        chosen = _PROFILES[profile]
        (PRINT_OPTS.precision, PRINT_OPTS.threshold, PRINT_OPTS.edgeitems,
         PRINT_OPTS.linewidth) = (chosen.precision, chosen.threshold, chosen.edgeitems,
                                  chosen.linewidth)
    if precision is not None:
        PRINT_OPTS.precision = precision
    if threshold is not None:
        PRINT_OPTS.threshold = threshold
    if edgeitems is not None:
        PRINT_OPTS.edgeitems = edgeitems
    if linewidth is not None:
        PRINT_OPTS.linewidth = linewidth
    PRINT_OPTS.sci_mode = sci_mode


def get_printoptions() -> dict:
    """The current print options, as ``torch.get_printoptions``."""
    return dataclasses.asdict(PRINT_OPTS)


_PREFIX = "tensor("
# Written before dtype names, where torch writes "torch.". Suffix wrapping depends on its length.
_DTYPE_PREFIX = "fusegrad."


def _is_floating(dtype: np.dtype) -> bool:
    """True for real floating dtypes, including ml_dtypes ones (bfloat16, float8_*)."""
    if dtype.kind == "f":
        return True
    try:
        ml_dtypes.finfo(dtype)
    except (ValueError, TypeError, KeyError):
        return False
    return True


def _to_printable(data: np.ndarray) -> np.ndarray:
    """Widen values so that ``tolist()`` yields exact Python floats/complexes/ints/bools.

    torch formats elements via ``.item()``/``.tolist()``, which turn every float dtype into a
    Python float holding the exact stored value; casting to float64 reproduces that.
    """
    if data.dtype.kind == "c":
        return data.astype(np.complex128)
    if _is_floating(data.dtype):
        return data.astype(np.float64)
    return data


class _Formatter:
    """Decides the common width and notation of every element of one tensor.

    Built from the (possibly summarized) values, like torch's ``_Formatter``; afterwards
    :meth:`format` renders any single value of the tensor padded to :attr:`width`.
    """

    def __init__(self, values: np.ndarray, floating: bool) -> None:
        self.floating = floating
        self.int_mode = True
        self.sci_mode = False
        self.width = 1
        flat = values.reshape(-1)
        if not floating:
            for value in flat.tolist():
                self.width = max(self.width, len(str(value)))
            return
        nonzero_finite = flat[np.isfinite(flat) & (flat != 0)]
        if nonzero_finite.size == 0:
            # Only zeros/nan/inf: torch keeps width 1 and integer mode, whatever sci_mode says.
            return
        abs_vals = np.abs(nonzero_finite)
        vmin, vmax = float(abs_vals.min()), float(abs_vals.max())
        self.int_mode = bool(np.all(nonzero_finite == np.ceil(nonzero_finite)))
        auto = vmax / vmin > 1000.0 or vmax > 1.0e8 or vmin < 1.0e-4
        self.sci_mode = auto if PRINT_OPTS.sci_mode is None else bool(PRINT_OPTS.sci_mode)
        items = nonzero_finite.tolist()
        if self.sci_mode:
            widths = (len(f"{v:.{PRINT_OPTS.precision}e}") for v in items)
        elif self.int_mode:
            # The trailing "." that marks a float is not in the "{:.0f}" text, hence +1.
            widths = (len(f"{v:.0f}") + 1 for v in items)
        else:
            widths = (len(f"{v:.{PRINT_OPTS.precision}f}") for v in items)
        self.width = max(self.width, max(widths))

    def format(self, value: float | int | bool) -> str:
        """Render one element, right-aligned to the common width."""
        if not self.floating:
            text = str(value)
        elif self.sci_mode:
            text = f"{value:{self.width}.{PRINT_OPTS.precision}e}"
        elif self.int_mode:
            text = f"{value:.0f}"
            if math.isfinite(value):
                text += "."
        else:
            text = f"{value:.{PRINT_OPTS.precision}f}"
        return text.rjust(self.width)


class _ComplexFormatter:
    """Pairs one formatter for the real parts and one for the imaginary parts (torch style)."""

    def __init__(self, values: np.ndarray) -> None:
        self.real = _Formatter(values.real, floating=True)
        self.imag = _Formatter(values.imag, floating=True)
        # The extra 1 accounts for the "j" after the imaginary part.
        self.width = self.real.width + self.imag.width + 1

    def format(self, value: complex) -> str:
        """Render ``a+bj`` with the sign of the imaginary part taken from its own text."""
        real_text = self.real.format(value.real)
        imag_text = (self.imag.format(value.imag) + "j").lstrip()
        if imag_text[0] in "+-":
            return real_text + imag_text
        return real_text + "+" + imag_text


_AnyFormatter = Union[_Formatter, _ComplexFormatter]


def _summarized(values: np.ndarray) -> np.ndarray:
    """Keep only the first/last ``edgeitems`` entries of every dimension longer than twice
    that (torch's ``get_summarized_data``, down to its edgeitems=0 cases: a vector keeps all
    of itself, ``x[-0:]``, a higher-rank tensor nothing).

    The formatter is built from this subset, so elided elements do not affect the width.
    """
    edge = PRINT_OPTS.edgeitems
    if values.ndim > 1 and not edge:
        return values[(slice(0, 0),) * values.ndim]
    for axis, size in enumerate(values.shape):
        if size > 2 * edge and (edge or values.ndim > 1):
            keep = np.r_[0:edge, size - edge : size]
            values = np.take(values, keep, axis=axis)
    return values


def _vector_str(vec: np.ndarray, indent: int, summarize: bool, fmt: _AnyFormatter) -> str:
    """Format a 1-D array, wrapping to as many elements per line as fit in the line width."""
    edge = PRINT_OPTS.edgeitems
    # Each element is followed by ", " hence the +2.
    per_line = max(1, int((PRINT_OPTS.linewidth - indent) // (fmt.width + 2)))
    if summarize and not edge:
        items = ["..."]
    elif summarize and vec.shape[0] > 2 * edge:
        items = (
            [fmt.format(v) for v in _to_printable(vec[:edge]).tolist()]
            + [" ..."]
            + [fmt.format(v) for v in _to_printable(vec[-edge:]).tolist()]
        )
    else:
        items = [fmt.format(v) for v in _to_printable(vec).tolist()]
    lines = [", ".join(items[i : i + per_line]) for i in range(0, len(items), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _nested_str(values: np.ndarray, indent: int, summarize: bool, fmt: _AnyFormatter) -> str:
    """Format an array of any rank; sub-arrays are separated by ndim-1 newlines like torch."""
    if values.ndim == 0:
        return fmt.format(_to_printable(values).item())
    if values.ndim == 1:
        return _vector_str(values, indent, summarize, fmt)
    edge = PRINT_OPTS.edgeitems
    if summarize and not edge:
        return "[...]"
    size = values.shape[0]
    if summarize and size > 2 * edge:
        rows = list(range(edge)) + [None] + list(range(size - edge, size))
    else:
        rows = list(range(size))
    parts = ["..." if i is None else _nested_str(values[i], indent + 1, summarize, fmt) for i in rows]
    separator = "," + "\n" * (values.ndim - 1) + " " * (indent + 1)
    return "[" + separator.join(parts) + "]"


def _values_str(data: np.ndarray, indent: int) -> str:
    """Format the values of a non-empty array (the part between ``tensor(`` and suffixes)."""
    summarize = data.size > PRINT_OPTS.threshold
    # Only the summarized subset is widened here; _nested_str widens just the slices it prints,
    # so huge tensors are never copied whole.
    basis = _to_printable(_summarized(data) if summarize else data)
    fmt: _AnyFormatter
    if basis.dtype.kind == "c":
        fmt = _ComplexFormatter(basis)
    else:
        fmt = _Formatter(basis, floating=basis.dtype.kind == "f")
    return _nested_str(data, indent, summarize, fmt)


def _add_suffixes(text: str, suffixes: Sequence[str], indent: int) -> str:
    """Append ``, suffix`` items, moving one to a new line when it would pass the line
    width."""
    parts = [text]
    # torch's own measure of the last line (it over-counts by 2 when there is no newline);
    # reproduced as is because it decides where suffixes wrap.
    last_line_len = len(text) - text.rfind("\n") + 1
    for suffix in suffixes:
        if last_line_len + len(suffix) + 2 > PRINT_OPTS.linewidth:
            parts.append(",\n" + " " * indent + suffix)
            last_line_len = indent + len(suffix)
        else:
            parts.append(", " + suffix)
            last_line_len += len(suffix) + 2
    parts.append(")")
    return "".join(parts)


def _default_dtype_names(default_dtype: bool) -> tuple[str, str]:
    """The (default float, default complex) dtype names for the current default dtype."""
    return ("float32", "complex64") if default_dtype else ("float64", "complex128")


def format_tensor(
    data: np.ndarray,
    *,
    dtype_name: str,
    default_dtype: bool,
    suffixes: Sequence[str] = (),
    device: str | None = None,
) -> str:
    """Return ``repr`` of a tensor holding ``data``, formatted as PyTorch 2.x would.

    Args:
        data: the tensor's values; any numpy dtype (bool, ints, floats, ml_dtypes.bfloat16,
            complex) and any shape, including 0-d and empty ones.
        dtype_name: the tensor's dtype name without prefix, e.g. ``"float32"`` or ``"int64"``.
        default_dtype: True when float32 is the current default float dtype (the usual case);
            False means the default is float64, as after ``set_default_dtype(float64)``. The
            default float dtype, its complex counterpart, int64 and bool are not printed; any
            other dtype is shown as ``dtype=fusegrad.<name>``.
        suffixes: already formatted trailing items such as ``"grad_fn=<MulBackward0>"`` or
            ``"requires_grad=True"``; they follow the device and dtype items.
        device: when given, printed first among the suffixes as ``device='<device>'``.

    Returns:
        The full string, e.g. ``"tensor([2., 4., 6.])"``.
    """
    data = np.asarray(data)
    indent = len(_PREFIX)
    default_float, default_complex = _default_dtype_names(default_dtype)
    items: list[str] = []
    if device is not None:
        items.append(f"device='{device}'")
    if data.size == 0:
        # Like numpy, the shape is spelled out unless it is the plain 1-D (0,).
        if data.ndim != 1:
            items.append(f"size={tuple(data.shape)}")
        # No elements reveal the dtype, so everything but the default float dtype is shown.
        if dtype_name != default_float:
            items.append(f"dtype={_DTYPE_PREFIX}{dtype_name}")
        body = "[]"
    else:
        if not PRINT_OPTS.edgeitems:
            items.append(f"size={tuple(data.shape)}")        # torch's, with edgeitems=0
        if dtype_name not in (default_float, default_complex, "int64", "bool"):
            items.append(f"dtype={_DTYPE_PREFIX}{dtype_name}")
        body = _values_str(data, indent)
    items.extend(suffixes)
    return _add_suffixes(_PREFIX + body, items, indent)
