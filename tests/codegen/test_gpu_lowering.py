"""The GPU-shaped lowering, run by the kernel IR's reference interpreter (no GPU needed):
every kernel of the zoo, launched by the CUDA runtime on a simulated driver, matches the
numbers of eager execution (numpy)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.codegen.gpu_lowering import lower_kernel
from fusegrad.codegen.interpret import InterpreterError, run_kernel
from fusegrad.codegen.kernel_ir import (
    INDEX,
    Barrier,
    ExprBuilder,
    If,
    LoweredKernel,
    Param,
    Store,
    format_kernel,
)
from fusegrad.passes.fusion import fuse
from fusegrad.passes.manager import PassManager
from fusegrad.passes.partition import partition_joint
from fusegrad.runtime.cpu import Program
from fusegrad.runtime.cuda import CudaProgram
from fusegrad.testing.simulated_cuda import SimulatedDriver
from fusegrad.tracer.compile import DEFAULT_PIPELINE
from tests.codegen.gpu_zoo import ZOO, mlp_args, mlp_loss


def kernel_graph(fn, args):
    return fuse(PassManager(DEFAULT_PIPELINE).run(fg.trace(fn, *args)))


def tolerance(dtype: np.dtype) -> dict:
    if dtype.kind in "biu":
        return {"rtol": 0, "atol": 0}
    if dtype == np.float64:
        return {"rtol": 1e-12, "atol": 1e-12}
    if dtype.itemsize == 2 or dtype.kind == "V":
        return {"rtol": 1e-2, "atol": 1e-2}
    return {"rtol": 2e-5, "atol": 2e-5}


def as_float(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) if a.dtype.kind not in "biu" else a


def run_simulated(kg, arrays):
    return [o.to_host() for o in CudaProgram(kg, SimulatedDriver())(*arrays)]


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_matches_eager_in_the_interpreter(name):
    fn, args = ZOO[name]
    kg = kernel_graph(fn, args)
    eager = fn(*args)
    eager = list(eager) if isinstance(eager, tuple) else [eager]
    got = run_simulated(kg, [a._data for a in args])
    assert len(got) == len(eager)
    for g, e in zip(got, eager):
        ref = e._data
        assert g.shape == ref.shape and g.dtype == ref.dtype, (g.dtype, ref.dtype)
        np.testing.assert_allclose(as_float(g), as_float(ref), **tolerance(ref.dtype))


def test_zoo_covers_every_kernel_family():
    families = set()
    for fn, args in ZOO.values():
        kg = kernel_graph(fn, args)
        for k in kg.kernels:
            if k.kind != "extern":
                families.add(lower_kernel(k, kg).family)
    assert families == {"elementwise", "row_reduce", "col_reduce", "matmul"}


def test_mlp_forward_and_backward_match_the_cpu():
    args = mlp_args()
    g = PassManager(DEFAULT_PIPELINE).run(fg.trace(mlp_loss, *args))
    part = partition_joint(g, wrt=[1, 2, 3, 4], free_inputs=[])
    arrays = [a._data for a in args]
    fwd = kernel_graph_of(part.forward)
    cpu_fwd = Program(fwd)(*arrays)
    gpu_fwd = run_simulated(fwd, arrays)
    for c, s in zip(cpu_fwd, gpu_fwd):
        np.testing.assert_allclose(s, c, rtol=1e-5, atol=1e-6)
    bwd = kernel_graph_of(part.backward)
    rng = np.random.default_rng(0)
    bwd_inputs = [np.asarray(rng.standard_normal(v.type.shape), dtype=v.type.dtype.np_dtype)
                  if v.type.dtype.is_floating_point else np.zeros(v.type.shape,
                                                                  v.type.dtype.np_dtype)
                  for v in part.backward.inputs]
    cpu_bwd = Program(bwd)(*bwd_inputs)
    gpu_bwd = run_simulated(bwd, bwd_inputs)
    assert len(gpu_bwd) == 4
    for c, s in zip(cpu_bwd, gpu_bwd):
        np.testing.assert_allclose(s, c, rtol=1e-4, atol=1e-5)


def kernel_graph_of(graph):
    return fuse(PassManager(DEFAULT_PIPELINE).run(graph))


def test_kernel_ir_text_shows_the_row_reduction_structure():
    fn, args = ZOO["softmax"]
    kg = kernel_graph(fn, args)
    (k,) = kg.kernels
    text = format_kernel(lower_kernel(k, kg))
    assert text.startswith("kernel k0_row_reduce_")
    for piece in ("for row", "step gridDim.x", "shfl_xor.f32(", "barrier", "exp.f32("):
        assert piece in text, piece
    # One shared array per reduction (max, then sum), named apart from every local.
    assert len(re.findall(r"shared red\d+: f32\[32\]", text)) == 2
    # exp(x - max) is computed once, kept in shared memory by the sum, read by the stores
    (kept,) = re.findall(r"shared (row\d+): f32\[300\]", text)
    assert text.count("exp.f32(") == 1
    stores = text[text.rindex("for j"):]
    assert f"{kept}[" in stores and "exp" not in stores


def _tiny_kernel(body, params, block=64):
    return LoweredKernel("tiny", params, [], body, block, 1, "test")


def test_interpreter_rejects_a_barrier_in_divergent_code():
    b = ExprBuilder()
    half = b.cmp("lt", b.special("threadIdx"), b.const(INDEX, 32), INDEX)
    k = _tiny_kernel([If(half, [Barrier()])], [])
    with pytest.raises(InterpreterError, match="barrier"):
        run_kernel(k, [])


def test_interpreter_rejects_an_out_of_bounds_store():
    b = ExprBuilder()
    p = Param("p0", fg.float32, writes=True)
    k = _tiny_kernel([Store(p, b.special("threadIdx"), b.const(fg.float32, 1.0))], [p])
    out = np.zeros(10, np.float32)
    with pytest.raises(InterpreterError, match="out of bounds"):
        run_kernel(k, [out])


def _without_barriers(body: list) -> list:
    out = []
    for st in body:
        if isinstance(st, Barrier):
            continue
        if hasattr(st, "body"):
            st.body = _without_barriers(st.body)
        out.append(st)
    return out


@pytest.mark.parametrize("name", ["softmax", "matmul_epilogue"])
def test_interpreter_finds_the_race_of_a_missing_barrier(name):
    # Lanes run in lockstep, so without its barriers the kernel would still compute the
    # right numbers here: the shared-memory bookkeeping must report the race instead.
    fn, args = ZOO[name]
    kg = kernel_graph(fn, args)
    k = next(k for k in kg.kernels if k.kind != "extern")
    lk = lower_kernel(k, kg)
    lk.body = _without_barriers(lk.body)
    arrays = [np.zeros(p.value.type.shape, p.value.type.dtype.np_dtype) for p in lk.params]
    with pytest.raises(InterpreterError, match="race on"):
        run_kernel(lk, arrays)


def _misaligned(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` whose data starts 4 bytes past a 16-byte boundary."""
    raw = np.empty(a.size + 4, dtype=a.dtype)
    skip = (-raw.__array_interface__["data"][0] % 16) // a.itemsize + 1
    out = raw[skip:skip + a.size].reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.parametrize("aligned", [True, False])
