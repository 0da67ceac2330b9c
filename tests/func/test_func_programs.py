"""Programs users write with the function transforms, on small float64 models: per-example
gradients with functional_call and vmap(grad), Hessian-vector products (per example and of
the batch loss) as forward over reverse, and an ensemble over stacked weights; eager and
compiled, against loops of plain reverse mode and against torch.func where torch is
installed.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import func as fgfunc

TOL = {"rtol": 1e-9, "atol": 1e-11}
BATCH, IN, HIDDEN, OUT, MODELS = 5, 4, 6, 3, 3


def weights(seed: int) -> dict:
    """The MLP's weights as float64 arrays, the same for fusegrad and torch."""
    rng = np.random.default_rng(seed)
    return {"0.weight": rng.normal(0, 0.5, (HIDDEN, IN)), "0.bias": rng.normal(0, 0.1, HIDDEN),
            "2.weight": rng.normal(0, 0.5, (OUT, HIDDEN)), "2.bias": rng.normal(0, 0.1, OUT)}


def mlp(T, seed: int = 0):
    model = T.nn.Sequential(T.nn.Linear(IN, HIDDEN, dtype=T.float64), T.nn.Tanh(),
                            T.nn.Linear(HIDDEN, OUT, dtype=T.float64))
    model.load_state_dict({k: T.tensor(v) for k, v in weights(seed).items()})
    return model


def data(T):
    rng = np.random.default_rng(7)
    x = T.tensor(rng.normal(0, 1, (BATCH, IN)))
    t = T.tensor(rng.integers(0, OUT, BATCH))
    return x, t


def tangent_of(T, params: dict) -> dict:
    rng = np.random.default_rng(11)
    return {k: T.tensor(rng.normal(0, 1, tuple(p.shape))) for k, p in params.items()}


def params_of(model) -> dict:
    return {k: p.detach() for k, p in model.named_parameters()}


# --------------------------------------------------------------------------- the programs
# Each takes the library ``T`` (fusegrad or torch) and returns a function of tensors and the
# arguments to call it with, so that it runs eagerly, compiled and under torch alike.


def per_example_loss(T, model):
    def loss(params, x, t):
        logits = T.func.functional_call(model, params, (x.unsqueeze(0),))
        return T.nn.functional.cross_entropy(logits, t.unsqueeze(0))
    return loss


def per_example_gradients(T):
    model = mlp(T)
    x, t = data(T)
    fn = T.func.vmap(T.func.grad(per_example_loss(T, model)), in_dims=(None, 0, 0))
    return fn, (params_of(model), x, t)


def per_example_hvps(T):
    """Each example's loss Hessian (with respect to the weights) times one direction."""
    model = mlp(T)
    x, t = data(T)
    loss = per_example_loss(T, model)
    params = params_of(model)

    def hvp(params, v, x, t):
        return T.func.jvp(lambda p: T.func.grad(loss)(p, x, t), (params,), (v,))[1]
    return T.func.vmap(hvp, in_dims=(None, None, 0, 0)), (params, tangent_of(T, params), x, t)


def batch_hvp(T):
    """The batch loss's Hessian-vector product, forward over reverse."""
    model = mlp(T)
    x, t = data(T)
    params = params_of(model)

    def loss(params):
        return T.nn.functional.cross_entropy(T.func.functional_call(model, params, (x,)), t)

    def hvp(params, v):
        return T.func.jvp(T.func.grad(loss), (params,), (v,))[1]
    return hvp, (params, tangent_of(T, params))


def ensemble(T):
    """Predictions and per-model gradients of an ensemble of MLPs over stacked weights."""
    models = [mlp(T, seed) for seed in range(MODELS)]
    params, buffers = T.func.stack_module_state(models)
    params = {k: p.detach() for k, p in params.items()}
    base = models[0]
    x, t = data(T)

    def predict(params, buffers, x):
        return T.func.functional_call(base, (params, buffers), (x,))

    def loss(params, buffers, x, t):
        return T.nn.functional.cross_entropy(predict(params, buffers, x), t)

    def step(params, buffers, x, t):
        preds = T.func.vmap(predict, in_dims=(0, 0, None))(params, buffers, x)
        grads = T.func.vmap(T.func.grad(loss), in_dims=(0, 0, None, None))(params, buffers, x, t)
        return preds, grads
    return step, (params, buffers, x, t)


def gradient_penalty(T):
    """The weights' gradient of a penalty on each example's input gradient (a critic's
    gradient penalty): grad over vmap(grad)."""
    model = mlp(T)
    x, _ = data(T)

    def penalty(params, x):
        def score(example):
            return T.func.functional_call(model, params, (example,)).sum()
        norms = T.func.vmap(T.func.grad(score))(x).norm(dim=1)
        return ((norms - 1) ** 2).mean()
    return T.func.grad(penalty), (params_of(model), x)


def per_example_hessians(T):
    """Each example's loss Hessian with respect to all the weights, as nested dicts."""
    model = mlp(T)
    x, t = data(T)
    fn = T.func.vmap(T.func.hessian(per_example_loss(T, model)), in_dims=(None, 0, 0))
    return fn, (params_of(model), x, t)


