"""Gradient rules for order statistics: sort, msort, topk, kthvalue, median, nanmedian, mode, quantile, nanquantile.

Every one picks input elements, so its backward sends each output's gradient back to the element it picked:
the returned index when torch returns one (ties go where torch's index points), split evenly among the tied
elements for median() / nanmedian() without dim (as torch), and interpolated between two picks for quantile.
"""
from typing import Optional

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.ops.reduction import split_among_ties

T = torch.Tensor


def scatter_to_picks(g: torch.Tensor, indices: torch.Tensor, shape: torch.Size, dim: int, kept: bool) -> torch.Tensor:
    """Gradient of y = x.gather(dim, indices): g placed at the picked positions, 0 elsewhere (`kept`: y kept dim)."""
    if len(shape) == 0:
        return g.reshape(shape)
    dim = dim % len(shape)
    if not kept:
        g, indices = g.unsqueeze(dim), indices.unsqueeze(dim)
    return g.new_zeros(shape).scatter_add(dim, indices, g)


class PickAlongDim(Function):
    """y, i = f(x, dim): y = x[i] along dim  ->  dL/dx = g at the index i, 0 elsewhere"""

    op = staticmethod(torch.sort)

    @staticmethod
    def record(ctx, x, out, dim: int, kept: bool):
        ctx.shape, ctx.dim, ctx.kept = x.shape, dim, kept
        ctx.save_for_backward(out.indices)
        return out

    @staticmethod
    def backward(ctx, g, *_):
        (indices,) = ctx.saved_tensors
        return scatter_to_picks(g, indices, ctx.shape, ctx.dim, ctx.kept)


@register(torch.sort, T.sort)
class Sort(PickAlongDim):
    """values, indices = sort(x, dim)  ->  dL/dx[indices] = g  (a permutation: each element gets its own g)"""

    @staticmethod
    def forward(ctx, x, dim=-1, descending=False, *, stable=None):
        out = torch.sort(x, dim=dim, descending=descending, stable=stable)
        return PickAlongDim.record(ctx, x, out, dim, True)


@register(torch.msort, T.msort)
class Msort(PickAlongDim):
    """y = msort(x) = sort(x, dim=0).values  ->  dL/dx[indices] = g"""

    @staticmethod
    def forward(ctx, x):
        out = torch.sort(x, dim=0)
        PickAlongDim.record(ctx, x, out, 0, True)
        return out.values

    @staticmethod
    def backward(ctx, g):
        return PickAlongDim.backward(ctx, g)


@register(torch.topk, T.topk)
class Topk(PickAlongDim):
    """values, indices = topk(x, k, dim)  ->  dL/dx[indices] = g, 0 for the elements not picked"""

    @staticmethod
    def forward(ctx, x, k, dim=-1, largest=True, sorted=True):
        return PickAlongDim.record(ctx, x, torch.topk(x, k, dim, largest, sorted), dim, True)


@register(torch.kthvalue, T.kthvalue)
class Kthvalue(PickAlongDim):
    """values, indices = kthvalue(x, k, dim)  ->  dL/dx = g at the returned index (ties: torch's index)"""

    @staticmethod
    def forward(ctx, x, k, dim=-1, keepdim=False):
        return PickAlongDim.record(ctx, x, torch.kthvalue(x, k, dim, keepdim), dim, keepdim)


@register(torch.mode, T.mode)
class Mode(PickAlongDim):
    """values, indices = mode(x, dim)  ->  dL/dx = g at the returned index"""

    @staticmethod
    def forward(ctx, x, dim=-1, keepdim=False):
        return PickAlongDim.record(ctx, x, torch.mode(x, dim, keepdim), dim, keepdim)


@register(torch.median, T.median)
class Median(PickAlongDim):
    """y = median(x)  ->  dx = g/k at each of the k elements equal to y;  median(x, dim): dx = g at the returned
    index"""

    op = staticmethod(torch.median)

    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False):
        if dim is None:
            y = ctx._rule.op(x)
            ctx.all = True
            ctx.save_for_backward(x, y)
            return y
        ctx.all = False
        return PickAlongDim.record(ctx, x, ctx._rule.op(x, dim, keepdim), dim, keepdim)

    @staticmethod
    def backward(ctx, g, *_):
        if ctx.all:
            x, y = ctx.saved_tensors
            return split_among_ties(g, x, y, None, False)
        return PickAlongDim.backward(ctx, g)


@register(torch.nanmedian, T.nanmedian)
class Nanmedian(Median):
    """y = the median of the non-NaN x  ->  dx = g/k at each of the k elements equal to y;  nanmedian(x, dim):
    dx = g at the returned index (y is NaN when every element is)"""

    op = staticmethod(torch.nanmedian)


INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def quantile_picks(x: torch.Tensor, q, dim: Optional[int], ignore_nan: bool):
    """torch's quantile recipe on the sorted last dim: (sorted order, rank, ranks below/above, rank scale, valid)."""
    x = x.reshape(-1) if dim is None or x.dim() == 0 else x.movedim(dim, -1)
    order = x.sort(-1).indices  # torch.quantile sorts unstably along the last dim; NaN sorts last
    nan = x.isnan()
    q = torch.as_tensor(q, dtype=x.dtype, device=x.device).reshape(-1, *([1] * x.dim()))
    if ignore_nan:
        count = (~nan).sum(-1, keepdim=True)
        valid = count > 0
        scale = (count - 1).clamp(min=0).to(x.dtype)
    else:
        valid = ~nan.any(-1, keepdim=True)
        scale = torch.full_like(valid, x.shape[-1] - 1, dtype=x.dtype)
    fallback = torch.full_like(scale, 0 if ignore_nan else x.shape[-1] - 1)  # torch: rank 0 when all are NaN
    rank = torch.where(valid, q * scale, fallback)
    return x, order, rank, scale, valid


@register(torch.quantile, T.quantile)
class Quantile(Function):
    """y = lerp(s[floor r], s[ceil r], w), s = sort(x), r = q (n - 1)  ->  ds[floor r] = g (1 - w),  ds[ceil r] = g w"""

    ignore_nan = False

    @staticmethod
    def forward(ctx, x, q, dim=None, keepdim=False, *, interpolation="linear", out=None):
        y = getattr(torch, ctx._rule.__name__.lower())(x, q, dim, keepdim, interpolation=interpolation)
        ctx.dim, ctx.keepdim, ctx.interpolation, ctx.shape = dim, keepdim, interpolation, x.shape
        ctx.q_is_tensor = isinstance(q, torch.Tensor) and q.dim() > 0
        ctx.save_for_backward(x, q if isinstance(q, torch.Tensor) else torch.tensor(q, dtype=x.dtype))
        return y

    @staticmethod
    def backward(ctx, g, *_):
        x, q = ctx.saved_tensors
        moved, order, rank, scale, valid = quantile_picks(x, q, ctx.dim, ctx._rule.ignore_nan)
        mode = ctx.interpolation
        rounded = {"lower": rank.floor(), "higher": rank.ceil(), "nearest": rank.round()}.get(mode, rank)
        below = rounded.floor()
        above = rounded.ceil()
        weight = rank - below if mode == "linear" else torch.full_like(rank, 0.5 if mode == "midpoint" else 0.0)
        g = quantile_grad_shape(g, x, ctx.dim, ctx.keepdim, ctx.q_is_tensor)
        n = moved.shape[-1]
        shape = torch.Size((g.shape[0], *moved.shape))
        order = order.expand(shape)
        grad_sorted = (g.new_zeros(shape).scatter_add(-1, below.long().expand(*shape[:-1], 1), g * (1 - weight))
                       .scatter_add(-1, above.long().expand(*shape[:-1], 1), g * weight))
        grad = g.new_zeros(shape).scatter_add(-1, order, grad_sorted).sum(0)
        grad = grad.reshape(x.shape) if ctx.dim is None or x.dim() == 0 else grad.movedim(-1, ctx.dim)
        grad_q = None
        if ctx.needs_input_grad[1] and n:
            if mode != "linear":
                grad_q = torch.zeros_like(q)
            else:
                values = moved.sort(-1).values.unsqueeze(0).expand(shape)
                step = values.gather(-1, above.long().expand(*shape[:-1], 1)) - values.gather(
                    -1, below.long().expand(*shape[:-1], 1))
                grad_q = (g * step * scale * valid).reshape(g.shape[0], -1).sum(1).reshape(q.shape)
        return grad, grad_q


def quantile_grad_shape(g: torch.Tensor, x: torch.Tensor, dim: Optional[int], keepdim: bool,
                        q_is_tensor: bool) -> torch.Tensor:
    """The output gradient as (len(q), *x's shape with the reduced dim moved last and of size 1)."""
    g = g if q_is_tensor else g.unsqueeze(0)
    if dim is None:
        return g.reshape(g.shape[0], 1)
    dim = dim % max(x.dim(), 1)
    if x.dim() == 0:
        return g.reshape(g.shape[0], 1)
    if not keepdim:
        g = g.unsqueeze(dim + 1)
    return g.movedim(dim + 1, -1)


@register(torch.nanquantile, T.nanquantile)
class Nanquantile(Quantile):
    """y = nanquantile(x, q) = lerp(s[floor r], s[ceil r], w)  ->  ds[floor r] = g (1 - w),  ds[ceil r] = g w;
    s = sort of the non-NaN x, r = q (count - 1), w = r - floor r (quantile's rule over the non-NaN elements)"""

    ignore_nan = True
