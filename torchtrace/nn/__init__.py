"""torchtrace.nn: torch.nn layers whose gradients come from torchtrace's rules.

Each layer file holds the torch.nn.functional rules of its family (forward, hand-derived backward)
and its modules. Modules are torch.nn.Modules whose parameters are tracers (`Parameter`), so torch
code calling F.* on tracers is differentiated by the same rules.
"""
from torch.nn import functional, init  # noqa: F401  (torch's initialisers fill tracer parameters, same seeds)

from torchtrace.nn import (  # noqa: F401  (rules without modules: grid_sample, _weight_norm, aten norms, elu_)
    activation_inplace,
    gumbel_softmax,
    native,
    sampling,
    weight_norm,
)

if hasattr(functional, "linear_cross_entropy"):  # older torch releases have none: no rule to register
    from torchtrace.nn import linear_cross_entropy  # noqa: F401
from torchtrace.nn import parallel as parallel  # tt.nn.parallel.DistributedDataParallel
from torchtrace.nn.activation import (
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
    ReLU,
    ReLU6,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Softshrink,
    Softsign,
    Tanh,
    Tanhshrink,
    Threshold,
)
from torchtrace.nn.activation_parametric import PReLU, RReLU
from torchtrace.nn.attention import MultiheadAttention
from torchtrace.nn.container import Flatten, Identity, ModuleDict, ModuleList, Sequential, Unflatten
from torchtrace.nn.conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from torchtrace.nn.ctc import CTCLoss
from torchtrace.nn.distance import CosineSimilarity, PairwiseDistance
from torchtrace.nn.dropout import AlphaDropout, Dropout, Dropout1d, Dropout2d, Dropout3d, FeatureAlphaDropout
from torchtrace.nn.embedding import Embedding
from torchtrace.nn.embedding_bag import EmbeddingBag
from torchtrace.nn.fold import Fold, Unfold
from torchtrace.nn.linear import Bilinear, Linear
from torchtrace.nn.local_response_norm import LocalResponseNorm
from torchtrace.nn.loss import (
    MSE,
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from torchtrace.nn.loss_margin import (
    CosineEmbeddingLoss,
    HingeEmbeddingLoss,
    MarginRankingLoss,
    MultiLabelMarginLoss,
    MultiLabelSoftMarginLoss,
    MultiMarginLoss,
    SoftMarginLoss,
    TripletMarginLoss,
    TripletMarginWithDistanceLoss,
)
from torchtrace.nn.loss_probabilistic import GaussianNLLLoss, PoissonNLLLoss
from torchtrace.nn.lp_pooling import LPPool1d, LPPool2d, LPPool3d
from torchtrace.nn.module import Model, Module, Parameter
from torchtrace.nn.normalization import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    GroupNorm,
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
    LayerNorm,
    RMSNorm,
)
from torchtrace.nn.pixelshuffle import ChannelShuffle, PixelShuffle, PixelUnshuffle
from torchtrace.nn.pooling import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AdaptiveMaxPool3d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    FractionalMaxPool2d,
    FractionalMaxPool3d,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
)
from torchtrace.nn.recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from torchtrace.nn.unpooling import MaxUnpool1d, MaxUnpool2d, MaxUnpool3d
from torchtrace.nn.upsampling import Upsample, UpsamplingBilinear2d, UpsamplingNearest2d

__all__ = [
    "Module", "Model", "Parameter", "Sequential", "ModuleList", "ModuleDict", "Identity", "Flatten", "Unflatten",
    "Linear", "Bilinear", "ReLU", "ReLU6", "LeakyReLU", "ELU", "GELU", "SiLU", "Mish", "Softplus", "Sigmoid",
    "Tanh", "Hardtanh", "Softmax", "LogSoftmax", "MSELoss", "MSE", "L1Loss", "SmoothL1Loss", "HuberLoss",
    "CrossEntropyLoss", "NLLLoss", "BCELoss", "BCEWithLogitsLoss", "KLDivLoss", "MultiheadAttention",
    "RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
    "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LayerNorm", "GroupNorm", "RMSNorm", "Dropout",
    "Dropout1d", "Dropout2d", "Dropout3d", "Embedding", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d",
    "ConvTranspose2d", "ConvTranspose3d", "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d",
    "AvgPool3d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "init", "functional",
    # activations, distances, alpha dropout and the remaining losses
    "SELU", "CELU", "GLU", "Hardswish", "Hardsigmoid", "LogSigmoid", "Softsign", "Softshrink", "Hardshrink",
    "Tanhshrink", "Threshold", "PReLU", "RReLU", "AlphaDropout", "FeatureAlphaDropout", "CosineSimilarity",
    "PairwiseDistance", "CosineEmbeddingLoss", "MarginRankingLoss", "TripletMarginLoss",
    "TripletMarginWithDistanceLoss", "MultiMarginLoss", "MultiLabelMarginLoss", "MultiLabelSoftMarginLoss",
    "SoftMarginLoss", "PoissonNLLLoss",
    "GaussianNLLLoss", "HingeEmbeddingLoss", "CTCLoss",
    "PixelShuffle", "PixelUnshuffle", "ChannelShuffle", "Unfold", "Fold", "LocalResponseNorm", "MaxUnpool1d",
    "MaxUnpool2d", "MaxUnpool3d", "FractionalMaxPool2d", "FractionalMaxPool3d", "LPPool1d", "LPPool2d", "LPPool3d",
    "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d", "EmbeddingBag",
]
