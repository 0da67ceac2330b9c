"""Adafactor, Muon and SparseAdam: numpy references of torch's update formulas
(torch/optim/_adafactor.py, _muon.py, sparse_adam.py), torch itself where present, and the
same steps traced into a compiled training step.

The problem is a small two-layer model (a tanh hidden layer and a quadratic loss) with a
vector and a 3-D parameter added for Adafactor's unfactored and batched paths; torch and
fusegrad run the same code on it (their tensor APIs agree).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import fusegrad
from fusegrad import nn, optim
from fusegrad.optim.muon import zeropower_via_newtonschulz
from tests.drift import assert_no_farther_than_eager

RNG = np.random.default_rng(0)
X = RNG.standard_normal((8, 3))
Y = RNG.standard_normal((8, 2))
C3 = RNG.uniform(0.5, 2.0, (2, 3, 4))
INIT = {"w1": RNG.standard_normal((5, 3)), "b1": RNG.standard_normal(5),
        "w2": RNG.standard_normal((2, 5)), "p3": RNG.standard_normal((2, 3, 4))}
MATRICES = ("w1", "w2")
STEPS = 20
BF16_EPS = 2.0 ** -8


def make_params(lib, names, dtype):
    """Leaf tensors of ``lib`` (fusegrad or torch) holding ``INIT[name]``."""
    return {n: lib.tensor(INIT[n], dtype=dtype, requires_grad=True) for n in names}


def loss_of(lib, ps, dtype):
    x, y = lib.tensor(X, dtype=dtype), lib.tensor(Y, dtype=dtype)
    h = x @ ps["w1"].T
    if "b1" in ps:
        h = h + ps["b1"]
    loss = ((h.tanh() @ ps["w2"].T - y) ** 2).mean()
    if "p3" in ps:
        loss = loss + (lib.tensor(C3, dtype=dtype) * ps["p3"] ** 2).sum()
    return loss


def train(lib, opt_name, names, groups=None, steps=STEPS, dtype=None, opt=None, ps=None,
          **kw):
    """``steps`` steps of ``lib.optim.<opt_name>``; returns the parameters and optimizer.
    ``groups`` maps a group's keyword overrides to its parameter names."""
    dtype = lib.float64 if dtype is None else dtype
    ps = make_params(lib, names, dtype) if ps is None else ps
    if opt is None:
        params = ([dict(params=[ps[n] for n in group_names], **over)
                   for group_names, over in groups] if groups else list(ps.values()))
        opt = getattr(lib.optim, opt_name)(params, **kw)
    for _ in range(steps):
        opt.zero_grad()
        loss_of(lib, ps, dtype).backward()
        opt.step()
    return ps, opt


def arrays(ps):
    return {n: p.detach().numpy().astype(np.float64) for n, p in ps.items()}


# --------------------------------------------------------------------------- numpy references


def np_loss_grads(ps):
    """The gradients of ``loss_of`` at ``ps`` (float64), by hand."""
    h = X @ ps["w1"].T + (ps["b1"] if "b1" in ps else 0)
    t = np.tanh(h)
    r = 2 * (t @ ps["w2"].T - Y) / Y.size
    dh = (r @ ps["w2"]) * (1 - t * t)
    grads = {"w1": dh.T @ X, "w2": r.T @ t}
    if "b1" in ps:
        grads["b1"] = dh.sum(0)
    if "p3" in ps:
        grads["p3"] = 2 * C3 * ps["p3"]
    return grads


def np_lerp(start, end, w):
    return start + w * (end - start) if abs(w) < 0.5 else end - (end - start) * (1 - w)


