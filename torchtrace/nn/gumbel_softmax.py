"""F.gumbel_softmax: a reparameterised sample, so the gradient flows through the softmax (straight through when
hard=True). The Gumbel noise is drawn exactly as torch draws it, so under the same seed the samples are torch's."""
import warnings

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register


@register(F.gumbel_softmax)
class GumbelSoftmax(Function):
    """y = softmax((x + G) / tau), G ~ Gumbel(0, 1) fixed  ->  dx = y (g - sum(g y)) / tau
    (hard=True: the one-hot value y_hard - y + y, with the soft sample's gradient)"""

    @staticmethod
    def forward(ctx, logits, tau=1.0, hard=False, eps=1e-10, dim=-1):
        if eps != 1e-10:
            warnings.warn("`eps` parameter is deprecated and has no effect.", stacklevel=3)
        gumbels = -torch.empty_like(logits, memory_format=torch.legacy_contiguous_format).exponential_().log()
        y_soft = ((logits + gumbels) / tau).softmax(dim)
        ctx.tau, ctx.dim = tau, dim
        ctx.save_for_backward(logits, gumbels)
        if not hard:
            return y_soft
        index = y_soft.max(dim, keepdim=True)[1]
        y_hard = torch.zeros_like(logits, memory_format=torch.legacy_contiguous_format).scatter_(dim, index, 1.0)
        return y_hard - y_soft + y_soft  # torch's expression, so the value rounds as torch's does

    @staticmethod
    def backward(ctx, g):
        logits, gumbels = ctx.saved_tensors
        y = ((logits + gumbels) / ctx.tau).softmax(ctx.dim)  # recomputed: create_graph links it to the logits
        return y * (g - (g * y).sum(ctx.dim, keepdim=True)) / ctx.tau
