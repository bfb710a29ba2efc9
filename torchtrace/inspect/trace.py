"""The backprop trace: one line per node (or per layer), in the order gradients flow.

A chain prints exactly as the original torchtrace did. In a DAG every line gets a number, and lines
say where gradients merge (a tensor used several times: its gradients are summed) and where they branch
(an op with several differentiable inputs). Walks are iterative, so graphs of any depth print.
"""
from typing import Any, Dict, List, Optional

import torch

from torchtrace.autograd.engine import topological_order
from torchtrace.autograd.node import AccumulateGrad, Node
from torchtrace.autograd.state import observing


def _layer(node: Node) -> Optional[torch.nn.Module]:
    """The layer (a module without sub-modules) that recorded this node, if any."""
    module = getattr(node, "module", None)
    return module if module is not None and not module._modules else None


def _layer_text(module: torch.nn.Module, node: Node) -> str:
    describe = getattr(module, "original_repr", None)
    text = (describe() if callable(describe) else None) or repr(module).splitlines()[0]
    shapes = (node.notes or {}).get("call_shapes")
    if getattr(module, "trace_grad_shapes", False) and shapes:
        text += f"   GRAD:{shapes[1]} -> {shapes[0]}"
    return text


def _op_text(node: Node) -> str:
    """`Sum()`, `View((3, -1))`: the rule's name and the shape arguments it was called with."""
    args = getattr(node.ctx, "args", None)
    shown = args[0] if args and len(args) == 1 and isinstance(args[0], (tuple, list)) else args
    return f"{node.rule.__name__}({tuple(shown) if shown else ''})"


def _lines_for(order: List[Node], modules: bool) -> List[List[Node]]:
    """Group nodes into printed lines: consecutive nodes of one layer share a line (modules=True)."""
    groups: List[List[Node]] = []
    for node in order:
        layer = _layer(node) if modules else None
        if groups and layer is not None and _layer(groups[-1][-1]) is layer:
            groups[-1].append(node)
        else:
            groups.append([node])
    return groups


def backprop_lines(output: torch.Tensor, shapes: bool = False, norms: Optional[Dict[Node, float]] = None,
                   modules: bool = True) -> List[str]:
    """The lines `output.backward(show=True)` prints. `shapes` adds gradient shapes, `norms` gradient norms."""
    if output.grad_fn is None:
        return ["BackProp:", "↘︎ Input"]
    order = [n for n in topological_order([output.grad_fn]) if not isinstance(n, AccumulateGrad)]
    groups = _lines_for(order, modules)
    line_of = {node: i for i, group in enumerate(groups) for node in group}
    senders: Dict[int, set] = {}  # line -> lines whose gradients reach it
    out_shape: Dict[Node, Any] = {output.grad_fn: tuple(output.shape)}
    for node in order:
        for edge in node.edges:
            nxt = edge.node
            out_shape.setdefault(nxt, tuple(edge.shape))
            if nxt in line_of and line_of[nxt] != line_of[node]:
                senders.setdefault(line_of[nxt], set()).add(line_of[node])
    receivers: Dict[int, set] = {}
    for target, sources in senders.items():
        for source in sources:
            receivers.setdefault(source, set()).add(target)
    chain = all(len(s) <= 1 for s in senders.values()) and all(len(r) <= 1 for r in receivers.values())
    lines = ["BackProp:"]
    for i, group in enumerate(groups):
        first, layer = group[0], _layer(group[0]) if modules else None
        text = _layer_text(layer, group[-1]) if layer is not None else _op_text(first)
        if not modules and getattr(first, "module", None) is not None:
            text += f"  [in {type(first.module).__name__}]"
        if shapes:
            text += f"  grad {list(out_shape.get(first, ()))}"
        if norms is not None and first in norms:
            text += f"  |grad| {norms[first]:.4g}"
        if not chain:
            merged = sorted(senders.get(i, ()))
            branches = sorted(receivers.get(i, ()))
            text = f"[{i}] {text}"
            text += f"  ⊕ sums gradients from {', '.join(f'[{k}]' for k in merged)}" if len(merged) > 1 else ""
            text += f"  ⑂ sends to {', '.join(f'[{k}]' for k in branches)}" if len(branches) > 1 else ""
        lines.append(f"↘︎ {text}")
    lines.append("↘︎ Input")
    return lines


def show(output: torch.Tensor, shapes: bool = False, norms: bool = False, modules: bool = True) -> None:
    """Print the backprop trace of `output`.

    norms=True runs `output.backward()` itself (it needs the gradients) and prints the norm of the
    gradient arriving at each line; modules=False prints one line per op, with the module it ran in.
    """
    measured: Optional[Dict[Node, float]] = None
    if norms:
        measured = {}

        def measure(node: Node, grads: Any, result: Any) -> None:
            measured[node] = float(sum(g.double().norm() ** 2 for g in grads if g is not None) ** 0.5)

        with observing(on_backward=measure):
            output.backward()
    print("\n".join(backprop_lines(output, shapes, measured, modules)))
