"""tt.landscape: the loss along one or two directions through the trained parameters θ*,
L(α) = L(θ* + α d) or L(α, β) = L(θ* + α d₁ + β d₂), on a grid of α, β in [−span, span].

Directions:
- "filter-normalized" (Li, Xu, Taylor, Studer and Goldstein, 2018): d ~ N(0, I), then each filter of each weight
  (a slice along its first dimension: a row of a Linear's weight, an output channel of a Conv) is rescaled to the
  norm of the same filter of θ*: d_f ← d_f ‖θ*_f‖ / ‖d_f‖. Scale-invariant layers (ReLU networks with BatchNorm)
  then give comparable pictures. Biases and other 1-D parameters get d = 0 (the paper's choice of ignoring them).
- "eigen": the top eigenvectors of the Hessian (tt.spectrum), unit vectors: along them the loss curves most.
- or the directions themselves: a list of flat vectors or of per-parameter tuples.
A training path (checkpoints) is drawn by least-squares coordinates: c = argmin ‖D c − (θ_t − θ*)‖, D = [d₁ d₂].
"""
import itertools
from typing import Any, List, Optional, Sequence, Union

import torch

from torchtrace.argument_checks import count, integer, positive
from torchtrace.autograd.grad_mode import no_grad
from torchtrace.autograd.plain import plain_torch
from torchtrace.curvature.model_loss import LossFn, ModelLoss
from torchtrace.curvature.spectrum import spectrum
from torchtrace.forward.transpose import plain

DIRECTIONS = ("filter-normalized", "eigen")


def filter_normalized(loss: ModelLoss, generator: torch.Generator) -> torch.Tensor:
    """A random direction, each filter scaled to its parameter filter's norm; 1-D parameters get 0 (flat)."""
    parts = []
    for p in loss.params:
        with plain_torch():
            theta = plain(p)
        if theta.dim() <= 1:
            parts.append(torch.zeros_like(theta))
            continue
        d = torch.randn(theta.shape, generator=generator, dtype=theta.dtype)
        d_rows, theta_rows = d.reshape(len(d), -1), theta.reshape(len(theta), -1)
        scale = theta_rows.norm(dim=1, keepdim=True) / d_rows.norm(dim=1, keepdim=True).clamp_min(1e-30)
        parts.append((d_rows * scale).reshape(theta.shape))
    return loss.flatten(parts)


class Landscape:
    """`losses` (steps, or steps × steps: losses[i, j] at alphas[i] along d₁ and alphas[j] along d₂), `alphas`,
    `directions` (one tuple of per-parameter tensors per direction) and `names` of the parameters moved."""

    def __init__(self, loss: ModelLoss, origin: torch.Tensor, flat_directions: torch.Tensor, alphas: torch.Tensor,
                 losses: torch.Tensor, kind: str) -> None:
        self._loss, self._origin, self._flat, self.alphas, self.losses = loss, origin, flat_directions, alphas, losses
        self.kind, self.names = kind, loss.names
        self.directions = [loss.unflatten(d) for d in flat_directions]

    def _flat_point(self, checkpoint: Any) -> torch.Tensor:
        if isinstance(checkpoint, dict):
            missing = [n for n in self.names if n not in checkpoint]
            if missing:
                raise KeyError(f"checkpoint has no {missing[0]}: pass model.state_dict() copies (or parameter lists)")
            checkpoint = tuple(checkpoint[n] for n in self.names)
        return _flat_vector(checkpoint, self._loss, "checkpoint")

    def project(self, path: Sequence[Any]) -> torch.Tensor:
        """The coordinates (points × directions) of checkpoints (state dicts, parameter lists or flat vectors):
        least squares c = argmin ‖D c − (θ_t − θ*)‖."""
        if not isinstance(path, (list, tuple)) or len(path) == 0:
            raise ValueError("project takes a list of the checkpoints to place on the landscape (state dicts, "
                             f"parameter lists or flat vectors): at least one, not {path!r:.60}")
        offsets = torch.stack([self._flat_point(c) - self._origin for c in path])
        return torch.linalg.lstsq(self._flat.T, offsets.T).solution.T

    def plot(self, path: Optional[Sequence[Any]] = None, ax: Any = None, levels: int = 30) -> Any:
        """1-D: the loss curve; 2-D: its contours, with the training path projected on it when given."""
        import matplotlib.pyplot as plt
        import numpy as np

        ax = ax or plt.subplots(figsize=(5.5, 4.5) if self.losses.dim() == 2 else (6, 3.5))[1]
        a = self.alphas.numpy()
        one = self.losses.dim() == 1
        if self.kind == "eigen":
            title = "loss along the top eigenvector" + ("" if one else "s")
        else:
            title = f"loss along {'a' if one else 'two'} {self.kind} direction{'' if one else 's'}"
        if self.losses.dim() == 1:
            ax.plot(a, self.losses.numpy(), color="tab:blue")
            ax.set_xlabel("α")
            ax.set_ylabel("loss")
            if path is not None:  # each checkpoint at its coordinate, on the curve (its loss off the line differs)
                coords = self.project(path)[:, 0]
                on_curve = torch.from_numpy(np.interp(coords.numpy(), a, self.losses.numpy()))
                ax.plot(coords.numpy(), on_curve.numpy(), "o-", color="tab:red", markersize=3, label="training path")
                ax.legend(fontsize=8)
            ax.set_title(title)
            return ax
        contours = ax.contour(a, a, self.losses.T.numpy(), levels=levels, cmap="viridis")
        ax.clabel(contours, fontsize=7, fmt="%.3g")
        ax.plot([0], [0], "k*", markersize=10, label="θ*")
        if path is not None:
            coords = self.project(path).numpy()
            ax.plot(coords[:, 0], coords[:, 1], "o-", color="tab:red", markersize=3, label="training path")
        ax.set_xlabel("α (direction 1)")
        ax.set_ylabel("β (direction 2)")
        ax.set_title(title)
        ax.legend(loc="upper right", fontsize=8)
        return ax


