"""Checked replay: the user's Python runs as written; each torch call that records a gradient is checked.

`ReplayMode` (a TorchFunctionMode) sees every torch call of one compiled call. A call that records no gradient
(grad mode off, or no argument requiring one) simply runs. A call that records one is matched against the
program's next statement (`Run.replay`): the same callable, the same structural arguments, each tensor argument
from the same place — value j, or leaf slot L bound to this call's object (one object per slot, one slot per
object) with its shape and dtype — and the same requires_grad. A match runs the rule's forward on plain tensors
into a Context of its own, and its results become outputs of the call's one node (segment.py). The first call
that does not match ends replay for this call: the node is closed as it is, and the call goes on eagerly
(`Run.record`), each call recorded as a statement of a new branch of the program's trie. Nothing runs twice.
"""
import linecache
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from torchtrace.autograd.arguments import to_positions
from torchtrace.autograd.dispatch import _fresh, _grad_edges, _link_outputs, _rebuild
from torchtrace.autograd.function import INPLACE, INPLACE_FLAG, RULES, Function
from torchtrace.autograd.inplace import inplace_requested, mark_piece, remember_base
from torchtrace.autograd.node import Context, Edge, Node, _top_hooks, link_output, saved_tensor_hooks
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import STATE, observing
from torchtrace.compiler.ir import EAGER, NUMBER, PASS, REPLAY, TENSOR, Block, Program, Statement, describe, same_func
from torchtrace.compiler.segment import Segment, Step, output_meta
from torchtrace.compiler.statement_replay import statement_replay
from torchtrace.compiler.step_code import StepCode, step_code
from torchtrace.compiler.tracing.judge import call_values
from torchtrace.lanes.operators import MODES_CALLED_DIRECTLY
from torchtrace.tracer import tracer

_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled
_any_autocast = torch._C._is_any_autocast_enabled
_disabled = torch._C._disabled_torch_function_impl
_new_edge = tuple.__new__
T = torch.Tensor
# metadata reads answered without entering the tracer's dispatch
METADATA = {getattr(T, name).__get__ for name in (
    "shape", "dtype", "device", "ndim", "is_cuda", "layout", "_version", "is_sparse", "is_quantized", "is_meta",
    "is_nested")} | {T.size, T.dim, T.stride, T.numel, T.is_contiguous, T.is_floating_point,
                              T.is_complex, T.storage_offset, T.element_size, T.__len__, T.nelement, T.ndimension,
                              T.data_ptr, T._is_view}
# autograd attributes user code and torch.nn read (`if h.requires_grad:`, `p.grad is None`): they never record
AUTOGRAD_READS = {getattr(T, name).__get__ for name in ("requires_grad", "grad_fn", "is_leaf", "grad", "_base")}
_PACKAGE_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))


