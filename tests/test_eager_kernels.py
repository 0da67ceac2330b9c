"""Eager composite ops on large float32 CPU tensors run as the fused kernels of their compiled
definition (fusegrad.tracer.eager_kernels): values and gradients against numpy references
and against the same op run primitive by primitive, higher-order gradients, torch's node
names, and every case that must stay eager."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.ops.composite import CompositeNode
from fusegrad.tracer.compiled_autograd import _OutputBackward

F = fg.nn.functional
THRESHOLD = 4096
SHAPE = (64, 96)                   # 6144 elements: above THRESHOLD


@pytest.fixture
def kernels():
    """Eager kernels on from THRESHOLD elements; the setting is restored afterwards."""
    old = fg.config.eager_kernel_threshold
    fg.config.eager_kernel_threshold = THRESHOLD
    yield
    fg.config.eager_kernel_threshold = old


def _both(fn, *arrays, requires_grad=True):
    """(output, input grads) of ``fn`` on tensors of ``arrays`` with eager kernels on, then
    off; the first output's grad_fn is returned too."""
    results = []
    for threshold in (THRESHOLD, 0):
        fg.config.eager_kernel_threshold = threshold
        ts = [fg.tensor(a, requires_grad=requires_grad and a.dtype.kind == "f") for a in arrays]
        out = fn(*ts)
        seed = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
        if requires_grad:
            out.backward(fg.tensor(seed))
        grads = [t.grad.numpy() if t.grad is not None else None for t in ts]
        results.append((out, grads))
    fg.config.eager_kernel_threshold = THRESHOLD
    return results


