"""torch.nn.utils.parametrize and parametrizations (weight_norm, spectral_norm, orthogonal):
values from their definitions (float64), torch's state_dict keys, classes and messages,
compiled steps equal to eager, and agreement with torch where it is installed."""

import copy
import pickle

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.nn.utils import parametrize
from fusegrad.nn.utils.parametrizations import orthogonal, spectral_norm, weight_norm


class Symmetric(fg.nn.Module):
    def forward(self, x):
        return x.triu() + x.triu(1).mT

    def right_inverse(self, a):
        return a.triu()


class Scale(fg.nn.Module):
    def forward(self, x):
        return 2 * x


def _linear(n_in=4, n_out=4, seed=0, dtype=fg.float64):
    rng = np.random.default_rng(seed)
    m = fg.nn.Linear(n_in, n_out).to(dtype)
    with fg.no_grad():
        m.weight.copy_(fg.tensor(rng.standard_normal((n_out, n_in))))
        m.bias.copy_(fg.tensor(rng.standard_normal(n_out)))
    return m


def test_register_makes_the_tensor_a_property_of_its_original():
    m = _linear()
    w0 = m.weight.detach().numpy().copy()
    original = m.weight
    parametrize.register_parametrization(m, "weight", Symmetric())
    assert type(m).__name__ == "ParametrizedLinear" and isinstance(m, fg.nn.Linear)
    assert parametrize.type_before_parametrizations(m) is fg.nn.Linear
    assert parametrize.is_parametrized(m) and parametrize.is_parametrized(m, "weight")
    assert not parametrize.is_parametrized(m, "bias")
    # the Parameter object stays, now holding right_inverse(weight)
    assert m.parametrizations.weight.original is original
    np.testing.assert_array_equal(original.detach().numpy(), np.triu(w0))
    w = m.weight.detach().numpy()
    np.testing.assert_array_equal(w, np.triu(w0) + np.triu(w0, 1).T)
    assert sorted(m.state_dict()) == ["bias", "parametrizations.weight.original"]
    assert {n for n, _ in m.named_parameters()} == {"bias", "parametrizations.weight.original"}
    # gradients reach the original through the parametrization
    m(fg.ones(2, 4, dtype=fg.float64)).sum().backward()
    g = original.grad.numpy()
    # dL/dW is 2 everywhere; W = triu(X) + triu(X, 1).T: 4 above the diagonal, 2 on it
    np.testing.assert_array_equal(g, np.triu(np.full((4, 4), 4.0)) - 2.0 * np.eye(4))


def test_assignment_goes_through_right_inverse_and_chains_apply_in_order():
    m = _linear()
    parametrize.register_parametrization(m, "weight", Symmetric())
    a = np.arange(16.0).reshape(4, 4)
    m.weight = fg.tensor(a)
    np.testing.assert_array_equal(m.parametrizations.weight.original.detach().numpy(), np.triu(a))
    parametrize.register_parametrization(m, "weight", Scale())
    sym = np.triu(a) + np.triu(a, 1).T
    np.testing.assert_array_equal(m.weight.detach().numpy(), 2 * sym)
    with pytest.raises(RuntimeError, match="parametrization Scale does not implement right_inverse."):
        m.weight = fg.tensor(a)


def test_remove_parametrizations_restores_the_module():
    m = _linear()
    parametrize.register_parametrization(m, "weight", Symmetric())
    want = m.weight.detach().numpy().copy()
    parametrize.remove_parametrizations(m, "weight")
    assert type(m) is fg.nn.Linear and not hasattr(m, "parametrizations")
    assert isinstance(m.weight, fg.nn.Parameter)
    np.testing.assert_array_equal(m.weight.detach().numpy(), want)
    assert sorted(m.state_dict()) == ["bias", "weight"]
    m2 = _linear()
    w0 = m2.weight.detach().numpy().copy()
    parametrize.register_parametrization(m2, "weight", Symmetric())
    parametrize.remove_parametrizations(m2, "weight", leave_parametrized=False)
    np.testing.assert_array_equal(m2.weight.detach().numpy(), np.triu(w0))
    with pytest.raises(ValueError, match="does not have a parametrization on weight"):
        parametrize.remove_parametrizations(m2, "weight")


