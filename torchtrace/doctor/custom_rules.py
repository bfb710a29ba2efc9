"""A user's own rules (tt.Function, a subclass of torch's Function) checked against their own forward, from values.

While tt.diagnose watches, each call of a rule that is not torchtrace's keeps its arguments, and its backward step
keeps the gradient u it received and the gradients it sent, one per input. Afterwards the forward runs again in
float64 at x + eps v and x - eps v, for a random direction v over the inputs it sent a gradient to (with torch's
random generator at the same state both times, so a dropout inside draws the same mask), and

    <u, J v>  by the backward:            sum_i <sent_i, v_i>
    <u, J v>  by the forward (central):   <u, (f(x + eps v) - f(x - eps v)) / (2 eps)>

must agree (a relative difference of at most RTOL). A forward that is flat along v (a rounding, a sign: the
derivative is 0 almost everywhere) whose backward sends a gradient anyway is a surrogate gradient on purpose (a
straight-through estimator), not a finding. A forward that raises in float64, or that run again at x does not give
the result it recorded (it draws random numbers, as a dropout, or reads state that changed), is not checked.
"""
import math
from typing import Any, Dict, List, Optional, Tuple

import torch

from torchtrace.autograd.function import OUR_RULES
from torchtrace.autograd.plain import plain_torch

EPS = 1e-6
RTOL = 1e-3
FLAT = 1e-6  # |by the forward| below FLAT * |by the backward|: the forward does not move along v


def _users(rule: type) -> bool:
    trusted = getattr(rule, "_tt_trusted", None)
    return not (trusted if trusted is not None else rule.__module__.startswith(OUR_RULES))


def _float64(t: Any) -> Any:
    if isinstance(t, torch.Tensor) and t.is_floating_point():
        return t.detach().as_subclass(torch.Tensor).double()
    return t


def _dot(a: Any, b: Any) -> float:
    return float((_float64(a) * _float64(b)).sum())


class CustomRules:
    """Observers of the forward (each user rule's arguments) and of the backward (what it received and sent)."""

    def __init__(self) -> None:
        self.calls: Dict[Any, Tuple[tuple, dict, Any]] = {}
        self.steps: Dict[Any, Tuple[list, tuple]] = {}

    def on_record(self, node: Any, args: tuple, kwargs: dict, result: Any) -> None:
        if _users(node.rule):
            self.calls[node] = (args, kwargs, result)

    def on_backward(self, node: Any, grads: List[Any], result: Any) -> None:
        if node in self.calls:
            self.steps[node] = (list(grads), result if isinstance(result, tuple) else (result,))

    def disagreements(self) -> List[Tuple[Any, float, float]]:
        """(node, <u, J v> by its backward, by finite differences of its forward) for each rule that disagrees."""
        found = []
        for node, (grads, sent) in self.steps.items():
            args, kwargs, result = self.calls[node]
            with plain_torch():
                both = _both_ways(node.rule, args, kwargs, result, grads, sent)
            if both is None:
                continue
            by_backward, by_forward = both
            flat = abs(by_forward) <= FLAT * abs(by_backward)
            if not flat and abs(by_backward - by_forward) > RTOL * max(abs(by_backward), abs(by_forward)):
                found.append((node, by_backward, by_forward))
        return found


def _both_ways(rule: type, args: tuple, kwargs: dict, result: Any, grads: list,
               sent: tuple) -> Optional[Tuple[float, float]]:
    """<u, J v> by the rule's backward and by central differences of its forward, in float64 (None: not checkable)."""
    x = [_float64(a) for a in args]
    generator = torch.Generator().manual_seed(0)
    v = {i: torch.randn(a.shape, generator=generator, dtype=torch.float64) for i, a in enumerate(x)
         if isinstance(a, torch.Tensor) and a.is_floating_point() and i < len(sent) and sent[i] is not None}
    if not v:
        return None
    by_backward = sum(_dot(sent[i], direction) for i, direction in v.items())

    def forward(sign: float) -> List[Any]:
        moved = [a + sign * EPS * v[i] if i in v else a for i, a in enumerate(x)]
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(0)
            out = rule.apply(*moved, **{k: _float64(a) for k, a in kwargs.items()})
        return list(out) if isinstance(out, (tuple, list)) else [out]

    recorded = [_float64(r) for r in (result if isinstance(result, (tuple, list)) else [result])]
    try:
        again, plus, minus = forward(0.0), forward(1.0), forward(-1.0)
        if not all(torch.allclose(a, r, rtol=1e-5, atol=1e-6) for a, r in zip(again, recorded)
                   if isinstance(r, torch.Tensor) and r.is_floating_point() and isinstance(a, torch.Tensor)):
            return None
    except Exception:  # (a forward written for one dtype, or a result of another shape)
        return None
    by_forward = sum(_dot(u, (p - m) / (2 * EPS)) for u, p, m in zip(grads, plus, minus)
                     if u is not None and isinstance(p, torch.Tensor) and p.is_floating_point())
    return (by_backward, by_forward) if math.isfinite(by_backward) and math.isfinite(by_forward) else None
