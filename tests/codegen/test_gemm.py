"""The GEMMs generated for a compiled program's float32 products (fusegrad.codegen.llvm.gemm).

The generated code uses 512-bit vectors; LLVM splits them on CPUs without AVX-512, so these
tests run everywhere (``config.native_gemm = "on"``), while programs use the generated GEMMs
by default only on AVX-512 CPUs.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.codegen import interpret
from fusegrad.codegen.gemm import gemm_kernel
from fusegrad.codegen.llvm import gemm
from fusegrad.config import config
from fusegrad.passes.fusion import fuse
from fusegrad.passes.manager import PassManager
from fusegrad.runtime import jit
from fusegrad.runtime.cpu import GemmStep, MatmulStep, Program
from fusegrad.tracer.compile import DEFAULT_PIPELINE

_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


def operand(rng, shape, order: str, offset: int = 0):
    """A float32 matrix of ``shape`` laid out as ``order`` ("C", "F", or "S": every other
    column of a wider array) ``offset`` elements into its buffer; returns (array, buffer)."""
    rows, cols = shape
    if order == "C":
        buf = rng.standard_normal(offset + rows * cols).astype(np.float32)
        return buf[offset:].reshape(rows, cols), buf
    if order == "F":
        buf = rng.standard_normal(offset + rows * cols).astype(np.float32)
        return buf[offset:].reshape(cols, rows).T, buf
    buf = rng.standard_normal(offset + rows * cols * 2).astype(np.float32)
    return buf[offset:].reshape(rows, cols * 2)[:, ::2], buf


@functools.lru_cache(maxsize=1)
def _module():
    return jit.compile_ir(gemm.emit_gemm("gemm_under_test"), ["gemm_under_test"])


def run_gemm(a, a_buf, b, b_buf, ranges=None):
    """C = a @ b by the generated GEMM, its panels run in ``ranges`` (default: one call)."""
    item = a.itemsize
    g = gemm.Gemm(a.shape[0], b.shape[1], a.shape[1],
                  tuple(s // item for s in a.strides),
                  (a.ctypes.data - a_buf.ctypes.data) // item,
                  tuple(s // item for s in b.strides),
                  (b.ctypes.data - b_buf.ctypes.data) // item)
    fn = _FN(_module().address("gemm_under_test"))
    c = np.full((g.m, g.n), np.nan, np.float32)
    pack = np.full(max(g.pack_floats, 1), np.nan, np.float32)
    params = g.params()
    table = (ctypes.c_void_p * 5)(a_buf.ctypes.data, b_buf.ctypes.data, c.ctypes.data,
                                  pack.ctypes.data, params.ctypes.data)
    for start, end in ranges or [(0, g.panels)]:
        fn(ctypes.addressof(table), start, end)
    return g, c


def assert_product(c, a, b):
    """Within the classic bound of a float32 dot product of length K: K eps |a| @ |b|."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = a.shape[1] * np.finfo(np.float32).eps * (np.abs(a64) @ np.abs(b64))
    err = np.abs(c.astype(np.float64) - a64 @ b64)
    assert np.all(err <= bound + 1e-30), float((err - bound).max())


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 5, 7), (8, 3, 32), (9, 17, 33),
                                   (17, 64, 48), (100, 7, 100), (7, 300, 15), (16, 2, 64)])
@pytest.mark.parametrize("orders", ["CC", "CF", "FC", "FF", "SC", "CS"])
def test_generated_gemm_is_the_product_for_any_sizes_and_strides(m, k, n, orders):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a, a_buf = operand(rng, (m, k), orders[0], offset=3)
    b, b_buf = operand(rng, (k, n), orders[1], offset=5)
    g, c = run_gemm(a, a_buf, b, b_buf)
    assert g.packed == (b.strides[1] != b.itemsize)
    assert_product(c, a, b)


def test_panels_split_over_calls_give_the_same_bits():
    # The parallel loop runs panels [start, end) on each thread: every split is one panel's
    # code per panel, so the bits cannot depend on it.
    rng = np.random.default_rng(0)
    a, a_buf = operand(rng, (37, 70), "C")
    b, b_buf = operand(rng, (70, 100), "F")       # packed, 4 panels, the last 4 columns wide
    g, whole = run_gemm(a, a_buf, b, b_buf)
    assert g.panels == 4
    for ranges in ([(0, 1), (1, 4)], [(0, 2), (2, 4)], [(3, 4), (0, 3)], [(i, i + 1) for i in
                                                                         range(4)]):
        _, split = run_gemm(a, a_buf, b, b_buf, ranges)
        np.testing.assert_array_equal(split, whole)


