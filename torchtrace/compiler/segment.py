"""The one node a run of matched statements becomes: its backward is the program's backward over those statements.

Each matched statement ran its rule's forward into a Context of its own (no Node, no edges). The statements'
results are outputs of one Node, `Segment.node`; its edges are the tensors the statements read from outside
the segment (parameters, inputs, results of eager calls or of an earlier segment). Its backward walks the
statements in reverse: each rule's backward on its Context, each edge's gradient (`edge_gradient`: the rule's
gradient summed to the input's shape and cast to its dtype) summed into the value it came from, or handed to the
engine as the gradient of an outside tensor — which the engine sums into `.grad` as for any node. That walk is
written out once per sequence of statements as one generated function (segment_code.py), which runs wherever no
hook, retain_grad, tt.grad capture or create_graph asks for the walk itself (`Segment.backward` below).
"""
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from torchtrace.autograd.dispatch import DATA_WRITES
from torchtrace.autograd.engine import saves_torch_leaf, with_torch_leaves_linked
from torchtrace.autograd.grad_fn_hooks import run_post_hooks, run_pre_hooks
from torchtrace.autograd.hooks import output_hooks
from torchtrace.autograd.node import Context, Edge, Node, contributions, leaf_accumulator, link_output
from torchtrace.autograd.node import _next_sequence_nr as next_sequence_nr
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import STATE
from torchtrace.compiler.segment_code import generated_backward
from torchtrace.compiler.step_code import LayoutDiffers
from torchtrace.tracer import tracer

_new_edge = tuple.__new__


class Step:
    """A statement as it ran in this call: its rule and Context, the values it made, where each gradient goes
    (`targets`: (position, shape, dtype, local, where) per edge: the rule's gradient at `position` of what backward
    returns, summed to `shape` and cast to `dtype` as `edge_gradient` does, goes to value `where` of this segment if
    `local`, else to the segment node's edge `where`)."""

    __slots__ = ("rule", "ctx", "outputs", "metas", "targets", "local", "released", "saved_outputs", "node",
                 "statement", "floats", "shown_ref", "saved_inputs")

    def __init__(self, rule: type, ctx: Any, outputs: List[int], metas: list, targets: list, local: List[int],
                 saved_outputs: Tuple[Tuple[int, int], ...], statement: Any, floats: tuple):
        self.rule, self.ctx, self.outputs, self.metas, self.targets = rule, ctx, outputs, metas, targets
        self.statement = statement  # the program's Statement it ran as
        self.floats = floats  # the call's floats, in the order its trace names them (f0, f1, ...)
        self.local = local  # the values of this segment the step reads (whose steps its gradients go to), in order
        self.released = False
        self.saved_outputs = saved_outputs  # (saved index, output nr of the node): results the rule saved plain
        self.saved_inputs: Tuple[Tuple[int, Any, int], ...] = ()  # (saved index, weak ref, output nr): arguments
        # this node made that the rule saved, kept plain (Segment.plain_saved_inputs)
        self.node: Optional[HookLists] = None  # the hooks registered on its grad_fn (their lists, not the node)
        self.shown_ref: Optional[Callable[[], Optional[Node]]] = None  # that grad_fn, weakly: its edges lead to the
        # segment's node, whose ctx holds this step (held strongly, that would be a cycle)

    def shown(self) -> Optional[Node]:
        """The grad_fn its results show, while anything holds it (`Segment.grad_fn_of` makes it when first read)."""
        return self.shown_ref() if self.shown_ref is not None else None


class HookLists:
    """What the segment's backward runs around a step's rule: the grad_fn hooks registered on the step's grad_fn,
    the same lists that node holds (a grad_fn made again later, after the first was dropped, gets them too)."""

    __slots__ = ("rule", "pre_hooks", "post_hooks")

    def __init__(self, rule: type, pre_hooks: list, post_hooks: list):
        self.rule, self.pre_hooks, self.post_hooks = rule, pre_hooks, post_hooks


