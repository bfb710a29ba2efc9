"""Run the backward pass once, through the engine, and write down every step of it.

The engine does the work (so every `.grad` is what `output.backward()` gives); an observer that the
engine calls after each rule (`observing(on_backward=...)`) notes what reached the node, what the rule
saved, and what it sent along each edge, unbroadcast and cast as the engine sends it. Leaves get a
step of their own where the engine sums their gradients into `.grad`.

Each node's value is read before the backward (which frees what rules saved): what the op produced
(produced.py), or why it is not known.
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from torchtrace.autograd import engine
from torchtrace.autograd.node import AccumulateGrad, Node, edge_gradient, leaf_accumulator
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import observing
from torchtrace.inspect.explore.derivative import describe
from torchtrace.inspect.explore.local import estimates, rule_jacobians
from torchtrace.inspect.explore.produced import gone, output_value
from torchtrace.inspect.explore.saved import position_text, saved_label
from torchtrace.inspect.explore.shown import plain, shape_text, tensor_text
from torchtrace.inspect.explore.steps import Sent, Step
from torchtrace.inspect.names import Names, Params, place_nodes
from torchtrace.inspect.recorded import require_tracers
from torchtrace.rule_math import rule_math

Matrix = List[List[float]]

WORK = 1024  # how many extra backward and forward calls a whole exploration may spend on local derivatives and checks


@dataclass
class GraphNode:
    """A node of the drawing: an op, or a leaf (whose step is the sum into its .grad)."""

    id: str
    label: str
    kind: str  # "op", "output", "leaf"
    module: str
    shape: str
    value: str  # '' where the value is not known ...
    value_note: str = ""  # ... and why


@dataclass
class GraphEdge:
    """An edge in the direction gradients flow: from the op that sends to the input that receives."""

    source: str
    target: str
    gradient: str  # '' when no gradient went along it
    step: int  # the index of the step that sent it (-1: none)


@dataclass
class _Ran:
    """What the observer saw of one rule step."""

    upstream: List[Optional[torch.Tensor]]
    saved: List[Tuple[int, Any, str]]  # (index in what the rule saved, tensor, its text)
    sent: List[Optional[torch.Tensor]]
    jacobians: Optional[List[Tuple[Matrix, Optional[Matrix]]]]  # per edge: J, and J before unbroadcasting


def _model_of(order: List[Any]) -> Optional[torch.nn.Module]:
    """The outermost module any op ran in: tt.nn and ported models name their parameters through it."""
    return next((n.module_path[0] for n in order if n.module_path), None)


def _sent(node: Node, edge: Any, result: tuple) -> Optional[torch.Tensor]:
    """What the engine sends along `edge`: the rule's gradient, summed to the input's shape, in its dtype."""
    g = edge_gradient(edge, result)
    return None if g is None else plain(g)


class Collector:
    """Runs the backward and builds the steps and the drawing's nodes and edges."""

    def __init__(self, output: torch.Tensor, params: Params, local_names: Mapping[str, Any],
                 calls: Optional[Mapping[Any, tuple]] = None) -> None:
        require_tracers("tt.explore", [output])
        if not getattr(output, "_tt_requires_grad", False):
            raise RuntimeError("tt.explore needs a tracer that requires grad: make a leaf it depends on require grad "
                               "(tt.tracer(..., requires_grad=True))")
        self.output = output
        self.root = output._tt_node if output._tt_node is not None else leaf_accumulator(output)
        self.order = engine.topological_order([self.root])
        self.names = Names(params if params is not None else _model_of(self.order), "tt.explore")
        self.names.adopt(local_names, self.order)
        self.place = place_nodes(self.order, self.names)
        self.ids = {node: f"n{i}" for i, node in enumerate(self.order)}
        self.work = WORK  # spent step by step, in backward order: a large graph's first small steps get them
        self.ran: Dict[Any, _Ran] = {}
        self.received: Dict[Any, List[Tuple[Any, int, torch.Tensor]]] = {}  # node -> (sender, output nr, gradient)
        self.values: Dict[Tuple[Any, int], str] = {}
        self.leaf_number = {n: i for i, n in enumerate(n for n in self.order if isinstance(n, AccumulateGrad))}
        self.before: Dict[Any, Optional[torch.Tensor]] = {}  # leaf -> its .grad before the backward
        self.calls: Mapping[Any, tuple] = calls or {}  # node -> (args, kwargs, outputs) of its forward
        self.kept: Dict[Any, Tuple[str, str]] = {}  # node -> (value text, why there is none), read before backward

    def observe(self, node: Node, grads: Any, result: tuple) -> None:
        saved = []
        for j, s in enumerate(node.saved):
            if isinstance(s, torch.Tensor):
                saved.append((j, s, tensor_text(s)))
                producer = getattr(s, "_tt_node", None)
                if producer is not None:
                    self.values.setdefault((producer, s._tt_nr), tensor_text(s))
        sent = [_sent(node, edge, result) for edge in node.edges]
        for edge, g in zip(node.edges, sent):
            if g is not None:
                self.received.setdefault(edge.node, []).append((node, edge.output_nr, g))
        cost = sum(g.numel() for g in grads if g is not None)  # one backward call per output element
        jacobians = rule_jacobians(node, grads) if cost <= self.work else None
        if jacobians is not None:
            self.work -= cost
        self.ran[node] = _Ran([plain(g) if g is not None else None for g in grads], saved, sent, jacobians)

    def run(self, gradient: Optional[torch.Tensor], retain_graph: Optional[bool]) -> None:
        self.kept = {node: self._value_now(node) for node in self.order}  # before backward frees saved outputs
        self.before = {n: plain(n.variable.grad) if n.variable.grad is not None else None
                       for n in self.order if isinstance(n, AccumulateGrad)}
        with plain_torch():
            seed = plain(gradient) if gradient is not None else torch.ones_like(self.output).as_subclass(torch.Tensor)
        nr = getattr(self.output, "_tt_nr", 0)
        self.received[self.root] = [(None, nr, seed.to(self.output.dtype))]  # sender None: the output's own seed
        with observing(on_backward=self.observe):
            engine.backward(self.output, gradient, retain_graph)

    # ------------------------------------------------------------------------------------ the record

    def label(self, node: Any) -> str:
        if isinstance(node, AccumulateGrad):
            name = self.names.tensors.get(id(node.variable))
            if name is None:
                kind = "parameter" if isinstance(node.variable, torch.nn.Parameter) else "input"
                name = f"{kind} {self.leaf_number[node]}"
            return name
        named = [self.names.results[(node, nr)][0] for nr in range(node.n_outputs) if (node, nr) in self.names.results]
        return node.rule.__name__ + (f" → {', '.join(named)}" if named else "")

    def _value_now(self, node: Any) -> Tuple[str, str]:
        """(the text of what `node` produced, '') while it is known; else (what is known, why the rest is not)."""
        if isinstance(node, AccumulateGrad):
            return tensor_text(node.variable), ""
        call = self.calls.get(node) or (node.notes or {}).get("call")
        read = [output_value(node, nr, self.names.results, call) for nr in range(node.n_outputs)]
        texts = [text for text, _ in read]
        return "; ".join(texts) if any(texts) else "", "; ".join(why for _, why in read if why)

    def value(self, node: Any) -> Tuple[str, str]:
        """The value's text and, where it is not known, why; a value a rule saved stands in for a lost one. The
        output's too is what its op produced (changed in place since, it is marked as any other)."""
        text, why = self.kept.get(node, ("", gone()))
        if not text and why == gone() and node.n_outputs == 1 and (node, 0) in self.values:
            return self.values[(node, 0)], ""
        return text, why

    def shape(self, node: Any) -> str:
        if isinstance(node, AccumulateGrad):
            return shape_text(node.variable.shape)
        if node is self.root:
            return shape_text(self.output.shape)
        ran = self.ran.get(node)
        if ran is not None:
            return "; ".join(shape_text(g.shape) for g in ran.upstream if g is not None)
        return ""

    def build(self) -> Tuple[List[Step], List[GraphNode], List[GraphEdge]]:
        self.index: Dict[Any, int] = {}
        for node in self.order:
            if node in self.ran or (isinstance(node, AccumulateGrad) and node in self.received):
                self.index[node] = len(self.index)
        index = self.index
        steps = [self._step(node, i) for node, i in index.items()]
        nodes = [GraphNode(self.ids[n], self.label(n), "output" if n is self.root else
                           "leaf" if isinstance(n, AccumulateGrad) else "op",
                           ".".join(self.place.get(n, ())), self.shape(n), *self.value(n)) for n in self.order]
        edges = []
        for node in self.order:
            ran = self.ran.get(node)
            for i, edge in enumerate(node.edges):
                g = ran.sent[i] if ran is not None else None
                edges.append(GraphEdge(self.ids[node], self.ids[edge.node], tensor_text(g) if g is not None else "",
                                       index[node] if g is not None else -1))
        return steps, nodes, edges

    def _parts(self, node: Any) -> List[Tuple[str, str]]:
        """Who sent what to `node` (naming the output it reached, for an op with several)."""
        parts = []
        for sender, nr, g in self.received.get(node, ()):
            who = "the output" if sender is None else f"{self.label(sender)} (step {self.index[sender] + 1})"
            parts.append((who + (f", to output {nr}" if node.n_outputs > 1 else ""), tensor_text(g)))
        return parts

    def _arrived(self, node: Any) -> List[Optional[torch.Tensor]]:
        """The sum of the gradients that reached each output, added in the engine's order."""
        sums: List[Optional[torch.Tensor]] = [None] * node.n_outputs
        for _, nr, g in self.received.get(node, ()):
            sums[nr] = g if sums[nr] is None else sums[nr] + g
        return sums

    def _hook_note(self, hooked: bool, arrived: List[Optional[torch.Tensor]], used: List[Optional[torch.Tensor]],
                   what: str) -> str:
        """'' when no hook could change the gradient, or when what the step used is the sum of what arrived (NaN
        matching NaN); else what a hook made of it."""
        if not hooked:
            return ""
        for a, u in zip(arrived, used):
            if a is not None and u is not None and not torch.allclose(a, u.to(a.dtype), rtol=0, atol=0, equal_nan=True):
                return f"a hook replaced {what} (the gradients that arrived summed to {tensor_text(a)})"
        return ""

    def _step(self, node: Any, i: int) -> Step:
        module = ".".join(self.place.get(node, ()))
        if isinstance(node, AccumulateGrad):
            (total,) = self._arrived(node)
            before, after = self.before.get(node), node.variable.grad
            expected = total if before is None else before + total
            leaf = node.variable
            hooked = bool(getattr(leaf, "_tt_hooks", None) or getattr(leaf, "_tt_post_hooks", None))
            note = self._hook_note(hooked, [expected], [after], "the gradient (or .grad was changed)")
            return Step(i, "accumulate", self.ids[node], self.label(node), module, "", tensor_text(total),
                        self._parts(node), before=tensor_text(before), after=tensor_text(after), note=note)
        ran = self.ran[node]
        saved = [(saved_label(node, s, j, self._name_of), text) for j, s, text in ran.saved]
        call = self.calls.get(node) or (node.notes or {}).get("call")
        cost = 2 * sum(edge.shape.numel() for edge in node.edges) + 1  # two forward calls per input element
        checks = [None] * len(node.edges)
        if ran.jacobians is not None and cost <= self.work:
            checks = estimates(node, call)
            self.work -= cost if call is not None else 0
        outputs = [g.shape for g in ran.upstream if g is not None]
        sent = []
        for k, edge in enumerate(node.edges):
            g = ran.sent[k]
            local = describe(*ran.jacobians[k], outputs, edge.shape) if ran.jacobians is not None else None
            check = checks[k]
            if check is not None:
                check.rule = local.matrix if local is not None else None
            target = edge.node
            who = self.label(target) + ("" if isinstance(target, AccumulateGrad) else " (its output)")
            sent.append(Sent(self.ids[target], f"input {position_text(edge.position)}: {who}",
                             tensor_text(g) if g is not None else "none", local, check))
        upstream = "; ".join(tensor_text(g) for g in ran.upstream)
        name = node.name + self.label(node)[len(node.rule.__name__):]  # MulBackward → e
        hooked = bool(node.hooks or node.pre_hooks)
        note = self._hook_note(hooked, self._arrived(node), ran.upstream, "the upstream gradient")
        return Step(i, "rule", self.ids[node], name, module, rule_math(node.rule), upstream,
                    self._parts(node), saved, sent, gathered=node.n_outputs > 1, note=note)

    def _name_of(self, t: torch.Tensor) -> str:
        """What the student calls tensor `t`: a variable's or parameter's name, or the node that computed it."""
        producer = getattr(t, "_tt_node", None)
        if producer is not None and (producer, t._tt_nr) in self.names.results:
            return self.names.results[(producer, t._tt_nr)][0]
        if producer in self.ids:
            return self.label(producer)
        return self.names.tensors.get(id(t), "")