def np_adafactor(names, steps=STEPS, lr=1e-2, beta2_decay=-0.8, eps=(None, 1e-3), d=1.0,
                 weight_decay=0.0, maximize=False):
    ps = {n: INIT[n].copy() for n in names}
    eps1 = np.finfo(np.float64).eps if eps[0] is None else eps[0]
    state = {n: (np.zeros(p.shape[:-1] + (1,)), np.zeros(p.shape[:-2] + (1, p.shape[-1])))
             if p.ndim > 1 else np.zeros_like(p) for n, p in ps.items()}
    for t in range(1, steps + 1):
        for n, g in np_loss_grads(ps).items():
            g = -g if maximize else g
            p = ps[n]
            beta = t ** beta2_decay
            alpha = max(eps[1], np.sqrt(np.mean(p * p))) * min(lr, 1 / np.sqrt(t))
            p = p * (1 - lr * weight_decay)
            if p.ndim > 1:
                row, col = state[n]
                row = np_lerp(row, np.mean(g * g, axis=-1, keepdims=True), beta)
                col = np_lerp(col, np.mean(g * g, axis=-2, keepdims=True), beta)
                state[n] = row, col
                v = row @ col / np.maximum(row.mean(axis=-2, keepdims=True), eps1)
            else:
                v = state[n] = np_lerp(state[n], g * g, beta)
            u = g / np.sqrt(np.maximum(v, eps1 * eps1))
            ps[n] = p - alpha / max(1.0, np.sqrt(np.mean(u * u)) / d) * u
    return ps


def np_newton_schulz(g, coefficients=(3.4445, -4.775, 2.0315), steps=5):
    """The quintic Newton-Schulz iteration in float64 (torch runs it in bfloat16)."""
    a, b, c = coefficients
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / np.linalg.norm(x)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if g.shape[0] > g.shape[1] else x


def np_muon(steps=STEPS, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
            adjust_lr_fn=None, orthogonalize=np_newton_schulz):
    ps = {n: INIT[n].copy() for n in MATRICES}
    bufs = {n: np.zeros_like(p) for n, p in ps.items()}
    for _ in range(steps):
        for n, g in np_loss_grads(ps).items():
            bufs[n] = np_lerp(bufs[n], g, 1 - momentum)
            update = orthogonalize(np_lerp(g, bufs[n], momentum) if nesterov else bufs[n])
            rows, cols = g.shape
            ratio = (0.2 * np.sqrt(max(rows, cols)) if adjust_lr_fn == "match_rms_adamw"
                     else np.sqrt(max(1, rows / cols)))
            ps[n] = ps[n] * (1 - lr * weight_decay) - lr * ratio * update
    return ps


ADAFACTOR_CONFIGS = [
    {},
    {"lr": 0.05, "weight_decay": 0.1, "maximize": True},
    {"eps": (1e-4, 1e-2), "d": 1.5, "beta2_decay": -0.5},
]


@pytest.mark.parametrize("config", ADAFACTOR_CONFIGS, ids=str)
def test_adafactor_matches_numpy_reference(config):
    ps, _ = train(fusegrad, "Adafactor", INIT, **config)
    expected = np_adafactor(INIT, **config)
    for n, p in arrays(ps).items():
        np.testing.assert_allclose(p, expected[n], rtol=1e-10, atol=1e-12, err_msg=n)


def test_adafactor_state_is_factored_for_matrices():
    ps, opt = train(fusegrad, "Adafactor", INIT, steps=1)
    assert sorted(opt.state[ps["w1"]]) == ["col_var", "row_var", "step"]
    assert opt.state[ps["w1"]]["row_var"].shape == (5, 1)
    assert opt.state[ps["w1"]]["col_var"].shape == (1, 3)
    assert opt.state[ps["p3"]]["row_var"].shape == (2, 3, 1)
    assert opt.state[ps["p3"]]["col_var"].shape == (2, 1, 4)
    assert sorted(opt.state[ps["b1"]]) == ["step", "variance"]
    assert opt.state[ps["b1"]]["step"].dtype is fusegrad.float32
    assert float(opt.state[ps["b1"]]["step"]) == 1.0


