"""Gradient rules for inverting and solving: inv, det/slogdet/logdet, solve, triangular solves, the LU family,
cholesky_solve / cholesky_inverse.

Every rule here rests on one identity: d(A^-1) = -A^-1 dA A^-1. For X = A^-1 B it gives dB = A^-T G and
dA = -dB X^T; det and logdet follow from d log|det A| = tr(A^-1 dA). Backward rules solve with the same
torch.linalg calls that forward uses, and those calls have rules of their own, so create_graph=True gives
second derivatives. All rules are for real matrices (a complex matrix is refused, see `real_only`).
"""
from typing import Any, Optional, Sequence

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.ops.rule_tables import reordered

T = torch.Tensor
linalg = torch.linalg


# ----------------------------------------------------------------------------------------------------------------
# small matrix helpers shared by the linalg rule files (each is made of ops that have rules)

def real_only(name: str, *tensors: Any) -> None:
    """The linalg rules differentiate real matrices only: refuse complex ones at the call."""
    if any(isinstance(t, torch.Tensor) and t.is_complex() for t in tensors):
        raise UnsupportedOperationError(f"{name}: complex inputs are not supported — torchtrace's linalg gradient "
                                        "rules are real-only; work with real and imaginary parts separately")


def eye(n: int, m: Optional[int], like: torch.Tensor) -> torch.Tensor:
    return torch.eye(n, n if m is None else m, dtype=like.dtype, device=like.device)


def tril(x: torch.Tensor, diagonal: int = 0) -> torch.Tensor:
    """x with the part above the `diagonal`-th diagonal zeroed (a product with a constant 0/1 mask)."""
    return x * torch.ones(x.shape[-2:], dtype=x.dtype, device=x.device).tril(diagonal)


def triu(x: torch.Tensor, diagonal: int = 0) -> torch.Tensor:
    return x * torch.ones(x.shape[-2:], dtype=x.dtype, device=x.device).triu(diagonal)


def diag_embed(v: torch.Tensor) -> torch.Tensor:
    """Batched diagonal matrices from the last dim of v."""
    return v.unsqueeze(-1) * eye(v.shape[-1], None, v)


def scaled_eye(scale: torch.Tensor, n: int) -> torch.Tensor:
    """scale[..., None, None] * I_n, one identity per batch element."""
    return scale.unsqueeze(-1).unsqueeze(-1) * eye(n, None, scale)


def as_matrix(b: torch.Tensor, vector: bool) -> torch.Tensor:
    """A right-hand side that is a (batch of) vector(s) as a one-column matrix (as torch.linalg.solve)."""
    return b.unsqueeze(-1) if vector else b


def as_given(b: torch.Tensor, vector: bool) -> torch.Tensor:
    return b.squeeze(-1) if vector else b


def solve_is_vector(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch.linalg.solve's rule: B is a vector when it is 1-D, or A without its last dim."""
    return b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])


def solved_grads(g: torch.Tensor, x: torch.Tensor, solve_transposed: Any, left: bool, needs: Sequence[bool]) -> tuple:
    """X = A^-1 B (left) or B A^-1 (right)  ->  dB = A^-T G (G A^-T), dA = -dB X^T (-X^T dB).

    solve_transposed(G) computes A^-T G (left) or G A^-T (right); all operands are matrices here.
    """
    grad_b = solve_transposed(g)
    grad_a = None
    if needs[0]:
        grad_a = -(grad_b @ x.mT) if left else -(x.mT @ grad_b)
    return grad_a, grad_b if needs[1] else None


# ----------------------------------------------------------------------------------------------------------------
# the inverse

@register(linalg.inv, torch.inverse, T.inverse)
class Inv(Function):
    """Y = A^-1  ->  dA = -Y^T G Y^T"""

    @staticmethod
    def forward(ctx, A):
        real_only("torch.linalg.inv", A)
        y = linalg.inv(A)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g, *_):
        (y,) = ctx.saved_tensors
        return -(y.mT @ g @ y.mT)