PROGRAMS = {"per_example_gradients": per_example_gradients, "per_example_hvps": per_example_hvps,
            "batch_hvp": batch_hvp, "ensemble": ensemble, "gradient_penalty": gradient_penalty,
            "per_example_hessians": per_example_hessians}


# --------------------------------------------------------------------------- references


def grads_of(loss, params: dict, create_graph: bool = False) -> dict:
    leaves = {k: p.detach().requires_grad_() for k, p in params.items()}
    gs = fg.autograd.grad(loss(leaves), list(leaves.values()), create_graph=create_graph,
                          materialize_grads=True)
    return dict(zip(leaves, gs)), leaves


def hvp_by_double_backward(loss, params: dict, v: dict) -> dict:
    g, leaves = grads_of(loss, params, create_graph=True)
    dot = sum((g[k] * v[k]).sum() for k in g)
    return dict(zip(leaves, fg.autograd.grad(dot, list(leaves.values()))))


def hessian_by_double_backward(loss, params: dict) -> dict:
    """``{k1: {k2: d2 loss / dk1 dk2}}``, one double backward per element of each weight."""
    g, leaves = grads_of(loss, params, create_graph=True)
    out = {}
    for k1, g1 in g.items():
        rows = [fg.autograd.grad(g1.reshape(-1)[n], list(leaves.values()), retain_graph=True,
                                 materialize_grads=True) for n in range(g1.numel())]
        out[k1] = {k2: fg.stack([r[j] for r in rows], 0).reshape(tuple(g1.shape) + tuple(p.shape))
                   for j, (k2, p) in enumerate(leaves.items())}
    return out


def stack(dicts: list) -> dict:
    if isinstance(next(iter(dicts[0].values())), dict):
        return {k: stack([d[k] for d in dicts]) for k in dicts[0]}
    return {k: fg.stack([d[k].detach() for d in dicts], 0) for k in dicts[0]}


def expected(name: str):
    model = mlp(fg)
    x, t = data(fg)
    params = params_of(model)
    F = fg.nn.functional

    def example_loss(i):
        return lambda p: F.cross_entropy(fgfunc.functional_call(model, p, (x[i:i + 1],)), t[i:i + 1])
    if name == "per_example_gradients":
        return stack([grads_of(example_loss(i), params)[0] for i in range(BATCH)])
    if name == "per_example_hvps":
        v = tangent_of(fg, params)
        return stack([hvp_by_double_backward(example_loss(i), params, v) for i in range(BATCH)])
    if name == "batch_hvp":
        def loss(p):
            return F.cross_entropy(fgfunc.functional_call(model, p, (x,)), t)
        return hvp_by_double_backward(loss, params, tangent_of(fg, params))
    if name == "gradient_penalty":
        def penalty(p):
            norms = []
            for i in range(BATCH):
                xi = x[i].detach().requires_grad_()
                (g,) = fg.autograd.grad(fgfunc.functional_call(model, p, (xi,)).sum(), xi,
                                        create_graph=True)
                norms.append(g.norm())
            return ((fg.stack(norms) - 1) ** 2).mean()
        return grads_of(penalty, params)[0]
    if name == "per_example_hessians":
        return stack([hessian_by_double_backward(example_loss(i), params) for i in range(BATCH)])
    models = [mlp(fg, seed) for seed in range(MODELS)]
    preds = fg.stack([m(x).detach() for m in models], 0)
    grads = stack([grads_of(lambda p, m=m: F.cross_entropy(fgfunc.functional_call(m, p, (x,)), t),
                            params_of(m))[0] for m in models])
    return preds, grads


def assert_tree_close(got, want, **tol):
    if isinstance(want, dict):
        assert set(got) == set(want)
        for k in want:
            assert_tree_close(got[k], want[k], **tol)
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_tree_close(a, b, **tol)
    else:
        assert tuple(got.shape) == tuple(want.shape)
        np.testing.assert_allclose(got.detach().numpy(), np.asarray(want.detach().numpy()),
                                   **(tol or TOL))


# --------------------------------------------------------------------------- tests


def test_hvp_reference_is_the_finite_difference_of_the_gradient():
    model = mlp(fg)
    x, t = data(fg)
    params = params_of(model)
    v = tangent_of(fg, params)

    def loss(p):
        return fg.nn.functional.cross_entropy(fgfunc.functional_call(model, p, (x,)), t)
    eps = 1e-5
    plus = grads_of(loss, {k: p + eps * v[k] for k, p in params.items()})[0]
    minus = grads_of(loss, {k: p - eps * v[k] for k, p in params.items()})[0]
    fd = {k: (plus[k] - minus[k]) / (2 * eps) for k in plus}
    assert_tree_close(hvp_by_double_backward(loss, params, v), fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_eager(name):
    fn, args = PROGRAMS[name](fg)
    assert_tree_close(fn(*args), expected(name))


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "per_example_hessians"
                                  else n for n in PROGRAMS])
def test_program_compiled(name):
    fn, args = PROGRAMS[name](fg)
    assert_tree_close(fg.compile(fn, fullgraph=True)(*args), expected(name))


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_matches_torch_func(name):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.func")
    fn, args = PROGRAMS[name](fg)
    tfn, targs = PROGRAMS[name](torch)
    assert_tree_close(fn(*args), tfn(*targs))
