"""Composites with their own VJP (softmax, log_softmax, GELU, attention's softmax), and the
``strip-barriers`` pass that lets CSE see a backward's recomputation of forward values.

Traced, these ops emit a ``custom_vjp`` node: autodiff takes torch's backward formula
(softmax: ``out * (g - sum(g * out))``) instead of differentiating the forward's primitives,
so the forward saves less. The gradients must equal finite differences and eager's, first and
second order, and the kernels must show the saving.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd.grad_mode import enable_grad
from fusegrad.autograd.gradcheck import numerical_jacobian
from fusegrad.ir import Graph, TensorType, interpret, parse
from fusegrad.ir.graph import IRError
from fusegrad.passes.autodiff import grad_graph
from fusegrad.passes.barriers import strip_barriers
from fusegrad.passes.cse import cse
from fusegrad.passes.simplify import simplify

F = fg.nn.functional

OPS = {
    "softmax": lambda x: F.softmax(x, dim=-1),
    "softmax_dim0": lambda x: F.softmax(x, dim=0),
    "log_softmax": lambda x: F.log_softmax(x, dim=1),
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "sdpa_causal": lambda x: F.scaled_dot_product_attention(x, x * 0.5, x.flip(-1), is_causal=True),
}


def _weights(shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape)


def _loss(op, x, w):
    return (op(x) * w).sum()


def _central_differences(f, x0: np.ndarray) -> np.ndarray:
    """d f / d x at ``x0`` (float64) for scalar ``f``, by central differences."""
    ((jac,),) = numerical_jacobian(f, [fg.from_numpy(x0.copy()).requires_grad_()])
    return jac.reshape(x0.shape)


def _grad(op, x0, w, compiled):
    x = fg.from_numpy(x0.copy()).requires_grad_()
    wt = fg.from_numpy(w)

    def f(x):
        return _loss(op, x, wt)
    (fg.compile(f) if compiled else f)(x).backward()
    return x.grad.numpy()


@pytest.mark.parametrize("name", sorted(OPS))
def test_compiled_gradient_equals_finite_differences_in_float64(name):
    op = OPS[name]
    x0 = np.random.default_rng(0).standard_normal((3, 4, 5)) * 2
    w = _weights(x0.shape)
    got = _grad(op, x0, w, compiled=True)
    num = _central_differences(lambda x: _loss(op, x, fg.from_numpy(w)), x0)
    np.testing.assert_allclose(got, num, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(OPS))
def test_compiled_gradient_equals_eager_in_float32(name):
    op = OPS[name]
    x0 = (np.random.default_rng(2).standard_normal((4, 6, 8)) * 3).astype(np.float32)
    w = _weights(x0.shape, 3).astype(np.float32)
    np.testing.assert_allclose(_grad(op, x0, w, compiled=True), _grad(op, x0, w, compiled=False),
                               rtol=1e-5, atol=2e-6)


def test_softmax_gradient_is_torchs_formula_with_masked_entries():
    # -inf scores (a causal mask) get a zero gradient; a row that is all -inf gives NaN, as
    # softmax's value there does.
    x0 = np.random.default_rng(4).standard_normal((3, 5)).astype(np.float32)
    x0[0, 3:] = -np.inf
    w = _weights(x0.shape, 5).astype(np.float32)
    got = _grad(OPS["softmax"], x0, w, compiled=True)
    e = np.exp(x0 - x0.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    want = p * (w - (w * p).sum(-1, keepdims=True))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert np.all(got[0, 3:] == 0)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "gelu", "gelu_tanh"])
def test_second_derivative_through_the_custom_rule(name):
    # grad(grad(f)) under compile differentiates the rule's own graph.
    op = OPS[name]
    x0 = np.random.default_rng(6).standard_normal((2, 5)) * 1.5
    w = _weights(x0.shape, 7)
    v = _weights(x0.shape, 8)

    def first(x):
        (g,) = fg.autograd.grad(_loss(op, x, fg.from_numpy(w)), [x], create_graph=True)
        return g

    def second(x):
        g = first(x)
        (gg,) = fg.autograd.grad((g * fg.from_numpy(v)).sum(), [x])
        return gg

    got = fg.compile(second)(fg.from_numpy(x0).requires_grad_()).numpy()

    def first_dot_v(x):
        with enable_grad():        # central differences run under no_grad
            return (first(x.detach().requires_grad_()) * fg.from_numpy(v)).sum()
    np.testing.assert_allclose(got, _central_differences(first_dot_v, x0), rtol=1e-5, atol=1e-6)


def _step_kernels(fn, *arrays):
    ts = [fg.from_numpy(a).requires_grad_() for a in arrays]

    def step(*ts):
        loss = fn(*ts)
        loss.backward()
        return loss
    lowered = fg.compile(step).lower(*ts)
    return lowered.program.kg


def test_gelu_forward_kernel_saves_one_tensor_for_the_backward():
    # The chain rule through x * 0.5 * (1 + erf(x / sqrt 2)) reads three forward values of
    # the GELU's shape (x * 0.5, 1 + erf, exp(-x^2 / 2)); torch's formula one (cdf + x * pdf),
    # which the forward's kernel computes beside the output, sharing one erf.
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((32, 16), (16, 64), (64,)))
    v = rng.standard_normal((64, 8)).astype(np.float32)
    kg = _step_kernels(lambda x, w, b, v: (F.gelu(x @ w + b) @ v).sum(), x, w, b, v)
    gelu = [k for k in kg.kernels if any(n.op == "erf" for n in k.nodes)]
    assert len(gelu) == 1
    assert sum(n.op == "erf" for n in gelu[0].nodes) == 1
    assert [o.type.shape for o in gelu[0].outputs] == [(32, 64), (32, 64)]


def test_softmax_forward_kernel_writes_only_the_probabilities():
    rng = np.random.default_rng(1)
    x, v = (rng.standard_normal(s).astype(np.float32) for s in ((8, 4, 16, 16), (8, 4, 16, 8)))
    # The squared loss makes the probabilities' cotangent depend on the forward's result, so
    # the backward's reduction is a kernel of its own that reads what the forward saved.
    kg = _step_kernels(lambda x, v: ((F.softmax(x, dim=-1) @ v) ** 2).sum(), x, v)
    fwd = [k for k in kg.kernels if any(n.op == "exp" for n in k.nodes)]
    assert len(fwd) == 1
    assert [o.type.shape for o in fwd[0].outputs] == [(8, 4, 16, 16)]


def test_eager_kernels_and_composite_path_agree_to_second_order():
    # Large eager calls run as compiled kernels of the composite (eager_kernels, whose traced
    # definition carries the custom VJP); their backward, and a double backward through it,
    # must equal the eager composite's (whose custom_vjp node applies the rule; it raised
    # "backward through the graph a second time" before composites kept their inner graph).
    rng = np.random.default_rng(9)
    x0 = rng.standard_normal((256, 300)).astype(np.float32)
    for op in (OPS["gelu"], OPS["softmax"]):
        results = []
        for threshold in (1, 10**9):
            old = fg.config.eager_kernel_threshold
            fg.config.eager_kernel_threshold = threshold
            try:
                x = fg.from_numpy(x0.copy()).requires_grad_()
                (g,) = fg.autograd.grad((op(x) * x).sum(), [x], create_graph=True)
                (gg,) = fg.autograd.grad((g * g).sum(), [x])
                results.append((g.detach().numpy(), gg.numpy()))
            finally:
                fg.config.eager_kernel_threshold = old
        for a, b in zip(*results):
            np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("threshold", [1, 10**9])
def test_eager_gelu_gradient_is_the_rule_where_the_chain_rule_meets_zero_times_inf(
        approximate, threshold):
    # exp(gelu(100)) overflows float32: the gradient is inf * gelu'(100) = inf * 1. The chain
    # rule through the primitives multiplied inf by the pdf's 0 (NaN); torch, the compiled
    # function, the eager kernels and eager custom_vjp's node all apply g * (cdf + x * pdf).
    x0 = np.array([100.0, 3.0, -0.5, 0.0, -20.0], np.float32)
    if approximate == "none":       # (the tanh form's x**3 overflows float32 there: NaN)
        x0 = np.append(x0, np.float32([1e30, -1e30]))
    old = fg.config.eager_kernel_threshold
    fg.config.eager_kernel_threshold = threshold
    try:
        x = fg.from_numpy(x0.copy()).requires_grad_()
        F.gelu(x, approximate=approximate).exp().sum().backward()
        eager = x.grad.numpy()
    finally:
        fg.config.eager_kernel_threshold = old

    def grad(v):
        return fg.autograd.grad(F.gelu(v, approximate=approximate).exp().sum(), [v])[0]
    compiled = fg.compile(grad)(fg.from_numpy(x0.copy()).requires_grad_()).numpy()
    xd = x0.astype(np.float64)
    if approximate == "none":
        cdf = 0.5 * (1 + np.vectorize(math.erf)(xd / math.sqrt(2)))
        d = cdf + xd * np.exp(-0.5 * xd * xd) / math.sqrt(2 * math.pi)
        y = xd * cdf
    else:
        t = np.tanh(math.sqrt(2 / math.pi) * (xd + 0.044715 * xd ** 3))
        d = 0.5 * (1 + t) + 0.5 * xd * (1 - t * t) * math.sqrt(2 / math.pi) * (
            1 + 3 * 0.044715 * xd * xd)
        y = 0.5 * xd * (1 + t)
    with np.errstate(all="ignore"):
        want = np.exp(y.astype(np.float32)) * d   # exp() overflows in float32, as eager's
    for got in (eager, compiled):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30, equal_nan=True)
    assert np.isinf(eager[0]) and eager[0] > 0


def test_custom_vjp_node_refuses_an_unknown_rule():
    g = Graph("bad")
    x = g.add_input("x", TensorType((3,), fg.float32))
    with pytest.raises(IRError, match="no VJP named 'nope' is registered"):
        g.add_node("custom_vjp", [x, x], {"rule": "nope", "params": ()})


def test_simplify_drops_custom_vjp_and_the_graph_still_differentiates():
    # Without the node, autodiff goes through the forward's primitives: the same gradient.
    def f(x):
        return (F.softmax(x, dim=-1) * fg.arange(4.0)).sum()
    x0 = np.random.default_rng(3).standard_normal((2, 4))
    g = fg.trace(f, fg.from_numpy(x0))
    assert any(n.op == "custom_vjp" for n in g.nodes)
    plain = simplify(g)
    assert not any(n.op == "custom_vjp" for n in plain.nodes)
    with_rule = interpret(grad_graph(g, [0]), x0)
    without = interpret(grad_graph(plain, [0]), x0)
    np.testing.assert_allclose(with_rule[-1], without[-1], rtol=1e-12, atol=1e-14)


STRIP = """
graph @f(%x: f32[4], %y: f32[4]) -> (f32[4], f32[4], f32[4]) {
  %0 = exp %x : f32[4]
  %1 = stop_gradient %x : f32[4]
  %2 = exp %1 : f32[4]
  %3 = add %0, %2 : f32[4]
  %4 = stop_gradient %y : f32[4]
  %5 = stop_gradient %3 : f32[4]
  return %3, %4, %5
}
"""


def test_strip_barriers_lets_cse_merge_and_keeps_outputs_that_are_inputs():
    g = parse(STRIP)
    out = cse(strip_barriers(g))
    ops = [n.op for n in out.nodes]
    assert ops.count("exp") == 1
    # %4 stays a node (an output must not become the input itself); %5 becomes %3.
    assert ops.count("stop_gradient") == 1
    assert out.outputs[2] is out.outputs[0]
    x, y = np.array([0.5, -1.0, 2.0, 0.0], np.float32), np.arange(4, dtype=np.float32)
    for a, b in zip(interpret(out, x, y), interpret(g, x, y)):
        np.testing.assert_array_equal(a, b)


def test_strip_barriers_is_in_the_default_pipeline_and_named_for_pipelines():
    from fusegrad.passes.manager import PassManager
    from fusegrad.tracer.compile import DEFAULT_PIPELINE
    assert "strip-barriers" in DEFAULT_PIPELINE.split(",")
    out = PassManager("strip-barriers,cse").run(parse(STRIP))
    assert [n.op for n in out.nodes].count("exp") == 1


def _nodes(root) -> list:
    """Every autograd node reachable from ``root``, composites' inner graphs included."""
    seen, stack, out = set(), [root], []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        out.append(node)
        stack += [n for n, _ in node.next_functions]
        inner = getattr(node, "_inner", None)
        if inner is not None:
            stack.append(inner.grad_fn)
    return out


