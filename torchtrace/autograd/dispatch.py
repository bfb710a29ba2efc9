"""Every torch call on a tracer lands here: look up the rule, run forward on plain tensors, link a Node."""
from typing import Any, Callable, List, Optional, Tuple

import torch

from torchtrace.autograd.arguments import to_positions, wants_gradient
from torchtrace.autograd.autocast import autocast_inputs
from torchtrace.autograd.function import INPLACE, INPLACE_FLAG, RULES, Function
from torchtrace.autograd.function_contract import returned_outputs
from torchtrace.autograd.inplace import (
    RESHAPING,
    UNRECORDED_PIECE,
    catch_up,
    inplace_requested,
    mark_piece,
    overlapping,
    record_inplace,
    record_inplace_flag,
    refuse_no_grad_view,
    remember_base,
    write_into_part,
)
from torchtrace.autograd.kept_values import kept_output
from torchtrace.autograd.node import AccumulateGrad, Context, Edge, Node, keep_values, leaf_accumulator, link_output
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import STATE
from torchtrace.errors import UnsupportedOperationError
from torchtrace.naming import callable_name

_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled
_any_autocast = torch._C._is_any_autocast_enabled
_plain_call = torch._C._disabled_torch_function_impl  # (func, types, args, kwargs dict): func(*args) on plain tensors
_new_edge = tuple.__new__  # Edge(...) without NamedTuple's Python-level __new__: this runs for every input
_containers = (list, tuple)


def recording() -> bool:
    """Are torch calls on tracers recorded now? Grad mode on, outside torch.inference_mode (torch records nothing
    there even under enable_grad, and the tensors it makes have no version counter)."""
    return _grad_enabled() and not torch.is_inference_mode_enabled()


NON_DIFFERENTIABLE: set = set()  # callables whose floating outputs never carry a gradient
_T = torch.Tensor
# What a tensor is, never what it computes: read at once, without recording (layers and user code read these often).
DATA_WRITES: List[Callable[[Any], None]] = []  # fn(t) after `t.data = v` (a compiled call's saves of t follow it)
METADATA = {_T.shape.__get__, _T.dtype.__get__, _T.device.__get__, _T.ndim.__get__, _T.layout.__get__,
            _T.is_cuda.__get__, _T.is_sparse.__get__, _T.size, _T.dim, _T.ndimension, _T.numel, _T.nelement,
            _T.stride, _T.storage_offset, _T.is_contiguous, _T.element_size, _T.is_floating_point, _T.is_complex,
            _T.get_device, _T.data_ptr, _T.__len__, _T._version.__get__, _T.untyped_storage}


