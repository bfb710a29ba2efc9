"""The nn surface audit: every public torch.nn.functional callable and every torch.nn Module class is called on
small float64 tracers that require grad. Each either gives torch's outputs and torch's gradients (inputs and
parameters), or raises UnsupportedOperationError — never a silently wrong or missing gradient. Callables that
take no floating input (or are helpers) are listed with the reason. `python -m pytest -s tests/test_nn_surface.py`
prints the refused ones with their messages (the README's Limitations)."""
import copy
import inspect
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten

import torchtrace as tt

D = torch.float64


def r(*shape: int, seed: int = 0, low: Optional[float] = None) -> torch.Tensor:
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed + sum(shape)), dtype=D)
    return t.abs() + low if low is not None else t


def p(*shape: int, seed: int = 0) -> torch.Tensor:
    """Probabilities in (0.1, 0.9)."""
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed + 7), dtype=D) * 0.8 + 0.1


IDX = torch.tensor([1, 0, 3])
IMG, SEQ, VOL = r(2, 3, 6, 6), r(2, 3, 8), r(1, 2, 4, 4, 4)
POOLED_INDICES = F.max_pool2d(IMG, 2, return_indices=True)[1]

# name -> (call, float inputs that require grad)
F_CALLS: Dict[str, Tuple[Callable, tuple]] = {
    "adaptive_avg_pool1d": (lambda x: F.adaptive_avg_pool1d(x, 3), (SEQ,)),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (4, 3)), (IMG,)),
    "adaptive_avg_pool3d": (lambda x: F.adaptive_avg_pool3d(x, 3), (VOL,)),
    "adaptive_max_pool1d": (lambda x: F.adaptive_max_pool1d(x, 3), (SEQ,)),
    "adaptive_max_pool1d_with_indices": (lambda x: F.adaptive_max_pool1d_with_indices(x, 3), (SEQ,)),
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x, 4), (IMG,)),
    "adaptive_max_pool2d_with_indices": (lambda x: F.adaptive_max_pool2d_with_indices(x, 4), (IMG,)),
    "adaptive_max_pool3d": (lambda x: F.adaptive_max_pool3d(x, 2), (VOL,)),
    "adaptive_max_pool3d_with_indices": (lambda x: F.adaptive_max_pool3d_with_indices(x, 2), (VOL,)),
    "affine_grid": (lambda th: F.affine_grid(th, [2, 3, 4, 5], align_corners=False), (r(2, 2, 3),)),
    "alpha_dropout": (lambda x: F.alpha_dropout(x, 0.3, training=True), (r(4, 5),)),
    "avg_pool1d": (lambda x: F.avg_pool1d(x, 3, 2, 1), (SEQ,)),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), (IMG,)),
    "avg_pool3d": (lambda x: F.avg_pool3d(x, 2), (VOL,)),
    "batch_norm": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), (IMG, r(3), r(3))),
    "bilinear": (lambda a, b, w, bias: F.bilinear(a, b, w, bias), (r(4, 3), r(4, 2), r(5, 3, 2), r(5))),
    "binary_cross_entropy": (lambda x, t: F.binary_cross_entropy(x, t), (p(4, 3), p(4, 3, seed=1))),
    "binary_cross_entropy_with_logits": (lambda x, t: F.binary_cross_entropy_with_logits(x, t, pos_weight=r(3) ** 2),
                                         (r(4, 3), p(4, 3))),
    "celu": (lambda x: F.celu(x, 0.7), (r(4, 5),)),
    "celu_": (lambda x: F.celu_(x * 1), (r(4, 5),)),
    "channel_shuffle": (lambda x: F.channel_shuffle(x, 3), (r(2, 6, 3),)),
    "native_channel_shuffle": (lambda x: F.native_channel_shuffle(x, 3), (r(2, 6, 3),)),
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b, padding=1), (SEQ, r(4, 3, 3), r(4))),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=2), (IMG, r(4, 3, 3, 3), r(4))),
    "conv3d": (lambda x, w: F.conv3d(x, w), (VOL, r(2, 2, 2, 2, 2))),
    "conv_tbc": (lambda x, w, b: F.conv_tbc(x, w, b, 1), (r(5, 2, 3), r(3, 3, 4), r(4))),
    "conv_transpose1d": (lambda x, w: F.conv_transpose1d(x, w, stride=2), (SEQ, r(3, 2, 3))),
    "conv_transpose2d": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, output_padding=1),
                         (IMG, r(3, 2, 3, 3), r(2))),
    "conv_transpose3d": (lambda x, w: F.conv_transpose3d(x, w), (VOL, r(2, 2, 2, 2, 2))),
    "cosine_embedding_loss": (lambda a, b: F.cosine_embedding_loss(a, b, torch.tensor([1, -1, 1, -1]), 0.1),
                              (r(4, 3), r(4, 3, seed=1))),
    "cosine_similarity": (lambda a, b: F.cosine_similarity(a, b), (r(4, 3), r(4, 3, seed=1))),
    "cross_entropy": (lambda x: F.cross_entropy(x, torch.tensor([1, 0, 3]), label_smoothing=0.1), (r(3, 4),)),
    "ctc_loss": (lambda x: F.ctc_loss(x.log_softmax(2), torch.tensor([[1, 2], [2, 2]]), [5, 5], [2, 2]),
                 (r(5, 2, 3),)),
    "dropout": (lambda x: F.dropout(x, 0.4), (r(4, 5),)),
    "dropout1d": (lambda x: F.dropout1d(x, 0.4), (r(2, 3, 4),)),
    "dropout2d": (lambda x: F.dropout2d(x, 0.4), (IMG,)),
    "dropout3d": (lambda x: F.dropout3d(x, 0.4), (VOL,)),
    "elu": (lambda x: F.elu(x, 0.5), (r(4, 5),)),
    "elu_": (lambda x: F.elu_(x * 1), (r(4, 5),)),
    "embedding": (lambda w: F.embedding(torch.tensor([[1, 0], [3, 1]]), w, padding_idx=0), (r(5, 3),)),
    "embedding_bag": (lambda w: F.embedding_bag(torch.tensor([1, 0, 3, 1]), w, torch.tensor([0, 2]), mode="mean"),
                      (r(5, 3),)),
    "feature_alpha_dropout": (lambda x: F.feature_alpha_dropout(x, 0.3, training=True), (IMG,)),
    "fold": (lambda x: F.fold(x, (4, 5), (2, 2)), (r(2, 12, 12),)),
    "fractional_max_pool2d": (lambda x: F.fractional_max_pool2d(x, 2, output_ratio=(0.5, 0.5)), (IMG,)),
    "fractional_max_pool2d_with_indices": (lambda x: F.fractional_max_pool2d_with_indices(x, 2, output_size=3),
                                           (IMG,)),
    "fractional_max_pool3d": (lambda x: F.fractional_max_pool3d(x, 2, output_size=2), (VOL,)),
    "fractional_max_pool3d_with_indices": (lambda x: F.fractional_max_pool3d_with_indices(x, 2, output_size=2),
                                           (VOL,)),
    "gaussian_nll_loss": (lambda x, t, v: F.gaussian_nll_loss(x, t, v), (r(4, 3), r(4, 3, seed=1), p(4, 3))),
    "gelu": (lambda x: F.gelu(x, approximate="tanh"), (r(4, 5),)),
    "glu": (lambda x: F.glu(x, 1), (r(4, 6),)),
    "grid_sample": (lambda x, g: F.grid_sample(x, g, align_corners=False), (IMG, r(2, 3, 2, 2) * 0.8)),
    "group_norm": (lambda x, w, b: F.group_norm(x, 3, w, b), (IMG, r(3), r(3))),
    "gumbel_softmax": (lambda x: F.gumbel_softmax(x, tau=0.5), (r(3, 4),)),
    "hardshrink": (lambda x: F.hardshrink(x, 0.4), (r(4, 5),)),
    "hardsigmoid": (lambda x: F.hardsigmoid(x * 4), (r(4, 5),)),
    "hardswish": (lambda x: F.hardswish(x * 4), (r(4, 5),)),
    "hardtanh": (lambda x: F.hardtanh(x, -0.5, 0.6), (r(4, 5),)),
    "hardtanh_": (lambda x: F.hardtanh_(x * 1), (r(4, 5),)),
    "hinge_embedding_loss": (lambda x: F.hinge_embedding_loss(x, torch.tensor([1, -1, 1, -1.0], dtype=D)), (r(4),)),
    "huber_loss": (lambda x, t: F.huber_loss(x, t, delta=0.5), (r(4, 3), r(4, 3, seed=1))),
    "instance_norm": (lambda x, w, b: F.instance_norm(x, weight=w, bias=b), (IMG, r(3), r(3))),
    "interpolate": (lambda x: F.interpolate(x, scale_factor=1.5, mode="bicubic"), (IMG,)),
    "kl_div": (lambda x, t: F.kl_div(x, t, reduction="batchmean"), (r(4, 3), p(4, 3))),
    "l1_loss": (lambda x, t: F.l1_loss(x, t), (r(4, 3), r(4, 3, seed=1))),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, [6], w, b), (IMG, r(6), r(6))),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), (r(4, 5),)),
    "leaky_relu_": (lambda x: F.leaky_relu_(x * 1, 0.2), (r(4, 5),)),
    "linear": (lambda x, w, b: F.linear(x, w, b), (r(4, 3), r(5, 3), r(5))),
    "linear_cross_entropy": (lambda x, w: F.linear_cross_entropy(x, w, IDX), (r(3, 4), r(5, 4))),
    "local_response_norm": (lambda x: F.local_response_norm(x, 2), (IMG,)),
    "log_softmax": (lambda x: F.log_softmax(x, 1), (r(4, 5),)),
    "logsigmoid": (lambda x: F.logsigmoid(x), (r(4, 5),)),
    "lp_pool1d": (lambda x: F.lp_pool1d(x, 2, 2), (SEQ,)),
    "lp_pool2d": (lambda x: F.lp_pool2d(x, 3, 2), (IMG,)),
    "lp_pool3d": (lambda x: F.lp_pool3d(x, 2, 2), (VOL,)),
    "margin_ranking_loss": (lambda a, b: F.margin_ranking_loss(a, b, torch.tensor([1, -1, 1.0], dtype=D), 0.1),
                            (r(3), r(3, seed=1))),
    "max_pool1d": (lambda x: F.max_pool1d(x, 3, 2), (SEQ,)),
    "max_pool1d_with_indices": (lambda x: F.max_pool1d_with_indices(x, 3, 2), (SEQ,)),
    "max_pool2d": (lambda x: F.max_pool2d(x, 3, 2, 1, dilation=1, ceil_mode=True), (IMG,)),
    "max_pool2d_with_indices": (lambda x: F.max_pool2d_with_indices(x, 2), (IMG,)),
    "max_pool3d": (lambda x: F.max_pool3d(x, 2), (VOL,)),
    "max_pool3d_with_indices": (lambda x: F.max_pool3d_with_indices(x, 2), (VOL,)),
    "max_unpool1d": (lambda x: F.max_unpool1d(*F.max_pool1d(x, 2, return_indices=True), 2), (SEQ,)),
    "max_unpool2d": (lambda x: F.max_unpool2d(x, POOLED_INDICES, 2), (r(2, 3, 3, 3),)),
    "max_unpool3d": (lambda x: F.max_unpool3d(*F.max_pool3d(x, 2, return_indices=True), 2), (VOL,)),
    "mish": (lambda x: F.mish(x), (r(4, 5),)),
    "mse_loss": (lambda x, t: F.mse_loss(x, t), (r(4, 3), r(4, 3, seed=1))),
    "multi_head_attention_forward": (
        lambda q, w, b, ow, ob: F.multi_head_attention_forward(q, q, q, 4, 2, w, b, None, None, False, 0.0, ow, ob),
        (r(3, 2, 4), r(12, 4), r(12), r(4, 4), r(4))),
    "multi_margin_loss": (lambda x: F.multi_margin_loss(x, IDX, p=2, margin=0.5), (r(3, 4),)),
    "multilabel_margin_loss": (lambda x: F.multilabel_margin_loss(x, torch.tensor([[1, 3, -1, 0], [0, -1, 2, 2]])),
                               (r(2, 4),)),
    "multilabel_soft_margin_loss": (lambda x: F.multilabel_soft_margin_loss(x, torch.tensor([[1, 0, 1.0]], dtype=D)),
                                    (r(2, 3),)),
    "nll_loss": (lambda x: F.nll_loss(x, IDX), (r(3, 4),)),
    "normalize": (lambda x: F.normalize(x, p=3, dim=0), (r(4, 5),)),
    "pad": (lambda x: F.pad(x, (1, 2, 2, 0), mode="reflect"), (IMG,)),
    "pairwise_distance": (lambda a, b: F.pairwise_distance(a, b, p=1.5), (r(4, 3), r(4, 3, seed=1))),
    "pdist": (lambda x: F.pdist(x), (r(4, 3),)),
    "pixel_shuffle": (lambda x: F.pixel_shuffle(x, 2), (r(1, 8, 2, 3),)),
    "pixel_unshuffle": (lambda x: F.pixel_unshuffle(x, 2), (r(1, 2, 4, 6),)),
    "poisson_nll_loss": (lambda x, t: F.poisson_nll_loss(x, t, full=True), (r(4, 3), p(4, 3) * 5)),
    "prelu": (lambda x, w: F.prelu(x, w), (IMG, r(3))),
    "relu": (lambda x: F.relu(x), (r(4, 5),)),
    "relu6": (lambda x: F.relu6(x * 4), (r(4, 5),)),
    "relu_": (lambda x: F.relu_(x * 1), (r(4, 5),)),
    "rms_norm": (lambda x, w: F.rms_norm(x, [6], w), (IMG, r(6))),
    "rrelu": (lambda x: F.rrelu(x, training=True), (r(4, 5),)),
    "rrelu_": (lambda x: F.rrelu_(x * 1, training=False), (r(4, 5),)),
    "scaled_dot_product_attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                     (r(2, 3, 4), r(2, 3, 4, seed=1), r(2, 3, 4, seed=2))),
    "selu": (lambda x: F.selu(x), (r(4, 5),)),
    "selu_": (lambda x: F.selu_(x * 1), (r(4, 5),)),
    "sigmoid": (lambda x: F.sigmoid(x), (r(4, 5),)),
    "silu": (lambda x: F.silu(x), (r(4, 5),)),
    "smooth_l1_loss": (lambda x, t: F.smooth_l1_loss(x, t, beta=0.5), (r(4, 3), r(4, 3, seed=1))),
    "soft_margin_loss": (lambda x: F.soft_margin_loss(x, torch.tensor([1, -1, 1.0], dtype=D)), (r(3),)),
    "softmax": (lambda x: F.softmax(x, 0), (r(4, 5),)),
    "softmin": (lambda x: F.softmin(x, 1), (r(4, 5),)),
    "softplus": (lambda x: F.softplus(x, beta=2, threshold=1), (r(4, 5),)),
    "softshrink": (lambda x: F.softshrink(x, 0.3), (r(4, 5),)),
    "softsign": (lambda x: F.softsign(x), (r(4, 5),)),
    "tanh": (lambda x: F.tanh(x), (r(4, 5),)),
    "tanhshrink": (lambda x: F.tanhshrink(x), (r(4, 5),)),
    "threshold": (lambda x: F.threshold(x, 0.1, -2.0), (r(4, 5),)),
    "threshold_": (lambda x: F.threshold_(x * 1, 0.1, -2.0), (r(4, 5),)),
    "triplet_margin_loss": (lambda a, b, c: F.triplet_margin_loss(a, b, c, swap=True),
                            (r(4, 3), r(4, 3, seed=1), r(4, 3, seed=2))),
    "triplet_margin_with_distance_loss": (lambda a, b, c: F.triplet_margin_with_distance_loss(a, b, c, margin=0.5),
                                          (r(4, 3), r(4, 3, seed=1), r(4, 3, seed=2))),
    "unfold": (lambda x: F.unfold(x, 2, padding=1, stride=2), (IMG,)),
    "upsample": (lambda x: F.upsample(x, scale_factor=2, mode="nearest"), (IMG,)),
    "upsample_bilinear": (lambda x: F.upsample_bilinear(x, scale_factor=2), (IMG,)),
    "upsample_nearest": (lambda x: F.upsample_nearest(x, size=(7, 9)), (IMG,)),
}

