"""The attention fusion (fusegrad.passes.attention): its primitives' native code against their
numpy references, where the rewrite applies and where it must not, and compiled training
steps with fused attention against eager ones."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.ir import Graph, TensorType
from fusegrad.ops import fused_attention as FA
from fusegrad.passes.simplify import simplify
from fusegrad.runtime import native_attention as NA


def _heads(rng, shape, dtype, layout="qkv"):
    """q, k, v of ``shape`` (B, H, L, E): views of one (B, L, 3, H, E) buffer as a transformer
    makes them, or separate contiguous arrays."""
    B, H, L, E = shape
    if layout == "qkv":
        qkv = rng.standard_normal((B, L, 3, H, E)).astype(dtype)
        return [qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]
    return [rng.standard_normal(shape).astype(dtype) for _ in range(3)]


def _mask(rng, kind, B, L):
    if kind is None:
        return None
    if kind == "causal":
        return ~np.tril(np.ones((L, L), dtype=bool))[None, None]
    m = rng.random((B, 1, L, L)) < 0.4
    m[:, :, 0] = True                # a row that is all masked
    return m


def _native(q, k, v, mask, dout, *, scale, keep, zero_dead):
    L, E = q.shape[-2:]
    packed = np.full(q.shape[:-1] + (E + L,), np.nan, q.dtype)
    assert NA.attention_forward(packed, q, k, v, mask, scale=scale, keep=keep,
                                zero_dead=zero_dead)
    grads = np.full((3,) + q.shape, np.nan, q.dtype)
    assert NA.attention_backward(grads, q, k, v, dout, packed, mask, scale=scale, keep=keep)
    return packed, grads


# (Each case builds its attention kernels cold, 2-6 s: float64 and the flags' variants run
# in `make test` only, marked slow; they do not depend on the machine profile.)
@pytest.mark.parametrize("dtype", [np.float32, pytest.param(np.float64, marks=pytest.mark.slow)])
@pytest.mark.parametrize("shape", [(2, 4, 32, 16), (2, 3, 5, 7), (1, 1, 1, 1), (3, 2, 33, 8)])
@pytest.mark.parametrize("mask", [None, "causal", "random"])
@pytest.mark.parametrize("keep,zero_dead", [(False, False),
                                            pytest.param(True, True, marks=pytest.mark.slow),
                                            pytest.param(False, True, marks=pytest.mark.slow)])
def test_native_code_matches_the_numpy_reference(dtype, shape, mask, keep, zero_dead):
    rng = np.random.default_rng(sum(shape))
    q, k, v = _heads(rng, shape, dtype)
    m = _mask(rng, mask, shape[0], shape[2])
    if m is not None and keep:
        m = ~m
    dout = rng.standard_normal(shape).astype(dtype)
    packed, grads = _native(q, k, v, m, dout, scale=0.3, keep=keep, zero_dead=zero_dead)
    ms = () if m is None else (m,)
    want = FA._forward_impl(q, k, v, *ms, scale=0.3, keep=keep, zero_dead=zero_dead)
    tol = 3e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(packed, want, rtol=tol, atol=tol)
    want_grads = FA._backward_impl(q, k, v, want, dout, *ms, scale=0.3, keep=keep)
    np.testing.assert_allclose(grads, want_grads, rtol=10 * tol, atol=10 * tol)
    if m is not None and mask == "random":
        # the all-masked row: zeros (sdpa's rule) or NaN (softmax's 0/0)
        dead = packed[:, :, 0]
        assert np.all(dead == 0) if zero_dead else np.all(np.isnan(dead))


def test_native_code_matches_a_float64_computation():
    """Against the math in float64, not the reference's float32 operations."""
    rng = np.random.default_rng(5)
    q, k, v = _heads(rng, (2, 2, 16, 8), np.float32)
    m = _mask(rng, "causal", 2, 16)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    packed, grads = _native(q, k, v, m, dout, scale=0.25, keep=False, zero_dead=False)
    q64, k64, v64, d64 = (a.astype(np.float64) for a in (q, k, v, dout))
    s = np.where(m, -np.inf, q64 @ k64.transpose(0, 1, 3, 2) * 0.25)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(packed[..., :8], p @ v64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(packed[..., 8:], p, rtol=1e-5, atol=1e-7)
    dp = d64 @ v64.transpose(0, 1, 3, 2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True)) * 0.25
    want = [ds @ k64, ds.transpose(0, 1, 3, 2) @ q64, p.transpose(0, 1, 3, 2) @ d64]
    for got, w in zip(grads, want):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-6)


