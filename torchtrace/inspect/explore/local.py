"""A step's local derivative, two ways: from the rule, and by finite differences of the op's forward.

The rule's Jacobian J[k][j] = d out_k / d in_j is read off its backward, one call per output element
with a one-hot upstream gradient (row k = backward(e_k)). The estimate perturbs each input element by
±eps in float64 and runs the op's forward again: column j = (f(x + eps e_j) - f(x - eps e_j)) / 2 eps.
Both are made only for small steps (every tensor at most FULL elements).
"""
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from torchtrace.autograd.node import Context, Edge, Node, edge_gradient
from torchtrace.autograd.plain import plain_torch
from torchtrace.inspect.explore.shown import FULL, matrix_text, number

EPS = 1e-6
RTOL, ATOL = 1e-3, 1e-4  # the rule runs in the op's dtype (float32 mostly), the estimate in float64

Matrix = List[List[float]]


@dataclass
class Check:
    """The rule's local derivative of one input next to the finite-difference estimate."""

    rule: Optional[Matrix]
    estimate: Optional[Matrix]
    why_not: str = ""  # why there is no estimate ('' when there is one)

    def _pairs(self) -> List[Tuple[float, float]]:
        return [(r, e) for rr, er in zip(self.rule or [], self.estimate or []) for r, e in zip(rr, er)]

    @property
    def max_difference(self) -> Optional[float]:
        if self.rule is None or self.estimate is None:
            return None
        return max((abs(r - e) for r, e in self._pairs()), default=0.0)

    @property
    def agrees(self) -> Optional[bool]:
        """|rule - estimate| <= ATOL + RTOL |estimate| for every entry (None: nothing to compare)."""
        if self.rule is None or self.estimate is None:
            return None
        return all(abs(r - e) <= ATOL + RTOL * abs(e) for r, e in self._pairs())

    def __str__(self) -> str:
        if self.estimate is None:
            return f"not checked: {self.why_not}"
        verdict = "agrees" if self.agrees else "DIFFERS"
        return (f"rule {matrix_text(self.rule or [[]])}   finite differences {matrix_text(self.estimate)}   "
                f"{verdict} (max difference {number(self.max_difference or 0.0)})")


def small(shapes: Sequence[Any]) -> bool:
    return all(torch.Size(s).numel() <= FULL for s in shapes)


def _gradient_of(edge: Edge, result: tuple) -> torch.Tensor:
    g = edge_gradient(edge, result)
    return torch.zeros(edge.shape, dtype=torch.float64) if g is None else g.double()


def rule_jacobians(node: Node, grads: Sequence[Optional[torch.Tensor]]) -> Optional[List[Matrix]]:
    """One Jacobian per edge of `node`, from its rule's backward (call while its saved tensors are alive)."""
    outputs = [g for g in grads if g is not None]
    shapes = [g.shape for g in outputs] + [edge.shape for edge in node.edges]
    if node.autocast or len(outputs) != len(grads) or not small(shapes):
        return None
    rows: List[Matrix] = [[] for _ in node.edges]
    with plain_torch():
        for nr, g in enumerate(outputs):
            for k in range(g.numel()):
                onehot = [torch.zeros(o.shape, dtype=o.dtype, device=o.device) for o in outputs]
                onehot[nr].view(-1)[k] = 1
                result = node.rule.backward(node.ctx, *onehot)
                result = result if isinstance(result, tuple) else (result,)
                for i, edge in enumerate(node.edges):
                    rows[i].append(_gradient_of(edge, result).flatten().tolist())
    return rows


def _replace(args: tuple, position: Any, value: torch.Tensor) -> tuple:
    args = list(args)
    if type(position) is int:
        args[position] = value
    else:
        items = list(args[position[0]])
        items[position[1]] = value
        args[position[0]] = type(args[position[0]])(items)
    return tuple(args)


def _double(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    if isinstance(value, (list, tuple)):
        return type(value)(_double(v) for v in value)
    return value


def _input(args: tuple, position: Any) -> torch.Tensor:
    return args[position] if type(position) is int else args[position[0]][position[1]]


def _forward(node: Node, kwargs: dict) -> Callable[[tuple], torch.Tensor]:
    """The op's forward as torchtrace ran it (the rule's, on its normalised arguments), all outputs flattened."""
    def run(args: tuple) -> torch.Tensor:
        with plain_torch():
            out = node.rule.forward(Context(node.rule, node.edges, node.ctx._mask), *args, **kwargs)
            outs = out if isinstance(out, (list, tuple)) else (out,)
            return torch.cat([o.double().flatten() for o in outs if isinstance(o, torch.Tensor)])
    return run


def estimates(node: Node) -> List[Check]:
    """For each edge, the finite-difference Jacobian of the op's forward; needs the call noted by tt.recording()."""
    call = (node.notes or {}).get("call")
    if call is None:
        why = "the forward's inputs are not known: run the forward inside `with tt.recording():`"
        return [Check(None, None, why) for _ in node.edges]
    args, kwargs, outputs = call
    run = _forward(node, kwargs)
    with plain_torch():
        recorded = torch.cat([o.double().flatten() for o in outputs])
        again = run(args)
    if again.shape != recorded.shape or not torch.allclose(again, recorded, rtol=1e-5, atol=1e-6):
        return [Check(None, None, "running the forward again gives another result (a random op?)")
                for _ in node.edges]
    args64, kwargs = _double(args), _double(kwargs)
    run = _forward(node, kwargs)
    checks = []
    for edge in node.edges:
        x = _input(args64, edge.position).clone(memory_format=torch.contiguous_format)  # .view(-1) below writes x
        columns = []
        with plain_torch():
            for j in range(x.numel()):
                up, down = x.clone(), x.clone()
                up.view(-1)[j] += EPS
                down.view(-1)[j] -= EPS
                f_up, f_down = run(_replace(args64, edge.position, up)), run(_replace(args64, edge.position, down))
                columns.append(((f_up - f_down) / (2 * EPS)).tolist())
        checks.append(Check(None, [list(row) for row in zip(*columns)]))
    return checks
