"""Gradient rules for indexing: x[index], x[index] = v, gather / scatter, index_select / index_add, masks.

Reading elements sends the gradient back to where they were read (adding up where one element was read
twice); writing elements cuts the gradient of what was overwritten and sends it to the written values.
"""
import math
from typing import Any, Sequence, Tuple

import torch

from torchtrace.autograd.function import INPLACE, Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.ops.rule_tables import binary

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
    """g padded with zeros at the end of each dim up to `shape` (scatter reads only the front of a large src); a 0-dim
    src, which torch reads as its one element, gets the sum of g (its one element, or 0 where the index is empty)."""
    if tuple(g.shape) == tuple(shape):
        return g
    if len(shape) == 0:
        return g.sum()
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

    op, put_back = staticmethod(torch.gather), staticmethod(T.scatter_add)  # a pick along dim and its adjoint

    @staticmethod
    def forward(ctx, x, dim, index, sparse_grad=False):
        ctx.shape, ctx.dim = x.shape, dim
        ctx.save_for_backward(index)
        return ctx._rule.op(x, dim, index)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        return ctx._rule.put_back(g.new_zeros(ctx.shape), ctx.dim, index, g)


@register(torch.scatter, T.scatter)
class Scatter(Function):
    """y = x with y[i][index[i][j]] = src[i][j] (dim=1)  ->  dx = g zeroed where written, dsrc = g.gather(dim, index)"""

    @staticmethod
    def forward(ctx, x, dim, index, src=None, *, value=None, reduce=None):
        if reduce is not None:
            twin = "'sum'" if reduce == "add" else "'prod'"
            raise UnsupportedOperationError(
                f"torch.scatter: reduce={reduce!r} has no gradient (torch has none either) — use "
                f"torch.scatter_reduce(..., reduce={twin}), which torchtrace differentiates.")
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
            size = math.prod(ctx.shape)
            flat = g.new_zeros(size).scatter_add(0, indices.reshape(-1) % max(size, 1), g)  # -1 reads the last one
            return flat.reshape(ctx.shape)
        wrapped = indices.expand(ctx.index_shape) % max(ctx.x_shape[ctx.dim], 1)
        return g.new_zeros(ctx.x_shape).scatter_add(ctx.dim, wrapped, g)


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
class IndexSelect(Gather):
    """y = x picked at index along dim  ->  dx = zeros.index_add(dim, index, g)"""

    op, put_back = staticmethod(torch.index_select), staticmethod(T.index_add)


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


@register(torch.index_copy, T.index_copy)
class IndexCopy(Function):
    """y = x with slice index[k] along dim replaced by s[k]  ->  dx = g zeroed there, ds = g.index_select(dim, index)"""

    @staticmethod
    def forward(ctx, x, dim, index, source):
        ctx.dim = dim
        ctx.save_for_backward(index)
        return torch.index_copy(x, dim, index, source)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        need_x, need_source = ctx.needs_input_grad[0], ctx.needs_input_grad[3]
        dx = g.index_fill(ctx.dim, index, 0.0) if need_x else None
        return dx, None, None, g.index_select(ctx.dim, index) if need_source else None


@register(torch.index_fill, T.index_fill)
class IndexFill(Function):
    """y = x with slices index[k] along dim set to v  ->  dx = g zeroed there, dv = sum of g over those slices"""

    @staticmethod
    def forward(ctx, x, dim, index, value):
        ctx.dim = dim
        ctx.save_for_backward(index % (x.shape[dim] if x.dim() else 1))  # -1 and n-1 name the same slice
        return torch.index_fill(x, dim, index, value)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        need_x, need_value = ctx.needs_input_grad[0], ctx.needs_input_grad[3]
        dx = g.index_fill(ctx.dim, index, 0.0) if need_x else None
        # a slice named twice in index is filled once: count it once
        dv = g.index_select(ctx.dim, index.reshape(-1).unique()).sum() if need_value else None
        return dx, None, None, dv


@register(torch.masked_scatter, T.masked_scatter)
class MaskedScatter(Function):
    """y = x, with the elements where mask taken in order from s  ->  dx = g where not mask, ds = g where mask"""

    @staticmethod
    def forward(ctx, x, mask, source):
        ctx.source_shape = source.shape
        ctx.save_for_backward(mask)
        return torch.masked_scatter(x, mask, source)

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        need_x, need_source = ctx.needs_input_grad[0], ctx.needs_input_grad[2]
        dx = g.masked_fill(mask, 0.0) if need_x else None
        ds = None
        if need_source:  # s is read from its start; the elements not read get 0
            ds = fit(g.masked_select(mask), (math.prod(ctx.source_shape),)).reshape(ctx.source_shape)
        return dx, None, ds


