"""Power iteration with deflation: the k eigenvalues of largest magnitude, one after the other.

v ← H v / ‖H v‖ converges to the eigenvector of the largest |λ| at the rate |λ_2 / λ_1| per step, with
λ ≈ vᵀ H v (the Rayleigh quotient). For the next one, the ones found are deflated out by projection:
H' v = P H v with P = I − Σ_i u_i u_iᵀ, and every start and iterate is kept orthogonal to the u_i (H is
symmetric, so their complement is invariant and H' has the other eigenvalues of H). Each runs until its residual
‖H' v − λ v‖ is below tol times the largest |λ| met: a steady λ alone is not enough, since v flips between the
eigenvectors of λ and −λ while their mixture's Rayleigh quotient stays put. Slower than Lanczos (one eigenvalue at
a time, no shared Krylov space), but a few lines and the method of many papers.
"""
from typing import Callable, List, Optional, Tuple

import torch


def power_iteration(matvec: Callable[[torch.Tensor], torch.Tensor], start: Callable[[], torch.Tensor], k: int,
                    iterations: int, tol: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(λ, U, r): k eigenvalues of largest magnitude (in the order found), their unit eigenvectors (rows) and residuals
    ‖H u − λ u‖. tol (default: the square root of the dtype's machine epsilon) is relative to the largest |λ|; an
    eigenvalue not converged after `iterations` steps raises (|λ_i| ≈ |λ_i+1|, or a ±λ pair)."""
    values: List[torch.Tensor] = []
    vectors: List[torch.Tensor] = []
    residuals: List[torch.Tensor] = []
    for i in range(k):
        v = _unit(_deflated(start(), vectors))
        tol = tol if tol is not None else torch.finfo(v.dtype).eps ** 0.5
        for _ in range(iterations):
            w = _deflated(matvec(v), vectors)
            value = torch.dot(v, w)
            residual = (w - value * v).norm()
            scale = max([abs(float(x)) for x in values] + [abs(float(value))])
            if residual <= tol * scale:  # (H' v = 0: v spans a null direction, λ = 0, residual 0)
                break
            v = _unit(w)
        else:
            raise RuntimeError(
                f"tt.spectrum: power iteration did not converge for eigenvalue {i + 1} in {iterations} steps "
                f"(residual ‖Hv − λv‖ = {float(residual):.3g} for λ ≈ {float(value):.6g}): two eigenvalues have "
                "(almost) the same magnitude, such as λ and −λ, and the iterate turns between their eigenvectors. Use "
                "method='lanczos' (the default), or pass more iterations=.")
        values.append(value)
        vectors.append(v)
        residuals.append(residual)
    return torch.stack(values), torch.stack(vectors), torch.stack(residuals)


def _deflated(v: torch.Tensor, found: List[torch.Tensor]) -> torch.Tensor:
    """P v: v without its components along the eigenvectors found (twice: once leaves rounding error behind)."""
    for _ in range(2 if found else 0):
        for u in found:
            v = v - torch.dot(u, v) * u
    return v


def _unit(v: torch.Tensor) -> torch.Tensor:
    norm = v.norm()
    return v / norm if norm > 0 else v
