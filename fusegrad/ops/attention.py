"""Scaled dot-product attention as a composition of matmul, softmax, where and dropout.

Being a composition, it traces, differentiates and fuses like any other op: compiled, the mask,
scale and softmax around the two matmuls fuse into their epilogues and reductions.

A row that no key may attend to (an all-False boolean mask row, an all ``-inf`` float row)
gives zeros, as torch's ``_safe_softmax`` does, not NaN; its scores are replaced by zeros
*before* the softmax so that the backward pass sees finite values there (``where``'s VJP
multiplies the unselected branch by 0, and 0 * NaN would still be NaN).
"""

from __future__ import annotations

import math

from fusegrad import dtypes
from fusegrad.ops import functional as F
from fusegrad.ops.composite import composite, opmath
from fusegrad.ops.creation import ones
from fusegrad.ops.dropout import dropout
from fusegrad.ops.softmax import TENSOR_MATH, softmax_values
from fusegrad.ops.softmax_math import softmax_formula
from fusegrad.tensor import Tensor

__all__ = ["scaled_dot_product_attention"]

# torch's spelling of dtypes in its attention errors (C++ type names)
_C_NAMES = {dtypes.float32: "float", dtypes.float64: "double", dtypes.float16: "c10::Half",
            dtypes.bfloat16: "c10::BFloat16", dtypes.int64: "long int", dtypes.int32: "int",
            dtypes.bool_: "bool"}


def _c_name(dtype) -> str:
    return _C_NAMES.get(dtype, str(dtype).removeprefix("fusegrad."))


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, attn_mask, dropout_p: float, is_causal: bool,
                  enable_gqa: bool) -> None:
    if not (q.dtype == k.dtype == v.dtype):
        raise RuntimeError("Expected query, key, and value to have the same dtype, but got "
                           f"query.dtype: {_c_name(q.dtype)} key.dtype: {_c_name(k.dtype)} and "
                           f"value.dtype: {_c_name(v.dtype)} instead.")
    if min(q.ndim, k.ndim, v.ndim) < 2:
        raise RuntimeError("Expected query, key, and value to all be  at least 2 dimensional, but "
                           f"got query.dim: {q.ndim} key.dim: {k.ndim} and value.dim: {v.ndim} "
                           "instead.")
    if not q.dtype.is_floating_point:
        raise RuntimeError(f"expected scalar type Float but found {F._dtype_title(q.dtype)}")
    if attn_mask is not None:
        if is_causal:
            raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be "
                               "set when is_causal=True")
        if attn_mask.dtype is not dtypes.bool_ and attn_mask.dtype != q.dtype:
            raise RuntimeError("Expected attn_mask dtype to be bool or float or to match query "
                               f"dtype, but got attn_mask.dtype: {_c_name(attn_mask.dtype)} and  "
                               f"query.dtype: {_c_name(q.dtype)} instead.")
    if not 0.0 <= dropout_p <= 1.0:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
    if k.shape[-1] != q.shape[-1]:
        raise RuntimeError("Expected size for first two dimensions of batch2 tensor to be: "
                           f"[{k.shape[-2]}, {q.shape[-1]}] but got: [{k.shape[-2]}, "
                           f"{k.shape[-1]}].")
    if v.shape[-2] != k.shape[-2]:
        raise RuntimeError("Expected size for first two dimensions of batch2 tensor to be: "
                           f"[{q.shape[-2]}, {k.shape[-2]}] but got: [{v.shape[-2]}, "
                           f"{v.shape[-1]}].")
    if enable_gqa and q.ndim >= 3 and k.ndim >= 3:
        hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
        if hk == 0 or hq % hk or hv != hk:
            raise RuntimeError("Number of heads in key and value must divide the number of heads "
                               "in ")


def _repeat_heads(t: Tensor, times: int) -> Tensor:
    """Each head of (..., H, S, E) repeated ``times`` times in place: (..., H * times, S, E)."""
    return t if times == 1 else F.repeat_interleave(t, times, dim=-3)


def _attention(q: Tensor, k: Tensor, v: Tensor, mask, dropout_p: float, scale: float) -> Tensor:
    scores = F.mul(F.matmul(q, F.transpose(k, -2, -1)), scale)
    if scores.shape[-1] == 0:
        # no keys: every row attends to nothing, zeros as torch (a max over no keys is undefined)
        return F.matmul(scores, v)
    if mask is not None:
        if mask.dtype is dtypes.bool_:
            scores = F.where(mask, scores, -math.inf)
        else:
            scores = F.add(scores, mask)
    # rows where every score is -inf attend to nothing: zeros out, finite gradients; the
    # gradient is softmax's (out * (g - sum(g * out)), which reads the weights alone)
    weights = softmax_formula(TENSOR_MATH, scores, -1, zero_dead=True)
    weights = softmax_values.mark(weights, (scores,), (-1,))
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p)
    return F.matmul(weights, v)


# torch names the node after its CPU kernel (flash attention for CPU); 16-bit inputs are
# computed in float32 (their scores overflow float16 long before the result does)
_attention_node = composite("ScaledDotProductFlashAttentionForCpuBackward0")(opmath(_attention))


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``softmax(query @ key^T * scale + mask) @ value`` over (..., L, E), (..., S, E), (..., S, Ev).

    ``attn_mask``: boolean (True: the key takes part) or float (added to the scores),
    broadcastable to (..., L, S). ``is_causal``: query i sees keys 0..i (the top-left aligned
    lower triangle, also when L != S). ``scale`` defaults to ``1 / sqrt(E)``. ``dropout_p``:
    dropout on the attention weights, from fusegrad's generator (``manual_seed``).
    ``enable_gqa``: key and value may have fewer heads (dim -3) than query, each repeated.

    >>> q = k = v = fusegrad.randn(2, 4, 8, 16)
    >>> scaled_dot_product_attention(q, k, v, is_causal=True).shape
    (2, 4, 8, 16)
    """
    _check_inputs(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    if enable_gqa and query.ndim >= 3 and key.ndim >= 3:
        key = _repeat_heads(key, query.shape[-3] // key.shape[-3])
        value = _repeat_heads(value, query.shape[-3] // value.shape[-3])
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    if is_causal:
        L, S = query.shape[-2], key.shape[-2]
        attn_mask = F.tril(ones((L, S), dtype=dtypes.bool_))
    return _attention_node(query, key, value, attn_mask, float(dropout_p), float(scale))
