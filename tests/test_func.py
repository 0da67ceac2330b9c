"""fusegrad.func (torch.func): grad, grad_and_value, vjp, jvp, jacrev, jacfwd, hessian, vmap,
functional_call and stack_module_state; their compositions, eager and compiled.

References without torch: closed forms, central finite differences in float64 and
fusegrad.autograd.functional; the tests at the end compare with torch.func."""

import collections

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad.autograd import functional as AF
from fusegrad.func import (
    functional_call,
    grad,
    grad_and_value,
    hessian,
    jacfwd,
    jacrev,
    jvp,
    stack_module_state,
    vjp,
    vmap,
)
from fusegrad.func._pytree import tree_flatten
from fusegrad.tracer.state import trace_state

F32_TOL = dict(rtol=1e-5, atol=1e-6)


def t64(values):
    return fg.tensor(np.asarray(values, dtype=np.float64))


def close(a, b, **tol):
    np.testing.assert_allclose(np.asarray(a.detach().numpy() if isinstance(a, fg.Tensor) else a),
                               np.asarray(b.detach().numpy() if isinstance(b, fg.Tensor) else b),
                               **(tol or F32_TOL))


def cubic(x):
    return (x ** 3).sum()


def finite_difference_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(x)
    for i in range(x.size):
        d = np.zeros_like(x)
        d.flat[i] = eps
        g.flat[i] = (f(t64(x + d)).item() - f(t64(x - d)).item()) / (2 * eps)
    return g


# --------------------------------------------------------------------------- grad


def test_grad_is_the_closed_form_and_the_finite_difference():
    x = np.array([0.5, -1.0, 2.0])
    close(grad(cubic)(t64(x)), 3 * x ** 2)

    def f(x):
        return (x.sin() * x.exp()).sum()
    close(grad(f)(t64(x)), finite_difference_grad(f, x), rtol=1e-7, atol=1e-8)


def test_grad_argnums_tuple_negative_and_pytrees():
    x, y = t64([1.0, 2.0]), t64([3.0, -1.0])

    def f(x, y):
        return (x ** 2 * y).sum()
    gx, gy = grad(f, argnums=(0, 1))(x, y)
    close(gx, 2 * x * y)
    close(gy, x ** 2)
    close(grad(f, argnums=-1)(x, y), x ** 2)
    (gy_only,) = grad(f, argnums=(1,))(x, y)
    close(gy_only, x ** 2)
    params = {"w": x, "b": [y]}
    g = grad(lambda p, s: (p["w"] * p["b"][0] * s).sum())(params, 2.0)
    assert set(g) == {"w", "b"} and isinstance(g["b"], list)
    close(g["w"], 2 * y)
    close(g["b"][0], 2 * x)


def test_grad_and_value_with_aux():
    x = t64([1.0, 2.0])
    g, (value, aux) = grad_and_value(lambda x: (cubic(x), {"double": x * 2}), has_aux=True)(x)
    close(g, 3 * x ** 2)
    close(value, 9.0)
    close(aux["double"], [2.0, 4.0])
    assert not g.requires_grad and not value.requires_grad and not aux["double"].requires_grad
    g2, aux2 = grad(lambda x: (cubic(x), x.sum()), has_aux=True)(x)
    close(g2, g)
    close(aux2, 3.0)


def test_grad_of_unused_input_is_zeros_and_keyword_arguments_pass_through():
    x = t64([1.0, 2.0])
    close(grad(lambda x: (x.detach() ** 2).sum())(x), [0.0, 0.0])
    close(grad(lambda x, *, k: (x * k).sum())(x, k=t64([5.0, 7.0])), [5.0, 7.0])


def test_grad_keeps_history_only_to_tensors_outside_that_require_grad():
    x = t64([1.0, 2.0])
    w = t64([3.0, 4.0]).requires_grad_()
    g = grad(lambda x: (w * x * x).sum())(x)     # 2 w x, a function of w
    assert g.requires_grad
    (dw,) = fg.autograd.grad(g.sum(), w)
    close(dw, 2 * x)
    assert not grad(cubic)(x).requires_grad
    xr = x.clone().requires_grad_()
    gr = grad(cubic)(xr)
    assert gr.requires_grad
    (h,) = fg.autograd.grad(gr.sum(), xr)
    close(h, 6 * x)


