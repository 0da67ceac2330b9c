"""Complex tensors: dtypes and promotion, creation, parts and views, arithmetic, reductions,
printing, checkpoints, and gradients in torch's conjugate-Wirtinger convention.

Torch-free checks compare with numpy's complex128 arithmetic and with central differences of
real losses; the torch checks (skipped without torch) compare values and gradients with
torch 2.13.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

import fusegrad as fg

F64_EPS = np.finfo(np.float64).eps
F32_EPS = np.finfo(np.float32).eps


def crand(*shape, seed=0, dtype=np.complex128):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


# --------------------------------------------------------------------------- dtypes


def test_complex_dtypes_and_names():
    assert fg.cfloat is fg.complex64 and fg.cdouble is fg.complex128
    z = fg.tensor([1 + 2j])
    assert z.dtype is fg.complex64 and z.is_complex() and fg.is_complex(z)
    assert not z.is_floating_point() and not fg.ones(2).is_complex()
    assert z.type() == "fusegrad.ComplexFloatTensor"
    assert z.element_size() == 8 and fg.zeros(1, dtype=fg.cdouble).element_size() == 16
    assert fg.finfo(fg.complex64).eps == fg.finfo(fg.float32).eps


@pytest.mark.parametrize("a,b,want", [
    (fg.float32, fg.complex64, fg.complex64), (fg.float64, fg.complex64, fg.complex128),
    (fg.float16, fg.complex64, fg.complex64), (fg.int64, fg.complex64, fg.complex64),
    (fg.complex64, fg.complex128, fg.complex128), (fg.bool, fg.complex128, fg.complex128),
])
def test_promote_types(a, b, want):
    assert fg.promote_types(a, b) is want and fg.promote_types(b, a) is want


def test_result_type_with_python_complex_and_zero_dim_tensors():
    f32, f64 = fg.ones(2), fg.ones(2, dtype=fg.float64)
    assert (f32 + 1j).dtype is fg.complex64
    assert (f64 + 1j).dtype is fg.complex128          # a lower complex keeps the precision
    assert (fg.ones(2, dtype=fg.int64) + 1j).dtype is fg.complex64
    assert (fg.ones(2, dtype=fg.bfloat16) * 1j).dtype is fg.complex64
    assert (f32 + fg.tensor(1j, dtype=fg.complex128)).dtype is fg.complex64
    assert (f64 + fg.tensor(1j)).dtype is fg.complex128
    assert (f64 + fg.ones(2, dtype=fg.complex64)).dtype is fg.complex128
    with pytest.raises(RuntimeError, match="complex32"):
        fg.ones(2, dtype=fg.float16) + 1j


def test_default_complex_follows_the_default_float():
    fg.set_default_dtype(fg.float64)
    try:
        assert fg.tensor([1j]).dtype is fg.complex128
        assert (fg.ones(2) * 1j).dtype is fg.complex128
    finally:
        fg.set_default_dtype(fg.float32)
    assert fg.tensor([1j]).dtype is fg.complex64


def test_creation_item_tolist_and_factories():
    z = fg.tensor([1, 2j])
    assert z.tolist() == [1 + 0j, 2j] and fg.tensor(3 - 1j).item() == 3 - 1j
    assert complex(fg.tensor(2j)) == 2j
    assert float(fg.tensor(2 + 0j)) == 2.0
    with pytest.raises(RuntimeError, match="cannot be converted to type double"):
        float(fg.tensor(2 + 1j))
    assert fg.zeros(2, 3, dtype=fg.cdouble).dtype is fg.complex128
    assert fg.full((2,), 1 + 1j).dtype is fg.complex64
    np.testing.assert_array_equal(fg.full((2,), 1 + 1j).numpy(), [1 + 1j, 1 + 1j])
    assert fg.ones(2).cfloat().dtype is fg.complex64
    assert fg.ones(2).to(fg.cdouble).dtype is fg.complex128


def test_randn_complex_has_parts_of_variance_one_half():
    fg.manual_seed(0)
    z = fg.randn(20000, dtype=fg.cfloat)
    assert z.dtype is fg.complex64
    parts = fg.view_as_real(z).numpy().astype(np.float64)
    # 20000 samples: the sample variance is within a few percent of 1/2
    assert abs(parts[:, 0].var() - 0.5) < 0.03 and abs(parts[:, 1].var() - 0.5) < 0.03
    assert abs(parts.mean()) < 0.03


def test_complex_and_polar():
    re, im = fg.tensor([1.0, -2.0]), fg.tensor([0.5, 3.0])
    z = fg.complex(re, im)
    assert z.dtype is fg.complex64
    np.testing.assert_array_equal(z.numpy(), [1 + 0.5j, -2 + 3j])
    assert fg.complex(re.double(), im.double()).dtype is fg.complex128
    r, theta = fg.tensor([2.0], dtype=fg.float64), fg.tensor([0.5], dtype=fg.float64)
    np.testing.assert_allclose(fg.polar(r, theta).numpy(), 2 * np.exp(0.5j), rtol=4 * F64_EPS)
    with pytest.raises(RuntimeError, match="Expected object of scalar type float32"):
        fg.complex(re, im.double())
    with pytest.raises(RuntimeError, match="Float or Double"):
        fg.complex(fg.ones(2, dtype=fg.int64), fg.ones(2, dtype=fg.int64))


# --------------------------------------------------------------------------- parts and views


def test_real_and_imag_are_views():
    z = fg.tensor([1 + 2j, 3 - 4j])
    assert z.real._base is z and z.imag._base is z
    z.real[0] = 5
    z.imag.mul_(2)
    np.testing.assert_array_equal(z.numpy(), [5 + 4j, 3 - 8j])
    z.real = fg.tensor([7.0, 8.0])
    np.testing.assert_array_equal(z.numpy(), [7 + 4j, 8 - 8j])
    x = fg.ones(2)
    assert x.real is x
    with pytest.raises(RuntimeError, match="imag is not implemented for tensors with non-complex"):
        _ = x.imag


def test_view_as_real_and_view_as_complex_share_storage():
    z = fg.tensor([1 + 2j, 3 - 4j])
    r = fg.view_as_real(z)
    assert r.shape == (2, 2) and r.dtype is fg.float32 and r.stride() == (2, 1)
    r[1, 1] = 0.5
    np.testing.assert_array_equal(z.numpy(), [1 + 2j, 3 + 0.5j])
    x = fg.zeros(2, 2)
    fg.view_as_complex(x).add_(1j)
    np.testing.assert_array_equal(x.numpy(), [[0, 1], [0, 1]])
    assert fg.view_as_real(fg.randn(3, 4, dtype=fg.cfloat).T).shape == (4, 3, 2)
    with pytest.raises(RuntimeError, match="last dimension of size 2"):
        fg.view_as_complex(fg.zeros(2, 3))
    with pytest.raises(RuntimeError, match="stride 1"):
        fg.view_as_complex(fg.zeros(2, 2).T)
    with pytest.raises(RuntimeError, match="stride divisible by 2"):
        fg.view_as_complex(fg.zeros(3, 3)[:, :2])
    with pytest.raises(RuntimeError, match="storage_offset divisible by 2"):
        fg.view_as_complex(fg.zeros(5)[1:].reshape(2, 2))
    assert fg.view_as_complex(fg.zeros(3, 4)[:, 2:]).shape == (3,)
    with pytest.raises(RuntimeError, match="only supported for complex tensors"):
        fg.view_as_real(fg.zeros(2))


def test_a_recorded_write_through_a_part_raises_before_writing():
    w = fg.tensor([1 + 1j, 2 - 1j], requires_grad=True)
    y = w * 2
    with pytest.raises(NotImplementedError, match="real"):
        y.real.mul_(3)
    np.testing.assert_array_equal(y.detach().numpy(), [2 + 2j, 4 - 2j])


def test_conj_abs_angle_sgn():
    zs = np.array([3 + 4j, -1j, 0j, -2 + 0j])
    z = fg.tensor(zs, dtype=fg.complex128)
    np.testing.assert_array_equal(z.conj().numpy(), np.conj(zs))
    assert not z.conj().is_conj() and z.resolve_conj() is z
    np.testing.assert_array_equal(z.conj_physical().numpy(), np.conj(zs))
    assert z.abs().dtype is fg.float64
    np.testing.assert_array_equal(z.abs().numpy(), np.abs(zs))
    np.testing.assert_array_equal(z.angle().numpy(), np.angle(zs))
    np.testing.assert_allclose(z.sgn().numpy(), [0.6 + 0.8j, -1j, 0, -1], rtol=4 * F64_EPS)
    x = fg.tensor([-2.0, 0.0, -0.0, 3.0, float("nan")])
    np.testing.assert_array_equal(x.angle().numpy(), [np.float32(np.pi), 0, 0, 0, np.nan])
    assert fg.ones(2).conj() is not None and fg.ones(2).conj().dtype is fg.float32
    with pytest.raises(RuntimeError, match="torch.sgn"):
        z.sign()


def test_casts_to_real_warn_as_torch():
    z = fg.tensor([1 + 2j])
    with pytest.warns(UserWarning, match="Casting complex values to real discards the imaginary"):
        r = z.to(fg.float32)
    assert r.tolist() == [1.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fg.ones(2).to(fg.complex64)
        z.to(fg.complex128)


def test_ops_without_complex_meaning_refuse_complex():
    z = fg.tensor([1 + 2j])
    for op in (lambda: z < z, lambda: fg.maximum(z, z), lambda: z.floor(), lambda: z.trunc(),
               lambda: z.round(), lambda: z.amax(), lambda: z.argmax(), lambda: z.sort(),
               lambda: z.clamp(0), lambda: z % 2, lambda: z // 2):
        with pytest.raises((RuntimeError, NotImplementedError), match="complex"):
            op()


def test_nan_and_inf_tests_see_both_parts():
    z = fg.tensor([complex(1, float("nan")), complex(float("inf"), 0), 1j])
    assert z.isnan().tolist() == [True, False, False]
    assert z.isinf().tolist() == [False, True, False]
    assert z.isfinite().tolist() == [False, False, True]


# --------------------------------------------------------------------------- arithmetic


BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
          "pow": np.power}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("other", ["complex", "real", "scalar", "complex_scalar"])
def test_binary_ops_match_numpy(name, other):
    a = crand(3, 4, seed=1)
    if other == "complex":
        b_np = crand(3, 4, seed=2)
        b = fg.tensor(b_np)
    elif other == "real":
        b_np = np.random.default_rng(3).uniform(0.5, 2, (4,))
        b = fg.tensor(b_np)
    else:
        b_np = b = 1.5 if other == "scalar" else 0.5 - 0.25j
    got = getattr(fg, name)(fg.tensor(a), b)
    assert got.dtype is fg.complex128
    np.testing.assert_allclose(got.numpy(), BINARY[name](a, b_np), rtol=64 * F64_EPS)
    # reflected: the real or scalar operand first
    if other != "complex":
        got = getattr(fg, name)(b if other.endswith("scalar") else fg.tensor(b_np), fg.tensor(a))
        np.testing.assert_allclose(got.numpy(), BINARY[name](b_np, a), rtol=64 * F64_EPS)


INVERSE_TRIG = {"asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "asinh": np.arcsinh,
                "acosh": np.arccosh, "atanh": np.arctanh}


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "sin", "cos", "tan", "tanh", "sinh",
                                  "cosh", "reciprocal", "neg", "exp2", "log2", "log10", "log1p",
                                  "expm1", *INVERSE_TRIG])
def test_unary_ops_match_numpy(name):
    a = crand(5, seed=4)
    ref = {"reciprocal": lambda v: 1 / v, "neg": np.negative, **INVERSE_TRIG}.get(
        name, getattr(np, name, None))
    got = getattr(fg, name)(fg.tensor(a))
    np.testing.assert_allclose(got.numpy(), ref(a), rtol=16 * F64_EPS)
    got32 = getattr(fg, name)(fg.tensor(a.astype(np.complex64)))
    assert got32.dtype is fg.complex64
    np.testing.assert_allclose(got32.numpy(), ref(a), rtol=64 * F32_EPS, atol=16 * F32_EPS)


def test_matmul_and_reductions_match_numpy():
    a, b = crand(3, 4, seed=5), crand(4, 2, seed=6)
    np.testing.assert_allclose((fg.tensor(a) @ fg.tensor(b)).numpy(), a @ b, rtol=64 * F64_EPS)
    with pytest.raises(RuntimeError, match="same dtype"):     # torch promotes no operand
        fg.tensor(a) @ fg.tensor(b.real)
    t = fg.tensor(a)
    np.testing.assert_allclose(t.sum().numpy(), a.sum(), rtol=16 * F64_EPS)
    np.testing.assert_allclose(t.sum(0).numpy(), a.sum(0), rtol=16 * F64_EPS)
    np.testing.assert_allclose(t.mean(1).numpy(), a.mean(1), rtol=16 * F64_EPS)
    np.testing.assert_allclose(t.prod(1).numpy(), a.prod(1), rtol=16 * F64_EPS)
    assert t.sum().dtype is fg.complex128 and fg.tensor([1j]).mean().dtype is fg.complex64
    np.testing.assert_allclose(t.mH.numpy(), a.conj().T)


def test_norms_variance_and_vdot_use_moduli_and_conjugates():
    a, b = crand(5, seed=16), crand(5, seed=17)
    t, u = fg.tensor(a), fg.tensor(b)
    assert t.norm().dtype is fg.float64
    np.testing.assert_allclose(t.norm().numpy(), np.linalg.norm(a), rtol=16 * F64_EPS)
    np.testing.assert_allclose(fg.linalg.vector_norm(t, 1).numpy(), np.abs(a).sum(),
                               rtol=16 * F64_EPS)
    np.testing.assert_allclose(t.var().numpy(), np.var(a, ddof=1), rtol=16 * F64_EPS)
    np.testing.assert_allclose(t.std(correction=0).numpy(), np.std(a), rtol=16 * F64_EPS)
    np.testing.assert_allclose(fg.vdot(t, u).numpy(), np.vdot(a, b), rtol=16 * F64_EPS)
    with pytest.raises(NotImplementedError, match="mse"):
        fg.nn.functional.mse_loss(t, u)
    with pytest.raises(TypeError, match="must be real number, not complex"):
        fg.tensor([1 + 2j], dtype=fg.float32)
    with pytest.raises(TypeError, match="must be real number, not complex"):
        fg.Tensor([1 + 2j])


# --------------------------------------------------------------------------- printing, saving


def test_printing_matches_torch():
    # The strings torch 2.13 prints for these tensors.
    assert repr(fg.tensor([1 + 2j, 3 - 4j])) == "tensor([1.+2.j, 3.-4.j])"
    assert repr(fg.tensor(1 + 2j)) == "tensor(1.+2.j)"
    assert repr(fg.tensor([[1.5 + 2j, -3 - 0.25j], [0, 1e-5j]])) == (
        "tensor([[ 1.5000+2.0000e+00j, -3.0000-2.5000e-01j],\n"
        "        [ 0.0000+0.0000e+00j,  0.0000+1.0000e-05j]])")
    assert repr(fg.tensor([1e10 + 2j, 3j], dtype=fg.complex128)) == (
        "tensor([1.0000e+10+2.j, 0.0000e+00+3.j], dtype=fusegrad.complex128)")
    assert repr(fg.tensor([float("nan") + 1j, float("inf") - 1j])) == "tensor([nan+1.j, inf-1.j])"
    assert repr(fg.zeros(0, dtype=fg.cfloat)) == "tensor([], dtype=fusegrad.complex64)"
    z = fg.tensor([1 + 2j], requires_grad=True)
    assert repr(z * 2) == "tensor([2.+4.j], grad_fn=<MulBackward0>)"


@pytest.mark.parametrize("dtype", [fg.complex64, fg.complex128])
def test_save_and_load(dtype):
    z = fg.tensor(crand(2, 3, seed=7), dtype=dtype)
    buf = io.BytesIO()
    fg.save({"z": z, "s": z[0, 0]}, buf)
    buf.seek(0)
    back = fg.load(buf)
    assert back["z"].dtype is dtype
    np.testing.assert_array_equal(back["z"].numpy(), z.numpy())
    np.testing.assert_array_equal(back["s"].numpy(), z[0, 0].numpy())


# --------------------------------------------------------------------------- gradients


def numeric_grad(loss, z: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """torch's gradient of a real ``loss`` at complex ``z``: dL/dx + i dL/dy, by central
    differences in float64."""
    grad = np.zeros_like(z)
    for i in np.ndindex(z.shape):
        for unit in (1, 1j):
            zp, zm = z.copy(), z.copy()
            zp[i] += h * unit
            zm[i] -= h * unit
            d = (float(loss(fg.tensor(zp))) - float(loss(fg.tensor(zm)))) / (2 * h)
            grad[i] += d * unit
    return grad


def autograd_grad(loss, z: np.ndarray) -> np.ndarray:
    t = fg.tensor(z, requires_grad=True)
    loss(t).backward()
    return t.grad.numpy()


W = crand(3, seed=8)

LOSSES = {
    "abs_squared": lambda z: (z.abs() ** 2).sum(),
    "mul": lambda z: (z * fg.tensor(W)).abs().sum(),
    "div": lambda z: (fg.tensor(W) / z).real.sum() + (z / (1 + 2j)).imag.sum(),
    "exp": lambda z: z.exp().real.sum(),
    "log": lambda z: z.log().imag.sum() + z.log().abs().sum(),
    "sqrt": lambda z: z.sqrt().abs().pow(3).sum(),
    "sin_cos": lambda z: (z.sin() * z.cos()).real.sum(),
    "tanh": lambda z: z.tanh().imag.sum(),
    "pow_scalar": lambda z: (z ** 3).real.sum(),
    "pow_complex": lambda z: (z ** fg.tensor(W)).abs().sum(),
    "reciprocal": lambda z: z.reciprocal().real.sum(),
    "log_family": lambda z: (z.log2() + z.log10() + z.log1p() + z.exp2() + z.expm1()).abs().sum(),
    "inverse_trig": lambda z: (z.asin() + z.acos() + z.atan() + z.asinh() + z.acosh()
                               + z.atanh()).abs().sum(),
    "angle": lambda z: z.angle().sum(),
    "conj": lambda z: (z.conj() * fg.tensor(W)).real.sum(),
    "sgn": lambda z: (z.sgn() * fg.tensor(W)).imag.sum(),
    "view_as_real": lambda z: (fg.view_as_real(z) ** 3).sum(),
    "matmul": lambda z: (fg.tensor(crand(2, 3, seed=9)) @ z.reshape(3, 1)).abs().sum(),
    "sum_mean_prod": lambda z: z.sum().abs() + z.mean().real + z.prod().imag,
    "real_mix": lambda z: (z * fg.tensor([1.0, 2.0, 3.0], dtype=fg.float64)).abs().sum(),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_gradient_is_the_conjugate_wirtinger_derivative(name):
    z = crand(3, seed=10)
    want = numeric_grad(LOSSES[name], z)
    np.testing.assert_allclose(autograd_grad(LOSSES[name], z), want, rtol=1e-6, atol=1e-7)


def test_abs_squared_gives_two_z():
    z = crand(4, seed=11)
    np.testing.assert_allclose(autograd_grad(lambda t: (t.abs() ** 2).sum(), z), 2 * z,
                               rtol=8 * F64_EPS)


def test_gradients_of_the_parts():
    re = fg.tensor([1.0, 2.0], dtype=fg.float64, requires_grad=True)
    im = fg.tensor([-1.0, 0.5], dtype=fg.float64, requires_grad=True)
    z = fg.complex(re, im)
    (z.abs() ** 2).sum().backward()
    np.testing.assert_array_equal(re.grad.numpy(), [2.0, 4.0])
    np.testing.assert_array_equal(im.grad.numpy(), [-2.0, 1.0])
    x = fg.tensor([1.0, -2.0], requires_grad=True)
    (x.to(fg.complex64) * (1 + 1j)).abs().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.sign([1.0, -2.0]) * np.sqrt(2), rtol=F32_EPS)


def test_backward_of_a_complex_output_raises():
    z = fg.tensor([1 + 2j], requires_grad=True)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for real scalar "
                                           "outputs but got fusegrad.complex64"):
        (z * 2).sum().backward()
    y = z * 2
    y.backward(fg.tensor([1 + 0j]))
    np.testing.assert_array_equal(z.grad.numpy(), [2 + 0j])


def test_sgd_trains_complex_parameters_and_other_optimizers_refuse_them():
    z = fg.tensor([1 + 2j, -0.5 + 0.3j], dtype=fg.complex128, requires_grad=True)
    opt = fg.optim.SGD([z], lr=0.1, momentum=0.9, weight_decay=0.01)
    for _ in range(3):
        opt.zero_grad()
        ((z - (0.2 - 1j)).abs() ** 2).sum().backward()
        opt.step()
    # the values torch 2.13 gives
    np.testing.assert_allclose(z.detach().numpy(), [0.245618 - 0.820732j, 0.158327 - 0.919662j],
                               atol=1e-6)
    for make in (fg.optim.Adam, fg.optim.AdamW, fg.optim.RMSprop, fg.optim.Adagrad):
        with pytest.raises(NotImplementedError, match="complex parameters"):
            make([z])


# --------------------------------------------------------------------------- compiled


def test_compiled_complex_steps_are_extern_and_match_eager():
    def f(z, w, x):
        return (z * w * (1 + 2j)).conj().exp().abs().sum() + (x * 2).relu().sum()

    z, w = fg.tensor(crand(4, seed=12, dtype=np.complex64)), fg.tensor(crand(4, seed=13,
                                                                             dtype=np.complex64))
    x = fg.randn(4)
    compiled = fg.compile(f)
    np.testing.assert_allclose(compiled(z, w, x).numpy(), f(z, w, x).numpy(), rtol=16 * F32_EPS)
    kernels = compiled.lower(z, w, x).kernels
    assert any("extern complex" in k and "(exp)" in k for k in kernels), kernels
    assert not any("complex" in k for k in kernels if "relu" in k or "le," in k), kernels
    zz = z.clone().requires_grad_()
    compiled(zz, w, x).backward()
    got = zz.grad.numpy()
    zz.grad = None
    f(zz, w, x).backward()
    np.testing.assert_allclose(got, zz.grad.numpy(), rtol=64 * F32_EPS, atol=1e-6)


def test_compiled_writes_through_parts():
    def f(z):
        w = z * 1
        w.real.mul_(2)
        w.imag[0] = 7
        fg.view_as_real(w)[1, 0] = -1.5
        return w

    z = fg.tensor([1 + 2j, 3 - 4j])
    np.testing.assert_array_equal(fg.compile(f)(z).numpy(), f(z).numpy())
    np.testing.assert_array_equal(f(z).numpy(), [2 + 7j, -1.5 - 4j])


def test_traced_complex_graph_round_trips_its_text():
    from fusegrad.ir import parse, print_graph

    def f(z):
        return (z * (0.5 - 1j)).conj().abs()

    g = fg.trace(f, fg.tensor([1 + 2j]))
    text = print_graph(g)
    assert "complex(0.5, -1.0)" in text
    assert print_graph(parse(text)) == text


# --------------------------------------------------------------------------- torch


TORCH_OPS = {
    "mul": lambda lib, z, w: (z * w).abs().sum(),
    "div_real": lambda lib, z, w: (z / w.real).imag.sum(),
    "exp_log": lambda lib, z, w: (z.exp() + w.log()).abs().sum(),
    "sqrt": lambda lib, z, w: (z.sqrt() * w).real.sum(),
    "pow": lambda lib, z, w: (z ** w).abs().sum(),
    "trig": lambda lib, z, w: (z.sin() + w.cos() + z.tanh()).real.sum(),
    "angle_sgn": lambda lib, z, w: z.angle().sum() + (w.sgn() * z).real.sum(),
    "conj": lambda lib, z, w: (z.conj() * w).imag.sum(),
    "matmul": lambda lib, z, w: (z.reshape(2, 3) @ w.reshape(3, 2)).abs().sum(),
    "parts": lambda lib, z, w: (z.real * w.imag).sum() + lib.view_as_real(z).pow(2).sum(),
    "complex_polar": lambda lib, z, w: lib.polar(z.abs(), w.angle()).real.sum()
    + lib.complex(z.real, w.imag).abs().sum(),
    "reductions": lambda lib, z, w: z.sum().abs() + w.mean().imag + z.prod().real,
    "inverse_trig": lambda lib, z, w: (z.asin() * w.acosh() + z.atan() + w.asinh()).abs().sum()
    + z.acos().real.sum() + w.atanh().imag.sum(),
    "log_family": lambda lib, z, w: (z.log2() * w.expm1() + z.log1p() + w.exp2()).abs().sum()
    + z.log10().real.sum(),
    "norms_var": lambda lib, z, w: z.norm() + lib.linalg.vector_norm(w, 1) + z.var() + w.std()
    + lib.vdot(z, w).real,
}


@pytest.mark.parametrize("name", sorted(TORCH_OPS))
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_values_and_gradients_match_torch(name, dtype):
    torch = pytest.importorskip("torch")
    zs, ws = crand(6, seed=14), crand(6, seed=15)
    results = []
    for lib in (torch, fg):
        dt = getattr(lib, dtype)
        z = lib.tensor(zs, dtype=dt, requires_grad=True)
        w = lib.tensor(ws, dtype=dt, requires_grad=True)
        out = TORCH_OPS[name](lib, z, w)
        out.backward()
        results.append([np.asarray(out.detach().numpy()), z.grad.resolve_conj().numpy(),
                        w.grad.resolve_conj().numpy()])
    eps = F32_EPS if dtype == "complex64" else F64_EPS
    for want, got in zip(*results):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=256 * eps, atol=64 * eps)


def test_promotion_and_printing_match_torch():
    torch = pytest.importorskip("torch")
    for make in (lambda lib: lib.ones(2) + 1j, lambda lib: lib.ones(2, dtype=lib.float64) * 1j,
                 lambda lib: lib.ones(2, dtype=lib.int64) + 2j,
                 lambda lib: lib.ones(2, dtype=lib.float64) + lib.tensor([1j, 2]),
                 lambda lib: lib.tensor([[1.5 + 2j, -3], [1e-5j, 0]], dtype=lib.cdouble)):
        want, got = make(torch), make(fg)
        assert got.dtype.name == str(want.dtype).split(".")[1]
        assert repr(got) == repr(want).replace("torch.", "fusegrad.")
