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

_guard = torch._C.DisableTorchFunctionSubclass


def _layer(node: Any) -> Optional[torch.nn.Module]:
    """The layer (a module without sub-modules) that recorded this node, if any."""
    module = node.module
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


def _lines_for(order: List[Any], modules: bool) -> List[List[Any]]:
    """Group nodes into printed lines: consecutive nodes of one layer share a line (modules=True).

    A leaf gets a line of its own only when it receives several gradients (they are summed into .grad).
    """
    uses: Dict[Any, int] = {}
    for node in order:
        for edge in node.edges:
            uses[edge.node] = uses.get(edge.node, 0) + 1
    groups: List[List[Any]] = []
    accumulated: set = set()
    for node in order:
        if isinstance(node, AccumulateGrad):
            if uses.get(node, 0) > 1:
                groups.append([node])
            accumulated.add(id(node.variable))
            groups += [[text] for text in _announced(node.variable, accumulated)]
            continue
        layer = _layer(node) if modules else None
        if groups and layer is not None and not isinstance(groups[-1][-1], str) and _layer(groups[-1][-1]) is layer:
            groups[-1].append(node)
        else:
            groups.append([node])
    return groups


def _announced(leaf: Any, accumulated: set) -> List[str]:
    """Lines announced by the leaf's post-accumulate-grad hooks that have a `trace_lines(accumulated)` method (given
    the ids of the leaves accumulated so far), e.g. a bucket all-reduce of tt.nn.parallel.DistributedDataParallel."""
    hooks = getattr(leaf, "_tt_post_hooks", None) or ()
    return [text for hook in hooks if hasattr(hook, "trace_lines") for text in hook.trace_lines(accumulated)]


def _sources(lines: List[int]) -> str:
    return ", ".join(f"[{k}]" for k in lines)


def backprop_lines(output: torch.Tensor, shapes: bool = False, norms: Optional[Dict[Any, float]] = None,
                   modules: bool = True) -> List[str]:
    """The lines `output.backward(show=True)` prints. `shapes` adds gradient shapes, `norms` gradient norms.

    A chain prints one line per layer or op. Where a tensor is used more than once (`x * x + x`),
    its gradients are summed: every line is numbered, a line that receives several gradients says
    `⊕ sums N gradients from [i], [j], ...` (leaves included: they sum into .grad), and a line whose op
    sends gradients to several lines says `⑂ sends to [i], [j], ...`.
    """
    if output.grad_fn is None:
        return ["BackProp:", "↘︎ Input"]
    order = topological_order([output.grad_fn])
    groups = _lines_for(order, modules)
    line_of = {node: i for i, group in enumerate(groups) for node in group}
    senders: Dict[int, List[int]] = {}  # line -> the lines whose gradients reach it, once per gradient
    per_output: Dict[Any, int] = {}  # (node, output nr) -> how many gradients reach that output
    out_shape: Dict[Any, Any] = {output.grad_fn: tuple(output.shape)}
    for node in order:
        for edge in node.edges:
            nxt = edge.node
            out_shape.setdefault(nxt, tuple(edge.shape))
            per_output[(nxt, edge.output_nr)] = per_output.get((nxt, edge.output_nr), 0) + 1
            if nxt in line_of and line_of[nxt] != line_of.get(node):
                senders.setdefault(line_of[nxt], []).append(line_of[node])
    summed = {line_of[n] for (n, _), count in per_output.items() if count > 1 and n in line_of}
    receivers: Dict[int, List[int]] = {}
    for target, sources in senders.items():
        for source in sources:
            receivers.setdefault(source, []).append(target)
    chain = all(len(s) <= 1 for s in senders.values()) and all(len(r) <= 1 for r in receivers.values())
    lines = ["BackProp:"]
    for i, group in enumerate(groups):
        first = group[0]
        if isinstance(first, str):
            lines.append(f"↘︎ {first}" if chain else f"↘︎ [{i}] {first}")
            continue
        if isinstance(first, AccumulateGrad):
            text = f"leaf {list(first.variable.shape)} (.grad)"
        else:
            layer = _layer(first) if modules else None
            text = _layer_text(layer, group[-1]) if layer is not None else _op_text(first)
            if not modules and first.module is not None:
                text += f"  [in {type(first.module).__name__}]"
        if shapes:
            text += f"  grad {list(out_shape.get(first, ()))}"
        if norms is not None and first in norms:
            text += f"  |grad| {norms[first]:.4g}"
        if not chain:
            merged = sorted(senders.get(i, ()))
            branches = sorted(receivers.get(i, ()))
            text = f"[{i}] {text}"
            if len(merged) > 1:  # several gradients: summed, or one per output of a multi-output op (split)
                text += (f"  ⊕ sums {len(merged)} gradients from {_sources(merged)}" if i in summed
                         else f"  gathers the gradients of its outputs from {_sources(merged)}")
            text += f"  ⑂ sends to {_sources(branches)}" if len(branches) > 1 else ""
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
        for node in topological_order([output.grad_fn] if output.grad_fn is not None else []):
            if isinstance(node, AccumulateGrad) and node.variable.grad is not None:
                with _guard():
                    measured[node] = node.variable.grad.detach().double().norm().item()  # what reached .grad
    print("\n".join(backprop_lines(output, shapes, measured, modules)))
