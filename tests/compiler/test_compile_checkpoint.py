"""Activation checkpointing compiled: a region run through ``fusegrad.utils.checkpoint`` is
differentiated on values recomputed right before its backward (passes/autodiff.py), in a
whole compiled training step and in the backward of a compiled forward (the partition).

The recomputation is the forward's own ops on the same inputs, so values and gradients are
the unchecked program's up to how kernels round: the copies run in kernels of their own,
where LLVM may contract a multiply and an add the forward's kernel kept apart. The bound
used is the forward error bound of a dot product of length n, n * eps * sum |terms|
(Higham, Accuracy and Stability, 3.1), taken per layer: ``_tol``.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import nn
from fusegrad.ir.graph import Graph
from fusegrad.ops.primitive import TensorType
from fusegrad.passes.partition import partition_joint
from fusegrad.utils.checkpoint import checkpoint

EPS32 = float(np.finfo(np.float32).eps)
WIDTH, DEPTH, BATCH = 64, 6, 32
PER_REGION = 2          # layers per checkpointed region


def _tol(width: int = WIDTH, depth: int = DEPTH) -> float:
    """Relative rounding bound of ``depth`` layers of length-``width`` dot products, with a
    few elementwise roundings each (tanh, the bias, the loss's square)."""
    return (width + 8) * depth * EPS32


def _mlp(dropout: float = 0.0) -> nn.Sequential:
    fg.manual_seed(0)
    layers = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
        if dropout:
            layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def _forward(model: nn.Sequential, x, checkpointed: bool):
    """The MLP on ``x``; with ``checkpointed``, each run of PER_REGION layers is a region."""
    if not checkpointed:
        return model(x)
    size = len(model) // (DEPTH // PER_REGION)
    for start in range(0, len(model), size):
        x = checkpoint(model[start:start + size], x, use_reentrant=False)
    return x


def _training_step(checkpointed: bool, dropout: float = 0.0):
    """A compiled SGD step of the MLP, checkpointed or not."""
    model = _mlp(dropout)
    opt = fg.optim.SGD(model.parameters(), lr=0.01)

    def step(x):
        opt.zero_grad()
        loss = (_forward(model, x, checkpointed) ** 2).mean()
        loss.backward()
        opt.step()
        return loss
    return model, fg.compile(step, fullgraph=True)


def _x(seed: int = 1):
    return fg.tensor(np.random.default_rng(seed).standard_normal((BATCH, WIDTH)),
                     dtype=fg.float32)


def _assert_close(got, want, tol: float) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.all(np.abs(got - want) <= tol * max(np.abs(want).max(), 1e-30)), \
        np.abs(got - want).max()


def _run_steps(checkpointed: bool, dropout: float = 0.0, n: int = 3):
    model, step = _training_step(checkpointed, dropout)
    fg.manual_seed(7)
    losses = [float(step(_x(k))) for k in range(n)]
    return losses, [p.detach().numpy().copy() for p in model.parameters()], step


def test_whole_step_gives_the_unchecked_losses_and_parameters():
    want_losses, want_params, _ = _run_steps(False)
    got_losses, got_params, _ = _run_steps(True)
    # Three steps: the parameters carry each step's rounding into the next.
    _assert_close(got_losses, want_losses, 3 * _tol())
    for g, w in zip(got_params, want_params):
        _assert_close(g, w, 3 * _tol())


def test_whole_step_recomputes_the_region_and_needs_less_memory():
    _, plain = _training_step(False)
    _, checked = _training_step(True)
    x = _x()
    p_plain, p_checked = plain.lower(x).program, checked.lower(x).program

    def matmuls(p):
        return sum(k.kind == "matmul" for k in p.kg.kernels)
    # The backward recomputes the product of each region's first layer (the last layer's
    # product feeds only the region's output, whose tanh derivative reads that output).
    regions = DEPTH // PER_REGION
    assert matmuls(p_checked) == matmuls(p_plain) + regions * (PER_REGION - 1)
    # Unchecked, the forward computes two values per layer that the backward reads (the
    # tanh, the next product's input, and 1 - tanh**2, its derivative), each BATCH x WIDTH
    # float32, all live when the backward starts. Checked, those of each region's first
    # layer are recomputed, and only one region's recomputation is live at a time.
    activation = BATCH * WIDTH * 4
    saved = p_plain.plan.arena_bytes - p_checked.plan.arena_bytes
    assert saved >= 2 * (regions - 1) * (PER_REGION - 1) * activation


def test_recomputation_runs_after_the_forward():
    # Fusion keeps a recomputed copy out of the forward's kernels (where it would be computed
    # early and held until the backward): every kernel with a copy comes after the loss.
    _, checked = _training_step(True)
    kg = checked.lower(_x()).program.kg
    loss = kg.graph.outputs[0]
    at_loss = next(i for i, k in enumerate(kg.kernels) if loss in k.outputs)
    remat = [i for i, k in enumerate(kg.kernels) if any(n.remat for n in k.nodes)]
    assert remat and min(remat) > at_loss


def test_dropout_in_the_region_draws_the_forward_mask_again():
    # A different mask in the recomputation would change the gradients by O(1), not by
    # rounding: equal losses and parameters over steps say the masks were the forward's.
    want_losses, want_params, _ = _run_steps(False, dropout=0.5)
    got_losses, got_params, step = _run_steps(True, dropout=0.5)
    _assert_close(got_losses, want_losses, 3 * _tol())
    for g, w in zip(got_params, want_params):
        _assert_close(g, w, 3 * _tol())
    # Each dropout is drawn twice from one key, in the forward and in the recomputation
    # (a region's output is its last dropout's product, whose derivative reads the mask).
    graph = step.lower(_x()).graph
    keys = [_expression(n.inputs[0]) for n in graph.nodes if n.op == "random_uniform"]
    assert len(keys) == 2 * DEPTH
    assert len(set(keys)) == DEPTH


def _expression(v) -> tuple:
    """What computes ``v``, barriers skipped: equal for a value and its recomputation."""
    node = v.producer
    if node is None:
        return ("input", v.name)
    if node.op == "stop_gradient":
        return _expression(node.inputs[0])
    if node.op == "constant":
        return ("constant", node.attrs["value"].array.tobytes())
    return (node.op, repr(sorted(node.attrs.items())),
            tuple(_expression(op) if hasattr(op, "producer") else repr(op) for op in node.inputs))


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_compiled_forward_backward_later_saves_only_the_region_boundary(dropout):
    def grads(checkpointed):
        model = _mlp(dropout)

        def f(x):
            return (_forward(model, x, checkpointed) ** 2).mean()
        compiled = fg.compile(f)
        x = _x().requires_grad_()
        fg.manual_seed(3)
        loss = compiled(x)
        loss.backward()
        entry = next(e for es in compiled.cache.values() for e in es)
        split = next(v for k, v in entry.backward.items() if k[0] == "split")
        return [float(loss), x.grad.numpy()] + [p.grad.numpy() for p in model.parameters()], \
            split.partition

    want, plain = grads(False)
    got, checked = grads(True)
    for g, w in zip(got, want):
        _assert_close(g, w, _tol())
    # Unchecked the forward hands each layer's activations to the backward; checked only
    # each region's output (its last tanh, or its last dropout's product) crosses over,
    # beside inputs and parameters, and the backward recomputes the regions' first layers.
    residuals = [s for s in checked.saved if s.kind == "residual"]
    assert len(residuals) == DEPTH // PER_REGION
    assert all(s.type.shape == (BATCH, WIDTH) for s in residuals)
    assert checked.residual_bytes < plain.residual_bytes
    # Every layer's product but each region's last, whose tanh is the output; with dropout,
    # that tanh is inside too (the output is the dropout's product).
    recomputed = PER_REGION if dropout else PER_REGION - 1
    assert checked.recomputed_ops.count("matmul") == DEPTH // PER_REGION * recomputed


def _region_graph(marked: bool) -> Graph:
    """out = sum(tanh(tanh(x @ w1) @ w2)), the two layers one checkpointed region."""
    f32 = fg.float32
    g = Graph("two_layers")
    x = g.add_input("x", TensorType((8, 16), f32))
    w1 = g.add_input("w1", TensorType((16, 16), f32))
    w2 = g.add_input("w2", TensorType((16, 16), f32))
    h = g.add_node("tanh", [g.add_node("matmul", [x, w1])])
    y = g.add_node("tanh", [g.add_node("matmul", [h, w2])])
    if marked:
        for node in g.nodes:
            node.region = 0
    g.set_outputs([g.add_node("sum", [y], {"axes": (0, 1)})])
    return g


@pytest.mark.parametrize("policy", ["min_cut", "save_all"])
def test_partition_saves_no_value_inside_a_region(policy):
    plain = partition_joint(_region_graph(False), wrt=[1, 2], policy=policy)
    checked = partition_joint(_region_graph(True), wrt=[1, 2], policy=policy)
    # Unchecked: a value of each layer crosses over; checked: one of the region's output
    # (the output or its tanh derivative), and the backward recomputes the first layer
    # from x and w1.
    assert [s.type.shape for s in plain.saved if s.kind == "residual"] == [(8, 16)] * 2
    assert [s.type.shape for s in checked.saved if s.kind == "residual"] == [(8, 16)]
    assert {s.name for s in checked.saved if s.kind == "input"} == {"x", "w1", "w2"}
    assert checked.recomputed_ops.count("matmul") == 1
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((8, 16), (16, 16), (16, 16))]
    from fusegrad.ir.interpreter import interpret
    for p in (plain, checked):
        fwd = interpret(p.forward, *args)
        p.result = interpret(p.backward, *fwd[p.n_forward_outputs:], np.float32(1.0))
    for a, b in zip(plain.result, checked.result):
        np.testing.assert_array_equal(a, b)     # the interpreter runs the same numpy ops


