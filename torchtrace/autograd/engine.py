"""backward() and tt.grad: visit nodes newest first, call each rule, send every edge its gradient, sum into .grad.

The walk (`_walk`) is the whole algorithm: a node runs once every node that uses its outputs has run, which is
exactly "newest first" (`Node.sequence_nr`), so a heap of the nodes that received a gradient replaces any
topological sort. Beside it, named steps: a rule's call (`_call_rule`), what its gradients become (`_send`), and
a leaf's sum into .grad (`accumulate`, with `Ownership`: which gradients a leaf may keep without a copy).
Hooks, tt.grad's capture and create_graph's re-linked outputs only run when asked for (hooks.py and below).
"""
import contextlib
from heapq import heappop, heappush
from typing import Any, Callable, ContextManager, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from torchtrace.autograd import function_contract, grad_fn_hooks
from torchtrace.autograd.dispatch import run_rule
from torchtrace.autograd.function import OUR_RULES
from torchtrace.autograd.hooks import as_user_code, non_leaf_hooks, run_hooks
from torchtrace.autograd.inplace import catch_up
from torchtrace.autograd.node import (
    AccumulateGrad,
    Contributions,
    Edge,
    Node,
    gradient_for,
    leaf_accumulator,
    link_output,
)
from torchtrace.autograd.plain import modes_aside, plain_torch
from torchtrace.autograd.state import STATE

Tensors = Union[torch.Tensor, Sequence[torch.Tensor]]

# Tools watch a tracer's backward by registering here when they load (the core imports none of them):
BACKWARD_WATCHERS: List[Callable[[Any, bool], ContextManager]] = []  # watcher(output, create_graph) -> a block
ANOMALY_MODE: List[Callable[[Any, Any, Any], None]] = []  # observers run while torch's anomaly mode is on
TOOLS: Dict[str, Callable[[Any], None]] = {}  # "show": print the backprop trace of a tracer (y.backward(show=True))
INTO_GRAD = object()  # backward(inputs=): a leaf among the inputs sums into its .grad instead of being captured


def tensor_backward(self: torch.Tensor, gradient: Optional[torch.Tensor] = None, retain_graph: Optional[bool] = None,
                    create_graph: bool = False, inputs: Optional[Tensors] = None, show: bool = False) -> None:
    """tracer.backward: back-propagate from this tracer into every leaf's `.grad` (only into `inputs`' when given);
    `show=True` prints the trace."""
    if not (show or BACKWARD_WATCHERS):
        return backward(self, gradient, retain_graph, create_graph, inputs=inputs)
    if show:
        TOOLS["show"](self)
    with contextlib.ExitStack() as watching:
        for watcher in BACKWARD_WATCHERS:
            watching.enter_context(watcher(self, create_graph))
        backward(self, gradient, retain_graph, create_graph, inputs=inputs)


def backward(tensors: Tensors, grad_tensors: Optional[Tensors] = None, retain_graph: Optional[bool] = None,
             create_graph: bool = False, *, inputs: Optional[Tensors] = None) -> None:
    """Accumulate d(tensors)/d(leaf) * grad_tensors into every leaf's `.grad`; with `inputs`, only into theirs (a
    non-leaf's too, as torch), running only the nodes that lead to them."""
    roots, tracer_type = _roots(tensors, grad_tensors, create_graph)
    if inputs is None:
        with modes_aside(not create_graph):
            return WALK[0](roots, create_graph if retain_graph is None else retain_graph, create_graph, None,
                           tracer_type)
    inputs = _as_list(inputs)
    if not inputs:
        raise RuntimeError("`inputs` argument to `backward()` cannot be empty.")
    targets = [_edge_of(t, f"inputs[{i}]") for i, t in enumerate(inputs)]
    captured = {edge: INTO_GRAD if type(edge[0]) is AccumulateGrad else None for edge in targets}
    with modes_aside(not create_graph):
        _walk(roots, create_graph if retain_graph is None else retain_graph, create_graph, captured, tracer_type)
    for t, (node, nr) in zip(inputs, targets):  # a non-leaf input's gradient, captured, summed into its .grad
        g = captured.pop((node, nr), None)
        if g is not None and g is not INTO_GRAD and not (node.retained and nr in node.retained):
            t._tt_grad = g.clone() if t._tt_grad is None else t._tt_grad + g
        if type(node) is not AccumulateGrad:  # and from now on it retains its gradient, as torch's retain_grad()
            t.retain_grad()