def test_grad_ignores_an_outer_no_grad():
    x = t64([1.0, 2.0])
    with fg.no_grad():
        close(grad(cubic)(x), 3 * x ** 2)


@pytest.mark.parametrize("fn, args, argnums, has_aux, exc, message", [
    (lambda x: x ** 2, (1,), 0, False, RuntimeError,
     "Expected f(*args) to return a scalar Tensor, got tensor with 1 dims. Maybe you wanted to use "
     "the vjp or jacrev APIs instead?"),
    (lambda x: 3.0, (1,), 0, False, RuntimeError,
     "grad_and_value(f)(*args): Expected f(*args) to return a Tensor, got <class 'float'>"),
    (cubic, (1,), 1, False, RuntimeError, "Got argnum=1, but only 1 positional inputs"),
    (cubic, (1,), (0, 0), False, RuntimeError, "argnums elements must be unique, got (0, 0)"),
    (cubic, (1,), 1.5, False, RuntimeError, "argnums must be int or Tuple[int, ...], got: <class 'float'>"),
    (cubic, (1,), (), False, RuntimeError, "argnums must be non-empty"),
    (cubic, (1,), 0, True, RuntimeError,
     "grad_and_value(f)(*args): output of function f should be a tuple: (output, aux) if has_aux is "
     "True"),
    (lambda x: (cubic(x), 1), (1,), 0, True, RuntimeError,
     "Expected tensors, got unsupported type <class 'int'>"),
    (cubic, (3.0,), 0, False, ValueError,
     "Thing passed to transform API must be Tensor, got <class 'float'>"),
    (cubic, ("int",), 0, False, RuntimeError, "only Tensors of floating point dtype can require gradients"),
])
def test_grad_mistakes_raise_torchs_errors(fn, args, argnums, has_aux, exc, message):
    x = fg.tensor([1.0, 2.0])
    real_args = tuple(x if a == 1 else fg.tensor([1, 2]) if a == "int" else a for a in args)
    with pytest.raises(exc) as info:
        grad(fn, argnums=argnums, has_aux=has_aux)(*real_args)
    assert message in str(info.value)


# --------------------------------------------------------------------------- vjp, jvp


def test_vjp_equals_autograd_functional_and_is_reusable():
    x, y = t64([1.0, 2.0]), t64([0.5, -1.0])

    def f(x, y):
        return x * y.exp(), (x ** 2).sum()
    out, vjp_fn = vjp(f, x, y)
    close(out[0], x * y.exp())
    v = (t64([1.0, -2.0]), t64(3.0))
    gx, gy = vjp_fn(v)
    _, (rx, ry) = AF.vjp(f, (x, y), v)
    close(gx, rx)
    close(gy, ry)
    gx2, _ = vjp_fn(v)                      # the graph is kept for another call
    close(gx2, rx)
    out, vjp_fn, aux = vjp(lambda x: (x.sin(), x.cos()), x, has_aux=True)
    close(aux, x.cos())
    (g,) = vjp_fn(fg.ones_like(x))
    close(g, x.cos())


def test_vjp_mistakes_raise_torchs_errors():
    x = fg.tensor([1.0, 2.0])
    _, vjp_fn = vjp(lambda x: x ** 2, x)
    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[0\] has a shape of"):
        vjp_fn(fg.ones(3))
    with pytest.raises(RuntimeError, match="Expected pytree structure of cotangents to be the same as "
                       r"pytree structure of outputs to the function. cotangents: \[\*\], primal "
                       r"output: \*"):
        vjp_fn([fg.ones(2)])
    with pytest.raises(RuntimeError, match=r"vjp\(f, \*primals\): expected f\(\*primals\) to return only "
                       "tensors, got unsupported type <class 'int'>"):
        vjp(lambda x: 3, x)
    with pytest.raises(RuntimeError, match=r"vjp\(f, \*primals\): output of function f should be a tuple"):
        vjp(lambda x: x ** 2, x, has_aux=True)