def _float64_attention(q, k, v, m, dout, scale, keep):
    q, k, v, dout = (a.astype(np.float64) for a in (q, k, v, dout))
    s = q @ np.swapaxes(k, -1, -2) * scale
    if m is not None:
        s = np.where(m == keep, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = dout @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True)) * scale
    return p @ v, p, [ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ dout]


@pytest.mark.slow          # (builds the kernels for every length: seconds of LLVM each)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask,keep", [(None, False), ("causal", False), ("causal", True)])
def test_one_kernel_takes_every_sequence_length(dtype, mask, keep):
    """The number of keys is read at run time: lengths of one row width (L = 8, 16, ...),
    between two (lanes past the keys), of one key and of the most keys run the one forward
    and one backward kernel of their feature count, each within rounding of the float64
    math, writing nothing past the packed result."""
    rng = np.random.default_rng(7)
    E = 8
    built = NA._compiled.cache_info().currsize
    for L in (1, 3, 8, 9, 20, 31, 64, 100, NA.MAX_KEYS):
        q, k, v = _heads(rng, (2, 3, L, E), dtype)
        m = _mask(rng, mask, 2, L)
        if m is not None and keep:
            m = ~m
        dout = rng.standard_normal(q.shape).astype(dtype)
        # The packed result with a sentinel after it.
        n = q.size // E * (E + L)
        room = np.full(n + 64, 7.0, dtype)
        packed = room[:n].reshape(q.shape[:-1] + (E + L,))
        assert NA.attention_forward(packed, q, k, v, m, scale=0.3, keep=keep, zero_dead=False)
        assert np.all(room[n:] == 7.0)
        grads = np.full((3,) + q.shape, np.nan, dtype)
        assert NA.attention_backward(grads, q, k, v, dout, packed, m, scale=0.3, keep=keep)
        # A static length's kernel (its row width's bodies only) computes the same bits.
        alone = np.empty_like(packed)
        assert NA.attention_forward(alone, q, k, v, m, scale=0.3, keep=keep, zero_dead=False,
                                    every_length=False)
        np.testing.assert_array_equal(alone, packed)
        out, p, want = _float64_attention(q, k, v, m, dout, 0.3, keep)
        # sums of E products for a score, L terms for a row's sum and each product
        tol = 16 * np.finfo(dtype).eps * (E + L)
        np.testing.assert_allclose(packed[..., :E], out, rtol=tol, atol=tol, err_msg=str(L))
        np.testing.assert_allclose(packed[..., E:], p, rtol=tol, atol=tol, err_msg=str(L))
        for got, w in zip(grads, want):
            np.testing.assert_allclose(got, w, rtol=4 * tol, atol=4 * tol, err_msg=str(L))
    # one forward and one backward kernel for every length (none if an earlier test built
    # them), and a forward per row width
    assert NA._compiled.cache_info().currsize - built <= 2 + 5


