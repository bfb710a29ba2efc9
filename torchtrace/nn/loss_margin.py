"""Margin and embedding losses: hinge-like losses max(0, margin - score) and their smooth cousins.

Each rule's forward is torch's own function (so values, errors and checks are torch's); each backward is
dl/d(score) times d(score)/d(input), times the reduction's d(reduced)/dl (`_scale`: g, or g / count for
'mean'). torch's conventions at the hinge: losses built with clamp_min (margin_ranking, hinge_embedding,
cosine_embedding, triplet) pass the gradient where the clamped value is exactly 0 (the margin is exactly
met); multi_margin and multilabel_margin, hand-written kernels in torch, count only z > 0 strictly.
Class weights are constants, as in torch: one that requires a gradient is refused.
"""
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.nn.distance import pairwise_distance_vjp
from torchtrace.nn.loss import EPSILON, _reduction, _refuse_grad, _scale, aten_twin
from torchtrace.nn.module import Module


def _elementwise_scale(g: torch.Tensor, reduction: str, count: int) -> torch.Tensor:
    """d(reduced loss)/d(l) for a loss l with `count` elements: g ('none', 'sum') or g / count ('mean')."""
    return _scale(g, reduction, max(count, 1) if reduction == "mean" else count)


class _PairLoss(Function):
    """The forward of a loss of (input1, input2, target, margin): torch's own `op`, with all three inputs saved."""

    @staticmethod
    def forward(ctx, input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
        ctx.margin, ctx.reduction = margin, _reduction(size_average, reduce, reduction)
        ctx.save_for_backward(input1, input2, target)
        return ctx._rule.op(input1, input2, target, margin, reduction=ctx.reduction)


@register(F.cosine_embedding_loss)
class CosineEmbedding(_PairLoss):
    """l = 1 - cos (y = 1) or max(0, cos - margin) (y = -1)  ->  dx1 = g dl/dcos (x2 / s - cos x1 / (|x1|^2 + e)),
    dl/dcos = -1 or [cos >= margin], dx2 likewise;  cos = x1.x2 / s, s = sqrt((|x1|^2 + e)(|x2|^2 + e)), e = 1e-12"""

    op = staticmethod(F.cosine_embedding_loss)

    @staticmethod
    def backward(ctx, g):
        x1, x2, y = ctx.saved_tensors
        dim = y.dim()  # the feature dim: 1 for (N, D) inputs, 0 for (D,)
        m1, m2 = (x1 * x1).sum(dim) + EPSILON, (x2 * x2).sum(dim) + EPSILON
        denom = (m1 * m2).sqrt()
        cos = (x1 * x2).sum(dim) / denom
        slope = torch.where(y == 1, -1.0, ((y == -1) & (cos - ctx.margin >= 0)).to(cos.dtype))  # cos's dtype
        c = (slope * _elementwise_scale(g, ctx.reduction, cos.numel())).unsqueeze(dim)
        cos, denom, m1, m2 = (t.unsqueeze(dim) for t in (cos, denom, m1, m2))
        need_1, need_2 = ctx.needs_input_grad[:2]
        grad_1 = c * (x2 / denom - cos * x1 / m1) if need_1 else None
        grad_2 = c * (x1 / denom - cos * x2 / m2) if need_2 else None
        return grad_1, grad_2, None


@register(F.margin_ranking_loss)
class MarginRanking(_PairLoss):
    """l = max(0, -y (x1 - x2) + margin)  ->  dx1 = -g y m,  dx2 = g y m,  dy = -g (x1 - x2) m;
    m = [-y (x1 - x2) + margin >= 0]"""

    op = staticmethod(F.margin_ranking_loss)

    @staticmethod
    def backward(ctx, g):
        x1, x2, y = ctx.saved_tensors
        d = x1 - x2
        z = -y * d + ctx.margin
        c = (z >= 0) * _elementwise_scale(g, ctx.reduction, z.numel())
        need_1, need_2, need_y = ctx.needs_input_grad[:3]
        return (-y * c if need_1 else None), (y * c if need_2 else None), (-d * c if need_y else None)


@register(F.hinge_embedding_loss)
class HingeEmbedding(Function):
    """l = x (y = 1) or max(0, margin - x) (y = -1)  ->  dx = g ([y != -1] - [y != 1] [margin - x >= 0])
    (both terms where y is neither)"""

    @staticmethod
    def forward(ctx, input, target, margin=1.0, size_average=None, reduce=None, reduction="mean"):
        ctx.margin, ctx.reduction = margin, _reduction(size_average, reduce, reduction)
        ctx.save_for_backward(input, target)
        return F.hinge_embedding_loss(input, target, margin, reduction=ctx.reduction)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        slope = (y != -1).to(x.dtype) - ((y != 1) & (ctx.margin - x >= 0)).to(x.dtype)
        shape = torch.broadcast_shapes(x.shape, y.shape)
        return slope * _elementwise_scale(g, ctx.reduction, shape.numel()), None


class _TargetLoss(Function):
    """The forward of a loss of (input, target) and no options: torch's own `op`, with both inputs saved."""

    @staticmethod
    def forward(ctx, input, target, size_average=None, reduce=None, reduction="mean"):
        ctx.reduction = _reduction(size_average, reduce, reduction)
        ctx.save_for_backward(input, target)
        return ctx._rule.op(input, target, reduction=ctx.reduction)


@register(F.soft_margin_loss)
class SoftMargin(_TargetLoss):
    """l = log(1 + e^(-y x))  ->  dl/dx = -y s(-y x), dl/dy = -x s(-y x), s = sigmoid
    (torch refuses the target's gradient; torchtrace gives it)"""

    op = staticmethod(F.soft_margin_loss)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        count = torch.broadcast_shapes(x.shape, y.shape).numel()
        s = torch.sigmoid(-y * x) * _elementwise_scale(g, ctx.reduction, count)
        need_x, need_y = ctx.needs_input_grad[:2]
        return (-y * s if need_x else None), (-x * s if need_y else None)


@register(F.multilabel_soft_margin_loss)
class MultilabelSoftMargin(Function):
    """l_n = -(1/C) sum_c w_c [y_nc log s(x_nc) + (1 - y_nc) log s(-x_nc)]  ->  dx_nc = g w_c (s(x_nc) - y_nc) / C,
    dy_nc = -g w_c x_nc / C,  dw_c = -g [y_nc log s(x_nc) + (1 - y_nc) log s(-x_nc)] / C"""

    @staticmethod
    def forward(ctx, input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
        ctx.reduction = _reduction(size_average, reduce, reduction)
        ctx.save_for_backward(input, target, weight)
        return F.multilabel_soft_margin_loss(input, target, weight, reduction=ctx.reduction)

    @staticmethod
    def backward(ctx, g):
        x, y, weight = ctx.saved_tensors
        n_classes = x.shape[-1] if x.dim() else 1
        per_sample = _elementwise_scale(g, ctx.reduction, x.numel() // max(n_classes, 1))
        c = per_sample.unsqueeze(-1) / n_classes if ctx.reduction == "none" else per_sample / n_classes
        need_x, need_y, need_w = ctx.needs_input_grad[:3]
        grad_w = -(y * F.logsigmoid(x) + (1 - y) * F.logsigmoid(-x)) * c if need_w else None
        if weight is not None:
            c = c * weight
        return ((torch.sigmoid(x) - y) * c if need_x else None), (-x * c if need_y else None), grad_w


def _as_batch(x: torch.Tensor, target: torch.Tensor, target_per_sample: bool) -> tuple:
    """(N, C) input and its target ((N,) class indices or (N, C) label lists) for 0-d, 1-d and 2-d inputs."""
    if x.dim() >= 2:
        return x, target
    x = x.reshape(1, -1)
    return x, (target.reshape(1) if target_per_sample else target.reshape(1, -1))


def _per_sample(g: torch.Tensor, reduction: str, n: int) -> torch.Tensor:
    """d(reduced)/d(l_n) as an (N, 1) column (or a scalar): 'none' gives one g per sample."""
    scale = _elementwise_scale(g, reduction, n)
    return scale.reshape(-1, 1) if reduction == "none" else scale


@register(F.multi_margin_loss)
class MultiMargin(Function):
    """l_n = (1/C) sum_{i != y} w_y max(0, z_i)^p, z_i = margin - x_y + x_i  ->  dx_i = g h_i (i != y),
    dx_y = -g sum_i h_i;  h_i = w_y [z_i > 0] (1 if p = 1, 2 z_i if p = 2) / C;  x = input[n], y = target[n],
    C = the number of classes, w = weight (1 without)"""

    @staticmethod
    def forward(ctx, input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None, reduction="mean"):
        _refuse_grad(ctx, 4, "multi_margin_loss", "weight")
        ctx.p, ctx.margin, ctx.reduction = p, margin, _reduction(size_average, reduce, reduction)
        ctx.save_for_backward(input, target, weight)
        return F.multi_margin_loss(input, target, p, margin, weight, reduction=ctx.reduction)

    @staticmethod
    def backward(ctx, g):
        x0, target, weight = ctx.saved_tensors
        x, y = _as_batch(x0, target, target_per_sample=True)
        n, n_classes = x.shape
        own = x.gather(1, y.reshape(-1, 1))
        z = ctx.margin - own + x
        others = torch.arange(n_classes, device=x.device).reshape(1, -1) != y.reshape(-1, 1)
        active = ((z > 0) & others).to(x.dtype)  # in x's dtype: a bool mask times a number would be float32
        h = (active if ctx.p == 1 else active * 2 * z) / n_classes
        if weight is not None:
            h = h * weight.gather(0, y).reshape(-1, 1)
        h = h * _per_sample(g, ctx.reduction, n)
        grad = h - (~others) * h.sum(1, keepdim=True)
        return grad.reshape(x0.shape), None, None, None, None


@register(F.multilabel_margin_loss)
class MultilabelMargin(_TargetLoss):
    """l_n = (1/C) sum_{j in Y_n} sum_{i not in Y_n} max(0, 1 - x_j + x_i)  ->  dx_i = (g/C) #active pairs with i,
    dx_j = -(g/C) #active pairs with j;  a pair is active where 1 - x_j + x_i > 0, Y_n = target[n] up to the first
    -1 (a repeated label counts twice)"""

    op = staticmethod(F.multilabel_margin_loss)

    @staticmethod
    def backward(ctx, g):
        x0, target = ctx.saved_tensors
        x, y = _as_batch(x0, target, target_per_sample=False)
        n, n_classes = x.shape
        listed = (y >= 0).cumprod(1).bool()  # the labels before the first -1
        classes = torch.arange(n_classes, device=x.device)
        count = ((y.unsqueeze(-1) == classes) & listed.unsqueeze(-1)).sum(1).to(x.dtype)  # (N, C): times listed
        z = 1 - x.unsqueeze(2) + x.unsqueeze(1)  # z[n, j, i] = 1 - x_j + x_i
        pairs = count.unsqueeze(2) * (count == 0).unsqueeze(1) * (z > 0)
        grad = (pairs.sum(1) - pairs.sum(2)) / n_classes * _per_sample(g, ctx.reduction, n)
        return grad.reshape(x0.shape), None


def _triplet_grads(g: torch.Tensor, anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor,
                   margin: float, swap: bool, reduction: str, distance: Callable, vjp: Callable) -> tuple:
    """Gradients of l = max(0, margin + d(a, p) - d_neg), d_neg = d(a, n) or min(d(a, n), d(p, n)) with swap.

    distance(x1, x2) is the distance and vjp(c, x1, x2) its gradient w.r.t. x1 (w.r.t. x2 it is -vjp).
    min's gradient goes to the smaller distance, half to each on a tie (torch.minimum's convention).
    """
    d_pos, d_an = distance(anchor, positive), distance(anchor, negative)
    d_neg, to_an, to_pn = d_an, 1.0, None
    if swap:
        d_pn = distance(positive, negative)
        d_neg = torch.minimum(d_an, d_pn)
        to_an = (d_an < d_pn) + 0.5 * (d_an == d_pn)
        to_pn = (d_pn < d_an) + 0.5 * (d_an == d_pn)
    c = (margin + d_pos - d_neg >= 0) * _elementwise_scale(g, reduction, d_pos.numel())
    g_ap, g_an = vjp(c, anchor, positive), vjp(-c * to_an, anchor, negative)
    grad_a, grad_p, grad_n = g_ap + g_an, -g_ap, -g_an
    if swap:
        g_pn = vjp(-c * to_pn, positive, negative)
        grad_p, grad_n = grad_p + g_pn, grad_n - g_pn
    return grad_a, grad_p, grad_n


@register(F.triplet_margin_loss)
class TripletMargin(Function):
    """l = max(0, margin + d(a, p) - d(a, n))  ->  da = g m (dd(a, p)/da - dd(a, n)/da),  dp = g m dd(a, p)/dp,
    dn = -g m dd(a, n)/dn;  m = [margin + d(a, p) - d(a, n) >= 0], d = pairwise_distance(., ., p, eps); swap:
    d(a, n) -> min(d(a, n), d(p, n)), whose gradient goes to the smaller distance (half to each on a tie)"""

    @staticmethod
    def forward(ctx, anchor, positive, negative, margin=1.0, p=2, eps=1e-6, swap=False, size_average=None,
                reduce=None, reduction="mean"):
        ctx.margin, ctx.p, ctx.eps, ctx.swap = margin, p, eps, swap
        ctx.reduction = _reduction(size_average, reduce, reduction)
        ctx.save_for_backward(anchor, positive, negative)
        return F.triplet_margin_loss(anchor, positive, negative, margin, p, eps, swap, reduction=ctx.reduction)

    @staticmethod
    def backward(ctx, g):
        def distance(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
            return torch.pairwise_distance(x1, x2, ctx.p, ctx.eps)

        def vjp(c: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
            return pairwise_distance_vjp(c, x1, x2, ctx.p, ctx.eps)

        return _triplet_grads(g, *ctx.saved_tensors, ctx.margin, ctx.swap, ctx.reduction, distance, vjp)


def _known_distance(distance_function: Optional[Callable]) -> Optional[tuple]:
    """(p, eps) when distance_function is pairwise_distance (its defaults) or a PairwiseDistance module, else None."""
    if distance_function is None or distance_function in (F.pairwise_distance, torch.pairwise_distance):
        return 2.0, 1e-6
    if isinstance(distance_function, torch.nn.PairwiseDistance) and not distance_function.keepdim:
        return distance_function.norm, distance_function.eps
    return None


@register(F.triplet_margin_with_distance_loss)
class TripletMarginWithDistance(TripletMargin):
    """l = max(0, margin + d(a, p) - d(a, n))  ->  da = g m (dd(a, p)/da - dd(a, n)/da),  dp = g m dd(a, p)/dp,
    dn = -g m dd(a, n)/dn;  m = [margin + d(a, p) - d(a, n) >= 0], d = distance_function (pairwise_distance or
    nn.PairwiseDistance), swap as in triplet_margin_loss"""

    @staticmethod
    def forward(ctx, anchor, positive, negative, *, distance_function=None, margin=1.0, swap=False,
                reduction="mean"):
        known = _known_distance(distance_function)
        if known is None:
            raise UnsupportedOperationError(
                "torch.nn.functional.triplet_margin_with_distance_loss: a custom distance_function "
                f"({distance_function!r}) is not supported, because the rule cannot see inside it — compute the "
                "distances yourself on tracers and write the loss out: torch.clamp_min(margin + d_pos - d_neg, 0)"
                ".mean() (every op there has a rule), or pass distance_function=None / F.pairwise_distance / "
                "nn.PairwiseDistance(p, eps)."
            )
        ctx.p, ctx.eps = known
        ctx.margin, ctx.swap, ctx.reduction = margin, swap, reduction
        ctx.save_for_backward(anchor, positive, negative)
        return F.triplet_margin_with_distance_loss(anchor, positive, negative, distance_function=distance_function,
                                                   margin=margin, swap=swap, reduction=reduction)


aten_twin("TorchCosineEmbedding", CosineEmbedding, torch.cosine_embedding_loss, "input1 input2 target margin reduction")
aten_twin("TorchMarginRanking", MarginRanking, torch.margin_ranking_loss, "input1 input2 target margin reduction")
aten_twin("TorchHingeEmbedding", HingeEmbedding, torch.hinge_embedding_loss, "input target margin reduction")
aten_twin("TorchSoftMargin", SoftMargin, torch._C._nn.soft_margin_loss, "input target reduction")
aten_twin("TorchMultiMargin", MultiMargin, torch._C._nn.multi_margin_loss, "input target p margin weight reduction")
aten_twin("TorchMultilabelMargin", MultilabelMargin, torch._C._nn.multilabel_margin_loss, "input target reduction")
aten_twin("TorchTripletMargin", TripletMargin, torch.triplet_margin_loss,
          "anchor positive negative margin p eps swap reduction")


class CosineEmbeddingLoss(Module, torch.nn.CosineEmbeddingLoss):
    """1 - cos(x1, x2) for similar pairs (y = 1), max(0, cos - margin) for dissimilar ones (y = -1)."""


class MarginRankingLoss(Module, torch.nn.MarginRankingLoss):
    """max(0, -y (x1 - x2) + margin): x1 should rank above x2 when y = 1."""


class HingeEmbeddingLoss(Module, torch.nn.HingeEmbeddingLoss):
    """x for y = 1, max(0, margin - x) for y = -1 (x is usually a distance)."""


class SoftMarginLoss(Module, torch.nn.SoftMarginLoss):
    """log(1 + e^(-y x)): two-class logistic loss with labels +-1."""


class MultiLabelSoftMarginLoss(Module, torch.nn.MultiLabelSoftMarginLoss):
    """Per-class binary cross entropy of logits, averaged over classes."""


class MultiMarginLoss(Module, torch.nn.MultiMarginLoss):
    """Multi-class hinge loss: sum over wrong classes of max(0, margin - x_y + x_i)^p / C."""


class MultiLabelMarginLoss(Module, torch.nn.MultiLabelMarginLoss):
    """Multi-label hinge loss between every listed label and every unlisted class."""


class TripletMarginLoss(Module, torch.nn.TripletMarginLoss):
    """max(0, margin + d(a, p) - d(a, n)) with the pairwise p-norm distance."""


class TripletMarginWithDistanceLoss(Module, torch.nn.TripletMarginWithDistanceLoss):
    """max(0, margin + d(a, p) - d(a, n)) with d = distance_function (pairwise_distance by default)."""
