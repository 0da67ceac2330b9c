"""Symbolic dimensions in compiled functions: ``fusegrad.compile(dynamic=True)``, torch's
automatic dynamic (``dynamic=None``), ``mark_dynamic``, and what the symbolic trace assumed.

A training step compiled with a symbolic batch dim traces and optimizes once for every batch
size of at least 2 (size 1 specializes, as torch's 0/1 specialization does); its values
equal eager's within float32 rounding of the same computation.
"""

from __future__ import annotations

import copy
import os
import sys

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import config as fg_config
from fusegrad.ir.parser import parse
from fusegrad.ir.printer import print_graph
from fusegrad.ir.verifier import verify
from fusegrad.symint import SymInt

EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(autouse=True)
def _automatic_dynamic(monkeypatch):
    monkeypatch.setattr(fg_config.config, "automatic_dynamic_shapes", True)


def _mlp(seed=0):
    fg.manual_seed(seed)
    return fg.nn.Sequential(fg.nn.Linear(12, 16), fg.nn.ReLU(), fg.nn.Linear(16, 10))


def _step_fn(model, opt):
    def step(x, y):
        opt.zero_grad()
        loss = fg.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def _batches(sizes, seed=1):
    rng = np.random.default_rng(seed)
    return [(fg.tensor(rng.standard_normal((n, 12)).astype(np.float32)),
             fg.tensor(rng.integers(0, 10, n))) for n in sizes]


def _train(dynamic, sizes, optimizer="sgd"):
    """Losses and final parameters of compiled and eager training on the same batches, and
    the compiled step."""
    eager_model = _mlp()
    model = copy.deepcopy(eager_model)
    make = {"sgd": lambda p: fg.optim.SGD(p, lr=0.1),
            "adam": lambda p: fg.optim.Adam(p, lr=1e-2)}[optimizer]
    eager_step = _step_fn(eager_model, make(eager_model.parameters()))
    step = fg.compile(_step_fn(model, make(model.parameters())), dynamic=dynamic)
    losses, eager_losses = [], []
    for x, y in _batches(sizes):
        losses.append(float(step(x, y)))
        eager_losses.append(float(eager_step(x, y)))
    params = [p.detach().numpy() for p in model.parameters()]
    eager_params = [p.detach().numpy() for p in eager_model.parameters()]
    return losses, eager_losses, params, eager_params, step


def _assert_matches_eager(losses, eager_losses, params, eager_params, steps):
    # Dot products of length 16 and sums over 10 classes and the batch, in float32: a few
    # hundred eps per step at most, compounding through the updates.
    tol = 256 * EPS32 * steps
    np.testing.assert_allclose(losses, eager_losses, rtol=tol, atol=tol)
    for p, q in zip(params, eager_params):
        np.testing.assert_allclose(p, q, rtol=tol, atol=tol)


def test_dynamic_true_compiles_a_training_step_once_for_every_batch_size():
    sizes = [32, 32, 7, 2, 31, 17, 32, 5]            # the last batch of an epoch is shorter
    losses, eager_losses, params, eager_params, step = _train(True, sizes)
    _assert_matches_eager(losses, eager_losses, params, eager_params, len(sizes))
    assert step.compiles == 1 and step.recompile_reasons == []
    (entry,) = step.entries()
    assert entry.symbolic is not None
    x_type = entry.graph.inputs[0].type
    assert isinstance(x_type.shape[0], SymInt) and x_type.shape[1] == 12
    assert str(x_type) == "f32[s0,12]"


def test_dynamic_true_with_adam_compiles_its_first_step_and_then_once():
    sizes = [16, 9, 16, 3, 11]
    losses, eager_losses, params, eager_params, step = _train(True, sizes, "adam")
    _assert_matches_eager(losses, eager_losses, params, eager_params, len(sizes))
    # The first step makes Adam's state (a program that runs once), then the steady step.
    assert step.compiles == 2