def test_jvp_equals_autograd_functional_and_finite_differences():
    x, v = np.array([0.3, -1.2, 2.0]), np.array([1.0, 0.5, -2.0])

    def f(x):
        return x.sin() * x.sum()
    out, tangent = jvp(f, (t64(x),), (t64(v),))
    _, ref = AF.jvp(f, t64(x), t64(v))
    close(out, f(t64(x)))
    close(tangent, ref)
    eps = 1e-6
    fd = (f(t64(x + eps * v)).numpy() - f(t64(x - eps * v)).numpy()) / (2 * eps)
    close(tangent, fd, rtol=1e-7, atol=1e-8)
    assert not tangent.requires_grad and not out.requires_grad
    out, tangent, aux = jvp(lambda x: (x ** 2, x + 1), (t64(x),), (t64(v),), has_aux=True)
    close(tangent, 2 * x * v)
    close(aux, x + 1)


def test_jvp_mistakes_raise_torchs_errors():
    x = fg.tensor([1.0, 2.0])
    sq = lambda x: x ** 2  # noqa: E731
    with pytest.raises(RuntimeError, match="Expected primals to be a tuple"):
        jvp(sq, x, x)
    with pytest.raises(RuntimeError, match="Expected primals and tangents to have the same python structure"):
        jvp(sq, (x,), (x, x))
    with pytest.raises(RuntimeError, match="Expected primals and tangents to have the same python structure"):
        jvp(sq, (x,), [x])
    with pytest.raises(RuntimeError, match="Expected primals to contain at least one Tensor"):
        jvp(sq, (), ())
    with pytest.raises(RuntimeError, match=r"Tensor is of size \[2\] while the given forward gradient is "
                       r"of size \[3\]"):
        jvp(sq, (x,), (fg.ones(3),))
    with pytest.raises(RuntimeError, match=r"jvp\(f, primals, tangents\): output of function f should be"):
        jvp(sq, (x,), (x,), has_aux=True)


# --------------------------------------------------------------------------- Jacobians


def test_jacrev_and_jacfwd_equal_autograd_functional_jacobian():
    x, y = t64([0.5, 1.5, -1.0]), t64([2.0, 3.0])

    def f(x, y):
        return x.sin() * y.sum(), (x[:2] * y).exp()
    ref = AF.jacobian(f, (x, y))
    for transform in (jacrev, jacfwd):
        jac = transform(f, argnums=(0, 1))(x, y)
        assert isinstance(jac, tuple) and len(jac) == 2
        for i in range(2):
            for j in range(2):
                close(jac[i][j], ref[i][j])
        jx = transform(f)(x, y)
        close(jx[0], ref[0][0])
        close(jx[1], ref[1][0])


def test_jacobian_structures_and_aux():
    x = t64([1.0, 2.0])
    jac = jacrev(lambda x: {"sq": x ** 2, "sum": x.sum()}, argnums=(0,))(x)
    assert set(jac) == {"sq", "sum"} and isinstance(jac["sq"], tuple)
    close(jac["sq"][0], np.diag([2.0, 4.0]))
    close(jac["sum"][0], [1.0, 1.0])
    jac, aux = jacfwd(lambda x: (x ** 3, x.sum()), has_aux=True)(x)
    close(jac, np.diag(3 * np.array([1.0, 2.0]) ** 2))
    close(aux, 3.0)
    with pytest.raises(RuntimeError, match=r"vjp\(f, \*primals\): expected f\(\*primals\) to return only"):
        jacrev(lambda x: 3)(x)
    with pytest.raises(RuntimeError, match="Got argnum=1, but only 1 positional inputs"):
        jacrev(lambda x: x, argnums=1)(x)
    with pytest.raises(ValueError, match="jacrev: `chunk_size` should be greater than 0."):
        jacrev(lambda x: x, chunk_size=0)


def test_hessian_and_nested_jacrev_equal_autograd_functional_hessian():
    x = t64([0.5, -1.0, 2.0])

    def f(x):
        return (x.sin() * x.prod()).sum()
    ref = AF.hessian(f, x)
    close(hessian(f)(x), ref)
    close(jacrev(jacrev(f))(x), ref)
    close(jacfwd(jacrev(f))(x), ref)