def grad(outputs: Tensors, inputs: Tensors, grad_outputs: Optional[Tensors] = None, retain_graph: Optional[bool] = None,
         create_graph: bool = False, allow_unused: Optional[bool] = None, is_grads_batched: bool = False,
         materialize_grads: bool = False) -> Any:
    """Return d(outputs)/d(inputs) * grad_outputs without touching any `.grad`. `is_grads_batched`: each
    grad_outputs has a leading batch dimension; one backward per row, the results stacked (torch vmaps it).
    `materialize_grads`: zeros instead of None for an input the outputs do not depend on (allow_unused implied).
    `inputs` a dict (dict(model.named_parameters())): the gradients in a dict of the same keys, as torch's."""
    if type(inputs) is dict:
        return dict(zip(inputs, grad(outputs, tuple(inputs.values()), grad_outputs, retain_graph, create_graph,
                                     allow_unused, is_grads_batched, materialize_grads)))
    if materialize_grads and allow_unused is False:
        raise ValueError("Expected allow_unused to be True or not passed when materialize_grads=True, but got: "
                         "allow_unused=False.")
    if materialize_grads:
        result = grad(outputs, inputs, grad_outputs, retain_graph, create_graph, True, is_grads_batched)
        return tuple((torch.zeros_like(t, requires_grad=True) if create_graph else torch.zeros_like(t).as_subclass(
            torch.Tensor)) if g is None else g for g, t in zip(result, _as_list(inputs)))
    if is_grads_batched:
        return _batched_grad(outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused)
    inputs = _as_list(inputs)
    if not inputs:
        raise RuntimeError("inputs argument to grad() cannot be empty: pass the tensors to differentiate by")
    targets = [_edge_of(t, f"input {i}") for i, t in enumerate(inputs)]
    captured: Dict[Tuple[Any, int], Any] = {edge: None for edge in targets}
    roots, tracer_type = _roots(outputs, grad_outputs, create_graph, "grad_outputs")
    with modes_aside(not create_graph):
        _walk(roots, create_graph if retain_graph is None else retain_graph, create_graph, captured, tracer_type)
    result = tuple(captured[edge] for edge in targets)
    if not allow_unused and any(g is None for g in result):
        raise RuntimeError("One of the differentiated tracers was not used to compute the outputs. "
                           "Pass allow_unused=True to get None for it.")
    return result


def _batched_grad(outputs: Tensors, inputs: Tensors, grad_outputs: Optional[Tensors], retain_graph: Optional[bool],
                  create_graph: bool, allow_unused: bool) -> Tuple[Optional[torch.Tensor], ...]:
    """grad once per row of the batched grad_outputs (the graph kept until the last row), results stacked."""
    batches = _as_list(grad_outputs)
    if not batches or any(g is None or g.dim() == 0 for g in batches) or len({g.shape[0] for g in batches}) != 1:
        raise RuntimeError("is_grads_batched=True needs grad_outputs: one tensor per output, each with a leading "
                           "batch dimension of the same size (grad_outputs[k][i] is row i's gradient of output k)")
    n = batches[0].shape[0]
    rows = [grad(outputs, inputs, [g[i] for g in batches], True if i < n - 1 else retain_graph, create_graph,
                 allow_unused) for i in range(n)]
    return tuple(None if column[0] is None else torch.stack(column) for column in zip(*rows))


def _as_list(tensors: Any) -> List[Any]:
    return [tensors] if tensors is None or isinstance(tensors, torch.Tensor) else list(tensors)


def _edge_of(t: Any, what: str) -> Tuple[Any, int]:
    """(node, output nr) that produced `t`: its grad_fn, or its AccumulateGrad if it is a leaf. A view whose memory
    changed in place since it was taken is brought up to date first, as any op that reads it would."""
    if getattr(t, "_tt_base", None) is not None and t._version != t._tt_version:
        catch_up(t, type(t), run_rule)
    if getattr(t, "_tt_requires_grad", False):
        return (leaf_accumulator(t), 0) if t._tt_node is None else (t._tt_node, t._tt_nr)
    if isinstance(t, torch.Tensor) and not hasattr(type(t), "_tt_node") and t.requires_grad and t.grad_fn is None:
        return leaf_accumulator(t), 0  # a plain torch leaf that met tracers
    raise RuntimeError(f"{what} does not require grad and has no grad_fn: make a leaf tracer it depends on "
                       "require grad (tt.tracer(..., requires_grad=True) or x.requires_grad_()), and compute it "
                       "outside no_grad, through ops with a gradient (not argmax, comparisons or .detach()).")


