"""The native loops of extern steps (fusegrad.codegen.native_loops) and the attention
kernels (fusegrad.codegen.attention) are kernel-IR programs printed by the LLVM printer;
fusegrad.runtime.native and native_attention only compile and call them."""

import numpy as np
import pytest

from fusegrad import dtypes
from fusegrad.codegen import interpret
from fusegrad.codegen.attention import (
    LAYOUT,
    attention_backward_kernel,
    attention_forward_kernel,
    row_widths,
)
from fusegrad.codegen.cuda.printer import cuda_source
from fusegrad.codegen.gemm import Gemm, gemm_kernel
from fusegrad.codegen.llvm.kernel import module_text
from fusegrad.codegen.native_loops import check_copy_kernel, convert_kernel, index_add_rows_kernel
from fusegrad.ops.lowering import Unsupported
from fusegrad.runtime import native, native_attention


def test_kernels_print_as_plain_functions():
    text = str(index_add_rows_kernel(dtypes.float64))
    assert text.splitlines()[0] == ("kernel fg_index_add_rows_double(out: f64*, x: f64*, idx: i64*, "
                                    "src: f64*, n: idx, inner: idx, rows: idx) -> ok: i32 {")
    assert "address(out)" in text
    llvm = module_text("m", [check_copy_kernel()])
    assert 'define i32 @"fg_check_copy_i64"(i64* noalias %"src", i64* noalias %"dst", i64 %"n", ' \
        'i64 %"lo", i64 %"hi")' in llvm


def test_index_add_rows_matches_add_at_bit_for_bit():
    rng = np.random.default_rng(0)
    for dt in (np.float32, np.float64):
        x = rng.standard_normal((7, 3, 2)).astype(dt)
        src = rng.standard_normal((9, 3, 2)).astype(dt)
        idx = np.array([0, 6, 6, 2, 0, 1, 6, 3, 0])
        want = x.copy()
        np.add.at(want, idx, src)
        out = np.empty_like(x)
        assert native.index_add_rows(out, x, idx, src)
        np.testing.assert_array_equal(out, want)
        assert native.index_add_rows(x, x, idx, src)           # in place: no copy
        np.testing.assert_array_equal(x, want)
        bad = np.full_like(x, 5)
        assert not native.index_add_rows(bad, x, np.array([0, 7, 1, 0, 0, 0, 0, 0, 0]), src)
        assert (bad == 5).all()                                   # nothing written
        empty = np.empty_like(x)
        assert native.index_add_rows(empty, x, idx[:0], src[:0])
        np.testing.assert_array_equal(empty, x)


def test_check_copy():
    src, dst = np.array([3, -2, 0, 4]), np.zeros(4, np.int64)
    assert not native.check_copy(src, dst, 0, 5) and (dst == 0).all()
    assert native.check_copy(src, dst, -5, 5)
    np.testing.assert_array_equal(dst, src)
    assert not native.check_copy(src, dst, -2, 4)
    assert native.check_copy(src[:0], dst[:0], 0, 1)


def test_attention_kernels_are_kernel_ir_programs():
    """The native attention kernels are written in the kernel IR (vector rows of scores,
    lane reductions for the softmax, shuffles for the transposed tile) and printed by the
    LLVM printer with the CPU kernels' calling convention. One kernel per feature count
    takes every number of keys (the layout's last entry): a body per row width, and for the
    lengths between two widths one whose rows have lanes past the keys, which it neither
    loads nor stores."""
    k = attention_forward_kernel(dtypes.float32, 8, True, False, True)
    text = str(k)
    assert text.startswith("kernel fg_attention_fwd_f32_e8_101(q: f32*, k: f32*, v: f32*, "
                           "mask: u8*, dout: f32*, packed: f32*, out: f32*, layout: idx*, "
                           "scale: f64*)")
    assert row_widths(dtypes.float32, 8) == [8, 16, 32, 64, 128]
    assert row_widths(dtypes.float64, 128) == [4, 8, 16, 32, 64]      # 64 x 128 = MAX_TILE
    assert f"layout[{LAYOUT - 1}]" in text
    for op in ("reduce.f32(", "exp.f32x16(", "shuffle.f32x8(", "muladd.f32x16(", "kt16.x16[",
               "mask.x16[", "exp.f32x128(", "eq.idx(keys"):
        assert op in text, op
    assert "local kt128: f32[1024]" in text and "local kt8: f32[64]" in text   # keys x features
    assert len([ln for ln in text.splitlines() if ln.lstrip().startswith("if ")]) == 10
    alone = str(attention_forward_kernel(dtypes.float32, 8, True, False, True, upto=32))
    assert alone.startswith("kernel fg_attention_fwd_f32_e8_101_upto32(")    # 1 to 32 keys
    assert len([ln for ln in alone.splitlines() if ln.lstrip().startswith("if ")]) == 2
    llvm = module_text("m", [attention_backward_kernel(dtypes.float64, 7, False, False)])
    assert 'define void @"fg_attention_bwd_f64_e7_00"(i8** %"bufs", i64 %"start", i64 %"end")' \
        in llvm
    assert "llvm.masked.load.v8f64" in llvm          # a row of weights of 5 to 7 keys


