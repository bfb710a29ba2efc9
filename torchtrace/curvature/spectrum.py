"""tt.spectrum: the top eigenvalues and eigenvectors of a model's loss Hessian, its trace and its density, from
Hessian-vector products only (the Hessian itself is never formed: n² numbers for n parameters).

- Lanczos (lanczos.py, the default) or power iteration (power.py): the top k;
- Spectrum.trace: Hutchinson's estimator with its standard error (hutchinson.py);
- Spectrum.density: stochastic Lanczos quadrature (density.py).
"""
import warnings
from typing import Any, List, Optional, Tuple

import torch

from torchtrace.argument_checks import count, integer, positive
from torchtrace.curvature.density import Density
from torchtrace.curvature.hutchinson import Estimate, hutchinson, rademacher
from torchtrace.curvature.lanczos import lanczos, residuals, ritz
from torchtrace.curvature.model_loss import LossFn, ModelLoss
from torchtrace.curvature.power import power_iteration


class Spectrum:
    """The top-k eigenpairs of H = ∇²L(θ): `eigenvalues` (largest first), `eigenvectors` (k × n rows, unit norm,
    over the parameters `names` flattened in that order); `vector(i)` is eigenvector i shaped like the parameters.
    `trace()` and `density()` estimate the rest of the spectrum; `hvp(v)` is H v on flat vectors."""

    def __init__(self, loss: ModelLoss, eigenvalues: torch.Tensor, eigenvectors: torch.Tensor, residuals: torch.Tensor,
                 seed: int) -> None:
        self._loss, self.eigenvalues, self.eigenvectors, self.seed = loss, eigenvalues, eigenvectors, seed
        self.residuals = residuals  # ‖H u_i − λ_i u_i‖ per pair: an eigenvalue of H lies within it of λ_i
        self.names: List[str] = loss.names

    def __repr__(self) -> str:
        values = ", ".join(f"{float(v):.6g}" for v in self.eigenvalues)
        return f"Spectrum(top {len(self.eigenvalues)} of {self._loss.numel} parameters: [{values}])"

    def vector(self, i: int) -> Tuple[torch.Tensor, ...]:
        """Eigenvector i as one tensor per parameter (of `names`), each shaped like it."""
        k = len(self.eigenvalues)
        if isinstance(i, bool) or not isinstance(i, int) or not -k <= i < k:
            raise IndexError(f"vector(i): i counts the {k} eigenvectors found (0 = the largest), not {i!r}")
        return self._loss.unflatten(self.eigenvectors[i])

    def hvp(self, v: torch.Tensor) -> torch.Tensor:
        """H v for a flat v over the parameters `names` (one HVP per batch, weighted by batch size)."""
        return self._loss.hvp(v)

    def _generator(self, offset: int) -> torch.Generator:
        """A generator of its own per estimate, so trace() and density() repeat exactly for a seed."""
        return torch.Generator().manual_seed(self.seed + offset)

    def trace(self, samples: int = 100) -> Estimate:
        """tr H by Hutchinson: `.value` ± `.stderr` from `samples` Rademacher probes (one HVP each)."""
        samples = count("trace", "samples", samples)
        with self._loss.run("trace", samples):
            return hutchinson(self._loss.hvp, self._loss.numel, self._loss.dtype, samples, self._generator(1))

    def density(self, iterations: int = 50, runs: int = 3, sigma: Optional[float] = None) -> Density:
        """The eigenvalue density by SLQ: `runs` Lanczos runs of `iterations` steps from random unit vectors."""
        iterations, runs = count("density", "iterations", iterations), count("density", "runs", runs)
        iterations = min(iterations, self._loss.numel)  # (a Krylov space of n parameters has at most n dimensions)
        sigma = None if sigma is None else positive("density", "sigma", sigma)
        nodes, weights = [], []
        generator = self._generator(2)
        with self._loss.run("density", runs * iterations):
            for _ in range(runs):
                tri, basis, _ = lanczos(self._loss.hvp, rademacher(self._loss.numel, self._loss.dtype, generator),
                                        iterations)
                values, _, vectors = ritz(tri, basis)
                padded = torch.zeros(iterations, dtype=values.dtype)  # an early stop leaves zero weights
                nodes.append(torch.cat([values, padded[len(values):] + values[-1]]))
                weights.append(torch.cat([vectors[0] ** 2, padded[len(values):]]))
        return Density(torch.stack(nodes), torch.stack(weights), sigma)


