"""Gradients at the edges where torch defines a value: ties, the origin, kinks, hooks and
repeated inputs of ``autograd.grad``. Each expected value is torch 2.x's, checked by hand."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg

F = fg.nn.functional


def test_autograd_grad_runs_a_leafs_hooks():
    x = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x.register_hook(lambda g: g * 10)
    (g,) = fg.autograd.grad((x * x).sum(), x)
    np.testing.assert_array_equal(g.numpy(), [20.0, 40.0, 60.0])    # was [2, 4, 6]


def test_autograd_grad_of_an_input_given_twice():
    x = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    a, b = fg.autograd.grad((x * x).sum(), [x, x])
    np.testing.assert_array_equal(a.numpy(), [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(b.numpy(), [2.0, 4.0, 6.0])


def test_atan2_gradient_at_the_origin_is_zero():
    y = fg.tensor([0.0, 1.0], requires_grad=True)
    x = fg.tensor([0.0, 1.0], requires_grad=True)
    fg.atan2(y, x).sum().backward()
    np.testing.assert_array_equal(y.grad.numpy(), [0.0, 0.5])
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, -0.5])


@pytest.mark.parametrize("op", ["fmax", "fmin"])
def test_fmax_fmin_give_a_tie_to_the_first_operand(op):
    a = fg.tensor([1.0, 2.0, float("nan")], requires_grad=True)
    b = fg.tensor([1.0, float("nan"), 3.0], requires_grad=True)
    getattr(fg, op)(a, b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [1.0, 1.0, 0.0])
    np.testing.assert_array_equal(b.grad.numpy(), [0.0, 0.0, 1.0])


def test_bce_with_logits_second_derivative_at_zero():
    x = fg.tensor([0.0, 0.5, -1.0], dtype=fg.float64, requires_grad=True)
    t = fg.tensor([0.3, 0.3, 0.3], dtype=fg.float64)
    loss = F.binary_cross_entropy_with_logits(x, t, reduction="sum")
    (g,) = fg.autograd.grad(loss, x, create_graph=True)
    (h,) = fg.autograd.grad(g.sum(), x)
    s = 1 / (1 + np.exp(-x.detach().numpy()))
    np.testing.assert_allclose(g.detach().numpy(), s - 0.3, rtol=1e-12)
    np.testing.assert_allclose(h.numpy(), s * (1 - s), rtol=1e-12)    # 0.25 at 0 (was 0)


@pytest.mark.parametrize("op", ["median", "nanmedian"])
def test_median_of_all_elements_shares_its_gradient_among_ties(op):
    x = fg.tensor([[1.0, 3.0, 2.0], [2.0, 2.0, 5.0]], requires_grad=True)
    m = getattr(x, op)()
    assert m.item() == 2.0
    m.backward()
    third = np.float32(1.0) / np.float32(3.0)
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 0, third], [third, third, 0]])
    v = fg.tensor([0.1, 0.1, 0.1, 0.7], requires_grad=True)
    assert v.median().item() == np.float32(0.1)          # the value itself is exact


def test_median_along_a_dim_keeps_one_index():
    x = fg.tensor([[2.0, 2.0, 5.0]], requires_grad=True)
    values, indices = x.median(1)
    values.sum().backward()
    assert x.grad.numpy().sum() == 1.0 and x.grad.numpy()[0, indices.item()] == 1.0


@pytest.mark.parametrize("xs,want", [
    ([0.0, 0.0, 3.0], [30.0, 3.0, 0.0]),             # two zeros: d(prod of the others)/dx
    ([0.0, 2.0, 3.0], [230.0, 3.0, 2.0]),
    ([0.0, 0.0, 0.0], [0.0, 0.0, 0.0]),
    ([1.0, 2.0, 3.0], [230.0, 103.0, 12.0]),
])
def test_prod_second_derivative_with_zeros(xs, want):
    a = fg.tensor(xs, dtype=fg.float64, requires_grad=True)
    (g,) = fg.autograd.grad(a.prod(), a, create_graph=True)
    (h,) = fg.autograd.grad((g * fg.tensor([1.0, 10.0, 100.0], dtype=fg.float64)).sum(), a)
    np.testing.assert_allclose(h.numpy(), want, rtol=1e-12)


def test_cumprod_second_derivative_with_zeros():
    r = fg.tensor([1.5, -2.0, 0.7], dtype=fg.float64)
    a = fg.zeros(3, dtype=fg.float64, requires_grad=True)
    (g,) = fg.autograd.grad((a.cumprod(0) * r).sum(), a, create_graph=True)
    (h,) = fg.autograd.grad((g * g).sum(), a)
    np.testing.assert_array_equal(g.detach().numpy(), [1.5, 0.0, 0.0])
    np.testing.assert_array_equal(h.numpy(), [0.0, 2 * 1.5 * -2.0, 0.0])


def test_xlogy_gradient_at_x_zero_is_log_y():
    x = fg.tensor([0.0, 0.0, 1.0], requires_grad=True)
    out = fg.xlogy(x, fg.tensor([6.0, 0.5, 2.0]))
    np.testing.assert_array_equal(out.detach().numpy(), [0.0, 0.0, np.log(np.float32(2.0))])
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.log([6.0, 0.5, 2.0]), rtol=1e-6)


def test_max_and_amax_of_a_nan_give_its_gradient_to_the_nan():
    for reduce in (lambda t: t.max(), lambda t: t.amax(0)):
        x = fg.tensor([0.5, float("nan"), 2.0], requires_grad=True)
        reduce(x).backward()
        np.testing.assert_array_equal(x.grad.numpy(), [0.0, 1.0, 0.0])


def test_small_torch_parities_found_by_a_sweep():
    """all/any of uint8 keep uint8; diff and sign of bools; quantile of a 0-d tensor with
    keepdim keeps no dim (each raised, or differed from torch)."""
    u = fg.tensor([1, 2], dtype=fg.uint8)
    assert u.all().dtype is fg.uint8 and u.all().item() == 1
    assert fg.tensor([[1, 0]], dtype=fg.uint8).any(1).tolist() == [1]
    assert fg.tensor([True, False]).all().dtype is fg.bool
    assert fg.diff(fg.tensor([True, False, False, True])).tolist() == [True, False, True]
    assert fg.sign(fg.tensor([True, False])).tolist() == [True, False]
    assert fg.quantile(fg.tensor(2.5), 0.5, dim=-1, keepdim=True).shape == ()
    empty = fg.cummax(fg.zeros(2, 0), 1)
    assert empty.values.shape == (2, 0) and empty.indices.dtype is fg.int64


def test_unique_consecutive_of_a_tensor_requiring_grad_and_of_a_0d_tensor():
    x = fg.tensor([1.0, 1.0, 2.0], requires_grad=True)
    assert x.unique_consecutive().tolist() == [1.0, 2.0]        # raised (numpy() of x)
    values, inverse, counts = fg.tensor(True).unique_consecutive(return_inverse=True,
                                                                 return_counts=True)
    assert values.tolist() == [True] and inverse.shape == () and counts.tolist() == [1]


def test_autograd_grad_batched_grad_outputs_and_only_inputs():
    # is_grads_batched: each row of grad_outputs is a separate vector-Jacobian product (the
    # Jacobian from the identity); only_inputs, deprecated in torch, is accepted and ignored
    a = np.array([0.5, -1.0, 2.0], dtype=np.float32)
    x = fg.tensor(a, requires_grad=True)
    y = x.tanh() * x.sum()
    jac, = fg.autograd.grad(y, x, fg.eye(3), is_grads_batched=True)
    t = np.tanh(a)
    want = np.diag((1 - t * t) * a.sum()) + t[:, None]
    np.testing.assert_allclose(jac.numpy(), want, rtol=1e-6)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        fg.autograd.grad(y, x, fg.ones(3))
    z = (x * x).sum()
    g, = fg.autograd.grad(z, x, only_inputs=True)
    np.testing.assert_allclose(g.numpy(), 2 * a)