# The hand-written kernels in the reference interpreter: what the kernel IR programs mean,
# apart from the LLVM printer.

def test_interpreted_index_add_rows_and_checks():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    src = np.ones((3, 3), np.float32)
    idx = np.array([2, 0, 2])
    want = x.copy()
    np.add.at(want, idx, src)
    out = np.zeros_like(x)
    assert interpret.run_kernel(index_add_rows_kernel(dtypes.float32), [out, x, idx, src],
                                scalars=(3, 3, 4)) == 1
    np.testing.assert_array_equal(out, want)
    assert interpret.run_kernel(index_add_rows_kernel(dtypes.float32), [x, x, idx, src],
                                scalars=(3, 3, 4)) == 1           # in place
    np.testing.assert_array_equal(x, want)
    dst = np.zeros(3, np.int64)
    assert interpret.run_kernel(check_copy_kernel(), [idx, dst], scalars=(3, 0, 3)) == 1
    np.testing.assert_array_equal(dst, idx)
    assert interpret.run_kernel(check_copy_kernel(), [idx, dst * 0], scalars=(3, 0, 2)) == 0


def _round_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 bits by integer arithmetic (round to nearest even, a NaN kept
    NaN with its quiet bit set): the rounding model the conversions are held to."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    quiet = (bits | 0x400000) >> 16
    return np.where(np.isnan(x), quiet, rounded).astype(np.uint16)


def _conversion_cases() -> np.ndarray:
    """float32 values at every edge of the rounding: ties to even both ways, just above and
    below a tie, the largest finite values (one rounds to inf), subnormals, signed zeros,
    infinities and NaNs with payloads."""
    bits = [0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F7FFFFF, 0x7F7F7FFF, 0x00000001,
            0x00008000, 0x00018000, 0x807FFFFF, 0x80000000, 0x00000000, 0x7F800000, 0xFF800000,
            0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x3F800000, 0xC0490FDB]
    rng = np.random.default_rng(0)
    spread = rng.standard_normal(1000).astype(np.float32) * np.float32(10.0) ** rng.integers(-40, 38, 1000)
    return np.concatenate([np.array(bits, np.uint32).view(np.float32), spread.astype(np.float32)])


def test_conversions_round_to_nearest_even_as_the_model():
    x = _conversion_cases()
    want = _round_bf16_bits(x)
    out = np.empty(x.shape, dtypes.bfloat16.np_dtype)
    assert native.convert(x, out)
    np.testing.assert_array_equal(out.view(np.uint16), want)
    numbers = ~np.isnan(x)                     # ml_dtypes' NaN payloads are its own
    np.testing.assert_array_equal(out.view(np.uint16)[numbers],
                                  x[numbers].astype(dtypes.bfloat16.np_dtype).view(np.uint16))
    back = np.empty(x.shape, np.float32)                  # widening is exact: the bits shifted up
    assert native.convert(out, back)
    np.testing.assert_array_equal(back.view(np.uint32), want.astype(np.uint32) << 16)
    interpreted = np.empty(x.shape, np.uint16)            # 16-bit floats' memory form: their bits
    assert interpret.run_kernel(convert_kernel(dtypes.float32, dtypes.bfloat16), [x, interpreted],
                                scalars=(x.size,)) == 1
    np.testing.assert_array_equal(interpreted, want)


def test_conversions_in_parts_are_the_same():
    x = np.random.default_rng(1).standard_normal(native.PARALLEL_CONVERT + 7).astype(np.float32)
    one, parts = (np.empty(x.shape, dtypes.bfloat16.np_dtype) for _ in range(2))
    assert native.convert(x, one) and native.convert(x, parts, threads=3)
    np.testing.assert_array_equal(parts.view(np.uint16), one.view(np.uint16))
    wide = np.empty_like(x)
    assert native.convert(parts, wide, threads=3)
    np.testing.assert_array_equal(wide, one.astype(np.float32))


