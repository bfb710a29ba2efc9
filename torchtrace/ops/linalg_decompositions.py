"""Gradient rules for matrix decompositions: cholesky, qr, eigh / eigvalsh, svd / svdvals, pinv, lstsq.

Each backward differentiates the defining equations (A = L L^T, A = Q R with Q^T Q = I, A = V diag(w) V^T,
A = U S V^T) and projects onto what the factors can change (a triangle, skew-symmetric rotations). The results
are the standard ones (Giles 2008; Murray 2016 for Cholesky; Liao et al. 2019 for QR; PyTorch's
derivatives.yaml). Where a decomposition is not unique torch's conventions are followed: repeated eigenvalues or
singular values give inf/NaN gradients of the vectors (division by w_j - w_i), exactly as torch's.

A gradient that the engine fills with zeros (an output the loss never used) is detected, so that, as in torch,
a loss of the eigenvalues / singular values alone never divides by their differences.
Real matrices only.
"""
from typing import Any, Optional

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.ops.linalg_inverse import diag_embed, eye, real_only, tril

T = torch.Tensor
linalg = torch.linalg


def used(g: Optional[torch.Tensor]) -> bool:
    """Did the loss use this output? (the engine hands zeros for outputs that got no gradient)"""
    return g is not None and bool(g.any())


def sym(x: torch.Tensor) -> torch.Tensor:
    return (x + x.mT) / 2


def skew(x: torch.Tensor) -> torch.Tensor:
    return x - x.mT


def recorded_again(saved: tuple, recompute: Any) -> tuple:
    """Factors saved in forward are constants to the graph; with create_graph=True compute them again from the
    input (through their own rules), so second derivatives see how they depend on it."""
    return recompute() if torch.is_grad_enabled() else saved


# ----------------------------------------------------------------------------------------------------------------
# Cholesky

def cholesky_grad(factor: torch.Tensor, g: torch.Tensor, upper: bool) -> torch.Tensor:
    """A = L L^T  ->  dA = sym(L^-T Phi(L^T gL) L^-1), Phi = lower triangle with the diagonal halved."""
    lower, g_lower = (factor.mT, g.mT) if upper else (factor, g)
    phi = tril(lower.mT @ g_lower)
    phi = phi - diag_embed(phi.diagonal(0, -2, -1)) / 2
    grad = linalg.solve_triangular(lower.mT, phi, upper=True)
    grad = linalg.solve_triangular(lower, grad, upper=False, left=False)
    return sym(grad)


@register(linalg.cholesky, torch.cholesky, T.cholesky)
class Cholesky(Function):
    """A = L L^T (L lower; upper=True: A = U^T U)  ->  dA = sym(L^-T Phi(L^T gL) L^-1), Phi = tril, halved diagonal"""

    @staticmethod
    def forward(ctx, A, upper=False):
        real_only("torch.linalg.cholesky", A)
        factor = linalg.cholesky(A, upper=upper)
        ctx.upper = upper
        ctx.save_for_backward(factor)
        return factor

    @staticmethod
    def backward(ctx, g, *_):
        (factor,) = ctx.saved_tensors
        return cholesky_grad(factor, g, ctx.upper)


@register(linalg.cholesky_ex)
class CholeskyEx(Cholesky):
    """(L, info) = cholesky_ex(A), A = L L^T  ->  dA = sym(L^-T Phi(L^T gL) L^-1)   (info is an integer)"""

    @staticmethod
    def forward(ctx, A, *, upper=False, check_errors=False):
        real_only("torch.linalg.cholesky_ex", A)
        out = linalg.cholesky_ex(A, upper=upper, check_errors=check_errors)
        ctx.upper = upper
        ctx.save_for_backward(out.L)
        return out


# ----------------------------------------------------------------------------------------------------------------
# QR

def copyltu(m: torch.Tensor) -> torch.Tensor:
    """The symmetric matrix whose lower triangle is m's."""
    return tril(m) + tril(m, -1).mT


def qr_grad(q: torch.Tensor, r: torch.Tensor, g_q: torch.Tensor, g_r: torch.Tensor) -> torch.Tensor:
    """A = Q R (m >= n)  ->  dA = (gQ + Q copyltu(M)) R^-T, M = R gR^T - gQ^T Q.
    Wide (m < n), A = [X Y], R = [U V]: Y = Q V gives dY = Q gV, and X = Q U is square with gQ + Y gV^T."""
    m, n = q.shape[-2], r.shape[-1]
    if m < n:
        u, v, g_u, g_v = r[..., :, :m], r[..., :, m:], g_r[..., :, :m], g_r[..., :, m:]
        y = q @ v
        return torch.cat([qr_grad(q, u, g_q + y @ g_v.mT, g_u), q @ g_v], -1)
    m_ = r @ g_r.mT - g_q.mT @ q
    return linalg.solve_triangular(r.mT, g_q + q @ copyltu(m_), upper=False, left=False)


