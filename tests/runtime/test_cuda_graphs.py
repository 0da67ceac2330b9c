"""``fusegrad.compile(fn, mode="reduce-overhead")`` on CUDA: each call of a compiled program
replays one CUDA graph over static buffers. On the simulated driver a capture records the
launches (kernels, cuBLASLt's matmuls, device copies) and a replay runs them; any call that
would wait for the device during a capture raises, as the real driver does."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.config import config
from fusegrad.ops import primitive
from fusegrad.runtime import cuda as rt
from fusegrad.testing.simulated_cuda import SimulatedDriver
from fusegrad.tracer import eager_cuda


@pytest.fixture(params=[False, True], ids=["tiled-matmul", "cublaslt"])
def drv(request):
    d = SimulatedDriver(cublas=request.param)
    rt.set_driver(d)
    eager_cuda.clear_cache()
    yield d
    eager_cuda.clear_cache()
    primitive._device_apply = None
    rt.set_driver(None)


def _train(mode, device, steps=4):
    """Losses and parameters after ``steps`` compiled SGD+momentum steps of a small MLP
    with a learning rate that a scheduler changes every step, and the compiled step."""
    fg.manual_seed(0)
    model = fg.nn.Sequential(fg.nn.Linear(4, 16), fg.nn.ReLU(), fg.nn.Linear(16, 3)).to(device)
    opt = fg.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    sched = fg.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    @fg.compile(backend="cuda", mode=mode)
    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    x = fg.randn(8, 4).to(device)
    y = fg.tensor(np.array([0, 1, 2, 1, 0, 2, 2, 1])).to(device)
    losses = []
    for _ in range(steps):
        losses.append(step(x, y))
        sched.step()
    return [loss.item() for loss in losses], [p.detach().cpu().numpy() for p in model.parameters()]


@pytest.mark.filterwarnings("ignore:cudagraphs. the cross_entropy check")
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_replayed_steps_equal_launched_steps(drv, device):
    losses, params = _train(None, device)
    launches = drv.graph_launches
    graph_losses, graph_params = _train("reduce-overhead", device)
    # the first step makes the optimizer's state (a trace of its own), the second captures
    assert drv.graph_launches - launches >= 2
    np.testing.assert_array_equal(graph_losses, losses)
    for p, q in zip(graph_params, params):
        np.testing.assert_array_equal(p, q)
    assert len(set(losses)) == len(losses)        # the steps did change the model


def test_nothing_waits_for_the_device_inside_a_replayed_step(drv):
    fg.manual_seed(0)
    model = fg.nn.Sequential(fg.nn.Linear(4, 8), fg.nn.GELU(), fg.nn.Linear(8, 2)).to("cuda")
    # capturable: the step count lives on the device (a cpu count is copied back each step)
    opt = fg.optim.Adam(model.parameters(), lr=1e-2, capturable=True)

    @fg.compile(backend="cuda", mode="reduce-overhead")
    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss
    x, y = fg.randn(8, 4).to("cuda"), fg.randn(8, 2).to("cuda")
    for _ in range(3):                   # state made, then captured
        step(x, y)
    syncs, replays = drv.syncs, drv.graph_launches
    for _ in range(3):
        for group in opt.param_groups:
            group["lr"] *= 0.5               # a scalar input: copied in, not waited for
        loss = step(x, y)
    assert drv.graph_launches - replays == 3
    assert drv.syncs == syncs
    assert np.isfinite(loss.item())


def test_a_program_with_host_steps_launches_kernel_by_kernel_and_says_why(drv):
    def f(x):
        return fg.sort(x * 2, dim=-1).values + 1
    x = fg.randn(3, 5)
    with pytest.warns(UserWarning, match=r"skipping cudagraphs due to \d+ kernel\(s\) run on the host"):
        got = fg.compile(f, backend="cuda", mode="reduce-overhead")(x)
    np.testing.assert_allclose(got.numpy(), f(x).numpy())
    assert drv.graph_launches == 0


def test_a_bad_target_of_a_replayed_step_still_raises(drv):
    f = fg.compile(lambda x, y: F.cross_entropy(x * 2, y), backend="cuda", mode="reduce-overhead")
    x = fg.randn(4, 3)
    f(x, fg.tensor(np.array([0, 1, 2, 1])))
    f(x, fg.tensor(np.array([2, 1, 0, 0])))
    assert drv.graph_launches == 1
    with pytest.raises(IndexError, match="Target 7 is out of bounds"):
        f(x, fg.tensor(np.array([0, 7, 2, 1])))


def test_outputs_of_a_replay_are_not_overwritten_by_the_next(drv):
    f = fg.compile(lambda a, b: a @ b + 1, backend="cuda", mode="reduce-overhead")
    a, b = fg.randn(3, 4).to("cuda"), fg.randn(4, 2).to("cuda")
    first = f(a, b)
    second = f(a * 2, b)
    third = f(a * 3, b)
    want = a.cpu().numpy() @ b.cpu().numpy()
    for out, scale in ((first, 1), (second, 2), (third, 3)):
        np.testing.assert_allclose(out.cpu().numpy(), scale * want + 1, rtol=1e-5, atol=1e-5)
    assert drv.graph_launches == 2


def test_graphs_are_destroyed_with_their_program(drv):
    f = fg.compile(lambda a: (a * 2).exp().sum(-1), backend="cuda", mode="reduce-overhead")
    g = fg.compile(lambda a: a.tanh() + 1, backend="cuda", mode="reduce-overhead")
    a = fg.randn(3, 4).to("cuda")
    for _ in range(3):
        f(a), g(a)
    assert len(drv.live_graphs) == 2 and drv.graph_launches == 4
    del f
    gc.collect()
    rt.empty_cache()
    assert len(drv.live_graphs) == 1
    del g
    gc.collect()
    rt.empty_cache()
    assert drv.live_graphs == []


def test_capture_refuses_a_wait():
    d = SimulatedDriver()
    d.begin_capture()
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
        d.synchronize()
    assert d.end_capture() == []


def test_a_changed_tf32_setting_is_captured_again():
    """torch reads the TF32 switch at each call: a graph captured with exact float32 products
    is captured again once TF32 is allowed, instead of replaying the old compute type."""
    drv = SimulatedDriver(cublas=True)
    rt.set_driver(drv)
    before = config.float32_matmul_precision
    try:
        fg.set_float32_matmul_precision("highest")
        f = fg.compile(lambda a, b: a @ b, backend="cuda", mode="reduce-overhead")
        a, b = fg.randn(16, 32).to("cuda"), fg.randn(32, 8).to("cuda")
        for _ in range(3):
            f(a, b)
        calls = drv.cublaslt_library.calls
        assert calls and calls[-1]["compute"] == 68             # CUBLAS_COMPUTE_32F
        fg.set_float32_matmul_precision("high")
        f(a, b)
        f(a, b)
        assert calls[-1]["compute"] == 77                       # CUBLAS_COMPUTE_32F_FAST_TF32
        fg.set_float32_matmul_precision("highest")
        f(a, b)
        assert calls[-1]["compute"] == 68
        # Each new capture destroyed the graph it replaced.
        assert len(drv.live_graphs) == 1
    finally:
        config.float32_matmul_precision = before
        eager_cuda.clear_cache()
        primitive._device_apply = None
        rt.set_driver(None)
