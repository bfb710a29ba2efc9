"""backward(): an iterative reverse-topological walk that calls each Node's rule and accumulates gradients."""
import contextlib
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from torchtrace.autograd import dispatch
from torchtrace.autograd.function import AccumulateGrad, BackwardMode, Node
from torchtrace.autograd.observers import ON_BACKWARD

_guard = torch._C.DisableTorchFunctionSubclass
Tensors = Union[torch.Tensor, Sequence[torch.Tensor]]


def backward(
    tensors: Tensors,
    grad_tensors: Optional[Tensors] = None,
    retain_graph: Optional[bool] = None,
    create_graph: bool = False,
) -> None:
    """Accumulate d(tensors)/d(leaf) * grad_tensors into every leaf's `.grad`."""
    roots = _roots(tensors, grad_tensors, create_graph)
    _run(roots, create_graph if retain_graph is None else retain_graph, create_graph, None)


def grad(
    outputs: Tensors,
    inputs: Tensors,
    grad_outputs: Optional[Tensors] = None,
    retain_graph: Optional[bool] = None,
    create_graph: bool = False,
    allow_unused: bool = False,
) -> Tuple[Optional[torch.Tensor], ...]:
    """Return d(outputs)/d(inputs) * grad_outputs without touching any `.grad`."""
    inputs = _as_list(inputs)
    targets = [_edge_of(t, f"input {i}") for i, t in enumerate(inputs)]
    captured: Dict[Tuple[Any, int], Any] = {edge: None for edge in targets}
    roots = _roots(outputs, grad_outputs, create_graph)
    _run(roots, create_graph if retain_graph is None else retain_graph, create_graph, captured)
    result = tuple(captured[edge] for edge in targets)
    if not allow_unused and any(g is None for g in result):
        raise RuntimeError(
            "One of the differentiated tracers was not used to compute the outputs. "
            "Pass allow_unused=True to get None for it."
        )
    return result


def _as_list(tensors: Any) -> List[Any]:
    return [tensors] if tensors is None or isinstance(tensors, torch.Tensor) else list(tensors)


def _edge_of(t: Any, what: str) -> Tuple[Any, int]:
    if not (isinstance(t, dispatch.TRACER) and t._tt_requires_grad):
        raise RuntimeError(
            f"{what} does not require grad and has no grad_fn: make a leaf tracer it depends on "
            "require grad (tt.tracer(..., requires_grad=True) or x.requires_grad_())."
        )
    if t._tt_node is None:
        return dispatch.leaf_accumulator(t), 0
    return t._tt_node, t._tt_nr


def _roots(tensors: Tensors, grads: Optional[Tensors], create_graph: bool) -> List[Tuple[Any, int, Any]]:
    tensors = _as_list(tensors)
    grads = [None] * len(tensors) if grads is None else _as_list(grads)
    roots = []
    with _guard():
        for i, (t, g) in enumerate(zip(tensors, grads)):
            node, nr = _edge_of(t, f"element {i} of the tensors passed to backward")
            if g is None:
                if t.numel() != 1:
                    raise RuntimeError(
                        f"grad can be implicitly created only for scalar outputs, but this output has shape "
                        f"{tuple(t.shape)}: pass gradient= (a tensor of that shape), or reduce it (e.g. .sum())."
                    )
                g = torch.ones_like(t)
            elif g.shape != t.shape:
                raise RuntimeError(f"gradient has shape {tuple(g.shape)} but the output has shape {tuple(t.shape)}")
            g = g.as_subclass(dispatch.TRACER if create_graph else torch.Tensor)
            roots.append((node, nr, g))
    return roots


def _topological_order(roots: List[Any]) -> List[Any]:
    """Reverse post-order of an iterative depth-first search: every node comes before the nodes it feeds."""
    order, seen = [], set()
    for root in roots:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(root.inputs))]
        while stack:
            node, edges = stack[-1]
            for edge in edges:
                nxt = edge[1]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, iter(nxt.inputs)))
                    break
            else:
                stack.pop()
                order.append(node)
    order.reverse()
    return order


def _needed(order: List[Any], captured: Dict[Tuple[Any, int], Any]) -> set:
    """Nodes from which some captured input can be reached (tt.grad runs only these)."""
    targets = {node for node, _ in captured}
    needed = set()
    for node in reversed(order):
        if node in targets or any(edge[1] in needed for edge in node.inputs):
            needed.add(node)
    return needed


