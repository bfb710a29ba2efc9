"""Gradient rules for products: matmul and its special cases, einsum, tensordot, the addmm family, trace.

Every product here is an einsum, z = einsum(eq, x_1, ..., x_n). Its vector-Jacobian product for operand k is
again an einsum: of the output gradient with every other operand, producing the subscripts of x_k. So one
function, `einsum_grads`, differentiates the whole family; the rules only say which equation their op computes.
Because that backward calls nothing but torch.einsum (and constant eye/ones tensors), it is itself recorded by
the Einsum rule when create_graph=True: double backward comes for free.
"""
import functools
import numbers
import string
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.ops.rule_tables import Meta, reflected

T = torch.Tensor
LABELS = string.ascii_uppercase + string.ascii_lowercase  # torch.einsum's subscript alphabet
ELLIPSIS = "..."


# ----------------------------------------------------------------------------------------------------------------
# einsum equations: parsing, and the gradient equation of one operand

@functools.lru_cache(maxsize=512)
def parse(equation: str, ranks: Tuple[int, ...]) -> Tuple[List[str], str, str]:
    """Explicit form of an einsum equation for operands of these ranks: (input subscripts, output subscripts,
    unused labels). '...' is spelled out as labels of its own, so ellipsis dimensions broadcast like any
    other label; an implicit output is '...' then the labels used exactly once, in sorted order (as torch)."""
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"einsum(): the equation '{equation}' has {len(terms)} operands, but {len(ranks)} were given")
    unused = [label for label in LABELS if label not in equation]
    named = [len(term.replace(ELLIPSIS, "")) for term in terms]
    n_ellipsis = max([rank - n for term, rank, n in zip(terms, ranks, named) if ELLIPSIS in term], default=0)
    if n_ellipsis > len(unused):
        raise ValueError(f"einsum(): too many dimensions to label in '{equation}'")
    ellipsis, unused = "".join(unused[:n_ellipsis]), "".join(unused[n_ellipsis:])
    inputs = [term.replace(ELLIPSIS, ellipsis[n_ellipsis - (rank - n):]) for term, rank, n in zip(terms, ranks, named)]
    if not arrow:
        letters = lhs.replace(ELLIPSIS, "").replace(",", "")
        rhs = ellipsis + "".join(sorted(label for label in set(letters) if letters.count(label) == 1))
    return inputs, rhs.replace(ELLIPSIS, ellipsis), unused


def _operand_grad(g: torch.Tensor, operands: Sequence[torch.Tensor], inputs: List[str], output: str, k: int,
                  unused: str) -> torch.Tensor:
    """dz/dx_k = einsum(g, x_j for j != k  ->  subscripts of x_k), made to come out in exactly x_k's shape.

    Constant helper operands cover three cases: a label repeated within x_k (a diagonal, 'ii->i') is tied to a
    fresh label by an identity matrix; a label of x_k that no other term carries at full size (summed away,
    'ij->') comes from a tensor of ones, which broadcasts the gradient back over it; a size-1 dimension of x_k
    that broadcast against a larger one gets a fresh size-1 label (from the ones tensor) so that einsum sums
    the larger one away. Leading (ellipsis) dimensions that x_k lacks are not in its subscripts: summed too.
    """
    x = operands[k]
    terms = [output] + [inputs[j] for j in range(len(operands)) if j != k]
    # (operands of several float dtypes: torch computes in the promoted one, g's; the edge casts the result back)
    tensors = [g] + [operands[j] if operands[j].dtype == g.dtype else operands[j].to(g.dtype)
                     for j in range(len(operands)) if j != k]
    sizes = {}  # label -> largest size any term of the gradient einsum gives it
    for term, t in zip(terms, tensors):
        for label, n in zip(term, t.shape):
            sizes[label] = max(sizes.get(label, 0), n)
    fresh = iter(unused)
    target = ""
    for label, n in zip(inputs[k], x.shape):
        if label in target or (n == 1 and sizes.get(label, 1) > 1):
            tied = next(fresh, None)
            if tied is None:
                raise ValueError(f"einsum(): too many labels to differentiate '{inputs[k]}'")
            if label in target:
                terms.append(label + tied)
                tensors.append(torch.eye(n, dtype=g.dtype, device=x.device))
                sizes[label] = sizes[tied] = n
            label = tied
        target += label
    ones = [(label, n) for label, n in zip(target, x.shape) if sizes.get(label, 0) < n]
    if ones:
        terms.append("".join(label for label, _ in ones))
        tensors.append(torch.ones([n for _, n in ones], dtype=g.dtype, device=x.device))
    return torch.einsum(",".join(terms) + "->" + target, *tensors)


