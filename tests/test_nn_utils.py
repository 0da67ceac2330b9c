"""nn.utils: gradient clipping and parameter vectors, against numpy."""

import math

import numpy as np
import pytest

import fusegrad as fg


def params_with_grads(seed=0):
    rng = np.random.default_rng(seed)
    ps = [fg.nn.Parameter(fg.tensor(rng.standard_normal(s), dtype=fg.float32))
          for s in [(3, 4), (4,), (2, 2)]]
    for p in ps:
        p.grad = fg.tensor(rng.standard_normal(p.shape) * 3, dtype=fg.float32)
    return ps


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm_matches_numpy(norm_type, max_norm):
    ps = params_with_grads()
    flat = np.concatenate([p.grad.numpy().ravel() for p in ps]).astype(np.float64)
    want = np.max(np.abs(flat)) if norm_type == math.inf else \
        np.sum(np.abs(flat) ** norm_type) ** (1 / norm_type)
    before = [p.grad.numpy().copy() for p in ps]
    total = fg.nn.utils.clip_grad_norm_(ps, max_norm, norm_type=norm_type, foreach=True)
    assert total.ndim == 0
    np.testing.assert_allclose(total.item(), want, rtol=1e-5)
    coef = min(max_norm / (want + 1e-6), 1.0)
    for p, b in zip(ps, before):
        np.testing.assert_allclose(p.grad.numpy(), b * coef, rtol=1e-5)


def test_clip_grad_norm_edge_cases():
    p = fg.nn.Parameter(fg.ones(2))
    assert fg.nn.utils.clip_grad_norm_([p], 1.0).item() == 0.0   # no grads
    p.grad = fg.tensor([3.0, 4.0])
    assert fg.nn.utils.clip_grad_norm_(p, 1.0).item() == pytest.approx(5.0)   # one tensor
    np.testing.assert_allclose(p.grad.numpy(), [0.6, 0.8], rtol=1e-5)
    p.grad = fg.tensor([math.inf, 1.0])
    with pytest.raises(RuntimeError, match="The total norm of order 2.0 for gradients from "
                       "`parameters` is non-finite"):
        fg.nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    with pytest.warns(FutureWarning):
        fg.nn.utils.clip_grad_norm([p], 1.0)


def test_clip_grad_value():
    ps = params_with_grads(1)
    before = [p.grad.numpy().copy() for p in ps]
    fg.nn.utils.clip_grad_value_(ps, 0.7)
    for p, b in zip(ps, before):
        np.testing.assert_array_equal(p.grad.numpy(), np.clip(b, -0.7, 0.7))


def test_parameters_vector_round_trip():
    model = fg.nn.Sequential(fg.nn.Linear(3, 4), fg.nn.Linear(4, 2))
    vec = fg.nn.utils.parameters_to_vector(model.parameters())
    want = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    np.testing.assert_array_equal(vec.detach().numpy(), want)
    vec.sum().backward()   # differentiable with respect to the parameters
    assert all(np.all(p.grad.numpy() == 1) for p in model.parameters())
    new = fg.arange(float(vec.numel()))
    fg.nn.utils.vector_to_parameters(new, model.parameters())
    np.testing.assert_array_equal(fg.nn.utils.parameters_to_vector(model.parameters())
                                  .detach().numpy(), new.numpy())
    assert all(p.is_leaf and p.requires_grad for p in model.parameters())
    with pytest.raises(RuntimeError, match="vector has 3 elements"):
        fg.nn.utils.vector_to_parameters(fg.zeros(3), model.parameters())
    with pytest.raises(TypeError, match="expected torch.Tensor"):
        fg.nn.utils.vector_to_parameters([1.0], model.parameters())