def test_hessian_vector_product_as_jvp_of_grad():
    x, v = t64([0.5, -1.0, 2.0]), t64([1.0, 2.0, -0.5])

    def f(x):
        return (x.sin() * x.prod()).sum()
    value, hv = jvp(grad(f), (x,), (v,))
    close(value, grad(f)(x))
    _, ref = AF.hvp(f, x, v)
    close(hv, ref)


def test_jacfwd_randomness_error_refuses_random_ops():
    x = fg.tensor([1.0, 2.0])
    with pytest.raises(RuntimeError, match="called random operation while in randomness error mode"):
        jacfwd(lambda x: x + fg.rand(2))(x)
    jacfwd(lambda x: x + fg.rand(2), randomness="different")(x)
    with pytest.raises(RuntimeError, match="Only allowed values for randomness are 'error', 'different', "
                       "or 'same'. Got x"):
        jacfwd(lambda x: x, randomness="x")


# --------------------------------------------------------------------------- vmap


def test_vmap_equals_a_loop_with_in_dims_and_out_dims():
    x = fg.arange(6.0).reshape(2, 3)
    y = fg.arange(12.0).reshape(3, 4)
    out = vmap(lambda a, b: a * b.sum(), in_dims=(-1, None))(x, y)
    assert out.shape == (3, 2)
    close(out, x.t() * y.sum())
    out = vmap(lambda a, b: (a.sum() + b.sum(), a), in_dims=(0, 1), out_dims=(0, 1))(
        fg.ones(4, 2), fg.ones(3, 4))
    close(out[0], [5.0] * 4)
    assert out[1].shape == (2, 4)
    assert vmap(lambda a: a, out_dims=-1)(x).shape == (3, 2)
    d = {"a": x, "b": fg.tensor(2.0)}
    close(vmap(lambda d: d["a"] * d["b"], in_dims=({"a": 0, "b": None},))(d), x * 2)
    close(vmap(lambda a, *, s: a * s)(x, s=fg.tensor([1.0, 2.0, 3.0])), x * fg.tensor([1.0, 2.0, 3.0]))
    close(vmap(lambda a: fg.ones(2), out_dims=None)(x), [1.0, 1.0])
    assert vmap(lambda a: a)(fg.zeros(0, 3)).shape == (0, 3)
    close(vmap(lambda a: a.sum(), chunk_size=1)(x), [3.0, 12.0])


def test_vmap_over_containers():
    pair = collections.namedtuple("pair", "a b")
    x, y = fg.arange(6.0).reshape(3, 2), fg.tensor([1.0, 2.0])
    close(vmap(lambda p: p.a * p.b)(pair(x, x)), x * x)
    close(vmap(lambda pl: pl[0] + pl[1], in_dims=([0, None],))([x, y]), x + y)
    out = vmap(lambda a: {"s": a.sum(), "l": [a, a * 2]})(x)
    close(out["s"], [1.0, 5.0, 9.0])
    assert isinstance(out["l"], list)
    close(out["l"][1], x * 2)
    out, three = vmap(lambda a: (a, 3.0), out_dims=(0, None))(x)
    assert three == 3.0


def test_nested_vmap_is_an_outer_product():
    a, b = fg.tensor([1.0, 2.0]), fg.tensor([3.0, 4.0, 5.0])
    out = vmap(vmap(lambda x, y: x * y, in_dims=(None, 0)), in_dims=(0, None))(a, b)
    close(out, np.outer([1.0, 2.0], [3.0, 4.0, 5.0]))