def _gelu_ref(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _softmax_ref(x, dim):
    e = np.exp(x - x.max(dim, keepdims=True))
    return e / e.sum(dim, keepdims=True)


CASES = {
    "gelu": (lambda x: F.gelu(x), lambda x: _gelu_ref(x), "GeluBackward0"),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"),
                  lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) *
                                                   (x + 0.044715 * x ** 3))), "GeluBackward0"),
    "silu": (lambda x: F.silu(x), lambda x: x / (1 + np.exp(-x)), "SiluBackward0"),
    "softplus": (lambda x: F.softplus(x), lambda x: np.log1p(np.exp(x)), "SoftplusBackward0"),
    "elu": (lambda x: F.elu(x), lambda x: np.where(x > 0, x, np.expm1(x)), "EluBackward0"),
    "mish": (lambda x: F.mish(x), lambda x: x * np.tanh(np.log1p(np.exp(x))), "MishBackward0"),
    "softmax": (lambda x: F.softmax(x, dim=-1), lambda x: _softmax_ref(x, -1),
                "SoftmaxBackward0"),
    "softmax0": (lambda x: F.softmax(x, dim=0), lambda x: _softmax_ref(x, 0),
                 "SoftmaxBackward0"),
    "log_softmax": (lambda x: F.log_softmax(x, dim=1), lambda x: np.log(_softmax_ref(x, 1)),
                    "LogSoftmaxBackward0"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_unary_composites_match_numpy_and_the_primitive_path(kernels, name):
    fn, ref, grad_name = CASES[name]
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32) * 3
    (out_k, (gk,)), (out_e, (ge,)) = _both(fn, x)
    assert isinstance(out_k.grad_fn, _OutputBackward)          # the kernel path ran
    assert isinstance(out_e.grad_fn, CompositeNode)            # the primitive path ran
    assert out_k.grad_fn.name() == out_e.grad_fn.name() == grad_name
    np.testing.assert_allclose(out_k.detach().numpy(), ref(x.astype(np.float64)), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(out_k.detach().numpy(), out_e.detach().numpy(), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(gk, ge, rtol=2e-5, atol=2e-6)


def test_gelu_gradient_matches_finite_differences(kernels):
    x = np.random.default_rng(0).standard_normal(SHAPE)
    t = fg.tensor(x.astype(np.float32), requires_grad=True)
    F.gelu(t).sum().backward()
    h = 1e-6
    fd = (_gelu_ref(x + h) - _gelu_ref(x - h)) / (2 * h)
    np.testing.assert_allclose(t.grad.numpy(), fd, rtol=1e-5, atol=1e-5)


def test_layer_norm_with_affine_parameters(kernels):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 16, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    (out_k, gk), (out_e, ge) = _both(lambda x, w, b: F.layer_norm(x, (64,), w, b), x, w, b)
    assert isinstance(out_k.grad_fn, _OutputBackward)
    assert out_k.grad_fn.name() == "NativeLayerNormBackward0"
    x64 = x.astype(np.float64)
    mean, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
    ref = (x64 - mean) / np.sqrt(var + 1e-5) * w + b
    np.testing.assert_allclose(out_k.detach().numpy(), ref, rtol=1e-5, atol=1e-5)
    for a, e in zip(gk, ge):           # x, weight and bias each get their gradient
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


def test_relu_of_a_large_tensor_keeps_torchs_gradient_at_zero_and_nan(kernels):
    from fusegrad.ops.elementwise import RELU_KERNEL_MIN
    x = np.random.default_rng(0).standard_normal(RELU_KERNEL_MIN).astype(np.float32)
    x[:4] = [0.0, -0.0, np.nan, np.inf]
    seed = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    t = fg.tensor(x, requires_grad=True)
    out = F.relu(t)
    out.backward(fg.tensor(seed))
    assert isinstance(out.grad_fn, _OutputBackward) and out.grad_fn.name() == "ReluBackward0"
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(out.detach().numpy(), np.where(x <= 0, 0, x))
        np.testing.assert_array_equal(t.grad.numpy(), np.where(x <= 0, 0, seed))
    # in place, on a non-leaf: the same values, and the gradient flows through
    t2 = fg.tensor(x, requires_grad=True)
    y = t2 * 1.0
    y.relu_()
    y.backward(fg.tensor(seed))
    np.testing.assert_array_equal(t2.grad.numpy(), t.grad.numpy())


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batch_norm_training_updates_the_running_statistics(kernels, momentum):
    # The kernel writes the running statistics back as eager batch norm does. momentum=None
    # (the cumulative average) passes 1 / num_batches_tracked as a float64 tensor: that call
    # stays unfused, with the same values.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 6, 12, 12)).astype(np.float32) * 2 + 1    # 6912 elements
    seed = fg.tensor(rng.standard_normal(x.shape).astype(np.float32))
    results = []
    for threshold in (THRESHOLD, 0):
        fg.config.eager_kernel_threshold = threshold
        bn = fg.nn.BatchNorm2d(6, momentum=momentum)
        with fg.no_grad():
            bn.weight.copy_(fg.tensor(np.linspace(0.5, 2.0, 6, dtype=np.float32)))
            bn.bias.copy_(fg.tensor(np.linspace(-1.0, 1.0, 6, dtype=np.float32)))
        t = fg.tensor(x, requires_grad=True)
        for _ in range(2):
            out = bn(t)
        out.backward(seed)
        results.append((out, bn, [t.grad.numpy(), bn.weight.grad.numpy(), bn.bias.grad.numpy()]))
    fg.config.eager_kernel_threshold = THRESHOLD
    (out_k, bn_k, gk), (out_e, bn_e, ge) = results
    assert isinstance(out_k.grad_fn, _OutputBackward) == (momentum is not None)
    assert out_k.grad_fn.name() == out_e.grad_fn.name() == "NativeBatchNormBackward0"
    x64 = x.astype(np.float64)
    mean, var = x64.mean((0, 2, 3)), x64.var((0, 2, 3))
    scale = np.linspace(0.5, 2.0, 6)[:, None, None]
    ref = (x64 - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * scale \
        + np.linspace(-1.0, 1.0, 6)[:, None, None]
    np.testing.assert_allclose(out_k.detach().numpy(), ref, rtol=1e-5, atol=1e-5)
    # the share of the batch's statistics after two updates from 0 (mean) and 1 (var): the
    # cumulative average's factors are 1, then 1/2
    m = 1.0 if momentum is None else 1 - 0.9 ** 2
    unbiased = var * x[:, 0].size / (x[:, 0].size - 1)
    np.testing.assert_allclose(bn_k.running_mean.numpy(), m * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn_k.running_var.numpy(), (1 - m) + m * unbiased, rtol=1e-5)
    assert int(bn_k.num_batches_tracked) == 2
    for a, e in zip(gk, ge):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_and_mse(kernels, reduction):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((512, 20)).astype(np.float32)
    target = rng.integers(0, 20, 512)
    (out_k, (gk, _)), (out_e, (ge, _)) = _both(
        lambda x, t: F.cross_entropy(x, t, reduction=reduction), logits, target)
    assert isinstance(out_k.grad_fn, _OutputBackward)
    x64 = logits.astype(np.float64)
    logp = x64 - x64.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    losses = -logp[np.arange(512), target]
    ref = {"mean": losses.mean(), "sum": losses.sum(), "none": losses}[reduction]
    np.testing.assert_allclose(out_k.detach().numpy(), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gk, ge, rtol=1e-5, atol=1e-7)

    y = rng.standard_normal((512, 20)).astype(np.float32)
    (out_k, (gk, _)), (_, (ge, _)) = _both(
        lambda a, b: F.mse_loss(a, b.detach(), reduction=reduction), logits, y)
    ref = {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction](
        (x64 - y) ** 2)
    np.testing.assert_allclose(out_k.detach().numpy(), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gk, ge, rtol=1e-5, atol=1e-7)


def test_second_order_gradients_through_a_kernel(kernels):
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    results = []
    for threshold in (THRESHOLD, 0):
        fg.config.eager_kernel_threshold = threshold
        t = fg.tensor(x, requires_grad=True)
        (g,) = fg.autograd.grad(F.gelu(t).sum(), t, create_graph=True)
        (gg,) = fg.autograd.grad((g * g).sum(), t)
        results.append(gg.numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-4, atol=1e-5)


def test_inference_and_inputs_without_grad(kernels):
    x = fg.tensor(np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32))
    with fg.no_grad():
        y = F.softmax(x, -1)
    assert y.grad_fn is None and not y.requires_grad
    np.testing.assert_allclose(y.numpy(), _softmax_ref(x.numpy().astype(np.float64), -1),
                               rtol=2e-6, atol=1e-7)
    z = F.gelu(x)                      # grad mode, nothing requires grad
    assert z.grad_fn is None and not z.requires_grad


def test_hooks_retain_grad_and_version_checks(kernels):
    t = fg.tensor(np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32),
                  requires_grad=True)
    y = F.gelu(t)
    y.retain_grad()
    seen = []
    y.register_hook(lambda g: seen.append(g.shape))
    y.sum().backward()
    assert seen == [fg.Size(SHAPE)]
    np.testing.assert_array_equal(y.grad.numpy(), np.ones(SHAPE, np.float32))

    u = t * 1.0
    v = F.gelu(u)
    with fg.no_grad():
        u.add_(1.0)                    # the input the backward needs is changed
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        v.sum().backward()


def test_small_float64_and_half_tensors_stay_eager(kernels):
    rng = np.random.default_rng(0)
    small = fg.tensor(rng.standard_normal((4, 8)).astype(np.float32), requires_grad=True)
    assert isinstance(F.gelu(small).grad_fn, CompositeNode)
    wide = fg.tensor(rng.standard_normal(SHAPE), requires_grad=True)          # float64
    assert isinstance(F.gelu(wide).grad_fn, CompositeNode)
    half = fg.tensor(rng.standard_normal(SHAPE).astype(np.float16), requires_grad=True)
    assert isinstance(F.gelu(half).grad_fn, CompositeNode)
    fg.config.eager_kernel_threshold = 0                                       # off
    big = fg.tensor(rng.standard_normal(SHAPE).astype(np.float32), requires_grad=True)
    assert isinstance(F.gelu(big).grad_fn, CompositeNode)


def test_a_users_mistake_gets_the_eager_ops_error(kernels):
    x = fg.tensor(np.zeros(SHAPE, np.float32), requires_grad=True)
    with pytest.raises(IndexError, match="Dimension out of range"):
        F.softmax(x, dim=5)
    target = fg.tensor(np.full(SHAPE[0], 500))
    with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
        F.cross_entropy(x, target)


def test_inside_a_compiled_function_the_composite_is_traced(kernels):
    x = fg.tensor(np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32))
    f = fg.compile(lambda x: F.gelu(x) * 2)
    lowered = f.lower(x)
    assert any(n.op == "erf" for n in lowered.graph.nodes)     # fused, not a nested call
    np.testing.assert_allclose(f(x).detach().numpy(), 2 * _gelu_ref(x.numpy().astype(np.float64)),
                               rtol=2e-6, atol=2e-6)


