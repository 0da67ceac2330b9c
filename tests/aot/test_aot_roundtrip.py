"""fusegrad.aot: compile without running, save, load, run; values against fusegrad.compile
and numpy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.runtime import jit
from tests.aot.helpers import batches, mlp_step, train_in_fresh_process

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_function_roundtrip(tmp_path):
    def f(x, w):
        return (x @ w).relu() * 2.0 + 1.0, x.sum(1)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    art = fg.aot.compile(f, fg.tensor(x), fg.tensor(w))
    path = tmp_path / "f.fgaot"
    art.save(path)
    run = fg.aot.load(path)
    a, b = run(fg.tensor(x), fg.tensor(w))
    np.testing.assert_allclose(a.numpy(), np.maximum(x @ w, 0) * 2 + 1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.numpy(), x.sum(1), rtol=1e-5, atol=1e-5)
    assert isinstance(a, fg.Tensor) and a.dtype == fg.float32


def test_compile_does_not_run_the_step():
    step, model, opt, x, y = mlp_step("adamw")
    before = [p.detach().numpy().copy() for p in model.parameters()]
    fg.aot.compile(step, x, y)
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.detach().numpy(), b)
        assert p.grad is None
    assert not opt.state                  # the optimizer's first-step state is taken back


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adamw"])
def test_training_step_matches_compiled(optimizer):
    step, model, opt, x, y = mlp_step(optimizer)
    run = fg.aot.loads(fg.aot.compile(step, x, y).to_bytes())
    compiled = fg.compile(step)
    for xb, yb in batches(4):
        want = compiled(xb, yb)
        got = run(xb, yb)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(run.state["model." + name], p.detach().numpy(),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(run.state[f"model.{name}.grad"], p.grad.numpy(),
                                   rtol=1e-5, atol=1e-6)
    if optimizer == "adamw":
        assert len(run.programs) == 2 and run.state["aot.calls"] == 4
        p0 = next(iter(model.parameters()))
        np.testing.assert_allclose(run.state["opt.state.model.0.weight.exp_avg"],
                                   opt.state[p0]["exp_avg"].numpy(), rtol=1e-5, atol=1e-7)


def test_sgd_step_against_numpy():
    """One SGD step of a linear model, computed by hand."""
    fg.manual_seed(0)
    lin = fg.nn.Linear(3, 1)
    opt = fg.optim.SGD(lin.parameters(), lr=0.5)

    def step(x, t):
        opt.zero_grad()
        loss = ((lin(x) - t) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    t = rng.standard_normal((5, 1)).astype(np.float32)
    w, b = lin.weight.detach().numpy().copy(), lin.bias.detach().numpy().copy()
    run = fg.aot.loads(fg.aot.compile(step, fg.tensor(x), fg.tensor(t)).to_bytes())
    loss = run(fg.tensor(x), fg.tensor(t))
    r = x @ w.T + b - t
    np.testing.assert_allclose(loss.item(), (r ** 2).mean(), rtol=1e-5)
    gw, gb = 2 * r.T @ x / 5, 2 * r.sum(0) / 5
    np.testing.assert_allclose(run.state["lin.weight"], w - 0.5 * gw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run.state["lin.bias"], b - 0.5 * gb, rtol=1e-5, atol=1e-6)
    # The model itself is untouched: the artifact trains its own copy of the state.
    np.testing.assert_array_equal(lin.weight.detach().numpy(), w)


def test_state_given_at_load_is_trained_in_place():
    step, model, opt, x, y = mlp_step("sgd")
    art = fg.aot.compile(step, x, y, carry_state=False)
    assert art.state is None
    with pytest.raises(fg.aot.ArtifactError, match="does not carry its state"):
        fg.aot.loads(art.to_bytes())
    state = {"model." + n: p for n, p in model.named_parameters()}
    state["lr"] = np.array(0.1)
    run = fg.aot.loads(art.to_bytes(), state=state)
    reference = mlp_step("sgd")
    for xb, yb in batches(2):
        run(xb, yb)
        reference[0](xb, yb)
    for p, q in zip(model.parameters(), reference[1].parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_fresh_adam_state_given_at_load_counts_steps_as_eager():
    """carry_state=False with a fresh optimizer's state (step counts 0, calls 0): the first
    call sets the step count its program does not write (Adam makes it from a constant),
    so every later bias correction is eager's (it trained one step behind)."""
    step, model, opt, x, y = mlp_step("adamw")
    art = fg.aot.compile(step, x, y, carry_state=False)
    names = [n for n in art.plan["state"] if n["name"].endswith(".step")]
    assert names and all(not n["needed"] for n in names)
    state = {"model." + n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    state.update({"lr": np.array(opt.param_groups[0]["lr"]), "aot.calls": np.array(0),
                  "beta1": np.array(opt.param_groups[0]["betas"][0])})
    state.update({n["name"]: np.zeros((), np.float32) for n in names})
    run = fg.aot.loads(art.to_bytes(), state=state)
    text = run.describe()
    assert "then sets: " in text and "opt.state.model.0.weight.step = 1.0" in text
    for xb, yb in batches(4):
        np.testing.assert_allclose(run(xb, yb).numpy(), step(xb, yb).detach().numpy(), rtol=1e-5)
    p0 = next(iter(model.parameters()))
    assert run.state["opt.state.model.0.weight.step"] == opt.state[p0]["step"].item() == 4.0
    for name, p in model.named_parameters():
        np.testing.assert_allclose(run.state["model." + name], p.detach().numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_module_forward_roundtrip():
    fg.manual_seed(1)
    model = fg.nn.Sequential(fg.nn.Linear(5, 7), fg.nn.GELU(), fg.nn.LayerNorm(7))
    x = fg.randn(3, 5)
    run = fg.aot.loads(fg.aot.compile(model, x).to_bytes())
    assert {"0.weight", "2.bias"} <= set(run.state)
    with fg.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(run(x).numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_fresh_process_loads_without_tracing_or_compiling(tmp_path):
    """Save here, load in a new interpreter that cannot trace or run LLVM's optimizer."""
    step, model, opt, x, y = mlp_step("adamw")
    path = tmp_path / "step.fgaot"
    fg.aot.compile(step, x, y).save(path)
    data = batches(3)
    compiled = fg.compile(step)
    want = [compiled(xb, yb).item() for xb, yb in data]
    weight = model[0].weight.detach().numpy()
    # An empty kernel cache: the artifact alone holds all code, the native loop of the loss's
    # target check included.
    losses, compiles, state = train_in_fresh_process(path, tmp_path,
                                                     [a.numpy() for b in data for a in b])
    assert compiles == 0
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    np.testing.assert_allclose(state["model.0.weight"], weight, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_artifacts_carry_the_native_loops_of_their_extern_steps(tmp_path):
    # Attention (forward and backward) and an embedding's gradient run native loops that a
    # program compiles on first use; a fresh process with an empty cache loads them from the
    # artifact instead.
    emb = fg.nn.Embedding(11, 8)

    def f(idx, q):
        emb.zero_grad()
        k = emb(idx).unsqueeze(1)
        out = fg.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True)
        out.sum().backward()
        return out, emb.weight.grad

    idx = fg.tensor(np.arange(12).reshape(2, 6) % 11)
    q = fg.randn(2, 1, 6, 8)
    art = fg.aot.compile(f, idx, q)
    native = [key for p in art.plan["programs"] for key in p["native"]]
    assert len(native) >= 3          # index check, attention forward and backward, index_add
    path = tmp_path / "f.fgaot"
    art.save(path)
    np.savez(tmp_path / "in.npz", idx=idx.numpy(), q=q.numpy())
    code = f"""
import json, numpy as np
import fusegrad as fg, fusegrad.runtime.jit as jit
def refuse(*a, **k):
    raise AssertionError("compiled while loading or running")
jit._compile_object = refuse
run = fg.aot.load({str(path)!r})
d = np.load({str(tmp_path / 'in.npz')!r})
out, grad = run(fg.tensor(d["idx"]), fg.tensor(d["q"]))
np.save({str(tmp_path / 'out.npy')!r}, out.numpy())
print(json.dumps({{"compiles": jit.stats["compiles"]}}))
"""
    env = dict(os.environ, PYTHONPATH=ROOT, FUSEGRAD_CACHE_DIR=str(tmp_path / "empty-cache"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["compiles"] == 0
    want = fg.compile(f)(idx, q)[0].detach().numpy()
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=1e-5, atol=1e-6)


def test_load_links_only(monkeypatch):
    step, model, opt, x, y = mlp_step("sgd")
    blob = fg.aot.compile(step, x, y).to_bytes()

    def refuse(*a, **k):
        raise AssertionError("LLVM optimization or codegen while loading")
    monkeypatch.setattr(jit, "_compile_object", refuse)
    run = fg.aot.loads(blob)
    assert np.isfinite(run(x, y).item())


def test_rng_state_advances(tmp_path):
    def f(x):
        return fg.nn.functional.dropout(x, 0.5, training=True)

    x = fg.ones(64)
    run = fg.aot.loads(fg.aot.compile(f, x).to_bytes())
    a, b = run(x).numpy(), run(x).numpy()
    assert set(np.unique(a)) <= {0.0, 2.0} and not np.array_equal(a, b)