def test_muon_update_around_the_iteration_matches_numpy_reference():
    """Momentum, Nesterov, weight decay and the lr adjustment exactly, with the bfloat16
    iteration itself taken from fusegrad (tested below against float64)."""
    def orthogonalize(u):
        return zeropower_via_newtonschulz(fusegrad.tensor(u), (3.4445, -4.775, 2.0315), 5,
                                          1e-7).double().numpy()
    for config in ({}, {"nesterov": False, "adjust_lr_fn": "match_rms_adamw", "lr": 0.02,
                        "momentum": 0.5, "weight_decay": 0.0}):
        ps, _ = train(fusegrad, "Muon", MATRICES, **config)
        expected = np_muon(orthogonalize=orthogonalize, **config)
        for n, p in arrays(ps).items():
            np.testing.assert_allclose(p, expected[n], rtol=1e-12, atol=1e-14, err_msg=n)


@pytest.mark.parametrize("shape", [(5, 3), (3, 6), (4, 4)])
def test_newton_schulz_is_the_float64_iteration_in_bfloat16(shape):
    g = np.random.default_rng(1).standard_normal(shape)
    got = zeropower_via_newtonschulz(fusegrad.tensor(g, dtype=fusegrad.float32),
                                     (3.4445, -4.775, 2.0315), 5, 1e-7)
    assert got.dtype is fusegrad.bfloat16 and got.shape == shape
    exact = np_newton_schulz(g)
    # five steps of a polynomial with coefficients up to 4.8 amplify bfloat16 rounding: a
    # few dozen bfloat16 ulps of the largest entry bound it
    np.testing.assert_allclose(got.double().numpy(), exact, atol=40 * BF16_EPS)
    # and it orthogonalizes: the singular vectors are the input's, the singular values
    # near 1 (between 0.5 and 1.5 by the choice of coefficients)
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    s = np.diag(u.T @ got.double().numpy() @ vt.T)
    assert np.all((s > 0.5) & (s < 1.5))


def test_muon_state_layout():
    ps, opt = train(fusegrad, "Muon", MATRICES, steps=1)
    assert sorted(opt.state[ps["w1"]]) == ["momentum_buffer"]
    assert opt.state_dict()["param_groups"][0]["ns_coefficients"] == (3.4445, -4.775, 2.0315)


def test_muon_refuses_parameters_that_are_not_matrices():
    with pytest.raises(ValueError) as err:
        optim.Muon([nn.Parameter(fusegrad.zeros(3, 2)), nn.Parameter(fusegrad.zeros(3))])
    assert str(err.value) == ("Muon only supports 2D parameters whereas we found a parameter "
                              "with size: torch.Size([3])")


def test_muon_step_errors():
    p = nn.Parameter(fusegrad.ones(2, 2))
    p.grad = fusegrad.ones(2, 2)
    for kw, message in (({"ns_steps": 100}, "Number of steps must be less than 100 for "
                                           "computational efficiency"),
                        ({"ns_coefficients": (1.0, 2.0)},
                         "Coefficients must be a tuple of exactly 3 values")):
        with pytest.raises(ValueError, match=message):
            optim.Muon([p], **kw).step()


