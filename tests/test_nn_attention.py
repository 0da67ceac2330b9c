"""Scaled dot-product attention, MultiheadAttention and the transformer layers: values against
numpy loops, gradients against finite differences, traced and compiled against eager, a
compiled training step of a tiny encoder, and torch as an optional oracle."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad
from fusegrad import nn
from fusegrad.autograd.gradcheck import gradcheck
from fusegrad.nn import functional as NF

RNG = np.random.default_rng(5)


def f32(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def t(a, grad=False) -> fusegrad.Tensor:
    return fusegrad.tensor(a, requires_grad=grad)


def sdpa_ref(q, k, v, mask=None, causal=False, scale=None):
    """Attention one query row at a time; a row with no key to attend to gives zeros."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(E) if scale is None else scale
    bias = np.zeros((L, S))
    if causal:
        bias = np.where(np.tril(np.ones((L, S), bool)), 0.0, -np.inf)
    if mask is not None:
        mask = np.asarray(mask)
        bias = np.where(mask, 0.0, -np.inf) if mask.dtype == bool else bias + mask
    bias = np.broadcast_to(bias, lead + (L, S))
    q, k, v = (np.broadcast_to(a, lead + a.shape[-2:]) for a in (q, k, v))
    out = np.zeros(lead + (L, v.shape[-1]))
    for idx in np.ndindex(*lead):
        for i in range(L):
            s = np.array([q[idx][i] @ k[idx][j] * scale for j in range(S)]) + bias[idx][i]
            if np.all(s == -np.inf):
                continue
            w = np.exp(s - s.max())
            out[idx][i] = (w / w.sum()) @ v[idx]
    return out


# --------------------------------------------------------------------------- sdpa


SDPA_CASES = [
    dict(),
    dict(causal=True),
    dict(scale=0.3),
    dict(mask="bool"),
    dict(mask="float"),
]


@pytest.mark.parametrize("kw", SDPA_CASES, ids=lambda kw: "-".join(map(str, kw.values())) or "plain")
@pytest.mark.parametrize("L,S", [(4, 6), (5, 3)])
def test_sdpa_matches_loop(kw, L, S):
    q, k, v = f32(2, 3, L, 5), f32(2, 3, S, 5), f32(2, 3, S, 4)
    mask = None
    if kw.get("mask") == "bool":
        mask = RNG.random((L, S)) < 0.6
        mask[0] = False                      # a row that attends to nothing gives zeros
    elif kw.get("mask") == "float":
        mask = f32(3, L, S)
    out = NF.scaled_dot_product_attention(t(q), t(k), t(v), None if mask is None else t(mask),
                                          is_causal=kw.get("causal", False), scale=kw.get("scale"))
    ref = sdpa_ref(q, k, v, mask, kw.get("causal", False), kw.get("scale"))
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_sdpa_unbatched_broadcast_and_gqa():
    q, k, v = f32(4, 3), f32(6, 3), f32(6, 2)
    np.testing.assert_allclose(NF.scaled_dot_product_attention(t(q), t(k), t(v)).numpy(),
                               sdpa_ref(q, k, v), rtol=1e-5, atol=1e-5)
    q, k, v = f32(2, 4, 3, 5), f32(2, 2, 6, 5), f32(2, 2, 6, 3)
    out = NF.scaled_dot_product_attention(t(q), t(k), t(v), enable_gqa=True)
    ref = sdpa_ref(q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1))
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_sdpa_dropout_uses_the_generator():
    q, k, v = (t(f32(2, 4, 5)) for _ in range(3))
    fusegrad.manual_seed(7)
    a = NF.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    fusegrad.manual_seed(7)
    b = NF.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.allclose(a.numpy(), NF.scaled_dot_product_attention(q, k, v).numpy())
    # p = 1 drops every weight
    np.testing.assert_array_equal(NF.scaled_dot_product_attention(q, k, v, dropout_p=1.0).numpy(),
                                  0.0)