@pytest.mark.parametrize("shape", [(7, 5), (3, 7, 5), (2, 3, 2, 7, 5)])
def test_native_code_takes_any_number_of_batch_dimensions(shape):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    q = np.swapaxes(np.swapaxes(q, -1, -2).copy(), -1, -2)      # same values, other strides
    m = rng.random(shape[:-2] + (7, 7)) < 0.3
    dout = rng.standard_normal(shape).astype(np.float32)
    packed, grads = _native(q, k, v, m, dout, scale=0.5, keep=False, zero_dead=True)
    want = FA._forward_impl(q, k, v, m, scale=0.5, keep=False, zero_dead=True)
    np.testing.assert_allclose(packed, want, rtol=3e-6, atol=3e-6)
    np.testing.assert_allclose(
        grads, FA._backward_impl(q, k, v, want, dout, m, scale=0.5, keep=False),
        rtol=3e-5, atol=3e-5)

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask", ["causal", "random"])
@pytest.mark.parametrize("zero_dead", [False, True])
def test_skipped_masked_terms_keep_the_non_finite_values_of_a_full_sum(dtype, mask, zero_dead):
    """The products skip keys and queries whose weights the mask makes 0, yet 0 * inf and
    0 * NaN are NaN: an inf or NaN at a masked position must reach the same outputs as the
    reference's full products. Also a row of NaN weights (a NaN query) and all-masked rows."""
    rng = np.random.default_rng(11)
    L, E = 16, 8
    q, k, v = _heads(rng, (2, 2, L, E), dtype)
    dout = rng.standard_normal(q.shape).astype(dtype)
    m = _mask(rng, mask, 2, L)
    v[0, 0, L - 1, 3] = np.inf          # only the last query sees this key under causal
    v[1, 1, 9, 0] = np.nan
    k[0, 1, 12, 2] = -np.inf
    q[1, 0, 4, 5] = np.nan              # a row of NaN weights, masked ones included
    q[0, 0, 2, 1] = np.inf
    dout[1, 1, 6, 7] = np.nan
    dout[0, 1, 0, 0] = np.inf
    packed, grads = _native(q, k, v, m, dout, scale=0.3, keep=False, zero_dead=zero_dead)
    want = FA._forward_impl(q, k, v, m, scale=0.3, keep=False, zero_dead=zero_dead)
    tol = 3e-6 if dtype == np.float32 else 1e-13
    with np.errstate(invalid="ignore"):
        want_grads = FA._backward_impl(q, k, v, want, dout, m, scale=0.3, keep=False)
    for got, ref in [(packed, want), (grads, want_grads)]:
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
        np.testing.assert_allclose(got, ref, rtol=10 * tol, atol=10 * tol)



def test_native_code_declines_what_it_does_not_take():
    rng = np.random.default_rng(2)
    for shape, dtype in [((1, 1, 200, 4), np.float32), ((1, 1, 8, 200), np.float32),
                         ((1, 1, 8, 4), np.float16)]:
        q, k, v = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
        L, E = shape[-2:]
        out = np.zeros(shape[:-1] + (E + L,), dtype)
        assert not NA.attention_forward(out, q, k, v, None, scale=1.0, keep=False,
                                        zero_dead=False)
        assert not out.any()
    q, k, v = (rng.standard_normal((2, 4, 8)).astype(np.float32) for _ in range(3))
    assert not NA.attention_forward(np.zeros((2, 4, 12), np.float32), q, k[:, :3], v, None,
                                    scale=1.0, keep=False, zero_dead=False)