def test_sums_run_in_k_order_with_one_rounding_per_term():
    # 1 + 2**-24 + 2**-24 ... : summed from k = 0 with an FMA per term, each tiny term is
    # lost against 1 (round to even), as in a sequential float32 dot product.
    k = 9
    a = np.ones((1, k), np.float32)
    b = np.full((k, 1), 2.0 ** -24, np.float32)
    b[0, 0] = 1.0
    _, c = run_gemm(a, a.reshape(-1), b, b.reshape(-1))
    assert c[0, 0] == np.float32(1.0)


def test_fits_admits_what_the_kernel_is_made_for():
    ok = gemm.Gemm(512, 256, 64, (64, 1), 0, (1, 64), 0)
    assert gemm.fits(ok) and ok.packed and ok.panels == 8 and ok.pack_floats == 8 * 64 * 32
    assert not gemm.fits(gemm.Gemm(512, 256, 0, (0, 1), 0, (256, 1), 0))
    assert not gemm.fits(gemm.Gemm(8, 8, gemm.MAX_K + 1, (gemm.MAX_K + 1, 1), 0, (8, 1), 0))
    big_a = gemm.MAX_A_BYTES // 4 // 64 + 1
    assert not gemm.fits(gemm.Gemm(big_a, 8, 64, (64, 1), 0, (8, 1), 0))


def _program(fn, *args):
    return Program(fuse(PassManager(DEFAULT_PIPELINE).run(fg.trace(fn, *args))))


@pytest.mark.parametrize("setting", ["on", "off"])
def test_programs_run_their_products_as_generated_gemms_when_enabled(setting, monkeypatch):
    monkeypatch.setattr(config, "native_gemm", setting)
    x, w, bias = fg.randn(40, 24), fg.randn(72, 24), fg.randn(72)
    prog = _program(lambda x, w, bias: (x @ w.t() + bias).relu(), x, w, bias)
    kinds = [type(s) for s in prog.steps]
    assert (GemmStep in kinds) == (setting == "on")
    assert (MatmulStep in kinds) == (setting == "off")
    got = prog(x._data, w._data, bias._data)[0]
    want = np.maximum(x.numpy().astype(np.float64) @ w.numpy().T.astype(np.float64)
                      + bias.numpy(), 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_auto_uses_generated_gemms_only_on_avx512_targets(monkeypatch):
    monkeypatch.setattr(config, "native_gemm", "auto")
    x = fg.randn(16, 16)
    with jit.compile_target("x86-64-v3"):
        prog = _program(lambda x: x @ x, x)
    assert not any(isinstance(s, GemmStep) for s in prog.steps)
    prog = _program(lambda x: x @ x, x)
    assert any(isinstance(s, GemmStep) for s in prog.steps) == jit.target_has_avx512()


def test_products_the_generator_is_not_made_for_stay_with_blas(monkeypatch):
    monkeypatch.setattr(config, "native_gemm", "on")
    cases = [(lambda a, b: a @ b, (fg.randn(3, 4, 5), fg.randn(3, 5, 6))),        # batched
             (lambda a, b: a @ b, (fg.randn(4, 5, dtype=fg.float64),
                                   fg.randn(5, 6, dtype=fg.float64))),            # float64
             (lambda a, b: a @ b, (fg.randn(3, gemm.MAX_K + 1), fg.randn(gemm.MAX_K + 1, 2)))]
    for fn, args in cases:
        prog = _program(fn, *args)
        assert not any(isinstance(s, GemmStep) for s in prog.steps)
        got = prog(*[a._data for a in args])[0]
        np.testing.assert_allclose(got, fn(*args).numpy(), rtol=1e-5, atol=1e-4)


def test_compiled_training_step_with_generated_gemms_equals_eager(monkeypatch):
    # The whole step: forward products (x @ W.T, packed), the gradients' (g @ W and xᵀ @ g,
    # read down A's columns) and Adam's update in their epilogues.
    monkeypatch.setattr(config, "native_gemm", "on")
    rng = np.random.default_rng(0)
    x = fg.tensor(rng.standard_normal((48, 20)).astype(np.float32))
    y = fg.tensor(rng.integers(0, 5, 48))

    def make():
        fg.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(20, 40), fg.nn.ReLU(), fg.nn.Linear(40, 5))
        return model, fg.optim.Adam(model.parameters(), lr=1e-2)

    def step_of(model, opt):
        def step(x, y):
            opt.zero_grad()
            loss = fg.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        return step

    eager_model, eager_opt = make()
    compiled_model, compiled_opt = make()
    eager, compiled = step_of(eager_model, eager_opt), fg.compile(step_of(compiled_model,
                                                                           compiled_opt))
    for _ in range(6):
        want, got = eager(x, y), compiled(x, y)
        np.testing.assert_allclose(got.item(), want.item(), rtol=1e-5)
    steady = compiled.entries()[-1].program
    assert sum(isinstance(s, GemmStep) for s in steady.steps) == 5    # 2 forward, 3 backward
    for p, q in zip(eager_model.parameters(), compiled_model.parameters()):
        np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=1e-4,
                                   atol=1e-5)


