"""backward() and tt.grad: visit nodes in reverse topological order, call each rule, send every edge its gradient."""
import contextlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from torchtrace import function_contract, grad_fn_hooks
from torchtrace.autograd.accumulation import OUR_RULES, Ownership, accumulate
from torchtrace.autograd.hooks import non_leaf_hooks
from torchtrace.autograd.node import AccumulateGrad, Node, gradient_for, leaf_accumulator, link_output
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import STATE

Tensors = Union[torch.Tensor, Sequence[torch.Tensor]]


def backward(tensors: Tensors, grad_tensors: Optional[Tensors] = None, retain_graph: Optional[bool] = None,
             create_graph: bool = False) -> None:
    """Accumulate d(tensors)/d(leaf) * grad_tensors into every leaf's `.grad`."""
    roots, tracer_type = _roots(tensors, grad_tensors, create_graph)
    _walk(roots, create_graph if retain_graph is None else retain_graph, create_graph, None, tracer_type)


def grad(outputs: Tensors, inputs: Tensors, grad_outputs: Optional[Tensors] = None, retain_graph: Optional[bool] = None,
         create_graph: bool = False, allow_unused: bool = False) -> Tuple[Optional[torch.Tensor], ...]:
    """Return d(outputs)/d(inputs) * grad_outputs without touching any `.grad`."""
    inputs = _as_list(inputs)
    targets = [_edge_of(t, f"input {i}") for i, t in enumerate(inputs)]
    captured: Dict[Tuple[Any, int], Any] = {edge: None for edge in targets}
    roots, tracer_type = _roots(outputs, grad_outputs, create_graph, "grad_outputs")
    _walk(roots, create_graph if retain_graph is None else retain_graph, create_graph, captured, tracer_type)
    result = tuple(captured[edge] for edge in targets)
    if not allow_unused and any(g is None for g in result):
        raise RuntimeError("One of the differentiated tracers was not used to compute the outputs. "
                           "Pass allow_unused=True to get None for it.")
    return result


def _as_list(tensors: Any) -> List[Any]:
    return [tensors] if tensors is None or isinstance(tensors, torch.Tensor) else list(tensors)


def _edge_of(t: Any, what: str) -> Tuple[Any, int]:
    """(node, output nr) that produced `t`: its grad_fn, or its AccumulateGrad if it is a leaf."""
    if getattr(t, "_tt_requires_grad", False):
        return (leaf_accumulator(t), 0) if t._tt_node is None else (t._tt_node, t._tt_nr)
    if isinstance(t, torch.Tensor) and not hasattr(type(t), "_tt_node") and t.requires_grad and t.grad_fn is None:
        return leaf_accumulator(t), 0  # a plain torch leaf that met tracers
    raise RuntimeError(f"{what} does not require grad and has no grad_fn: make a leaf tracer it depends on "
                       "require grad (tt.tracer(..., requires_grad=True) or x.requires_grad_()).")


def _roots(tensors: Tensors, grads: Optional[Tensors], create_graph: bool,
           grads_name: str = "gradient") -> Tuple[List[Tuple[Any, int, Any]], type]:
    tensors = _as_list(tensors)
    grads = [None] * len(tensors) if grads is None else _as_list(grads)
    tracer_type = next((t._tt_type for t in tensors if hasattr(type(t), "_tt_type")), None)
    if tracer_type is None:
        raise RuntimeError("backward needs tracers: these tensors were not computed by torchtrace "
                           "(for plain tensors use torch's own .backward())")
    roots = []
    with plain_torch():
        for i, (t, g) in enumerate(zip(tensors, grads)):
            node, nr = _edge_of(t, f"element {i} of the tensors passed to backward")
            if g is None:
                if t.numel() != 1:
                    raise RuntimeError(f"grad can be implicitly created only for scalar outputs, but this output has "
                                       f"shape {tuple(t.shape)}: pass {grads_name}= (a tensor of that shape), or "
                                       "reduce it (e.g. .sum()).")
                g = torch.ones_like(t)
            elif g.shape != t.shape or g.is_complex():
                raise RuntimeError(f"gradient has shape {tuple(g.shape)} and dtype {g.dtype}, but the output has shape "
                                   f"{tuple(t.shape)} and dtype {t.dtype}: pass a real gradient of the output's shape")
            if g.dtype != t.dtype:  # as torch: the gradient of an output has the output's dtype
                g = g.to(t.dtype)
            if not (create_graph and isinstance(g, tracer_type)):
                g = g.as_subclass(tracer_type if create_graph else torch.Tensor)
            roots.append((node, nr, g))
    return roots, tracer_type


