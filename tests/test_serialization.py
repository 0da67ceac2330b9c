"""fusegrad.save / fusegrad.load, load_state_dict from foreign arrays, and DLPack interchange."""

import hashlib
import io
import json
import math
from collections import OrderedDict

import ml_dtypes
import numpy as np
import pytest

import fusegrad as fg
from fusegrad.serialization import ALIGN, MAGIC, CheckpointError

ALL_DTYPES = [fg.float32, fg.float64, fg.float16, fg.bfloat16, fg.int64, fg.int32, fg.int16,
              fg.int8, fg.uint8, fg.bool]


def roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    fg.save(obj, buf)
    buf.seek(0)
    return fg.load(buf, **load_kwargs)


def sample(dtype, shape=(3, 4), seed=0):
    rng = np.random.default_rng(seed)
    if dtype is fg.bool:
        return fg.tensor(rng.random(shape) > 0.5)
    if dtype.is_floating_point:
        return fg.tensor(rng.standard_normal(shape) * 100, dtype=dtype)
    info = np.iinfo(dtype.np_dtype)
    return fg.tensor(rng.integers(info.min, info.max, shape, endpoint=True), dtype=dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
def test_tensor_round_trip_is_bit_exact(dtype):
    t = sample(dtype)
    out = roundtrip(t)
    assert out.dtype is dtype and out.shape == t.shape
    assert out.numpy().tobytes() == t.numpy().tobytes()


def test_special_values_and_layouts():
    x = fg.tensor([math.inf, -math.inf, math.nan, -0.0, 1e-45], dtype=fg.float32)
    out = roundtrip({"x": x, "nc": fg.arange(12.).reshape(3, 4).t(), "e": fg.zeros(0, 5),
                     "s": fg.tensor(2.5)})
    assert out["x"].numpy().tobytes() == x.numpy().tobytes()
    np.testing.assert_array_equal(out["nc"].numpy(), np.arange(12.).reshape(3, 4).T)
    assert out["e"].shape == (0, 5) and out["s"].ndim == 0 and out["s"].item() == 2.5


def test_nested_structure_and_python_values():
    obj = OrderedDict(a=[1, 2.5, None, "text", True, (3, -4.0)], b={0: "int key", 1.5: "float",
                                                                    (1, 2): "tuple", None: 0})
    obj["c"] = {"inf": math.inf, "nan": math.nan, "big": 2 ** 70, "size": fg.Size([2, 3]),
                "dtype": fg.bfloat16, "device": fg.device("cpu"), "np": np.float32(0.1)}
    out = roundtrip(obj)
    assert type(out) is OrderedDict and list(out) == ["a", "b", "c"]
    assert out["a"] == [1, 2.5, None, "text", True, (3, -4.0)]
    assert type(out["a"][5]) is tuple and type(out["a"][0]) is int
    assert out["b"] == {0: "int key", 1.5: "float", (1, 2): "tuple", None: 0}
    c = out["c"]
    assert c["inf"] == math.inf and math.isnan(c["nan"]) and c["big"] == 2 ** 70
    assert isinstance(c["size"], fg.Size) and c["size"] == (2, 3)
    assert c["dtype"] is fg.bfloat16 and c["device"] == fg.device("cpu")
    assert c["np"] == float(np.float32(0.1))   # numpy scalars load as Python numbers


def test_requires_grad_parameters_and_shared_tensors():
    p = fg.nn.Parameter(fg.randn(3))
    w = fg.randn(2, requires_grad=True)
    t = fg.ones(2)
    out = roundtrip({"p": p, "w": w, "same": [t, t]})
    assert isinstance(out["p"], fg.nn.Parameter) and out["p"].requires_grad
    assert out["w"].requires_grad and not isinstance(out["w"], fg.nn.Parameter)
    assert out["same"][0] is out["same"][1]   # one tensor saved twice loads as one


def test_unsupported_objects_are_refused():
    with pytest.raises(TypeError, match=r"can't store an object of type object \(at \['x'\]\[1\]\)"):
        fg.save({"x": [1, object()]}, io.BytesIO())
    with pytest.raises(TypeError, match="tensor as a dict key"):
        fg.save({fg.ones(1): 1}, io.BytesIO())


def _train(model, opt, steps, seed):
    gen = fg.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = fg.randn(8, 4, generator=gen)
        y = fg.randint(0, 3, (8,), generator=gen)
        loss = fg.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("opt_cls", [fg.optim.Adam, fg.optim.SGD])
def test_resume_from_checkpoint_matches_uninterrupted_run(opt_cls, tmp_path):
    def make():
        fg.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(4, 8), fg.nn.Tanh(), fg.nn.Linear(8, 3))
        kwargs = {"lr": 0.05, "weight_decay": 0.01}
        if opt_cls is fg.optim.SGD:
            kwargs["momentum"] = 0.9
        return model, opt_cls(model.parameters(), **kwargs)

    full_model, full_opt = make()
    full = _train(full_model, full_opt, 3, seed=1) + _train(full_model, full_opt, 3, seed=2)

    model, opt = make()
    first = _train(model, opt, 3, seed=1)
    path = tmp_path / "ckpt.fg"
    fg.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}, path)
    ckpt = fg.load(path, map_location="cpu", weights_only=True)
    assert type(ckpt["model"]) is OrderedDict
    assert ckpt["optimizer"]["param_groups"][0]["lr"] == 0.05
    assert list(ckpt["optimizer"]["state"]) == list(opt.state_dict()["state"])   # int keys
    model2, opt2 = make()
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["optimizer"])
    resumed = first + _train(model2, opt2, 3, seed=2)
    assert resumed == full
    for a, b in zip(full_model.parameters(), model2.parameters()):
        assert a.detach().numpy().tobytes() == b.detach().numpy().tobytes()


