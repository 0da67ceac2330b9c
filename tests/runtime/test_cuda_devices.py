"""Several cuda devices (the simulated driver pretending to have two), ``fusegrad.cuda``'s
queries, and the machine without a driver."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.runtime import cuda as rt
from fusegrad.runtime import cuda_drivers
from fusegrad.testing.simulated_cuda import SimulatedDriver
from tests.runtime.conftest import no_modules_after


def _device_of_memory(drv, t) -> int:
    start = max(p for p in drv.starts if p <= t._data.ptr)
    return drv.owner[start]


def test_tensors_remember_their_device_and_move_between_devices(two_devices):
    assert fg.cuda.device_count() == 2 and fg.cuda.current_device() == 0
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x0 = fg.tensor(a, device="cuda")
    x1 = fg.tensor(a, device="cuda:1")
    assert x0.device == fg.device("cuda", 0) and x1.device == fg.device("cuda", 1)
    assert str(x1.device) == "cuda:1" and "device='cuda:1'" in repr(x1)
    assert _device_of_memory(two_devices, x1) == 1 and _device_of_memory(two_devices, x0) == 0
    moved = x0.to("cuda:1")
    assert moved.device == fg.device("cuda:1") and x0.to("cuda:0") is x0
    assert x0.cuda(1).device == fg.device("cuda:1") and x1.cuda() is not x1
    assert x0.to(1).device == fg.device("cuda:1") and x1.to(device=0).device == x0.device
    np.testing.assert_array_equal(moved.cpu().numpy(), a)
    y = (moved * 2 + x1).sum(0)                # runs on device 1, its memory there
    assert y.device == fg.device("cuda:1") and _device_of_memory(two_devices, y) == 1
    np.testing.assert_array_equal(y.cpu().numpy(), (3 * a).sum(0))
    assert fg.zeros_like(x1).device == fg.device("cuda:1")
    assert x1.new_ones(2).device == fg.device("cuda:1")
    assert x1.t()[1].device == fg.device("cuda:1")            # views stay there


def test_set_device_changes_what_cuda_means(two_devices):
    fg.cuda.set_device(1)
    assert fg.cuda.current_device() == 1
    x = fg.ones(3, device="cuda")
    assert x.device == fg.device("cuda:1") and fg.randn(2).cuda().device == fg.device("cuda:1")
    assert x.to("cuda") is x
    fg.cuda.set_device("cuda:0")
    assert fg.ones(3).cuda().device == fg.device("cuda:0")
    assert x.to("cuda").device == fg.device("cuda:0")      # "cuda" is the current device
    with fg.cuda.device(1):
        assert fg.cuda.current_device() == 1 and fg.zeros(1, device="cuda").get_device() == 1
    assert fg.cuda.current_device() == 0 and fg.zeros(1).get_device() == -1


def test_ops_across_devices_raise_torchs_error(two_devices):
    x0, x1 = fg.ones(3, device="cuda:0"), fg.ones(3, device="cuda:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but "
                       "found at least two devices, cuda:0 and cuda:1!"):
        x0 + x1
    with pytest.raises(RuntimeError, match="cuda:1 and cuda:0!"):
        x1 * x0
    with pytest.raises(RuntimeError, match="cuda:1 and cpu!"):
        x1 - fg.ones(3)
    with pytest.raises(RuntimeError, match="same device"):
        fg.compile(lambda a, b: a + b)(x0, x1)
    x0.copy_(x1 * 5)                            # copy_ crosses devices, as torch's does
    np.testing.assert_array_equal(x0.cpu().numpy(), [5, 5, 5])


def test_out_of_range_devices_raise_a_clear_error(two_devices):
    for bad in (lambda: fg.ones(2, device="cuda:2"), lambda: fg.ones(2).to("cuda:5"),
                lambda: fg.cuda.set_device(2), lambda: fg.ones(2).cuda(3),
                lambda: fg.cuda.get_device_name(2)):
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            bad()
    assert fg.cuda.current_device() == 0


def test_training_on_device_1_matches_the_cpu(two_devices):
    def run(dev):
        fg.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(4, 6), fg.nn.Tanh(), fg.nn.Linear(6, 3)).to(dev)
        opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x, y = fg.randn(5, 4).to(dev), fg.tensor(np.array([0, 1, 2, 1, 0])).to(dev)
        for _ in range(2):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return model
    cpu, gpu = run("cpu"), run("cuda:1")
    assert fg.nn.Linear(2, 2).cuda(1).weight.device == fg.device("cuda:1")
    for p, q in zip(cpu.parameters(), gpu.parameters()):
        assert q.device == fg.device("cuda:1") and q.grad.device == fg.device("cuda:1")
        np.testing.assert_allclose(q.detach().cpu().numpy(), p.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_compiled_function_runs_on_the_device_of_its_inputs(two_devices):
    def f(a, b):
        return (a @ b).relu().sum(0)
    x, w = fg.randn(4, 3), fg.randn(3, 5)
    compiled = fg.compile(f)
    for dev in ("cuda:0", "cuda:1"):
        got = compiled(x.to(dev), w.to(dev))
        assert got.device == fg.device(dev) and _device_of_memory(two_devices, got) == \
            fg.device(dev).index
        np.testing.assert_allclose(got.cpu().numpy(), f(x, w).numpy(), rtol=1e-5, atol=1e-6)


def test_cuda_namespace_reports_memory_and_names(two_devices):
    assert fg.cuda.is_available() and fg.cuda.device_count() == 2
    assert fg.cuda.get_device_name() == "fusegrad simulated CUDA device 0"
    assert fg.cuda.get_device_name(1).endswith("device 1")
    before = fg.cuda.memory_allocated(1)
    x = fg.zeros(1000, device="cuda:1")
    assert fg.cuda.memory_allocated(1) - before >= 4000
    assert fg.cuda.memory_allocated(0) == 0 or fg.cuda.memory_allocated(0) < 4000
    peak = fg.cuda.max_memory_allocated("cuda:1")
    assert peak >= fg.cuda.memory_allocated(1)
    del x
    assert fg.cuda.memory_allocated(1) == before and fg.cuda.max_memory_allocated(1) == peak
    fg.cuda.reset_peak_memory_stats(1)
    assert fg.cuda.max_memory_allocated(1) == before
    reserved = fg.cuda.memory_reserved(1)
    assert reserved >= 4000
    frees = len(two_devices.memory)
    fg.cuda.empty_cache()
    assert fg.cuda.memory_reserved(1) < reserved and len(two_devices.memory) < frees
    fg.cuda.synchronize()
    fg.cuda.synchronize(1)
    fg.cuda.manual_seed(5)
    a = fg.randn(3, device="cuda:1")
    fg.cuda.manual_seed_all(5)
    np.testing.assert_array_equal(a.cpu().numpy(), fg.randn(3).numpy())


def test_without_a_driver_library_no_cuda_package_is_imported(monkeypatch):
    # The packages count as installed, the driver library as missing: nothing is imported.
    monkeypatch.setattr(cuda_drivers, "find_libcuda", lambda: None)
    monkeypatch.setattr(cuda_drivers, "_package_present", lambda name: True)

    def refuse(self, *args, **kwargs):
        raise AssertionError("a CUDA package was imported without a driver")
    monkeypatch.setattr(rt.CudaPythonDriver, "__init__", refuse)
    monkeypatch.setattr(rt.PyCudaDriver, "__init__", refuse)
    rt.set_driver(None)
    try:
        assert not fg.cuda.is_available() and fg.cuda.device_count() == 0
        assert fg.cuda.memory_allocated() == 0 and fg.cuda.current_device() == 0
        fg.cuda.synchronize()
        fg.cuda.empty_cache()
        with pytest.raises(RuntimeError, match="no NVIDIA driver"):
            rt.driver()
        with pytest.raises(RuntimeError, match="NVIDIA driver"):
            fg.ones(2, device="cuda")
    finally:
        rt.set_driver(None)


@pytest.mark.slow
def test_cuda_queries_import_no_cuda_package_on_this_machine():
    if rt.find_libcuda() is not None:
        pytest.skip("this machine has an NVIDIA driver")
    no_modules_after("import fusegrad as fg\n"
                     "assert not fg.cuda.is_available() and fg.cuda.device_count() == 0\n"
                     "assert fg.cuda.memory_allocated() == 0\n",
                     ("cuda", "cuda.bindings", "pycuda"))


def test_a_replaced_driver_gets_programs_of_its_own(two_devices):
    x = fg.ones(3, 4, device="cuda")
    (x + x).sum()
    x.t() * 2                                   # a strided-copy program too
    fg.cuda.set_device(1)
    other = SimulatedDriver(devices=1)          # the cache is not cleared on purpose
    rt.set_driver(other)
    assert fg.cuda.current_device() == 0        # a new driver starts on device 0
    y = fg.ones(3, 4, device="cuda")
    got = ((y + y).sum(), y.t() * 2)
    assert {name for name, _, _ in other.launches} and got[0].item() == 24.0
    np.testing.assert_array_equal(got[1].cpu().numpy(), np.full((4, 3), 2.0))
