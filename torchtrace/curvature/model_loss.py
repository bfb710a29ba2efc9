"""The loss of a model on its data as a function of (some of) its parameters θ, as one flat vector.

L(θ) = Σ_b n_b L_b(θ) / Σ_b n_b over the batches b (n_b the batch's size: the first dimension of its first tensor,
wherever it sits in tuples, lists or dicts), so for a loss_fn that returns a batch mean, L is the mean loss over all
the data, and so are its gradient and Hessian: H v = Σ_b n_b H_b v / Σ_b n_b. Random ops inside loss_fn (dropout in
train mode) draw the same numbers for a batch at every evaluation (its random state is fixed by the seed and the
batch's number), so L is one deterministic function and results repeat for a seed; the caller's random state is
left as it was. `module="layer3"` keeps only that sub-module's parameters: the Hessian is then
the diagonal block ∂²L/∂θ_layer3², the other parameters held where they are.
"""
import contextlib
import functools
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch

from torchtrace.autograd.grad_mode import no_grad
from torchtrace.autograd.plain import plain_torch
from torchtrace.curvature.hvp import METHODS, hvp_at
from torchtrace.curvature.progress import SILENT as _SILENT
from torchtrace.curvature.progress import progress
from torchtrace.forward.api import recording_on
from torchtrace.forward.transpose import plain
from torchtrace.tracer import tracer as TRACER

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


def _batches(data: Any) -> Sequence[Any]:
    """A tensor, tuple or dict is one batch; a list, a DataLoader or any re-iterable is a sequence of batches. A list
    of tensors that differ in dtype or in shape past the first dimension is one batch: a DataLoader's [x, y] (one
    whose tensors all agree is ambiguous: refused)."""
    if isinstance(data, (torch.Tensor, tuple, dict)) or _one_collated_batch(data):
        return [data]
    if isinstance(data, (str, bytes)) or not hasattr(data, "__iter__"):
        raise TypeError(f"data is a batch (a tensor, tuple or dict) or an iterable of batches, not "
                        f"{type(data).__name__}")
    if iter(data) is data:
        raise TypeError("data is an iterator (it can be walked only once, and each HVP walks it again): pass a "
                        "batch, a list of batches or a DataLoader")
    if hasattr(data, "__len__") and len(data) == 0:
        raise ValueError("data holds no batch: the loss is a mean over the batches, so it needs at least one")
    return data


def _one_collated_batch(data: Any) -> bool:
    """A list of tensors that differ in dtype or trailing shape is a DataLoader's batch [x, y]; one whose tensors all
    agree could be that batch or a list of one-tensor batches, and a wrong guess gives another loss: refused."""
    if type(data) is not list or len(data) < 2 or not all(isinstance(t, torch.Tensor) for t in data):
        return False
    if len({(t.dtype, tuple(t.shape[1:])) for t in data}) > 1:
        return True
    raise ValueError(f"data is a list of {len(data)} tensors of one dtype and shape: it may be one DataLoader batch "
                     "[x, y] or a list of batches of one tensor each. Pass one batch as a tuple, tuple(data), or the "
                     "batches as a list of tuples, [(t,) for t in data] (loss_fn then receives each tuple)")


def _size(batch: Any) -> Optional[int]:
    """n_b: the first dimension of the batch's first tensor of at least one dimension (inside tuples, lists and dicts
    too); None when it holds none."""
    if isinstance(batch, torch.Tensor):
        return len(batch) if batch.dim() > 0 else None
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    return next((n for n in map(_size, items) if n is not None), None)


def _weights(batches: Sequence[Any]) -> Optional[List[int]]:
    """Each batch's n_b (None for a single batch: its weight does not matter); a batch without a tensor to tell
    its size from, among several, is refused (its weight in the mean would be a guess)."""
    if not hasattr(batches, "__len__") or len(batches) == 1:
        return None
    sizes = [_size(batch) for batch in batches]
    if None in sizes:
        raise ValueError(f"batch {sizes.index(None)} of data holds no tensor with a first dimension to tell its size: "
                         "the loss is the mean over the batches weighted by their sizes. Put the batch's tensors in "
                         "it, or pass one batch")
    return sizes


