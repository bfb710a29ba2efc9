"""Optimizer: a torch.optim.Optimizer (parameter groups, state, hooks, (de)serialisation) with torchtrace's updates.

A subclass passes its hyperparameters as `defaults` and writes one method, `update(param, grad, state, group)`:
the update rule for a single parameter (`update_all` may run the same rule on all of a group's parameters at
once). The base class calls it under `no_grad()` for every parameter that has a gradient, handing it plain-tensor
aliases of the parameter and its gradient (same storage, no tracer; a gradient that is a plain tensor already is
handed as it is), so the in-place update changes the tracer's values without recording anything and the state it
creates stays plain.
"""
import copy
import numbers
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

import torch

from torchtrace.autograd.grad_mode import enable_grad, no_grad
from torchtrace.autograd.plain import modes_aside, plain_torch
from torchtrace.errors import UnsupportedOperationError

Params = Union[Iterable[torch.Tensor], Iterable[Dict[str, Any]]]
_detach = torch.Tensor.detach  # torch's own, not a subclass's override (tt.nn.Parameter.detach re-wraps)


def plain(t: torch.Tensor) -> torch.Tensor:
    """The same storage as a plain, detached torch.Tensor (an in-place change shows through the original)."""
    with plain_torch():
        return _plain_alias(t)


def _plain_alias(t: torch.Tensor) -> torch.Tensor:
    """plain(t) inside a plain_torch() guard: t itself when it is one already (as gradients usually are)."""
    if type(t) is torch.Tensor and not t.requires_grad:
        return t
    alias = _detach(t)  # a new object of t's class (no one else holds it): it becomes a plain tensor itself
    alias.__class__ = torch.Tensor
    return alias


def check_non_negative(**values: float) -> None:
    """Refuse negative hyperparameters with torch's messages ("Invalid learning rate: -1")."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (numbers.Real, torch.Tensor)):
            raise TypeError(f"Invalid {'learning rate' if name == 'lr' else name}: {value!r} (a number)")
        if isinstance(value, torch.Tensor) and value.numel() != 1:
            raise ValueError(f"Tensor {name} must be 1-element")
        if value < 0:
            label = "learning rate" if name == "lr" else f"{name} value"
            raise ValueError(f"Invalid {label}: {value}")


def as_scalar(value: Any) -> Any:
    """A hyperparameter as torch's optimizers read it at each step: a 1-element tensor of any shape as a 0-d one (the
    group keeps what was given); a number as it is."""
    return value.squeeze() if isinstance(value, torch.Tensor) and value.dim() != 0 else value


def refuse_flags(**flags: Optional[bool]) -> None:
    """Torch options that select a specialised implementation; torchtrace.optim has only the plain one."""
    for name, value in flags.items():
        if value:
            raise UnsupportedOperationError(f"torchtrace.optim: {name}=True is not supported — torchtrace.optim has "
                                            f"one plain implementation per optimizer; leave {name} unset")


class Optimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose update rule is torchtrace's own `update()`, one parameter at a time (Adam and
    AdamW also run it for all parameters at once with torch's multi-tensor kernels where torch does: `update_all`).

    torch's base class keeps `param_groups` and `state`, checks the parameters, runs step / state_dict hooks and
    is what torch's lr schedulers, `ReduceLROnPlateau`, `torch.optim.swa_utils` and training loops expect.
    """

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """torch's add_param_group (defaults filled in, duplicates refused), plus: no complex parameters."""
        super().add_param_group(param_group)
        if any(p.is_complex() for p in self.param_groups[-1]["params"]):
            self.param_groups.pop()
            raise UnsupportedOperationError("torchtrace.optim: complex parameters are not supported — use real "
                                            "floating-point parameters")

    def update(self, param: torch.Tensor, grad: torch.Tensor, state: Dict[str, Any], group: Dict[str, Any]) -> None:
        """The update rule for one parameter, in place (param and grad are plain tensors)."""
        raise NotImplementedError(f"{type(self).__name__} must define update(param, grad, state, group)")

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One optimisation step over every parameter that has a gradient; returns closure()'s loss, if given."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        state = self.state
        with no_grad(), modes_aside():
            for group in self.param_groups:
                with plain_torch():  # one guard for all the aliases of a group (this loop runs every step)
                    pairs = [(p, _plain_alias(p), _plain_alias(grad))
                             for p in group["params"] if (grad := p.grad) is not None]
                if any(grad.is_sparse for _, _, grad in pairs):
                    raise RuntimeError(f"torchtrace.optim.{type(self).__name__} does not support sparse gradients")
                kept = [state[p] for p, _, _ in pairs]
                self.update_all([param for _, param, _ in pairs], [grad for _, _, grad in pairs], kept, group)
                for (p, _, _), values in zip(pairs, kept):
                    if not values:  # nothing to keep (SGD without momentum): no entry, as torch's state
                        del state[p]
        return loss

    def update_all(self, params: List[torch.Tensor], grads: List[torch.Tensor], states: List[Dict[str, Any]],
                   group: Dict[str, Any]) -> None:
        """The update of one group's parameters that have gradients: `update` on each in turn (an optimizer may do
        them all at once with torch's multi-tensor kernels where torch does, see `uses_foreach`)."""
        for param, grad, state in zip(params, grads, states):
            self.update(param, grad, state, group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's gradient: to None (default), or to plain zeros (a create_graph gradient's graph is
        dropped: the zeros are a plain tensor, not a tracer)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    grad = plain(p.grad)
                    grad.zero_()
                    p.grad = grad

    def state_dict(self) -> Dict[str, Any]:
        """torch's state_dict ({'state': {index: {...}}, 'param_groups': [...]}, hooks included), as a snapshot: its
        tensors are copies, so stepping on afterwards leaves it unchanged."""
        saved = super().state_dict()
        return {**saved, "state": {i: _copy_state(values) for i, values in saved["state"].items()}}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """torch's load_state_dict (ours or a torch.optim optimizer's, matched by position, floating state cast to each
        parameter's dtype and device) on copies of the saved tensors, so the two never share state."""
        state = {i: _copy_state(values) for i, values in state_dict["state"].items()}
        super().load_state_dict({**state_dict, "state": state})


def _copy_state(values: Dict[str, Any]) -> Dict[str, Any]:
    """Copy one parameter's state: tensors as plain tensors, other values deep-copied."""
    return {key: plain(value).clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
            for key, value in values.items()}


def uses_foreach(group: Dict[str, Any], params: List[torch.Tensor]) -> bool:
    """torch's choice between its two implementations: the multi-tensor one (torch._foreach_* kernels, a few launches
    for all parameters) with foreach=True, or with foreach unset when every parameter is on CUDA (torch's default
    there, unless lr is a tensor); otherwise one parameter at a time."""
    foreach = group.get("foreach")
    if foreach is None:
        return bool(params) and all(p.device.type in ("cuda", "xpu") for p in params) and \
            not isinstance(group["lr"], torch.Tensor)
    return bool(foreach)


def next_step(state: Dict[str, Any]) -> float:
    """Advance the step count kept in state['step'] (a 0-d tensor, as torch keeps it) and return it."""
    state["step"] += 1
    return float(state["step"])


def l2_regularised(grad: torch.Tensor, param: torch.Tensor, maximize: bool, weight_decay: float) -> torch.Tensor:
    """g <- -g when maximizing, then g <- g + weight_decay * param (the L2 penalty folded into the gradient)."""
    if maximize:
        grad = -grad
    if weight_decay != 0:
        grad = grad.add(param, alpha=weight_decay)
    return grad
