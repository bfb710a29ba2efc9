"""Gradient rules for reductions: sum, mean, prod, nansum, nanmean, max/min, amax/amin, aminmax, logsumexp,
var/std (and var_mean/std_mean), norms, cumsum."""
import math
import numbers
from typing import Any, Sequence, Tuple, Union

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.ops.rule_tables import unary

T = torch.Tensor
Dims = Union[None, int, Sequence[int]]


def reduced_dims(dim: Dims, ndim: int) -> Tuple[int, ...]:
    """The dims a reduction runs over, sorted and non-negative (None or an empty tuple means all dims)."""
    if dim is None or (not isinstance(dim, numbers.Integral) and len(dim) == 0):
        return tuple(range(ndim))
    dims = [dim] if isinstance(dim, numbers.Integral) else dim
    return tuple(sorted(d % ndim for d in dims)) if ndim else ()


def restore_dims(t: torch.Tensor, ndim: int, dim: Dims, keepdim: bool) -> torch.Tensor:
    """Re-insert (with size 1) the dims a reduction dropped, so `t` broadcasts against the reduction's input."""
    if not keepdim:
        for d in reduced_dims(dim, ndim):
            t = t.unsqueeze(d)
    return t


def expand_reduced(g: torch.Tensor, shape: torch.Size, dim: Dims, keepdim: bool) -> torch.Tensor:
    """Broadcast a reduced gradient back to the input's shape (re-inserting the dims that keepdim dropped)."""
    return restore_dims(g, len(shape), dim, keepdim).expand(shape)


def reduced_count(shape: torch.Size, dim: Dims) -> int:
    """How many input elements went into each output element."""
    return math.prod(shape[d] for d in reduced_dims(dim, len(shape)))


REDUCE_OPTIONS = {"dim": None, "keepdim": False, "dtype": None}  # sum / mean / nansum / nanmean after their input


def mean_grad(g: torch.Tensor, shape: torch.Size, dim: Dims, keepdim: bool) -> torch.Tensor:
    """d mean / dx_i = 1 / N."""
    return expand_reduced(g, shape, dim, keepdim) / reduced_count(shape, dim)


def _nanmean_grad(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor, dim: Dims, keepdim: bool,
                  dtype: Any = None) -> torch.Tensor:
    kept = ~x.isnan()
    count = kept.sum(reduced_dims(dim, x.dim()), keepdim=True)
    return restore_dims(g, x.dim(), dim, keepdim) / count * kept


unary("Sum", [torch.sum, T.sum], "y = sum_i x_i (over dim)  ->  dy/dx_i = 1",
      lambda g, x, y, dim, keepdim, dtype: expand_reduced(g, x.shape, dim, keepdim), uses=("x.meta",),
      options=REDUCE_OPTIONS)
unary("Mean", [torch.mean, T.mean], "y = (1/N) sum_i x_i (over dim)  ->  dy/dx_i = 1/N",
      lambda g, x, y, dim, keepdim, dtype: mean_grad(g, x.shape, dim, keepdim), uses=("x.meta",),
      options=REDUCE_OPTIONS)
unary("Nansum", [torch.nansum, T.nansum], "y = sum of the non-NaN x_i (over dim)  ->  dy/dx_i = 1, 0 at NaN",
      lambda g, x, y, dim, keepdim, dtype: expand_reduced(g, x.shape, dim, keepdim) * ~x.isnan(), uses=("x",),
      options=REDUCE_OPTIONS)
unary("Nanmean", [torch.nanmean, T.nanmean],
      "y = nansum x / (number of non-NaN x_i)  ->  dy/dx_i = 1 / count, 0 at NaN (NaN for an all-NaN slice, as torch)",
      _nanmean_grad, uses=("x",), options=REDUCE_OPTIONS)


