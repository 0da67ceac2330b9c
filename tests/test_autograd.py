"""Autograd semantics: accumulation, retain_grad, freed graphs, grad modes, autograd.grad,
higher-order gradients, hooks, detach, custom Functions.

Expected messages are torch 2.13's for the same mistakes.
"""

from __future__ import annotations

import math
import threading
import warnings

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd.gradcheck import GradcheckError, gradcheck, gradgradcheck
from tests.conftest import arr, assert_close, positive

FREED = "Trying to backward through the graph a second time"


def test_gradients_accumulate_over_backward_calls():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0]
    (x * x).sum().backward()
    assert x.grad.tolist() == [4.0, 8.0]
    g = x.grad
    (x * 3).sum().backward()
    assert x.grad is g and g.tolist() == [7.0, 11.0]     # accumulated in place
    x.grad.zero_()
    (x * 3).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]
    x.grad = None
    x.sum().backward()
    assert x.grad.tolist() == [1.0, 1.0]


def test_grad_of_a_leaf_starts_as_none_and_is_not_tracked():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    assert x.grad is None
    (x * 2).sum().backward()
    assert not x.grad.requires_grad and x.grad.is_leaf


def test_shared_subexpressions_sum_their_gradients():
    x = fg.tensor(3.0, requires_grad=True)
    (x + x + x).backward()
    assert x.grad.item() == 3.0
    y = fg.tensor(3.0, requires_grad=True)
    a, b = y * 2, y * y
    (a * b).backward()                                   # d(2y^3)/dy = 6y^2
    assert y.grad.item() == 54.0


def test_leaf_grad_is_laid_out_like_the_leaf():
    # torch's layout contract: p.grad.view(-1) (flattening gradients) works; a linear
    # layer's weight got the transposed product as its .grad and view raised
    lin = fg.nn.Linear(3, 2)
    lin(fg.ones(4, 3)).sum().backward()
    assert lin.weight.grad.is_contiguous()
    np.testing.assert_array_equal(lin.weight.grad.view(-1).numpy(), np.full(6, 4.0))
    x = fg.tensor(arr(2, 3), requires_grad=True)
    x.t().backward(fg.arange(6.0).view(3, 2))
    assert x.grad.is_contiguous()
    np.testing.assert_array_equal(x.grad.numpy(), np.arange(6.0).reshape(3, 2).T)


def test_create_graph_grads_are_copies():
    # with create_graph, .grad was the gradient itself: the caller's `gradient`, or the one
    # tensor two leaves (or a retained non-leaf) both got, so a write into one .grad changed
    # the other tensors
    x = fg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    go = fg.ones(2, 2)
    x.t().backward(go, create_graph=True)
    assert x.grad.is_contiguous()
    x.grad.detach().zero_()
    assert go.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    a = fg.tensor([1.0, 2.0], requires_grad=True)
    b = fg.tensor([3.0, 4.0], requires_grad=True)
    y = a + b
    y.retain_grad()
    y.backward(fg.ones(2), create_graph=True)
    a.grad.detach().add_(1)
    assert b.grad.tolist() == [1.0, 1.0] and y.grad.tolist() == [1.0, 1.0]


def test_detach_in_place_refuses_views():
    # a view detached in place got its base's history back once the base was written in
    # place, and sent a gradient to it; torch refuses the detach_
    x = fg.ones(3, 4, requires_grad=True)
    v = (x * 1)[0]
    with pytest.raises(RuntimeError, match="Can't detach views in-place. Use detach"):
        v.detach_()
    y = x * 1
    y.detach_()
    assert not y.requires_grad and y.is_leaf


def test_leaf_frozen_after_the_forward_gets_no_grad():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = (x * 2).sum()
    x.requires_grad_(False)
    y.backward()
    assert x.grad is None
    with pytest.raises(RuntimeError, match=r"`inputs` argument to `grad\(\)` cannot be empty"):
        fg.autograd.grad((fg.ones(2, requires_grad=True) * 2).sum(), [])


def test_retain_grad():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.retain_grad()
    assert y.retains_grad and not x.retains_grad
    (y * y).sum().backward(retain_graph=True)
    assert y.grad.tolist() == [4.0, 8.0]
    (y * y).sum().backward()
    assert y.grad.tolist() == [8.0, 16.0]               # accumulates like a leaf's
    x.retain_grad()                                       # a no-op on leaves
    with pytest.raises(RuntimeError, match="can't retain_grad on Tensor that has "
                                           "requires_grad=False"):
        fg.ones(2).retain_grad()


