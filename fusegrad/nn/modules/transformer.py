"""``MultiheadAttention`` and the transformer layers, as torch.nn has them.

Everything is a composition of public ops (linear, scaled_dot_product_attention, softmax,
layer_norm, dropout), so these modules trace, differentiate and compile as written. Masks keep
torch's conventions, which differ between the two APIs: for ``scaled_dot_product_attention`` a
boolean True means "may attend"; for ``MultiheadAttention`` (``attn_mask``,
``key_padding_mask``) a boolean True means "masked out".
"""

from __future__ import annotations

import copy
import math
from typing import Callable

from fusegrad import dtypes
from fusegrad.nn import functional as NF
from fusegrad.nn import init
from fusegrad.nn.modules.container import ModuleList
from fusegrad.nn.modules.dropout import Dropout
from fusegrad.nn.modules.linear import Linear, NonDynamicallyQuantizableLinear
from fusegrad.nn.modules.module import Module
from fusegrad.nn.modules.normalization import LayerNorm
from fusegrad.nn.parameter import Parameter
from fusegrad.ops import functional as F
from fusegrad.ops.creation import empty, ones, zeros
from fusegrad.tensor import Tensor

__all__ = ["MultiheadAttention", "TransformerEncoderLayer", "TransformerDecoderLayer",
           "TransformerEncoder", "TransformerDecoder", "Transformer"]


def _additive_mask(mask: Tensor | None, dtype, name: str) -> Tensor | None:
    """A boolean mask (True: masked out) as a float mask of 0 and -inf; a float one as is."""
    if mask is None:
        return None
    if mask.dtype is dtypes.bool_:
        return F.where(mask, -math.inf, zeros((), dtype=dtype))
    if not mask.dtype.is_floating_point:
        raise AssertionError(f"only bool and floating types of {name} are supported")
    return mask


def _pad_last(mask: Tensor | None) -> Tensor | None:
    """One more key that every query may attend to (for bias_k/bias_v and add_zero_attn)."""
    return None if mask is None else NF.pad(mask, (0, 1))