def exclusive_products(x: torch.Tensor, dim: int) -> torch.Tensor:
    """prod_{j != i} x_j along dim for every i: the exclusive cumprods from both ends multiplied (torch's formula)."""
    n = x.shape[dim]
    if n <= 1 or x.numel() == 0:
        return torch.ones_like(x)
    ones = torch.ones_like(x.narrow(dim, 0, 1))
    before = torch.cat([ones, x.narrow(dim, 0, n - 1)], dim).cumprod(dim)
    after = torch.cat([ones, x.narrow(dim, 1, n - 1).flip(dim)], dim).cumprod(dim).flip(dim)
    return before * after


@register(torch.prod, T.prod)
class Prod(Function):
    """y = prod_i x_i (over dim)  ->  dy/dx_i = prod_{j != i} x_j  (y / x_i when no input is 0, as torch)"""

    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, *, dtype=None):
        y = torch.prod(x, dtype=dtype) if dim is None else torch.prod(x, dim, keepdim, dtype=dtype)
        ctx.dim, ctx.keepdim = dim, keepdim
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        if x.dim() == 0:
            return g
        zeros = int((x == 0).sum())  # torch picks its formula by the zeros in the whole input, even across slices
        if ctx.dim is not None:
            g, y = (restore_dims(t, x.dim(), ctx.dim, ctx.keepdim) for t in (g, y))
            return g * (y / x) if zeros == 0 else g * exclusive_products(x, ctx.dim % x.dim())
        if zeros == 0:
            return g * (y / x)
        if zeros > 1 and not torch.is_grad_enabled():
            return torch.zeros_like(x)  # torch's shortcut: with two zeros every product of the others is 0
        return g * exclusive_products(x.reshape(-1), 0).reshape(x.shape)


def split_among_ties(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor, dim: Dims, keepdim: bool,
                     nan_is_equal: bool = True) -> torch.Tensor:
    """Gradient of a max/min reduction: g shared evenly by the elements equal to the result.

    max()/min()/median() count NaN as equal to a NaN result and give exactly 0 elsewhere, an infinite g included
    (torch's evenly_distribute_backward on CPU); amax/amin multiply by the 0/1 mask, so a slice whose result is NaN
    has no element equal to it and gets g * 0 / 0 = NaN, and an infinite g gives NaN off the mask, as torch.
    """
    y = restore_dims(y, x.dim(), dim, keepdim)
    g = restore_dims(g, x.dim(), dim, keepdim)
    if nan_is_equal:
        hits = (x == y) | (x.isnan() & y.isnan())
        return torch.where(hits, g / hits.sum(reduced_dims(dim, x.dim()), keepdim=True), 0.0)
    hits = x == y
    return g * hits / hits.sum(reduced_dims(dim, x.dim()), keepdim=True)


@register(torch.amax, T.amax)
class Amax(Function):
    """y = max x (over dim)  ->  dy/dx_i = 1/k at the k elements equal to y, 0 elsewhere"""

    op = staticmethod(torch.amax)

    @staticmethod
    def forward(ctx, x, dim=(), keepdim=False):
        y = ctx._rule.op(x, dim, keepdim)
        ctx.dim, ctx.keepdim = dim, keepdim
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return split_among_ties(g, x, y, ctx.dim, ctx.keepdim, nan_is_equal=False)


@register(torch.amin, T.amin)
class Amin(Amax):
    """y = min x (over dim)  ->  dy/dx_i = 1/k at the k elements equal to y, 0 elsewhere"""

    op = staticmethod(torch.amin)


@register(torch.aminmax, T.aminmax)
class Aminmax(Function):
    """(min, max) = aminmax(x)  ->  dx = g_min/k at the k elements equal to min + g_max/t at the t equal to max
    (NaN: NaN, as amin/amax)"""

    @staticmethod
    def forward(ctx, x, *, dim=None, keepdim=False):
        out = torch.aminmax(x, dim=dim, keepdim=keepdim)
        ctx.dim, ctx.keepdim = dim, keepdim
        ctx.save_for_backward(x, out.min, out.max)
        return out

    @staticmethod
    def backward(ctx, g_min, g_max):
        x, low, high = ctx.saved_tensors
        return sum(split_among_ties(g, x, y, ctx.dim, ctx.keepdim, nan_is_equal=False)
                   for g, y in ((g_min, low), (g_max, high)))