def torch_function(cls: type, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
    """tracer.__torch_function__: the one entry point of every intercepted torch call."""
    rule = RULES.get(func)
    if rule is not None:
        return run_rule(cls._tt_type, rule, func, args, kwargs or {})
    if func in METADATA:
        return _plain_call(func, types, args, kwargs or {})
    return _run_without_rule(cls._tt_type, func, args, kwargs or {})


def run_rule(tracer_type: type, rule: type, func: Optional[Callable], args: tuple, kwargs: dict) -> Any:
    """Run `rule` (forward of func); record a Node when some argument requires a gradient."""
    call = args, kwargs  # as the caller wrote it: what torch itself is called with when nothing is recorded
    if kwargs:  # tensors passed by keyword move to their positions (arguments.py); a known call's plan is applied here
        args, kwargs = to_positions(func, rule, args, kwargs)
    if func in INPLACE_FLAG and inplace_requested(INPLACE_FLAG[func], args, kwargs):
        return record_inplace_flag(tracer_type, rule, func, *call, run_rule)
    with plain_torch():
        edges, torch_leaf, needs = _grad_edges(tracer_type, rule, args, kwargs) if recording() else ((), 0, 0)
        if kwargs and kwargs.get("out") is not None and (edges or recording() and wants_gradient(kwargs["out"])):
            raise UnsupportedOperationError(  # (an out= that requires grad would lose its graph: its data is replaced)
                f"{callable_name(func) if func else rule.__name__ + '.apply'}: out= cannot be recorded (no gradient "
                "can flow into a preallocated output) — assign the result instead, or run the call under tt.no_grad()")
        if not edges:
            out = func(*call[0], **call[1]) if func is not None and not rule.forward_when_not_recording else \
                rule.forward(Context(rule), *args, **kwargs)
            result = _as_tracers(out, tracer_type, args)
            for t in result if rule.several_views and _grad_enabled() else ():  # (mark_piece)
                t._tt_piece = UNRECORDED_PIECE
            return result
        node = Node(rule, Context(rule, edges, needs), edges, func, STATE.module_stack)
        if func is None:  # Function.apply: backward must return one gradient per argument, as torch checks, and
            n = node.ctx._n_inputs = len(args) + len(kwargs)  # a user's forward reads one flag per argument
            if not rule._tt_trusted:
                node.ctx.needs_input_grad = node.ctx.needs_input_grad[:n]
        inputs, options = args, kwargs
        if _any_autocast():  # the inputs torch.autocast casts for this op, cast (autocast.py)
            inputs, options, node.autocast = autocast_inputs(func, args, kwargs)
        grad_off = torch_leaf or not rule._tt_trusted  # torch's autograd must not record the plain tensors that
        if grad_off:  # require grad; a user's forward runs with grad mode off, as torch runs Function.forward
            _set_grad_enabled(False)
        try:
            out = rule.forward(node.ctx, *inputs, **options)
            if func is not None and args and out is args[0] and isinstance(out, tracer_type):
                return out  # torch hands back the input itself (x.contiguous() of a contiguous x): no new node
            result = _link_outputs(out, node, tracer_type, args)
            if not rule._tt_trusted:
                _mark_custom_views(out, result, node, args)
        finally:
            if grad_off:
                _set_grad_enabled(True)
    for observe in STATE.on_record:
        observe(node, args, kwargs, result)
    return result


def _grad_edges(tracer_type: type, rule: type, args: tuple, kwargs: dict) -> Tuple[List[Edge], bool, int]:
    """An Edge for every argument that requires a gradient (items of list arguments too), whether one of them is
    a plain torch.Tensor with torch's requires_grad=True (a leaf torchtrace fills), and the bit mask of the
    arguments that need a gradient (the rule's ctx.needs_input_grad)."""
    edges: List[Edge]
    edges, torch_leaf, needs = [], False, 0
    limit = rule._tt_inputs  # (None: every argument, and no copy of args made)
    pairs = enumerate(args if limit is None else args[:limit]) if not kwargs else [
        *enumerate(args[:limit]), *((rule.param_index(k), v) for k, v in kwargs.items() if k != "out"
                                    and wants_gradient(v) and (limit is None or rule.param_index(k) < limit))]
    for position, arg in pairs:
        if isinstance(arg, tracer_type) and not arg._tt_view:  # _edge(position, arg) written out: the hottest loop
            if arg._tt_requires_grad:
                node = arg._tt_node
                if node is None:  # a leaf: its AccumulateGrad, while the graph keeps it, else a new one
                    acc = arg._tt_acc
                    node = acc() if acc is not None else None
                    if node is None:
                        node = AccumulateGrad(arg)
                edges.append(_new_edge(Edge, (position, node, arg._tt_nr, arg.shape, arg.dtype)))
                needs |= 1 << position
        elif isinstance(arg, tracer_type) or (isinstance(arg, torch.Tensor) and arg.requires_grad) or (
                isinstance(arg, _containers)):
            items = [((position, j), item) for j, item in enumerate(arg)] if isinstance(arg, _containers) else [
                (position, arg)]
            for where, item in items:
                edge = _edge(where, item, tracer_type)
                if edge is not None:
                    edges.append(edge)
                    needs |= 1 << position
                    torch_leaf = torch_leaf or not isinstance(item, tracer_type)
    return edges, torch_leaf, needs


def _edge(position: Any, t: Any, tracer_type: type) -> Optional[Edge]:
    """The edge to the node that produced t (a leaf's: its AccumulateGrad), None when t needs no gradient. A view whose
    base changed in place is brought up to date first; a plain tensor with torch's requires_grad=True is a leaf."""
    if isinstance(t, tracer_type):
        if t._tt_view:
            catch_up(t, tracer_type, run_rule)
        if not t._tt_requires_grad:
            return None
        return _new_edge(Edge, (position, t._tt_node or leaf_accumulator(t), t._tt_nr, t.shape, t.dtype))
    if not isinstance(t, torch.Tensor) or not t.requires_grad:
        return None
    if t.grad_fn is not None:
        raise RuntimeError(
            f"A tensor computed by torch autograd (grad_fn={t.grad_fn.name()}) met a tracer: torchtrace cannot follow "
            "torch autograd's graph back to its leaves. Make the leaf a tracer instead "
            "(tt.as_tracer(x, requires_grad=True)), or detach the tensor first.")
    return _new_edge(Edge, (position, leaf_accumulator(t), 0, t.shape, t.dtype))


def _rebuild(sequence: Any, items: list) -> Any:
    """A list, tuple, named tuple or torch.return_types result with new items."""
    if isinstance(sequence, list):
        return items
    kind = type(sequence)
    return kind(*items) if hasattr(kind, "_fields") else kind(items)


def _fresh(out: torch.Tensor, args: tuple) -> bool:
    """A plain result no argument is (torch hands some back as they are: x.to(x.dtype)), so no one else holds it: it
    can become the tracer itself, its class changed, instead of getting a second Python object (as_subclass)."""
    if type(out) is not torch.Tensor:
        return False
    for a in args:
        if a is out or (type(a) in _containers and any(item is out for item in a)):
            return False
    return True


def _link_result(out: torch.Tensor, saved: bool, node: Node, nr: int, tracer_type: type, args: tuple) -> torch.Tensor:
    """link_output for result nr of a forward: a fresh result becomes the tracer itself; one the rule saved (it stays
    plain in ctx) gets, if it is no view, a detached alias as its tracer, which shares its memory and version counter
    (an in-place change of the tracer is caught in backward) and is no view, as torch's result is not; anything else
    (an input handed back, a view) an alias that is a view of it."""
    fresh = _fresh(out, args)
    if saved and fresh and not out._is_view():
        return link_output(out.detach(), node, nr, tracer_type, True)
    return link_output(out, node, nr, tracer_type, fresh and not saved)


def _link_outputs(out: Any, node: Node, tracer_type: type, args: tuple) -> Any:
    """The forward's result as tracers produced by node. A result the rule saved stays a plain tensor with a tracer
    alias (as a tracer it would hold the node that holds it); a fresh one becomes the tracer itself; one the rule
    marked non-differentiable (ctx.mark_non_differentiable: an index, a norm's statistics) a tracer without a node."""
    result = _linked(out, node, tracer_type, args)
    if "non_differentiable" in node.ctx.__dict__:
        _unlink(node.ctx.non_differentiable, out, result)
    return result


def _linked(out: Any, node: Node, tracer_type: type, args: tuple) -> Any:
    saved = node.ctx.__dict__.get("packed_ids") or tuple(map(id, node.ctx._saved))  # what was saved, by identity
    if isinstance(out, torch.Tensor):
        kept = ()  # which saved tensors are the output: create_graph re-links them to the node
        for i, s in enumerate(saved):
            if s == id(out):
                kept = node.saved_outputs = (*kept, (i, 0))
        value = kept_output(out)  # the value itself, within the budget (read before out becomes the tracer)
        t = _link_result(out, bool(kept), node, 0, tracer_type, args)
        keep_values(node, (value,), (t,))
        if t._tt_view:
            remember_base(t, args)
            mark_piece(t, node.rule, 0, args)
        return t
    if not isinstance(out, _containers) or not any(isinstance(o, torch.Tensor) for o in out):
        return out  # not a tensor result (e.g. x.type() returns a string): nothing to record
    outputs = tuple(out)
    node.n_outputs = len(outputs)
    node.output_meta = [(o.shape, o.dtype, o.device) if isinstance(o, torch.Tensor) else None for o in outputs]
    node.saved_outputs = tuple((i, nr) for i, s in enumerate(saved) for nr, o in enumerate(outputs) if s == id(o))
    kept = set(saved)
    values = [kept_output(o) if isinstance(o, torch.Tensor) else None for o in outputs]
    linked = [_link_result(o, id(o) in kept, node, nr, tracer_type, args)
              if isinstance(o, torch.Tensor) else o for nr, o in enumerate(outputs)]
    keep_values(node, values, linked)
    for nr, t in enumerate(linked):
        if isinstance(t, torch.Tensor) and t._tt_view:
            remember_base(t, args)
            mark_piece(t, node.rule, nr, args)
    return _rebuild(out, linked)


def _mark_custom_views(out: Any, result: Any, node: Node, args: tuple) -> None:
    """A user Function's output that is a view (or an input returned as-is) may not be changed in place with grad
    mode on: torch forbids it, since the write would bypass the custom backward."""
    inputs = {id(a) for a in args if isinstance(a, torch.Tensor)}
    pairs = zip(out, result) if isinstance(out, _containers) else [(out, result)]
    for nr, (raw, t) in enumerate(pairs):
        if isinstance(t, torch.Tensor) and (id(raw) in inputs or raw._is_view()):
            t._tt_custom_view = f"Output {nr} of {node.rule.__name__}"


def _unlink(marked: tuple, out: Any, result: Any) -> None:
    """The results whose forward outputs were marked non-differentiable need no gradient (as torch's)."""
    for raw, t in zip(out, result) if isinstance(out, _containers) else [(out, result)]:
        if isinstance(t, torch.Tensor) and any(raw is m or t is m for m in marked):
            t._tt_node, t._tt_requires_grad = None, False


def _as_tracers(out: Any, tracer_type: type, args: tuple) -> Any:
    """Results of ops that record nothing are still tracers (as torch's subclass convention)."""
    if isinstance(out, torch.Tensor):
        if isinstance(out, tracer_type):
            return out
        view, fresh = out._is_view(), _fresh(out, args)
        if fresh:  # it becomes the tracer itself
            out.__class__ = tracer_type
        t = out if fresh else out.as_subclass(tracer_type)
        if view:
            t._tt_view, t._tt_version = True, out._version
            remember_base(t, args)
            if not _grad_enabled():  # torch's CreationMeta: no in-place change of it once grad mode is back on
                t._tt_no_grad_view = True
        return t
    if isinstance(out, _containers):
        return _rebuild(out, [_as_tracers(o, tracer_type, args) for o in out])
    return out


def _run_without_rule(tracer_type: type, func: Callable, args: tuple, kwargs: dict) -> Any:
    """No rule: Function.apply, in-place ops (through their out-of-place twin), or non-differentiable ops."""
    owner = getattr(func, "__self__", None)
    if isinstance(owner, type) and issubclass(owner, Function) and func.__name__ == "apply":
        return returned_outputs(owner, run_rule(tracer_type, owner, None, args, kwargs))
    records = recording() and (wants_gradient(args) or wants_gradient(kwargs))
    if args and (func in INPLACE or _is_inplace(func)):
        refuse_no_grad_view(args[0])
        if isinstance(args[0], torch.Tensor) and not _has_floating(args[0]):
            records = False  # an integer or bool destination holds no gradient: the values are cast, as torch's
    if records and func not in INPLACE and func not in NON_DIFFERENTIABLE and _is_inplace(func):
        _refuse(func)  # before torch changes the argument
    if records and func is torch.Tensor.__setitem__ and getattr(args[0], "_tt_view", False) and overlapping(args[0]):
        return write_into_part(*args[:3])  # e = b.expand(3); e[0] = v writes e[0] alone
    if records and func in INPLACE:
        rule, twin = INPLACE[func]
        # x gets its new data from func itself, except where forward drew random numbers: a second draw would give x
        # other values than the graph recorded (and move torch's generator on twice), so the result is copied in
        mutate = (lambda result: torch.Tensor.copy_(args[0], result)) if rule.draws_random else (
            lambda result: func(*args, **kwargs))
        return record_inplace(tracer_type, args[0], callable_name(func),
                              lambda before: run_rule(tracer_type, rule, twin, (before, *args[1:]), kwargs),
                              mutate, run_rule, getattr(func, "__name__", "") in RESHAPING)
    leaf = kwargs.get("requires_grad") is True  # torch.zeros_like(x, requires_grad=True): a new leaf of torchtrace's
    with plain_torch():
        out = func(*args, **({**kwargs, "requires_grad": False} if leaf else kwargs))
    for follow in DATA_WRITES if func == _T.data.__set__ else ():
        follow(args[0])
    if records and func not in NON_DIFFERENTIABLE and _has_floating(out):
        _refuse(func)
    out = _as_tracers(out, tracer_type, args)
    return out.requires_grad_() if leaf else out


def _is_inplace(func: Callable) -> bool:
    name = getattr(func, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


def _refuse(func: Callable) -> None:
    name = callable_name(func)
    raise UnsupportedOperationError(
        f"{name}: torchtrace has no gradient rule for it, and one of its inputs requires a gradient — write one "
        f"with tt.Function and connect it with tt.register({name}, YourFunction), or run this call under "
        "tt.no_grad()."
    )


def _has_floating(out: Any) -> bool:
    if isinstance(out, torch.Tensor):
        return out.is_floating_point() or out.is_complex()
    return isinstance(out, _containers) and any(_has_floating(o) for o in out)