def _roots(tensors: Tensors, grads: Optional[Tensors], create_graph: bool,
           grads_name: str = "gradient") -> Tuple[List[Tuple[Any, int, Any]], type]:
    """(node, output nr, gradient) for each output: ones for a scalar without one; the output's dtype. `grads_name`
    is what the caller calls the gradients (backward's gradient=, tt.grad's grad_outputs=), for the message."""
    tensors = _as_list(tensors)
    grads = [None] * len(tensors) if grads is None else _as_list(grads)
    for g in grads:
        if g is not None and not isinstance(g, torch.Tensor):
            raise TypeError(f"{grads_name} can be either Tensors or None, but got {type(g).__name__}")
    if len(grads) < len(tensors):  # (more gradients than tensors: the extra ones are ignored, as torch's engine does)
        raise RuntimeError(f"{grads_name}: got {len(tensors)} tensors and {len(grads)} gradients (one each, None for "
                           "a scalar)")
    tracer_type = next((t._tt_type for t in tensors if hasattr(type(t), "_tt_type")), None)
    if tracer_type is None:
        raise RuntimeError("backward needs tracers: these tensors were not computed by torchtrace "
                           "(for plain tensors use torch's own .backward())")
    with plain_torch():
        return [(*_edge_of(t, f"element {i} of the tensors passed to backward"), _root_gradient(t, g, create_graph,
                 tracer_type, grads_name)) for i, (t, g) in enumerate(zip(tensors, grads))], tracer_type


def _root_gradient(t: torch.Tensor, g: Optional[torch.Tensor], create_graph: bool, tracer_type: type,
                   grads_name: str) -> Any:
    """The gradient backward starts from: ones for a scalar output; else g, which must have the output's shape; in
    the output's dtype (as torch); recorded too with create_graph."""
    if (g is None and t.numel() != 1) or (g is not None and (g.shape != t.shape or g.is_complex())):
        raise RuntimeError(f"grad can be implicitly created only for scalar outputs, but this output has shape "
                           f"{tuple(t.shape)}: pass {grads_name}= (a tensor of that shape), or reduce it (e.g. .sum())."
                           if g is None else f"gradient has shape {tuple(g.shape)} and dtype {g.dtype}, but the "
                           f"output has shape {tuple(t.shape)} and dtype {t.dtype}: pass a real gradient of the "
                           "output's shape")
    if create_graph and _is_torch_leaf(g, tracer_type):  # a torch leaf: d/d(gradient) reaches it too, as torch's
        g = with_torch_leaves_linked((g,), tracer_type)[0]
    g = torch.ones_like(t) if g is None else g.to(t.dtype)
    return g if create_graph and isinstance(g, tracer_type) else g.as_subclass(
        tracer_type if create_graph else torch.Tensor)


def topological_order(roots: List[Any]) -> List[Any]:
    """Reverse post-order of an iterative depth-first search: every node comes before the nodes it feeds (the order
    the inspection tools list a graph in; tt.grad uses it to find the nodes it needs)."""
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


def _needed(roots: List[Any], captured: Dict[Tuple[Any, int], Any]) -> set:
    """Nodes from which some captured input can be reached (tt.grad runs only these)."""
    targets = {node for node, _ in captured}
    needed = set()
    for node in reversed(topological_order(roots)):
        if node in targets or any(edge.node in needed for edge in node.edges):
            needed.add(node)
    return needed


