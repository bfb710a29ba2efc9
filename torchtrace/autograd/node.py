"""The graph: a Node holds a rule, the rule's ctx and one Edge per input that needs a gradient.

An Edge points at the node that produced that input (an AccumulateGrad for a leaf). backward()
(engine.py) visits nodes newest first, calls each node's rule, and sends every edge the gradient
that belongs to it (`edge_gradient`). A node's `sequence_nr` says when it was made: the nodes an edge
points to are always older, so newest first is a topological order (as torch orders its ready queue).
"""
import functools
import itertools
import operator
import weakref
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

from torchtrace.autograd.grad_fn_hooks import GradFnHooks, NodeName
from torchtrace.errors import UnsupportedOperationError, saved_inference_tensor

_next_sequence_nr = itertools.count().__next__  # one counter for all threads (a graph may mix them)


class Edge(NamedTuple):
    """One input of a recorded op that needs a gradient."""

    position: Any  # where the input sat in the call: i, or (i, j) for item j of a list argument (torch.cat)
    node: Any  # the node that produced the input: a Node, or the AccumulateGrad of a leaf
    output_nr: int  # which output of that node the input was
    shape: torch.Size  # the gradient sent along this edge is summed (unbroadcast) to this shape...
    dtype: torch.dtype  # ...and cast to this dtype


class Contributions(tuple):
    """Several gradients a node sends along one edge, in the order eager's walk would have summed them (a compiled
    call's node: one per statement that read the outside tensor, newest first). The engine adds them into the
    buffer one by one, so they meet the gradients of other nodes in eager's order, bit for bit."""

    __slots__ = ()


def contributions(gradients: List[Any]) -> Any:
    """What an edge of a compiled node sends: None, one gradient, or several (Contributions)."""
    return None if not gradients else gradients[0] if len(gradients) == 1 else Contributions(gradients)


def gradient_for(edge: Edge, grads_of_inputs: tuple) -> Any:
    """The gradient this edge receives: its entry in what the rule's backward returned (a compiled node's several
    contributions summed, in the order the engine adds them)."""
    position = edge.position
    g = grads_of_inputs[position] if type(position) is int else grads_of_inputs[position[0]][position[1]]
    return functools.reduce(operator.add, g) if type(g) is Contributions else g


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


# the version list of a ctx that saved nothing (shared, never changed); getattr(t, "_version", None) per tensor:
_UNSAVED, _VERSION, _NONE = [], itertools.repeat("_version"), itertools.repeat(None)