@register(linalg.inv_ex)
class InvEx(Inv):
    """(Y, info) = inv_ex(A), Y = A^-1  ->  dA = -Y^T G Y^T   (info is an integer)"""

    @staticmethod
    def forward(ctx, A, *, check_errors=False):
        real_only("torch.linalg.inv_ex", A)
        out = linalg.inv_ex(A, check_errors=check_errors)
        ctx.save_for_backward(out.inverse)
        return out


# ----------------------------------------------------------------------------------------------------------------
# determinants

def cofactor(a: torch.Tensor) -> torch.Tensor:
    """d det(A) / dA = adj(A)^T, also for singular A. Up to 3x3 its polynomial entries: 1; [[d, -c], [-b, a]]; row i
    = row i+1 x row i+2 (so a second derivative is exact too: through an SVD it is not where singular values repeat,
    as at A = 0). Larger: det(U) det(V^T) U diag(prod_{j != i} s_j) V^T for A = U S V^T."""
    n = a.shape[-1]
    if n <= 3:
        rows = a.unbind(-2)
        if n == 1:
            return torch.ones_like(a)
        if n == 2:
            return torch.stack([torch.stack([rows[1][..., 1], -rows[1][..., 0]], -1),
                                torch.stack([-rows[0][..., 1], rows[0][..., 0]], -1)], -2)
        return torch.stack([linalg.cross(rows[(i + 1) % 3], rows[(i + 2) % 3]) for i in range(3)], -2)
    u, s, vh = linalg.svd(a)
    others = eye(n, None, s)  # row i = s with s_i replaced by 1
    products = (s.unsqueeze(-2) * (1 - others) + others).prod(-1)
    sign = linalg.det(u) * linalg.det(vh)
    return (u * (sign.unsqueeze(-1) * products).unsqueeze(-2)) @ vh


@register(linalg.det, torch.det, T.det)
class Det(Function):
    """d = det A  ->  dA = g d A^-T, for singular A g adj(A)^T (the cofactor matrix: its polynomial up to 3x3)"""

    @staticmethod
    def forward(ctx, A):
        real_only("torch.linalg.det", A)
        d = linalg.det(A)
        ctx.save_for_backward(A, d)
        return d

    @staticmethod
    def backward(ctx, g):
        a, d = ctx.saved_tensors
        if a.shape[-1] == 0:
            return torch.zeros_like(a)
        if bool((d == 0).any()) or (torch.is_grad_enabled() and a.shape[-1] <= 3):  # with create_graph: the
            return g.unsqueeze(-1).unsqueeze(-1) * cofactor(a)  # polynomial (d A^-T's second derivative cancels)
        return linalg.solve(a.mT, scaled_eye(g * d, a.shape[-1]))