def test_automatic_dynamic_recompiles_once_with_the_changed_dim_symbolic(capsys, monkeypatch):
    monkeypatch.setattr(fg_config.config, "debug", 1)
    sizes = [32, 32, 32, 20, 32, 9, 3]
    losses, eager_losses, params, eager_params, step = _train(None, sizes)
    _assert_matches_eager(losses, eager_losses, params, eager_params, len(sizes))
    assert step.compiles == 2
    assert step.recompile_reasons == [
        "automatic dynamic: x.size(0) 32 -> 20, y.size(0) 32 -> 20 (now symbolic)"]
    static, symbolic = step.entries()
    assert static.symbolic is None and symbolic.symbolic is not None
    err = capsys.readouterr().err
    assert "automatic dynamic: step saw x.size(0) 32 -> 20, y.size(0) 32 -> 20" in err
    assert "traced with symbolic x.size(0) as s0, y.size(0) as s0" in err


def test_size_one_specializes_and_dynamic_false_is_static(capsys, monkeypatch):
    monkeypatch.setattr(fg_config.config, "debug", 1)
    _, _, _, _, step = _train(True, [8, 1, 5, 1])
    assert step.compiles == 2                        # s0 >= 2, then the size-1 program
    reasons = [line for line in capsys.readouterr().err.splitlines() if "recompile reason" in line]
    assert len(reasons) == 1 and "dim 0 (s0 = 1): a size of 0 or 1 is compiled for itself" \
        in reasons[0] and "0/1 specialization" in reasons[0]
    losses, eager_losses, params, eager_params, step = _train(False, [8, 4, 8, 4])
    _assert_matches_eager(losses, eager_losses, params, eager_params, 4)
    assert step.compiles == 2 and all(e.symbolic is None for e in step.entries())


def test_dynamic_true_builds_kernels_that_read_their_sizes():
    x = fg.randn(64, 32)
    f = lambda t: (t.softmax(-1) * 2).sum(0)        # noqa: E731
    static = fg.compile(f, dynamic=False)
    dynamic = fg.compile(f, dynamic=True)
    a, b = static.lower(x), dynamic.lower(x)
    # The static kernels know their sizes; the symbolic ones read them from the sizes
    # buffer, and no kernel holds the sizes of this call.
    assert "symbols" not in a.llvm_ir
    assert b.kernels == ["k0[reduction s0xs1](max,reshape,eq,where,sub,exp,sum,reshape,div,mul,"
                         "sum)"] or all("s0" in k for k in b.kernels)
    # Sums of at most 64 terms: a few float32 roundings apart, whatever the loop order.
    np.testing.assert_allclose(dynamic(x).numpy(), static(x).numpy(), rtol=64 * EPS32, atol=0)


def test_mark_dynamic_makes_that_dim_symbolic():
    f = fg.compile(lambda t: t.softmax(-1).sum(-1))
    x = fg.randn(6, 8)
    fg._dynamo.mark_dynamic(x, 0)
    assert fg.mark_dynamic is fg._dynamo.mark_dynamic
    f(x)
    (entry,) = f.entries()
    assert isinstance(entry.graph.inputs[0].type.shape[0], SymInt)
    for n in (3, 17):
        y = fg.randn(n, 8)
        fg.mark_dynamic(y, 0)
        np.testing.assert_allclose(f(y).numpy(), np.ones(n), rtol=0, atol=8 * 4 * EPS32)
    assert f.compiles == 1
    with pytest.raises(IndexError, match="Dimension out of range"):
        fg.mark_dynamic(x, 2)


