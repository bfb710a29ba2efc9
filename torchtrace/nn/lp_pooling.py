"""Power-average (LP) pooling, as torch computes it: an average pool of x^p, scaled back to a sum, to the 1/p.

    u_q = K avg_q(x^p) = (K / D_q) sum_{i in window q} x_i^p,   y_q = u_q^(1/p)
    ->  dx_i = p x_i^(p-1) * avgpool_adjoint( K (1/p) u^(1/p - 1) g )_i

(K: kernel volume; D_q: the window's size, smaller than K only for ceil_mode windows past the edge.) torch
passes the average through sign(u) relu(|u|), whose derivative is sign(u)^2 where u != 0 and 0 at u = 0: an
all-zero window sends no gradient (not the infinite slope of u^(1/p) there), as here; nor, for p = 1, does one
holding a NaN (torch.sign(NaN) is 0).

p = +inf is torch's max_pool(|x|) and p = -inf its -max_pool(-|x|): then g goes to each window's largest (smallest)
|x_i|, the one torch's max pool picks, times sign(x_i):  dx_i = sign(x_i) sum_{q: i = argmax_q} g_q.
"""
import math

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.nn.conv import ntuple
from torchtrace.nn.module import Module
from torchtrace.nn.pooling import avg_pool_adjoint, scatter_to_input

MAX_POOLS = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


class LPPool(Function):
    """y_q = (K avg_q(x^p))^(1/p)  ->  dx = p x^(p-1) avgpool_adjoint(K (1/p) u^(1/p - 1) sign(u)^2 g), 0 at u = 0;
    p = +-inf: y_q = max (min) |x_i| over window q  ->  dx_i = sign(x_i) g_q where i is that window's pick"""

    op = staticmethod(F.lp_pool2d)
    dims = 2

    @staticmethod
    def forward(ctx, input, norm_type, kernel_size, stride=None, ceil_mode=False):
        n = ctx._rule.dims
        ctx.p, ctx.kernel = float(norm_type), ntuple(kernel_size, n)
        ctx.stride = ntuple(stride, n) if stride is not None else ctx.kernel
        ctx.shape = input.shape
        y = ctx._rule.op(input, norm_type, kernel_size, stride, ceil_mode)
        if math.isinf(ctx.p):  # which |x_i| each window picked: torch's own max pool of |x| (of -|x| for -inf)
            side = input.abs() if ctx.p > 0 else -input.abs()
            picks = MAX_POOLS[n](side, ctx.kernel, ctx.stride, 0, 1, ceil_mode, return_indices=True)[1]
            ctx.save_for_backward(input, picks)
        else:
            ctx.save_for_backward(input, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        p, volume = ctx.p, math.prod(ctx.kernel)
        if math.isinf(p):  # y holds each window's pick
            return scatter_to_input(g, y, ctx.shape, ctx._rule.dims) * x.sign()
        u = y.pow(p)  # K avg(x^p), recomputed from y
        # sign(u)^2, as torch's chain through sign(u) relu(|u|) multiplies it in: 0 for a NaN window (torch.sign(NaN)
        # is 0: the gradient is then 0 for p = 1, where NaN^0 = 1, and NaN otherwise, as torch's)
        du = torch.where(u != 0, g * (volume / p) * u.pow(1 / p - 1) * u.sign().square(), 0.0)
        dpow = avg_pool_adjoint(du, ctx.shape, ctx.kernel, ctx.stride, (0,) * ctx._rule.dims)
        return dpow * p * x.pow(p - 1) if p != 0 else torch.zeros_like(x)


for _n, _op in [(1, F.lp_pool1d), (2, F.lp_pool2d), (3, F.lp_pool3d)]:
    register(_op, rule=type(f"LPPool{_n}d", (LPPool,), {"__doc__": LPPool.__doc__, "op": staticmethod(_op),
                                                         "dims": _n}))


class LPPool1d(Module, torch.nn.LPPool1d):
    """torch.nn.LPPool1d, recorded by torchtrace's power-average pooling rule."""


class LPPool2d(Module, torch.nn.LPPool2d):
    """torch.nn.LPPool2d, recorded by torchtrace's power-average pooling rule."""


class LPPool3d(Module, torch.nn.LPPool3d):
    """torch.nn.LPPool3d, recorded by torchtrace's power-average pooling rule."""