F_NOT_CALLED = {
    "Optional": "typing helper, not a function", "assert_int_or_pair": "argument checker",
    "boolean_dispatch": "decorator factory", "handle_torch_function": "override machinery",
    "has_torch_function": "override machinery", "has_torch_function_unary": "override machinery",
    "has_torch_function_variadic": "override machinery", "one_hot": "integer input, integer output",
    "grouped_mm": "low-precision grouped GEMM for CUDA (bfloat16 / float8); not on CPU float64",
    "scaled_grouped_mm": "float8 scaled GEMM (CUDA only)", "scaled_mm": "float8 scaled GEMM (CUDA only)",
}


def _module(cls: type, *args: Any, **kwargs: Any) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        torch.manual_seed(0)
        return cls(*args, **kwargs).to(D)
    return make


def _seq(n_out: int = 4) -> Tuple[torch.Tensor]:
    return (r(3, 2, n_out),)


class LogSoftmaxFirst(nn.Module):
    """CTC's log_probs come from log_softmax in the graph (on raw log_probs torch's gradient is not the derivative of
    the value it returns: see torchtrace/nn/ctc.py)."""

    def forward(self, x: torch.Tensor, *rest: Any) -> Any:
        return (x.log_softmax(2), *rest)


class Sequential(nn.Sequential):
    def forward(self, *args: Any) -> Any:
        return self[1](*self[0](*args))