def test_retain_grad_follows_in_place_writes():
    # torch moves the retains_grad hook to the grad_fn an in-place op gives: .grad is the
    # gradient of the value written (it stayed None)
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.retain_grad()
    y.mul_(3)
    y.add_(1)
    (y * y).sum().backward()
    assert y.grad.tolist() == [14.0, 26.0]             # 2 * (6x + 1)
    assert x.grad.tolist() == [84.0, 156.0]
    # written through a view of it (the base gets CopySlices)
    x = fg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = x * 1
    y.retain_grad()
    y[0].mul_(3)
    (y * y).sum().backward()
    assert y.grad.tolist() == [[6.0, 12.0], [6.0, 8.0]]
    # a view that retains its gradient, written through its base
    x = fg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = x * 1
    v = y[0]
    v.retain_grad()
    y.mul_(3)
    (v * v).sum().backward()
    assert v.grad.tolist() == [6.0, 12.0]
    assert x.grad.tolist() == [[18.0, 36.0], [0.0, 0.0]]


def test_non_leaf_grad_access_warns():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.sum().backward()
    with pytest.warns(UserWarning, match="The .grad attribute of a Tensor that is not a leaf "
                                         "Tensor is being accessed"):
        assert y.grad is None
    y.retain_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert y.grad is None                            # retained: no warning
        assert x.grad is not None


@pytest.mark.parametrize("make", [
    lambda x: x.exp().sum(),                  # a primitive that saves its output
    lambda x: (x * x).sum(),                  # ... its inputs
    lambda x: x.var(),                        # a composite
    lambda x: x.norm(),
    lambda x: (x @ x.reshape(2, 1)).sum(),
], ids=["exp", "mul", "var", "norm", "matmul"])
def test_second_backward_through_freed_graph_raises(make):
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = make(x)
    y.backward()
    with pytest.raises(RuntimeError, match=FREED):
        y.backward()
    x.grad = None
    z = make(x)
    z.backward(retain_graph=True)
    first = x.grad.clone()
    z.backward()
    assert_close(x.grad, 2 * first.numpy(), rtol=1e-6)


def test_graph_that_saves_nothing_can_run_twice():
    # add, neg, reshape and sum save no tensors, so nothing is freed (as in torch; x * 2
    # saves the constant 2 and cannot run twice, also as in torch)
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = (-(x + 1)).reshape(2, 1).sum()
    y.backward()
    y.backward()
    assert x.grad.tolist() == [-2.0, -2.0]


def test_autograd_grad_frees_the_graph_too():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x.exp().sum()
    fg.autograd.grad(y, x)
    with pytest.raises(RuntimeError, match=FREED):
        fg.autograd.grad(y, x)


def test_backward_on_non_scalar_needs_a_gradient():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar "
                                           "outputs"):
        (x * 2).backward()
    (x * 2).backward(fg.tensor([1.0, 10.0]))
    assert x.grad.tolist() == [2.0, 20.0]
    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[0\] has a shape of "
                                           r"fusegrad.Size\(\[3\]\) and output\[0\] has a shape of "
                                           r"fusegrad.Size\(\[2\]\)"):
        (x * 2).backward(fg.tensor([1.0, 2.0, 3.0]))
    (x * 2)[0].backward()                                # a 1-element result is fine
    (x * 2).sum(0, keepdim=True).backward()


