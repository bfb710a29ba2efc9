"""A torch autograd Function called on tracers runs its own forward/backward as one torchtrace node.

The user's class is wrapped in a tt.Function built once per class (cached with weak references, so no user class is
kept alive by the cache). forward runs on plain tensors (nothing is recorded inside) with a `UserContext` that has
torch's ctx API; backward calls the user's backward with that ctx.
"""
import inspect
import weakref
from typing import Any, Callable, List, Tuple

import torch

from torchtrace.autograd.dispatch import run_rule
from torchtrace.autograd.function import Function
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import STATE
from torchtrace.errors import UnsupportedOperationError
from torchtrace.tracer import tracer as TRACER

_BRIDGES: "weakref.WeakKeyDictionary[type, type]" = weakref.WeakKeyDictionary()
ONCE_DIFFERENTIABLE_MESSAGE = "trying to differentiate twice a function that was marked with @once_differentiable"


class UserContext:
    """torch's ctx for a user Function: save_for_backward, saved_tensors, needs_input_grad, mark_dirty, ...

    Saved tensors live on the graph node (so retain_graph, in-place checks and create_graph work as for rules). It
    reaches that node's Context only while forward or backward runs (`_node`, None between): the Context holds it, so
    holding the Context back would be a reference cycle that keeps the graph alive until Python's cycle collector ran.
    """

    def __init__(self, node: Any, needs_input_grad: Tuple[bool, ...]):
        self._node: Any = node
        self.needs_input_grad = needs_input_grad
        self.materialize_grads = True
        self.dirty: Tuple[Any, ...] = ()
        self.non_differentiable: Tuple[Any, ...] = ()

    def save_for_backward(self, *tensors: Any) -> None:
        self._node.save_for_backward(*tensors)

    def save_for_forward(self, *tensors: Any) -> None:
        self.saved_for_forward = tensors

    @property
    def saved_tensors(self) -> Tuple[Any, ...]:
        return self._node.saved_tensors

    def mark_dirty(self, *tensors: Any) -> None:
        self.dirty = tensors

    def mark_non_differentiable(self, *tensors: Any) -> None:
        self.non_differentiable = tensors

    def set_materialize_grads(self, value: bool) -> None:
        """False: backward receives None for an output no gradient reached; the engine reads the node's own ctx."""
        self.materialize_grads = bool(value)
        self._node.set_materialize_grads(value)


class _Opaque:
    """Hides a container argument from the dispatcher: torch tracks only tensors passed directly, so do we."""

    def __init__(self, value: Any):
        self.value = value


class _Call:
    """One call of a user Function: its class, and what forward learned (the node, the output layout)."""

    def __init__(self, user_class: type, new_style: bool):
        self.user_class, self.new_style = user_class, new_style
        self.node: Any = None
        self.places: List[int] = []
        self.n_outputs = 1
        self.raw: List[Any] = []
        self.others: Any = None


def _split(out: Any, call: _Call) -> List[Any]:
    """The tensor outputs of forward; `call` remembers where they sit among all outputs."""
    if isinstance(out, torch.Tensor):
        call.places, call.n_outputs = [0], 1
        return [out]
    if not isinstance(out, tuple):
        raise UnsupportedOperationError(f"{call.user_class.__name__}.forward returned {type(out).__name__}: return "
                                        "a tensor or a tuple of tensors (as torch requires)")
    call.places = [i for i, o in enumerate(out) if isinstance(o, torch.Tensor)]
    call.n_outputs = len(out)
    return [out[i] for i in call.places]


def _merge(tensors: List[Any], call: _Call, others: Any) -> Any:
    """Put tensors back among forward's other outputs (`others` is forward's tuple, or None for one tensor)."""
    if others is None:
        return tensors[0]
    items = list(others)
    for i, t in zip(call.places, tensors):
        items[i] = t
    return tuple(items)


def _once_differentiable(backward: Callable, user_class: type) -> bool:
    """Is backward torch's once_differentiable wrapper? functools.wraps copied the user's names onto it, but not
    the module it was defined in (its globals): the module of torch's Function, a base of user_class."""
    torch_modules = {base.__module__ for base in user_class.__mro__ if base.__module__.startswith("torch.")}
    return hasattr(backward, "__wrapped__") and getattr(backward, "__globals__", {}).get("__name__") in torch_modules


