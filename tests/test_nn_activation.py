"""Activations added for torch parity (hardtanh, relu6, elu, selu, celu, mish, hardswish,
hardsigmoid, prelu, softsign, tanhshrink), softmax as a function and a method, and the pad modes:
values against numpy, torch's gradients at the kinks, finite differences, compiled against
eager, torch as an optional oracle."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad
import fusegrad as fg
from fusegrad import nn
from fusegrad.autograd.gradcheck import gradcheck
from fusegrad.nn import functional as NF

RNG = np.random.default_rng(5)
ALPHA, SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
KINKS = np.array([-4.0, -3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0, 4.0, 7.0])


def softplus(x):
    return np.log1p(np.exp(x))


ACTIVATIONS = {
    "hardtanh": (lambda x: NF.hardtanh(x, -1.0, 0.5), lambda x: np.clip(x, -1.0, 0.5),
                 lambda x: ((x > -1.0) & (x < 0.5)).astype(float)),
    "relu6": (NF.relu6, lambda x: np.clip(x, 0, 6), lambda x: ((x > 0) & (x < 6)).astype(float)),
    "elu": (lambda x: NF.elu(x, 0.7), lambda x: np.where(x > 0, x, 0.7 * np.expm1(x)),
            lambda x: np.where(x > 0, 1.0, 0.7 * np.exp(x))),
    "selu": (NF.selu, lambda x: SCALE * np.where(x > 0, x, ALPHA * np.expm1(x)),
             lambda x: SCALE * np.where(x > 0, 1.0, ALPHA * np.exp(x))),
    "celu": (lambda x: NF.celu(x, 2.0), lambda x: np.where(x > 0, x, 2.0 * np.expm1(x / 2.0)),
             lambda x: np.where(x > 0, 1.0, np.exp(x / 2.0))),
    "mish": (NF.mish, lambda x: x * np.tanh(softplus(x)), None),
    "hardswish": (NF.hardswish, lambda x: x * np.clip(x + 3, 0, 6) / 6,
                  # torch 2.13: 0 at -3 and 1 at 3 (its hardswish_backward's bounds)
                  lambda x: np.where(x <= -3, 0.0, np.where(x < 3, (2 * x + 3) / 6, 1.0))),
    "hardsigmoid": (NF.hardsigmoid, lambda x: np.clip(x + 3, 0, 6) / 6,
                    lambda x: np.where((x > -3) & (x < 3), 1 / 6, 0.0)),
    "softsign": (NF.softsign, lambda x: x / (1 + np.abs(x)), None),
    "tanhshrink": (NF.tanhshrink, lambda x: x - np.tanh(x), None),
    "logsigmoid": (NF.logsigmoid, lambda x: -softplus(-x), lambda x: 1 / (1 + np.exp(x))),
    "softshrink": (lambda x: NF.softshrink(x, 0.5),
                   lambda x: np.where(x > 0.5, x - 0.5, np.where(x < -0.5, x + 0.5, 0.0)),
                   lambda x: ((x > 0.5) | (x < -0.5)).astype(float)),
    "hardshrink": (lambda x: NF.hardshrink(x, 0.5), lambda x: np.where(np.abs(x) > 0.5, x, 0.0),
                   lambda x: (np.abs(x) > 0.5).astype(float)),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_values_and_gradients(name):
    fn, ref, dref = ACTIVATIONS[name]
    x = fusegrad.tensor(KINKS, requires_grad=True)
    y = fn(x)
    np.testing.assert_allclose(y.detach().numpy(), ref(KINKS), rtol=1e-12, atol=1e-12)
    if dref is not None:     # torch's gradient, including at the kinks
        y.sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), dref(KINKS), rtol=1e-12, atol=1e-12)
    smooth = fusegrad.tensor(RNG.uniform(-5, 5, 12) + 0.01, requires_grad=True)
    assert gradcheck(fn, (smooth,))


def test_activations_do_not_overflow_into_nan_gradients():
    x = fusegrad.tensor([1000.0, -1000.0], requires_grad=True)
    (NF.elu(x) + NF.celu(x, 0.5) + NF.selu(x) + NF.mish(x)).sum().backward()
    assert np.isfinite(x.grad.numpy()).all()


def test_inplace_variants_and_modules():
    x = fusegrad.tensor(KINKS.copy())
    NF.hardtanh(x, inplace=True)
    np.testing.assert_array_equal(x.numpy(), np.clip(KINKS, -1, 1))
    t = fusegrad.tensor(KINKS)
    for module, fn in [(nn.Hardtanh(-2, 2), lambda v: NF.hardtanh(v, -2, 2)), (nn.ReLU6(), NF.relu6),
                       (nn.ELU(0.5), lambda v: NF.elu(v, 0.5)), (nn.SELU(), NF.selu),
                       (nn.CELU(0.5), lambda v: NF.celu(v, 0.5)), (nn.Mish(), NF.mish),
                       (nn.Hardswish(), NF.hardswish), (nn.Hardsigmoid(), NF.hardsigmoid),
                       (nn.Softsign(), NF.softsign), (nn.Tanhshrink(), NF.tanhshrink)]:
        np.testing.assert_array_equal(module(t).numpy(), fn(t).numpy())
    assert repr(nn.Hardtanh(-2, 2)) == "Hardtanh(min_val=-2, max_val=2)"
    assert repr(nn.ELU(alpha=0.5, inplace=True)) == "ELU(alpha=0.5, inplace=True)"


def test_prelu():
    x = RNG.standard_normal((2, 3, 4))
    w = np.array([0.1, 0.2, 0.3])
    xt, wt = fusegrad.tensor(x, requires_grad=True), fusegrad.tensor(w, requires_grad=True)
    y = NF.prelu(xt, wt)
    np.testing.assert_allclose(y.detach().numpy(), np.where(x > 0, x, w[:, None] * x))
    assert y.grad_fn.name() == "PreluKernelBackward0"
    assert gradcheck(NF.prelu, (xt, wt))
    m = nn.PReLU(3)
    np.testing.assert_array_equal(m.weight.detach().numpy(), np.full(3, 0.25, np.float32))
    assert fusegrad.prelu(fusegrad.tensor(x), fusegrad.tensor([0.5])).shape == (2, 3, 4)
    with pytest.raises(RuntimeError, match="Mismatch of parameter numbers"):
        NF.prelu(fusegrad.tensor(x), fusegrad.tensor([0.1, 0.2]))


def test_softmax_is_a_function_and_a_method():
    x = fusegrad.tensor(RNG.standard_normal((3, 4)))
    e = np.exp(x.numpy() - x.numpy().max(1, keepdims=True))
    np.testing.assert_allclose(x.softmax(1).numpy(), e / e.sum(1, keepdims=True))
    np.testing.assert_allclose(fusegrad.softmax(x, dim=1).numpy(), x.softmax(dim=1).numpy())
    np.testing.assert_allclose(fusegrad.log_softmax(x, 0).numpy(), NF.log_softmax(x, 0).numpy())
    np.testing.assert_allclose(x.log_softmax(-1).exp().sum(-1).numpy(), np.ones(3))
    assert fusegrad.softmax(x.float(), 1, dtype=fusegrad.float64).dtype is fusegrad.float64


@pytest.mark.parametrize("mode,np_mode", [("reflect", "reflect"), ("replicate", "edge"),
                                          ("circular", "wrap")])
def test_pad_modes_match_numpy(mode, np_mode):
    a = RNG.standard_normal((2, 3, 5, 4))
    y = NF.pad(fusegrad.tensor(a), (1, 2, 3, 0), mode=mode)
    np.testing.assert_array_equal(y.numpy(), np.pad(a, [(0, 0), (0, 0), (3, 0), (1, 2)],
                                                    mode=np_mode))
    y1 = NF.pad(fusegrad.tensor(a[0]), (2, 2), mode=mode)
    np.testing.assert_array_equal(y1.numpy(), np.pad(a[0], [(0, 0), (0, 0), (2, 2)], mode=np_mode))
    x = fusegrad.tensor(RNG.standard_normal((1, 2, 4)), requires_grad=True)
    assert gradcheck(lambda x: NF.pad(x, (2, 3), mode=mode), (x,))


@pytest.mark.parametrize("compiled", [False, True])
def test_pad_modes_with_negative_amounts_crop_as_torch(compiled):
    # torch's values: reflect and replicate index the whole input and crop the result (they
    # raised: the reflected block was taken from the cropped data); circular wraps the crop
    x = fusegrad.arange(5.0).reshape(1, 1, 5)
    cases = {((-1, 2), "reflect"): [1, 2, 3, 4, 3, 2], ((-1, 2), "replicate"): [1, 2, 3, 4, 4, 4],
             ((-1, 2), "circular"): [1, 2, 3, 4, 1, 2], ((3, -3), "reflect"): [3, 2, 1, 0, 1],
             ((3, -5), "reflect"): [3, 2, 1], ((3, -5), "replicate"): [0, 0, 0],
             ((2, -1), "circular"): [2, 3, 0, 1, 2, 3], ((-3, 1), "reflect"): [3, 4, 3],
             ((-1, 4), "reflect"): [1, 2, 3, 4, 3, 2, 1, 0], ((-2, -1), "replicate"): [2, 3]}
    for (amounts, mode), want in cases.items():
        def f(x, p=amounts, m=mode):
            return NF.pad(x, p, mode=m)
        y = (fusegrad.compile(f) if compiled else f)(x)
        np.testing.assert_array_equal(y.numpy().ravel(), want, err_msg=f"{amounts} {mode}")
    a = fusegrad.tensor(RNG.standard_normal((2, 2, 4, 4)), requires_grad=True)
    for mode in ("reflect", "replicate"):
        assert gradcheck(lambda a, m=mode: NF.pad(a, (-1, 2, 2, -1), mode=m), (a,))
    assert NF.pad(fusegrad.zeros(1, 1, 5, 5), (0, 0, 0, -5), mode="reflect").shape == (1, 1, 0, 5)
    with pytest.raises(RuntimeError, match=r"input \(W: 5\) is too small. Calculated output W: 0"):
        NF.pad(x, (0, -5), mode="reflect")
    with pytest.raises(RuntimeError, match=r"input \(H: 5, W: 5 \) is too small. Calculated "
                                           r"output H: 0 W: 0"):
        NF.pad(fusegrad.zeros(1, 1, 5, 5), (0, -5, 0, -5), mode="replicate")
    with pytest.raises(RuntimeError, match=r"negative dimension -1: \[1, 1, -1, 5\]"):
        NF.pad(fusegrad.zeros(1, 1, 5, 5), (0, 0, 0, -6), mode="reflect")


def test_pad_mode_errors():
    with pytest.raises(RuntimeError, match="Padding size should be less than"):
        NF.pad(fusegrad.zeros(1, 1, 3), (3, 0), mode="reflect")
    with pytest.raises(NotImplementedError, match="Unrecognised padding mode"):
        NF.pad(fusegrad.zeros(1, 1, 3), (1, 1), mode="mirror")
    # torch's messages: the pad pair as given, numbered as arguments from the last dim
    with pytest.raises(RuntimeError, match=r"Argument #6: .* padding \(1, 5\) at dimension 1 "
                                           r"of input \[2, 4, 3\]"):
        NF.pad(fusegrad.zeros(2, 4, 3), (1, 1, 1, 5), mode="reflect")
    with pytest.raises(NotImplementedError, match="Padding size 2 is not supported for 1D input"):
        NF.pad(fusegrad.zeros(4), (1, 1), mode="replicate")
    with pytest.raises(NotImplementedError, match="Padding size 2 is not supported for 4D input"):
        NF.pad(fusegrad.zeros(1, 2, 3, 4), (1, 1), mode="circular")
    with pytest.raises(RuntimeError, match="other non-zero dimensions for input, but got: "
                                           r"\[2, 0\]"):
        NF.pad(fusegrad.zeros(2, 0), (1, 1), mode="replicate")
    with pytest.raises(RuntimeError, match="doesn't take in value argument"):
        NF.pad(fusegrad.zeros(2, 3), (1, 1), mode="reflect", value=1.0)


def test_compiled_activations_and_pads_match_eager():
    x = fusegrad.tensor(RNG.standard_normal((2, 3, 5)).astype(np.float32) * 4)
    w = fusegrad.tensor(np.array([0.1, 0.2, 0.3], np.float32))

    def f(x):
        ys = [fn(x) for fn, _, _ in ACTIVATIONS.values()]
        ys += [NF.prelu(x, w), x.softmax(-1), NF.pad(x, (2, 1), mode="reflect"),
               NF.pad(x, (1, 1), mode="circular"), NF.pad(x, (3, 0), mode="replicate")]
        return tuple(ys)

    def loss(x):
        return sum((y * y).sum() for y in f(x))
    for e, c in zip(f(x), fusegrad.compile(f)(x)):
        np.testing.assert_allclose(c.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fusegrad.compile(fusegrad.grad(loss))(x).numpy(),
                               fusegrad.grad(loss)(x).numpy(), rtol=1e-4, atol=1e-5)


def test_against_torch():
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((2, 3, 5)).astype(np.float32) * 4
    for name in ("hardtanh", "relu6", "selu", "mish", "hardswish", "hardsigmoid"):
        ours = getattr(NF, name)(fusegrad.tensor(x))
        ref = getattr(torch.nn.functional, name)(torch.tensor(x))
        np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    for mode in ("reflect", "replicate", "circular"):
        np.testing.assert_array_equal(
            NF.pad(fusegrad.tensor(x), (2, 1), mode=mode).numpy(),
            torch.nn.functional.pad(torch.tensor(x), (2, 1), mode=mode).numpy())


def test_hardswish_gradient_at_its_bounds_is_torchs():
    # torch: 0 up to -3, 1 from 3 (the middle piece's (2x + 3) / 6 gave -0.5 and 1.5 there).
    x = fg.tensor([-4.0, -3.0, -1.0, 2.0, 3.0, 5.0], requires_grad=True)
    fg.nn.functional.hardswish(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 0.0, 1 / 6, 7 / 6, 1.0, 1.0], rtol=1e-6)


@pytest.mark.parametrize("name", ["silu", "hardswish", "hardsigmoid", "mish", "elu", "selu",
                                  "celu", "hardtanh", "relu6", "leaky_relu"])
def test_inplace_activation_of_a_tensor_with_history_has_a_gradient(name):
    # The in-place form read its input in the backward after overwriting it: "modified by an
    # inplace operation". It now reads a copy, as torch saves the original.
    a = np.array([[-4.0, -1.0, 0.5, 2.0, 7.0]], np.float32)
    fn = getattr(fg.nn.functional, name)
    x = fg.tensor(a, requires_grad=True)
    y = fn(x * 1.0, inplace=True)
    y.sum().backward()
    x2 = fg.tensor(a, requires_grad=True)
    fn(x2 * 1.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), x2.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(y.detach().numpy(), fn(fg.tensor(a)).numpy(), rtol=1e-6)


def test_logsigmoid_is_stable_and_twice_differentiable_at_zero():
    x = fusegrad.tensor([-200.0, 0.0, 200.0], dtype=fusegrad.float64, requires_grad=True)
    y = nn.LogSigmoid()(x)
    np.testing.assert_allclose(y.detach().numpy(), [-200.0, -np.log(2.0), 0.0], atol=1e-12)
    (g,) = fg.autograd.grad(y.sum(), x, create_graph=True)
    (h,) = fg.autograd.grad(g.sum(), x)
    np.testing.assert_allclose(h.numpy(), [0.0, -0.25, 0.0], atol=1e-12)   # -sigmoid'(x)
    out = nn.Softshrink(0.5)(fusegrad.tensor([float("nan"), -1.0]))
    assert np.isnan(out.numpy()[0]) and out.numpy()[1] == -0.5
    assert repr(nn.Hardshrink(0.25)) == "Hardshrink(0.25)"


def _erf(x):
    import math
    return np.vectorize(math.erf)(x)


def _sixteen_bit_ok(got, want: np.ndarray, x: np.ndarray, dtype) -> np.ndarray:
    """Where ``got`` is ``want`` (float64) rounded once to ``dtype`` from float32 math: within
    half an ulp (subnormal ulps included) plus a few float32 ulps of the input's scale (gelu's
    1 + erf cancels in float32 for x < -3; torch's does too)."""
    info = fg.finfo(dtype)
    g = got.float().numpy().astype(np.float64)
    tol = info.eps / 2 * np.abs(want) + float(info.smallest_normal) * info.eps / 2
    return np.abs(g - want) <= tol + 2.0 ** -22 * np.maximum(np.abs(x), 1)


