"""The eigenvalue density by stochastic Lanczos quadrature (SLQ; Ghorbani, Krishnan and Xiao, 2019).

The spectral density φ(t) = (1/n) Σ_i δ(t − λ_i) satisfies, for a random unit v (E[v vᵀ] = I/n),
E[vᵀ f(H) v] = ∫ f(t) φ(t) dt. Lanczos from q_1 = v gives T = S Θ Sᵀ, and the Gauss quadrature
vᵀ f(H) v ≈ Σ_j τ_j f(θ_j), with nodes θ_j (T's eigenvalues) and weights τ_j = (e_1ᵀ s_j)² that sum to 1.
Averaging over runs and smoothing each node with a Gaussian of width σ gives a density that integrates to 1:
φ_σ(t) = (1/runs) Σ_runs Σ_j τ_j N(t; θ_j, σ²).
"""
import math
from typing import Any, Optional

import torch


class Density:
    """SLQ's quadrature: `nodes` and `weights` (runs × m; each run's weights sum to 1), smoothed by `sigma`."""

    def __init__(self, nodes: torch.Tensor, weights: torch.Tensor, sigma: Optional[float] = None) -> None:
        self.nodes, self.weights = nodes, weights
        spread = float(nodes.max() - nodes.min())  # (all nodes equal, H = c I: a width relative to c instead)
        self.sigma = sigma if sigma is not None else max(spread, 1e-2 * float(nodes.abs().max()), 1e-12) / 100

    def grid(self, points: int = 1000) -> torch.Tensor:
        """t from 5σ below the smallest node to 5σ above the largest: the density's mass lies inside."""
        lo, hi = float(self.nodes.min()) - 5 * self.sigma, float(self.nodes.max()) + 5 * self.sigma
        return torch.linspace(lo, hi, points, dtype=self.nodes.dtype)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        """φ_σ(t) = (1/runs) Σ τ_j exp(−(t − θ_j)² / 2σ²) / (σ √(2π))."""
        gauss = torch.exp(-(t[:, None] - self.nodes.reshape(1, -1)) ** 2 / (2 * self.sigma ** 2))
        gauss = gauss / (self.sigma * (2 * math.pi) ** 0.5)
        return gauss @ self.weights.reshape(-1) / self.nodes.shape[0]

    def plot(self, ax: Any = None, log: bool = True) -> Any:
        """The smoothed density against t (log scale by default: the bulk near 0 and the few outliers both show)."""
        import matplotlib.pyplot as plt

        ax = ax or plt.subplots(figsize=(6, 3.5))[1]
        t = self.grid()
        values = self(t)
        floor = float(values.max()) * 1e-6 if log else 0.0  # a log scale shows six decades below the peak
        ax.plot(t.numpy(), values.clamp_min(floor).numpy(), color="tab:blue")
        if log:
            ax.set_yscale("log")
            ax.set_ylim(bottom=floor)
        ax.set_xlabel("eigenvalue")
        ax.set_ylabel("density")
        ax.set_title(f"Hessian eigenvalue density (SLQ, {self.nodes.shape[0]} runs, σ = {self.sigma:.2g})")
        return ax