def topological_order(roots: List[Any]) -> List[Any]:
    """Reverse post-order of an iterative depth-first search: every node comes before the nodes it feeds."""
    order, seen = [], set()
    for root in roots:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(root.edges))]
        while stack:
            node, edges = stack[-1]
            for edge in edges:
                nxt = edge.node
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, iter(nxt.edges)))
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
        if node in targets or any(edge.node in needed for edge in node.edges):
            needed.add(node)
    return needed


def _walk(roots: List[Tuple[Any, int, Any]], retain_graph: bool, create_graph: bool, captured: Optional[dict],
          tracer_type: type) -> None:
    """The backward pass: visit the nodes in reverse topological order; each pops the gradients buffered for its
    outputs, runs its rule's backward, and sends every edge its gradient. What torch adds to that loop is a named
    step: tensor hooks, retain_grad and tt.grad's capture (`hooks.py`), create_graph and autocast
    (`_call_in_forward_state`), sums into .grad (`accumulation.py`)."""
    order = topological_order([node for node, _, _ in roots])
    needed = _needed(order, captured) if captured is not None else None
    buffers: Dict[Any, List[Any]] = {}
    for node, nr, g in roots:
        _add(buffers, node, nr, g)
    ownership = Ownership([g for _, _, g in roots], enabled=not STATE.on_backward)
    with _backward_mode(create_graph):
        for node in order:
            grads = buffers.pop(node, None)
            if grads is None or (needed is not None and node not in needed):
                continue  # no gradient reached this node, or tt.grad does not need it
            if type(node) is AccumulateGrad:
                accumulate(node, grads[0], create_graph, captured, ownership)
                continue
            if node.hooks or node.retained or captured is not None:
                non_leaf_hooks(node, grads, captured, ownership.hand_out)
            _send(node, _call_rule(node, grads, create_graph, tracer_type, ownership), buffers)
            if not retain_graph:
                node.ctx.release()


@contextlib.contextmanager
def _backward_mode(create_graph: bool) -> Iterator[None]:
    """Rules run on plain tensors (recording nothing), or with create_graph on tracers with recording on, so the
    rules' own torch calls build the graph of the gradient."""
    previous = STATE.create_graph, torch.is_grad_enabled()
    STATE.create_graph = create_graph
    torch.set_grad_enabled(create_graph)
    try:
        with plain_torch() if not create_graph else contextlib.nullcontext():
            yield
    finally:
        STATE.create_graph = previous[0]
        torch.set_grad_enabled(previous[1])


def _add(buffers: Dict[Any, List[Any]], node: Any, nr: int, g: Any) -> None:
    """Buffer g for output nr of node; gradients arriving along several edges (fan-out) are summed."""
    buf = buffers.get(node)
    if buf is None:
        buffers[node] = buf = [None] * node.n_outputs
    buf[nr] = g if buf[nr] is None else buf[nr] + g


def _send(node: Node, result: tuple, buffers: Dict[Any, List[Any]]) -> None:
    """Each edge's gradient from what the rule returned, summed over the dimensions forward broadcast and cast to
    the input's dtype, into the buffer of the node the edge points to (this is _add, written out: it runs for
    every edge of every node)."""
    n = len(result)
    for edge in node.edges:
        position, target, nr, shape, dtype = edge
        g = result[position] if type(position) is int and position < n else _received(node, edge, result)
        if g is None:
            continue
        if not isinstance(g, torch.Tensor):
            g = _received(node, edge, result)  # raises, naming what backward returned
        if g.shape != shape:
            g = _unbroadcast(node, g, shape)
        if g.dtype != dtype:
            g = g.to(dtype)
        buf = buffers.get(target)
        if buf is None:
            buffers[target] = buf = [None] * target.n_outputs
        buf[nr] = g if buf[nr] is None else buf[nr] + g


