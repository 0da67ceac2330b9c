"""fusegrad.fft: values against numpy.fft (float64), identities (inverse, Parseval), gradients
by central differences, compiled programs, torch's errors, and, where torch is installed,
values and gradients against torch.fft; a spectral loss trains a small conv net as torch does.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg

F64_EPS = np.finfo(np.float64).eps
F32_EPS = np.finfo(np.float32).eps
NORMS = [None, "backward", "ortho", "forward"]


def rand(*shape, seed=0, complex_=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    return x + 1j * rng.standard_normal(shape) if complex_ else x


def close(got: fg.Tensor, want: np.ndarray, eps=F64_EPS, growth=64):
    """Within ``growth`` ulps of the largest magnitude: an FFT's error is relative to the
    signal's norm, not to each output."""
    want = np.asarray(want)
    assert tuple(got.shape) == want.shape
    scale = max(float(np.abs(want).max(initial=0.0)), 1.0)
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=growth * eps * scale)


# --------------------------------------------------------------------------- values

# (function, numpy reference, input is complex, keyword sets)
ONE_DIM = [
    ("fft", np.fft.fft, True, [{}, {"n": 7}, {"n": 3, "dim": 0}]),
    ("ifft", np.fft.ifft, True, [{}, {"n": 9, "dim": 0}]),
    ("rfft", np.fft.rfft, False, [{}, {"n": 9}, {"n": 4, "dim": 0}]),
    ("irfft", np.fft.irfft, True, [{}, {"n": 7}, {"n": 4, "dim": 0}]),
    ("hfft", np.fft.hfft, True, [{}, {"n": 5}]),
    ("ihfft", np.fft.ihfft, False, [{}, {"n": 3, "dim": 0}]),
]


def _numpy_kwargs(kw: dict) -> dict:
    out = {k: v for k, v in kw.items() if k != "dim"}
    if "dim" in kw:
        out["axis"] = kw["dim"]
    return out


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name,ref,cplx,kwargs", ONE_DIM, ids=[c[0] for c in ONE_DIM])
def test_one_dimensional_transforms_match_numpy(name, ref, cplx, kwargs, norm):
    x = rand(6, 5, seed=1, complex_=cplx)
    for kw in kwargs:
        got = getattr(fg.fft, name)(fg.tensor(x), norm=norm, **kw)
        close(got, ref(x, norm=norm, **_numpy_kwargs(kw)))


N_DIM = [
    ("fft2", np.fft.fft2, True, [{}, {"s": (3, 7)}, {"dim": (0, 2)}]),
    ("ifft2", np.fft.ifft2, True, [{}, {"s": (5, 2), "dim": (1, 0)}]),
    ("fftn", np.fft.fftn, True, [{}, {"s": (2, 3)}, {"dim": (0, 2)}, {"s": (3, -1), "dim": (1, 2)}]),
    ("ifftn", np.fft.ifftn, True, [{}, {"dim": (2,)}]),
    ("rfft2", np.fft.rfft2, False, [{}, {"s": (4, 6)}]),
    ("irfft2", np.fft.irfft2, True, [{}, {"s": (3, 5)}]),
    ("rfftn", np.fft.rfftn, False, [{}, {"s": (3, 5)}, {"dim": (0, 1)}]),
    ("irfftn", np.fft.irfftn, True, [{}, {"s": (2, 4, 6)}, {"dim": (0, 2)}]),
]


def _numpy_nd_kwargs(kw: dict) -> dict:
    out = {}
    if "s" in kw:
        out["s"] = kw["s"]
    if "dim" in kw:
        out["axes"] = kw["dim"]
    return out


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name,ref,cplx,kwargs", N_DIM, ids=[c[0] for c in N_DIM])
def test_n_dimensional_transforms_match_numpy(name, ref, cplx, kwargs, norm):
    x = rand(2, 3, 4, seed=2, complex_=cplx)
    for kw in kwargs:
        got = getattr(fg.fft, name)(fg.tensor(x), norm=norm, **kw)
        np_kw = _numpy_nd_kwargs(kw)
        if "s" in np_kw:
            # numpy wants the axes with s, and has no -1 for "as it is"
            axes = np_kw.setdefault("axes", tuple(range(x.ndim - len(np_kw["s"]), x.ndim)))
            np_kw["s"] = [x.shape[a] if n == -1 else n for a, n in zip(axes, np_kw["s"])]
        close(got, ref(x, norm=norm, **np_kw))


