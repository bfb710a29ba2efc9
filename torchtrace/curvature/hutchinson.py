"""Hutchinson's trace estimator: tr H = E[vᵀ H v] for any random v with E[v vᵀ] = I.

With v Rademacher (each entry ±1 with probability 1/2), the m samples x_i = v_iᵀ H v_i give the estimate
x̄ = (1/m) Σ x_i, and its standard error s / √m, s² = Σ (x_i − x̄)² / (m − 1). Its variance is
2 (‖H‖_F² − Σ_i H_ii²) / m: small when H is nearly diagonal.
"""
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class Estimate:
    """A Monte Carlo estimate: `value`, its standard error `stderr`, from `samples` samples."""

    value: float
    stderr: float
    samples: int

    def __repr__(self) -> str:
        return f"Estimate({self.value:.6g} ± {self.stderr:.2g}, {self.samples} samples)"


def rademacher(n: int, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """n independent entries, each −1 or +1 with probability 1/2: the signs of standard normal draws."""
    return torch.randn(n, generator=generator, dtype=dtype).sign()


def hutchinson(matvec: Callable[[torch.Tensor], torch.Tensor], n: int, dtype: torch.dtype, samples: int,
               generator: torch.Generator) -> Estimate:
    """tr H from `samples` Rademacher probes vᵀ H v (samples >= 2, for the standard error)."""
    if samples < 2:
        raise ValueError("Hutchinson's estimator needs samples >= 2 for a standard error")
    xs = torch.stack([torch.dot(v, matvec(v)) for v in (rademacher(n, dtype, generator) for _ in range(samples))])
    return Estimate(float(xs.mean()), float(xs.std() / samples ** 0.5), samples)
