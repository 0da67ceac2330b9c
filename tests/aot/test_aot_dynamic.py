"""fusegrad.aot with symbolic dims (``dynamic_shapes``, ``Dim``): one artifact for every
batch size within bounds, trained as fusegrad.compile trains, and refusing what is out of
bounds, naming the argument, the dim and the Dim."""

from __future__ import annotations

import copy
import os
import sys

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.aot.format import ArtifactError
from fusegrad.runtime import jit
from tests.aot.helpers import mlp_step, train_in_fresh_process, with_plan
from tests.compiler.test_dynamic_shapes import lm_sgd_step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EPS32 = float(np.finfo(np.float32).eps)
SIZES = (3, 8, 5)


def _batch(n: int, seed: int, features: int = 12, classes: int = 5):
    rng = np.random.default_rng(seed)
    return (fg.tensor(rng.standard_normal((n, features)).astype(np.float32)),
            fg.tensor(rng.integers(0, classes, n)))


def _mlp_artifact(optimizer: str = "adamw", **dim):
    step, model, opt, x, y = mlp_step(optimizer)
    batch = fg.aot.Dim("batch", **dim)
    art = fg.aot.compile(step, x, y, dynamic_shapes={"x": {0: batch}, "y": {0: batch}})
    return art, step, model


# --------------------------------------------------------------------------- Dim


def test_dim_bounds_and_errors():
    b = fg.aot.Dim("batch", max=64)
    assert (b.__name__, b.min, b.max) == ("batch", 2, 64)
    assert repr(b) == "Dim('batch', min=2, max=64)"
    with pytest.raises(AssertionError, match="Cannot create Dim with inconsistent min=5, max=3"):
        fg.aot.Dim("x", min=5, max=3)
    with pytest.raises(AssertionError, match="Dim name must be a valid identifier, got 1x"):
        fg.aot.Dim("1x")
    with pytest.raises(ValueError, match="sizes 0 and 1 are specialized"):
        fg.aot.Dim("batch", min=1)


def test_dim_errors_match_torch_export():
    torch = pytest.importorskip("torch")
    for kwargs in ({"name": "x", "min": 5, "max": 3}, {"name": "1x"}):
        with pytest.raises(AssertionError) as theirs:
            torch.export.Dim(**kwargs)
        with pytest.raises(AssertionError) as ours:
            fg.aot.Dim(**kwargs)
        assert str(ours.value) == str(theirs.value)
    b = torch.export.Dim("batch", min=2, max=64)
    assert (b.__name__, b.min, b.max) == ("batch", 2, 64)


def test_dynamic_shapes_checked_against_the_example():
    step, model, opt, x, y = mlp_step()
    b = fg.aot.Dim("batch", max=64)
    with pytest.raises(ValueError, match=r"top-level keys must be the arg names \['x', 'y'\]"):
        fg.aot.compile(step, x, y, dynamic_shapes={"z": {0: b}})
    with pytest.raises(ValueError, match=r"x.size\(0\) = 8 not in range \[9, 12\]"):
        fg.aot.compile(step, x, y, dynamic_shapes={"x": {0: fg.aot.Dim("b", min=9, max=12)}})
    with pytest.raises(ValueError, match=r"x.size\(1\) = 12 and x.size\(0\) = 8 are both"):
        fg.aot.compile(step, x, y, dynamic_shapes={"x": {0: b, 1: b}})
    with pytest.raises(TypeError, match="must be a fusegrad.aot.Dim"):
        fg.aot.compile(step, x, y, dynamic_shapes=({0: 8}, None))
    with pytest.raises(IndexError, match="names dim 2 of a tensor of 1 dims"):
        fg.aot.compile(step, x, y, dynamic_shapes=(None, {2: b}))


# --------------------------------------------------------------------------- training


