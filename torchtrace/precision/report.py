"""The report of tt.precision: every op of a low-precision run beside the float32 run, forward then backward."""
from typing import Any, Callable, Dict, List, Optional

import torch

from torchtrace import argument_checks
from torchtrace.autocast_lists import WHY_FLOAT32, WHY_LOWER, WHY_PROMOTED, why
from torchtrace.doctor.comparison import _aligned
from torchtrace.doctor.recording import Pass
from torchtrace.precision.counts import Counts, count, count_all, relative_error
from torchtrace.precision.rows import Row

BY = ("rel_error", "underflow", "overflow", "subnormal")


def _dtype(tensors: List[Optional[torch.Tensor]]) -> Optional[torch.dtype]:
    return next((t.dtype for t in tensors if t is not None), None)


def why_of(node: Any, dtype: Optional[torch.dtype]) -> str:
    """lists.why for the op a node recorded (F.pad's reason reads the mode and the pads its rule kept) where autocast
    cast it, its forward having run in `dtype`; 'promoted' (the type its inputs give it) for an op autocast left
    alone: recorded outside an autocast region (enabled=False inside one), or run in another dtype than its list's
    (float64 inputs, which autocast never casts)."""
    ctx = node.ctx
    pads = getattr(ctx, "pad", None) if hasattr(ctx, "__dict__") else None
    reason = why(node.func, getattr(ctx, "mode", None), len(pads) // 2 if isinstance(pads, (list, tuple)) else 0)
    listed = {WHY_LOWER: node.autocast[1] if node.autocast else None, WHY_FLOAT32: torch.float32}
    return reason if node.autocast is not None and dtype == listed.get(reason, dtype) else WHY_PROMOTED


def forward_rows(low: Pass, reference: Pass) -> List[Row]:
    rows = []
    for i, j in _aligned(low.forward, reference.forward):
        op, ref = low.forward[i], reference.forward[j]
        node = low.recorded[i]
        dtype = _dtype([op.value])
        rows.append(Row(op.rule, op.module, op.line, "forward", dtype, why_of(node, dtype),
                        count(op.value, ref.value), relative_error(op.value, ref.value), op.value, ref.value, node, i))
    return rows


def backward_rows(low: Pass, reference: Pass, scale: float, computed_in: Dict[Any, torch.dtype]) -> List[Row]:
    """A row per rule; its dtype is the one its forward ran in (under autocast the backward computes in it too, and a
    gradient it hands to a float32 tensor is cast after), else the dtype of what it sent."""
    rows = []
    for i, j in _aligned(low.steps, reference.steps):
        step, ref = low.steps[i], reference.steps[j]
        errors = [relative_error(a, b, scale) for a, b in zip(step.sent, ref.sent)]
        first = next((k for k, t in enumerate(step.sent) if t is not None), 0)
        forward_dtype = computed_in.get(step.node)
        dtype = forward_dtype or _dtype(step.sent)
        rows.append(Row(step.rule, step.module, step.line, "backward", dtype, why_of(step.node, forward_dtype),
                        count_all(zip(step.sent, ref.sent), scale, dtype), max(errors, default=0.0),
                        step.sent[first] if step.sent else None, ref.sent[first] if ref.sent else None, step.node, i))
    return rows


class PrecisionReport:
    """`rows` (forward, then backward in the engine's order), `top(k, by=...)`, the shares of the whole backward, and
    `explore()`; `print(r)` shows the largest errors and underflows."""

    def __init__(self, low: Pass, reference: Pass, dtype: torch.dtype, scale: float,
                 rerun: Optional[Callable[[], Pass]] = None) -> None:
        self.low, self.reference, self.dtype, self.scale = low, reference, dtype, scale
        forward = forward_rows(low, reference)
        computed_in = {row.node: row.dtype for row in forward if row.dtype is not None}
        self.rows = forward + backward_rows(low, reference, scale, computed_in)
        self._rerun = rerun

    def top(self, k: int = 5, by: str = "rel_error", phase: Optional[str] = None) -> List[Row]:
        """The k rows largest by `by` ("rel_error", "underflow", "overflow" or "subnormal"), of one phase or both."""
        if by not in BY:
            raise ValueError(f"by must be one of {BY}, not {by!r}")
        if phase not in (None, "forward", "backward"):
            raise ValueError(f"phase must be 'forward', 'backward' or None (both), not {phase!r}")
        k = argument_checks.count("top", "k (how many rows to list)", k, least=0)
        rows = [r for r in self.rows if phase is None or r.phase == phase]
        return sorted(rows, key=lambda r: -getattr(r, by))[:k]

    def counts(self, phase: str = "backward") -> Counts:
        """The counts of every row of a phase added up (each gradient a rule sent, or each forward value)."""
        total = Counts()
        for row in self.rows:
            if row.phase == phase:
                total = total + row.counts
        return total

    @property
    def first_underflow(self) -> Optional[Row]:
        """The first rule, in backward order, that sent an underflowed gradient: where the zeros start (the rules
        after it receive them and count them again)."""
        return next((r for r in self.rows if r.phase == "backward" and r.counts.underflow), None)

    @property
    def gradient_underflow(self) -> float:
        """The share of all the gradient elements the backward's rules sent that underflowed."""
        return self.counts("backward").share("underflow")

    @property
    def gradient_overflow(self) -> float:
        return self.counts("backward").share("overflow")

    def leaf_counts(self) -> Counts:
        """The counts of the gradients the leaves (the parameters) received, against the float32 run's."""
        return count_all(((self.low.leaf_grads.get(k), self.reference.leaf_grads.get(k)) for k in self.low.leaf_order),
                         self.scale)

    def __str__(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        grads = self.counts("backward")
        lines = [f"tt.precision {dtype} (scale {self.scale:g}) vs float32: loss {self.low.loss / self.scale:.6g} vs "
                 f"{self.reference.loss:.6g}; {sum(r.phase == 'forward' for r in self.rows)} ops, "
                 f"{sum(r.phase == 'backward' for r in self.rows)} rules; gradients: "
                 f"{grads.share('underflow'):.2%} underflow, {grads.share('subnormal'):.2%} subnormal, "
                 f"{grads.share('overflow'):.2%} overflow",
                 "largest relative errors:"]
        lines += [f"  {row}" for row in self.top(5)]
        underflows = [row for row in self.top(5, by="underflow") if row.underflow > 0]
        if underflows:
            lines += ["largest underflows:"] + [f"  {row}" for row in underflows]
        overflows = [row for row in self.top(5, by="overflow") if row.overflow > 0]
        if overflows:
            lines += ["overflows:"] + [f"  {row}" for row in overflows]
        return "\n".join(lines)

    __repr__ = __str__

    def explore(self) -> Any:
        """The player of the low-precision backward (the function runs once more), each node marked with the dtype
        it ran in and why, its underflow and overflow shares, and its float32 value beside the low-precision one."""
        if self._rerun is None:
            raise RuntimeError("this report cannot run its function again: make it with tt.precision(fn, *args)")
        from torchtrace.precision.player import in_player

        return in_player(self, self._rerun())
