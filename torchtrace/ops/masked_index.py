"""torch._unsafe_masked_index and torch._unsafe_masked_index_put_accumulate (what interpolate / pad
decompositions emit): gathers and scatter-adds where a mask allows, with out-of-range indices clamped."""
from typing import List, Optional

import torch

from torchtrace.autograd.function import Function, register


def clamped(indices: List[Optional[torch.Tensor]], shape: torch.Size) -> list:
    """Indices held inside each dim (masked-off positions may point anywhere), as torch's implementation does."""
    return [None if i is None else i.clamp(-size, size - 1) for i, size in zip(indices, shape)]


@register(torch._unsafe_masked_index)
class UnsafeMaskedIndex(Function):
    """y = where(mask, x[indices], fill)  ->  dx = zeros.index_put(indices, where(mask, g, 0), accumulate=True)"""

    @staticmethod
    def forward(ctx, input, mask, indices, fill):
        ctx.shape = input.shape
        ctx.save_for_backward(mask, *[i for i in indices if i is not None])
        ctx.none_at = [i is None for i in indices]
        return torch._unsafe_masked_index(input, mask, indices, fill)

    @staticmethod
    def backward(ctx, g):
        mask, *given = ctx.saved_tensors
        found = iter(given)
        indices = clamped([None if none else next(found) for none in ctx.none_at], ctx.shape)
        picked = torch.where(mask, g, 0.0)
        return g.new_zeros(ctx.shape).index_put(indices, picked, accumulate=True), None, None, None


@register(torch._unsafe_masked_index_put_accumulate)
class UnsafeMaskedIndexPutAccumulate(Function):
    """y = x.index_put(indices, where(mask, v, 0), accumulate=True)  ->  dx = g,  dv = where(mask, g[indices], 0)"""

    @staticmethod
    def forward(ctx, input, mask, indices, values):
        ctx.save_for_backward(mask, *[i for i in indices if i is not None])
        ctx.none_at, ctx.shape = [i is None for i in indices], input.shape
        return torch._unsafe_masked_index_put_accumulate(input, mask, indices, values)

    @staticmethod
    def backward(ctx, g):
        mask, *given = ctx.saved_tensors
        need_x, _, _, need_v = ctx.needs_input_grad[:4]
        dv = None
        if need_v:
            found = iter(given)
            indices = clamped([None if none else next(found) for none in ctx.none_at], ctx.shape)
            dv = torch.where(mask, g[tuple(slice(None) if i is None else i for i in indices)], 0.0)
        return (g if need_x else None), None, None, dv