def _small_layers():
    fg.manual_seed(0)
    return (nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh()),
            nn.Sequential(nn.Linear(8, 8), nn.Tanh()))


def test_a_nested_region_is_part_of_the_outer_one():
    a, b = _small_layers()

    def f(x):
        y = checkpoint(lambda h: checkpoint(b, a(h), use_reentrant=False), x,
                       use_reentrant=False)
        return (y * y).sum()
    x = fg.randn(4, 8, requires_grad=True)
    want = fg.autograd.grad((b(a(x)) ** 2).sum(), [x, *a.parameters(), *b.parameters()])
    got = fg.autograd.grad(fg.compile(f)(x), [x, *a.parameters(), *b.parameters()])
    for g, w in zip(got, want):
        _assert_close(g.numpy(), w.numpy(), _tol(8, 3))
    graph = fg.compile(f, pipeline="").lower(x).graph
    assert len({n.region for n in graph.nodes if n.region is not None}) == 1


def test_a_differentiated_backward_keeps_the_activations():
    # With create_graph=True the backward is differentiated again: a recomputation behind
    # barriers would cut the second derivative off, so the region is not recomputed there.
    a, _ = _small_layers()

    def gradient_norm(x):
        loss = (checkpoint(a, x, use_reentrant=False) ** 2).sum()
        (g,) = fg.autograd.grad(loss, [x], create_graph=True)
        return (g ** 2).sum()
    x = fg.randn(4, 8, requires_grad=True)
    want = fg.autograd.grad(gradient_norm(x), [x])[0]
    got = fg.autograd.grad(fg.compile(gradient_norm)(x), [x])[0]
    _assert_close(got.numpy(), want.numpy(), _tol(8, 4))
