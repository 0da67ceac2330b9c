"""The native loops of extern steps (fusegrad.codegen.native_loops) and the attention
kernels (fusegrad.codegen.attention) are kernel-IR programs printed by the LLVM printer;
fusegrad.runtime.native and native_attention only compile and call them."""

import numpy as np

from fusegrad import dtypes
from fusegrad.codegen.attention import attention_backward_kernel, attention_forward_kernel
from fusegrad.codegen.llvm.kernel import module_text
from fusegrad.codegen.native_loops import check_copy_kernel, index_add_rows_kernel
from fusegrad.runtime import native


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
    LLVM printer with the CPU kernels' calling convention."""
    k = attention_forward_kernel(dtypes.float32, 16, 8, True, False, True)
    text = str(k)
    assert text.startswith("kernel fg_attention_fwd_f32_16x8_101(q: f32*, k: f32*, v: f32*, "
                           "mask: u8*, dout: f32*, packed: f32*, out: f32*, layout: idx*, "
                           "scale: f64*)")
    for op in ("reduce.f32(", "exp.f32x16(", "shuffle.f32x8(", "muladd.f32x16(", "kt.x16[",
               "mask.x16["):
        assert op in text, op
    llvm = module_text("m", [attention_backward_kernel(dtypes.float64, 5, 7, False, False)])
    assert 'define void @"fg_attention_bwd_f64_5x7_00"(i8** %"bufs", i64 %"start", i64 %"end")' \
        in llvm
