"""Gradients through compiled functions equal eager gradients.

A compiled call attaches a backward node per differentiable output that runs the compiled
VJP program (the autodiff pass on the traced graph); ``create_graph=True`` replays the VJP
graph eagerly so that higher orders work. Gradients are compared in float64, where the
compiled and eager VJPs agree to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as NF
from tests.compiler.compare import values


def leaves(*arrays) -> list[fg.Tensor]:
    return [fg.from_numpy(np.array(a, dtype=np.float64)).requires_grad_() for a in arrays]


def grads(fn, arrays, compiled: bool) -> list:
    """Gradients of a weighted sum of ``fn``'s outputs (each output gets its own weight, so
    a mixed-up output would show)."""
    xs = leaves(*arrays)
    out = (fg.compile(fn) if compiled else fn)(*xs)
    outs = out if isinstance(out, tuple) else (out,)
    total = sum((o * (i + 1.5)).sum() for i, o in enumerate(outs))
    total.backward()
    return [x.grad.numpy() if x.grad is not None else None for x in xs]


def f64(*shape, seed=0, low=-2.0):
    return values(shape, fg.float64, seed, special=False, low=low)


# Several functions per case (outputs weighted differently): one compiled forward and one
# backward program per case keep the file fast.
CASES = {
    "elementwise_and_reductions": (
        lambda a, v: ((a * v).exp().sin() + a / (v + 3), a.sum(1).tanh() + a.sum(),
                      ((a - a.mean(0)) ** 2 * v).var(1), a.round().amax(1) * 2 + a.amin(),
                      a.max(1).values.sum() + a.min(0)[0].sum()),
        [f64(4, 5) * 1.7, f64(4, 1, seed=1)]),
    "matmul": (lambda a, b, c, d: ((a @ b + c).relu(), (d @ b).tanh(), a.t() @ a),
               [f64(4, 5), f64(5, 3, seed=1), f64(3, seed=2), f64(2, 4, 5, seed=3)]),
    "normalizations": (lambda a, w, b: (NF.softmax(a, -1) * fg.arange(5.0, dtype=fg.float64),
                                        NF.log_softmax(a, 0)[1], NF.layer_norm(a, (5,), w, b),
                                        NF.cross_entropy(a, fg.tensor([0, 1, 4, 2]))),
                       [f64(4, 5), f64(5, seed=1), f64(5, seed=2)]),
    "movement": (lambda a, b: (a[1:, :4:2] * a[:-1, 1::2] + a.t()[0, :2],
                               fg.cat([a, b], 0).sum(0) + NF.pad(a, (1, 1)).mean(1).sum(),
                               a.gather(1, fg.tensor([[0], [4], [2], [2]])), a.reshape(2, 10)),
                 [f64(4, 5), f64(2, 5, seed=1)]),
    "activations": (lambda a: (fg.where(a > 1, a.abs().sqrt(), a * a), NF.gelu(a),
                               NF.silu(a) * NF.gelu(a, approximate="tanh"), NF.softplus(a)),
                    [f64(4, 5)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_gradients_equal_eager(name):
    fn, arrays = CASES[name]
    eager = grads(fn, arrays, compiled=False)
    compiled = grads(fn, arrays, compiled=True)
    for e, c in zip(eager, compiled, strict=True):
        np.testing.assert_allclose(c, e, rtol=1e-10, atol=1e-12)


def test_gradient_only_for_inputs_that_require_it():
    x, w = leaves(f64(4, 5), f64(4, 5, seed=1))
    w.requires_grad_(False)
    f = fg.compile(lambda x, w, i: (x * w)[i].sum())
    f(x, w, fg.tensor([0, 2])).backward()
    assert w.grad is None
    want = np.zeros((4, 5))
    want[[0, 2]] = w.numpy()[[0, 2]]
    np.testing.assert_allclose(x.grad.numpy(), want)


def test_float32_gradients_match_eager():
    x = fg.from_numpy(values((4, 5), fg.float32, special=False)).requires_grad_()
    f = fg.compile(lambda x: NF.softmax(x * 3, -1).pow(2).sum())
    f(x).backward()
    compiled = x.grad.numpy().copy()
    x.grad = None
    NF.softmax(x * 3, -1).pow(2).sum().backward()
    np.testing.assert_allclose(compiled, x.grad.numpy(), rtol=1e-4, atol=1e-5)
    assert compiled.dtype == np.float32


def test_second_order_gradients_with_create_graph():
    (x,) = leaves(f64(4, 5))
    f = fg.compile(lambda x: (x ** 3).sum() + (x.sin() * x).sum())
    (g,) = fg.autograd.grad(f(x), [x], create_graph=True)
    a = x.detach().numpy()
    np.testing.assert_allclose(g.detach().numpy(), 3 * a ** 2 + np.cos(a) * a + np.sin(a))
    (g2,) = fg.autograd.grad(g.sum(), [x])
    np.testing.assert_allclose(g2.numpy(), 6 * a - np.sin(a) * a + 2 * np.cos(a), rtol=1e-10)


def test_gradients_accumulate_over_calls():
    (x,) = leaves(f64(4, 5))
    f = fg.compile(lambda x: (x * x).sum())
    f(x).backward()
    f(x).backward()
    np.testing.assert_allclose(x.grad.numpy(), 4 * x.detach().numpy())


def test_backward_twice_needs_retain_graph():
    (x,) = leaves(f64(4, 5))
    f = fg.compile(lambda x: (x * x).sum())
    y = f(x)
    y.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()
    x.grad = None
    y = f(x)
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 4 * x.detach().numpy())


def test_outputs_of_one_call_backward_together():
    # Each output has its own node; a backward through several of them must not free the
    # inputs the others still need.
    (x,) = leaves(f64(4, 5))
    f = fg.compile(lambda x: (x.exp(), (x * x).sum(1)))
    a, b = f(x)
    (a.sum() + b.sum()).backward()
    v = x.detach().numpy()
    np.testing.assert_allclose(x.grad.numpy(), np.exp(v) + 2 * v)


def test_modifying_an_input_after_the_call_is_detected():
    x, w = leaves(f64(4, 5), f64(4, 5, seed=1))
    w.requires_grad_(False)
    y = fg.compile(lambda x, w: (x * w).sum())(x, w)
    w.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_modifying_an_output_the_backward_reads_is_detected():
    # softmax's backward reads its output, which the call returns in the saved buffer: a
    # write into it changed the gradient silently (torch refuses it)
    x, = leaves(f64(4, 5))
    y = fg.compile(lambda x: NF.softmax(x, 1))(x)
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (y * y).sum().backward()


def test_compiled_module_parameter_gradients():
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    x = fg.from_numpy(f64(4, 5))
    fg.compile(model)(x).pow(2).sum().backward()
    compiled = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    model(x).pow(2).sum().backward()
    for c, p in zip(compiled, model.parameters(), strict=True):
        np.testing.assert_allclose(c, p.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_outputs_that_do_not_depend_on_grad_inputs_do_not_require_grad():
    (x,) = leaves(f64(3))
    y = fg.from_numpy(f64(3, seed=1))
    out = fg.compile(lambda x, y: (x * 2, y * 3, x.detach() + 1, x > 0, x.argmax()))(x, y)
    assert [t.requires_grad for t in out] == [True, False, False, False, False]
    out[1].numpy()          # no "Can't call numpy() on Tensor that requires grad"


def test_input_written_in_place_keeps_forward_values_for_backward():
    def f(b):
        b.mul_(2)
        return (b * b).sum()

    def run(fn):
        (a,) = leaves([1.0, 2.0, 3.0])
        b = a * 1
        b.add_(0)                       # b's version is not 0 when the call saves it
        out = fn(b)
        (out + b.sum()).backward()      # b's history is now the in-place write's
        return a.grad.numpy(), b.detach().numpy()

    eager, compiled = run(f), run(fg.compile(f))
    np.testing.assert_allclose(compiled[0], eager[0])
    np.testing.assert_allclose(compiled[1], eager[1])


def test_write_through_a_view_input_rebases_its_base():
    def f(v):
        v.add_(1)
        return v.sum() * 0

    def run(fn):
        (a,) = leaves([[1.0, 2.0], [3.0, 4.0]])
        base = a * 2
        fn(base[0])
        (base * base).sum().backward()
        return a.grad.numpy()

    np.testing.assert_allclose(run(fg.compile(f)), run(f))


def test_outputs_stay_differentiable_after_autograd_grad_inside():
    # autograd.grad inside returns gradients without touching .grad: unlike a backward()
    # step, the call's outputs keep their history (a dropped one lost its gradient silently)
    def fn(x, w):
        y = (x @ w).tanh().sum()
        g, = fg.autograd.grad(y, w, create_graph=True)
        return y, (g * g).sum()

    x = fg.from_numpy(f64(3, 4, seed=1))
    got, want = leaves(f64(4, 5, seed=2)), leaves(f64(4, 5, seed=2))
    for w, f in ((got[0], fg.compile(fn)), (want[0], fn)):
        y, pen = f(x, w)
        assert y.requires_grad and pen.requires_grad
        (y + 2 * pen).backward()
    np.testing.assert_allclose(got[0].grad.numpy(), want[0].grad.numpy(), rtol=1e-10)


def test_an_input_only_unused_outputs_depend_on_gets_no_gradient():
    # backward through one output of a call: an input only the other output depends on
    # keeps .grad None as in eager (it got zeros, which an optimizer steps with)
    x, w = leaves(f64(3, 4), f64(3, 4, seed=1))
    a, _ = fg.compile(lambda x, w: ((x * 2).sum(), (w * w).sum()))(x, w)
    a.backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((3, 4), 2.0))
    assert w.grad is None
