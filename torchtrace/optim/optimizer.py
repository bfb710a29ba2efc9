"""Optimizer: the base class that owns the parameter groups, the per-parameter state and (de)serialisation.

A subclass passes its hyperparameters as `defaults` and writes one method, `update(param, grad, state, group)`:
the update rule for a single parameter. The base class calls it under `no_grad()` for every parameter that has
a gradient, handing it plain-tensor aliases of the parameter and its gradient (same storage, no tracer), so the
in-place update changes the tracer's values without recording anything and the state it creates stays plain.
"""
import copy
import warnings
from collections import defaultdict
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

import torch

from torchtrace.autograd.grad_mode import enable_grad, no_grad
from torchtrace.errors import UnsupportedOperationError

_guard = torch._C.DisableTorchFunctionSubclass
Params = Union[Iterable[torch.Tensor], Iterable[Dict[str, Any]]]


def plain(t: torch.Tensor) -> torch.Tensor:
    """The same storage as a plain, detached torch.Tensor (an in-place change shows through the original)."""
    with _guard():
        return t.detach().as_subclass(torch.Tensor)


def check_non_negative(**values: float) -> None:
    """Refuse negative hyperparameters with torch's messages ("Invalid learning rate: -1")."""
    for name, value in values.items():
        if value < 0:
            label = "learning rate" if name == "lr" else f"{name} value"
            raise ValueError(f"Invalid {label}: {value}")


def refuse_flags(**flags: Optional[bool]) -> None:
    """Torch options that select a specialised implementation; torchtrace.optim has only the plain one."""
    for name, value in flags.items():
        if value:
            raise UnsupportedOperationError(f"torchtrace.optim: {name}=True is not supported — torchtrace.optim has "
                                            "one plain implementation per optimizer; leave {name} unset")


class Optimizer:
    """Base class: `param_groups` (dicts of 'params' plus hyperparameters) and `state` (a dict per parameter)."""

    def __init__(self, params: Params, defaults: Dict[str, Any]):
        if isinstance(params, torch.Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            f"but got {type(params).__name__}")
        self.defaults = dict(defaults)
        self.state: Dict[torch.Tensor, Dict[str, Any]] = defaultdict(dict)
        self.param_groups: List[Dict[str, Any]] = []
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Add a group of parameters; hyperparameters it leaves out are taken from the defaults."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        group = dict(param_group)
        params = group["params"]
        if isinstance(params, torch.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering of "
                            "tensors in sets will change between runs. Please use a list instead.")
        params = list(params)
        if params and all(isinstance(p, tuple) for p in params):  # named parameters: (name, tensor) pairs
            group["param_names"] = [name for name, _ in params]
            params = [p for _, p in params]
        for p in params:
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but one of the params is {type(p).__name__}")
            if not (p.is_leaf or p.retains_grad):
                raise ValueError("can't optimize a non-leaf Tensor")
            if p.is_complex():
                raise UnsupportedOperationError("torchtrace.optim: complex parameters are not supported — use real "
                                                "floating-point parameters")
        group["params"] = params
        for name, default in self.defaults.items():
            group.setdefault(name, default)
        ids = [id(p) for p in params]
        if len(set(ids)) != len(ids):
            warnings.warn("optimizer contains a parameter group with duplicate parameters; in future, this will "
                          "cause an error", stacklevel=2)
        existing = {id(p) for g in self.param_groups for p in g["params"]}
        if existing & set(ids):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def update(self, param: torch.Tensor, grad: torch.Tensor, state: Dict[str, Any], group: Dict[str, Any]) -> None:
        """The update rule for one parameter, in place (param and grad are plain tensors)."""
        raise NotImplementedError(f"{type(self).__name__} must define update(param, grad, state, group)")

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One optimisation step over every parameter that has a gradient; returns closure()'s loss, if given."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    grad = plain(p.grad)
                    if grad.is_sparse:
                        raise RuntimeError(f"torchtrace.optim.{type(self).__name__} does not support sparse gradients")
                    self.update(plain(p), grad, self.state[p], group)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's gradient: to None (default), or to zeros (detached from any graph)."""
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
        """{'state': {index: {...}}, 'param_groups': [{..., 'params': [indices]}]}, as torch; a snapshot (tensors are
        cloned), so stepping on afterwards leaves it unchanged."""
        index: Dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {key: value for key, value in group.items() if key != "params"}
            packed["params"] = [index.setdefault(id(p), len(index)) for p in group["params"]]
            groups.append(packed)
        state = {index[id(p)]: _copy_state(s) for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore state and hyperparameters saved by state_dict() (ours or torch.optim's) onto this optimizer's
        parameters, matched by position; state tensors are copied to each parameter's dtype and device."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(saved["params"]) != len(group["params"]) for saved, group in zip(saved_groups, self.param_groups)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                             "optimizer's group")
        by_index = {i: p for saved, group in zip(saved_groups, self.param_groups)
                    for i, p in zip(saved["params"], group["params"])}
        state: Dict[Any, Dict[str, Any]] = defaultdict(dict)
        for i, values in state_dict["state"].items():
            param = by_index.get(i)
            state[param if param is not None else i] = _copy_state(values, param)
        groups = []
        for saved, group in zip(saved_groups, self.param_groups):
            restored = copy.deepcopy({key: value for key, value in saved.items() if key != "params"})
            if "param_names" in group:
                restored.setdefault("param_names", group["param_names"])
            restored["params"] = group["params"]
            groups.append(restored)
        self.state, self.param_groups = state, groups

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {key}: {group[key]}" for key in sorted(group) if key != "params"]
        return "\n".join(lines + [")"])


def _copy_state(values: Dict[str, Any], param: Optional[torch.Tensor] = None) -> Dict[str, Any]:
    """Copy one parameter's state; with `param`, floating tensors (except the step count) take its dtype/device."""
    copied = {}
    for key, value in values.items():
        if isinstance(value, torch.Tensor):
            value = plain(value)
            if param is not None and key != "step" and value.is_floating_point():
                value = value.to(dtype=param.dtype, device=param.device, copy=True)
            else:
                value = value.clone()
        else:
            value = copy.deepcopy(value)
        copied[key] = value
    return copied


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
