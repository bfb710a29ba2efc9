"""Python's operators on a tracer, straight to their lanes (`a * b`, `a + b`, `a - b`, `a / b`, `a @ b`, `-a`, `2 - a`),
and the switch of the tracer's entry points between the lanes and the readable path.

torch hands `a * b` on a tensor subclass to `__torch_function__` through its C entry: it parses the arguments, finds
the overloaded ones, looks the method up by name and builds the call, which costs a small op's forward more than all
its arithmetic (counted with callgrind on the 200-op chain of bench/overhead.py: ~10,000 of ~65,000 instructions per
op). While the lanes are on, the tracer class defines these operators itself. In the common case (the other operand a
tracer, a plain tensor or a Python number; no TorchFunctionMode; torch function dispatch not disabled) an operator
calls its rule's lane with exactly what `__torch_function__` would have received: torch's method (`Tensor.mul`) and
`(a, b)`. With one TorchFunctionMode on, of a type registered in MODES_CALLED_DIRECTLY (tt.compile's ReplayMode),
the operator hands the call to that mode as torch's entry would (the mode off the stack while it runs), without that
entry. Every other case calls torch's own operator, which follows the protocol as before (and answers
NotImplemented where torch does, so `a * x` still reaches `type(x).__rmul__`). A reflected operator takes a number
only; with a plain tensor on the left (`t - a`) it answers as that tensor's own operator (see below).
"""
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch

from torchtrace.autograd import dispatch
from torchtrace.autograd.function import RULES
from torchtrace.autograd.plain import _pop_mode, _push_mode, _stack_at, _stack_len
from torchtrace.lanes.forward import LANES, MOST_ARGUMENTS, _FirstUse
from torchtrace.lanes.forward import torch_function as lanes_torch_function

_TENSORS, _NUMBERS = (torch.Tensor,), (float, int, bool)
# operator -> (the torch method __torch_function__ receives for it, the other operand's types its common case takes
# besides tracers; None: a unary operator)
OPERATORS: Dict[str, Tuple[Callable, Optional[tuple]]] = {
    "__add__": (torch.Tensor.add, _TENSORS + _NUMBERS), "__sub__": (torch.Tensor.sub, _TENSORS + _NUMBERS),
    "__mul__": (torch.Tensor.mul, _TENSORS + _NUMBERS), "__truediv__": (torch.Tensor.div, _TENSORS + _NUMBERS),
    "__matmul__": (torch.Tensor.matmul, _TENSORS), "__neg__": (torch.Tensor.neg, None),
    "__rsub__": (torch.Tensor.__rsub__, _NUMBERS), "__rmatmul__": (torch.Tensor.matmul, ())}
# torch's own `__radd__` and `__rmul__` (C) stay: they give `2 * a` and `t * a` to the protocol as `mul(a, 2)` and
# `mul(t, a)` (a Python one would cost the backward, whose formulas multiply plain gradients by saved tracers: g * b);
# c / x stays tensor_protocols.py's __rtruediv__ (two nodes, as torch records it). But a class that defines `__sub__`
# gets Python's slot for `-`, which asks the right operand's `__rsub__` first when its class is a subclass of the left
# one's: `t - a` (t a plain tensor) would become torch's `Tensor.__rsub__(a, t)` (recorded as Rsub), `t @ a` torch's
# `torch.matmul(t, a)`. So a reflected operator given a tensor whose class keeps torch's operator answers as that
# operator: `t - a` is `Tensor.__sub__(t, a)`, as before the tracer had operators. A number (`2 - a`) takes the lane.
_dispatch_on, _mode_on = torch._C._is_torch_function_enabled, torch._C._is_torch_function_mode_enabled
# TorchFunctionModes an operator calls itself when it is the only mode (tt.compile's ReplayMode registers): the call
# torch would make through its C entry, `mode.__torch_function__(func, types, args, kwargs)` with the mode off the
# stack while it runs, without that entry's cost
MODES_CALLED_DIRECTLY: Set[type] = set()
_MADE: Dict[type, Dict[str, Callable]] = {}  # tracer class -> its operators (made once)