@pytest.mark.parametrize("name,dtype,want", [
    ("rfft", fg.float32, fg.complex64), ("rfft", fg.float64, fg.complex128),
    ("fft", fg.float32, fg.complex64), ("fft", fg.int64, fg.complex64),
    ("fft", fg.complex128, fg.complex128), ("irfft", fg.complex64, fg.float32),
    ("irfft", fg.float64, fg.float64), ("hfft", fg.complex64, fg.float32),
    ("ihfft", fg.float64, fg.complex128),
])
def test_result_dtypes(name, dtype, want):
    x = fg.ones(8).to(dtype) if not dtype.is_complex else fg.ones(8, dtype=dtype)
    assert getattr(fg.fft, name)(x).dtype is want


def test_float32_transform_is_within_float32_accuracy():
    x = rand(64, seed=3).astype(np.float32)
    close(fg.fft.rfft(fg.tensor(x)), np.fft.rfft(x.astype(np.float64)), eps=F32_EPS)


# --------------------------------------------------------------------------- identities


@pytest.mark.parametrize("norm", NORMS)
def test_inverse_transforms_invert(norm):
    z = rand(3, 8, seed=4, complex_=True)
    x = rand(3, 7, seed=5)
    t = fg.tensor(z)
    close(fg.fft.ifft(fg.fft.fft(t, norm=norm), norm=norm), z)
    close(fg.fft.ifftn(fg.fft.fftn(t, norm=norm), norm=norm), z)
    close(fg.fft.irfft(fg.fft.rfft(fg.tensor(x), norm=norm), n=7, norm=norm), x)
    close(fg.fft.irfftn(fg.fft.rfftn(fg.tensor(x), norm=norm), s=(3, 7), norm=norm), x)
    close(fg.fft.ihfft(fg.fft.hfft(fg.fft.ihfft(fg.tensor(x), norm=norm), n=7, norm=norm),
                       norm=norm), np.fft.ihfft(x, norm=norm))


def test_parseval():
    x = fg.tensor(rand(16, seed=6, complex_=True))
    energy = float((x.abs() ** 2).sum())
    assert abs(float((fg.fft.fft(x).abs() ** 2).sum()) / 16 - energy) < 64 * F64_EPS * energy
    assert abs(float((fg.fft.fft(x, norm="ortho").abs() ** 2).sum()) - energy) < \
        64 * F64_EPS * energy


def test_fft_of_a_real_signal_is_hermitian():
    x = fg.tensor(rand(9, seed=7))
    full, half = fg.fft.fft(x), fg.fft.rfft(x)
    close(full[:5], half.numpy())
    close(full[1:], full.flip(0)[:-1].conj().numpy())


def test_frequencies_and_shifts_match_numpy():
    for n in (1, 4, 5):
        close(fg.fft.fftfreq(n, dtype=fg.float64), np.fft.fftfreq(n))
        close(fg.fft.rfftfreq(n, 0.5, dtype=fg.float64), np.fft.rfftfreq(n, 0.5))
    assert fg.fft.fftfreq(4).dtype is fg.float32
    assert fg.fft.rfftfreq(4, requires_grad=True).requires_grad
    a = np.arange(30).reshape(5, 6)
    t = fg.tensor(a)
    np.testing.assert_array_equal(fg.fft.fftshift(t).numpy(), np.fft.fftshift(a))
    np.testing.assert_array_equal(fg.fft.ifftshift(t).numpy(), np.fft.ifftshift(a))
    np.testing.assert_array_equal(fg.fft.fftshift(t, dim=1).numpy(), np.fft.fftshift(a, axes=1))
    np.testing.assert_array_equal(fg.fft.ifftshift(t, dim=(0,)).numpy(),
                                  np.fft.ifftshift(a, axes=(0,)))


# --------------------------------------------------------------------------- errors


def test_errors_are_torchs():
    x = fg.ones(4)
    with pytest.raises(RuntimeError, match='Invalid normalization mode: "bad"'):
        fg.fft.fft(x, norm="bad")
    with pytest.raises(RuntimeError, match=r"Invalid number of data points \(0\) specified"):
        fg.fft.fft(x, n=0)
    with pytest.raises(RuntimeError, match="rfft expects a real input tensor, but got ComplexFloat"):
        fg.fft.rfft(x.to(fg.complex64))
    with pytest.raises(RuntimeError, match="FFT dims must be unique"):
        fg.fft.fft2(fg.ones(2, 2), dim=(0, 0))
    with pytest.raises(RuntimeError, match="dim and shape arguments must have the same length"):
        fg.fft.fftn(fg.ones(2, 2), s=(2, 2), dim=(0,))
    with pytest.raises(IndexError, match="Dimension out of range"):
        fg.fft.fft(x, dim=3)
    with pytest.raises(RuntimeError, match="Unsupported dtype Half"):
        fg.fft.fft(fg.ones(4, dtype=fg.float16))
    with pytest.raises(RuntimeError, match=r"Invalid number of data points \(0\)"):
        fg.fft.irfft(fg.ones(1, dtype=fg.cfloat))
    with pytest.raises(AttributeError, match="torch.fft.nope|has no attribute"):
        _ = fg.fft.nope


