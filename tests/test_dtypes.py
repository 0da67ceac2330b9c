"""dtypes and PyTorch's type promotion.

The promotion tables below were printed by torch 2.13 (``torch.promote_types`` and
``tensor + scalar``), so they pin torch's rules without importing torch.
"""

from __future__ import annotations

import pickle
import warnings

import ml_dtypes
import numpy as np
import pytest

import fusegrad as fg
from fusegrad import dtypes

F = fg.nn.functional

SHORT = {"b": fg.bool, "u8": fg.uint8, "i8": fg.int8, "i16": fg.int16, "i32": fg.int32,
         "i64": fg.int64, "f16": fg.float16, "bf16": fg.bfloat16, "f32": fg.float32,
         "f64": fg.float64}

# torch.promote_types(row, column)
PROMOTE_TABLE = """
         b   u8   i8  i16  i32  i64  f16 bf16  f32  f64
    b    b   u8   i8  i16  i32  i64  f16 bf16  f32  f64
   u8   u8   u8  i16  i16  i32  i64  f16 bf16  f32  f64
   i8   i8  i16   i8  i16  i32  i64  f16 bf16  f32  f64
  i16  i16  i16  i16  i16  i32  i64  f16 bf16  f32  f64
  i32  i32  i32  i32  i32  i32  i64  f16 bf16  f32  f64
  i64  i64  i64  i64  i64  i64  i64  f16 bf16  f32  f64
  f16  f16  f16  f16  f16  f16  f16  f16  f32  f32  f64
 bf16 bf16 bf16 bf16 bf16 bf16 bf16  f32 bf16  f32  f64
  f32  f32  f32  f32  f32  f32  f32  f32  f32  f32  f64
  f64  f64  f64  f64  f64  f64  f64  f64  f64  f64  f64
"""


def _promote_cases():
    lines = PROMOTE_TABLE.strip().splitlines()
    cols = lines[0].split()
    for line in lines[1:]:
        row, *results = line.split()
        for col, res in zip(cols, results, strict=True):
            yield pytest.param(SHORT[row], SHORT[col], SHORT[res], id=f"{row}-{col}")


PROMOTE_CASES = list(_promote_cases())


@pytest.mark.parametrize("a,b,expected", PROMOTE_CASES)
def test_promote_types_matches_torch(a, b, expected):
    assert fg.promote_types(a, b) is expected


@pytest.mark.parametrize("a,b,expected", PROMOTE_CASES)
def test_binary_op_result_dtype(a, b, expected):
    x = fg.tensor([1, 0], dtype=a)
    y = fg.tensor([1, 1], dtype=b)
    assert (x + y).dtype is expected
    assert (x * y).dtype is expected
    assert fg.where(x > 0, x, y).dtype is expected
    assert (x < y).dtype is fg.bool


@pytest.mark.parametrize("a,b,expected", PROMOTE_CASES)
def test_zero_dim_operand_changes_only_category(a, b, expected):
    # A 0-d tensor matters only when it belongs to a higher category (torch.result_type).
    x = fg.tensor([1, 0], dtype=a)
    z = fg.tensor(1, dtype=b)
    want = b if b.category > a.category else a
    assert (x + z).dtype is want
    # ... and two 0-d tensors promote as dimensioned ones do
    assert (fg.tensor(1, dtype=a) + z).dtype is expected


# tensor dtype -> dtype of (tensor + 2, tensor + 2.5, tensor + True), from torch
SCALAR_TABLE = {
    "b": ("i64", "f32", "b"), "u8": ("u8", "f32", "u8"), "i8": ("i8", "f32", "i8"),
    "i16": ("i16", "f32", "i16"), "i32": ("i32", "f32", "i32"), "i64": ("i64", "f32", "i64"),
    "f16": ("f16", "f16", "f16"), "bf16": ("bf16", "bf16", "bf16"),
    "f32": ("f32", "f32", "f32"), "f64": ("f64", "f64", "f64"),
}


@pytest.mark.parametrize("name", SCALAR_TABLE)
def test_python_scalar_promotion(name):
    x = fg.ones(2, dtype=SHORT[name])
    with_int, with_float, with_bool = (SHORT[s] for s in SCALAR_TABLE[name])
    assert (x + 2).dtype is with_int
    assert (x + 2.5).dtype is with_float
    assert (x + True).dtype is with_bool
    assert (2.5 * x).dtype is with_float


