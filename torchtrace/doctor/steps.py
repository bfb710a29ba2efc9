"""Training health across optimizer steps, for a script the doctor runs: the update/weight ratio of every step,
the gradient norm and the loss, and the first step where they blew up, with the learning rate that did it.

Global optimizer hooks (torch.optim.optimizer.register_optimizer_step_pre_hook / _post_hook) see every
optimizer of the script without being handed one. Before a step the parameters and the gradient norm are read;
after it, |w_after - w_before| / |w_before| over all the optimizer's parameters. Flags, with the thresholds of
tt.diagnose.training: an update above UPDATE_RATIO_HIGH of the weights, a gradient norm GROWTH_HIGH times
the first one, a loss that stops being finite or grows GROWTH_HIGH times its first value.
"""
import math
from dataclasses import dataclass
from typing import Any, List, Optional

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from torchtrace.autograd.plain import plain_torch
from torchtrace.doctor.findings import Finding
from torchtrace.doctor.training import GROWTH_HIGH, UPDATE_RATIO_HIGH

HEALTHY_RATIO = 1e-3  # what an update/weight ratio of a healthy step is near


@dataclass
class Step:
    """One optimizer step: the loss of the backward before it, the gradient norm, the update/weight ratio."""

    number: int
    loss: Optional[float]
    grad_norm: float
    update_ratio: float
    lr: Any
    optimizer: str


def _norm(tensors: List[torch.Tensor]) -> float:
    with plain_torch():
        return math.sqrt(sum(float((t.detach().double() ** 2).sum()) for t in tensors))


def _params(optimizer: torch.optim.Optimizer) -> List[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _said(value: float) -> str:
    return f"{value:.3g}"


class StepWatch:
    """Hooks every optimizer step while it is entered (up to `steps` of them); `steps`, `finding()`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.steps: List[Step] = []
        self.losses: List[float] = []
        self._before: List[torch.Tensor] = []
        self._grad_norm = 0.0
        self._handles: List[Any] = []
        self.reported = False
        self.blew_up_at: Optional[int] = None  # the step the finding names, once reported

    def note_loss(self, value: float) -> None:
        self.losses.append(value)

    def __enter__(self) -> "StepWatch":
        self._handles = [register_optimizer_step_pre_hook(self._pre), register_optimizer_step_post_hook(self._post)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()

    def _pre(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        if len(self.steps) >= self.limit:
            return
        params = _params(optimizer)
        with plain_torch():
            self._before = [p.detach().clone() for p in params]
        self._grad_norm = _norm([p.grad for p in params if p.grad is not None])

    def _post(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        if len(self.steps) >= self.limit or not self._before:
            return
        params = _params(optimizer)
        with plain_torch():
            update = _norm([p.detach() - b for p, b in zip(params, self._before)])
        weight = _norm(self._before)
        lrs = sorted({group.get("lr") for group in optimizer.param_groups}, key=str)
        self.steps.append(Step(len(self.steps) + 1, self.losses[-1] if self.losses else None, self._grad_norm,
                               update / weight if weight > 0 else 0.0, lrs[0] if len(lrs) == 1 else lrs,
                               type(optimizer).__name__))
        self._before = []

    def finding(self) -> Optional[Finding]:
        """The first step whose update, gradient or loss blew up, or None while training is healthy."""
        if not self.steps:
            return None
        first = self.steps[0]
        for step in self.steps:
            large = step.update_ratio > UPDATE_RATIO_HIGH or not math.isfinite(step.update_ratio)
            growing = first.grad_norm > 0 and (step.grad_norm > GROWTH_HIGH * first.grad_norm
                                               or not math.isfinite(step.grad_norm))
            if large or growing:
                return self._blew_up(step, large)
        return None

    def _blew_up(self, step: Step, large: bool) -> Finding:
        losses = " -> ".join(_said(v) for v in self.losses[: max(step.number + 2, 3)])
        norms = [s.grad_norm for s in self.steps]
        what = (f"the update was {_said(step.update_ratio)} of the weights (|w_after - w_before| / |w_before|; a "
                f"healthy step is near {HEALTHY_RATIO:g})" if large else
                f"the gradient norm reached {_said(step.grad_norm)}, {_said(step.grad_norm / norms[0])} times the "
                "first")
        message = (f"the learning rate lr={step.lr} of {step.optimizer} is too large: at optimizer step {step.number} "
                   f"{what}{f'; the loss went {losses}' if losses else ''}; the gradient norm went "
                   f"{' -> '.join(_said(v) for v in norms[: step.number + 2])}")
        advice = "lower the learning rate (or clip the gradient norm, torch.nn.utils.clip_grad_norm_)"
        if large and step.optimizer == "SGD" and isinstance(step.lr, (int, float)) and step.update_ratio > 0:
            suggested = step.lr * HEALTHY_RATIO / step.update_ratio
            advice += (f"; plain SGD's update is lr times the gradient, so lr={suggested:.2g} would make that step "
                       f"about {HEALTHY_RATIO:g} of the weights")
        self.blew_up_at = step.number
        return Finding("exploding", "training", "", "", "", "", message, advice)
