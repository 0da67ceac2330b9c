"""torch.optim.LBFGS: convergence on problems with known minima (float64), agreement with
torch's iterations where torch is installed, torch's argument errors, and state_dict."""

import numpy as np
import pytest

import fusegrad as fg


def _quadratic(dtype=fg.float64, n=6, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    a = m @ m.T + n * np.eye(n)                   # symmetric positive definite
    b = rng.standard_normal(n)
    return fg.tensor(a, dtype=dtype), fg.tensor(b, dtype=dtype), np.linalg.solve(a, b)


@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
def test_minimizes_a_quadratic_to_its_solution(line_search_fn):
    a, b, want = _quadratic()
    x = fg.zeros(6, dtype=fg.float64, requires_grad=True)
    opt = fg.optim.LBFGS([x], lr=1 if line_search_fn else 0.2, max_iter=200,
                         line_search_fn=line_search_fn, tolerance_grad=1e-12,
                         tolerance_change=1e-15)

    def closure():
        opt.zero_grad()
        loss = 0.5 * (x @ (a @ x)) - b @ x
        loss.backward()
        return loss
    for _ in range(3):
        opt.step(closure)
    np.testing.assert_allclose(x.detach().numpy(), want, rtol=1e-6)


def test_strong_wolfe_finds_the_rosenbrock_minimum():
    xy = fg.tensor([-1.5, 2.0], dtype=fg.float64, requires_grad=True)
    opt = fg.optim.LBFGS([xy], lr=1, max_iter=500, line_search_fn="strong_wolfe",
                         tolerance_grad=1e-10, tolerance_change=1e-14)

    def closure():
        opt.zero_grad()
        loss = (1 - xy[0]) ** 2 + 100 * (xy[1] - xy[0] ** 2) ** 2
        loss.backward()
        return loss
    first = opt.step(closure)
    assert float(first) == pytest.approx(2.5 ** 2 + 100 * (2.0 - 2.25) ** 2)
    np.testing.assert_allclose(xy.detach().numpy(), [1.0, 1.0], atol=1e-6)
    state = opt.state[xy]
    assert 0 < state["n_iter"] <= 500 and state["func_evals"] >= state["n_iter"]


def test_history_is_bounded_by_history_size():
    a, b, _ = _quadratic(n=12)
    x = fg.zeros(12, dtype=fg.float64, requires_grad=True)
    opt = fg.optim.LBFGS([x], history_size=3, max_iter=10, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = 0.5 * (x @ (a @ x)) - b @ x
        loss.backward()
        return loss
    opt.step(closure)
    assert len(opt.state[x]["old_dirs"]) == 3 and len(opt.state[x]["ro"]) == 3


def test_state_dict_round_trip_continues_the_same_iterations():
    a, b, _ = _quadratic(n=8, seed=1)

    def make():
        x = fg.zeros(8, dtype=fg.float64, requires_grad=True)
        opt = fg.optim.LBFGS([x], max_iter=3, history_size=5)

        def closure():
            opt.zero_grad()
            loss = 0.5 * (x @ (a @ x)) - b @ x
            loss.backward()
            return loss
        return x, opt, closure
    x1, opt1, c1 = make()
    for _ in range(4):
        opt1.step(c1)
    x2, opt2, c2 = make()
    for _ in range(2):
        opt2.step(c2)
    saved = opt2.state_dict()
    x3, opt3, c3 = make()
    with fg.no_grad():
        x3.copy_(x2)
    opt3.load_state_dict(saved)
    for _ in range(2):
        opt3.step(c3)
    np.testing.assert_array_equal(x3.detach().numpy(), x1.detach().numpy())


def test_argument_errors_as_torch():
    p = fg.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        fg.optim.LBFGS([p], lr=-1)
    with pytest.raises(ValueError, match="LBFGS doesn't support per-parameter options"):
        fg.optim.LBFGS([{"params": [p]}, {"params": [fg.zeros(2, requires_grad=True)]}])
    opt = fg.optim.LBFGS([p], line_search_fn="backtracking")
    with pytest.raises(RuntimeError, match="only 'strong_wolfe' is supported"):
        opt.step(lambda: (p * p).sum())
    assert fg.optim.LBFGS([p], max_iter=8).defaults["max_eval"] == 10


@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
@pytest.mark.parametrize("history_size", [100, 2])
def test_iterations_follow_torch(line_search_fn, history_size):
    torch = pytest.importorskip("torch")

    def run(lib, max_iter):
        rng = np.random.default_rng(0)
        x = lib.tensor(rng.standard_normal((64, 5)).astype(np.float32))
        y = lib.tensor(rng.standard_normal((64, 1)).astype(np.float32))
        w1 = lib.tensor(rng.standard_normal((5, 8)).astype(np.float32) * 0.5, requires_grad=True)
        w2 = lib.tensor(rng.standard_normal((8, 1)).astype(np.float32) * 0.5, requires_grad=True)
        opt = lib.optim.LBFGS([w1, w2], line_search_fn=line_search_fn,
                              history_size=history_size, max_iter=max_iter)

        def closure():
            opt.zero_grad()
            loss = ((x @ w1).tanh() @ w2 - y).pow(2).mean()
            loss.backward()
            return loss
        loss = float(opt.step(closure).detach())
        state = opt.state[w1]
        return loss, w1.detach().numpy(), state["func_evals"], state["n_iter"]
    for max_iter in (1, 3, 6):
        want, got = run(torch, max_iter), run(fg, max_iter)
        assert got[0] == pytest.approx(want[0], rel=1e-6)
        assert got[2:] == want[2:]
        # a few iterations of float32 rounding (different summation orders), not more
        np.testing.assert_allclose(got[1], want[1], atol=64 * max_iter * np.finfo(np.float32).eps)
