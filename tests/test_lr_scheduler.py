"""Learning-rate schedulers against torch's formulas, computed here by hand (closed forms and
step-by-step tables), plus state dicts, resumption and torch's error messages.

The schedulers themselves use torch's chainable (recursive) form; the closed forms here
agree with it to float64 rounding, hence ``rtol=1e-12``.
"""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pytest

import fusegrad
from fusegrad import nn, optim
from fusegrad.optim import lr_scheduler as L

BASE = (0.1, 0.05)       # two param groups with their own lr


def make_opt(cls=optim.SGD, **kw) -> optim.Optimizer:
    params = [nn.Parameter(fusegrad.zeros(2)), nn.Parameter(fusegrad.zeros(3))]
    return cls([{"params": [params[0]], "lr": BASE[0]}, {"params": [params[1]], "lr": BASE[1]}],
               **kw)


def trajectory(make_sched, epochs: int, opt=None) -> np.ndarray:
    """get_last_lr() after the constructor and after each of ``epochs - 1`` steps:
    row e holds the lrs of epoch e."""
    opt = opt or make_opt(momentum=0.9)
    sched = make_sched(opt)
    rows = [sched.get_last_lr()]
    for _ in range(epochs - 1):
        opt.step()
        sched.step()
        rows.append(sched.get_last_lr())
        assert rows[-1] == [g["lr"] for g in opt.param_groups]
    return np.array(rows, dtype=np.float64)


def closed(fn, epochs: int) -> np.ndarray:
    return np.array([[fn(base, e) for base in BASE] for e in range(epochs)])


def assert_lrs(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-16)


# --------------------------------------------------------------------------- formulas


