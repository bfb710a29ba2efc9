"""Gradient rules for distances and second moments: cdist, pdist, cov, corrcoef, renorm.

A distance is a p-norm of a difference, so its gradient is the norm's derivative sent with + to one point and
- to the other. cov is a weighted sum of outer products of centred samples; corrcoef divides it by the
standard deviations; renorm rescales each slice whose norm is too large.
"""
import math
from types import SimpleNamespace
from typing import Optional, Tuple

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.ops.reduction import vector_norm_grad

T = torch.Tensor


def distance_grad(diff: torch.Tensor, dist: torch.Tensor, p: float) -> torch.Tensor:
    """d ||diff||_p / d diff over the last dim (dist keeps that dim), by torch's cdist / pdist conventions:
    0 at coincident points and at zero coordinates when p < 1; p = inf: every tied coordinate gets it whole."""
    if p == 0:
        return torch.zeros_like(diff)
    if math.isinf(p):
        return diff.sign() * (diff.abs() == dist)
    if p == 2:  # smooth where a coordinate difference is 0 (its second derivative is 1/dist there)
        return diff / (dist + (dist == 0))
    zero = diff == 0
    return diff.sign() * (diff.abs() + zero) ** (p - 1) / (dist + (dist == 0)) ** (p - 1)


@register(torch.cdist)
class Cdist(Function):
    """d_ij = ||x1_i - x2_j||_p  ->  dx1_i = sum_j g_ij dd/ddiff, dx2_j = -sum_i g_ij dd/ddiff"""

    @staticmethod
    def forward(ctx, x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
        ctx.p = float(p)
        ctx.save_for_backward(x1, x2)
        return torch.cdist(x1, x2, p, compute_mode)

    @staticmethod
    def backward(ctx, g):
        x1, x2 = ctx.saved_tensors
        diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)  # (..., P, R, M)
        dist = torch.linalg.vector_norm(diff, ctx.p, -1, keepdim=True)  # exact, whatever compute_mode was
        share = g.unsqueeze(-1) * distance_grad(diff, dist, ctx.p)
        need_1, need_2 = ctx.needs_input_grad[:2]
        return share.sum(-2) if need_1 else None, -share.sum(-3) if need_2 else None


@register(torch.pdist)
class Pdist(Function):
    """d_k = ||v_k||_p, v_k = x_i - x_j for each row pair k = (i < j)  ->  dx_i = sum_{k = (i, j)} g_k dd_k/dv_k
    - sum_{k = (j, i)} g_k dd_k/dv_k  (a row gains the pairs it starts and loses the pairs it ends)"""

    @staticmethod
    def forward(ctx, x, p=2.0):
        ctx.p = float(p)
        ctx.save_for_backward(x)
        return torch.pdist(x, p)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        first, second = torch.triu_indices(x.shape[0], x.shape[0], 1, device=x.device)  # pdist's pair order
        diff = x.index_select(0, first) - x.index_select(0, second)
        dist = torch.linalg.vector_norm(diff, ctx.p, -1, keepdim=True)
        share = g.unsqueeze(-1) * distance_grad(diff, dist, ctx.p)
        return torch.zeros_like(x).index_add(0, first, share).index_add(0, second, -share)


# ------------------------------------------------------------------ covariance and correlation

