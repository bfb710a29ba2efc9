"""Forward mode from reverse mode: J v = d/du < J^T u, v >, the transpose of a vector-Jacobian product.

One backward from a cotangent u computes J^T u, linear in u; differentiating it again with respect to u,
along v, gives J v. The first backward runs with create_graph=True from a u that requires a gradient, so the
engine records J^T u as a graph in u; the second backward, seeded with v, walks that graph. The value of u
never matters for the result (it is drawn at random, from a generator of its own, to tell a backward that
ignores its incoming gradient from a Jacobian that is zero).

Two uses: `transposed_tangent` transposes ONE op whose rule has no tangent rule (the dual pass's fallback),
and `Linearised` transposes a whole function (tt.jvp(..., method="transpose"), the lesson of notebook 06a).
Both need the backward to be differentiable; a backward that is not (it detaches, or leaves torch) would give
a zero Jacobian silently, so both refuse instead.
"""
from typing import Any, List, Optional, Sequence, Tuple

import torch

from torchtrace.autograd.engine import grad
from torchtrace.autograd.node import Edge, Node, leaf_accumulator, link_output
from torchtrace.autograd.plain import plain_torch
from torchtrace.errors import UnsupportedOperationError
from torchtrace.factories import as_tracer
from torchtrace.forward.call import Call
from torchtrace.tracer import tracer as TRACER


def plain(t: torch.Tensor) -> torch.Tensor:
    with plain_torch():
        return t.detach().as_subclass(torch.Tensor)


def random_cotangent(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """u ~ N(0, 1), a tracer that requires a gradient (J^T u is then recorded as a function of u)."""
    u = torch.randn(like.shape, generator=generator, dtype=like.dtype).to(like.device)
    return as_tracer(u, requires_grad=True)


def not_differentiable(name: str) -> UnsupportedOperationError:
    return UnsupportedOperationError(
        f"forward mode: {name} has no tangent rule, and its backward is not differentiable (what it returns does "
        "not record the incoming gradient), so transposing it would give a zero Jacobian. Give it a "
        "jvp(ctx, *tangents) (as torch's autograd.Function), make its backward use torch ops on its arguments, "
        "or use reverse mode (tt.jacobian(f, x, mode='reverse')).")


def _nonzero(t: torch.Tensor) -> bool:
    with plain_torch():
        return bool((t != 0).any())


def _outputs(out: Any) -> List[Tuple[int, torch.Tensor]]:
    """(output number, tensor) of the floating outputs of an op."""
    items = [out] if isinstance(out, torch.Tensor) else list(out)
    return [(nr, o) for nr, o in enumerate(items) if isinstance(o, torch.Tensor) and o.is_floating_point()]


def _twin(node: Node, leaves: List[torch.Tensor]) -> Node:
    """The node's rule and ctx, with its edges ending at fresh leaves: its backward alone, nothing upstream."""
    edges = [Edge(e.position, leaf_accumulator(leaf), 0, e.shape, e.dtype) for e, leaf in zip(node.edges, leaves)]
    twin = Node(node.rule, node.ctx, edges, node.func, node.module_path)
    twin.n_outputs, twin.output_meta = node.n_outputs, node.output_meta
    twin.saved_outputs, twin.autocast = node.saved_outputs, node.autocast
    return twin


def _keyword(call: Call, where: int) -> str:
    """The keyword an argument past the positional ones was passed as (the engine routes it by that position)."""
    names = call.rule.parameter_names()
    return names[where] if where < len(names) else next(iter(call.kwargs))


def _input_of_edge(call: Call, edge: Edge) -> Any:
    position = edge.position
    where = position if type(position) is int else position[0]
    value = call.args[where] if where < len(call.args) else call.kwargs[_keyword(call, where)]
    return value if type(position) is int else value[position[1]]


def _tangent_of_edge(call: Call, edge: Edge) -> Optional[torch.Tensor]:
    position = edge.position
    where = position if type(position) is int else position[0]
    dot = call.dots[where] if where < len(call.args) else call.kwdots.get(_keyword(call, where))
    return dot if type(position) is int or dot is None else dot[position[1]]


def transposed_tangent(call: Call) -> Any:
    """J v of one op, from its own backward run twice (d/du < J^T u, v >)."""
    node = call.node
    outputs = _outputs(call.out)
    with plain_torch():
        leaves = [as_tracer(plain(_input_of_edge(call, edge)).clone(), requires_grad=True) for edge in node.edges]
    twin = _twin(node, leaves)
    generator = torch.Generator().manual_seed(0)
    linked = [link_output(plain(o), twin, nr, TRACER) for nr, o in outputs]
    cotangents = [random_cotangent(plain(o), generator) for _, o in outputs]
    vjps = grad(linked, leaves, cotangents, create_graph=True, retain_graph=True, allow_unused=True)
    products: List[Optional[torch.Tensor]] = [None] * len(outputs)
    for edge, vjp in zip(node.edges, vjps):
        v = _tangent_of_edge(call, edge)
        if v is None or vjp is None:
            continue
        columns = (grad(vjp, cotangents, v, retain_graph=True, allow_unused=True)
                   if getattr(vjp, "_tt_requires_grad", False) else [None] * len(outputs))
        if all(c is None for c in columns):
            if _nonzero(vjp):
                raise not_differentiable(node.rule.__name__)
            continue
        products = [p if c is None else plain(c) if p is None else p + plain(c) for p, c in zip(products, columns)]
    by_nr = {nr: p for (nr, _), p in zip(outputs, products)}
    if isinstance(call.out, torch.Tensor):
        return by_nr.get(0)
    return tuple(by_nr.get(nr) for nr in range(len(call.out)))


class Linearised:
    """f at the primals, with J^T u recorded as a graph in the cotangents u (the first reverse pass)."""

    def __init__(self, inputs: Sequence[torch.Tensor], outputs: List[torch.Tensor]):
        self.inputs, self.outputs = list(inputs), outputs
        self.live = [i for i, out in enumerate(self.outputs) if getattr(out, "_tt_requires_grad", False)]
        self.cotangents: List[torch.Tensor] = []
        self.vjp: Sequence[Any] = ()

    def _record_vjp(self) -> None:
        """J^T u with create_graph=True, from cotangents u that require a gradient (once, on first use)."""
        if self.cotangents or not self.live:
            return
        generator = torch.Generator().manual_seed(0)
        self.cotangents = [random_cotangent(plain(self.outputs[i]), generator) for i in self.live]
        self.vjp = grad([self.outputs[i] for i in self.live], self.inputs, self.cotangents,
                        create_graph=True, allow_unused=True)
        for g in self.vjp:
            if g is not None and not getattr(g, "_tt_requires_grad", False) and _nonzero(g):
                raise not_differentiable("a rule on the path")

    def jvp(self, tangents: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """J v, one output per f output: the second reverse pass, d/du < J^T u, v >."""
        self._record_vjp()
        wired = [(g, t) for g, t in zip(self.vjp, tangents) if g is not None and g._tt_requires_grad]
        products = (grad([g for g, _ in wired], self.cotangents, [t for _, t in wired], retain_graph=True,
                         allow_unused=True) if wired else [None] * len(self.live))
        by_output = dict(zip(self.live, products))
        return [plain(by_output[i]) if by_output.get(i) is not None else torch.zeros_like(plain(out))
                for i, out in enumerate(self.outputs)]