def test_user_mistakes_raise_torchs_messages():
    m = _linear(4, 3)
    with pytest.raises(ValueError, match="does not have a parameter, a buffer, or a parametrized "
                                         "element with name 'kernel'"):
        parametrize.register_parametrization(m, "kernel", Scale())

    class Flatten(fg.nn.Module):
        def forward(self, x):
            return x.reshape(-1)
    with pytest.raises(ValueError, match="may not change the shape of the tensor, unless `unsafe` "
                                         "flag is enabled"):
        parametrize.register_parametrization(m, "weight", Flatten())
    parametrize.register_parametrization(m, "weight", Flatten(), unsafe=True)
    assert m.weight.shape == (12,)
    with pytest.raises(ValueError, match="ParametrizationList requires one or more modules."):
        parametrize.ParametrizationList([], fg.zeros(2))


def test_cached_computes_each_parametrized_tensor_once():
    calls = []

    class Counting(fg.nn.Module):
        def forward(self, x):
            calls.append(1)
            return x * 1
    m = _linear()
    parametrize.register_parametrization(m, "weight", Counting())
    calls.clear()
    with parametrize.cached():
        a, b = m.weight, m.weight
    assert a is b and len(calls) == 1
    m.weight  # noqa: B018
    assert len(calls) == 2


def test_pickle_is_refused_and_deepcopy_copies():
    m = _linear()
    parametrize.register_parametrization(m, "weight", Symmetric())
    with pytest.raises(RuntimeError, match="Serialization of parametrized modules is only supported "
                                           "through state_dict()"):
        pickle.dumps(m)
    c = copy.deepcopy(m)
    assert type(c).__name__ == "ParametrizedLinear"
    np.testing.assert_array_equal(c.weight.detach().numpy(), m.weight.detach().numpy())
    assert c.parametrizations.weight.original is not m.parametrizations.weight.original


@pytest.mark.parametrize("dim", [0, 1, None])
def test_weight_norm_is_magnitude_times_direction(dim):
    m = fg.nn.Conv2d(3, 5, 3).to(fg.float64)
    w0 = m.weight.detach().numpy().copy()
    weight_norm(m, dim=dim)
    g = m.parametrizations.weight.original0.detach().numpy()
    v = m.parametrizations.weight.original1.detach().numpy()
    axes = None if dim is None else tuple(d for d in range(4) if d != dim)
    norm = np.sqrt((v ** 2).sum(axis=axes, keepdims=dim is not None))
    np.testing.assert_allclose(g, norm, rtol=1e-12)
    np.testing.assert_allclose(m.weight.detach().numpy(), w0, rtol=1e-12)
    np.testing.assert_allclose(m.weight.detach().numpy(), g * v / norm, rtol=1e-12)
    assert sorted(m.state_dict()) == ["bias", "parametrizations.weight.original0",
                                      "parametrizations.weight.original1"]


def test_spectral_norm_divides_by_the_largest_singular_value():
    m = fg.nn.Linear(6, 4).to(fg.float64)
    w0 = m.weight.detach().numpy().copy()
    spectral_norm(m, n_power_iterations=50)
    assert sorted(m.state_dict()) == ["bias", "parametrizations.weight.0._u",
                                      "parametrizations.weight.0._v",
                                      "parametrizations.weight.original"]
    w = m.weight.detach().numpy()
    np.testing.assert_allclose(w, w0 / np.linalg.svd(w0, compute_uv=False)[0], rtol=1e-6)
    assert np.linalg.svd(w, compute_uv=False)[0] == pytest.approx(1.0, rel=1e-6)
    u = m.parametrizations.weight[0]._u.numpy().copy()
    m.eval()
    m.weight  # noqa: B018 - no power iteration in eval mode
    np.testing.assert_array_equal(m.parametrizations.weight[0]._u.numpy(), u)
    t = fg.nn.ConvTranspose2d(3, 5, 2)
    spectral_norm(t)
    assert m.parametrizations.weight[0].dim == 0 and t.parametrizations.weight[0].dim == 1


