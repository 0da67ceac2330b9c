"""Matmuls through cuBLASLt (:mod:`fusegrad.runtime.cublas`) on the simulated driver's
stand-in, which reads every argument as the library would: the transposed trick, views,
batches, the fused epilogues, the TF32 switch, and the fallbacks to the generated kernel. The
binding's signatures are checked against the real ``libcublasLt`` where one is installed."""

from __future__ import annotations

import ctypes
import os
import re

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.config import config
from fusegrad.ops import primitive
from fusegrad.runtime import cublas
from fusegrad.runtime import cuda as rt
from fusegrad.testing.simulated_cuda import SimulatedCublasLt, SimulatedDriver
from fusegrad.tracer import eager_cuda


@pytest.fixture
def blas():
    """The simulated driver with its cuBLASLt stand-in; yields the stand-in."""
    drv = SimulatedDriver(cublas=True)
    rt.set_driver(drv)
    eager_cuda.clear_cache()
    yield drv.cublaslt_library
    eager_cuda.clear_cache()
    primitive._device_apply = None
    rt.set_driver(None)
    config.float32_matmul_precision = "highest"


def _rel_error(got, want) -> float:
    want = np.asarray(want, dtype=np.float64)
    return float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


# A float32 product of k terms rounds at most about k ulps away from the float64 one.
def _tol(k: int) -> float:
    return 4 * k * float(np.finfo(np.float32).eps)