def test_constructor_errors_match_torch():
    p = [nn.Parameter(fusegrad.zeros(2, 2))]
    cases = [
        (lambda: optim.Adafactor(p, lr=-1), "Learning rate should be >= 0 but is: -1"),
        (lambda: optim.Adafactor(p, beta2_decay=0.5), "beta2_decay should be <= 0 but is: 0.5"),
        (lambda: optim.Adafactor(p, eps=(-1, 1e-3)), "epsilon1 should be >= 0 but is: -1"),
        (lambda: optim.Adafactor(p, eps=(None, -1)), "epsilon2 should be >= 0 but is: -1"),
        (lambda: optim.Adafactor(p, d=0.5), "Clipping threshold d should be >= 1 but is: 0.5"),
        (lambda: optim.Adafactor(p, weight_decay=-1), "weight_decay should be >= 0 but is: -1"),
        (lambda: optim.Adafactor(p, lr=fusegrad.zeros(2)), "Tensor lr must be 1-element"),
        (lambda: optim.Muon(p, lr=-1), "Learning rate should be >= 0 but is: -1"),
        (lambda: optim.Muon(p, momentum=-1), "momentum should be >= 0 but is: -1"),
        (lambda: optim.Muon(p, weight_decay=-1), "weight decay should be >= 0 but is: -1"),
        (lambda: optim.Muon(p, adjust_lr_fn="x"), "Adjust learning rate function x is not "
                                                  "supported"),
        (lambda: optim.SparseAdam(p, lr=0), "Invalid learning rate: 0"),
        (lambda: optim.SparseAdam(p, eps=0), "Invalid epsilon value: 0"),
        (lambda: optim.SparseAdam(p, betas=(1.0, 0.9)), "Invalid beta parameter at index 0: 1.0"),
        (lambda: optim.SparseAdam(p, betas=(0.9, -1)), "Invalid beta parameter at index 1: -1"),
        (lambda: optim.SparseAdam([nn.Parameter(fusegrad.zeros(2)),
                                   nn.Parameter(fusegrad.zeros(2, dtype=fusegrad.complex64))]),
         "Complex params at indices [[0, 1]]: SparseAdam does not support complex parameters"),
    ]
    for make, message in cases:
        with pytest.raises(ValueError) as err:
            make()
        assert str(err.value) == message


def test_sparse_adam_refuses_dense_gradients():
    p = nn.Parameter(fusegrad.ones(3))
    opt = optim.SparseAdam([p])
    assert opt.step(lambda: 1.0) == 1.0          # no gradient yet: nothing to do
    assert opt.state_dict() == {"state": {}, "param_groups": [
        {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "maximize": False, "params": [0]}]}
    (p * p).sum().backward()
    with pytest.raises(RuntimeError, match="^SparseAdam does not support dense gradients, "
                                           "please consider Adam instead$"):
        opt.step()
    np.testing.assert_array_equal(p.detach().numpy(), np.ones(3))


@pytest.mark.parametrize("name,names,kw", [
    ("Adafactor", tuple(INIT), {"lr": 0.05, "weight_decay": 0.01}),
    ("Muon", MATRICES, {"lr": 0.02}),
])
def test_load_state_dict_resumes_exactly(name, names, kw):
    ps, opt = train(fusegrad, name, names, steps=4, **kw)
    saved = copy.deepcopy(opt.state_dict())   # its tensors are the live state, as torch's
    train(fusegrad, name, names, steps=3, opt=opt, ps=ps)
    expected = arrays(ps)
    # the same 4 steps again, then a new optimizer given the saved state
    ps2, _ = train(fusegrad, name, names, steps=4, **kw)
    opt2 = getattr(optim, name)(list(ps2.values()), **kw)
    opt2.load_state_dict(saved)
    train(fusegrad, name, names, steps=3, opt=opt2, ps=ps2)
    for n, p in arrays(ps2).items():
        np.testing.assert_array_equal(p, expected[n])


@pytest.mark.parametrize("name,names", [("Adafactor", tuple(INIT)), ("Muon", MATRICES)])
def test_a_tensor_lr_is_read_as_its_value(name, names):
    """As torch's ``_to_scalar``: a 0-d float32 lr steps as the Python float it holds."""
    ps, _ = train(fusegrad, name, names, steps=3, lr=fusegrad.tensor(0.05), weight_decay=0.1)
    expected, _ = train(fusegrad, name, names, steps=3, lr=float(np.float32(0.05)),
                        weight_decay=0.1)
    for n, p in arrays(ps).items():
        np.testing.assert_array_equal(p, arrays(expected)[n])


# --------------------------------------------------------------------------- compiled steps


