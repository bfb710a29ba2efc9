"""Local response normalisation: each channel divided by a power of the mean square of its channel neighbours.

    s_c = (1/n) sum_{c' = c - n//2}^{c + (n-1)//2} x_c'^2   (zero outside the channels),   b_c = k + alpha s_c,
    y_c = x_c / b_c^beta
    ->  dx_j = g_j / b_j^beta - (2 x_j / n) sum_{c: j in window(c)} g_c y_c alpha beta / b_c

The sum over the windows containing j is the window sum with its two reaches swapped (its adjoint).
"""
import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.nn.module import Module


def channel_window_sum(t: torch.Tensor, before: int, after: int) -> torch.Tensor:
    """r_c = sum of t_c' over c' in [c - before, c + after] along dim 1, zero outside the channels."""
    last = F.pad(t.transpose(1, -1), (before, after))
    channels = t.shape[1]
    total = last[..., 0:channels]
    for shift in range(1, before + after + 1):
        total = total + last[..., shift:shift + channels]
    return total.transpose(1, -1)


@register(F.local_response_norm)
class LocalResponseNormalization(Function):
    """y_c = x_c / b_c^beta, b_c = k + alpha s_c  ->  dx_j = g_j / b_j^beta - (2 x_j / n) sum_{c: j in window(c)}
    g_c y_c alpha beta / b_c;  s_c the mean of x^2 over the n channels around c"""

    @staticmethod
    def forward(ctx, input, size, alpha=1e-4, beta=0.75, k=1.0):
        y = F.local_response_norm(input, size, alpha, beta, k)
        ctx.size, ctx.alpha, ctx.beta, ctx.k = size, alpha, beta, k
        ctx.save_for_backward(input, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        n, alpha, beta = ctx.size, ctx.alpha, ctx.beta
        if x.numel() == 0:
            return torch.zeros_like(x)
        base = channel_window_sum(x * x, n // 2, (n - 1) // 2) * (alpha / n) + ctx.k
        spread = channel_window_sum(g * y * (alpha * beta) / base, (n - 1) // 2, n // 2)
        return g / base.pow(beta) - x * spread * (2 / n)


class LocalResponseNorm(Module, torch.nn.LocalResponseNorm):
    """torch.nn.LocalResponseNorm, recorded by torchtrace's local response normalisation rule."""


class CrossMapLRN2d(Module, torch.nn.CrossMapLRN2d):
    """torch.nn.CrossMapLRN2d runs a legacy torch autograd Function that torchtrace cannot see into: refused
    with gradients (tt.port swaps it in), torch's result without."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        needs = getattr(input, "_tt_requires_grad", False) or any(
            getattr(q, "_tt_requires_grad", False) or q.requires_grad for q in self.parameters())
        if needs and torch.is_grad_enabled():
            raise UnsupportedOperationError(
                "torch.nn.CrossMapLRN2d: its legacy autograd Function has no gradient rule — use "
                "torch.nn.LocalResponseNorm (F.local_response_norm) instead, or run it under tt.no_grad()")
        return torch.nn.CrossMapLRN2d.forward(self, input)
