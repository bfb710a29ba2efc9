"""One backward pass written down for tt.diff: each rule step (rule, module, line, what arrived, what it sent) and
the gradient every leaf received.

The run leaves `.grad` as it found it: the gradients of this pass are captured and the leaves' earlier
`.grad` put back, so two passes over the same model do not add up.
"""
import contextlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.nn.modules.module import register_module_forward_pre_hook

from torchtrace.autograd.engine import topological_order
from torchtrace.autograd.node import AccumulateGrad, Node, edge_gradient
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import observing
from torchtrace.doctor.paths import ModulesRan
from torchtrace.doctor.where import math_line, user_line
from torchtrace.inspect.explore.budget import keeping_every_value
from torchtrace.inspect.scope import module_names, module_scope, path_name
from torchtrace.nested import flatten


def _plain(t: Any) -> Optional[torch.Tensor]:
    if not isinstance(t, torch.Tensor):
        return None
    with plain_torch():
        return t.detach().as_subclass(torch.Tensor).clone()


@dataclass
class RuleStep:
    """One rule of the backward: what reached it and what it sent along each edge (plain tensors)."""

    rule: str
    math: str
    module: str
    line: str
    code: str
    incoming: List[Optional[torch.Tensor]]
    sent: List[Optional[torch.Tensor]]
    node: Any = field(default=None, repr=False)

    @property
    def key(self) -> Tuple[str, str]:
        return self.rule, self.module


@dataclass
class ForwardOp:
    """One recorded op of the forward and the value it computed (a plain copy of its first output)."""

    rule: str
    module: str
    line: str
    value: Optional[torch.Tensor]

    @property
    def key(self) -> Tuple[str, str]:
        return self.rule, self.module


@dataclass
class Pass:
    """A forward and backward of one function: the loss, the rule steps in backward order, the leaf gradients."""

    loss: float
    steps: List[RuleStep]
    leaf_grads: Dict[Any, torch.Tensor]  # leaf key -> the gradient this pass gave it
    leaf_names: Dict[Any, str]  # leaf key -> its name (a parameter's from its model, "argument i" for an input)
    leaf_order: List[Any]  # the leaf keys in the order the backward reached them
    recorded: List[Node] = field(default_factory=list, repr=False)  # the forward's nodes, in recording order
    forward: List[ForwardOp] = field(default_factory=list, repr=False)  # their values (names once the models are known)
    explorer: Any = field(default=None, repr=False)  # the tt.explore record of this backward, when asked for


def _fresh(args: tuple) -> Tuple[tuple, List[torch.Tensor]]:
    """Copies of the tracer arguments that need a gradient (each pass its own leaves), and those copies."""
    leaves, rebuild = flatten(list(args))
    copies, fresh = [], []
    for t in leaves:
        if getattr(t, "_tt_requires_grad", False) and t._tt_node is None:
            with plain_torch():
                c = t.detach().clone().as_subclass(type(t))  # a fresh leaf tracer, without the old one's graph
            c.requires_grad_(True)
            fresh.append(c)
            copies.append(c)
        else:
            copies.append(t)
    return tuple(rebuild(copies)), fresh


def _leaf_keys(models: List[torch.nn.Module], fresh: List[torch.Tensor]) -> Dict[int, Tuple[Any, str]]:
    """id(leaf) -> (key, name): the same parameter object has the same key in both passes, argument i is ("argument",
    i) (each pass has its own copy)."""
    keys: Dict[int, Tuple[Any, str]] = {id(t): (("argument", i), f"argument {i}") for i, t in enumerate(fresh)}
    for model in models:
        for name, p in model.named_parameters():
            keys.setdefault(id(p), (("parameter", id(p)), name))
    return keys


def record_pass(fn: Any, args: tuple, kwargs: dict, explore: bool = False, tool: str = "tt.diff") -> Pass:
    """Run fn(*args) and the backward of its scalar result, writing down every rule step (with `explore`, the
    backward runs through tt.explore, whose record the Pass keeps for the player)."""
    call_args, fresh = _fresh(args)
    lines: Dict[Node, Tuple[str, str]] = {}
    values: List[Optional[torch.Tensor]] = []

    def note(node: Node, args: tuple, kwargs: dict, result: Any) -> None:
        lines[node] = user_line()
        values.append(_plain(result[0] if isinstance(result, (tuple, list)) and result else result))

    ran = ModulesRan()
    handle = register_module_forward_pre_hook(ran)
    try:
        with module_scope(), observing(on_record=note), keeping_every_value() if explore else contextlib.nullcontext():
            output = fn(*call_args, **kwargs)  # the player shows every value
    finally:
        handle.remove()
    scalars = [t for t in flatten(output)[0] if isinstance(t, torch.Tensor) and t.numel() == 1]
    if not scalars or not getattr(scalars[0], "_tt_requires_grad", False):
        raise RuntimeError(f"{tool}: the function must return a scalar tracer that requires grad (the loss); port the "
                           "model first (tt.port(model)) so its parameters are tracers, or pass tracers that require "
                           "grad as inputs")
    loss = scalars[0]
    names: Dict[int, str] = {}
    for model in ran.roots():
        names.update(module_names(model))
    root = loss._tt_node
    order = topological_order([root]) if root is not None else []
    leaves = [n.variable for n in order if isinstance(n, AccumulateGrad)]
    leaf_key = _leaf_keys(ran.roots(), fresh)
    keys = [leaf_key.get(id(leaf), (("leaf", id(leaf)), f"leaf {i}")) for i, leaf in enumerate(leaves)]
    kept = {id(leaf): leaf.grad for leaf in leaves}
    for leaf in leaves:
        leaf.grad = None
    steps: List[RuleStep] = []

    def observe(node: Node, grads: List[Any], result: tuple) -> None:
        line, code = lines.get(node, ("", ""))
        steps.append(RuleStep(node.rule.__name__, math_line(node), path_name(node.module_path, names), line, code,
                              [_plain(g) for g in grads], [_plain(edge_gradient(e, result)) for e in node.edges],
                              node))

    explorer = None
    with observing(on_backward=observe):
        if explore:
            from torchtrace.inspect.explore import explore as explore_backward

            explorer = explore_backward(loss, params=ran.roots()[0] if len(ran.roots()) == 1 else None)
        else:
            loss.backward()
    grads = {}
    for (key, _), leaf in zip(keys, leaves):
        grads[key] = _plain(leaf.grad)
        leaf.grad = kept[id(leaf)]
    with plain_torch():
        value = float(loss.detach())
    forward = [ForwardOp(node.rule.__name__, path_name(node.module_path, names), lines[node][0], v)
               for node, v in zip(lines, values)]
    return Pass(value, steps, grads, dict(keys), [key for key, _ in keys], list(lines), forward, explorer)
