"""Batch, group, instance and RMS normalization: values and running statistics against numpy,
gradients against finite differences, compiled (running-stat updates included) against eager,
and torch as an optional oracle."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad
from fusegrad import nn
from fusegrad.autograd.gradcheck import gradcheck
from fusegrad.nn import functional as NF

RNG = np.random.default_rng(3)


def f32(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def f64(*shape) -> fusegrad.Tensor:
    return fusegrad.tensor(RNG.standard_normal(shape), requires_grad=True)


def bn_ref(x, rm, rv, w, b, momentum, eps=1e-5):
    """Training-mode batch norm and the updated running statistics."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mu, var = x.mean(axes), x.var(axes)
    n = x.size // x.shape[1]
    y = (x - mu.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    if w is not None:
        y = y * w.reshape(shape) + b.reshape(shape)
    return y, (1 - momentum) * rm + momentum * mu, (1 - momentum) * rv + momentum * var * n / (n - 1)


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (3, 3, 4, 5)])
def test_batch_norm_training_and_running_stats(shape):
    x, w, b = f32(*shape), f32(3), f32(3)
    rm, rv = fusegrad.zeros(3), fusegrad.ones(3)
    y = NF.batch_norm(fusegrad.tensor(x), rm, rv, fusegrad.tensor(w), fusegrad.tensor(b),
                      training=True, momentum=0.2)
    ry, rrm, rrv = bn_ref(x.astype(np.float64), np.zeros(3), np.ones(3), w, b, 0.2)
    np.testing.assert_allclose(y.numpy(), ry, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rm.numpy(), rrm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv.numpy(), rrv, rtol=1e-5, atol=1e-6)


def test_batch_norm_eval_uses_running_stats():
    x, rm, rv, w, b = f32(4, 3, 5), f32(3), np.abs(f32(3)) + 0.5, f32(3), f32(3)
    y = NF.batch_norm(fusegrad.tensor(x), fusegrad.tensor(rm), fusegrad.tensor(rv),
                      fusegrad.tensor(w), fusegrad.tensor(b), training=False, eps=1e-3)
    ref = (x - rm[:, None]) / np.sqrt(rv[:, None] + 1e-3) * w[:, None] + b[:, None]
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_batchnorm_module_momentum_none_is_a_cumulative_average():
    bn = nn.BatchNorm1d(3, momentum=None)
    batches = [f32(5, 3) for _ in range(3)]
    for x in batches:
        bn(fusegrad.tensor(x))
    np.testing.assert_allclose(bn.running_mean.numpy(), np.mean([x.mean(0) for x in batches], 0),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(),
                               np.mean([x.var(0, ddof=1) for x in batches], 0), rtol=1e-5)
    assert bn.num_batches_tracked.item() == 3
    assert bn.num_batches_tracked.dtype is fusegrad.int64