def test_a_failing_assumption_names_the_dim_and_compiles_that_size():
    def f(x):
        # Python control flow on a size: the symbolic trace assumes s0 != 4.
        return x * 2 if x.shape[0] == 4 else x + 1
    g = fg.compile(f, dynamic=True)
    np.testing.assert_array_equal(g(fg.ones(3, 2)).numpy(), np.full((3, 2), 2.0))
    (entry,) = g.entries()
    assert [(str(e), op, k) for e, op, k in entry.symbolic.assumptions] == [("s0", "!=", 4)]
    assert entry.symbolic.failing([fg.ones(4, 2)]) == \
        "the symbolic trace assumed x.size(0) (s0) != 4, but x.size(0) (s0) is 4 in this call"
    np.testing.assert_array_equal(g(fg.ones(4, 2)).numpy(), np.full((4, 2), 2.0) * 1)
    assert g.compiles == 2
    assert g.recompile_reasons == [
        "the symbolic trace assumed x.size(0) (s0) != 4, but x.size(0) (s0) is 4 in this call"]
    np.testing.assert_array_equal(g(fg.ones(5, 2)).numpy(), np.full((5, 2), 2.0))
    np.testing.assert_array_equal(g(fg.ones(4, 2)).numpy(), np.full((4, 2), 2.0))
    assert g.compiles == 2


def test_a_call_that_autograd_records_has_a_symbolic_backward():
    w = fg.randn(3, 3, requires_grad=True)
    f = fg.compile(lambda x: (x @ w).tanh().sum(), dynamic=True)
    for n in (4, 6, 9):
        x = fg.randn(n, 3)
        f(x).backward()
        eager_w = w.detach().clone().requires_grad_(True)
        (x @ eager_w).tanh().sum().backward()
        # Sums of n products of three terms and their derivatives, in float32.
        np.testing.assert_allclose(w.grad.numpy(), eager_w.grad.numpy(), rtol=64 * EPS32,
                                   atol=64 * EPS32)
        w.grad = None
    assert f.compiles == 1 and f.entries()[0].symbolic is not None


def test_a_compiled_model_trains_with_backward_outside():
    eager_model = _mlp()
    model = copy.deepcopy(eager_model)
    compiled = fg.compile(model, dynamic=True)
    opt = fg.optim.SGD(model.parameters(), lr=0.1)
    eager_opt = fg.optim.SGD(eager_model.parameters(), lr=0.1)
    for x, y in _batches([16, 7, 16, 3]):
        for m, o in ((compiled, opt), (eager_model, eager_opt)):
            o.zero_grad()
            fg.nn.functional.cross_entropy(m(x), y).backward()
            o.step()
    for p, q in zip(model.parameters(), eager_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1024 * EPS32,
                                   atol=1024 * EPS32)
    (entry,) = compiled.forward.entries()
    assert compiled.forward.compiles == 1 and entry.symbolic is not None


def test_symbolic_training_graph_prints_parses_and_verifies():
    _, _, _, _, step = _train(True, [8, 5])
    (entry,) = step.entries()
    text = print_graph(entry.optimized)
    assert "f32[s0,12]" in text and "i64[s0]" in text
    g = parse(text)
    verify(g)
    assert print_graph(g) == text


@pytest.mark.parametrize("dynamic,sizes", [(None, [32, 32, 20, 32, 9, 3]), (True, [32, 7, 2, 31]),
                                           (False, [8, 4, 8, 4])])
def test_compile_counts_are_torchs(dynamic, sizes):
    torch = pytest.importorskip("torch")
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    tf = torch.compile(lambda x: (x * 2).softmax(-1).sum(-1), backend="eager", dynamic=dynamic)
    f = fg.compile(lambda x: (x * 2).softmax(-1).sum(-1), dynamic=dynamic)
    rng = np.random.default_rng(0)
    for n in sizes:
        x = rng.standard_normal((n, 8)).astype(np.float32)
        np.testing.assert_allclose(f(fg.tensor(x)).numpy(), tf(torch.tensor(x)).numpy(),
                                   rtol=8 * 4 * EPS32, atol=8 * 4 * EPS32)
    assert f.compiles == counters["stats"]["unique_graphs"]


def test_a_size_assumption_recompiles_as_torchs():
    torch = pytest.importorskip("torch")
    from torch._dynamo.utils import counters

    def body(x):
        return x * 2 if x.shape[0] == 4 else x + 1
    torch._dynamo.reset()
    counters.clear()
    tf = torch.compile(body, backend="eager", dynamic=True)
    f = fg.compile(body, dynamic=True)
    for n in (3, 4, 5, 4):
        np.testing.assert_array_equal(f(fg.ones(n, 2)).numpy(), tf(torch.ones(n, 2)).numpy())
    assert f.compiles == counters["stats"]["unique_graphs"] == 2


