"""Attention as two primitives, forward and backward, for the fusion in
:mod:`fusegrad.passes.attention`.

``fused_attention(q, k, v[, mask])`` is ``softmax(q @ k.T * scale, masked) @ v`` with
``q``, ``k`` and ``v`` of one shape (..., L, E): self-attention, the case the fusion takes.
Its result is packed, (..., L, E + L): each query's row of the attention's result, then its
row of weights, which the backward reads instead of recomputing them (a primitive has one
result; the fusion slices the first E columns out).
``mask`` is boolean, broadcastable to (..., L, L); a score is -inf where the mask is not
``keep`` (``masked_fill(mask, -inf)`` is ``keep=False``, an sdpa mask ``keep=True``). A row
that is all -inf gives zeros with ``zero_dead`` (sdpa's rule) and NaN without (softmax's).

``fused_attention_backward(q, k, v, packed, dout[, mask])`` gives dq, dk and dv stacked, shape
(3, ..., L, E); the VJP rules of ``fused_attention`` take their part of it, and CSE keeps one
node for the three. The formulas are those of the primitives the fusion replaces: the
softmax VJP ``p * (dp - sum(p * dp))``, masked entries zero, times ``scale``.

Both are extern primitives: their numpy references below run anywhere (the interpreter, a
GPU program's host step), and the CPU runtime runs the native code of
:mod:`fusegrad.runtime.native_attention` where it applies. Neither appears in eager code.
"""

from __future__ import annotations

import numpy as np

from fusegrad import dtypes
from fusegrad.ops.primitive import (
    Kind,
    Primitive,
    Rule,
    ShapeError,
    TensorType,
    bind,
    jvp_rule,
    register,
)
from fusegrad.ops.prims import broadcast_shapes, concat
from fusegrad.ops.softmax_math import NUMPY_MATH, softmax_formula, softmax_vjp_formula

__all__ = ["fused_attention", "fused_attention_backward"]


def _check(op: str, q: TensorType, k: TensorType, v: TensorType, mask: tuple) -> None:
    if not (q.shape == k.shape == v.shape) or q.ndim < 2:
        raise ShapeError(f"{op}: query, key and value must be of one shape (..., L, E) with at "
                         f"least 2 dimensions, got {q}, {k} and {v}")
    if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_floating_point:
        raise ShapeError(f"{op}: query, key and value must be of one floating dtype, got "
                         f"{q.dtype}, {k.dtype} and {v.dtype}")
    if len(mask) > 1:
        raise ShapeError(f"{op}: at most one mask, got {len(mask)}")
    if mask:
        m = mask[0]
        scores = q.shape[:-1] + (q.shape[-2],)
        if m.dtype is not dtypes.bool_:
            raise ShapeError(f"{op}: the mask must be bool, got {m.dtype}")
        if broadcast_shapes(m.shape, scores, op=op) != scores:
            raise ShapeError(f"{op}: mask {m} does not broadcast to the scores' shape {scores}")


def _packed(q: TensorType) -> TensorType:
    """(..., L, E + L): each query's result, then its weights."""
    L, E = q.shape[-2:]
    return TensorType(q.shape[:-1] + (E + L,), q.dtype)


def _forward_infer(q, k, v, *mask, scale, keep, zero_dead) -> TensorType:
    _check("fused_attention", q, k, v, mask)
    return _packed(q)


def _backward_infer(q, k, v, packed, dout, *mask, scale, keep) -> TensorType:
    op = "fused_attention_backward"
    _check(op, q, k, v, mask)
    if packed != _packed(q) or dout.shape != q.shape or dout.dtype != q.dtype:
        raise ShapeError(f"{op}: the forward's result {packed} or the gradient {dout} does not "
                         f"match the query {q}")
    return TensorType((3,) + q.shape, q.dtype)


def _weights(q, k, mask, scale, keep, zero_dead):
    """The attention weights: :func:`~fusegrad.ops.softmax_math.softmax_formula` of the scores."""
    t = q.dtype.type
    with np.errstate(all="ignore"):
        s = np.matmul(q, np.swapaxes(k, -1, -2)) * t(scale)
        if mask:
            s = np.where(mask[0] != keep, t(-np.inf), s)
        return softmax_formula(NUMPY_MATH, s, -1, zero_dead)


def _forward_impl(q, k, v, *mask, scale, keep, zero_dead):
    p = _weights(q, k, mask, scale, keep, zero_dead)
    with np.errstate(all="ignore"):
        return np.concatenate([np.matmul(p, v), p], axis=-1).astype(q.dtype, copy=False)