class ShownStep(Node):
    """A step's grad_fn as a result shows it, held weakly by the step; hooks registered on it go into lists the step
    keeps (HookLists: the segment's backward runs them around the step's rule). Each rule's is a subclass named as the
    node (ReluBackward), as torch's grad_fn classes are, so a tensor's repr shows that name."""

    __slots__ = ("step",)

    def register_prehook(self, hook: Callable) -> Any:
        self._lists()
        return super().register_prehook(hook)

    def register_hook(self, hook: Callable) -> Any:
        self._lists()
        return super().register_hook(hook)

    def _lists(self) -> None:
        """The step keeps this node's hook lists (not the node: through its edges that would be a cycle)."""
        if self.step.node is None:
            self.step.node = HookLists(self.rule, [], [])
        self.pre_hooks, self.post_hooks = self.step.node.pre_hooks, self.step.node.post_hooks


_SHOWN_CLASSES: "weakref.WeakKeyDictionary[type, type]" = weakref.WeakKeyDictionary()  # rule -> its ShownStep class


def _shown_class(rule: type) -> type:
    found = _SHOWN_CLASSES.get(rule)
    if found is None:
        found = _SHOWN_CLASSES[rule] = type(f"{rule.__name__}Backward", (ShownStep,), {"__slots__": ()})
    return found


class CompiledCall:
    """y = the compiled statements -> dy/dx by each statement's rule, in reverse

    The rule of a segment's node: the engine calls backward(ctx, *grads), and ctx is the Segment. It runs the hooks,
    retain_grad and tt.grad captures of the values it made itself, each on the value's whole gradient.
    """

    _tt_hooks_inside = True
    _tt_trusted = True  # its statements' rules are torchtrace's own (a user's rule runs eagerly): see Function

    @staticmethod
    def backward(segment: "Segment", *grads: Optional[torch.Tensor]) -> Tuple[Optional[torch.Tensor], ...]:
        return segment.backward(grads)