class _DelayedError(Function):
    """y = x -> dy/dx raises: the gradient of a @once_differentiable backward cannot be differentiated again."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(ONCE_DIFFERENTIABLE_MESSAGE)


def _bridge(user_class: type) -> type:
    """The tt.Function that runs user Functions named like `user_class` (one per class, held weakly)."""
    bridge = _BRIDGES.get(user_class)
    if bridge is None:
        doc = f"y = {user_class.__qualname__}.forward(x) -> its own backward"
        bridge = type(user_class.__name__, (Function,), {"__doc__": doc, "forward": staticmethod(_forward),
                                                         "backward": staticmethod(_backward),
                                                         "hidden_arguments": 1,  # the _Opaque call
                                                         "user_backward": user_class.__qualname__})  # not the class
        _BRIDGES[user_class] = bridge
    return bridge


def _forward(ctx: Any, opaque_call: _Opaque, *args: Any) -> Any:
    call = opaque_call.value
    cls = call.user_class
    args = tuple(a.value if isinstance(a, _Opaque) else a for a in args)
    ctx.user_call, call.node = call, ctx
    ctx.user_ctx = UserContext(ctx, tuple(ctx.needs_input_grad[1:len(args) + 1]))
    if call.new_style:
        out = cls.forward(*args)
        cls.setup_context(ctx.user_ctx, args, out)
    else:
        out = cls.forward(ctx.user_ctx, *args)
    call.raw = _split(out, call)
    call.others = None if isinstance(out, torch.Tensor) else out
    ctx.user_ctx._node = None
    return out if isinstance(out, torch.Tensor) else tuple(call.raw)


def _backward(ctx: Any, *grads: Any) -> Any:
    call = ctx.user_call
    full: List[Any] = [None] * call.n_outputs
    for i, g in zip(call.places, grads):
        full[i] = g
    backward = call.user_class.backward
    ctx.user_ctx._node = ctx
    try:
        if _once_differentiable(backward, call.user_class) and STATE.create_graph:
            with plain_torch():
                result = backward.__wrapped__(ctx.user_ctx, *full)
            result = _poison(result)
        else:
            result = backward(ctx.user_ctx, *full)
    finally:
        ctx.user_ctx._node = None
    return (None,) + (tuple(result) if isinstance(result, (tuple, list)) else (result,))


def _poison(result: Any) -> Any:
    """Gradients whose own backward raises (torch's DelayedError for @once_differentiable under create_graph)."""
    single = not isinstance(result, tuple)
    items = [result] if single else list(result)
    with plain_torch():
        leaves = [torch.Tensor.detach(g).as_subclass(TRACER).requires_grad_() if isinstance(g, torch.Tensor) else g
                  for g in items]
    items = [_DelayedError.apply(g) if isinstance(g, TRACER) else g for g in leaves]
    return items[0] if single else tuple(items)


def apply_on_tracers(user_class: type, new_style: bool, args: tuple, kwargs: dict) -> Any:
    """Run `user_class.apply(*args, **kwargs)` as one torchtrace node."""
    if kwargs or new_style:  # (with setup_context torch fills in forward's defaults: its inputs hold them)
        params = list(inspect.signature(user_class.forward).parameters.values())[0 if new_style else 1:]
        bound = inspect.Signature(params).bind(*args, **kwargs)
        bound.apply_defaults()
        args = bound.args + tuple(bound.kwargs.values())
    call = _Call(user_class, new_style)
    hidden = tuple(_Opaque(a) if isinstance(a, (list, tuple, dict)) else a for a in args)
    result = run_rule(TRACER, _bridge(user_class), None, (_Opaque(call),) + hidden, {})
    tensors = [result] if isinstance(result, torch.Tensor) else list(result)
    user_ctx = call.node.user_ctx
    if call.node._edges:
        non_diff = {id(t) for t in user_ctx.non_differentiable}
        dirty = {id(t): t for t in user_ctx.dirty}
        for i, (t, plain) in enumerate(zip(tensors, call.raw)):
            if id(plain) in non_diff:
                with plain_torch():
                    tensors[i] = torch.Tensor.detach(plain).as_subclass(TRACER)
            elif id(plain) in dirty and isinstance(plain, TRACER):
                tensors[i] = _rebind(plain, t, user_class)
    result = _merge(tensors, call, call.others)
    call.node = call.raw = call.others = None  # (the node's Context holds the call: no cycle back, nor its outputs)
    return result


def _rebind(target: Any, linked: Any, user_class: type) -> Any:
    """mark_dirty: the input tracer itself now holds the output (as after x.mul_(2)), like torch."""
    if target._tt_requires_grad and target._tt_node is None:
        raise RuntimeError(f"{user_class.__name__}: a leaf tracer that requires grad was modified in place by "
                           "forward (mark_dirty). Pass a clone, or do it under tt.no_grad().")
    if target._tt_view:  # torch's graph carries the change on into the base (CopySlices); torchtrace's would not
        raise UnsupportedOperationError(
            f"{user_class.__name__}: forward changed a view in place (mark_dirty), and torchtrace does not carry a "
            "custom Function's in-place change on into the view's base: apply it to the base itself, or to a clone "
            "of the view and write the result back (base[i] = result)")
    target._tt_node, target._tt_nr = linked._tt_node, linked._tt_nr
    target._tt_requires_grad = linked._tt_requires_grad
    with plain_torch():
        target._tt_version = target._version
    return target
