"""Norm-based distances: F.normalize, F.cosine_similarity, F.pairwise_distance, and their modules.

Each is a p-norm n = ||v|| along a dim and a little algebra around it, so each backward is that algebra's
chain rule ending in the norm's vector-Jacobian product `norm_vjp` (vector_norm's gradient in ops/reduction.py:
sign(v) |v|^(p-1) / n^(p-1), with torch's conventions at n = 0, p = 1, inf and p < 1).

torch's formulas, reproduced exactly (torch 2.x, ATen Distance.cpp / functional.py):
  normalize(x, p, dim, eps)        = x / max(||x||_p, eps)                       (clamp_min: gradient where n >= eps)
  cosine_similarity(x1, x2, d, eps) = sum((x1 / c1) * (x2 / c2), d), c_i = max(||x_i||, eps). torch clamps the
                                     norms in place under no_grad, so its backward differentiates c_i as if it were
                                     ||x_i|| even where the clamp is active; so does ours.
  pairwise_distance(x1, x2, p, eps) = ||x1 - x2 + eps||_p along the last dim of the broadcast shape.
"""
from types import SimpleNamespace
from typing import Any, Optional

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.nn.module import Module
from torchtrace.ops.opmath import opmath
from torchtrace.ops.reduction import vector_norm_grad


def norm_vjp(g: torch.Tensor, v: torch.Tensor, n: torch.Tensor, p: float, dim: Any, keepdim: bool) -> torch.Tensor:
    """dL/dv for n = ||v||_p along dim, given g = dL/dn (n and g reduced with `keepdim`)."""
    ctx = SimpleNamespace(saved_tensors=(v, n), ord=float(p), dim=dim, keepdim=keepdim)
    return vector_norm_grad(ctx, g)


@register(F.normalize)
class Normalize(Function):
    """y = x / d, d = max(||x||_p, eps) along dim  ->  dx = g / d - [||x|| >= eps] (sum(g x) / d^2) d||x||/dx"""

    @staticmethod
    def forward(ctx, input, p=2.0, dim=1, eps=1e-12, out=None):  # the dispatcher refuses out= on tracers
        ctx.p, ctx.dim, ctx.eps = p, dim, eps
        ctx.save_for_backward(input)
        return F.normalize(input, p, dim, eps)

    @staticmethod
    def backward(ctx, g):
        x, g = opmath(*ctx.saved_tensors, g)  # (d^2 of float16 overflows past 256)
        n = torch.linalg.vector_norm(x, ctx.p, ctx.dim, keepdim=True)  # recomputed: differentiable under create_graph
        d = n.clamp_min(ctx.eps)
        grad_d = -(g * x).sum(ctx.dim, keepdim=True) / (d * d) * (n >= ctx.eps)
        return g / d + norm_vjp(grad_d, x, n, ctx.p, ctx.dim, True)


def clamped_value(t: torch.Tensor, low: float) -> torch.Tensor:
    """max(t, low) whose derivative is that of t (1 even where clamped): what torch's `with torch.no_grad():
    t.clamp_(min=low)` does to a tensor in a graph (cosine_similarity's norms, gaussian_nll_loss's var)."""
    return t + (t.clamp_min(low) - t).detach()


def _clamped_norm(x: torch.Tensor, dim: int, eps: float) -> tuple:
    """(||x||, max(||x||, eps) differentiated as ||x||)."""
    n = torch.linalg.vector_norm(x, 2, dim, keepdim=True)
    return n, clamped_value(n, eps)


@register(torch.cosine_similarity, F.cosine_similarity)
class CosineSimilarityFunction(Function):
    """y = sum(u1 u2), u_i = x_i / c_i, c_i = max(||x_i||, eps)  ->  dx1 = g (u2 - y x1 / ||x1||) / c1, dx2 likewise
    (x1 / ||x1|| = 0 where x1 = 0)"""

    @staticmethod
    def forward(ctx, x1, x2, dim=1, eps=1e-8):
        ctx.dim, ctx.eps = dim, eps
        y = torch.cosine_similarity(x1, x2, dim, eps)
        ctx.save_for_backward(x1, x2, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x1, x2, y = ctx.saved_tensors
        shape = torch.broadcast_shapes(x1.shape, x2.shape)
        x1, x2 = x1.expand(shape), x2.expand(shape)
        dim = ctx.dim % max(x1.dim(), 1)
        g, y = g.unsqueeze(dim), y.unsqueeze(dim)
        (n1, c1), (n2, c2) = _clamped_norm(x1, dim, ctx.eps), _clamped_norm(x2, dim, ctx.eps)
        need_1, need_2 = ctx.needs_input_grad[:2]
        grad_1 = g / c1 * (x2 / c2 - y * x1 / (n1 + (n1 == 0))) if need_1 else None
        grad_2 = g / c2 * (x1 / c1 - y * x2 / (n2 + (n2 == 0))) if need_2 else None
        return grad_1, grad_2


@register(torch.pairwise_distance, F.pairwise_distance)
class PairwiseDistanceFunction(Function):
    """y = ||x1 - x2 + eps||_p along the last dim  ->  dy/dx1 = d||v||/dv at v = x1 - x2 + eps, dy/dx2 = -dy/dx1"""

    @staticmethod
    def forward(ctx, x1, x2, p=2.0, eps=1e-6, keepdim=False):
        ctx.p, ctx.eps, ctx.keepdim = p, eps, keepdim
        ctx.save_for_backward(x1, x2)
        return torch.pairwise_distance(x1, x2, p, eps, keepdim)

    @staticmethod
    def backward(ctx, g):
        if ctx.p == 0:  # a count of nonzero differences: flat, and torch sends no gradient (None, as vector_norm)
            return None, None
        grad = pairwise_distance_vjp(g, *ctx.saved_tensors, ctx.p, ctx.eps, ctx.keepdim)
        need_1, need_2 = ctx.needs_input_grad[:2]
        return (grad if need_1 else None), (-grad if need_2 else None)


def pairwise_distance_vjp(g: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, p: float, eps: float,
                          keepdim: bool = False, n: Optional[torch.Tensor] = None) -> torch.Tensor:
    """dL/dx1 (= -dL/dx2) of y = pairwise_distance(x1, x2, p, eps, keepdim), given g = dL/dy."""
    v = x1 - x2 + eps
    dim = max(v.dim() - 1, 0)
    if v.dim() == 0:  # torch reduces a 0-d difference to |v|^... = its own norm
        v, g = v.reshape(1), g.reshape(1)
        return norm_vjp(g, v, torch.linalg.vector_norm(v, p, 0, True), p, 0, True).reshape(())
    if n is None:
        n = torch.linalg.vector_norm(v, p, dim, keepdim)
    return norm_vjp(g, v, n, p, dim, keepdim)


class CosineSimilarity(Module, torch.nn.CosineSimilarity):
    """torch.nn.CosineSimilarity: the cosine of the angle between x1 and x2 along dim."""


class PairwiseDistance(Module, torch.nn.PairwiseDistance):
    """torch.nn.PairwiseDistance: ||x1 - x2 + eps||_p along the last dim."""
