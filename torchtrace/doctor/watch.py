"""The doctor's observers: what it notes while the forward records ops and while the backward runs rules.

`Watch.on_record` keeps each op's source line and the first op that made an Inf from finite inputs or a
NaN from inputs without one; `Watch.on_backward` keeps the first rule whose gradient stopped being finite
while the gradient it received was finite, the rules that killed or saturated most of their gradient, and
the gradient each leaf received. The findings are assembled by `diagnosis.py` once both passes are done.
"""
import math
from typing import Any, Dict, List, Optional, Tuple

import torch

from torchtrace.autograd.node import AccumulateGrad, Node, edge_gradient
from torchtrace.autograd.plain import plain_torch
from torchtrace.doctor import gates, normalisation  # noqa: F401  (registers the normalisations' causes)
from torchtrace.doctor.causes import INF_MADE_NAN
from torchtrace.doctor.custom_rules import CustomRules
from torchtrace.doctor.findings import Finding
from torchtrace.doctor.nonfinite import backward_cause, forward_cause
from torchtrace.doctor.origins import DEAD_RULES, with_origins, zero_share
from torchtrace.doctor.values import all_finite, has_inf, has_nan, tensors_in
from torchtrace.doctor.where import math_line, user_line
from torchtrace.inspect.scope import path_name


def _numbers_finite(args: tuple, kwargs: dict) -> bool:
    numbers = [a for a in (*args, *kwargs.values()) if isinstance(a, float)]
    return all(math.isfinite(a) for a in numbers)