def test_batchnorm_module_modes():
    bn = nn.BatchNorm2d(3, affine=False, track_running_stats=False)
    assert bn.weight is None and bn.running_mean is None
    x = f32(2, 3, 4, 4)
    bn.eval()   # no running statistics: batch statistics even in eval mode
    y = bn(fusegrad.tensor(x))
    np.testing.assert_allclose(y.numpy(), bn_ref(x, 0, 0, None, None, 0.1)[0], rtol=1e-4,
                               atol=1e-5)
    bn2 = nn.BatchNorm2d(3)
    assert repr(bn2) == ("BatchNorm2d(3, eps=1e-05, momentum=0.1, affine=True, bias=True, "
                         "track_running_stats=True)")
    assert set(bn2.state_dict()) == {"weight", "bias", "running_mean", "running_var",
                                     "num_batches_tracked"}
    bn2.eval()
    np.testing.assert_allclose(bn2(fusegrad.tensor(x)).detach().numpy(),
                               x / np.sqrt(1 + 1e-5), rtol=1e-6)
    assert bn2.num_batches_tracked.item() == 0
    with pytest.raises(ValueError, match="expected 4D input \\(got 3D input\\)"):
        bn2(fusegrad.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        nn.BatchNorm1d(3)(fusegrad.zeros(1, 3))


def test_norm_modules_without_bias():
    # torch 2.13's bias=False keyword: a scale but no shift, and "bias=False" in the repr
    x = f32(4, 3, 5)
    w = np.array([0.5, 2.0, -1.0], dtype=np.float32)
    cases = [
        (nn.BatchNorm1d(3, bias=False), bn_ref(x, 0, 0, np.ones(3), np.zeros(3), 0.1)[0],
         "BatchNorm1d(3, eps=1e-05, momentum=0.1, affine=True, bias=False, "
         "track_running_stats=True)"),
        (nn.InstanceNorm1d(3, affine=True, bias=False),
         (x - x.mean(2, keepdims=True)) / np.sqrt(x.var(2, keepdims=True) + 1e-5),
         "InstanceNorm1d(3, eps=1e-05, momentum=0.1, affine=True, bias=False, "
         "track_running_stats=False)"),
        (nn.GroupNorm(1, 3, bias=False),
         (x - x.mean((1, 2), keepdims=True)) / np.sqrt(x.var((1, 2), keepdims=True) + 1e-5),
         "GroupNorm(1, 3, eps=1e-05, affine=True, bias=False)"),
    ]
    for module, normalized, text in cases:
        assert module.bias is None and repr(module) == text
        assert [n for n, _ in module.named_parameters()] == ["weight"]
        module.weight.data = fusegrad.tensor(w)
        y = module(fusegrad.tensor(x))
        np.testing.assert_allclose(y.detach().numpy(), normalized * w[:, None], rtol=1e-5,
                                   atol=1e-5)
    assert repr(nn.GroupNorm(1, 3)) == "GroupNorm(1, 3, eps=1e-05, affine=True, bias=True)"
    assert repr(nn.InstanceNorm2d(3)) == ("InstanceNorm2d(3, eps=1e-05, momentum=0.1, "
                                          "affine=False, bias=False, track_running_stats=False)")


def test_batch_norm_gradcheck_and_node_name():
    x, w, b = f64(4, 2, 3), f64(2), f64(2)
    assert gradcheck(lambda x, w, b: NF.batch_norm(x, None, None, w, b, training=True), (x, w, b))
    rm, rv = fusegrad.zeros(2, dtype=fusegrad.float64), fusegrad.ones(2, dtype=fusegrad.float64)
    assert gradcheck(lambda x, w, b: NF.batch_norm(x, rm, rv, w, b, training=False), (x, w, b))
    y = NF.batch_norm(x, None, None, w, b, training=True)
    assert y.grad_fn.name() == "NativeBatchNormBackward0"


def test_group_norm_matches_numpy_and_gradcheck():
    x, w, b = f32(2, 6, 3, 2), f32(6), f32(6)
    y = NF.group_norm(fusegrad.tensor(x), 3, fusegrad.tensor(w), fusegrad.tensor(b))
    g = x.reshape(2, 3, -1)
    ref = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5))
    ref = ref.reshape(x.shape) * w[:, None, None] + b[:, None, None]
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5)
    xs, ws, bs = f64(2, 4, 3), f64(4), f64(4)
    assert gradcheck(lambda x, w, b: NF.group_norm(x, 2, w, b), (xs, ws, bs))
    assert nn.GroupNorm(2, 6)(fusegrad.tensor(x)).shape == x.shape
    with pytest.raises(RuntimeError, match="divisible by num_groups"):
        NF.group_norm(fusegrad.tensor(x), 4)


def test_instance_norm_matches_numpy_and_updates_running_stats():
    x = f32(3, 2, 5)
    rm, rv = fusegrad.zeros(2), fusegrad.ones(2)
    y = NF.instance_norm(fusegrad.tensor(x), rm, rv, momentum=0.5)
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rm.numpy(), 0.5 * x.mean(-1).mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv.numpy(), 0.5 + 0.5 * x.var(-1, ddof=1).mean(0), rtol=1e-5)
    xs = f64(2, 2, 4)
    assert gradcheck(lambda x: NF.instance_norm(x), (xs,))
    m = nn.InstanceNorm2d(2, affine=True)
    assert m(fusegrad.randn(2, 4, 4)).shape == (2, 4, 4)


def test_instance_norm_with_momentum_none_keeps_its_running_stats():
    # torch's _InstanceNorm passes momentum 0.0 when it is None (no cumulative average as in
    # BatchNorm): the running statistics stay at their initial 0 and 1.
    m = nn.InstanceNorm2d(2, track_running_stats=True, momentum=None)
    m(fusegrad.tensor(f32(3, 2, 4, 4) * 2 + 1))
    np.testing.assert_array_equal(m.running_mean.numpy(), np.zeros(2, np.float32))
    np.testing.assert_array_equal(m.running_var.numpy(), np.ones(2, np.float32))
    m.eval()
    x = f32(1, 2, 4, 4)
    np.testing.assert_allclose(m(fusegrad.tensor(x)).numpy(), x / np.sqrt(1 + 1e-5), rtol=1e-6)


