"""``fusegrad.nn.functional``: torch.nn.functional's activations, layers and losses.

The functions are defined in :mod:`fusegrad.ops`, one module per family
(:mod:`~fusegrad.ops.activations`, :mod:`~fusegrad.ops.softmax`,
:mod:`~fusegrad.ops.normalization`, :mod:`~fusegrad.ops.losses`, :mod:`~fusegrad.ops.dropout`,
:mod:`~fusegrad.ops.layers`, :mod:`~fusegrad.ops.padding`, the convolutions, pools and
attention); this module gathers them under torch's names.
"""

from __future__ import annotations

from fusegrad.ops import autocast as _autocast
from fusegrad.ops import functional as F
from fusegrad.ops.activations import (
    celu,
    elu,
    gelu,
    glu,
    hardshrink,
    hardsigmoid,
    hardswish,
    hardtanh,
    leaky_relu,
    logsigmoid,
    mish,
    prelu,
    relu,
    relu6,
    relu_,
    selu,
    silu,
    softplus,
    softshrink,
    softsign,
    tanhshrink,
    threshold,
    threshold_,
)
from fusegrad.ops.attention import scaled_dot_product_attention
from fusegrad.ops.convolution import (
    conv1d,
    conv2d,
    conv3d,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
    fold,
    unfold,
)
from fusegrad.ops.dropout import (
    alpha_dropout,
    dropout,
    dropout1d,
    dropout2d,
    dropout3d,
    feature_alpha_dropout,
)
from fusegrad.ops.interpolate import interpolate, upsample
from fusegrad.ops.layers import (
    bilinear,
    embedding,
    linear,
    normalize,
    one_hot,
    pairwise_distance,
    pixel_shuffle,
    pixel_unshuffle,
)
from fusegrad.ops.losses import (
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    cosine_embedding_loss,
    cross_entropy,
    gaussian_nll_loss,
    hinge_embedding_loss,
    huber_loss,
    kl_div,
    l1_loss,
    margin_ranking_loss,
    mse_loss,
    multi_margin_loss,
    multilabel_soft_margin_loss,
    nll_loss,
    poisson_nll_loss,
    smooth_l1_loss,
    soft_margin_loss,
    triplet_margin_loss,
    triplet_margin_with_distance_loss,
)
from fusegrad.ops.normalization import batch_norm, group_norm, instance_norm, layer_norm, rms_norm
from fusegrad.ops.padding import pad
from fusegrad.ops.pooling import (
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_avg_pool3d,
    adaptive_max_pool1d,
    adaptive_max_pool2d,
    adaptive_max_pool3d,
    avg_pool1d,
    avg_pool2d,
    avg_pool3d,
    max_pool1d,
    max_pool1d_with_indices,
    max_pool2d,
    max_pool2d_with_indices,
    max_pool3d,
    max_unpool1d,
    max_unpool2d,
    max_unpool3d,
)
from fusegrad.ops.products import cosine_similarity
from fusegrad.ops.softmax import log_softmax, softmax, softmin
from fusegrad.torch_api import missing_attribute as _missing_attribute

__all__ = [
    "relu", "relu_", "gelu", "silu", "softplus", "leaky_relu", "sigmoid", "tanh", "softmax",
    "log_softmax", "linear", "dropout", "layer_norm", "embedding", "one_hot", "mse_loss",
    "l1_loss", "cross_entropy", "nll_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "normalize", "pad",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "unfold", "fold", "max_pool3d", "avg_pool3d",
    "max_pool1d", "max_pool2d", "max_pool1d_with_indices", "max_pool2d_with_indices",
    "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
    "adaptive_max_pool1d", "adaptive_max_pool2d", "batch_norm", "group_norm", "instance_norm",
    "rms_norm", "hardtanh", "relu6", "elu", "selu", "celu", "mish", "hardswish", "hardsigmoid",
    "prelu", "softsign", "tanhshrink", "scaled_dot_product_attention", "logsigmoid",
    "softshrink", "hardshrink", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
    "feature_alpha_dropout", "threshold", "threshold_", "softmin", "glu",
]

__all__ += ["cosine_similarity", "interpolate", "upsample", "smooth_l1_loss", "huber_loss", "kl_div",
            "cosine_embedding_loss", "adaptive_avg_pool3d", "adaptive_max_pool3d", "max_unpool1d",
            "max_unpool2d", "max_unpool3d", "pixel_shuffle", "pixel_unshuffle", "pairwise_distance",
            "bilinear", "poisson_nll_loss", "gaussian_nll_loss", "margin_ranking_loss",
            "hinge_embedding_loss", "soft_margin_loss", "multilabel_soft_margin_loss",
            "multi_margin_loss", "triplet_margin_loss", "triplet_margin_with_distance_loss"]


sigmoid = F.sigmoid
tanh = F.tanh

# torch's autocast lists name nn.functional's ops too (the convolutions, pools, attention):
# those gathered here from modules that do not wrap their own are wrapped once, here.
_autocast.wrap_namespace(globals())


def __getattr__(name: str):
    raise _missing_attribute("torch.nn.functional", "fusegrad.nn.functional", name)