@pytest.mark.parametrize("orthogonal_map", ["matrix_exp", "cayley", "householder"])
@pytest.mark.parametrize("shape", [(4, 4), (6, 3), (3, 6)])
def test_orthogonal_weights_stay_orthogonal_while_training(orthogonal_map, shape):
    m = _linear(shape[1], shape[0])
    orthogonal(m, orthogonal_map=orthogonal_map)
    opt = fg.optim.SGD(m.parameters(), lr=0.1)
    x = fg.tensor(np.random.default_rng(1).standard_normal((8, shape[1])))
    for _ in range(3):
        opt.zero_grad()
        m(x).pow(2).sum().backward()
        opt.step()
    w = m.weight.detach().numpy()
    small = min(shape)
    gram = w.T @ w if shape[0] >= shape[1] else w @ w.T
    np.testing.assert_allclose(gram, np.eye(small), atol=1e-12)
    assert m.parametrizations.weight.original.grad is not None


def test_orthogonal_messages():
    with pytest.raises(ValueError, match="Expected a matrix or batch of matrices. Got a tensor of "
                                         "1 dimensions."):
        orthogonal(fg.nn.Linear(3, 3), "bias")
    with pytest.raises(ValueError, match='orthogonal_map has to be one of "matrix_exp", "cayley", '
                                         '"householder". Got: qr'):
        orthogonal(fg.nn.Linear(3, 3), orthogonal_map="qr")


