"""Gradient rules for reductions: sum, mean, prod, max/min, logsumexp, var/std, norms, cumsum."""
import torch

from torchtrace.autograd.function import Function, register

T = torch.Tensor


def expand_reduced(g: torch.Tensor, shape: torch.Size, dim, keepdim: bool) -> torch.Tensor:
    """Broadcast a reduced gradient back to the input's shape (re-inserting the dims that keepdim dropped)."""
    if dim is not None and not keepdim:
        dims = [dim] if isinstance(dim, int) else list(dim)
        for d in sorted(d % len(shape) for d in dims):
            g = g.unsqueeze(d)
    return g.expand(shape)


@register(torch.sum, T.sum)
class Sum(Function):
    """y = sum_i x_i (over dim)  ->  dy/dx_i = 1"""

    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, *, dtype=None):
        ctx.shape, ctx.dim, ctx.keepdim = x.shape, dim, keepdim
        return torch.sum(x, dim, keepdim, dtype=dtype)

    @staticmethod
    def backward(ctx, g):
        return expand_reduced(g, ctx.shape, ctx.dim, ctx.keepdim)
