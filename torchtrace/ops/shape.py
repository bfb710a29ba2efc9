"""Gradient rules for shape ops: views, permutations, expand/repeat, cat/stack/split, casts and copies.

None of these ops does arithmetic: each only moves, copies or drops elements. So every backward moves the
gradient back the same way (reshape back, permute back, sum the copies, cut the joined gradient apart).
"""
import numbers
from typing import Any, Callable, Optional, Sequence, Tuple

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.ops.indexing import add_at, positions
from torchtrace.ops.rule_tables import AS_CALLED, binary, unary
from torchtrace.ops.rule_tables import make_rule as rule

T = torch.Tensor


def sizes(args: Sequence[Any]) -> Tuple[int, ...]:
    """view(2, 3), view((2, 3)) and view([2, 3]) all mean (2, 3)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def structural(name: str, targets: Sequence[Callable], math: str, grad: Optional[Callable] = None,
               op: Optional[Callable] = None, uses: Sequence[str] = ("x.meta",)) -> type:
    """Table rule for y = op(x, *args), an op that only moves, copies or drops elements: grad(g, x, y, *args,
    **kwargs) maps dL/dy back to dL/dx, reading of x (and y) only `uses` -- mostly x's shape, dtype and device
    (`x.meta`). Without `grad` the op is its own adjoint (a swap or a mask): dx = op(g, *args, **kwargs).

    Tensor arguments (view_as(other), to(other)) are not kept: they only lend their shape, dtype or device, and
    get no gradient (the formulas see None there).
    """
    op = op or targets[0]
    if grad is None:
        grad, uses = (lambda g, x, y, *args, **kwargs: op(g, *args, **kwargs)), ()
    return unary(name, targets, math, grad, uses, options=AS_CALLED, op=op)


# ------------------------------------------------------------------ same elements, new shape: reshape g back

def _view(x: torch.Tensor, *shape: Any, **kwargs: Any) -> torch.Tensor:
    if "dtype" in kwargs or (len(shape) == 1 and isinstance(shape[0], torch.dtype)):
        raise UnsupportedOperationError("torch.Tensor.view(dtype): it reinterprets the bits of each element and has no "
                                        "gradient — use x.to(dtype) to convert values, or call it under tt.no_grad()")
    return T.view(x, *shape, **kwargs)


def _reshape_back(g: torch.Tensor, x: Any, y: Any, *_: Any, **__: Any) -> torch.Tensor:
    return g.reshape(x.shape)


for _name, _targets, _op in [
    ("View", [T.view], _view),
    ("ViewAs", [T.view_as], None),
    ("Reshape", [T.reshape, torch.reshape], None),
    ("ReshapeAs", [T.reshape_as], None),
    ("Flatten", [T.flatten, torch.flatten], None),
    ("Ravel", [T.ravel, torch.ravel], None),
    ("Unflatten", [T.unflatten, torch.unflatten], None),
    ("Squeeze", [T.squeeze, torch.squeeze], None),
    ("Unsqueeze", [T.unsqueeze, torch.unsqueeze], None),
]:
    structural(_name, _targets, "y = x with a new shape  ->  dx = g reshaped to x's shape", _reshape_back, _op)


# ------------------------------------------------------------------ dims reordered: reorder g back

def _unpermute(g: torch.Tensor, x: Any, y: Any, *dims: Any, **named: Any) -> torch.Tensor:
    """The permutation given by position (x.permute(1, 0), x.permute((1, 0))) or by name (x.permute(dims=(1, 0)))."""
    perm = [d % len(x.shape) for d in sizes(named.get("dims", dims))] if x.shape else []
    return g.permute(sorted(range(len(perm)), key=perm.__getitem__))


def _reverse_dims(g: torch.Tensor, x: Any, y: Any) -> torch.Tensor:
    return g.permute(tuple(reversed(range(g.dim()))))


def _unmove(g: torch.Tensor, x: Any, y: Any, source: Any, destination: Any) -> torch.Tensor:
    return g.movedim(destination, source)


def _unroll(g: torch.Tensor, x: Any, y: Any, shifts: Any, dims: Any = None) -> torch.Tensor:
    back = -shifts if isinstance(shifts, numbers.Integral) else tuple(-s for s in shifts)
    return g.roll(back, dims) if dims is not None else g.roll(back)


structural("Permute", [T.permute, torch.permute], "y = x.permute(p)  ->  dx = g.permute(p^-1)", _unpermute)
structural("Transpose", [T.transpose, torch.transpose, T.swapdims, torch.swapdims],
           "y = x with dims a, b swapped  ->  dx = g with dims a, b swapped")
structural("Swapaxes", [T.swapaxes, torch.swapaxes], "y = x with axes a, b swapped  ->  dx = g with a, b swapped")
structural("T", [T.t, torch.t], "y = x^T (2-D or less)  ->  dx = g^T")
structural("TProperty", [T.T.__get__], "y = x.T (all dims reversed)  ->  dx = g with all dims reversed", _reverse_dims,
           uses=())
structural("MT", [T.mT.__get__], "y = x.mT (last two dims swapped)  ->  dx = g.mT")
structural("Movedim", [T.movedim, torch.movedim, T.moveaxis, torch.moveaxis],
           "y = x with dims moved src -> dst  ->  dx = g with dims moved dst -> src", _unmove, uses=())
structural("Flip", [T.flip, torch.flip], "y = x reversed along dims  ->  dx = g reversed along dims")
structural("Reversed", [T.__reversed__],
           "y = reversed(x): x reversed along dim 0 (x.flip(0); a 0-d x itself)  ->  dx = g reversed along dim 0")
structural("Fliplr", [T.fliplr, torch.fliplr], "y = x reversed along dim 1  ->  dx = g reversed along dim 1")
structural("Flipud", [T.flipud, torch.flipud], "y = x reversed along dim 0  ->  dx = g reversed along dim 0")
structural("Roll", [T.roll, torch.roll], "y = x rolled by s  ->  dx = g rolled by -s", _unroll, uses=())


# ------------------------------------------------------------------ elements copied: sum the copies' gradients

def _sum_copies(g: torch.Tensor, x: Any, y: Any, *_: Any, **__: Any) -> torch.Tensor:
    return g.sum_to_size(x.shape)


def _unrepeat(g: torch.Tensor, x: Any, y: Any, *repeats: Any, **named: Any) -> torch.Tensor:
    """g of shape (r0*s0, r1*s1, ...) viewed as (r0, s0, r1, s1, ...), summed over the r's (the counts given by
    position or by name: x.repeat(repeats=(1, 2)))."""
    repeats = sizes(named.get("repeats", repeats))
    shape = (1,) * (len(repeats) - len(x.shape)) + tuple(x.shape)
    split = [n for pair in zip(repeats, shape) for n in pair]
    if not split:
        return g
    return g.reshape(split).sum(tuple(range(0, len(split), 2))).reshape(x.shape)


def _untile(g: torch.Tensor, x: Any, y: Any, dims: Any) -> torch.Tensor:
    dims = tuple(dims)
    return _unrepeat(g, x, y, (1,) * (len(x.shape) - len(dims)) + dims)


def _broadcast_back(g: torch.Tensor, x: Any, y: Any, *_: Any, **__: Any) -> torch.Tensor:
    return g.expand(x.shape)


structural("Expand", [T.expand], "y = x broadcast to a shape  ->  dx = g summed over the broadcast dims", _sum_copies)
structural("ExpandAs", [T.expand_as], "y = x broadcast to other's shape  ->  dx = g summed over broadcast dims",
           _sum_copies)
structural("BroadcastTo", [T.broadcast_to, torch.broadcast_to],
           "y = x broadcast to a shape  ->  dx = g summed over the broadcast dims", _sum_copies)
structural("Repeat", [T.repeat], "y = x tiled r_i times along dim i  ->  dx = sum of g over the tiles", _unrepeat)
structural("Tile", [T.tile, torch.tile], "y = x tiled r_i times along dim i  ->  dx = sum of g over the tiles", _untile)
structural("SumToSize", [T.sum_to_size], "y = x summed down to a shape  ->  dx = g broadcast to x's shape",
           _broadcast_back)


# ------------------------------------------------------------------ copies and conversions: g passes through

def _identity(g: torch.Tensor, x: Any, y: Any, *_: Any, **__: Any) -> torch.Tensor:
    return g


def _convert_back(g: torch.Tensor, x: Any, y: Any, *_: Any, **__: Any) -> torch.Tensor:
    return g.to(device=x.device, dtype=x.dtype)


structural("Contiguous", [T.contiguous], "y = x laid out contiguously  ->  dx = g", _identity, uses=())
structural("Clone", [T.clone, torch.clone], "y = copy of x  ->  dx = g", _identity, uses=())
for _name, _target in [("To", T.to), ("Type", T.type), ("TypeAs", T.type_as), ("Float", T.float), ("Double", T.double),
                       ("Half", T.half), ("BFloat16", T.bfloat16), ("Cpu", T.cpu), ("Cuda", T.cuda)]:
    structural(_name, [_target], "y = x converted to another dtype / device  ->  dx = g converted back", _convert_back)


# ------------------------------------------------------------------ part of x: embed g into zeros; and the inverse

def _narrow_scatter(base: torch.Tensor, src: torch.Tensor, dim: int, start: Any, length: int) -> torch.Tensor:
    start = int(start)
    start = start + base.shape[dim] if start < 0 else start
    return torch.slice_scatter(base, src, dim, start, start + length)


def _slice(x: torch.Tensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> torch.Tensor:
    """The part of x that slice_scatter(x, src, dim, start, end, step) overwrites."""
    return x[(slice(None),) * (dim % x.dim()) + (slice(start, end, step),)]


def part_of(name: str, targets: Sequence[Callable], embed: Callable) -> type:
    """y = view(x, *args) picks part of x  ->  dx = embed(zeros like x, g, *args)."""
    return structural(name, targets, f"y = {name.lower()} of x  ->  dx = g written into zeros where y came from",
                      lambda g, x, y, *args, **kwargs: embed(g.new_zeros(x.shape), g, *args, **kwargs))


def written_into(name: str, targets: Sequence[Callable], part: Callable) -> type:
    """y = scatter(x, src, *args): src overwrites part of x  ->  dx = g with that part zeroed, dsrc = that part of g."""
    op = targets[0]
    return binary(name, targets, f"y = x with src written in ({name})  ->  dx = g zeroed there, dsrc = g there",
                  lambda g, a, b, z, *args, **kwargs: op(g, g.new_zeros(b.shape), *args, **kwargs),
                  lambda g, a, b, z, *args, **kwargs: part(g, *args, **kwargs), uses=(("b.meta",), ()),
                  options=AS_CALLED, inputs=("x", "src"))


part_of("Select", [T.select, torch.select], torch.select_scatter)
part_of("Narrow", [T.narrow, torch.narrow], _narrow_scatter)
part_of("Diagonal", [T.diagonal, torch.diagonal], torch.diagonal_scatter)
written_into("SelectScatter", [torch.select_scatter, T.select_scatter], T.select)
written_into("SliceScatter", [torch.slice_scatter, T.slice_scatter], _slice)
written_into("DiagonalScatter", [torch.diagonal_scatter, T.diagonal_scatter], T.diagonal)


structural("Unfold", [T.unfold],
           "y = sliding windows of x along dim (windows may overlap)  ->  dx = g added back at each window's elements",
           lambda g, x, y, *args, **kwargs: add_at(g, x.shape, positions(x.shape, g.device).unfold(*args, **kwargs)))


# ------------------------------------------------------------------ joining and cutting

@register(torch.cat, torch.concat, torch.concatenate)
class Cat(Function):
    """y = [x_1, ..., x_n] joined along dim  ->  dx_i = the slice of g where x_i went"""

    @staticmethod
    def forward(ctx, tensors, dim=0):
        y = torch.cat(tensors, dim)
        ctx.dim = dim % y.dim()
        ctx.shapes = [t.shape for t in tensors]
        # torch skips 1-D empty tensors whatever dim is: they take up no slice of y
        legacy_empty = [t.dim() == 1 and t.numel() == 0 and y.dim() != 1 for t in tensors]
        ctx.sizes = [0 if skip else t.shape[ctx.dim] for t, skip in zip(tensors, legacy_empty)]
        return y

    @staticmethod
    def backward(ctx, g):
        pieces = g.split(ctx.sizes, ctx.dim)
        return [p if p.shape == s else p.reshape(s) for p, s in zip(pieces, ctx.shapes)], None


@register(torch.stack)
class Stack(Function):
    """y = [x_1, ..., x_n] stacked along a new dim  ->  dx_i = g[..., i, ...]"""

    @staticmethod
    def forward(ctx, tensors, dim=0):
        ctx.dim = dim
        return torch.stack(tensors, dim)

    @staticmethod
    def backward(ctx, g):
        return list(g.unbind(ctx.dim)), None


def joined(name: str, targets: Sequence[Callable], lift: Callable, dim_of: Callable) -> type:
    """y = cat([lift(x_i)], dim_of(lifted)) (hstack, vstack, ...)  ->  dx_i = its slice of g, reshaped to x_i."""

    def forward(ctx: Any, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        lifted = [lift(t) for t in tensors]
        ctx.dim, ctx.shapes = dim_of(lifted), [t.shape for t in tensors]
        ctx.sizes = [t.shape[ctx.dim] for t in lifted]
        return targets[0](tensors)

    def backward(ctx: Any, g: torch.Tensor) -> Tuple[list]:
        return ([p.reshape(s) for p, s in zip(g.split(ctx.sizes, ctx.dim), ctx.shapes)],)

    return rule(name, "y = the x_i (made at least k-D) joined along a dim  ->  dx_i = its slice of g", forward,
                     backward, targets)


def _as_column(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, 1) if t.dim() < 2 else t


joined("Hstack", [torch.hstack], torch.atleast_1d, lambda lifted: 0 if lifted[0].dim() == 1 else 1)
joined("Vstack", [torch.vstack, torch.row_stack], torch.atleast_2d, lambda lifted: 0)
joined("Dstack", [torch.dstack], torch.atleast_3d, lambda lifted: 2)
joined("ColumnStack", [torch.column_stack], _as_column, lambda lifted: 1)


def _dim_argument(x: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """The `dim` of torch.split(x, sizes, dim=0) / chunk / tensor_split, passed by position or by keyword."""
    return kwargs["dim"] if "dim" in kwargs else (args[1] if len(args) > 1 else 0)


def cut(name: str, targets: Sequence[Callable], cut_dim: Callable = _dim_argument, several_views: bool = False) -> type:
    """(y_1, ..., y_n) = x cut into consecutive pieces along one dim  ->  dx = the pieces' gradients joined.

    cut_dim(x, *args, **kwargs) names that dim: the `dim` argument, or the fixed one of hsplit/vsplit/dsplit (not
    guessed from the pieces' shapes: pieces of size 0 are as long as x in every dim). `several_views`: torch makes the
    pieces in one op returning several views (split, chunk), which it forbids changing in place; tensor_split and
    hsplit/vsplit/dsplit slice x one piece at a time (ordinary views)."""
    op = targets[0]

    def forward(ctx: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> Tuple[torch.Tensor, ...]:
        ctx.dim = cut_dim(x, *args, **kwargs)
        return op(x, *args, **kwargs)

    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        return torch.cat(grads, ctx.dim)

    made = rule(name, "(y_1..y_n) = pieces of x along dim  ->  dx = cat(dy_1..dy_n, dim)", forward, backward,
                targets)
    made.several_views = several_views
    return made


cut("Split", [T.split, torch.split], several_views=True)
cut("SplitWithSizes", [T.split_with_sizes, torch.split_with_sizes], several_views=True)
cut("Chunk", [T.chunk, torch.chunk], several_views=True)
cut("TensorSplit", [T.tensor_split, torch.tensor_split])
cut("Hsplit", [T.hsplit, torch.hsplit], lambda x, sections: 1 if x.dim() > 1 else 0)
cut("Vsplit", [T.vsplit, torch.vsplit], lambda x, sections: 0)
cut("Dsplit", [T.dsplit, torch.dsplit], lambda x, sections: 2)
cut("UnsafeSplit", [T.unsafe_split, torch.unsafe_split])
cut("UnsafeSplitWithSizes", [T.unsafe_split_with_sizes, torch.unsafe_split_with_sizes])
cut("UnsafeChunk", [T.unsafe_chunk, torch.unsafe_chunk])


@register(T.unbind, torch.unbind)
class Unbind(Function):
    """(y_1, ..., y_n) = the slices x[..., i, ...]  ->  dx = stack(dy_1, ..., dy_n)"""

    several_views = True

    @staticmethod
    def forward(ctx, x, dim=0):
        ctx.dim = dim
        return torch.unbind(x, dim)

    @staticmethod
    def backward(ctx, *grads):
        return torch.stack(grads, ctx.dim)
