"""The backprop trace: one line per node (or per layer), in the order gradients flow.

A chain of layers prints exactly as the original torchtrace did. Otherwise every line gets a number, every
leaf a line of its own (named when its model or `params` names it), and lines say where gradients merge (a
tensor used several times: its gradients are summed) and where they branch (an op with several
differentiable inputs). The glyphs exist in DejaVu Sans Mono, Jupyter's usual monospace font on Linux.
Walks are iterative, so graphs of any depth print.
"""
from typing import Any, Dict, List, NamedTuple, Optional, Set

import torch

from torchtrace.autograd.engine import grad, topological_order
from torchtrace.autograd.node import AccumulateGrad, Node
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import observing
from torchtrace.inspect.names import Names, Params
from torchtrace.inspect.recorded import require_tracers


def _layer(node: Any) -> Optional[torch.nn.Module]:
    """The layer (a module without sub-modules) that recorded this node, if any."""
    module = node.module
    return module if module is not None and not module._modules else None


def _layer_text(module: torch.nn.Module, node: Node) -> str:
    describe = getattr(module, "original_repr", None)
    text = (describe() if callable(describe) else None) or repr(module).splitlines()[0]
    shapes = (node.notes or {}).get("call_shapes")
    if shapes:  # noted only for layers whose class sets trace_grad_shapes
        text += f"   GRAD:{shapes[1]} -> {shapes[0]}"
    return text


def _op_text(node: Node) -> str:
    """`Sum()`, `View((3, -1))`: the rule's name and the shape arguments it was called with."""
    args = getattr(node.ctx, "args", None)
    shown = args[0] if args and len(args) == 1 and isinstance(args[0], (tuple, list)) else args
    return f"{node.rule.__name__}({tuple(shown) if shown else ''})"


def leaf_names(order: List[Any], params: Params = None) -> Dict[int, str]:
    """id(leaf tensor) -> its name: from `params` (a model's `0.weight`, or a dict such as {"w": w}),
    else from the outermost module that ran an op using it (the model that was called)."""
    names = Names(params, "tt.show")
    models = {id(node.module_path[0]): node.module_path[0] for node in order
              if not isinstance(node, AccumulateGrad) and node.module_path}
    for model in models.values():
        for name, tensor in model.named_parameters():
            names.tensors.setdefault(id(tensor), name)
    return names.tensors


def _absorbed(node: AccumulateGrad, senders: List[Any]) -> bool:
    """A parameter used by one op of its own layer: the layer's line stands for it (the original format)."""
    if len(senders) != 1:
        return False
    layer = _layer(senders[0])
    return layer is not None and any(p is node.variable for p in layer.parameters(recurse=False))


def _lines_for(order: List[Any], modules: bool, absorb: bool) -> List[List[Any]]:
    """Group nodes into printed lines: consecutive nodes of one layer share a line (modules=True).

    Every leaf gets a line of its own, except (absorb=True) a parameter its layer's line stands for.
    """
    senders: Dict[Any, List[Any]] = {}
    for node in order:
        for edge in node.edges:
            senders.setdefault(edge.node, []).append(node)
    groups: List[List[Any]] = []
    accumulated: set = set()
    for node in order:
        if isinstance(node, AccumulateGrad):
            if not (absorb and modules and _absorbed(node, senders.get(node, []))):
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
    """`[1], [2], [2]`; a long list is compressed: runs `[3]..[9]`, repeats `[2] x3`, then `... 9 more`."""
    if len(lines) <= 6:
        return ", ".join(f"[{k}]" for k in lines)
    counts: Dict[int, int] = {}
    for k in lines:
        counts[k] = counts.get(k, 0) + 1
    parts: List[str] = []
    keys = sorted(counts)
    start = 0
    while start < len(keys):
        end = start
        while end + 1 < len(keys) and keys[end + 1] == keys[end] + 1 and counts[keys[end + 1]] == counts[keys[start]]:
            end += 1
        times = f" x{counts[keys[start]]}" if counts[keys[start]] > 1 else ""
        if end - start >= 2:
            parts.append(f"[{keys[start]}]..[{keys[end]}]{times}")
            start = end + 1
        else:
            parts.append(f"[{keys[start]}]{times}")
            start += 1
    if len(parts) > 6:
        parts = [*parts[:3], f"... {len(parts) - 5} more", *parts[-2:]]
    return ", ".join(parts)


def _shape_text(shape: Any) -> str:
    return str(tuple(shape))


def _leaf_text(node: AccumulateGrad, names: Dict[int, str]) -> str:
    name = names.get(id(node.variable))
    return f"leaf{' ' + name if name else ''}, shape {_shape_text(node.variable.shape)} -> .grad"


