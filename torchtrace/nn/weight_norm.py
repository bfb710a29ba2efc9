"""Weight normalisation (torch._weight_norm, what nn.utils.weight_norm and parametrizations.weight_norm call):

    w = g v / ||v||   (the norm over every dim but `dim`; dim = -1: over the whole tensor)
    ->  dg = sum_{but dim}(gw v) / ||v||,   dv = (g / ||v||) (gw - v sum_{but dim}(gw v) / ||v||^2)
    n = norm_except_dim(v, 2, dim) = ||v||   ->  dv = gn v / ||v||   (0 where ||v|| = 0, as torch)

The gradient of v is the part of (g / ||v||) gw orthogonal to v: scaling v changes nothing.
"""
from typing import List

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.ops.opmath import opmath


def _other_dims(v: torch.Tensor, dim: int) -> List[int]:
    return [d for d in range(v.dim()) if dim == -1 or d != dim % max(v.dim(), 1)]


@register(torch._weight_norm)
class WeightNorm(Function):
    """w = g v / ||v||  ->  dg = sum(gw v) / ||v||,  dv = (g / ||v||) (gw - v sum(gw v) / ||v||^2)"""

    @staticmethod
    def forward(ctx, v, g, dim=0):
        ctx.dim = dim
        ctx.save_for_backward(v, g)
        return torch._weight_norm(v, g, dim)

    @staticmethod
    def backward(ctx, gw):
        v, g, gw = opmath(*ctx.saved_tensors, gw)  # (v^2 of float16 overflows past 256)
        dims = _other_dims(v, ctx.dim)
        norm = (v * v).sum(dims, keepdim=True).sqrt()
        if g.numel() != norm.numel():  # dim=-1 with a g that broadcasts over v (one scale per column, say):
            along = (g * gw * v).sum(dims, keepdim=True)  # dv = g gw / ||v|| - v sum(g gw v) / ||v||^3
            grad_v = g * gw / norm - v * along / (norm * norm * norm) if ctx.needs_input_grad[0] else None
            grad_g = (gw * v / norm).sum_to_size(g.shape) if ctx.needs_input_grad[1] else None
            return grad_v, grad_g, None
        along = (gw * v).sum(dims, keepdim=True)
        grad_v = (g.reshape(norm.shape) / norm) * (gw - v * along / (norm * norm)) if ctx.needs_input_grad[0] else None
        grad_g = (along / norm).reshape(g.shape) if ctx.needs_input_grad[1] else None
        return grad_v, grad_g, None


@register(torch.norm_except_dim)  # nn.utils.weight_norm initialises g with it
class NormExceptDim(Function):
    """n = ||v|| over every dim but dim (kept as size 1)  ->  dv = gn v / n  (0 where n = 0)"""

    @staticmethod
    def forward(ctx, v, pow=2, dim=0):
        if pow != 2:
            raise UnsupportedOperationError(f"torch.norm_except_dim: pow={pow} has no gradient rule — use pow=2 "
                                            "(what weight_norm uses) or torch.linalg.vector_norm")
        ctx.dim = dim
        n = torch.norm_except_dim(v, pow, dim)
        ctx.save_for_backward(v, n)
        return n

    @staticmethod
    def backward(ctx, gn):
        v, n = ctx.saved_tensors
        n = n.reshape([1] * v.dim()) if ctx.dim == -1 else n
        return torch.where(n == 0, 0.0, gn.reshape(n.shape) / n) * v, None, None
