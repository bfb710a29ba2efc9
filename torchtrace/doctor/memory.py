"""What backward keeps: per rule the tensors it saved (shape, bytes), their total, and the peak across the backward.

    m = tt.diagnose.memory(fn, *args)   # runs fn and the backward of its scalar result, watching memory
    print(m)                            # one row per rule: module, line, saved shapes and bytes; total and peak

Bytes are counted per saved tensor, as torch's `saved_tensors_hooks` see them (a tensor saved by two rules
counts twice; `unique_bytes` counts each storage once). The peak simulates the backward: at each rule, the
tensors still saved (by rules that have not run yet, or that a checkpoint recomputed) plus the gradients on
their way to rules that have not run (what reaches a leaf goes into its `.grad`, which outlives the backward);
a rule's saved tensors are freed once it has run. With `torch.utils.checkpoint`, a block keeps only its inputs in
forward and recomputes its own saved tensors during backward: the total falls and the recomputed block appears in
the peak.
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

import torch

from torchtrace.autograd.engine import topological_order
from torchtrace.autograd.node import AccumulateGrad, Node, edge_gradient
from torchtrace.autograd.state import observing
from torchtrace.doctor.where import math_line, user_line
from torchtrace.inspect.scope import module_names, module_scope, path_name


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def saved_tensors(node: Node) -> List[torch.Tensor]:
    return [t for t in node.saved if isinstance(t, torch.Tensor)]


@dataclass
class RuleMemory:
    """The tensors one rule saved for its backward."""

    rule: str
    module: str
    line: str
    shapes: List[Tuple[int, ...]]
    bytes: int


class MemoryReport:
    """Per-rule saved tensors, `saved_bytes` (their sum), `unique_bytes` (each storage once) and `peak_bytes`."""

    def __init__(self, rows: List[RuleMemory], unique_bytes: int, peak_bytes: int, math: Dict[str, str]) -> None:
        self.rows, self.unique_bytes, self.peak_bytes, self._math = rows, unique_bytes, peak_bytes, math

    @property
    def saved_bytes(self) -> int:
        return sum(r.bytes for r in self.rows)

    def __str__(self) -> str:
        lines = [f"{'rule':<22} {'module':<22} {'line':<18} {'bytes':>10}  saved shapes"]
        for r in sorted(self.rows, key=lambda r: -r.bytes):
            shapes = ", ".join(str(tuple(s)) for s in r.shapes)
            lines.append(f"{r.rule:<22} {r.module:<22} {r.line:<18} {r.bytes:>10}  {shapes}")
        lines.append(f"saved for backward: {self.saved_bytes} bytes in {len(self.rows)} rules "
                     f"({self.unique_bytes} bytes in distinct storages); peak during backward: {self.peak_bytes} bytes")
        return "\n".join(lines)

    __repr__ = __str__


class _Ledger:
    """Live bytes during backward: tensors saved by rules that have not run, and gradients in flight."""

    def __init__(self) -> None:
        self.saved: Dict[Node, int] = {}
        self.in_flight: Dict[Any, int] = {}  # node -> bytes of gradients waiting for it
        self.peak = 0

    def live(self) -> int:
        return sum(self.saved.values()) + sum(self.in_flight.values())

    def on_record(self, node: Node, args: tuple, kwargs: dict, result: Any) -> None:  # a checkpoint recomputing
        self.saved[node] = sum(_bytes(t) for t in saved_tensors(node))
        self.peak = max(self.peak, self.live())

    def on_backward(self, node: Node, grads: List[Any], result: tuple) -> None:
        for edge in node.edges:
            g = edge_gradient(edge, result) if type(edge.node) is not AccumulateGrad else None  # .grad: not in flight
            if g is not None:
                self.in_flight[edge.node] = self.in_flight.get(edge.node, 0) + _bytes(g)
        self.peak = max(self.peak, self.live())
        self.saved.pop(node, None)
        self.in_flight.pop(node, None)


def memory(fn: Any, *args: Any, **kwargs: Any) -> MemoryReport:
    """Run fn(*args, **kwargs) and the backward of its scalar result; report what each rule saved and the peak."""
    recorded: List[Node] = []
    lines: Dict[Node, str] = {}

    def note(node: Node, *_: Any) -> None:
        recorded.append(node)
        lines[node] = user_line()[0]

    with module_scope(), observing(on_record=note):
        loss = fn(*args, **kwargs)
    in_graph = set(topological_order([loss._tt_node])) if getattr(loss, "_tt_node", None) is not None else set()
    recorded = [n for n in recorded if n in in_graph]  # not the graphs a checkpoint dropped after a discovery run
    model = next((n.module_path[0] for n in recorded if n.module_path), None)
    names = module_names(model)
    rows, storages = [], {}
    ledger = _Ledger()
    for node in recorded:
        tensors = saved_tensors(node)
        if not tensors:
            continue
        rows.append(RuleMemory(node.rule.__name__, path_name(node.module_path, names), lines[node],
                               [tuple(t.shape) for t in tensors], sum(_bytes(t) for t in tensors)))
        ledger.saved[node] = rows[-1].bytes
        for t in tensors:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    ledger.peak = ledger.live()
    with observing(on_record=ledger.on_record, on_backward=ledger.on_backward):
        loss.backward()
    return MemoryReport(rows, sum(storages.values()), ledger.peak, {n.rule.__name__: math_line(n) for n in recorded})
