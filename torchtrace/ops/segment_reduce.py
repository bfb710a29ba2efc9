"""torch.segment_reduce: one reduction per run of consecutive slices along `axis` (lengths or offsets).

Per segment S_k with result y_k: sum -> dx_i = g_k; mean -> g_k / |S_k|; max / min -> g_k split evenly among the
elements equal to y_k (NaN ones count as equal, as torch's kernel); prod -> g_k times the product of the other
elements (and `initial`). Empty segments (filled with `initial`) send nothing back.
"""
import itertools

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError


def bounds(values: list, from_lengths: bool) -> list:
    """[(start, end)] of each segment, from one row of lengths or of offsets."""
    if not from_lengths:
        return list(zip(values[:-1], values[1:]))
    ends = torch.tensor(values, dtype=torch.long).cumsum(0).tolist() if values else []
    return [(end - length, end) for length, end in zip(values, ends)]


def all_bounds(lengths, offsets) -> dict:
    """{leading index: bounds} — one entry () for 1-D lengths / offsets, one per row for batched (N-D) ones."""
    given = lengths if lengths is not None else offsets
    values = given if isinstance(given, torch.Tensor) else torch.tensor(given)
    return {index: bounds(values[index].tolist(), lengths is not None) for index in itertools.product(
        *(range(n) for n in values.shape[:-1]))}


def row_grad(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, spans: list, reduce: str, initial) -> torch.Tensor:
    """The gradient of one row: segments along dim 0 of x."""
    pieces = [segment_grad(x[start:end], y[k], g[k], reduce, initial)
              for k, (start, end) in enumerate(spans) if end > start]
    rest = x.shape[0] - (spans[-1][1] if spans else 0)
    if rest:
        pieces.append(x.new_zeros(rest, *x.shape[1:]))
    return torch.cat(pieces) if pieces else torch.zeros_like(x)


def segment_grad(seg: torch.Tensor, y: torch.Tensor, g: torch.Tensor, reduce: str, initial=None) -> torch.Tensor:
    """d(reduce over dim 0 of seg)/d seg, times g (y, g: one slice)."""
    n = seg.shape[0]
    if reduce == "sum":
        return g.expand_as(seg)
    if reduce == "mean":
        return (g / n).expand_as(seg)
    if reduce in ("max", "min"):
        hits = (seg == y) | seg.isnan()
        return hits * g / hits.sum(0).clamp_min(1)  # none hit: `initial` won, nothing flows back (as torch)
    if reduce == "prod":
        others = [torch.cat([seg[:i], seg[i + 1:]]).prod(0) for i in range(n)]
        return torch.stack(others) * g * (1 if initial is None else initial)
    raise UnsupportedOperationError(f"torch.segment_reduce: reduce={reduce!r} has no gradient rule — use "
                                    "'sum', 'mean', 'max', 'min' or 'prod'")


@register(torch.segment_reduce)
class SegmentReduce(Function):
    """y_k = reduce(x[S_k]) along axis  ->  dx[S_k] = d reduce / dx (module docstring) * g_k"""

    @staticmethod
    def forward(ctx, data, reduce, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None,
                dim=None):
        axis = axis if dim is None else dim  # the dispatcher renames numpy's axis= to dim=
        if indices is not None:
            raise UnsupportedOperationError("torch.segment_reduce: indices= is not supported — pass lengths or "
                                            "offsets")
        ctx.bounds = all_bounds(lengths, offsets)
        segment_grad(data.new_zeros(1), data.new_zeros(()), data.new_zeros(()), reduce)  # refuse early
        ctx.reduce, ctx.initial = reduce, initial
        if axis % data.dim() != len(next(iter(ctx.bounds))):
            raise UnsupportedOperationError("torch.segment_reduce: axis must be the dim after the batch dims of "
                                            "lengths / offsets — move that dim there (movedim) first")
        y = torch.segment_reduce(data, reduce, lengths=lengths, offsets=offsets, axis=axis, unsafe=unsafe,
                                 initial=initial)
        ctx.save_for_backward(data, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        rows = [row_grad(x[index], y[index], g[index], spans, ctx.reduce, ctx.initial)
                for index, spans in ctx.bounds.items()]  # batched: axis is the dim after the leading ones
        grad = rows[0] if list(ctx.bounds) == [()] else torch.stack(rows).reshape(x.shape)
        return grad, None