def einsum_grads(equation: str, g: torch.Tensor, operands: Sequence[torch.Tensor],
                 needed: Sequence[bool]) -> List[Optional[torch.Tensor]]:
    """Gradients of z = einsum(equation, *operands) for the operands flagged in `needed` (None for the rest)."""
    inputs, output, unused = parse(equation, tuple(len(x.shape) for x in operands))
    return [_operand_grad(g, operands, inputs, output, k, unused) if need else None for k, need in enumerate(needed)]


def _real_only(name: str, *tensors: Any) -> None:
    if any(isinstance(t, torch.Tensor) and t.is_complex() for t in tensors):
        raise UnsupportedOperationError(f"{name}: complex inputs are not supported — torchtrace's gradient rules are "
                                        "for real dtypes (a complex gradient would need conjugates)")


def _names(targets: Sequence[Callable]) -> str:
    return ", ".join(sorted({getattr(t, "__name__", str(t)) for t in targets}))


# ----------------------------------------------------------------------------------------------------------------
# einsum itself

@register(torch.einsum)
class Einsum(Function):
    """z = einsum(eq, x_1..x_n)  ->  dz/dx_k = einsum(g, x_j for j != k  ->  subscripts of x_k)"""

    @staticmethod
    def forward(ctx, equation, *operands):
        ctx.listed = len(operands) == 1 and isinstance(operands[0], (list, tuple))  # einsum(eq, [a, b])
        tensors = list(operands[0]) if ctx.listed else list(operands)
        _real_only("einsum", *tensors)
        ctx.equation = equation
        ctx.save_for_backward(*tensors)
        return torch.einsum(equation, *tensors)

    @staticmethod
    def backward(ctx, g):
        tensors = ctx.saved_tensors
        needed = [True] * len(tensors) if ctx.listed else ctx.needs_input_grad[1:1 + len(tensors)]
        grads = einsum_grads(ctx.equation, g, tensors, needed)
        return (None, grads) if ctx.listed else (None, *grads)


# ----------------------------------------------------------------------------------------------------------------
# products of two tensors: each is an einsum whose equation depends on the operands' ranks

def _rule_class(name: str, math: str, forward: Callable, backward: Callable) -> type:
    methods = {"__doc__": math, "forward": staticmethod(forward), "backward": staticmethod(backward)}
    return type(name, (Function,), methods)