@register(torch.put, T.put)
class Put(Function):
    """y = x with flat positions index[k] set to s[k] (+= if accumulate)  ->  dx = g (0 there unless accumulate),
    ds = g.take(index)"""

    @staticmethod
    def forward(ctx, x, index, source, accumulate=False):
        ctx.accumulate, ctx.source_shape = accumulate, source.shape
        ctx.save_for_backward(index)
        return torch.put(x, index, source, accumulate)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        need_x, need_source = ctx.needs_input_grad[0], ctx.needs_input_grad[2]
        dx = None
        if need_x:
            dx = g if ctx.accumulate else g.put(index, g.new_zeros(ctx.source_shape))
        return dx, None, g.take(index).reshape(ctx.source_shape) if need_source else None


# ------------------------------------------------------------------ filling: the old values stop mattering

Fill = binary("Fill", [torch.fill], "y = v everywhere  ->  dx = 0, dv = sum of g",
              lambda g, a, b, z: torch.zeros_like(g), lambda g, a, b, z: g.sum(), uses=((), ()),
              inputs=("input", "value"))


class Zero(Function):
    """y = 0 everywhere  ->  dx = 0"""

    @staticmethod
    def forward(ctx, x):
        return torch.zeros_like(x)

    @staticmethod
    def backward(ctx, g):
        return torch.zeros_like(g)


def fill_diagonal(x: torch.Tensor, fill_value: Any, wrap: bool = False) -> torch.Tensor:
    """Out-of-place `x.fill_diagonal_(fill_value, wrap)`."""
    return x.clone().fill_diagonal_(fill_value, wrap)


class FillDiagonal(Function):
    """y = x with its main diagonal (every dim's index equal) set to a number  ->  dx = g zeroed there"""

    @staticmethod
    def forward(ctx, x, fill_value, wrap=False):
        ctx.shape, ctx.wrap = x.shape, wrap
        return fill_diagonal(x, fill_value, wrap)

    @staticmethod
    def backward(ctx, g):
        on_diagonal = torch.zeros(ctx.shape, dtype=torch.bool, device=g.device).fill_diagonal_(True, ctx.wrap)
        return g.masked_fill(on_diagonal, 0.0)


INPLACE[T.fill_] = INPLACE[torch.fill_] = (Fill, torch.fill)
INPLACE[T.zero_] = INPLACE[torch.zero_] = (Zero, torch.zeros_like)
INPLACE[T.fill_diagonal_] = (FillDiagonal, fill_diagonal)


# ------------------------------------------------------------------ reductions into slots: scatter_reduce, index_reduce