def _char_transformer(block=16):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "examples"))
    try:
        from char_transformer import make_model
    finally:
        sys.path.pop(0)
    fg.manual_seed(0)
    return make_model(fg, vocab=20, block=block, n_embd=16, n_head=2, n_layer=1)


def _lm_steps(eager_model, dynamic):
    """A char transformer's SGD training step compiled with ``dynamic`` (on a copy of the
    model) and eager: (compiled step, eager step, its model, the eager model). (SGD: Adam's
    normalized update would turn the rounding noise of near-zero gradients into steps of the
    learning rate's size, compiled or not.)"""
    model = copy.deepcopy(eager_model)
    return fg.compile(lm_sgd_step(model), dynamic=dynamic), lm_sgd_step(eager_model), model, \
        eager_model


def lm_sgd_step(model, lr=0.1):
    """The training step of a language model called as ``model(x, y) -> loss``, with SGD
    (Adam's normalized update would turn the rounding noise of near-zero gradients into
    steps of the learning rate's size, compiled or not)."""
    opt = fg.optim.SGD(model.parameters(), lr=lr)

    def step(x, y):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss
    return step


@pytest.mark.slow
@pytest.mark.parametrize("dynamic,compiles", [(True, 1), (None, 2)])
def test_char_transformer_compiles_once_for_every_sequence_length(dynamic, compiles):
    step, eager_step, model, eager_model = _lm_steps(_char_transformer(), dynamic)
    rng = np.random.default_rng(0)
    lengths = [16, 16, 9, 16, 5, 12, 2]
    for t in lengths:
        x, y = (fg.tensor(rng.integers(0, 20, (3, t))) for _ in range(2))
        loss, eager_loss = float(step(x, y)), float(eager_step(x, y))
        # Sums of a few dozen float32 terms per value, through one block and Adam's update.
        np.testing.assert_allclose(loss, eager_loss, rtol=1024 * EPS32 * len(lengths))
    # One program for every length (dynamic=None: a static one first, then the symbolic
    # one from the second length on).
    assert step.compiles == compiles
    assert step.entries()[-1].symbolic is not None
    for p, q in zip(model.parameters(), eager_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(),
                                   rtol=1024 * EPS32 * len(lengths),
                                   atol=1024 * EPS32 * len(lengths) * 0.1)


