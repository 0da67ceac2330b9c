"""Ordinary training and inference programs under symbolic dimensions: each one, called
with changing sizes, keeps one symbolic compile (torch's automatic dynamic: at most two
compiles per signature) and equals eager within float32 rounding, buffers and optimizer
state included."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import config as fg_config
from fusegrad.symint import COMPARE
from tests.compiler.test_dynamic_shapes import lm_sgd_step

EPS32 = float(np.finfo(np.float32).eps)
F = fg.nn.functional


@pytest.fixture(autouse=True)
def _automatic_dynamic(monkeypatch):
    monkeypatch.setattr(fg_config.config, "automatic_dynamic_shapes", True)


def _randn(rng, *shape):
    return fg.tensor(rng.standard_normal(shape).astype(np.float32))


def _bn_net():
    fg.manual_seed(0)
    return fg.nn.Sequential(fg.nn.Linear(6, 5), fg.nn.BatchNorm1d(5), fg.nn.ReLU(),
                            fg.nn.Linear(5, 3))


@pytest.mark.parametrize("dynamic,compiles", [(True, 1), (None, 2)])
def test_batchnorm_training_keeps_one_symbolic_compile(dynamic, compiles):
    # The running variance's Bessel factor n / (n - 1) of a symbolic batch is the graph's
    # arithmetic; as a Python division of sizes it sent every batch size to a compile.
    eager = _bn_net()
    model = copy.deepcopy(eager)

    def step_of(m):
        opt = fg.optim.SGD(m.parameters(), lr=0.1)

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            return loss
        return step
    step, eager_step = fg.compile(step_of(model), dynamic=dynamic), step_of(eager)
    rng = np.random.default_rng(0)
    for n in (8, 8, 5, 3, 7):
        x, y = _randn(rng, n, 6), fg.tensor(rng.integers(0, 3, n))
        np.testing.assert_allclose(float(step(x, y)), float(eager_step(x, y)),
                                   rtol=64 * EPS32, atol=64 * EPS32)
    for got, want in zip(list(model.parameters()) + list(model.buffers()),
                         list(eager.parameters()) + list(eager.buffers())):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(),
                                   rtol=256 * EPS32, atol=256 * EPS32)
    assert step.compiles == compiles
    assert step.entries()[-1].symbolic is not None


def test_cross_entropy_with_probabilities_is_symbolic():
    def f(x, p):
        return F.cross_entropy(x, p, label_smoothing=0.1)
    compiled = fg.compile(f, dynamic=None)
    rng = np.random.default_rng(1)
    for n in (4, 6, 9):
        x, p = _randn(rng, n, 5), F.softmax(_randn(rng, n, 5), -1)
        np.testing.assert_allclose(float(compiled(x, p)), float(f(x, p)), rtol=64 * EPS32)
    assert compiled.compiles == 2 and compiled.entries()[-1].symbolic is not None


def test_reshape_minus_one_beside_symbolic_sizes():
    def f(x):
        b, t, _ = x.shape
        return x.view(b, t, -1).sum(-1) + x.reshape(b * t, -1).sum(-1).view(b, t)
    compiled = fg.compile(f, dynamic=True)
    rng = np.random.default_rng(2)
    for b, t in ((3, 4), (2, 7), (5, 3)):
        x = _randn(rng, b, t, 6)
        np.testing.assert_allclose(compiled(x).numpy(), f(x).numpy(), rtol=16 * EPS32,
                                   atol=16 * EPS32)
    assert compiled.compiles == 1 and compiled.entries()[0].symbolic is not None


def _one_symbolic_compile_equals_eager(f, seed: int) -> None:
    """``f`` (outputs of a ``[n, 3]`` float32 argument) compiled with ``dynamic=True`` and
    called at n = 4, 7, 5 equals eager, from one symbolic compile."""
    compiled = fg.compile(f, dynamic=True)
    rng = np.random.default_rng(seed)
    for n in (4, 7, 5):
        x = _randn(rng, n, 3)
        for got, want in zip(compiled(x), f(x)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=16 * EPS32,
                                       atol=16 * EPS32)
    assert compiled.compiles == 1 and compiled.entries()[0].symbolic is not None


def test_negative_indices_flip_and_roll_of_a_symbolic_dim():
    # x[-1] normalized the index with a modulo of the size, and flip/roll built numpy
    # indices of it: a symbolic size answers neither, so each size compiled static.
    def f(x):
        y = x.detach().requires_grad_()
        out = (y[-1] * 3 + y[:, -1].sum() + y[-2:].sum(0) + y.flip(0)[0] +
               y.roll(1, 0)[0] * y.roll(-3, 0)[-1])
        out.sum().backward()
        return out.detach(), y.grad
    _one_symbolic_compile_equals_eager(f, seed=3)


def test_a_mask_made_inside_sliced_to_a_symbolic_length():
    # A slice of a tensor made inside the function to a symbolic length is a traced view
    # of a constant: it failed the symbolic trace (every length compiled static), and
    # x[n - 1] with a symbolic n was no valid index.
    def f(x):
        n = x.shape[0]
        causal = fg.triu(fg.ones(16, 16), diagonal=1)[:n, :n]
        buf = fg.zeros(16, 3)
        buf[:n].add_(x)
        return causal @ x + x[n - 1], buf.sum(0)
    _one_symbolic_compile_equals_eager(f, seed=4)


def _same_at_sizes(f, shapes, *, grad=False, marks=(0,)):
    """``f`` compiled once and called at ``shapes`` (dims ``marks`` marked dynamic) equals
    eager, gradients included with ``grad``; returns the compiled function."""
    compiled = fg.compile(f, fullgraph=True)
    rng = np.random.default_rng(5)
    for shape in shapes:
        data = rng.standard_normal(shape)
        x, y = fg.tensor(data), fg.tensor(data)
        if grad:
            x.requires_grad_(), y.requires_grad_()
        fg.mark_dynamic(x, list(marks))
        got, want = compiled(x), f(y)
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12,
                                   atol=1e-12)
        if grad:
            cot = fg.tensor(rng.standard_normal(tuple(want.shape)))
            (got * cot).sum().backward()
            (want * cot).sum().backward()
            np.testing.assert_allclose(x.grad.numpy(), y.grad.numpy(), rtol=1e-12, atol=1e-12)
    return compiled


def test_an_empty_slice_from_a_negative_start_stays_symbolic():
    # x[-2:0] starts at s0-2 and stops at 0: it is empty at every size, but the stop was
    # kept before the start and the slice rule rejected its bounds (each size static).
    compiled = _same_at_sizes(lambda x: x[-2:0] * 2 + x[:, :1].sum(), [(5, 3), (4, 3), (6, 3)])
    assert compiled.compiles == 1


def test_a_reshape_to_literal_sizes_guards_divisibility():
    # reshape(6, -1) of [s0, 3]: 3*s0 must divide by 6; that was undecidable, and the
    # function compiled static at every size. It is an assumption, guarded.
    compiled = _same_at_sizes(lambda x: x.reshape(6, -1).sin(), [(2, 3), (4, 3), (8, 3)])
    assert compiled.compiles == 1
    remainder = [e for e, op, v in compiled.entries()[0].symbolic.assumptions
                 if (op, v) == ("==", 0)]
    assert [e.evaluate({"s0": 4}) for e in remainder] == [0]
    assert [e.evaluate({"s0": 5}) for e in remainder] == [3]
    x = fg.ones(5, 3)
    fg.mark_dynamic(x, 0)
    with pytest.raises(RuntimeError, match=r"shape '\[6, -1\]' is invalid for input of size 15"):
        compiled(x)             # the guard fails; the trace at 5 raises eager's error


def test_backward_of_some_outputs_replays_guarded_comparisons():
    # Only the first output gets a gradient, so the backward is built at the first backward
    # call: its rules compare s0 with narrow's literal bound again, outside the trace.
    def f(x):
        return F.layer_norm(x, x.shape[-1:]) + x.narrow(0, 4, 1).sum(), x.narrow(0, 4, 1)
    compiled = fg.compile(f, fullgraph=True)
    for n in (7, 6, 8):
        x = fg.tensor(np.linspace(-1, 1, n * 3).reshape(n, 3)).requires_grad_()
        y = x.detach().requires_grad_()
        fg.mark_dynamic(x, 0)
        compiled(x)[0].sum().backward()
        f(y)[0].sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), y.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert compiled.compiles == 1


@pytest.mark.parametrize("f", [lambda x: x[0:0] * 3, lambda x: F.softmax(x.flatten(), 0)],
                         ids=["empty", "flattened"])
def test_a_backward_binds_its_sizes_from_a_forward_input(f):
    # The backward's saved values and cotangents had no bare s0 (a cotangent of [0, 2], a
    # saved f64[2*s0]): it could not bind s0, and the function compiled static.
    compiled = _same_at_sizes(f, [(5, 2), (3, 2), (6, 2)], grad=True)
    assert compiled.compiles == 1


def test_a_trace_that_fails_on_its_own_sizes_compiles_that_call_static():
    # x[1::3] is floor((s0+1)/3) long, 2 at s0 = 5, where it broadcasts with y's 2: the trace
    # answered floor((s0+1)/3) == 2 False, the where then failed, and symbolic tracing was
    # given up for every later size. Only this call's sizes are at fault: it compiles
    # static, and the next size is traced symbolic again.
    def f(x, y):
        return fg.where(x[1::3] > 0, x[1::3], y)
    compiled = fg.compile(f)
    rng = np.random.default_rng(6)
    y = _randn(rng, 2, 3)
    for n in (5, 6):
        x = _randn(rng, n, 3)
        fg.mark_dynamic(x, 0)
        np.testing.assert_array_equal(compiled(x, y).numpy(), f(x, y).numpy())
    assert compiled.compiles == 2 and compiled._symbolic_off is None


def test_a_backward_comparison_the_trace_did_not_make_holds_only_where_it_was_answered():
    # The VJP of the seeded output alone, built at the first backward, compares s0 with the
    # static 7 (s0 != 7), which the forward's trace never did and so does not guard: at
    # s0 = 7 the call gets the VJP of its own sizes.
    def f(x, w):
        return x.transpose(-3, -1), x @ w
    compiled = fg.compile(f, fullgraph=True)
    rng = np.random.default_rng(7)
    w_data = rng.standard_normal((7, 3))
    for n in (2, 7, 3):
        data = rng.standard_normal((1, n, n, 7))
        x, y = fg.tensor(data).requires_grad_(), fg.tensor(data).requires_grad_()
        w, v = fg.tensor(w_data).requires_grad_(), fg.tensor(w_data).requires_grad_()
        fg.mark_dynamic(x, [1, 2])
        compiled(x, w)[1].sum().backward()
        f(y, v)[1].sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), y.grad.numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), v.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert compiled.compiles == 1
    entry = compiled.entries()[0]
    new = [a for k, a in entry.backward.items() if k[0] == "assumed"]
    assert [[f"{e} {op} {v}" for e, op, v in a] for a in new] == [["s0 != 7"]]


def test_a_strided_slice_backward_does_not_guard_the_parity():
    # x[::2]'s VJP cut its interleaved gradient at min(2*ceil(s0/2), s0) and skipped a pad
    # of width 0: both compared sizes with the parity of s0, so odd and even sizes each
    # compiled their own graph.
    compiled = _same_at_sizes(lambda x: x[::2] * 3, [(4, 2), (5, 2), (7, 2), (6, 2)], grad=True)
    assert compiled.compiles == 1
    # What it still assumes (the last pad's width is not negative) holds at every size.
    sig = compiled.entries()[0].symbolic
    assert all(COMPARE[op](e.evaluate({"s0": n}), v) for e, op, v in sig.assumptions
               for n in range(2, 40))


def _char_transformer(block: int):
    import os
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(root, "examples"))
    try:
        from char_transformer import make_model
    finally:
        sys.path.pop(0)
    fg.manual_seed(0)
    return make_model(fg, vocab=20, block=block, n_embd=16, n_head=2, n_layer=1)




@pytest.mark.slow
def test_a_char_transformer_of_symbolic_batch_and_length_builds_nothing_at_a_new_length(
        monkeypatch):
    """Batch and sequence length symbolic: the fused attention's kernels read the length at
    run time, so after the first call no kernel or native loop is built (or loaded) at a
    new (batch, length), and the losses equal eager's within float32 rounding."""
    from fusegrad.runtime import jit, native_attention
    native = []
    forward = native_attention.attention_forward

    def counted(out, *args, **kwargs):
        native.append((out.shape[-2], forward(out, *args, **kwargs)))
        return native[-1][1]
    monkeypatch.setattr(native_attention, "attention_forward", counted)
    model = _char_transformer(64)
    reference = copy.deepcopy(model)
    compiled, eager = fg.compile(lm_sgd_step(model), dynamic=True), lm_sgd_step(reference)
    rng = np.random.default_rng(0)
    built = []
    for n, t in ((3, 8), (5, 20), (4, 64)):
        x, y = (fg.tensor(rng.integers(0, 20, (n, t))) for _ in range(2))
        before = jit.stats["compiles"] + jit.stats["disk_hits"]
        got = compiled(x, y).item()
        built.append(jit.stats["compiles"] + jit.stats["disk_hits"] - before)
        # Sums of a few dozen float32 terms per value, through one block and SGD steps.
        np.testing.assert_allclose(got, eager(x, y).item(), rtol=1024 * EPS32 * len(built))
    assert built[1:] == [0, 0] and compiled.compiles == 1
    assert native == [(8, True), (20, True), (64, True)]        # the fused attention ran