def qr_backward(ctx: Any, g_q: torch.Tensor, g_r: torch.Tensor) -> torch.Tensor:
    q, r = ctx.saved_tensors
    if ctx.mode == "r":
        raise UnsupportedOperationError(
            f"{ctx.api}: the derivative of mode='r' depends on Q, which that mode does not compute — use "
            "mode='reduced' if you are going to differentiate through it (as torch)")
    if ctx.mode == "complete" and q.shape[-2] > r.shape[-1]:
        raise UnsupportedOperationError(
            f"{ctx.api}: the QR decomposition is not differentiable when mode='complete' and nrows > ncols (as "
            "torch) — use mode='reduced'")
    return qr_grad(q, r, g_q, g_r)


@register(linalg.qr)
class Qr(Function):
    """A = Q R  ->  dA = (gQ + Q copyltu(R gR^T - gQ^T Q)) R^-T  (m >= n; a wide A is split as [X Y],
    X = its first m columns, Y = the rest)"""

    @staticmethod
    def forward(ctx, A, mode="reduced"):
        real_only("torch.linalg.qr", A)
        out = linalg.qr(A, mode)
        ctx.mode, ctx.api = mode, "torch.linalg.qr"
        ctx.save_for_backward(*out)
        return out

    backward = staticmethod(qr_backward)


@register(torch.qr, T.qr)
class LegacyQr(Function):
    """(Q, R) = torch.qr(A, some)  ->  dA = (gQ + Q copyltu(R gR^T - gQ^T Q)) R^-T, as linalg.qr in mode
    'reduced' if some else 'complete'"""

    @staticmethod
    def forward(ctx, A, some=True):
        real_only("torch.qr", A)
        out = torch.qr(A, some)
        ctx.mode, ctx.api = "reduced" if some else "complete", "torch.qr"
        ctx.save_for_backward(*out)
        return out

    backward = staticmethod(qr_backward)


# ----------------------------------------------------------------------------------------------------------------
# symmetric eigendecomposition

def eigh_grad(w: Optional[torch.Tensor], v: torch.Tensor, g_w: Optional[torch.Tensor],
              g_v: Optional[torch.Tensor]) -> torch.Tensor:
    """A = V diag(w) V^T  ->  dA = V (diag(gw) + skew(V^T gV) / 2 / E) V^T, E_ij = w_j - w_i (E_ii = 1)."""
    inner = diag_embed(g_w) if g_w is not None else torch.zeros_like(v)
    if used(g_v):
        gaps = w.unsqueeze(-2) - w.unsqueeze(-1)
        gaps = gaps + eye(w.shape[-1], None, w)
        inner = inner + skew(v.mT @ g_v) / 2 / gaps
    return v @ inner @ v.mT


@register(linalg.eigh)
class Eigh(Function):
    """(w, V) = eigh(A), A = V diag(w) V^T  ->  dA = V (diag(gw) + skew(V^T gV) / 2 / (w_j - w_i)) V^T"""

    @staticmethod
    def forward(ctx, A, UPLO="L"):
        real_only("torch.linalg.eigh", A)
        out = linalg.eigh(A, UPLO)
        ctx.save_for_backward(out.eigenvalues, out.eigenvectors)
        return out

    @staticmethod
    def backward(ctx, g_w, g_v):
        w, v = ctx.saved_tensors
        return eigh_grad(w, v, g_w, g_v)


@register(linalg.eigvalsh)
class Eigvalsh(Function):
    """w = eigvalsh(A), A = V diag(w) V^T  ->  dA = V diag(g) V^T"""

    @staticmethod
    def forward(ctx, A, UPLO="L"):
        real_only("torch.linalg.eigvalsh", A)
        w, v = linalg.eigh(A, UPLO)
        ctx.UPLO = UPLO
        ctx.save_for_backward(A, v)
        return w

    @staticmethod
    def backward(ctx, g):
        a, v = ctx.saved_tensors
        (v,) = recorded_again((v,), lambda: (linalg.eigh(a, ctx.UPLO).eigenvectors,))
        return eigh_grad(None, v, g, None)


