"""``fusegrad.save`` / ``load`` of cuda tensors: the device is saved, loading puts tensors
back on it, and ``map_location`` (a string, a device, a dict, a callable) overrides it as in
torch; a device the machine lacks raises torch's error."""

from __future__ import annotations

import io

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.ops import primitive
from fusegrad.runtime import cuda as rt
from fusegrad.testing.simulated_cuda import SimulatedDriver
from fusegrad.tracer import eager_cuda


@pytest.fixture
def two_devices():
    rt.set_driver(SimulatedDriver(devices=2))
    eager_cuda.clear_cache()
    yield
    eager_cuda.clear_cache()
    primitive._device_apply = None
    rt.set_driver(None)


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    fg.save(obj, buf)
    return buf.getvalue()


def _checkpoint():
    """A state dict with tensors on the cpu, cuda:0 and cuda:1 (a parameter, a view)."""
    w = fg.nn.Parameter(fg.tensor([[1., 2.], [3., 4.]], device="cuda:0"))
    return {"w": w, "b": fg.tensor([5., 6.], device="cuda:1"), "step": fg.tensor(3),
            "col": w.detach()[:, 1], "cfg": {"lr": 0.1}}


def _values(loaded) -> dict:
    return {k: v.cpu().tolist() for k, v in loaded.items() if isinstance(v, fg.Tensor)}


WANT = {"w": [[1., 2.], [3., 4.]], "b": [5., 6.], "step": 3, "col": [2., 4.]}


def test_tensors_load_back_on_their_devices(two_devices):
    loaded = fg.load(io.BytesIO(_saved(_checkpoint())))
    assert _values(loaded) == WANT and loaded["cfg"] == {"lr": 0.1}
    devices = {k: str(v.device) for k, v in loaded.items() if isinstance(v, fg.Tensor)}
    assert devices == {"w": "cuda:0", "b": "cuda:1", "step": "cpu", "col": "cuda:0"}
    assert isinstance(loaded["w"], fg.nn.Parameter) and loaded["w"].requires_grad
    assert loaded["w"].is_leaf


@pytest.mark.parametrize("where", ["cpu", fg.device("cpu"), "cuda:1", fg.device("cuda", 0)])
def test_map_location_to_one_device_moves_every_tensor(two_devices, where):
    loaded = fg.load(io.BytesIO(_saved(_checkpoint())), map_location=where)
    assert _values(loaded) == WANT
    want = str(fg.device(where))
    assert {str(v.device) for v in loaded.values() if isinstance(v, fg.Tensor)} == {want}
    assert loaded["w"].is_leaf and loaded["w"].requires_grad


def test_map_location_dict_maps_only_the_locations_it_names(two_devices):
    loaded = fg.load(io.BytesIO(_saved(_checkpoint())), map_location={"cuda:0": "cpu"})
    assert _values(loaded) == WANT
    assert str(loaded["w"].device) == "cpu" and str(loaded["b"].device) == "cuda:1"
    loaded = fg.load(io.BytesIO(_saved(_checkpoint())),
                     map_location={"cuda:1": "cuda:0", "cpu": "cuda:1"})
    assert str(loaded["b"].device) == "cuda:0" and str(loaded["step"].device) == "cuda:1"
    assert str(loaded["w"].device) == "cuda:0"


def test_map_location_callable_gets_the_saved_location(two_devices):
    seen = []

    def where(t, location):
        seen.append((t.device.type, location))
        return t.to("cuda:1") if location == "cuda:0" else None    # None: the saved device
    loaded = fg.load(io.BytesIO(_saved(_checkpoint())), map_location=where)
    assert _values(loaded) == WANT
    assert sorted(seen) == [("cpu", "cpu"), ("cpu", "cuda:0"), ("cpu", "cuda:0"),
                            ("cpu", "cuda:1")]
    assert str(loaded["w"].device) == "cuda:1" and str(loaded["b"].device) == "cuda:1"
    assert str(loaded["step"].device) == "cpu"


def test_a_missing_device_raises_torchs_error_unless_mapped(two_devices):
    data = _saved(_checkpoint())
    rt.set_driver(SimulatedDriver(devices=1))
    with pytest.raises(RuntimeError, match="Attempting to deserialize object on CUDA device 1 "
                       "but fusegrad.cuda.device_count\\(\\) is 1"):
        fg.load(io.BytesIO(data))
    loaded = fg.load(io.BytesIO(data), map_location={"cuda:1": "cuda:0"})
    assert _values(loaded) == WANT and str(loaded["b"].device) == "cuda:0"


def test_without_cuda_a_cuda_checkpoint_needs_map_location(two_devices, monkeypatch):
    data = _saved(_checkpoint())
    monkeypatch.setattr(rt, "device_count", lambda: 0)
    with pytest.raises(RuntimeError) as info:
        fg.load(io.BytesIO(data))
    assert str(info.value).startswith(
        "Attempting to deserialize object on a CUDA device but fusegrad.cuda.is_available() is "
        "False. If you are running on a CPU-only machine, please use fusegrad.load with "
        "map_location=fusegrad.device('cpu')")
    for where in ("cpu", fg.device("cpu"), {"cuda:0": "cpu", "cuda:1": "cpu"},
                  lambda t, location: t):
        loaded = fg.load(io.BytesIO(data), map_location=where)
        assert _values(loaded) == WANT
        assert all(v.device.type == "cpu" for v in loaded.values() if isinstance(v, fg.Tensor))
    with pytest.raises(RuntimeError, match="Attempting to deserialize object on a CUDA"):
        fg.load(io.BytesIO(data), map_location={"cuda:0": "cpu"})    # cuda:1 is left


def test_a_model_and_optimizer_round_trip_on_cuda(two_devices, tmp_path):
    fg.manual_seed(0)
    model = fg.nn.Linear(3, 2).to("cuda:1")
    opt = fg.optim.Adam(model.parameters(), lr=0.1)
    model(fg.randn(4, 3, device="cuda:1")).sum().backward()
    opt.step()
    fg.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "ck.pt")
    ck = fg.load(tmp_path / "ck.pt")
    again = fg.nn.Linear(3, 2).to("cuda:1")
    again.load_state_dict(ck["model"])
    opt2 = fg.optim.Adam(again.parameters(), lr=0.1)
    opt2.load_state_dict(ck["opt"])
    for p, q in zip(model.parameters(), again.parameters()):
        assert q.device == fg.device("cuda:1")
        np.testing.assert_array_equal(q.detach().cpu().numpy(), p.detach().cpu().numpy())
    state = next(iter(opt2.state.values()))
    assert state["exp_avg"].device == fg.device("cuda:1")