def test_a_strided_last_axis_is_copied_and_never_reused():
    """Operands whose rows are not contiguous are copied for the call; a later call with new
    values in the same buffer must see them (the prepared call is not cached then)."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal((2, 8, 6)).astype(np.float32)
    q = base.transpose(0, 2, 1)                          # (2, 6, 8), columns strided
    k, v = (rng.standard_normal((2, 6, 8)).astype(np.float32) for _ in range(2))
    for _ in range(2):
        out = np.empty((2, 6, 14), np.float32)
        assert NA.attention_forward(out, q, k, v, None, scale=0.5, keep=False,
                                    zero_dead=False)
        np.testing.assert_allclose(out, FA._forward_impl(q, k, v, scale=0.5, keep=False,
                                                         zero_dead=False), rtol=3e-6,
                                   atol=3e-6)
        base *= 2


def test_threads_split_the_heads_with_the_same_bits():
    rng = np.random.default_rng(4)
    q, k, v = _heads(rng, (8, 4, 32, 16), np.float32)
    m = _mask(rng, "causal", 8, 32)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    before = fg.config.num_threads
    try:
        fg.config.num_threads = 1
        one = _native(q, k, v, m, dout, scale=0.25, keep=False, zero_dead=False)
        fg.config.num_threads = 3
        three = _native(q, k, v, m, dout, scale=0.25, keep=False, zero_dead=False)
    finally:
        fg.config.num_threads = before
    for a, b in zip(one, three):
        np.testing.assert_array_equal(a, b)


def test_slice_of_a_pad_is_the_pad_input():
    g = Graph("g")
    x = g.add_input("x", TensorType((2, 3), fg.float32))
    p = g.add_node("pad", [x], {"widths": ((0, 0), (1, 4)), "value": 0.0})
    inner = g.add_node("slice", [p], {"starts": (0, 1), "stops": (2, 4), "steps": (1, 1)})
    other = g.add_node("slice", [p], {"starts": (0, 0), "stops": (2, 3), "steps": (1, 1)})
    g.set_outputs([inner, other])
    s = simplify(g)
    assert s.outputs[0] is s.inputs[0]
    assert s.outputs[1] is not s.inputs[0]


# --------------------------------------------------------------------------- the rewrite


class Block(fg.nn.Module):
    """A causal self-attention layer written as a PyTorch user writes it."""

    def __init__(self, C=16, H=2, T=8, style="masked_fill"):
        super().__init__()
        self.H, self.style = H, style
        self.qkv = fg.nn.Linear(C, 3 * C)
        self.out = fg.nn.Linear(C, C)
        self.register_buffer("mask", fg.tril(fg.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        if self.style == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.style == "sdpa_mask":
            keep = fg.rand(B, 1, T, T) < 0.6
            keep[:, :, 0] = False                        # a query that sees no key: zeros
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.H))
            if self.style == "masked_fill":
                att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
            elif self.style == "float_mask":
                att = att + (self.mask[:, :, :T, :T] - 1) * 1e9
            att = F.softmax(att, dim=-1)
            if self.style == "dropout":
                att = F.dropout(att, 0.1, training=True)
            self.weights = att
            y = att @ v
        return self.out(y.transpose(1, 2).contiguous().view(B, T, C))


def _step_results(style, compiled, dtype=fg.float32, steps=3, seed=0):
    fg.manual_seed(seed)
    model = Block(style=style).to(dtype)
    opt = fg.optim.SGD(model.parameters(), lr=0.1)
    x = fg.randn(4, 8, 16, dtype=dtype)

    def step(x):
        opt.zero_grad()
        loss = (model(x) ** 2).mean()
        loss.backward()
        opt.step()
        return loss
    f = fg.compile(step, fullgraph=True) if compiled else step
    losses = []
    for _ in range(steps):
        fg.manual_seed(seed + 1)       # the same dropout and random masks in both runs
        losses.append(float(f(x)))
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    return losses, grads, [p.detach().numpy().copy() for p in model.parameters()], f


def _ops(f) -> set[str]:
    return {n.op for n in f.entries()[-1].graph.nodes}


@pytest.mark.parametrize("style", ["masked_fill", "none", "sdpa", "sdpa_mask"])
@pytest.mark.parametrize("dtype", [fg.float32, fg.float64])
def test_compiled_training_step_fuses_attention_and_matches_eager(style, dtype):
    le, ge, pe, _ = _step_results(style, False, dtype)
    lc, gc, pc, f = _step_results(style, True, dtype)
    assert "fused_attention" in _ops(f) and "fused_attention_backward" in _ops(f)
    # the attention's own products are gone: what is left are the projections'
    assert sum(n.op == "matmul" for n in f.entries()[-1].graph.nodes) == 6
    tol = 2e-5 if dtype == fg.float32 else 1e-12
    np.testing.assert_allclose(lc, le, rtol=tol)
    for a, b in zip(gc + pc, ge + pe):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())


@pytest.mark.parametrize("style", ["float_mask", "dropout"])
def test_attention_the_fusion_does_not_take_is_left_as_written(style):
    le, ge, pe, _ = _step_results(style, False)
    lc, gc, pc, f = _step_results(style, True)
    assert "fused_attention" not in _ops(f)
    np.testing.assert_allclose(lc, le, rtol=2e-5)
    for a, b in zip(gc + pc, ge + pe):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5 * np.abs(b).max())


def test_weights_read_elsewhere_keep_their_chain_and_gradient():
    """The weights also enter the loss: they are computed by the chain as written, and the
    gradient through them adds to the fused attention's."""
    def run(compiled):
        fg.manual_seed(0)
        model = Block()
        x = fg.randn(4, 8, 16)

        def f(x):
            y = model(x)
            loss = (y ** 2).mean() + (model.weights ** 2).sum()
            loss.backward()
            return loss
        g = fg.compile(f, fullgraph=True) if compiled else f
        loss = float(g(x))
        return loss, [p.grad.numpy().copy() for p in model.parameters()], g
    le, ge, _ = run(False)
    lc, gc, g = run(True)
    assert "fused_attention" in _ops(g)
    np.testing.assert_allclose(lc, le, rtol=2e-5)
    for a, b in zip(gc, ge):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5 * np.abs(b).max())


