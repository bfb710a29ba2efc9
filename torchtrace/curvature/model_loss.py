"""The loss of a model on its data as a function of (some of) its parameters θ, as one flat vector.

L(θ) = Σ_b n_b L_b(θ) / Σ_b n_b over the batches b (n_b the batch's size, its first dimension), so for a loss_fn
that returns a batch mean, L is the mean loss over all the data, and so are its gradient and Hessian:
H v = Σ_b n_b H_b v / Σ_b n_b. `module="layer3"` keeps only that sub-module's parameters: the Hessian is then
the diagonal block ∂²L/∂θ_layer3², the other parameters held where they are.
"""
import contextlib
import functools
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch

from torchtrace.autograd.grad_mode import no_grad
from torchtrace.autograd.plain import plain_torch
from torchtrace.curvature.hvp import hvp_at
from torchtrace.curvature.progress import SILENT as _SILENT
from torchtrace.curvature.progress import progress
from torchtrace.forward.transpose import plain
from torchtrace.tracer import tracer as TRACER

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


def _batches(data: Any) -> Sequence[Any]:
    """A tensor, tuple or dict is one batch; a list, a DataLoader or any re-iterable is a sequence of batches."""
    if isinstance(data, (torch.Tensor, tuple, dict)):
        return [data]
    if iter(data) is data:
        raise TypeError("data is an iterator (it can be walked only once, and each HVP walks it again): pass a "
                        "batch, a list of batches or a DataLoader")
    if hasattr(data, "__len__") and len(data) == 0:
        raise ValueError("data holds no batch: the loss is a mean over the batches, so it needs at least one")
    return data


def _size(batch: Any) -> int:
    first = batch if isinstance(batch, torch.Tensor) else (
        next(iter(batch.values())) if isinstance(batch, dict) else batch[0])
    return len(first) if isinstance(first, torch.Tensor) and first.dim() > 0 else 1


class ModelLoss:
    """L(θ) of `loss_fn(model, batch)` over `data`, θ the parameters of `model` (or of `model.<module>`) that
    require a gradient; `hvp`, `loss` and `gradient` take and give flat vectors of θ's dtype (the widest of the
    parameters' dtypes: each parameter's piece is cast to its own dtype where it is used)."""

    def __init__(self, loss_fn: LossFn, model: torch.nn.Module, data: Any, module: Optional[str] = None,
                 show_progress: Optional[bool] = None, method: str = "forward-over-reverse") -> None:
        self.loss_fn, self.model, self.batches = loss_fn, model, _batches(data)
        self.show_progress, self.method = show_progress, method
        self._bar = _SILENT
        owner = model.get_submodule(module) if module else model
        named = [(n, p) for n, p in owner.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(f"{'model.' + module if module else 'the model'} has no parameters that require grad")
        plain_params = [n for n, p in named if not isinstance(p, TRACER)]
        if plain_params:
            raise TypeError(f"parameter {plain_params[0]} is a plain torch tensor: port the model first "
                            "(model = tt.port(model)) or build it from tt.nn layers")
        self.names: List[str] = [f"{module}.{n}" if module else n for n, _ in named]
        self.params: List[torch.Tensor] = [p for _, p in named]
        self.shapes = [p.shape for p in self.params]
        self.numel = sum(p.numel() for p in self.params)
        with plain_torch():
            self.dtypes = [p.dtype for p in self.params]
        self.dtype = functools.reduce(torch.promote_types, self.dtypes)

    def flatten(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """One tensor per parameter -> one flat plain vector (θ's order and dtype)."""
        with plain_torch():
            return torch.cat([plain(t).reshape(-1).to(self.dtype) for t in tensors])

    def unflatten(self, flat: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """One tensor per parameter, each shaped like it and of its dtype (views of `flat` where the dtypes agree)."""
        with plain_torch():
            pieces = flat.split([p.numel() for p in self.params])
            return tuple(t.view(s).to(d) for t, s, d in zip(pieces, self.shapes, self.dtypes))

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        """Parameters and buffers (BatchNorm's running statistics, in train mode) are restored on the way out."""
        with plain_torch():
            saved = [(t, plain(t).clone()) for t in [*self.model.parameters(), *self.model.buffers()]]
        try:
            yield
        finally:
            with no_grad(), plain_torch():
                for t, value in saved:
                    t.copy_(value)

    @contextlib.contextmanager
    def run(self, what: str, passes: int) -> Iterator[None]:
        """A run of `passes` HVPs or losses over all the data: one progress bar for it (see progress.py)."""
        total = passes * len(self.batches) if hasattr(self.batches, "__len__") else passes
        with progress(total, what, self.show_progress) as self._bar:
            yield
        self._bar = _SILENT

    def _passes(self) -> Iterator[Tuple[Any, int]]:
        for batch in self.batches:
            yield batch, _size(batch)
            self._bar.update(1)

    def hvp(self, v: torch.Tensor) -> torch.Tensor:
        """H v = Σ_b n_b H_b v / Σ_b n_b, one HVP per batch (v and the result flat)."""
        vs = self.unflatten(v)
        total, count = None, 0
        with self.kept():
            for batch, n in self._passes():
                products, _ = hvp_at(lambda: self.loss_fn(self.model, batch), self.params, vs, self.method)
                with plain_torch():
                    flat = self.flatten(products) * n
                    total = flat if total is None else total + flat
                count += n
        with plain_torch():
            return total / count

    def loss(self) -> float:
        """L(θ) at the parameters' current values, without recording anything."""
        total, count = 0.0, 0
        with no_grad():
            for batch, n in self._passes():
                total += float(plain(self.loss_fn(self.model, batch))) * n
                count += n
        return total / count