def compiled_run(name, names, compiled, dtype, **kw):
    ps = make_params(fusegrad, names, dtype)
    opt = getattr(optim, name)(list(ps.values()), **kw)

    def step():
        opt.zero_grad()
        loss = loss_of(fusegrad, ps, dtype)
        loss.backward()
        opt.step()
        return loss
    f = fusegrad.compile(step, fullgraph=True) if compiled else step
    losses = [float(f()) for _ in range(STEPS)]
    return losses, list(ps.values()), opt, f


@pytest.mark.slow
@pytest.mark.parametrize("name,names,kw", [
    ("Adafactor", tuple(INIT), {"lr": 0.05, "weight_decay": 0.01}),
    ("Adafactor", ("w1", "b1", "w2"), {"maximize": False, "eps": (1e-3, 1e-3), "d": 1.2}),
    ("Muon", MATRICES, {"lr": 0.02, "weight_decay": 0.01}),
])
def test_compiled_training_step_equals_eager(name, names, kw):
    """20 compiled steps land within float32 rounding of the eager steps: no farther from a
    float64 run than eager's float32 run is (tests/drift.py)."""
    le, pe, oe, _ = compiled_run(name, names, False, fusegrad.float32, **kw)
    lc, pc, oc, f = compiled_run(name, names, True, fusegrad.float32, **kw)
    lx, px, _, _ = compiled_run(name, names, False, fusegrad.float64, **kw)
    assert le[-1] < le[0]
    assert_no_farther_than_eager(lc, le, lx, what="loss")
    assert_no_farther_than_eager(pc, pe, px, what="parameter")
    for a, b in zip(pe, pc, strict=True):
        se, sc = oe.state[a], oc.state[b]
        assert sorted(se) == sorted(sc)
        for k in se:
            assert sc[k].dtype is se[k].dtype and sc[k].shape == se[k].shape
            np.testing.assert_allclose(sc[k].numpy(), se[k].numpy(), rtol=1e-4, atol=1e-6)
    assert f.compiles == 2          # the first step (which makes the state), then the rest


@pytest.mark.slow
@pytest.mark.parametrize("name,names", [("Adafactor", tuple(INIT)), ("Muon", MATRICES)])
def test_compiled_step_reads_a_scheduled_lr_at_each_call(name, names):
    """A scheduler's lr reaches the compiled step as an input: no recompile, eager's steps."""
    def run(compiled, dtype=fusegrad.float32):
        ps = make_params(fusegrad, names, dtype)
        opt = getattr(optim, name)(list(ps.values()), lr=0.05, weight_decay=0.1)
        schedule = optim.lr_scheduler.StepLR(opt, 2, gamma=0.5)

        def step():
            opt.zero_grad()
            loss_of(fusegrad, ps, dtype).backward()
            opt.step()
        f = fusegrad.compile(step, fullgraph=True) if compiled else step
        for _ in range(8):
            f()
            schedule.step()
        return list(ps.values()), f
    (pe, _), (pc, f), (px, _) = run(False), run(True), run(False, fusegrad.float64)
    assert f.compiles == 2
    assert_no_farther_than_eager(pc, pe, px, what="parameter")


# --------------------------------------------------------------------------- torch, if present


TORCH_CASES = [
    ("Adafactor", tuple(INIT), None, {}),
    ("Adafactor", tuple(INIT), None, {"lr": 0.05, "weight_decay": 0.1, "maximize": True,
                                      "eps": (1e-5, 1e-3), "d": 1.5}),
    ("Adafactor", tuple(INIT), [(("w1", "b1"), {"lr": 0.1}), (("w2", "p3"), {"weight_decay": 0.2})],
     {"lr": 0.02}),
    ("Muon", MATRICES, None, {}),
    ("Muon", MATRICES, None, {"lr": 0.02, "nesterov": False, "adjust_lr_fn": "match_rms_adamw",
                              "momentum": 0.9, "weight_decay": 0.01}),
    ("Muon", MATRICES, [(("w1",), {"lr": 0.05}), (("w2",), {"weight_decay": 0.0})],
     {"lr": 0.01, "adjust_lr_fn": "original"}),
]