def logabsdet_grad(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """d log|det A| / dA = A^-T (inf/nan for a singular A, as torch: no error is raised)."""
    return linalg.solve_ex(a.mT, scaled_eye(g, a.shape[-1]))[0]


@register(linalg.slogdet, torch.slogdet, T.slogdet)
class Slogdet(Function):
    """(sign, l) = slogdet A, l = log|det A|  ->  dA = g_l A^-T   (sign is piecewise constant: no gradient)"""

    @staticmethod
    def forward(ctx, A):
        real_only("torch.linalg.slogdet", A)
        ctx.save_for_backward(A)
        return linalg.slogdet(A)

    @staticmethod
    def backward(ctx, g_sign, g_logabsdet):
        (a,) = ctx.saved_tensors
        return logabsdet_grad(a, g_logabsdet)


@register(torch.logdet, T.logdet)
class Logdet(Function):
    """y = log det A (NaN where det A < 0)  ->  dA = g A^-T where det A >= 0, 0 where det A < 0 (as torch)"""

    @staticmethod
    def forward(ctx, A):
        real_only("torch.logdet", A)
        sign, _ = linalg.slogdet(A)
        ctx.save_for_backward(A, sign)
        return torch.logdet(A)

    @staticmethod
    def backward(ctx, g):
        a, sign = ctx.saved_tensors
        return logabsdet_grad(a, g * (sign >= 0))


# ----------------------------------------------------------------------------------------------------------------
# general solves

@register(linalg.solve)
class Solve(Function):
    """X = A^-1 B (left) or B A^-1 (left=False)  ->  dB = A^-T G (G A^-T), dA = -dB X^T (-X^T dB)"""

    @staticmethod
    def forward(ctx, A, B, *, left=True):
        real_only("torch.linalg.solve", A, B)
        x = linalg.solve(A, B, left=left)
        ctx.left, ctx.vector = left, solve_is_vector(A, B)
        ctx.save_for_backward(A, x)
        return x

    @staticmethod
    def backward(ctx, g, *_):
        a, x = ctx.saved_tensors
        left, vector = ctx.left, ctx.vector
        grad_a, grad_b = solved_grads(as_matrix(g, vector), as_matrix(x, vector),
                                      lambda g: linalg.solve(a.mT, g, left=left), left, ctx.needs_input_grad)
        return grad_a, None if grad_b is None else as_given(grad_b, vector)


@register(linalg.solve_ex)
class SolveEx(Solve):
    """(X, info) = solve_ex(A, B): X = A^-1 B (or B A^-1)  ->  dB = A^-T G, dA = -dB X^T   (info is an integer)"""

    @staticmethod
    def forward(ctx, A, B, *, left=True, check_errors=False):
        real_only("torch.linalg.solve_ex", A, B)
        out = linalg.solve_ex(A, B, left=left, check_errors=check_errors)
        ctx.left, ctx.vector = left, solve_is_vector(A, B)
        ctx.save_for_backward(A, out.result)
        return out


# ----------------------------------------------------------------------------------------------------------------
# triangular solves: as solve, with dA kept to A's triangle (the other triangle is never read)

def triangle_of(x: torch.Tensor, upper: bool, unitriangular: bool) -> torch.Tensor:
    """The entries of x where a triangular A is read: one triangle, without the diagonal when unitriangular."""
    return triu(x, int(unitriangular)) if upper else tril(x, -int(unitriangular))


@register(linalg.solve_triangular)
class SolveTriangular(Function):
    """X = A^-1 B (or B A^-1), A triangular  ->  dB = A^-T G (G A^-T), dA = triangle of (-dB X^T) (or -X^T dB)"""

    @staticmethod
    def forward(ctx, A, B, *, upper, left=True, unitriangular=False):
        real_only("torch.linalg.solve_triangular", A, B)
        x = linalg.solve_triangular(A, B, upper=upper, left=left, unitriangular=unitriangular)
        ctx.options = upper, left, unitriangular
        ctx.save_for_backward(A, x)
        return x

    @staticmethod
    def backward(ctx, g):
        a, x = ctx.saved_tensors
        upper, left, unitriangular = ctx.options

        def solve_transposed(g):
            return linalg.solve_triangular(a.mT, g, upper=not upper, left=left, unitriangular=unitriangular)

        grad_a, grad_b = solved_grads(g, x, solve_transposed, left, ctx.needs_input_grad)
        return None if grad_a is None else triangle_of(grad_a, upper, unitriangular), grad_b


@register(torch.triangular_solve, T.triangular_solve)
class TriangularSolve(Function):
    """op(A) X = b, A' = copy of A  ->  db = op(A)^-T G, dA = triangle of op^T(-db X^T) + g_A';
    op = transpose or not"""

    @staticmethod
    def forward(ctx, b, A, upper=True, transpose=False, unitriangular=False):
        real_only("torch.triangular_solve", b, A)
        out = torch.triangular_solve(b, A, upper, transpose, unitriangular)
        ctx.options = upper, transpose, unitriangular
        ctx.save_for_backward(A, out.solution)
        return out

    @staticmethod
    def backward(ctx, g, g_copy):
        a, x = ctx.saved_tensors
        upper, transpose, unitriangular = ctx.options
        op_a = a.mT if transpose else a
        grad_b = linalg.solve_triangular(op_a.mT, g, upper=upper == transpose, unitriangular=unitriangular)
        grad_a = None
        if ctx.needs_input_grad[1]:
            grad_op_a = -(grad_b @ x.mT)
            grad_a = triangle_of(grad_op_a.mT if transpose else grad_op_a, upper, unitriangular) + g_copy
        return grad_b, grad_a


# ----------------------------------------------------------------------------------------------------------------
# LU: A = P L U, L unit lower triangular (m x k), U upper triangular (k x n), k = min(m, n)

def lu_parts(lu: torch.Tensor) -> tuple:
    """L and U out of the packed LU matrix (masks: the ops keep their gradients)."""
    m, n = lu.shape[-2:]
    k = min(m, n)
    lower = tril(lu[..., :, :k], -1) + eye(m, k, lu)
    return lower, triu(lu[..., :k, :])


def lu_grad(p: Optional[torch.Tensor], lower: torch.Tensor, upper: torch.Tensor, g_lower: torch.Tensor,
            g_upper: torch.Tensor) -> torch.Tensor:
    """dA of A = P L U from dL, dU:  square: dA = P L^-T (tril_-1(L^T gL) + triu(gU U^T)) U^-T (p None: P = I).

    Wide (m < n, U = [U1 U2]): U2 = L^-1 P^T A2 adds -gU2 U2^T to L^T gL, and dA2 = P L^-T gU2.
    Tall (m > n, L = [L1; L2]): L2 = B2 U^-1 adds -L2^T gL2 to gU U^T, and dB2 = gL2 U^-T (B = P^T A).
    """
    m, n = lower.shape[-2], upper.shape[-1]
    k = min(m, n)
    l1, u1 = lower[..., :k, :], upper[..., :, :k]
    core_l = l1.mT @ g_lower[..., :k, :]
    core_u = g_upper[..., :, :k] @ u1.mT
    if m < n:
        core_l = core_l - g_upper[..., :, k:] @ upper[..., :, k:].mT
    if m > n:
        core_u = core_u - lower[..., k:, :].mT @ g_lower[..., k:, :]
    core = tril(core_l, -1) + triu(core_u)
    if m < n:
        core = torch.cat([linalg.solve_triangular(u1.mT, core, upper=False, left=False), g_upper[..., :, k:]], -1)
        grad = linalg.solve_triangular(l1.mT, core, upper=True, unitriangular=True)
    else:
        core = linalg.solve_triangular(l1.mT, core, upper=True, unitriangular=True)
        grad = linalg.solve_triangular(u1.mT, torch.cat([core, g_lower[..., k:, :]], -2), upper=False, left=False)
    return grad if p is None else p @ grad


def permutation(lu: torch.Tensor, pivots: torch.Tensor) -> torch.Tensor:
    """P of A = P L U as a constant matrix (it is piecewise constant in A: nothing to record)."""
    with torch.no_grad():
        return torch.lu_unpack(lu, pivots, unpack_data=False)[0]


def packed_lu_grad(p: torch.Tensor, lu: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Packed LU = (L - I) + U  ->  dL = strictly lower part of g, dU = upper part of g."""
    k = min(lu.shape[-2:])
    lower, upper = lu_parts(lu)
    return lu_grad(p, lower, upper, tril(g[..., :, :k], -1), triu(g[..., :k, :]))


@register(linalg.lu_factor)
class LuFactor(Function):
    """(LU, pivots) = lu_factor(A), A = P L U packed  ->  dA = P L^-T (tril_-1(L^T gL) + triu(gU U^T)) U^-T"""

    name = "torch.linalg.lu_factor"

    @staticmethod
    def forward(ctx, A, *args, **kwargs):
        real_only(ctx._rule.name, A)
        out = ctx._rule.factor(A, *args, **kwargs)
        ctx.save_for_backward(out[0], permutation(out[0], out[1]))
        return out

    factor = staticmethod(linalg.lu_factor)

    @staticmethod
    def backward(ctx, g, *_):
        lu, p = ctx.saved_tensors
        return packed_lu_grad(p, lu, g)


@register(linalg.lu_factor_ex)
class LuFactorEx(LuFactor):
    """(LU, pivots, info) = lu_factor_ex(A)  ->  as lu_factor: dA = P L^-T (tril_-1(L^T gL) + triu(gU U^T)) U^-T;
    A = P L U, packed into LU and pivots"""

    name, factor = "torch.linalg.lu_factor_ex", staticmethod(linalg.lu_factor_ex)


@register(torch.lu, T.lu)
class LegacyLu(LuFactor):
    """(LU, pivots[, infos]) = torch.lu(A)  ->  as lu_factor: dA = P L^-T (tril_-1(L^T gL) + triu(gU U^T)) U^-T;
    A = P L U, packed into LU and pivots"""

    name = "torch.lu"

    @staticmethod
    def factor(A, pivot=True, get_infos=False, out=None):
        out = linalg.lu_factor_ex(A, pivot=pivot, check_errors=not get_infos)
        return tuple(out) if get_infos else tuple(out[:2])


@register(linalg.lu)
class Lu(Function):
    """(P, L, U) = lu(A)  ->  dA = P L^-T (tril_-1(L^T gL) + triu(gU U^T)) U^-T   (+ wide/tall terms; P: none)"""

    @staticmethod
    def forward(ctx, A, *, pivot=True):
        real_only("torch.linalg.lu", A)
        out = linalg.lu(A, pivot=pivot)
        ctx.save_for_backward(out.P if pivot else None, out.L, out.U)  # pivot=False (CUDA only): P is empty, A = L U
        ctx.mark_non_differentiable(out.P)  # a permutation: a constant, as torch marks it
        return out

    @staticmethod
    def backward(ctx, g_p, g_lower, g_upper):
        p, lower, upper = ctx.saved_tensors
        return lu_grad(p, lower, upper, tril(g_lower, -1), triu(g_upper))


@register(torch.lu_unpack)
class LuUnpack(Function):
    """(P, L, U) = lu_unpack(LU, pivots): L = tril_-1(LU) + I, U = triu(LU)  ->  dLU = tril_-1(gL) + triu(gU)"""

    @staticmethod
    def forward(ctx, LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
        real_only("torch.lu_unpack", LU_data)
        ctx.shape = LU_data.shape
        out = torch.lu_unpack(LU_data, LU_pivots, unpack_data, unpack_pivots)
        ctx.mark_non_differentiable(out.P)  # a permutation: a constant, as torch marks it
        return out

    @staticmethod
    def backward(ctx, g_p, g_lower, g_upper):
        m, n = ctx.shape[-2:]
        grad = g_lower.new_zeros(ctx.shape)
        if g_lower.numel():
            grad = grad + pad_to(tril(g_lower, -1), m, n)
        if g_upper.numel():
            grad = grad + pad_to(triu(g_upper), m, n)
        return grad, None


def pad_to(x: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """x (m' x n', m' <= m, n' <= n) in the top-left corner of zeros of shape (..., m, n)."""
    rows, cols = x.shape[-2:]
    if cols < n:
        x = torch.cat([x, x.new_zeros(x.shape[:-1] + (n - cols,))], -1)
    if rows < m:
        x = torch.cat([x, x.new_zeros(x.shape[:-2] + (m - rows, n))], -2)
    return x


def lu_solve_grads(ctx: Any, lu: torch.Tensor, pivots: torch.Tensor, x: torch.Tensor, g: torch.Tensor,
                   needs: Sequence[bool]) -> tuple:
    """X solves op(A) X = B or X op(A) = B with A = P L U  ->  (dLU, dB): dB solves the adjoint system; dA is
    -dB X^T, -X dB^T, -X^T dB or -dB^T X (by left/adjoint), then dL = tril_-1(P^T dA U^T), dU = triu(L^T P^T dA)."""
    left, adjoint = ctx.left, ctx.adjoint
    grad_b = linalg.lu_solve(lu, pivots, g, left=left, adjoint=not adjoint)
    grad_lu = None
    if needs[0]:
        if left:
            grad_a = -(x @ grad_b.mT) if adjoint else -(grad_b @ x.mT)
        else:
            grad_a = -(grad_b.mT @ x) if adjoint else -(x.mT @ grad_b)
        p = permutation(lu, pivots)
        lower, upper = lu_parts(lu)
        grad_a = p.mT @ grad_a
        grad_lu = tril(grad_a @ upper.mT, -1) + triu(lower.mT @ grad_a)
    return grad_lu, grad_b if needs[1] else None


@register(linalg.lu_solve)
class LuSolve(Function):
    """X = A^-1 B, A = P L U given as (LU, pivots)  ->  dB = A^-T G, dA = -dB X^T, then dL, dU of A = P L U"""

    api = "torch.linalg.lu_solve"  # the name its errors give (the legacy spelling has its own)

    @staticmethod
    def forward(ctx, LU, pivots, B, *, left=True, adjoint=False):
        real_only(ctx._rule.api, LU, B)
        x = linalg.lu_solve(LU, pivots, B, left=left, adjoint=adjoint)
        ctx.left, ctx.adjoint = left, adjoint
        ctx.save_for_backward(LU, pivots, x)
        return x

    @staticmethod
    def backward(ctx, g):
        lu, pivots, x = ctx.saved_tensors
        grad_lu, grad_b = lu_solve_grads(ctx, lu, pivots, x, g, (ctx.needs_input_grad[0], ctx.needs_input_grad[2]))
        return grad_lu, None, grad_b


LegacyLuSolve = reordered("LegacyLuSolve", LuSolve, [torch.lu_solve, T.lu_solve], (1, 2, 0),  # (b, LU, pivots)
                          "X = torch.lu_solve(b, LU, pivots) = A^-1 b, A = P L U packed into (LU, pivots)  ->  "
                          "db = A^-T G, dA = -db X^T, then dL, dU of A = P L U")
LegacyLuSolve.api = "torch.lu_solve"


# ----------------------------------------------------------------------------------------------------------------
# given a Cholesky factor: A = L L^T (or U^T U with upper=True)

@register(torch.cholesky_solve, T.cholesky_solve)
class CholeskySolve(Function):
    """X = (L L^T)^-1 B  ->  dB = (L L^T)^-1 G, dL = -(dB X^T + X dB^T) L   (upper: dU = -U (dB X^T + X dB^T),
    U = L^T the upper factor given instead)"""

    @staticmethod
    def forward(ctx, B, L, upper=False):
        real_only("torch.cholesky_solve", B, L)
        x = torch.cholesky_solve(B, L, upper)
        ctx.upper = upper
        ctx.save_for_backward(L, x)
        return x

    @staticmethod
    def backward(ctx, g):
        factor, x = ctx.saved_tensors
        grad_b = torch.cholesky_solve(g, factor, ctx.upper)
        grad_factor = None
        if ctx.needs_input_grad[1]:
            common = grad_b @ x.mT
            common = common + common.mT
            grad_factor = -(factor @ common) if ctx.upper else -(common @ factor)
        return grad_b, grad_factor


@register(torch.cholesky_inverse, T.cholesky_inverse)
class CholeskyInverse(Function):
    """Y = (L L^T)^-1  ->  dL = -Y (G + G^T) Y L   (upper: dU = -U Y (G + G^T) Y, U = L^T the upper factor
    given instead)"""

    @staticmethod
    def forward(ctx, L, upper=False):
        real_only("torch.cholesky_inverse", L)
        y = torch.cholesky_inverse(L, upper)
        ctx.upper = upper
        ctx.save_for_backward(L, y)
        return y

    @staticmethod
    def backward(ctx, g):
        factor, y = ctx.saved_tensors
        common = y @ (g + g.mT) @ y
        return -(factor @ common) if ctx.upper else -(common @ factor)