def cov_parts(x: torch.Tensor, correction: float, fweights: Optional[torch.Tensor],
              aweights: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(samples as columns of a 2-D X centred by the weighted mean, weights w, their sum s, normaliser f)."""
    x = x.reshape(1, -1) if x.dim() < 2 else x
    w = fweights if aweights is None else aweights if fweights is None else fweights * aweights
    w = torch.ones_like(x[0]) if w is None else w
    s = w.sum()
    centred = x - (x * w).sum(1, keepdim=True) / s
    f = s - correction if aweights is None else s - correction * (w * aweights).sum() / s
    return centred, w, s, f.clamp_min(0)  # as torch: too few samples for the correction give inf / nan


def cov_input_grad(G: torch.Tensor, centred: torch.Tensor, w: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """C = Xc diag(w) Xc^T / f  ->  dX = (G + G^T) Xc diag(w) / f (the mean's share vanishes: Xc w = 0)."""
    return (G + G.mT) @ (centred * w) / f


@register(torch.cov, T.cov)
class Cov(Function):
    """C = sum_k w_k (x_k - m)(x_k - m)^T / f  ->  dX = (G + G^T)(X - m) diag(w) / f;
    d aweights_k = fw_k (x_k - m)^T G (x_k - m) / f - <G, C> df/d aweights_k / f;  X = the observations x_k as
    columns, w_k = fw_k aweights_k, fw = fweights, m = their w-weighted mean, f = sum_k w_k - correction"""

    @staticmethod
    def forward(ctx, x, correction=1, fweights=None, aweights=None):
        c = torch.cov(x, correction=correction, fweights=fweights, aweights=aweights)
        ctx.correction = correction
        ctx.save_for_backward(x, fweights, aweights, c)
        return c

    @staticmethod
    def backward(ctx, g):
        x, fweights, aweights, c = ctx.saved_tensors
        centred, w, s, f = cov_parts(x, ctx.correction, fweights, aweights)
        G = g.reshape(centred.shape[0], centred.shape[0])
        dx = cov_input_grad(G, centred, w, f).reshape(x.shape) if ctx.needs_input_grad[0] else None
        d_aw = None
        if aweights is not None and ctx.needs_input_grad[3]:
            fw = 1 if fweights is None else fweights
            quadratic = ((G @ centred) * centred).sum(0)
            df = fw * (1 - ctx.correction * (2 * aweights / s - (w * aweights).sum() / s ** 2))
            d_aw = fw * quadratic / f - (g * c).sum() * df / f
        return dx, None, None, d_aw


@register(torch.corrcoef, T.corrcoef)
class Corrcoef(Function):
    """R_ij = C_ij / (sigma_i sigma_j), sigma = sqrt(diag C)  ->  dC = G / (sigma sigma^T)
    - diag(sum_j (G o R)_ij + (G o R)_ji) / (2 C_ii), then through cov"""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.corrcoef(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        centred, w, _, f = cov_parts(x, 1, None, None)
        c = centred @ centred.mT / f
        variance = c.diagonal()
        sigma = variance.sqrt()
        scale = sigma.unsqueeze(1) * sigma.unsqueeze(0)
        G = g.reshape(c.shape)
        GR = G * (c / scale)
        dc = G / scale + torch.diag_embed(-(GR.sum(1) + GR.sum(0)) / (2 * variance))
        return cov_input_grad(dc, centred, w, f).reshape(x.shape)


# ------------------------------------------------------------------ renorm

@register(torch.renorm, T.renorm)
class Renorm(Function):
    """y = c x (on slices along dim whose p-norm n > m; else y = x)  ->  dx = c g - c <g, x> dn/dx / (n + 1e-7),
    c = m / (n + 1e-7)"""

    @staticmethod
    def forward(ctx, x, p, dim, maxnorm):
        ctx.p, ctx.maxnorm = float(p), maxnorm
        ctx.dims = [d for d in range(x.dim()) if d != dim % max(x.dim(), 1)]
        ctx.save_for_backward(x)
        return torch.renorm(x, p, dim, maxnorm)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        norm = torch.linalg.vector_norm(x, ctx.p, ctx.dims, keepdim=True)
        factor = ctx.maxnorm / (norm + 1e-7)
        along = (g * x).sum(ctx.dims, keepdim=True)
        # <g, x> dn/dx by the vector norm's own rule (its conventions at zeros and ties)
        norm_ctx = SimpleNamespace(saved_tensors=(x, norm), ord=ctx.p, dim=ctx.dims, keepdim=True)
        shrunk = factor * g - factor / (norm + 1e-7) * vector_norm_grad(norm_ctx, along)
        return torch.where(norm > ctx.maxnorm, shrunk, g)
