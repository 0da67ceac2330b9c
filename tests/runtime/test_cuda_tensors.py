"""Tensors on ``cuda`` through a simulated driver (device memory in host arrays, kernels run
by the lowered IR's interpreter): moving tensors, eager ops as single-op kernels, autograd,
compiled functions on cuda inputs, and torch's errors. The same checks with the real driver
are in tests/gpu/test_on_device.py."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.runtime import cuda as rt
from fusegrad.tracer import eager_cuda
from tests.runtime.conftest import no_modules_after

TOL = {"rtol": 1e-5, "atol": 1e-6}


def _on_cuda(t) -> bool:
    return isinstance(t._data, rt.DeviceArray) and str(t.device) == "cuda:0"


def test_to_cuda_and_back_keeps_values_and_reports_the_device(simulated):
    x = fg.randn(3, 4)
    for moved in (x.to("cuda"), x.to(fg.device("cuda")), x.cuda(), x.to("cuda:0")):
        assert _on_cuda(moved) and moved.is_cuda and moved.device == fg.device("cuda", 0)
        back = moved.cpu()
        assert back.device == fg.device("cpu") and not back.is_cuda
        np.testing.assert_array_equal(back.numpy(), x.numpy())
    for scalar in (fg.tensor(2.5).cuda(), fg.tensor(7, device="cuda")):   # 0-d stays 0-d
        assert scalar.shape == () and scalar.ndim == 0 and scalar.cpu().shape == ()
    assert fg.tensor(2.5).cuda().tolist() == 2.5
    y = x.to("cuda", fg.float64)
    assert _on_cuda(y) and y.dtype is fg.float64
    assert x.cpu() is x and y.cuda() is y


def test_factories_take_a_device(simulated):
    for t in (fg.zeros(2, 3, device="cuda"), fg.ones(2, 3, device="cuda"),
              fg.empty(2, 3, device="cuda"), fg.full((2, 3), 7.0, device="cuda"),
              fg.tensor([[1., 2., 3.], [4., 5., 6.]], device="cuda"),
              fg.arange(6, device="cuda").reshape(2, 3)):
        assert _on_cuda(t) and tuple(t.shape) == (2, 3)
    np.testing.assert_array_equal(fg.ones(2, 3, device="cuda").cpu().numpy(), np.ones((2, 3)))
    fg.manual_seed(3)
    a = fg.randn(4, 5, device="cuda")
    fg.manual_seed(3)
    b = fg.randn(4, 5)
    np.testing.assert_array_equal(a.cpu().numpy(), b.numpy())
    w = fg.randn(3, requires_grad=True, device="cuda")
    assert w.is_leaf and w.requires_grad and _on_cuda(w)
    assert _on_cuda(fg.zeros_like(w)) and _on_cuda(w.new_zeros(2)) and _on_cuda(fg.randn_like(w))


def test_elementwise_with_broadcasting_matches_numpy(simulated):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 1, 4)).astype(np.float32)
    b = rng.standard_normal((5, 4)).astype(np.float32)
    x, y = fg.tensor(a, device="cuda"), fg.tensor(b, device="cuda")
    cases = [(x + y, a + b), (x * y - 1.5, a * b - 1.5), ((x / (y.abs() + 1)).exp(),
             np.exp(a / (np.abs(b) + 1))), (fg.where(x > y, x, y), np.where(a > b, a, b)),
             (fg.maximum(x, y).tanh(), np.tanh(np.maximum(a, b))), (2 ** x, 2 ** a)]
    for got, want in cases:
        assert _on_cuda(got)
        np.testing.assert_allclose(got.cpu().numpy(), want, **TOL)
    i = fg.tensor(np.arange(12).reshape(3, 4), device="cuda")
    np.testing.assert_array_equal((i // 3 + i % 5).cpu().numpy(),
                                  np.arange(12).reshape(3, 4) // 3 + np.arange(12).reshape(3, 4) % 5)


def test_reductions_match_numpy(simulated):
    a = np.random.default_rng(1).standard_normal((4, 5, 6)).astype(np.float32)
    x = fg.tensor(a, device="cuda")
    np.testing.assert_allclose(x.sum().cpu().numpy(), a.sum(), rtol=1e-5)
    np.testing.assert_allclose(x.sum(1).cpu().numpy(), a.sum(1), **TOL)
    np.testing.assert_allclose(x.mean((0, 2), keepdim=True).cpu().numpy(),
                               a.mean((0, 2), keepdims=True), **TOL)
    np.testing.assert_array_equal(x.amax(-1).cpu().numpy(), a.max(-1))
    np.testing.assert_array_equal(x.argmax(0).cpu().numpy(), a.argmax(0))
    assert x.sum().item() == pytest.approx(float(a.sum()), rel=1e-5)


def test_matmul_and_softmax_match_numpy(simulated):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 3, 5)).astype(np.float32)
    b = rng.standard_normal((5, 4)).astype(np.float32)
    got = fg.tensor(a, device="cuda") @ fg.tensor(b, device="cuda")
    assert _on_cuda(got)
    np.testing.assert_allclose(got.cpu().numpy(), a @ b, rtol=1e-5, atol=1e-5)
    s = F.softmax(fg.tensor(a, device="cuda"), -1).cpu().numpy()
    e = np.exp(a - a.max(-1, keepdims=True))
    np.testing.assert_allclose(s, e / e.sum(-1, keepdims=True), **TOL)


def test_movement_ops_are_views_of_the_device_memory(simulated):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = fg.tensor(a, device="cuda")
    launches = len(simulated.launches)
    for got, want in [(x.permute(2, 0, 1), a.transpose(2, 0, 1)), (x[:, 1:, ::2], a[:, 1:, ::2]),
                      (x.reshape(6, 4), a.reshape(6, 4)), (x.expand(5, 2, 3, 4), np.broadcast_to(
                          a, (5, 2, 3, 4)))]:
        assert _on_cuda(got) and got._data.shares_storage(x._data)
        assert got.stride() == tuple(s // 4 for s in want.strides)
        assert got.is_contiguous() == want.flags.c_contiguous
        np.testing.assert_array_equal(got.cpu().numpy(), want)
    assert len(simulated.launches) == launches        # no kernel made a view


def test_each_op_signature_compiles_once(simulated):
    x, y = fg.randn(3, 4, device="cuda"), fg.randn(3, 4, device="cuda")
    x + y
    compiled = eager_cuda.STATS["compiled"]
    for _ in range(3):
        x + y
    assert eager_cuda.STATS["compiled"] == compiled
    x + fg.randn(5, 4, device="cuda")[:3]       # a contiguous view at an offset: no copy
    assert eager_cuda.STATS["compiled"] == compiled
    x + fg.randn(4, 3, device="cuda").t()       # a strided view: one strided-copy program
    assert eager_cuda.STATS["compiled"] == compiled + 1
    x + fg.randn(6, 5, device="cuda")[::2, :4]  # another view geometry: another copy program
    assert eager_cuda.STATS["compiled"] == compiled + 2
    x + fg.randn(4, 3, device="cuda").t()       # both cached now
    assert eager_cuda.STATS["compiled"] == compiled + 2


def test_extern_ops_run_on_the_host_and_are_counted(simulated):
    a = np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)
    x = fg.tensor(a, device="cuda")
    before = eager_cuda.STATS["host_fallbacks"]
    got = x.cumsum(1)
    assert _on_cuda(got) and eager_cuda.STATS["host_fallbacks"] == before + 1
    np.testing.assert_allclose(got.cpu().numpy(), np.cumsum(a, 1), **TOL)


def test_mixing_devices_raises_torchs_error_except_for_scalars(simulated):
    x = fg.ones(3, device="cuda")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but "
                       "found at least two devices, cuda:0 and cpu!"):
        x + fg.ones(3)
    with pytest.raises(RuntimeError, match="same device"):
        fg.ones(2, 3) @ fg.ones(3, 2, device="cuda")
    y = x * fg.tensor(2.0) + 1          # a 0-d cpu tensor and a Python scalar are allowed
    assert _on_cuda(y)
    np.testing.assert_array_equal(y.cpu().numpy(), [3, 3, 3])


def test_printing_copies_back_and_names_the_device(simulated):
    x = fg.tensor([1., 2., 3.], device="cuda")
    assert repr(x) == "tensor([1., 2., 3.], device='cuda:0')"
    w = fg.tensor([1., 2.], device="cuda", requires_grad=True)
    assert repr(w) == "tensor([1., 2.], device='cuda:0', requires_grad=True)"
    assert repr(w * 2) == "tensor([2., 4.], device='cuda:0', grad_fn=<MulBackward0>)"
    assert repr(fg.tensor([1, 2], device="cuda", dtype=fg.float64)) == \
        "tensor([1., 2.], device='cuda:0', dtype=fusegrad.float64)"


def test_numpy_on_a_cuda_tensor_raises_and_item_copies_back(simulated):
    x = fg.tensor([1.5, 2.5], device="cuda")
    message = ("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
               "tensor to host memory first.")
    with pytest.raises(TypeError) as info:
        x.numpy()
    assert str(info.value) == message
    with pytest.raises(TypeError, match="Use Tensor.cpu()"):
        np.asarray(x)
    assert x[1].item() == 2.5 and x.tolist() == [1.5, 2.5] and float(x.sum()) == 4.0


def test_autograd_on_cuda_gives_cuda_grads(simulated):
    x = fg.randn(4, 3)
    w = fg.randn(3, 5, requires_grad=True, device="cuda")
    loss = (x.cuda() @ w).tanh().square().mean()
    loss.backward()
    assert _on_cuda(w.grad)
    w_cpu = w.detach().cpu().requires_grad_()
    (x @ w_cpu).tanh().square().mean().backward()
    np.testing.assert_allclose(w.grad.cpu().numpy(), w_cpu.grad.numpy(), **TOL)
    first = w.grad.cpu().numpy()
    (x.cuda() @ w).tanh().square().mean().backward()      # accumulates in place on the device
    assert _on_cuda(w.grad)
    np.testing.assert_allclose(w.grad.cpu().numpy(), 2 * first, **TOL)


def test_gradient_crosses_devices_through_to(simulated):
    a = fg.tensor([1., 2., 3.], requires_grad=True)
    b = a.to("cuda")
    assert b.grad_fn.name() == "ToCopyBackward0"
    (b * b).sum().backward()
    assert a.grad.device == fg.device("cpu")
    np.testing.assert_allclose(a.grad.numpy(), [2., 4., 6.])


def test_mlp_forward_and_backward_on_cuda_matches_the_cpu(simulated):
    fg.manual_seed(0)
    cpu = fg.nn.Sequential(fg.nn.Linear(4, 8), fg.nn.GELU(), fg.nn.Linear(8, 3))
    gpu = fg.nn.Sequential(fg.nn.Linear(4, 8), fg.nn.GELU(), fg.nn.Linear(8, 3))
    gpu.load_state_dict(cpu.state_dict())
    gpu.cuda()
    assert all(_on_cuda(p) and p.is_leaf for p in gpu.parameters())
    x, y = fg.randn(5, 4), fg.tensor(np.array([0, 1, 2, 1, 0]))
    loss_cpu = F.cross_entropy(cpu(x), y)
    loss_gpu = F.cross_entropy(gpu(x.cuda()), y.cuda())
    assert _on_cuda(loss_gpu)
    np.testing.assert_allclose(loss_gpu.item(), loss_cpu.item(), rtol=1e-5)
    loss_cpu.backward()
    loss_gpu.backward()
    for p, q in zip(cpu.parameters(), gpu.parameters()):
        assert _on_cuda(q.grad)
        np.testing.assert_allclose(q.grad.cpu().numpy(), p.grad.numpy(), **TOL)
    opt = fg.optim.SGD(gpu.parameters(), lr=0.1)
    opt.step()
    fg.optim.SGD(cpu.parameters(), lr=0.1).step()
    for p, q in zip(cpu.parameters(), gpu.parameters()):
        assert _on_cuda(q)
        np.testing.assert_allclose(q.detach().cpu().numpy(), p.detach().numpy(), **TOL)


def test_compile_on_cuda_inputs_runs_on_the_device(simulated):
    def f(x, w):
        return F.softmax(x @ w, -1).sum(0)
    x, w = fg.randn(6, 5), fg.randn(5, 7)
    compiled = fg.compile(f)                   # the default backend: cuda inputs switch it
    xc, wc = x.cuda(), w.cuda()
    compiled(xc, wc)
    uploads = []
    real_htod = simulated.htod
    simulated.htod = lambda ptr, host: (uploads.append(host.shape), real_htod(ptr, host))
    launches = len(simulated.launches)
    got = compiled(xc, wc)
    assert _on_cuda(got) and len(simulated.launches) > launches
    assert uploads == []                       # inputs already on the device stay there
    np.testing.assert_allclose(got.cpu().numpy(), f(x, w).numpy(), **TOL)
    assert compiled(x, w).device == fg.device("cpu")     # cpu inputs still run on the cpu


def test_autograd_through_a_compiled_function_on_cuda_inputs(simulated):
    x = fg.randn(4, 3)
    w = fg.randn(3, 5, requires_grad=True, device="cuda")
    loss = fg.compile(lambda x, w: (x @ w).tanh().square().mean())(x.cuda(), w)
    assert _on_cuda(loss)
    loss.backward()
    assert _on_cuda(w.grad)
    w_cpu = w.detach().cpu().requires_grad_()
    (x @ w_cpu).tanh().square().mean().backward()
    np.testing.assert_allclose(w.grad.cpu().numpy(), w_cpu.grad.numpy(), **TOL)


def test_cuda_namespace_with_a_driver(simulated):
    assert fg.cuda.is_available() and fg.cuda.device_count() == 1
    fg.cuda.manual_seed(1)
    fg.cuda.manual_seed_all(1)
    fg.cuda.synchronize()
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        fg.ones(2).to("cuda:1")


def test_without_a_driver_moving_to_cuda_says_what_to_install(monkeypatch):
    for name in ("cuda", "cuda.bindings", "pycuda", "pycuda.driver"):
        monkeypatch.setitem(sys.modules, name, None)
    rt.set_driver(None)
    try:
        with pytest.raises(RuntimeError, match="fusegrad\\[cuda\\]"):
            fg.ones(2).cuda()
        with pytest.raises(RuntimeError, match="fusegrad\\[cuda\\]"):
            fg.randn(2, device="cuda")
    finally:
        rt.set_driver(None)


@pytest.mark.slow
def test_cpu_eager_code_loads_no_cuda_module():
    no_modules_after("import fusegrad as fg\n"
                     "x = fg.randn(4, 3, requires_grad=True)\n"
                     "(x.exp() @ fg.ones(3, 2)).sum().backward()\n"
                     "print(x.to('cpu').cpu().device, fg.zeros(2, device='cpu'))\n"
                     "from fusegrad.ops import primitive\n"
                     "assert primitive._device_apply is None\n",
                     ("fusegrad.tracer.eager_cuda", "fusegrad.runtime.cuda", "cuda.bindings",
                      "pycuda"))


def test_indexing_a_cuda_tensor_with_masks_and_index_tensors_of_either_device(simulated):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = fg.tensor(a, device="cuda")
    for got, want in [(x[x > 3.5], a[a > 3.5]), (x[fg.tensor([2, 0])], a[[2, 0]]),
                      (x[fg.tensor([2, 0], device="cuda"), 1:], a[[2, 0], 1:]),
                      (x.nonzero(), np.argwhere(a))]:
        assert _on_cuda(got)
        np.testing.assert_array_equal(got.cpu().numpy(), want)


def test_index_assignment_writes_into_the_device_buffer(simulated):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = fg.tensor(a, device="cuda")
    alias = x.detach()                     # shares the buffer, as a detached cpu tensor would
    x[0] = 5.0
    x[1:, ::2] = fg.tensor([[-1., -2.], [-3., -4.]])
    want = a.copy()
    want[0] = 5.0
    want[1:, ::2] = [[-1., -2.], [-3., -4.]]
    np.testing.assert_array_equal(x.cpu().numpy(), want)
    np.testing.assert_array_equal(alias.cpu().numpy(), want)


def test_dropout_on_cuda_masks_on_the_device(simulated):
    x = fg.ones(200, device="cuda")
    y = fg.nn.functional.dropout(x, 0.5, training=True)
    assert _on_cuda(y)
    values = y.cpu().numpy()
    assert set(np.unique(values)) <= {0.0, 2.0} and 40 < (values == 0).sum() < 160


def test_compiled_training_step_of_a_cuda_model_matches_the_cpu(simulated):
    def run(dev):
        fg.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(4, 8), fg.nn.GELU(), fg.nn.Linear(8, 3)).to(dev)
        opt = fg.optim.Adam(model.parameters(), lr=0.1)

        @fg.compile
        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        x, y = fg.randn(5, 4).to(dev), fg.tensor(np.array([0, 1, 2, 1, 0])).to(dev)
        losses = [step(x, y).item() for _ in range(3)]
        assert all(str(p.device).startswith(dev) for p in model.parameters())
        return losses, [p.detach().cpu().numpy() for p in model.parameters()]
    cpu_losses, cpu_params = run("cpu")
    gpu_losses, gpu_params = run("cuda")
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-5)
    for a, b in zip(gpu_params, cpu_params):
        np.testing.assert_allclose(a, b, **TOL)


def test_saving_a_cuda_state_dict_writes_its_values(simulated, tmp_path):
    model = fg.nn.Linear(3, 2).cuda()
    fg.save(model.state_dict(), tmp_path / "m.pt")
    loaded = fg.load(tmp_path / "m.pt")
    assert _on_cuda(loaded["weight"])
    np.testing.assert_array_equal(loaded["weight"].cpu().numpy(),
                                  model.weight.detach().cpu().numpy())


def test_complex_ops_on_cuda_run_as_host_steps(simulated):
    # No GPU lowering has complex types: each op is a host step, with the CPU's values.
    zs = np.array([1 + 2j, 3j, -0.5 + 0.25j], np.complex64)
    z = fg.tensor(zs, device="cuda")
    before = eager_cuda.STATS["host_fallbacks"]
    w = (z * z).exp().abs()
    assert eager_cuda.STATS["host_fallbacks"] - before == 3
    assert _on_cuda(w) and w.dtype is fg.float32
    np.testing.assert_allclose(w.cpu().numpy(), np.abs(np.exp(zs * zs)), **TOL)
    spectrum = fg.fft.rfft(fg.tensor([1.0, 2.0, 3.0, 4.0], device="cuda"))
    assert _on_cuda(spectrum)
    np.testing.assert_allclose(spectrum.cpu().numpy(), [10, -2 + 2j, -2], **TOL)
    assert _on_cuda(fg.fft.fftfreq(4, device="cuda")) and _on_cuda(fg.fft.rfftfreq(4, device="cuda"))