CASES = {
    # name: (function of x (8x8), w (16x8), b (16), the epilogues cuBLASLt runs)
    "relu of a linear": (lambda x, w, b: F.relu(x @ w.t() + b), ["RELU_BIAS"]),
    "tanh GELU of a linear": (lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"),
                              ["GELU_BIAS"]),
    "erf GELU: bias fused, GELU after": (lambda x, w, b: F.gelu(F.linear(x, w, b)), ["BIAS"]),
    "plain product, transposed operand": (lambda x, w, b: x @ w.t(), ["DEFAULT"]),
    "both operands transposed": (lambda x, w, b: x.t() @ w[:8].t(), ["DEFAULT"]),
    "a sliced operand": (lambda x, w, b: x[:, 2:6] @ w[3:7, :], ["DEFAULT"]),
    "a batch of products": (lambda x, w, b: x.reshape(2, 4, 8) @ w.reshape(2, 8, 8), ["DEFAULT"]),
    "a batch of rows times one matrix": (lambda x, w, b: F.linear(x.reshape(2, 4, 8), w, b) * 2,
                                         ["BIAS"]),
    "the pre-activation kept": (lambda x, w, b: (lambda h: (F.relu(h), h * 3))(x @ w.t() + b),
                                ["BIAS"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_matmuls_run_through_cublaslt(blas, name):
    fn, epilogues = CASES[name]
    fg.manual_seed(0)
    x, w, b = fg.randn(8, 8), fg.randn(16, 8), fg.randn(16)
    got = fg.compile(fn, backend="cuda")(x, w, b)
    want = fn(*(fg.tensor(t.numpy().astype(np.float64)) for t in (x, w, b)))
    for g, r in zip(got if isinstance(got, tuple) else [got],
                    want if isinstance(want, tuple) else [want]):
        assert _rel_error(g.numpy(), r.numpy()) < _tol(8)
    assert [c["epilogue"] for c in blas.calls] == epilogues


def test_a_batch_of_rows_times_one_matrix_is_one_gemm(blas):
    x, w = fg.randn(3, 5, 8), fg.randn(8, 4)
    got = fg.compile(lambda a, c: a @ c, backend="cuda")(x, w)
    np.testing.assert_allclose(got.numpy(), x.numpy() @ w.numpy(), rtol=_tol(8), atol=_tol(8))
    # cuBLAS's column-major problem: m = our n, n = our batch * m
    assert [(c["m"], c["n"], c["k"], c["batch"]) for c in blas.calls] == [(4, 15, 8, 1)]


def test_gelu_keeping_its_input_uses_the_aux_epilogue(blas):
    def f(x, w, b):
        h = F.linear(x, w, b)
        return F.gelu(h, approximate="tanh"), h
    x, w, b = fg.randn(4, 8), fg.randn(16, 8), fg.randn(16)
    got = fg.compile(f, backend="cuda")(x, w, b)
    want = f(x, w, b)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-5, atol=1e-5)
    assert [c["epilogue"] for c in blas.calls] == ["GELU_AUX_BIAS"]


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_training_step_through_cublaslt_matches_the_cpu(blas, act):
    def run(backend):
        fg.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(4, 16), fg.nn.ReLU() if act == "relu" else
                                 fg.nn.GELU(approximate="tanh"), fg.nn.Linear(16, 3))
        opt = fg.optim.Adam(model.parameters(), lr=0.01)

        @fg.compile(backend=backend)
        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        x, y = fg.randn(8, 4), fg.tensor(np.array([0, 1, 2, 1, 0, 2, 2, 1]))
        losses = [step(x, y).item() for _ in range(3)]
        return losses, [p.detach().numpy() for p in model.parameters()]
    cpu_losses, cpu_params = run("llvm")
    losses, params = run("cuda")
    np.testing.assert_allclose(losses, cpu_losses, rtol=1e-5)
    for p, q in zip(params, cpu_params):
        np.testing.assert_allclose(p, q, rtol=1e-4, atol=1e-5)
    assert len(blas.calls) >= 3 * 3      # forward's two and the backward's matmuls, each step


def test_eager_cuda_matmul_runs_through_cublaslt(blas):
    x, w = fg.randn(5, 6), fg.randn(6, 7)
    got = (x.to("cuda") @ w.to("cuda")).cpu()
    np.testing.assert_allclose(got.numpy(), x.numpy() @ w.numpy(), rtol=_tol(6), atol=_tol(6))
    assert len(blas.calls) == 1


@pytest.mark.parametrize("dtype", [fg.float16, fg.bfloat16, fg.float64])
def test_other_float_dtypes(blas, dtype):
    x, w = fg.randn(6, 10).to(dtype), fg.randn(10, 4).to(dtype)
    got = fg.compile(lambda a, c: a @ c, backend="cuda")(x, w)
    want = x @ w                      # eager rounds the float32 product once, as cuBLAS
    np.testing.assert_allclose(got.float().numpy(), want.float().numpy(), rtol=1e-2, atol=1e-2)
    assert got.dtype == dtype and len(blas.calls) == 1


def test_integer_matmul_and_the_kernel_switch_fall_back_to_the_generated_kernel(blas,
                                                                               monkeypatch):
    xi, wi = fg.tensor(np.arange(12).reshape(3, 4)), fg.tensor(np.arange(8).reshape(4, 2))
    got = fg.compile(lambda a, c: a @ c, backend="cuda")(xi, wi)
    np.testing.assert_array_equal(got.numpy(), xi.numpy() @ wi.numpy())
    assert blas.calls == []
    monkeypatch.setattr(config, "cuda_blas", "kernel")
    x, w = fg.randn(3, 4), fg.randn(4, 2)
    got = fg.compile(lambda a, c: (a @ c) * 1.0, backend="cuda")(x, w)
    np.testing.assert_allclose(got.numpy(), x.numpy() @ w.numpy(), rtol=_tol(4), atol=_tol(4))
    assert blas.calls == []


def test_tf32_switches(blas):
    assert fg.get_float32_matmul_precision() == "highest"
    assert fg.backends.cuda.matmul.allow_tf32 is False
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((16, 64)).astype(np.float32), \
        rng.standard_normal((64, 16)).astype(np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64)
    f = fg.compile(lambda a, c: a @ c, backend="cuda")
    full = f(fg.tensor(x), fg.tensor(w)).numpy()
    fg.backends.cuda.matmul.allow_tf32 = True
    assert fg.get_float32_matmul_precision() == "high"
    tf32 = f(fg.tensor(x), fg.tensor(w)).numpy()
    fg.set_float32_matmul_precision("highest")
    assert fg.backends.cuda.matmul.allow_tf32 is False
    fg.set_float32_matmul_precision("medium")
    assert fg.backends.cuda.matmul.allow_tf32 is True
    assert [c["compute"] for c in blas.calls] == [cublas.COMPUTE["32F"],
                                                  cublas.COMPUTE["32F_FAST_TF32"]]
    # TF32 keeps 10 mantissa bits: its error is ~2^-11 relative per product, float32's ~2^-24
    assert _rel_error(full, exact) < _tol(64)
    assert 1e-5 < _rel_error(tf32, exact) < 64 * 2.0 ** -11


def test_tf32_switch_errors():
    with pytest.raises(AttributeError, match="Unknown attribute foo"):
        _ = fg.backends.cuda.matmul.foo
    with pytest.warns(UserWarning, match="is not one of 'highest', 'high', or 'medium'"):
        fg.set_float32_matmul_precision("fast")
    assert fg.get_float32_matmul_precision() == "highest"


def test_signatures_match_the_installed_library():
    """The binding's functions exist in ``libcublasLt`` (dlopen needs no GPU), and its enum
    values are those of ``cublasLt.h``/``cublas_api.h`` beside it."""
    path = cublas.find_cublaslt()
    if path is None:
        pytest.skip("no libcublasLt installed (pip install nvidia-cublas)")
    lib = cublas.load_cublaslt(path)
    assert lib.cublasLtGetVersion() > 0
    assert lib.cublasLtGetStatusString(cublas.STATUS_NOT_SUPPORTED) == \
        SimulatedCublasLt.cublasLtGetStatusString(None, cublas.STATUS_NOT_SUPPORTED)
    assert ctypes.sizeof(cublas.HeuristicResult) == 96
    include = os.path.join(os.path.dirname(os.path.dirname(path)), "include")
    if not os.path.exists(os.path.join(include, "cublasLt.h")):
        return
    header = open(os.path.join(include, "cublasLt.h")).read() + \
        open(os.path.join(include, "cublas_api.h")).read()

    def value(name: str) -> int:
        expr = re.search(rf"\b{name}\s*=\s*([^,\n]+),", header).group(1)
        expr = re.sub(r"CUBLASLT_EPILOGUE_(\w+)", lambda m: str(cublas.EPILOGUE[m.group(1)]), expr)
        return eval(expr)
    for name, v in cublas.EPILOGUE.items():
        assert value(f"CUBLASLT_EPILOGUE_{name}") == v, name
    for name, v in cublas.COMPUTE.items():
        assert value(f"CUBLAS_COMPUTE_{name}") == v, name
    for name, v in [("CUBLASLT_MATMUL_DESC_TRANSA", cublas.DESC_TRANSA),
                    ("CUBLASLT_MATMUL_DESC_TRANSB", cublas.DESC_TRANSB),
                    ("CUBLASLT_MATMUL_DESC_EPILOGUE", cublas.DESC_EPILOGUE),
                    ("CUBLASLT_MATMUL_DESC_BIAS_POINTER", cublas.DESC_BIAS_POINTER),
                    ("CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER", cublas.DESC_EPILOGUE_AUX_POINTER),
                    ("CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD", cublas.DESC_EPILOGUE_AUX_LD),
                    ("CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT", cublas.LAYOUT_BATCH_COUNT),
                    ("CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET",
                     cublas.LAYOUT_STRIDED_BATCH_OFFSET),
                    ("CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES", cublas.PREF_MAX_WORKSPACE_BYTES)]:
        assert value(name) == v, name
    for which, v in cublas.PREF_MIN_ALIGNMENT.items():
        assert value(f"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{which}_BYTES") == v
    for name in cublas.SIGNATURES:
        assert re.search(rf"\b{name}\s*\(", header), name
