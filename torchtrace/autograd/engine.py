"""backward(): visit nodes in reverse topological order, call each rule, send every edge its gradient."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from torchtrace.autograd.node import AccumulateGrad, Node, gradient_for, leaf_accumulator, link_output
from torchtrace.autograd.state import STATE

_guard = torch._C.DisableTorchFunctionSubclass
Tensors = Union[torch.Tensor, Sequence[torch.Tensor]]


def backward(
    tensors: Tensors,
    grad_tensors: Optional[Tensors] = None,
    retain_graph: Optional[bool] = None,
    create_graph: bool = False,
) -> None:
    """Accumulate d(tensors)/d(leaf) * grad_tensors into every leaf's `.grad`."""
    roots, tracer_type = _roots(tensors, grad_tensors, create_graph)
    _run(roots, create_graph if retain_graph is None else retain_graph, create_graph, None, tracer_type)


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
    roots, tracer_type = _roots(outputs, grad_outputs, create_graph)
    _run(roots, create_graph if retain_graph is None else retain_graph, create_graph, captured, tracer_type)
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
    """(node, output nr) that produced `t`: its grad_fn, or its AccumulateGrad if it is a leaf."""
    if getattr(t, "_tt_requires_grad", False):
        return (leaf_accumulator(t), 0) if t._tt_node is None else (t._tt_node, t._tt_nr)
    if isinstance(t, torch.Tensor) and not hasattr(type(t), "_tt_node") and t.requires_grad and t.grad_fn is None:
        return leaf_accumulator(t), 0  # a plain torch leaf that met tracers
    raise RuntimeError(
        f"{what} does not require grad and has no grad_fn: make a leaf tracer it depends on "
        "require grad (tt.tracer(..., requires_grad=True) or x.requires_grad_())."
    )


def _roots(tensors: Tensors, grads: Optional[Tensors], create_graph: bool) -> Tuple[List[Tuple[Any, int, Any]], type]:
    tensors = _as_list(tensors)
    grads = [None] * len(tensors) if grads is None else _as_list(grads)
    tracer_type = next((t._tt_type for t in tensors if hasattr(type(t), "_tt_type")), None)
    if tracer_type is None:
        raise RuntimeError("backward needs tracers: these tensors were not computed by torchtrace "
                           "(for plain tensors use torch's own .backward())")
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


def _run(roots: List[Tuple[Any, int, Any]], retain_graph: bool, create_graph: bool, captured: Optional[dict],
         tracer_type: type) -> None:
    order = topological_order([node for node, _, _ in roots])
    needed = _needed(order, captured) if captured is not None else None
    buffers: Dict[Any, List[Any]] = {}
    for node, nr, g in roots:
        _add(buffers, node, nr, g)
    ownership = Ownership([g for _, _, g in roots], enabled=not STATE.on_backward)
    previous = STATE.create_graph, torch.is_grad_enabled()
    STATE.create_graph = create_graph
    torch.set_grad_enabled(create_graph)
    try:
        with _guard() if not create_graph else contextlib.nullcontext():
            for node in order:
                grads = buffers.pop(node, None)
                if grads is None or (needed is not None and node not in needed):
                    continue
                if isinstance(node, AccumulateGrad):
                    _accumulate(node, grads[0], create_graph, captured, ownership)
                    continue
                if node.hooks or node.retained or captured is not None:
                    _tensor_hooks(node, grads, captured, ownership)
                _propagate(node, grads, buffers, create_graph, tracer_type, ownership)
                if not retain_graph:
                    node.ctx.release()
    finally:
        STATE.create_graph = previous[0]
        torch.set_grad_enabled(previous[1])


def _add(buffers: Dict[Any, List[Any]], node: Any, nr: int, g: Any) -> None:
    buf = buffers.get(node)
    if buf is None:
        buffers[node] = buf = [None] * node.n_outputs
    buf[nr] = g if buf[nr] is None else buf[nr] + g


def _propagate(node: Node, grads: List[Any], buffers: Dict[Any, List[Any]], create_graph: bool,
               tracer_type: type, ownership: Ownership) -> None:
    """Call the rule's backward and send each input gradient, unbroadcast and cast, to the next node."""
    if node.output_meta is not None:
        grads = [torch.zeros(meta[0], dtype=meta[1], device=meta[2]) if g is None and meta is not None else g
                 for g, meta in zip(grads, node.output_meta)]
    trusted = node.rule.__module__.startswith(_OUR_RULES)  # user code may keep what it receives or returns
    if not trusted:
        for g in grads:
            ownership.hand_out(g)
    result = _call_backward(node, grads, create_graph, tracer_type)
    if not trusted:
        for g in result:
            ownership.hand_out(g)
    if STATE.on_backward:
        for observe in STATE.on_backward:
            observe(node, grads, result)
    for edge in node.edges:
        g = _received(node, edge, result)
        if g is None:
            continue
        if g.shape != edge.shape:
            g = _unbroadcast(node, g, edge.shape)
        if g.dtype != edge.dtype:
            g = g.to(edge.dtype)
        _add(buffers, edge.node, edge.output_nr, g)