def test_conv2d_with_padding_stride_and_groups(kernels):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 4, 16, 16)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    (out_k, gk), (out_e, ge) = _both(
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2), x, w, b)
    assert isinstance(out_k.grad_fn, _OutputBackward)
    assert out_k.grad_fn.name() == out_e.grad_fn.name() == "ConvolutionBackward0"
    # direct sum over the window, in float64
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((8, 6, 8, 8))
    for o in range(6):
        g = o // 3
        for i in range(3):
            for j in range(3):
                patch = xp[:, 2 * g:2 * g + 2, i:i + 16:2, j:j + 16:2]
                ref[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j])
        ref[:, o] += b[o]
    np.testing.assert_allclose(out_k.detach().numpy(), ref, rtol=1e-4, atol=1e-4)
    for a, e in zip(gk, ge):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("padding,stride", [(0, 2), (1, 1)])
def test_max_pool2d_sends_the_gradient_to_the_first_maximum(kernels, padding, stride):
    # small integers: many windows hold their maximum twice; a NaN is its window's maximum
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, (8, 4, 16, 16)).astype(np.float32)
    x[0, 0, 0, 1] = np.nan
    (out_k, gk), (out_e, ge) = _both(
        lambda x: F.max_pool2d(x, 3, stride=stride, padding=padding), x)
    assert isinstance(out_k.grad_fn, _OutputBackward)
    assert out_k.grad_fn.name() == out_e.grad_fn.name() == "MaxPool2DWithIndicesBackward0"
    xp = np.pad(x, ((0, 0), (0, 0), (padding,) * 2, (padding,) * 2), constant_values=-np.inf)
    n = out_k.shape[-1]
    ref = np.stack([xp[:, :, i:i + stride * n:stride, j:j + stride * n:stride]
                    for i in range(3) for j in range(3)]).max(axis=0)
    np.testing.assert_array_equal(out_k.detach().numpy(), ref)
    np.testing.assert_allclose(gk[0], ge[0], rtol=1e-5, atol=1e-6)
    # each window's gradient lands on one element: the totals agree
    seed = np.random.default_rng(1).standard_normal(out_k.shape).astype(np.float32)
    np.testing.assert_allclose(np.nansum(gk[0]), seed.sum(), rtol=1e-4)