def _backward_impl(q, k, v, packed, dout, *mask, scale, keep):
    p = packed[..., q.shape[-1]:]
    with np.errstate(all="ignore"):
        dp = np.matmul(dout, np.swapaxes(v, -1, -2))
        ds = softmax_vjp_formula(NUMPY_MATH, dp, p, -1)
        if mask:
            ds = np.where(mask[0] != keep, q.dtype.type(0), ds)
        ds = ds * q.dtype.type(scale)
        grads = (np.matmul(ds, k), np.matmul(np.swapaxes(ds, -1, -2), q),
                 np.matmul(np.swapaxes(p, -1, -2), dout))
        return np.stack(grads).astype(q.dtype, copy=False)


def _grad_rule(ct, out, q, k, v, *mask, argnum, scale, keep, zero_dead):
    if argnum > 2:
        return None                 # the mask has no gradient
    # Only the results part of the packed output has a gradient (the weights are read by
    # the backward alone); the fusion's slice gives its cotangent a pad that simplify
    # removes again. CSE keeps one backward node for the three operands.
    dout = ct[..., :q.shape[-1]]
    # The weights are given: how a row of all -inf became them (zero_dead) does not matter.
    return bind(fused_attention_backward, q, k, v, out, dout, *mask, scale=scale,
                keep=keep)[argnum]


def _no_second_order(ct, out, *operands, argnum, scale, keep):
    raise NotImplementedError("fused_attention_backward: the gradient of a fused attention's "
                              "gradient is not implemented (the fusion is not applied where "
                              "a backward is differentiated, with create_graph=True)")



# Variadic: the mask is optional (a primitive's operand count is otherwise fixed).
fused_attention = register(Primitive(
    "fused_attention", Kind.EXTERN, _forward_infer, _forward_impl,
    (Rule(_grad_rule, (0, 1, 2, 3), reads_output=True),),
    "ScaledDotProductFlashAttentionForCpuBackward0", attrs=("scale", "keep", "zero_dead"),
    variadic=True))

fused_attention_backward = register(Primitive(
    "fused_attention_backward", Kind.EXTERN, _backward_infer, _backward_impl,
    (Rule(_no_second_order),), "FusedAttentionBackwardBackward0", attrs=("scale", "keep"),
    variadic=True))


# --------------------------------------------------------------------------- JVP rules
# Forward mode (fusegrad.ops.dual): with s = scale q k^T, p = softmax(s) and o = p v,
# dp = p (ds - sum(p ds)) (masked and dead entries have p = 0, so they stay 0) and
# do = dp v + p dv; the result's tangent is packed as the result is. The backward has no
# derivative (fused_attention_backward's VJP refuses second order too).


@jvp_rule(fused_attention)
def _fused_attention_jvp(ts, out, q, k, v, *mask, scale, keep, zero_dead):
    tq, tk, tv = ts[:3]
    e = q.shape[-1]
    p = out[..., e:]
    ds = None
    if tq is not None:
        ds = tq @ k.transpose(-1, -2)
    if tk is not None:
        term = q @ tk.transpose(-1, -2)
        ds = term if ds is None else ds + term
    dout = None
    if ds is not None:
        ds = ds * scale
        dp = p * (ds - (p * ds).sum(-1, keepdim=True))
        dout = dp @ v
    else:
        dp = p.new_zeros(tuple(p.shape))
    if tv is not None:
        dout = p @ tv if dout is None else dout + p @ tv
    return bind(concat, dout, dp, axis=out.ndim - 1)


# --------------------------------------------------------------------------- batching rules
# Attention maps over its leading dims: query, key and value go batch-first (broadcast to
# the batch when unbatched), a mask batch-first with size-1 axes up to the scores' rank.

from fusegrad.ops.batching import batch_size, batching, to_front  # noqa: E402


def _attention_operands(args, dims):
    size = batch_size(args, dims)
    qkv = [to_front(a, d, size) for a, d in zip(args[:-1], dims[:-1])]
    ndim = qkv[0].ndim
    mask, d = args[-1], dims[-1]
    if d is not None:
        mask = to_front(mask, d)
        if mask.ndim < ndim:
            mask = mask.reshape((size,) + (1,) * (ndim - mask.ndim) + tuple(mask.shape[1:]))
    return qkv + [mask]


@batching(fused_attention)
def _attention_batching(args, dims, **attrs):
    n = 3 if len(args) == 3 else 4
    ops = _attention_operands(args[:n] + [args[0]] * (n == 3), dims[:n] + [dims[0]] * (n == 3))
    return bind(fused_attention, *ops[:len(args)], **attrs), 0


@batching(fused_attention_backward)
def _attention_backward_batching(args, dims, **attrs):
    n = len(args)
    padded = args + [args[0]] * (n == 5)
    ops = _attention_operands(padded, dims + [dims[0]] * (n == 5))
    return bind(fused_attention_backward, *ops[:n], **attrs), 1      # (3, batch, ...)