def test_compiled_training_step_equals_eager():
    def run(compiled):
        fg.manual_seed(0)
        net = fg.nn.Sequential(_linear(5, 8, seed=2, dtype=fg.float32), fg.nn.Tanh(),
                               _linear(8, 8, seed=3, dtype=fg.float32), fg.nn.Tanh(),
                               _linear(8, 2, seed=4, dtype=fg.float32))
        weight_norm(net[0])
        orthogonal(net[2])
        opt = fg.optim.Adam(net.parameters(), lr=1e-2)
        x = fg.tensor(np.random.default_rng(5).standard_normal((16, 5)).astype(np.float32))

        def step():
            opt.zero_grad()
            loss = net(x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss
        step = fg.compile(step, fullgraph=True) if compiled else step
        return [float(step()) for _ in range(5)], net[2].weight.detach().numpy()
    (eager, w_e), (comp, w_c) = run(False), run(True)
    np.testing.assert_allclose(comp, eager, rtol=1e-5)
    np.testing.assert_allclose(w_c, w_e, atol=1e-5)


def test_parametrizations_follow_torch():
    torch = pytest.importorskip("torch")

    def run(lib, which):
        rng = np.random.default_rng(0)
        m = lib.nn.Linear(4, 4)
        with lib.no_grad():
            m.weight.copy_(lib.tensor(rng.standard_normal((4, 4)).astype(np.float32)))
            m.bias.zero_()
        getattr(lib.nn.utils.parametrizations, which)(m)
        if which == "spectral_norm":
            with lib.no_grad():
                m.parametrizations.weight[0]._u.copy_(lib.tensor(rng.standard_normal(4).astype(np.float32)))
                m.parametrizations.weight[0]._v.copy_(lib.tensor(rng.standard_normal(4).astype(np.float32)))
        x = lib.tensor(rng.standard_normal((3, 4)).astype(np.float32))
        m(x).pow(2).sum().backward()
        return (sorted(m.state_dict()), m.weight.detach().numpy(),
                [p.grad.numpy() for _, p in sorted(m.named_parameters())])
    for which in ("weight_norm", "spectral_norm", "orthogonal"):
        want, got = run(torch, which), run(fg, which)
        assert got[0] == want[0]
        np.testing.assert_allclose(got[1], want[1], atol=1e-6)
        for a, b in zip(got[2], want[2]):
            np.testing.assert_allclose(a, b, atol=1e-5)


def test_hook_based_weight_norm_as_torch():
    m = _linear(4, 3)
    w0 = m.weight.detach().numpy().copy()
    with pytest.warns(FutureWarning, match="`torch.nn.utils.weight_norm` is deprecated"):
        fg.nn.utils.weight_norm(m)
    assert [n for n, _ in m.named_parameters()] == ["bias", "weight_g", "weight_v"]
    np.testing.assert_allclose(m.weight_g.detach().numpy(),
                               np.sqrt((w0 ** 2).sum(axis=1, keepdims=True)), rtol=1e-12)
    with fg.no_grad():
        m.weight_g.mul_(2)
    x = fg.ones(2, 4, dtype=fg.float64)
    np.testing.assert_allclose(m(x).detach().numpy(), x.numpy() @ (2 * w0).T + m.bias.detach().numpy(),
                               rtol=1e-12)
    with pytest.raises(RuntimeError, match="Cannot register two weight_norm hooks on the same "
                                           "parameter weight"), pytest.warns(FutureWarning):
        fg.nn.utils.weight_norm(m)
    fg.nn.utils.remove_weight_norm(m)
    assert [n for n, _ in m.named_parameters()] == ["bias", "weight"]
    np.testing.assert_allclose(m.weight.detach().numpy(), 2 * w0, rtol=1e-12)
    with pytest.raises(ValueError, match="weight_norm of 'weight' not found in"):
        fg.nn.utils.remove_weight_norm(m)


def np_normalize(x):
    return x / max(np.linalg.norm(x), 1e-12)


def test_hook_based_spectral_norm_iterates_v_then_u_in_training_only():
    m = _linear(5, 3)
    w0 = m.weight.detach().numpy().copy()
    fg.nn.utils.spectral_norm(m, n_power_iterations=2)
    assert [n for n, _ in m.named_parameters()] == ["bias", "weight_orig"]
    assert list(m.state_dict()) == ["bias", "weight_orig", "weight_u", "weight_v"]
    assert m.weight_u.shape == (3,) and m.weight_v.shape == (5,)
    u, v = m.weight_u.numpy().copy(), m.weight_v.numpy().copy()
    x = fg.ones(2, 5, dtype=fg.float64)
    out = m(x)
    for _ in range(2):              # torch's order: v from u, then u from v
        v = np_normalize(w0.T @ u)
        u = np_normalize(w0 @ v)
    np.testing.assert_allclose(m.weight_u.numpy(), u, rtol=1e-12)
    np.testing.assert_allclose(m.weight_v.numpy(), v, rtol=1e-12)
    sigma = u @ w0 @ v
    np.testing.assert_allclose(out.detach().numpy(),
                               x.numpy() @ (w0 / sigma).T + m.bias.detach().numpy(), rtol=1e-12)
    out.sum().backward()            # the gradient flows to weight_orig, not to the buffers
    assert m.weight_orig.grad is not None and m.weight_u.grad is None
    m.eval()
    m(x)
    np.testing.assert_array_equal(m.weight_u.numpy(), u)
    # many training-mode forwards converge to the largest singular value
    m.train()
    for _ in range(30):
        m(x)
    np.testing.assert_allclose(np.linalg.svd(m.weight.detach().numpy(), compute_uv=False)[0],
                               1.0, rtol=1e-10)


def test_hook_based_spectral_norm_remove_and_messages():
    m = _linear(4, 3)
    fg.nn.utils.spectral_norm(m)
    m(fg.ones(1, 4, dtype=fg.float64))
    w = m.weight.detach().numpy().copy()
    with pytest.raises(RuntimeError, match="^Cannot register two spectral_norm hooks on the same "
                                           "parameter weight$"):
        fg.nn.utils.spectral_norm(m)
    fg.nn.utils.remove_spectral_norm(m)
    assert list(m.state_dict()) == ["bias", "weight"]
    assert isinstance(m.weight, fg.nn.Parameter)
    np.testing.assert_allclose(m.weight.detach().numpy(), w, rtol=1e-12)   # the stored u, v
    with pytest.raises(ValueError, match="spectral_norm of 'weight' not found in"):
        fg.nn.utils.remove_spectral_norm(m)
    with pytest.raises(ValueError, match="^Expected n_power_iterations to be positive, but got "
                                         "n_power_iterations=0$"):
        fg.nn.utils.spectral_norm(fg.nn.Linear(2, 2), n_power_iterations=0)
    nobias = fg.nn.Linear(2, 2, bias=False)
    with pytest.raises(ValueError, match="^`SpectralNorm` cannot be applied as parameter `bias` is "
                                         "None$"):
        fg.nn.utils.spectral_norm(nobias, name="bias")
    t = fg.nn.utils.spectral_norm(fg.nn.ConvTranspose2d(3, 5, 2))
    assert t.weight_u.shape == (5,) and t.weight_v.shape == (3 * 2 * 2,)   # dim 1 is the output


def test_hook_based_spectral_norm_compiled_step_equals_eager():
    def run(compiled):
        net = fg.nn.Sequential(_linear(5, 6, seed=2, dtype=fg.float32), fg.nn.Tanh(),
                               _linear(6, 2, seed=3, dtype=fg.float32))
        fg.manual_seed(0)
        fg.nn.utils.spectral_norm(net[0])
        opt = fg.optim.SGD(net.parameters(), lr=0.1)
        x = fg.tensor(np.random.default_rng(5).standard_normal((16, 5)).astype(np.float32))

        def step():
            opt.zero_grad()
            loss = net(x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss
        step = fg.compile(step, fullgraph=True) if compiled else step
        losses = [float(step()) for _ in range(5)]
        return losses, net[0].weight_orig.detach().numpy(), net[0].weight_u.numpy()
    (eager, w_e, u_e), (comp, w_c, u_c) = run(False), run(True)
    np.testing.assert_allclose(comp, eager, rtol=1e-5)
    np.testing.assert_allclose(w_c, w_e, atol=1e-5)
    np.testing.assert_allclose(u_c, u_e, atol=1e-5)      # the buffers are written back


@pytest.mark.parametrize("make", ["Linear", "Conv2d", "ConvTranspose2d"])
def test_hook_based_spectral_norm_follows_torch(make):
    torch = pytest.importorskip("torch")
    args, shape = {"Linear": ((5, 4), (3, 5)), "Conv2d": ((2, 3, 3), (2, 2, 5, 5)),
                   "ConvTranspose2d": ((2, 3, 3), (2, 2, 4, 4))}[make]
    mt = torch.nn.utils.spectral_norm(getattr(torch.nn, make)(*args), n_power_iterations=2)
    mf = fg.nn.utils.spectral_norm(getattr(fg.nn, make)(*args), n_power_iterations=2)
    assert list(mf.state_dict()) == list(mt.state_dict())
    mf.load_state_dict(mt.state_dict())      # torch's tensors, u and v included
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for train in (True, True, False):
        mt.train(train)
        mf.train(train)
        yt, yf = mt(torch.tensor(x)), mf(fg.tensor(x))
        np.testing.assert_allclose(yf.detach().numpy(), yt.detach().numpy(), atol=2e-6)
        np.testing.assert_allclose(mf.weight_u.numpy(), mt.weight_u.numpy(), atol=1e-6)
    yt.sum().backward()
    yf.sum().backward()
    np.testing.assert_allclose(mf.weight_orig.grad.numpy(), mt.weight_orig.grad.numpy(),
                               atol=5e-6)
    torch.nn.utils.remove_spectral_norm(mt)
    fg.nn.utils.remove_spectral_norm(mf)
    assert list(mf.state_dict()) == list(mt.state_dict())
    np.testing.assert_allclose(mf.weight.detach().numpy(), mt.weight.detach().numpy(), atol=1e-6)