def backprop_lines(output: torch.Tensor, shapes: bool = False, norms: Optional[Dict[Any, float]] = None,
                   modules: bool = True, params: Params = None) -> List[str]:
    """The lines `output.backward(show=True)` prints. `shapes` adds gradient shapes, `norms` gradient norms.

    A chain of layers prints as the original torchtrace did (a layer's line stands for its parameters).
    Otherwise every line is numbered and every leaf has a line, named from `params` or its model
    (`leaf 0.weight, shape (3, 2) -> .grad`); a line that receives several gradients says
    `⊕ sums N gradients from [i], [j], ...` (leaves included: they sum into .grad), and a line whose op
    sends gradients to several lines says `⇉ sends to [i], [j], ...`.
    """
    if output.grad_fn is None:
        return ["BackProp:", "↘︎ Input"]
    order = topological_order([output.grad_fn])
    names = leaf_names(order, params)
    groups = _lines_for(order, modules, absorb=True)
    links = _links(order, groups)
    if not links.chain:
        groups = _lines_for(order, modules, absorb=False)
        links = _links(order, groups)
    lines = ["BackProp:"]
    for i, group in enumerate(groups):
        first = group[0]
        if isinstance(first, str):  # announced by a leaf's hook, e.g. a bucket's all-reduce
            lines.append(f"↘︎ {first}" if links.chain else f"↘︎ [{i}] {first}")
            continue
        if isinstance(first, AccumulateGrad):
            text = _leaf_text(first, names)
        else:
            layer = _layer(first) if modules else None
            text = _layer_text(layer, group[-1]) if layer is not None else _op_text(first)
            if not modules and first.module is not None:
                text += f"  [in {type(first.module).__name__}]"
        if shapes:
            shape = output.shape if first is output.grad_fn else links.out_shape.get(first, ())
            text += f"  grad shape {_shape_text(shape)}"
        if norms is not None and first in norms:
            text += f"  |grad| {norms[first]:.4g}"
        if not links.chain:
            merged = sorted(links.senders.get(i, ()))
            branches = sorted(links.receivers.get(i, ()))
            text = f"[{i}] {text}"
            if len(merged) > 1:  # several gradients: summed, or one per output of a multi-output op (split)
                text += (f"  ⊕ sums {len(merged)} gradients from {_sources(merged)}" if i in links.summed
                         else f"  gathers the gradients of its outputs from {_sources(merged)}")
            text += f"  ⇉ sends to {_sources(branches)}" if len(branches) > 1 else ""
        lines.append(f"↘︎ {text}")
    lines.append("↘︎ Input")
    return lines


class _Links(NamedTuple):
    senders: Dict[int, List[int]]  # line -> the lines whose gradients reach it, once per gradient
    receivers: Dict[int, List[int]]  # line -> the lines it sends gradients to
    summed: Set[int]  # lines whose node output receives several gradients (summed)
    out_shape: Dict[Any, Any]  # node -> the shape of the gradient it receives
    chain: bool


def _links(order: List[Any], groups: List[List[Any]]) -> _Links:
    """Which printed line sends gradients to which, and whether the lines form a chain."""
    line_of = {node: i for i, group in enumerate(groups) for node in group}
    senders: Dict[int, List[int]] = {}
    per_output: Dict[Any, int] = {}  # (node, output nr) -> how many gradients reach that output
    out_shape: Dict[Any, Any] = {}
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
    return _Links(senders, receivers, summed, out_shape, chain)


def show(output: torch.Tensor, shapes: bool = False, norms: bool = False, modules: bool = True,
         params: Params = None) -> None:
    """Print the backprop trace of `output`.

    params names the leaves: a model (its parameters' dotted names) or a dict such as {"w": w, "b": b}.
    norms=True prints the norm of the gradient arriving at each line. To measure it, show runs a backward of its
    own, as tt.grad does: the graph is kept and no `.grad` changes, so your own `output.backward()` afterwards
    works and fills `.grad` exactly as it would have without show. modules=False prints one line per op, with the
    module it ran in.
    """
    require_tracers("tt.show", [output])
    measured = _gradient_norms(output) if norms else None
    print("\n".join(backprop_lines(output, shapes, measured, modules, params)))


def _gradient_norms(output: torch.Tensor) -> Dict[Any, float]:
    """node -> |gradient| reaching it in a backward of `output` that keeps the graph and leaves every .grad alone."""
    measured: Dict[Any, float] = {}
    if output.grad_fn is None:
        return measured

    def measure(node: Node, grads: Any, result: Any) -> None:
        measured[node] = float(sum(g.double().norm() ** 2 for g in grads if g is not None) ** 0.5)

    leaves = [node for node in topological_order([output.grad_fn]) if isinstance(node, AccumulateGrad)]
    with observing(on_backward=measure):
        reached = grad(output, [leaf.variable for leaf in leaves], retain_graph=True, allow_unused=True)
    for leaf, gradient in zip(leaves, reached):
        if gradient is not None:
            with plain_torch():
                measured[leaf] = gradient.detach().double().norm().item()  # what a backward adds to .grad
    return measured