def _call_backward(node: Node, grads: List[Any], create_graph: bool, tracer_type: type) -> tuple:
    """rule.backward(ctx, *grads), under the autocast state of forward and, with create_graph, with saved
    outputs re-linked to this node (so their second derivative flows back through it)."""
    ctx = node.ctx
    relink = create_graph and node.saved_outputs
    if relink:
        saved = list(ctx._saved)
        for i, nr in node.saved_outputs:
            saved[i] = link_output(saved[i], node, nr, tracer_type)
        ctx.use_graph_saved(tuple(saved))
    try:
        with torch.autocast(*node.autocast) if node.autocast else contextlib.nullcontext():
            result = node.rule.backward(ctx, *grads)
    finally:
        if relink:
            ctx.use_graph_saved(None)
    if isinstance(result, tuple):
        return result
    if result is None or isinstance(result, torch.Tensor):
        return (result,)
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
        raise RuntimeError(
            f"{node.name}.backward returned a gradient of shape {tuple(g.shape)} for an input of shape {tuple(shape)}"
        ) from None


def _run_hooks(hooks: List[Callable], g: Any, where: str, ownership: Ownership) -> Any:
    """hook(grad) for each hook; a returned tensor (of the gradient's shape) replaces the gradient."""
    for fn in list(hooks):
        ownership.hand_out(g)
        replaced = fn(g)
        if replaced is None:
            continue
        if not isinstance(replaced, torch.Tensor) or replaced.shape != g.shape:
            got = f"shape {tuple(replaced.shape)}" if isinstance(replaced, torch.Tensor) else type(replaced).__name__
            raise RuntimeError(f"hook {getattr(fn, '__name__', fn)} on {where} returned {got}; a hook must return "
                               f"None or a tensor of the gradient's shape {tuple(g.shape)}")
        g = replaced
        ownership.hand_out(g)
    return g


def _tensor_hooks(node: Node, grads: List[Any], captured: Optional[dict], ownership: Ownership) -> None:
    """Hooks and retain_grad of non-leaf tracers, and tt.grad captures of non-leaf inputs."""
    for nr, fns in (node.hooks or {}).items():
        if grads[nr] is not None:
            grads[nr] = _run_hooks(fns, grads[nr], f"an output of {node.name}", ownership)
    for nr, ref in (node.retained or {}).items():
        t = ref()
        if t is not None and grads[nr] is not None:
            t._tt_grad = grads[nr].clone() if t._tt_grad is None else t._tt_grad + grads[nr]
    if captured is not None:
        for nr, g in enumerate(grads):
            if (node, nr) in captured:
                captured[(node, nr)] = g


_OUR_RULES = ("torchtrace.ops.", "torchtrace.nn.", "torchtrace.autograd.")  # backward makes new tensors or views of g


class Ownership:
    """Which gradients a leaf may keep as its .grad without a copy (as torch's AccumulateGrad steals its buffer).

    A leaf keeps a gradient that no user code has seen: the engine knows the storages that reached user code
    during this backward (the root gradients, what hooks saw or returned, what a user's Function received or
    returned) and the storages leaves already keep. Handing a kept storage to user code later first gives its
    leaf a private copy, so an in-place accumulation into .grad never reaches anyone else.
    """

    def __init__(self, roots: List[Any], enabled: bool):
        self.enabled = enabled  # off while observers watch: they see every gradient
        self.handed_out = {_storage(g) for g in roots}
        self.kept: Dict[int, Any] = {}  # storage -> the leaf that keeps it as .grad

    def hand_out(self, g: Any) -> None:
        """g (or a tensor sharing its memory) reaches user code."""
        if isinstance(g, torch.Tensor):
            storage = _storage(g)
            self.handed_out.add(storage)
            leaf = self.kept.pop(storage, None)
            if leaf is not None:
                leaf.grad = _private_copy(leaf.grad)

    def take(self, g: Any, leaf: Any, create_graph: bool) -> Any:
        """g itself for the leaf's .grad when nobody else can reach its memory, else a private copy. A recorded
        gradient (create_graph) is never changed in place later, so only other leaves must not share it."""
        storage = _storage(g)
        free = storage not in self.handed_out and storage not in self.kept
        if create_graph:
            self.handed_out.add(storage)
            return g if free else _private_copy(g, create_graph)
        if not (free and self.enabled and type(g) is torch.Tensor and g.is_contiguous()
                and (g._base is None or g._base.numel() == g.numel())):
            return _private_copy(g)
        self.kept[storage] = leaf
        return g


def _private_copy(g: Any, create_graph: bool = False) -> Any:
    """A copy of g for a leaf's .grad: recorded in the graph with create_graph, else a plain contiguous tensor."""
    return g.clone() if create_graph else g.clone(memory_format=torch.contiguous_format).as_subclass(torch.Tensor)


def _storage(t: torch.Tensor) -> int:
    with _guard():
        return t.untyped_storage().data_ptr()


def _accumulate(acc: AccumulateGrad, g: Any, create_graph: bool, captured: Optional[dict],
                ownership: Ownership) -> None:
    """Sum g into the leaf's .grad (a plain tensor leaf: torch's own .grad); every leaf owns its .grad."""
    leaf = acc.variable
    if not acc.torch_leaf and leaf._tt_hooks:
        g = _run_hooks(leaf._tt_hooks, g, "a leaf", ownership)
    if captured is not None:
        if (acc, 0) in captured:
            captured[(acc, 0)] = g
        return
    current = leaf.grad if acc.torch_leaf else leaf._tt_grad
    if current is None:
        current = ownership.take(g, leaf, create_graph)
    elif create_graph or type(current) is not torch.Tensor:
        current = current + g
    else:
        current.add_(g)  # in place, as torch: a reference to .grad held by the user sees the sum
    if acc.torch_leaf:
        leaf.grad = current
    else:
        leaf._tt_grad = current
        for fn in list(leaf._tt_post_hooks or ()):
            fn(leaf)
