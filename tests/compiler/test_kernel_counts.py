"""How many kernels programs become: the fusion rules of fusegrad.passes.fusion, pinned.

Like tinygrad's schedule tests: each case asserts ``len(f.lower(*args).kernels)`` and that
the compiled result equals eager. A count going up means a fusion rule stopped applying
(often because an op started emitting an extra cast or reshape); look at the kernels
listed in the failure message.
"""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as NF
from fusegrad.runtime.cpu import NumpyStep
from tests.compiler.compare import assert_same, check_compiled, numpy_steps, values


def kernels_of(fn, *args, **compile_options) -> list[str]:
    """The kernels ``fn(*args)`` compiles to, after checking the result against eager (to
    float32 accuracy: a fused kernel rounds differently, and BLAS sums in its own order)."""
    compiled = check_compiled(fn, *args, rtol=1e-5, atol=1e-5, **compile_options)
    lowered = compiled.lower(*[fg.from_numpy(a) if isinstance(a, np.ndarray) else a
                               for a in args])
    assert not [s for s in lowered.program.steps if isinstance(s, NumpyStep)], lowered.kernels
    return lowered.kernels


def f32(*shape, seed=0, special=False):
    return values(shape, fg.float32, seed, special=special)


def hand_softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def diamond(a, b, c, d):
    ab = a + b
    return (ab + c) * (ab + d)


CASES = {
    # name: (function, arguments, kernels)
    "gelu_tanh_of_affine": (lambda x, a, b: NF.gelu(x * a + b, approximate="tanh"),
                            (f32(8, 64), f32(64, seed=1), f32(64, seed=2)), 1),
    "gelu_erf_of_affine": (lambda x, a, b: NF.gelu(x * a + b),
                           (f32(8, 64), f32(64, seed=1), f32(64, seed=2)), 1),
    "diamond": (diamond, (f32(8, 64), f32(8, 64, seed=1), f32(8, 64, seed=2),
                          f32(8, 64, seed=3)), 1),
    "sum_then_relu": (lambda a, b: (a * b).sum().relu(), (f32(8, 64), f32(8, 64, seed=1)), 1),
    "softmax_last_axis": (lambda x: NF.softmax(x, -1), (f32(8, 64, special=True),), 1),
    "hand_written_softmax": (hand_softmax, (f32(8, 64, special=True),), 1),
    "log_softmax_last_axis": (lambda x: NF.log_softmax(x, -1), (f32(8, 64),), 1),
    "layer_norm": (lambda x, w, b: NF.layer_norm(x, (64,), w, b),
                   (f32(8, 64), f32(64, seed=1), f32(64, seed=2)), 1),
    # stop_gradient of a transposed view is the view: no copy kernel before the matmul
    "detached_transpose_into_matmul": (lambda x, w: x.t().detach() @ w,
                                       (f32(32, 8), f32(32, 16, seed=1)), 1),
    "detached_head_split_into_matmul": (
        lambda q, k: q.reshape(2, 8, 4, 4).permute(0, 2, 1, 3).detach() @ k,
        (f32(2, 8, 16), f32(2, 4, 4, 8, seed=1)), 1),
    # a convolution's bias and activation (and a residual) join its matmul as the epilogue,
    # through the reshape from the product's (N, 1, C, H*W) to (N, C, H, W): pad, the
    # window gather and the matmul
    "conv_bias_relu": (lambda x, w, b: NF.relu(NF.conv2d(x, w, b, padding=1)),
                       (f32(2, 3, 8, 8), f32(4, 3, 3, 3, seed=1), f32(4, seed=2)), 3),
    "conv_residual_gelu": (lambda x, w, r: NF.gelu(NF.conv2d(x, w, padding=1) + r),
                           (f32(2, 3, 8, 8), f32(4, 3, 3, 3, seed=1), f32(2, 4, 8, 8, seed=2)),
                           3),
    "relu_of_linear": (lambda x, w, b: (x @ w + b).relu(),
                       (f32(8, 32), f32(32, 64, seed=1), f32(64, seed=2)), 1),
    "nn_linear_relu": (lambda x, w, b: NF.relu(NF.linear(x, w, b)),
                       (f32(8, 32), f32(64, 32, seed=1), f32(64, seed=2)), 1),
    "mean_of_squares": (lambda x: (x * x).mean(-1), (f32(8, 64),), 1),
    "optimizer_like_siblings": (lambda w, g, m: (w - 0.1 * g, 0.9 * m + g),
                                (f32(8, 64), f32(8, 64, seed=1), f32(8, 64, seed=2)), 1),
    "view_of_input_is_free": (lambda x: x.t() * 2 + x.t(), (f32(16, 8),), 1),
    # an optimizer's decay of its state (m * beta1) joins the epilogue of the product that
    # computes the gradient, beside the update it feeds
    "state_decay_into_matmul_epilogue": (
        lambda a, b, m: m * 0.9 + (a.t() @ b) * 0.1,
        (f32(32, 8), f32(32, 16, seed=1), f32(8, 16, seed=2)), 1),
    # ... but not an elementwise value the product itself reads: it runs before the product
    "product_operand_not_in_its_epilogue": (
        lambda x, w: (x * 2) @ w + (x * 2),
        (f32(16, 16), f32(16, 16, seed=1)), 2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_count(name):
    fn, args, want = CASES[name]
    kernels = kernels_of(fn, *args)
    assert len(kernels) == want, f"{name}: {kernels}"


def test_mlp_module_is_three_kernels():
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 10))
    x = fg.from_numpy(f32(8, 32))
    compiled = fg.compile(model)
    with fg.no_grad():
        assert_same(compiled(x), model(x), atol=1e-5)
    kernels = compiled.lower(x).kernels
    assert len(kernels) == 3, kernels
    assert all(k.startswith(f"k{i}[matmul") for i, k in enumerate(kernels)), kernels


