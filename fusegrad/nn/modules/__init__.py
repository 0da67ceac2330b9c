"""The module classes of ``fusegrad.nn``, one file per family as in torch.nn.modules."""

from fusegrad.nn.modules import utils  # noqa: F401  (torch.nn.modules.utils)
from fusegrad.nn.modules.activation import (
    CELU,
    ELU,
    GELU,
    GLU,
    SELU,
    Hardshrink,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    LeakyReLU,
    LogSigmoid,
    LogSoftmax,
    Mish,
    PReLU,
    ReLU,
    ReLU6,
    Sigmoid,
    SiLU,
    Softmax,
    Softmin,
    Softplus,
    Softshrink,
    Softsign,
    Tanh,
    Tanhshrink,
    Threshold,
)
from fusegrad.nn.modules.batchnorm import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
)
from fusegrad.nn.modules.container import ModuleDict, ModuleList, Sequential
from fusegrad.nn.modules.conv import (
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
    Fold,
    Unfold,
)
from fusegrad.nn.modules.distance import CosineSimilarity, PairwiseDistance
from fusegrad.nn.modules.dropout import (
    AlphaDropout,
    Dropout,
    Dropout1d,
    Dropout2d,
    Dropout3d,
    FeatureAlphaDropout,
)
from fusegrad.nn.modules.linear import Bilinear, Flatten, Identity, Linear, Unflatten
from fusegrad.nn.modules.loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
)
from fusegrad.nn.modules.loss_more import (
    CosineEmbeddingLoss,
    GaussianNLLLoss,
    HingeEmbeddingLoss,
    HuberLoss,
    KLDivLoss,
    MarginRankingLoss,
    MultiLabelSoftMarginLoss,
    MultiMarginLoss,
    PoissonNLLLoss,
    SmoothL1Loss,
    SoftMarginLoss,
    TripletMarginLoss,
    TripletMarginWithDistanceLoss,
)
from fusegrad.nn.modules.module import Module
from fusegrad.nn.modules.normalization import GroupNorm, LayerNorm, RMSNorm
from fusegrad.nn.modules.padding import (
    CircularPad1d,
    CircularPad2d,
    CircularPad3d,
    ConstantPad1d,
    ConstantPad2d,
    ConstantPad3d,
    ReflectionPad1d,
    ReflectionPad2d,
    ReflectionPad3d,
    ReplicationPad1d,
    ReplicationPad2d,
    ReplicationPad3d,
    ZeroPad1d,
    ZeroPad2d,
    ZeroPad3d,
)
from fusegrad.nn.modules.parameter_containers import ParameterDict, ParameterList
from fusegrad.nn.modules.pixelshuffle import PixelShuffle, PixelUnshuffle
from fusegrad.nn.modules.pooling import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AdaptiveMaxPool3d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
    MaxUnpool1d,
    MaxUnpool2d,
    MaxUnpool3d,
)
from fusegrad.nn.modules.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from fusegrad.nn.modules.sparse import Embedding
from fusegrad.nn.modules.transformer import (
    MultiheadAttention,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from fusegrad.nn.modules.upsampling import Upsample, UpsamplingBilinear2d, UpsamplingNearest2d

__all__ = [
    "Module", "Sequential", "ModuleList", "ModuleDict", "Identity", "Linear", "Flatten",
    "Unflatten", "Embedding", "LayerNorm", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d",
    "AlphaDropout", "FeatureAlphaDropout", "ReLU", "GELU", "Tanh", "Sigmoid", "SiLU",
    "Softmax", "LogSoftmax", "LeakyReLU", "Softplus", "MSELoss", "L1Loss", "CrossEntropyLoss",
    "NLLLoss", "BCELoss", "BCEWithLogitsLoss",
    "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "Unfold", "Fold",
    "MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
    "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "BatchNorm1d", "BatchNorm2d", "InstanceNorm1d",
    "InstanceNorm2d", "GroupNorm", "RMSNorm", "Hardtanh", "ReLU6", "ELU", "SELU", "CELU", "Mish",
    "Hardswish", "Hardsigmoid", "PReLU", "Softsign", "Tanhshrink", "Conv3d", "ConvTranspose3d",
    "LogSigmoid", "Softshrink", "Hardshrink",
    "MaxPool3d", "AvgPool3d", "BatchNorm3d", "InstanceNorm3d",
    "MultiheadAttention", "TransformerEncoderLayer", "TransformerDecoderLayer",
    "TransformerEncoder", "TransformerDecoder", "Transformer", "RNN", "LSTM", "GRU", "RNNCell", "LSTMCell",
    "GRUCell",
]
__all__ += ["Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d", "SmoothL1Loss", "HuberLoss",
            "KLDivLoss", "CosineEmbeddingLoss", "ParameterList", "ParameterDict", "MaxUnpool1d",
            "MaxUnpool2d", "MaxUnpool3d", "AdaptiveAvgPool3d", "AdaptiveMaxPool3d"]
__all__ += ["ZeroPad1d", "ZeroPad2d", "ZeroPad3d", "ConstantPad1d", "ConstantPad2d",
            "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d",
            "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "CircularPad1d",
            "CircularPad2d", "CircularPad3d"]
__all__ += ["PixelShuffle", "PixelUnshuffle", "GLU", "Softmin", "Threshold", "CosineSimilarity",
            "PairwiseDistance", "Bilinear"]
__all__ += ["PoissonNLLLoss", "GaussianNLLLoss", "MarginRankingLoss", "HingeEmbeddingLoss",
            "SoftMarginLoss", "MultiLabelSoftMarginLoss", "MultiMarginLoss", "TripletMarginLoss",
            "TripletMarginWithDistanceLoss"]
