"""Tangents of reductions, sorts and scans, and of the softmax family.

A reduction y_k = r(x_j : j in S_k), where every input feeds one output, has ẏ_k = Σ_{j in S_k} ∂y_k/∂x_j ẋ_j;
the weights ∂y_k/∂x_j are the backward of a unit cotangent (ones), so `reduction` needs only the reduced dims.
"""
import numbers
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from torchtrace.forward.call import Call, NoTangent
from torchtrace.forward.table import declare, tangent

Dims = Tuple[Optional[Sequence[int]], bool]


def _dims(dim: Any, ndim: int) -> Optional[Tuple[int, ...]]:
    """dim as a tuple of non-negative dims; None for every dim."""
    if dim is None:
        return None
    dims = (dim,) if isinstance(dim, numbers.Integral) else tuple(dim)
    if not dims:
        return None
    return tuple(d % max(ndim, 1) for d in dims)


def reduction(spec: Callable[[Call], Dims], outputs: Sequence[int] = (0,)) -> Callable[[Call], Any]:
    """ẏ = Σ over the reduced dims of (backward of ones) ⊙ ẋ, for each of `outputs` (the others: no tangent)."""

    def rule(call: Call) -> Any:
        call.only(0)
        outs = [call.out] if isinstance(call.out, torch.Tensor) else list(call.out)
        dim, keepdim = spec(call)
        dims = _dims(dim, call.args[0].dim())
        tangents: List[Optional[torch.Tensor]] = [None] * len(outs)
        for output in outputs:
            cotangents = [torch.ones_like(o) if nr == output else torch.zeros_like(o)
                          for nr, o in enumerate(outs) if o.is_floating_point()]
            weights = call.rule.backward(call.ctx, *cotangents)
            weights = weights[0] if isinstance(weights, (tuple, list)) else weights
            if weights is None:  # a flat reduction (the 0-norm counts nonzeros): its backward sends nothing
                tangents[output] = torch.zeros_like(outs[output])
                continue
            weighted = weights * call.dot(0)
            total = weighted.sum() if dims is None or weighted.dim() == 0 else weighted.sum(dims, keepdim=keepdim)
            tangents[output] = total.reshape(outs[output].shape)
        return tangents[0] if isinstance(call.out, torch.Tensor) else tuple(tangents)

    return rule


def _at(dim_at: int, keep_at: int, dim_name: str = "dim") -> Callable[[Call], Dims]:
    return lambda call: (call.arg(dim_at, dim_name), bool(call.arg(keep_at, "keepdim", False)))


def _statistics(call: Call) -> Dims:
    """var/std(x), (x, unbiased), (x, dim, unbiased, keepdim), (x, dim, *, correction, keepdim)."""
    first = call.arg(1, "dim")
    dim = None if isinstance(first, bool) else first
    keepdim = call.kwargs.get("keepdim", call.args[3] if len(call.args) > 3 else False)
    return dim, bool(keepdim)


def _keywords(call: Call) -> Dims:
    return call.kwargs.get("dim"), bool(call.kwargs.get("keepdim", False))


def _matrix(call: Call) -> Dims:
    return (-2, -1), False


def _norm(call: Call) -> Dims:
    """torch.norm(x, p, dim, keepdim) and linalg.norm(x, ord, dim, keepdim)."""
    return call.arg(2, "dim"), bool(call.arg(3, "keepdim", False))


def _matrix_norm(call: Call) -> Dims:
    return call.arg(2, "dim", (-2, -1)), bool(call.arg(3, "keepdim", False))


declare("Prod Amax Amin LogSumExp", "ẏ = Σ_reduced ∂y/∂x ẋ (∂y/∂x: the backward of ones; ties share evenly)",
        reduction(_at(1, 2)))
declare("VectorNorm Norm LinalgNorm", "ẏ = Σ_reduced ∂‖x‖/∂x ẋ", reduction(_norm))
declare("MatrixNorm", "ẏ = Σ over each matrix ∂‖X‖/∂X ⊙ Ẋ", reduction(_matrix_norm))
declare("Var Std", "ẏ = Σ_reduced ∂y/∂x ẋ (∂var/∂x_j = 2 (x_j - mean) / (N - correction))",
        reduction(_statistics))
declare("Det Logdet", "ẏ = Σ ∂y/∂A ⊙ Ȧ (d det A = det A tr(A^-1 Ȧ))", reduction(_matrix))
declare("Slogdet", "d log|det A| = tr(A^-1 Ȧ); the sign's tangent is 0", reduction(_matrix, outputs=(0, 1)))
declare("VarMean StdMean", "(var, mean): each Σ_reduced ∂y/∂x ẋ", reduction(_statistics, outputs=(0, 1)))
declare("Aminmax", "(min, max): each the mean of ẋ over its ties", reduction(_keywords, outputs=(0, 1)))