def spectrum(loss_fn: LossFn, model: torch.nn.Module, data: Any, k: int = 5, method: str = "lanczos",
             iterations: Optional[int] = None, module: Optional[str] = None, progress: Optional[bool] = None,
             seed: int = 0, hvp_method: str = "forward-over-reverse") -> Spectrum:
    """The top-k eigenvalues and eigenvectors of the Hessian of L(θ) = mean over `data` of loss_fn(model, batch).

    method="lanczos": Lanczos steps with full reorthogonalisation from a random start (and from a new one orthogonal
    to the others wherever the Krylov space closes, so repeated eigenvalues come back as often as they occur); the k
    largest Ritz values (largest first). By default it runs until the k Ritz pairs have converged (each residual
    ‖H u − λ u‖ below √ε times the largest |λ|, ε the dtype's machine epsilon), at most n steps, and warns if that
    takes more than 10 (max(2k, 20) + k); `iterations=m` runs exactly m steps (at most n). method="power": power
    iteration with deflation, up to `iterations` (default 1000) steps per eigenvalue until its residual is as
    small: the k of largest magnitude, in the order found (it raises where it cannot converge: λ and −λ).
    `residuals` holds each pair's residual. module="layer3": the block of model.layer3's parameters only. `data` is
    one batch or an iterable of batches; the model's parameters and buffers are left as they were.
    """
    if method not in ("lanczos", "power"):
        raise ValueError(f"tt.spectrum: method must be 'lanczos' or 'power', not {method!r}")
    k = count("tt.spectrum", "k", k)
    iterations = None if iterations is None else count("tt.spectrum", "iterations", iterations)
    seed = integer("tt.spectrum", "seed", seed)
    loss = ModelLoss(loss_fn, model, data, module, progress, hvp_method, seed)
    if k > loss.numel:
        raise ValueError(f"tt.spectrum: k must be between 1 and the {loss.numel} parameters, not {k}")
    generator = torch.Generator().manual_seed(seed)
    start = lambda: torch.randn(loss.numel, generator=generator, dtype=loss.dtype)  # noqa: E731
    if method == "lanczos":
        if iterations is not None and iterations < k:
            raise ValueError(f"tt.spectrum: {iterations} Lanczos iterations give at most {iterations} eigenvalues, "
                             f"not k = {k}: pass iterations >= k")
        values, vectors, residual = _top_by_lanczos(loss, k, iterations, start)
    else:
        steps = iterations or 1000
        with loss.run("power iteration", k * steps):
            values, vectors, residual = power_iteration(loss.hvp, start, k, steps)
    vectors = vectors / vectors.norm(dim=1, keepdim=True)
    return Spectrum(loss, values, vectors, residual, seed)


def _top_by_lanczos(loss: ModelLoss, k: int, iterations: Optional[int],
                    start: Any) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The k largest Ritz values, their vectors and residuals: after `iterations` steps, or (None) once converged."""
    tol = torch.finfo(loss.dtype).eps ** 0.5
    usual = max(2 * k, 20) + k
    if iterations is not None:
        steps, converged = min(loss.numel, iterations), None
    else:
        steps = loss.numel

        def converged(tri: torch.Tensor, beta: float) -> bool:
            if len(tri) < usual and len(tri) < loss.numel:
                return False
            theta, s = torch.linalg.eigh(tri)
            top = theta.abs().max()
            order = theta.argsort(descending=True)[:k]
            return len(order) == k and bool((residuals(beta, s[:, order]) <= tol * top).all())
    with loss.run("Lanczos", steps if converged is None else min(steps, usual)):
        tri, basis, beta = lanczos(loss.hvp, start(), steps, fresh=start, converged=converged)
    values, vectors, of_t = ritz(tri, basis)
    values, vectors, residual = values[:k], vectors[:k], residuals(beta, of_t[:, :k])
    if iterations is None and len(tri) > 10 * usual:
        warnings.warn(f"tt.spectrum: the top {k} eigenpairs took {len(tri)} Lanczos steps to converge (their "
                      f"eigenvalues are close together); pass iterations= to choose the number of steps", stacklevel=3)
    return values, vectors, residual