SIXTEEN_BIT = {
    "gelu": (NF.gelu, lambda x: x * 0.5 * (1 + _erf(x / np.sqrt(2)))),
    "silu": (NF.silu, lambda x: x / (1 + np.exp(-x))),
    "sigmoid": (fg.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    "softplus": (NF.softplus, lambda x: np.log1p(np.exp(x))),
    "logsigmoid": (NF.logsigmoid, lambda x: -np.log1p(np.exp(-x))),
    "elu": (NF.elu, lambda x: np.where(x > 0, x, np.expm1(x))),
    "mish": (NF.mish, lambda x: x * np.tanh(np.log1p(np.exp(x)))),
    "hardswish": (NF.hardswish, lambda x: x * np.clip(x + 3, 0, 6) / 6),
    "hardsigmoid": (NF.hardsigmoid, lambda x: np.clip(x + 3, 0, 6) / 6),
    "leaky_relu": (lambda x: NF.leaky_relu(x, 0.1), lambda x: np.where(x > 0, x, 0.1 * x)),
    "logaddexp": (lambda x: fg.logaddexp(x, x * 0.5), lambda x: np.logaddexp(x, x * 0.5)),
    "softmax": (lambda x: NF.softmax(x, -1), lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True)),
    "log_softmax": (lambda x: NF.log_softmax(x, -1),
                    lambda x: x - x.max(-1, keepdims=True)
                    - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))),
}


@pytest.mark.parametrize("dtype", [fg.float16, fg.bfloat16], ids=str)
@pytest.mark.parametrize("name", sorted(SIXTEEN_BIT))
def test_sixteen_bit_activations_round_once_from_float32(name, dtype):
    """torch computes these in float32 for float16 and bfloat16 and rounds the result once;
    rounding every intermediate gave bfloat16 gelu(-4.34) = -0.0 (not -3.0e-5), float16
    sigmoid(8) = 1.0 (not 0.99951) and softmax 16 ulp off, eager and compiled alike."""
    fn, ref = SIXTEEN_BIT[name]
    x = fg.tensor(np.random.default_rng(3).standard_normal((4, 64)) * 4 + [[0.0], [-4.34375],
                                                                          [8.0], [2.0]])
    x = x.to(dtype)
    x64 = x.double().numpy()
    want = ref(x64)
    for got in (fn(x), fusegrad.compile(fn)(x)):
        assert got.dtype is dtype
        ok = _sixteen_bit_ok(got, want, x64, dtype)
        assert ok.all(), (name, got.float().numpy()[~ok][:4], want[~ok][:4])
