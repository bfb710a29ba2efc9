"""Tangents of the layers' functional rules: linear and convolution, pooling, embedding, normalization, losses,
attention. Normalizations and losses are decomposed into ops that have tangent rules (a nested dual pass)."""
import math
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

from torchtrace.forward.call import Call, NoTangent
from torchtrace.forward.kinds import decomposed, linear, product
from torchtrace.forward.table import declare, tangent

declare("LinearFunction", "y = x W^T + b  ->  ẏ = ẋ W^T + x Ẇ^T + ḃ", product((0, 1), offset=2))
declare("BilinearFunction", "y = x1^T W x2 + b  ->  ẏ = ẋ1^T W x2 + x1^T Ẇ x2 + x1^T W ẋ2 + ḃ",
        product((0, 1, 2), offset=3))
declare("Convolution ConvTranspose", "y = conv(x, W) + b  ->  ẏ = conv(ẋ, W) + conv(x, Ẇ) + ḃ",
        product((0, 1), offset=2))
declare("""AvgPool1d AvgPool2d AvgPool3d AdaptiveAvgPool1d AdaptiveAvgPool2d AdaptiveAvgPool3d Im2Col Col2Im
           PixelShuffling PixelUnshuffling ChannelShuffling Interpolate UpsampleBilinearAA UpsampleBilinearAADefault
           MaxUnpool1d MaxUnpool2d MaxUnpool3d""",
        "ẏ = op(ẋ): averaging, resampling, rearranging and unpooling are linear in x", linear((0,)))
declare("TorchEmbedding", "y = W[i]  ->  ẏ = Ẇ[i]", linear((0,)))
declare("NllLoss", "y = -Σ w_t x[t] (/ Σ w_t)  ->  ẏ = the same of ẋ (linear in x; weights fixed)", linear((0,)))


@tangent("EmbeddingFunction", "y = W[i]  ->  ẏ = Ẇ[i] (max_norm renormalizes W: not linear)")
def _embedding(call: Call) -> torch.Tensor:
    if call.arg(3, "max_norm") is not None:
        raise NoTangent
    return linear((1,))(call)


@tangent("EmbeddingBagFunction", "y = Σ_bag p_i W[i] (sum / mean)  ->  ẏ = Σ_bag (ṗ_i W[i] + p_i Ẇ[i]); max: not")
def _embedding_bag(call: Call) -> torch.Tensor:
    if call.arg(6, "mode", "mean") == "max" or call.arg(3, "max_norm") is not None:
        raise NoTangent
    return product((1, 8))(call)


_WITH_INDICES = {"MaxPool1d": F.max_pool1d_with_indices, "MaxPool2d": F.max_pool2d_with_indices,
                 "MaxPool3d": F.max_pool3d_with_indices, "AdaptiveMaxPool1d": F.adaptive_max_pool1d_with_indices,
                 "AdaptiveMaxPool2d": F.adaptive_max_pool2d_with_indices,
                 "AdaptiveMaxPool3d": F.adaptive_max_pool3d_with_indices}


@tangent("""MaxPool1d MaxPool2d MaxPool3d MaxPool1dWithIndices MaxPool2dWithIndices MaxPool3dWithIndices
            AdaptiveMaxPool1d AdaptiveMaxPool2d AdaptiveMaxPool3d AdaptiveMaxPool1dWithIndices
            AdaptiveMaxPool2dWithIndices AdaptiveMaxPool3dWithIndices FractionalMaxPool2dWithIndices
            FractionalMaxPool3dWithIndices""", "y = x at the window's argmax i  ->  ẏ = ẋ at i")
def _max_pool(call: Call) -> Any:
    call.only(0)
    dx = call.dot(0)
    if isinstance(call.out, torch.Tensor):  # the form without indices: find them again (the same kernel)
        pool = _WITH_INDICES.get(call.rule.__name__)
        if pool is None:
            raise NoTangent
        values, indices = pool(*call.args, **call.kwargs)
    else:
        values, indices = call.out
    depth = int(next(c for c in call.rule.__name__ if c.isdigit()))  # spatial dims: MaxPool2d -> 2
    flat = dx.flatten(-depth).gather(-1, indices.flatten(-depth)).view(values.shape)
    return flat if isinstance(call.out, torch.Tensor) else (flat, None)