def test_promotion_cases_from_the_issue():
    assert (fg.tensor([1, 2]) * 2.5).dtype is fg.float32
    assert (fg.tensor([1.0], dtype=fg.float16) + 1.0).dtype is fg.float16
    assert (fg.tensor([1, 2]) + fg.tensor(1.0, dtype=fg.float64)).dtype is fg.float64
    assert (fg.tensor([True]) + fg.tensor([1])).dtype is fg.int64
    assert (fg.tensor([1], dtype=fg.uint8) + fg.tensor([1], dtype=fg.int8)).dtype is fg.int16
    assert (fg.tensor([1.0], dtype=fg.float16) +
            fg.tensor([1.0], dtype=fg.bfloat16)).dtype is fg.float32


def test_numpy_scalars_promote_like_python_numbers():
    # torch reads np.float64(2.5) as the number 2.5, not as a float64 0-d tensor
    i32, f32 = fg.ones(2, dtype=fg.int32), fg.tensor(1.0)
    assert (i32 * np.float64(2.5)).dtype is fg.float32
    assert (np.float64(2.5) * i32).tolist() == [2.5, 2.5]
    assert (f32 * np.float64(2)).dtype is fg.float32
    assert (fg.tensor([True]) * np.float64(1.5)).dtype is fg.float32
    assert (i32 + np.int64(3)).dtype is fg.int32
    assert fg.full((2,), np.float64(1.5)).dtype is fg.float32
    assert fg.tensor(np.float64(1.5)).dtype is fg.float64      # a conversion keeps it
    assert fg.result_type(i32, np.float64(1.0)) is fg.float32


def test_promotion_values_are_exact():
    out = fg.tensor([200], dtype=fg.uint8) + fg.tensor([-100], dtype=fg.int8)
    assert out.tolist() == [100]
    assert (fg.tensor([1, 2]) * 2.5).tolist() == [2.5, 5.0]