def _train_both(art, step, model, sizes=SIZES):
    """Losses and first weights of the loaded artifact and of fusegrad.compile
    (dynamic=True) over batches of ``sizes``, from the same initial state."""
    run = fg.aot.loads(art.to_bytes())
    compiled = fg.compile(step, dynamic=True)
    got, want = [], []
    for k, n in enumerate(sizes):
        x, y = _batch(n, seed=k)
        got.append(run(x, y).item())
        want.append(compiled(x, y).item())
    return run, compiled, np.array(got), np.array(want)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_one_artifact_trains_at_every_batch_size(optimizer):
    art, step, model = _mlp_artifact(optimizer, max=64)
    # One program (AdamW: the first step and the steady one), built once, for every size.
    assert art.plan["dims"] == [{"name": "batch", "min": 2, "max": 64, "hint": 8,
                                 "where": "x.size(0)"}]
    assert art.plan["args"][0]["shape"] == ["batch", 12]
    run, compiled, got, want = _train_both(art, step, model)
    # (fusegrad.compile too: once, and AdamW's first step once more.)
    assert compiled.compiles == (2 if optimizer == "adamw" else 1)
    # The same graph and kernels up to which dims are symbolic (fusegrad.compile's feature
    # dims are symbols too): sums of at most 16 products per value, through three steps.
    tol = 64 * EPS32 * len(SIZES)
    np.testing.assert_allclose(got, want, rtol=tol)
    np.testing.assert_allclose(run.state["model.0.weight"], model[0].weight.detach().numpy(),
                               rtol=tol, atol=tol)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_equal_to_compile_with_the_same_symbolic_dims(optimizer):
    """fusegrad.compile with the batch dims marked dynamic, first called at the example's
    size, builds the same kernels from the same graph: the same values, bit for bit."""
    art, step, model = _mlp_artifact(optimizer, max=64)
    run = fg.aot.loads(art.to_bytes())
    compiled = fg.compile(step)
    for k, n in enumerate((8, 3, 5)):
        x, y = _batch(n, seed=k)
        got = run(x, y).item()
        fg.mark_dynamic(x, 0)
        fg.mark_dynamic(y, 0)
        assert got == compiled(x, y).item()
    assert compiled.compiles == (2 if optimizer == "adamw" else 1)
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(run.state[f"model.{name}"], p.detach().numpy())


def test_loading_and_new_sizes_compile_nothing(monkeypatch):
    art, step, model = _mlp_artifact("sgd", max=64)
    blob = art.to_bytes()

    def refuse(*a, **k):
        raise AssertionError("compiled at load or at a new size")
    monkeypatch.setattr(jit, "_compile_object", refuse)
    run = fg.aot.loads(blob)
    for n in (2, 64, 17):
        assert np.isfinite(run(*_batch(n, seed=n)).item())


def test_out_of_bounds_and_unequal_sizes_are_refused():
    art, _, _ = _mlp_artifact("sgd", min=4, max=16)
    run = fg.aot.loads(art.to_bytes())
    before = {k: v.copy() for k, v in run.state.items()}
    cases = [
        (_batch(17, 0), r"Guard failed: x.size\(\)\[0\] <= 16 \(x.size\(0\) is "
                        r"Dim\('batch', min=4, max=16\); got 17\)"),
        (_batch(3, 0), r"Guard failed: x.size\(\)\[0\] >= 4 .* got 3"),
        ((_batch(5, 0)[0], _batch(6, 0)[1]), r"Guard failed: y.size\(\)\[0\] == x.size\(\)\[0\] "
                                             r"\(y.size\(0\) = 6 and x.size\(\)\[0\] = 5 are both"),
        ((fg.zeros(5, 13), _batch(5, 0)[1]), r"argument 0 \(x\) must be f32\[batch,12\], got "
                                              r"f32\[5,13\]"),
    ]
    for args, message in cases:
        with pytest.raises(ArtifactError, match=message) as e:
            run(*args)
        assert e.value.reason == "signature"
    # Nothing ran: the state is untouched.
    for k, v in run.state.items():
        np.testing.assert_array_equal(v, before[k])


def test_format_round_trips_the_dims():
    art, _, _ = _mlp_artifact("sgd", max=100)
    blob = art.to_bytes()
    run = fg.aot.loads(blob)
    assert run.plan["dims"] == art.plan["dims"]
    assert "dim batch: sizes 2..100 (first x.size(0); compiled at 8)" in run.describe()
    assert "in  arg0 x: f32[batch,12]" in run.describe()
    unbounded, _, _ = _mlp_artifact("sgd")
    assert "dim batch: sizes 2..inf" in unbounded.describe()