@pytest.mark.parametrize("call, message", [
    (lambda x, y: vmap(lambda a, b: a)(x, y),
     "vmap: Expected all tensors to have the same size in the mapped dimension, got sizes [2, 3] for the "
     "mapped dimension"),
    (lambda x, y: vmap(lambda a: a, in_dims=2)(x),
     "vmap(<lambda>, in_dims=2, ...)(<inputs>): Got in_dim=2 for some input, but that input is a Tensor "
     "of dimensionality 2 so expected in_dim to satisfy -2 <= in_dim < 2."),
    (lambda x, y: vmap(lambda a: a, in_dims=(0, 0))(x),
     "vmap(<lambda>, in_dims=(0, 0), ...)(<inputs>): in_dims is not compatible with the structure of "
     "`inputs`."),
    (lambda x, y: vmap(lambda a: a, in_dims=[0])(x),
     "vmap(<lambda>, in_dims=[0], ...)(<inputs>): expected `in_dims` to be int or a (potentially nested) "
     "tuple matching the structure of inputs, got: <class 'list'>."),
    (lambda x, y: vmap(lambda a: a, in_dims=(None,))(x), "vmap: Expected at least one Tensor to vmap over"),
    (lambda x, y: vmap(lambda a, k: a * k)(x, 3),
     "vmap(<lambda>, in_dims=0, ...)(<inputs>): Got in_dim=0 for an input but the input is of type <class "
     "'int'>. We cannot vmap over non-Tensor arguments, please use None as the respective in_dim"),
    (lambda x, y: vmap(lambda a: a)(),
     "vmap(<lambda>)(<inputs>): got no inputs. Maybe you forgot to add inputs, or you are trying to vmap "
     "over a function with no inputs. The latter is unsupported."),
    (lambda x, y: vmap(lambda a: (a, 3))(x),
     "vmap(<lambda>, ...): `<lambda>` must only return Tensors, got type <class 'int'>. Did you mean to "
     "set out_dims= to None for output?"),
    (lambda x, y: vmap(lambda a: (a, a), out_dims=(0,))(x),
     "vmap(<lambda>, ..., out_dims=(0,))(<inputs>): out_dims is not compatible with the structure of "
     "`outputs`."),
    (lambda x, y: vmap(lambda a: a, out_dims=None)(x),
     "vmap(<lambda>, ...): `<lambda>` can not return a BatchedTensor when out_dim is None"),
    (lambda x, y: vmap(lambda a: a, chunk_size=0),
     "vmap: chunk_size should be None or greater than 0. (got 0)"),
])
def test_vmap_mistakes_raise_torchs_value_errors(call, message):
    x, y = fg.arange(6.0).reshape(2, 3), fg.arange(12.0).reshape(3, 4)
    with pytest.raises(ValueError) as info:
        call(x, y)
    assert message in str(info.value)


def test_vmap_randomness():
    x = fg.zeros(4, 3)
    for fn in (lambda a: a + fg.rand(()), lambda a: F.dropout(a + 1, 0.5)):
        with pytest.raises(RuntimeError, match="vmap: called random operation while in randomness error "
                           "mode. Please either use the 'same' or 'different' randomness flags"):
            vmap(fn)(x)
    fg.manual_seed(0)
    same = vmap(lambda a: a + fg.rand(3), randomness="same")(x).numpy()
    assert (same == same[0]).all() and len(np.unique(same[0])) == 3
    different = vmap(lambda a: a + fg.rand(3), randomness="different")(x).numpy()
    assert len(np.unique(different)) == different.size
    with pytest.raises(RuntimeError, match="Only allowed values for randomness are 'error', 'different', "
                       "or 'same'. Got foo"):
        vmap(lambda a: a, randomness="foo")
    assert not trace_state().key_sources      # no key source left behind, even after errors


def test_torch_vmap_is_func_vmap():
    assert fg.vmap is fg.func.vmap
    with pytest.raises(AttributeError, match="torch.func.linearize is not implemented in fusegrad yet"):
        _ = fg.func.linearize


# --------------------------------------------------------------------------- functional_call


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)
        self.b.weight = self.a.weight
        self.register_buffer("buf", fg.zeros(2))

    def forward(self, x):
        return self.b(self.a(x)) + self.buf


def test_functional_call_swaps_and_restores_parameters_and_buffers():
    fg.manual_seed(0)
    m = Tied()
    x = fg.ones(1, 2)
    w0, buf0 = m.a.weight, m.buf
    eye = fg.eye(2)
    # Tied: the value given for a.weight is b.weight's too.
    out = functional_call(m, ({"a.weight": eye}, {"buf": fg.ones(2)}), (x,))
    close(out, (x + m.a.bias.detach()) + m.b.bias.detach() + 1)
    assert m.a.weight is w0 and m.b.weight is w0 and m.buf is buf0
    out_untied = functional_call(m, {"a.weight": eye}, x, tie_weights=False)
    close(out_untied, (x + m.a.bias) @ w0.t() + m.b.bias)

    def boom(x):
        raise ValueError("boom")
    m.forward = boom
    with pytest.raises(ValueError, match="boom"):
        functional_call(m, {"a.weight": eye, "zz": eye}, (x,))
    assert m.a.weight is w0 and "zz" not in m.__dict__