def test_sdpa_errors_as_torch():
    q, k, v = t(f32(2, 4, 5)), t(f32(2, 6, 5)), t(f32(2, 6, 3))
    cases = [
        (dict(key=t(f32(2, 6, 4))), "Expected size for first two dimensions of batch2 tensor to "
                                    r"be: \[6, 5\] but got: \[6, 4\]"),
        (dict(value=t(f32(2, 5, 3))), r"batch2 tensor to be: \[4, 6\] but got: \[5, 3\]"),
        (dict(key=t(f32(2, 6, 5).astype(np.float64))), "same dtype, but got query.dtype: float "
                                                       "key.dtype: double"),
        (dict(query=t(f32(5))), "at least 2 dimensional"),
        (dict(attn_mask=t(np.ones((4, 6), bool)), is_causal=True),
         "Explicit attn_mask should not be set when is_causal=True"),
        (dict(attn_mask=t(np.zeros((4, 6), np.int64))), "attn_mask.dtype: long int"),
        (dict(dropout_p=1.5), "dropout probability has to be between 0 and 1"),
    ]
    for kw, msg in cases:
        args = dict(query=q, key=k, value=v) | kw
        with pytest.raises(RuntimeError, match=msg):
            NF.scaled_dot_product_attention(**args)


def test_sdpa_gradcheck_and_fully_masked_rows_have_finite_gradients():
    def f64(*shape):
        return fusegrad.tensor(RNG.standard_normal(shape), requires_grad=True)
    q, k, v = f64(2, 3, 4), f64(2, 5, 4), f64(2, 5, 3)
    mask = fusegrad.tensor(RNG.standard_normal((3, 5)))
    assert gradcheck(lambda q, k, v: NF.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                     (q, k, v))
    assert gradcheck(lambda q, k, v: NF.scaled_dot_product_attention(q, k, v, is_causal=True),
                     (q, k, v))
    bmask = fusegrad.tensor(np.array([[False] * 5, [True] * 5, [True, False] * 2 + [True]]))
    assert gradcheck(lambda q, k, v: NF.scaled_dot_product_attention(q, k, v, attn_mask=bmask),
                     (q, k, v))
    out = NF.scaled_dot_product_attention(q, k, v, attn_mask=bmask)
    out.sum().backward()
    assert np.isfinite(q.grad.numpy()).all() and np.isfinite(k.grad.numpy()).all()
    assert out.grad_fn.name() == "ScaledDotProductFlashAttentionForCpuBackward0"


@pytest.mark.parametrize("compiled", [False, True])
def test_sdpa_with_no_keys_gives_zeros(compiled):
    # torch: every query attends to nothing, the result and the gradients are zeros
    q = t(f32(2, 3, 4), grad=True)
    k, v = t(np.zeros((2, 0, 4), np.float32), grad=True), t(np.zeros((2, 0, 5), np.float32))

    def f(q, k, v):
        out = NF.scaled_dot_product_attention(q, k, v)
        out.sum().backward()
        return out
    out = (fusegrad.compile(f) if compiled else f)(q, k, v)
    np.testing.assert_array_equal(out.detach().numpy(), np.zeros((2, 3, 5), np.float32))
    np.testing.assert_array_equal(q.grad.numpy(), np.zeros((2, 3, 4), np.float32))