# name -> (module factory, float inputs that require grad, extra non-grad arguments)
M_CALLS: Dict[str, Tuple[Callable, tuple, tuple]] = {
    "AdaptiveAvgPool1d": (_module(nn.AdaptiveAvgPool1d, 3), (SEQ,), ()),
    "AdaptiveAvgPool2d": (_module(nn.AdaptiveAvgPool2d, 4), (IMG,), ()),
    "AdaptiveAvgPool3d": (_module(nn.AdaptiveAvgPool3d, 3), (VOL,), ()),
    "AdaptiveLogSoftmaxWithLoss": (_module(nn.AdaptiveLogSoftmaxWithLoss, 4, 6, [2, 4]), (r(3, 4),),
                                   (torch.tensor([0, 3, 5]),)),
    "AdaptiveMaxPool1d": (_module(nn.AdaptiveMaxPool1d, 3), (SEQ,), ()),
    "AdaptiveMaxPool2d": (_module(nn.AdaptiveMaxPool2d, 4), (IMG,), ()),
    "AdaptiveMaxPool3d": (_module(nn.AdaptiveMaxPool3d, 2), (VOL,), ()),
    "AlphaDropout": (_module(nn.AlphaDropout, 0.3), (r(4, 5),), ()),
    "AvgPool1d": (_module(nn.AvgPool1d, 3), (SEQ,), ()),
    "AvgPool2d": (_module(nn.AvgPool2d, 2), (IMG,), ()),
    "AvgPool3d": (_module(nn.AvgPool3d, 2), (VOL,), ()),
    "BCELoss": (_module(nn.BCELoss), (p(4, 3), p(4, 3, seed=1)), ()),
    "BCEWithLogitsLoss": (_module(nn.BCEWithLogitsLoss), (r(4, 3), p(4, 3)), ()),
    "BatchNorm1d": (_module(nn.BatchNorm1d, 3), (SEQ,), ()),
    "BatchNorm2d": (_module(nn.BatchNorm2d, 3), (IMG,), ()),
    "BatchNorm3d": (_module(nn.BatchNorm3d, 2), (VOL,), ()),
    "Bilinear": (_module(nn.Bilinear, 3, 2, 5), (r(4, 3), r(4, 2)), ()),
    "CELU": (_module(nn.CELU), (r(4, 5),), ()),
    "CTCLoss": (_module(lambda: Sequential(LogSoftmaxFirst(), nn.CTCLoss())), (r(5, 2, 3),),
                (torch.tensor([[1, 2], [2, 2]]), [5, 5], [2, 2])),
    "ChannelShuffle": (_module(nn.ChannelShuffle, 3), (r(2, 6, 3),), ()),
    "CircularPad1d": (_module(nn.CircularPad1d, 2), (SEQ,), ()),
    "CircularPad2d": (_module(nn.CircularPad2d, (1, 2, 0, 1)), (IMG,), ()),
    "CircularPad3d": (_module(nn.CircularPad3d, 1), (VOL,), ()),
    "ConstantPad1d": (_module(nn.ConstantPad1d, 2, 1.5), (SEQ,), ()),
    "ConstantPad2d": (_module(nn.ConstantPad2d, (1, 0, 2, 1), -1.0), (IMG,), ()),
    "ConstantPad3d": (_module(nn.ConstantPad3d, 1, 0.5), (VOL,), ()),
    "Conv1d": (_module(nn.Conv1d, 3, 4, 3, padding="same"), (SEQ,), ()),
    "Conv2d": (_module(nn.Conv2d, 3, 4, 3, padding_mode="reflect", padding=1), (IMG,), ()),
    "Conv3d": (_module(nn.Conv3d, 2, 2, 2), (VOL,), ()),
    "ConvTranspose1d": (_module(nn.ConvTranspose1d, 3, 2, 3, stride=2), (SEQ,), ()),
    "ConvTranspose2d": (_module(nn.ConvTranspose2d, 3, 2, 3, stride=2, output_padding=1), (IMG,), ()),
    "ConvTranspose3d": (_module(nn.ConvTranspose3d, 2, 2, 2), (VOL,), ()),
    "CosineEmbeddingLoss": (_module(nn.CosineEmbeddingLoss), (r(4, 3), r(4, 3, seed=1)),
                            (torch.tensor([1, -1, 1, -1]),)),
    "CosineSimilarity": (_module(nn.CosineSimilarity), (r(4, 3), r(4, 3, seed=1)), ()),
    "CrossEntropyLoss": (_module(nn.CrossEntropyLoss), (r(3, 4),), (IDX,)),
    "CrossMapLRN2d": (_module(nn.CrossMapLRN2d, 3), (IMG,), ()),
    "Dropout": (_module(nn.Dropout, 0.4), (r(4, 5),), ()),
    "Dropout1d": (_module(nn.Dropout1d, 0.4), (r(2, 3, 4),), ()),
    "Dropout2d": (_module(nn.Dropout2d, 0.4), (IMG,), ()),
    "Dropout3d": (_module(nn.Dropout3d, 0.4), (VOL,), ()),
    "ELU": (_module(nn.ELU), (r(4, 5),), ()),
    "Embedding": (_module(nn.Embedding, 5, 3, max_norm=1.0), (), (torch.tensor([[1, 0], [3, 1]]),)),
    "EmbeddingBag": (_module(nn.EmbeddingBag, 5, 3, mode="max"), (), (torch.tensor([[1, 0], [3, 1]]),)),
    "FeatureAlphaDropout": (_module(nn.FeatureAlphaDropout, 0.3), (IMG,), ()),
    "Flatten": (_module(nn.Flatten), (IMG,), ()),
    "Fold": (_module(nn.Fold, (4, 5), (2, 2)), (r(2, 12, 12),), ()),
    "FractionalMaxPool2d": (_module(nn.FractionalMaxPool2d, 2, output_size=3), (IMG,), ()),
    "FractionalMaxPool3d": (_module(nn.FractionalMaxPool3d, 2, output_ratio=0.5), (VOL,), ()),
    "GELU": (_module(nn.GELU), (r(4, 5),), ()),
    "GLU": (_module(nn.GLU), (r(4, 6),), ()),
    "GRU": (_module(nn.GRU, 4, 3, num_layers=2, bidirectional=True), _seq(), ()),
    "GRUCell": (_module(nn.GRUCell, 4, 3), (r(2, 4),), ()),
    "GaussianNLLLoss": (_module(nn.GaussianNLLLoss), (r(4, 3), r(4, 3, seed=1), p(4, 3)), ()),
    "GroupNorm": (_module(nn.GroupNorm, 3, 3), (IMG,), ()),
    "Hardshrink": (_module(nn.Hardshrink), (r(4, 5),), ()),
    "Hardsigmoid": (_module(nn.Hardsigmoid), (r(4, 5) * 4,), ()),
    "Hardswish": (_module(nn.Hardswish), (r(4, 5) * 4,), ()),
    "Hardtanh": (_module(nn.Hardtanh), (r(4, 5),), ()),
    "HingeEmbeddingLoss": (_module(nn.HingeEmbeddingLoss), (r(4),), (torch.tensor([1, -1, 1, -1.0], dtype=D),)),
    "HuberLoss": (_module(nn.HuberLoss), (r(4, 3), r(4, 3, seed=1)), ()),
    "Identity": (_module(nn.Identity), (r(4, 5),), ()),
    "InstanceNorm1d": (_module(nn.InstanceNorm1d, 3, affine=True), (SEQ,), ()),
    "InstanceNorm2d": (_module(nn.InstanceNorm2d, 3), (IMG,), ()),
    "InstanceNorm3d": (_module(nn.InstanceNorm3d, 2, track_running_stats=True), (VOL,), ()),
    "KLDivLoss": (_module(nn.KLDivLoss, reduction="batchmean", log_target=True), (r(4, 3), r(4, 3, seed=1)), ()),
    "L1Loss": (_module(nn.L1Loss), (r(4, 3), r(4, 3, seed=1)), ()),
    "LPPool1d": (_module(nn.LPPool1d, 2, 2), (SEQ,), ()),
    "LPPool2d": (_module(nn.LPPool2d, 2, 2), (IMG,), ()),
    "LPPool3d": (_module(nn.LPPool3d, 2, 2), (VOL,), ()),
    "LSTM": (_module(nn.LSTM, 4, 3, proj_size=2, batch_first=True), _seq(), ()),
    "LSTMCell": (_module(nn.LSTMCell, 4, 3), (r(2, 4),), ()),
    "LayerNorm": (_module(nn.LayerNorm, [3, 6]), (r(2, 3, 6),), ()),
    "LazyBatchNorm1d": (_module(nn.LazyBatchNorm1d), (SEQ,), ()),
    "LazyBatchNorm2d": (_module(nn.LazyBatchNorm2d), (IMG,), ()),
    "LazyBatchNorm3d": (_module(nn.LazyBatchNorm3d), (VOL,), ()),
    "LazyConv1d": (_module(nn.LazyConv1d, 4, 3), (SEQ,), ()),
    "LazyConv2d": (_module(nn.LazyConv2d, 4, 3), (IMG,), ()),
    "LazyConv3d": (_module(nn.LazyConv3d, 2, 2), (VOL,), ()),
    "LazyConvTranspose1d": (_module(nn.LazyConvTranspose1d, 2, 3), (SEQ,), ()),
    "LazyConvTranspose2d": (_module(nn.LazyConvTranspose2d, 2, 3), (IMG,), ()),
    "LazyConvTranspose3d": (_module(nn.LazyConvTranspose3d, 2, 2), (VOL,), ()),
    "LazyInstanceNorm1d": (_module(nn.LazyInstanceNorm1d), (SEQ,), ()),
    "LazyInstanceNorm2d": (_module(nn.LazyInstanceNorm2d), (IMG,), ()),
    "LazyInstanceNorm3d": (_module(nn.LazyInstanceNorm3d), (VOL,), ()),
    "LazyLinear": (_module(nn.LazyLinear, 5), (r(4, 3),), ()),
    "LeakyReLU": (_module(nn.LeakyReLU, 0.1), (r(4, 5),), ()),
    "Linear": (_module(nn.Linear, 3, 5), (r(4, 3),), ()),
    "LinearCrossEntropyLoss": (_module(nn.LinearCrossEntropyLoss, 4, 5), (r(3, 4),), (IDX,)),
    "LocalResponseNorm": (_module(nn.LocalResponseNorm, 2), (IMG,), ()),
    "LogSigmoid": (_module(nn.LogSigmoid), (r(4, 5),), ()),
    "LogSoftmax": (_module(nn.LogSoftmax, 1), (r(4, 5),), ()),
    "MSELoss": (_module(nn.MSELoss), (r(4, 3), r(4, 3, seed=1)), ()),
    "MarginRankingLoss": (_module(nn.MarginRankingLoss), (r(3), r(3, seed=1)), (torch.tensor([1, -1, 1.0], dtype=D),)),
    "MaxPool1d": (_module(nn.MaxPool1d, 2), (SEQ,), ()),
    "MaxPool2d": (_module(nn.MaxPool2d, 3, 2, 1), (IMG,), ()),
    "MaxPool3d": (_module(nn.MaxPool3d, 2), (VOL,), ()),
    "MaxUnpool1d": (_module(nn.MaxUnpool1d, 2), (r(2, 3, 4),), (F.max_pool1d(SEQ, 2, return_indices=True)[1],)),
    "MaxUnpool2d": (_module(nn.MaxUnpool2d, 2), (r(2, 3, 3, 3),), (POOLED_INDICES,)),
    "MaxUnpool3d": (_module(nn.MaxUnpool3d, 2), (r(1, 2, 2, 2, 2),), (F.max_pool3d(VOL, 2, return_indices=True)[1],)),
    "Mish": (_module(nn.Mish), (r(4, 5),), ()),
    "MultiLabelMarginLoss": (_module(nn.MultiLabelMarginLoss), (r(2, 4),),
                             (torch.tensor([[1, 3, -1, 0], [0, -1, 2, 2]]),)),
    "MultiLabelSoftMarginLoss": (_module(nn.MultiLabelSoftMarginLoss), (r(2, 3),),
                                 (torch.tensor([[1, 0, 1.0]], dtype=D),)),
    "MultiMarginLoss": (_module(nn.MultiMarginLoss), (r(3, 4),), (IDX,)),
    "MultiheadAttention": (_module(nn.MultiheadAttention, 4, 2, kdim=3, vdim=5),
                           (r(3, 2, 4), r(4, 2, 3), r(4, 2, 5)), ()),
    "NLLLoss": (_module(nn.NLLLoss), (r(3, 4),), (IDX,)),
    "NLLLoss2d": (_module(nn.NLLLoss2d), (r(2, 3, 2, 2),), (torch.tensor([[[0, 1], [2, 1]], [[1, 1], [0, 2]]]),)),
    "PReLU": (_module(nn.PReLU, 3), (IMG,), ()),
    "PairwiseDistance": (_module(nn.PairwiseDistance), (r(4, 3), r(4, 3, seed=1)), ()),
    "PixelShuffle": (_module(nn.PixelShuffle, 2), (r(1, 8, 2, 3),), ()),
    "PixelUnshuffle": (_module(nn.PixelUnshuffle, 2), (r(1, 2, 4, 6),), ()),
    "PoissonNLLLoss": (_module(nn.PoissonNLLLoss), (r(4, 3), p(4, 3)), ()),
    "RMSNorm": (_module(nn.RMSNorm, [6]), (IMG,), ()),
    "RNN": (_module(nn.RNN, 4, 3, nonlinearity="relu"), _seq(), ()),
    "RNNCell": (_module(nn.RNNCell, 4, 3), (r(2, 4),), ()),
    "RReLU": (_module(nn.RReLU), (r(4, 5),), ()),
    "ReLU": (_module(nn.ReLU), (r(4, 5),), ()),
    "ReLU6": (_module(nn.ReLU6), (r(4, 5) * 4,), ()),
    "ReflectionPad1d": (_module(nn.ReflectionPad1d, 2), (SEQ,), ()),
    "ReflectionPad2d": (_module(nn.ReflectionPad2d, (1, 2, 0, 1)), (IMG,), ()),
    "ReflectionPad3d": (_module(nn.ReflectionPad3d, 1), (VOL,), ()),
    "ReplicationPad1d": (_module(nn.ReplicationPad1d, 2), (SEQ,), ()),
    "ReplicationPad2d": (_module(nn.ReplicationPad2d, (1, 2, 0, 1)), (IMG,), ()),
    "ReplicationPad3d": (_module(nn.ReplicationPad3d, 1), (VOL,), ()),
    "SELU": (_module(nn.SELU), (r(4, 5),), ()),
    "SiLU": (_module(nn.SiLU), (r(4, 5),), ()),
    "Sigmoid": (_module(nn.Sigmoid), (r(4, 5),), ()),
    "SmoothL1Loss": (_module(nn.SmoothL1Loss), (r(4, 3), r(4, 3, seed=1)), ()),
    "SoftMarginLoss": (_module(nn.SoftMarginLoss), (r(3),), (torch.tensor([1, -1, 1.0], dtype=D),)),
    "Softmax": (_module(nn.Softmax, 1), (r(4, 5),), ()),
    "Softmax2d": (_module(nn.Softmax2d), (IMG,), ()),
    "Softmin": (_module(nn.Softmin, 1), (r(4, 5),), ()),
    "Softplus": (_module(nn.Softplus), (r(4, 5),), ()),
    "Softshrink": (_module(nn.Softshrink), (r(4, 5),), ()),
    "Softsign": (_module(nn.Softsign), (r(4, 5),), ()),
    "Tanh": (_module(nn.Tanh), (r(4, 5),), ()),
    "Tanhshrink": (_module(nn.Tanhshrink), (r(4, 5),), ()),
    "Threshold": (_module(nn.Threshold, 0.1, 20.0), (r(4, 5),), ()),
    "Transformer": (_module(nn.Transformer, 4, 2, 1, 1, 8, dropout=0.0), (r(3, 2, 4), r(2, 2, 4, seed=1)), ()),
    "TransformerDecoder": (lambda: _module(nn.TransformerDecoder, _module(
        nn.TransformerDecoderLayer, 4, 2, 8, dropout=0.0)(), 2)(), (r(3, 2, 4), r(2, 2, 4, seed=1)), ()),
    "TransformerDecoderLayer": (_module(nn.TransformerDecoderLayer, 4, 2, 8, dropout=0.0, norm_first=True),
                                (r(3, 2, 4), r(2, 2, 4, seed=1)), ()),
    "TransformerEncoder": (lambda: _module(nn.TransformerEncoder, _module(
        nn.TransformerEncoderLayer, 4, 2, 8, dropout=0.0)(), 2, enable_nested_tensor=False)(), (r(3, 2, 4),), ()),
    "TransformerEncoderLayer": (_module(nn.TransformerEncoderLayer, 4, 2, 8, dropout=0.0, activation="gelu"),
                                (r(3, 2, 4),), ()),
    "TripletMarginLoss": (_module(nn.TripletMarginLoss), (r(4, 3), r(4, 3, seed=1), r(4, 3, seed=2)), ()),
    "TripletMarginWithDistanceLoss": (_module(nn.TripletMarginWithDistanceLoss, swap=True),
                                      (r(4, 3), r(4, 3, seed=1), r(4, 3, seed=2)), ()),
    "Unflatten": (_module(nn.Unflatten, 1, (2, 3)), (r(4, 6),), ()),
    "Unfold": (_module(nn.Unfold, 2), (IMG,), ()),
    "Upsample": (_module(nn.Upsample, scale_factor=2, mode="bilinear", align_corners=True), (IMG,), ()),
    "UpsamplingBilinear2d": (_module(nn.UpsamplingBilinear2d, scale_factor=2), (IMG,), ()),
    "UpsamplingNearest2d": (_module(nn.UpsamplingNearest2d, size=(7, 5)), (IMG,), ()),
    "ZeroPad1d": (_module(nn.ZeroPad1d, 2), (SEQ,), ()),
    "ZeroPad2d": (_module(nn.ZeroPad2d, (1, 0, 2, -1)), (IMG,), ()),
    "ZeroPad3d": (_module(nn.ZeroPad3d, 1), (VOL,), ()),
}

