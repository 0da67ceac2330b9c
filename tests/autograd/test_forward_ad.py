"""fusegrad.autograd.forward_ad (torch.autograd.forward_ad): dual tensors through ops, models,
reverse mode (both ways round), in-place writes and fusegrad.compile; torch's errors.

References without torch: closed forms and central finite differences in float64; the tests
at the end compare with torch's forward AD, torch.func and torch.autograd.functional."""

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.autograd.forward_ad as fwAD
import fusegrad.nn as nn
from fusegrad.autograd import functional as AF
from fusegrad.func import grad, jacfwd, jvp


def t64(values):
    return fg.tensor(np.asarray(values, dtype=np.float64))


def close(a, b, rtol=1e-10, atol=1e-12):
    as_np = lambda t: t.detach().numpy() if isinstance(t, fg.Tensor) else np.asarray(t)  # noqa: E731
    np.testing.assert_allclose(as_np(a), as_np(b), rtol=rtol, atol=atol)


X = np.array([0.5, -1.25, 2.0])
V = np.array([1.0, 0.5, -2.0])


def test_dual_tensor_tangent_is_the_derivative():
    with fwAD.dual_level() as level:
        assert level == 0
        d = fwAD.make_dual(t64(X), t64(V))
        y = (d.sin() * d).sum()
        out = fwAD.unpack_dual(y)
        assert isinstance(out, fwAD.UnpackedDualTensor) and out._fields == ("primal", "tangent")
        close(out.primal, (np.sin(X) * X).sum())
        close(out.tangent, ((np.cos(X) * X + np.sin(X)) * V).sum())
        assert fwAD.unpack_dual(out.primal).tangent is None
        # integer and boolean results carry none; piecewise-constant ops a zero one
        assert fwAD.unpack_dual(d > 0).tangent is None
        assert fwAD.unpack_dual(d.argmax()).tangent is None
        close(fwAD.unpack_dual(d.floor()).tangent, np.zeros(3))
        assert fwAD.unpack_dual(d.detach()).tangent is None
    # the level is gone: nothing carries its tangents
    assert fwAD.unpack_dual(y).tangent is None


def test_make_dual_is_a_view_and_unpack_outside_a_level():
    x = t64(X)
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t64(V))
        assert d._base is x
        primal, tangent = fwAD.unpack_dual(d)
        assert primal._base is x and fwAD.unpack_dual(primal).tangent is None
        close(tangent, V)
        # a float32 tangent of a float64 primal takes the primal's dtype
        assert fwAD.unpack_dual(fwAD.make_dual(x, fg.ones(3))).tangent.dtype == fg.float64
    primal, tangent = fwAD.unpack_dual(x)
    assert primal is x and tangent is None


def test_forward_ad_mistakes_raise_torchs_errors():
    x = t64(X)
    with pytest.raises(RuntimeError, match="no level exists, make sure to enter_dual_level"):
        fwAD.make_dual(x, x)
    with pytest.raises(RuntimeError, match="Dual level must be a positive number"):
        fwAD.exit_dual_level()
    with fwAD.dual_level():
        with pytest.raises(RuntimeError, match=r"Tensor is of size \[3\] while the given forward "
                                               r"gradient is of size \[4\]"):
            fwAD.make_dual(x, fg.ones(4, dtype=fg.float64))
        with pytest.raises(ValueError, match="Expected primal to be floating point or complex, "
                                             "but got: fusegrad.int64"):
            fwAD.make_dual(fg.arange(3), x)
        with pytest.raises(ValueError, match="Expected tangent to be floating point"):
            fwAD.make_dual(x, fg.arange(3))
        with pytest.raises(RuntimeError, match="Invalid level given to _make_dual"):
            fwAD.make_dual(x, x, level=1)
        with pytest.raises(RuntimeError, match="Nested forward mode AD is not supported"):
            fwAD.enter_dual_level()
        with pytest.raises(RuntimeError, match="not the last one that was created"):
            fwAD.exit_dual_level(level=3)
        # an op with no derivative refuses, naming it
        with pytest.raises(NotImplementedError, match="forward AD with nextafter"):
            fg.nextafter(fwAD.make_dual(x, x), x)


def mlp64():
    fg.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 8), nn.GELU(),
                         nn.Linear(8, 2)).double()


def test_dual_numbers_through_an_mlp_match_finite_differences():
    model = mlp64()
    x = t64(np.random.default_rng(0).standard_normal((4, 3)))
    v = t64(np.random.default_rng(1).standard_normal((4, 3)))
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(model(fwAD.make_dual(x, v)).log_softmax(-1)).tangent
    h = 1e-6
    with fg.no_grad():
        fd = (model(x + h * v).log_softmax(-1) - model(x - h * v).log_softmax(-1)) / (2 * h)
    close(tangent, fd, rtol=1e-6, atol=1e-8)


