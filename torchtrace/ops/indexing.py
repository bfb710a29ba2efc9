"""Gradient rules for indexing: x[index], x[index] = v, gather / scatter, index_select / index_add, masks.

Reading elements sends the gradient back to where they were read (adding up where one element was read
twice); writing elements cuts the gradient of what was overwritten and sends it to the written values.
"""
import math
from typing import Any, Sequence, Tuple

import torch

from torchtrace.autograd.function import INPLACE, Function, register

T = torch.Tensor
_TENSOR = object()  # stands for a tensor of an index, kept by save_for_backward


def save_index(ctx: Any, index: Any, *tensors: torch.Tensor) -> None:
    """Keep `index` for backward: its tensors through save_for_backward (after `tensors`), the rest on ctx."""
    items = index if type(index) is tuple else (index,)
    ctx.index_form = type(index) is tuple, tuple(_TENSOR if isinstance(i, torch.Tensor) else i for i in items)
    ctx.save_for_backward(*tensors, *(i for i in items if isinstance(i, torch.Tensor)))


def load_index(ctx: Any, n_tensors: int = 0) -> Tuple[Any, Tuple[torch.Tensor, ...]]:
    """The index given to save_index, and the tensors saved before it."""
    saved = ctx.saved_tensors
    index_tensors = iter(saved[n_tensors:])
    is_tuple, items = ctx.index_form
    items = tuple(next(index_tensors) if i is _TENSOR else i for i in items)
    return (items if is_tuple else items[0]), saved[:n_tensors]


def positions(shape: Sequence[int], device: Any) -> torch.Tensor:
    """Each element's flat position: any op that only picks elements, run on this, tells where they came from."""
    return torch.arange(math.prod(shape), device=device).reshape(shape)


def add_at(g: torch.Tensor, shape: Sequence[int], picked: torch.Tensor) -> torch.Tensor:
    """Zeros of `shape` with each g element added at its flat position in `picked` (repeats add up)."""
    flat = g.new_zeros(math.prod(shape)).index_put((picked.reshape(-1),), g.reshape(-1), accumulate=True)
    return flat.reshape(shape)


def embed(g: torch.Tensor, shape: Sequence[int], index: Any) -> torch.Tensor:
    """Zeros of `shape` with g added at the positions x[index] reads (a position read twice gets both)."""
    return add_at(g, shape, positions(shape, g.device)[index])


def match_dims(g: torch.Tensor, dims: int) -> torch.Tensor:
    """Assigned values may carry extra leading size-1 dims (x[0] = v with v of shape (1, n)): add them to g."""
    return g.reshape((1,) * (dims - g.dim()) + tuple(g.shape)) if g.dim() < dims else g


