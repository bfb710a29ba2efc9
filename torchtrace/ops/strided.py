"""torch.as_strided and its twins: any view of a tensor's memory, differentiated by memory positions.

Each element of the result reads one memory position; the gradient of the input is the result's gradient
summed at those positions (an element read twice gets both), then read back at the input's own positions.
The input must not overlap itself in memory (an expanded tensor), where "its element" is ambiguous, and the result
must read only the input's memory. as_strided_scatter is refused (ops/refused.py): torch's own gradient for it
fails gradcheck.
"""
from typing import Any, Optional, Sequence

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.autograd.views import locate, spread
from torchtrace.errors import UnsupportedOperationError

T = torch.Tensor


def _locate_strided(ctx: Any, x: torch.Tensor, size: Sequence[int], stride: Sequence[int],
                    storage_offset: Optional[int]) -> None:
    offset = x.storage_offset() if storage_offset is None else storage_offset
    locate(ctx, x, (tuple(size), tuple(stride), offset - x.storage_offset()))
    if ctx.base_at.unique().numel() != ctx.base_at.numel():
        raise UnsupportedOperationError(
            "torch.as_strided: the input overlaps itself in memory (as an expanded tensor does), so which element a "
            "memory position belongs to is ambiguous — call .contiguous() on it first")
    owned = torch.zeros(ctx.span, dtype=torch.bool, device=x.device)
    owned[ctx.base_at.reshape(-1)] = True
    if not bool(owned[ctx.view_at].all()):
        raise UnsupportedOperationError(
            "torch.as_strided: the result reads memory outside its input (the input is part of a larger tensor), "
            "whose gradient torchtrace would lose — call as_strided on the whole tensor, or on x.contiguous()")


@register(torch.as_strided, T.as_strided)
class AsStrided(Function):
    """y = x's memory read at (size, stride, offset)  ->  dx = g summed at each read position, read at x's"""

    copy = False

    @staticmethod
    def forward(ctx, x, size, stride, storage_offset=None):
        _locate_strided(ctx, x, size, stride, storage_offset)
        y = torch.as_strided(x, size, stride, storage_offset)
        return y.clone() if ctx._rule.copy else y

    @staticmethod
    def backward(ctx, g):
        return spread(ctx, g), None, None, None


@register(torch.as_strided_copy)
class AsStridedCopy(AsStrided):
    """y = copy of x's memory read at (size, stride, offset)  ->  dx = g summed at each read position"""

    copy = True
