"""tt.precision.training(model, optimizer, scaler): a mixed-precision loop watched step by step.

    with tt.precision.training(model, optimizer, scaler) as p:
        for x, y in batches:
            with torch.autocast("cpu", dtype=torch.float16):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    p.steps   # each step: .scale (the one its backward used), .skipped, .first_inf

The decisions are torch.amp.GradScaler's own: a step is skipped when the scaler did not call
optimizer.step() (it found an inf or NaN in the unscaled gradients). For a skipped step, `first_inf` is
the first rule of the backward that sent a non-finite gradient out of a finite one, where it was written,
and the parameters whose gradient it reached. Everything is put back as it was when the block ends.
"""
import contextlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, List, Optional

import torch

from torchtrace.autograd.node import Node, edge_gradient
from torchtrace.autograd.state import observing
from torchtrace.doctor.values import all_finite
from torchtrace.doctor.where import math_line, user_line
from torchtrace.inspect.scope import module_names, module_scope, path_name


@contextlib.contextmanager
def _replaced(obj: Any, name: str, value: Any) -> Iterator[None]:
    """obj.name is `value` inside the block (an instance attribute); what obj had before is put back after."""
    had = vars(obj).get(name, _MISSING)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had is _MISSING:
            delattr(obj, name)
        else:
            setattr(obj, name, had)


_MISSING = object()


@dataclass
class FirstInf:
    """The first rule of a backward whose gradient stopped being finite, and the parameters it reached."""

    rule: str
    math: str
    module: str
    line: str
    code: str
    parameters: List[str] = field(default_factory=list)

    def __str__(self) -> str:
        where = " ".join(p for p in (f"in {self.module}" if self.module else "", f"at {self.line}" if self.line
                                     else "") if p)
        reached = ", ".join(self.parameters) or "no parameter"
        return f"{self.rule} {where}: the first non-finite gradient; it reached {reached}".replace("  ", " ")


@dataclass
class Step:
    """One optimizer step of the loop: the scale its backward used, whether GradScaler skipped it, and why."""

    index: int
    scale: float
    skipped: bool
    first_inf: Optional[FirstInf] = None

    def __str__(self) -> str:
        what = f"skipped: {self.first_inf}" if self.skipped and self.first_inf else (
            "skipped" if self.skipped else "taken")
        return f"step {self.index}: scale {self.scale:g}, {what}"


class PrecisionTraining:
    """The watcher; `steps` once (or while) the loop runs, `skipped` the indices of the steps GradScaler skipped."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: Any) -> None:
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.steps: List[Step] = []
        self._first: Optional[Node] = None
        self._stack = contextlib.ExitStack()

    @property
    def skipped(self) -> List[int]:
        return [s.index for s in self.steps if s.skipped]

    def _note(self, node: Node, args: tuple, kwargs: dict, result: Any) -> None:
        node.note(user_line=user_line())

    def _backward(self, node: Node, grads: List[Any], result: tuple) -> None:
        """The first rule that sent a non-finite gradient out of a finite one: as sent along its edges, each cast to
        its input's dtype (a float32-list op's gradient overflows float16 there, as torch's ToCopyBackward casts it)."""
        if self._first is None and all_finite(list(grads)) and not all_finite(
                [edge_gradient(edge, result) for edge in node.edges]):
            self._first = node

    def _step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """GradScaler.step, noting the scale, whether it called optimizer.step(), and the first inf of this step."""
        called = []
        real_step = optimizer.step

        def step(*a: Any, **k: Any) -> Any:
            called.append(True)
            return real_step(*a, **k)

        scale = float(self.scaler.get_scale())
        first = self._first_inf()
        with _replaced(optimizer, "step", step):
            result = self._scaler_step(optimizer, *args, **kwargs)
        self.steps.append(Step(len(self.steps), scale, not called, first if not called else None))
        self._first = None
        return result

    def _first_inf(self) -> Optional[FirstInf]:
        node = self._first
        if node is None:
            return None
        names = module_names(self.model)
        line, code = (node.notes or {}).get("user_line", ("", ""))
        line = "" if line == "<unknown>" else line  # the op was written inside torchtrace (its own demo model)
        reached = [name for name, p in self.model.named_parameters() if p.grad is not None and not all_finite(p.grad)]
        return FirstInf(node.rule.__name__, math_line(node), path_name(node.module_path, names), line, code, reached)

    def __enter__(self) -> "PrecisionTraining":
        if not self.scaler.is_enabled():  # (torch.amp.GradScaler() is for "cuda": on a machine without it, disabled)
            warnings.warn("tt.precision.training: the GradScaler is disabled (torch.amp.GradScaler() defaults to "
                          "device 'cuda'; without CUDA, or with enabled=False, torch turns it off): it scales nothing "
                          "and skips no step, so a non-finite gradient reaches the optimizer. Make it for the device "
                          "you train on: torch.amp.GradScaler('cpu')", stacklevel=2)
        self._stack.enter_context(module_scope())
        self._stack.enter_context(observing(on_record=self._note, on_backward=self._backward))
        self._scaler_step = self.scaler.step
        self._stack.enter_context(_replaced(self.scaler, "step", self._step))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    def __str__(self) -> str:
        head = f"tt.precision.training: {len(self.steps)} steps, {len(self.skipped)} skipped {self.skipped}"
        return "\n".join([head] + [str(s) for s in self.steps if s.skipped])

    __repr__ = __str__


def training(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: Any) -> PrecisionTraining:
    """Watch a loop with torch.amp.GradScaler: each step's scale, whether it was skipped, and for a skipped step the
    first rule that produced the inf and the parameters it reached."""
    return PrecisionTraining(model, optimizer, scaler)