def test_backward_of_something_without_grad():
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad and does "
                                           "not have a grad_fn"):
        (fg.ones(2) * 2).sum().backward()
    x = fg.tensor([1.0, 3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad"):
        x.argmax().backward()


def test_integer_tensors_cannot_require_grad():
    msg = "only Tensors of floating point dtype can require gradients"
    for make in (lambda: fg.tensor([1, 2], requires_grad=True),
                 lambda: fg.tensor([1, 2]).requires_grad_(),
                 lambda: setattr(fg.tensor([True]), "requires_grad", True),
                 lambda: fg.zeros(2, dtype=fg.int64, requires_grad=True)):
        with pytest.raises(RuntimeError, match=msg):
            make()


def test_integer_results_do_not_require_grad():
    x = fg.tensor([1.5, -2.5], requires_grad=True)
    for out in (x.long(), x.argmax(), x > 0, x.max(0).indices, x.to(fg.int32), x.bool()):
        assert not out.requires_grad and out.grad_fn is None


def test_requires_grad_propagation_and_requires_grad_():
    a = fg.ones(2)
    b = a * 2
    assert not b.requires_grad
    assert a.requires_grad_() is a and a.requires_grad
    c = a * 2
    assert c.requires_grad and c.grad_fn is not None
    assert (c + fg.ones(2)).requires_grad
    a.requires_grad = False
    assert not (a * 2).requires_grad
    c.requires_grad_(True)                               # already true: allowed
    with pytest.raises(RuntimeError, match="you can only change requires_grad flags of leaf "
                                           "variables"):
        c.requires_grad_(False)


def test_detach():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    d = y.detach()
    assert not d.requires_grad and d.grad_fn is None and d.is_leaf
    assert np.shares_memory(d.numpy(), y.detach().numpy())
    z = d * x
    z.sum().backward()
    assert x.grad.tolist() == [2.0, 4.0]                 # d is a constant
    y.detach_()
    assert not y.requires_grad and y.is_leaf and y.grad_fn is None


# --------------------------------------------------------------------------- grad modes


def _records(x):
    return (x * 2).requires_grad


def test_no_grad_context_and_decorators():
    x = fg.tensor([1.0], requires_grad=True)
    with fg.no_grad():
        assert not fg.is_grad_enabled() and not _records(x)
    assert fg.is_grad_enabled() and _records(x)

    @fg.no_grad()
    def called():
        return _records(x)

    @fg.no_grad
    def bare():
        """docstring kept"""
        return _records(x)

    assert called() is False and bare() is False
    assert bare.__name__ == "bare" and bare.__doc__ == "docstring kept"
    assert fg.is_grad_enabled()


def test_enable_grad_inside_no_grad():
    x = fg.tensor([1.0], requires_grad=True)

    @fg.enable_grad
    def bare():
        return _records(x)

    @fg.enable_grad()
    def called():
        return _records(x)

    with fg.no_grad():
        with fg.enable_grad():
            assert _records(x)
        assert not _records(x)
        assert bare() and called()
        assert not fg.is_grad_enabled()


def test_set_grad_enabled_as_function_context_and_decorator():
    x = fg.tensor([1.0], requires_grad=True)
    fg.set_grad_enabled(False)
    assert not fg.is_grad_enabled() and not _records(x)
    fg.set_grad_enabled(True)
    assert fg.is_grad_enabled()
    with fg.set_grad_enabled(False):
        assert not _records(x)
    assert fg.is_grad_enabled()

    @fg.set_grad_enabled(False)
    def off():
        return _records(x)

    assert fg.is_grad_enabled()          # decorating must not change the mode around it
    assert off() is False
    assert fg.is_grad_enabled() and _records(x)
    with fg.no_grad():
        with fg.set_grad_enabled(True):
            assert _records(x)
        assert not fg.is_grad_enabled()


def test_inference_mode():
    x = fg.tensor([1.0], requires_grad=True)
    with fg.inference_mode():
        assert fg.is_inference_mode_enabled() and not fg.is_grad_enabled()
        y = x * 2
    assert not y.requires_grad and not fg.is_inference_mode_enabled()
    with fg.inference_mode(False):
        assert _records(x) and not fg.is_inference_mode_enabled()

    @fg.inference_mode()
    def infer():
        return _records(x), fg.is_inference_mode_enabled()

    assert infer() == (False, True) and fg.is_grad_enabled()


def test_grad_mode_is_restored_after_an_exception():
    with pytest.raises(ValueError):
        with fg.no_grad():
            raise ValueError
    assert fg.is_grad_enabled()

    @fg.no_grad
    def fails():
        raise KeyError

    with pytest.raises(KeyError):
        fails()
    assert fg.is_grad_enabled()


def test_grad_mode_decorators_hold_inside_generator_steps():
    # a decorated generator function's body runs at each next(), not at the call: the mode
    # must be set around each step and the caller's restored at each yield
    x = fg.ones(2, requires_grad=True)

    @fg.no_grad()
    def gen():
        got = yield (x * 2).requires_grad
        yield got, (x * 2).requires_grad
        return "done"

    g = gen()
    assert next(g) is False and fg.is_grad_enabled()
    assert g.send(5) == (5, False) and fg.is_grad_enabled()
    with pytest.raises(StopIteration, match="done"):
        next(g)

    with fg.no_grad():
        @fg.enable_grad()
        def gen2():
            yield fg.is_grad_enabled()
            yield (x * 2).requires_grad
        assert list(gen2()) == [True, True] and not fg.is_grad_enabled()


def test_grad_mode_is_thread_local():
    seen = []
    with fg.no_grad():
        t = threading.Thread(target=lambda: seen.append(fg.is_grad_enabled()))
        t.start()
        t.join()
    assert seen == [True]


def test_backward_runs_under_no_grad():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    with fg.no_grad():
        y.backward()
    assert x.grad.tolist() == [2.0, 4.0]


# --------------------------------------------------------------------------- autograd.grad


def test_autograd_grad_returns_without_accumulating():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = fg.tensor([3.0, 4.0], requires_grad=True)
    gx, gy = fg.autograd.grad((x * y).sum(), [x, y])
    assert gx.tolist() == [3.0, 4.0] and gy.tolist() == [1.0, 2.0]
    assert x.grad is None and y.grad is None
    g, = fg.autograd.grad(x * 3, x, grad_outputs=fg.tensor([1.0, 2.0]))
    assert g.tolist() == [3.0, 6.0]
    assert isinstance(fg.autograd.grad(x.sum(), x), tuple)


def test_autograd_grad_allow_unused():
    x = fg.tensor(1.0, requires_grad=True)
    y = fg.tensor(1.0, requires_grad=True)
    with pytest.raises(RuntimeError, match="The differentiated Tensor at index 1 appears to not "
                                           "have been used in the graph. Set allow_unused=True"):
        fg.autograd.grad(x * 2, [x, y])
    gx, gy = fg.autograd.grad(x * 2, [x, y], allow_unused=True)
    assert gx.item() == 2.0 and gy is None
    gx, gy = fg.autograd.grad(x * 2, [x, y], materialize_grads=True)
    assert gy.item() == 0.0
    with pytest.raises(RuntimeError, match="One of the differentiated Tensors does not require "
                                           "grad"):
        fg.autograd.grad(x * 2, [fg.tensor(1.0)])


def test_autograd_grad_of_intermediate():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    h = x * 3
    out = (h * h).sum()
    gh, = fg.autograd.grad(out, h)
    assert gh.tolist() == [6.0, 12.0]


def test_backward_inputs_restricts_accumulation():
    x = fg.tensor(1.0, requires_grad=True)
    y = fg.tensor(2.0, requires_grad=True)
    (x * y).backward(inputs=[x])
    assert x.grad.item() == 2.0 and y.grad is None
    with pytest.raises(RuntimeError, match="'inputs' argument to backward\\(\\) cannot be empty"):
        (x * y).backward(inputs=[])


# --------------------------------------------------------------------------- higher order


def _d(out, x, create_graph=True):
    g, = fg.autograd.grad(out, x, create_graph=create_graph)
    return g


def test_second_and_third_derivative_of_cube():
    x = fg.tensor(2.0, dtype=fg.float64, requires_grad=True)
    g1 = _d(x ** 3, x)
    assert g1.item() == 12.0 and g1.requires_grad
    g2 = _d(g1, x)
    assert g2.item() == 12.0
    g3 = _d(g2, x, create_graph=False)
    assert g3.item() == 6.0


def test_backward_with_create_graph_makes_grad_differentiable():
    x = fg.tensor(2.0, dtype=fg.float64, requires_grad=True)
    (x ** 3).backward(create_graph=True)
    assert x.grad.requires_grad and x.grad.item() == 12.0
    gg, = fg.autograd.grad(x.grad, x)
    assert gg.item() == 12.0


@pytest.mark.parametrize("fn,second", [
    (lambda x: x.tanh(), lambda a: -2 * np.tanh(a) * (1 - np.tanh(a) ** 2)),
    (lambda x: x.exp(), np.exp),
    (lambda x: x.sin(), lambda a: -np.sin(a)),
    (lambda x: x.sigmoid(), lambda a: (s := 1 / (1 + np.exp(-a))) * (1 - s) * (1 - 2 * s)),
    (lambda x: x.log(), lambda a: -1 / a ** 2),
    (lambda x: x.sqrt(), lambda a: -0.25 * a ** -1.5),
    (lambda x: x ** 4, lambda a: 12 * a ** 2),
    (lambda x: 1 / x, lambda a: 2 / a ** 3),
], ids=["tanh", "exp", "sin", "sigmoid", "log", "sqrt", "pow4", "reciprocal"])
def test_grad_of_grad_elementwise(fn, second):
    a = positive(4)
    x = fg.tensor(a, requires_grad=True)
    g = _d(fn(x).sum(), x)
    gg = _d(g.sum(), x, create_graph=False)
    assert_close(gg, second(a), rtol=1e-6)


SECOND_ORDER = [
    ("logsumexp", lambda x: x.logsumexp(1)),
    ("var", lambda x: x.var(0)),
    ("std", lambda x: x.std(1)),
    ("norm", lambda x: x.norm(dim=1)),
    ("norm_all", lambda x: x.norm()),
    ("mean", lambda x: x.mean(1) ** 2),
    ("softmax_like", lambda x: (x - x.logsumexp(1, keepdim=True)).exp()),
    ("prod", lambda x: x.prod(1)),
    ("max", lambda x: x.amax(1) * x.sum(1)),
    ("matmul_tanh", lambda x: (x @ x.t()).tanh()),
    ("cumsum", lambda x: x.cumsum(1) ** 2),
    ("index", lambda x: x[[0, 2]] ** 3),
    ("where", lambda x: fg.where(x > 0, x ** 2, x ** 3)),
    ("clamp", lambda x: x.clamp(-0.5, 0.5) * x),
]


@pytest.mark.parametrize("name,fn", SECOND_ORDER, ids=[s[0] for s in SECOND_ORDER])
def test_gradgradcheck(name, fn):
    x = fg.tensor(arr(3, 4), requires_grad=True)
    assert gradgradcheck(fn, [x])


def test_hessian_vector_product():
    a = arr(3)
    x = fg.tensor(a, requires_grad=True)
    g = _d((x ** 3).sum() + (x[0] * x[1]), x)
    v = fg.tensor([1.0, 0.0, 2.0], dtype=fg.float64)
    hv = _d((g * v).sum(), x, create_graph=False)
    hessian = np.diag(6 * a) + np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert_close(hv, hessian @ v.numpy())


# --------------------------------------------------------------------------- hooks


def test_hook_on_a_leaf_modifies_its_gradient():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    handle = x.register_hook(lambda g: g * 10)
    (x * x).sum().backward()
    assert x.grad.tolist() == [20.0, 40.0]
    handle.remove()
    x.grad = None
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0]


def test_hook_on_a_non_leaf_changes_what_flows_on():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    seen = []
    y.register_hook(lambda g: seen.append(g.tolist()))         # returning None keeps g
    y.register_hook(lambda g: g + 1)
    (y * 3).sum().backward()
    assert seen == [[3.0, 3.0]]
    assert x.grad.tolist() == [8.0, 8.0]                       # (3 + 1) * 2


def test_hook_that_changes_dtype_or_shape_is_refused():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    x.register_hook(lambda g: g.double())
    with pytest.raises(RuntimeError, match="hook '<lambda>' has changed the type of value"):
        (x * x).sum().backward()
    with pytest.raises(RuntimeError, match="has changed the type of value"):
        fg.autograd.grad((x * x).sum(), x)
    y = fg.tensor([1.0, 2.0], requires_grad=True) * 2
    y.register_hook(lambda g: g[:1])
    with pytest.raises(RuntimeError, match="hook '<lambda>' has changed the size of value"):
        y.sum().backward()


def test_hook_handle_is_a_context_manager():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    with x.register_hook(lambda g: g * 10):
        (x * 1).sum().backward()
    (x * 1).sum().backward()
    assert x.grad.tolist() == [11.0, 11.0]


def test_assigned_grad_must_have_the_tensors_dtype():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="assign a gradient with dtype fusegrad.float64 to a "
                                           "tensor with dtype fusegrad.float32"):
        x.grad = fg.zeros(2, dtype=fg.float64)
    assert x.grad is None


