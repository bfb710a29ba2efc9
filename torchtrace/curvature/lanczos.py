"""The Lanczos iteration with full reorthogonalisation: m products H q give a tridiagonal T = Qᵀ H Q whose
eigenvalues (Ritz values) approximate H's extreme eigenvalues first.

q_1 = v / ‖v‖; for j = 1..m: w = H q_j − β_{j−1} q_{j−1}, α_j = q_jᵀ w, w ← w − α_j q_j, then w ← w − Q (Qᵀ w)
twice (full reorthogonalisation: in floating point the q_j would otherwise lose orthogonality and repeat
eigenvalues), β_j = ‖w‖, q_{j+1} = w / β_j. T has α on its diagonal and β beside it. If T s = θ s, then
θ is a Ritz value and Q s a Ritz vector; after m = n steps (exact arithmetic) they are H's eigenpairs.
When β_j vanishes (next to the largest |α| and β so far: the test scales with H), Q spans an invariant subspace
and its Ritz values are exact. A Krylov space holds each distinct eigenvalue once, so where `fresh` gives new random
vectors the iteration goes on from one orthogonal to Q (β_j = 0: T splits into blocks) and a repeated eigenvalue
appears as often as it occurs; without `fresh` it stops there.
"""
from typing import Callable, Optional, Tuple

import torch


def lanczos(matvec: Callable[[torch.Tensor], torch.Tensor], start: torch.Tensor, iterations: int,
            fresh: Optional[Callable[[], torch.Tensor]] = None,
            converged: Optional[Callable[[torch.Tensor, float], bool]] = None
            ) -> Tuple[torch.Tensor, torch.Tensor, float]:
    """(T, Q, β): the m×m tridiagonal matrix, the m×n orthonormal basis (rows q_j), m <= iterations, and β_m, the
    norm of what H q_m has outside Q (Ritz pair i's residual ‖H y_i − θ_i y_i‖ is β_m |s_mi|: `residuals`);
    `fresh()` gives a random vector to go on from where Q spans an invariant subspace (None: stop there);
    `converged(T, β)`, asked after each step, stops the iteration early when it says so."""
    n = start.numel()
    basis = torch.zeros(min(iterations, n), n, dtype=start.dtype)
    alphas, betas = [], []
    q, scale = start / start.norm(), 0.0
    for j in range(basis.shape[0]):
        basis[j] = q
        w = matvec(q)
        if j > 0:
            w = w - betas[-1] * basis[j - 1]
        alpha = torch.dot(q, w)
        w = w - alpha * q
        for _ in range(2):
            w = w - basis[: j + 1].T @ (basis[: j + 1] @ w)
        alphas.append(alpha)
        beta = w.norm()
        scale = max(scale, float(alpha.abs()), float(beta))
        if j + 1 == basis.shape[0] or (converged is not None and converged(_tridiagonal(alphas, betas), float(beta))):
            break
        if beta <= 1e-10 * scale:  # an invariant subspace (or H q = 0 throughout it)
            q = _orthogonal_to(basis[: j + 1], fresh) if fresh is not None else None
            if q is None:
                break
            beta = torch.zeros((), dtype=start.dtype)
        else:
            q = w / beta
        betas.append(beta)
    m = len(alphas)
    last = 0.0 if m == basis.shape[1] or beta <= 1e-10 * scale else float(beta)  # (Q spans all, or an invariant space)
    return _tridiagonal(alphas, betas), basis[:m], last


def _tridiagonal(alphas: list, betas: list) -> torch.Tensor:
    """T: the α_j on the diagonal, β_j beside it (the first m − 1 of them)."""
    m = len(alphas)
    tri = torch.diag(torch.stack(alphas))
    if m > 1:
        off = torch.stack(betas[: m - 1])
        tri = tri + torch.diag(off, 1) + torch.diag(off, -1)
    return tri


def residuals(beta: float, ritz_vectors_of_t: torch.Tensor) -> torch.Tensor:
    """‖H y_i − θ_i y_i‖ = β_m |s_mi| for each Ritz pair (s_i: T's eigenvector i, a column), free of HVPs."""
    return beta * ritz_vectors_of_t[-1].abs()


def ritz(tri: torch.Tensor, basis: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(θ, Q s, s): Ritz values from largest to smallest, their Ritz vectors (rows) and T's eigenvectors (columns)."""
    values, vectors = torch.linalg.eigh(tri)
    order = values.argsort(descending=True)
    values, vectors = values[order], vectors[:, order]
    return values, vectors.T @ basis, vectors


def _orthogonal_to(basis: torch.Tensor, fresh: Callable[[], torch.Tensor]) -> Optional[torch.Tensor]:
    """A unit vector orthogonal to the rows of `basis`, from a random one (None if none is left after a few tries)."""
    for _ in range(3):
        v = fresh().to(basis.dtype)
        for _ in range(2):
            v = v - basis.T @ (basis @ v)
        norm = v.norm()
        if norm > 1e-6 * max(1.0, float(v.abs().max())):
            return v / norm
    return None
