"""Sampling ops whose parameters may be tracers: torch.normal and torch.bernoulli.

The forward calls torch's own sampler with the caller's arguments, so under the same seed the samples
equal torch's. As in torch (derivatives.yaml), the samples are not reparameterised: the gradient with
respect to mean, std and p is zero. For a reparameterised sample write mean + std * torch.randn_like(std).
"""
import torch

from torchtrace.autograd.function import Function, register

T = torch.Tensor


def zeros_for(ctx, g: torch.Tensor, n: int) -> tuple:
    """Zero gradients (as torch) for the first n parameters that need one."""
    return tuple(torch.zeros_like(g) if need else None for need in ctx.needs_input_grad[:n])


@register(torch.normal)
class Normal(Function):
    """y ~ N(mean, std^2), sampled by torch  ->  dy/dmean = 0, dy/dstd = 0 (torch: not reparameterised)"""

    @staticmethod
    def forward(ctx, mean, std=1.0, *args, **kwargs):
        ctx.n = 2 + len(args)
        return torch.normal(mean, std, *args, **kwargs)

    @staticmethod
    def backward(ctx, g):
        return (*zeros_for(ctx, g, 2), *(None,) * (ctx.n - 2))


@register(torch.bernoulli, T.bernoulli)
class Bernoulli(Function):
    """y ~ Bernoulli(p), sampled by torch  ->  dy/dp = 0 (as torch)"""

    @staticmethod
    def forward(ctx, input, *args, **kwargs):
        ctx.n = 1 + len(args)
        return torch.bernoulli(input, *args, **kwargs)

    @staticmethod
    def backward(ctx, g):
        return (*zeros_for(ctx, g, 2)[:ctx.n],) if ctx.n > 1 else zeros_for(ctx, g, 1)
