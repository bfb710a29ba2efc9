"""Power iteration with deflation: the k eigenvalues of largest magnitude, one after the other.

v ← H v / ‖H v‖ converges to the eigenvector of the largest |λ| at the rate |λ_2 / λ_1| per step, with
λ ≈ vᵀ H v (the Rayleigh quotient). For the next one, the ones found are deflated out:
H' v = H v − Σ_i λ_i u_i (u_iᵀ v). Slower than Lanczos (one eigenvalue at a time, no shared Krylov space), but
three lines and the method of many papers.
"""
from typing import Callable, Tuple

import torch


def power_iteration(matvec: Callable[[torch.Tensor], torch.Tensor], start: Callable[[], torch.Tensor], k: int,
                    iterations: int, tol: float = 1e-10) -> Tuple[torch.Tensor, torch.Tensor]:
    """(λ, U): k eigenvalues of largest magnitude (in the order found) and their unit eigenvectors (rows); each
    runs until the Rayleigh quotient changes by less than tol·|λ| or for `iterations` steps."""
    values, vectors = [], []
    for _ in range(k):
        v = start()
        v = v / v.norm()
        value = None
        for _ in range(iterations):
            w = matvec(v)
            for lam, u in zip(values, vectors):
                w = w - lam * u * torch.dot(u, v)
            new = torch.dot(v, w)
            v = w / w.norm()
            done = value is not None and abs(float(new - value)) <= tol * abs(float(new))
            value = new
            if done:
                break
        values.append(value)
        vectors.append(v)
    return torch.stack(values), torch.stack(vectors)