# --------------------------------------------------------------------------- gradients


def numeric_grad(loss, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """dL/dx (+ i dL/dy for complex x) by central differences: torch's gradient."""
    grad = np.zeros_like(x)
    units = (1, 1j) if np.iscomplexobj(x) else (1,)
    for i in np.ndindex(x.shape):
        for u in units:
            xp, xm = x.copy(), x.copy()
            xp[i] += h * u
            xm[i] -= h * u
            grad[i] += (float(loss(fg.tensor(xp))) - float(loss(fg.tensor(xm)))) / (2 * h) * u
    return grad


def spectral_loss(y: fg.Tensor) -> fg.Tensor:
    """A real loss that weighs every output differently (so no symmetry hides an error)."""
    w = fg.tensor(np.random.default_rng(99).standard_normal(tuple(y.shape)))
    if y.is_complex():
        return (y.abs() * w).sum() + (y.real * w).sum() - (y.imag ** 2).sum()
    return (y * w).sum() + (y ** 2).sum()


GRAD_CASES = [
    ("fft", (5,), True, {}), ("fft", (3, 4), True, {"n": 6, "norm": "ortho"}),
    ("ifft", (4, 3), True, {"n": 2, "dim": 0, "norm": "forward"}),
    ("fft", (6,), False, {}), ("rfft", (6,), False, {}), ("rfft", (2, 5), False, {"n": 7}),
    ("rfft", (5, 2), False, {"dim": 0, "norm": "ortho"}), ("irfft", (5,), True, {}),
    ("irfft", (2, 4), True, {"n": 7, "norm": "forward"}), ("irfft", (4,), True, {"n": 4}),
    ("irfft", (3, 2), True, {"n": 3, "dim": 0, "norm": "ortho"}),
    ("fft2", (3, 4), True, {}), ("rfft2", (3, 4), False, {"norm": "ortho"}),
    ("irfft2", (3, 3), True, {}), ("rfftn", (2, 3, 4), False, {"s": (3, 5)}),
    ("irfftn", (2, 3, 3), True, {"dim": (0, 2)}), ("hfft", (4,), True, {"n": 5}),
    ("ihfft", (6,), False, {"norm": "forward"}),
]


@pytest.mark.parametrize("name,shape,cplx,kwargs", GRAD_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(GRAD_CASES)])
def test_gradients_match_finite_differences(name, shape, cplx, kwargs):
    x = rand(*shape, seed=8, complex_=cplx)

    def loss(t):
        return spectral_loss(getattr(fg.fft, name)(t, **kwargs))

    t = fg.tensor(x, requires_grad=True)
    loss(t).backward()
    np.testing.assert_allclose(t.grad.numpy(), numeric_grad(loss, x), rtol=1e-6, atol=1e-6)


def test_autograd_node_names():
    x = fg.randn(4, requires_grad=True)
    assert fg.fft.rfft(x).grad_fn.name() == "FftR2CBackward0"
    assert fg.fft.fft(x.to(fg.cfloat)).grad_fn.name() == "FftC2CBackward0"
    assert fg.fft.irfft(fg.fft.rfft(x)).grad_fn.name() == "FftC2RBackward0"
    # torch transforms a real signal along one axis by r2c, along several by c2c
    assert fg.fft.fft(x).grad_fn.name() == "FftR2CBackward0"
    assert fg.fft.ifft(x).grad_fn.name() == "ConjBackward0"
    assert fg.fft.fft2(x.reshape(2, 2)).grad_fn.name() == "FftC2CBackward0"


def test_transform_of_a_real_signal_prints_as_torchs():
    # the negative frequencies are conjugates of the positive ones: -0.0000j where torch has it
    assert repr(fg.fft.fft(fg.ones(4), n=6, norm="ortho")) == (
        "tensor([1.6330+0.0000j, 0.0000-0.7071j, 0.4082+0.0000j, 0.0000+0.0000j,\n"
        "        0.4082-0.0000j, 0.0000+0.7071j])")


# --------------------------------------------------------------------------- compiled


def test_compiled_transforms_match_eager_and_list_extern_complex_steps():
    def f(x, z):
        return fg.fft.irfft(fg.fft.rfft(x) * fg.fft.fft(z, n=5), n=8).abs().sum()

    x, z = fg.randn(3, 8), fg.randn(3, 4, dtype=fg.cfloat)
    compiled = fg.compile(f)
    close(compiled(x, z), f(x, z).numpy(), eps=F32_EPS)
    kernels = compiled.lower(x, z).kernels
    assert any("extern complex" in k and "fft_r2c" in k for k in kernels), kernels
    xx = x.clone().requires_grad_()
    compiled(xx, z).backward()
    got = xx.grad.numpy()
    xx.grad = None
    f(xx, z).backward()
    close(xx.grad, got, eps=F32_EPS, growth=256)