class ModelLoss:
    """L(θ) of `loss_fn(model, batch)` over `data`, θ the parameters of `model` (or of `model.<module>`) that
    require a gradient; `hvp`, `loss` and `gradient` take and give flat vectors of θ's dtype (the widest of the
    parameters' dtypes: each parameter's piece is cast to its own dtype where it is used)."""

    def __init__(self, loss_fn: LossFn, model: torch.nn.Module, data: Any, module: Optional[str] = None,
                 show_progress: Optional[bool] = None, method: str = "forward-over-reverse", seed: int = 0,
                 tool: str = "tt.spectrum") -> None:
        if not callable(loss_fn):
            raise TypeError(f"{tool}: loss_fn(model, batch) returns the loss of a batch; got {type(loss_fn).__name__}")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{tool}: model must be a torch.nn.Module (ported, or made of tt.nn layers), not "
                            f"{type(model).__name__}")
        if module is not None and not isinstance(module, str):
            raise TypeError(f"{tool}: module names a sub-module by its dotted path (\"layer3\", \"blocks.0\"), "
                            f"not {module!r}")
        if method not in METHODS:
            raise ValueError(f"{tool}: hvp_method must be one of {METHODS}, not {method!r}")
        self.loss_fn, self.model, self.batches = loss_fn, model, _batches(data)
        self.sizes = _weights(self.batches)
        self.show_progress, self.method, self.seed, self.tool = show_progress, method, seed, tool
        self._bar = _SILENT
        try:
            owner = model.get_submodule(module) if module else model
        except AttributeError as error:
            raise ValueError(f"{tool}: module={module!r} names no sub-module of the model ({error})") from None
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
        """Each batch and its weight n_b, its random state fixed: random ops in loss_fn (dropout) draw the same
        numbers for a batch at every evaluation, so H is the Hessian of one function (the loss with those masks) and
        results repeat for a seed; the caller's random state is left as it was."""
        devices = sorted({p.device.index or 0 for p in self.params if p.device.type == "cuda"})
        for number, batch in enumerate(self.batches):
            with torch.random.fork_rng(devices=devices):
                torch.random.default_generator.manual_seed(self.seed * 1_000_003 + number)
                for device in devices:
                    torch.cuda.default_generators[device].manual_seed(self.seed * 1_000_003 + number)
                yield batch, 1 if self.sizes is None else self.sizes[number]
            self._bar.update(1)

    def _loss_of(self, batch: Any) -> torch.Tensor:
        value = self.loss_fn(self.model, batch)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"{self.tool}: loss_fn(model, batch) must return the batch's scalar loss; it returned "
                             f"{shape}")
        return value

    def hvp(self, v: torch.Tensor) -> torch.Tensor:
        """H v = Σ_b n_b H_b v / Σ_b n_b, one HVP per batch (v and the result flat)."""
        with plain_torch():
            if not isinstance(v, torch.Tensor) or v.shape != (self.numel,):
                raise ValueError(f"hvp takes a flat vector of the {self.numel} parameter elements, not "
                                 f"{tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}")
        vs = self.unflatten(v)
        total, count = None, 0
        with self.kept(), recording_on():  # (an HVP records, even inside the caller's no_grad or inference_mode)
            for number, (batch, n) in enumerate(self._passes()):
                products, passes = hvp_at(lambda: self._loss_of(batch), self.params, vs, self.method, "loss_fn")
                with plain_torch():
                    flat = self.flatten(products) * n
                    if not bool(flat.isfinite().all()):  # (eigh / the estimates would fail or mean nothing)
                        raise ValueError(f"{self.tool}: the Hessian-vector product on batch {number} is not finite "
                                         f"(its loss is {float(plain(passes.loss)):.6g}): look for NaN or inf in that "
                                         "batch, in the parameters, or a loss that overflows (tt.detect_anomaly() "
                                         "names the op)")
                    total = flat if total is None else total + flat
                count += n
        with plain_torch():
            return total / count

    def loss(self) -> float:
        """L(θ) at the parameters' current values, without recording anything."""
        total, count = 0.0, 0
        with no_grad():
            for batch, n in self._passes():
                total += float(plain(self._loss_of(batch))) * n
                count += n
        return total / count
