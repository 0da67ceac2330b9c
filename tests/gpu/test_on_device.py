"""On a real GPU (skipped without one): every kernel family of the zoo against eager, and a
compiled MLP forward and backward against the CPU program. ``benchmarks/gpu_check.sh`` runs
these."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.passes.manager import PassManager
from fusegrad.passes.partition import partition_joint
from fusegrad.runtime.cpu import Program
from fusegrad.tracer.compile import DEFAULT_PIPELINE
from tests.codegen.gpu_zoo import ZOO, mlp_args, mlp_loss
from tests.codegen.test_gpu_lowering import as_float, kernel_graph, kernel_graph_of, tolerance

pytestmark = pytest.mark.skipif(not fg.cuda.is_available(), reason="no CUDA device")


def run_on_device(kg, arrays):
    from fusegrad.runtime.cuda import CudaProgram
    outs = CudaProgram(kg)(*arrays)
    fg.cuda.synchronize()
    return [o.to_host() for o in outs]


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_on_the_gpu_matches_eager(name):
    fn, args = ZOO[name]
    eager = fn(*args)
    eager = list(eager) if isinstance(eager, tuple) else [eager]
    got = run_on_device(kernel_graph(fn, args), [a._data for a in args])
    for g, e in zip(got, eager):
        ref = e._data
        assert g.shape == ref.shape and g.dtype == ref.dtype
        tol = tolerance(ref.dtype)
        if ref.dtype == np.float32:
            # CUDA's expf/tanhf/erff are within 2 ulp; the CPU mathlib within 1.
            tol = {"rtol": 1e-5 * 4, "atol": 1e-5 * 4}
        np.testing.assert_allclose(as_float(g), as_float(ref), **tol)


def test_mlp_step_on_the_gpu_matches_the_cpu():
    args = mlp_args()
    g = PassManager(DEFAULT_PIPELINE).run(fg.trace(mlp_loss, *args))
    part = partition_joint(g, wrt=[1, 2, 3, 4], free_inputs=[])
    arrays = [a._data for a in args]
    fwd = kernel_graph_of(part.forward)
    cpu = Program(fwd)(*arrays)
    gpu = run_on_device(fwd, arrays)
    for c, s in zip(cpu, gpu):
        np.testing.assert_allclose(s, c, rtol=1e-4, atol=1e-5)
    bwd = kernel_graph_of(part.backward)
    saved = list(cpu[part.n_forward_outputs:])
    seeds = [np.ones(v.type.shape, v.type.dtype.np_dtype)
             for v in part.backward.inputs[len(saved):]]
    cpu_grads = Program(bwd)(*saved, *seeds)
    gpu_grads = run_on_device(bwd, saved + seeds)
    for c, s in zip(cpu_grads, gpu_grads):
        np.testing.assert_allclose(s, c, rtol=1e-4, atol=1e-5)


def test_compiled_training_step_on_the_gpu_matches_eager():
    def run(backend):
        fg.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(32, 64), fg.nn.GELU(), fg.nn.Linear(64, 10))
        opt = fg.optim.Adam(model.parameters(), lr=1e-3)

        def step(x, y):
            opt.zero_grad()
            loss = fg.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        if backend is not None:
            step = fg.compile(step, backend=backend)
        x = fg.randn(64, 32)
        y = fg.tensor(np.arange(64) % 10)
        losses = [step(x, y).item() for _ in range(4)]
        return losses, [p.detach().numpy() for p in model.parameters()]
    eager_losses, eager_params = run(None)
    gpu_losses, gpu_params = run("cuda")
    np.testing.assert_allclose(gpu_losses, eager_losses, rtol=1e-4)
    for a, b in zip(gpu_params, eager_params):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore:cudagraphs. the cross_entropy check")
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_symbolic_training_step_on_the_gpu_is_one_program_for_every_batch(mode):
    # The kernels read the batch size from the device's sizes buffer; cuBLASLt's m and k,
    # the grids and the buffers follow each call (a CUDA graph per size when replayed).
    def run(backend):
        fg.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(32, 64), fg.nn.GELU(), fg.nn.Linear(64, 10))
        opt = fg.optim.SGD(model.parameters(), lr=0.1)

        def step(x, y):
            opt.zero_grad()
            loss = fg.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        step = fg.compile(step, backend=backend, dynamic=True,
                          mode=mode if backend == "cuda" else None)
        rng = np.random.default_rng(0)
        losses = []
        for n in (64, 17, 300, 17):
            x = fg.tensor(rng.standard_normal((n, 32)).astype(np.float32))
            losses.append(step(x, fg.tensor(rng.integers(0, 10, n))).item())
        return losses, [p.detach().numpy() for p in model.parameters()], step
    cpu_losses, cpu_params, _ = run("llvm")
    gpu_losses, gpu_params, step = run("cuda")
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-4)
    for a, b in zip(gpu_params, cpu_params):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    (entry,) = step.entries()
    assert entry.program.builds == 1 and entry.program.fallback is None


# --------------------------------------------------------------------------- cuda tensors


def test_eager_cuda_tensors_match_numpy():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 1, 64)).astype(np.float32)
    b = rng.standard_normal((50, 64)).astype(np.float32)
    x, y = fg.tensor(a, device="cuda"), fg.tensor(b, device="cuda")
    tol = {"rtol": 4e-5, "atol": 4e-5}
    assert str((x + y).device) == "cuda:0"
    np.testing.assert_allclose(((x * y).exp() - 1).cpu().numpy(), np.exp(a * b) - 1, **tol)
    np.testing.assert_allclose((x + y).sum(1).cpu().numpy(), (a + b).sum(1), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(y.amax(0).cpu().numpy(), b.max(0))
    np.testing.assert_allclose((y @ y.T).cpu().numpy(), b @ b.T, rtol=1e-4, atol=1e-4)
    s = fg.nn.functional.softmax(y, -1).cpu().numpy()
    e = np.exp(b - b.max(-1, keepdims=True))
    np.testing.assert_allclose(s, e / e.sum(-1, keepdims=True), **tol)
    assert repr(fg.tensor([1., 2.], device="cuda")) == "tensor([1., 2.], device='cuda:0')"
    with pytest.raises(RuntimeError, match="cuda:0 and cpu"):
        x + fg.ones(64)
    with pytest.raises(TypeError, match="Use Tensor.cpu()"):
        x.numpy()


def test_eager_mlp_on_cuda_matches_the_cpu():
    fg.manual_seed(0)
    cpu = fg.nn.Sequential(fg.nn.Linear(32, 64), fg.nn.GELU(), fg.nn.Linear(64, 10))
    gpu = fg.nn.Sequential(fg.nn.Linear(32, 64), fg.nn.GELU(), fg.nn.Linear(64, 10))
    gpu.load_state_dict(cpu.state_dict())
    gpu.cuda()
    x, y = fg.randn(16, 32), fg.tensor(np.arange(16) % 10)
    fg.nn.functional.cross_entropy(cpu(x), y).backward()
    fg.nn.functional.cross_entropy(gpu(x.cuda()), y.cuda()).backward()
    for p, q in zip(cpu.parameters(), gpu.parameters()):
        assert q.grad.is_cuda
        np.testing.assert_allclose(q.grad.cpu().numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_compile_on_cuda_inputs_returns_cuda_tensors():
    def f(x, w):
        return fg.nn.functional.softmax(x @ w, -1).sum(0)
    x, w = fg.randn(64, 32), fg.randn(32, 48)
    got = fg.compile(f)(x.cuda(), w.cuda())
    assert got.is_cuda
    np.testing.assert_allclose(got.cpu().numpy(), f(x, w).numpy(), rtol=1e-4, atol=1e-5)


def test_cublaslt_matmuls_and_their_epilogues_on_the_device():
    from fusegrad.runtime import cublas
    from fusegrad.runtime import cuda as rt
    blas = cublas.cublaslt_for(rt.driver())
    if blas is None:
        pytest.skip("no libcublasLt (pip install nvidia-cublas)")
    fg.manual_seed(0)
    x, w, b = fg.randn(96, 64), fg.randn(128, 64), fg.randn(128)
    for fn in (lambda x, w, b: x @ w.t(),
               lambda x, w, b: fg.nn.functional.relu(fg.nn.functional.linear(x, w, b)),
               lambda x, w, b: fg.nn.functional.gelu(x @ w.t() + b, approximate="tanh"),
               lambda x, w, b: x.reshape(3, 32, 64) @ w[:64].t()):
        got = fg.compile(fn)(x.cuda(), w.cuda(), b.cuda())
        want = fn(*(fg.tensor(t.numpy().astype(np.float64)) for t in (x, w, b)))
        np.testing.assert_allclose(got.cpu().numpy(), want.numpy(), rtol=1e-4, atol=1e-4)
    assert blas.plans           # the matmuls went through cuBLASLt


def test_a_step_replayed_as_a_cuda_graph_equals_the_launched_step():
    def train(mode):
        fg.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(32, 64), fg.nn.ReLU(), fg.nn.Linear(64, 10)).cuda()
        opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = fg.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)

        @fg.compile(backend="cuda", mode=mode)
        def step(x, y):
            opt.zero_grad()
            loss = fg.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss
        x, y = fg.randn(16, 32).cuda(), fg.randn(16, 10).cuda()
        losses = []
        for _ in range(5):
            losses.append(step(x, y).item())
            sched.step()
        return losses
    np.testing.assert_allclose(train("reduce-overhead"), train(None), rtol=1e-6)
