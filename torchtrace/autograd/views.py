"""Views and their base share memory, so an in-place op on one changes the other (torch's view semantics).

A view remembers its base tracer (`_tt_base`). When the base changes in place after the view was taken,
the view's value is now `ViewOfBase(base)`; when an op writes into a view in place, the base's new value
is `WriteIntoView(base, result)`. Both rules locate the view's elements inside the base by their storage
positions (offset + index . stride), so any view (slices, transposes, diagonals, expands) is handled.
"""
from typing import Any, Tuple

import torch

from torchtrace.autograd.function import Function

Geometry = Tuple[Tuple[int, ...], Tuple[int, ...], int]  # size, stride, storage offset relative to the base's


def geometry(view: torch.Tensor, base: torch.Tensor) -> Geometry:
    """Where the view sits in its base's memory (read from plain tensors)."""
    return tuple(view.size()), tuple(view.stride()), view.storage_offset() - base.storage_offset()


def _extent(size: Tuple[int, ...], stride: Tuple[int, ...], offset: int) -> int:
    return offset + 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset


def locate(ctx: Any, base: torch.Tensor, where: Geometry) -> None:
    """ctx.view_at / ctx.base_at: the memory position of each view / base element (ctx.span positions in all)."""
    size, stride, offset = where
    low = min(offset, 0)  # a view may start before its base (torch.as_strided on a slice)
    ctx.span = max(_extent(size, stride, offset - low), _extent(base.shape, base.stride(), -low))
    memory = torch.arange(ctx.span, device=base.device)
    ctx.view_at, ctx.base_at = memory.as_strided(size, stride, offset - low), memory.as_strided(base.shape,
                                                                                                base.stride(), -low)


def spread(ctx: Any, g: torch.Tensor) -> torch.Tensor:
    """A view-shaped gradient summed into its base's elements (an element read twice gets both)."""
    return g.new_zeros(ctx.span).index_add(0, ctx.view_at.reshape(-1), g.reshape(-1))[ctx.base_at]


def collect(ctx: Any, g: torch.Tensor) -> torch.Tensor:
    """A base-shaped gradient read at the view's elements."""
    return g.new_zeros(ctx.span).index_add(0, ctx.base_at.reshape(-1), g.reshape(-1))[ctx.view_at]


def covered(ctx: Any) -> torch.Tensor:
    """Which base elements the view covers (a bool tensor of the base's shape)."""
    hit = torch.zeros(ctx.span, dtype=torch.bool, device=ctx.base_at.device)
    hit[ctx.view_at.reshape(-1)] = True
    return hit[ctx.base_at]


class ViewOfBase(Function):
    """v = view of base (after base changed in place)  ->  dbase = g added at the view's positions in base"""

    @staticmethod
    def forward(ctx, base, where):
        locate(ctx, base, where)
        size, stride, offset = where
        return base.as_strided(size, stride, base.storage_offset() + offset)

    @staticmethod
    def backward(ctx, g):
        return spread(ctx, g), None


class WriteIntoView(Function):
    """base' = base with its view replaced by r  ->  dbase = g outside the view, dr = g at the view"""

    @staticmethod
    def forward(ctx, base, written, where):
        locate(ctx, base, where)
        ctx.covered = covered(ctx)
        size, stride, offset = where
        out = base.clone()
        out.as_strided(size, stride, out.storage_offset() + offset).copy_(written)
        return out

    @staticmethod
    def backward(ctx, g):
        need_base, need_written = ctx.needs_input_grad[:2]
        return (g.masked_fill(ctx.covered, 0) if need_base else None), (collect(ctx, g) if need_written else None), None


def base_root(t: Any) -> Any:
    """The plain tensor that owns t's memory as torch sees it (tracers are aliases of their raw result)."""
    root = torch._C.TensorBase._base.__get__(t)
    return t if root is None else root
