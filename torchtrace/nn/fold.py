"""Unfold (im2col) and fold (col2im): each is the other's adjoint, so each backward is the other's forward.

    unfold: y[n, (c, k), l] = x_pad[n, c, s l + d k]   (every sliding block as a column)
            ->  dx = fold(g, x's size, same kernel, dilation, padding, stride)   (overlapping blocks add up)
    fold:   y = sum of the columns placed back at their blocks (overlaps summed, padding cut)
            ->  dx = unfold(g, same kernel, dilation, padding, stride)
"""
import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.nn.module import Module


@register(F.unfold)
class Im2Col(Function):
    """y = unfold(x) (im2col)  ->  dx = fold(g, x's spatial size) (col2im: the adjoint)"""

    @staticmethod
    def forward(ctx, input, kernel_size, dilation=1, padding=0, stride=1):
        ctx.options, ctx.size = (kernel_size, dilation, padding, stride), tuple(input.shape[-2:])
        return F.unfold(input, kernel_size, dilation, padding, stride)

    @staticmethod
    def backward(ctx, g):
        return F.fold(g, ctx.size, *ctx.options)


@register(F.fold)
class Col2Im(Function):
    """y = fold(x) (col2im, overlaps summed)  ->  dx = unfold(g) (im2col: the adjoint)"""

    @staticmethod
    def forward(ctx, input, output_size, kernel_size, dilation=1, padding=0, stride=1):
        ctx.options = (kernel_size, dilation, padding, stride)
        return F.fold(input, output_size, kernel_size, dilation, padding, stride)

    @staticmethod
    def backward(ctx, g):
        return F.unfold(g, *ctx.options)


class Unfold(Module, torch.nn.Unfold):
    """torch.nn.Unfold, recorded by torchtrace's unfold rule."""


class Fold(Module, torch.nn.Fold):
    """torch.nn.Fold, recorded by torchtrace's fold rule."""
