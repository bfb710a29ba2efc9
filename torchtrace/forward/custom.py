"""A user's Function in forward mode: its own `jvp(ctx, *tangents)`, as torch's autograd.Function defines it.

torch calls `jvp` right after `forward`, with forward's ctx, one tangent per argument of forward (None for a
non-tensor argument, zeros for a tensor without a tangent), and takes one tangent per output. Tensors forward
kept with `ctx.save_for_forward(...)` are `ctx.saved_tensors` inside jvp. A Function without `jvp` is
transposed instead (its backward run twice), which needs that backward to be differentiable (`transpose.py`).
"""
from typing import Any, Callable, List, Optional

import torch

from torchtrace.forward.call import Call, NoTangent


class JvpContext:
    """forward's ctx as jvp sees it: every attribute forward set, and saved_tensors = what it saved for forward."""

    def __init__(self, ctx: Any):
        object.__setattr__(self, "_ctx", ctx)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._ctx, name, value)

    @property
    def saved_tensors(self) -> tuple:
        return tuple(getattr(self._ctx, "saved_for_forward", ()))


def defines_jvp(cls: type) -> bool:
    """Does `cls` (not torch's base class, whose jvp only raises) define jvp?"""
    owner = next((c for c in cls.__mro__ if "jvp" in c.__dict__), None)
    return owner is not None and not owner.__module__.startswith("torch.")


def user_jvp(rule: type) -> Optional[Callable[[Call], Any]]:
    """The tangent rule of a user's Function: its jvp, or None (then its backward is transposed)."""
    if getattr(rule, "user_backward", None) is not None:  # a torch's autograd.Function, run through the bridge
        return _bridged_jvp
    return _own_jvp if defines_jvp(rule) else None


def _tangents(args: tuple, dots: List[Any]) -> List[Any]:
    return [d if d is not None else (torch.zeros_like(a) if isinstance(a, torch.Tensor) and a.is_floating_point()
                                     else None)
            for a, d in zip(args, dots)]


def _outputs(returned: Any) -> List[Any]:
    return list(returned) if isinstance(returned, (tuple, list)) else [returned]


def _own_jvp(call: Call) -> Any:
    """A tt.Function's jvp."""
    returned = call.rule.jvp(JvpContext(call.ctx), *_tangents(call.args, call.dots))
    return returned if isinstance(call.out, torch.Tensor) else tuple(_outputs(returned))


def _bridged_jvp(call: Call) -> Any:
    """A torch's autograd.Function's jvp (the bridge's first argument is the call itself, hidden)."""
    user_call = call.ctx.user_call
    if not defines_jvp(user_call.user_class):
        raise NoTangent
    args = tuple(getattr(a, "value", a) for a in call.args[1:])
    returned = _outputs(user_call.user_class.jvp(JvpContext(call.ctx.user_ctx), *_tangents(args, call.dots[1:])))
    tensors = [returned[i] for i in user_call.places]
    return tensors[0] if isinstance(call.out, torch.Tensor) else tuple(tensors)