M_NOT_CALLED = {
    "Container": "deprecated container base", "Module": "base class", "ModuleDict": "container",
    "ModuleList": "container", "ParameterDict": "container", "ParameterList": "container",
    "Sequential": "container (its layers are audited one by one)", "RNNBase": "base class of RNN/LSTM/GRU",
    "RNNCellBase": "base class of the cells", "DataParallel": "device wrapper (needs several devices)",
    "SyncBatchNorm": "needs a distributed process group",
}


def public_functions() -> List[str]:
    return sorted(n for n in dir(F) if not n.startswith("_") and callable(getattr(F, n))
                  and not inspect.isclass(getattr(F, n)) and not isinstance(getattr(F, n), types.ModuleType))


def public_modules() -> List[str]:
    return sorted(n for n in dir(nn) if inspect.isclass(getattr(nn, n)) and issubclass(getattr(nn, n), nn.Module))


def _float_outputs(out: Any) -> list:
    return [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.is_floating_point()]


def _loss(outputs: list) -> Any:
    """sum of outputs times fixed weights (so every output element's gradient matters)."""
    total = 0
    for i, o in enumerate(outputs):
        weights = torch.randn(o.shape, generator=torch.Generator().manual_seed(100 + i), dtype=o.dtype)
        total = total + (o * weights).sum()
    return total


