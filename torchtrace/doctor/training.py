"""tt.diagnose.training(model, optimizer): per-layer health over a training loop, a table, a plot and flags.

    with tt.diagnose.training(model, optimizer) as doc:
        for x, y in batches:
            ...; loss.backward(); optimizer.step()
    print(doc.table()); doc.plot("health.png"); doc.findings

Per layer (a module with its own parameters, or a parameter-free leaf module such as ReLU) and per
optimizer step: the gradient norm of its parameters, the update/weight ratio |w_after - w_before| / |w_before|
(read around optimizer.step()), the activation mean and standard deviation of its last forward, and its
dead-unit share (units whose output is exactly 0 for every example of the batch). Flags and their thresholds:
- "non-finite":        a gradient or weight stopped being finite;
- "large updates":     the median update/weight ratio is above UPDATE_RATIO_HIGH (healthy training sits near
                       1e-3; above 1e-1 each step rewrites a tenth of the weight: lower the learning rate);
- "growing gradients": the gradient norm grew by more than GROWTH_HIGH between the first and the largest step,
                       and the loss did not fall into that step (a layer behind one initialised small sees its
                       gradient grow with those weights while the loss falls: healthy);
- "dead units":        at the last step at least DEAD_SHARE of the units were 0 for every example;
- "diverging loss":    the loss (the scalar each step's backward starts from) rose at each of the last RISING_STEPS
                       steps or more, by more than LOSS_GROWTH_HIGH over them (the sign of a learning rate past
                       the stable range: the gradient and the update/weight ratio may still look ordinary).
"""
import contextlib
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional

import torch

from torchtrace.autograd.engine import BACKWARD_WATCHERS
from torchtrace.autograd.plain import plain_torch
from torchtrace.doctor.findings import Finding
from torchtrace.doctor.gates import unit_dim

UPDATE_RATIO_HIGH = 1e-1
GROWTH_HIGH = 1e3
DEAD_SHARE = 0.9
RISING_STEPS = 5
LOSS_GROWTH_HIGH = 10.0
FLAG_KINDS = {"non-finite": "nonfinite", "large updates": "exploding", "growing gradients": "exploding",
              "dead units": "killed", "diverging loss": "exploding"}
FLAG_ADVICE = {"non-finite": "run tt.diagnose on one step to find the first non-finite value",
               "large updates": "lower the learning rate (or clip the gradient norm)",
               "growing gradients": "lower the learning rate, clip the gradient norm, or normalise the activations",
               "dead units": "re-initialise the layer (kaiming), lower the learning rate, or use LeakyReLU / GELU",
               "diverging loss": "lower the learning rate (a tenth is a good first try), or warm it up; "
                                 "tt.spectrum's top eigenvalue tells the largest stable SGD step, 2 / lambda_max"}


@dataclass
class LayerStep:
    """One layer at one optimizer step (None where it does not apply)."""

    grad_norm: Optional[float] = None
    weight_norm: Optional[float] = None  # before the step
    update_ratio: Optional[float] = None
    act_mean: Optional[float] = None
    act_std: Optional[float] = None
    dead_share: Optional[float] = None
    finite: bool = True


@dataclass
class LayerHistory:
    name: str
    steps: List[LayerStep] = field(default_factory=list)

    def flags(self, losses: Optional[List[float]] = None) -> List[str]:
        """The flags of this layer; `losses`: the loss at each optimizer step (as many as the steps), if known."""
        found = []
        if not all(s.finite for s in self.steps):
            found.append("non-finite")
        ratios = [s.update_ratio for s in self.steps if s.update_ratio is not None]
        if ratios and statistics.median(ratios) > UPDATE_RATIO_HIGH:
            found.append("large updates")
        norms = [(i, s.grad_norm) for i, s in enumerate(self.steps) if s.grad_norm is not None]
        largest = max(norms, key=lambda item: item[1], default=None)
        if largest and norms[0][1] > 0 and largest[1] > GROWTH_HIGH * norms[0][1] and not _falling(losses, largest[0]):
            found.append("growing gradients")
        if self.steps and (self.steps[-1].dead_share or 0) >= DEAD_SHARE:
            found.append("dead units")
        return found