def _reduce(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _legacy(call: Call, size_average_at: Optional[int], reduce_at: Optional[int]) -> None:
    """size_average= / reduce= (torch's deprecated spellings): transpose the backward instead."""
    for at, name in ((size_average_at, "size_average"), (reduce_at, "reduce")):
        if at is not None and call.arg(at, name) is not None:
            raise NoTangent


def _mse(x: torch.Tensor, target: torch.Tensor, size_average: Any = None, reduce: Any = None,
         reduction: str = "mean", weight: Any = None) -> torch.Tensor:
    loss = (x - target) ** 2
    return _reduce(loss * weight if weight is not None else loss, reduction)


def _l1(x: torch.Tensor, target: torch.Tensor, size_average: Any = None, reduce: Any = None,
        reduction: str = "mean") -> torch.Tensor:
    return _reduce((x - target).abs(), reduction)


def _smooth_l1(x: torch.Tensor, target: torch.Tensor, size_average: Any = None, reduce: Any = None,
               reduction: str = "mean", beta: float = 1.0) -> torch.Tensor:
    d = (x - target).abs()
    loss = d if beta == 0 else torch.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)
    return _reduce(loss, reduction)


def _huber(x: torch.Tensor, target: torch.Tensor, reduction: str = "mean", delta: float = 1.0,
           weight: Any = None) -> torch.Tensor:
    d = (x - target).abs()
    loss = torch.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))
    return _reduce(loss * weight if weight is not None else loss, reduction)


def _bce(x: torch.Tensor, target: torch.Tensor, weight: Any = None, size_average: Any = None, reduce: Any = None,
         reduction: str = "mean") -> torch.Tensor:
    loss = -(target * x.log().clamp_min(-100) + (1 - target) * (1 - x).log().clamp_min(-100))
    return _reduce(loss * weight if weight is not None else loss, reduction)


def _bce_logits(x: torch.Tensor, target: torch.Tensor, weight: Any = None, size_average: Any = None,
                reduce: Any = None, reduction: str = "mean", pos_weight: Any = None) -> torch.Tensor:
    log_weight = 1 if pos_weight is None else (pos_weight - 1) * target + 1
    loss = (1 - target) * x + log_weight * ((-x.abs()).exp().log1p() + (-x).clamp_min(0))
    return _reduce(loss * weight if weight is not None else loss, reduction)


def _kl_div(x: torch.Tensor, target: torch.Tensor, size_average: Any = None, reduce: Any = None,
            reduction: str = "mean", log_target: bool = False) -> torch.Tensor:
    loss = target.exp() * (target - x) if log_target else torch.xlogy(target, target) - target * x
    if reduction == "batchmean":
        return loss.sum() / (x.shape[0] if x.dim() else 1)
    return _reduce(loss, reduction)