def _call_rule(node: Node, grads: List[Any], create_graph: bool, tracer_type: type, ownership: Ownership) -> tuple:
    """rule.backward(ctx, *grads) as a tuple, with zeros for outputs no gradient reached; observers see the call,
    and what user code receives or returns no leaf keeps."""
    if node.output_meta is not None:
        grads = [torch.zeros(meta[0], dtype=meta[1], device=meta[2]) if g is None and meta is not None else g
                 for g, meta in zip(grads, node.output_meta)]
    if node.pre_hooks:
        grads = grad_fn_hooks.run_pre_hooks(node, grads)
    trusted = node.rule.__module__.startswith(OUR_RULES)
    if not trusted:
        for g in grads:
            ownership.hand_out(g)
    if node.autocast or (create_graph and node.saved_outputs):
        result = _call_in_forward_state(node, grads, create_graph, tracer_type)
    else:
        result = node.rule.backward(node.ctx, *grads)
    if type(result) is not tuple or node.ctx._n_inputs is not None:
        result = _as_tuple(node, result)
    if node.post_hooks:
        result = grad_fn_hooks.run_post_hooks(node, result, grads)
    if not trusted:
        for g in result:
            ownership.hand_out(g)
    for observe in STATE.on_backward:
        observe(node, grads, result)
    return result


def _call_in_forward_state(node: Node, grads: List[Any], create_graph: bool, tracer_type: type) -> Any:
    """rule.backward under the torch.autocast state forward ran in, and with create_graph with the saved outputs
    re-linked to this node, so their second derivative flows back through it."""
    relink = create_graph and node.saved_outputs
    if relink:
        _relink_saved_outputs(node, tracer_type)
    try:
        with torch.autocast(*node.autocast) if node.autocast else contextlib.nullcontext():
            return node.rule.backward(node.ctx, *grads)
    finally:
        if relink:
            node.ctx.use_graph_saved(None)


def _relink_saved_outputs(node: Node, tracer_type: type) -> None:
    """create_graph: the node's saved outputs become tracers produced by this node."""
    saved = list(node.ctx._saved)
    for i, nr in node.saved_outputs:
        saved[i] = link_output(saved[i], node, nr, tracer_type)
    node.ctx.use_graph_saved(tuple(saved))


def _as_tuple(node: Node, result: Any) -> tuple:
    """A tensor or None becomes a 1-tuple; a user's Function must return one gradient per input (as torch checks)."""
    if result is None or isinstance(result, torch.Tensor):
        result = (result,)
    if isinstance(result, tuple):
        return result if node.ctx._n_inputs is None else function_contract.checked_gradient_count(node, result)
    raise RuntimeError(f"{node.rule.__name__}.backward returned a {type(result).__name__}; it must return a "
                       "tensor, None, or a tuple with one gradient (or None) per input of forward")


def _received(node: Node, edge: Any, result: tuple) -> Optional[torch.Tensor]:
    """The gradient `edge` receives from `result`, checked: a tensor or None, at the input's position."""
    position = edge.position
    where = position if type(position) is int else position[0]
    if where >= len(result):
        raise RuntimeError(f"{node.rule.__name__}.backward returned {len(result)} gradients, but input {where} of "
                           "forward needs one: return one gradient (or None) per input of forward")
    if type(position) is not int and not isinstance(result[where], (list, tuple)):
        raise RuntimeError(f"{node.rule.__name__}.backward returned a {type(result[where]).__name__} for input "
                           f"{where}, a list of tensors: return a list with one gradient per item")
    g = gradient_for(edge, result)
    if g is not None and not isinstance(g, torch.Tensor):
        raise RuntimeError(f"{node.rule.__name__}.backward returned a {type(g).__name__} as the gradient of input "
                           f"{position}: gradients must be tensors (or None)")
    return g


def _unbroadcast(node: Node, g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum a gradient over the dimensions that forward broadcast, back to the input's shape."""
    try:
        return g.sum_to_size(shape)
    except NotImplementedError:
        raise
    except RuntimeError:
        raise RuntimeError(f"{node.name}.backward returned a gradient of shape {tuple(g.shape)} for an input of shape "
                           f"{tuple(shape)}") from None
