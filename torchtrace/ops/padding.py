"""F.pad: constant padding (negative pads crop) and the reflect / replicate / circular modes."""
from typing import Any

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.ops.input_in_backward import reading_input


def _source_positions(mode: str, size: int, lo: int, hi: int, device: Any) -> torch.Tensor:
    """For each position j of a padded dim, the input position it copies (reflect, replicate, circular).

    Read off torch's own padding of the positions 0 .. size-1, so negative pads (crops) follow torch exactly:
    circular padding, for one, wraps around the cropped interior, never reaching the cropped elements.
    """
    positions = torch.arange(size, dtype=torch.float64, device=device).reshape(1, 1, size)
    return F.pad(positions, [lo, hi], mode).reshape(-1).long()


@register(F.pad)
class Pad(Function):
    """constant: y = x with p_lo / p_hi values added (negative: removed) per dim  ->  dx = g with them removed
    (added back as zeros);  reflect / replicate / circular: y_j = x_src(j)  ->  dx_i = sum_{j: src(j) = i} g_j"""

    @staticmethod
    def forward(ctx, input, pad, mode="constant", value=None):
        if mode not in ("constant", "reflect", "replicate", "circular"):
            raise UnsupportedOperationError(f"torch.nn.functional.pad: mode={mode!r} has no gradient rule — use "
                                            "'constant', 'reflect', 'replicate' or 'circular'")
        ctx.pad, ctx.mode, ctx.shape = list(pad), mode, input.shape
        if mode in ("reflect", "replicate"):  # read by a create_graph backward, as torch's kernels read it
            ctx.save_for_backward(input)
        return F.pad(input, pad, mode, value)

    @staticmethod
    def backward(ctx, g):
        if ctx.mode == "constant":
            return F.pad(g, [-side for side in ctx.pad])
        if g.numel() == 0:  # every element cropped away (or none to start with): no input element is copied
            return g.new_zeros(ctx.shape)
        for i in range(len(ctx.pad) // 2):
            dim = g.dim() - 1 - i
            source = _source_positions(ctx.mode, ctx.shape[dim], ctx.pad[2 * i], ctx.pad[2 * i + 1], g.device)
            shape = list(g.shape)
            shape[dim] = ctx.shape[dim]
            g = torch.zeros(shape, dtype=g.dtype, device=g.device).index_add(dim, source, g)
        return g if ctx.mode == "circular" else reading_input(g, ctx.saved_tensors[0])