def test_rms_norm_matches_numpy_and_gradcheck():
    x, w = f32(3, 4, 5), f32(4, 5)
    y = NF.rms_norm(fusegrad.tensor(x), (4, 5), fusegrad.tensor(w))
    eps = np.finfo(np.float32).eps
    ref = x / np.sqrt((x * x).mean((1, 2), keepdims=True) + eps) * w
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-6)
    xs, ws = f64(2, 3), f64(3)
    assert gradcheck(lambda x, w: NF.rms_norm(x, 3, w, eps=1e-6), (xs, ws))
    m = nn.RMSNorm(5)
    np.testing.assert_allclose(m(fusegrad.tensor(x)).detach().numpy(),
                               x / np.sqrt((x * x).mean(-1, keepdims=True) + eps), rtol=1e-5)


def test_compiled_batchnorm_training_updates_running_stats_like_eager():
    x = fusegrad.tensor(f32(4, 3, 5, 5))
    eager, compiled = nn.BatchNorm2d(3), nn.BatchNorm2d(3)
    run = fusegrad.compile(lambda x: compiled(x))
    for _ in range(3):
        ye, yc = eager(x), run(x)
        np.testing.assert_allclose(yc.detach().numpy(), ye.detach().numpy(), rtol=1e-6,
                                   atol=1e-6)
    # equal to float32 rounding: compiled reductions sum in another order than numpy's
    np.testing.assert_allclose(compiled.running_mean.numpy(), eager.running_mean.numpy(),
                               rtol=2e-6, atol=1e-8)
    np.testing.assert_allclose(compiled.running_var.numpy(), eager.running_var.numpy(),
                               rtol=2e-6)
    assert compiled.num_batches_tracked.item() == eager.num_batches_tracked.item() == 3


def test_compiled_momentum_none_and_eval_mode():
    x = [fusegrad.tensor(f32(6, 3)) for _ in range(3)]
    eager, compiled = nn.BatchNorm1d(3, momentum=None), nn.BatchNorm1d(3, momentum=None)
    run = fusegrad.compile(lambda x: compiled(x))
    for xi in x:
        eager(xi), run(xi)
    np.testing.assert_allclose(compiled.running_mean.numpy(), eager.running_mean.numpy(),
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(compiled.running_var.numpy(), eager.running_var.numpy(), rtol=1e-6)
    eager.eval()
    compiled.eval()
    np.testing.assert_allclose(run(x[0]).detach().numpy(), eager(x[0]).detach().numpy(),
                               rtol=1e-6, atol=1e-6)


def test_compiled_training_step_with_batchnorm_matches_eager():
    data = fusegrad.tensor(f32(8, 2, 6, 6))
    target = fusegrad.tensor(RNG.integers(0, 3, 8))
    results = {}
    for mode in ("eager", "compiled"):
        fusegrad.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                              nn.GroupNorm(2, 4), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                              nn.Linear(4, 3))
        opt = fusegrad.optim.SGD(model.parameters(), lr=0.1)

        def step(x, y, model=model, opt=opt):
            opt.zero_grad()
            loss = NF.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        run = fusegrad.compile(step) if mode == "compiled" else step
        losses = [run(data, target).item() for _ in range(3)]
        results[mode] = (losses, model[1].running_mean.numpy().copy())
    np.testing.assert_allclose(results["compiled"][0], results["eager"][0], rtol=1e-5)
    np.testing.assert_allclose(results["compiled"][1], results["eager"][1], rtol=1e-5, atol=1e-6)


def test_against_torch():
    torch = pytest.importorskip("torch")
    x = f32(4, 3, 5, 5)
    ours, ref = nn.BatchNorm2d(3, momentum=None), torch.nn.BatchNorm2d(3, momentum=None)
    for _ in range(2):
        y, r = ours(fusegrad.tensor(x)), ref(torch.tensor(x))
    np.testing.assert_allclose(y.detach().numpy(), r.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours.running_var.numpy(), ref.running_var.numpy(), rtol=1e-5)
    np.testing.assert_allclose(NF.group_norm(fusegrad.tensor(x), 3).numpy(),
                               torch.nn.functional.group_norm(torch.tensor(x), 3).numpy(),
                               rtol=1e-4, atol=1e-5)


def test_batchnorm3d_and_instancenorm3d():
    x = f32(3, 2, 3, 2, 4)
    bn = nn.BatchNorm3d(2)
    np.testing.assert_allclose(bn(fusegrad.tensor(x)).detach().numpy(),
                               bn_ref(x, 0, 1, np.ones(2), np.zeros(2), 0.1)[0], rtol=1e-4,
                               atol=1e-5)
    inst = nn.InstanceNorm3d(2)(fusegrad.tensor(x))
    axes = (2, 3, 4)
    ref = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + 1e-5)
    np.testing.assert_allclose(inst.numpy(), ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="expected 5D input"):
        bn(fusegrad.zeros(2, 2, 3))
