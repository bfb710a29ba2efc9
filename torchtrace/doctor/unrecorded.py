"""The first NaN or Inf made by an op that records nothing (its inputs need no gradient, or grad mode is off).

No node remembers such an op, so the recorded graph can only say that a non-finite value entered it. While
tt.diagnose(fn, ...) runs the forward, its torch function mode sees every call; for each result that no node
produced it checks whether the values are finite, and keeps the first op that made a NaN or Inf from finite
tensor inputs, with its source line, the module it ran in and the cause read from its inputs (a factory, such as
torch.empty whose memory may hold NaN, computes nothing from inputs and is left out).
"""
from typing import Any, Optional, Tuple

import torch

from torchtrace.autograd.function import INPLACE, RULES
from torchtrace.autograd.state import STATE
from torchtrace.doctor.causes import AtOp, bind, cause_of
from torchtrace.doctor.values import all_finite, describe, tensors_in
from torchtrace.doctor.where import user_line


class UnrecordedOrigin:
    """Where the first non-finite value of an unrecorded op was made."""

    def __init__(self, op: str, line: Tuple[str, str], modules: Tuple[Any, ...], cause: Tuple[str, str]) -> None:
        self.op, (self.line, self.code), self.modules, self.cause = op, line, modules, cause


def _op_name(func: Any) -> str:
    rule = RULES.get(func)
    return rule.__name__ if rule is not None else getattr(func, "__name__", str(func))


class FirstUnrecorded:
    """Called by the doctor's torch function mode after every call: keeps the first unrecorded non-finite result."""

    def __init__(self) -> None:
        self.origin: Optional[UnrecordedOrigin] = None

    def before(self, func: Any, args: tuple) -> Optional[torch.Tensor]:
        """The tensor this call is about to write into in place while nothing records the write (grad mode is off,
        or the tensor needs no gradient: `h.detach()[0] = ...`), when it is finite now; else None."""
        target = args[0] if args else None
        name = getattr(func, "__name__", "")
        if self.origin is not None or not isinstance(target, torch.Tensor) or not (
                func in INPLACE or func is torch.Tensor.__setitem__ or (name.endswith("_") and name[-2:] != "__")):
            return None
        if torch.is_grad_enabled() and getattr(target, "_tt_requires_grad", False):
            return None  # a recorded write: the forward's observer checks it
        return target if all_finite([target]) else None

    def see(self, func: Any, args: tuple, kwargs: dict, result: Any, written: Optional[torch.Tensor] = None) -> None:
        if self.origin is None and written is not None and not all_finite([written]):
            needs = "grad mode is off" if not torch.is_grad_enabled() else "the tensor written needs no gradient"
            self.origin = UnrecordedOrigin(
                _op_name(func), user_line(), STATE.module_stack,
                (f"{_op_name(func)} wrote NaN or Inf into a tensor in place ({describe(written)} now; nothing "
                 f"recorded this write: {needs})", "make the written value finite, or leave the tensor the graph "
                 "reads unchanged (write into a copy)"))
            return
        if self.origin is not None or getattr(result, "_tt_node", None) is not None:
            return  # a recorded op: the forward's observer checks it
        outputs, inputs = tensors_in(result), tensors_in([*args, *kwargs.values()])
        if not outputs or not inputs or all_finite(outputs) or not all_finite(inputs):
            return  # no tensor inputs: a factory (torch.empty's memory, a constant), not a computation
        rule = RULES.get(func)
        named = bind(rule.forward, args, kwargs) if rule is not None else {}
        at = AtOp(_op_name(func), "forward", args, kwargs, named, outputs)
        message, advice = cause_of(at)
        needs = "grad mode is off" if not torch.is_grad_enabled() else "its inputs need no gradient"
        self.origin = UnrecordedOrigin(at.rule, user_line(), STATE.module_stack,
                                       (f"{message} (nothing recorded this op: {needs})", advice))