def torch_tolerance(name, kw):
    """float64 runs: Adafactor agrees to rounding. Muon's bfloat16 iteration rounds each
    update to 2**-8 relative, and a last-bit difference in a float64 gradient may round an
    entry the other way: a few such flips over the run, each an lr-sized step times 2**-8."""
    if name == "Adafactor":
        return {"rtol": 1e-10, "atol": 1e-12}
    return {"rtol": 0, "atol": STEPS * 0.05 * 4 * BF16_EPS}


@pytest.mark.parametrize("name,names,groups,kw", TORCH_CASES)
def test_matches_torch(name, names, groups, kw):
    torch = pytest.importorskip("torch")
    pt, _ = train(torch, name, names, groups, **kw)
    pf, _ = train(fusegrad, name, names, groups, **kw)
    expected = arrays(pt)
    for n, p in arrays(pf).items():
        np.testing.assert_allclose(p, expected[n], err_msg=n, **torch_tolerance(name, kw))


@pytest.mark.parametrize("name,names,kw", [
    ("Adafactor", tuple(INIT), {"weight_decay": 0.1}),
    ("Muon", MATRICES, {"lr": 0.02}),
])
def test_state_dict_moves_between_torch_and_fusegrad(name, names, kw):
    """torch's state_dict (its keys, its tensors) loads into fusegrad's optimizer, which
    then continues as torch does; fusegrad's, converted to torch tensors, loads into
    torch's."""
    torch = pytest.importorskip("torch")
    pt, ot = train(torch, name, names, steps=5, **kw)
    pf, of = train(fusegrad, name, names, steps=5, **kw)
    saved_t, saved_f = ot.state_dict(), of.state_dict()
    assert saved_t["param_groups"] == saved_f["param_groups"]
    for i, s in saved_t["state"].items():
        assert sorted(s) == sorted(saved_f["state"][i])
    # fusegrad continues from torch's state (and torch's parameters)
    for n in names:
        with fusegrad.no_grad():
            pf[n].copy_(fusegrad.tensor(pt[n].detach().numpy()))
    of.load_state_dict(saved_t)
    train(fusegrad, name, names, steps=5, opt=of, ps=pf)
    # torch continues from fusegrad's state
    pt2, ot2 = train(torch, name, names, steps=0, **kw)
    with torch.no_grad():
        for n in names:
            pt2[n].copy_(pt[n])
    ot2.load_state_dict({"param_groups": saved_f["param_groups"], "state": {
        i: {k: torch.tensor(v.numpy()) for k, v in s.items()}
        for i, s in saved_f["state"].items()}})
    train(torch, name, names, steps=5, opt=ot2, ps=pt2)
    train(torch, name, names, steps=5, opt=ot, ps=pt)
    expected = arrays(pt)
    for got in (arrays(pf), arrays(pt2)):
        for n, p in got.items():
            np.testing.assert_allclose(p, expected[n], err_msg=n, **torch_tolerance(name, kw))


def test_sparse_adam_messages_are_torchs():
    torch = pytest.importorskip("torch")
    messages = []
    for lib in (torch, fusegrad):
        p = lib.ones(3, requires_grad=True)
        opt = lib.optim.SparseAdam([p])
        (p * p).sum().backward()
        with pytest.raises(RuntimeError) as err:
            opt.step()
        messages.append(str(err.value))
        for kw in ({"lr": -1}, {"eps": 0.0}, {"betas": (0.5, 1.0)}):
            with pytest.raises(ValueError) as err:
                lib.optim.SparseAdam([p], **kw)
            messages.append(str(err.value))
    assert messages[:4] == messages[4:]
