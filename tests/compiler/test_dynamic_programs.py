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


def test_negative_indices_flip_and_roll_of_a_symbolic_dim():
    # x[-1] normalized the index with a modulo of the size, and flip/roll built numpy
    # indices of it: a symbolic size answers neither, so each size compiled static.
    def f(x):
        y = x.detach().requires_grad_()
        out = (y[-1] * 3 + y[:, -1].sum() + y[-2:].sum(0) + y.flip(0)[0] +
               y.roll(1, 0)[0] * y.roll(-3, 0)[-1])
        out.sum().backward()
        return out.detach(), y.grad
    compiled = fg.compile(f, dynamic=True)
    rng = np.random.default_rng(3)
    for n in (4, 7, 5):
        x = _randn(rng, n, 3)
        for got, want in zip(compiled(x), f(x)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=16 * EPS32,
                                       atol=16 * EPS32)
    assert compiled.compiles == 1 and compiled.entries()[0].symbolic is not None


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
    compiled = fg.compile(f, dynamic=True)
    rng = np.random.default_rng(4)
    for n in (4, 7, 5):
        x = _randn(rng, n, 3)
        for got, want in zip(compiled(x), f(x)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=16 * EPS32,
                                       atol=16 * EPS32)
    assert compiled.compiles == 1 and compiled.entries()[0].symbolic is not None
