"""tt.explore: step through a backward pass, one rule at a time, with the numbers.

    ex = tt.explore(L)          # runs the backward (every .grad as after L.backward()), recording each step
    ex                          # in Jupyter: the player (a widget)
    print(ex.steps[0])          # a step, with its numbers
    ex.save("backward.html")    # one self-contained page with the same player
    ex.annotate(node, "nonfinite", "the gradient holds NaN", severity="error")   # a diagnosis layer on the page
    side_by_side(ex_a, ex_b, pairs).save("both.html")   # two players stepping in lockstep

Python collects the steps (collect.py: the engine's own backward, watched); the front end
(player.js, player.css) only displays them, laid out in the page, so no Graphviz is needed.
"""
import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

import torch

from torchtrace.inspect.explore.budget import keep_values
from torchtrace.inspect.explore.collect import Collector, GraphEdge, GraphNode
from torchtrace.inspect.explore.derivative import SHOWN
from torchtrace.inspect.explore.holding import run_holding
from torchtrace.inspect.explore.page import iframe, page
from torchtrace.inspect.explore.produced import dropped_notice
from torchtrace.inspect.explore.shown import matrix_text
from torchtrace.inspect.explore.side_by_side import side_by_side
from torchtrace.inspect.explore.steps import Sent, Step
from torchtrace.inspect.names import Params, named_pairs

__all__ = ["explore", "Explorer", "Exploration", "Step", "Sent", "Finding", "side_by_side"]

SEVERITIES = ("info", "warn", "error")


@dataclass
class Finding:
    """A mark on one node's step, shown in the page's diagnosis layer (a badge on the node, the message in its step)."""

    node: str  # the id of the graph node
    kind: str  # what was found: "nonfinite", "killed", ...
    message: str
    severity: str  # "info", "warn" or "error"


class Explorer:
    """The record of one backward pass: `steps` in the order the engine ran them, and the graph to draw."""

    def __init__(self, steps: List[Step], nodes: List[GraphNode], edges: List[GraphEdge], title: str,
                 ids: Optional[Mapping[Any, str]] = None, modules: Optional[Dict[str, str]] = None) -> None:
        self.steps, self.nodes, self.edges, self.title = steps, nodes, edges, title
        self.modules = dict(modules or {})  # module path -> its class name (the label of a collapsed module)
        self._ids = dict(ids or {})  # graph Node (or AccumulateGrad) -> the id its drawing and step carry
        self.findings: List[Finding] = []
        self.notice = dropped_notice([n.value_note for n in nodes])  # how many values are gone, and how to keep them

    def annotate(self, node: Any, kind: str, message: str, severity: str = "warn") -> "Explorer":
        """Mark `node`'s step with a finding: the page shows a badge on the node and the message in its step panel
        (the "diagnosis" button hides or shows them). `node` is a graph Node (`t.grad_fn`, an AccumulateGrad), a
        Step of `self.steps`, or a step's index."""
        if severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {severity!r}")
        self.findings.append(Finding(self._node_id(node), kind, message, severity))
        return self

    def _node_id(self, node: Any) -> str:
        if isinstance(node, Step):
            return node.node
        if isinstance(node, int) and not isinstance(node, bool):
            if not 0 <= node < len(self.steps):
                raise IndexError(f"step {node} is not one of this backward's {len(self.steps)} steps")
            return self.steps[node].node
        found = self._ids.get(node) if not isinstance(node, str) else node
        if found is None or found not in {n.id for n in self.nodes}:
            raise ValueError(f"{node!r} is not a node of this graph: pass a node of the graph tt.explore drew "
                             "(output.grad_fn, ...), one of its steps, or a step index")
        return found

    def data(self) -> Dict[str, Any]:
        """Everything the player shows, as JSON-ready dicts (the numbers already written as text)."""
        steps = []
        for step in self.steps:  # field by field: asdict would deep-copy every Jacobian
            record = {f.name: getattr(step, f.name) for f in dataclasses.fields(step) if f.name != "sent"}
            record["sent"] = [{"to": sent.to, "input": sent.input, "gradient": sent.gradient} for sent in step.sent]
            for sent, out in zip(step.sent, record["sent"]):
                local = sent.local
                out["local"] = None if local is None else {
                    "kind": local.kind, "shape": local.shape, "how": local.how,
                    "text": local.text or f"({len(local.matrix)} x {len(local.matrix[0])} numbers: too many to show)"}
                check = sent.check
                out["check"] = None if check is None else {
                    "rule": _shown(check.rule), "estimate": _shown(check.estimate), "agrees": check.agrees,
                    "detail": check.detail if check.estimate is not None else "", "why_not": check.why_not}
            steps.append(record)
        return {"title": self.title, "steps": steps, "nodes": [dataclasses.asdict(n) for n in self.nodes],
                "edges": [dataclasses.asdict(e) for e in self.edges],
                "findings": [dataclasses.asdict(f) for f in self.findings], "modules": self.modules,
                "notice": self.notice}

    def save(self, path: Union[str, os.PathLike]) -> str:
        """Write the player as one HTML file (script, style and data inlined; nothing from the network)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(page(self.data(), self.title))
        return os.fspath(path)

    def widget(self) -> Any:
        """The Jupyter widget (needs anywidget: pip install anywidget)."""
        try:
            from torchtrace.inspect.explore.widget import ExploreWidget
        except ImportError as missing:
            raise ImportError("the tt.explore widget needs anywidget: pip install anywidget (ex.save('backward.html') "
                              "works without it)") from missing
        return ExploreWidget(self.data(), repr(self))

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Dict[str, Any]:
        """The widget in Jupyter; without anywidget, the saved page's player in an iframe."""
        try:
            return self.widget()._repr_mimebundle_(include=include, exclude=exclude)
        except ImportError:
            return {"text/plain": repr(self), "text/html": iframe(page(self.data(), self.title), self.title, 820)}

    def __repr__(self) -> str:
        rules = sum(1 for s in self.steps if s.kind == "rule")
        notice = f"; {self.notice}" if self.notice else ""
        sums = len(self.steps) - rules
        return f"<tt.explore: {len(self.steps)} steps ({rules} rules, {sums} sums into .grad){notice}>"

    def __str__(self) -> str:
        return "\n".join(str(step) for step in self.steps)


