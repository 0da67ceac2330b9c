"""Kernels of their own for extern primitives on the GPU: the fused attention (forward and
backward) and ``index_add`` (an embedding's gradient). A CUDA program runs them on the device
(the simulated driver interprets their kernel IR) instead of as host steps, so a transformer's
training step replays as one CUDA graph. Each matches its primitive's numpy reference."""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.ops.fused_attention import fused_attention, fused_attention_backward
from fusegrad.ops.primitive import bind
from fusegrad.ops.prims_index import index_add
from fusegrad.runtime import cuda as rt
from fusegrad.runtime.cuda import CudaProgram
from fusegrad.testing.simulated_cuda import SimulatedDriver
from fusegrad.tracer import eager_cuda
from tests.codegen.test_gpu_lowering import kernel_graph


def run_on_device(fn, arrays):
    """``fn`` traced over ``arrays``, run as a CUDA program on the simulated driver: its
    outputs and the families of the kernels it launched (host steps launch none)."""
    kg = kernel_graph(fn, [fg.tensor(a) for a in arrays])
    prog = CudaProgram(kg, SimulatedDriver())
    assert not prog.host_steps, prog.host_steps
    return [o.to_host() for o in prog(*arrays)], [lk.family for lk in prog.lowered.values()]


def attention_inputs(dtype, shape=(2, 3, 5, 4), mask_shape=None, dead_row=False, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v, dout = (rng.standard_normal(shape).astype(dtype) for _ in range(4))
    mask = None
    if mask_shape is not None:
        mask = rng.random(mask_shape) < 0.6
        if dead_row:
            mask[..., 1, :] = False         # with keep=True: a row that attends to nothing
    return q, k, v, dout, mask


def tol(dtype) -> dict:
    # float32: dot products of at most 5 terms, an exp and a division: a few ulps of the
    # largest magnitudes (|scores| < 10) of a float32; float64 likewise of a float64.
    eps = np.finfo(dtype).eps
    return {"rtol": 64 * eps, "atol": 64 * eps}


CASES = {   # name: (keep, zero_dead, mask shape, dead row)
    "no_mask": (False, False, None, False),
    "masked_fill": (False, False, (5, 5), False),            # masked_fill(mask, -inf)
    "sdpa_mask_broadcast": (True, True, (3, 1, 5), False),   # broadcast over batch and keys
    "sdpa_dead_row": (True, True, (2, 3, 5, 5), True),       # a row of zeros
    "softmax_dead_row": (True, False, (2, 3, 5, 5), True),   # a row of NaN
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_attention_forward_and_backward_match_the_reference(case, dtype):
    keep, zero_dead, mask_shape, dead = CASES[case]
    q, k, v, dout, mask = attention_inputs(dtype, mask_shape=mask_shape, dead_row=dead)
    masks = () if mask is None else (mask,)
    attrs = {"scale": 1 / math.sqrt(q.shape[-1]), "keep": keep}
    packed_want = fused_attention.impl(q, k, v, *masks, zero_dead=zero_dead, **attrs)

    def forward(q, k, v, *mask):
        return bind(fused_attention, q, k, v, *mask, zero_dead=zero_dead, **attrs)
    (packed,), families = run_on_device(forward, (q, k, v) + masks)
    assert families == ["attention"]
    np.testing.assert_allclose(packed, packed_want, **tol(dtype))
    if dead and not zero_dead:
        assert np.isnan(packed[..., 1, :]).all()

    def backward(q, k, v, packed, dout, *mask):
        return bind(fused_attention_backward, q, k, v, packed, dout, *mask, **attrs)
    grads_want = fused_attention_backward.impl(q, k, v, packed_want, dout, *masks, **attrs)
    (grads,), families = run_on_device(backward, (q, k, v, packed_want, dout) + masks)
    assert families == ["attention_backward"]
    np.testing.assert_allclose(grads, grads_want, **tol(dtype))


def test_fused_attention_reads_strided_heads():
    # q, k and v as the heads of a (B, L, H, E) array, transposed: strided views.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 2, 6, 3, 4)).astype(np.float32)     # (qkv, B, L, H, E)
    attrs = {"scale": 0.5, "keep": False, "zero_dead": False}

    def forward(x):
        q, k, v = (x[i].transpose(1, 2) for i in range(3))
        return bind(fused_attention, q, k, v, **attrs)
    (packed,), _ = run_on_device(forward, (x,))
    q, k, v = (np.swapaxes(x[i], 1, 2) for i in range(3))
    np.testing.assert_allclose(packed, fused_attention.impl(q, k, v, **attrs), **tol(np.float32))


@pytest.mark.parametrize("dtype,axis", [(np.float32, 0), (np.float64, 1), (np.int64, 0),
                                        (np.float16, 0)])
def test_index_add_adds_in_index_order(dtype, axis):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 4)).astype(dtype) if dtype != np.int64 else \
        rng.integers(-9, 9, (5, 4))
    idx = np.array([[3, -1], [0, 3], [4, 3]]) if axis == 0 else np.array([2, 0, 2, -4, 1])
    shape = (3, 2, 4) if axis == 0 else (5, 5)
    src = (rng.standard_normal(shape) * 100).astype(dtype) if dtype != np.int64 else \
        rng.integers(-9, 9, shape)
    (got,), families = run_on_device(lambda x, i, s: bind(index_add, x, i, s, axis=axis),
                                     (x, idx, src))
    assert families == ["index_add"]
    # The reference adds repeated indices one after another, rounding each sum: so does the
    # kernel, exactly.
    np.testing.assert_array_equal(got, index_add.impl(x, idx, src, axis=axis))


def char_transformer_step(device_driver, mode):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from char_transformer import TEXT, batches, make_model
    fg.manual_seed(0)
    model = make_model(fg, len(set(TEXT)), block=8, n_embd=16, n_head=2, n_layer=1)
    # SGD: Adam would move a parameter whose gradient is rounding noise by a good part of the
    # learning rate, in a direction rounding picks (tests/drift.py).
    opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    backend = "cuda" if device_driver is not None else "llvm"

    @fg.compile(backend=backend, mode=mode)
    def step(x, y):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss
    x, y = next(batches(fg, TEXT, 8, 2))
    losses = [step(x, y).item() for _ in range(4)]
    return losses, [p.detach().numpy() for p in model.parameters()]


@pytest.mark.slow
def test_the_char_transformer_step_replays_as_one_cuda_graph():
    drv = SimulatedDriver()
    rt.set_driver(drv)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")        # no "skipping cudagraphs"
            losses, params = char_transformer_step(drv, "reduce-overhead")
    finally:
        eager_cuda.clear_cache()
        rt.set_driver(None)
    # The first step (SGD making its momentum buffers) is a program of its own; the second runs and
    # captures the graph of the steps after it, and the last two replay it.
    assert drv.graph_launches == 2
    names = [name for name, _, _ in drv.launches]
    assert any("attention_fused_attention" in n for n in names)
    assert any("attention_backward" in n for n in names)
    assert any("index_add" in n for n in names)
    cpu_losses, cpu_params = char_transformer_step(None, None)
    # Four steps of float32 arithmetic summed in other orders (dot products of 16 terms at
    # most, losses near 4, parameters below 1): the CPU run's and the device's agree to about
    # a hundred float32 ulps.
    np.testing.assert_allclose(losses, cpu_losses, rtol=100 * np.finfo(np.float32).eps)
    for p, c in zip(params, cpu_params):
        np.testing.assert_allclose(p, c, rtol=0, atol=100 * np.finfo(np.float32).eps)