SIZE_PROGRAMS = {
    "mean": lambda x: x.mean(),
    "var over the batch": lambda x: x.var(0),
    "a size as a scalar": lambda x: x.sum(0) / x.shape[0] + x * x.shape[0],
    "full of a symbolic shape": lambda x: x + fg.full((x.shape[0], 3), 2.0),
    "layer_norm": lambda x: fg.nn.functional.layer_norm(x, (3,)),
    "mse_loss": lambda x: fg.nn.functional.mse_loss(x, fg.zeros_like(x)),
    "arange of a size": lambda x: x * fg.arange(x.shape[0]).float()[:, None],
    "a view of the input": lambda x: x[: x.shape[0] // 2],
    "view(-1)": lambda x: x.view(-1) * 2,
}


@pytest.mark.parametrize("name", list(SIZE_PROGRAMS))
def test_programs_reading_sizes_compile_once(name):
    f = SIZE_PROGRAMS[name]
    compiled = fg.compile(f, dynamic=True)
    rng = np.random.default_rng(0)
    for n in (4, 7, 9):
        x = fg.tensor(rng.standard_normal((n, 3)).astype(np.float32))
        # Sums over at most 27 elements in float32.
        np.testing.assert_allclose(compiled(x).numpy(), f(x).numpy(), rtol=32 * EPS32,
                                   atol=32 * EPS32)
    assert compiled.compiles == 1 and compiled.entries()[0].symbolic is not None
    # One program: a size the kernels use as a value (a mean's count) is read at run time.
    program = compiled.entries()[0].program
    assert program.builds == 1 and program.fallback is None


@pytest.mark.parametrize("name,f", [
    ("layer_norm over a symbolic row", lambda x: fg.nn.functional.layer_norm(x, x.shape).sum()),
    ("var", lambda x: x.var()),
    ("mean", lambda x: (x * x).mean()),
])
def test_gradients_of_programs_reading_sizes_compile_once(name, f):
    # The backward divides by a symbolic count too (layer norm's VJP rule, run by the
    # autodiff pass, makes that count a node of the backward graph).
    compiled = fg.compile(f, dynamic=True)
    rng = np.random.default_rng(1)
    for n in (4, 2, 5):
        data = rng.standard_normal((n, 3)).astype(np.float32)
        x, y = fg.tensor(data, requires_grad=True), fg.tensor(data, requires_grad=True)
        compiled(x).backward()
        f(y).backward()
        np.testing.assert_allclose(x.grad.numpy(), y.grad.numpy(), rtol=64 * EPS32,
                                   atol=64 * EPS32)
    assert compiled.compiles == 1, name


def test_symbolic_training_step_is_built_once_for_every_batch_size():
    # One fused program, its kernels reading the batch size at run time: a new size builds
    # nothing, and each size's losses and parameters are those of the step compiled for it.
    sizes = [32, 32, 2, 7, 33, 17, 64, 3]
    models = {d: _mlp() for d in (True, False)}
    steps = {d: fg.compile(_step_fn(m, fg.optim.Adam(m.parameters(), lr=1e-2)), dynamic=d)
             for d, m in models.items()}
    kernels = []
    for x, y in _batches(sizes):
        got, want = float(steps[True](x, y)), float(steps[False](x, y))
        np.testing.assert_allclose(got, want, rtol=256 * EPS32)
        kernels.append(steps[True].entries()[-1].program.kernels())
    # The first step, then the steady one (with Adam's state): one program each.
    assert steps[True].compiles == 2
    for entry in steps[True].entries():
        program = entry.program
        assert program.builds == 1 and program.fallback is None and program.programs() == 1
    assert all(k == kernels[-1] for k in kernels[1:]) and any("s0" in k for k in kernels[-1])
    for p, q in zip(models[True].parameters(), models[False].parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4,
                                   atol=1e-5)


@pytest.mark.parametrize("dynamic,compiles", [(True, 1), (None, 2)])
def test_an_epoch_whose_last_batch_is_shorter(dynamic, compiles):
    from fusegrad.utils.data import DataLoader, TensorDataset

    rng = np.random.default_rng(3)
    data = TensorDataset(fg.tensor(rng.standard_normal((150, 12)).astype(np.float32)),
                         fg.tensor(rng.integers(0, 10, 150)))
    eager_model = _mlp()
    model = copy.deepcopy(eager_model)
    step = fg.compile(_step_fn(model, fg.optim.SGD(model.parameters(), lr=0.1)),
                      dynamic=dynamic)
    eager_step = _step_fn(eager_model, fg.optim.SGD(eager_model.parameters(), lr=0.1))
    sizes = []
    for _ in range(2):
        for x, y in DataLoader(data, batch_size=64):          # 64, 64, 22
            sizes.append(len(x))
            loss, eager_loss = float(step(x, y)), float(eager_step(x, y))
            np.testing.assert_allclose(loss, eager_loss, rtol=256 * EPS32 * len(sizes))
    assert sizes == [64, 64, 22] * 2
    assert step.compiles == compiles


def test_other_backends_compile_static_shapes_and_say_so(capsys, monkeypatch):
    monkeypatch.setattr(fg_config.config, "debug", 1)
    f = fg.compile(lambda t: t * 2, backend="interpreter", dynamic=True)
    for n in (3, 4):
        np.testing.assert_array_equal(f(fg.ones(n)).numpy(), np.full(n, 2.0))
    assert f.compiles == 2 and all(e.symbolic is None for e in f.entries())
    assert "the interpreter backend compiles static shapes" in capsys.readouterr().err


def test_a_function_returning_a_size_returns_ints():
    f = fg.compile(lambda x: (x * 2, x.shape[0], x.shape), dynamic=True)
    for n in (3, 5):
        out = f(fg.ones(n, 2))
        assert type(out[1]) is int and out[1] == n and out[2] == (n, 2)
    assert all(e.symbolic is None for e in f.entries())


_W, _B = fg.randn(6, 4), fg.randn(4)
F = fg.nn.functional
# Programs over an (n, 6) input: each compiled with dynamic=True, run at four sizes, equal
# to eager (where a program's trace needs a concrete size, it compiles static shapes).
DIFFERENTIAL = {
    "matmul": lambda x: x @ _W,
    "linear_relu": lambda x: F.relu(x @ _W + _B),
    "softmax": lambda x: x.softmax(-1),
    "softmax0": lambda x: x.softmax(0),
    "logsumexp0": lambda x: x.logsumexp(0),
    "sum_all": lambda x: x.sum(),
    "max0": lambda x: x.max(0).values,
    "argmax0": lambda x: x.argmax(0),
    "t": lambda x: x.t() * 2,
    "t_contig": lambda x: x.t().contiguous() + 1,
    "cat0": lambda x: fg.cat([x, x * 2], 0),
    "cat1": lambda x: fg.cat([x, x * 2], 1),
    "stack": lambda x: fg.stack([x, x], 0).sum(0),
    "index_rows": lambda x: x[1:] - x[:-1],
    "step_slice": lambda x: x[::2],
    "neg_index": lambda x: x[-1],
    "where": lambda x: fg.where(x > 0, x, x * 0.1),
    "unsqueeze_bcast": lambda x: x.unsqueeze(0) + x.unsqueeze(1),
    "outer": lambda x: x.sum(1)[:, None] * x.sum(1)[None, :],
    "cumsum": lambda x: x.cumsum(0),
    "flip": lambda x: x.flip(0),
    "roll": lambda x: x.roll(1, 0),
    "pad": lambda x: F.pad(x, (1, 1, 2, 0)),
    "reshape_merge": lambda x: x.reshape(-1, 3) * 2,
    "view_split": lambda x: x.view(x.shape[0], 2, 3).sum(1),
    "expand": lambda x: x[:, :1].expand(-1, 6) + x,
    "std0": lambda x: x.std(0),
    "norm": lambda x: x.norm(dim=1),
    "gelu_ln": lambda x: F.gelu(F.layer_norm(x, (6,))),
    "cross_entropy": lambda x: F.cross_entropy(x, (x.sum(1) > 0).long()),
    "dropout_eval": lambda x: F.dropout(x, 0.5, training=False),
    "gather": lambda x: x.gather(1, fg.zeros(x.shape[0], 1, dtype=fg.int64)),
    "topk": lambda x: x.topk(2, dim=1).values,
    "sort0": lambda x: x.sort(0).values,
    "chunk": lambda x: x.chunk(2, 1)[1] * 3,
    "split_sizes": lambda x: x.split(2, 0)[0],
    "mean_keep": lambda x: x - x.mean(0, keepdim=True),
    "inplace": lambda x: x.clone().mul_(2).add_(1),
    "masked_fill": lambda x: x.masked_fill(x < 0, 0.0),
    "clamp": lambda x: x.clamp(-0.5, 0.5),
    "tril": lambda x: x.tril(),
    "bmm": lambda x: (x.view(x.shape[0], 2, 3) @ x.view(x.shape[0], 3, 2)),
    "einsum": lambda x: fg.einsum("ij,kj->ik", x, x),
    "nonzero_count": lambda x: (x > 0).sum(1),
    "repeat": lambda x: x.repeat(2, 1),
}


@pytest.mark.parametrize("name", list(DIFFERENTIAL))
def test_symbolic_programs_equal_eager(name):
    f = DIFFERENTIAL[name]
    compiled = fg.compile(f, dynamic=True)
    rng = np.random.default_rng(1)
    for n in (3, 5, 8, 2):
        x = fg.tensor(rng.standard_normal((n, 6)).astype(np.float32))
        got, want = compiled(x), f(x)
        # Reductions over at most 48 elements in float32 (float64 where a sum is blocked).
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=64 * EPS32, atol=64 * EPS32)


