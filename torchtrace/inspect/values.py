"""The values and gradients the drawings show, kept on the nodes (`node.notes`).

The engine keeps neither the value of an intermediate tensor nor the gradient that reached it, so a
tool that wants to show them must be there when they exist. Two ways, and neither costs anything to
a graph nobody looks at:

- `tt.recording()`: every op recorded inside the block notes its value (and, for small tensors, its whole
  call, so that tt.explore can run it again for a finite-difference check), and gets a gradient hook;
- `tt.draw(y)` hooks every node of y's graph (the same hook a user's `register_hook` adds).

A hooked node notes the gradient that reaches it in every later backward (a plain `backward()`,
anywhere), the last one winning. A plain backward through a tiny graph (`tiny_graph`: micrograd's
examples) notes every node's gradient, and the values its rules saved, without either. Tensors of at
most VALUE_LIMIT elements are kept as copies, larger ones as their 2-norm. A leaf's value is the leaf and
its gradient `.grad`, which sums every backward since it was last zeroed: a plain backward through a tiny
graph notes on a leaf whose `.grad` held a gradient already what this backward added (`added`), so that
the drawing shows this backward's gradient beside the sum.
"""
import contextlib
import functools
import weakref
from typing import Any, Iterator, Optional, Union

import torch

from torchtrace.autograd.engine import topological_order
from torchtrace.autograd.node import AccumulateGrad, Node, gradient_for
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import observing
from torchtrace.inspect.scope import module_scope

VALUE_LIMIT = 4  # tensors with at most this many elements are shown in full; larger ones by their norm
CALL_LIMIT = 16  # an op whose tensors all have at most this many elements notes its call (tt.explore checks it)
Summary = Union[None, torch.Tensor, float]  # a small tensor's values, a large one's 2-norm, or unknown


def summary(t: Any, shape: Optional[torch.Size] = None) -> Summary:
    """A detached copy of a small tensor, the 2-norm of a larger one (summed to `shape` first, as the engine does)."""
    if not isinstance(t, torch.Tensor):
        return None
    with plain_torch():
        t = t.detach()
        if shape is not None and t.shape != shape:
            try:
                t = t.sum_to_size(shape)
            except RuntimeError:  # a rule's gradient of a wrong shape: unknown here, the engine says what is wrong
                return None
        if t.numel() <= VALUE_LIMIT:
            return t.as_subclass(torch.Tensor).clone()
        return t.double().norm().item()


def norm_of(value: Summary) -> Optional[float]:
    if isinstance(value, torch.Tensor):
        with plain_torch():
            return value.double().norm().item()
    return value


def number(value: float) -> str:
    """Plain notation where it reads well (0.336, -6, 1e-07), four significant digits."""
    return f"{value:.4g}"


def text(value: Summary, what: str) -> str:
    """`data 2`, `grad [1, -0.5]`, or `|grad| 0.336` for a large tensor; '' when unknown."""
    if value is None:
        return ""
    if isinstance(value, torch.Tensor):
        items = [number(v) for v in value.double().flatten().tolist()]
        return f"{what} {items[0] if value.dim() == 0 else '[' + ', '.join(items) + ']'}"
    return f"|{what}| {number(value)}"


def _capture(ref: "weakref.ref[Node]", nr: int, g: Any) -> None:
    node = ref()
    if node is not None:
        node.note(grads={**node.notes.get("grads", {}), nr: summary(g)})


def watch(node: Any) -> None:
    """Hook each output of an op node once, so every later backward notes the gradient that reaches it."""
    if not isinstance(node, Node) or (node.notes and node.notes.get("watched")):
        return
    node.note(watched=True)
    node.hooks = node.hooks or {}
    ref = weakref.ref(node)
    for nr in range(node.n_outputs):
        node.hooks.setdefault(nr, []).append(functools.partial(_capture, ref, nr))


def _copy(value: Any) -> Any:
    """A detached plain copy of every tensor in an argument (a list of tensors too)."""
    if isinstance(value, torch.Tensor):
        return value.detach().as_subclass(torch.Tensor).clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(v) for v in value)
    return value


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def small_call(args: tuple, kwargs: dict, outputs: tuple, limit: int = CALL_LIMIT) -> Optional[tuple]:
    """(args, kwargs, outputs) copied, when every tensor in them has at most `limit` elements; else None."""
    with plain_torch():
        if any(t.numel() > limit for t in _tensors((args, tuple(kwargs.values()), outputs))):
            return None
        return _copy(args), {k: _copy(v) for k, v in kwargs.items()}, _copy(tuple(_tensors(outputs)))


