"""Gradient rules for cumulative ops (scans): cumprod, cummax, cummin, logcumsumexp (cumsum lives in reduction.py)."""
import torch

from torchtrace.autograd.function import Function, register

T = torch.Tensor


def reversed_cumsum(t: torch.Tensor, dim: int) -> torch.Tensor:
    """s_j = sum_{i>=j} t_i along dim."""
    return t.flip(dim).cumsum(dim).flip(dim)


def cumprod_grad_with_zeros(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, dim: int) -> torch.Tensor:
    """dL/dx_k = sum_{i>=k} g_i prod_{j<=i, j!=k} x_j, exact when x has zeros (dim: non-negative).

    Without create_graph, terms that are zero by the math are selected away (torch.where), never multiplied by 0, so
    a NaN or an infinity past a zero stays out of them, as in torch: cumprod of [1, 0, nan] gets [g_0, nan, 0]. With
    it, torch's own product form (below), whose second derivative meets NaNs and zeros as torch's does."""
    n = x.shape[dim]
    if torch.is_grad_enabled():  # create_graph: torch's own O(n^2) form, so a second derivative meets NaNs and zeros
        columns = []  # as torch's does: column k = sum_{i>=k} g_i (prod_{j<k} x_j)(prod_{k<j<=i} x_j)
        for k in range(n):
            until = x.narrow(dim, 0, k).prod(dim, keepdim=True) if k else torch.ones_like(g.narrow(dim, 0, 1))
            if k < n - 1:
                after = x.narrow(dim, k + 1, n - k - 1).cumprod(dim)
                omitted = torch.cat([until, after if k == 0 else until * after], dim)
            else:
                omitted = until
            columns.append((g.narrow(dim, k, n - k) * omitted).sum(dim, keepdim=True))
        return torch.cat(columns, dim)
    zeros = x == 0
    seen = zeros.cumsum(dim)
    before, first = seen == 0, zeros & (seen == 1)  # before the first zero z1 of the slice; z1 itself
    ahead = reversed_cumsum(torch.where(before, g * y, 0.0), dim) / torch.where(before, x, 1.0)
    # at z1: prod_{j<z1} x_j (= y_{z1-1}) * sum_{z1<=i<z2} g_i prod_{z1<j<=i} x_j, z2 the second zero
    between = (seen == 1) & ~first
    after_first = (torch.where(between, x, 1.0).cumprod(dim) * torch.where(seen == 1, g, 0.0)).sum(dim, keepdim=True)
    z1 = first.to(torch.uint8).argmax(dim, keepdim=True)
    until_first = torch.where(z1 == 0, 1.0, y.gather(dim, (z1 - 1).clamp(min=0)))
    return torch.where(before, ahead, torch.where(first, after_first * until_first, 0.0))


@register(torch.cumprod, T.cumprod)
class Cumprod(Function):
    """y_i = prod_{j<=i} x_j  ->  dL/dx_k = sum_{i>=k} g_i y_i / x_k  (exact products of the others at zeros)"""

    @staticmethod
    def forward(ctx, x, dim, *, dtype=None):
        y = torch.cumprod(x, dim, dtype=dtype)
        ctx.dim = dim
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        if x.numel() <= 1 or x.dim() == 0:
            return g
        dim = ctx.dim % x.dim()
        if x.shape[dim] == 1:
            return g
        if (x == 0).any():
            return cumprod_grad_with_zeros(x, y.to(g.dtype), g, dim)
        return reversed_cumsum(g * y, dim) / x


@register(torch.cummax, T.cummax)
class Cummax(Function):
    """values_i = max_{j<=i} x_j, indices_i = its position  ->  dL/dx_j = sum of g_i over the i whose index is j"""

    op = staticmethod(torch.cummax)

    @staticmethod
    def forward(ctx, x, dim):
        out = ctx._rule.op(x, dim)
        ctx.dim = dim
        ctx.save_for_backward(out.indices)
        return out

    @staticmethod
    def backward(ctx, g, *_):
        (indices,) = ctx.saved_tensors
        if g.dim() == 0:
            return g
        return g.new_zeros(g.shape).scatter_add(ctx.dim, indices, g)


@register(torch.cummin, T.cummin)
class Cummin(Cummax):
    """values_i = min_{j<=i} x_j, indices_i = its position  ->  dL/dx_j = sum of g_i over the i whose index is j"""

    op = staticmethod(torch.cummin)


@register(torch.logcumsumexp, T.logcumsumexp)
class LogCumSumExp(Function):
    """y_i = log sum_{j<=i} exp x_j  ->  dL/dx_k = sum_{i>=k} g_i exp(x_k - y_i)  (in log space, g split by sign)"""

    @staticmethod
    def forward(ctx, x, dim):
        y = torch.logcumsumexp(x, dim)
        ctx.dim = dim
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        if x.dim() == 0:
            return LogCumSumExp.grad(x.reshape(1), y.reshape(1), g.reshape(1), 0).reshape(())
        return LogCumSumExp.grad(x, y, g, ctx.dim)

    @staticmethod
    def grad(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, dim: int) -> torch.Tensor:
        """exp(x_k + log sum_{i>=k} |g_i| exp(-y_i)) for the positive and the negative g, as torch (log 0 -> lowest)"""
        lowest = torch.full_like(g, torch.finfo(g.dtype).min)
        log_g = g.abs().log()
        parts = [torch.where(mask, log_g, lowest) for mask in (g > 0, g < 0)]
        positive, negative = ((part - y).flip(dim).logcumsumexp(dim).flip(dim) + x for part in parts)
        return positive.exp() - negative.exp()