@pytest.mark.parametrize("change,field", [
    (lambda p: p["dims"][0].update(min=50), "dims[0]"),          # min above the traced size
    (lambda p: p["dims"][0].update(name="b"), "args[0]"),        # args name another symbol
    (lambda p: p.pop("dims"), "args[0]"),                        # symbolic args, no dims
    (lambda p: p["dims"].append(dict(p["dims"][0], name="t")), "dims"),   # a dim no arg has
])
def test_tampered_dims_are_refused(change, field):
    art, _, _ = _mlp_artifact("sgd", max=64)
    with pytest.raises(ArtifactError) as e:
        fg.aot.loads(with_plan(art.to_bytes(), change))
    assert e.value.reason == "plan" and field in str(e.value), e.value


def test_static_artifacts_have_no_dims_and_still_load():
    step, model, opt, x, y = mlp_step("sgd")
    art = fg.aot.compile(step, x, y)
    assert "dims" not in art.plan and art.plan["args"][0]["shape"] == [8, 12]
    run = fg.aot.loads(art.to_bytes())
    with pytest.raises(ArtifactError, match=r"must be f32\[8,12\], got f32\[5,12\]"):
        run(*_batch(5, 0))
    assert np.isfinite(run(*_batch(8, 0)).item())


# --------------------------------------------------------------------------- char transformer




def _char_transformer():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        from char_transformer import make_model
    finally:
        sys.path.pop(0)
    fg.manual_seed(0)
    return make_model(fg, vocab=20, block=16, n_embd=16, n_head=2, n_layer=1)


def _tokens(n: int, t: int, seed: int):
    rng = np.random.default_rng(seed)
    return [fg.tensor(rng.integers(0, 20, (n, t))) for _ in range(2)]


@pytest.mark.slow
def test_char_transformer_artifact_trains_at_three_batch_sizes_in_a_fresh_process(tmp_path):
    model = _char_transformer()
    reference = copy.deepcopy(model)
    batch = fg.aot.Dim("batch", max=64)
    path = tmp_path / "step.fgaot"
    fg.aot.compile(lm_sgd_step(model), *_tokens(4, 16, 0),
                   dynamic_shapes={"x": {0: batch}, "y": {0: batch}}).save(path)
    data = [a.numpy() for k, n in enumerate(SIZES) for a in _tokens(n, 16, k + 1)]
    compiled = fg.compile(lm_sgd_step(reference), dynamic=True)
    want = [compiled(fg.tensor(data[i]), fg.tensor(data[i + 1])).item()
            for i in range(0, len(data), 2)]
    losses, compiles, state = train_in_fresh_process(path, tmp_path, data)
    assert compiles == 0
    assert compiled.compiles == 1
    # Sums of a few dozen float32 terms per value, through one block and three SGD steps.
    tol = 1024 * EPS32 * len(SIZES)
    np.testing.assert_allclose(losses, want, rtol=tol)
    for name, p in reference.named_parameters():
        np.testing.assert_allclose(state[f"model.{name}"], p.detach().numpy(), rtol=tol,
                                   atol=tol * 0.1, err_msg=name)


def _tokens_of(pairs, seed: int = 1) -> list:
    return [a.numpy() for k, (n, t) in enumerate(pairs) for a in _tokens(n, t, seed + k)]


@pytest.mark.slow
def test_char_transformer_artifact_trains_at_three_batch_sizes_and_lengths(tmp_path):
    """Batch and sequence length symbolic: the fused attention's kernels read the length at
    run time, so one artifact trains at any (batch, length) within the bounds, in a fresh
    process that compiles nothing, as fusegrad.compile(dynamic=True) trains."""
    model = _char_transformer()
    reference = copy.deepcopy(model)
    b, t = fg.aot.Dim("batch", max=64), fg.aot.Dim("seq", max=16)
    path = tmp_path / "step.fgaot"
    fg.aot.compile(lm_sgd_step(model), *_tokens(3, 12, 0),
                   dynamic_shapes={"x": {0: b, 1: t}, "y": {0: b, 1: t}}).save(path)
    data = _tokens_of([(3, 12), (8, 16), (5, 7)])
    compiled = fg.compile(lm_sgd_step(reference), dynamic=True)
    want = [compiled(fg.tensor(data[i]), fg.tensor(data[i + 1])).item()
            for i in range(0, len(data), 2)]
    losses, compiles, state = train_in_fresh_process(path, tmp_path, data)
    assert compiles == 0
    assert compiled.compiles == 1
    # The same program and kernels: the same bits.
    assert losses == want
    for name, p in reference.named_parameters():
        np.testing.assert_array_equal(state[f"model.{name}"], p.detach().numpy(), err_msg=name)