def test_map_location_forms():
    obj = {"w": fg.ones(2)}
    for loc in (None, "cpu", fg.device("cpu"), {"cpu": "cpu"}):
        assert roundtrip(obj, map_location=loc)["w"].tolist() == [1.0, 1.0]
    seen = []
    out = roundtrip(obj, map_location=lambda t, where: seen.append(where) or t * 2)
    assert seen == ["cpu"] and out["w"].tolist() == [2.0, 2.0]
    if not fg.cuda.is_available():
        with pytest.raises(RuntimeError, match="NVIDIA driver"):
            roundtrip(obj, map_location="cuda")


def test_file_layout_matches_its_description():
    t = fg.tensor([1.0, 2.0, 3.0])
    u = fg.tensor([[7, 8]], dtype=fg.int16)
    buf = io.BytesIO()
    fg.save({"t": t, "u": u}, buf)
    data = buf.getvalue()
    assert data[:8] == MAGIC
    n = int.from_bytes(data[8:16], "little")
    header = json.loads(data[16:16 + n])
    assert header["format"] == "fusegrad.checkpoint" and header["version"] == 1
    start = 16 + n + (-(16 + n) % ALIGN)
    assert set(data[16 + n:start]) <= {0}
    entries = header["tensors"]
    assert [e["dtype"] for e in entries] == ["float32", "int16"]
    assert [e["offset"] % ALIGN for e in entries] == [0, 0]
    e0, e1 = entries
    assert data[start + e0["offset"]:start + e0["offset"] + 12] == np.float32([1, 2, 3]).tobytes()
    assert data[start + e1["offset"]:start + e1["offset"] + 4] == b"\x07\x00\x08\x00"
    end = start + header["data_nbytes"]
    assert len(data) == end + 32
    assert data[end:] == hashlib.sha256(data[:end]).digest()


def _checkpoint_bytes():
    model = fg.nn.Linear(5, 3)
    return fg.serialization.dumps({"model": model.state_dict(), "step": 7})


