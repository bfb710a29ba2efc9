"""Gradient rules for ops that build a new tensor out of the elements of their inputs.

Triangles and diagonals (tril, triu, diag, diag_embed, diagflat, block_diag), grids and products of index
sets (meshgrid, cartesian_prod, combinations, kron), repeats (repeat_interleave), rotations (rot90) and the
shape adapters (atleast_1d/2d/3d, broadcast_tensors). Each output element is one input element, a zero, or
(kron) a product of one element of each input, so each backward sends g back to where the element came from.
"""
import math
from typing import Any, Callable, List, Sequence, Tuple

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.ops.indexing import add_at, positions
from torchtrace.ops.rule_tables import make_rule
from torchtrace.ops.shape import structural

T = torch.Tensor
_VF = torch._C._VariableFunctions  # list forms: torch.meshgrid([x, y]) reaches this builtin with the list


def picked(name: str, targets: Sequence[Callable], math_line: str) -> type:
    """Rule for an op that only copies elements of x (any may be copied many times or dropped).

    Running the op on every element's flat position tells where each output element came from; g is added
    back there (copies add up).
    """
    op = targets[0]

    def forward(ctx: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        ctx.shape, ctx.args, ctx.kwargs = x.shape, args, kwargs
        return op(x, *args, **kwargs)

    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return add_at(g, ctx.shape, op(positions(ctx.shape, g.device), *ctx.args, **ctx.kwargs))

    return make_rule(name, math_line, forward, backward, targets)


def per_tensor(ctx: Any, tensors: Sequence[Any], outputs: Any) -> Any:
    """Outputs that each come from one input (meshgrid, broadcast_tensors, atleast_Nd of several): output k requires
    a gradient only if input k does, as torch's (which makes them one view each)."""
    if isinstance(outputs, (tuple, list)):
        ctx.mark_non_differentiable(*[out for t, out in zip(tensors, outputs) if not (
            getattr(t, "_tt_requires_grad", False) or isinstance(t, torch.Tensor) and t.requires_grad)])
    return outputs


def with_list_form(name: str, rule: type, targets: Sequence[Callable]) -> type:
    """The same rule for the builtin that receives the tensors as one list (torch.meshgrid([x, y]))."""

    def forward(ctx: Any, tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        return rule.forward(ctx, *tensors, *args, **kwargs)

    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[List[torch.Tensor]]:
        return (list(rule.backward(ctx, *grads)),)

    return make_rule(name, rule.__doc__, forward, backward, targets)


# ------------------------------------------------------------------ triangles and diagonals

def _unrotate(g: torch.Tensor, x: Any, y: Any, k: int = 1, dims: Sequence[int] = (0, 1)) -> torch.Tensor:
    return torch.rot90(g, -k, dims)


def _undiag(g: torch.Tensor, x: Any, y: Any, diagonal: int = 0) -> torch.Tensor:
    if len(x.shape) == 1:
        return g.diagonal(diagonal)
    return torch.diagonal_scatter(g.new_zeros(x.shape), g, diagonal)


def _undiagflat(g: torch.Tensor, x: Any, y: Any, offset: int = 0) -> torch.Tensor:
    return g.diagonal(offset).reshape(x.shape)


def _undiag_embed(g: torch.Tensor, x: Any, y: Any, offset: int = 0, dim1: int = -2, dim2: int = -1) -> torch.Tensor:
    return g.diagonal(offset, dim1, dim2)


for _rule in (
    structural("Tril", [torch.tril, T.tril], "y = x below diagonal k, 0 above  ->  dx = tril(g, k)"),
    structural("Triu", [torch.triu, T.triu], "y = x above diagonal k, 0 below  ->  dx = triu(g, k)"),
    structural("Rot90", [torch.rot90, T.rot90], "y = x turned k quarter turns in the plane dims  ->  dx = g turned -k",
               _unrotate, uses=()),
    structural("Diag", [torch.diag, T.diag],
               "1-D x: y = matrix with x on diagonal k -> dx = g.diagonal(k);  "
               "2-D x: y = x.diagonal(k) -> dx = g put there", _undiag),
    structural("Diagflat", [torch.diagflat, T.diagflat],
               "y = matrix with x.flatten() on diagonal k  ->  dx = g.diagonal(k) reshaped to x", _undiagflat),
    structural("DiagEmbed", [torch.diag_embed, T.diag_embed],
               "y[..., i, i+k] = x[..., i] on the plane (dim1, dim2)  ->  dx = g.diagonal(k, dim1, dim2)",
               _undiag_embed, uses=()),
):
    _rule.__module__ = __name__  # filed under this module, not shape.py where the factory lives


def _as_block(shape: torch.Size) -> Tuple[int, int]:
    """block_diag treats a 0-d tensor as (1, 1) and a 1-D tensor of n as (1, n)."""
    return (1, 1) if len(shape) == 0 else (1, shape[0]) if len(shape) == 1 else (shape[0], shape[1])


@register(torch.block_diag)
class BlockDiag(Function):
    """y = the x_i as blocks along the diagonal, 0 elsewhere  ->  dx_i = g's block at x_i's place"""

    @staticmethod
    def forward(ctx, *tensors):
        ctx.shapes = [t.shape for t in tensors]
        return torch.block_diag(*tensors)

    @staticmethod
    def backward(ctx, g):
        grads, row, col = [], 0, 0
        for shape in ctx.shapes:
            rows, cols = _as_block(shape)
            grads.append(g[row:row + rows, col:col + cols].reshape(shape))
            row, col = row + rows, col + cols
        return tuple(grads)


# ------------------------------------------------------------------ copies in a new arrangement

picked("RepeatInterleave", [torch.repeat_interleave, T.repeat_interleave],
       "y = each x element repeated r_i times (along dim, or flat)  ->  dx_i = sum of g over x_i's copies")
picked("Combinations", [torch.combinations],
       "y = rows of r elements of 1-D x, one per combination  ->  dx_i = sum of g wherever x_i was put")


@register(torch.kron, T.kron)
class Kron(Function):
    """y[i*B + j] = a[i] b[j] (per dim)  ->  da[i] = sum_j g[i*B + j] b[j], db[j] = sum_i g[i*B + j] a[i]"""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.kron(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        n = max(a.dim(), b.dim())
        sa, sb = (1,) * (n - a.dim()) + tuple(a.shape), (1,) * (n - b.dim()) + tuple(b.shape)
        # interleaved view of g: dims (a0, b0, a1, b1, ...), so that y = a (at even dims) * b (at odd dims)
        g = g.reshape([s for pair in zip(sa, sb) for s in pair])
        a_dims, b_dims = tuple(range(0, 2 * n, 2)), tuple(range(1, 2 * n, 2))
        need_a, need_b = ctx.needs_input_grad[:2]
        da = (g * _spread(b, sb, a_dims)).sum(b_dims).reshape(a.shape) if need_a else None
        db = (g * _spread(a, sa, b_dims)).sum(a_dims).reshape(b.shape) if need_b else None
        return da, db


def _spread(t: torch.Tensor, shape: Tuple[int, ...], new_dims: Tuple[int, ...]) -> torch.Tensor:
    """t (padded to `shape`) with size-1 dims inserted at new_dims, ready to broadcast against the interleaved g."""
    t = t.reshape(shape)
    for d in new_dims:
        t = t.unsqueeze(d)
    return t


# ------------------------------------------------------------------ grids: each x_i spread along its own dim

def _grid_dim(i: int, n: int, indexing: Any) -> int:
    """The dim of meshgrid's outputs along which x_i varies ('xy' swaps the first two)."""
    if indexing == "xy" and n >= 2 and i < 2:
        return 1 - i
    return i


def _sum_all_but(g: torch.Tensor, dim: int, shape: torch.Size) -> torch.Tensor:
    others = tuple(d for d in range(g.dim()) if d != dim)
    return (g.sum(others) if others else g).reshape(shape)


@register(torch.meshgrid)
class Meshgrid(Function):
    """Y_k[i_1, ..., i_n] = x_k[i_k]  ->  dx_k = sum of dY_k over every dim but k's (xy: first two dims swapped)"""

    @staticmethod
    def forward(ctx, *tensors, indexing=None):
        ctx.shapes, ctx.indexing = [t.shape for t in tensors], indexing
        return per_tensor(ctx, tensors, torch.meshgrid(*tensors, indexing=indexing))

    @staticmethod
    def backward(ctx, *grads):
        n = len(ctx.shapes)
        return tuple(_sum_all_but(g, _grid_dim(i, n, ctx.indexing), shape)
                     for i, (g, shape) in enumerate(zip(grads, ctx.shapes)))


with_list_form("MeshgridList", Meshgrid, [_VF.meshgrid])


@register(torch.cartesian_prod)
class CartesianProd(Function):
    """y[k] = (x_1[i_1], ..., x_n[i_n]) over all index tuples  ->  dx_j = column j of g summed per x_j element"""

    @staticmethod
    def forward(ctx, *tensors):
        ctx.shapes = [t.shape for t in tensors]
        return torch.cartesian_prod(*tensors)

    @staticmethod
    def backward(ctx, g):
        if len(ctx.shapes) == 1:
            return (g,)
        lengths = [math.prod(s) for s in ctx.shapes]
        return tuple(_sum_all_but(g[:, j].reshape(lengths), j, s) for j, s in enumerate(ctx.shapes))


# ------------------------------------------------------------------ shape adapters

def _at_least(rank: int, op: Callable) -> type:
    def forward(ctx: Any, *tensors: torch.Tensor) -> Any:
        ctx.shapes = [t.shape for t in tensors]
        return per_tensor(ctx, tensors, op(*tensors))

    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(g.reshape(s) for g, s in zip(grads, ctx.shapes))

    name = f"Atleast{rank}d"
    rule = make_rule(name, f"y = x with size-1 dims added up to {rank}-D  ->  dx = g reshaped to x", forward,
                     backward, [op])
    return with_list_form(name + "List", rule, [getattr(_VF, f"atleast_{rank}d")])


_at_least(1, torch.atleast_1d)
_at_least(2, torch.atleast_2d)
_at_least(3, torch.atleast_3d)


@register(torch.broadcast_tensors)
class BroadcastTensors(Function):
    """y_i = x_i broadcast to the common shape  ->  dx_i = g_i summed over the broadcast dims"""

    @staticmethod
    def forward(ctx, *tensors):
        ctx.shapes = [t.shape for t in tensors]
        return per_tensor(ctx, tensors, torch.broadcast_tensors(*tensors))

    @staticmethod
    def backward(ctx, *grads):
        return tuple(g.sum_to_size(s) for g, s in zip(grads, ctx.shapes))