def test_reverse_over_forward_and_forward_over_reverse_give_the_hvp():
    # f = sum(exp(x) * x): H = diag(exp(x) (x + 2))
    hv = np.exp(X) * (X + 2) * V
    x = t64(X).requires_grad_()
    with fwAD.dual_level():
        d = fwAD.make_dual(x, t64(V))
        tangent = fwAD.unpack_dual((d.exp() * d).sum()).tangent
        (g,) = fg.autograd.grad(tangent, x)              # grad of the jvp
        close(g, hv)
        d = fwAD.make_dual(x, t64(V))
        (g,) = fg.autograd.grad((d.exp() * d).sum(), d, create_graph=True)
        close(fwAD.unpack_dual(g).tangent, hv)           # jvp of the grad


def test_in_place_ops_move_the_tangent():
    with fwAD.dual_level():
        z = fwAD.make_dual(t64(X).clone(), t64(V))
        z.mul_(2.0)
        close(fwAD.unpack_dual(z).tangent, 2 * V)
        w = t64(X).clone()
        w.mul_(fwAD.make_dual(t64(X), t64(V)))           # w had no tangent: it gets x * v
        close(fwAD.unpack_dual(w).tangent, X * V)
        w.fill_(1.0)
        assert fwAD.unpack_dual(w).tangent is None


def test_writes_through_views_update_the_base_and_its_other_views():
    """A tangent follows the storage, as torch's (a view's tangent is a view of its base's):
    a write through a view updates the base's tangent, a write into a plain tensor gives it
    one, and a view made before a write sees the written tangent."""
    p = fg.arange(6.0, dtype=fg.float64).reshape(2, 3)
    with fwAD.dual_level():
        x = fwAD.make_dual(p, fg.ones(2, 3, dtype=fg.float64))
        y = x.clone()
        row = y[1]                       # made before the writes
        y[0].mul_(2)
        y[:, 1] += x[:, 2] ** 2          # d/dx (x^2) = 2x at x = 2 and 5
        np.testing.assert_array_equal(fwAD.unpack_dual(y).tangent.numpy(),
                                      [[2, 6, 2], [1, 11, 1]])
        np.testing.assert_array_equal(fwAD.unpack_dual(row).tangent.numpy(), [1, 11, 1])
        np.testing.assert_array_equal(fwAD.unpack_dual(row * 2).tangent.numpy(), [2, 22, 2])
        z = fg.zeros(2, 3, dtype=fg.float64)
        tail = z[1]
        z[1] = x[0] * 3
        np.testing.assert_array_equal(fwAD.unpack_dual(z).tangent.numpy(),
                                      [[0, 0, 0], [3, 3, 3]])
        np.testing.assert_array_equal(fwAD.unpack_dual(tail).tangent.numpy(), [3, 3, 3])
        w = fg.zeros(2, 3, dtype=fg.float64)
        first = w[0]
        w.copy_(x.exp())
        np.testing.assert_allclose(fwAD.unpack_dual(first.sum()).tangent.item(),
                                   np.exp([0.0, 1.0, 2.0]).sum(), rtol=1e-15)


def _writes_through_views(x):
    y = x.clone()
    a = y[1]
    y[0].mul_(3)
    y[:, 2] += a[:2].sin()
    v = y.view(-1)
    v[1:3].exp_()
    return y * a.sum()


@pytest.mark.parametrize("compiled", [False, True])
def test_jvp_through_views_matches_finite_differences(compiled):
    """func.jvp of a function that writes through views, eager and compiled (where the
    trace functionalizes the writes), against central differences in float64."""
    rng = np.random.default_rng(0)
    x = fg.tensor(rng.standard_normal((2, 3)))
    t = fg.tensor(rng.standard_normal((2, 3)))

    def f(x, t):
        return jvp(_writes_through_views, (x,), (t,))
    fn = fg.compile(f, fullgraph=True) if compiled else f
    out, tangent = fn(x, t)
    h = 1e-6
    numeric = (_writes_through_views(x + h * t).numpy() -
               _writes_through_views(x - h * t).numpy()) / (2 * h)
    np.testing.assert_allclose(out.numpy(), _writes_through_views(x).numpy(), rtol=1e-12)
    np.testing.assert_allclose(tangent.numpy(), numeric, rtol=1e-6, atol=1e-8)


def test_nested_jvp_is_the_second_derivative():
    # f = sum(x^3): d2f[v1, v2] = sum(6 x v1 v2)
    v2 = np.array([0.25, 1.0, 3.0])

    def df(x):
        return jvp(lambda y: (y ** 3).sum(), (x,), (t64(V),))[1]
    _, d2 = jvp(df, (t64(X),), (t64(v2),))
    close(d2, (6 * X * V * v2).sum())


