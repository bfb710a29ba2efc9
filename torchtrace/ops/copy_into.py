"""x.copy_(src): x's old value is overwritten by src (broadcast to x's shape, cast to x's dtype)."""
import torch

from torchtrace.autograd.function import INPLACE, Function


def copied(x: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """Out-of-place `x.copy_(src)`: src (a tensor, or a number as torch 2.13 takes it) broadcast to x's shape, in x's
    dtype and on x's device."""
    if not isinstance(src, torch.Tensor):
        return torch.full_like(x, src)
    return src.to(dtype=x.dtype, device=x.device, non_blocking=non_blocking).expand(x.shape).clone()


class CopyInto(Function):
    """y = src (broadcast to x, cast to x's dtype)  ->  dx = 0 (overwritten), dsrc = g summed to src's shape"""

    @staticmethod
    def forward(ctx, x, src, non_blocking=False):
        ctx.src_device = src.device if isinstance(src, torch.Tensor) else None  # (a number gets no gradient)
        return copied(x, src, non_blocking)

    @staticmethod
    def backward(ctx, g):  # zeros, not None, for x: what it held before reaches x's inputs as torch's zeros_like
        need_x, need_src = ctx.needs_input_grad[:2]
        return (torch.zeros_like(g) if need_x else None), (g.to(ctx.src_device) if need_src else None), None


INPLACE[torch.Tensor.copy_] = (CopyInto, copied)