def test_a_trace_that_needs_a_size_falls_back_to_static(capsys, monkeypatch):
    monkeypatch.setattr(fg_config.config, "debug", 1)
    f = fg.compile(lambda x: x * float(x.shape[0]), dynamic=True)
    for n in (3, 4, 5):
        x = fg.arange(float(n))
        np.testing.assert_array_equal(f(x).numpy(), x.numpy() * n)
    assert f.compiles == 3 and all(e.symbolic is None for e in f.entries())
    err = capsys.readouterr().err
    assert "symbolic x.size(0) as s0 is not supported here (" in err
    assert "compiling static shapes" in err


@pytest.mark.parametrize("dynamic", [True, None])
def test_equality_of_two_size_expressions_is_guarded(dynamic):
    # s0//2*2 == s0 and s0-1 == s1 were compared by their form (always False, nothing
    # recorded): a branch on them took the wrong side, silently, at sizes where they hold.
    def f(x, y):
        a = x * 2 if x.shape[0] // 2 * 2 == x.shape[0] else x - 1
        b = x[:-1] + y if x.shape[0] - 1 == y.shape[0] else y * 3
        c = 2.0 if x.shape[0] == 12.0 else 1.0      # (float == SymInt was identity)
        return a.sum(0) * c, b
    compiled = fg.compile(f, dynamic=dynamic)
    rng = np.random.default_rng(5)
    for n, m in ((8, 7), (9, 8), (10, 4), (7, 6), (12, 11), (5, 3)):
        x = fg.tensor(rng.standard_normal((n, 3)).astype(np.float32))
        y = fg.tensor(rng.standard_normal((m, 3)).astype(np.float32))
        for got, want in zip(compiled(x, y), f(x, y)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=8 * EPS32,
                                       atol=8 * EPS32)


