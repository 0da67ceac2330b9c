"""vmap as one batched call: per-example gradients, vmap inside grad, nesting, in-place
writes, the loop fallback and compiled graphs whose kernels do not depend on the batch size.

Values are checked against per-example loops and float64 references (no torch needed), and
against torch.func where torch is installed.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad.config import config
from fusegrad.func import functional_call, grad, jacrev, vjp, vmap
from fusegrad.func._batching import BatchTensor

F32 = {"rtol": 1e-5, "atol": 1e-6}


def close(a, b, **tol):
    np.testing.assert_allclose(np.asarray(a.detach().numpy()), np.asarray(b.detach().numpy()
                               if isinstance(b, fg.Tensor) else b), **(tol or F32))


def mlp(sizes=(8, 16, 16, 4), seed=0):
    fg.manual_seed(seed)
    layers = []
    for i, (m, n) in enumerate(zip(sizes, sizes[1:])):
        layers += [nn.Linear(m, n)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


def per_example(model):
    def loss(p, x, t):
        return F.cross_entropy(functional_call(model, p, (x.unsqueeze(0),)), t.unsqueeze(0))
    return vmap(grad(loss), in_dims=(None, 0, 0))


def loop_grads(model, x, t):
    out = {k: [] for k, _ in model.named_parameters()}
    for i in range(x.shape[0]):
        loss = F.cross_entropy(model(x[i:i + 1]), t[i:i + 1])
        for (k, _), g in zip(model.named_parameters(), fg.autograd.grad(loss, list(model.parameters()))):
            out[k].append(g.numpy())
    return {k: np.stack(v) for k, v in out.items()}


def test_the_function_runs_once_on_batched_tensors():
    seen = []

    def f(a):
        seen.append((type(a), tuple(a.shape)))
        return a * 2
    out = vmap(f)(fg.ones(5, 3))
    assert seen == [(BatchTensor, (3,))]
    assert type(out) is fg.Tensor and out.shape == (5, 3)


def test_per_example_gradients_in_float64_equal_the_loop():
    model = mlp().double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    fg.manual_seed(1)
    x, t = fg.randn(6, 8, dtype=fg.float64), fg.randint(0, 4, (6,))
    got = per_example(model)(params, x, t)
    want = loop_grads(model, x, t)
    for k in want:
        np.testing.assert_allclose(got[k].numpy(), want[k], rtol=1e-12, atol=1e-14)


def test_compiled_per_example_gradients_are_one_batched_graph():
    model = mlp()
    params = {k: v.detach() for k, v in model.named_parameters()}
    f = fg.compile(per_example(model))
    counts = []
    for batch in (2, 16):
        fg.manual_seed(batch)
        x, t = fg.randn(batch, 8), fg.randint(0, 4, (batch,))
        counts.append(len(f.lower(params, x, t).kernels))
        got, want = f(params, x, t), loop_grads(model, x, t)
        for k in want:
            close(got[k], want[k], rtol=1e-5, atol=1e-6)
    assert counts[0] == counts[1]


def test_vmap_inside_grad_sums_the_examples_gradients():
    fg.manual_seed(0)
    w, x = fg.randn(4, 3, dtype=fg.float64), fg.randn(5, 4, dtype=fg.float64)

    def f(w, xi):
        return (xi @ w).tanh().sum()
    got = grad(lambda w: vmap(f, in_dims=(None, 0))(w, x).sum())(w)
    want = sum(grad(f)(w, x[i]) for i in range(5))
    close(got, want, rtol=1e-12, atol=1e-14)
    w2 = w.clone().requires_grad_()
    vmap(f, in_dims=(None, 0))(w2, x).sum().backward()
    close(w2.grad, want, rtol=1e-12, atol=1e-14)


def test_vjp_functions_and_backward_inside_vmap():
    fg.manual_seed(0)
    x = fg.randn(3, 4, dtype=fg.float64)

    def twice(a):
        _, fn = vjp(lambda v: v.sin(), a)
        with fg.no_grad():
            return fn(fg.ones(4, dtype=fg.float64))[0] + fn(fg.full((4,), 2.0, dtype=fg.float64))[0]
    close(vmap(twice)(x), 3 * x.cos(), rtol=1e-12, atol=1e-14)

    def accumulated(a):
        a = a.detach().requires_grad_()
        (a ** 2).sum().backward()
        return a.grad
    close(vmap(accumulated)(x), 2 * x, rtol=1e-12, atol=1e-14)


def test_nested_vmap_of_grad_and_jacobians():
    fg.manual_seed(0)
    x = fg.randn(2, 3, 4, dtype=fg.float64)
    f = lambda v: (v.sin() * v.sum()).sum()      # noqa: E731
    got = vmap(vmap(grad(f)))(x)
    want = fg.stack([fg.stack([grad(f)(x[i, j]) for j in range(3)]) for i in range(2)])
    close(got, want, rtol=1e-12, atol=1e-14)
    jac = vmap(jacrev(lambda v: v.sin() * v.sum()))(x[0])
    want = fg.stack([jacrev(lambda v: v.sin() * v.sum())(x[0, i]) for i in range(3)])
    close(jac, want, rtol=1e-12, atol=1e-14)


def test_in_dims_out_dims_and_chunks():
    fg.manual_seed(0)
    a, b = fg.randn(3, 4), fg.randn(4, 5)

    def f(x, y):
        return (x.unsqueeze(-1) * y[:2]).sum(0)
    want = fg.stack([f(a[:, i], b[i]) for i in range(4)])
    close(vmap(f, in_dims=(-1, 0))(a, b), want)
    close(vmap(f, in_dims=(1, 0), out_dims=1)(a, b), want.movedim(0, 1))
    for chunk in (1, 3, 10):
        close(vmap(f, in_dims=(1, 0), chunk_size=chunk)(a, b), want)
    rows, sums = vmap(lambda x: (x * 2, x.sum()), out_dims=(1, 0))(a)
    close(rows, (a * 2).t())
    close(sums, a.sum(1))


def test_unbatched_result_and_none_out_dims():
    x = fg.arange(6.0).reshape(2, 3)
    c = fg.ones(3)
    assert vmap(lambda a: c * 2, out_dims=None)(x).shape == (3,)
    close(vmap(lambda a: c * 2)(x), fg.full((2, 3), 2.0))
    with pytest.raises(ValueError, match="can not return a BatchedTensor when out_dim is None"):
        vmap(lambda a: a * 2, out_dims=None)(x)


def test_in_place_writes_inside_vmap():
    x = fg.arange(6.0).reshape(2, 3)

    def f(a):
        y = a.clone()
        y.mul_(2)
        y[0] = -1.0
        y[1:].add_(10)
        return y
    close(vmap(f)(x), fg.stack([f(x[i]) for i in range(2)]))

    def views(a):
        y = a.clone()
        head, tail = y[:2], y[1:]
        y.add_(1)                  # seen through both views
        head.mul_(10)              # seen through y and tail
        return y, head, tail
    got = vmap(views)(x)
    for k, want in enumerate(zip(*[views(x[i]) for i in range(2)])):
        close(got[k], fg.stack(list(want)))


def test_values_of_batched_tensors_are_refused():
    x = fg.ones(2, 3)
    with pytest.raises(RuntimeError, match="vmap: It looks like you're calling .item"):
        vmap(lambda a: a.sum().item())(x)
    with pytest.raises(RuntimeError, match="data-dependent control flow"):
        vmap(lambda a: a * 2 if a.sum() > 0 else a)(x)
    with pytest.raises(RuntimeError, match="vmap: inplace arithmetic"):
        vmap(lambda a: fg.zeros(3).copy_(a))(x)
    kept = []
    vmap(lambda a: kept.append(a) or a)(x)
    with pytest.raises(RuntimeError, match="escaped vmap"):
        kept[0] + 1


def test_loop_fallback_is_reported_under_debug(monkeypatch, capsys):
    monkeypatch.setattr(config, "debug", True)
    fg.manual_seed(0)
    out = vmap(lambda a: a + fg.rand(4), randomness="different")(fg.zeros(3, 4))
    assert "vmap: random_uniform runs once per example (3 calls)" in capsys.readouterr().err
    assert len({tuple(r) for r in out.numpy().tolist()}) == 3


def test_randomness_same_holds_across_chunks():
    fg.manual_seed(0)
    same = vmap(lambda a: a + fg.rand(2), randomness="same", chunk_size=2)(fg.zeros(5, 2))
    assert (same.numpy() == same.numpy()[:1]).all()
    different = vmap(lambda a: a + fg.rand(2), randomness="different", chunk_size=2)(
        fg.zeros(5, 2))
    assert len({tuple(r) for r in different.numpy().tolist()}) == 5


def test_randomness_different_under_nesting_gives_every_example_its_own_numbers():
    fg.manual_seed(0)
    out = vmap(vmap(lambda a: a + fg.rand(2), randomness="different"),
               randomness="different")(fg.zeros(2, 3, 2))
    rows = {tuple(r) for r in out.reshape(6, 2).numpy().tolist()}
    assert len(rows) == 6
    same = vmap(vmap(lambda a: a + fg.rand(2), randomness="same"), randomness="different")(
        fg.zeros(2, 3, 2)).numpy()
    assert (same[:, :1] == same).all() and not (same[:1] == same).all()


# --------------------------------------------------------------------------- public ops


def _public_op_cases():
    fg.manual_seed(0)
    b = 3
    x4, w = fg.randn(b, 2, 5, 5), fg.randn(4, 2, 3, 3)
    x2, idx = fg.randn(b, 4, 6), fg.tensor([2, 0, 1])
    emb, tok = fg.randn(10, 6), fg.randint(0, 10, (b, 5))
    a, v = fg.randn(b, 4, 4) + 4 * fg.eye(4), fg.randn(b, 4)
    return {
        "conv2d": (lambda x: F.conv2d(x, w, padding=1), (x4,)),
        "max_pool2d": (lambda x: F.max_pool2d(x, 2), (x4,)),
        "interpolate": (lambda x: F.interpolate(x, scale_factor=2), (x4,)),
        "unfold": (lambda x: F.unfold(x, 2), (x4,)),
        "layer_norm": (lambda x: F.layer_norm(x, (6,)), (x2,)),
        "softmax": (lambda x: x.softmax(0) + x.log_softmax(-1), (x2,)),
        "embedding": (lambda t: F.embedding(t, emb), (tok,)),
        "attention": (lambda x: F.scaled_dot_product_attention(x, x, x, is_causal=True), (x2,)),
        "solve": (lambda m, y: fg.linalg.solve(m, y) + fg.linalg.det(m), (a, v)),
        "sort_topk_cumsum": (lambda x: x.sort(-1).values[:, :2] + x.topk(2).values
                             + x.cumsum(1)[:, :2], (x2,)),
        "index": (lambda x, i: x[i] + x.index_select(1, idx)[:2, :2].sum(), (x2, fg.randint(0, 4, (b, 2)))),
        "gather_scatter": (lambda x, i: x.gather(1, i) + fg.zeros(4, 6).scatter_add(1, i, x[:, :2])
                           .sum(), (x2, fg.randint(0, 6, (b, 4, 2)))),
        "where_masked": (lambda x: fg.where(x > 0, x, -x).masked_fill(x > 1, 0.0), (x2,)),
        "einsum_outer": (lambda x: fg.einsum("ij,kj->ik", x, x) + fg.outer(x[0], x[1])[:4, :4], (x2,)),
        "movement": (lambda x: F.pad(x.flip(0).roll(1, 1), (1, 2)).T.reshape(-1).view(3, 12), (x2,)),
        "reductions": (lambda x: x.max(1).values + x.argmax(0).float().sum() + x.var(1), (x2,)),
        "cross_entropy": (lambda x, t: F.cross_entropy(x, t), (x2, fg.randint(0, 6, (b, 4)))),
        "fft": (lambda x: fg.fft.rfft(x).abs(), (x2,)),
    }


PUBLIC_OPS = _public_op_cases()


@pytest.mark.parametrize("name", sorted(PUBLIC_OPS))
def test_public_ops_and_their_gradients_equal_the_loop(name):
    f, args = PUBLIC_OPS[name]
    n = args[0].shape[0]
    close(vmap(f)(*args), fg.stack([f(*[a[i] for a in args]) for i in range(n)]), atol=1e-5)
    if args[0].is_floating_point():
        g = grad(lambda *a: f(*a).float().sum())
        close(vmap(g)(*args), fg.stack([g(*[a[i] for a in args]) for i in range(n)]), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["conv2d", "attention", "gather_scatter", "movement"])
def test_compiled_public_ops_equal_eager(name):
    f, args = PUBLIC_OPS[name]
    g = grad(lambda *a: f(*a).float().sum())
    close(fg.compile(vmap(f), fullgraph=True)(*args), vmap(f)(*args), atol=1e-5)
    close(fg.compile(vmap(g), fullgraph=True)(*args), vmap(g)(*args), atol=1e-5)


# --------------------------------------------------------------------------- against torch


def test_per_example_gradients_match_torch_func():
    torch = pytest.importorskip("torch")
    model = mlp()
    fg.manual_seed(3)
    x, t = fg.randn(8, 8), fg.randint(0, 4, (8,))
    tm = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                             torch.nn.ReLU(), torch.nn.Linear(16, 4))
    tm.load_state_dict({k: torch.tensor(v.numpy()) for k, v in model.state_dict().items()})
    tp = {k: v.detach() for k, v in tm.named_parameters()}

    def tloss(p, xi, ti):
        out = torch.func.functional_call(tm, p, (xi.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, ti.unsqueeze(0))
    want = torch.func.vmap(torch.func.grad(tloss), in_dims=(None, 0, 0))(
        tp, torch.tensor(x.numpy()), torch.tensor(t.numpy()))
    params = {k: v.detach() for k, v in model.named_parameters()}
    for got in (per_example(model)(params, x, t),
                fg.compile(per_example(model))(params, x, t)):
        for k in want:
            close(got[k], want[k].numpy(), rtol=1e-5, atol=1e-6)


def test_nested_vmap_and_dims_match_torch():
    torch = pytest.importorskip("torch")
    fg.manual_seed(0)
    a, b = fg.randn(3, 4, 5), fg.randn(5, 3)
    ta, tb = torch.tensor(a.numpy()), torch.tensor(b.numpy())
    cases = [
        (lambda lib: lib.func.vmap(lib.func.vmap(lambda x, y: x @ y, in_dims=(0, None)),
                                   in_dims=(1, None), out_dims=2), ),
        (lambda lib: lib.func.vmap(lambda x, y: (x * y[:1].sum()).softmax(-1),
                                   in_dims=(0, 1), out_dims=-1), ),
        (lambda lib: lib.func.vmap(lib.func.grad(lambda x, y: (x @ y).tanh().sum()),
                                   in_dims=(0, None)), ),
        (lambda lib: lib.func.vmap(lib.func.vmap(lib.func.grad(lambda x: (x ** 3).sum()))), ),
    ]
    args = [((a, b), (ta, tb)), ((a, b.narrow(1, 0, 3)), (ta, tb[:, :3])), ((a, b), (ta, tb)),
            ((a,), (ta,))]
    for (make,), (fa, ta_) in zip(cases, args):
        got, want = make(fg)(*fa), make(torch)(*ta_)
        close(got, want.numpy(), rtol=1e-5, atol=1e-5)
