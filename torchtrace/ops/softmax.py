"""Gradient rules for softmax, log_softmax and softmin (torch.*, Tensor.*, torch.nn.functional.*, torch.special.*)."""
import warnings

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.ops.opmath import opmath

T = torch.Tensor


def softmax_dim(x: torch.Tensor, dim, name: str) -> int:
    """The dim to normalise over; F.softmax(x) without dim picks one as torch does (with its warning)."""
    if dim is not None:
        return dim
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. "
                  "Change the call to include dim=X as an argument.", stacklevel=2)
    return 0 if x.dim() in (0, 1, 3) else 1


@register(torch.softmax, T.softmax, F.softmax, torch.special.softmax)
class Softmax(Function):
    """y = exp(x) / sum exp(x)  ->  dL/dx = y * (g - sum(g * y))"""

    op = staticmethod(torch.softmax)

    @staticmethod
    def forward(ctx, x, dim=None, *options, dtype=None, _stacklevel=3):
        dtype = options[-1] if options else dtype  # options: (dtype) from torch.softmax, (_stacklevel, dtype) from F
        ctx.dim = softmax_dim(x, dim, ctx._rule.op.__name__)
        y = ctx._rule.op(x, ctx.dim, dtype=dtype)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        y, g = opmath(*ctx.saved_tensors, g)  # (the difference cancels in bfloat16)
        return y * (g - (g * y).sum(ctx.dim, keepdim=True))


@register(torch.log_softmax, T.log_softmax, F.log_softmax, torch.special.log_softmax)
class LogSoftmax(Softmax):
    """y = x - log sum exp(x)  ->  dL/dx = g - exp(y) * sum(g)"""

    op = staticmethod(torch.log_softmax)

    @staticmethod
    def backward(ctx, g):
        y, g = opmath(*ctx.saved_tensors, g)
        return g - y.exp() * g.sum(ctx.dim, keepdim=True)


@register(F.softmin)
class Softmin(Softmax):
    """y = softmax(-x)  ->  dL/dx = -y * (g - sum(g * y))"""

    op = staticmethod(F.softmin)

    @staticmethod
    def backward(ctx, g):
        return -Softmax.backward(ctx, g)