def user_line() -> str:
    """'file.py:12  h = x @ w': the innermost frame outside torch and torchtrace."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIRS):
        frame = frame.f_back
    if frame is None:
        return ""
    text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).split("  #")[0].strip()
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}" + (f"  {text}" if text else "")


def _requires_grad(t: torch.Tensor) -> bool:
    flag = getattr(t, "_tt_requires_grad", None)
    return t.requires_grad if flag is None else flag


def _wants_gradient(args: tuple, kwargs: dict) -> bool:
    for a in args:
        if isinstance(a, torch.Tensor):
            if _requires_grad(a):
                return True
        elif isinstance(a, (list, tuple)) and any(isinstance(e, torch.Tensor) and _requires_grad(e) for e in a):
            return True
    return bool(kwargs) and _wants_gradient(tuple(kwargs.values()), {})


def _may_record(func: Callable, args: tuple, kwargs: dict) -> bool:
    """Can this call record a node: a rule's callable, an in-place form, or a Function's apply?"""
    if func in RULES or func in INPLACE:
        return True
    owner = getattr(func, "__self__", None)
    return (isinstance(owner, type) and issubclass(owner, (Function, torch._C._FunctionBase))) or is_inplace(
        func, args, kwargs)


def is_inplace(func: Callable, args: tuple, kwargs: dict) -> bool:
    if func in INPLACE or func is T.__setitem__:
        return True
    if func in INPLACE_FLAG and inplace_requested(INPLACE_FLAG[func], args, kwargs):
        return True
    name = getattr(func, "__name__", "")
    return (name.endswith("_") and not name.endswith("__")) or (name.startswith("__i") and name.endswith("__"))


def _normalise(func: Callable, args: tuple, kwargs: dict) -> Tuple[Optional[type], tuple, dict]:
    rule = RULES.get(func)
    if kwargs and rule is not None:
        args, kwargs = to_positions(func, rule, args, kwargs)
    return rule, args, kwargs


def _positional(func: Callable, rule: type, args: tuple, kwargs: dict) -> Optional[tuple]:
    """A rule's call with keywords, as the positional call it records as (F.mse_loss(x, t, reduction="mean")); None
    where a keyword stays one."""
    try:
        with plain_torch():
            args, kwargs = to_positions(func, rule, args, kwargs)
    except Exception:  # keywords it cannot place: the general path says what is wrong, as eager does
        return None
    return None if kwargs else args


def _tensor_results(out: Any) -> List[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [o for o in out if isinstance(o, torch.Tensor)]
    return []


MISS = object()  # a statement's generated replay: the call does not fit it (nothing has run)
_NO_SIBLINGS: list = []


def _shifted(position: Any, hidden: int) -> Any:
    """An edge's position among the call's own arguments, past `hidden` leading ones its rule was given."""
    return position - hidden if type(position) is int else (position[0] - hidden, position[1])


def _argument_at(args: tuple, kwargs: dict, rule: type, position: Any) -> torch.Tensor:
    """The tensor an edge's position names (i, or (i, j) for item j of a list argument)."""
    index, item = (position, None) if type(position) is int else position
    if index < len(args):
        value = args[index]
    else:
        value = next(v for k, v in kwargs.items() if rule.param_index(k) == index)
    return value if item is None else value[item]