def contraction(name: str, targets: Sequence[Callable], math: str, equation: Callable) -> type:
    """Rule for z = op(a, b, ...), where equation(a, b, ...) is the einsum equation that op computes."""
    op, names = targets[0], _names(targets)

    def forward(ctx: Any, a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        _real_only(names, a, b)
        z = op(a, b, *args, **kwargs)
        ctx.equation = equation(a, b, *args, **kwargs)
        save_for_each_other(ctx, a, b, *ctx.needs_input_grad[:2])
        return z

    def backward(ctx: Any, g: Any) -> Any:
        return tuple(einsum_grads(ctx.equation, g, saved_or_meta(ctx), ctx.needs_input_grad[:2]))

    return register(*targets, rule=_rule_class(name, math, forward, backward))


def save_for_each_other(ctx: Any, a: torch.Tensor, b: torch.Tensor, need_a: bool, need_b: bool) -> None:
    """Save a only if b needs its gradient and b only if a does, as torch; an operand not saved leaves its Meta
    (the shape its own gradient takes), so a later in-place change of it is no error."""
    ctx.metas = [None if need_b else Meta(a.shape, a.dtype, a.device), None if need_a else Meta(b.shape, b.dtype,
                                                                                                  b.device)]
    ctx.save_for_backward(a if need_b else None, b if need_a else None)


def saved_or_meta(ctx: Any) -> List[Any]:
    return [t if meta is None else meta for t, meta in zip(ctx.saved_tensors, ctx.metas)]


def fixed(equation: str) -> Callable:
    return lambda *args, **kwargs: equation


def inner_equation(a: torch.Tensor, b: torch.Tensor, *args: Any, **kwargs: Any) -> str:
    """Sum over the last dimension of both; a 0-d operand multiplies."""
    if a.dim() == 0 or b.dim() == 0:
        return ",".join(ELLIPSIS if t.dim() else "" for t in (a, b)) + "->" + ELLIPSIS
    left, right = LABELS[:a.dim() - 1], LABELS[a.dim() - 1:a.dim() + b.dim() - 2]
    return f"{left}z,{right}z->{left}{right}"


def _tensordot_dims(a: torch.Tensor, b: torch.Tensor, dims: Any) -> Tuple[List[int], List[int]]:
    if isinstance(dims, torch.Tensor):
        dims = dims.tolist()
    if isinstance(dims, numbers.Integral):
        return list(range(a.dim() - dims, a.dim())), list(range(dims))
    dims_a, dims_b = ([d] if isinstance(d, numbers.Integral) else list(d) for d in dims)
    return [d % a.dim() for d in dims_a], [d % b.dim() for d in dims_b]


def tensordot_equation(a: torch.Tensor, b: torch.Tensor, dims: Any = 2, *args: Any, **kwargs: Any) -> str:
    """The dims of a in dims[0] are contracted with those of b in dims[1]; the rest are kept, a's first."""
    dims_a, dims_b = _tensordot_dims(a, b, dims)
    left = LABELS[:a.dim()]
    right = list(LABELS[a.dim():a.dim() + b.dim()])
    for da, db in zip(dims_a, dims_b):
        right[db] = left[da]
    kept = [label for d, label in enumerate(left) if d not in dims_a]
    kept += [label for d, label in enumerate(right) if d not in dims_b]
    return f"{left},{''.join(right)}->{''.join(kept)}"


@register(torch.matmul, T.matmul, T.__matmul__, torch.linalg.matmul)
class Matmul(Function):
    """z = a @ b  ->  dz/da = g @ b^T, dz/db = a^T @ g

    Each operand is saved only if the other needs its gradient, as torch does: a later in-place change of an operand
    that no gradient reads is no error."""

    @staticmethod
    def forward(ctx, a, b):
        _real_only("torch.matmul", a, b)
        out = torch.matmul(a, b)  # first: an operand that is no tensor gets torch's TypeError (`2 @ x`: NotImplemented)
        need_a, need_b = ctx.needs_input_grad[:2]
        ctx.vectors = a.dim() == 1, b.dim() == 1
        ctx.save_for_backward(a if need_b else None, b if need_a else None)
        return out

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[:2]
        row, column = ctx.vectors
        if row and column:  # a dot product
            return (g * b if need_a else None), (g * a if need_b else None)
        # A vector a is a one-row matrix, a vector b a one-column matrix; batch dims are summed by the engine.
        g = g.unsqueeze(-2) if row else g.unsqueeze(-1) if column else g
        da = g @ (b.unsqueeze(-1) if column else b).mT if need_a else None
        db = (a.unsqueeze(0) if row else a).mT @ g if need_b else None
        return (da.squeeze(-2) if row and need_a else da), (db.squeeze(-1) if column and need_b else db)


reflected("Rmatmul", Matmul, [T.__rmatmul__])
contraction("Mm", [torch.mm, T.mm], "z = A B  ->  dz/dA = g B^T, dz/dB = A^T g", fixed("ij,jk->ik"))
contraction("Bmm", [torch.bmm, T.bmm], "z_b = A_b B_b  ->  dz/dA_b = g_b B_b^T, dz/dB_b = A_b^T g_b",
            fixed("bij,bjk->bik"))
contraction("Mv", [torch.mv, T.mv], "z = A v  ->  dz/dA = g v^T, dz/dv = A^T g", fixed("ij,j->i"))
contraction("Dot", [torch.dot, T.dot, torch.vdot, T.vdot], "z = a . b (real)  ->  dz/da = g b, dz/db = g a",
            fixed("i,i->"))
contraction("Outer", [torch.outer, T.outer, torch.ger, T.ger], "z = a b^T  ->  dz/da = g b, dz/db = g^T a",
            fixed("i,j->ij"))
contraction("Inner", [torch.inner, T.inner], "z = sum_k a[..., k] b[..., k]  ->  dz/da = g . b, dz/db = g . a",
            inner_equation)
contraction("Tensordot", [torch.tensordot], "z = sum over paired dims of a b  ->  dz/da = g . b, dz/db = a . g",
            tensordot_equation)


# ----------------------------------------------------------------------------------------------------------------
# beta * input + alpha * (product): addmm, addmv, addr, baddbmm, addbmm

def scaled_contraction(name: str, targets: Sequence[Callable], math: str, equation: str,
                       order: Tuple[str, str]) -> type:
    """Rule for z = beta * input + alpha * einsum(equation, a, b) (input broadcasts; the engine sums it back).

    beta and alpha are keyword-only in torch, but the dispatcher hands keyword arguments over by position in
    the order of torch's signature table, which is `order` (alpha first for baddbmm and addbmm).
    """
    op, names = targets[0], _names(targets)

    def forward(ctx: Any, input: Any, a: Any, b: Any, *scalars: Any, **named: Any) -> Any:
        _real_only(names, input, a, b)
        named.update(zip(order, scalars))
        ctx.beta, ctx.alpha = named.pop("beta", 1), named.pop("alpha", 1)
        save_for_each_other(ctx, a, b, *ctx.needs_input_grad[1:3])
        return op(input, a, b, beta=ctx.beta, alpha=ctx.alpha, **named)

    def backward(ctx: Any, g: Any) -> Any:
        need_input, need_a, need_b = ctx.needs_input_grad[:3]
        grad_input = (g if ctx.beta == 1 else g * ctx.beta) if need_input else None
        scaled = g if ctx.alpha == 1 else g * ctx.alpha
        return (grad_input, *einsum_grads(equation, scaled, saved_or_meta(ctx), (need_a, need_b)))

    return register(*targets, rule=_rule_class(name, math, forward, backward))


scaled_contraction("Addmm", [torch.addmm, T.addmm], "z = beta C + alpha A B  ->  dz/dC = beta g, dz/dA = alpha g B^T, "
                   "dz/dB = alpha A^T g", "ij,jk->ik", ("beta", "alpha"))
scaled_contraction("Addmv", [torch.addmv, T.addmv], "z = beta c + alpha A v  ->  dz/dc = beta g, dz/dA = alpha g v^T, "
                   "dz/dv = alpha A^T g", "ij,j->i", ("beta", "alpha"))
scaled_contraction("Addr", [torch.addr, T.addr], "z = beta C + alpha a b^T  ->  dz/dC = beta g, dz/da = alpha g b, "
                   "dz/db = alpha g^T a", "i,j->ij", ("beta", "alpha"))
scaled_contraction("Baddbmm", [torch.baddbmm, T.baddbmm], "z_b = beta C_b + alpha A_b B_b  ->  dz/dC = beta g, "
                   "dz/dA_b = alpha g_b B_b^T, dz/dB_b = alpha A_b^T g_b", "bij,bjk->bik", ("alpha", "beta"))
scaled_contraction("Addbmm", [torch.addbmm, T.addbmm], "z = beta C + alpha sum_b A_b B_b  ->  dz/dC = beta g, "
                   "dz/dA_b = alpha g B_b^T, dz/dB_b = alpha A_b^T g", "bij,bjk->ik", ("alpha", "beta"))


@register(torch.trace, T.trace)
class Trace(Function):
    """y = sum_i X_ii  ->  dy/dX = g I   (I rectangular for a non-square X)"""

    @staticmethod
    def forward(ctx, x):
        _real_only("trace", x)
        ctx.shape, ctx.dtype, ctx.device = x.shape, x.dtype, x.device
        return torch.trace(x)

    @staticmethod
    def backward(ctx, g):
        return g * torch.eye(*ctx.shape, dtype=ctx.dtype, device=ctx.device)