@pytest.mark.slow
def test_a_sequence_dim_past_what_the_fused_attention_takes_is_refused():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        from char_transformer import make_model
    finally:
        sys.path.pop(0)
    fg.manual_seed(0)
    step = lm_sgd_step(make_model(fg, vocab=20, block=256, n_embd=16, n_head=2,
                                             n_layer=1))
    b, t = fg.aot.Dim("batch", max=64), fg.aot.Dim("seq", max=200)
    with pytest.raises(ValueError, match=r"seq <= 128 \(false at seq = 129: the fused attention "
                                         r"takes at most 128 keys.*Dim\('seq', min=2, max=200\)"):
        fg.aot.compile(step, *_tokens(3, 12, 0), dynamic_shapes={"x": {0: b, 1: t},
                                                                  "y": {0: b, 1: t}})


def test_a_read_only_view_of_a_buffer_is_state_of_its_own():
    """(regression test: a [1,1,16,16] mask buffer viewing a [16,16] array, sliced at a
    sequence length below 16, was refused as one state of two types)"""
    step = lm_sgd_step(_char_transformer())
    art = fg.aot.compile(step, *_tokens(3, 12, 0))
    names = {s["name"]: s["type"] for s in art.plan["state"]}
    assert names["model.blocks.0.mask"] == "f32[1,1,16,16]"
    assert names["model.blocks.0.mask.view"] == "f32[16,16]"


def test_a_written_tensor_read_through_a_view_is_refused():
    lin = fg.nn.Linear(4, 4, bias=False)
    flat = lin.weight.detach().view(16)
    opt = fg.optim.SGD(lin.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        loss = lin(x).sum() + flat.sum()
        loss.backward()
        opt.step()
        return loss
    with pytest.raises(ValueError, match="a view of .* of another shape"):
        fg.aot.compile(step, fg.ones(4, 4))


def test_what_the_trace_assumed_must_hold_within_the_bounds():
    def body(x):
        return x * 2 if x.shape[0] == 4 else x + 1
    x = fg.ones(6, 3)
    with pytest.raises(ValueError, match=r"batch != 4 \(false at batch = 4\)"):
        fg.aot.compile(body, x, dynamic_shapes=[{0: fg.aot.Dim("batch", max=8)}])
    with pytest.raises(ValueError, match=r"batch != 4 \(not checked over Dim\('batch', min=2\)"):
        fg.aot.compile(body, x, dynamic_shapes=[{0: fg.aot.Dim("batch")}])
    # Within [5, 8] the branch taken is the one for every size.
    art = fg.aot.compile(body, x, dynamic_shapes=[{0: fg.aot.Dim("batch", min=5, max=8)}])
    run = fg.aot.loads(art.to_bytes())
    for n in (5, 8):
        np.testing.assert_array_equal(run(fg.ones(n, 3)).numpy(), np.full((n, 3), 2.0))


@pytest.mark.slow
def test_guard_wording_matches_torch_export():
    torch = pytest.importorskip("torch")

    class Add(torch.nn.Module):
        def forward(self, x, y):
            return x + y
    tb = torch.export.Dim("batch", min=4, max=16)
    theirs = torch.export.export(Add(), (torch.ones(5, 3), torch.ones(5, 3)),
                                 dynamic_shapes={"x": {0: tb}, "y": {0: tb}}).module()
    b = fg.aot.Dim("batch", min=4, max=16)
    ours = fg.aot.loads(fg.aot.compile(lambda x, y: x + y, fg.ones(5, 3), fg.ones(5, 3),
                                       dynamic_shapes={"x": {0: b}, "y": {0: b}}).to_bytes())
    for n, m in ((3, 3), (17, 17), (5, 6)):
        with pytest.raises(AssertionError) as t:
            theirs(torch.ones(n, 3), torch.ones(m, 3))
        with pytest.raises(ArtifactError) as e:
            ours(fg.ones(n, 3), fg.ones(m, 3))
        assert str(t.value) in str(e.value)