Exploration = Explorer  # the name this class had first


def _shown(rows: Optional[List[List[float]]]) -> Optional[str]:
    """A Jacobian for the check's line: written out when it is small enough to read."""
    if rows is None:
        return None
    return matrix_text(rows) if len(rows) * len(rows[0]) <= SHOWN else f"({len(rows)} x {len(rows[0])})"


def _named(params: Any, variables: Mapping[str, Any]) -> Params:
    """A list (or generator) of tensors becomes (name, tensor) pairs, named by the caller's variables holding them."""
    if params is None or isinstance(params, (torch.nn.Module, Mapping)):
        return params
    held = {id(v): k for k, v in variables.items() if isinstance(v, torch.Tensor) and not k.startswith("_")}
    return named_pairs("tt.explore", params, lambda i, p: held.get(id(p), f"params[{i}]"))


def explore(output: Union[torch.Tensor, Callable[..., torch.Tensor]], *inputs: Any, params: Params = None,
            gradient: Optional[torch.Tensor] = None, retain_graph: Optional[bool] = None) -> Explorer:
    """Run `output.backward(gradient, retain_graph)` and record every step of it.

    `tt.explore(fn, *inputs)` runs `fn(*inputs)` first (tensor inputs become leaves that require grad, named by
    fn's parameters), holding every result, so every node shows its value and small steps get a
    finite-difference check. On a graph built the ordinary way, every node keeps what its op produced while the
    thread's kept results fit `tt.explore.keep_values(bytes)` (2 MB unless set); beyond it a node shows its value
    while something holds it (the caller's variables, a rule that saved it, `tt.recording()`), else says it is gone,
    and the player counts such nodes. A value changed in place after its op is never shown as the op's result.

    Leaves are named by `params` (a module, a dict name -> tensor, (name, tensor) pairs, or a list of tensors named
    by the variables that hold them, else `params[i]`), else by the
    parameter names of the tt.nn or ported model the ops ran in, else by the caller's variable names
    (tensors of the graph held in local variables, intermediate results included).
    """
    caller = sys._getframe(1).f_locals
    calls: Dict[Any, tuple] = {}
    if isinstance(output, torch.Tensor):
        if len(inputs) > 1 or (inputs and params is not None):
            raise TypeError("tt.explore(output, params=None, gradient=None, retain_graph=None): give inputs only "
                            "with a function, tt.explore(fn, *inputs)")
        params = inputs[0] if inputs else params
    elif callable(output):
        output, by_parameter, calls = run_holding(output, inputs)
        caller = {**caller, **by_parameter}
    else:
        raise TypeError(f"tt.explore takes an output tensor or a function and its inputs, not {type(output).__name__}")
    collector = Collector(output, _named(params, caller), caller, calls)
    collector.run(gradient, retain_graph)
    steps, nodes, edges = collector.build()
    return Explorer(steps, nodes, edges, "torchtrace: stepping through backward", collector.ids,
                    {".".join(path): kind for path, kind in collector.names.kinds.items() if path})


explore.keep_values = keep_values  # type: ignore[attr-defined]  # tt.explore.keep_values(bytes): the graph's budget
