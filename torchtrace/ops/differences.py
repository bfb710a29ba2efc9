"""Gradient rules for finite differences along a dim: diff, gradient, trapezoid / trapz, cumulative_trapezoid, cross.

Each of these is linear (or, for the trapezoid rule with sample points x, bilinear) in its inputs, so each
backward is the transposed stencil: a difference y_i = z_{i+1} - z_i sends g_i to z_{i+1} and -g_i to z_i.
"""
import numbers
from typing import Any, Optional, Sequence, Tuple

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError

T = torch.Tensor


def _padded(t: torch.Tensor, dim: int, front: bool) -> torch.Tensor:
    """t with one zero slice added along dim, at the front or at the back."""
    shape = list(t.shape)
    shape[dim] = 1
    zero = t.new_zeros(shape)
    return torch.cat([zero, t] if front else [t, zero], dim)


def undiff(g: torch.Tensor, dim: int) -> torch.Tensor:
    """Transpose of y_i = z_{i+1} - z_i along dim: dz_j = g_{j-1} - g_j (g = 0 outside its range)."""
    return _padded(g, dim, front=True) - _padded(g, dim, front=False)


# ------------------------------------------------------------------ diff

@register(torch.diff, T.diff)
class Diff(Function):
    """y = n-th difference of z = cat(prepend, x, append) along dim  ->  dz = n-fold transposed difference of g"""

    @staticmethod
    def forward(ctx, x, n=1, dim=-1, prepend=None, append=None):
        y = torch.diff(x, n, dim, prepend, append)
        ctx.n, ctx.dim = n, dim % max(x.dim(), 1)
        ctx.shape = x.shape
        ctx.lengths = [t.shape[ctx.dim] if t is not None else 0 for t in (prepend, x, append)]
        return y

    @staticmethod
    def backward(ctx, g):
        if ctx.n == 0:  # torch returns x itself: prepend and append are not used
            return g, None, None, None, None
        if ctx.n >= sum(ctx.lengths):  # every difference was cut away: y is empty and nothing depends on z
            shape = list(ctx.shape)
            shape[ctx.dim] = sum(ctx.lengths)
            dz = g.new_zeros(shape)
        else:
            dz = g
            for _ in range(ctx.n):
                dz = undiff(dz, ctx.dim)
        d_before, dx, d_after = dz.split(ctx.lengths, ctx.dim)
        need_before, need_after = ctx.needs_input_grad[3:5]
        return dx, None, None, d_before if need_before else None, d_after if need_after else None


# ------------------------------------------------------------------ torch.gradient

def _stencil(n: int, spacing: Any, edge_order: int, like: torch.Tensor) -> torch.Tensor:
    """The matrix A of torch.gradient along one dim of length n: out = A @ x, found by applying it to I."""
    eye = torch.eye(n, dtype=like.dtype, device=like.device)
    return torch.gradient(eye, spacing=[spacing], dim=0, edge_order=edge_order)[0]


@register(torch.gradient)
class Gradient(Function):
    """y_k = A_k x along dim_k  ->  dx = sum_k A_k^T g_k  (A_k a fixed matrix built from the spacing: central
    differences inside, one-sided at the edges)"""

    @staticmethod
    def forward(ctx, x, spacing=1, dim=None, edge_order=1):
        dims = list(range(x.dim())) if dim is None else [dim] if isinstance(dim, numbers.Integral) else list(dim)
        steps = list(spacing) if isinstance(spacing, (list, tuple)) else [1 if spacing is None else spacing]
        if any(isinstance(s, torch.Tensor) and s.requires_grad for s in steps):
            raise UnsupportedOperationError(
                "torch.gradient: a gradient with respect to the spacing coordinates is not supported — pass the "
                "coordinates as tensors that do not require grad (e.g. coords.detach())."
            )
        ctx.dims = [d % x.dim() for d in dims]
        ctx.steps = steps * len(dims) if len(steps) == 1 else steps
        ctx.edge_order = edge_order
        return torch.gradient(x, spacing=spacing, dim=dim, edge_order=edge_order)

    @staticmethod
    def backward(ctx, *grads):
        dx = None
        for g, d, step in zip(grads, ctx.dims, ctx.steps):
            a = _stencil(g.shape[d], step, ctx.edge_order, g)
            part = (g.movedim(d, -1) @ a).movedim(-1, d)
            dx = part if dx is None else dx + part
        return dx


# ------------------------------------------------------------------ trapezoid rule