class Context:
    """What a rule keeps between its forward and its backward (PyTorch's `ctx`).

    Rules call `save_for_backward`, read `saved_tensors` and `needs_input_grad` (one flag per positional parameter
    of forward: does that argument need a gradient?), and may set any attribute of their own (`ctx.dim = dim`, even
    `ctx.rule`). What torchtrace keeps here is underscored: `_rule` is the Function this ctx serves (a rule class
    shared by several ops reads its data there). The graph bookkeeping lives apart, in the Node.
    """

    __slots__ = ("_rule", "_edges", "_mask", "_saved", "_versions", "needs_input_grad", "__dict__")
    _released = False
    _graph_saved: Optional[Tuple[Any, ...]] = None
    _packed: Optional[Tuple[Callable, List[Any]]] = None  # (unpack, what pack made of each saved tensor): see below
    _n_inputs: Optional[int] = None  # set for Function.apply: how many arguments backward returns gradients for

    def __init__(self, rule: type, edges: Any = (), needs_mask: int = 0):  # mask bit i set: argument i needs a gradient
        self._rule, self._edges, self._mask, self._saved, self._versions = rule, edges, needs_mask, (), _UNSAVED
        self.needs_input_grad = _NEEDS.get(needs_mask) or _needs_flags(needs_mask)

    def save_for_backward(self, *tensors: Any) -> None:
        """Keep tensors for backward; an in-place change of one of them before backward is an error."""
        try:
            self._saved, self._versions = tensors, list(map(getattr, tensors, _VERSION, _NONE))
        except RuntimeError:  # an inference tensor has no version counter
            raise saved_inference_tensor(self._rule.__name__) from None
        if None in self._versions and not getattr(self._rule, "_tt_trusted", False):  # a user rule saved a number?
            for i, t in enumerate(tensors):
                if t is not None and not isinstance(t, torch.Tensor):
                    raise TypeError(f"save_for_backward can only save tensors (or None), but argument {i} is of type "
                                    f"{type(t).__name__}: keep other values as attributes of ctx (ctx.k = k)")
        if _top_hooks(False) is not None:  # (one C call when none: this runs for every op that saves)
            hooks = saved_tensor_hooks()
            if hooks is not None:
                self._pack(*hooks)

    def _pack(self, pack: Callable, unpack: Callable) -> None:
        """Under torch's saved_tensors_hooks (save_on_cpu, a user's compression), as torch: each saved
        tensor goes through pack now and unpack in backward, and only what pack returned is kept. Its version can
        then not be read in backward: an in-place change of it afterwards is not caught (torch keeps a counter)."""
        self._packed = unpack, [(pack(t), True) if isinstance(t, torch.Tensor) else (t, False) for t in self._saved]
        self.packed_ids = tuple(map(id, self._saved))  # which results were saved (dispatch._linked reads it)
        self._saved, self._versions = (), _UNSAVED  # (a number a rule keeps, as Mul's 0.6 in x * 0.6, stays as it is)

    materialize_grads = True  # backward receives zeros (not None) for an output of several no gradient reached

    def set_materialize_grads(self, value: bool) -> None:
        """False: backward receives None for an output no gradient reached (as torch's ctx)."""
        self.materialize_grads = bool(value)

    def mark_non_differentiable(self, *outputs: Any) -> None:
        """Outputs of forward that carry no gradient (an index, a mask), as torch's ctx: they are returned as tracers
        that do not require grad, and backward receives zeros (or None) for them."""
        self.non_differentiable = outputs

    def mark_dirty(self, *tensors: Any) -> None:
        raise UnsupportedOperationError(
            f"{self._rule.__name__}: a tt.Function's forward cannot change its inputs in place (ctx.mark_dirty). "
            "Return a changed copy (x.clone()), or subclass torch's own autograd Function instead, which runs on "
            "tracers with torch's whole ctx API.")

    def save_for_forward(self, *tensors: Any) -> None:
        """Keep tensors for the rule's jvp (forward mode), which reads them as ctx.saved_tensors (as torch's)."""
        self.saved_for_forward = tensors

    @property
    def saved_tensors(self) -> Tuple[Any, ...]:
        if self._released:
            self._refuse()
        if self._packed is not None:
            unpack, packed = self._packed
            return tuple(unpack(p) if was_tensor else p for p, was_tensor in packed)
        if list(map(getattr, self._saved, _VERSION, _NONE)) != self._versions and any(  # (one read per tensor, in C)
                v is not None and t._version != v for t, v in zip(self._saved, self._versions)):  # None: unchecked
            self._refuse()
        return self._saved if self._graph_saved is None else self._graph_saved

    def _refuse(self) -> None:
        if self._released:
            raise RuntimeError(
                f"Trying to backward through the graph a second time ({self._rule.__name__}Backward): its saved "
                "tensors were freed after the first backward. Pass retain_graph=True to the first backward()."
            )
        t, version = next((t, v) for t, v in zip(self._saved, self._versions) if v is not None and t._version != v)
        raise RuntimeError(
            f"A tensor saved by {self._rule.__name__}Backward for backward was modified by an in-place "
            f"operation (version {version} -> {t._version}). Use the out-of-place form of that op "
            "(e.g. x = x + 1 instead of x += 1), or .clone() before modifying it."
        )

    def use_graph_saved(self, saved: Optional[Tuple[Any, ...]]) -> None:
        """While a create_graph backward runs: saved outputs re-linked to the graph (None restores them)."""
        self._graph_saved = saved

    def release(self) -> None:
        """Free what forward saved (after the node ran, unless retain_graph)."""
        if self._saved or self._packed is not None:
            self._saved, self._versions, self._released, self._packed = (), _UNSAVED, True, None


_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks


def saved_tensor_hooks() -> Optional[Tuple[Callable, Callable]]:
    """(pack, unpack) of torch's saved_tensors_hooks in force, None without. torch.utils.checkpoint's
    own (its non-reentrant mode) are not followed: they rebuild torch autograd's graph, which tracers do not have (a
    checkpoint on tracers keeps what it saves: its gradient is exact, its memory is not saved)."""
    hooks = _top_hooks(False)
    if hooks is None or hooks[0].__qualname__.startswith("_checkpoint_hook."):
        return None
    return hooks


_NEEDS: Dict[int, Tuple[bool, ...]] = {}  # bit mask of the arguments needing a gradient -> needs_input_grad flags


def _needs_flags(mask: int) -> Tuple[bool, ...]:
    """0b101 -> (True, False, True, False, ...): one flag per parameter, at least 16 (F.embedding_bag reads its
    tenth: a rule may ask about any parameter it has, whether or not the call passed it)."""
    return _NEEDS.setdefault(mask, tuple(bool(mask >> i & 1) for i in range(max(16, mask.bit_length()))))