def test_eager_custom_vjp_records_the_rule_inside_attention_and_stops_without_grad():
    # scaled_dot_product_attention marks its inner softmax: eagerly that is a CustomVJPNode
    # in the composite's inner graph, and the gradient through it equals central differences
    # of the chain of primitives. Without an operand that requires grad, mark returns its
    # value.
    from fusegrad.ops.composite import CustomVJPNode
    from fusegrad.ops.softmax import softmax_values
    q0 = np.random.default_rng(3).standard_normal((2, 3, 5, 4))
    q = fg.from_numpy(q0.copy()).requires_grad_()
    y = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert any(isinstance(n, CustomVJPNode) and n._rule is softmax_values for n in _nodes(y.grad_fn))
    (g,) = fg.autograd.grad((y * y).sum(), [q])

    mask = fg.from_numpy(np.triu(np.full((5, 5), -np.inf), 1))

    def f(a):
        s = (a @ a.mT) / 2.0 + mask
        e = (s - s.amax(-1, keepdim=True)).exp()
        out = (e / e.sum(-1, keepdim=True)) @ a
        return (out * out).sum()
    np.testing.assert_allclose(g.numpy(), _central_differences(f, q0), rtol=1e-6, atol=1e-8)
    x = fg.from_numpy(q0.copy()).requires_grad_()
    marked = softmax_values.mark(F.softmax(x, -1), (x,), (-1,))
    assert isinstance(marked.grad_fn, CustomVJPNode)
    plain = fg.from_numpy(q0.copy())
    assert softmax_values.mark(plain * 2, (plain,), (-1,)).grad_fn is None