@register(torch.max, T.max)
class Max(Function):
    """y = max x  ->  dx = g/k at each of k tied maxima;  max(x, dim): dx = g at the returned index;
    max(a, b) is maximum's rule"""

    op, sign = staticmethod(torch.max), 1

    @staticmethod
    def forward(ctx, x, other=None, keepdim=False, *, dim=None):
        ctx.mode = "binary" if isinstance(other, torch.Tensor) else "all" if other is None and dim is None else "dim"
        if ctx.mode == "binary":
            out = ctx._rule.op(x, other)
            ctx.save_for_backward(x, other)
            return out
        if ctx.mode == "all":
            out = ctx._rule.op(x)
            ctx.save_for_backward(x, out)
            return out
        ctx.dim, ctx.keepdim, ctx.shape = dim if other is None else other, keepdim, x.shape
        out = ctx._rule.op(x, ctx.dim, keepdim)
        ctx.save_for_backward(out.indices)
        return out

    @staticmethod
    def backward(ctx, g, *_):
        if ctx.mode == "binary":
            a, b = ctx.saved_tensors
            return elementwise_extreme_grads(g, a * ctx._rule.sign, b * ctx._rule.sign)
        if ctx.mode == "all":
            x, y = ctx.saved_tensors
            return split_among_ties(g, x, y, None, False)
        (indices,) = ctx.saved_tensors
        if len(ctx.shape) == 0:
            return g
        dim = ctx.dim % len(ctx.shape)
        positions = torch.arange(ctx.shape[dim], device=g.device).view([-1] + [1] * (len(ctx.shape) - dim - 1))
        chosen = positions == restore_dims(indices, len(ctx.shape), dim, ctx.keepdim)
        return torch.where(chosen, restore_dims(g, len(ctx.shape), dim, ctx.keepdim), 0.0)  # exactly 0 off it, as torch


@register(torch.min, T.min)
class Min(Max):
    """y = min x  ->  dx = g/k at each of k tied minima;  min(x, dim): dx = g at the returned index;
    min(a, b) is minimum's rule"""

    op, sign = staticmethod(torch.min), -1


