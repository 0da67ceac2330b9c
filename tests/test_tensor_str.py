"""Tests for fusegrad._tensor_str.format_tensor.

Every expected string below was produced by ``repr()`` of the same values in real PyTorch 2.13
(with ``torch.`` replaced by ``fusegrad.``), so these tests pin byte-for-byte torch
compatibility without importing torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np
import pytest

from fusegrad import _tensor_str
from fusegrad._tensor_str import format_tensor


class Case(NamedTuple):
    """One formatting case: values, dtype, and the string torch prints for them."""

    id: str
    data: Callable[[], Any]
    dtype_name: str
    expected: str
    suffixes: Sequence[str] = ()
    default_dtype: bool = True


def _array(data: Any, dtype_name: str) -> np.ndarray:
    """Build the numpy array a fusegrad tensor of ``dtype_name`` would hold."""
    dtype = ml_dtypes.bfloat16 if dtype_name == "bfloat16" else np.dtype(dtype_name)
    return np.asarray(data).astype(dtype)


def _format(case: Case) -> str:
    return format_tensor(
        _array(case.data(), case.dtype_name),
        dtype_name=case.dtype_name,
        default_dtype=case.default_dtype,
        suffixes=case.suffixes,
    )


SCALARS = [
    Case(
        "scalar_float_int_valued",
        lambda: 48.0,
        "float32",
        "tensor(48.)",
    ),
    Case(
        "scalar_float_fraction",
        lambda: 0.1,
        "float32",
        "tensor(0.1000)",
    ),
    Case(
        "scalar_float_pow_grad",
        lambda: 9.0,
        "float32",
        "tensor(9., grad_fn=<PowBackward0>)",
        suffixes=["grad_fn=<PowBackward0>"],
    ),
    Case(
        "scalar_int",
        lambda: -7,
        "int64",
        "tensor(-7)",
    ),
    Case(
        "scalar_bool",
        lambda: True,
        "bool",
        "tensor(True)",
    ),
    Case(
        "scalar_nan",
        lambda: np.nan,
        "float32",
        "tensor(nan)",
    ),
    Case(
        "scalar_neg_inf",
        lambda: -np.inf,
        "float32",
        "tensor(-inf)",
    ),
    Case(
        "scalar_neg_zero",
        lambda: -0.0,
        "float32",
        "tensor(-0.)",
    ),
    Case(
        "scalar_sci",
        lambda: 1e-5,
        "float64",
        "tensor(1.0000e-05, dtype=fusegrad.float64)",
    ),
    Case(
        "scalar_float16",
        lambda: 2.5,
        "float16",
        "tensor(2.5000, dtype=fusegrad.float16)",
    ),
]

VECTORS = [
    Case(
        "int_valued_floats",
        lambda: [2.0, 4.0, 6.0],
        "float32",
        "tensor([2., 4., 6.])",
    ),
    Case(
        "fixed_point",
        lambda: [0.1, 0.2],
        "float32",
        "tensor([0.1000, 0.2000])",
    ),
    Case(
        "aligned_int_floats",
        lambda: [1.0, 10.0, 100.0],
        "float32",
        "tensor([  1.,  10., 100.])",
    ),
    Case(
        "negative_fixed",
        lambda: [-1.5, 2.25, 0.0],
        "float32",
        "tensor([-1.5000,  2.2500,  0.0000])",
    ),
    Case(
        "ints",
        lambda: [1, 2, 3],
        "int64",
        "tensor([1, 2, 3])",
    ),
    Case(
        "negative_ints",
        lambda: [-100, 5, 42],
        "int64",
        "tensor([-100,    5,   42])",
    ),
    Case(
        "bools",
        lambda: [True, False],
        "bool",
        "tensor([ True, False])",
    ),
    Case(
        "nan_inf",
        lambda: [np.nan, np.inf, -np.inf],
        "float32",
        "tensor([nan, inf, -inf])",
    ),
    Case(
        "nan_with_values",
        lambda: [1.5, np.nan, -np.inf, 2.0],
        "float32",
        "tensor([1.5000,    nan,   -inf, 2.0000])",
    ),
    Case(
        "nan_int_mode",
        lambda: [1.0, np.nan, 100.0],
        "float32",
        "tensor([  1.,  nan, 100.])",
    ),
    Case(
        "neg_zero",
        lambda: [-0.0],
        "float32",
        "tensor([-0.])",
    ),
    Case(
        "neg_zero_mixed",
        lambda: [0.0, -0.0, 1.5],
        "float32",
        "tensor([0.0000, -0.0000, 1.5000])",
    ),
    Case(
        "neg_zero_sci",
        lambda: [-0.0, 1e-5],
        "float32",
        "tensor([-0.0000e+00, 1.0000e-05])",
    ),
    Case(
        "all_zero",
        lambda: np.zeros(5),
        "float32",
        "tensor([0., 0., 0., 0., 0.])",
    ),
    Case(
        "single",
        lambda: [3.0],
        "float32",
        "tensor([3.])",
    ),
]

SCI = [
    Case(
        "sci_2d",
        lambda: [[1e-5, 1e5]],
        "float32",
        "tensor([[1.0000e-05, 1.0000e+05]])",
    ),
    Case(
        "ratio_1000_fixed",
        lambda: [1.0, 1000.0],
        "float32",
        "tensor([   1., 1000.])",
    ),
    Case(
        "ratio_over_1000_sci",
        lambda: [1.0, 1001.0],
        "float32",
        "tensor([1.0000e+00, 1.0010e+03])",
    ),
    Case(
        "max_1e8_fixed",
        lambda: [1e8],
        "float32",
        "tensor([100000000.])",
    ),
    Case(
        "max_over_1e8_sci",
        lambda: [1.1e8],
        "float32",
        "tensor([1.1000e+08])",
    ),
    Case(
        "float32_1e-4_is_below_threshold_sci",
        lambda: [1e-4],
        "float32",
        "tensor([1.0000e-04])",
    ),
    Case(
        "float64_1e-4_fixed",
        lambda: [1e-4],
        "float64",
        "tensor([0.0001], dtype=fusegrad.float64)",
    ),
    Case(
        "min_under_1e-4_sci",
        lambda: [9.9e-5],
        "float32",
        "tensor([9.9000e-05])",
    ),
    Case(
        "sci_with_inf",
        lambda: [1e-8, np.inf, -1.0, np.nan],
        "float32",
        "tensor([ 1.0000e-08,         inf, -1.0000e+00,         nan])",
    ),
    Case(
        "sci_big_exponent",
        lambda: [1e-300, 1e300],
        "float64",
        "tensor([1.0000e-300, 1.0000e+300], dtype=fusegrad.float64)",
    ),
    Case(
        "sci_zero_ignored",
        lambda: [0.0, 1e-3, 1.0],
        "float32",
        "tensor([0.0000, 0.0010, 1.0000])",
    ),
]

DTYPES = [
    Case(
        "float64",
        lambda: [1.0, 2.5],
        "float64",
        "tensor([1.0000, 2.5000], dtype=fusegrad.float64)",
    ),
    Case(
        "float16",
        lambda: [1.0, 2.5, 65504.0],
        "float16",
        "tensor([1.0000e+00, 2.5000e+00, 6.5504e+04], dtype=fusegrad.float16)",
    ),
    Case(
        "bfloat16",
        lambda: [1.0, 0.5, 3.140625],
        "bfloat16",
        "tensor([1.0000, 0.5000, 3.1406], dtype=fusegrad.bfloat16)",
    ),
    Case(
        "int32",
        lambda: [1, 2],
        "int32",
        "tensor([1, 2], dtype=fusegrad.int32)",
    ),
    Case(
        "uint8",
        lambda: [0, 255],
        "uint8",
        "tensor([  0, 255], dtype=fusegrad.uint8)",
    ),
    Case(
        "int8",
        lambda: [-128, 127],
        "int8",
        "tensor([-128,  127], dtype=fusegrad.int8)",
    ),
    Case(
        "default64_float64_hidden",
        lambda: [1.0, 2.5],
        "float64",
        "tensor([1.0000, 2.5000])",
        default_dtype=False,
    ),
    Case(
        "default64_float32_shown",
        lambda: [1.0, 2.5],
        "float32",
        "tensor([1.0000, 2.5000], dtype=fusegrad.float32)",
        default_dtype=False,
    ),
]

EMPTY = [
    Case(
        "empty_float",
        lambda: np.zeros(0),
        "float32",
        "tensor([])",
    ),
    Case(
        "empty_2x0",
        lambda: np.zeros((2, 0)),
        "float32",
        "tensor([], size=(2, 0))",
    ),
    Case(
        "empty_int32",
        lambda: np.zeros(0),
        "int32",
        "tensor([], dtype=fusegrad.int32)",
    ),
    Case(
        "empty_int64",
        lambda: np.zeros(0),
        "int64",
        "tensor([], dtype=fusegrad.int64)",
    ),
    Case(
        "empty_bool",
        lambda: np.zeros(0),
        "bool",
        "tensor([], dtype=fusegrad.bool)",
    ),
    Case(
        "empty_float64",
        lambda: np.zeros(0),
        "float64",
        "tensor([], dtype=fusegrad.float64)",
    ),
    Case(
        "empty_float16_3d",
        lambda: np.zeros((3, 0, 2)),
        "float16",
        "tensor([], size=(3, 0, 2), dtype=fusegrad.float16)",
    ),
    Case(
        "empty_default64_float32",
        lambda: np.zeros(0),
        "float32",
        "tensor([], dtype=fusegrad.float32)",
        default_dtype=False,
    ),
    Case(
        "empty_default64_float64",
        lambda: np.zeros(0),
        "float64",
        "tensor([])",
        default_dtype=False,
    ),
    Case(
        "empty_requires_grad",
        lambda: np.zeros(0),
        "float32",
        "tensor([], requires_grad=True)",
        suffixes=["requires_grad=True"],
    ),
]

NESTED = [
    Case(
        "2d_int",
        lambda: np.arange(6).reshape(2, 3),
        "int64",
        ("tensor([[0, 1, 2],\n        [3, 4, 5]])"),
    ),
    Case(
        "2d_float",
        lambda: np.arange(6).reshape(3, 2) / 4,
        "float32",
        ("tensor([[0.0000, 0.2500],\n        [0.5000, 0.7500],\n        [1.0000, 1.2500]])"),
    ),
    Case(
        "3d_float",
        lambda: np.arange(12).reshape(2, 3, 2) - 5.5,
        "float32",
        (
            "tensor([[[-5.5000, -4.5000],\n"
            "         [-3.5000, -2.5000],\n"
            "         [-1.5000, -0.5000]],\n"
            "\n"
            "        [[ 0.5000,  1.5000],\n"
            "         [ 2.5000,  3.5000],\n"
            "         [ 4.5000,  5.5000]]])"
        ),
    ),
    Case(
        "4d_int",
        lambda: np.arange(16).reshape(2, 2, 2, 2),
        "int64",
        (
            "tensor([[[[ 0,  1],\n"
            "          [ 2,  3]],\n"
            "\n"
            "         [[ 4,  5],\n"
            "          [ 6,  7]]],\n"
            "\n"
            "\n"
            "        [[[ 8,  9],\n"
            "          [10, 11]],\n"
            "\n"
            "         [[12, 13],\n"
            "          [14, 15]]]])"
        ),
    ),
    Case(
        "2d_bool",
        lambda: np.arange(4).reshape(2, 2) % 2 == 0,
        "bool",
        ("tensor([[ True, False],\n        [ True, False]])"),
    ),
    Case(
        "2d_sci",
        lambda: [[1e-6, 2.0], [3e6, -4.0]],
        "float64",
        ("tensor([[ 1.0000e-06,  2.0000e+00],\n        [ 3.0000e+06, -4.0000e+00]], dtype=fusegrad.float64)"),
    ),
]

WRAP = [
    Case(
        "wrap_floats",
        lambda: np.arange(30) / 8,
        "float32",
        (
            "tensor([0.0000, 0.1250, 0.2500, 0.3750, 0.5000, 0.6250, 0.7500, 0.8750, 1.0000,\n"
            "        1.1250, 1.2500, 1.3750, 1.5000, 1.6250, 1.7500, 1.8750, 2.0000, 2.1250,\n"
            "        2.2500, 2.3750, 2.5000, 2.6250, 2.7500, 2.8750, 3.0000, 3.1250, 3.2500,\n"
            "        3.3750, 3.5000, 3.6250])"
        ),
    ),
    Case(
        "wrap_ints",
        lambda: np.arange(40) * 1001,
        "int64",
        (
            "tensor([    0,  1001,  2002,  3003,  4004,  5005,  6006,  7007,  8008,  9009,\n"
            "        10010, 11011, 12012, 13013, 14014, 15015, 16016, 17017, 18018, 19019,\n"
            "        20020, 21021, 22022, 23023, 24024, 25025, 26026, 27027, 28028, 29029,\n"
            "        30030, 31031, 32032, 33033, 34034, 35035, 36036, 37037, 38038, 39039])"
        ),
    ),
    # No nonzero finite value: torch keeps the element width at 1, so 24 "0." fit per line.
    Case(
        "zeros_width_quirk",
        lambda: np.zeros(30),
        "float32",
        (
            "tensor([0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., "
            "0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0.,\n"
            "        0., 0., 0., 0., 0., 0.])"
        ),
    ),
    Case(
        "wrap_2d",
        lambda: (np.arange(60).reshape(2, 30) * 37 % 101 - 50) / 7,
        "float32",
        (
            "tensor([[-7.1429, -1.8571,  3.4286, -5.7143, -0.4286,  4.8571, -4.2857,  1.0000,\n"
            "          6.2857, -2.8571,  2.4286, -6.7143, -1.4286,  3.8571, -5.2857,  0.0000,\n"
            "          5.2857, -3.8571,  1.4286,  6.7143, -2.4286,  2.8571, -6.2857, -1.0000,\n"
            "          4.2857, -4.8571,  0.4286,  5.7143, -3.4286,  1.8571],\n"
            "        [ 7.1429, -2.0000,  3.2857, -5.8571, -0.5714,  4.7143, -4.4286,  0.8571,\n"
            "          6.1429, -3.0000,  2.2857, -6.8571, -1.5714,  3.7143, -5.4286, -0.1429,\n"
            "          5.1429, -4.0000,  1.2857,  6.5714, -2.5714,  2.7143, -6.4286, -1.1429,\n"
            "          4.1429, -5.0000,  0.2857,  5.5714, -3.5714,  1.7143]])"
        ),
    ),
    Case(
        "wrap_wide_fixed",
        lambda: np.arange(1, 13) * 1e5 + 0.5,
        "float64",
        (
            "tensor([ 100000.5000,  200000.5000,  300000.5000,  400000.5000,  500000.5000,\n"
            "         600000.5000,  700000.5000,  800000.5000,  900000.5000, 1000000.5000,\n"
            "        1100000.5000, 1200000.5000], dtype=fusegrad.float64)"
        ),
    ),
]

SUMMARY = [
    Case(
        "summary_1d_int",
        lambda: np.arange(2000),
        "int64",
        "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])",
    ),
    Case(
        "summary_1d_float",
        lambda: np.arange(2000) / 3,
        "float32",
        ("tensor([0.0000e+00, 3.3333e-01, 6.6667e-01,  ..., 6.6567e+02, 6.6600e+02,\n        6.6633e+02])"),
    ),
    Case(
        "summary_1001",
        lambda: np.arange(1001) % 7,
        "int64",
        "tensor([0, 1, 2,  ..., 4, 5, 6])",
    ),
    Case(
        "summary_2d",
        lambda: np.arange(10000).reshape(100, 100) / 100,
        "float32",
        (
            "tensor([[0.0000e+00, 1.0000e-02, 2.0000e-02,  ..., 9.7000e-01, 9.8000e-01,\n"
            "         9.9000e-01],\n"
            "        [1.0000e+00, 1.0100e+00, 1.0200e+00,  ..., 1.9700e+00, 1.9800e+00,\n"
            "         1.9900e+00],\n"
            "        [2.0000e+00, 2.0100e+00, 2.0200e+00,  ..., 2.9700e+00, 2.9800e+00,\n"
            "         2.9900e+00],\n"
            "        ...,\n"
            "        [9.7000e+01, 9.7010e+01, 9.7020e+01,  ..., 9.7970e+01, 9.7980e+01,\n"
            "         9.7990e+01],\n"
            "        [9.8000e+01, 9.8010e+01, 9.8020e+01,  ..., 9.8970e+01, 9.8980e+01,\n"
            "         9.8990e+01],\n"
            "        [9.9000e+01, 9.9010e+01, 9.9020e+01,  ..., 9.9970e+01, 9.9980e+01,\n"
            "         9.9990e+01]])"
        ),
    ),
    Case(
        "summary_3d",
        lambda: np.arange(8000).reshape(20, 20, 20),
        "int64",
        (
            "tensor([[[   0,    1,    2,  ...,   17,   18,   19],\n"
            "         [  20,   21,   22,  ...,   37,   38,   39],\n"
            "         [  40,   41,   42,  ...,   57,   58,   59],\n"
            "         ...,\n"
            "         [ 340,  341,  342,  ...,  357,  358,  359],\n"
            "         [ 360,  361,  362,  ...,  377,  378,  379],\n"
            "         [ 380,  381,  382,  ...,  397,  398,  399]],\n"
            "\n"
            "        [[ 400,  401,  402,  ...,  417,  418,  419],\n"
            "         [ 420,  421,  422,  ...,  437,  438,  439],\n"
            "         [ 440,  441,  442,  ...,  457,  458,  459],\n"
            "         ...,\n"
            "         [ 740,  741,  742,  ...,  757,  758,  759],\n"
            "         [ 760,  761,  762,  ...,  777,  778,  779],\n"
            "         [ 780,  781,  782,  ...,  797,  798,  799]],\n"
            "\n"
            "        [[ 800,  801,  802,  ...,  817,  818,  819],\n"
            "         [ 820,  821,  822,  ...,  837,  838,  839],\n"
            "         [ 840,  841,  842,  ...,  857,  858,  859],\n"
            "         ...,\n"
            "         [1140, 1141, 1142,  ..., 1157, 1158, 1159],\n"
            "         [1160, 1161, 1162,  ..., 1177, 1178, 1179],\n"
            "         [1180, 1181, 1182,  ..., 1197, 1198, 1199]],\n"
            "\n"
            "        ...,\n"
            "\n"
            "        [[6800, 6801, 6802,  ..., 6817, 6818, 6819],\n"
            "         [6820, 6821, 6822,  ..., 6837, 6838, 6839],\n"
            "         [6840, 6841, 6842,  ..., 6857, 6858, 6859],\n"
            "         ...,\n"
            "         [7140, 7141, 7142,  ..., 7157, 7158, 7159],\n"
            "         [7160, 7161, 7162,  ..., 7177, 7178, 7179],\n"
            "         [7180, 7181, 7182,  ..., 7197, 7198, 7199]],\n"
            "\n"
            "        [[7200, 7201, 7202,  ..., 7217, 7218, 7219],\n"
            "         [7220, 7221, 7222,  ..., 7237, 7238, 7239],\n"
            "         [7240, 7241, 7242,  ..., 7257, 7258, 7259],\n"
            "         ...,\n"
            "         [7540, 7541, 7542,  ..., 7557, 7558, 7559],\n"
            "         [7560, 7561, 7562,  ..., 7577, 7578, 7579],\n"
            "         [7580, 7581, 7582,  ..., 7597, 7598, 7599]],\n"
            "\n"
            "        [[7600, 7601, 7602,  ..., 7617, 7618, 7619],\n"
            "         [7620, 7621, 7622,  ..., 7637, 7638, 7639],\n"
            "         [7640, 7641, 7642,  ..., 7657, 7658, 7659],\n"
            "         ...,\n"
            "         [7940, 7941, 7942,  ..., 7957, 7958, 7959],\n"
            "         [7960, 7961, 7962,  ..., 7977, 7978, 7979],\n"
            "         [7980, 7981, 7982,  ..., 7997, 7998, 7999]]])"
        ),
    ),
    Case(
        "summary_short_dim",
        lambda: np.arange(1002).reshape(2, 501),
        "int64",
        (
            "tensor([[   0,    1,    2,  ...,  498,  499,  500],\n"
            "        [ 501,  502,  503,  ...,  999, 1000, 1001]])"
        ),
    ),
    # The 1e6 in the middle is elided, so it neither widens the elements nor forces sci mode.
    Case(
        "summary_width_from_edges",
        lambda: np.where(np.arange(2000) == 1000, 1e6, np.arange(2000) % 5),
        "float32",
        "tensor([0., 1., 2.,  ..., 2., 3., 4.])",
    ),
]

SUFFIXES = [
    Case(
        "grad_fn",
        lambda: [1.0, 2.0, 3.0],
        "float32",
        "tensor([1., 2., 3.], grad_fn=<MulBackward0>)",
        suffixes=["grad_fn=<MulBackward0>"],
    ),
    Case(
        "requires_grad",
        lambda: [1.0, 2.0],
        "float32",
        "tensor([1., 2.], requires_grad=True)",
        suffixes=["requires_grad=True"],
    ),
    Case(
        "dtype_and_grad",
        lambda: [1.0, 2.0],
        "float64",
        "tensor([1., 2.], dtype=fusegrad.float64, grad_fn=<AddBackward0>)",
        suffixes=["grad_fn=<AddBackward0>"],
    ),
    Case(
        "grad_fn_wraps",
        lambda: np.arange(13) / 3,
        "float32",
        (
            "tensor([0.0000, 0.3333, 0.6667, 1.0000, 1.3333, 1.6667, 2.0000, 2.3333, 2.6667,\n"
            "        3.0000, 3.3333, 3.6667, 4.0000], grad_fn=<MulBackward0>)"
        ),
        suffixes=["grad_fn=<MulBackward0>"],
    ),
    Case(
        "grad_fn_after_multiline",
        lambda: np.arange(6).reshape(3, 2) / 3,
        "float32",
        (
            "tensor([[0.0000, 0.3333],\n"
            "        [0.6667, 1.0000],\n"
            "        [1.3333, 1.6667]], grad_fn=<MulBackward0>)"
        ),
        suffixes=["grad_fn=<MulBackward0>"],
    ),
    Case(
        "int16_wrap_then_dtype",
        lambda: np.arange(10) * 12345,
        "int16",
        (
            "tensor([     0,  12345,  24690, -28501, -16156,  -3811,   8534,  20879, -32312,\n"
            "        -19967], dtype=fusegrad.int16)"
        ),
    ),
]

COMPLEX_AND_MIXED = [
    Case(
        "complex_vector",
        lambda: [1 + 2j, -0.5 - 1e-5j],
        "complex64",
        "tensor([ 1.0000+2.0000e+00j, -0.5000-1.0000e-05j])",
    ),
    Case(
        "complex_scalar",
        lambda: 3j,
        "complex128",
        "tensor(0.+3.j, dtype=fusegrad.complex128)",
    ),
    Case(
        "complex128_default64",
        lambda: [1 + 2j, 0.5j],
        "complex128",
        "tensor([1.+2.0000j, 0.+0.5000j])",
        default_dtype=False,
    ),
    Case(
        "bfloat16_summary_grad",
        lambda: np.arange(2 * 600).reshape(2, 600) / 64 - 5,
        "bfloat16",
        (
            "tensor([[-5.0000, -5.0000, -4.9688,  ...,  4.3125,  4.3438,  4.3750],\n"
            "        [ 4.3750,  4.3750,  4.4062,  ..., 13.6875, 13.7500, 13.7500]],\n"
            "       dtype=fusegrad.bfloat16, grad_fn=<MulBackward0>)"
        ),
        suffixes=["grad_fn=<MulBackward0>"],
    ),
]

ALL_CASES = SCALARS + VECTORS + SCI + DTYPES + EMPTY + NESTED + WRAP + SUMMARY + SUFFIXES + COMPLEX_AND_MIXED


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id + "-" + c.dtype_name for c in ALL_CASES])
def test_matches_torch_repr(case: Case) -> None:
    assert _format(case) == case.expected


def test_case_ids_are_unique() -> None:
    ids = [(c.id, c.dtype_name) for c in ALL_CASES]
    assert len(ids) == len(set(ids))


def test_exactly_threshold_elements_are_not_summarized() -> None:
    # torch summarizes only when numel > 1000; 1000 elements print in full (42 wrapped lines).
    text = format_tensor(np.arange(1000) % 7, dtype_name="int64", default_dtype=True)
    lines = text.split("\n")
    assert "..." not in text
    assert len(lines) == 42
    assert lines[0] == "tensor([0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2,"
    assert lines[-1] == "        4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5])"
    assert text.count(",") == 999


def test_no_line_exceeds_linewidth_for_wrapped_rows() -> None:
    text = format_tensor(np.arange(500) / 7, dtype_name="float32", default_dtype=True)
    assert max(len(line) for line in text.split("\n")) <= _tensor_str.PRINT_OPTS.linewidth


def test_device_comes_first() -> None:
    # Order and wrapping verified against torch (device, then dtype, then autograd suffixes).
    text = format_tensor(
        np.array([1.0, 2.0]),
        dtype_name="float64",
        default_dtype=True,
        suffixes=["grad_fn=<MulBackward0>"],
        device="cuda:0",
    )
    assert text == (
        "tensor([1., 2.], device='cuda:0', dtype=fusegrad.float64,\n       grad_fn=<MulBackward0>)"
    )


def test_device_wraps_after_full_line() -> None:
    text = format_tensor(
        np.arange(1, 10).reshape(1, 9) / 10, dtype_name="float16", default_dtype=True, device="cuda:0"
    )
    assert text == (
        "tensor([[0.1000, 0.2000, 0.3000, 0.4000, 0.5000, 0.6000, 0.7000, 0.8000, 0.9000]],\n"
        "       device='cuda:0', dtype=fusegrad.float16)"
    )


def test_device_on_default_dtype_and_empty() -> None:
    text = format_tensor(
        np.array([1.0, 2.0]),
        dtype_name="float32",
        default_dtype=True,
        device="cpu",
        suffixes=["requires_grad=True"],
    )
    assert text == "tensor([1., 2.], device='cpu', requires_grad=True)"
    text = format_tensor(np.zeros((2, 0), np.int32), dtype_name="int32", default_dtype=True, device="cpu")
    assert text == "tensor([], device='cpu', size=(2, 0), dtype=fusegrad.int32)"


def test_dtype_suffix_wraps_like_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    # Suffix wrapping depends on the suffix length; with torch's own prefix the line still fits,
    # with the 3 characters longer "fusegrad." prefix it passes 80 columns and wraps.
    data = np.array([[105, 53, 32, 78, 253, 161, 35, 144, 84, 237]], dtype=np.uint8)
    body = "tensor([[105,  53,  32,  78, 253, 161,  35, 144,  84, 237]]"
    text = format_tensor(data, dtype_name="uint8", default_dtype=True)
    assert text == body + ",\n       dtype=fusegrad.uint8)"
    monkeypatch.setattr(_tensor_str, "_DTYPE_PREFIX", "torch.")
    text = format_tensor(data, dtype_name="uint8", default_dtype=True)
    assert text == body + ", dtype=torch.uint8)"


def test_non_contiguous_input() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert format_tensor(data.T, dtype_name="float32", default_dtype=True) == format_tensor(
        np.ascontiguousarray(data.T), dtype_name="float32", default_dtype=True
    )
    assert format_tensor(data.T, dtype_name="float32", default_dtype=True) == (
        "tensor([[0., 3.],\n        [1., 4.],\n        [2., 5.]])"
    )


def test_input_is_not_modified() -> None:
    data = np.array([1.5, np.nan, -0.0], dtype=np.float16)
    before = data.copy()
    format_tensor(data, dtype_name="float16", default_dtype=True)
    np.testing.assert_array_equal(data, before)
    assert data.dtype == np.float16


# ------------------------------------------------------------------- print options (torch's)

# (options, expression, what torch 2.13 prints under those options)
PRINT_OPTION_CASES = [
    ({"precision": 2}, "fg.tensor([1.23456, -2.5, 1000.0])",
     "tensor([   1.23,   -2.50, 1000.00])"),
    ({"sci_mode": True}, "fg.tensor([1.23456, -2.5, 1000.0])",
     "tensor([ 1.2346e+00, -2.5000e+00,  1.0000e+03])"),
    ({"sci_mode": False}, "fg.tensor([1e-5, 1.0, 3.0])", "tensor([0.0000, 1.0000, 3.0000])"),
    ({"threshold": 5, "edgeitems": 1}, "fg.arange(12.).reshape(3, 4)",
     "tensor([[ 0.,  ...,  3.],\n        ...,\n        [ 8.,  ..., 11.]])"),
    ({"linewidth": 30}, "fg.arange(10.)",
     "tensor([0., 1., 2., 3., 4.,\n        5., 6., 7., 8., 9.])"),
    ({"profile": "short"}, "fg.arange(2000.).reshape(40, 50) / 7",
     "tensor([[0.00e+00, 1.43e-01,  ..., 6.86e+00, 7.00e+00],\n"
     "        [7.14e+00, 7.29e+00,  ..., 1.40e+01, 1.41e+01],\n"
     "        ...,\n"
     "        [2.71e+02, 2.72e+02,  ..., 2.78e+02, 2.78e+02],\n"
     "        [2.79e+02, 2.79e+02,  ..., 2.85e+02, 2.86e+02]])"),
    ({"edgeitems": 0, "threshold": 5}, "fg.arange(12.).reshape(3, 4)",
     "tensor([...], size=(3, 4))"),
    ({"sci_mode": True}, "fg.zeros(2)", "tensor([0., 0.])"),
]


@pytest.mark.parametrize("options,expr,expected", PRINT_OPTION_CASES,
                         ids=[str(c[0]) for c in PRINT_OPTION_CASES])
def test_set_printoptions_prints_as_torch(options, expr, expected):
    import fusegrad as fg
    try:
        fg.set_printoptions(**options)
        assert repr(eval(expr, {"fg": fg})) == expected
    finally:
        fg.set_printoptions(profile="default")
    assert repr(fg.tensor([1.23456])) == "tensor([1.2346])"


def test_get_printoptions_and_profiles():
    import fusegrad as fg
    try:
        fg.set_printoptions(profile="full", precision=6)
        assert fg.get_printoptions() == {"precision": 6, "threshold": float("inf"),
                                         "edgeitems": 3, "linewidth": 80, "sci_mode": None}
        with pytest.raises(ValueError, match="profile must be one of"):
            fg.set_printoptions(profile="long")
    finally:
        fg.set_printoptions(profile="default")
    assert fg.get_printoptions() == {"precision": 4, "threshold": 1000, "edgeitems": 3,
                                     "linewidth": 80, "sci_mode": None}