def test_a_custom_vjp_holds_its_rule_and_its_call_marks_tensor_arguments():
    # The rule hangs on the function object (jax.custom_vjp's shape); the IR names it by its
    # name alone. A call's tensor arguments are the operands, the others the params.
    from fusegrad.ops import prims
    from fusegrad.ops.composite import CustomVJP, CustomVJPNode, custom_vjp
    from fusegrad.ops.softmax import _softmax_vjp, softmax_values

    assert softmax_values.bwd is _softmax_vjp and prims.CUSTOM_VJPS["softmax"] is _softmax_vjp
    assert softmax_values.__name__ == "softmax_values" and softmax_values.__doc__
    name = "test_cube_as_three_x_squared_times_k"
    seen = []

    @custom_vjp(name)
    def cube(x, k):
        return x * x * x

    try:
        with pytest.raises(TypeError, match="no rule"):
            cube(fg.ones(2, requires_grad=True), 1.0)

        @cube.defvjp
        def _(g, out, operands, params):
            seen.append(params)
            (x,), (k,) = operands, params
            return (g * 3 * x * x * k,)

        with pytest.raises(ValueError, match="defined twice"):
            cube.defvjp(lambda g, out, operands, params: (g,))
        x = fg.tensor([1.0, 2.0], requires_grad=True)
        y = cube(x, 2.0)
        assert isinstance(y.grad_fn, CustomVJPNode) and y.grad_fn._rule is cube
        y.sum().backward()
        assert x.grad.tolist() == [6.0, 24.0] and seen == [(2.0,)]
        # compiled: the same rule, through the graph's custom_vjp node named by the rule
        x.grad = None
        fg.compile(lambda x: cube(x, 2.0).sum())(x).backward()
        assert x.grad.tolist() == [6.0, 24.0]
        with pytest.raises(TypeError, match="no function of its own"):
            CustomVJP(name + "_mark_only")(x)
    finally:
        prims.CUSTOM_VJPS.pop(name, None)
        prims.CUSTOM_VJP_READS.pop(name, None)


