"""tt.explore: step through a backward pass, one rule at a time, with the numbers.

    ex = tt.explore(L)          # runs the backward (every .grad as after L.backward()), recording each step
    ex                          # in Jupyter: the player (a widget)
    print(ex.steps[0])          # a step, with its numbers
    ex.save("backward.html")    # one self-contained page with the same player

Python collects the steps (collect.py: the engine's own backward, watched); the front end
(player.js, player.css) only displays them, laid out in the page, so no Graphviz is needed.
"""
import dataclasses
import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Union

import torch

from torchtrace.inspect.explore.collect import Collector, GraphEdge, GraphNode
from torchtrace.inspect.explore.page import page
from torchtrace.inspect.explore.shown import matrix_text
from torchtrace.inspect.explore.steps import Sent, Step
from torchtrace.inspect.names import Params

__all__ = ["explore", "Exploration", "Step", "Sent"]


class Exploration:
    """The record of one backward pass: `steps` in the order the engine ran them, and the graph to draw."""

    def __init__(self, steps: List[Step], nodes: List[GraphNode], edges: List[GraphEdge], title: str) -> None:
        self.steps, self.nodes, self.edges, self.title = steps, nodes, edges, title

    def data(self) -> Dict[str, Any]:
        """Everything the player shows, as JSON-ready dicts (the numbers already written as text)."""
        steps = []
        for step in self.steps:
            record = dataclasses.asdict(step)
            for sent, out in zip(step.sent, record["sent"]):
                out["local"] = sent.local_text or None
                check = sent.check
                out["check"] = None if check is None else {
                    "rule": _matrix(check.rule), "estimate": _matrix(check.estimate), "agrees": check.agrees,
                    "max_difference": None if check.max_difference is None else f"{check.max_difference:.2g}",
                    "why_not": check.why_not}
            steps.append(record)
        return {"title": self.title, "steps": steps, "nodes": [dataclasses.asdict(n) for n in self.nodes],
                "edges": [dataclasses.asdict(e) for e in self.edges]}

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
        try:
            return self.widget()._repr_mimebundle_(include=include, exclude=exclude)
        except ImportError:
            return {"text/plain": repr(self)}

    def __repr__(self) -> str:
        rules = sum(1 for s in self.steps if s.kind == "rule")
        return f"<tt.explore: {len(self.steps)} steps ({rules} rules, {len(self.steps) - rules} sums into .grad)>"

    def __str__(self) -> str:
        return "\n".join(str(step) for step in self.steps)


def _matrix(rows: Optional[List[List[float]]]) -> Optional[str]:
    return None if rows is None else matrix_text(rows)


def _named(params: Any, variables: Mapping[str, Any]) -> Params:
    """A list (or generator) of tensors becomes (name, tensor) pairs, named by the caller's variables holding them."""
    if params is None or isinstance(params, (torch.nn.Module, Mapping)):
        return params
    params = list(params)
    if not all(isinstance(p, torch.Tensor) for p in params):
        return params  # (name, tensor) pairs
    held = {id(v): k for k, v in variables.items() if isinstance(v, torch.Tensor) and not k.startswith("_")}
    return [(held.get(id(p), f"params[{i}]"), p) for i, p in enumerate(params)]


def explore(output: torch.Tensor, params: Params = None, gradient: Optional[torch.Tensor] = None,
            retain_graph: Optional[bool] = None) -> Exploration:
    """Run `output.backward(gradient, retain_graph)` and record every step of it.

    Leaves are named by `params` (a module, a dict name -> tensor, (name, tensor) pairs, or a list of tensors named
    by the variables that hold them, else `params[i]`), else by the
    parameter names of the tt.nn or ported model the ops ran in, else by the caller's variable names
    (tensors of the graph held in local variables, intermediate results included). Ops whose forward
    ran inside `tt.recording()` show their values, and small ones get a finite-difference check of
    their local derivative.
    """
    caller = sys._getframe(1).f_locals
    collector = Collector(output, _named(params, caller), caller)
    collector.run(gradient, retain_graph)
    steps, nodes, edges = collector.build()
    return Exploration(steps, nodes, edges, "torchtrace: stepping through backward")