def test_a_tensor_argument_and_a_none_in_its_place_are_different_kernels(kernels):
    # layer_norm without, then with, its affine parameters: same shapes, same other
    # arguments; the second must not run the first's kernel (which ignores weight and bias)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8, 192)).astype(np.float32)
    w = rng.standard_normal(192).astype(np.float32)
    F.layer_norm(fg.tensor(x), (192,))
    out = F.layer_norm(fg.tensor(x), (192,), fg.tensor(w), fg.tensor(w * 0.5))
    mu = x.astype(np.float64).mean(-1, keepdims=True)
    ref = (x - mu) / np.sqrt(x.astype(np.float64).var(-1, keepdims=True) + 1e-5) * w + w * 0.5
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_static_arguments_of_equal_value_and_another_type_are_different_keys():
    # 1 == 1.0 == True, and they hash alike, but they may trace differently
    from fusegrad.tracer.eager_kernels import _static
    assert len({_static(1), _static(1.0), _static(True)}) == 3
    assert len({_static((1, 2)), _static((1.0, 2)), _static((True, 2))}) == 3
    assert _static([1, 2]) == _static([1, 2]) != _static((1, 2))
    assert _static([(0, 1), (1, 1)]) == _static([(0, 1), (1, 1)])
    with pytest.raises(TypeError):
        _static([fg.ones(2)])


@pytest.mark.parametrize("shape", [(64, 96), (4, 16, 96)])
def test_linear_2d_and_batched(kernels, shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((80, 96)).astype(np.float32)
    b = rng.standard_normal(80).astype(np.float32)
    (out_k, gk), (out_e, ge) = _both(F.linear, x, w, b)
    assert isinstance(out_k.grad_fn, _OutputBackward)
    assert out_k.grad_fn.name() == out_e.grad_fn.name()
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + b
    np.testing.assert_allclose(out_k.detach().numpy(), ref, rtol=1e-4, atol=1e-4)
    for a, e in zip(gk, ge):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4)


def test_eager_kernels_are_static_whatever_automatic_dynamic_says(monkeypatch, kernels):
    # A symbolic program sums rows in other blocks than the static one: an eager op's bits
    # must not depend on whether automatic dynamic shapes was on when it first ran.
    from fusegrad.config import config
    from fusegrad.tracer.eager_kernels import EagerKernel
    monkeypatch.setattr(config, "automatic_dynamic_shapes", True)
    ek = EagerKernel(lambda x: (x * 2).exp().sum(-1), "SumBackward1")
    outs = [ek((fg.randn(n, 700),), {}) for n in (8, 9, 10)]
    (cf,) = ek.functions.values()
    assert all(o is not NotImplemented for o in outs) and cf.compiles == 3


def test_past_the_signature_limit_the_oldest_are_dropped_not_run_unfused(monkeypatch, kernels):
    # Running a new signature unfused once the limit is reached would make its bits depend on
    # what the process ran before.
    from fusegrad.tracer import eager_kernels
    monkeypatch.setattr(eager_kernels, "SIGNATURE_LIMIT", 2)
    ek = eager_kernels.EagerKernel(lambda x, k: (x * k).exp(), "ExpBackward0")
    for k in (1.0, 2.0, 3.0):                         # three keys: the first is dropped
        assert ek((fg.randn(8, 700), k), {}) is not NotImplemented
    assert len(ek.functions) == 2
    for n in (8, 9, 10):                              # three signatures of one key
        assert ek((fg.randn(n, 700), 3.0), {}) is not NotImplemented