def test_jvp_jacfwd_and_hvp_closed_forms():
    x = t64(X)
    value, tangent = jvp(lambda x: x.sin() * 2, (x,), (t64(V),))
    close(value, 2 * np.sin(X))
    close(tangent, 2 * np.cos(X) * V)
    close(jacfwd(lambda x: x.exp().cumsum(0))(x), np.tril(np.ones((3, 3))) * np.exp(X))
    _, hv = AF.hvp(lambda x: (x.exp() * x).sum(), x, t64(V))
    close(hv, np.exp(X) * (X + 2) * V)
    _, hv = jvp(grad(lambda x: (x.exp() * x).sum()), (x,), (t64(V),))
    close(hv, np.exp(X) * (X + 2) * V)
    _, jv = AF.jvp(lambda x: (x ** 2, x.sum()), x, t64(V))
    close(jv[0], 2 * X * V)
    close(jv[1], V.sum())


def _dual_program(x, v, w):
    with fwAD.dual_level():
        y = (fwAD.make_dual(x, v) @ w).tanh().sum(-1)
        return fwAD.unpack_dual(y).tangent


def test_compiled_forward_ad_is_one_graph_and_matches_eager():
    rng = np.random.default_rng(2)
    x, v, w = (t64(rng.standard_normal(s)) for s in ((4, 3), (4, 3), (3, 5)))
    compiled = fg.compile(_dual_program, fullgraph=True)
    for _ in range(2):
        close(compiled(x, v, w), _dual_program(x, v, w), rtol=1e-12, atol=1e-12)
    assert compiled.compiles == 1
    # a dual tensor made outside the compiled function: it runs eagerly, tangents and all
    outside = fg.compile(lambda x, w: (x @ w).tanh().sum(-1))
    with fwAD.dual_level():
        got = fwAD.unpack_dual(outside(fwAD.make_dual(x, v), w)).tangent
    close(got, _dual_program(x, v, w), rtol=1e-12, atol=1e-12)
    f = lambda x: (x.exp() * x).sum()  # noqa: E731
    hvp_program = fg.compile(lambda x, v: (jvp(grad(f), (x,), (v,))[1],
                                           AF.hvp(f, x, v)[1]), fullgraph=True)
    for got in hvp_program(x, v):
        close(got, (x.exp() * (x + 2) * v).numpy(), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- against torch


def _torch():
    return pytest.importorskip("torch")


def _torch_mlp(torch, model):
    tmodel = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8),
                                 torch.nn.GELU(), torch.nn.Linear(8, 2)).double()
    with torch.no_grad():
        for p, q in zip(tmodel.parameters(), model.parameters()):
            p.copy_(torch.from_numpy(q.detach().numpy().copy()))
    return tmodel


@pytest.mark.parametrize("compiled", [False, True])
def test_forward_ad_programs_match_torch(compiled):
    torch = _torch()
    tfwAD = torch.autograd.forward_ad
    model = mlp64()
    tmodel = _torch_mlp(torch, model)
    rng = np.random.default_rng(3)
    xs, vs = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))

    def dual_mlp(lib, ad, m, x, v):
        with ad.dual_level():
            out = m(ad.make_dual(x, v)).log_softmax(-1)
            return ad.unpack_dual(out).tangent

    def loss(lib):
        return lambda x: (x.sin() * x.exp()).sum() + (x ** 2).prod()

    def programs(lib, ad, m, func, functional):
        f = loss(lib)
        return lambda x, v: (
            dual_mlp(lib, ad, m, x, v),
            func.jvp(lambda x: m(x).tanh(), (x,), (v,))[1],
            func.jacfwd(lambda x: m(x).sum(0))(x[0]),
            func.jvp(func.grad(f), (x,), (v,))[1],
            functional.hvp(f, x, v)[1],
            functional.jvp(lambda x: m(x) * 2, x, v)[1],
        )
    ours = programs(fg, fwAD, model, fg.func, AF)
    if compiled:
        ours = fg.compile(ours, fullgraph=True)
    got = ours(t64(xs), t64(vs))
    want = programs(torch, tfwAD, tmodel, torch.func, torch.autograd.functional)(
        torch.from_numpy(xs), torch.from_numpy(vs))
    for a, b in zip(got, want, strict=True):
        assert tuple(a.shape) == tuple(b.shape)
        close(a, b.detach().numpy(), rtol=1e-9, atol=1e-11)


def test_forward_ad_errors_match_torch():
    torch = _torch()
    for lib in (fg, torch):
        ad = lib.autograd.forward_ad
        x = lib.zeros(3, dtype=lib.float64)
        with pytest.raises(RuntimeError, match="no level exists"):
            ad.make_dual(x, x)
        with ad.dual_level():
            with pytest.raises(RuntimeError, match="forward gradient is of size"):
                ad.make_dual(x, lib.zeros(4, dtype=lib.float64))
            with pytest.raises(RuntimeError, match="Nested forward mode AD"):
                ad.enter_dual_level()
            with pytest.raises(ValueError, match="Expected primal to be floating point"):
                ad.make_dual(lib.arange(3), x)