def test_every_flipped_byte_is_detected():
    data = _checkpoint_bytes()
    fg.load(io.BytesIO(data))   # intact
    n = int.from_bytes(data[8:16], "little")
    # magic, length, header, padding, tensor data, digest
    for pos in [0, 5, 9, 20, 16 + n // 2, 16 + n + 1, len(data) - 40, len(data) - 33, len(data) - 1]:
        bad = bytearray(data)
        bad[pos] ^= 0x40
        with pytest.raises(CheckpointError, match="corrupted|truncated|not a fusegrad"):
            fg.load(io.BytesIO(bytes(bad)))


def test_flipped_data_byte_says_checksum():
    data = bytearray(_checkpoint_bytes())
    data[-40] ^= 1   # inside the last tensor's bytes
    with pytest.raises(CheckpointError, match="corrupted: its SHA-256 checksum does not match"):
        fg.load(io.BytesIO(bytes(data)))


@pytest.mark.parametrize("keep", [0, 5, 12, 16, 40, -33, -32, -1])
def test_truncated_checkpoint_is_refused(keep):
    data = _checkpoint_bytes()
    cut = data[:keep] if keep >= 0 else data[:len(data) + keep]
    with pytest.raises(CheckpointError, match="truncated"):
        fg.load(io.BytesIO(cut))


def test_trailing_bytes_and_foreign_files_are_refused(tmp_path):
    data = _checkpoint_bytes()
    with pytest.raises(CheckpointError, match="trailing data"):
        fg.load(io.BytesIO(data + b"\0"))
    with pytest.raises(CheckpointError, match="PyTorch .pickle-based. checkpoint"):
        fg.load(io.BytesIO(b"PK\x03\x04" + b"\0" * 100))
    with pytest.raises(CheckpointError, match="not a fusegrad checkpoint"):
        fg.load(io.BytesIO(b"hello world, this is text"))
    path = tmp_path / "w.safetensors"
    fg.safetensors.save_file({"a": fg.ones(2)}, path)
    with pytest.raises(CheckpointError, match="safetensors file"):
        fg.load(path)


# --------------------------------------------------------------------------- load_state_dict


def test_load_state_dict_accepts_numpy_arrays():
    src = fg.nn.Linear(3, 2)
    arrays = {k: v.numpy().copy() for k, v in src.state_dict().items()}
    dst = fg.nn.Linear(3, 2)
    dst.load_state_dict(arrays)
    np.testing.assert_array_equal(dst.weight.detach().numpy(), arrays["weight"])
    arrays["weight"][0, 0] = 99.0   # copied, not aliased
    assert dst.weight[0, 0].item() != 99.0
    half = fg.nn.Linear(3, 2).bfloat16()
    half.load_state_dict({k: v.astype(ml_dtypes.bfloat16) for k, v in arrays.items()})
    assert half.weight.dtype is fg.bfloat16


class _DLPackOnly:
    """A foreign array that offers only the DLPack protocol (as a torch tensor does)."""

    def __init__(self, array):
        self._a = array

    def __dlpack__(self, stream=None, **kw):
        return self._a.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_load_state_dict_accepts_dlpack_objects_and_keeps_torch_messages():
    src = fg.nn.Linear(3, 2)
    dst = fg.nn.Linear(3, 2)
    dst.load_state_dict({k: _DLPackOnly(v) for k, v in src.state_dict().items()})
    np.testing.assert_array_equal(dst.bias.detach().numpy(), src.bias.detach().numpy())
    with pytest.raises(RuntimeError, match=r"size mismatch for weight: copying a param with shape "
                       r"fusegrad.Size\(\[2, 4\]\) from checkpoint, the shape in current model is "
                       r"fusegrad.Size\(\[2, 3\]\)"):
        dst.load_state_dict({"weight": np.zeros((2, 4), np.float32), "bias": np.zeros(2)})
    with pytest.raises(RuntimeError, match="expected torch.Tensor or Tensor-like object from "
                       "checkpoint but received <class 'str'>"):
        dst.load_state_dict({"weight": "nope", "bias": np.zeros(2)})


# --------------------------------------------------------------------------- DLPack


@pytest.mark.parametrize("dtype", [fg.float16, fg.float32, fg.int64, fg.uint8])
def test_dlpack_standard_dtypes_with_numpy(dtype):
    t = sample(dtype)
    a = np.from_dlpack(t)
    assert a.dtype == dtype.np_dtype and np.shares_memory(a, t.numpy())
    back = fg.from_dlpack(_DLPackOnly(a))
    assert back.dtype is dtype and np.shares_memory(back.numpy(), a)


def test_bfloat16_dlpack_round_trip_is_zero_copy():
    from fusegrad import dlpack
    base = fg.arange(12.).reshape(3, 4).to(fg.bfloat16)
    for t in (base, base.t(), base[:, 1:3]):
        out = fg.from_dlpack(_DLPackOnly(t))
        assert out.dtype is fg.bfloat16 and out.shape == t.shape
        assert np.array_equal(out.float().numpy(), t.float().numpy())
        assert np.shares_memory(out.numpy(), base.numpy())
    out = fg.from_dlpack(_DLPackOnly(base))
    base[0, 0] = 42.0
    assert out[0, 0].item() == 42.0
    del out
    import gc
    gc.collect()
    assert not dlpack._exported   # the consumer called the deleter
    capsule = base.__dlpack__()
    del capsule   # never consumed: its destructor frees the export
    assert not dlpack._exported
    assert fg.from_dlpack(_DLPackOnly(fg.zeros(0, 3, dtype=fg.bfloat16))).shape == (0, 3)


def test_dlpack_refuses_tensors_that_require_grad():
    with pytest.raises(RuntimeError, match="Can't export tensors that require gradient"):
        fg.ones(2, requires_grad=True).__dlpack__()


def test_bfloat16_and_float16_dlpack_with_torch():
    torch = pytest.importorskip("torch")
    x = fg.randn(3, 4).to(fg.bfloat16)
    t = torch.from_dlpack(x)
    assert t.dtype == torch.bfloat16
    assert np.array_equal(t.float().numpy(), x.float().numpy())
    t[0, 0] = 5
    assert x[0, 0].item() == 5.0
    for tdt, fdt in ((torch.bfloat16, fg.bfloat16), (torch.float16, fg.float16)):
        src = torch.randn(2, 5, dtype=tdt).t()
        y = fg.from_dlpack(src)
        assert y.dtype is fdt
        assert np.array_equal(y.float().numpy(), src.float().numpy())
    h = torch.from_dlpack(fg.ones(3).half())
    assert h.dtype == torch.float16


def test_load_state_dict_from_torch_module():
    torch = pytest.importorskip("torch")
    for tdt, fdt in ((torch.float32, fg.float32), (torch.bfloat16, fg.bfloat16)):
        tm = torch.nn.Linear(3, 2).to(tdt)
        fm = fg.nn.Linear(3, 2).to(fdt)
        fm.load_state_dict(tm.state_dict())
        np.testing.assert_array_equal(fm.weight.detach().float().numpy(),
                                      tm.weight.detach().float().numpy())
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        fg.nn.Linear(4, 2).load_state_dict(torch.nn.Linear(3, 2).state_dict())


def test_counters_survive_and_a_multistep_scheduler_resumes(tmp_path):
    # MultiStepLR's milestones are a Counter: saved as a plain dict, its step(epoch) form
    # failed after loading ('dict' object has no attribute 'elements').
    from collections import Counter
    opt = fg.optim.SGD([fg.nn.Parameter(fg.zeros(2))], lr=1.0)
    sched = fg.optim.lr_scheduler.MultiStepLR(opt, [3, 6], gamma=0.5)
    for _ in range(4):
        opt.step()
        sched.step()
    fg.save(sched.state_dict(), tmp_path / "s.pt")
    state = fg.load(tmp_path / "s.pt")
    assert isinstance(state["milestones"], Counter)
    sched.load_state_dict(state)
    sched.step(7)
    assert sched.get_last_lr() == [0.25]