def test_functional_call_mistakes_raise_torchs_errors():
    m, eye, x = Tied(), fg.eye(2), fg.ones(1, 2)
    with pytest.raises(ValueError, match=r"functional_call got multiple values for keys \['a.weight', "
                       r"'b.weight'\], which are tied. Consider using tie_weights=False"):
        functional_call(m, {"a.weight": eye, "b.weight": eye * 2}, (x,))
    with pytest.raises(ValueError, match=r"\['a.weight'\] appeared in multiple dictionaries; behavior of "
                       "functional call is ambiguous"):
        functional_call(m, ({"a.weight": eye}, {"a.weight": eye}), (x,))
    with pytest.raises(RuntimeError) as info:
        functional_call(m, {"zz": eye}, (x,), strict=True)
    assert str(info.value) == ("Error(s) in reparametrizing for Tied:\n\tUnexpected key(s): 'zz'.\n\t"
                               "Missing key(s): 'a.bias', 'a.weight', 'b.bias', 'b.weight', 'buf'.")
    with pytest.raises(TypeError, match="3 is not an instance of torch.Tensor"):
        functional_call(m, {"a.weight": 3}, (x,))
    with pytest.raises(ValueError, match="Expected parameter_and_buffer_dicts to be a dict, or a list/tuple "
                       "of dicts, but got <class 'int'>"):
        functional_call(m, 5, (x,))


def test_stack_module_state_and_an_ensemble_under_vmap():
    fg.manual_seed(1)
    models = [nn.Linear(3, 2) for _ in range(4)]
    params, buffers = stack_module_state(models)
    assert params["weight"].shape == (4, 2, 3) and params["bias"].shape == (4, 2)
    assert params["weight"].is_leaf and params["weight"].requires_grad and buffers == {}
    x = fg.randn(5, 3)
    out = vmap(lambda p, b, x: functional_call(models[0], (p, b), (x,)), in_dims=(0, 0, None))(
        params, buffers, x)
    for k, m in enumerate(models):
        close(out[k], m(x))
    with pytest.raises(RuntimeError, match="stack_module_state: Expected at least one model, got 0."):
        stack_module_state([])
    models[0].weight.requires_grad_(False)
    with pytest.raises(RuntimeError, match="Expected weight from each model to have the same .requires_grad"):
        stack_module_state(models)


# --------------------------------------------------------------------------- per-example gradients