def test_conversions_refuse_other_arrays():
    x = np.ones((4, 6), np.float32)
    assert not native.convert(x, np.empty((4, 6), np.float64))
    assert not native.convert(x[:, ::2], np.empty((4, 3), dtypes.bfloat16.np_dtype))
    assert not native.convert(x, np.empty((4, 5), dtypes.bfloat16.np_dtype))


def test_conversions_match_torch():
    torch = pytest.importorskip("torch")
    x = _conversion_cases()
    out = np.empty(x.shape, dtypes.bfloat16.np_dtype)
    assert native.convert(x, out)
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    numbers = ~np.isnan(x)                   # torch's NaN payloads are its own
    np.testing.assert_array_equal(out.view(np.uint16)[numbers], want[numbers])
    assert np.isnan(out.astype(np.float32)[~numbers]).all()


@pytest.mark.parametrize("packed", [False, True])
def test_interpreted_gemm(packed):
    rng = np.random.default_rng(int(packed))
    m, k, n = 9, 5, 35                       # a short tile and a masked panel
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k) if packed else (k, n)).astype(np.float32)
    b = w.T if packed else w
    g = Gemm(m, n, k, (k, 1), 0, tuple(s // 4 for s in b.strides), 0)
    c = np.full(m * n, np.nan, np.float32)
    pack = np.zeros(max(g.pack_floats, 1), np.float32)
    interpret.run_kernel(gemm_kernel("g"), [a, w, c, pack, g.params().astype(np.uint64)],
                         grid=1, extent=g.panels)
    want = a.astype(np.float64) @ b.astype(np.float64)
    bound = k * np.finfo(np.float32).eps * (np.abs(a) @ np.abs(b))
    assert np.all(np.abs(c.reshape(m, n) - want) <= bound + 1e-30)


# the shuffle transpose; the scalar one; lanes past the keys (with both transposes; fewer
# keys than a block of rows)
@pytest.mark.parametrize("L,E", [pytest.param(8, 8, marks=pytest.mark.slow),
                                 pytest.param(5, 3, marks=pytest.mark.slow), (11, 8), (3, 8)])
def test_interpreted_attention_matches_the_native_call(L, E):
    rng = np.random.default_rng(L)
    B, H = 1, 2
    q, k, v, dout = (rng.standard_normal((B, H, L, E)).astype(np.float32) for _ in range(4))
    mask = ~np.tril(np.ones((L, L), dtype=bool))[None, None]
    packed = np.empty((B, H, L, E + L), np.float32)
    grads = np.empty((3, B, H, L, E), np.float32)
    assert native_attention.attention_forward(packed, q, k, v, mask, scale=0.5, keep=False,
                                              zero_dead=False)
    assert native_attention.attention_backward(grads, q, k, v, dout, packed, mask, scale=0.5,
                                               keep=False)
    contiguous = [H * L * E, L * E, E]
    # the mask's rows as wide as the kernel's rows of scores (16 lanes for 11 keys)
    width = next(w for w in row_widths(dtypes.float32, E) if w >= L)
    bits = np.zeros((L, width), np.uint8)
    bits[:, :L] = mask[0, 0]
    layout = np.array([H, *contiguous * 3, 0, 0, width, *contiguous, B * H, L], np.uint64)
    scale = np.array([0.5])
    got = np.full_like(packed, np.nan)
    interpret.run_kernel(attention_forward_kernel(dtypes.float32, E, True, False, False),
                         [q, k, v, bits, dout, got, grads * 0, layout, scale], grid=1,
                         extent=B * H)
    np.testing.assert_allclose(got, packed, rtol=1e-5, atol=1e-6)
    got_grads = np.full_like(grads, np.nan)
    interpret.run_kernel(attention_backward_kernel(dtypes.float32, E, True, False),
                         [q, k, v, bits, dout, packed, got_grads, layout, scale], grid=1,
                         extent=B * H)
    np.testing.assert_allclose(got_grads, grads, rtol=1e-4, atol=1e-5)


def test_cuda_printer_refuses_host_kernels_and_vectors():
    with pytest.raises(Unsupported, match="c_abi"):
        cuda_source([check_copy_kernel()])
    with pytest.raises(Unsupported, match="lanes"):
        cuda_source([gemm_kernel("g")])