@pytest.mark.parametrize("dynamic", [True, None])
def test_a_size_looked_up_in_a_dict_or_set_compiles_static(dynamic, capsys, monkeypatch):
    # A dict or set finds a key by hash, so {20: 2.0}.get(s0) traced at 32 answered the
    # default with nothing to guard, and ran that branch at 20 too. Hashing a size while
    # tracing gives the symbolic trace up (torch's SymInt is unhashable).
    monkeypatch.setattr(fg_config.config, "debug", 1)

    def f(x):
        return x * {20: 2.0, 7: 5.0}.get(x.shape[0], 1.0) + (x.shape[0] in {8, 20})
    compiled = fg.compile(f, dynamic=dynamic)
    rng = np.random.default_rng(6)
    for n in (32, 20, 7, 8, 9):
        x = fg.tensor(rng.standard_normal((n, 3)).astype(np.float32))
        np.testing.assert_allclose(compiled(x).numpy(), f(x).numpy(), rtol=4 * EPS32)
    assert all(e.symbolic is None for e in compiled.entries())
    assert "unhashable type: symbolic size s0" in capsys.readouterr().err


def test_vmap_over_a_symbolic_batch_keeps_the_symbolic_compile():
    f = fg.compile(lambda x: fg.func.vmap(lambda r: r.sin().sum())(x), dynamic=True)
    rng = np.random.default_rng(7)
    for n in (4, 6, 9):
        x = fg.tensor(rng.standard_normal((n, 3)).astype(np.float32))
        np.testing.assert_allclose(f(x).numpy(), np.sin(x.numpy()).sum(1), rtol=8 * EPS32,
                                   atol=8 * EPS32)
    assert f.compiles == 1 and f.entries()[0].symbolic is not None


