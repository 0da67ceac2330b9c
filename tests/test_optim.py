"""Tests of fusegrad.optim against numpy implementations of torch's update formulas
(torch/optim/sgd.py and adam.py, single-tensor path), plus the Optimizer API.

The problem is a fixed quadratic, so the gradient at each step is known in closed form:
``loss = sum(a * w**2 + b * w)`` has ``grad = 2 * a * w + b``.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

import fusegrad
from fusegrad import nn, optim

RNG = np.random.default_rng(0)
SHAPES = [(3, 2), (2,)]
A = [RNG.uniform(0.5, 2.0, s) for s in SHAPES]
B = [RNG.standard_normal(s) for s in SHAPES]
P0 = [RNG.standard_normal(s) for s in SHAPES]


def make_params(dtype=fusegrad.float64) -> list[nn.Parameter]:
    return [nn.Parameter(fusegrad.tensor(p, dtype=dtype)) for p in P0]


def quadratic_loss(params) -> fusegrad.Tensor:
    total = None
    for p, a, b in zip(params, A, B, strict=True):
        term = (fusegrad.tensor(a, dtype=p.dtype) * p * p + fusegrad.tensor(b, dtype=p.dtype)
                * p).sum()
        total = term if total is None else total + term
    return total


def np_grads(ps):
    return [2 * a * p + b for p, a, b in zip(ps, A, B, strict=True)]


def run(opt_cls, steps: int = 6, dtype=fusegrad.float64, **kw) -> list[np.ndarray]:
    params = make_params(dtype)
    opt = opt_cls(params, **kw)
    for _ in range(steps):
        opt.zero_grad()
        quadratic_loss(params).backward()
        opt.step()
    return [p.detach().numpy().astype(np.float64) for p in params]


# --------------------------------------------------------------------------- numpy references


def np_sgd(steps, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
           maximize=False):
    ps = [p.copy() for p in P0]
    bufs = [None] * len(ps)
    for _ in range(steps):
        for i, (p, g) in enumerate(zip(ps, np_grads(ps), strict=True)):
            g = -g if maximize else g
            if weight_decay:
                g = g + weight_decay * p
            if momentum:
                if bufs[i] is None:
                    bufs[i] = g.copy()
                else:
                    bufs[i] = bufs[i] * momentum + (1 - dampening) * g
                g = g + momentum * bufs[i] if nesterov else bufs[i]
            ps[i] = p - lr * g
    return ps


def np_lerp(start, end, w):
    return start + w * (end - start) if abs(w) < 0.5 else end - (end - start) * (1 - w)


def np_adam(steps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False,
            maximize=False, decoupled=False, capturable=False):
    b1, b2 = betas
    ps = [p.copy() for p in P0]
    m = [np.zeros_like(p) for p in ps]
    v = [np.zeros_like(p) for p in ps]
    vmax = [np.zeros_like(p) for p in ps]
    for t in range(1, steps + 1):
        for i, g in enumerate(np_grads(ps)):
            g = -g if maximize else g
            if weight_decay:
                if decoupled:
                    ps[i] = ps[i] * (1 - lr * weight_decay)
                else:
                    g = g + weight_decay * ps[i]
            m[i] = np_lerp(m[i], g, 1 - b1)
            v[i] = v[i] * b2 + (1 - b2) * g * g
            second = v[i]
            if amsgrad:
                vmax[i] = np.maximum(vmax[i], v[i])
                second = vmax[i]
            if capturable:
                # torch's capturable branch: bias corrections from the float32 step tensor.
                f32 = np.float32
                bc1, bc2 = f32(1) - f32(b1) ** f32(t), f32(1) - f32(b2) ** f32(t)
                step_size_neg = -(f32(lr) / bc1)
                denom = (np.sqrt(second) / np.float64(np.sqrt(bc2) * step_size_neg)
                         + np.float64(f32(eps) / step_size_neg))
                ps[i] = ps[i] + m[i] / denom
                continue
            denom = np.sqrt(second) / math.sqrt(1 - b2 ** t) + eps
            ps[i] = ps[i] - lr / (1 - b1 ** t) * m[i] / denom
    return ps


def assert_params(actual, expected, rtol=1e-12):
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=1e-14)


# --------------------------------------------------------------------------- update formulas

SGD_CONFIGS = [
    dict(lr=0.1),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.3),
    dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1),
    dict(lr=0.02, momentum=0.5, weight_decay=0.01, maximize=True),
]


@pytest.mark.parametrize("config", SGD_CONFIGS, ids=[str(c) for c in SGD_CONFIGS])
def test_sgd_matches_torch_formula(config):
    assert_params(run(optim.SGD, **config), np_sgd(6, **config))


ADAM_CONFIGS = [
    dict(),
    dict(lr=0.1, amsgrad=True),
    dict(lr=0.05, weight_decay=0.1),
    dict(lr=0.05, weight_decay=0.1, amsgrad=True, maximize=True),
    dict(lr=0.01, betas=(0.3, 0.9), eps=1e-3),     # 1 - beta1 > 0.5: lerp's other branch
]


@pytest.mark.parametrize("config", ADAM_CONFIGS, ids=[str(c) for c in ADAM_CONFIGS])
def test_adam_matches_torch_formula(config):
    assert_params(run(optim.Adam, **config), np_adam(6, **config))


@pytest.mark.parametrize("config", [dict(), dict(lr=0.1, weight_decay=0.5),
                                    dict(lr=0.1, weight_decay=0.5, amsgrad=True)])
def test_adamw_matches_torch_formula(config):
    expected = np_adam(6, decoupled=True, **{"weight_decay": 1e-2, **config})
    assert_params(run(optim.AdamW, **config), expected)
    # AdamW is Adam with decoupled weight decay, as in torch 2.
    assert_params(run(optim.Adam, decoupled_weight_decay=True, **{"weight_decay": 1e-2, **config}),
                  expected)


def test_adam_and_adamw_differ_with_weight_decay():
    adam = run(optim.Adam, lr=0.1, weight_decay=0.5)
    adamw = run(optim.AdamW, lr=0.1, weight_decay=0.5)
    assert not np.allclose(adam[0], adamw[0])


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_capturable_uses_tensor_math_with_the_same_result(amsgrad):
    got = run(optim.Adam, lr=0.05, amsgrad=amsgrad, capturable=True)
    # The bias corrections are float32 here: 0.999**t may differ by an ulp between libms,
    # and 1 - 0.999**t cancels about 10 bits of it, so the bound is float32's, not float64's.
    assert_params(got, np_adam(6, lr=0.05, amsgrad=amsgrad, capturable=True), rtol=1e-5)
    # float32 bias corrections (1 - 0.999**t cancels) move the result only slightly.
    assert_params(got, np_adam(6, lr=0.05, amsgrad=amsgrad), rtol=1e-3)


def test_float32_parameters_stay_float32():
    params = make_params(fusegrad.float32)
    opt = optim.Adam(params, lr=0.01)
    quadratic_loss(params).backward()
    opt.step()
    assert all(p.dtype is fusegrad.float32 for p in params)
    assert all(v.dtype is fusegrad.float32 for s in opt.state.values() for k, v in s.items()
               if k != "step")
    np.testing.assert_allclose(params[0].detach().numpy(), np_adam(1, lr=0.01)[0], rtol=1e-5)


# --------------------------------------------------------------------------- optimizer API


def test_step_is_in_place_under_no_grad():
    params = make_params()
    storage = [p.data_ptr() for p in params]
    versions = [p._version for p in params]
    opt = optim.SGD(params, lr=0.1, momentum=0.9)
    quadratic_loss(params).backward()
    opt.step()
    assert [p.data_ptr() for p in params] == storage
    assert all(p._version > v for p, v in zip(params, versions, strict=True))
    assert all(p.is_leaf and p.grad_fn is None and p.requires_grad for p in params)


def test_parameters_without_grad_are_skipped():
    params = make_params()
    opt = optim.Adam(params, lr=0.1)
    params[0].sum().backward()      # only the first gets a gradient
    opt.step()
    assert id(params[1]) not in {id(k) for k in opt.state}
    np.testing.assert_array_equal(params[1].detach().numpy(), P0[1])


def test_zero_grad_set_to_none_and_to_zero():
    params = make_params()
    opt = optim.SGD(params, lr=0.1)
    quadratic_loss(params).backward()
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.numpy().any() for p in params)
    opt.zero_grad()
    assert all(p.grad is None for p in params)


def test_gradient_accumulation_over_two_backward_calls():
    params = make_params()
    quadratic_loss(params).backward()
    (quadratic_loss(params) * 2).backward()
    for p, g in zip(params, np_grads(P0), strict=True):
        np.testing.assert_allclose(p.grad.numpy(), 3 * g, rtol=1e-12)
    optim.SGD(params, lr=0.1).step()
    single = make_params()
    (quadratic_loss(single) * 3).backward()
    optim.SGD(single, lr=0.1).step()
    assert_params([p.detach().numpy() for p in params], [p.detach().numpy() for p in single])


def test_closure_runs_with_grad_enabled_and_returns_loss():
    params = make_params()
    opt = optim.SGD(params, lr=0.1)
    enabled = []

    def closure():
        opt.zero_grad()
        enabled.append(fusegrad.is_grad_enabled())
        loss = quadratic_loss(params)
        loss.backward()
        return loss

    with fusegrad.no_grad():
        loss = opt.step(closure)
    assert enabled == [True]
    assert isinstance(loss, fusegrad.Tensor) and loss.grad_fn is not None
    assert_params([p.detach().numpy() for p in params], np_sgd(1, lr=0.1))


def test_param_groups_with_own_hyperparameters():
    params = make_params()
    opt = optim.SGD([{"params": [params[0]]}, {"params": params[1], "lr": 0.5}], lr=0.1,
                    momentum=0.9)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    assert all(g["momentum"] == 0.9 for g in opt.param_groups)
    quadratic_loss(params).backward()
    opt.step()
    g = np_grads(P0)
    np.testing.assert_allclose(params[0].detach().numpy(), P0[0] - 0.1 * g[0], rtol=1e-12)
    np.testing.assert_allclose(params[1].detach().numpy(), P0[1] - 0.5 * g[1], rtol=1e-12)

    extra = nn.Parameter(fusegrad.zeros(2))
    opt.add_param_group({"params": [extra], "momentum": 0.0})
    assert opt.param_groups[2]["lr"] == 0.1 and opt.param_groups[2]["momentum"] == 0.0
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter "
                                         "group"):
        opt.add_param_group({"params": [extra]})
    named = optim.SGD([("w", params[0])], lr=0.1)
    assert named.param_groups[0]["param_names"] == ["w"]


def test_constructor_errors_match_torch():
    p = [nn.Parameter(fusegrad.zeros(2))]
    cases = [
        (lambda: optim.SGD(p, lr=0.1, nesterov=True), ValueError,
         "Nesterov momentum requires a momentum and zero dampening"),
        (lambda: optim.SGD(p, lr=-1), ValueError, "Invalid learning rate: -1"),
        (lambda: optim.SGD(p, momentum=-0.5), ValueError, "Invalid momentum value: -0.5"),
        (lambda: optim.Adam(p, betas=(1.0, 0.9)), ValueError,
         "Invalid beta parameter at index 0: 1.0"),
        (lambda: optim.Adam(p, eps=-1.0), ValueError, "Invalid epsilon value: -1.0"),
        (lambda: optim.AdamW(p, weight_decay=-1), ValueError, "Invalid weight_decay value: -1"),
        (lambda: optim.SGD([], lr=0.1), ValueError, "optimizer got an empty parameter list"),
        (lambda: optim.SGD(fusegrad.zeros(2), lr=0.1), TypeError,
         "params argument given to the optimizer should be an iterable of Tensors or dicts, but "
         "got fusegrad.FloatTensor"),
        (lambda: optim.SGD([fusegrad.zeros(2, requires_grad=True) * 2], lr=0.1), ValueError,
         "can't optimize a non-leaf Tensor"),
        (lambda: optim.SGD([1.0], lr=0.1), TypeError,
         "optimizer can only optimize Tensors, but one of the params is float"),
    ]
    for make, exc, message in cases:
        with pytest.raises(exc) as err:
            make()
        assert str(err.value) == message


def test_sgd_repr_matches_torch():
    opt = optim.SGD([nn.Parameter(fusegrad.zeros(2))], lr=0.1)
    assert repr(opt) == ("SGD (\nParameter Group 0\n    dampening: 0\n    differentiable: False\n"
                         "    foreach: None\n    fused: None\n    lr: 0.1\n    maximize: False\n"
                         "    momentum: 0\n    nesterov: False\n    weight_decay: 0\n)")


def test_state_dict_layout_matches_torch():
    opt = optim.Adam([nn.Parameter(fusegrad.zeros(2))])
    # torch 2.13: optim.Adam([torch.zeros(2, requires_grad=True)]).state_dict()
    assert opt.state_dict() == {"state": {}, "param_groups": [{
        "lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": 0, "amsgrad": False,
        "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
        "fused": None, "decoupled_weight_decay": False, "params": [0]}]}

    params = make_params()
    opt = optim.Adam([{"params": [params[1]]}, {"params": [params[0]], "lr": 0.1}],
                     amsgrad=True)
    quadratic_loss(params).backward()
    opt.step()
    opt.step()
    sd = opt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [[0], [1]]
    assert sorted(sd["state"]) == [0, 1]
    assert list(sd["state"][0]) == ["step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"]
    assert repr(sd["state"][0]["step"]) == "tensor(2.)"
    assert sd["state"][0]["exp_avg"].shape == params[1].shape
    sgd = optim.SGD(params, lr=0.1, momentum=0.9)
    quadratic_loss(params).backward()
    sgd.step()
    assert list(sgd.state_dict()["state"][1]) == ["momentum_buffer"]
    assert optim.SGD(params, lr=0.1).state_dict()["state"] == {}


@pytest.mark.parametrize("opt_cls,kw", [(optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True)),
                                        (optim.Adam, dict(lr=0.05, amsgrad=True)),
                                        (optim.AdamW, dict(lr=0.05))])
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
    assert resumed.param_groups[0]["lr"] == kw["lr"]
    assert resumed.param_groups[0]["params"][0] is twins[0]
    steps(params, opt, 3)
    steps(twins, resumed, 3)
    assert_params([p.detach().numpy() for p in twins], [p.detach().numpy() for p in params],
                  rtol=0)
    # The loaded state is a copy, not the saved tensors.
    state = next(iter(resumed.state.values()))
    key = "momentum_buffer" if opt_cls is optim.SGD else "exp_avg"
    assert state[key] is not saved["state"][0][key]


def test_load_state_dict_errors_and_dtype_cast():
    params = make_params()
    opt = optim.SGD(params, lr=0.1)
    with pytest.raises(ValueError, match="loaded state dict has a different number of parameter "
                                         "groups"):
        opt.load_state_dict({"state": {}, "param_groups": []})
    with pytest.raises(ValueError, match="loaded state dict contains a parameter group that "
                                         "doesn't match the size of optimizer's group"):
        opt.load_state_dict({"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]})
    f32 = [nn.Parameter(fusegrad.zeros(2))]
    adam = optim.Adam(f32)
    adam.load_state_dict({"state": {0: {"step": fusegrad.tensor(4.0),
                                        "exp_avg": fusegrad.ones(2, dtype=fusegrad.float64),
                                        "exp_avg_sq": fusegrad.ones(2, dtype=fusegrad.float64)}},
                          "param_groups": [dict(adam.state_dict()["param_groups"][0])]})
    state = adam.state[f32[0]]
    assert state["exp_avg"].dtype is fusegrad.float32 and state["step"].item() == 4.0


def test_training_a_model_end_to_end():
    fusegrad.manual_seed(0)
    x = fusegrad.randn(64, 4)
    y = (x[:, :1] - 2 * x[:, 1:2] > 0).long().reshape(-1)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = optim.AdamW(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    first = None
    for _ in range(60):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert loss.item() < 0.2 * first
    assert (model(x).argmax(1) == y).float().mean().item() > 0.95


_ARRAY_PATH_CONFIGS = [
    (optim.SGD, {"lr": 0.1}),
    (optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    (optim.SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.3, "maximize": True}),
    (optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 1}),
    (optim.Adam, {"lr": 1e-2}),
    (optim.Adam, {"lr": 1e-2, "weight_decay": 0.1, "maximize": True}),
    (optim.Adam, {"lr": 1e-2, "betas": (0.3, 0.9)}),      # lerp from the other end
    (optim.AdamW, {"lr": 3e-3, "weight_decay": 0.1}),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cls,kwargs", _ARRAY_PATH_CONFIGS)
def test_eager_array_update_equals_the_tensor_ops(cls, kwargs, dtype, monkeypatch):
    # Eager steps update float32/float64 parameters on their numpy arrays in place; the
    # result, the state and the version counters must be the tensor ops' exactly.
    from fusegrad.optim import adam, sgd
    rng = np.random.default_rng(0)
    shapes = [(5, 3), (3,), ()]
    init = [rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(3)]

    def run():
        params = [fusegrad.tensor(a.copy(), requires_grad=True) for a in init]
        opt = cls(params, **kwargs)
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = fusegrad.tensor(g)
            opt.step()
        state = [{k: v.numpy() if hasattr(v, "numpy") else v for k, v in opt.state[p].items()}
                 for p in params]
        return ([p.detach().numpy() for p in params], state,
                [p._version_counter.value for p in params], len(opt.state))

    taken = []

    def spy(*tensors):
        arrays = eager_arrays(*tensors)
        taken.append(arrays is not None)
        return arrays
    eager_arrays = sgd.eager_arrays
    monkeypatch.setattr(sgd, "eager_arrays", spy)
    monkeypatch.setattr(adam, "eager_arrays", spy)
    fast = run()
    assert taken and all(taken)
    monkeypatch.setattr(sgd, "eager_arrays", lambda *t: None)
    monkeypatch.setattr(adam, "eager_arrays", lambda *t: None)
    slow = run()
    for a, b in zip(fast[0], slow[0]):
        np.testing.assert_array_equal(a, b)
    for sa, sb in zip(fast[1], slow[1]):
        assert sa.keys() == sb.keys()
        for k in sa:
            np.testing.assert_array_equal(sa[k], sb[k])
    assert fast[2:] == slow[2:]


def test_a_torch_optimizers_state_dict_loads_as_fusegrad_tensors():
    # torch tensors were kept in opt.state as they were, and the next step failed.
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    tp = torch.nn.Parameter(torch.randn(3))
    to = torch.optim.Adam([tp], lr=0.1)
    for _ in range(3):
        to.zero_grad()
        (tp ** 2).sum().backward()
        to.step()
    fp = fusegrad.nn.Parameter(fusegrad.tensor(tp.detach().numpy()))
    fo = fusegrad.optim.Adam([fp], lr=0.1)
    fo.load_state_dict(to.state_dict())
    assert isinstance(fo.state[fp]["exp_avg"], fusegrad.Tensor)
    for _ in range(3):
        to.zero_grad()
        (tp ** 2).sum().backward()
        to.step()
        fo.zero_grad()
        (fp ** 2).sum().backward()
        fo.step()
    np.testing.assert_allclose(fp.detach().numpy(), tp.detach().numpy(), rtol=1e-6)