# ----------------------------------------------------------------------------------------------------------------
# singular value decomposition

def svd_grad(u: torch.Tensor, s: torch.Tensor, vh: torch.Tensor, g_u: Optional[torch.Tensor],
             g_s: Optional[torch.Tensor], g_vh: Optional[torch.Tensor]) -> torch.Tensor:
    """A = U S V^T (reduced)  ->  dA = U [skew(U^T gU) S / E + S skew(V^T gV) / E + diag(gS)] V^T
    + (I - U U^T) gU S^-1 V^T + U S^-1 gV^T (I - V V^T),  E_ij = s_j^2 - s_i^2 (E_ii = 1)."""
    m, n = u.shape[-2], vh.shape[-1]
    g_u, g_vh = (g_u if used(g_u) else None), (g_vh if used(g_vh) else None)
    if g_u is None and g_vh is None:
        return (u * g_s.unsqueeze(-2)) @ vh
    squares = s * s
    gaps = squares.unsqueeze(-2) - squares.unsqueeze(-1)
    gaps = gaps + eye(s.shape[-1], None, s)
    inner = torch.zeros_like(gaps)
    if g_u is not None:
        inner = inner + skew(u.mT @ g_u) * s.unsqueeze(-2) / gaps
    if g_vh is not None:
        inner = inner + s.unsqueeze(-1) * skew(vh @ g_vh.mT) / gaps
    if g_s is not None:
        inner = inner + diag_embed(g_s)
    if m > n and g_u is not None:
        g_u_scaled = g_u / s.unsqueeze(-2)
        return (u @ inner + g_u_scaled - u @ (u.mT @ g_u_scaled)) @ vh
    if m < n and g_vh is not None:
        g_v_scaled = g_vh.mT / s.unsqueeze(-2)
        return u @ (inner @ vh + g_v_scaled.mT - (g_v_scaled.mT @ vh.mT) @ vh)
    return u @ inner @ vh


def reduced(u: torch.Tensor, s: torch.Tensor, vh: torch.Tensor) -> tuple:
    """The parts of a full SVD's U and V^T that multiply singular values (torch ignores the rest)."""
    k = s.shape[-1]
    return u[..., :, :k], vh[..., :k, :]


@register(linalg.svd)
class Svd(Function):
    """A = U S V^T  ->  dA = U [skew(U^T gU) S / E + S skew(V^T gV) / E + diag(gS)] V^T, E_ij = s_j^2 - s_i^2"""

    @staticmethod
    def forward(ctx, A, full_matrices=True, *, driver=None):
        real_only("torch.linalg.svd", A)
        out = linalg.svd(A, full_matrices, driver=driver)
        ctx.save_for_backward(*out)
        return out

    @staticmethod
    def backward(ctx, g_u, g_s, g_vh):
        u, s, vh = ctx.saved_tensors
        u, vh = reduced(u, s, vh)
        g_u, g_vh = reduced(g_u, s, g_vh)
        return svd_grad(u, s, vh, g_u, g_s, g_vh)


@register(torch.svd, T.svd)
class LegacySvd(Function):
    """(U, S, V) = torch.svd(A)  ->  dA = U [skew(U^T gU) S / E + S skew(V^T gV) / E + diag(gS)] V^T,
    E_ij = s_j^2 - s_i^2: linalg.svd's rule with gVh = gV^T (compute_uv=False: only S, dA = U diag(gS) V^T)"""

    @staticmethod
    def forward(ctx, A, some=True, compute_uv=True):
        real_only("torch.svd", A)
        ctx.compute_uv = compute_uv
        if not compute_uv:  # U and V are zeros: S's gradient needs the vectors, computed again in backward
            out = torch.svd(A, some, compute_uv)
            ctx.save_for_backward(A, out.S)
            return out
        u, s, vh = linalg.svd(A, full_matrices=not some)
        out = torch.return_types.svd((u, s, vh.mT))
        ctx.save_for_backward(*out)  # the outputs themselves, so create_graph sees how they depend on A
        return out

    @staticmethod
    def backward(ctx, g_u, g_s, g_v):
        if not ctx.compute_uv:
            a, s = ctx.saved_tensors
            u, _, vh = linalg.svd(a, full_matrices=False)
            return svd_grad(u, s, vh, None, g_s, None)
        u, s, v = ctx.saved_tensors
        u, vh = reduced(u, s, v.mT)
        g_u, g_vh = reduced(g_u, s, g_v.mT)
        return svd_grad(u, s, vh, g_u, g_s, g_vh)