def _cross_entropy(x: torch.Tensor, target: torch.Tensor, weight: Any = None, size_average: Any = None,
                   ignore_index: int = -100, reduce: Any = None, reduction: str = "mean",
                   label_smoothing: float = 0.0) -> torch.Tensor:
    """nll_loss(log_softmax(x), t) for class indices; -Σ_c w_c t_c log_softmax(x)_c for probabilities; with label
    smoothing ε the loss mixes in ε/C times -Σ_c w_c log_softmax(x)_c (as torch's)."""
    dim = 1 if x.dim() > 1 else 0
    logp = torch.log_softmax(x, dim)
    classes = x.shape[dim]
    w = None if weight is None else weight.reshape([-1 if i == dim else 1 for i in range(x.dim())])
    if target.is_floating_point():
        soft = target * (1 - label_smoothing) + label_smoothing / classes
        loss = -((logp * w if w is not None else logp) * soft).sum(dim)
        return loss.sum() / (x.numel() // classes) if reduction == "mean" else _reduce(loss, reduction)
    hard = F.nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    if not label_smoothing:
        return hard
    kept = (target != ignore_index).unsqueeze(dim)
    smooth = -((logp * w if w is not None else logp) * kept).sum(dim)
    if reduction == "mean":
        denominator = (weight[target.masked_fill(target == ignore_index, 0)] * kept.squeeze(dim)).sum() \
            if weight is not None else kept.sum()  # (indexing: targets of any shape, (N, d1, ...) too)
        smooth = smooth.sum() / denominator
    else:
        smooth = _reduce(smooth, reduction)
    return (1 - label_smoothing) * hard + label_smoothing / classes * smooth


def _loss(fn: Any, size_average_at: Optional[int], reduce_at: Optional[int]) -> Any:
    inner = decomposed(fn)

    def rule(call: Call) -> Any:
        _legacy(call, size_average_at, reduce_at)
        return inner(call)

    rule.recorded = True
    return rule


declare("MseLoss", "l = reduce((x - t)^2 w)  ->  the tangent of that composition", _loss(_mse, 2, 3))
declare("L1Loss", "l = reduce(|x - t|)", _loss(_l1, 2, 3))
declare("SmoothL1Loss", "l = reduce(0.5 d^2 / β if |d| < β else |d| - β/2)", _loss(_smooth_l1, 2, 3))
declare("HuberLoss", "l = reduce(0.5 d^2 if |d| < δ else δ (|d| - δ/2))", _loss(_huber, None, None))
declare("BinaryCrossEntropy", "l = reduce(-w (t log x + (1 - t) log(1 - x))), logs clamped at -100",
        _loss(_bce, 3, 4))
declare("BinaryCrossEntropyWithLogits", "l = reduce(w ((1 - t) x + (1 + (p - 1) t) (log(1 + e^-|x|) + max(-x, 0))))",
        _loss(_bce_logits, 3, 4))
declare("KlDiv", "l = reduce(t (log t - x)) (or e^t (t - x) with log_target)", _loss(_kl_div, 2, 3))
declare("CrossEntropy", "l = nll_loss(log_softmax(x), t) for class-index targets", _loss(_cross_entropy, 3, 5))


def _batched(x: torch.Tensor) -> None:
    """The decompositions below read (N, C, ...) inputs with elements; anything else is transposed instead."""
    if x.dim() < 2 or x.numel() == 0:
        raise NoTangent


def _channels(v: Optional[torch.Tensor], ndim: int) -> Optional[torch.Tensor]:
    """A per-channel vector shaped to broadcast over (N, C, ...)."""
    return None if v is None else v.reshape([-1 if i == 1 else 1 for i in range(ndim)])


def _affine(y: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> torch.Tensor:
    if weight is not None:
        y = y * weight
    return y + bias if bias is not None else y


def _normalized(x: torch.Tensor, dims: Sequence[int], eps: float) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over dims (the biased variance)."""
    centred = x - x.mean(dims, keepdim=True)
    return centred * torch.rsqrt((centred * centred).mean(dims, keepdim=True) + eps)


def _layer_norm(x: torch.Tensor, normalized_shape: Sequence[int], weight: Any = None, bias: Any = None,
                eps: float = 1e-5, *rest: Any) -> torch.Tensor:
    dims = tuple(range(x.dim() - len(tuple(normalized_shape)), x.dim()))
    return _affine(_normalized(x, dims, eps), weight, bias)


def _rms_norm(x: torch.Tensor, normalized_shape: Sequence[int], weight: Any = None, eps: Any = None) -> torch.Tensor:
    dims = tuple(range(x.dim() - len(tuple(normalized_shape)), x.dim()))
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    return _affine(x * torch.rsqrt((x * x).mean(dims, keepdim=True) + eps), weight, None)


def _group_norm(x: torch.Tensor, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5,
                *rest: Any) -> torch.Tensor:
    _batched(x)
    grouped = x.reshape(x.shape[0], num_groups, -1)
    y = _normalized(grouped, (2,), eps).reshape(x.shape)
    return _affine(y, _channels(weight, x.dim()), _channels(bias, x.dim()))


def _batch_norm(x: torch.Tensor, running_mean: Any, running_var: Any, weight: Any = None, bias: Any = None,
                training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> torch.Tensor:
    """Training (or no running statistics): the batch's mean and biased variance over all dims but 1."""
    _batched(x)
    if training or running_mean is None:
        y = _normalized(x, tuple(i for i in range(x.dim()) if i != 1), eps)
    else:
        y = (x - _channels(running_mean, x.dim())) * torch.rsqrt(_channels(running_var, x.dim()) + eps)
    return _affine(y, _channels(weight, x.dim()), _channels(bias, x.dim()))


def _torch_batch_norm(x: torch.Tensor, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: bool,
                      momentum: float, eps: float, *rest: Any) -> torch.Tensor:
    return _batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)


def _instance_norm(x: torch.Tensor, running_mean: Any = None, running_var: Any = None, weight: Any = None,
                   bias: Any = None, use_input_stats: bool = True, momentum: float = 0.1,
                   eps: float = 1e-5) -> torch.Tensor:
    _batched(x)
    if not use_input_stats:
        raise NoTangent
    y = _normalized(x, tuple(range(2, x.dim())), eps)
    return _affine(y, _channels(weight, x.dim()), _channels(bias, x.dim()))


def _torch_instance_norm(x: torch.Tensor, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                         use_input_stats: bool, momentum: float, eps: float, *rest: Any) -> torch.Tensor:
    return _instance_norm(x, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)


def _native_layer_norm(x: torch.Tensor, normalized_shape: Sequence[int], weight: Any, bias: Any, eps: float) -> tuple:
    dims = tuple(range(x.dim() - len(tuple(normalized_shape)), x.dim()))
    mean = x.mean(dims, keepdim=True)
    centred = x - mean
    rstd = torch.rsqrt((centred * centred).mean(dims, keepdim=True) + eps)
    return _affine(centred * rstd, weight, bias), mean, rstd


def _normalize(x: torch.Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out: Any = None) -> torch.Tensor:
    return x / torch.linalg.vector_norm(x, p, dim, keepdim=True).clamp_min(eps).expand_as(x)


NORM = "y = (x - mean) / sqrt(var + eps) w + b  ->  the tangent of that composition (statistics included)"
declare("LayerNormFunction", NORM, decomposed(_layer_norm))
declare("NativeLayerNorm", NORM + "; also of mean and 1/std", decomposed(_native_layer_norm))
declare("RMSNormFunction", "y = x / sqrt(mean(x^2) + eps) w", decomposed(_rms_norm))
declare("GroupNormFunction", NORM + ", per group", decomposed(_group_norm))
declare("BatchNormFunction", NORM + ", batch statistics in training, fixed running ones in eval",
        decomposed(_batch_norm))
declare("TorchBatchNorm", NORM + ", batch statistics in training, fixed running ones in eval",
        decomposed(_torch_batch_norm))
declare("InstanceNormFunction", NORM + ", per sample and channel", decomposed(_instance_norm))
declare("TorchInstanceNorm", NORM + ", per sample and channel", decomposed(_torch_instance_norm))
declare("Normalize", "y = x / max(‖x‖_p, eps)", decomposed(_normalize))


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None, dropout_p: float = 0.0,
               is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> torch.Tensor:
    if dropout_p or enable_gqa:
        raise NoTangent
    scores = q @ k.mT * (q.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:
        causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        scores = (scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                  else scores + attn_mask)
    return torch.softmax(scores, -1) @ v


declare("ScaledDotProductAttention", "y = softmax(q k^T s + mask) v  ->  the tangent of that composition",
        decomposed(_attention))


def _glu(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    a, b = x.chunk(2, dim)
    return a * torch.sigmoid(b)


def _cosine_similarity(x1: torch.Tensor, x2: torch.Tensor, dim: int = 1, eps: float = 1e-8) -> torch.Tensor:
    x1, x2 = torch.broadcast_tensors(x1, x2)
    n1 = torch.linalg.vector_norm(x1, 2, dim, keepdim=True).clamp_min(eps)
    n2 = torch.linalg.vector_norm(x2, 2, dim, keepdim=True).clamp_min(eps)
    return ((x1 / n1) * (x2 / n2)).sum(dim)


def _pairwise_distance(x1: torch.Tensor, x2: torch.Tensor, p: float = 2.0, eps: float = 1e-6,
                       keepdim: bool = False) -> torch.Tensor:
    last = max(x1.dim(), x2.dim()) - 1
    return torch.linalg.vector_norm(x1 - x2 + eps, p, last if last >= 0 else None, keepdim=keepdim)


def _soft_margin(x: torch.Tensor, target: torch.Tensor, size_average: Any = None, reduce: Any = None,
                 reduction: str = "mean") -> torch.Tensor:
    return _reduce((-target * x).exp().log1p(), reduction)


def _margin_ranking(x1: torch.Tensor, x2: torch.Tensor, target: torch.Tensor, margin: float = 0.0,
                    size_average: Any = None, reduce: Any = None, reduction: str = "mean") -> torch.Tensor:
    return _reduce((-target * (x1 - x2) + margin).clamp_min(0), reduction)


def _hinge_embedding(x: torch.Tensor, target: torch.Tensor, margin: float = 1.0, size_average: Any = None,
                     reduce: Any = None, reduction: str = "mean") -> torch.Tensor:
    zero = torch.zeros_like(x)
    loss = torch.where(target != -1, x, zero) + torch.where(target != 1, (margin - x).clamp_min(0), zero)
    return _reduce(loss, reduction)


def _gaussian_nll(x: torch.Tensor, target: torch.Tensor, var: torch.Tensor, full: bool = False, eps: float = 1e-6,
                  reduction: str = "mean") -> torch.Tensor:
    if var.dim() != x.dim() or var.shape != x.shape and var.shape[-1] == 1 and x.shape[-1] != 1:
        var = var.unsqueeze(-1) if var.dim() == x.dim() - 1 else var
    var = var.clamp_min(eps)
    loss = 0.5 * (var.log() + (x - target) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction)


def _poisson_nll(x: torch.Tensor, target: torch.Tensor, log_input: bool = True, full: bool = False,
                 size_average: Any = None, eps: float = 1e-8, reduce: Any = None,
                 reduction: str = "mean") -> torch.Tensor:
    loss = x.exp() - target * x if log_input else x - target * (x + eps).log()
    if full:
        stirling = target * target.log() - target + 0.5 * (2 * math.pi * target).log()
        loss = loss + stirling.masked_fill(target <= 1, 0)
    return _reduce(loss, reduction)


declare("Glu", "y = a σ(b), (a, b) = x halved along dim  ->  the tangent of that composition", decomposed(_glu))
declare("CosineSimilarityFunction", "y = Σ x1/max(‖x1‖, eps) · x2/max(‖x2‖, eps)", decomposed(_cosine_similarity))
declare("PairwiseDistanceFunction", "y = ‖x1 - x2 + eps‖_p", decomposed(_pairwise_distance))
declare("SoftMargin", "l = reduce(log(1 + e^(-t x)))", _loss(_soft_margin, 2, 3))
declare("MarginRanking", "l = reduce(max(0, -t (x1 - x2) + margin))", _loss(_margin_ranking, 4, 5))
declare("HingeEmbedding", "l = reduce(x where t = 1, max(0, margin - x) where t = -1)", _loss(_hinge_embedding, 3, 4))
declare("GaussianNll", "l = reduce((log max(var, eps) + (x - t)^2 / max(var, eps)) / 2 (+ log(2π)/2))",
        _loss(_gaussian_nll, None, None))
declare("PoissonNll", "l = reduce(e^x - t x) (log input) or reduce(x - t log(x + eps)) (+ Stirling's term)",
        _loss(_poisson_nll, 4, 6))


def _native_group_norm(x: torch.Tensor, weight: Any, bias: Any, n: int, c: int, hxw: int, group: int,
                       eps: float) -> tuple:
    _batched(x)
    grouped = x.reshape(n, group, -1)
    mean = grouped.mean(2, keepdim=True)
    centred = grouped - mean
    rstd = torch.rsqrt((centred * centred).mean(2, keepdim=True) + eps)
    y = (centred * rstd).reshape(x.shape)
    return _affine(y, _channels(weight, x.dim()), _channels(bias, x.dim())), mean.reshape(n, group), \
        rstd.reshape(n, group)


def _dist(x: torch.Tensor, other: torch.Tensor, p: float = 2) -> torch.Tensor:
    return torch.linalg.vector_norm(x - other, p)


def _triplet_margin(anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, margin: float = 1.0,
                    p: float = 2, eps: float = 1e-6, swap: bool = False, size_average: Any = None, reduce: Any = None,
                    reduction: str = "mean") -> torch.Tensor:
    d_pos = _pairwise_distance(anchor, positive, p, eps)
    d_neg = _pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_neg = torch.minimum(d_neg, _pairwise_distance(positive, negative, p, eps))
    return _reduce((d_pos - d_neg + margin).clamp_min(0), reduction)


def _multilabel_soft_margin(x: torch.Tensor, target: torch.Tensor, weight: Any = None, size_average: Any = None,
                            reduce: Any = None, reduction: str = "mean") -> torch.Tensor:
    loss = -(target * F.logsigmoid(x) + (1 - target) * F.logsigmoid(-x))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss.sum(-1) / x.shape[-1], reduction)


declare("NativeGroupNorm", NORM + ", per group; also of mean and 1/std", decomposed(_native_group_norm))
declare("Dist", "y = ‖x - other‖_p", decomposed(_dist))
declare("TripletMargin", "l = reduce(max(0, d(a, p) - d(a, n) + margin)), d the pairwise distance",
        _loss(_triplet_margin, 7, 8))
declare("MultilabelSoftMargin", "l = reduce(mean_c -(t log σ(x) + (1 - t) log σ(-x)) w)",
        _loss(_multilabel_soft_margin, 3, 4))