def test_sdpa_traced_and_compiled_match_eager():
    q, k, v = t(f32(2, 2, 4, 8)), t(f32(2, 2, 6, 8)), t(f32(2, 2, 6, 8))
    mask = t(RNG.random((4, 6)) < 0.7)

    def f(q, k, v):
        return (NF.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                NF.scaled_dot_product_attention(q, q, q, is_causal=True))

    def loss(q, k, v):
        a, b = f(q, k, v)
        return (a * a).sum() + b.sum()
    for e, c in zip(f(q, k, v), fusegrad.compile(f)(q, k, v)):
        np.testing.assert_allclose(c.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)
    g_eager = fusegrad.grad(loss, argnums=(0, 1, 2))(q, k, v)
    g_comp = fusegrad.compile(fusegrad.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    for e, c in zip(g_eager, g_comp):
        np.testing.assert_allclose(c.numpy(), e.numpy(), rtol=1e-4, atol=1e-5)


def test_compiled_sdpa_is_three_kernels_and_dropout_matches_eager():
    # the scale and mask fuse into the first matmul, the softmax is one reduction kernel
    q, k, v = t(f32(2, 2, 4, 8)), t(f32(2, 2, 6, 8)), t(f32(2, 2, 6, 8))
    f = fusegrad.compile(lambda q, k, v: NF.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert len(f.lower(q, k, v).kernels) == 3, f.lower(q, k, v).kernels
    g = fusegrad.compile(lambda q, k, v: NF.scaled_dot_product_attention(q, k, v, dropout_p=0.5))
    fusegrad.manual_seed(3)
    a = g(q, k, v)
    fusegrad.manual_seed(3)
    b = NF.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_sdpa_against_torch():
    torch = pytest.importorskip("torch")
    q, k, v = f32(2, 4, 5, 8), f32(2, 2, 7, 8), f32(2, 2, 7, 3)
    bmask = RNG.random((5, 7)) < 0.5
    bmask[2] = False
    fmask = f32(2, 1, 5, 7)
    for kw in (dict(is_causal=True), dict(attn_mask=bmask), dict(attn_mask=fmask, scale=0.2)):
        ours = [t(a, grad=True) for a in (q, k, v)]
        theirs = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
        o = NF.scaled_dot_product_attention(
            *ours, enable_gqa=True, **{n: t(a) if isinstance(a, np.ndarray) else a
                                       for n, a in kw.items()})
        r = torch.nn.functional.scaled_dot_product_attention(
            *theirs, enable_gqa=True, **{n: torch.tensor(a) if isinstance(a, np.ndarray) else a
                                         for n, a in kw.items()})
        np.testing.assert_allclose(o.detach().numpy(), r.detach().numpy(), rtol=1e-5, atol=1e-5)
        (o * o).sum().backward()
        (r * r).sum().backward()
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- MultiheadAttention


def mha_ref(q, k, v, p, H, attn_mask=None, kpm=None):
    """(L, N, E) attention head by head; bool masks: True is masked out. Returns output and
    head-averaged weights."""
    E = q.shape[-1]
    hd = E // H
    w, b = p["in_proj_weight"], p["in_proj_bias"]
    Q, K, V = q @ w[:E].T + b[:E], k @ w[E:2 * E].T + b[E:2 * E], v @ w[2 * E:].T + b[2 * E:]
    L, N, S = q.shape[0], q.shape[1], k.shape[0]
    out, weights = np.zeros((L, N, E)), np.zeros((N, H, L, S))
    for n in range(N):
        for h in range(H):
            sl = slice(h * hd, (h + 1) * hd)
            s = Q[:, n, sl] @ K[:, n, sl].T / math.sqrt(hd)
            if attn_mask is not None:
                s = np.where(attn_mask, -np.inf, s)
            if kpm is not None:
                s = np.where(kpm[n][None, :], -np.inf, s)
            a = np.exp(s - s.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            weights[n, h] = a
            out[:, n, sl] = a @ V[:, n, sl]
    return out @ p["out_proj.weight"].T + p["out_proj.bias"], weights.mean(1)


def params_of(module) -> dict[str, np.ndarray]:
    return {n: q.detach().numpy().astype(np.float64) for n, q in module.named_parameters()}


def test_mha_parameters_and_init():
    m = nn.MultiheadAttention(8, 2)
    assert [n for n, _ in m.named_parameters()] == ["in_proj_weight", "in_proj_bias",
                                                    "out_proj.weight", "out_proj.bias"]
    bound = math.sqrt(6 / (8 + 24))            # xavier_uniform over (3E, E)
    assert np.abs(m.in_proj_weight.detach().numpy()).max() <= bound
    assert not m.in_proj_bias.detach().numpy().any() and not m.out_proj.bias.detach().numpy().any()
    m2 = nn.MultiheadAttention(8, 4, bias=False, add_bias_kv=True, kdim=3, vdim=5)
    shapes = {n: tuple(q.shape) for n, q in m2.named_parameters()}
    assert shapes == {"q_proj_weight": (8, 8), "k_proj_weight": (8, 3), "v_proj_weight": (8, 5),
                      "bias_k": (1, 1, 8), "bias_v": (1, 1, 8), "out_proj.weight": (8, 8)}
    assert m2.in_proj_weight is None and m2.in_proj_bias is None
    out, w = m2(fusegrad.randn(4, 2, 8), fusegrad.randn(6, 2, 3), fusegrad.randn(6, 2, 5))
    assert out.shape == (4, 2, 8) and w.shape == (2, 4, 7)
    with pytest.raises(AssertionError, match="divisible by num_heads"):
        nn.MultiheadAttention(6, 4)


@pytest.mark.parametrize("batch_first", [False, True])
def test_mha_matches_loop_with_masks(batch_first):
    m = nn.MultiheadAttention(8, 2, batch_first=batch_first)
    q, k, v = f32(4, 3, 8), f32(5, 3, 8), f32(5, 3, 8)
    mask = RNG.random((4, 5)) < 0.3
    mask[:, 0] = False
    kpm = np.zeros((3, 5), bool)
    kpm[1, 3:] = True

    def arg(a):
        return t(a.transpose(1, 0, 2) if batch_first else a)
    out, w = m(arg(q), arg(k), arg(v), key_padding_mask=t(kpm), attn_mask=t(mask))
    ref, ref_w = mha_ref(q, k, v, params_of(m), 2, mask, kpm)
    got = out.detach().numpy()
    np.testing.assert_allclose(got.transpose(1, 0, 2) if batch_first else got, ref,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w.detach().numpy(), ref_w, rtol=1e-5, atol=1e-6)
    # the same through scaled_dot_product_attention (need_weights=False), and a float mask
    fmask = t(np.where(mask, -np.inf, 0.0).astype(np.float32))
    out2, none = m(arg(q), arg(k), arg(v), key_padding_mask=t(kpm), attn_mask=fmask,
                   need_weights=False)
    assert none is None
    np.testing.assert_allclose(out2.detach().numpy(), got, rtol=1e-5, atol=1e-5)
    per_head = m(arg(q), arg(k), arg(v), average_attn_weights=False)[1]
    assert per_head.shape == (3, 2, 4, 5)


def test_mha_unbatched_and_causal_hint():
    m = nn.MultiheadAttention(4, 2)
    x = f32(5, 4)
    out, w = m(t(x), t(x), t(x))
    ref, ref_w = mha_ref(x[:, None], x[:, None], x[:, None], params_of(m), 2)
    np.testing.assert_allclose(out.detach().numpy(), ref[:, 0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w.detach().numpy(), ref_w[0], rtol=1e-5, atol=1e-6)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    a = m(t(x), t(x), t(x), attn_mask=causal, is_causal=True, need_weights=False)[0]
    ref = mha_ref(x[:, None], x[:, None], x[:, None], params_of(m), 2,
                  ~np.tril(np.ones((5, 5), bool)))[0]
    np.testing.assert_allclose(a.detach().numpy(), ref[:, 0], rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="Need attn_mask if specifying the is_causal hint"):
        m(t(x), t(x), t(x), is_causal=True)


def test_mha_returns_the_weights_after_dropout():
    m = nn.MultiheadAttention(4, 2, dropout=0.5)
    x = t(f32(3, 2, 4))
    fusegrad.manual_seed(2)
    out, w = m(x, x, x, average_attn_weights=False)
    dropped = (w.detach().numpy() == 0)
    assert dropped.any() and not dropped.all()
    m.eval()
    assert not (m(x, x, x)[1].detach().numpy() == 0).any()


def test_mha_gradcheck():
    m = nn.MultiheadAttention(4, 2, add_bias_kv=True, add_zero_attn=True, dtype=fusegrad.float64)
    q = fusegrad.tensor(RNG.standard_normal((3, 2, 4)), requires_grad=True)
    kv = fusegrad.tensor(RNG.standard_normal((4, 2, 4)), requires_grad=True)
    kpm = fusegrad.tensor(np.array([[False] * 4, [False, False, True, True]]))
    assert gradcheck(lambda q, kv: m(q, kv, kv, key_padding_mask=kpm)[0], (q, kv))
    assert gradcheck(lambda q: m(q, q, q, need_weights=False)[0], (q,))


# --------------------------------------------------------------------------- transformer layers


def encoder_ref(x, p, H, norm_first, act=lambda a: np.maximum(a, 0), prefix=""):
    """One post- or pre-norm encoder layer on (L, N, E) in float64."""
    def ln(a, i):
        mu, var = a.mean(-1, keepdims=True), a.var(-1, keepdims=True)
        return (a - mu) / np.sqrt(var + 1e-5) * p[f"{prefix}norm{i}.weight"] + \
            p[f"{prefix}norm{i}.bias"]

    def sa(a):
        sub = {n.removeprefix(f"{prefix}self_attn."): w for n, w in p.items()}
        return mha_ref(a, a, a, sub, H)[0]

    def ff(a):
        h = act(a @ p[f"{prefix}linear1.weight"].T + p[f"{prefix}linear1.bias"])
        return h @ p[f"{prefix}linear2.weight"].T + p[f"{prefix}linear2.bias"]
    if norm_first:
        x = x + sa(ln(x, 1))
        return x + ff(ln(x, 2))
    x = ln(x + sa(x), 1)
    return ln(x + ff(x), 2)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_reference(norm_first):
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, norm_first=norm_first)
    x = f32(5, 2, 8)
    out = layer(t(x))
    np.testing.assert_allclose(out.detach().numpy(), encoder_ref(x, params_of(layer), 2, norm_first),
                               rtol=1e-4, atol=1e-5)
    enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8))
    assert len(enc.layers) == 2 and enc.layers[0].linear1.weight is not layer.linear1.weight
    p = params_of(enc)
    ref = encoder_ref(encoder_ref(x, p, 2, norm_first, prefix="layers.0."), p, 2, norm_first,
                      prefix="layers.1.")
    ref = (ref - ref.mean(-1, keepdims=True)) / np.sqrt(ref.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(enc(t(x)).detach().numpy(), ref * p["norm.weight"] + p["norm.bias"],
                               rtol=1e-4, atol=1e-5)


def test_decoder_layer_shapes_and_gelu():
    layer = nn.TransformerDecoderLayer(8, 2, 16, activation="gelu", batch_first=True)
    assert layer.activation is NF.gelu
    tgt, mem = fusegrad.randn(2, 4, 8), fusegrad.randn(2, 6, 8)
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    assert layer(tgt, mem, tgt_mask=mask, tgt_is_causal=True).shape == (2, 4, 8)
    dec = nn.TransformerDecoder(layer, 2)
    assert dec(tgt, mem).shape == (2, 4, 8)
    with pytest.raises(RuntimeError, match="activation should be relu/gelu"):
        nn.TransformerEncoderLayer(8, 2, activation="swish")
    model = nn.Transformer(8, 2, 1, 1, 16, dropout=0.0)
    assert model(fusegrad.randn(5, 2, 8), fusegrad.randn(4, 2, 8)).shape == (4, 2, 8)
    assert model.encoder.norm is not None and model.decoder.norm is not None
    with pytest.raises(RuntimeError, match="the batch number of src and tgt must be equal"):
        model(fusegrad.randn(5, 2, 8), fusegrad.randn(4, 3, 8))


class TinyEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 1)
        self.head = nn.Linear(8, 11)

    def forward(self, ids):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        return self.head(self.encoder(self.embed(ids), mask=mask, is_causal=True))


def _training_step(model, classes):
    opt = fusegrad.optim.Adam(model.parameters(), lr=1e-2)

    def step(ids, target):
        opt.zero_grad()
        loss = NF.cross_entropy(model(ids).reshape(-1, classes), target)
        loss.backward()
        opt.step()
        return loss
    return step


def test_compiled_transformer_training_step_matches_eager():
    ids = fusegrad.tensor(RNG.integers(0, 11, (3, 6)))
    target = fusegrad.tensor(RNG.integers(0, 11, (3 * 6,)))
    losses = {}
    for mode in ("eager", "compiled"):
        fusegrad.manual_seed(0)
        step = _training_step(TinyEncoder(), 11)
        run = fusegrad.compile(step) if mode == "compiled" else step
        losses[mode] = [run(ids, target).item() for _ in range(3)]
    np.testing.assert_allclose(losses["compiled"], losses["eager"], rtol=1e-5)
    assert losses["eager"][2] < losses["eager"][0]


def test_compiled_mha_matches_eager():
    m = nn.MultiheadAttention(8, 2, batch_first=True)
    x, kpm = t(f32(2, 5, 8)), t(np.array([[False] * 5, [False] * 3 + [True] * 2]))

    def f(x):
        out, w = m(x, x, x, key_padding_mask=kpm)
        return out, w
    for e, c in zip(f(x), fusegrad.compile(f)(x)):
        np.testing.assert_allclose(c.detach().numpy(), e.detach().numpy(), rtol=1e-5, atol=1e-6)


def _copy_from_torch(ours, theirs):
    ours.load_state_dict({n: fusegrad.tensor(v.detach().numpy())
                          for n, v in theirs.state_dict().items()})


def test_mha_and_encoder_against_torch():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    for kw in (dict(), dict(add_bias_kv=True, add_zero_attn=True), dict(kdim=3, vdim=5)):
        tm = torch.nn.MultiheadAttention(8, 2, batch_first=True, **kw)
        m = nn.MultiheadAttention(8, 2, batch_first=True, **kw)
        _copy_from_torch(m, tm)
        q, k, v = f32(2, 4, 8), f32(2, 6, kw.get("kdim", 8)), f32(2, 6, kw.get("vdim", 8))
        kpm = np.zeros((2, 6), bool)
        kpm[0, 4:] = True
        mask = RNG.random((4, 6)) < 0.2
        ours = [t(a, grad=True) for a in (q, k, v)]
        theirs = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
        o, w = m(*ours, key_padding_mask=t(kpm), attn_mask=t(mask))
        r, rw = tm(*theirs, key_padding_mask=torch.tensor(kpm), attn_mask=torch.tensor(mask))
        np.testing.assert_allclose(o.detach().numpy(), r.detach().numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(w.detach().numpy(), rw.detach().numpy(), rtol=1e-4, atol=1e-6)
        (o * o).sum().backward()
        (r * r).sum().backward()
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-5)
        for n, p in tm.named_parameters():
            np.testing.assert_allclose(dict(m.named_parameters())[n].grad.numpy(),
                                       p.grad.numpy(), rtol=1e-4, atol=1e-5)
    for norm_first in (False, True):
        tl = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(
            8, 2, 16, dropout=0.0, activation="gelu", norm_first=norm_first), 2,
            enable_nested_tensor=False)
        ol = nn.TransformerEncoder(nn.TransformerEncoderLayer(
            8, 2, 16, dropout=0.0, activation="gelu", norm_first=norm_first), 2)
        _copy_from_torch(ol, tl)
        x = f32(5, 2, 8)
        kpm = np.array([[False] * 5, [False] * 3 + [True] * 2])
        o = ol(t(x), src_key_padding_mask=t(kpm))
        r = tl(torch.tensor(x), src_key_padding_mask=torch.tensor(kpm))
        np.testing.assert_allclose(o.detach().numpy(), r.detach().numpy(), rtol=1e-4, atol=1e-5)
        td = torch.nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, norm_first=norm_first)
        od = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, norm_first=norm_first)
        _copy_from_torch(od, td)
        mem = f32(6, 2, 8)
        causal = np.triu(np.ones((5, 5), bool), 1)
        o = od(t(x), t(mem), tgt_mask=t(causal))
        r = td(torch.tensor(x), torch.tensor(mem), tgt_mask=torch.tensor(causal))
        np.testing.assert_allclose(o.detach().numpy(), r.detach().numpy(), rtol=1e-4, atol=1e-5)



def test_transformer_model_against_torch():
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    kw = dict(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=1,
              dim_feedforward=16, dropout=0.0, batch_first=True)
    tm, m = torch.nn.Transformer(**kw), nn.Transformer(**kw)
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in tm.named_parameters()]
    _copy_from_torch(m, tm)
    src, tgt = f32(2, 5, 8), f32(2, 4, 8)
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    np.testing.assert_array_equal(mask.numpy(),
                                  torch.nn.Transformer.generate_square_subsequent_mask(4).numpy())
    o = m(t(src), t(tgt), tgt_mask=mask, tgt_is_causal=True)
    r = tm(torch.tensor(src), torch.tensor(tgt), tgt_mask=torch.tensor(mask.numpy()),
           tgt_is_causal=True)
    np.testing.assert_allclose(o.detach().numpy(), r.detach().numpy(), rtol=1e-4, atol=1e-5)