def _on_record(node: Node, args: tuple, kwargs: dict, result: Any) -> None:
    outputs = result if isinstance(result, (tuple, list)) else (result,)
    node.note(values={nr: summary(out) for nr, out in enumerate(outputs)}, call=small_call(args, kwargs, outputs))
    watch(node)


def _on_backward(node: Node, grads: Any, result: Any) -> None:
    """The gradient each input edge received: what the drawing writes on the arrows."""
    node.note(edge_grads={edge.position: summary(gradient_for(edge, result), edge.shape) for edge in node.edges})


TINY_NODES = 64  # a backward through a graph this small, of tensors of at most VALUE_LIMIT elements, notes its numbers


def tiny_graph(output: Any) -> bool:
    """At most TINY_NODES nodes, every tensor at most VALUE_LIMIT elements: the graphs tt.draw shows values for.

    The walk stops at the first large tensor or past TINY_NODES nodes, so a real model costs one step of it.
    """
    root = getattr(output, "_tt_node", None)
    if root is None:
        return False
    with plain_torch():  # a plain numel(), not one more call through the tracer's hook
        if output.numel() > VALUE_LIMIT:
            return False
    seen, stack = {root}, [root]
    while stack:
        for edge in stack.pop().edges:
            if edge.shape.numel() > VALUE_LIMIT:
                return False
            if edge.node not in seen:
                if len(seen) == TINY_NODES:
                    return False
                seen.add(edge.node)
                stack.append(edge.node)
    return True


def _note_everything(node: Node, grads: Any, result: Any) -> None:
    """During a backward of a tiny graph: the gradient reaching each output, what went along each edge, and the
    values of tensors the rule saved (an input saved by its consumer is the value of the op that made it)."""
    node.note(grads={**(node.notes or {}).get("grads", {}),
                     **{nr: summary(g) for nr, g in enumerate(grads) if g is not None}})
    _on_backward(node, grads, result)
    for saved in node.saved:
        producer = getattr(saved, "_tt_node", None)
        if producer is not None:
            known = (producer.notes or {}).get("values", {})
            if known.get(saved._tt_nr) is None:
                producer.note(values={**known, saved._tt_nr: summary(saved)})


def noting_tiny_graphs(output: Any, create_graph: bool) -> Any:
    """The block a plain backward runs in: for a tiny graph, every node notes its numbers (so `tt.draw(L)` after
    `L.backward()` shows them, as micrograd's draw_dot does); for any other graph, nothing. The package registers
    it with the tracer's backward (torchtrace/__init__.py), so the engine itself never looks."""
    if create_graph or not tiny_graph(output):
        return contextlib.nullcontext()
    return _noting(output)


@contextlib.contextmanager
def _noting(output: Any) -> Iterator[None]:
    """The observed backward of a tiny graph, and on each leaf whose .grad held a gradient before it, what it added
    (a leaf's .grad is the sum; the ops' notes hold this backward's gradients)."""
    held = {}
    with plain_torch():
        for node in topological_order([output._tt_node]):
            if isinstance(node, AccumulateGrad):
                node.notes = {k: v for k, v in (node.notes or {}).items() if k != "added"}  # (an earlier backward's)
                if node.variable.grad is not None and node.variable.grad.count_nonzero() > 0:
                    held[node] = node.variable.grad.detach().clone()
    with observing(on_backward=_note_everything):
        yield
    with plain_torch():
        for node, before in held.items():
            after = node.variable.grad
            if after is not None and after.shape == before.shape:
                node.notes = {**node.notes, "added": after.detach() - before}


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Inside the block, every op notes its module, its value and, in any later backward, its gradient.

        with tt.recording():
            loss = model(x)
        loss.backward()        # inside or outside the block
        tt.draw(loss, model)   # every op shows its value (or |value|) and its gradient

    A backward that runs inside the block also labels each arrow with the gradient that went along
    it. Plain torch modules (neither tt.nn nor ported) are placed in their modules only for forwards
    run inside the block.
    """
    with module_scope(), observing(on_record=_on_record, on_backward=_on_backward):
        yield
