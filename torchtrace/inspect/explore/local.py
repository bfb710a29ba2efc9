"""A step's local derivative, two ways: from the rule, and by finite differences of the op's forward.

The rule's Jacobian J[k][j] = d out_k / d in_j is read off its backward, one call per output element
with a one-hot upstream gradient (row k = backward(e_k)). The estimate perturbs each input element in float64
and runs the op's forward again: column j = (f(x + h_j e_j) - f(x - h_j e_j)) / 2 h_j, with a relative step
h_j = eps^(1/3) max(1, |x_j|), where eps is the machine epsilon of the precision the forward computes in (a cast
to float16 inside the op, `x.half()`, computes in float16 even on float64 inputs). Both are made only for small
steps (every tensor at most LIMIT elements).

The two agree when |rule - estimate| <= rtol |estimate| + atol for every entry: rtol grows with the lowest
precision involved (the rule runs in the op's dtype), atol is the estimate's own rounding noise,
eps |f| / h_j. NaN entries agree with NaN, infinities with the same infinity.
"""
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from torchtrace.autograd.node import Context, Edge, Node, edge_gradient, gradient_for
from torchtrace.autograd.plain import plain_torch
from torchtrace.inspect.explore.shown import matrix_text, number

LIMIT = 64  # tensors of at most this many elements get a Jacobian and a finite-difference check
RTOL = 1e-3  # the least relative tolerance (the rule runs in float32 mostly, the estimate in float64)

Matrix = List[List[float]]


@dataclass
class Check:
    """The rule's local derivative of one input next to the finite-difference estimate."""

    rule: Optional[Matrix]
    estimate: Optional[Matrix]
    why_not: str = ""  # why there is no estimate ('' when there is one)
    rtol: float = RTOL
    atol: float = 0.0
    at_nan: bool = False  # the op's inputs or outputs hold NaN or inf here: NaN spreads through 0 x NaN

    def _pairs(self) -> List[Tuple[float, float]]:
        return [(r, e) for rr, er in zip(self.rule or [], self.estimate or []) for r, e in zip(rr, er)]

    def _compared(self) -> List[Tuple[float, float]]:
        """The entries compared: not those NaN on one side only at a point where the forward holds NaN or inf."""
        return [(r, e) for r, e in self._pairs() if not (self.at_nan and (r != r) != (e != e))]

    @property
    def max_difference(self) -> Optional[float]:
        if self.rule is None or self.estimate is None:
            return None
        return max((abs(r - e) for r, e in self._compared() if not _same(r, e)), default=0.0)

    @property
    def agrees(self) -> Optional[bool]:
        """Every entry within rtol |estimate| + atol (None: nothing to compare)."""
        if self.rule is None or self.estimate is None:
            return None
        return all(_same(r, e) or abs(r - e) <= self.atol + self.rtol * abs(e) for r, e in self._compared())

    @property
    def detail(self) -> str:
        pairs = self._pairs()
        both = sum(1 for r, e in pairs if r != r and e != e)
        one = len(pairs) - len(self._compared())
        nans = (f"; {both} entries NaN in both" if both else "") + (
            f"; {one} entries NaN on one side only, not compared (the forward holds NaN or inf here, and NaN "
            "spreads through 0 x NaN)" if one else "")
        return (f"max difference {number(self.max_difference or 0.0)}, tolerance {self.rtol:.0e} relative "
                f"+ {number(self.atol)}{nans}")

    def __str__(self) -> str:
        if self.estimate is None:
            return f"not checked: {self.why_not}"
        verdict = "agrees" if self.agrees else "DIFFERS"
        return (f"rule {matrix_text(self.rule or [[]])}   finite differences {matrix_text(self.estimate)}   "
                f"{verdict} ({self.detail})")


def _same(r: float, e: float) -> bool:
    """NaN beside NaN, or the same infinity."""
    return (r != r and e != e) or (r == e and abs(r) == float("inf"))


def small(shapes: Sequence[Any]) -> bool:
    return all(torch.Size(s).numel() <= LIMIT for s in shapes)


def _flat(g: Optional[torch.Tensor], shape: torch.Size) -> List[float]:
    return torch.zeros(shape.numel(), dtype=torch.float64).tolist() if g is None else g.double().flatten().tolist()


def rule_jacobians(node: Node, grads: Sequence[Optional[torch.Tensor]]
                   ) -> Optional[List[Tuple[Matrix, Optional[Matrix]]]]:
    """For each edge of `node`: its Jacobian from the rule's backward, and, where the rule's gradient had the
    broadcast shape and was summed back to the input's, the Jacobian before that sum (call while the node's
    saved tensors are alive)."""
    outputs = [g for g in grads if g is not None]
    shapes = [g.shape for g in outputs] + [edge.shape for edge in node.edges]
    if node.autocast or len(outputs) != len(grads) or not small(shapes):
        return None
    rows: List[Matrix] = [[] for _ in node.edges]
    raw: List[Optional[Matrix]] = [[] for _ in node.edges]
    with plain_torch():
        for nr, g in enumerate(outputs):
            for k in range(g.numel()):
                onehot = [torch.zeros(o.shape, dtype=o.dtype, device=o.device) for o in outputs]
                onehot[nr].view(-1)[k] = 1
                result = node.rule.backward(node.ctx, *onehot)
                result = result if isinstance(result, tuple) else (result,)
                for i, edge in enumerate(node.edges):
                    rows[i].append(_flat(edge_gradient(edge, result), edge.shape))
                    before = gradient_for(edge, result)
                    if raw[i] is not None and before is not None and before.shape != edge.shape:
                        raw[i].append(before.double().flatten().tolist())
                    else:
                        raw[i] = None
    return list(zip(rows, raw))


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


