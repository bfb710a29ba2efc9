"""Max unpooling: the partial inverse of max pooling. Each input value is written at its index, the rest is zero.

    y.flat[i_q] = x_q (in each flattened output plane)  ->  dx_q = g.flat[i_q]   (a gather of g at the indices)

torch writes one of several values sent to the same index; its gradient still gathers g for every x_q, as here.
"""
import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.nn.module import Module


class MaxUnpool(Function):
    """y.flat[i_q] = x_q, zero elsewhere  ->  dx_q = g.flat[i_q]"""

    op = staticmethod(F.max_unpool2d)
    dims = 2

    @staticmethod
    def forward(ctx, input, indices, kernel_size, stride=None, padding=0, output_size=None):
        ctx.save_for_backward(indices)
        return ctx._rule.op(input, indices, kernel_size, stride, padding, output_size)

    @staticmethod
    def backward(ctx, g):
        (indices,) = ctx.saved_tensors
        n = ctx._rule.dims
        return g.flatten(-n).gather(-1, indices.flatten(-n)).reshape(indices.shape), None


for _n, _op in [(1, F.max_unpool1d), (2, F.max_unpool2d), (3, F.max_unpool3d)]:
    register(_op, rule=type(f"MaxUnpool{_n}d", (MaxUnpool,), {"__doc__": MaxUnpool.__doc__,
                                                               "op": staticmethod(_op), "dims": _n}))


class MaxUnpool1d(Module, torch.nn.MaxUnpool1d):
    """torch.nn.MaxUnpool1d, recorded by torchtrace's max-unpool rule."""


class MaxUnpool2d(Module, torch.nn.MaxUnpool2d):
    """torch.nn.MaxUnpool2d, recorded by torchtrace's max-unpool rule."""


class MaxUnpool3d(Module, torch.nn.MaxUnpool3d):
    """torch.nn.MaxUnpool3d, recorded by torchtrace's max-unpool rule."""