@pytest.mark.parametrize("style", ["masked_fill", "sdpa"])
def test_a_compiled_model_with_eager_backward_fuses_its_attention(style):
    """``fg.compile(model)``, ``loss.backward()`` outside: the partitioned forward and
    backward programs use the fused primitives, and the gradients are eager's."""
    def run(compiled):
        fg.manual_seed(0)
        model = Block(style=style)
        f = fg.compile(model) if compiled else model
        x = fg.randn(4, 8, 16)
        loss = (f(x) ** 2).mean()
        loss.backward()
        return float(loss), [p.grad.numpy().copy() for p in model.parameters()], f
    le, ge, _ = run(False)
    lc, gc, f = run(True)
    split = [v for v in f.entries()[-1].backward.values() if hasattr(v, "partition")]
    assert [n.op for n in split[0].partition.forward.nodes].count("fused_attention") == 1
    assert any(n.op == "fused_attention_backward" for n in split[0].partition.backward.nodes)
    assert "fused_attention" not in _ops(f)           # the entry's own graph is unchanged
    np.testing.assert_allclose(lc, le, rtol=2e-5)
    for a, b in zip(gc, ge):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5 * np.abs(b).max())


def test_a_backward_that_is_differentiated_is_not_fused():
    fg.manual_seed(0)
    model = Block()
    x = fg.randn(2, 8, 16)

    def f(x):
        loss = (model(x) ** 2).mean()
        (g,) = fg.autograd.grad(loss, [model.qkv.weight], create_graph=True)
        return (g ** 2).sum()
    compiled = fg.compile(f, fullgraph=True)
    got = float(compiled(x))
    assert "fused_attention" not in _ops(compiled)
    np.testing.assert_allclose(got, float(f(x)), rtol=1e-5)


def test_an_inference_forward_is_not_fused():
    fg.manual_seed(0)
    model = Block()
    x = fg.randn(2, 8, 16)
    with fg.no_grad():
        want = model(x).numpy()
        f = fg.compile(model)
        np.testing.assert_allclose(f(x).numpy(), want, rtol=1e-5, atol=1e-6)
    assert "fused_attention" not in _ops(f)


def test_fused_primitives_check_their_operands():
    f32 = fg.float32
    q = TensorType((2, 4, 8), f32)
    with pytest.raises(fg.ops.ShapeError, match="of one shape"):
        FA.fused_attention.infer(q, TensorType((2, 5, 8), f32), q, scale=1.0, keep=False,
                                 zero_dead=False)
    with pytest.raises(fg.ops.ShapeError, match="must be bool"):
        FA.fused_attention.infer(q, q, q, TensorType((4, 4), f32), scale=1.0, keep=False,
                                 zero_dead=False)
    with pytest.raises(fg.ops.ShapeError, match="does not broadcast"):
        FA.fused_attention.infer(q, q, q, TensorType((5, 2, 4, 4), fg.bool), scale=1.0,
                                 keep=False, zero_dead=False)
    with pytest.raises(fg.ops.ShapeError, match="must match the size"):
        FA.fused_attention.infer(q, q, q, TensorType((3, 4, 4), fg.bool), scale=1.0,
                                 keep=False, zero_dead=False)
    with pytest.raises(fg.ops.ShapeError, match="does not match"):
        FA.fused_attention_backward.infer(q, q, q, q, q, scale=1.0, keep=False)