def _plain(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.as_subclass(torch.Tensor).detach()


def _same(ours: Optional[torch.Tensor], theirs: Optional[torch.Tensor], what: str) -> None:
    ours, theirs = _plain(ours), _plain(theirs)
    if ours is None and theirs is None:
        return
    ours = torch.zeros_like(theirs) if ours is None else ours
    theirs = torch.zeros_like(ours) if theirs is None else theirs
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-8, equal_nan=True, msg=lambda m: f"{what}: {m}")


def judge(call: Callable, inputs: tuple, params: Tuple[list, list] = ([], [])) -> Optional[str]:
    """None when outputs and gradients (inputs, then params) equal torch's; the refusal message otherwise."""
    theirs_in = [x.clone().requires_grad_() for x in inputs]
    ours_in = [tt.tracer(x.clone(), requires_grad=True) for x in inputs]
    their_params, our_params = params
    torch.manual_seed(0)
    their_out = _float_outputs(call(theirs_in, True))
    picked = [k for k, b in enumerate(their_out) if b.requires_grad]
    leaves_t, leaves_o = theirs_in + their_params, ours_in + our_params
    try:
        their_loss = _loss([their_out[k] for k in picked])
        expected = torch.autograd.grad(their_loss, leaves_t, allow_unused=True) if picked else None
    except RuntimeError as exc:  # torch has no derivative either (e.g. native_channel_shuffle)
        return f"torch has no gradient either: {str(exc).splitlines()[0]}"
    torch.manual_seed(0)
    try:
        our_out = _float_outputs(call(ours_in, False))
        assert len(our_out) == len(their_out), "number of floating outputs differs"
        for k, (a, b) in enumerate(zip(our_out, their_out)):
            _same(a, b, f"output {k}")
        assert all(our_out[k].requires_grad for k in picked), "an output carries no gradient in torchtrace"
        if not picked:
            return None
        got = tt.grad(_loss([our_out[k] for k in picked]), leaves_o, allow_unused=True)
    except tt.UnsupportedOperationError as exc:
        return str(exc).splitlines()[0]
    for k, (a, b) in enumerate(zip(got, expected)):
        _same(a, b, f"gradient of leaf {k}")
    return None