def _falling(losses: Optional[List[float]], step: int) -> bool:
    """Whether the loss fell into `step` (from the step before): a gradient that grows while the loss falls is a
    layer waking up behind one initialised small (its gradient is scaled by the weights after it), not a blow-up."""
    return bool(losses) and 0 < step < len(losses) and losses[step] < losses[step - 1]


def rising_streak(losses: List[float]) -> int:
    """How many steps in a row, up to the last, the loss rose (0 when the last step did not)."""
    n = 0
    while n + 1 < len(losses) and losses[-1 - n] > losses[-2 - n]:
        n += 1
    return n


def _norm(tensors: List[torch.Tensor]) -> float:
    with plain_torch():
        return float(torch.sqrt(sum((t.detach().double() ** 2).sum() for t in tensors)))


def _activation(output: Any) -> Optional[torch.Tensor]:
    if isinstance(output, (tuple, list)):
        output = output[0] if output else None
    return output if isinstance(output, torch.Tensor) and output.is_floating_point() else None


class TrainingDoctor:
    """The context manager tt.diagnose.training returns; `history`, `table()`, `plot()`, `findings`."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        self.layers: Dict[str, torch.nn.Module] = {
            name or "model": m for name, m in model.named_modules()
            if list(m.parameters(recurse=False)) or not list(m.children())}
        self.history: Dict[str, LayerHistory] = {name: LayerHistory(name) for name in self.layers}
        self._activations: Dict[str, LayerStep] = {}
        self._before: Dict[str, List[torch.Tensor]] = {}
        self._handles: List[Any] = []
        self.losses: List[float] = []  # per optimizer step: the mean of the losses its backward calls started from
        self._step_losses: List[float] = []

    def __enter__(self) -> "TrainingDoctor":
        for name, module in self.layers.items():
            self._handles.append(module.register_forward_hook(self._forward_hook(name)))
        self._handles.append(self.optimizer.register_step_pre_hook(self._before_step))
        self._handles.append(self.optimizer.register_step_post_hook(self._after_step))
        BACKWARD_WATCHERS.append(self._loss_watcher)
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._loss_watcher in BACKWARD_WATCHERS:
            BACKWARD_WATCHERS.remove(self._loss_watcher)

    @contextlib.contextmanager
    def _loss_watcher(self, output: Any, create_graph: bool) -> Iterator[None]:
        """Around each loss.backward(): the loss's value (a scalar's), for the step it belongs to."""
        if isinstance(output, torch.Tensor) and output.numel() == 1:
            with plain_torch():
                self._step_losses.append(float(output.detach()))
        yield

    def _forward_hook(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple, output: Any) -> None:
            out = _activation(output)
            if out is None:
                return
            with plain_torch():
                x = out.detach().double()
                dim = unit_dim(x.shape)
                dead = None if dim is None else float((x == 0).movedim(dim, 0).flatten(1).all(dim=1).double().mean())
                self._activations[name] = LayerStep(act_mean=float(x.mean()), act_std=float(x.std()) if x.numel() > 1
                                                    else 0.0, dead_share=dead)
        return hook

    def _own(self, name: str) -> List[torch.Tensor]:
        return list(self.layers[name].parameters(recurse=False))

    def _before_step(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        with plain_torch():
            self._before = {name: [p.detach().clone() for p in self._own(name)] for name in self.layers}

    def _after_step(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        for name in self.layers:
            params = self._own(name)
            step = self._activations.get(name, LayerStep())
            if params:
                grads = [p.grad for p in params if p.grad is not None]
                step.grad_norm = _norm(grads) if grads else None
                with plain_torch():
                    update = _norm([p.detach() - b for p, b in zip(params, self._before[name])])
                weight = step.weight_norm = _norm(self._before[name])
                step.update_ratio = update / weight if weight > 0 else None
                step.finite = all(v is None or v == v and abs(v) != float("inf")
                                  for v in (step.grad_norm, update, _norm(params)))
            self.history[name].steps.append(step)
        self._activations = {}
        if self._step_losses:
            self.losses.append(statistics.fmean(self._step_losses))
            self._step_losses = []

    def loss_flag(self) -> Optional[str]:
        """'diverging loss: ...' when the loss rose at each of the last RISING_STEPS steps or more, by more than
        LOSS_GROWTH_HIGH; else None."""
        n = rising_streak(self.losses)
        if n < RISING_STEPS:
            return None
        start, end = self.losses[-1 - n], self.losses[-1]
        if not (start > 0 and end > LOSS_GROWTH_HIGH * start):
            return None
        return f"diverging loss: it rose at each of the last {n} optimizer steps, from {start:.3g} to {end:.3g}"

    @property
    def findings(self) -> List[Finding]:
        found = []
        for name, history in self.history.items():
            for flag in history.flags(self._aligned_losses(history)):
                found.append(Finding(FLAG_KINDS[flag], "training", "", "", name, "", f"{flag}: {self._row(history)}",
                                     FLAG_ADVICE[flag]))
        diverging = self.loss_flag()
        if diverging is not None:
            found.append(Finding(FLAG_KINDS["diverging loss"], "training", "", "", "", "", diverging,
                                 FLAG_ADVICE["diverging loss"]))
        return found

    def _row(self, history: LayerHistory) -> str:
        cells = self._cells(history)
        return ", ".join(f"{column} {cell}" for column, cell in zip(self.columns[1:-1], cells[1:-1]) if cell != "-")

    columns = ("layer", "|grad| first", "|grad| last", "update/weight (median)", "act mean", "act std", "dead units",
               "flags")

    def _cells(self, history: LayerHistory) -> List[str]:
        def fmt(value: Optional[float], spec: str = ".2e") -> str:
            return "-" if value is None else format(value, spec)
        norms = [s.grad_norm for s in history.steps if s.grad_norm is not None]
        ratios = [s.update_ratio for s in history.steps if s.update_ratio is not None]
        last = history.steps[-1] if history.steps else LayerStep()
        return [history.name, fmt(norms[0] if norms else None), fmt(norms[-1] if norms else None),
                fmt(statistics.median(ratios) if ratios else None), fmt(last.act_mean, ".3g"), fmt(last.act_std, ".3g"),
                fmt(last.dead_share, ".0%"), ", ".join(history.flags(self._aligned_losses(history)))]

    def _aligned_losses(self, history: LayerHistory) -> Optional[List[float]]:
        return self.losses if len(self.losses) == len(history.steps) else None

    def table(self) -> str:
        """One row per layer over the run: first and last gradient norm, median update/weight, last activations."""
        rows = [list(self.columns)] + [self._cells(h) for h in self.history.values() if h.steps]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.columns))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        steps = max((len(h.steps) for h in self.history.values()), default=0)
        if self.losses:
            lines.append(f"loss: first {self.losses[0]:.3g}, last {self.losses[-1]:.3g}"
                         + (f"; {self.loss_flag()}" if self.loss_flag() else ""))
        lines.append(f"{steps} optimizer steps; flags: large updates > {UPDATE_RATIO_HIGH:g} (median update/weight), "
                     f"growing gradients > x{GROWTH_HIGH:g}, dead units >= {DEAD_SHARE:.0%}, diverging loss: rising "
                     f"{RISING_STEPS} steps in a row, by > x{LOSS_GROWTH_HIGH:g}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def plot(self, path: Optional[str] = None) -> Any:
        """Gradient norm, update/weight ratio, activation std and dead-unit share per layer over the steps."""
        import matplotlib.pyplot as plt

        from torchtrace.inspect.flow import _figure_class  # matplotlib's figure, shown once in Jupyter

        figure = plt.figure(figsize=(11, 7), FigureClass=_figure_class())
        panels = (("grad_norm", "|grad|", True), ("update_ratio", "update / weight", True),
                  ("act_std", "activation std", False), ("dead_share", "dead-unit share", False))
        for n, (attr, title, log) in enumerate(panels):
            ax = figure.add_subplot(2, 2, n + 1)
            for name, history in self.history.items():
                values = [getattr(s, attr) for s in history.steps]
                if any(v is not None for v in values):
                    ax.plot([v if v is not None else float("nan") for v in values], label=name)
            if attr == "update_ratio":
                ax.axhline(UPDATE_RATIO_HIGH, color="red", linestyle="--", linewidth=1)
            if log:
                ax.set_yscale("log")
            ax.set_title(title)
            ax.set_xlabel("optimizer step")
        figure.axes[0].legend(fontsize=7, loc="best")
        figure.tight_layout()
        if path is not None:
            figure.savefig(path, dpi=100)
        return figure


def training(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> TrainingDoctor:
    """A context manager that watches every optimizer step of `model`: see the module docstring for the columns
    and the flags' thresholds."""
    return TrainingDoctor(model, optimizer)