def test_a_new_dim_that_breaks_the_symbolic_trace_stays_static_alone(capsys, monkeypatch):
    # An RNN-like loop over the sequence length needs its value; once the batch was
    # symbolic, the length turning symbolic gave symbolic shapes up for every later call.
    monkeypatch.setattr(fg_config.config, "debug", 1)

    def f(x):
        return sum(x[:, i] * (i + 1) for i in range(x.shape[1]))
    compiled = fg.compile(f)
    rng = np.random.default_rng(8)
    for b, t in ((4, 6), (3, 6), (4, 9), (5, 9), (2, 9), (7, 6)):
        x = fg.tensor(rng.standard_normal((b, t)).astype(np.float32))
        np.testing.assert_allclose(compiled(x).numpy(), f(x).numpy(), rtol=16 * EPS32,
                                   atol=16 * EPS32)
    # (4, 6) static, then a symbolic batch at each length: 6 and 9.
    assert compiled.compiles == 3
    assert "the new dims stay static, the earlier ones symbolic" in capsys.readouterr().err


def test_dynamic_true_narrowed_still_makes_a_changing_length_symbolic():
    # A conv checks its channel dim, so dynamic=True narrows to the leading dims; the
    # sequence length then compiled once per length.
    fg.manual_seed(0)
    conv = fg.nn.Conv1d(4, 5, 3, padding=1)
    f = fg.compile(lambda x: conv(x), dynamic=True)
    rng = np.random.default_rng(9)
    for t in (16, 9, 33, 12, 20):
        x = fg.tensor(rng.standard_normal((3, 4, t)).astype(np.float32))
        np.testing.assert_allclose(f(x).detach().numpy(), conv(x).detach().numpy(),
                                   rtol=64 * EPS32, atol=64 * EPS32)
    # 16 (leading dims symbolic), 9 (a second length), 33: the length symbolic from then on.
    assert f.compiles == 3


@pytest.mark.slow
@pytest.mark.parametrize("dynamic,compiles", [(True, 1), (None, 2)])
def test_batch_sizes_from_128_to_2_each_epoch_shorter_at_its_end(dynamic, compiles):
    """Batch sizes 128 down to 2, each epoch's last batch shorter (302 samples: 46, 2, 6,
    14...); then a batch of one, which compiles for itself (0/1 specialization)."""
    from fusegrad.utils.data import DataLoader, TensorDataset

    rng = np.random.default_rng(5)
    data = TensorDataset(fg.tensor(rng.standard_normal((302, 12)).astype(np.float32)),
                         fg.tensor(rng.integers(0, 10, 302)))
    eager_model = _mlp()
    model = copy.deepcopy(eager_model)
    step = fg.compile(_step_fn(model, fg.optim.SGD(model.parameters(), lr=0.05)),
                      dynamic=dynamic)
    eager_step = _step_fn(eager_model, fg.optim.SGD(eager_model.parameters(), lr=0.05))
    sizes = []
    for batch_size in (128, 100, 64, 37, 16, 5, 2):
        for x, y in DataLoader(data, batch_size=batch_size):
            sizes.append(len(x))
            loss, eager_loss = float(step(x, y)), float(eager_step(x, y))
            np.testing.assert_allclose(loss, eager_loss, rtol=256 * EPS32 * len(sizes))
    assert min(sizes) == 2 and len(set(sizes)) == 10
    assert step.compiles == compiles
    x, y = data[:1]
    step(x, y)
    assert step.compiles == compiles + 1


@pytest.mark.slow
@pytest.mark.parametrize("dynamic,compiles", [(True, 1), (None, 2)])
def test_char_transformer_at_sequence_lengths_8_to_128(dynamic, compiles):
    step, eager_step, _, _ = _lm_steps(_char_transformer(block=128), dynamic)
    rng = np.random.default_rng(2)
    lengths = [128, 8, 64, 100, 33, 128, 17, 9]
    for t in lengths:
        x, y = (fg.tensor(rng.integers(0, 20, (2, t))) for _ in range(2))
        loss, eager_loss = float(step(x, y)), float(eager_step(x, y))
        np.testing.assert_allclose(loss, eager_loss, rtol=1024 * EPS32 * len(lengths))
    assert step.compiles == compiles
    # One program for every length: no kernel (the fused attention's included) per length.
    program = step.entries()[-1].program
    assert program.builds == 1 and program.fallback is None