def _walk(roots: List[Tuple[Any, int, Any]], retain_graph: bool, create_graph: bool, captured: Optional[dict],
          tracer_type: type) -> None:
    """The backward pass. `ready` holds every node that has received a gradient, newest first: when a node comes
    out, every node that uses its outputs has run, so its buffered gradients are complete. It runs its rule and
    sends each edge its gradient (the node the edge points to becomes ready); a leaf sums it into its .grad."""
    needed = _needed([node for node, _, _ in roots], captured) if captured is not None else None
    buffers: Dict[Any, List[Any]]  # node -> the gradient of each of its outputs, summed as they arrive
    ready: List[Tuple[int, Any]]  # (-sequence_nr, node): a heap, newest node first
    buffers, ready = {}, []
    _send(_Root([Edge(i, node, nr, g.shape, g.dtype) for i, (node, nr, g) in enumerate(roots)]),
          tuple(g for _, _, g in roots), buffers, ready)  # the roots' gradients, buffered as any node's result
    observers = STATE.on_backward  # read once per backward: tools add theirs before it starts
    if torch.is_anomaly_enabled():  # torch's anomaly mode (set_detect_anomaly): its check of each result
        observers = [*observers, *ANOMALY_MODE]
    ownership = Ownership([g for _, _, g in roots], enabled=not observers)
    previous = STATE.create_graph, STATE.walk  # what a node's rule may ask of the walk running it
    STATE.create_graph, STATE.walk = create_graph, (retain_graph, captured, ownership.hand_out, needed)
    # rules run on plain tensors, unseen by any TorchFunctionMode (as torch's backward runs in C++); with create_graph
    # on tracers, recording, so they build the gradient's graph
    try:
        with torch.set_grad_enabled(create_graph), \
                torch._C.DisableTorchFunction() if not create_graph else contextlib.nullcontext():
            while ready:
                node = heappop(ready)[1]
                grads = buffers.pop(node)
                if needed is not None and node not in needed:
                    continue  # tt.grad does not need it
                if type(node) is AccumulateGrad:
                    accumulate(node, grads[0], create_graph, captured, ownership)
                    continue
                inside = getattr(node.rule, "_tt_hooks_inside", False)  # a compiled call's node runs them itself
                if (node.hooks or node.retained or captured is not None) and not inside:
                    non_leaf_hooks(node, grads, captured, ownership.hand_out)
                if needed is not None and not inside and not any(edge.node in needed for edge in node.edges):
                    continue  # a captured input's own node, with no other input below: captured, not run (as torch)
                _send(node, _call_rule(node, grads, create_graph, tracer_type, ownership, observers), buffers, ready)
                if not retain_graph and (node.ctx._saved or node.ctx._packed is not None):
                    node.ctx.release()
    finally:
        STATE.create_graph, STATE.walk = previous


WALK = [_walk]  # what backward() runs: _walk, or while the lanes are on the walk's lane (torchtrace/lanes/walk.py)


class _Root(NamedTuple):
    """Where backward starts (torch's GraphRoot): a node whose result is the roots' gradients, one edge per root."""

    edges: List[Edge]


def _send(node: Node, result: tuple, buffers: Dict[Any, List[Any]], ready: List[Tuple[int, Any]]) -> None:
    """Each edge's gradient, node.edge_gradient written out with checks (the rule's entry for the edge, summed over
    the dimensions forward broadcast, cast to the input's dtype), added into the buffer of the node it points to."""
    n = len(result)
    for edge in node.edges:
        position, target, nr, shape, dtype = edge
        g = result[position] if type(position) is int and position < n else _received(node, edge, result)
        if type(g) is not torch.Tensor:  # a tracer (create_graph), None (no gradient), or a mistake
            if g is None:
                continue
            if type(g) is Contributions:  # a compiled node's: each added in turn, in eager's order
                for each in g:
                    buffer_gradient(target, nr, each, buffers, ready)
                continue
            if not isinstance(g, torch.Tensor):
                g = _received(node, edge, result)  # raises, naming what backward returned
        if g.shape != shape:
            g = _unbroadcast(node, g, shape)
        if g.dtype != dtype:
            g = g.to(dtype)
        buffer_gradient(target, nr, g, buffers, ready)


def buffer_gradient(target: Any, nr: int, g: Any, buffers: Dict[Any, List[Any]], ready: List[Tuple[int, Any]]) -> None:
    """A node's first gradient makes it ready; gradients arriving along several edges (fan-out) are summed."""
    buf = buffers.get(target)
    if buf is None:
        buffers[target] = buf = [None] * target.n_outputs
        heappush(ready, (-target.sequence_nr, target))
    buf[nr] = g if buf[nr] is None else buf[nr] + g