def _run(roots: List[Tuple[Any, int, Any]], retain_graph: bool, create_graph: bool, captured: Optional[dict]) -> None:
    order = _topological_order([node for node, _, _ in roots])
    needed = _needed(order, captured) if captured is not None else None
    buffers: Dict[Any, List[Any]] = {}
    for node, nr, g in roots:
        _add(buffers, node, nr, g)
    handed_out = {id(g) for _, _, g in roots}
    previous = BackwardMode.create_graph, torch.is_grad_enabled()
    BackwardMode.create_graph = create_graph
    torch.set_grad_enabled(create_graph)
    try:
        with _guard() if not create_graph else contextlib.nullcontext():
            for node in order:
                grads = buffers.pop(node, None)
                if grads is None or (needed is not None and node not in needed):
                    continue
                if isinstance(node, AccumulateGrad):
                    _accumulate(node, grads[0], create_graph, captured, handed_out)
                    continue
                if node.hooks or node.retained or captured is not None:
                    _tensor_hooks(node, grads, captured, handed_out)
                _propagate(node, grads, buffers)
                if not retain_graph and node.saved:
                    node.release()
    finally:
        BackwardMode.create_graph = previous[0]
        torch.set_grad_enabled(previous[1])


def _add(buffers: Dict[Any, List[Any]], node: Any, nr: int, g: Any) -> None:
    buf = buffers.get(node)
    if buf is None:
        buffers[node] = buf = [None] * node.n_outputs
    buf[nr] = g if buf[nr] is None else buf[nr] + g


def _propagate(node: Node, grads: List[Any], buffers: Dict[Any, List[Any]]) -> None:
    """Call the rule's backward and send each input gradient, unbroadcast and cast, to the next node."""
    if node.n_outputs > 1:
        grads = [torch.zeros(shape, dtype=dtype, device=device) if g is None else g
                 for g, (shape, dtype, device) in zip(grads, node.out_meta)]
    result = node.rule.backward(node, *grads)
    if not isinstance(result, tuple):
        result = (result,)
    if ON_BACKWARD:
        for observe in ON_BACKWARD:
            observe(node, grads, result)
    for key, nxt, nr, shape, dtype in node.inputs:
        try:
            g = result[key] if type(key) is int else result[key[0]][key[1]]
        except IndexError:
            raise RuntimeError(f"{node.name}.backward returned {len(result)} gradients; input {key} has none") from None
        if g is None:
            continue
        if g.shape != shape:
            g = _unbroadcast(node, g, shape)
        if g.dtype != dtype:
            g = g.to(dtype)
        buf = buffers.get(nxt)
        if buf is None:
            buffers[nxt] = buf = [None] * nxt.n_outputs
        buf[nr] = g if buf[nr] is None else buf[nr] + g


def _unbroadcast(node: Node, g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum a gradient over the dimensions that forward broadcast, back to the input's shape."""
    try:
        return g.sum_to_size(shape)
    except NotImplementedError:
        raise
    except RuntimeError:
        raise RuntimeError(
            f"{node.name}.backward returned a gradient of shape {tuple(g.shape)} for an input of shape {tuple(shape)}"
        ) from None


def _tensor_hooks(node: Node, grads: List[Any], captured: Optional[dict], handed_out: set) -> None:
    """Hooks and retain_grad of non-leaf tracers, and tt.grad captures of non-leaf inputs."""
    for nr, fns in (node.hooks or {}).items():
        for fn in list(fns):
            replaced = fn(grads[nr])
            grads[nr] = grads[nr] if replaced is None else replaced
    for nr, ref in (node.retained or {}).items():
        t = ref()
        if t is not None and grads[nr] is not None:
            t._tt_grad = grads[nr].clone() if t._tt_grad is None else t._tt_grad + grads[nr]
    if captured is not None:
        for nr, g in enumerate(grads):
            if (node, nr) in captured:
                captured[(node, nr)] = g
                handed_out.add(id(g))


def _accumulate(acc: AccumulateGrad, g: Any, create_graph: bool, captured: Optional[dict], handed_out: set) -> None:
    leaf = acc.variable
    for fn in list(leaf._tt_hooks or ()):
        replaced = fn(g)
        g = g if replaced is None else replaced
    if captured is not None:
        if (acc, 0) in captured:
            captured[(acc, 0)] = g
        return
    if not create_graph and (type(g) is not torch.Tensor or id(g) in handed_out or not g.is_contiguous()):
        g = g.clone(memory_format=torch.contiguous_format).as_subclass(torch.Tensor)
    handed_out.add(id(g))
    leaf._tt_grad = g if leaf._tt_grad is None else leaf._tt_grad + g
