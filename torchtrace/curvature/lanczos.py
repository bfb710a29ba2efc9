"""The Lanczos iteration with full reorthogonalisation: m products H q give a tridiagonal T = Qᵀ H Q whose
eigenvalues (Ritz values) approximate H's extreme eigenvalues first.

q_1 = v / ‖v‖; for j = 1..m: w = H q_j − β_{j−1} q_{j−1}, α_j = q_jᵀ w, w ← w − α_j q_j, then w ← w − Q (Qᵀ w)
twice (full reorthogonalisation: in floating point the q_j would otherwise lose orthogonality and repeat
eigenvalues), β_j = ‖w‖, q_{j+1} = w / β_j. T has α on its diagonal and β beside it. If T s = θ s, then
θ is a Ritz value and Q s a Ritz vector; after m = n steps (exact arithmetic) they are H's eigenpairs.
The iteration stops early when β_j vanishes: Q then spans an invariant subspace and its Ritz values are exact.
"""
from typing import Callable, Tuple

import torch


def lanczos(matvec: Callable[[torch.Tensor], torch.Tensor], start: torch.Tensor,
            iterations: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(T, Q): the m×m tridiagonal matrix and the m×n orthonormal basis (rows q_j), m <= iterations."""
    n = start.numel()
    basis = torch.zeros(min(iterations, n), n, dtype=start.dtype)
    alphas, betas = [], []
    q = start / start.norm()
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
        if j + 1 == basis.shape[0] or beta <= 1e-10 * max(1.0, float(alpha.abs())):
            break
        betas.append(beta)
        q = w / beta
    m = len(alphas)
    tri = torch.diag(torch.stack(alphas))
    if m > 1:
        off = torch.stack(betas[: m - 1])
        tri = tri + torch.diag(off, 1) + torch.diag(off, -1)
    return tri, basis[:m]


def ritz(tri: torch.Tensor, basis: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(θ, Q s, s): Ritz values from largest to smallest, their Ritz vectors (rows) and T's eigenvectors (columns)."""
    values, vectors = torch.linalg.eigh(tri)
    order = values.argsort(descending=True)
    values, vectors = values[order], vectors[:, order]
    return values, vectors.T @ basis, vectors