@register(linalg.svdvals)
class Svdvals(Function):
    """s = svdvals(A), A = U S V^T  ->  dA = U diag(g) V^T"""

    @staticmethod
    def forward(ctx, A, *, driver=None):
        real_only("torch.linalg.svdvals", A)
        u, s, vh = linalg.svd(A, full_matrices=False, driver=driver)
        ctx.save_for_backward(A, u, vh)
        return s

    @staticmethod
    def backward(ctx, g):
        a, u, vh = ctx.saved_tensors
        u, vh = recorded_again((u, vh), lambda: linalg.svd(a, full_matrices=False)[::2])
        return (u * g.unsqueeze(-2)) @ vh


# ----------------------------------------------------------------------------------------------------------------
# pseudo-inverse and least squares

def pinv_grad(a: torch.Tensor, p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """P = A^+  ->  dA = -P^T G P^T + (I - A P) G^T P P^T + P^T P G^T (I - P A)   (Golub & Pereyra 1973)"""
    m, n = a.shape[-2:]
    first = -(p.mT @ g @ p.mT)
    left = g.mT @ (p @ p.mT)
    right = (p.mT @ p) @ g.mT
    return first + left - a @ (p @ left) + right - (right @ p) @ a if m <= n else \
        first + left - (a @ p) @ left + right - right @ (p @ a)


@register(linalg.pinv)
class Pinv(Function):
    """P = A^+  ->  dA = -P^T G P^T + (I - A P) G^T P P^T + P^T P G^T (I - P A)   (any atol/rtol/hermitian)"""

    @staticmethod
    def forward(ctx, A, rcond=None, hermitian=False, *, atol=None, rtol=None):
        real_only("torch.linalg.pinv", A)
        if rcond is not None:  # the older overload pinv(A, rcond, hermitian)
            p = linalg.pinv(A, rcond, hermitian)
        else:
            p = linalg.pinv(A, atol=atol, rtol=rtol, hermitian=hermitian)
        ctx.save_for_backward(A, p)
        return p

    @staticmethod
    def backward(ctx, g):
        a, p = ctx.saved_tensors
        return pinv_grad(a, p, g), None, None, None, None  # the tolerances are piecewise constant: no gradient


@register(torch.pinverse, T.pinverse)
class Pinverse(Pinv):
    """P = torch.pinverse(A, rcond) = A^+  ->  dA = -P^T G P^T + (I - A P) G^T P P^T + P^T P G^T (I - P A)"""

    @staticmethod
    def forward(ctx, A, rcond=1e-15):
        real_only("torch.pinverse", A)
        p = torch.pinverse(A, rcond)
        ctx.save_for_backward(A, p)
        return p

    @staticmethod
    def backward(ctx, g):
        a, p = ctx.saved_tensors
        return pinv_grad(a, p, g)


@register(linalg.lstsq)
class Lstsq(Function):
    """X = argmin |A X - B| = A^+ B  ->  dB = A^+^T G, dA = pinv backward of G B^T;  residuals r_j = |A x_j - b_j|^2
    (X is optimal, so dr/dX = 0)  ->  dA += 2 R diag(g_r) X^T, dB -= 2 R diag(g_r), R = A X - B"""

    @staticmethod
    def forward(ctx, A, B, rcond=None, *, driver=None):
        real_only("torch.linalg.lstsq", A, B)
        out = linalg.lstsq(A, B, rcond, driver=driver)
        ctx.vector = B.dim() == A.dim() - 1
        ctx.save_for_backward(A, B, out.solution)
        ctx.mark_non_differentiable(out.rank, out.singular_values)  # (as torch's: constants in a loss)
        return out

    @staticmethod
    def backward(ctx, g, g_residuals, g_rank, g_values):
        a, b, x = ctx.saved_tensors
        g, b, x = (t.unsqueeze(-1) for t in (g, b, x)) if ctx.vector else (g, b, x)
        p = linalg.pinv(a)
        grad_a = pinv_grad(a, p, g @ b.mT) if ctx.needs_input_grad[0] else None
        grad_b = p.mT @ g if ctx.needs_input_grad[1] else None
        if used(g_residuals):
            weighted = (a @ x - b) * g_residuals.unsqueeze(-2)  # column j of the residual scaled by g_r[j]
            grad_a = grad_a + 2 * weighted @ x.mT if grad_a is not None else None
            grad_b = grad_b - 2 * weighted if grad_b is not None else None
        if ctx.vector and grad_b is not None:
            grad_b = grad_b.squeeze(-1)
        return grad_a, grad_b