class MultiheadAttention(Module):
    """Attention over ``num_heads`` heads of ``embed_dim // num_heads`` features each.

    Parameters as torch names them: ``in_proj_weight`` (3E, E) and ``in_proj_bias`` (3E), or
    ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight`` when ``kdim``/``vdim`` differ from
    ``embed_dim``; ``out_proj`` (a Linear); ``bias_k``, ``bias_v`` (1, 1, E) with
    ``add_bias_kv``. Inputs are (L, N, E), or (N, L, E) with ``batch_first``, or unbatched
    (L, E). ``forward`` returns ``(output, weights)``; weights are (N, L, S) averaged over the
    heads, (N, H, L, S) with ``average_attn_weights=False``, None with ``need_weights=False``.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None,
                 dtype=None) -> None:
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim="
                             f"{embed_dim} and num_heads={num_heads} instead")
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise AssertionError("embed_dim must be divisible by num_heads")
        kw = dict(dtype=dtype, device=device)
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(empty((3 * embed_dim, embed_dim), **kw))
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.q_proj_weight = Parameter(empty((embed_dim, embed_dim), **kw))
            self.k_proj_weight = Parameter(empty((embed_dim, self.kdim), **kw))
            self.v_proj_weight = Parameter(empty((embed_dim, self.vdim), **kw))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(empty(3 * embed_dim, **kw))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **kw)
        if add_bias_kv:
            self.bias_k = Parameter(empty((1, 1, embed_dim), **kw))
            self.bias_v = Parameter(empty((1, 1, embed_dim), **kw))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        # torch's init: Xavier-uniform projections, zero biases, Xavier-normal bias_k/bias_v
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
            init.xavier_normal_(self.bias_v)

    def _project(self, query: Tensor, key: Tensor, value: Tensor):
        E = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None,) * 3 if b is None else (b[:E], b[E:2 * E], b[2 * E:])
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            wq, wk, wv = w[:E], w[E:2 * E], w[2 * E:]
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return NF.linear(query, wq, bq), NF.linear(key, wk, bk), NF.linear(value, wv, bv)

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                key_padding_mask: Tensor | None = None, need_weights: bool = True,
                attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False):
        """Attend from ``query`` to ``key``/``value``; see the class docstring for shapes.

        ``key_padding_mask`` (N, S) and ``attn_mask`` (L, S) or (N * num_heads, L, S): boolean
        (True: masked out) or float (added to the scores). ``is_causal`` is a hint that
        ``attn_mask`` is the causal mask, which must then be given, as in torch.
        """
        batched = query.ndim == 3
        if query.ndim not in (2, 3):
            raise AssertionError(f"query should be unbatched 2D or batched 3D tensor but "
                                 f"received {query.ndim}-D query tensor")
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the "
                               "Transformer module method `generate_square_subsequent_mask` to "
                               "create this mask.")
        if batched and self.batch_first:
            query, key, value = (F.transpose(x, 0, 1) for x in (query, key, value))
        if not batched:
            query, key, value = (F.unsqueeze(x, 1) for x in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = F.unsqueeze(key_padding_mask, 0)
        out, weights = self._attend(query, key, value, key_padding_mask, need_weights, attn_mask,
                                    average_attn_weights, is_causal)
        if not batched:
            return F.squeeze(out, 1), None if weights is None else F.squeeze(weights, 0)
        if self.batch_first:
            out = F.transpose(out, 0, 1)
        return out, weights

    def _attend(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                average_attn_weights, is_causal):
        L, N, E = query.shape
        H, hd = self.num_heads, self.head_dim
        if E != self.embed_dim:
            raise AssertionError(f"was expecting embedding dimension of {self.embed_dim}, but "
                                 f"got {E}")
        q, k, v = self._project(query, key, value)
        attn_mask = _additive_mask(attn_mask, q.dtype, "attn_mask")
        key_padding_mask = _additive_mask(key_padding_mask, q.dtype, "key_padding_mask")
        if attn_mask is not None:
            S = key.shape[0]
            if attn_mask.ndim == 2 and tuple(attn_mask.shape) != (L, S):
                raise RuntimeError(f"The shape of the 2D attn_mask is {tuple(attn_mask.shape)}, "
                                   f"but should be {(L, S)}.")
            if attn_mask.ndim == 3 and tuple(attn_mask.shape) != (N * H, L, S):
                raise RuntimeError(f"The shape of the 3D attn_mask is {tuple(attn_mask.shape)}, "
                                   f"but should be {(N * H, L, S)}.")
            attn_mask = F.reshape(attn_mask, (-1, H, L, S)) if attn_mask.ndim == 3 else attn_mask
        if self.bias_k is not None:
            k = F.cat([k, F.expand(self.bias_k, (1, N, E))], 0)
            v = F.cat([v, F.expand(self.bias_v, (1, N, E))], 0)
            attn_mask, key_padding_mask = _pad_last(attn_mask), _pad_last(key_padding_mask)
        # (S, N, E) -> (N, H, S, hd)
        q, k, v = (F.permute(F.reshape(x, (x.shape[0], N, H, hd)), (1, 2, 0, 3))
                   for x in (q, k, v))
        if self.add_zero_attn:
            k = F.cat([k, zeros((N, H, 1, hd), dtype=k.dtype)], 2)
            v = F.cat([v, zeros((N, H, 1, hd), dtype=v.dtype)], 2)
            attn_mask, key_padding_mask = _pad_last(attn_mask), _pad_last(key_padding_mask)
        S = k.shape[2]
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (N, S):
                raise AssertionError(f"expecting key_padding_mask shape of {(N, S)}, but got "
                                     f"{tuple(key_padding_mask.shape)}")
            kpm = F.reshape(key_padding_mask, (N, 1, 1, S))
            attn_mask = kpm if attn_mask is None else F.add(attn_mask, kpm)
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            scores = F.matmul(F.mul(q, math.sqrt(1.0 / hd)), F.transpose(k, -2, -1))
            if attn_mask is not None:
                scores = F.add(scores, attn_mask)
            # as torch, the weights returned are the ones used: after dropout
            weights = NF.dropout(NF.softmax(scores, -1), dropout_p)
            out = F.matmul(weights, v)
        else:
            causal = is_causal and key_padding_mask is None
            out = NF.scaled_dot_product_attention(q, k, v, None if causal else attn_mask,
                                                  dropout_p, is_causal=causal)
            weights = None
        # (N, H, L, hd) -> (L, N, E)
        out = F.reshape(F.permute(out, (2, 0, 1, 3)), (L, N, E))
        out = NF.linear(out, self.out_proj.weight, self.out_proj.bias)
        if weights is not None and average_attn_weights:
            weights = F.mean(weights, 1)
        return out, weights


def _activation(activation: str | Callable) -> Callable:
    if activation == "relu":
        return NF.relu
    if activation == "gelu":
        return NF.gelu
    if callable(activation):
        return activation
    raise RuntimeError(f"activation should be relu/gelu, not {activation}")


class TransformerEncoderLayer(Module):
    """Self-attention and a feed-forward block, each with a residual connection and LayerNorm
    (after the residual, or before the block with ``norm_first``), as torch's."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: str | Callable = "relu",
                 layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, **kw)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(activation)

    def forward(self, src: Tensor, src_mask: Tensor | None = None,
                src_key_padding_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """One encoder layer on ``src`` (masks as ``MultiheadAttention`` takes them)."""
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerDecoderLayer(Module):
    """Self-attention, attention over ``memory`` and a feed-forward block, each with a
    residual connection and LayerNorm, as torch's."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: str | Callable = "relu",
                 layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, **kw)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                 batch_first=batch_first, **kw)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = _activation(activation)

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, tgt_key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None, tgt_is_causal: bool = False,
                memory_is_causal: bool = False) -> Tensor:
        """One decoder layer on ``tgt`` attending to ``memory``."""
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask,
                                    memory_is_causal)
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask,
                                           memory_is_causal))
        return self.norm3(x + self._ff_block(x))

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           is_causal=is_causal, need_weights=False)[0]
        return self.dropout1(x)

    def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal):
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask,
                                key_padding_mask=key_padding_mask, is_causal=is_causal,
                                need_weights=False)[0]
        return self.dropout2(x)

    def _ff_block(self, x):
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))


def _clones(module: Module, n: int) -> ModuleList:
    return ModuleList([copy.deepcopy(module) for _ in range(n)])


def generate_square_subsequent_mask(sz: int, dtype=None) -> Tensor:
    """The (sz, sz) causal float mask: 0 on and below the diagonal, -inf above."""
    causal = F.tril(ones((sz, sz), dtype=dtypes.bool_))
    return F.where(causal, zeros((), dtype=dtype or dtypes.float32), -math.inf)


class TransformerEncoder(Module):
    """``num_layers`` copies of ``encoder_layer`` applied in turn, then ``norm`` if given."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int,
                 norm: Module | None = None, enable_nested_tensor: bool = True,
                 mask_check: bool = True) -> None:
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src: Tensor, mask: Tensor | None = None,
                src_key_padding_mask: Tensor | None = None,
                is_causal: bool | None = None) -> Tensor:
        """Run the layers on ``src``; ``mask`` and the padding mask go to every layer."""
        out = src
        for layer in self.layers:
            out = layer(out, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                        is_causal=bool(is_causal))
        return out if self.norm is None else self.norm(out)