class Run:
    """One call of a compiled function: where it is in the trie, what its values and leaf slots are bound to."""

    def __init__(self, program: Program, names: Callable[[], Dict[int, str]]):
        self.program = program
        self.block: Block = program.root
        self.at = 0
        self.replaying = bool(program.root.statements or program.root.children or program.root.eager_after)
        self.eager_from = ""  # the user's line from where this call runs eagerly, unrecorded (see go_eager)
        self.values: Dict[int, int] = {}  # id(tensor object) -> value number
        self.keep: List[Any] = []  # every object numbered stays alive, so no id is reused during the call
        self.slot_of: Dict[int, int] = {}  # id(tensor object) -> leaf slot
        self.slots: List[torch.Tensor] = []  # leaf slot -> this call's object
        self.n_values = 0
        self._segment: Optional[Segment] = None
        self.recorded: List[Statement] = []  # after a divergence: the statements of the new branch
        self.branch_at: Tuple[Block, int] = (program.root, 0)
        self.nodes: Optional[List[Node]] = None  # the nodes the eager call running now records
        self._names = names  # () -> {id(tensor or module): a name}, built when a call is first recorded
        self._named: Optional[Dict[int, str]] = None
        self.path: List[Statement] = []  # the statements this call matched or recorded, in order
        self.siblings: List[Tuple[Block, Statement]] = []  # other statements for the call matched last
        self.before: Tuple[Block, int] = (program.root, 0)

    @property
    def segment(self) -> Optional[Segment]:
        """The open segment: the node matched statements join. Replacing it (by None when the call leaves it)
        hands the one before its node to hold weakly (Segment.leave)."""
        return self._segment

    @segment.setter
    def segment(self, segment: Optional[Segment]) -> None:
        if self._segment is not None and self._segment is not segment:
            self._segment.leave()
        self._segment = segment

    @property
    def names(self) -> Dict[int, str]:
        if self._named is None:
            self._named = self._names()
        return self._named

    # observer of the eager engine --------------------------------------------------------------------------
    def on_record(self, node: Node, args: tuple, kwargs: dict, result: Any) -> None:
        self.nodes.append(node)

    # replay --------------------------------------------------------------------------------------------------
    def replay(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        """Run the call as the program's next statement; None when it does not match (nothing has run then)."""
        with plain_torch():
            rule, args_, kwargs_ = _normalise(func, args, kwargs)
            st = self._match(func, args_, kwargs_, _any_autocast())
            if st is None:
                return None
            if st.kind != EAGER:
                return (self._rule(st, func, rule, args_, kwargs_),)
        return (self._eager(st, func, args, kwargs),)  # through the tracer's dispatch: outside plain_torch

    def _fits(self, st: Statement, checks: tuple, args: tuple) -> bool:
        """Does each argument fit its check — a tensor from where the statement's came (value j, or leaf slot L: one
        object per slot, one slot per object, new slots bound and unbound on a mismatch), needing a gradient as it
        did; a float; a simple value equal to the recorded one?"""
        values, slot_of, slots = self.values, self.slot_of, self.slots
        bound = 0
        for a, (entry, source, needs) in zip(args, checks):
            if entry is TENSOR:
                if isinstance(a, tracer):  # and not changed in place since it was made (eager's version check; a
                    # view whose base changed is caught up by an EAGER statement's dispatch, as when it was recorded)
                    ok = a._tt_requires_grad == needs and (a._tt_node is None or a._version == a._tt_version or (
                        st.kind == EAGER and a._tt_view))
                else:
                    ok = isinstance(a, T) and a.requires_grad == needs
                if not ok:
                    pass
                elif source >= 0:
                    ok = values.get(id(a)) == source
                else:
                    have = slot_of.get(id(a))
                    if have is None:  # a leaf slot read for the first time in this call
                        slot = ~source
                        shape, dtype, device = st.new_slots.get(slot, (None, None, None))
                        ok = slot == len(slots) and id(a) not in values and a.shape == shape and a.dtype == dtype \
                            and a.device == device
                        if ok:
                            slot_of[id(a)] = slot
                            slots.append(a)
                            bound += 1
                    else:
                        ok = have == ~source
            elif entry is NUMBER:
                ok = type(a) is float
            else:
                ok = type(a) is entry[0] and a == entry[1]
            if not ok:
                for _ in range(bound):
                    del slot_of[id(slots.pop())]
                return False
        return True

    @staticmethod
    def _plan(st: Statement, segment: Segment, args: tuple, kwargs: dict, rule: type) -> tuple:
        """(targets, local, opened, first value): where the gradients of st's edges go — (position, shape, dtype,
        True, value) for a value of this segment, (..., False, edge) for the segment node's edge to an outside
        tensor, opened where the segment first reads it. Values are numbered and edges opened in the order of the
        path, so a call that reaches st along the trie in a segment begun at the same value gets the plan of the
        first call: it is kept on the statement, and only its opened edges are made again for this call. (A segment
        begins after an eager statement, or after a backward through the one before: not a fact of the trie.)"""
        plan = st.plan
        if plan is not None and plan[3] == segment.first_value:
            for source, position, where in plan[2]:
                if segment.edge_to(source, _argument_at(args, kwargs, rule, position)) != where:
                    plan = None  # cannot happen on a path of the trie; a plan of its own for this call
                    break
            if plan is not None:
                return plan
        targets, local, opened = [], [], []
        nr_of, outside = segment.nr_of, segment.outside
        for edge, source in st.edges:
            if source in nr_of:  # a value this segment made (leaf slots, negative, never are)
                targets.append((edge.position, edge.shape, edge.dtype, True, source))
                local.append(source)
            else:  # the source number (value j, or ~slot) names the outside tensor
                where = outside.get(source)
                if where is None:
                    where = segment.edge_to(source, _argument_at(args, kwargs, rule, edge.position))
                    opened.append((source, edge.position, where))
                targets.append((edge.position, edge.shape, edge.dtype, False, where))
        if st.plan is None:
            st.plan = targets, local, opened, segment.first_value
            if st.checks is not None and st.kind == REPLAY and not st.torch_leaf and st.rule is not None and all(
                    type(position) is int for _, position, _ in opened):
                st.replay = statement_replay(st, MISS)  # the common call's, from now
        return targets, local, opened, segment.first_value

    def _matched(self, block: Block, at: int, st: Statement) -> None:
        self.before = (block, at)  # where a call that ran but then did not fit leaves the trie
        self.at = at + 1
        self.siblings = []
        self.path.append(st)

    def _match(self, func: Callable, args: tuple, kwargs: dict, eager_only: bool = False) -> Optional[Statement]:
        """The statement the call is, now bound (None: no statement fits). Under autocast (`eager_only`) only an
        EAGER statement fits: the eager engine runs it in the autocast state of the call, and its node's backward
        casts as its forward did (a rule's forward run on plain tensors would be cast without its backward)."""
        block, at = self.block, self.at
        if at < len(block.statements):  # the common case: one statement to match, no siblings
            st = block.statements[at]
            if not same_func(st.func, func) or (st.kind == REPLAY and RULES.get(func) is not st.rule) or (
                    eager_only and st.kind != EAGER):
                return None  # another callable, a rule registered for it since, or a rule's forward under autocast
            if not kwargs and st.checks is not None:  # its key is st.key exactly when each argument fits its entry
                if len(args) != len(st.checks) or not self._fits(st, st.checks, args):
                    return None
            else:
                key, tensors = describe(args, kwargs)
                if st.key != key or not self._bind(st, tensors):
                    return None
            self._matched(block, at, st)
            return st
        key, tensors = describe(args, kwargs)
        options = [(child, child.statements[0]) for child in block.children]
        for owner, st in options:
            if st.same_call(func, key) and (st.kind != REPLAY or RULES.get(func) is st.rule) \
                    and (not eager_only or st.kind == EAGER) and self._bind(st, tensors):
                self.before = (block, at)
                self.block, self.at = owner, 1
                self.siblings = [(o, s) for o, s in options if s is not st and s.same_call(func, key)
                                 and s.sources == st.sources and s.needs == st.needs]
                self.path.append(st)
                return st
        return None

    def _refit(self, st: Statement, out: Any, raw: List[torch.Tensor], first: Any) -> Optional[Statement]:
        """The call ran as `st` but its results fit a sibling statement (the same call that once handed back its
        input, or once made a new tensor): go on as that one."""
        for owner, other in self.siblings:
            fits = (other.kind == PASS and out is first) or (other.kind == REPLAY and out is not first and len(
                raw) == len(other.results) and all((r.shape, r.dtype) == m for r, m in zip(raw, other.results)))
            if fits:
                self.block, self.at = owner, (self.at if owner is self.block else 1)
                self.path[-1] = other
                return other
        return None

    def _bind(self, st: Statement, tensors: Any) -> bool:
        """Do the tensors of a described call come from where the statement's did (see `_fits`)?"""
        return self._fits(st, tuple((TENSOR, source, needs) for source, needs in zip(st.sources, st.needs)), tensors)

    def _rule(self, st: Statement, func: Callable, rule: type, args: tuple, kwargs: dict) -> Any:
        """A REPLAY or PASS statement: the rule's forward into a Context of its own, results on the segment."""
        ctx = Context(rule, (), st.mask)
        if st.torch_leaf:
            _set_grad_enabled(False)
            try:
                out = rule.forward(ctx, *args, **kwargs)
            finally:
                _set_grad_enabled(True)
        else:
            out = rule.forward(ctx, *args, **kwargs)
        return self._link(st, func, rule, ctx, args, kwargs, out)

    def relink(self, st: Statement, ctx: Context, args: tuple, out: Any) -> Any:
        """A statement's generated replay ran its forward, and the result is not the common case (a view, one of the
        arguments, another shape): the general linking, as from a call `_match` matched to it."""
        self.before, self.siblings = (self.block, self.at - 1), _NO_SIBLINGS
        return self._link(st, st.func, st.rule, ctx, args, {}, out)

    def _link(self, st: Statement, func: Callable, rule: type, ctx: Context, args: tuple, kwargs: dict,
              out: Any) -> Any:
        """The results of a statement's forward become outputs of the segment's node (when they fit the statement)."""
        first = args[0] if args else None
        if out is first and st.kind == PASS:
            return out
        if type(out) is T:  # one plain result: the common case
            raw = [out]
            differs = len(st.results) != 1 or (out.shape, out.dtype) != st.results[0]
        else:
            raw = _tensor_results(out)
            differs = len(raw) != len(st.results) or any(
                (r.shape, r.dtype) != meta for r, meta in zip(raw, st.results))
        if differs or out is first or st.kind == PASS:
            other = self._refit(st, out, raw, first)
            if other is None:
                return self._diverge_after(st, func, rule, ctx, args, kwargs, out)
            if other.kind == PASS:
                return out
            st = other
        segment = self.segment
        if segment is None or segment.sealed:
            segment = self.segment = Segment(self.n_values)
        values = []
        linked = []
        saved = ctx._saved
        kept = []  # (saved index, output nr) of each result the rule saved
        for k, r in enumerate(raw):
            value = self.n_values
            self.n_values += 1
            # a result no argument is and the rule did not save becomes the tracer itself (its class changes);
            # a saved one stays plain in the Context, with a tracer alias (as a tracer it would hold the node)
            fresh = _fresh(r, args) and (not saved or id(r) not in map(id, saved)) and (
                len(raw) == 1 or sum(x is r for x in raw) == 1)
            nr = segment.add_output(value)
            kept += [(i, nr) for i, s in enumerate(saved) if s is r]
            t = link_output(r, segment.node, nr, tracer, fresh)
            if t._tt_view:
                remember_base(t, args)
                mark_piece(t, rule, k, args)  # (a piece of split or chunk: no in-place change, as eager)
            self.values[id(t)] = value
            self.keep.append(t)
            values.append(value)
            linked.append(t)
        targets, local, _, _ = self._plan(st, segment, args, kwargs, rule)
        floats = tuple(call_values(args, kwargs)[1]) if st.numbers else ()
        segment.add_step(Step(rule, ctx, values, [output_meta(r) for r in raw] if len(raw) > 1 else None,
                              targets, local, tuple(kept), st, floats))
        return linked[0] if isinstance(out, torch.Tensor) else _rebuild(out, _relinked(out, raw, linked))

    def _diverge_after(self, st: Statement, func: Callable, rule: type, ctx: Context, args: tuple, kwargs: dict,
                       out: Any) -> Any:
        """The statement ran, but its results differ from the program's (a shape that follows from values): they
        become an eager node built from what it computed, and the call goes on eagerly from here."""
        self.block, self.at = self.before
        self._diverge()
        self.path.pop()
        result_edges: list = []
        if out is args[0]:
            result = out
        else:
            edges, _, _ = _grad_edges(tracer, rule, args, kwargs)
            result_edges = edges
            ctx._edges = edges
            node = Node(rule, ctx, edges, func, tuple(STATE.module_stack))
            result = _link_outputs(out, node, tracer, args)
        again = Statement(func, REPLAY if out is not args[0] else PASS, st.key, st.sources, st.needs)
        again.rule, again.mask, again.torch_leaf, again.new_slots = st.rule, st.mask, st.torch_leaf, st.new_slots
        if out is not args[0]:  # its edges, from the node just built (a PASS statement has none)
            _, tensors = describe(args, kwargs)
            by_id = {id(t): source for t, source in zip(tensors, st.sources)}
            again.edges = tuple((_new_edge(Edge, (e.position, None, 0, e.shape, e.dtype)),
                                 by_id[id(_argument_at(args, kwargs, rule, e.position))]) for e in result_edges)
        again.module, again.line, again.slot_names = st.module, st.line, st.slot_names
        self._finish_statement(again, result, args, kwargs)
        return result

    def _eager(self, st: Statement, func: Callable, args: tuple, kwargs: dict) -> Any:
        """An EAGER statement: the eager engine runs it (after the segment so far is closed)."""
        self.segment = None
        out = func(*args, **kwargs)
        results = _tensor_results(out)
        with plain_torch():
            same = len(results) == len(st.results) and all(
                (r.shape, r.dtype) == meta for r, meta in zip(results, st.results))
        if not same:
            self.block, self.at = self.before
            self._diverge()
            self.path.pop()
            again = Statement(func, EAGER, st.key, st.sources, st.needs)
            again.new_slots, again.module, again.line, again.slot_names = (
                st.new_slots, st.module, st.line, st.slot_names)
            self._finish_statement(again, out, args, kwargs)
            return out
        for r in results:
            self._number(r)
        return out

    # eagerly, from a point on -------------------------------------------------------------------------------
    def at_eager_mark(self) -> bool:
        """Has the call reached the end of a block after which recorded calls went on eagerly?"""
        return self.replaying and self.block.eager_after and self.at == len(self.block.statements)

    def go_eager(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        """Run the call eagerly, and the rest of this call too, without recording it: something watches every op
        the eager engine records (torch.utils.checkpoint learns the parameters its block reads that way) and
        would miss the ones replay runs. The segment so far is closed, so that a node made from here (the
        checkpoint's) reads its values as any later node would."""
        if not self.eager_from:
            self.eager_from = user_line() or getattr(func, "__name__", repr(func))
            self.segment = None
        return func(*args, **kwargs)

    # recording -------------------------------------------------------------------------------------------------
    def _diverge(self) -> None:
        if self.replaying:
            self.replaying = False
            self.branch_at = (self.block, self.at)
        self.segment = None

    def record(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        """Run the call eagerly and write it down as the next statement of the new branch."""
        self._diverge()
        with plain_torch():
            rule, pargs, pkwargs = _normalise(func, args, kwargs)
            key, tensors = describe(pargs, pkwargs)
            sources, needs, new_slots, names = [], [], {}, {}
            for t in tensors:
                needs.append(_requires_grad(t))
                value = self.values.get(id(t))
                if value is not None:
                    sources.append(value)
                    continue
                slot = self.slot_of.get(id(t))
                if slot is None:
                    slot = self.slot_of[id(t)] = len(self.slots)
                    self.slots.append(t)
                    new_slots[slot] = (t.shape, t.dtype, t.device)
                    names[slot] = self._leaf_name(t)
                sources.append(~slot)
        self.nodes = []
        try:
            with observing(on_record=self.on_record):  # the nodes the eager engine records for this call
                out = func(*args, **kwargs)
        finally:
            nodes, self.nodes = self.nodes, None
        if rule is None and len(nodes) == 1:  # Function.apply, an in-place twin: rendered as that one rule
            rule = nodes[0].rule
        inplace = is_inplace(func, pargs, pkwargs)
        first = pargs[0] if pargs else None
        if RULES.get(func) is not None and not inplace and len(nodes) == 1 and same_func(nodes[0].func, func) and \
                nodes[0].autocast is None and rule._tt_trusted:
            kind = REPLAY  # (a user's own rule runs eagerly: the engine hands what its backward sees to user code)
        elif RULES.get(func) is not None and not inplace and not nodes and out is first:
            kind = PASS
        else:
            kind = EAGER
        st = Statement(func, kind, key, tuple(sources), tuple(needs))
        st.new_slots, st.slot_names = new_slots, names
        st.line = user_line()
        stack = STATE.module_stack
        st.module = self._module_name(stack[-1]) if stack else ""
        if kind == PASS:  # which arguments need a gradient, should a later call's forward give a new tensor
            with plain_torch():
                st.mask = _grad_edges(tracer, rule, pargs, pkwargs)[2]
        if kind == REPLAY or (kind == EAGER and len(nodes) == 1):
            node = nodes[0]
            st.rule, st.mask = rule, node.ctx._mask or 0
            st.torch_leaf = any(type(t) is torch.Tensor and t.requires_grad for t in tensors)
            by_id = {id(t): source for t, source in zip(tensors, sources)}
            hidden = getattr(rule, "hidden_arguments", 0)  # a user autograd Function's: its call, before its arguments
            st.edges = () if hidden and pkwargs else tuple((_new_edge(Edge, (e.position, None, 0, e.shape, e.dtype)),
                                                             by_id[id(_argument_at(pargs, pkwargs, rule, _shifted(
                                                                 e.position, hidden)))]) for e in node.edges)
        self._finish_statement(st, out, pargs, pkwargs)
        return out

    def _finish_statement(self, st: Statement, out: Any, args: tuple, kwargs: dict) -> None:
        st.first_value = self.n_values
        results = [] if st.kind == PASS else _tensor_results(out)
        with plain_torch():
            st.results = tuple((r.shape, r.dtype) for r in results)
            st.example = (tuple(_plain_copy(a) for a in args), {k: _plain_copy(v) for k, v in kwargs.items()},
                          [_plain_copy(r) for r in results])
        if st.kind == REPLAY:  # its backward as lines of the generated backward, if its rule traces clean
            st.code = step_code(st.rule, st.key, st.mask, *st.example[:2])
            one_floating = len(st.results) == 1 and st.results[0][1].is_floating_point
            st.traced_forward = st.code.forward if isinstance(st.code, StepCode) and st.checks is not None \
                and one_floating else None
        for r in results:
            self._number(r)
        self.recorded.append(st)
        self.path.append(st)

    def _number(self, t: torch.Tensor) -> None:
        self.values[id(t)] = self.n_values
        self.n_values += 1
        self.keep.append(t)

    def _leaf_name(self, t: torch.Tensor) -> Tuple[str, str]:
        """(name, kind) of a new leaf: an argument ("input"), a parameter or buffer of the running model, or a
        closure cell or global of the function ("param"; "" when it has no name)."""
        found = self.names.get(id(t))
        if found is None and STATE.module_stack:  # a model the function calls: its parameters by dotted name,
            root = STATE.module_stack[0]  # prefixed by the model's Python name where another model took the name
            owner = self.names.get(id(root))
            prefix = f"{owner[0] if isinstance(owner, tuple) else type(root).__name__}."
            taken = {v if isinstance(v, str) else v[0] for v in self.names.values()}
            for name, module in root.named_modules():
                if name:
                    self.names.setdefault(id(module), name)
            for name, p in (*root.named_buffers(), *root.named_parameters()):
                self.names.setdefault(id(p), name if name not in taken else prefix + name)
            found = self.names.get(id(t))
        if found is None:
            return "", "param"
        return found if isinstance(found, tuple) else (found, "param")

    def _module_name(self, module: Any) -> str:
        """'fc1: Linear' (its path in the compiled module), or 'Linear' for a module of unknown place."""
        path = self.names.get(id(module))
        return f"{path}: {type(module).__name__}" if isinstance(path, str) and path else type(module).__name__

    def finish(self, returned: Any, trie_full: Callable[[], bool]) -> Optional[bool]:
        """The call returned: a new branch joins the trie, unless the trie is full (None then). True if one was added,
        False if the call ended where a recorded one did."""
        self.segment = None
        self.outputs = [self.values[id(t)] for t in tensors_in(returned) if id(t) in self.values]
        block, at = self.branch_at if not self.replaying else (self.block, self.at)
        if self.eager_from:  # it went on eagerly from (block, at): later calls reaching it do so at once
            if self.replaying and at == len(block.statements) and block.eager_after:
                return False
            if trie_full():
                return None
            self.program.attach(block, at, [] if self.replaying else self.recorded, [], eager_after=True)
            return True
        if self.replaying and at == len(block.statements) and (block.ended or not block.children):
            block.ended, block.outputs = True, block.outputs or self.outputs
            return False
        if trie_full():
            return None
        self.program.attach(block, at, [] if self.replaying else self.recorded, self.outputs)
        return True


def tensors_in(value: Any) -> List[torch.Tensor]:
    """The tensors of a returned value: in tuples, lists, dicts and objects' attributes."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def _plain_copy(value: Any) -> Any:
    """A plain, detached alias of a tensor (lists of tensors too): what rendering reruns the rules on."""
    if isinstance(value, torch.Tensor):
        return T.detach(value).as_subclass(torch.Tensor)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_plain_copy(v) for v in value) if not hasattr(value, "_fields") else value
    return value


def _relinked(out: Any, raw: List[torch.Tensor], linked: List[torch.Tensor]) -> list:
    swap = {id(r): t for r, t in zip(raw, linked)}
    return [swap.get(id(o), o) for o in out]


class ReplayMode(TorchFunctionMode):
    """Every torch call of one compiled call comes here first (a user autograd Function's apply on tracers too)."""

    sees_function_apply = True
    idle_without_grad = True  # a call with grad mode off runs as without it: a region that records nothing may take
    # it off the stack (plain.modes_aside: a backward, an optimizer's update)

    def __init__(self, run: Run):
        super().__init__()
        self.run = run

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        if not _grad_enabled():  # records nothing (no_grad, an optimizer's update, a backward's rules): it simply runs
            return func(*args, **(kwargs or {}))
        run = self.run
        if run.eager_from or STATE.on_record or (_top_hooks(False) is not None and saved_tensor_hooks() is not None):
            return run.go_eager(func, args, kwargs or {})  # watched op by op (a checkpoint's discovery run), or
            # saved_tensors_hooks entered inside the function (each op's saves pass through them): eagerly from here
        # the common call: the program's next statement is a REPLAY of func, called with positional arguments of one
        # key entry each (keywords moved to their positions, as the statement's were); its generated replay checks
        # them and runs it
        if run.replaying:
            try:
                st = run.block.statements[run.at]
            except IndexError:  # the end of a block: a branch to choose (the general path)
                st = None
            if st is not None and st.replay is not None and (st.func is func or same_func(st.func, func)) \
                    and not _any_autocast() and RULES.get(func) is st.rule:
                positional = args if not kwargs else _positional(func, st.rule, args, kwargs)
                if positional is not None:
                    with plain_torch():  # its checks read the tracers' attributes, its forward runs on them plain
                        found = st.replay(run, st, positional)
                    if found is not MISS:
                        return found
        if func in METADATA:  # (never a statement: read as torch.nn's modules read them on every call)
            return _disabled(func, types, args, kwargs or {})
        if func in AUTOGRAD_READS:  # answered as eager answers them: a tracer's own, a plain tensor's torch's
            return func(*args, **(kwargs or {}))
        kwargs = kwargs or {}
        if not _may_record(func, args, kwargs) or not _wants_gradient(args, kwargs):
            return func(*args, **kwargs)  # records nothing (x > 0, .item()): it simply runs
        if run.replaying:
            found = run.replay(func, args, kwargs)
            if found is not None:
                return found[0]
        if run.at_eager_mark():
            return run.go_eager(func, args, kwargs)
        return run.record(func, args, kwargs)


MODES_CALLED_DIRECTLY.add(ReplayMode)  # a tracer's operators hand it their calls without torch's C entry