class Segment:
    """The open node of matched statements: grows as statements match, is complete when the call leaves it."""

    _released = False
    _n_inputs = None
    _saved: tuple = ()
    _packed = None  # (a compiled call under saved_tensors_hooks runs eagerly: its segments pack nothing)
    shown = False  # a statement's node was shown as a result's grad_fn (it may hold grad_fn hooks)

    def __init__(self, first_value: int) -> None:
        self.first_value = first_value  # the number of the first value it makes: every later one until it closes
        self.sealed = False  # its backward has started: statements from now on make a node of their own
        self.steps: List[Step] = []
        self.nr_of: Dict[int, int] = {}  # value number -> output nr of the node
        self.producer: Dict[int, Step] = {}  # value number -> the step that made it
        self.outputs: List[int] = []  # output nr -> value number
        self.outside: Dict[int, int] = {}  # source (value j, or ~slot for leaf slot) -> edge position
        self._node: Optional[Node] = Node(CompiledCall, self, [], None, ())  # held while the call adds to it
        self._node.n_outputs = 0
        self._left: Callable[[], Optional[Node]] = lambda: None

    @property
    def node(self) -> Node:
        """The node whose ctx this segment is: held strongly while the call adds statements, weakly once it left (the
        node holds the segment as its ctx; its results and the nodes after it hold the node)."""
        node = self._node
        return node if node is not None else self._left()

    def leave(self) -> None:
        """The call left the segment: hold the node weakly from now on (no cycle node -> segment -> node)."""
        if self._node is not None:
            self._left, self._node = weakref.ref(self._node), None

    def add_output(self, value: int) -> int:
        nr = len(self.outputs)
        self.outputs.append(value)
        self.nr_of[value] = nr
        self.node.n_outputs = nr + 1
        return nr

    def add_step(self, step: Step) -> None:
        self.steps.append(step)
        for value in step.outputs:
            self.producer[value] = step
        self.plain_saved_inputs(step)

    def plain_saved_inputs(self, step: Step) -> None:
        """A tracer this segment made, saved by a later statement, would hold the node through the step's Context
        (node -> segment -> step -> Context -> tracer -> node: a cycle only Python's collector frees, with every
        tensor of the graph): it is saved as a plain alias instead (the same memory and version counter), and a
        create_graph backward reads the tracer itself again while it lives (else links the alias back as the node's
        output, as the results a rule saved)."""
        node = self._node or self.node
        for i, t in enumerate(step.ctx._saved):
            if getattr(t, "_tt_node", None) is node:
                with plain_torch():
                    self.plain_saved_input(step, i, t)

    def plain_saved_input(self, step: Step, index: int, t: torch.Tensor) -> None:
        """Saved tensor `index` of the step, a tracer of this node, kept as a plain alias (under plain_torch)."""
        saved = list(step.ctx._saved)
        saved[index] = torch.Tensor.detach(t)  # (a plain tensor: subclass dispatch is off)
        step.ctx._saved, step.saved_inputs = tuple(saved), (*step.saved_inputs, (index, weakref.ref(t), t._tt_nr))

    def follow_data(self, t: torch.Tensor) -> None:
        """`t.data = v` on a value this segment made: the statements that saved t read its new data, as eager's rules
        (which hold t itself) and torch's saved variables do; a result a rule saved keeps what the op made (torch's
        too)."""
        for step in self.steps:
            for index, ref, _ in step.saved_inputs:
                if ref() is t and step.ctx is not None:  # (a step freed by a backward saves nothing any more)
                    saved = list(step.ctx._saved)
                    with plain_torch():
                        saved[index] = torch.Tensor.detach(t)
                    step.ctx._saved = tuple(saved)

    def edge_to(self, key: int, t: torch.Tensor) -> int:
        """The edge position of an outside tensor that needs a gradient (one per tensor, however often it is read)."""
        position = self.outside.get(key)
        if position is None:
            node = self._node or self.node
            target = t._tt_node if hasattr(type(t), "_tt_node") else None
            nr = t._tt_nr if target is not None else 0
            if target is None:
                target = leaf_accumulator(t)
            if target.sequence_nr > node.sequence_nr:  # a leaf's AccumulateGrad made just now: the node stays
                node.sequence_nr = next_sequence_nr()  # newer than what it sends to, as an eager op's
            position = self.outside[key] = len(node.edges)
            node.edges.append(_new_edge(Edge, (position, target, nr, t.shape, t.dtype)))
        return position

    def grad_fn_of(self, nr: int) -> Node:
        """The grad_fn of output nr, as eager's: a node of the statement that made it (its rule's name, its own
        grad_fn hooks, which the segment's backward runs around that statement's rule; its edges lead to this
        segment's node or to the node's edges)."""
        step = self.producer[self.outputs[nr]]
        self.shown = True
        node = step.shown()
        if node is None:
            edges, ctx = self.node.edges, step.ctx
            if ctx is None:  # a backward freed it already: what the node shows is a freed Context
                ctx = Context(step.rule)
                ctx._released = True
            node = _shown_class(step.rule)(step.rule, ctx, [
                _new_edge(Edge, (position, self.node, self.nr_of[where], shape, dtype)) if local else
                _new_edge(Edge, (position, edges[where].node, edges[where].output_nr, shape, dtype))
                for position, shape, dtype, local, where in step.targets], None, ())
            node.step, step.shown_ref = step, weakref.ref(node)
            if step.node is not None:  # hooks registered on a grad_fn of this step that was dropped since
                node.pre_hooks, node.post_hooks = step.node.pre_hooks, step.node.post_hooks
        return node

    # what the engine reads of a node's ctx: _released, _saved (nothing: each step frees its own), backward ------
    def backward(self, grads: tuple) -> tuple:
        create_graph = torch.is_grad_enabled()  # the rules' torch calls record the gradient's graph (on tracers)
        retain, captured, hand_out, needed = STATE.walk
        self.sealed = True
        node = self.node
        asked = node.hooks or node.retained or (captured is not None and any(n is node for n, _ in captured))
        runs, seen = self._needed_steps(captured, needed)
        if not (create_graph or asked) and (runs is None or len(runs) == len(self.steps)):
            result = self._run_generated(grads, retain)
            if result is not None:
                return result
        buffers: Dict[int, torch.Tensor] = {}
        for nr, g in enumerate(grads):
            if g is not None:
                buffers[self.outputs[nr]] = g
        result: List[List[torch.Tensor]] = [[] for _ in self.node.edges]  # what each edge sends, newest first
        for step in self._order(buffers):
            if len(step.outputs) == 1:
                g = buffers.pop(step.outputs[0], None)
                if g is None:
                    continue
                gs = [g]
            else:
                gs = [buffers.pop(v, None) for v in step.outputs]
                if all(g is None for g in gs):
                    continue
            if seen is not None and step not in seen:
                continue  # tt.grad needs neither its values nor anything below it: not run, no hooks (as eager)
            if asked:  # each value's gradient is whole now (every statement reading it has run): as eager's walk
                gs = self._hooks(step, gs, captured, hand_out)  # runs hooks, retain_grad and tt.grad's capture
            if runs is not None and step not in runs:
                continue  # tt.grad needs nothing below it: its gradient captured, its rule not run (as eager)
            if len(gs) > 1:
                # as the engine: zeros for the outputs no gradient reached
                gs = [torch.zeros(m[0], dtype=m[1], device=m[2]) if g is None and m is not None else g
                      for g, m in zip(gs, step.metas)]
            shown = step.node
            if shown is not None and shown.pre_hooks:  # grad_fn.register_prehook on one of its results
                gs = run_pre_hooks(shown, gs)
            if step.released:
                raise RuntimeError(
                    f"Trying to backward through the graph a second time ({step.rule.__name__}Backward, inside a "
                    "compiled call): its saved tensors were freed after the first backward. Pass retain_graph=True "
                    "to the first backward().")
            if create_graph and (step.saved_outputs or step.saved_inputs or saves_torch_leaf(step.ctx, tracer)):
                out = self._with_saved_outputs_linked(step, gs)
            else:
                out = step.rule.backward(step.ctx, *gs)
            if type(out) is not tuple:
                out = (out,)
            if shown is not None and shown.post_hooks:  # grad_fn.register_hook: sees (and may replace) grad_inputs
                out = run_post_hooks(shown, out, gs, [target[:3] for target in step.targets])
            if not retain:  # freed at once, as the engine frees each node's: memory the next steps reuse
                _free(step)
            for position, shape, dtype, local, where in step.targets:  # edge_gradient, written out
                g = out[position] if type(position) is int else out[position[0]][position[1]]
                if g is None:
                    continue
                if g.shape != shape:
                    g = g.sum_to_size(shape)
                if g.dtype != dtype:
                    g = g.to(dtype)
                if local:
                    have = buffers.get(where)
                    buffers[where] = g if have is None else have + g
                else:  # sent one by one: they meet other nodes' gradients in eager's order
                    result[where].append(g)
        if not retain and all(step.released for step in self.steps):
            self._released = True  # what tools show of a node whose saved tensors are gone
        return tuple(map(contributions, result))

    def _run_generated(self, grads: tuple, retain: bool) -> Optional[tuple]:
        """The generated backward (segment_code.py), where it serves this call: no grad_fn hooks on a statement's
        node, no step freed by an earlier backward, every layout as traced (and, checked by the caller, no
        create_graph, no hook / retain_grad / capture on this node's values, every step needed). None: the steps are
        interpreted."""
        steps = self.steps
        if not steps or any(s.released for s in steps) or (self.shown and any(
                s.node is not None and (s.node.pre_hooks or s.node.post_hooks) for s in steps)):
            return None
        code = generated_backward(steps, self.outputs, len(self.node.edges))
        try:
            result, ran = code.function(steps, grads, None if retain or not code.frees_inline else _free)
        except LayoutDiffers:  # (raised before anything was freed: the code frees as it goes only without checks)
            return None
        if not retain:  # freed as the interpreter frees them
            if not code.frees_inline:
                for k in ran:
                    _free(steps[k])
            if len(ran) == len(steps) or all(step.released for step in steps):
                self._released = True
        return result

    def _order(self, seeded: Dict[int, torch.Tensor]) -> List[Step]:
        """The steps the seeded outputs reach, newest first: the engine's own order (it walks nodes newest first),
        so gradients meeting at a value are summed in eager's order, bit for bit."""
        producer = self.producer
        reached = {producer[v] for v in seeded}  # steps (hashed by identity)
        stack = list(reached)
        while stack:
            for value in stack.pop().local:
                step = producer[value]
                if step not in reached:
                    reached.add(step)
                    stack.append(step)
        return [step for step in reversed(self.steps) if step in reached]

    def _with_saved_outputs_linked(self, step: Step, gs: List[Any]) -> Any:
        """rule.backward with the results the step saved as tracers made by this node (output nr each), so that a
        second derivative flows back through them (as the engine re-links a node's saved outputs)."""
        saved = with_torch_leaves_linked(step.ctx._saved, tracer)
        for index, nr in step.saved_outputs:
            saved[index] = link_output(saved[index], self.node, nr, tracer)
        for index, ref, nr in step.saved_inputs:
            t = ref()
            saved[index] = t if t is not None else link_output(saved[index], self.node, nr, tracer)
        step.ctx.use_graph_saved(tuple(saved))
        try:
            return step.rule.backward(step.ctx, *gs)
        finally:
            step.ctx.use_graph_saved(None)

    def _hooks(self, step: Step, gs: List[Optional[torch.Tensor]], captured: Optional[dict],
               hand_out: Callable[[Any], None]) -> List[Optional[torch.Tensor]]:
        """The whole gradient of each value the step made goes through its hooks, retain_grad and tt.grad's capture
        (the engine leaves them to this node: what reaches the node from outside is only part of a value that its
        own statements read too)."""
        nr_of = self.nr_of
        return [g if g is None else output_hooks(self.node, nr_of[value], g, captured, hand_out)
                for value, g in zip(step.outputs, gs)]

    def _needed_steps(self, captured: Optional[dict], needed: Optional[set]) -> Tuple[Optional[set], Optional[set]]:
        """Under tt.grad (or backward(inputs=)), as the engine runs only the nodes that reach a captured input
        (engine._needed): the steps whose rule runs (a value of this node captured, or made by such a step, or an edge
        to a node the engine needs, lies below them), and the steps seen at all (those, and the makers of captured
        values: their hooks and the capture run). (None, None): every step runs."""
        if captured is None or needed is None:
            return None, None
        node, producer, edges = self.node, self.producer, self.node.edges
        wanted = {self.outputs[nr] for n, nr in captured if n is node}
        runs: set = set()  # (steps hash by identity)
        for step in self.steps:  # oldest first: a step reads only values made before it
            if any((where in wanted or producer.get(where) in runs) if local else edges[where].node in needed
                   for _, _, _, local, where in step.targets):
                runs.add(step)
        return runs, runs | {producer[value] for value in wanted}


def _free(step: Step) -> None:
    """A step's saved tensors, freed after its backward ran (unless retain_graph), as the engine frees a node's: a
    step that saved nothing (an add) can run again, as an eager node that saved nothing can."""
    ctx = step.ctx
    if ctx is None or (not ctx._saved and ctx._packed is None):
        return
    if step.shown() is not None:
        ctx.release()
    step.released, step.ctx = True, None


def output_meta(raw: torch.Tensor) -> tuple:
    with plain_torch():
        return raw.shape, raw.dtype, raw.device


def _data_written(t: torch.Tensor) -> None:
    """A `.data` write on a tracer: followed by the segment that made it, if one did."""
    node = getattr(t, "_tt_node", None)
    if node is not None and node.rule is CompiledCall:
        node.ctx.follow_data(t)


DATA_WRITES.append(_data_written)