class TransformerDecoder(Module):
    """``num_layers`` copies of ``decoder_layer`` applied in turn, then ``norm`` if given."""

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int,
                 norm: Module | None = None) -> None:
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, tgt_key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None,
                tgt_is_causal: bool | None = None, memory_is_causal: bool = False) -> Tensor:
        """Run the layers on ``tgt`` attending to ``memory``."""
        out = tgt
        for layer in self.layers:
            out = layer(out, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                        tgt_key_padding_mask=tgt_key_padding_mask,
                        memory_key_padding_mask=memory_key_padding_mask,
                        tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        return out if self.norm is None else self.norm(out)


class Transformer(Module):
    """The encoder-decoder model of "Attention Is All You Need", as torch's ``nn.Transformer``:
    an encoder and a decoder of ``num_*_layers`` layers, each ending in a LayerNorm, and every
    matrix Xavier-uniform initialized."""

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: str | Callable = "relu",
                 custom_encoder: Module | None = None, custom_decoder: Module | None = None,
                 layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        kw = dict(dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                  layer_norm_eps=layer_norm_eps, batch_first=batch_first,
                  norm_first=norm_first, bias=bias, device=device, dtype=dtype)
        norm = dict(eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.encoder = custom_encoder or TransformerEncoder(
            TransformerEncoderLayer(d_model, nhead, **kw), num_encoder_layers,
            LayerNorm(d_model, **norm))
        self.decoder = custom_decoder or TransformerDecoder(
            TransformerDecoderLayer(d_model, nhead, **kw), num_decoder_layers,
            LayerNorm(d_model, **norm))
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)
        self.d_model = d_model
        self.nhead = nhead
        self.batch_first = batch_first

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None,
                src_key_padding_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None,
                src_is_causal: bool | None = None, tgt_is_causal: bool | None = None,
                memory_is_causal: bool = False) -> Tensor:
        """Encode ``src``, then decode ``tgt`` attending to the encoding."""
        batch_dim = 0 if self.batch_first else 1
        if src.ndim == 3 and src.shape[batch_dim] != tgt.shape[batch_dim]:
            raise RuntimeError("the batch number of src and tgt must be equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError("the feature number of src and tgt must be equal to d_model")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=None) -> Tensor:
        """The (sz, sz) causal float mask: 0 on and below the diagonal, -inf above."""
        return generate_square_subsequent_mask(sz, dtype)
