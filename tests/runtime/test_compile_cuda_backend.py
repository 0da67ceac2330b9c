"""``fusegrad.compile(fn, backend="cuda")`` on a simulated driver: the compiled function, its
autograd (forward and backward programs on the device) and a compiled training step give
what the CPU backend gives."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.runtime import cuda as rt
from fusegrad.testing.simulated_cuda import SimulatedDriver


@pytest.fixture
def simulated():
    drv = SimulatedDriver()
    rt.set_driver(drv)
    yield drv
    rt.set_driver(None)


def test_compiled_function_runs_its_kernels_on_the_device(simulated):
    def f(x, w):
        return F.softmax(x @ w, -1).sum(0)
    x, w = fg.randn(6, 5), fg.randn(5, 7)
    got = fg.compile(f, backend="cuda")(x, w)
    np.testing.assert_allclose(got.numpy(), f(x, w).numpy(), rtol=1e-5, atol=1e-6)
    assert {name.split("_")[1] for name, _, _ in simulated.launches} >= {"matmul", "row"}


def test_autograd_through_a_cuda_compiled_function(simulated):
    def f(x, w):
        return (x @ w).tanh().square().mean()
    x = fg.randn(4, 3)
    w1 = fg.randn(3, 5, requires_grad=True)
    w2 = fg.tensor(w1.detach().numpy(), requires_grad=True)
    fg.compile(f, backend="cuda")(x, w1).backward()
    f(x, w2).backward()
    np.testing.assert_allclose(w1.grad.numpy(), w2.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert len(simulated.launches) >= 2          # the forward's and the backward's kernels


def test_compiled_training_step_on_cuda_matches_the_cpu(simulated):
    def run(backend):
        fg.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(4, 8), fg.nn.GELU(), fg.nn.Linear(8, 3))
        opt = fg.optim.SGD(model.parameters(), lr=0.1)

        @fg.compile(backend=backend)
        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        x, y = fg.randn(5, 4), fg.tensor(np.array([0, 1, 2, 1, 0]))
        losses = [step(x, y).item() for _ in range(3)]
        return losses, [p.detach().numpy() for p in model.parameters()]
    cpu_losses, cpu_params = run("llvm")
    gpu_losses, gpu_params = run("cuda")
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-5)
    for a, b in zip(gpu_params, cpu_params):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_cuda_backend_without_a_driver_says_what_to_install():
    rt.set_driver(None)
    import sys
    saved = {k: sys.modules.get(k) for k in ("cuda", "cuda.bindings", "pycuda", "pycuda.driver")}
    try:
        for k in saved:
            sys.modules[k] = None
        with pytest.raises(rt.CudaUnavailable, match="fusegrad\\[cuda\\]"):
            fg.compile(lambda x: x * 2, backend="cuda")(fg.ones(3))
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        rt.set_driver(None)