def test_vector_loop_runs_where_every_vector_buffer_is_aligned(aligned):
    fn, args = ZOO["elementwise_vec4"]
    kg = kernel_graph(fn, args)
    (k,) = [k for k in kg.kernels if k.kind == "elementwise"]
    lk = lower_kernel(k, kg)
    text = format_kernel(lk)
    # a and the bias are read 4 at a time, the (64, 1) column and the strided view per element
    inputs = dict(zip(kg.graph.inputs, [a._data for a in args]))
    vec = {p.name for p in lk.params if f"{p.name}.v4[" in text}
    assert {p.value for p in lk.params if p.name in vec} >= {kg.graph.inputs[0],
                                                               kg.graph.inputs[1]}
    assert not {kg.graph.inputs[2], kg.graph.inputs[3]} & {p.value for p in lk.params
                                                          if p.name in vec}
    buffers = []
    for p in lk.params:
        arr = inputs[p.value].copy() if p.value in inputs else \
            np.zeros(p.value.type.shape, np.float32)
        buffers.append(arr if aligned or p.value is not kg.graph.inputs[0] else _misaligned(arr))
    run_kernel(lk, buffers)
    outs = [buffers[i] for i, p in enumerate(lk.params) if p.writes]
    eager = fn(*args)
    for got, ref in zip(outs, eager):
        np.testing.assert_allclose(got, ref.numpy(), rtol=2e-6, atol=1e-6)


def test_interpreter_refuses_a_misaligned_vector_access():
    b = ExprBuilder()
    f32 = fg.float32
    src, dst = Param("src", f32), Param("dst", f32, writes=True)
    vec = b.load_vec(src, b.index(0), 4)
    k = LoweredKernel("k", [src, dst], [], [Store(dst, b.index(0), b.extract(vec, 3))], 1, 1)
    out = np.zeros(1, np.float32)
    run_kernel(k, [np.arange(8, dtype=np.float32)[:4].copy(), out])
    assert out[0] == 3.0
    with pytest.raises(InterpreterError, match="not aligned"):
        run_kernel(k, [_misaligned(np.arange(4, dtype=np.float32)), out])


def test_matmul_accumulates_floats_with_fma_and_integers_wrapping():
    # Products past the float range: BLAS's fused multiply-add keeps the sum's sign where
    # a rounded product would be an infinity of its own (inf - inf = NaN); integer
    # products wrap as numpy's do. Both found by the fuzzer's cuda-sim way.
    big = np.array([[1.7e11, 6.5e8, 6.6e37], [-4.3e29, -1.05e33, 3.05e5]], np.float32)
    a = fg.tensor(big).to(fg.bfloat16)
    i = fg.tensor(np.array([[[46341, -3, 2**30]]], np.int32))

    def f(a, i):
        return a @ a.mT, i @ i.mT
    kg = kernel_graph(f, [a, i])
    got = run_simulated(kg, [a._data, i._data])
    eager = f(a, i)
    assert not np.isnan(as_float(got[0])).any()
    # numpy's BLAS gives the same infinities where its kernels use FMA; without FMA (an
    # SSE-only BLAS) a product rounds to an infinity of its own and inf - inf is NaN there.
    want = as_float(eager[0]._data)
    blas_nan = np.isnan(want)
    np.testing.assert_array_equal(as_float(got[0])[~blas_nan], want[~blas_nan])
    assert np.isinf(as_float(got[0])[blas_nan]).all()
    np.testing.assert_array_equal(got[1], eager[1]._data)
