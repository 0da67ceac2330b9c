"""fusegrad.safetensors against the format's specification (parsed by hand here)."""

import json

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.safetensors import SafetensorError

CODES = {fg.float64: "F64", fg.float32: "F32", fg.float16: "F16", fg.bfloat16: "BF16",
         fg.int64: "I64", fg.int32: "I32", fg.int16: "I16", fg.int8: "I8", fg.uint8: "U8",
         fg.bool: "BOOL"}


def sample(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if dtype is fg.bool:
        return fg.tensor(rng.random(shape) > 0.5)
    if dtype.is_floating_point:
        return fg.tensor(rng.standard_normal(shape), dtype=dtype)
    return fg.tensor(rng.integers(-100, 100, shape) % (256 if dtype is fg.uint8 else 1000),
                     dtype=dtype)


def parse(data: bytes):
    """Split a file by the specification: u64 LE length, JSON header, byte buffer."""
    n = int.from_bytes(data[:8], "little")
    raw = data[8:8 + n]
    return n, raw, json.loads(raw), data[8 + n:]


def test_written_file_follows_the_specification(tmp_path):
    tensors = {name: sample(dt, (2, 3), i) for i, (dt, name) in enumerate(
        [(fg.float32, "w"), (fg.float64, "z"), (fg.int64, "idx"), (fg.bfloat16, "bf"),
         (fg.float16, "h"), (fg.bool, "mask"), (fg.uint8, "u"), (fg.int8, "i8"),
         (fg.int16, "i16"), (fg.int32, "i32"), (fg.float32, "a")])}
    path = tmp_path / "t.safetensors"
    fg.safetensors.save_file(tensors, path, metadata={"format": "pt"})
    data = path.read_bytes()
    n, raw, header, buf = parse(data)
    assert n % 8 == 0 and raw.startswith(b'{"__metadata__":{"format":"pt"},')
    assert raw == raw.rstrip(b" ") + b" " * (len(raw) - len(raw.rstrip(b" ")))
    assert header.pop("__metadata__") == {"format": "pt"}
    # Layout order of the reference writer: dtype (its enum order, largest first), then name.
    order = [name for name in json.loads(raw.decode())][1:]
    assert order == ["idx", "z", "a", "w", "i32", "bf", "h", "i16", "i8", "u", "mask"]
    begin = 0
    for name in order:
        info = header[name]
        t = tensors[name]
        assert list(info) == ["dtype", "shape", "data_offsets"]
        assert info["dtype"] == CODES[t.dtype] and info["shape"] == [2, 3]
        start, end = info["data_offsets"]
        assert start == begin and end - start == t.numel() * t.dtype.itemsize
        le = t.numpy().astype(t.dtype.np_dtype.newbyteorder("<")) if t.dtype is not fg.bfloat16 \
            else t.numpy().view("<u2")
        assert buf[start:end] == le.tobytes()
        begin = end
    assert begin == len(buf)


@pytest.mark.parametrize("dtype", list(CODES), ids=lambda d: d.name)
def test_round_trip_is_bit_exact(dtype):
    t = sample(dtype, (3, 5))
    out = fg.safetensors.load(fg.safetensors.save({"t": t, "empty": fg.zeros(0, 2)}))
    assert out["t"].dtype is dtype and out["t"].numpy().tobytes() == t.numpy().tobytes()
    assert out["empty"].shape == (0, 2)


def test_non_contiguous_and_scalar_tensors(tmp_path):
    x = fg.arange(6.).reshape(2, 3).t()
    fg.safetensors.save_file({"x": x, "s": fg.tensor(3.5)}, tmp_path / "a.safetensors")
    out = fg.safetensors.load_file(tmp_path / "a.safetensors")
    np.testing.assert_array_equal(out["x"].numpy(), x.numpy())
    assert out["s"].shape == () and out["s"].item() == 3.5
    assert fg.safetensors.load_metadata(tmp_path / "a.safetensors") is None


def build(header: dict, buffer: bytes, pad: bool = True) -> bytes:
    raw = json.dumps(header).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + buffer


@pytest.mark.parametrize("header,buffer,message", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12), "overlaps"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, bytes(12), "leaves a hole"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8),
     "F32 with shape \\[3\\] needs 12 bytes"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8), "truncated"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, bytes(8), "after its last"),
    ({"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}}, bytes(4), "unknown dtype"),
    ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, bytes(4), "invalid shape"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, bytes(4), "invalid data_off"),
    ({"a": {"dtype": "F32", "shape": [1]}}, bytes(4), "expected dtype, shape and data_offsets"),
    ({"__metadata__": {"k": 1}}, b"", "__metadata__ must map str to str"),
    ({"a": {"dtype": "U16", "shape": [1], "data_offsets": [0, 2]}}, bytes(2),
     "fusegrad does not support"),
])
def test_invalid_headers_are_refused(header, buffer, message):
    with pytest.raises(SafetensorError, match=message):
        fg.safetensors.load(build(header, buffer))


def test_malformed_files_are_refused():
    with pytest.raises(SafetensorError, match="truncated"):
        fg.safetensors.load(b"\x10\x00")
    with pytest.raises(SafetensorError, match="header needs"):
        fg.safetensors.load((100).to_bytes(8, "little") + b"{}")
    with pytest.raises(SafetensorError, match="too large"):
        fg.safetensors.load((10 ** 12).to_bytes(8, "little") + b"{}")
    with pytest.raises(SafetensorError, match="does not start with"):
        fg.safetensors.load((2).to_bytes(8, "little") + b"[]")
    with pytest.raises(SafetensorError, match="not UTF-8 JSON"):
        fg.safetensors.load((2).to_bytes(8, "little") + b"{x")


def test_save_refuses_bad_arguments():
    with pytest.raises(TypeError, match="expected a fusegrad Tensor"):
        fg.safetensors.save({"a": np.zeros(2)})
    with pytest.raises(TypeError, match="map str to str"):
        fg.safetensors.save({"a": fg.ones(1)}, metadata={"k": 1})
    with pytest.raises(SafetensorError, match="reserved"):
        fg.safetensors.save({"__metadata__": fg.ones(1)})


def test_interop_with_the_reference_implementation(tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    fg_tensors = {f"t{i}": sample(dt, (2, 3), i) for i, dt in enumerate(CODES)}
    torch_tensors = {}
    for name, t in fg_tensors.items():
        if t.dtype is fg.bfloat16:
            torch_tensors[name] = torch.from_numpy(t.numpy().view(np.int16).copy()).view(
                torch.bfloat16)
        else:
            torch_tensors[name] = torch.from_numpy(t.numpy().copy())
    ours = fg.safetensors.save(fg_tensors, metadata={"format": "pt"})
    assert ours == st.save(torch_tensors, metadata={"format": "pt"})   # byte for byte
    back = st.load(ours)
    assert all(torch.equal(back[k], torch_tensors[k]) for k in torch_tensors)
    # A model trained in torch loads into fusegrad and back.
    tm = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    st.save_file(tm.state_dict(), tmp_path / "m.safetensors")
    fm = fg.nn.Sequential(fg.nn.Linear(4, 3), fg.nn.Tanh(), fg.nn.Linear(3, 2))
    fm.load_state_dict(fg.safetensors.load_file(tmp_path / "m.safetensors"))
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(fm(fg.tensor(x)).detach().numpy(),
                               tm(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    fg.safetensors.save_file(fm.state_dict(), tmp_path / "f.safetensors")
    tm2 = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    tm2.load_state_dict(st.load_file(tmp_path / "f.safetensors"))
    assert all(torch.equal(a, b) for a, b in zip(tm.parameters(), tm2.parameters()))
