"""Loading refuses what it cannot run, with ArtifactError and a message that says why."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.aot import artifact, format, plan_checks
from fusegrad.aot.format import ArtifactError
from tests.aot.helpers import mlp_step, with_plan


@pytest.fixture(scope="module")
def blob() -> bytes:
    step, model, opt, x, y = mlp_step("adamw")
    return fg.aot.compile(step, x, y).to_bytes()


def regions(blob: bytes) -> dict[str, tuple[int, int]]:
    """[start, end) of each part of the file."""
    _, _, head_len, total = struct.unpack_from("<8sIIQ", blob)
    header = json.loads(blob[24:24 + head_len])
    out = {"prefix": (0, 24), "header": (24, 24 + head_len)}
    base = 24 + head_len
    for s in header["sections"]:
        out[s["name"]] = (base + s["offset"], base + s["offset"] + s["length"])
    out["checksum"] = (total - 32, total)
    return out


def test_every_region_is_present(blob):
    r = regions(blob)
    assert all(end > start for start, end in r.values()), r
    assert fg.aot.loads(blob) is not None


@pytest.mark.parametrize("region", ["prefix", "header", "graph", "plan", "code", "state",
                                    "checksum"])
def test_flipped_byte_in_each_region(blob, region):
    start, end = regions(blob)[region]
    for pos in sorted({start, (start + end) // 2, end - 1}):
        for mask in (0x01, 0x80):
            bad = bytearray(blob)
            bad[pos] ^= mask
            with pytest.raises(ArtifactError) as e:
                fg.aot.loads(bytes(bad))
            assert e.value.reason in {"corrupt", "format", "truncated"}, (region, pos)
            assert str(e.value)


def test_flipped_byte_in_payload_names_the_checksum(blob):
    start, end = regions(blob)["code"]
    bad = bytearray(blob)
    bad[(start + end) // 2] ^= 0x10
    with pytest.raises(ArtifactError, match="checksum") as e:
        fg.aot.loads(bytes(bad))
    assert e.value.reason == "corrupt"


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.01, 0.3, 0.5, 0.9, 0.999])
def test_truncated(blob, fraction):
    cut = int(len(blob) * fraction)
    with pytest.raises(ArtifactError) as e:
        fg.aot.loads(blob[:cut])
    assert e.value.reason == "truncated"
    assert "truncated" in str(e.value)


def test_truncated_by_one_byte_and_extended(blob):
    with pytest.raises(ArtifactError, match="truncated"):
        fg.aot.loads(blob[:-1])
    with pytest.raises(ArtifactError, match="after its end"):
        fg.aot.loads(blob + b"\0")


def test_not_an_artifact(tmp_path):
    path = tmp_path / "x.fgaot"
    path.write_bytes(b"PK\x03\x04 a zip file, not an artifact" * 4)
    with pytest.raises(ArtifactError, match="not a fusegrad AOT artifact") as e:
        fg.aot.load(path)
    assert e.value.reason == "format"


def _reseal(body: bytes) -> bytes:
    return body + hashlib.sha256(body).digest()


def test_other_format_version(blob):
    body = bytearray(blob[:-32])
    struct.pack_into("<I", body, 8, format.FORMAT_VERSION + 1)
    with pytest.raises(ArtifactError, match="format version 2") as e:
        fg.aot.loads(_reseal(bytes(body)))
    assert e.value.reason == "format"


def _with_header(blob: bytes, **changes) -> bytes:
    decoded = format.decode(blob)
    header = {k: v for k, v in decoded.header.items() if k not in ("sections", "format")}
    header.update(changes)
    return format.encode(header, decoded.sections)


def test_other_fusegrad_version(blob):
    with pytest.raises(ArtifactError, match="fusegrad 0.0.1") as e:
        fg.aot.loads(_with_header(blob, fusegrad="0.0.1"))
    assert e.value.reason == "version"


def test_other_code_generator_of_the_same_version(blob):
    # Its kernels' loops need not match this build's launch extents.
    with pytest.raises(ArtifactError, match="code generator differs") as e:
        fg.aot.loads(_with_header(blob, codegen="0" * 16))
    assert e.value.reason == "version"


def test_features_this_machine_lacks(blob, monkeypatch):
    header = format.decode(blob).header
    # A machine with AVX2 but no AVX-512, as LLVM would report it.
    avx2_machine = tuple(f for f in artifact.X86_64_LEVELS["x86-64-v3"])
    monkeypatch.setattr(plan_checks, "_host_features", lambda: avx2_machine)
    resealed = _with_header(blob, features=sorted(set(header["features"]) | {"avx512f"}))
    with pytest.raises(ArtifactError, match="avx512f") as e:
        fg.aot.loads(resealed)
    assert e.value.reason == "target"
    assert "x86-64-v3" in str(e.value)          # the message says what to do


def test_other_architecture(blob):
    with pytest.raises(ArtifactError, match="aarch64") as e:
        fg.aot.loads(_with_header(blob, triple="aarch64-unknown-linux-gnu"))
    assert e.value.reason == "target"


def test_plan_that_does_not_fit_its_graph(blob):
    decoded = format.decode(blob)
    plan = json.loads(decoded.sections["plan"])
    plan["programs"][-1]["program"]["n_slots"] += 1
    sections = dict(decoded.sections, plan=json.dumps(plan).encode())
    header = {k: v for k, v in decoded.header.items() if k not in ("sections", "format")}
    with pytest.raises(ArtifactError) as e:
        fg.aot.loads(format.encode(header, sections))
    assert e.value.reason == "plan"


def test_wrong_inputs(blob):
    run = fg.aot.loads(blob)
    x = fg.tensor(np.zeros((8, 12), np.float32))
    y = fg.tensor(np.zeros(8, np.int64))
    with pytest.raises(ArtifactError, match=r"argument 0 \(x\) must be f32\[8,12\], got f32\[4,12\]"):
        run(fg.tensor(np.zeros((4, 12), np.float32)), y)
    with pytest.raises(ArtifactError, match=r"must be f32\[8,12\], got f64\[8,12\]") as e:
        run(fg.tensor(np.zeros((8, 12))), y)
    assert e.value.reason == "signature"
    with pytest.raises(ArtifactError, match="argument 1"):
        run(x, fg.tensor(np.zeros(8, np.int32)))
    with pytest.raises(ArtifactError, match="takes 2 tensor arguments"):
        run(x)
    state_before = {k: v.copy() for k, v in run.state.items()}
    assert np.isfinite(run(x, y).item())
    # A refused call changed nothing; the good call changed the parameters.
    assert not np.array_equal(state_before["model.0.weight"], run.state["model.0.weight"])


def test_wrong_state_at_load(blob):
    with pytest.raises(ArtifactError, match="no state named"):
        fg.aot.loads(blob, state={"nope": np.zeros(3)})
    with pytest.raises(ArtifactError, match="model.0.weight must be"):
        fg.aot.loads(blob, state={"model.0.weight": np.zeros((3, 3), np.float32)})


# --------------------------------------------------------------------------- tampered plans


def _refused(blob: bytes, field: str) -> ArtifactError:
    with pytest.raises(ArtifactError) as e:
        fg.aot.loads(blob)
    assert e.value.reason == "plan", e.value
    assert field in str(e.value), e.value
    return e.value


def test_argument_smaller_than_its_graph_says():
    """(regression test: the artifact loaded, and its call read 64 MiB past a 4-byte
    argument: a segfault or garbage)"""
    blob = fg.aot.compile(lambda x: x * 2, fg.zeros(16777216)).to_bytes()

    def shrink(plan):
        plan["args"][0].update(shape=[1], type="f32[1]")
    e = _refused(with_plan(blob, shrink), "args[0]")
    assert "says f32[1] but the graph's input %x is f32[16777216]" in str(e)


def _state_index(plan, name):
    return next(i for i, s in enumerate(plan["state"]) if s["name"] == name)


def _set_path(plan, path, value):
    node = plan
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _drop_state(plan, name):
    plan["state"].pop(_state_index(plan, name))
    plan["state_data"] = [e for e in plan["state_data"] if e["name"] != name]


TAMPERS = {
    "state lacks the call counter": lambda p: _drop_state(p, "aot.calls"),
    # field (as the error names it): a change to the plan
    "args[0]": lambda p: p["args"][0].update(dtype="float64", type="f64[8,12]"),
    "args[1]": lambda p: p["args"][1].update(arg=0),
    "outputs[0]": lambda p: _set_path(p, ["outputs", 0], "f32[8]"),
    "state model.0.weight": lambda p: p["state"][_state_index(p, "model.0.weight")].update(
        shape=[12, 16], type="f32[12,16]"),
    "state[0]": lambda p: p["state"][0].update(shape=[16, 13]),
    "programs[1].inputs[2]": lambda p: _set_path(p, ["programs", 1, "inputs", 2],
                                                 {"state": "nope"}),
    "programs[1].inputs[0]": lambda p: p["programs"][1]["inputs"][0].update(arg=7),
    "programs[1].writes[0]": lambda p: p["programs"][1]["writes"][0].update(output=0),
    "programs[0].writes[1]": lambda p: p["programs"][0]["writes"][1].update(output=999),
    "programs[1].kernels[0]": lambda p: p["programs"][1]["kernels"][0].update(symbol="fg_x"),
    "programs[1].kernels[0].slots": lambda p: p["programs"][1]["kernels"][0].update(
        slots=[-1]),
    "slots": lambda p: p["programs"][1]["kernels"][2]["slots"].reverse(),
    "kernels [": lambda p: p["programs"][1]["kernels"].pop(),
    "code[": lambda p: p["code"][sorted(p["code"])[0]].__setitem__(1, 10 ** 9),
    "state_data[0]": lambda p: p["state_data"][0].update(offset=-4),
    "programs[0].sets": lambda p: p["programs"][0]["sets"][sorted(p["programs"][0]["sets"])[0]]
    .update(dtype="float64"),
    "n_user_outputs": lambda p: p.update(n_user_outputs=2),
    "in_tree": lambda p: p.update(in_tree={"tuple": [{"tuple": ["leaf"]}, {"dict": []}]}),
    "out_tree": lambda p: p.update(out_tree={"list": ["leaf", "leaf"]}),
    "programs[1].rng_counters": lambda p: p["programs"][1].update(rng_counters="1"),
    "programs[1].donations": lambda p: p["programs"][1]["donations"].append([0, 10 ** 6]),
    "programs[0].role": lambda p: p["programs"][0].update(role="steady"),
}


@pytest.mark.parametrize("field", sorted(TAMPERS))
def test_tampered_plan_names_the_field(blob, field):
    _refused(with_plan(blob, TAMPERS[field]), field)


@pytest.mark.parametrize("depth, message", [(50, "in_tree holds 1 tensors for 2 arguments"),
                                            (150, "in_tree nests too deeply"),
                                            (5000, "plan nests too deeply")])
def test_deeply_nested_tree_in_the_plan(blob, depth, message):
    """(regression test: RecursionError escaped)"""
    decoded = format.decode(blob)
    text = decoded.sections["plan"].decode()
    nested = '{"tuple": [' * depth + '"leaf"' + "]}" * depth
    start = text.index('"in_tree": ') + len('"in_tree": ')
    end = text.index(', "n_user_outputs"')
    sections = dict(decoded.sections, plan=(text[:start] + nested + text[end:]).encode())
    header = {k: v for k, v in decoded.header.items() if k not in ("sections", "format")}
    with pytest.raises(ArtifactError, match=message):
        fg.aot.loads(format.encode(header, sections))


def _json_places(node):
    if isinstance(node, dict):
        for k, v in node.items():
            yield node, k
            yield from _json_places(v)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield node, i
            yield from _json_places(v)


@pytest.mark.slow
def test_fuzzed_plan_raises_only_artifact_error(blob):
    """Random values in random places of the plan, resealed: each artifact loads or raises
    ArtifactError, nothing else."""
    import random
    rng = random.Random(7)
    values = [None, True, -1, 0, 3, 10 ** 9, 1.5, "", "leaf", "f32[1]", "float64", [], {},
              [0, 1], [[0, 1]], {"tuple": []}, {"state": "rng"}, {"arg": 5}]
    refused = 0
    for _ in range(25):
        def change(plan):
            places = list(_json_places(plan))
            for _ in range(rng.randint(1, 2)):
                container, key = rng.choice(places)
                container[key] = rng.choice(values)
        try:
            fg.aot.loads(with_plan(blob, change))
        except ArtifactError:
            refused += 1
    assert refused >= 10