def test_pow_and_division_promotion():
    assert (fg.tensor([2, 3]) ** 2).dtype is fg.int64
    assert (fg.tensor([2, 3]) ** 2.0).dtype is fg.float32
    assert (fg.tensor([True, False]) ** 2).dtype is fg.int64
    assert (fg.tensor([2, 3]) / 2).dtype is fg.float32
    assert (fg.tensor([2, 3], dtype=fg.int32) // 2).dtype is fg.int32


def test_default_dtype_changes_float_inference():
    fg.set_default_dtype(fg.float64)
    assert fg.get_default_dtype() is fg.float64
    assert fg.tensor([1.0]).dtype is fg.float64
    assert (fg.tensor([1]) * 2.5).dtype is fg.float64
    assert fg.zeros(2).dtype is fg.float64
    assert fg.arange(0.0, 1.0, 0.5).dtype is fg.float64
    assert fg.tensor([1, 2]).float().dtype is fg.float32  # .float() is always float32
    fg.set_default_dtype(fg.float32)
    assert fg.tensor([1.0]).dtype is fg.float32


def test_default_dtype_must_be_floating():
    with pytest.raises(TypeError, match="only floating-point types are supported"):
        fg.set_default_dtype(fg.int64)


def test_result_type():
    assert fg.result_type(fg.tensor([1, 2]), 1.0) is fg.float32
    assert fg.result_type(fg.tensor([1], dtype=fg.int8), fg.tensor([1], dtype=fg.uint8)) is fg.int16
    assert dtypes.result_type(1, 2) is fg.int64
    assert dtypes.result_type(1, 2.0) is fg.float32
    assert dtypes.result_type(True, False) is fg.bool
    with pytest.raises(TypeError, match="at least one operand"):
        dtypes.result_type()


# --------------------------------------------------------------------------- the DType object


@pytest.mark.parametrize("dt,np_dtype,floating,signed,size", [
    (fg.bool, np.bool_, False, False, 1),
    (fg.uint8, np.uint8, False, False, 1),
    (fg.int8, np.int8, False, True, 1),
    (fg.int16, np.int16, False, True, 2),
    (fg.int32, np.int32, False, True, 4),
    (fg.int64, np.int64, False, True, 8),
    (fg.float16, np.float16, True, True, 2),
    (fg.bfloat16, ml_dtypes.bfloat16, True, True, 2),
    (fg.float32, np.float32, True, True, 4),
    (fg.float64, np.float64, True, True, 8),
])
def test_dtype_properties(dt, np_dtype, floating, signed, size):
    assert dt.np_dtype == np.dtype(np_dtype)
    assert dt.is_floating_point is floating
    assert dt.is_signed is signed
    assert dt.itemsize == size
    assert repr(dt) == f"fusegrad.{dt.name}"
    assert pickle.loads(pickle.dumps(dt)) is dt
    assert dtypes.from_numpy_dtype(np_dtype) is dt
    assert dtypes.as_dtype(dt.name) is dt
    t = fg.zeros(2, dtype=dt)
    assert t.dtype is dt and t.element_size() == size and t.is_floating_point() is floating


def test_dtype_aliases():
    assert fg.float is fg.float32 and fg.double is fg.float64 and fg.half is fg.float16
    assert fg.long is fg.int64 and fg.int is fg.int32 and fg.short is fg.int16
    assert dtypes.as_dtype(float) is fg.float32 and dtypes.as_dtype(int) is fg.int64
    assert dtypes.as_dtype(bool) is fg.bool and dtypes.as_dtype("f32") is fg.float32
    assert dtypes.as_dtype(np.float64) is fg.float64
    assert isinstance(fg.float32, fg.dtype)


def test_unknown_dtypes_are_rejected():
    with pytest.raises(TypeError, match="unknown dtype 'float128'"):
        dtypes.as_dtype("float128")
    with pytest.raises(TypeError, match="can't convert np.ndarray of type numpy.uint16"):
        fg.from_numpy(np.zeros(2, dtype=np.uint16))


# --------------------------------------------------------------------------- casts


CASTS = [
    ("float", fg.float32), ("double", fg.float64), ("half", fg.float16),
    ("bfloat16", fg.bfloat16), ("long", fg.int64), ("int", fg.int32), ("short", fg.int16),
    ("char", fg.int8), ("byte", fg.uint8), ("bool", fg.bool),
]


@pytest.mark.parametrize("method,dt", CASTS, ids=[c[0] for c in CASTS])
def test_cast_methods(method, dt):
    x = fg.tensor([0.0, 1.7, -2.5, 3.0])
    out = getattr(x, method)()
    assert out.dtype is dt
    expected = np.array([0.0, 1.7, -2.5, 3.0])
    if dt is fg.bool:
        assert out.tolist() == [False, True, True, True]
    elif dt is fg.uint8:
        assert out[[0, 1, 3]].tolist() == [0, 1, 3]
    elif not dt.is_floating_point:
        assert out.tolist() == [0, 1, -2, 3]   # truncation toward zero
    else:
        np.testing.assert_allclose(out.float().numpy(), expected, rtol=1e-2)
    assert x.to(dt).dtype is dt
    assert x.to(dtype=dt).dtype is dt
    assert x.type(dt).dtype is dt


def test_to_same_dtype_returns_self_and_copy_flag():
    x = fg.tensor([1.0, 2.0])
    assert x.to(fg.float32) is x
    assert x.float() is x
    y = x.to(fg.float32, copy=True)
    assert y is not x and y.tolist() == x.tolist()
    y[0] = 5.0
    assert x[0].item() == 1.0


def test_to_other_tensor_and_type_as():
    x = fg.tensor([1, 2])
    other = fg.tensor([1.0], dtype=fg.float64)
    assert x.to(other).dtype is fg.float64
    assert x.type_as(other).dtype is fg.float64
    assert x.type() == "fusegrad.LongTensor"
    assert other.type() == "fusegrad.DoubleTensor"
    assert fg.tensor([1.0]).type() == "fusegrad.FloatTensor"


def test_cast_gradient_returns_in_input_dtype():
    x = fg.tensor([1.0, 2.0], dtype=fg.float32, requires_grad=True)
    y = x.double()
    assert y.grad_fn.name() == "ToCopyBackward0"
    (y * y).sum().backward()
    assert x.grad.dtype is fg.float32 and x.grad.tolist() == [2.0, 4.0]


def test_cast_to_integer_cuts_the_graph():
    x = fg.tensor([1.5, 2.5], requires_grad=True)
    y = x.long()
    assert y.dtype is fg.int64 and not y.requires_grad


def test_bfloat16_values_and_item():
    x = fg.tensor([1.0, 1.00390625, 3.14159], dtype=fg.bfloat16)
    assert x.tolist() == [1.0, 1.0, 3.140625]
    assert isinstance(x[2].item(), float) and x[2].item() == 3.140625
    assert x.float().dtype is fg.float32


# --------------------------------------------------------------------------- 16-bit accumulation


def _half_rows(seed=0, shape=(4, 2000), scale=10.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_reductions_accumulate_in_float32(dtype):
    """A float16 sum of 1000 hundreds is inf (65504 at most), their mean is 100: means,
    variances and norms of 16-bit tensors compute in float32 and round once, as torch's."""
    dt = getattr(fg, dtype)
    x = fg.full((1000,), 100.0).to(dt)
    assert x.mean().item() == 100.0 and x.mean().dtype is dt
    assert fg.compile(lambda a: a.mean())(x).item() == 100.0
    r = _half_rows(shape=(1000,))
    h = fg.tensor(r).to(dt)
    wide = h.float().numpy().astype(np.float64)             # the 16-bit values, exactly
    rel = 1e-2 if dtype == "bfloat16" else 1e-3
    np.testing.assert_allclose(h.var().item(), wide.var(ddof=1), rtol=rel)
    np.testing.assert_allclose(h.std().item(), wide.std(ddof=1), rtol=rel)
    np.testing.assert_allclose(h.norm().item(), np.linalg.norm(wide), rtol=rel)
    np.testing.assert_allclose(fg.linalg.vector_norm(h).item(), np.linalg.norm(wide), rtol=rel)
    np.testing.assert_allclose(F.mse_loss(h, h * 0).item(), (wide ** 2).mean(), rtol=rel)
    pooled = F.avg_pool1d((h * 100).view(1, 1, 1000), 1000).item()
    np.testing.assert_allclose(pooled, (wide * 100).mean(), rtol=rel, atol=0.5)


def test_16_bit_normalization_layers_match_float32():
    r = _half_rows()                                         # rows of 2000: sum of squares 2e5
    h = fg.tensor(r).half()
    want_rows = (r - r.mean(1, keepdims=True)) / np.sqrt(r.var(1, keepdims=True) + 1e-5)
    got = F.layer_norm(h, (2000,)).float().numpy()
    np.testing.assert_allclose(got, want_rows, rtol=2e-3, atol=4e-3)
    got = F.group_norm(h.view(2, 4, 1000), 2).float().numpy().reshape(4, 2000)
    np.testing.assert_allclose(got, want_rows, rtol=2e-3, atol=4e-3)
    bn = fg.nn.BatchNorm1d(4).half()
    got = bn(h.t().contiguous()).detach().float().numpy().T
    np.testing.assert_allclose(got, want_rows, rtol=2e-3, atol=4e-3)
    np.testing.assert_allclose(bn.running_mean.float().numpy(), 0.1 * r.mean(1), rtol=2e-2,
                               atol=2e-3)
    got = F.rms_norm(h, (2000,)).float().numpy()
    want = r / np.sqrt((r ** 2).mean(1, keepdims=True) + np.finfo(np.float16).eps)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=4e-3)


def test_16_bit_attention_scores_do_not_overflow():
    """q @ k.T of 1e5 is inf in float16; the scaled scores are not."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 4, 64)).astype(np.float32) * 40 for _ in range(3))
    s = (q @ k.transpose(0, 1, 3, 2)) / 8.0
    w = np.exp(s - s.max(-1, keepdims=True))
    want = (w / w.sum(-1, keepdims=True)) @ v
    qh, kh, vh = (fg.tensor(a).half() for a in (q, k, v))
    for fn in (F.scaled_dot_product_attention, fg.compile(F.scaled_dot_product_attention)):
        got = fn(qh, kh, vh).float().numpy()
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=0.5)


def test_16_bit_tensor_with_a_scalar_its_dtype_cannot_hold():
    """torch's kernels take the scalar in float32: 1e-3 * 1e5 is 100 in float16 (the scalar
    rounded to float16 first is inf), 3 / 1e5 is 3e-5."""
    h = fg.tensor([1e-3, 0.0], dtype=fg.float16)
    np.testing.assert_array_equal((h * 1e5).numpy(), np.float16([100.0625, 0.0]))
    assert (h * 1e5).dtype is fg.float16
    np.testing.assert_array_equal((fg.tensor([3.0], dtype=fg.float16) / 1e5).numpy(),
                                  np.float16([3e-5]))
    np.testing.assert_array_equal((1e5 * h).numpy(), (h * 1e5).numpy())
    np.testing.assert_array_equal(fg.compile(lambda t: t * 1e5)(h).numpy(), (h * 1e5).numpy())
    # 1e5 / float16 is finite too (torch: reciprocal(x) * 1e5)
    np.testing.assert_array_equal((1e5 / fg.tensor([3.0], dtype=fg.float16)).numpy(),
                                  np.float16([33344.0]))


def test_16_bit_add_and_sub_round_the_scalar_to_the_dtype_first():
    """torch's add and sub convert a Python scalar to the tensor's dtype before adding: float16
    -65000 + 1e5 is inf (1e5 is inf in float16), and 1 + 1e-8 is 1, silently."""
    h = fg.tensor([-65000.0, 1.0], dtype=fg.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for got in (h + 1e5, 1e5 + h, h.add(1e5), fg.compile(lambda t: t + 1e5)(h)):
            assert got.dtype is fg.float16
            np.testing.assert_array_equal(got.numpy(), np.float16([np.inf, np.inf]))
        np.testing.assert_array_equal((h - 1e5).numpy(), np.float16([-np.inf, -np.inf]))
        np.testing.assert_array_equal((1e5 - h).numpy(), np.float16([np.inf, np.inf]))
        np.testing.assert_array_equal((h + 1e-8).numpy(), h.numpy())


def test_16_bit_composites_compute_in_float32():
    f16 = fg.float16
    assert fg.hypot(fg.tensor([60000.0], dtype=f16), fg.tensor([1.0], dtype=f16)).item() == 60000
    assert fg.lerp(fg.tensor([6e4], dtype=f16), fg.tensor([-6e4], dtype=f16), 0.5).item() == 0
    assert F.cosine_similarity(fg.tensor([[300.0, 400.0]], dtype=f16),
                               fg.tensor([[300.0, 400.0]], dtype=f16)).item() == 1.0
    out = fg.addcmul(fg.tensor([-60000.0], dtype=f16), fg.tensor([300.0], dtype=f16),
                     fg.tensor([300.0], dtype=f16), value=0.5)
    assert out.item() == -15000.0 and out.dtype is f16
    # with a float32 operand the result is float32, as the operands promote (it was rounded
    # to float16)
    f32 = fg.tensor([4.0])
    assert fg.hypot(fg.tensor([3.0], dtype=f16), f32).dtype is fg.float32
    assert fg.lerp(f32, fg.tensor([2.0], dtype=f16), 0.5).dtype is fg.float32
    assert fg.addcmul(f32, fg.tensor([2.0], dtype=f16), fg.tensor([3.0], dtype=f16)).dtype \
        is fg.float32


def test_addcmul_promotes_its_three_operands_first():
    out = fg.addcmul(fg.tensor([255], dtype=fg.uint8), fg.tensor([-128], dtype=fg.int8),
                     fg.tensor([3], dtype=fg.int8), value=2)
    assert out.dtype is fg.int16 and out.tolist() == [-513]          # was 255 (int8 wrap)
    out = fg.addcmul(fg.tensor([1], dtype=fg.int8), fg.tensor([True]), fg.tensor([True]), value=2)
    assert out.dtype is fg.int8 and out.tolist() == [3]


def test_nan_through_erfinv_and_hardshrink():
    for dt in (fg.float16, fg.float32, fg.float64):
        assert np.isnan(fg.erfinv(fg.tensor([float("nan")], dtype=dt)).item())
        assert np.isnan(fg.hardshrink(fg.tensor([float("nan")], dtype=dt)).item())


def test_python_ints_outside_a_narrow_integer_dtype_wrap_as_torch():
    """torch converts the scalar to the tensor's dtype, wrapping (it raised OverflowError):
    uint8 + -3 is 253; int8 < 300 compares with 44; true division takes it as a float."""
    u = fg.tensor([255, 1], dtype=fg.uint8)
    i = fg.tensor([50, -5], dtype=fg.int8)
    assert (u == -1).tolist() == [True, False]
    assert (u + (-3)).tolist() == [252, 254] and (u + (-3)).dtype is fg.uint8
    assert (u * 300).tolist() == [212, 44]
    assert (i < 300).tolist() == [False, True] and (i + 300).tolist() == [94, 39]
    assert (i // 300).tolist() == [1, -1]
    np.testing.assert_allclose((i / 300).numpy(), [50 / 300, -5 / 300], rtol=1e-6)
    x = fg.tensor([1, 2, 3], dtype=fg.uint8)
    x[fg.tensor([0])] = -1
    assert x.tolist() == [255, 2, 3]
    with pytest.raises(OverflowError):
        fg.tensor([1]) + (1 << 64)                 # beyond int64: torch raises too


def test_integer_power_with_a_negative_exponent_tensor():
    """torch: 1 / x**n truncated (it raised); a negative Python int exponent still raises."""
    x = fg.tensor([2, 3, 1, -1, -1])
    y = fg.tensor([-1, -2, -3, -1, -2])
    assert (x ** y).tolist() == [0, 0, 1, -1, 1]
    assert fg.compile(lambda a, b: a ** b)(x, y).tolist() == [0, 0, 1, -1, 1]
    assert (2 ** fg.tensor([-1, 3], dtype=fg.int8)).tolist() == [0, 8]
    with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
        fg.tensor([2]) ** -1