class Watch:
    """Observers for one diagnosis; `names` maps id(module) -> its dotted name (filled in once the models are
    known: findings name modules when they are made, after both passes)."""

    def __init__(self, names: Dict[int, str]) -> None:
        self.names = names
        self.lines: Dict[Node, Tuple[str, str]] = {}
        self.recorded = 0
        self.nonfinite: Dict[Node, int] = {}  # ops whose result had a NaN or Inf -> their place in the recording
        self.origins: Dict[Node, Tuple[bool, Tuple[str, str]]] = {}  # those whose inputs had none: (NaN?, cause)
        self.fed_inf: set = set()  # origins of a NaN made of an Inf of their inputs that no cause explains
        self.inf_from_outside = False  # forward_findings: the first NaN was made of an Inf no recorded op made
        self.backward_first: Optional[Finding] = None
        self.gated: Dict[Tuple[str, str, str], Finding] = {}
        self.leaf_grads: Dict[int, torch.Tensor] = {}
        self.dead: Dict[Node, Tuple[int, float]] = {}  # each ReLU -> (its place in the recording, share of zeros)
        self.ran = 0
        self.custom = CustomRules()  # a user's own rules, checked against their forward once both passes ran

    def finding(self, node: Node, kind: str, phase: str, message: str, advice: str,
                share: Optional[float] = None) -> Finding:
        line, code = self.lines.get(node, ("", ""))
        return Finding(kind, phase, node.rule.__name__, math_line(node), path_name(node.module_path, self.names),
                       line, message, advice, share, code, node)

    # ---------------------------------------------------------------------------------------- forward

    def on_record(self, node: Node, args: tuple, kwargs: dict, result: Any) -> None:
        self.recorded += 1
        self.lines[node] = user_line()
        self.custom.on_record(node, args, kwargs, result)
        if node.rule.__name__ in DEAD_RULES:
            self.dead[node] = (self.recorded, zero_share(result))
        self.note_values(node, args, kwargs, result, forward_cause)

    def note_values(self, node: Node, args: tuple, kwargs: dict, result: Any, cause: Any) -> None:
        """Whether the op made a NaN or Inf from inputs without one, and `cause(rule, args, kwargs, result)`, why."""
        nan_out, inf_out = has_nan(result), has_inf(result)
        if not (nan_out or inf_out):
            return
        self.nonfinite[node] = self.recorded
        inputs = [*args, *kwargs.values()]
        if (nan_out and not has_nan(inputs)) or (inf_out and all_finite(inputs) and _numbers_finite(args, kwargs)):
            self.origins[node] = (nan_out, cause(node.rule, args, kwargs, result))
            if INF_MADE_NAN in self.origins[node][1][0]:  # no cause at this op explains the Inf it was fed
                self.fed_inf.add(node)

    def forward_findings(self, root: Any) -> List[Finding]:
        """The ops that made a NaN or Inf out of values without one, on a chain of non-finite results that reaches
        `root` (an Inf absorbed on the way, as a -inf mask is by softmax, is not a cause): the first Inf and the
        first NaN, in the order they were recorded. `inf_from_outside` tells when that NaN was made of an Inf that
        no recorded op made (a parameter, an input, a write under no_grad)."""
        reached, stack, seen = [], [root], {root}
        while stack:
            node = stack.pop()
            if node in self.origins:
                reached.append(node)
            for edge in node.edges:
                if edge.node in self.nonfinite and edge.node not in seen:
                    seen.add(edge.node)
                    stack.append(edge.node)
        reached.sort(key=self.nonfinite.__getitem__)
        first_inf = next((n for n in reached if not self.origins[n][0]), None)
        first_nan = next((n for n in reached if self.origins[n][0]), None)
        chosen = sorted({n for n in (first_inf, first_nan) if n is not None}, key=self.nonfinite.__getitem__)
        self.inf_from_outside = first_inf is None and first_nan in self.fed_inf
        return [self.finding(n, "nonfinite", "forward", *self.origins[n][1]) for n in chosen]

    def custom_rule_findings(self) -> List[Finding]:
        """The user's rules whose backward disagrees with finite differences of their forward (custom_rules.py)."""
        disagreeing = self.custom.disagreements()
        return [self.finding(node, "wrong_rule", "backward", f"the backward of {node.rule.__name__} is not the "
                             f"derivative of its forward: along a random direction v of its inputs, <u, J v> (u the "
                             f"gradient it received) is {by_backward:.6g} by its backward and {by_forward:.6g} by "
                             "central differences of its forward (float64)",
                             f"check {node.rule.__name__}.backward's formula against its forward: "
                             f"tt.gradcheck({node.rule.__name__}.apply, inputs) checks it alone, tt.check(fn, *args) "
                             "names the first wrong step") for node, by_backward, by_forward in disagreeing]

    def gated_findings(self) -> List[Finding]:
        """The killed and saturated rules, each dead layer that follows from an earlier one marked as its
        consequence (and the earlier one added when no gradient reached it)."""
        killed = [f for f in self.gated.values() if f.kind == "killed"]
        make = lambda node, message, advice, share: self.finding(node, "killed", "forward", message, advice, share)  # noqa: E731
        return with_origins(killed, self.dead, make) + [f for f in self.gated.values() if f.kind != "killed"]

    # --------------------------------------------------------------------------------------- backward

    def on_backward(self, node: Node, grads: List[Any], result: tuple) -> None:
        self.ran += 1
        self.custom.on_backward(node, grads, result)
        for edge in node.edges:
            if type(edge.node) is AccumulateGrad:
                g = edge_gradient(edge, result)
                if g is not None:
                    key = id(edge.node.variable)
                    with plain_torch():
                        self.leaf_grads[key] = g if key not in self.leaf_grads else self.leaf_grads[key] + g
        incoming_finite = all_finite(list(grads))
        if not incoming_finite:
            return
        if self.backward_first is None and not all_finite(list(result)):
            message, advice = backward_cause(node, list(grads), result)
            self.backward_first = self.finding(node, "nonfinite", "backward", message, advice)
            return
        self._gate(node, grads, result)

    def _gate(self, node: Node, grads: List[Any], result: tuple) -> None:
        name = node.rule.__name__
        known = gates.KILLING.get(name) or gates.SATURATING.get(name)
        if known is None or not result or not isinstance(result[0], torch.Tensor) or not tensors_in(grads[:1]):
            return
        killed, saturated, units = gates.gate_shares(grads[0], result[0])
        why, advice = known
        saturated += killed  # tanh' and sigmoid' round to exactly 0 far from 0
        if name in gates.KILLING and killed >= gates.KILLED_SHARE:
            finding = self.finding(node, "killed", "backward", f"{killed:.0%} of the gradient's elements stop here "
                                   f"({units:.0%} of the units pass nothing for any example): {why}", advice, killed)
        elif name in gates.SATURATING and saturated >= gates.SATURATED_SHARE:
            finding = self.finding(node, "saturated", "backward", f"{saturated:.0%} of the gradient's elements "
                                   f"leave shrunk below 1% of what arrived: {why}", advice, saturated)
        else:
            return
        key = (name, finding.module, finding.line)
        if key not in self.gated or (finding.share or 0) > (self.gated[key].share or 0):
            self.gated[key] = finding
