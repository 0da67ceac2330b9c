"""Scaled dot-product attention, MultiheadAttention and the transformer layers: values against
numpy loops, gradients against finite differences, traced and compiled against eager, a
compiled training step of a tiny encoder, and torch as an optional oracle."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad
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
    assert out.grad_fn.name() == "ScaledDotProductAttentionBackward0"


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