def test_hook_needs_requires_grad():
    with pytest.raises(RuntimeError, match="cannot register a hook on a tensor that doesn't "
                                           "require gradient"):
        fg.ones(2).register_hook(lambda g: g)


# --------------------------------------------------------------------------- Function


class Square(fg.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        return 2 * x * grad


class ScaleBy(fg.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.k, None


def test_custom_function():
    x = fg.tensor([1.0, 3.0], requires_grad=True)
    y = Square.apply(x)
    assert y.tolist() == [1.0, 9.0] and y.requires_grad
    assert y.grad_fn.name() == "SquareBackward"
    y.sum().backward()
    assert x.grad.tolist() == [2.0, 6.0]
    z = ScaleBy.apply(x, 3.0)
    assert_close(fg.autograd.grad(z.sum(), x)[0], [3.0, 3.0])
    assert not Square.apply(fg.ones(2)).requires_grad
    with fg.no_grad():
        assert not Square.apply(x).requires_grad


def test_custom_function_gradcheck_and_ctx():
    seen = {}

    class Cube(fg.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            seen["needs"] = ctx.needs_input_grad
            ctx.save_for_backward(x, y)
            return x * x * x + y

        @staticmethod
        def backward(ctx, grad):
            x, y = ctx.saved_tensors
            return 3 * x * x * grad, grad

    x = fg.tensor(arr(3), requires_grad=True)
    assert gradcheck(lambda a: Cube.apply(a, fg.ones(3, dtype=fg.float64)), [x])
    assert seen["needs"] == (True, False)


def test_custom_function_wrong_number_of_gradients():
    class Bad(fg.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, grad):
            return grad

    x = fg.tensor([1.0, 3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"function BadBackward returned an incorrect number "
                                           r"of gradients \(expected 2, got 1\)"):
        Bad.apply(x, x).sum().backward()


def test_custom_function_saved_tensors_are_freed_after_backward():
    # a second backward through the same graph read the saved tensors again and silently
    # doubled .grad; torch refuses it unless retain_graph=True
    x = fg.tensor([1.0, 3.0], requires_grad=True)
    y = Square.apply(x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert x.grad.tolist() == [4.0, 12.0]
    with pytest.raises(RuntimeError, match=FREED):
        y.backward()
    z = ScaleBy.apply(x, 2.0).sum()       # nothing saved: a second backward is fine
    z.backward()
    z.backward()


def test_custom_function_setup_context_keywords_and_extra_none_gradients():
    class Scale(fg.autograd.Function):
        @staticmethod
        def forward(x, k=2.0):                  # torch 2's style: ctx filled separately
            return x * k

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.k = inputs[1]

        @staticmethod
        def backward(ctx, grad):
            return grad * ctx.k, None

    class Shift(fg.autograd.Function):
        @staticmethod
        def forward(ctx, x, by=1.0):
            return x + by

        @staticmethod
        def backward(ctx, grad):
            return grad, None, None             # trailing Nones beyond the inputs: ignored

    x = fg.tensor([1.0, 3.0], requires_grad=True)
    assert Scale.apply(x).tolist() == [2.0, 6.0]
    Scale.apply(x, k=3.0).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]
    y = Shift.apply(x, by=2.0)
    assert y.tolist() == [3.0, 5.0]
    y.sum().backward()
    assert x.grad.tolist() == [4.0, 4.0]


class MatMul(fg.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w.t(), x.t() @ grad


def test_custom_function_inside_compile_keeps_its_gradient():
    """Traced, the user's backward is the compiled backward: a whole step with
    loss.backward() inside, a compiled forward with the backward outside, and
    autograd.grad inside (the gradient was lost: w.grad stayed None)."""
    xs = fg.tensor(arr(4, 3))
    w0 = arr(3, 2) + 1.0
    want_w = (xs.numpy().T @ np.ones((4, 2)))            # d sum(x @ w) / dw

    w = fg.tensor(w0, requires_grad=True)

    @fg.compile
    def step(x):
        loss = (MatMul.apply(x, w) * 1).sum()
        loss.backward()
        return loss
    for calls in (1, 2, 3):
        step(xs)
        assert_close(w.grad, want_w * calls)

    w.grad = None
    out = fg.compile(lambda x: MatMul.apply(x, w).sin().sum())(xs)
    assert out.requires_grad
    out.backward()
    assert_close(w.grad, xs.numpy().T @ np.cos(xs.numpy() @ w0))

    g = fg.compile(lambda x: fg.autograd.grad(Square.apply(x * w[0, 0]).sum(), [x])[0])
    x = fg.tensor(arr(5), requires_grad=True)
    assert_close(g(x), 2 * x.detach().numpy() * w0[0, 0] ** 2)


def test_custom_function_saved_tensor_modified_in_place_is_refused():
    a = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    h = a * 1
    y = Square.apply(h)
    h.mul_(10)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def _doubling(name: str, backward):
    """An autograd.Function named ``name``: forward ``x * 2``, the given ``backward``."""
    return type(name, (fg.autograd.Function,), {
        "forward": staticmethod(lambda ctx, x: x * 2), "backward": staticmethod(backward)})


def test_custom_function_gradients_are_checked_as_torch_checks_them():
    # a gradient of a broadcast shape is summed; one no broadcast explains is refused
    Broadcast = _doubling("Broadcast", lambda ctx, grad: grad.expand(2, 3))
    Scalar = _doubling("Scalar", lambda ctx, grad: grad.sum())

    x = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    Broadcast.apply(x).sum().backward()
    assert_close(x.grad, [2.0, 2.0, 2.0])
    with pytest.raises(RuntimeError, match=r"ScalarBackward returned an invalid gradient at index "
                                           r"0 - got \[\] but expected shape compatible with \[3\]"):
        (Scalar.apply(x) * fg.tensor([1.0, 2.0, 3.0])).sum().backward()


def test_once_differentiable_and_unsupported_ctx_features():
    def backward(ctx, grad):
        assert not fg.is_grad_enabled()
        return grad * 2
    Twice = _doubling("Twice", fg.autograd.function.once_differentiable(backward))

    x = fg.tensor([1.0, 2.0], requires_grad=True)
    Twice.apply(x).sum().backward()
    assert_close(x.grad, [2.0, 2.0])

    class Dirty(fg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.mark_dirty(x)
            return x.add_(1)

    with pytest.raises(NotImplementedError, match="mark_dirty"):
        Dirty.apply(x * 1)


# --------------------------------------------------------------------------- gradcheck itself


def test_gradcheck_catches_a_wrong_gradient():
    WrongScale = _doubling("WrongScale", lambda ctx, grad: grad * 3)

    x = fg.tensor(arr(3), requires_grad=True)
    with pytest.raises(GradcheckError, match="Jacobian mismatch for output 0 with respect to "
                                             "input 0"):
        gradcheck(WrongScale.apply, [x])
    assert gradcheck(WrongScale.apply, [x], raise_exception=False) is False
    assert gradcheck(lambda a: ScaleBy.apply(a, 2.0) * a, [x])


def test_gradcheck_is_callable_from_the_autograd_namespace():
    # the submodule fusegrad.autograd.gradcheck (imported above) must not shadow the functions
    x = fg.tensor(arr(3), requires_grad=True)
    for _ in range(2):
        assert fg.autograd.gradcheck(lambda a: (a.tanh() * a).sum(), (x,))
        assert fg.autograd.gradgradcheck(lambda a: (a.tanh() * a).sum(), (x,))


def test_gradcheck_handles_non_contiguous_and_0d_inputs():
    base = fg.tensor(arr(4, 3))
    x = base.t().requires_grad_()
    assert not x.is_contiguous()
    assert gradcheck(lambda a: (a * a).sum(0), [x])
    assert np.array_equal(base.numpy(), arr(4, 3))      # perturbations are undone
    s = fg.tensor(1.5, dtype=fg.float64, requires_grad=True)
    assert gradcheck(lambda a: a.exp(), [s])


def test_gradcheck_warns_on_low_precision_inputs():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    with pytest.warns(UserWarning, match="not float64"):
        gradcheck(lambda a: a * 2, [x], eps=1e-2, atol=1e-2, rtol=1e-2)


def test_gradient_dtype_and_shape_match_the_input():
    x = fg.tensor([[1.0, 2.0]], dtype=fg.float16, requires_grad=True)
    (x.float() * 2).sum().backward()
    assert x.grad.dtype is fg.float16 and x.grad.shape == (1, 2)
    y = fg.tensor(2.0, requires_grad=True)
    (y.expand(3) * fg.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert y.grad.shape == () and y.grad.item() == 6.0
    assert math.isclose(y.grad.item(), 6.0)


def test_the_same_output_twice_adds_its_gradients():
    # Found by the differential fuzzer (seed 4, program 3416): expand() and squeeze() of a
    # 0-d tensor return it, and autograd.grad([y, y], ...) gave None (torch: the sum).
    a = fg.tensor(2.0, requires_grad=True)
    y = a.neg()
    (g,) = fg.autograd.grad([y, y.squeeze()], [a], [fg.tensor(1.0), fg.tensor(0.5)])
    assert g.item() == -1.5
    b = fg.tensor([1.0, 2.0], requires_grad=True)
    z = b * 3
    fg.autograd.backward([z, z], [fg.tensor([1.0, 1.0]), fg.tensor([2.0, 0.0])])
    np.testing.assert_array_equal(b.grad.numpy(), [9.0, 3.0])


def _alias(a, b) -> bool:
    return np.shares_memory(a.detach().numpy(), b.detach().numpy())


def _copies_during(fn) -> int:
    """How many ``copy`` primitives ``fn`` applies eagerly."""
    from fusegrad.ops import primitive
    apply, n = primitive._eager_apply, [0]

    def counted(prim, operands, attrs):
        n[0] += prim.name == "copy"
        return apply(prim, operands, attrs)
    primitive._eager_apply = counted
    try:
        fn()
    finally:
        primitive._eager_apply = apply
    return n[0]


def test_a_gradient_only_the_engine_holds_becomes_grad_without_a_copy():
    # The first gradient of a leaf is taken as it is when nothing else can see it; it must
    # still be a C-ordered array of its own that later backward calls add into.
    w = fg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    x = fg.tensor([[0.5, -1.0], [2.0, 0.25]])
    assert _copies_during(lambda: (w * x).sum().backward()) == 0
    assert_close(w.grad, x)
    assert w.grad.numpy().flags.c_contiguous and w.grad.grad_fn is None
    assert not _alias(w.grad, x) and not _alias(w.grad, w)
    (w * x).sum().backward()
    assert_close(w.grad, 2 * x.numpy())
    assert_close(x, [[0.5, -1.0], [2.0, 0.25]])


def test_a_gradient_shared_by_two_leaves_is_copied_for_each():
    # AddBackward sends one gradient tensor to both operands: each leaf gets its own.
    a = fg.tensor([1.0, 2.0], requires_grad=True)
    b = fg.tensor([3.0, 4.0], requires_grad=True)
    (a + b).backward(fg.tensor([1.0, 1.0]))
    assert not _alias(a.grad, b.grad)
    a.grad.add_(5.0)
    assert_close(b.grad, [1.0, 1.0])


def test_a_gradient_seen_elsewhere_is_copied():
    # Held by a hook, by a retained non-leaf .grad, or passed in by the caller: the leaf's
    # .grad must not share its memory, or an in-place update would reach the other holder.
    kept = []
    a = fg.tensor([1.0, 2.0], requires_grad=True)
    a.register_hook(lambda g: kept.append(g))
    (a * 3).sum().backward()
    assert not _alias(a.grad, kept[0])

    b = fg.tensor([1.0, 2.0], requires_grad=True)
    y = b.clone()                  # CloneBackward0 passes its gradient on unchanged
    y.retain_grad()
    y.backward(fg.tensor([2.0, 3.0]))
    assert not _alias(b.grad, y.grad)

    c = fg.tensor([1.0, 2.0], requires_grad=True)
    g = fg.tensor([4.0, 5.0])
    c.backward(g)
    assert not _alias(c.grad, g)
    c.grad.zero_()
    assert_close(g, [4.0, 5.0])


def test_a_gradient_that_views_a_product_only_it_holds_is_laid_out_like_its_leaf():
    # The weight of a linear layer gets a transposed view of a product that nothing else
    # holds: .grad is row-major like the weight (torch's layout contract: one copy, so that
    # w.grad.view(-1) works), a tensor of its own, and accumulates in place.
    w = fg.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3), requires_grad=True)
    x = fg.tensor(np.ones((4, 3), dtype=np.float32))
    assert _copies_during(lambda: (x @ w.T).sum().backward()) == 1
    assert_close(w.grad, np.full((2, 3), 4.0))
    assert w.grad._base is None and w.grad.grad_fn is None and w.grad.is_contiguous()
    g = w.grad
    (x @ w.T).sum().backward()
    assert_close(w.grad, np.full((2, 3), 8.0))
    assert w.grad is g


def test_a_gradient_viewing_an_array_held_elsewhere_is_copied():
    # Two views of one gradient (a reshape VJP's view sent on, and the gradient itself): the
    # leaf's .grad must be its own memory.
    a = fg.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    b = fg.tensor([[1.0, 1.0], [1.0, 1.0]], requires_grad=True)
    (a.reshape(2, 2) + b).backward(fg.ones(2, 2))
    assert not _alias(a.grad, b.grad)
    a.grad.add_(1.0)
    assert_close(b.grad, np.ones((2, 2)))


def test_writes_through_data_are_not_seen_by_autograd():
    """torch's .data has a version of its own: clipping a weight through it between forward
    and backward is allowed (through detach() it is refused), and the backward reads the
    clipped values."""
    x = fg.tensor([0.5, -1.0, 2.0], requires_grad=True)
    y = x.tanh()                                    # saves its output
    y.data.mul_(0.5)
    y.sum().backward()
    t = np.tanh(np.array([0.5, -1.0, 2.0], dtype=np.float32)) * 0.5
    assert_close(x.grad, 1 - t * t)
    w = fg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    inp = fg.tensor([[1.0, 1.0]], requires_grad=True)
    out = inp @ w
    w.data.clamp_(-0.5, 0.5)
    out.sum().backward()
    assert_close(inp.grad, [[1.0, 1.0]])
    assert w._version == 0
    z = fg.tensor([1.0, 2.0], requires_grad=True)
    h = z.exp()
    h.detach().mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        h.sum().backward()