def _directions(directions: Union[str, List[Any]], loss: ModelLoss, dims: int, seed: int,
                loss_fn: LossFn, model: torch.nn.Module, data: Any, module: Optional[str]) -> torch.Tensor:
    if isinstance(directions, str):
        if directions not in DIRECTIONS:
            raise ValueError(f"tt.landscape: directions must be one of {DIRECTIONS} or a list of directions, "
                             f"not {directions!r}")
        if directions == "eigen":
            if dims > loss.numel:
                raise ValueError(f"tt.landscape: directions='eigen' with dims={dims} needs {dims} eigenvectors, and "
                                 f"the parameters moved have {loss.numel} element(s): use dims=1")
            return spectrum(loss_fn, model, data, k=dims, module=module, seed=seed,
                            progress=loss.show_progress).eigenvectors
        if all(len(shape) <= 1 for shape in loss.shapes):
            raise ValueError(f"tt.landscape: every parameter moved ({', '.join(loss.names)}) is 1-D, and "
                             "filter-normalized directions leave 1-D parameters still (0), so the landscape would be "
                             "flat: pass directions='eigen' or directions of your own")
        generator = torch.Generator().manual_seed(seed)
        return torch.stack([filter_normalized(loss, generator) for _ in range(dims)])
    if not isinstance(directions, (list, tuple)):
        raise TypeError(f"tt.landscape: directions is one of {DIRECTIONS} or a list of {dims} directions, not "
                        f"{type(directions).__name__}")
    if len(directions) != dims:
        raise ValueError(f"tt.landscape: {dims} dims need {dims} directions, got {len(directions)}")
    return torch.stack([_flat_vector(d, loss, "direction") for d in directions])


def _flat_vector(vector: Any, loss: ModelLoss, what: str) -> torch.Tensor:
    """A given direction (or checkpoint) as one flat vector: a flat tensor of one entry per parameter element, or one
    tensor per parameter, each of its parameter's shape."""
    if isinstance(vector, torch.Tensor):
        if vector.numel() != loss.numel:
            raise ValueError(f"tt.landscape: a flat {what} has one entry per parameter element ({loss.numel}), "
                             f"not {vector.numel()}")
        return plain(vector).reshape(-1).to(loss.dtype)
    if not isinstance(vector, (list, tuple)) or not all(isinstance(d, torch.Tensor) for d in vector):
        raise TypeError(f"tt.landscape: a {what} is a flat tensor or one tensor per parameter (a tuple), not "
                        f"{type(vector).__name__}")
    if len(vector) != len(loss.params):
        raise ValueError(f"tt.landscape: a {what} given per parameter has one tensor for each of the "
                         f"{len(loss.params)} parameters {loss.names}, not {len(vector)}")
    for name, d, shape in zip(loss.names, vector, loss.shapes):
        if d.shape != shape:
            raise ValueError(f"tt.landscape: the {what}'s piece for {name} has shape {tuple(d.shape)}, the "
                             f"parameter {tuple(shape)}")
    return loss.flatten(vector)


def landscape(loss_fn: LossFn, model: torch.nn.Module, data: Any, directions: Union[str, List[Any]] =
              "filter-normalized", steps: int = 21, span: float = 1.0, dims: int = 2, module: Optional[str] = None,
              progress: Optional[bool] = None, seed: int = 0) -> Landscape:
    """The loss of `loss_fn(model, batch)` over `data` on a line (dims=1) or a plane (dims=2) through the current
    parameters, `steps` points per axis from −span to span. The parameters (and buffers) are left as they were."""
    dims = count("tt.landscape", "dims", dims)
    if dims not in (1, 2):
        raise ValueError(f"tt.landscape: dims must be 1 or 2, not {dims}")
    steps = count("tt.landscape", "steps", steps, least=2)  # (one point would sit at −span, not at the parameters)
    span = positive("tt.landscape", "span", span)
    seed = integer("tt.landscape", "seed", seed)
    loss = ModelLoss(loss_fn, model, data, module, progress, seed=seed, tool="tt.landscape")
    origin = loss.flatten(loss.params)
    flat = _directions(directions, loss, dims, seed, loss_fn, model, data, module)
    alphas = torch.linspace(-span, span, steps, dtype=loss.dtype)
    losses = torch.zeros((steps,) * dims, dtype=torch.float64)
    with loss.kept(), loss.run("landscape", steps ** dims):
        for index in itertools.product(range(steps), repeat=dims):
            point = origin + sum(alphas[i] * flat[axis] for axis, i in enumerate(index))
            with no_grad(), plain_torch():
                for p, value in zip(loss.params, loss.unflatten(point)):
                    p.copy_(value)
            losses[index] = loss.loss()
    return Landscape(loss, origin, flat, alphas, losses, directions if isinstance(directions, str) else "given")