def _spectral_training(lib, compiled: bool, steps: int = 4) -> tuple[list[float], np.ndarray]:
    """The program a user writes: a conv net trained on a spectral loss plus MSE."""
    nn, F = lib.nn, lib.nn.functional
    rng = np.random.default_rng(0)
    x = lib.tensor(rng.standard_normal((4, 1, 16)).astype(np.float32))
    target = lib.tensor(rng.standard_normal((4, 1, 16)).astype(np.float32))
    model = nn.Sequential(nn.Conv1d(1, 3, 5, padding=2), nn.Tanh(), nn.Conv1d(3, 1, 5, padding=2))
    init = np.random.default_rng(1)
    with lib.no_grad():
        for p in model.parameters():
            p.copy_(lib.tensor((init.standard_normal(tuple(p.shape)) * 0.3).astype(np.float32)))
    opt = lib.optim.SGD(model.parameters(), lr=0.005)

    def step(x, target):
        opt.zero_grad()
        pred = model(x)
        loss = (lib.fft.rfft(pred).abs() - lib.fft.rfft(target).abs()).pow(2).mean() + \
            F.mse_loss(pred, target)
        loss.backward()
        opt.step()
        return loss

    run = lib.compile(step) if compiled else step
    losses = [float(run(x, target).detach()) for _ in range(steps)]
    weights = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    return losses, weights


@pytest.mark.slow
def test_spectral_loss_training_compiled_matches_eager():
    eager_losses, eager_w = _spectral_training(fg, False)
    losses, w = _spectral_training(fg, True)
    assert eager_losses[-1] < eager_losses[0]
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5)
    np.testing.assert_allclose(w, eager_w, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- torch

TORCH_CASES = GRAD_CASES + [
    ("hfft2", (3, 4), True, {}), ("ihfftn", (3, 4), False, {}), ("ifft", (3, 6), False,
                                                                  {"norm": "ortho"}),
    ("ifft2", (2, 3, 4), True, {"s": (5, 2), "norm": "ortho"}),
    ("fftn", (2, 3, 4), True, {}), ("ifftn", (2, 3, 4), True, {"dim": (0, 2)}),
]


@pytest.mark.parametrize("name,shape,cplx,kwargs", TORCH_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(TORCH_CASES)])
@pytest.mark.parametrize("precision", ["single", "double"])
def test_values_and_gradients_match_torch(name, shape, cplx, kwargs, precision):
    torch = pytest.importorskip("torch")
    x = rand(*shape, seed=9, complex_=cplx)
    wts = np.random.default_rng(10).standard_normal(4096)
    results = []
    for lib in (torch, fg):
        dtype = {("single", False): lib.float32, ("double", False): lib.float64,
                 ("single", True): lib.complex64, ("double", True): lib.complex128}[
            precision, cplx]
        t = lib.tensor(x, dtype=dtype, requires_grad=True)
        y = getattr(lib.fft, name)(t, **kwargs)
        w = lib.tensor(wts[:y.numel()].reshape(tuple(y.shape)), dtype=t.real.dtype)
        loss = (y.abs() * w).sum() + (y.real * w).sum() if y.is_complex() else (y * w).sum()
        loss.backward()
        results.append((y.detach().resolve_conj().numpy(), t.grad.resolve_conj().numpy()))
    (y_t, g_t), (y_f, g_f) = results
    assert y_f.dtype == y_t.dtype and y_f.shape == y_t.shape
    eps = F32_EPS if precision == "single" else F64_EPS
    for got, want in ((y_f, y_t), (g_f, g_t)):
        scale = max(float(np.abs(want).max()), 1.0)
        np.testing.assert_allclose(got, want, rtol=0, atol=256 * eps * scale)


def test_frequencies_match_torch():
    torch = pytest.importorskip("torch")
    for n, d in ((5, 1.0), (6, 0.5)):
        np.testing.assert_array_equal(fg.fft.fftfreq(n, d).numpy(), torch.fft.fftfreq(n, d).numpy())
        np.testing.assert_array_equal(fg.fft.rfftfreq(n, d, dtype=fg.float64).numpy(),
                                      torch.fft.rfftfreq(n, d, dtype=torch.float64).numpy())


@pytest.mark.slow
def test_spectral_loss_training_matches_torch():
    torch = pytest.importorskip("torch")
    want_losses, want_w = _spectral_training(torch, False)
    for compiled in (False, True):
        losses, w = _spectral_training(fg, compiled)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
        np.testing.assert_allclose(w, want_w, rtol=1e-4, atol=1e-5)