def trapezoid_grads(G: torch.Tensor, y: torch.Tensor, x: Optional[torch.Tensor], dx: Any, dim: int,
                    need_x: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Gradients of sum_i G_i (x_{i+1} - x_i)(y_i + y_{i+1}) / 2, where G_i (one per interval) is what each
    interval's area receives: dy_i = (G_{i-1} w_{i-1} + G_i w_i) / 2, dx_i = G_{i-1} s_{i-1} - G_i s_i."""
    n = y.shape[dim]
    if x is not None and x.dim() == 1 and y.dim() > 1:  # 1-D sample points lie along dim
        x = x.reshape([n if d == dim % y.dim() else 1 for d in range(y.dim())])
    widths = x.diff(dim=dim) if x is not None else dx
    area = G * widths
    dy = (_padded(area, dim, True) + _padded(area, dim, False)) / 2
    d_x = None
    if need_x:
        mean = (y.narrow(dim, 0, n - 1) + y.narrow(dim, 1, n - 1)) / 2
        d_x = _padded(G * mean, dim, True) - _padded(G * mean, dim, False)
    return dy, d_x


def _x_shaped(d_x: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """The gradient of the sample points, summed back to x's shape (1-D x was spread along dim)."""
    if x.dim() == 1 and d_x.dim() > 1:
        d = dim % d_x.dim()
        return d_x.sum([i for i in range(d_x.dim()) if i != d])
    return d_x.sum_to_size(x.shape)


class _Trapezoid(Function):
    """Shared forward/backward of trapezoid and cumulative_trapezoid; `op` is the torch function."""

    op = staticmethod(torch.trapezoid)
    cumulative = False

    @staticmethod
    def forward(ctx, y, x=None, dim=-1, *, dx=None):
        op = ctx._rule.op
        out = op(y, x, dim=dim) if x is not None else op(y, dx=1 if dx is None else dx, dim=dim)
        ctx.dim, ctx.dx, ctx.has_x = dim, 1 if dx is None else dx, x is not None
        ctx.save_for_backward(y, x)
        return out

    @staticmethod
    def backward(ctx, g):
        y, x = ctx.saved_tensors
        nd = max(y.dim(), x.dim() if x is not None and x.dim() > 1 else 0)
        dim = ctx.dim % nd - nd  # negative: counts from the end, valid for y and the broadcast result
        n = y.shape[dim]
        need_x = ctx.has_x and ctx.needs_input_grad[1]
        if n == 0:
            return torch.zeros_like(y), torch.zeros_like(x) if need_x else None
        if ctx._rule.cumulative:  # interval i is in every running total from i on
            G = g.flip(dim).cumsum(dim).flip(dim)
        else:
            shape = list(g.unsqueeze(dim).shape)
            shape[dim] = n - 1
            G = g.unsqueeze(dim).expand(shape)
        dy, d_x = trapezoid_grads(G, y, x, ctx.dx, dim, need_x)
        return dy, _x_shaped(d_x, x, dim) if need_x else None


@register(torch.trapezoid, torch.trapz)
class Trapezoid(_Trapezoid):
    """r = sum_i w_i s_i, w_i = x_{i+1} - x_i, s_i = (y_i + y_{i+1}) / 2  ->  dy_i = (w_{i-1} + w_i) g / 2,
    dx_i = (s_{i-1} - s_i) g"""

    op = staticmethod(torch.trapezoid)


@register(torch.cumulative_trapezoid)
class CumulativeTrapezoid(_Trapezoid):
    """c_k = sum_{i<=k} w_i s_i, the cumulative trapezoid of y over x  ->  dy_i = (w_{i-1} G_{i-1} + w_i G_i) / 2,
    dx_i = s_{i-1} G_{i-1} - s_i G_i;  w_i = x_{i+1} - x_i, s_i = (y_i + y_{i+1}) / 2, G_i = sum_{k>=i} g_k
    (trapezoid's rule with G for g)"""

    op = staticmethod(torch.cumulative_trapezoid)
    cumulative = True


# ------------------------------------------------------------------ cross product

def _cross_dim(shape: Sequence[int]) -> int:
    """torch.cross with dim=None: the first dim of size 3 (torch's forward has checked there is one)."""
    return next(d for d, n in enumerate(shape) if n == 3)


@register(torch.linalg.cross)
class LinalgCross(Function):
    """c = a x b along dim  ->  da = b x g, db = g x a   (as <g, a x b> = <a, b x g> = <b, g x a>)"""

    @staticmethod
    def forward(ctx, a, b, dim=-1):
        ctx.dim = dim
        ctx.save_for_backward(a, b)
        return torch.linalg.cross(a, b, dim=dim)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[:2]
        da = torch.linalg.cross(b.expand_as(g), g, dim=ctx.dim) if need_a else None
        db = torch.linalg.cross(g, a.expand_as(g), dim=ctx.dim) if need_b else None
        return da, db


@register(torch.cross, T.cross)
class Cross(LinalgCross):
    """c = a x b along dim (dim=None: the first dim of size 3)  ->  da = b x g, db = g x a"""

    @staticmethod
    def forward(ctx, a, b, dim=None):
        out = torch.cross(a, b, dim=dim) if dim is not None else torch.cross(a, b)
        ctx.dim = dim if dim is not None else _cross_dim(torch.broadcast_shapes(a.shape, b.shape))
        ctx.save_for_backward(a, b)
        return out
