"""Symbolic programs on the cuda backend (``fusegrad.compile(fn, backend="cuda", dynamic=True)``)
on a simulated driver: the graph is fused and lowered once, its CUDA kernels read the sizes
at run time from a device buffer, and each call evaluates the memory plan, the launch grids
and cuBLASLt's problem for its sizes. Values equal the CPU backend's within float32 rounding
of the same computation; a CUDA graph (``mode="reduce-overhead"``) is captured per size."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.codegen import gpu_lowering
from fusegrad.codegen.values import SYMBOLS
from fusegrad.config import config
from fusegrad.ops import primitive
from fusegrad.runtime import cuda as rt
from fusegrad.testing.simulated_cuda import SimulatedDriver
from fusegrad.tracer import eager_cuda
from tests.compiler.test_dynamic_shapes import DIFFERENTIAL, lm_sgd_step

EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(params=[False, True], ids=["tiled-matmul", "cublaslt"])
def drv(request):
    d = SimulatedDriver(cublas=request.param)
    rt.set_driver(d)
    yield d
    rt.set_driver(None)


@pytest.fixture
def plain_drv():
    d = SimulatedDriver()
    rt.set_driver(d)
    eager_cuda.clear_cache()
    yield d
    eager_cuda.clear_cache()
    primitive._device_apply = None
    rt.set_driver(None)


def _mlp():
    fg.manual_seed(0)
    return fg.nn.Sequential(fg.nn.Linear(12, 16), fg.nn.ReLU(), fg.nn.Linear(16, 10))


def _step_fn(model, opt):
    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def _batches(sizes):
    rng = np.random.default_rng(1)
    return [(fg.tensor(rng.standard_normal((n, 12)).astype(np.float32)),
             fg.tensor(rng.integers(0, 10, n))) for n in sizes]


def _train(backend, sizes, **options):
    """Losses and final parameters of an SGD step compiled with ``dynamic=True``, and the
    compiled step."""
    model = _mlp()
    step = fg.compile(_step_fn(model, fg.optim.SGD(model.parameters(), lr=0.1)),
                      backend=backend, dynamic=True, **options)
    losses = [float(step(x, y)) for x, y in _batches(sizes)]
    return losses, [p.detach().numpy() for p in model.parameters()], step


def _one_program(step):
    """The symbolic program of a step compiled once: built once, for every size."""
    assert step.compiles == 1 and step.recompile_reasons == []
    (entry,) = step.entries()
    assert entry.symbolic is not None
    program = entry.program
    assert program.builds == 1 and program.fallback is None and program.programs() == 1
    return program.runtime_sized


def test_mlp_step_is_one_program_for_three_batch_sizes(drv):
    sizes = [20, 9, 40]
    losses, params, step = _train("cuda", sizes)
    cpu_losses, cpu_params, _ = _train("llvm", sizes)
    # Dot products of length 16 and sums over 10 classes and the batch, in float32: a few
    # hundred eps per step at most, compounding through the updates.
    tol = 256 * EPS32 * len(sizes)
    np.testing.assert_allclose(losses, cpu_losses, rtol=tol, atol=tol)
    for p, q in zip(params, cpu_params):
        np.testing.assert_allclose(p, q, rtol=tol, atol=tol)
    program = _one_program(step)
    assert program.symbols == ("s0",)
    # Each call launches the same kernels, their grids evaluated for its batch size.
    grids: dict[str, set] = {}
    for name, grid, _ in drv.launches:
        grids.setdefault(name, set()).add(grid)
    assert max(len(g) for g in grids.values()) == 3
    if drv.cublaslt_library is not None:
        # cuBLASLt's problem per call: the batch size is a dim of the forward's products
        # and k of the weights' gradients, the same products each call.
        calls = drv.cublaslt_library.calls
        assert len(calls) % len(sizes) == 0
        for i, n in enumerate(sizes):
            call = calls[i * len(calls) // len(sizes):(i + 1) * len(calls) // len(sizes)]
            assert any(c["k"] == n for c in call) and any(n in (c["m"], c["n"]) for c in call)


def test_symbolic_kernels_read_their_sizes_and_static_ones_do_not(plain_drv):
    f = fg.compile(lambda x: F.softmax(x * 2, -1).sum(0), backend="cuda", dynamic=True)
    static = fg.compile(lambda x: F.softmax(x * 2, -1).sum(0), backend="cuda", dynamic=False)
    for n in (5, 7, 3):
        x = fg.randn(n, 33)
        np.testing.assert_allclose(f(x).numpy(), static(x).numpy(), rtol=16 * EPS32,
                                   atol=16 * EPS32)
    program = _one_program(f)
    kernels = list(program.lowered.values())
    reading = [lk for lk in kernels if any(p.value is SYMBOLS for p in lk.params)]
    assert reading and all(lk.index_bits == 32 for lk in reading)
    # (the sizes buffer's 64-bit integers, narrowed to the kernels' 32-bit indices)
    assert "const long long* __restrict__" in program.source
    assert any(lk.blocks is not None for lk in kernels)      # a grid per call
    for entry in static.entries():
        for lk in entry.program.lowered.values():
            assert lk.blocks is None and all(p.value is not SYMBOLS for p in lk.params)


# A few programs of tests/compiler/test_dynamic_shapes.py's differential set, one per kernel
# family and layout: each a symbolic program on the device, equal to eager at four sizes.
ON_DEVICE = ["matmul", "linear_relu", "softmax", "softmax0", "sum_all", "argmax0", "t_contig",
             "cat1", "pad", "mean_keep", "std0", "gelu_ln", "cross_entropy", "roll"]


@pytest.mark.parametrize("name", ON_DEVICE)
def test_symbolic_programs_on_the_device_equal_eager(plain_drv, name):
    f = DIFFERENTIAL[name]
    compiled = fg.compile(f, backend="cuda", dynamic=True)
    rng = np.random.default_rng(1)
    for n in (3, 5, 8, 2):
        x = fg.tensor(rng.standard_normal((n, 6)).astype(np.float32))
        # Reductions over at most 48 elements in float32.
        np.testing.assert_allclose(compiled(x).numpy(), f(x).numpy(), rtol=64 * EPS32,
                                   atol=64 * EPS32)
    _one_program(compiled)


@pytest.mark.parametrize("backend", ["llvm", "cuda"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_a_size_used_as_a_value_is_read_at_run_time(plain_drv, backend, dtype):
    # A mean's count (a ``full`` of the symbolic size, in the mean's dtype: a 16-bit float
    # rounds it as eager's full does) is read from the sizes buffer: one program.
    def f(x):
        return x.to(getattr(fg, dtype)).mean(0) + x.shape[0]
    compiled = fg.compile(f, backend=backend, dynamic=True)
    eps = float(np.finfo(np.float16).eps) if dtype == "float16" else \
        2.0 ** -7 if dtype == "bfloat16" else float(np.finfo(np.float64).eps)
    for n in (3, 5, 300):
        x = fg.randn(n, 4)
        # A sum of n values rounded once to the dtype, plus n (exact), rounded again.
        np.testing.assert_allclose(compiled(x).float().numpy(), f(x).float().numpy(),
                                   rtol=2 * eps, atol=0)
    _one_program(compiled)


def test_a_kernel_that_needs_a_size_builds_per_size_and_says_why(plain_drv, capsys,
                                                                 monkeypatch):
    # x[1:] - x[:-1]: fusion cannot decide whether s0-1 is 1 for every size.
    monkeypatch.setattr(config, "debug", 1)
    f = fg.compile(lambda x: x[1:] - x[:-1], backend="cuda", dynamic=True)
    for n in (4, 6):
        x = fg.randn(n, 3)
        np.testing.assert_array_equal(f(x).numpy(), (x[1:] - x[:-1]).numpy())
    program = f.entries()[0].program
    assert program.runtime_sized is None and program.builds == 2
    err = capsys.readouterr().err
    assert "kernels per size (cannot decide s0-1 == 1 for every size)" in err
    assert "kernels for s0=6" in err


def test_sizes_past_32_bit_indices_run_a_program_built_for_them(plain_drv, capsys,
                                                                monkeypatch):
    # Indices are 32-bit where the traced sizes fit (as torch guards 32-bit indexing); a
    # call whose sizes do not (here: past a limit lowered to 4096, which 20 rows of a block
    # of 256 threads each pass) runs kernels built for its sizes, said under
    # FUSEGRAD_DEBUG; the others keep the one program.
    f = fg.compile(lambda x: (x * 2).softmax(-1), backend="cuda", dynamic=True)
    x = fg.randn(3, 8)
    np.testing.assert_allclose(f(x).numpy(), (x * 2).softmax(-1).numpy(), rtol=8 * EPS32)
    program = f.entries()[0].program
    kernels = list(program.runtime_sized.lowered.values())
    assert all(lk.index_bits == 32 and lk.index_limits for lk in kernels)
    monkeypatch.setattr(gpu_lowering, "INDEX32_LIMIT", 4096)
    monkeypatch.setattr(config, "debug", 1)
    for n in (20, 5, 20):
        x = fg.randn(n, 8)
        np.testing.assert_allclose(f(x).numpy(), (x * 2).softmax(-1).numpy(), rtol=8 * EPS32)
    assert f.compiles == 1 and program.builds == 2     # the one program, and s0=20's
    err = capsys.readouterr().err
    assert err.count("kernels for s0=20, s1=8 (each new size builds its kernels once: "
                     "s0=20, s1=8: kernel") == 1
    assert "has 32-bit indices (its sizes fit them when traced)" in err


def test_cuda_graphs_are_captured_per_size(plain_drv, monkeypatch):
    def f(x, w):
        return F.softmax(x @ w, -1) * x.shape[0]
    graphs = fg.compile(f, backend="cuda", dynamic=True, mode="reduce-overhead")
    launched = fg.compile(f, backend="cuda", dynamic=True)
    w = fg.randn(6, 5)
    for n in (4, 9, 4, 9, 7):
        x = fg.randn(n, 6)
        np.testing.assert_array_equal(graphs(x, w).numpy(), launched(x, w).numpy())
    program = _one_program(graphs)
    # One graph per size (4, 9, 7); the second calls of 4 and 9 replay theirs.
    assert len(plain_drv.live_graphs) == 3 and plain_drv.graph_launches == 2
    assert program.replays == 5
    # The least recently used sizes' graphs are destroyed past CUDA_GRAPH_SIZES.
    monkeypatch.setattr(rt, "CUDA_GRAPH_SIZES", 2)
    x = fg.randn(3, 6)
    np.testing.assert_array_equal(graphs(x, w).numpy(), launched(x, w).numpy())
    assert len(plain_drv.live_graphs) == 2
    assert sorted(key[1] for key in program._graphs) == [(3, 6, 5), (7, 6, 5)]    # (n, 6, 5)


@pytest.mark.filterwarnings("ignore:cudagraphs. the cross_entropy check")
def test_training_step_replays_a_graph_per_batch_size(plain_drv):
    sizes = [8, 5, 8, 5]
    losses, params, step = _train("cuda", sizes, mode="reduce-overhead")
    cpu_losses, cpu_params, _ = _train("llvm", sizes)
    tol = 256 * EPS32 * len(sizes)
    np.testing.assert_allclose(losses, cpu_losses, rtol=tol, atol=tol)
    for p, q in zip(params, cpu_params):
        np.testing.assert_allclose(p, q, rtol=tol, atol=tol)
    _one_program(step)
    assert len(plain_drv.live_graphs) == 2 and plain_drv.graph_launches == 2


@pytest.mark.filterwarnings("ignore:cudagraphs. the cross_entropy check")
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_a_model_on_the_device_trains_at_three_batch_sizes(plain_drv, mode):
    # cuda tensors in and out (the inputs' device buffers bind the sizes), the parameters
    # updated in place on the device.
    sizes = [8, 5, 11]
    model = _mlp().to("cuda")
    step = fg.compile(_step_fn(model, fg.optim.SGD(model.parameters(), lr=0.1)), dynamic=True,
                      mode=mode)
    losses = [step(x.cuda(), y.cuda()) for x, y in _batches(sizes)]
    assert all(loss.is_cuda for loss in losses)
    _one_program(step._cuda_twin)                 # (the twin on the cuda backend runs it)
    cpu_losses, cpu_params, _ = _train("llvm", sizes)
    tol = 256 * EPS32 * len(sizes)
    np.testing.assert_allclose([loss.item() for loss in losses], cpu_losses, rtol=tol, atol=tol)
    for p, q in zip(model.parameters(), cpu_params):
        np.testing.assert_allclose(p.detach().cpu().numpy(), q, rtol=tol, atol=tol)


def _char_transformer():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    try:
        from char_transformer import make_model
    finally:
        sys.path.pop(0)
    fg.manual_seed(0)
    return make_model(fg, vocab=20, block=16, n_embd=16, n_head=2, n_layer=1)


@pytest.mark.slow
def test_char_transformer_step_is_one_program_for_batch_and_sequence_length(drv):
    cpu_model = _char_transformer()
    model = copy.deepcopy(cpu_model)
    step = fg.compile(lm_sgd_step(model), backend="cuda", dynamic=True)
    cpu_step = fg.compile(lm_sgd_step(cpu_model), dynamic=True)
    rng = np.random.default_rng(0)
    shapes = [(3, 8), (5, 12), (2, 5)]          # (batch, sequence length)
    for b, t in shapes:
        x, y = (fg.tensor(rng.integers(0, 20, (b, t))) for _ in range(2))
        # Sums of a few dozen float32 terms per value, through one block and the update.
        np.testing.assert_allclose(float(step(x, y)), float(cpu_step(x, y)),
                                   rtol=1024 * EPS32 * len(shapes))
    program = _one_program(step)
    assert program.symbols == ("s0", "s1")
    # The attention runs on the device too, at every sequence length.
    assert not program.host_steps or all("attention" not in r for r in program.host_steps.values())
    tol = 1024 * EPS32 * len(shapes)
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=tol,
                                   atol=tol * 0.1)