def _call_rule(node: Node, grads: List[Any], create_graph: bool, tracer_type: type, ownership: "Ownership",
               observers: List[Callable]) -> tuple:
    """rule.backward(ctx, *grads) as a tuple, with zeros for outputs no gradient reached; grad_fn hooks run around
    it, observers see the call, and what user code receives or returns no leaf keeps."""
    if node.pre_hooks:  # the grad_fn pre-hooks, then zeros for the outputs of a multi-output node no gradient
        grads = grad_fn_hooks.run_pre_hooks(node, grads)  # reached (the hooks see None there, as torch's)
    seen = grads
    if node.output_meta is not None:
        grads = [torch.zeros(meta[0], dtype=meta[1], device=meta[2]) if g is None and meta is not None and
                 node.ctx.materialize_grads else g for g, meta in zip(grads, node.output_meta)]
    trusted = getattr(node.rule, "_tt_trusted", None)
    if trusted is None:  # a rule class that is no Function: one of OUR_RULES by its module
        trusted = node.rule.__module__.startswith(OUR_RULES)
    if not trusted:
        ownership.hand_out(grads)
    in_autocast = node.autocast is not None and node.autocast[2]
    if in_autocast or (create_graph and (node.saved_outputs or saves_torch_leaf(node.ctx, tracer_type))):
        result = _call_in_forward_state(node, grads, create_graph, tracer_type)
    elif trusted:
        result = node.rule.backward(node.ctx, *grads)
    else:  # a user's backward: user code (hooks.as_user_code)
        result = as_user_code(node.rule.backward, node.ctx, *grads)
    if type(result) is not tuple or node.ctx._n_inputs is not None or node.post_hooks:
        result = grad_fn_hooks.run_post_hooks(node, _as_tuple(node, result), seen)
    if not trusted:
        ownership.hand_out(result)
    for observe in observers:
        observe(node, grads, result)
    return result


def _call_in_forward_state(node: Node, grads: List[Any], create_graph: bool, tracer_type: type) -> Any:
    """rule.backward under the torch.autocast state forward ran in where its node asks for it (autocast.py), and
    with create_graph with the saved outputs re-linked to this node, so their second derivative flows back through
    it."""
    if create_graph and node.ctx._packed is not None:
        raise RuntimeError(f"{node.name}: create_graph=True through tensors saved under "
                           "torch's saved_tensors_hooks is not followed by torchtrace (a saved result "
                           "would lose its second derivative): compute the forward outside the hooks")
    relink = create_graph and (node.saved_outputs or saves_torch_leaf(node.ctx, tracer_type))
    if relink:  # the node's saved outputs become tracers produced by this node, a saved torch leaf a tracer of it
        saved = with_torch_leaves_linked(node.ctx._saved, tracer_type)
        for i, nr in node.saved_outputs:
            saved[i] = link_output(saved[i], node, nr, tracer_type)
        node.ctx.use_graph_saved(tuple(saved))
    try:
        in_autocast = node.autocast is not None and node.autocast[2]
        with torch.autocast(*node.autocast[:2]) if in_autocast else contextlib.nullcontext():
            return node.rule.backward(node.ctx, *grads)
    finally:
        if relink:
            node.ctx.use_graph_saved(None)


def _is_torch_leaf(t: Any, tracer_type: type) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, tracer_type) and t.requires_grad and t.grad_fn is None


def saves_torch_leaf(ctx: Any, tracer_type: type) -> bool:
    return ctx._packed is None and any(_is_torch_leaf(t, tracer_type) for t in ctx._saved)


def with_torch_leaves_linked(saved: Tuple[Any, ...], tracer_type: type) -> List[Any]:
    """Tensors for a backward with create_graph: a plain tensor with torch's requires_grad (a torch module's parameter
    a rule saved, a gradient= seed) as a leaf tracer whose gradient goes to that tensor's own node, else the rule's
    ops on it alone (w.reshape) would go to torch autograd's graph, which tracers cannot follow."""
    return [_leaf_alias(t, tracer_type) if _is_torch_leaf(t, tracer_type) else t for t in saved]


def _leaf_alias(t: torch.Tensor, tracer_type: type) -> torch.Tensor:
    alias = t.detach().as_subclass(tracer_type)  # its node held strongly: what reaches alias sums into t.grad
    alias._tt_requires_grad, alias._tt_acc = True, (lambda node=leaf_accumulator(t): node)
    return alias


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