def test_an_unknown_native_gemm_setting_warns_and_uses_auto(monkeypatch):
    monkeypatch.setenv("FUSEGRAD_NATIVE_GEMM", "fast")
    from fusegrad.config import Config
    with pytest.warns(RuntimeWarning, match="FUSEGRAD_NATIVE_GEMM='fast'"):
        assert Config.from_env().native_gemm == "auto"


def test_gemms_for_an_avx2_target_run_and_give_the_product(monkeypatch):
    # An ahead-of-time build for AVX2 CPUs with the generated GEMMs forced on: LLVM splits
    # the 512-bit vectors, and the code runs on any x86-64 CPU with AVX2 (this one too).
    monkeypatch.setattr(config, "native_gemm", "on")
    x, w = fg.randn(33, 70), fg.randn(50, 70)
    with jit.compile_target("x86-64-v3"):
        prog = _program(lambda x, w: x @ w.t(), x, w)
    assert any(isinstance(s, GemmStep) for s in prog.steps)
    assert_product(prog(x._data, w._data)[0], x.numpy(), w.numpy().T)


def test_artifacts_keep_their_generated_gemms(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "native_gemm", "on")
    x, w = fg.randn(24, 40), fg.randn(40, 36)

    def f(x, w):
        return (x @ w).tanh()

    compiled = fg.compile(f)
    want = compiled(x, w).numpy()
    fg.aot.compile(f, x, w).save(tmp_path / "f.fgaot")
    monkeypatch.setattr(config, "native_gemm", "off")      # loading does not decide again
    run = fg.aot.load(tmp_path / "f.fgaot")
    (linked,) = run.programs
    assert list(linked.program.gemm_code) == [0]
    np.testing.assert_array_equal(run(x, w).numpy(), want)


def test_generated_gemm_is_a_kernel_ir_program():
    """The GEMM is written in the kernel IR (vector accumulators, broadcast loads of A,
    masked loads of B, vector FMAs, masked stores of C) and printed by the LLVM printer."""
    text = str(gemm_kernel("g"))
    assert text.count("var acc") == 2 * 2 * gemm.TILE_ROWS          # packed and direct B
    assert "fma.f32x16(" in text and "broadcast.f32x16(" in text and "b.x16[" in text
    assert "pack.x16[" in text and "c.x16[" in text
    llvm = gemm.emit_gemm("g")
    assert 'define void @"g"(i8** %"bufs", i64 %"start", i64 %"end")' in llvm
    assert "llvm.fma.v16f32" in llvm and "llvm.masked.load.v16f32.p0" in llvm
    assert "llvm.masked.store.v16f32.p0" in llvm


# --- bfloat16 products --------------------------------------------------------------------

BF16 = fg.bfloat16.np_dtype


def bf16_operand(rng, shape, order: str):
    """A bf16 matrix (random normals rounded to bf16) laid out as ``order`` ("C" or "F")."""
    a = rng.standard_normal(shape).astype(np.float32).astype(BF16)
    return np.ascontiguousarray(a) if order == "C" else np.asfortranarray(a)