def test_softmax_kernel_is_one_reduction_over_rows():
    (kernel,) = kernels_of(lambda x: NF.softmax(x, -1), f32(8, 64))
    assert kernel.startswith("k0[reduction 8x64]"), kernel


def test_reduction_of_a_broadcast_value_is_not_recomputed_per_element():
    # A row value broadcast back over its row stays in registers (one kernel), where an
    # implicit broadcast of a full computed value would be materialized by its own kernel.
    kernels = kernels_of(lambda x, y: (x - x.sum(1, keepdim=True)) * y, f32(8, 64),
                         f32(8, 64, seed=1))
    assert len(kernels) == 1, kernels


def test_consumers_of_pad_and_concat_fuse_into_them():
    kernels = kernels_of(lambda x: NF.pad(x, (1, 1)) * 2 + 1, f32(8, 6))
    assert len(kernels) == 1, kernels
    kernels = kernels_of(lambda x, y: fg.cat([x, y], 1).relu(), f32(8, 6), f32(8, 3))
    assert len(kernels) == 1, kernels


def test_max_inputs_bounds_the_buffers_a_kernel_reads():
    from fusegrad.passes.fusion import fuse

    g = fg.trace(lambda a, b, c, d: ((a + b) + c) + d, *[fg.randn(8) for _ in range(4)])
    assert len(fuse(g).kernels) == 1
    split = fuse(g, max_inputs=2)
    assert len(split.kernels) == 3
    assert all(len(k.inputs) <= 2 for k in split.kernels)


def test_cross_entropy_picks_the_target_inside_the_log_softmax_kernels():
    # The target's log-probability is a masked sum over the classes (an iota compared with
    # the target), which joins the log_softmax's reduction; its gradient is a select that
    # joins the backward's. Only the target check stays a numpy step: no gather, no
    # scatter_add. Values against eager (which gathers), with an ignored target and a class
    # at -inf (a masked logit: where() must not let its -inf or a NaN gradient through).
    logits = f32(6, 5, seed=3)
    logits[1, 2] = -np.inf
    target = np.array([4, 0, -100, 1, 3, 2])

    def loss_and_grad(x, t):
        x = x.detach().requires_grad_()
        loss = NF.cross_entropy(x, t)
        loss.backward()
        return loss, x.grad

    with fg.enable_grad():
        want = loss_and_grad(fg.from_numpy(logits), fg.from_numpy(target))
        compiled = fg.compile(loss_and_grad, fullgraph=True)
        got = compiled(fg.from_numpy(logits), fg.from_numpy(target))
    assert_same(got, want, rtol=1e-6, atol=1e-7)
    assert np.isfinite(got[1].numpy()).all()
    kernels = compiled.lower(fg.from_numpy(logits), fg.from_numpy(target)).kernels
    ops = ",".join(kernels)
    assert "gather" not in ops and "scatter" not in ops and "iota" in ops, kernels
    steps = numpy_steps(compiled, logits, target)
    assert len(steps) == 1 and "check_target" in steps[0], steps


def test_embedding_lookup_is_loaded_inside_its_consumers_kernel():
    # The rows are loaded at the (checked) indices inside the kernel of what consumes them
    # (here the position add and a layer_norm); positions by arange are a slice of the
    # table. The check stays a numpy step and runs first: an index out of range raises
    # before any load.
    fg.manual_seed(0)
    tok, pos = nn.Embedding(50, 16), nn.Embedding(8, 16)
    ln = nn.LayerNorm(16)

    def embed(idx):
        return ln(tok(idx) + pos(fg.arange(idx.shape[1])))

    idx = fg.tensor(np.random.default_rng(0).integers(0, 50, (4, 8)))
    with fg.no_grad():
        want = embed(idx)
        compiled = fg.compile(embed, fullgraph=True)
        got = compiled(idx)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    steps = numpy_steps(compiled, idx)
    assert len(steps) == 1 and "check_index" in steps[0], steps
    kernels = compiled.lower(idx).kernels
    assert any("take" in k and "reduction" in k for k in kernels), kernels
    bad = idx.clone()
    bad[2, 3] = 50
    with fg.no_grad(), pytest.raises(IndexError, match="index 50 is out of bounds"):
        compiled(bad)


def test_take_of_unchecked_indices_stays_a_numpy_step():
    # x[idx] wraps negative indices and raises for others out of range: its numpy
    # reference does both, so it is not loaded in a kernel.
    x = fg.from_numpy(f32(6, 3))
    idx = fg.tensor([0, -1, 2, -6])
    compiled = check_compiled(lambda x, i: x[i] * 2, x, idx)
    assert any("take" in s for s in numpy_steps(compiled, x, idx))
    with pytest.raises(IndexError):
        compiled(x, fg.tensor([0, 6]))
