"""The graph: a Node holds a rule, the rule's ctx and one Edge per input that needs a gradient.

An Edge points at the node that produced that input (an AccumulateGrad for a leaf). backward()
(engine.py) visits nodes in reverse topological order, calls each node's rule, and sends every edge
the gradient that belongs to it (`gradient_for`).
"""
import weakref
from typing import Any, Callable, List, NamedTuple, Optional, Tuple

import torch

from torchtrace.errors import UnsupportedOperationError
from torchtrace.grad_fn_hooks import GradFnHooks, NodeName, RemovableHandle  # noqa: F401  (tracer.py's handle)


class Edge(NamedTuple):
    """One input of a recorded op that needs a gradient."""

    position: Any  # where the input sat in the call: i, or (i, j) for item j of a list argument (torch.cat)
    node: Any  # the node that produced the input: a Node, or the AccumulateGrad of a leaf
    output_nr: int  # which output of that node the input was
    shape: torch.Size  # the gradient sent along this edge is summed (unbroadcast) to this shape...
    dtype: torch.dtype  # ...and cast to this dtype


def gradient_for(edge: Edge, grads_of_inputs: tuple) -> Any:
    """The gradient this edge receives: its entry in what the rule's backward returned."""
    position = edge.position
    return grads_of_inputs[position] if type(position) is int else grads_of_inputs[position[0]][position[1]]


def edge_gradient(edge: Edge, grads_of_inputs: tuple) -> Optional[torch.Tensor]:
    """What the input behind `edge` receives: the rule's gradient for it, summed over the dimensions forward
    broadcast (back to the input's shape) and cast to the input's dtype. The engine, the compiler and the
    inspection tools all use this one definition."""
    g = gradient_for(edge, grads_of_inputs)
    if g is None:
        return None
    if g.shape != edge.shape:
        g = g.sum_to_size(edge.shape)
    return g if g.dtype == edge.dtype else g.to(edge.dtype)


class Node(GradFnHooks):
    """One recorded op: the grad_fn of its outputs, and a step of the backward walk."""

    n_outputs = 1
    output_meta: Optional[List[Any]] = None  # (shape, dtype, device) per output of a multi-output op; None: no tensor
    saved_outputs: Tuple[Tuple[int, int], ...] = ()  # (saved index, output nr): saved outputs create_graph re-links
    hooks: Optional[dict] = None  # output nr -> [hook(grad)] registered on a non-leaf tracer
    retained: Optional[dict] = None  # output nr -> weak ref to the tracer that called retain_grad()
    autocast: Optional[Tuple[str, torch.dtype]] = None  # recorded under torch.autocast(device type, dtype)
    notes: Optional[dict] = None  # what inspection tools note about the node: source line, call shapes, ...
    value_refs: Optional[tuple] = None  # a weakref.ref to each output tracer (None for a non-tensor output): tt.explore

    def __init__(self, rule: type, ctx: Any, edges: List[Edge], func: Optional[Callable], module_path: tuple):
        self.rule, self.ctx, self.edges, self.func = rule, ctx, edges, func
        self.module_path = module_path  # the modules running when the op was recorded, outermost first

    @property
    def name(self) -> NodeName:
        return NodeName(self.rule.__name__ + "Backward")

    @property
    def module(self) -> Any:
        """The innermost module that was running when this op was recorded (None outside modules)."""
        return self.module_path[-1] if self.module_path else None

    @property
    def saved(self) -> Tuple[Any, ...]:
        """What the rule saved for backward (empty once freed), for tools that show it."""
        return self.ctx._saved

    @property
    def released(self) -> bool:
        """Did a backward free this node's saved tensors?"""
        return self.ctx._released

    @property
    def next_functions(self) -> Tuple[Tuple[Any, int], ...]:
        return tuple((edge.node, edge.output_nr) for edge in self.edges)

    def note(self, **facts: Any) -> None:
        """Let an inspection tool remember something about this node (kept apart from the rule's ctx)."""
        self.notes = {**(self.notes or {}), **facts}

    def __repr__(self) -> str:
        return f"<{self.name}>"


class AccumulateGrad:
    """The node of a leaf: gradients that reach it are summed into the leaf's `.grad`."""

    name = NodeName("AccumulateGrad")
    n_outputs = 1
    edges: Tuple[Edge, ...] = ()
    next_functions = ()
    module_path = ()
    module = None
    notes = None

    def __init__(self, leaf: torch.Tensor):
        self.variable = leaf
        self.torch_leaf = not hasattr(type(leaf), "_tt_grad")  # a plain tensor with torch's requires_grad=True
        self.weak_self = weakref.ref(self)

    def __repr__(self) -> str:
        return "<AccumulateGrad>"


def leaf_accumulator(leaf: torch.Tensor) -> AccumulateGrad:
    """The leaf's AccumulateGrad node; the leaf holds it weakly, the graph strongly (as torch does)."""
    ref = getattr(leaf, "_tt_acc", None)
    acc = ref() if ref is not None else None
    if acc is None:
        acc = AccumulateGrad(leaf)
        leaf._tt_acc = acc.weak_self
    return acc


def link_output(raw: torch.Tensor, node: Node, nr: int, tracer_type: type) -> torch.Tensor:
    """Wrap a plain forward result as a tracer whose grad_fn is `node` (integer results get no node; complex ones are
    refused: every rule is written for real tensors, and a complex gradient would need conjugates)."""
    t = raw.as_subclass(tracer_type)
    if raw.is_floating_point():
        t._tt_node, t._tt_requires_grad = node, True
        if nr:
            t._tt_nr = nr
        version = raw._version
        if version:
            t._tt_version = version
    elif raw.is_complex():
        raise UnsupportedOperationError(f"{node.rule.__name__}: its result is complex, and torchtrace differentiates "
                                        "real tensors only: keep real and imaginary parts as separate real tracers, "
                                        "or run this call under tt.no_grad()")
    if raw._is_view():
        t._tt_view = True
    return t