def accumulate(acc: AccumulateGrad, g: Any, create_graph: bool, captured: Optional[dict],
               ownership: "Ownership") -> None:
    """A leaf's step: sum g into its .grad (a plain tensor leaf: torch's own .grad), in place once .grad exists, as
    torch does; the first gradient becomes .grad itself when no one else can reach its memory (`Ownership`)."""
    leaf = acc.variable
    hooks = leaf._backward_hooks if acc.torch_leaf else leaf._tt_hooks  # (a plain leaf's: Tensor.register_hook's)
    if hooks:
        g = run_hooks(hooks.values() if acc.torch_leaf else hooks, g, "a leaf", ownership.hand_out)
    if acc.pre_hooks:
        (g,) = grad_fn_hooks.run_pre_hooks(acc, [g])
    if captured is not None and captured.get((acc, 0)) is not INTO_GRAD:  # tt.grad: capture, keep .grad as it is
        if (acc, 0) in captured:
            captured[(acc, 0)] = g
        return
    if not (leaf.requires_grad if acc.torch_leaf else leaf._tt_requires_grad):
        return  # requires_grad_(False) since the forward (frozen): no .grad, as torch's AccumulateGrad
    current = leaf.grad if acc.torch_leaf else leaf._tt_grad
    if current is None:
        current = ownership.take(g, leaf, create_graph)
    elif create_graph:
        current = current + g
    else:
        current.add_(g)  # in place, as torch: a reference to .grad held by the user sees the sum
    if acc.torch_leaf:
        leaf.grad = current
    else:
        leaf._tt_grad = current
    post = leaf._post_accumulate_grad_hooks if acc.torch_leaf else leaf._tt_post_hooks
    for fn in list((post.values() if acc.torch_leaf else post) if post else ()):
        if fn(leaf) is not None:  # (a returned tensor would not become the .grad: refused, as torch)
            raise RuntimeError("Tensor post accumulate grad hooks should return None: change leaf.grad in place")
    for hook in list(acc.post_hooks or ()):
        hook((), (g,))


class Ownership:
    """Which gradients a leaf may keep as its .grad without a copy (as torch's AccumulateGrad steals its buffer).

    A leaf keeps a gradient that no user code has seen: the engine knows the storages that reached user code
    during this backward (the root gradients, what hooks saw or returned, what a user's Function received or
    returned) and the storages leaves already keep. Handing a kept storage to user code later first gives its
    leaf a private copy, so an in-place accumulation into .grad never reaches anyone else.
    """

    def __init__(self, roots: List[Any], enabled: bool):
        self.enabled = enabled  # off while observers watch: they see every gradient
        self.handed_out, self.kept = {_storage(g) for g in roots}, {}  # kept: storage -> the leaf keeping it as .grad

    def hand_out(self, g: Any) -> None:
        """g (or a tensor sharing its memory; or each tensor of a list of gradients) reaches user code."""
        if isinstance(g, (list, tuple)):
            for item in g:
                self.hand_out(item)
        elif isinstance(g, torch.Tensor):
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
        if create_graph or not (free and self.enabled and type(g) is torch.Tensor and _obeys_layout(g, leaf)
                                and (g._base is None or g._base.numel() == g.numel())):
            if create_graph:
                self.handed_out.add(storage)
            return g if create_graph and free else _private_copy(g, create_graph, leaf)
        self.kept[storage] = leaf
        return g


def _private_copy(g: Any, create_graph: bool = False, leaf: Any = None) -> Any:
    """A copy of g for the .grad of `leaf` (of g itself where it is one): recorded in the graph with create_graph, else
    a plain tensor laid out as torch's layout contract says (_obeys_layout)."""
    if create_graph:
        return g.clone()
    like = g if leaf is None else leaf
    if _dense_not_contiguous(like):  # a transposed or channels_last leaf: its .grad has the leaf's strides
        return torch.empty_strided(like.shape, like.stride(), dtype=g.dtype, device=g.device).copy_(g)
    return g.clone(memory_format=torch.contiguous_format).as_subclass(torch.Tensor)


def _obeys_layout(g: torch.Tensor, leaf: torch.Tensor) -> bool:
    """torch's gradient layout contract for .grad: the strides of its leaf (dimensions of size 1 aside) where the leaf
    is dense and non-overlapping (a transposed or channels_last weight), else contiguous."""
    if not _dense_not_contiguous(leaf):
        return g.is_contiguous()
    return all(size == 1 or a == b for size, a, b in zip(g.shape, g.stride(), leaf.stride()))


def _dense_not_contiguous(t: torch.Tensor) -> bool:
    """Does t fill its memory without gaps or overlaps in another order than row-major (t.t(), channels_last)?"""
    if t.is_contiguous() or t.numel() == 0:
        return False
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()  # a metadata read (dispatch.METADATA): no recording, even on a tracer
