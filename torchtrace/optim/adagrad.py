"""Adagrad: per-coordinate learning rates that shrink with the sum of squared past gradients."""
from typing import Any, Dict, Optional

import torch

from torchtrace.optim.optimizer import (
    Optimizer,
    Params,
    as_scalar,
    check_non_negative,
    l2_regularised,
    next_step,
    plain,
    refuse_flags,
)


class Adagrad(Optimizer):
    r"""Adagrad (torch.optim.Adagrad), one parameter theta with gradient g at step t = 1, 2, ...:

        g <- -g                                          if maximize
        g <- g + weight_decay * theta                    (L2 penalty)
        lr_t = lr / (1 + (t - 1) * lr_decay)
        s <- s + g^2                                     state['sum'], starts at initial_accumulator_value
        theta <- theta - lr_t * g / (sqrt(s) + eps)
    """

    def __init__(self, params: Params, lr: float = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
                 initial_accumulator_value: float = 0, eps: float = 1e-10, foreach: Optional[bool] = None, *,
                 maximize: bool = False, differentiable: bool = False, fused: Optional[bool] = None):
        check_non_negative(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                           initial_accumulator_value=initial_accumulator_value, epsilon=eps)
        refuse_flags(differentiable=differentiable, fused=fused)
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, maximize=maximize, foreach=foreach,
                        differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)
        for group in self.param_groups:  # as torch: every parameter's state exists from the start
            for p in group["params"]:
                self._start(self.state[p], plain(p))

    def _start(self, state: Dict[str, Any], param: torch.Tensor) -> None:
        """A parameter's first state, as torch's: s starts at the constructor's initial_accumulator_value (torch reads
        no group's own, neither of a group given at construction nor of one added later)."""
        state["step"] = torch.tensor(0.0)
        state["sum"] = torch.full_like(param, self.defaults["initial_accumulator_value"])

    def share_memory(self) -> None:
        """The accumulated sums in shared memory, for training in several processes (as torch's)."""
        for state in self.state.values():
            state["sum"].share_memory_()

    def update(self, param: torch.Tensor, grad: torch.Tensor, state: Dict[str, Any], group: Dict[str, Any]) -> None:
        if not state:  # a parameter of a group added since
            self._start(state, param)
        step = next_step(state)
        grad = l2_regularised(grad, param, group["maximize"], group["weight_decay"])
        lr_t = as_scalar(group["lr"]) / (1 + (step - 1) * group["lr_decay"])  # (a tensor lr: tensor arithmetic)
        state["sum"].addcmul_(grad, grad, value=1)
        denom = state["sum"].sqrt().add_(group["eps"])
        param.addcdiv_(grad, denom, value=-lr_t)