@pytest.mark.parametrize("zero_dead", [False, True])
def test_softmax_formula_and_vjp_are_one_for_tensors_and_numpy(zero_dead):
    # The fused attention's numpy reference evaluates the very formulas softmax and sdpa
    # trace: the same values, to exp's rounding (eager tensors may compute exp by fusegrad's
    # own vector code), on rows with -inf entries and on a row that is all -inf (NaN for
    # softmax, zeros for attention's rows that attend to nothing).
    from fusegrad.ops.softmax import TENSOR_MATH
    from fusegrad.ops.softmax_math import NUMPY_MATH, softmax_formula, softmax_vjp_formula
    s = _weights((3, 5)).astype(np.float32)
    s[1, :2] = -np.inf
    s[2] = -np.inf
    g = _weights((3, 5), seed=2).astype(np.float32)
    with np.errstate(all="ignore"):
        want = softmax_formula(NUMPY_MATH, s, -1, zero_dead)
        dwant = softmax_vjp_formula(NUMPY_MATH, g, want, -1)
    got = softmax_formula(TENSOR_MATH, fg.from_numpy(s), -1, zero_dead)
    dgot = softmax_vjp_formula(TENSOR_MATH, fg.from_numpy(g), got, -1)
    eps = np.finfo(np.float32).eps
    np.testing.assert_allclose(got.numpy(), want, rtol=8 * eps, atol=0)
    np.testing.assert_allclose(dgot.numpy(), dwant, rtol=32 * eps, atol=8 * eps * np.abs(g).max())
    if zero_dead:
        assert (want[2] == 0).all()
    else:
        assert np.isnan(want[2]).all()
        np.testing.assert_allclose(F.softmax(fg.from_numpy(s), -1).numpy(), want, rtol=8 * eps,
                                   atol=0)
    e = np.exp(s[0].astype(np.float64) - s[0].max())
    np.testing.assert_allclose(want[0], e / e.sum(), rtol=8 * eps)
