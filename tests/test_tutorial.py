"""A typical PyTorch "tensors and autograd" tutorial, run with ``import fusegrad as torch``.

Every expected string is what real PyTorch 2.13 prints for the same code, with ``torch.``
replaced by ``fusegrad.`` where torch names its Size and dtypes.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fusegrad as torch
from fusegrad import nn

NON_LEAF_GRAD_WARNING = (
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad "
    "attribute won't be populated during autograd.backward(). If you indeed want the .grad "
    "field to be populated for a non-leaf Tensor, use .retain_grad() on the non-leaf Tensor. "
    "If you access the non-leaf Tensor by mistake, make sure you access the leaf Tensor "
    "instead.")


def test_creation_and_attributes():
    x = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.float32)
    assert str(x) == "tensor([[1., 2., 3.],\n        [4., 5., 6.]])"
    assert str(x.shape) == "fusegrad.Size([2, 3])"
    assert str(x.dtype) == "fusegrad.float32"
    assert str(x.device) == "cpu"
    assert (x.size(1), x.ndim, x.numel(), x.requires_grad) == (3, 2, 6, False)
    assert str(torch.zeros(2, 3)) == "tensor([[0., 0., 0.],\n        [0., 0., 0.]])"
    assert str(torch.ones(2, 2, dtype=torch.int64)) == "tensor([[1, 1],\n        [1, 1]])"
    assert str(torch.arange(6).reshape(2, 3)) == "tensor([[0, 1, 2],\n        [3, 4, 5]])"
    assert str(torch.arange(6).dtype) == "fusegrad.int64"
    assert str(torch.full((2, 2), 7.0)) == "tensor([[7., 7.],\n        [7., 7.]])"
    assert str(torch.eye(3)) == ("tensor([[1., 0., 0.],\n        [0., 1., 0.],\n"
                                 "        [0., 0., 1.]])")
    assert str(torch.linspace(0, 1, 5)) == "tensor([0.0000, 0.2500, 0.5000, 0.7500, 1.0000])"
    assert str(torch.zeros_like(x)) == "tensor([[0., 0., 0.],\n        [0., 0., 0.]])"
    assert str(torch.tensor([1, 2, 3]).dtype) == "fusegrad.int64"
    assert str(torch.tensor([1.0, 2.0]).dtype) == "fusegrad.float32"


def test_operations_and_indexing():
    x = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.float32)
    assert str(x + 1) == "tensor([[2., 3., 4.],\n        [5., 6., 7.]])"
    assert str(x * x) == "tensor([[ 1.,  4.,  9.],\n        [16., 25., 36.]])"
    assert str(x @ x.T) == "tensor([[14., 32.],\n        [32., 77.]])"
    assert str(x.sum()) == "tensor(21.)"
    assert str(x.mean(dim=0)) == "tensor([2.5000, 3.5000, 4.5000])"
    assert str(x.max()) == "tensor(6.)"
    assert str(x.argmax(dim=1)) == "tensor([2, 2])"
    assert str(x[1, 2]) == "tensor(6.)"
    assert x[1, 2].item() == 6.0
    assert str(x[:, 1]) == "tensor([2., 5.])"
    assert str(x.view(3, 2)) == "tensor([[1., 2.],\n        [3., 4.],\n        [5., 6.]])"
    assert str(x.T) == "tensor([[1., 4.],\n        [2., 5.],\n        [3., 6.]])"
    assert str(x.unsqueeze(0).shape) == "fusegrad.Size([1, 2, 3])"
    assert str(x.double().dtype) == "fusegrad.float64"
    assert str(x.to(torch.int64)) == "tensor([[1, 2, 3],\n        [4, 5, 6]])"


def test_w_times_x_plus_b_gradient():
    x = torch.tensor(2.0)
    w = torch.tensor(3.0, requires_grad=True)
    b = torch.tensor(1.0, requires_grad=True)
    y = w * x + b
    assert str(y) == "tensor(7., grad_fn=<AddBackward0>)"
    assert y.grad_fn.name() == "AddBackward0"
    y.backward()
    assert str(w.grad) == "tensor(2.)"
    assert str(b.grad) == "tensor(1.)"
    assert x.grad is None

    a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    out = (a ** 2).sum()
    assert str(out) == "tensor(14., grad_fn=<SumBackward0>)"
    out.backward()
    assert str(a.grad) == "tensor([2., 4., 6.])"


def test_gradient_accumulation_trap_and_fix():
    w = torch.tensor(3.0, requires_grad=True)
    seen = []
    for _ in range(3):
        y = w * 2
        y.backward()
        seen.append(str(w.grad))
    # Gradients add up across backward calls...
    assert seen == ["tensor(2.)", "tensor(4.)", "tensor(6.)"]
    w.grad.zero_()
    assert str(w.grad) == "tensor(0.)"
    # ...so zero them after each step.
    seen = []
    for _ in range(3):
        y = w * 2
        y.backward()
        seen.append(str(w.grad))
        w.grad.zero_()
    assert seen == ["tensor(2.)"] * 3


def test_leaf_non_leaf_and_retain_grad():
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    b = a * 2
    c = b.sum()
    assert (a.is_leaf, b.is_leaf, c.is_leaf) == (True, False, False)
    assert str(b) == "tensor([2., 4.], grad_fn=<MulBackward0>)"
    assert str(c) == "tensor(6., grad_fn=<SumBackward0>)"
    b.retain_grad()
    c.backward()
    assert str(b.grad) == "tensor([1., 1.])"
    assert str(a.grad) == "tensor([2., 2.])"
    assert b.retains_grad

    d = a * 3
    e = d.sum()
    e.backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grad = d.grad
    assert grad is None
    # torch appends a link and its build path to the same message.
    assert str(caught[0].message).startswith(NON_LEAF_GRAD_WARNING)
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        e.backward()


def test_no_grad_detach_and_inplace_on_leaf():
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    with torch.no_grad():
        z = w * 2
    assert str(z) == "tensor([2., 4.])"
    assert z.requires_grad is False
    assert torch.is_grad_enabled()
    assert str(w.detach()) == "tensor([1., 2.])"
    assert w.detach().requires_grad is False

    @torch.no_grad()
    def infer(t):
        return t * 2
    assert infer(w).requires_grad is False

    with pytest.raises(RuntimeError) as err:
        w += 1
    assert str(err.value) == ("a leaf Variable that requires grad is being used in an in-place "
                              "operation.")
    with pytest.raises(RuntimeError) as err:
        w.numpy()
    assert str(err.value) == ("Can't call numpy() on Tensor that requires grad. Use "
                              "tensor.detach().numpy() instead.")
    assert str(w.detach().numpy()) == "[1. 2.]"


def test_manual_gradient_descent():
    x = torch.linspace(0, 1, 20).unsqueeze(1)
    y = 3 * x + 2
    w = torch.zeros(1, requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    lr = 0.5
    logged = []
    for epoch in range(300):
        loss = ((x * w + b - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= lr * w.grad
            b -= lr * b.grad
            w.grad.zero_()
            b.grad.zero_()
        if epoch % 100 == 0:
            logged.append(f"{loss.item():.4f}")
    assert logged == ["13.0789", "0.0000", "0.0000"]
    assert str(w) == "tensor([3.0000], requires_grad=True)"
    assert str(b) == "tensor([2.0000], requires_grad=True)"
    assert w.is_leaf and w.grad_fn is None


def test_linear_mse_sgd_loop_and_inference():
    torch.manual_seed(0)
    x = torch.linspace(0, 1, 20).unsqueeze(1)
    y = 3 * x + 2
    model = nn.Linear(1, 1)
    assert str(model) == "Linear(in_features=1, out_features=1, bias=True)"
    assert sum(p.numel() for p in model.parameters()) == 2
    assert [n for n, _ in model.named_parameters()] == ["weight", "bias"]
    assert str(model.weight.shape) == "fusegrad.Size([1, 1])"
    loss_fn = nn.MSELoss()
    assert str(loss_fn) == "MSELoss()"
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(200):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert loss.grad_fn.name() == "MseLossBackward0"
    assert model(x).grad_fn.name() == "AddmmBackward0"
    assert all(b <= a for a, b in zip(losses[:50], losses[1:50], strict=False))
    assert losses[-1] < 1e-3 * losses[0]
    np.testing.assert_allclose(model.weight.item(), 3.0, atol=0.05)
    np.testing.assert_allclose(model.bias.item(), 2.0, atol=0.05)

    model.eval()
    with torch.no_grad():
        pred = model(torch.tensor([[0.5]]))
    assert pred.requires_grad is False
    assert model.training is False
    assert model.weight.grad is not None
    opt.zero_grad()
    assert model.weight.grad is None