def elementwise_extreme_grads(g: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """z = maximum(a, b): g to the larger operand, g/2 to each on a tie (as torch); NaN operands get g."""
    tie = (a == b) * 0.5
    return g * (1 - (a < b).to(g.dtype) - tie), g * (1 - (b < a).to(g.dtype) - tie)


@register(torch.logsumexp, T.logsumexp, torch.special.logsumexp)
class LogSumExp(Function):
    """y = log sum_i exp(x_i)  ->  dy/dx_i = exp(x_i - y)  (the softmax of x)"""

    @staticmethod
    def forward(ctx, x, dim, keepdim=False):
        y = torch.logsumexp(x, dim, keepdim)
        ctx.dim, ctx.keepdim = dim, keepdim
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        y = restore_dims(y, x.dim(), ctx.dim, ctx.keepdim)
        return restore_dims(g, x.dim(), ctx.dim, ctx.keepdim) * (x - y).exp()


def var_options(args: tuple, kwargs: dict) -> Tuple[Dims, float, bool]:
    """(dim, correction, keepdim) from any var/std overload: (unbiased), (dim, unbiased, keepdim), (dim, correction=)"""
    names = ("unbiased",) if args and isinstance(args[0], bool) else ("dim", "unbiased", "keepdim")
    options = {**dict(zip(names, args)), **kwargs}
    correction = options.get("correction")
    if correction is None:
        correction = 1 if options.get("unbiased") is None else int(options["unbiased"])
    return options.get("dim"), correction, bool(options.get("keepdim", False))


def var_grad(g: torch.Tensor, x: torch.Tensor, dim: Dims, correction: float, keepdim: bool) -> torch.Tensor:
    """d var / dx_i = 2 (x_i - mean) / (N - correction); over all dims with N <= correction torch gives
    NaN where x_i = mean and inf elsewhere (2 / 0 times 0 or times a non-zero)."""
    if x.dim() == 0 or dim is None:
        dof = x.numel() - correction
        if dof <= 0:
            return g * torch.where(x == x.mean(), torch.full_like(x, math.nan), torch.full_like(x, math.inf))
        return g * (2 / dof) * (x - x.mean())
    centred = x - x.mean(reduced_dims(dim, x.dim()), keepdim=True)
    dof = reduced_count(x.shape, dim) - correction
    return restore_dims(g, x.dim(), dim, keepdim) * centred * (2 / dof if dof else math.inf)


def std_grad(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor, dim: Dims, correction: float,
             keepdim: bool) -> torch.Tensor:
    """d std / dx_i = d var / dx_i / (2 std), with g / (2 std) taken as 0 where std = 0 (as torch)."""
    scaled = torch.where(y == 0, torch.zeros_like(g), g / (2 * y))
    return var_grad(scaled, x, dim, correction, keepdim)


@register(torch.var, T.var)
class Var(Function):
    """y = sum_i (x_i - mean)^2 / (N - correction)  ->  dy/dx_i = 2 (x_i - mean) / (N - correction)"""

    op = staticmethod(torch.var)
    keeps_output = False  # std's gradient reads its output; var's does not (so var's may change in place)

    @staticmethod
    def forward(ctx, x, *args, **kwargs):
        y = ctx._rule.op(x, *args, **kwargs)
        ctx.dim, ctx.correction, ctx.keepdim = var_options(args, kwargs)
        ctx.save_for_backward(x, (y if isinstance(y, torch.Tensor) else y[0]) if ctx._rule.keeps_output else None)
        return y

    @staticmethod
    def backward(ctx, g):
        x, _ = ctx.saved_tensors
        return var_grad(g, x, ctx.dim, ctx.correction, ctx.keepdim)


@register(torch.std, T.std)
class Std(Var):
    """y = sqrt(var x)  ->  dy/dx_i = dvar/dx_i / (2y) = (x_i - mean) / ((N - correction) y), 0 where y = 0 (torch);
    N = the number of elements reduced"""

    op = staticmethod(torch.std)
    keeps_output = True

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return std_grad(g, x, y, ctx.dim, ctx.correction, ctx.keepdim)


def _unreached_without_freedom(ctx: Any, x: torch.Tensor, g_spread: torch.Tensor) -> bool:
    """var_mean / std_mean with no degree of freedom left (N <= correction: var's gradient is 0 * inf = NaN) and no
    gradient reaching var / std (zeros: only the mean was used): torch leaves that output out, so the mean's
    gradient stays finite. Reads g only in that case."""
    n = x.numel() if x.dim() == 0 or ctx.dim is None else reduced_count(x.shape, ctx.dim)
    return n - ctx.correction <= 0 and not bool(g_spread.any())


@register(torch.var_mean)
class VarMean(Var):
    """(var, mean) = var_mean(x)  ->  dL/dx = g_var dvar/dx + g_mean / N;  N = the number of elements reduced"""

    op = staticmethod(torch.var_mean)

    @staticmethod
    def backward(ctx, g_var, g_mean):
        x, _ = ctx.saved_tensors
        mean_part = mean_grad(g_mean, x.shape, ctx.dim, ctx.keepdim)
        if _unreached_without_freedom(ctx, x, g_var):
            return mean_part
        return var_grad(g_var, x, ctx.dim, ctx.correction, ctx.keepdim) + mean_part


@register(torch.std_mean)
class StdMean(Var):
    """(std, mean) = std_mean(x)  ->  dL/dx = g_std dstd/dx + g_mean / N;  N = the number of elements reduced"""

    op = staticmethod(torch.std_mean)
    keeps_output = True

    @staticmethod
    def backward(ctx, g_std, g_mean):
        x, y = ctx.saved_tensors
        mean_part = mean_grad(g_mean, x.shape, ctx.dim, ctx.keepdim)
        if _unreached_without_freedom(ctx, x, g_std):
            return mean_part
        return std_grad(g_std, x, y, ctx.dim, ctx.correction, ctx.keepdim) + mean_part


@register(torch.linalg.vector_norm)
class VectorNorm(Function):
    """y = (sum_i |x_i|^p)^(1/p)  ->  dy/dx_i = sign(x_i) |x_i|^(p-1) / y^(p-1)  (p=2: x/y; p=inf: ties share)"""

    @staticmethod
    def forward(ctx, x, ord=2, dim=None, keepdim=False, dtype=None, *, out=None):
        if out is not None:
            raise RuntimeError("torchtrace: vector_norm(..., out=) cannot be recorded; assign the result instead")
        y = torch.linalg.vector_norm(x, ord, dim, keepdim, dtype=dtype)
        ctx.ord, ctx.dim, ctx.keepdim = float(ord), dim, keepdim
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        if ctx.ord == 0:  # y counts the nonzero x_i: flat, and torch sends no gradient at all (None, not zeros)
            return None
        return vector_norm_grad(ctx, g)


def vector_norm_grad(ctx: Any, g: torch.Tensor) -> torch.Tensor:
    """dy/dx of y = ||x||_p, times g, from a vector_norm ctx (x and y saved; ord, dim, keepdim): zeros for p = 0
    (the rules that build on it, renorm and normalize, count that term as torch's composite does). sgn(x) = x/|x| is
    sign(x) for real x, and the direction a complex x's norm grows along (torch's convention)."""
    x, y = ctx.saved_tensors
    p = ctx.ord
    g, y = (restore_dims(t, x.dim(), ctx.dim, ctx.keepdim) for t in (g, y))
    if p == 0:
        return torch.zeros_like(x)
    if math.isinf(p):
        hits = (x.abs() == y) | x.isnan()
        return x.sgn() * g * hits / hits.sum(reduced_dims(ctx.dim, x.dim()), keepdim=True)
    if p == 1:
        return x.sgn() * g
    if p == 2:
        return g * torch.where(y == 0, 0.0, x / y)  # y = 0 only at x = 0: gradient 0 (2nd: NaN), as torch
    if p > 1:
        return x.sgn() * x.abs() ** (p - 1) * g / (y + (y == 0)) ** (p - 1)
    zero = x == 0  # p < 1: |x|^(p-1) blows up at 0, where torch defines the gradient as 0 (2nd: NaN, as torch)
    return x.sgn() * torch.where(zero, 0.0, x.abs() ** (p - 1)) * g * y ** (1 - p)


@register(torch.norm, T.norm)
class Norm(VectorNorm):
    """torch.norm / Tensor.norm: the vector p-norm over dim ('fro' = 2-norm); 'nuc' is refused"""

    @staticmethod
    def forward(ctx, x, p="fro", dim=None, keepdim=False, dtype=None, *, out=None):
        if isinstance(p, str) and p != "fro":
            torch.norm(x, p, dim, keepdim, dtype=dtype)  # an order torch does not know: torch's own error
            raise UnsupportedOperationError(f"torch.norm: p={p!r} has no gradient rule here — use p='fro' or a number")
        ord = 2 if p in ("fro", None) else p
        return VectorNorm.forward(ctx, x, ord, dim, keepdim, dtype, out=out)


unary("Cumsum", [torch.cumsum, T.cumsum],
      "y_i = sum_{j<=i} x_j  ->  dx_j = sum_{i>=j} g_i  (a cumsum of g from the other end)",
      lambda g, x, y, dim, dtype: g.flip(dim).cumsum(dim).flip(dim), uses=(), options={"dim": None, "dtype": None})