def small_mlp():
    fg.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def per_example_grads(model, data, targets):
    """torch.func's per-sample-gradients tutorial, unchanged but for the sizes."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def compute_loss(params, buffers, sample, target):
        predictions = functional_call(model, (params, buffers), (sample.unsqueeze(0),))
        return F.cross_entropy(predictions, target.unsqueeze(0))
    ft_compute_sample_grad = vmap(grad(compute_loss), in_dims=(None, None, 0, 0))
    return ft_compute_sample_grad, (params, buffers, data, targets)


def looped_grads(model, data, targets) -> dict:
    out = {k: [] for k, _ in model.named_parameters()}
    for i in range(data.shape[0]):
        loss = F.cross_entropy(model(data[i:i + 1]), targets[i:i + 1])
        for (k, _), g in zip(model.named_parameters(), fg.autograd.grad(loss, list(model.parameters()))):
            out[k].append(g.numpy())
    return {k: np.stack(v) for k, v in out.items()}


def tutorial_data():
    fg.manual_seed(2)
    return fg.randn(16, 8), fg.randint(0, 4, (16,))


def test_per_example_gradients_equal_a_loop_of_autograd_grad():
    model = small_mlp()
    data, targets = tutorial_data()
    fn, args = per_example_grads(model, data, targets)
    grads = fn(*args)
    ref = looped_grads(model, data, targets)
    assert set(grads) == set(ref)
    for k in ref:
        assert grads[k].shape == (16,) + tuple(dict(model.named_parameters())[k].shape)
        close(grads[k], ref[k])


@pytest.mark.slow
def test_compiled_per_example_gradients_equal_eager():
    model = small_mlp()
    data, targets = tutorial_data()
    fn, args = per_example_grads(model, data, targets)
    eager = fn(*args)
    compiled = fg.compile(fn, fullgraph=True)      # traced whole, no eager fallback
    for _ in range(2):
        got = compiled(*args)
        for k in eager:
            close(got[k], eager[k], rtol=1e-5, atol=1e-6)
    assert compiled.compiles == 1


def test_compiled_transforms_equal_eager():
    x, v = fg.tensor([0.5, -1.0, 2.0]), fg.tensor([1.0, 2.0, -0.5])

    def f(x):
        return (x.sin() * x.prod()).sum()
    programs = [
        (lambda x: jacrev(jacrev(f))(x), (x,)),
        (lambda x, v: jvp(grad(f), (x,), (v,))[1], (x, v)),
        (lambda x: vmap(grad(f))(fg.stack([x, 2 * x])), (x,)),
        (lambda x: hessian(f)(x), (x,)),
    ]
    for program, args in programs:
        close(fg.compile(program, fullgraph=True)(*args), program(*args), rtol=2e-5, atol=1e-5)


# --------------------------------------------------------------------------- against torch.func


def _torch():
    return pytest.importorskip("torch")


def _both(value):
    torch = _torch()
    arr = np.asarray(value, dtype=np.float32)
    return fg.tensor(arr), torch.tensor(arr)


def test_transforms_match_torch_func():
    torch = _torch()
    tf = torch.func
    (x, tx), (v, tv) = _both([0.5, -1.0, 2.0]), _both([1.0, 2.0, -0.5])

    def f(lib):
        return lambda x, y: ((x.sin() * y.exp()).sum(), x * y)
    fg_f, t_f = f(fg), f(torch)
    pairs = [
        (grad(lambda x, y: fg_f(x, y)[0], argnums=(0, 1))(x, v),
         tf.grad(lambda x, y: t_f(x, y)[0], argnums=(0, 1))(tx, tv)),
        (grad_and_value(fg_f, has_aux=True)(x, v), tf.grad_and_value(t_f, has_aux=True)(tx, tv)),
        (vjp(fg_f, x, v)[1]((fg.tensor(2.0), v)), tf.vjp(t_f, tx, tv)[1]((torch.tensor(2.0), tv))),
        (jvp(fg_f, (x, v), (v, x)), tf.jvp(t_f, (tx, tv), (tv, tx))),
        (jacrev(fg_f, argnums=(0, 1))(x, v), tf.jacrev(t_f, argnums=(0, 1))(tx, tv)),
        (jacfwd(fg_f, argnums=1)(x, v), tf.jacfwd(t_f, argnums=1)(tx, tv)),
        (hessian(lambda x: fg_f(x, v)[0])(x), tf.hessian(lambda x: t_f(x, tv)[0])(tx)),
        (jvp(grad(lambda x: fg_f(x, v)[0]), (x,), (v,)),
         tf.jvp(tf.grad(lambda x: t_f(x, tv)[0]), (tx,), (tv,))),
        (vmap(fg_f, in_dims=(0, None), out_dims=(0, 1))(fg.stack([x, v]), v),
         tf.vmap(t_f, in_dims=(0, None), out_dims=(0, 1))(torch.stack([tx, tv]), tv)),
    ]
    for ours, theirs in pairs:
        fg_leaves, _ = tree_flatten(ours)
        t_leaves = torch.utils._pytree.tree_leaves(theirs)
        assert len(fg_leaves) == len(t_leaves)
        for a, b in zip(fg_leaves, t_leaves):
            assert tuple(a.shape) == tuple(b.shape)
            close(a, b.detach().numpy(), rtol=2e-5, atol=1e-5)


def test_per_example_gradients_match_torch_func():
    torch = _torch()
    tf = torch.func
    model = small_mlp()
    data, targets = tutorial_data()
    fn, args = per_example_grads(model, data, targets)
    ours = fn(*args)
    tmodel = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                                 torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for (_, p), (_, tp) in zip(model.named_parameters(), tmodel.named_parameters()):
            tp.copy_(torch.tensor(p.detach().numpy()))
    params = {k: v.detach() for k, v in tmodel.named_parameters()}

    def compute_loss(params, sample, target):
        predictions = tf.functional_call(tmodel, (params,), (sample.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(predictions, target.unsqueeze(0))
    theirs = tf.vmap(tf.grad(compute_loss), in_dims=(None, 0, 0))(
        params, torch.tensor(data.numpy()), torch.tensor(targets.numpy()))
    for k in theirs:
        close(ours[k], theirs[k].numpy(), rtol=1e-5, atol=1e-6)


def _error(call):
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the exception is what is compared
        return type(e).__name__, str(e)
    return None


@pytest.mark.parametrize("mistake", [
    lambda lib, x: lib.func.grad(lambda x: x ** 2)(x),
    lambda lib, x: lib.func.grad(lambda x: (x ** 2).sum(), argnums=1)(x),
    lambda lib, x: lib.func.grad(lambda x: (x ** 2).sum(), argnums=(0, 0))(x),
    lambda lib, x: lib.func.grad(lambda x: (x ** 2).sum(), has_aux=True)(x),
    lambda lib, x: lib.func.grad(lambda x: (x ** 2).sum())(3.0),
    lambda lib, x: lib.func.vjp(lambda x: 3, x),
    lambda lib, x: lib.func.jvp(lambda x: x, x, x),
    lambda lib, x: lib.func.jvp(lambda x: x, (), ()),
    lambda lib, x: lib.func.jvp(lambda x: x, (x,), (lib.ones(3),)),
    lambda lib, x: lib.func.vmap(lambda a, b: a)(x, lib.ones(3)),
    lambda lib, x: lib.func.vmap(lambda a: a, in_dims=2)(x),
    lambda lib, x: lib.func.vmap(lambda a: a, in_dims=[0])(x),
    lambda lib, x: lib.func.vmap(lambda a: a)(),
    lambda lib, x: lib.func.vmap(lambda a: (a, 3))(x),
    lambda lib, x: lib.func.vmap(lambda a: a + lib.rand(()))(x),
    lambda lib, x: lib.func.vmap(lambda a: a, randomness="foo")(x),
    lambda lib, x: lib.func.stack_module_state([]),
    lambda lib, x: lib.func.stack_module_state([lib.nn.Linear(2, 2), lib.nn.Linear(2, 2).eval()]),
    lambda lib, x: lib.func.stack_module_state([lib.nn.Linear(2, 2), lib.nn.Tanh()]),
    lambda lib, x: lib.func.functional_call(lib.nn.Linear(2, 2), [{}, 3], (x,)),
    lambda lib, x: lib.func.functional_call(lib.nn.Linear(2, 2), 3, (x,)),
    lambda lib, x: lib.func.functional_call(lib.nn.Linear(2, 2), ({"bias": x}, {"bias": x}), (x,)),
    lambda lib, x: lib.func.functional_call(lib.nn.Linear(2, 2), {"bias": x, "zz": x}, (x,), strict=True),
    lambda lib, x: lib.func.vmap(lambda a, n: a)(x, None),
    lambda lib, x: lib.func.grad(lambda d: (d["a"] * 2).sum())({"a": x, "b": None}),
    lambda lib, x: lib.func.grad(lambda x: (x.sum(), None), has_aux=True)(x),
])
def test_mistakes_raise_as_torch_func(mistake):
    torch = _torch()
    ours = _error(lambda: mistake(fg, fg.tensor([1.0, 2.0])))
    theirs = _error(lambda: mistake(torch, torch.tensor([1.0, 2.0])))
    assert ours == theirs


def test_compiled_vmap_randomness():
    x = fg.zeros(3, 2)
    same = fg.compile(lambda x: vmap(lambda a: a + fg.rand(2), randomness="same")(x))
    first, second = same(x).numpy(), same(x).numpy()
    assert (first == first[0]).all() and (second == second[0]).all()
    assert not np.array_equal(first, second)          # fresh numbers on each call
    different = fg.compile(lambda x: vmap(lambda a: a + fg.rand(2), randomness="different")(x))(x)
    assert len(np.unique(different.numpy())) == 6
    with pytest.raises(RuntimeError, match="called random operation while in randomness error mode"):
        fg.compile(lambda x: vmap(lambda a: a + fg.rand(2))(x))(x)