def use_lanes(tracer_type: type, on: bool) -> None:
    """The tracer class's entry points: while the lanes are on, `__torch_function__` tries a rule's lane first and the
    operators are defined; off, every call goes to dispatch.torch_function (the operators are torch's again)."""
    tracer_type.__torch_function__ = classmethod(lanes_torch_function if on else dispatch.torch_function)
    methods = _MADE.get(tracer_type) or _MADE.setdefault(tracer_type, _operator_methods(tracer_type))
    for name, method in methods.items():
        if on:
            setattr(tracer_type, name, method)
        elif name in vars(tracer_type):
            delattr(tracer_type, name)


def _mode_called_directly() -> bool:
    """The only mode on the stack is of a registered type: an operator calls it itself (`_call_mode`)."""
    return _stack_len() == 1 and type(_stack_at(0)) in MODES_CALLED_DIRECTLY


def _call_mode(func: Callable, types: tuple, args: tuple, kwargs: Optional[dict]) -> Any:
    """What torch's C entry does with the mode: the call handed to it, with the mode off the stack while it runs (the
    keywords as torch passes them: None for a method, {} for `__rsub__`)."""
    mode = _pop_mode()
    try:
        return mode.__torch_function__(func, types, args, kwargs)
    finally:
        _push_mode(mode)


def _operator_methods(tracer_type: type) -> Dict[str, Callable]:
    # the tracer classes of the common case: a subclass of the tracer that keeps its entry (tt.nn.Parameter) joins;
    # any other type takes torch's protocol. Only torchtrace's own classes are remembered (a class a user makes in a
    # loop must be freed): a user's subclass is asked again at each call.
    tracers: Set[type] = {tracer_type}

    def joins(cls: type) -> bool:
        shares = (issubclass(cls, tracer_type) and getattr(cls, "_tt_type", None) is tracer_type
                  and getattr(cls.__torch_function__, "__func__", None) is tracer_type.__torch_function__.__func__)
        if shares and cls.__module__.startswith("torchtrace."):
            tracers.add(cls)
        return shares

    def operator(name: str, func: Callable, others: Optional[tuple]) -> Callable:
        """The operator: its lane in the common case (a tracer operand `self`, `other` of the operator's types,
        dispatch on, no mode), else torch's own."""
        torch_operator, takes, found = getattr(torch.Tensor, name), frozenset(others or ()), []  # found: [the rule's
        # lanes] after the first call (the rules register after the tracer class is made)
        if others is None:
            def unary(self: Any) -> Any:
                if (type(self) in tracers or joins(type(self))) and _dispatch_on():
                    if not _mode_on():
                        return (found[0] if found else _lanes_of(func, found))[1](tracer_type, func, (self,))
                    if _mode_called_directly():
                        return _call_mode(func, (tracer_type,), (self,), None)
                return torch_operator(self)
            return unary
        if name.startswith("__r"):
            forward = "__" + name[3:]
            torch_forward = getattr(torch.Tensor, forward)

            def reflected(self: Any, other: Any) -> Any:
                if type(other) in takes and (type(self) in tracers or joins(type(self))) and _dispatch_on():
                    if not _mode_on():
                        return (found[0] if found else _lanes_of(func, found))[2](tracer_type, func, (self, other))
                    if _mode_called_directly():
                        return _call_mode(func, (tracer_type,), (self, other), {})
                if isinstance(other, torch.Tensor) and getattr(type(other), forward) is torch_forward:
                    return torch_forward(other, self)  # t - a: the left tensor's own operator, as without ours
                return torch_operator(self, other)
            return reflected

        def binary(self: Any, other: Any) -> Any:
            if ((type(other) in tracers or type(other) in takes or joins(type(other)))
                    and (type(self) in tracers or joins(type(self))) and _dispatch_on()):
                if not _mode_on():
                    return (found[0] if found else _lanes_of(func, found))[2](tracer_type, func, (self, other))
                if _mode_called_directly():
                    return _call_mode(func, (tracer_type,), (self, other), None)
            return torch_operator(self, other)
        return binary

    methods = {name: operator(name, func, others) for name, (func, others) in OPERATORS.items()}
    for name, method in methods.items():
        method.__name__ = method.__qualname__ = name
        method.__doc__ = f"{name} of a tracer: {OPERATORS[name][0].__name__}'s lane, or torch's own operator outside " \
                         "the common case (lanes/operators.py)."
    return methods


def _lanes_of(func: Callable, found: List[Any]) -> List[Any]:
    rule = RULES[func]
    found.append(LANES.setdefault(rule, [_FirstUse(rule, k) for k in range(MOST_ARGUMENTS)]))
    return found[0]