def _picked(dx: torch.Tensor, indices: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    """ẋ at `indices` along dim (the positions a sort, top-k or arg-reduction picked)."""
    if dx.dim() == 0:
        return dx.clone()
    dim = dim % dx.dim()
    index = indices if keepdim or indices.dim() == dx.dim() else indices.unsqueeze(dim)
    picked = dx.gather(dim, index)
    return picked if keepdim or indices.dim() == dx.dim() else picked.squeeze(dim)


def _evenly(x: torch.Tensor, dx: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The full max / min / median: the mean of ẋ over the elements equal to y."""
    ties = x == y
    return (dx * ties).sum() / ties.sum()


def picking(dim_at: int, keep_at: Optional[int], default_dim: int = -1) -> Callable[[Call], Any]:
    """(values, indices) = op(x, ..., dim, keepdim)  ->  (ẋ at indices, no tangent)."""

    def rule(call: Call) -> Any:
        call.only(0)
        x, dx = call.args[0], call.dot(0)
        if isinstance(call.out, torch.Tensor):  # the op over all elements: one value
            return _evenly(x, dx, call.out)
        dim = call.arg(dim_at, "dim", default_dim)
        keepdim = bool(call.arg(keep_at, "keepdim", False)) if keep_at is not None else True
        return _picked(dx, call.out[1], default_dim if dim is None else dim, keepdim), None

    return rule


declare("Sort Cummax Cummin", "(y, i) = op(x, dim)  ->  ẏ = ẋ gathered at i", picking(1, None))
declare("Topk", "(y, i) = topk(x, k, dim)  ->  ẏ = ẋ gathered at i", picking(2, None))
declare("Kthvalue", "(y, i) = kthvalue(x, k, dim)  ->  ẏ = ẋ gathered at i", picking(2, 3))
declare("Median Nanmedian Mode", "(y, i) = op(x, dim)  ->  ẏ = ẋ gathered at i; over all elements: mean of ẋ at ties",
        picking(1, 2))


@tangent("Msort", "y = sort(x, dim=0)  ->  ẏ = ẋ in the same order")
def _msort(call: Call) -> torch.Tensor:
    call.only(0)
    return call.dot(0).gather(0, torch.sort(call.args[0], dim=0).indices) if call.args[0].dim() else call.dot(0)


@tangent("Max Min", "max(x): mean of ẋ at ties; max(x, dim): ẋ at the index; max(a, b): as maximum(a, b)")
def _max(call: Call) -> Any:
    other = call.arg(1, "other")
    x, dx, db = call.args[0], call.dot(0), call.dot(1)
    if isinstance(other, torch.Tensor):  # the elementwise form: ties give each input half
        call.only(0, 1)
        y = call.out
        da = dx if dx is not None else torch.zeros_like(x)
        db = db if db is not None else torch.zeros_like(other)
        return torch.where(x == other, (da + db) / 2, torch.where(x == y, da, db)).expand(y.shape)
    call.only(0)
    if isinstance(call.out, torch.Tensor):
        return _evenly(x, dx, call.out)
    dim = other if other is not None else call.kwargs.get("dim")
    return _picked(dx, call.out[1], dim, bool(call.arg(2, "keepdim", False))), None


@tangent("Cumprod", "y_k = Π_{j<=k} x_j  ->  ẏ = y cumsum(ẋ / x) (x without zeros)")
def _cumprod(call: Call) -> torch.Tensor:
    call.only(0)
    x, dim = call.args[0], call.arg(1, "dim")
    if bool((x == 0).any()):
        raise NoTangent
    return call.out * torch.cumsum(call.dot(0) / x, dim)


@tangent("LogCumSumExp", "y_k = log Σ_{j<=k} e^x_j  ->  ẏ_k = Σ_{j<=k} e^(x_j - y_k) ẋ_j, split by the sign of ẋ "
         "so each part is a logcumsumexp: e^(lcse(x + log ẋ+) - y) - e^(lcse(x + log ẋ-) - y)")
def _logcumsumexp(call: Call) -> torch.Tensor:
    call.only(0)
    x, dim, y, dx = call.args[0], call.arg(1, "dim"), call.out, call.dot(0)
    positive = torch.logcumsumexp(x + dx.clamp_min(0).log(), dim)
    negative = torch.logcumsumexp(x + (-dx).clamp_min(0).log(), dim)
    return (positive - y).exp() - (negative - y).exp()


def _softmax_dim(call: Call) -> int:
    dim = call.arg(1, "dim")
    if dim is None:
        raise NoTangent
    return dim


@tangent("Softmax SafeSoftmax", "y = softmax(x)  ->  ẏ = y (ẋ - Σ y ẋ)")
def _softmax(call: Call) -> torch.Tensor:
    call.only(0)
    y, dim = call.out, _softmax_dim(call)
    dx = call.dot(0).to(y.dtype)
    return y * (dx - (y * dx).sum(dim, keepdim=True))


@tangent("Softmin", "y = softmax(-x)  ->  ẏ = -y (ẋ - Σ y ẋ)")
def _softmin(call: Call) -> torch.Tensor:
    call.only(0)
    y, dim = call.out, _softmax_dim(call)
    dx = call.dot(0).to(y.dtype)
    return -y * (dx - (y * dx).sum(dim, keepdim=True))


@tangent("LogSoftmax", "y = x - logsumexp(x)  ->  ẏ = ẋ - Σ softmax(x) ẋ")
def _log_softmax(call: Call) -> torch.Tensor:
    call.only(0)
    y, dim = call.out, _softmax_dim(call)
    dx = call.dot(0).to(y.dtype)
    return dx - (y.exp() * dx).sum(dim, keepdim=True)