class Along:
    """Where src elements land in x: one element per index entry (scatter) or a whole slice (index_* ops)."""

    def __init__(self, dim: int, index: torch.Tensor, whole_slices: bool):
        self.dim, self.index, self.whole_slices = dim, index, whole_slices

    def pick(self, t: torch.Tensor) -> torch.Tensor:
        """The slot of each src element, read from t (shaped like x)."""
        return t.index_select(self.dim, self.index) if self.whole_slices else t.gather(self.dim, self.index)

    def add_into(self, base: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """base (shaped like x) with each t element (shaped like src) added into its slot."""
        if self.whole_slices:
            return base.index_add(self.dim, self.index, t)
        return base.scatter_add(self.dim, self.index, t)

    def clear(self, t: torch.Tensor) -> torch.Tensor:
        """t (shaped like x) with every slot that receives src set to 0."""
        return t.index_fill(self.dim, self.index, 0.0) if self.whole_slices else t.scatter(self.dim, self.index, 0.0)


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a == b, counting NaN as equal to NaN (a max over NaNs is NaN, and is reached there)."""
    return (a == b) | (a.isnan() & b.isnan())


def slot_reduce_grads(at: Along, reduce: str, include_self: bool, g: torch.Tensor, x: torch.Tensor,
                      src: torch.Tensor, y: torch.Tensor, reduced: Any) -> Tuple[torch.Tensor, torch.Tensor]:
    """(dx, dsrc) of y = x with each slot reduced over x's value (if include_self) and the src values sent there.

    Slots that receive nothing keep x: dx = g there. `reduced(x, src)` reruns the forward (for 'prod').
    Masks (ties, zeros, counts) are constants: the gradient flows only through the values they select.
    """
    if reduce == "sum":
        return (g if include_self else at.clear(g)), at.pick(g)
    if reduce == "mean":  # each value in a slot counts 1/n of it
        counts = at.add_into(torch.ones_like(x) if include_self else torch.zeros_like(x), torch.ones_like(src))
        share = g / counts.clamp_min(1)
        return (share if include_self else at.clear(g)), at.pick(share)
    if reduce in ("amax", "amin"):  # the values equal to the result share g evenly
        hits_x = _same(x, y).to(g.dtype)
        hits_x = hits_x if include_self else at.clear(hits_x)
        hits_src = _same(src, at.pick(y)).to(g.dtype)
        share = g / at.add_into(hits_x, hits_src)
        return hits_x * share, hits_src * at.pick(share)
    # prod (torch has refused any other name in forward): d/dv of a product is the product of the slot's other
    # values, written so that it stays exact (to the next derivative too) when the slot holds zeros
    zero_x, zero_src = (x == 0) & include_self, src == 0
    n_zeros = at.add_into(zero_x.to(g.dtype), zero_src.to(g.dtype))
    if torch.is_grad_enabled() and bool((n_zeros > 1).any()):
        raise UnsupportedOperationError(
            "torch.scatter_reduce / index_reduce: the second derivative of reduce='prod' where two or more zeros "
            "meet in one slot is not supported (torch refuses it too) — keep the values away from exact zeros.")
    nonzero = reduced(x.masked_fill(zero_x, 1.0), src.masked_fill(zero_src, 1.0))  # product of the nonzero values
    the_zero = at.add_into(x.masked_fill(~zero_x, 0.0) if include_self else torch.zeros_like(x),
                           src.masked_fill(~zero_src, 0.0))  # the slot's zero (where it has exactly one)

    def others(v: torch.Tensor, v_zero: torch.Tensor, count: torch.Tensor, product: torch.Tensor,
               zero: torch.Tensor) -> torch.Tensor:
        without_v = product / v.masked_fill(v_zero, 1.0)
        return without_v * (count == 0) + (product * v_zero + zero * without_v * ~v_zero) * (count == 1)

    dx = g * others(x, zero_x, n_zeros, nonzero, the_zero) if include_self else at.clear(g)
    return dx, others(src, zero_src, at.pick(n_zeros), at.pick(g * nonzero), at.pick(the_zero))


@register(torch.scatter_reduce, T.scatter_reduce)
class ScatterReduce(Function):
    """y = x with each src[i][j] reduced into y[i][index[i][j]] (dim=1)  ->  dx, dsrc = g (sum), g/n (mean),
    g/t at the t values equal to y (amax/amin), g * the product of the slot's other values (prod); n the values in
    the slot (x's own only if include_self)"""

    @staticmethod
    def forward(ctx, x, dim, index, src, reduce, *, include_self=True):
        y = torch.scatter_reduce(x, dim, index, src, reduce, include_self=include_self)
        ctx.dim, ctx.reduce, ctx.include_self, ctx.src_shape = dim, reduce, include_self, src.shape
        ctx.save_for_backward(x, src, y, index)
        return y

    @staticmethod
    def backward(ctx, g):
        x, src, y, index = ctx.saved_tensors
        if src.shape != index.shape:  # only the front of a larger src is read (a 0-dim src: its one element)
            src = (src.reshape([1] * index.dim()) if src.dim() == 0 else src)[tuple(slice(0, n) for n in index.shape)]
        at = Along(ctx.dim, index, whole_slices=False)
        dx, dsrc = slot_reduce_grads(at, ctx.reduce, ctx.include_self, g, x, src, y,
                                     lambda a, b: a.scatter_reduce(ctx.dim, index, b, "prod",
                                                                   include_self=ctx.include_self))
        return dx, None, None, fit(dsrc, ctx.src_shape)


@register(torch.index_reduce, T.index_reduce)
class IndexReduce(Function):
    """y = x with slice index[k] along dim reduced with s[k]  ->  dx, ds = g/n (mean), g/t at the t values equal
    to y (amax/amin), g * the product of the slot's other values (prod): scatter_reduce's, slice by slice"""

    @staticmethod
    def forward(ctx, x, dim, index, source, reduce, *, include_self=True):
        y = torch.index_reduce(x, dim, index, source, reduce, include_self=include_self)
        ctx.dim, ctx.reduce, ctx.include_self = dim, reduce, include_self
        ctx.save_for_backward(x, source, y, index)
        return y

    @staticmethod
    def backward(ctx, g):
        x, source, y, index = ctx.saved_tensors
        at = Along(ctx.dim, index, whole_slices=True)
        dx, dsource = slot_reduce_grads(at, ctx.reduce, ctx.include_self, g, x, source, y,
                                        lambda a, b: a.index_reduce(ctx.dim, index, b, "prod",
                                                                    include_self=ctx.include_self))
        return dx, None, None, dsource
