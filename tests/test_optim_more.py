"""RMSprop, Adagrad, Adamax, NAdam, RAdam, Adadelta, Rprop and ASGD against numpy
implementations of torch's update formulas (torch/optim/*.py, single-tensor path), on the fixed
quadratic of test_optim.

Each reference follows torch's order of operations, so float64 results agree to rounding.
The float32 scalars torch keeps in state (``step``, NAdam's ``mu_product``, ASGD's ``eta`` and
``mu``) are float32 here too, and so in the references.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

import fusegrad
from fusegrad import nn, optim
from tests.test_optim import P0, assert_params, make_params, np_grads, np_lerp, quadratic_loss, run

STEPS = 8


def np_rmsprop(steps, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
               centered=False, maximize=False):
    ps = [p.copy() for p in P0]
    sq = [np.zeros_like(p) for p in ps]
    gavg = [np.zeros_like(p) for p in ps]
    buf = [np.zeros_like(p) for p in ps]
    for _ in range(steps):
        for i, g in enumerate(np_grads(ps)):
            g = -g if maximize else g
            if weight_decay:
                g = g + weight_decay * ps[i]
            sq[i] = sq[i] * alpha + (1 - alpha) * g * g
            if centered:
                gavg[i] = np_lerp(gavg[i], g, 1 - alpha)
                avg = np.sqrt(sq[i] - gavg[i] * gavg[i]) + eps
            else:
                avg = np.sqrt(sq[i]) + eps
            if momentum > 0:
                buf[i] = buf[i] * momentum + g / avg
                ps[i] = ps[i] - lr * buf[i]
            else:
                ps[i] = ps[i] + (-lr * g) / avg
    return ps


def np_adagrad(steps, lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0,
               eps=1e-10, maximize=False):
    ps = [p.copy() for p in P0]
    sums = [np.full_like(p, initial_accumulator_value) for p in ps]
    for t in range(1, steps + 1):
        for i, g in enumerate(np_grads(ps)):
            g = -g if maximize else g
            if weight_decay:
                g = g + weight_decay * ps[i]
            clr = lr / (1 + (t - 1) * lr_decay)
            sums[i] = sums[i] + g * g
            ps[i] = ps[i] + (-clr * g) / (np.sqrt(sums[i]) + eps)
    return ps


def np_adamax(steps, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, maximize=False):
    b1, b2 = betas
    ps = [p.copy() for p in P0]
    m = [np.zeros_like(p) for p in ps]
    u = [np.zeros_like(p) for p in ps]
    for t in range(1, steps + 1):
        for i, g in enumerate(np_grads(ps)):
            g = -g if maximize else g
            if weight_decay:
                g = g + weight_decay * ps[i]
            m[i] = np_lerp(m[i], g, 1 - b1)
            u[i] = np.maximum(u[i] * b2, np.abs(g) + eps)
            clr = lr / (1 - b1 ** t)
            ps[i] = ps[i] + (-clr * m[i]) / u[i]
    return ps


def np_nadam(steps, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
             momentum_decay=4e-3, decoupled_weight_decay=False, maximize=False):
    b1, b2 = betas
    ps = [p.copy() for p in P0]
    m = [np.zeros_like(p) for p in ps]
    v = [np.zeros_like(p) for p in ps]
    mu_product = [np.float32(1.0) for _ in ps]
    for t in range(1, steps + 1):
        for i, g in enumerate(np_grads(ps)):
            g = -g if maximize else g
            if weight_decay:
                if decoupled_weight_decay:
                    ps[i] = ps[i] * (1 - lr * weight_decay)
                else:
                    g = g + weight_decay * ps[i]
            mu = b1 * (1.0 - 0.5 * 0.96 ** (t * momentum_decay))
            mu_next = b1 * (1.0 - 0.5 * 0.96 ** ((t + 1) * momentum_decay))
            # torch keeps mu_product in a float32 scalar tensor.
            mu_product[i] = np.float32(mu_product[i] * np.float32(mu))
            prod = float(mu_product[i])
            m[i] = np_lerp(m[i], g, 1 - b1)
            v[i] = v[i] * b2 + (1 - b2) * g * g
            denom = np.sqrt(v[i] / (1 - b2 ** t)) + eps
            ps[i] = ps[i] + (-lr * (1.0 - mu) / (1.0 - prod)) * g / denom
            ps[i] = ps[i] + ((-lr * mu_next) / (1.0 - prod * mu_next)) * m[i] / denom
    return ps


def np_radam(steps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
             decoupled_weight_decay=False, maximize=False):
    b1, b2 = betas
    ps = [p.copy() for p in P0]
    m = [np.zeros_like(p) for p in ps]
    v = [np.zeros_like(p) for p in ps]
    rho_inf = 2 / (1 - b2) - 1
    for t in range(1, steps + 1):
        for i, g in enumerate(np_grads(ps)):
            g = -g if maximize else g
            if weight_decay:
                if decoupled_weight_decay:
                    ps[i] = ps[i] * (1 - lr * weight_decay)
                else:
                    g = g + weight_decay * ps[i]
            m[i] = np_lerp(m[i], g, 1 - b1)
            v[i] = v[i] * b2 + (1 - b2) * g * g
            bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
            corrected = m[i] / bc1
            rho_t = rho_inf - 2 * t * b2 ** t / bc2
            if rho_t > 5.0:
                rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf
                                 / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
                adaptive = math.sqrt(bc2) / (np.sqrt(v[i]) + eps)
                ps[i] = ps[i] - corrected * lr * adaptive * rect
            else:
                ps[i] = ps[i] - corrected * lr
    return ps


def np_adadelta(steps, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, maximize=False, foreach=None):
    ps = [p.copy() for p in P0]
    v = [np.zeros_like(p) for p in ps]
    u = [np.zeros_like(p) for p in ps]
    for _ in range(steps):
        for i, g in enumerate(np_grads(ps)):
            g = -g if maximize else g
            if weight_decay:
                g = g + weight_decay * ps[i]
            v[i] = v[i] * rho + (1 - rho) * g * g
            delta = np.sqrt(u[i] + eps) / np.sqrt(v[i] + eps) * g
            u[i] = u[i] * rho + (1 - rho) * delta * delta
            ps[i] = ps[i] + delta * -lr
    return ps


def np_rprop(steps, lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), maximize=False,
             foreach=None):
    etaminus, etaplus = etas
    ps = [p.copy() for p in P0]
    prev = [np.zeros_like(p) for p in ps]
    size = [np.full_like(p, lr) for p in ps]
    for _ in range(steps):
        for i, g in enumerate(np_grads(ps)):
            g = -g if maximize else g
            sign = np.sign(g * prev[i])
            factor = np.where(sign > 0, etaplus, np.where(sign < 0, etaminus, 1.0))
            size[i] = np.clip(size[i] * factor, *step_sizes)
            g = np.where(factor == etaminus, 0.0, g)
            ps[i] = ps[i] - np.sign(g) * size[i]
            prev[i] = g
    return ps


def np_asgd(steps, lr=1e-2, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0.0, maximize=False,
            foreach=None):
    f32 = np.float32
    ps = [p.copy() for p in P0]
    ax = [np.zeros_like(p) for p in ps]
    eta = [f32(lr) for _ in ps]
    mu = [f32(1.0) for _ in ps]
    for t in range(1, steps + 1):
        for i, g in enumerate(np_grads(ps)):
            g = -g if maximize else g
            if weight_decay:
                g = g + weight_decay * ps[i]
            e = float(eta[i])
            ps[i] = ps[i] * (1 - lambd * e) + g * -e
            ax[i] = ps[i].copy() if mu[i] == 1 else ax[i] + (ps[i] - ax[i]) * float(mu[i])
            eta[i] = f32(lr / ((1 + lambd * lr * t) ** alpha))
            mu[i] = f32(1 / max(1, t - t0))
    return ps


# --------------------------------------------------------------------------- update formulas

CASES = [
    (optim.RMSprop, np_rmsprop, dict()),
    (optim.RMSprop, np_rmsprop, dict(lr=0.05, momentum=0.9)),
    (optim.RMSprop, np_rmsprop, dict(lr=0.05, centered=True, weight_decay=0.1)),
    (optim.RMSprop, np_rmsprop, dict(lr=0.02, alpha=0.3, momentum=0.5, centered=True,
                                     maximize=True)),   # 1 - alpha > 0.5: lerp's other branch
    (optim.Adagrad, np_adagrad, dict()),
    (optim.Adagrad, np_adagrad, dict(lr=0.1, lr_decay=0.05, weight_decay=0.1)),
    (optim.Adagrad, np_adagrad, dict(lr=0.1, initial_accumulator_value=0.5, eps=1e-3,
                                     maximize=True)),
    (optim.Adamax, np_adamax, dict()),
    (optim.Adamax, np_adamax, dict(lr=0.05, betas=(0.3, 0.9), weight_decay=0.1)),
    (optim.Adamax, np_adamax, dict(lr=0.05, eps=1e-2, maximize=True)),
    (optim.NAdam, np_nadam, dict()),
    (optim.NAdam, np_nadam, dict(lr=0.05, weight_decay=0.1, momentum_decay=0.01)),
    (optim.NAdam, np_nadam, dict(lr=0.05, weight_decay=0.1, decoupled_weight_decay=True)),
    (optim.NAdam, np_nadam, dict(lr=0.01, betas=(0.3, 0.9), maximize=True)),
    (optim.RAdam, np_radam, dict()),
    # beta2 = 0.9 (0.8) makes rho_t > 5 from step 6 (7) on, so both of RAdam's branches run.
    (optim.RAdam, np_radam, dict(lr=0.05, betas=(0.9, 0.9), weight_decay=0.1)),
    (optim.RAdam, np_radam, dict(lr=0.05, betas=(0.3, 0.8), weight_decay=0.1,
                                 decoupled_weight_decay=True, maximize=True)),
    (optim.Adadelta, np_adadelta, dict()),
    (optim.Adadelta, np_adadelta, dict(lr=0.5, rho=0.7, eps=1e-4, weight_decay=0.1)),
    (optim.Adadelta, np_adadelta, dict(lr=2.0, maximize=True, foreach=False)),
    (optim.Rprop, np_rprop, dict()),
    # step sizes clamped on both sides; etaplus large enough to overshoot (sign flips)
    (optim.Rprop, np_rprop, dict(lr=0.05, etas=(0.3, 1.9), step_sizes=(1e-2, 0.2))),
    (optim.Rprop, np_rprop, dict(lr=0.02, maximize=True, foreach=True)),
    (optim.ASGD, np_asgd, dict()),
    # t0 = 3: the averaging starts (mu < 1) within the run
    (optim.ASGD, np_asgd, dict(lr=0.05, lambd=0.01, alpha=0.5, t0=3, weight_decay=0.1)),
    (optim.ASGD, np_asgd, dict(lr=0.02, t0=2, maximize=True, foreach=False)),
]
IDS = [f"{cls.__name__}-{kw}" for cls, _, kw in CASES]


@pytest.mark.parametrize("opt_cls,reference,config", CASES, ids=IDS)
def test_update_matches_torch_formula(opt_cls, reference, config):
    assert_params(run(opt_cls, steps=STEPS, **config), reference(STEPS, **config))


@pytest.mark.parametrize("opt_cls,reference,config", CASES[::3], ids=IDS[::3])
def test_float32_parameters_follow_the_same_formula(opt_cls, reference, config):
    params = make_params(fusegrad.float32)
    opt = opt_cls(params, **config)
    for _ in range(3):
        opt.zero_grad()
        quadratic_loss(params).backward()
        opt.step()
    assert all(p.dtype is fusegrad.float32 for p in params)
    assert all(v.dtype is fusegrad.float32 for s in opt.state.values() for v in s.values())
    assert_params([p.detach().numpy().astype(np.float64) for p in params],
                  reference(3, **config), rtol=2e-5)


def test_radam_takes_both_branches():
    # rho_t = rho_inf - 2 t b2^t / (1 - b2^t), rho_inf = 2 / (1 - b2) - 1.
    for b2 in (0.9, 0.8):
        rho_inf = 2 / (1 - b2) - 1
        rho = [rho_inf - 2 * t * b2 ** t / (1 - b2 ** t) for t in range(1, STEPS + 1)]
        assert min(rho) <= 5 < max(rho)


@pytest.mark.parametrize("opt_cls,reference,config", [
    (optim.Adamax, np_adamax, dict(lr=0.05)),
    (optim.NAdam, np_nadam, dict(lr=0.05, weight_decay=0.1)),
    (optim.RAdam, np_radam, dict(lr=0.05, betas=(0.9, 0.9))),
])
def test_capturable_uses_tensor_math_with_the_same_result(opt_cls, reference, config):
    got = run(opt_cls, steps=STEPS, capturable=True, **config)
    # The step-dependent factors are float32 on this path (as in torch), so float32's bound,
    # relative to the parameters' scale (about 1) where a value passes near zero.
    for a, e in zip(got, reference(STEPS, **config), strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


def test_rmsprop_state_layout_matches_torch():
    params = make_params()
    opt = optim.RMSprop(params, momentum=0.9, centered=True)
    quadratic_loss(params).backward()
    opt.step()
    state = opt.state_dict()["state"][0]
    assert list(state) == ["step", "square_avg", "momentum_buffer", "grad_avg"]
    assert state["step"].item() == 1.0
    assert list(optim.RMSprop(make_params()).defaults) == [
        "lr", "momentum", "alpha", "eps", "centered", "weight_decay", "capturable", "foreach",
        "maximize", "differentiable"]


def test_adagrad_state_is_created_in_the_constructor():
    params = make_params()
    opt = optim.Adagrad(params, initial_accumulator_value=0.25)
    state = opt.state_dict()["state"]
    assert sorted(state) == [0, 1]
    assert list(state[0]) == ["step", "sum"]
    np.testing.assert_array_equal(state[0]["sum"].numpy(), np.full(P0[0].shape, 0.25))


def test_nadam_and_radam_state_layout():
    params = make_params()
    nadam, radam = optim.NAdam(params), optim.RAdam(make_params())
    quadratic_loss(params).backward()
    nadam.step()
    state = nadam.state_dict()["state"][0]
    assert list(state) == ["step", "mu_product", "exp_avg", "exp_avg_sq"]
    assert state["mu_product"].dtype is fusegrad.float32
    assert radam.defaults["lr"] == 1e-3 and nadam.defaults["momentum_decay"] == 4e-3


@pytest.mark.parametrize("opt_cls,kw", [(optim.RMSprop, dict(lr=0.05, momentum=0.9,
                                                            centered=True)),
                                        (optim.Adagrad, dict(lr=0.1, lr_decay=0.01)),
                                        (optim.Adamax, dict(lr=0.05)),
                                        (optim.NAdam, dict(lr=0.05)),
                                        (optim.RAdam, dict(lr=0.05, betas=(0.9, 0.9))),
                                        (optim.Adadelta, dict(rho=0.8)),
                                        (optim.Rprop, dict(lr=0.05)),
                                        (optim.ASGD, dict(lr=0.05, t0=2))])
def test_load_state_dict_resumes_exactly(opt_cls, kw):
    params = make_params()
    opt = opt_cls(params, **kw)

    def steps(ps, o, n):
        for _ in range(n):
            o.zero_grad()
            quadratic_loss(ps).backward()
            o.step()

    steps(params, opt, 3)
    saved = copy.deepcopy(opt.state_dict())
    twins = [nn.Parameter(fusegrad.tensor(p.detach().numpy().copy())) for p in params]
    resumed = opt_cls(twins, lr=123.0)
    resumed.load_state_dict(saved)
    steps(params, opt, 3)
    steps(twins, resumed, 3)
    # load_state_dict casts every state tensor but ``step`` to the parameter's dtype, as
    # torch's does, so NAdam's float32 mu_product resumes as float64: equal to rounding
    # (ASGD writes its eta and mu through float32 tensors, as torch: exactly equal).
    rtol = 1e-9 if opt_cls is optim.NAdam else 0
    assert_params([p.detach().numpy() for p in twins], [p.detach().numpy() for p in params],
                  rtol=rtol)
    if opt_cls is optim.NAdam:
        assert next(iter(resumed.state.values()))["mu_product"].dtype is fusegrad.float64


def test_asgd_keeps_a_tensor_lr_unchanged():
    """ASGD's eta is a copy of a tensor lr (a float32 lr tensor cast to itself was the
    state, and each step's update of eta wrote into the user's lr)."""
    lr = fusegrad.tensor(0.5)
    params = make_params()
    opt = optim.ASGD(params, lr=lr, lambd=1.0)
    for _ in range(3):
        opt.zero_grad()
        quadratic_loss(params).backward()
        opt.step()
    assert lr.item() == 0.5 and opt.param_groups[0]["lr"] is lr
    assert all(s["eta"] is not lr for s in opt.state.values())


def test_hyperparameters_are_read_from_the_group_at_each_step():
    params = make_params()
    opt = optim.RMSprop(params, lr=0.05)
    quadratic_loss(params).backward()
    opt.param_groups[0]["lr"] = 0.0
    opt.step()
    assert_params([p.detach().numpy() for p in params], P0, rtol=0)


def test_adadelta_rprop_asgd_state_layout_matches_torch():
    # torch 2.13: the state keys in order, the group keys (defaults) in order
    layouts = {optim.Adadelta: (["step", "square_avg", "acc_delta"],
                                ["lr", "rho", "eps", "weight_decay", "maximize", "capturable",
                                 "foreach", "differentiable"]),
               optim.Rprop: (["step", "prev", "step_size"],
                             ["lr", "etas", "step_sizes", "foreach", "maximize",
                              "differentiable", "capturable"]),
               optim.ASGD: (["step", "eta", "mu", "ax"],
                            ["lr", "lambd", "alpha", "t0", "weight_decay", "foreach", "maximize",
                             "differentiable", "capturable"])}
    for cls, (state_keys, group_keys) in layouts.items():
        params = make_params()
        opt = cls(params)
        quadratic_loss(params).backward()
        opt.step()
        saved = opt.state_dict()
        assert list(saved["state"][0]) == state_keys
        assert list(saved["param_groups"][0]) == group_keys + ["params"]
        assert saved["state"][0]["step"].dtype is fusegrad.float32
    asgd = optim.ASGD(make_params(), lr=0.3)
    asgd.zero_grad()
    state = asgd.state
    assert not state
    params = make_params()
    opt = optim.ASGD(params, lr=0.3)
    quadratic_loss(params).backward()
    opt.step()
    first = opt.state[params[0]]
    assert first["eta"].dtype is fusegrad.float32 and first["mu"].item() == 1.0
    np.testing.assert_allclose(first["eta"].item(), 0.3 / (1 + 1e-4 * 0.3) ** 0.75, rtol=1e-7)
    np.testing.assert_array_equal(first["ax"].numpy(), params[0].detach().numpy())
    rprop = optim.Rprop(make_params(), lr=0.25)
    p0 = rprop.param_groups[0]["params"][0]
    quadratic_loss(rprop.param_groups[0]["params"]).backward()
    rprop.step()
    np.testing.assert_array_equal(rprop.state[p0]["step_size"].numpy(), np.full(P0[0].shape,
                                                                                 0.25))


def test_constructor_errors_match_torch():
    p = [nn.Parameter(fusegrad.zeros(2))]
    cases = [
        (lambda: optim.Adadelta(p, lr=-1), "Invalid learning rate: -1"),
        (lambda: optim.Adadelta(p, rho=1.5), "Invalid rho value: 1.5"),
        (lambda: optim.Adadelta(p, eps=-1), "Invalid epsilon value: -1"),
        (lambda: optim.Adadelta(p, weight_decay=-1), "Invalid weight_decay value: -1"),
        (lambda: optim.Adadelta(p, lr=fusegrad.zeros(2)), "Tensor lr must be 1-element"),
        (lambda: optim.Rprop(p, etas=(1.2, 0.5)), "Invalid eta values: 1.2, 0.5"),
        (lambda: optim.Rprop(p, lr=-0.1), "Invalid learning rate: -0.1"),
        (lambda: optim.ASGD(p, lr=-1), "Invalid learning rate: -1"),
        (lambda: optim.ASGD(p, weight_decay=-1), "Invalid weight_decay value: -1"),
        (lambda: optim.RMSprop(p, lr=-1), "Invalid learning rate: -1"),
        (lambda: optim.RMSprop(p, alpha=-0.1), "Invalid alpha value: -0.1"),
        (lambda: optim.RMSprop(p, momentum=-1), "Invalid momentum value: -1"),
        (lambda: optim.Adagrad(p, lr_decay=-1), "Invalid lr_decay value: -1"),
        (lambda: optim.Adagrad(p, initial_accumulator_value=-1),
         "Invalid initial_accumulator_value value: -1"),
        (lambda: optim.Adamax(p, betas=(0.9, 1.0)), "Invalid beta parameter at index 1: 1.0"),
        (lambda: optim.NAdam(p, momentum_decay=-1), "Invalid momentum_decay value: -1"),
        (lambda: optim.RAdam(p, eps=-1.0), "Invalid epsilon value: -1.0"),
        (lambda: optim.RAdam(p, weight_decay=-1), "Invalid weight_decay value: -1"),
    ]
    for make, message in cases:
        with pytest.raises(ValueError) as err:
            make()
        assert str(err.value) == message


# --------------------------------------------------------------------------- torch, if present


@pytest.mark.parametrize("opt_cls,reference,config", CASES, ids=IDS)
def test_update_matches_torch(opt_cls, reference, config):
    torch = pytest.importorskip("torch")
    params = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in P0]
    opt = getattr(torch.optim, opt_cls.__name__)(params, **config)
    for _ in range(STEPS):
        opt.zero_grad()
        for p, g in zip(params, np_grads([q.detach().numpy() for q in params]), strict=True):
            p.grad = torch.tensor(g)
        opt.step()
    assert_params(run(opt_cls, steps=STEPS, **config), [p.detach().numpy() for p in params])