def fit(g: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """g padded with zeros at the end of each dim up to `shape` (scatter reads only the front of a large src)."""
    if tuple(g.shape) == tuple(shape):
        return g
    return embed(g, shape, tuple(slice(0, n) for n in g.shape))


# ------------------------------------------------------------------ x[index] and x[index] = v

@register(T.__getitem__)
class GetItem(Function):
    """y = x[index]  ->  dx = zeros with g added where each y element was read from"""

    @staticmethod
    def forward(ctx, x, index):
        ctx.shape = x.shape
        save_index(ctx, index)
        return x[index]

    @staticmethod
    def backward(ctx, g):
        index, _ = load_index(ctx)
        return embed(g, ctx.shape, index)


def setitem(x: torch.Tensor, index: Any, value: Any) -> torch.Tensor:
    """Out-of-place `x[index] = value`: a copy of x with value written at index."""
    out = x.clone()
    out[index] = value
    return out


class SetItem(Function):
    """y = x with y[index] = v  ->  dx = g with g[index] = 0, dv = g[index]"""

    @staticmethod
    def forward(ctx, x, index, value):
        written = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
        written[index] = True
        ctx.value_dims = value.dim() if isinstance(value, torch.Tensor) else 0
        save_index(ctx, index, written)
        return setitem(x, index, value)

    @staticmethod
    def backward(ctx, g):
        index, (written,) = load_index(ctx, 1)
        need_x, _, need_value = ctx.needs_input_grad[:3]
        dx = g.masked_fill(written, 0.0) if need_x else None
        return dx, None, match_dims(g[index], ctx.value_dims) if need_value else None


INPLACE[T.__setitem__] = (SetItem, setitem)


@register(torch.index_put, T.index_put)
class IndexPut(Function):
    """y = x with y[indices] = v (+= v if accumulate)  ->  dx = g (0 at indices unless accumulate), dv = g[indices]"""

    @staticmethod
    def forward(ctx, x, indices, values, accumulate=False):
        ctx.accumulate, ctx.value_dims = accumulate, values.dim()
        ctx.save_for_backward(*indices)
        return torch.index_put(x, indices, values, accumulate)

    @staticmethod
    def backward(ctx, g):
        indices = tuple(ctx.saved_tensors)
        need_x, _, need_values = ctx.needs_input_grad[:3]
        dx = None
        if need_x:
            dx = g if ctx.accumulate else g.index_put(indices, g.new_zeros(()))
        return dx, None, match_dims(g[indices], ctx.value_dims) if need_values else None


# ------------------------------------------------------------------ masks

@register(torch.masked_fill, T.masked_fill)
class MaskedFill(Function):
    """y = v where mask else x  ->  dx = g where not mask, dv = sum of g where mask"""

    @staticmethod
    def forward(ctx, x, mask, value):
        ctx.save_for_backward(mask)
        return torch.masked_fill(x, mask, value)

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        need_x, _, need_value = ctx.needs_input_grad[:3]
        dx = g.masked_fill(mask, 0.0) if need_x else None
        return dx, None, g.masked_fill(mask.logical_not(), 0.0).sum() if need_value else None


@register(torch.masked_select, T.masked_select)
class MaskedSelect(Function):
    """y = the x elements where mask (x, mask broadcast)  ->  dx = zeros with g written where mask"""

    @staticmethod
    def forward(ctx, x, mask):
        ctx.shape = torch.broadcast_shapes(x.shape, mask.shape)
        ctx.save_for_backward(mask)
        return torch.masked_select(x, mask)

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return embed(g, ctx.shape, mask.expand(ctx.shape))


# ------------------------------------------------------------------ gather / scatter along a dim

@register(torch.gather, T.gather)
class Gather(Function):
    """y[i][j] = x[i][index[i][j]] (dim=1)  ->  dx = zeros.scatter_add(dim, index, g)"""

    @staticmethod
    def forward(ctx, x, dim, index, sparse_grad=False):
        ctx.shape, ctx.dim = x.shape, dim
        ctx.save_for_backward(index)
        return torch.gather(x, dim, index)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        return g.new_zeros(ctx.shape).scatter_add(ctx.dim, index, g)


@register(torch.scatter, T.scatter)
class Scatter(Function):
    """y = x with y[i][index[i][j]] = src[i][j] (dim=1)  ->  dx = g zeroed where written, dsrc = g.gather(dim, index)"""

    @staticmethod
    def forward(ctx, x, dim, index, src=None, *, value=None, reduce=None):
        if reduce is not None:
            raise NotImplementedError(f"torchtrace: scatter(..., reduce={reduce!r}) has no gradient rule. Use "
                                      "scatter_add for reduce='add', or scatter_reduce(..., reduce='sum').")
        source = src if src is not None else value
        ctx.dim, ctx.src_shape = dim, source.shape if isinstance(source, torch.Tensor) else None
        ctx.save_for_backward(index)
        return torch.scatter(x, dim, index, source)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        need_x, need_src = ctx.needs_input_grad[0], ctx.needs_input_grad[3]
        dx = g.scatter(ctx.dim, index, 0.0) if need_x else None
        return dx, None, None, fit(g.gather(ctx.dim, index), ctx.src_shape) if need_src else None


@register(torch.scatter_add, T.scatter_add)
class ScatterAdd(Function):
    """y = x with y[i][index[i][j]] += src[i][j] (dim=1)  ->  dx = g, dsrc = g.gather(dim, index)"""

    @staticmethod
    def forward(ctx, x, dim, index, src):
        ctx.dim, ctx.src_shape = dim, src.shape
        ctx.save_for_backward(index)
        return torch.scatter_add(x, dim, index, src)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        need_src = ctx.needs_input_grad[3]
        return g, None, None, fit(g.gather(ctx.dim, index), ctx.src_shape) if need_src else None


@register(torch.scatter_reduce, T.scatter_reduce)
class ScatterReduce(Function):
    """y = x (0 where written if not include_self) + scattered sum of src  ->  dx = g (0 there), dsrc = g gathered"""

    @staticmethod
    def forward(ctx, x, dim, index, src, reduce, include_self=True):
        if reduce != "sum":
            raise NotImplementedError(f"torchtrace: scatter_reduce(..., reduce={reduce!r}) has no gradient rule; "
                                      "only reduce='sum' is supported.")
        ctx.dim, ctx.src_shape, ctx.include_self = dim, src.shape, include_self
        ctx.save_for_backward(index)
        return torch.scatter_reduce(x, dim, index, src, reduce, include_self=include_self)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        need_x, need_src = ctx.needs_input_grad[0], ctx.needs_input_grad[3]
        dx = (g if ctx.include_self else g.scatter(ctx.dim, index, 0.0)) if need_x else None
        return dx, None, None, fit(g.gather(ctx.dim, index), ctx.src_shape) if need_src else None


@register(torch.take_along_dim, T.take_along_dim)
class TakeAlongDim(Function):
    """y = x.gather(dim, indices) after broadcasting the other dims (flat x when dim=None)  ->  dx = scatter_add of g"""

    @staticmethod
    def forward(ctx, x, indices, dim=None):
        ctx.save_for_backward(indices)
        ctx.dim, ctx.shape = dim, x.shape
        if dim is not None:
            d = dim % x.dim()
            others = torch.broadcast_shapes(*(s[:d] + (1,) + s[d + 1:] for s in (x.shape, indices.shape)))
            ctx.x_shape = others[:d] + (x.shape[d],) + others[d + 1:]
            ctx.index_shape = others[:d] + (indices.shape[d],) + others[d + 1:]
        return torch.take_along_dim(x, indices, dim)

    @staticmethod
    def backward(ctx, g):
        (indices,) = ctx.saved_tensors
        if ctx.dim is None:
            flat = g.new_zeros(math.prod(ctx.shape)).scatter_add(0, indices.reshape(-1), g)
            return flat.reshape(ctx.shape)
        return g.new_zeros(ctx.x_shape).scatter_add(ctx.dim, indices.expand(ctx.index_shape), g)


@register(torch.take, T.take)
class Take(Function):
    """y = x.flatten()[index]  ->  dx = zeros with g added at the flat positions read"""

    @staticmethod
    def forward(ctx, x, index):
        ctx.shape = x.shape
        ctx.save_for_backward(index)
        return torch.take(x, index)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        return embed(g, (math.prod(ctx.shape),), index).reshape(ctx.shape)


# ------------------------------------------------------------------ whole slices picked by an index along a dim

@register(torch.index_select, T.index_select)
class IndexSelect(Function):
    """y = x picked at index along dim  ->  dx = zeros.index_add(dim, index, g)"""

    @staticmethod
    def forward(ctx, x, dim, index):
        ctx.shape, ctx.dim = x.shape, dim
        ctx.save_for_backward(index)
        return torch.index_select(x, dim, index)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        return g.new_zeros(ctx.shape).index_add(ctx.dim, index, g)


@register(torch.index_add, T.index_add)
class IndexAdd(Function):
    """y = x with y[index[k]] += alpha * s[k] along dim  ->  dx = g, ds = alpha * g.index_select(dim, index)"""

    @staticmethod
    def forward(ctx, x, dim, index, source, *, alpha=1):
        ctx.dim, ctx.alpha = dim, alpha
        ctx.save_for_backward(index)
        return torch.index_add(x, dim, index, source, alpha=alpha)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        if not ctx.needs_input_grad[3]:
            return g
        picked = g.index_select(ctx.dim, index)
        return g, None, None, picked if ctx.alpha == 1 else picked * ctx.alpha