REFUSED: Dict[str, str] = {}


def test_every_public_function_is_audited():
    missing = [n for n in public_functions() if n not in F_CALLS and n not in F_NOT_CALLED]
    assert not missing, f"classify these torch.nn.functional callables in F_CALLS or F_NOT_CALLED: {missing}"


def test_every_module_class_is_audited():
    missing = [n for n in public_modules() if n not in M_CALLS and n not in M_NOT_CALLED]
    assert not missing, f"classify these torch.nn Module classes in M_CALLS or M_NOT_CALLED: {missing}"


@pytest.mark.parametrize("name", sorted(F_CALLS))
def test_function_gradient_or_refusal(name):
    fn, inputs = F_CALLS[name]
    refused = judge(lambda xs, plain: fn(*xs), inputs)
    if refused:
        REFUSED[f"F.{name}"] = refused


def _module_leaves(module: nn.Module, tracers: bool) -> Tuple[nn.Module, list]:
    """The module itself (torch) or a tt.port of a deep copy (torchtrace): same parameter values."""
    if tracers:
        ported = tt.port(copy.deepcopy(module))
        return ported, [q for q in ported.parameters() if q.requires_grad]
    return module, [q for q in module.parameters() if q.requires_grad]


@pytest.mark.parametrize("name", sorted(M_CALLS))
def test_module_gradient_or_refusal(name):
    make, inputs, extra = M_CALLS[name]
    torch_module = make()
    if any(isinstance(q, nn.parameter.UninitializedParameter) for q in torch_module.parameters()):
        torch.manual_seed(0)
        torch_module(*inputs, *extra)  # lazy modules: infer shapes once, before both runs copy them
    try:
        ours, our_params = _module_leaves(torch_module, True)
    except tt.UnsupportedOperationError as exc:
        REFUSED[f"nn.{name}"] = str(exc).splitlines()[0]
        return
    theirs, their_params = _module_leaves(copy.deepcopy(torch_module), False)
    refused = judge(lambda xs, plain: (theirs if plain else ours)(*xs, *extra), inputs, (their_params, our_params))
    if refused:
        REFUSED[f"nn.{name}"] = refused


def teardown_module() -> None:
    """With -s, print the refused callables and their reasons (the README's Limitations)."""
    print("\nrefused:\n" + "\n".join(f"{name}: {reason}" for name, reason in sorted(REFUSED.items())))