def _eps(dtypes: Sequence[torch.dtype]) -> float:
    """The machine epsilon of the least precise floating dtype among `dtypes` (float64's when there is none)."""
    return max((torch.finfo(d).eps for d in dtypes if d.is_floating_point), default=torch.finfo(torch.float64).eps)


def _forward(node: Node, kwargs: dict) -> Callable[[tuple], Tuple[torch.Tensor, List[torch.dtype]]]:
    """The op's forward as torchtrace ran it (the rule's, on its normalised arguments): all outputs flattened into
    one float64 vector, and the dtypes they were computed in."""
    def run(args: tuple) -> Tuple[torch.Tensor, List[torch.dtype]]:
        with plain_torch():
            out = node.rule.forward(Context(node.rule, node.edges, node.ctx._mask), *args, **kwargs)
            outs = [o for o in (out if isinstance(out, (list, tuple)) else (out,)) if isinstance(o, torch.Tensor)]
            return torch.cat([o.double().flatten() for o in outs]), [o.dtype for o in outs]
    return run


def _not_checked(node: Node, why: str) -> List[Check]:
    return [Check(None, None, why) for _ in node.edges]


def estimates(node: Node, call: Optional[tuple]) -> List[Check]:
    """For each edge, the finite-difference Jacobian of the op's forward at `call` = (args, kwargs, outputs)."""
    if call is None:
        return _not_checked(node, "the forward's inputs are not known: run the forward inside `with tt.recording():`"
                                  " or explore with tt.explore(fn, *inputs)")
    args, kwargs, outputs = call
    with plain_torch():
        recorded = torch.cat([o.double().flatten() for o in outputs])
        again, out_dtypes = _forward(node, kwargs)(args)
    if again.shape != recorded.shape or not torch.allclose(again, recorded, rtol=1e-5, atol=1e-6, equal_nan=True):
        return _not_checked(node, "running the forward again gives another result (a random op?)")
    at_nan = not all(bool(t.isfinite().all()) for t in (*outputs, *(_input(args, e.position) for e in node.edges)))
    args64, kwargs64 = _double(args), _double(kwargs)
    run = _forward(node, kwargs64)
    with plain_torch():
        _, computed_in = run(args64)  # float64 unless the op casts (x.half(), sum(dtype=...))
    eps = _eps(computed_in)
    checks = []
    for edge in node.edges:
        x = _input(args64, edge.position).clone(memory_format=torch.contiguous_format)  # .view(-1) below writes x
        columns, noise = [], 0.0
        with plain_torch():
            for j in range(x.numel()):
                up, down = x.clone(), x.clone()
                h = eps ** (1 / 3) * max(1.0, abs(float(x.view(-1)[j])))
                up.view(-1)[j] += h
                down.view(-1)[j] -= h
                f_up = run(_replace(args64, edge.position, up))[0]
                f_down = run(_replace(args64, edge.position, down))[0]
                step = float(up.view(-1)[j] - down.view(-1)[j])  # 2h as represented
                columns.append(((f_up - f_down) / step).tolist())
                size = torch.cat([f_up, f_down]).abs().nan_to_num(0.0, 0.0, 0.0).max()
                noise = max(noise, 4 * eps * float(size) / step)
        estimate = [list(row) for row in zip(*columns)]
        checks.append(Check(None, estimate, rtol=_rtol(eps, edge, out_dtypes), atol=noise + _rounding(
            estimate, edge, out_dtypes), at_nan=at_nan))
    return checks


def _rounding(estimate: Matrix, edge: Edge, out_dtypes: Sequence[torch.dtype]) -> float:
    """What the rule's own dtype may lose by cancellation, absolutely: a float32 1 - y^2 at y = 0.99998 is
    3.111e-05 for the exact 3.116e-05 (the terms are ~1, their eps ~1e-7): 16 eps of the largest entry."""
    finite = [abs(v) for row in estimate for v in row if v == v and abs(v) != float("inf")]
    return 16 * _eps([edge.dtype, *out_dtypes]) * max(finite, default=0.0) if edge.dtype != torch.float64 else 0.0


def _rtol(eps: float, edge: Edge, out_dtypes: Sequence[torch.dtype]) -> float:
    """Central differences err by about eps^(2/3) relative; the rule by its own dtype's eps."""
    rule_eps = _eps([edge.dtype, *out_dtypes])
    return max(RTOL, 4 * eps ** (2 / 3), 16 * rule_eps)