class Node(GradFnHooks):
    """One recorded op: the grad_fn of its outputs, and a step of the backward walk."""

    n_outputs = 1
    output_meta: Optional[List[Any]] = None  # (shape, dtype, device) per output of a multi-output op; None: no tensor
    saved_outputs: Tuple[Tuple[int, int], ...] = ()  # (saved index, output nr): saved outputs create_graph re-links
    hooks: Optional[dict] = None  # output nr -> [hook(grad)] registered on a non-leaf tracer
    retained: Optional[dict] = None  # output nr -> weak ref to the tracer that called retain_grad()
    autocast: Optional[Tuple[str, torch.dtype, bool]] = None  # recorded under torch.autocast(device type, dtype);
    # the bool: its backward runs under it too (autograd/autocast.py)
    notes: Optional[dict] = None  # what inspection tools note about the node: source line, call shapes, ...

    # What every node has lives in slots; what few nodes have is a class default until set (in the instance dict).
    __slots__ = ("rule", "ctx", "edges", "func", "module_path", "sequence_nr", "value_refs")

    def __init__(self, rule: type, ctx: Any, edges: List[Edge], func: Optional[Callable], module_path: tuple):
        self.rule, self.ctx, self.edges, self.func = rule, ctx, edges, func
        self.module_path = module_path  # the modules running when the op was recorded, outermost first
        # newer than every node its edges point to; value_refs: for each output, kept_values.kept_output (the value
        # up to a budget, else a weak reference; None for a non-tensor output), so tools can show every value
        self.sequence_nr, self.value_refs = _next_sequence_nr(), None

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
    def saved_tensors(self) -> Tuple[Any, ...]:
        """What the rule saved, as torch's grad_fn.saved_tensors (raises once a backward freed them)."""
        return self.ctx.saved_tensors

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


class AccumulateGrad(GradFnHooks):
    """The node of a leaf: gradients that reach it are summed into the leaf's `.grad` (its grad_fn hooks as torch's:
    a pre-hook sees (grad,) before, a hook ((), (grad,)) after)."""

    name = NodeName("AccumulateGrad")
    n_outputs = 1
    edges: Tuple[Edge, ...] = ()
    next_functions = ()
    module_path = ()
    module = None
    notes = None

    def __init__(self, leaf: torch.Tensor):
        self.variable, self.sequence_nr = leaf, _next_sequence_nr()
        self.torch_leaf = not hasattr(type(leaf), "_tt_grad")  # a plain tensor with torch's requires_grad=True
        leaf._tt_acc = self.weak_self = weakref.ref(self)  # the leaf holds it weakly, the graph strongly (as torch)

    def __repr__(self) -> str:
        return "<AccumulateGrad>"


def leaf_accumulator(leaf: torch.Tensor) -> AccumulateGrad:
    """The leaf's AccumulateGrad node; the leaf holds it weakly, the graph strongly (as torch does)."""
    ref = getattr(leaf, "_tt_acc", None)
    acc = ref() if ref is not None else None
    return acc if acc is not None else AccumulateGrad(leaf)


def keep_values(node: Node, values: tuple, outputs: tuple) -> None:
    """What a node keeps of its outputs' values (one entry per output, None for a non-tensor): the value itself where
    kept_values.kept_output kept it (within the thread's budget), else a weak reference to the output, so tools can
    show values the graph itself does not keep. Every recording path calls this one helper."""
    node.value_refs = tuple(v or (weakref.ref(t) if isinstance(t, torch.Tensor) else None)
                            for v, t in zip(values, outputs))


def link_output(raw: torch.Tensor, node: Node, nr: int, tracer_type: type, fresh: bool = False) -> torch.Tensor:
    """Wrap a plain forward result as a tracer whose grad_fn is `node` (integer results get no node; complex ones are
    refused: every rule is written for real tensors, and a complex gradient would need conjugates). A `fresh` result,
    one no one else holds, becomes the tracer itself (its class changes: no second Python object, unlike as_subclass).
    """
    floating, view = raw.is_floating_point(), raw._is_view()
    if not floating and raw.is_complex():
        raise UnsupportedOperationError(f"{node.rule.__name__}: its result is complex, and torchtrace differentiates "
                                        "real tensors only: keep real and imaginary parts as separate real tracers, "
                                        "or run this call under tt.no_grad()")
    t = raw
    if not fresh:  # an alias: of a view, a view of the same base; else a detached one (not a view, as torch's result)
        t = raw.as_subclass(tracer_type) if view or raw.requires_grad else torch.Tensor.detach(raw)
    t.__class__ = tracer_type  # a fresh result becomes the tracer itself
    if floating:  # only what differs from the class defaults is set: the Python object is new
        t._tt_node, t._tt_requires_grad, t._tt_version = node, True, raw._version
        if nr:
            t._tt_nr = nr
    if view:
        t._tt_view = True
    return t