def test_step_lr():
    assert_lrs(trajectory(lambda o: L.StepLR(o, step_size=3, gamma=0.5), 10),
               closed(lambda b, e: b * 0.5 ** (e // 3), 10))


def test_multistep_lr_repeated_milestone_multiplies_twice():
    got = trajectory(lambda o: L.MultiStepLR(o, milestones=[2, 5, 5], gamma=0.1), 8)
    assert_lrs(got, closed(lambda b, e: b * 0.1 ** ((e >= 2) + 2 * (e >= 5)), 8))


def test_constant_lr():
    assert_lrs(trajectory(lambda o: L.ConstantLR(o, factor=0.25, total_iters=3), 6),
               closed(lambda b, e: b * (0.25 if e < 3 else 1.0), 6))


@pytest.mark.parametrize("start,end,total", [(1 / 3, 1.0, 5), (1.0, 0.1, 4), (0.5, 0.5, 3)])
def test_linear_lr(start, end, total):
    got = trajectory(lambda o: L.LinearLR(o, start_factor=start, end_factor=end,
                                          total_iters=total), total + 4)
    assert_lrs(got, closed(lambda b, e: b * (start + (end - start) * min(e, total) / total),
                           total + 4))


def test_exponential_lr():
    assert_lrs(trajectory(lambda o: L.ExponentialLR(o, gamma=0.8), 7),
               closed(lambda b, e: b * 0.8 ** e, 7))


def test_polynomial_lr():
    got = trajectory(lambda o: L.PolynomialLR(o, total_iters=4, power=2.0), 7)
    assert_lrs(got, closed(lambda b, e: b * (1 - min(e, 4) / 4) ** 2, 7))


@pytest.mark.parametrize("eta_min", [0.0, 0.01])
def test_cosine_annealing_lr_follows_the_cosine_down_and_back_up(eta_min):
    # Three half-periods: torch's recursive form keeps following the closed-form cosine.
    got = trajectory(lambda o: L.CosineAnnealingLR(o, T_max=4, eta_min=eta_min), 13)
    expected = closed(lambda b, e: eta_min + (b - eta_min) * (1 + math.cos(math.pi * e / 4)) / 2,
                      13)
    assert_lrs(got, expected)
    assert got[4, 0] == pytest.approx(eta_min, abs=1e-16)


def test_lambda_lr_one_function_per_group():
    got = trajectory(lambda o: L.LambdaLR(o, [lambda e: 0.9 ** e, lambda e: 1 / (e + 1)]), 6)
    expected = np.array([[BASE[0] * 0.9 ** e, BASE[1] / (e + 1)] for e in range(6)])
    assert_lrs(got, expected)


def test_multiplicative_lr():
    got = trajectory(lambda o: L.MultiplicativeLR(o, lambda e: 0.5 + 0.1 * e), 5)
    # lr_e = lr_{e-1} * f(e) for e >= 1.
    factors = np.cumprod([1.0] + [0.5 + 0.1 * e for e in range(1, 5)])
    assert_lrs(got, np.outer(factors, BASE))


def np_one_cycle(step, total, max_lr, pct_start=0.3, div=25.0, final_div=1e4, three=False,
                 strategy="cos", base_m=0.85, max_m=0.95):
    """torch's OneCycleLR as phases of (end_step, lr from, lr to, momentum from, to)."""
    initial, = [max_lr / div]
    min_lr = initial / final_div
    if three:
        phases = [(pct_start * total - 1, initial, max_lr, max_m, base_m),
                  (2 * pct_start * total - 2, max_lr, initial, base_m, max_m),
                  (total - 1, initial, min_lr, max_m, max_m)]
    else:
        phases = [(pct_start * total - 1, initial, max_lr, max_m, base_m),
                  (total - 1, max_lr, min_lr, base_m, max_m)]

    def anneal(a, b, pct):
        if strategy == "cos":
            return b + (a - b) / 2 * (math.cos(math.pi * pct) + 1)
        return (b - a) * pct + a

    start = 0.0
    for i, (end, lr0, lr1, m0, m1) in enumerate(phases):
        if step <= end or i == len(phases) - 1:
            pct = (step - start) / (end - start)
            return anneal(lr0, lr1, pct), anneal(m0, m1, pct)
        start = end
    raise AssertionError


@pytest.mark.parametrize("three,strategy", [(False, "cos"), (True, "cos"), (False, "linear")])
def test_one_cycle_lr_and_momentum(three, strategy):
    opt = make_opt(momentum=0.9)
    sched = L.OneCycleLR(opt, max_lr=[1.0, 0.5], total_steps=20, three_phase=three,
                         anneal_strategy=strategy)
    for step in range(20):
        for group, max_lr in zip(opt.param_groups, (1.0, 0.5), strict=True):
            lr, momentum = np_one_cycle(step, 20, max_lr, three=three, strategy=strategy)
            assert group["lr"] == pytest.approx(lr, rel=1e-12, abs=1e-18)
            assert group["momentum"] == pytest.approx(momentum, rel=1e-12)
        opt.step()
        if step < 19:
            sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(1.0 / 25 / 1e4, rel=1e-9)
    sched.step()
    with pytest.raises(ValueError, match="Tried to step 21 times. The specified number of total "
                                         "steps is 20"):
        sched.step()


def test_one_cycle_lr_cycles_adams_beta1():
    opt = make_opt(optim.Adam, betas=(0.9, 0.99))
    sched = L.OneCycleLR(opt, max_lr=0.1, epochs=2, steps_per_epoch=5)
    assert sched.total_steps == 10
    assert opt.param_groups[0]["betas"] == (0.95, 0.99)
    for _ in range(3):
        opt.step()
        sched.step()
    assert opt.param_groups[1]["betas"][0] == pytest.approx(np_one_cycle(3, 10, 0.1)[1])
    assert opt.param_groups[1]["betas"][1] == 0.99
    with pytest.raises(ValueError, match="optimizer must support momentum or beta1 with "
                                         "`cycle_momentum` option enabled"):
        L.OneCycleLR(make_opt(optim.Adagrad), max_lr=0.1, total_steps=5)


def test_cosine_annealing_warm_restarts():
    t0, t_mult, eta_min = 2, 2, 0.001
    got = trajectory(lambda o: L.CosineAnnealingWarmRestarts(o, T_0=t0, T_mult=t_mult,
                                                             eta_min=eta_min), 15)
    # Periods of 2, 4, 8 epochs: (T_cur, T_i) by hand.
    cycle = [(0, 2), (1, 2)] + [(i, 4) for i in range(4)] + [(i, 8) for i in range(8)] + [(0, 16)]
    expected = np.array([[eta_min + (b - eta_min) * (1 + math.cos(math.pi * cur / ti)) / 2
                          for b in BASE] for cur, ti in cycle])
    assert_lrs(got, expected)


def test_cosine_annealing_warm_restarts_fractional_epochs():
    opt = make_opt()
    sched = L.CosineAnnealingWarmRestarts(opt, T_0=3, T_mult=2)
    sched.step(2.5)       # T_cur 2.5 of 3
    assert sched.get_last_lr()[0] == pytest.approx(BASE[0] * (1 + math.cos(math.pi * 2.5 / 3)) / 2)
    sched.step(5.0)       # second period (length 6) starts at 3: T_cur = 2
    assert (sched.T_cur, sched.T_i, sched.last_epoch) == (2.0, 6, 5)
    assert sched.get_last_lr()[1] == pytest.approx(BASE[1] * (1 + math.cos(math.pi * 2 / 6)) / 2)
    with pytest.raises(ValueError, match="Expected non-negative epoch, but got -1"):
        sched.step(-1)


def test_reduce_lr_on_plateau_patience_cooldown_and_min_lr():
    opt = make_opt()
    sched = L.ReduceLROnPlateau(opt, factor=0.5, patience=1, cooldown=1, min_lr=[0.02, 0.0])
    metrics = [1.0, 0.9, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95, 0.8, 0.85, 0.85]
    # Hand-traced: bad epochs count past patience=1 on the 2nd stall; the cooldown epoch after
    # a reduction does not count; group 0 stops at its min_lr of 0.02.
    expected = [(0.1, 0.05), (0.1, 0.05), (0.1, 0.05), (0.05, 0.025), (0.05, 0.025),
                (0.05, 0.025), (0.025, 0.0125), (0.025, 0.0125), (0.025, 0.0125),
                (0.025, 0.0125), (0.02, 0.00625)]
    got = []
    for m in metrics:
        sched.step(m)
        got.append(tuple(sched.get_last_lr()))
    assert_lrs(np.array(got), np.array(expected))


def test_reduce_lr_on_plateau_max_mode_and_abs_threshold():
    opt = make_opt()
    sched = L.ReduceLROnPlateau(opt, mode="max", threshold=0.1, threshold_mode="abs",
                                patience=0, factor=0.1)
    sched.step(1.0)             # improves on -inf
    sched.step(1.05)            # not by more than 0.1: reduce
    assert_lrs(sched.get_last_lr(), [BASE[0] * 0.1, BASE[1] * 0.1])
    sched.step(1.2)             # improves by more than 0.1: keep
    assert sched.best == 1.2 and sched.num_bad_epochs == 0
    with pytest.raises(ValueError, match="mode other is unknown!"):
        L.ReduceLROnPlateau(opt, mode="other")
    with pytest.raises(ValueError, match="Factor should be < 1.0."):
        L.ReduceLROnPlateau(opt, factor=1.0)


def test_sequential_lr_restarts_each_scheduler_at_its_milestone():
    def make(o):
        return L.SequentialLR(o, [L.ConstantLR(o, factor=0.5, total_iters=2),
                                  L.ExponentialLR(o, gamma=0.9)], milestones=[3])
    expected = closed(lambda b, e: b * (0.5 if e < 2 else 1.0) if e < 3 else b * 0.9 ** (e - 3),
                      8)
    assert_lrs(trajectory(make, 8), expected)


def test_sequential_lr_warmup_then_cosine():
    def make(o):
        return L.SequentialLR(o, [L.LinearLR(o, start_factor=0.1, total_iters=3),
                                  L.CosineAnnealingLR(o, T_max=5)], milestones=[3])

    def lr(b, e):
        if e < 3:
            return b * (0.1 + 0.9 * e / 3)
        return b * (1 + math.cos(math.pi * (e - 3) / 5)) / 2
    assert_lrs(trajectory(make, 9), closed(lr, 9))


def test_chained_scheduler_composes_factors():
    def make(o):
        return L.ChainedScheduler([L.ConstantLR(o, factor=0.1, total_iters=2),
                                   L.ExponentialLR(o, gamma=0.9)])
    assert_lrs(trajectory(make, 6), closed(lambda b, e: b * 0.9 ** e * (0.1 if e < 2 else 1), 6))


def test_chained_step_lr_and_exponential_lr():
    def make(o):
        return L.ChainedScheduler([L.StepLR(o, 2, gamma=0.5), L.ExponentialLR(o, gamma=0.9)])
    assert_lrs(trajectory(make, 7), closed(lambda b, e: b * 0.5 ** (e // 2) * 0.9 ** e, 7))


def test_step_with_epoch_uses_the_closed_form_and_warns():
    opt = make_opt()
    sched = L.StepLR(opt, step_size=2, gamma=0.1)
    with pytest.warns(UserWarning, match="The epoch parameter in `scheduler.step\\(\\)` was not "
                                         "necessary"):
        sched.step(5)
    assert sched.last_epoch == 5
    assert_lrs(sched.get_last_lr(), [BASE[0] * 0.01, BASE[1] * 0.01])


def test_get_lr_outside_step_warns():
    sched = L.ExponentialLR(make_opt(), gamma=0.5)
    with pytest.warns(UserWarning, match="please use `get_last_lr\\(\\)`"):
        sched.get_lr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sched.step()


# CyclicLR's amplitude factor over the first steps, by hand: up over step_size_up steps,
# down over step_size_down, then the next cycle.
CYCLIC_UP2_DOWN4 = [0, 0.5, 1, 0.75, 0.5, 0.25, 0, 0.5, 1, 0.75]


def test_cyclic_lr_triangular_and_momentum():
    opt = make_opt(momentum=0.3)
    sched = L.CyclicLR(opt, base_lr=[0.01, 0.02], max_lr=[0.11, 0.52], step_size_up=2,
                       step_size_down=4, base_momentum=0.8, max_momentum=0.9)
    lrs, moms = [], []
    for _ in range(10):
        lrs.append(sched.get_last_lr())
        moms.append([g["momentum"] for g in opt.param_groups])
        opt.step()
        sched.step()
    f = np.array(CYCLIC_UP2_DOWN4)[:, None]
    assert_lrs(lrs, np.array([0.01, 0.02]) + np.array([0.1, 0.5]) * f)
    np.testing.assert_allclose(moms, 0.9 - 0.1 * f * np.ones((1, 2)), rtol=1e-12)
    assert opt.param_groups[0]["max_momentum"] == 0.9
    assert opt.param_groups[1]["base_momentum"] == 0.8


@pytest.mark.parametrize("mode, scale", [
    ("triangular2", lambda e, cycle: 0.5 ** (cycle - 1)),
    ("exp_range", lambda e, cycle: 0.9 ** e),
])
def test_cyclic_lr_modes_scale_the_amplitude(mode, scale):
    sched_lrs = trajectory(lambda o: L.CyclicLR(o, 0.1, 0.5, step_size_up=2, mode=mode,
                                                gamma=0.9), 13)
    f = [0, 0.5, 1, 0.5] * 4
    expected = [[0.1 + 0.4 * f[e] * scale(e, e // 4 + 1)] * 2 for e in range(13)]
    assert_lrs(sched_lrs, expected)


def test_cyclic_lr_custom_scale_fn_by_cycle_or_iteration():
    by_cycle = trajectory(lambda o: L.CyclicLR(o, 0.0, 1.0, step_size_up=1,
                                               scale_fn=lambda c: 1 / c), 6)
    assert_lrs(by_cycle[:, 0], [0, 1, 0, 1 / 2, 0, 1 / 3])
    by_step = trajectory(lambda o: L.CyclicLR(o, 0.0, 1.0, step_size_up=1,
                                              scale_fn=lambda e: 1 / (e + 1),
                                              scale_mode="iterations"), 6)
    assert_lrs(by_step[:, 0], [0, 1 / 2, 0, 1 / 4, 0, 1 / 6])


def test_cyclic_lr_cycles_adams_beta1_and_can_leave_momentum():
    opt = make_opt(optim.Adam, betas=(0.5, 0.99))
    sched = L.CyclicLR(opt, 0.1, 0.5, step_size_up=2, base_momentum=0.7, max_momentum=0.95)
    betas = []
    for _ in range(5):
        betas.append(opt.param_groups[0]["betas"])
        opt.step()
        sched.step()
    np.testing.assert_allclose(betas, [(0.95 - 0.25 * f, 0.99) for f in (0, 0.5, 1, 0.5, 0)],
                               rtol=1e-12)
    opt = make_opt(optim.Adagrad)
    sched = L.CyclicLR(opt, 0.1, 0.5, step_size_up=2, cycle_momentum=False)
    assert "momentum" not in opt.param_groups[0] and not hasattr(sched, "use_beta1")


def test_cyclic_lr_state_dict_keys_and_callable_scale_fn():
    class Halving:
        def __init__(self, rate):
            self.rate = rate

        def __call__(self, x):
            return self.rate ** x

    sched = L.CyclicLR(make_opt(momentum=0.9), 0.01, 0.1, step_size_up=3, scale_fn=Halving(0.5))
    state = sched.state_dict()
    # torch 2.13: CyclicLR(SGD([p], lr=0.1, momentum=0.9), 0.01, 0.1, 3).state_dict()
    assert list(state) == ["max_lrs", "total_size", "step_ratio", "mode", "gamma", "scale_mode",
                           "cycle_momentum", "use_beta1", "base_momentums", "max_momentums",
                           "base_lrs", "last_epoch", "_step_count", "_is_initial",
                           "_get_lr_called_within_step", "_last_lr", "_scale_fn_custom"]
    assert state["_scale_fn_custom"] == {"rate": 0.5} and state["total_size"] == 6.0
    other = L.CyclicLR(make_opt(momentum=0.9), 0.01, 0.1, step_size_up=3, scale_fn=Halving(0.9))
    other.load_state_dict(state)
    assert other.scale_fn(2) == 0.25
    plain = L.CyclicLR(make_opt(momentum=0.9), 0.01, 0.1, mode="exp_range", gamma=0.5)
    assert plain.state_dict()["_scale_fn_custom"] is None
    assert plain.state_dict()["scale_mode"] == "iterations"


# --------------------------------------------------------------------------- state


def test_state_dict_keys_match_torch():
    sched = L.StepLR(make_opt(), step_size=3)
    # torch 2.13: StepLR(SGD([p], lr=0.1), 3).state_dict()
    assert list(sched.state_dict()) == ["step_size", "gamma", "base_lrs", "last_epoch",
                                        "_step_count", "_is_initial",
                                        "_get_lr_called_within_step", "_last_lr"]
    assert sched.state_dict()["_step_count"] == 1 and sched.state_dict()["last_epoch"] == 0
    plateau = L.ReduceLROnPlateau(make_opt())
    assert list(plateau.state_dict()) == [
        "factor", "default_min_lr", "min_lrs", "patience", "cooldown", "eps", "last_epoch",
        "_last_lr", "mode_worse", "mode", "threshold", "threshold_mode", "best",
        "cooldown_counter", "num_bad_epochs"]


SCHEDULERS = {
    "step": lambda o: L.StepLR(o, 2, gamma=0.5),
    "multistep": lambda o: L.MultiStepLR(o, [1, 4]),
    "linear": lambda o: L.LinearLR(o, total_iters=6),
    "cosine": lambda o: L.CosineAnnealingLR(o, T_max=5, eta_min=0.001),
    "warm_restarts": lambda o: L.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2),
    "one_cycle": lambda o: L.OneCycleLR(o, max_lr=0.5, total_steps=12),
    "sequential": lambda o: L.SequentialLR(o, [L.LinearLR(o, total_iters=2),
                                               L.ExponentialLR(o, 0.9)], milestones=[3]),
    "chained": lambda o: L.ChainedScheduler([L.StepLR(o, 3), L.ExponentialLR(o, 0.8)]),
    "cyclic": lambda o: L.CyclicLR(o, 0.01, [0.2, 0.1], step_size_up=3, mode="triangular2"),
}


@pytest.mark.parametrize("name", SCHEDULERS)
def test_load_state_dict_resumes_the_schedule(name):
    make = SCHEDULERS[name]
    opt = make_opt(momentum=0.9)
    sched = make(opt)
    for _ in range(4):
        opt.step()
        sched.step()
    saved_opt, saved_sched = copy.deepcopy(opt.state_dict()), copy.deepcopy(sched.state_dict())
    rest = []
    for _ in range(5):
        opt.step()
        sched.step()
        rest.append(sched.get_last_lr() + [g.get("momentum") for g in opt.param_groups])

    opt2 = make_opt(momentum=0.9)
    sched2 = make(opt2)
    opt2.load_state_dict(saved_opt)
    sched2.load_state_dict(saved_sched)
    assert sched2.get_last_lr() == saved_sched["_last_lr"]
    resumed = []
    for _ in range(5):
        opt2.step()
        sched2.step()
        resumed.append(sched2.get_last_lr() + [g.get("momentum") for g in opt2.param_groups])
    assert resumed == rest


def test_lambda_lr_state_dict_saves_callable_objects_only():
    class Decay:
        def __init__(self, rate):
            self.rate = rate

        def __call__(self, epoch):
            return self.rate ** epoch

    sched = L.LambdaLR(make_opt(), [Decay(0.5), lambda e: 1.0])
    state = sched.state_dict()
    assert state["lr_lambdas"] == [{"rate": 0.5}, None]
    other = L.LambdaLR(make_opt(), [Decay(0.9), lambda e: 1.0])
    other.load_state_dict(state)
    assert other.lr_lambdas[0].rate == 0.5
    assert "lr_lambdas" in state     # the caller's dict is left whole


def test_resuming_with_last_epoch_keeps_the_lr_and_needs_initial_lr():
    opt = make_opt()
    with pytest.raises(KeyError, match="param 'initial_lr' is not specified in param_groups\\[0\\] "
                                       "when resuming scheduler with last_epoch >= 0."):
        L.StepLR(opt, 2, last_epoch=3)
    for group in opt.param_groups:
        group["initial_lr"] = group["lr"]
        group["lr"] *= 0.8 ** 4
    sched = L.ExponentialLR(opt, gamma=0.8, last_epoch=3)
    assert sched.last_epoch == 4
    assert_lrs(sched.get_last_lr(), [BASE[0] * 0.8 ** 4, BASE[1] * 0.8 ** 4])
    sched.step()
    assert_lrs(sched.get_last_lr(), [BASE[0] * 0.8 ** 5, BASE[1] * 0.8 ** 5])


def test_tensor_lr_is_updated_in_place():
    p = nn.Parameter(fusegrad.zeros(2))
    lr = fusegrad.tensor(0.1, dtype=fusegrad.float64)
    opt = optim.SGD([p], lr=lr)
    sched = L.StepLR(opt, step_size=1, gamma=0.5)
    sched.step()
    assert opt.param_groups[0]["lr"] is lr and lr.item() == pytest.approx(0.05)
    assert sched.get_last_lr()[0] is not lr


def test_constructor_errors_match_torch():
    opt = make_opt()
    cases = [
        (lambda: L.StepLR(object(), 2), TypeError, "object is not an Optimizer"),
        (lambda: L.ConstantLR(opt, factor=2.0), ValueError,
         "Constant multiplicative factor expected to be between 0 and 1."),
        (lambda: L.LinearLR(opt, start_factor=0), ValueError,
         "Starting multiplicative factor expected to be greater than 0 and less or equal to 1."),
        (lambda: L.LinearLR(opt, end_factor=1.5), ValueError,
         "Ending multiplicative factor expected to be between 0 and 1."),
        (lambda: L.LambdaLR(opt, [lambda e: 1.0]), ValueError, "Expected 2 lr_lambdas, but got 1"),
        (lambda: L.OneCycleLR(opt, 0.1), ValueError,
         "You must define either total_steps OR (epochs AND steps_per_epoch)"),
        (lambda: L.OneCycleLR(opt, 0.1, total_steps=0), ValueError,
         "Expected positive integer total_steps, but got 0"),
        (lambda: L.OneCycleLR(opt, 0.1, total_steps=5, pct_start=1), ValueError,
         "Expected float between 0 and 1 pct_start, but got 1"),
        (lambda: L.OneCycleLR(opt, 0.1, total_steps=5, anneal_strategy="exp"), ValueError,
         "anneal_strategy must be one of 'cos' or 'linear', instead got exp"),
        (lambda: L.OneCycleLR(opt, [0.1], total_steps=5), ValueError,
         "max_lr must have the same length as optimizer.param_groups. max_lr has 1 values, "
         "param_groups has 2."),
        (lambda: L.CosineAnnealingWarmRestarts(opt, T_0=0), ValueError,
         "Expected positive integer T_0, but got 0"),
        (lambda: L.CosineAnnealingWarmRestarts(opt, T_0=2, T_mult=0), ValueError,
         "Expected integer T_mult >= 1, but got 0"),
        (lambda: L.SequentialLR(opt, [], []), ValueError,
         "SequentialLR expects at least one scheduler, but got no scheduler."),
        (lambda: L.SequentialLR(opt, [L.StepLR(opt, 2)], [1]), ValueError,
         "Sequential Schedulers expects number of schedulers provided to be one more than the "
         "number of milestone points, but got number of schedulers 1 and the number of "
         "milestones to be equal to 1"),
        (lambda: L.ChainedScheduler([L.ReduceLROnPlateau(opt)]), ValueError,
         "ChainedScheduler does not support `ReduceLROnPlateau` scheduler as it requires "
         "additional kwargs to be specified when calling `step`, but got one at index 0 in the "
         "given schedulers sequence."),
        (lambda: L.ReduceLROnPlateau(opt, min_lr=[0.1]), ValueError, "expected 2 min_lrs, got 1"),
        (lambda: L.CyclicLR(opt, 0.1, 0.2, mode="cosine"), ValueError,
         "mode is invalid and scale_fn is None"),
        (lambda: L.CyclicLR(opt, [0.1], 0.2), ValueError,
         "base_lr must have the same length as optimizer.param_groups. base_lr has 1 values, "
         "param_groups has 2."),
        (lambda: L.CyclicLR(make_opt(optim.Adagrad), 0.1, 0.2), ValueError,
         "optimizer must support momentum or beta1 with `cycle_momentum` option enabled"),
    ]
    for make, exc, message in cases:
        with pytest.raises(exc) as err:
            make()
        assert str(err.value) == message, message


def test_reachable_through_the_torch_namespace():
    import fusegrad as torch
    assert torch.optim.lr_scheduler.StepLR is L.StepLR
    assert issubclass(torch.optim.lr_scheduler._LRScheduler, torch.optim.lr_scheduler.LRScheduler)


# --------------------------------------------------------------------------- torch, if present

TORCH_CASES = {
    **SCHEDULERS,
    "constant": lambda o: L.ConstantLR(o, factor=0.5, total_iters=3),
    "exponential": lambda o: L.ExponentialLR(o, 0.7),
    "polynomial": lambda o: L.PolynomialLR(o, total_iters=5, power=1.5),
    "multiplicative": lambda o: L.MultiplicativeLR(o, lambda e: 0.95),
    "lambda": lambda o: L.LambdaLR(o, lambda e: 1 / (1 + e)),
    "one_cycle_3": lambda o: L.OneCycleLR(o, max_lr=[0.5, 0.2], total_steps=12, three_phase=True,
                                          anneal_strategy="linear"),
    "cosine_long": lambda o: L.CosineAnnealingLR(o, T_max=3),
    "cyclic_exp": lambda o: L.CyclicLR(o, [0.01, 0.02], 0.3, step_size_up=2, step_size_down=5,
                                       mode="exp_range", gamma=0.95),
}


@pytest.mark.parametrize("name", TORCH_CASES)
def test_matches_torch(name):
    torch = pytest.importorskip("torch")
    import types
    # The same constructor call, evaluated against torch's classes.
    fake = types.SimpleNamespace(**{k: getattr(torch.optim.lr_scheduler, k) for k in L.__all__})
    make = TORCH_CASES[name]
    make_torch = types.FunctionType(make.__code__, {**make.__globals__, "L": fake})
    ps = [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)]
    topt = torch.optim.SGD([{"params": [ps[0]], "lr": BASE[0]},
                            {"params": [ps[1]], "lr": BASE[1]}], momentum=0.9)
    tsched = make_torch(topt)
    expected = [tsched.get_last_lr()]
    for _ in range(11):
        topt.step()
        tsched.step()
        expected.append(tsched.get_last_lr())
    assert_lrs(trajectory(make, 12), np.array(expected, dtype=np.float64))