def _bf16_gemm(a, b) -> gemm.Gemm:
    item = a.itemsize
    return gemm.Gemm(a.shape[0], b.shape[1], a.shape[1], tuple(s // item for s in a.strides), 0,
                     tuple(s // item for s in b.strides), 0, fg.bfloat16)


@functools.lru_cache(maxsize=1)
def _bf16_module():
    return jit.compile_ir(gemm.emit_gemm("gemm_bf16_under_test", fg.bfloat16), ["gemm_bf16_under_test"])


def run_bf16_gemm(a, b):
    """C = a @ b (bf16) by the converting bf16 GEMM, compiled for this machine."""
    g = _bf16_gemm(a, b)
    fn = _FN(_bf16_module().address("gemm_bf16_under_test"))
    c = np.zeros((g.m, g.n), BF16)
    pack = np.full(max(g.pack_floats, 1), np.nan, np.float32)
    params = g.params()
    table = (ctypes.c_void_p * 5)(a.ctypes.data, b.ctypes.data, c.ctypes.data, pack.ctypes.data,
                                  params.ctypes.data)
    fn(ctypes.addressof(table), 0, g.panels)
    return c


def interpret_bf16_gemm(a, b, pairs: bool):
    """C = a @ b (bf16) by the kernel-IR program in the reference interpreter."""
    g = _bf16_gemm(a, b)
    words = np.full(max(g.pack_floats, 1), 0xFFFFFFFF, np.uint32)
    pack = words if pairs else words.view(np.float32)
    c = np.zeros(g.m * g.n, np.uint16)
    flat = [np.lib.stride_tricks.as_strided(x.view(np.uint16), (x.size,), (2,)) for x in (a, b)]
    interpret.run_kernel(gemm_kernel("g", fg.bfloat16, pairs), [*flat, c, pack, g.params()],
                         extent=g.panels)
    return c.view(BF16).reshape(g.m, g.n)


def float32_gemm_rounded(a, b):
    """The float32 generated GEMM on the operands widened, rounded once to bf16."""
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    return run_gemm(a32, a32.reshape(-1), b32, b32.reshape(-1))[1].astype(BF16)


def pair_sums(a, b):
    """vdpbf16ps's sums, modelled in numpy: over pairs of k, the sum plus the product of the
    odd terms, rounded to float32, plus that of the even terms, rounded; a missing odd term
    of an odd K adds 0; then one rounding to bf16."""
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k0 in range(0, a.shape[1], 2):
        for kk in (k0 + 1, k0):
            if kk < a.shape[1]:
                acc = (acc.astype(np.float64)
                       + np.outer(a32[:, kk], b32[kk]).astype(np.float64)).astype(np.float32)
    return acc.astype(BF16)


_BF16_SHAPES = [(1, 1, 1), (3, 5, 7), (9, 17, 33), (17, 64, 48), (8, 2, 32)]


@pytest.mark.parametrize("m,k,n", _BF16_SHAPES)
@pytest.mark.parametrize("orders", ["CC", "CF", "FC"])
def test_bf16_gemm_converts_and_sums_as_the_float32_gemm(m, k, n, orders):
    # The products of bf16 values are exact in float32: converting while packing and
    # running the float32 tile loop gives the float32 GEMM's sums, rounded once to bf16.
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a, b = bf16_operand(rng, (m, k), orders[0]), bf16_operand(rng, (k, n), orders[1])
    got = run_bf16_gemm(a, b)
    np.testing.assert_array_equal(got.view(np.uint16), float32_gemm_rounded(a, b).view(np.uint16))


def test_bf16_gemm_rounds_to_nearest_even_and_keeps_nan_and_inf():
    a = np.array([[1.0, 2.0 ** -8], [np.inf, 1.0], [np.nan, 0.0], [1.0, 3 * 2.0 ** -8]],
                 np.float32).astype(BF16)
    b = np.array([[1.0, 0.0], [1.0, 1.0]], np.float32).astype(BF16)       # c[:, 0]: a row's sum
    c = run_bf16_gemm(a, b).astype(np.float32)
    assert c[0, 0] == 1.0                     # 1 + 2**-8: a tie, to even (1.0)
    assert c[3, 0] == 1.0 + 2.0 ** -6         # 1 + 3 * 2**-8: a tie, to even (up)
    assert c[1, 0] == np.inf and np.isnan(c[2, 0])


@pytest.mark.slow
@pytest.mark.parametrize("m,k,n", _BF16_SHAPES)
def test_bf16_programs_in_the_interpreter(m, k, n):
    # The converting program as compiled; the pair program (vdpbf16ps, which this machine
    # may lack) as modelled: packing pairs of rows, odd K, the last panel's masks.
    rng = np.random.default_rng(k)
    a, b = bf16_operand(rng, (m, k), "C"), bf16_operand(rng, (k, n), "F")
    np.testing.assert_array_equal(interpret_bf16_gemm(a, b, False).view(np.uint16),
                                  float32_gemm_rounded(a, b).view(np.uint16))
    pairs = interpret_bf16_gemm(a, b, True)
    np.testing.assert_array_equal(pairs.view(np.uint16), pair_sums(a, b).view(np.uint16))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = k * np.finfo(np.float32).eps * (np.abs(a64) @ np.abs(b64)) + 2.0 ** -8 * np.abs(a64 @ b64)
    assert np.all(np.abs(pairs.astype(np.float64) - a64 @ b64) <= bound)


@pytest.mark.parametrize("cpu,features", [("sapphirerapids", ""), ("x86-64", "+avx512f,+avx512bf16")])
def test_bf16_pair_gemm_assembles_to_vdpbf16ps(cpu, features):
    import llvmlite.binding as llvm
    jit._init()
    module = llvm.parse_assembly(gemm.emit_gemm("g", fg.bfloat16, bf16_pairs=True))
    module.verify()
    machine = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=features,
                                                                      opt=3)
    assert "vdpbf16ps" in machine.emit_assembly(module)
    with jit.compile_target(cpu, features):
        assert jit.target_has_avx512_bf16()
    with jit.compile_target("znver3"):
        assert not jit.target_has_avx512_bf16()


def test_compiled_bf16_products_run_as_generated_gemms(monkeypatch):
    monkeypatch.setattr(config, "native_gemm", "on")
    rng = np.random.default_rng(0)
    x = fg.tensor(rng.standard_normal((40, 24)).astype(np.float32)).to(fg.bfloat16)
    w = fg.tensor(rng.standard_normal((72, 24)).astype(np.float32)).to(fg.bfloat16)
    prog = _program(lambda x, w: x @ w.t(), x, w)
    steps = [s for s in prog.steps if isinstance(s, GemmStep)]
    assert len(steps) == 1 and steps[0].gemm.dtype is fg.bfloat16
    got = prog(x._data, w._data)[0]
    xs, ws = x._data, np.ascontiguousarray(w._data.T)
    want = pair_sums(xs, ws) if jit.target_has_avx512_bf16() else float32_gemm_rounded(xs, ws)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("setting", ["on", "off"])
def test_eager_bf16_products_take_the_generated_gemm_when_programs_do(setting, monkeypatch):
    monkeypatch.setattr(config, "native_gemm", setting)
    rng = np.random.default_rng(1)
    a, b = bf16_operand(rng, (20, 33), "C"), bf16_operand(rng, (40, 33), "C")
    got = (fg.tensor(a) @ fg.tensor(b).t()).numpy()      # B read down its columns: packed
    bt = np.ascontiguousarray(b.T)
    if setting == "off":        # numpy's float32 product, rounded once
        want = (a.astype(np.float32) @ bt.astype(np.float32)).astype(BF16)
    else:
        want = pair_sums(a, bt) if jit.target_has_avx512_bf16() else float32_gemm_rounded(a, bt)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_compiled_autocast_step_runs_its_bf16_products_as_generated_gemms(monkeypatch):
    # Forward products (x @ W.T: B packed), the input gradients (g @ W) and the weight
    # gradients (gᵀ @ x: A read down its columns), under autocast, with epilogues.
    rng = np.random.default_rng(0)
    x = fg.tensor(rng.standard_normal((48, 20)).astype(np.float32))
    y = fg.tensor(rng.integers(0, 5, 48))

    def run(setting):
        monkeypatch.setattr(config, "native_gemm", setting)
        fg.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(20, 40), fg.nn.ReLU(), fg.nn.Linear(40, 5))
        opt = fg.optim.SGD(model.parameters(), lr=0.1)

        def step(x, y):
            opt.zero_grad()
            with fg.autocast("cpu"):
                loss = fg.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        step = fg.compile(step, fullgraph=True)
        losses = [step(x, y).item() for _ in range(3)]
        gemms = [s.gemm.dtype for s in step.entries()[-1].program.steps if isinstance(s, GemmStep)]
        return losses, gemms
    (on, gemms), (off, none) = run("on"), run("off")
    # The forward products add their bias to the float32 sums before rounding once (torch's
    # numerics): float32 products of the widened operands. The backward's 3 are bf16.
    assert gemms == [fg.float32] * 2 + [fg.bfloat16] * 3 and none == []
    # The same products summed in another order, rounded to bf16: a bf16 ulp apart at most.
    np.testing.assert_allclose(on, off, rtol=2.0 ** -6)
