"""Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay."""
from typing import Any, Dict, Optional

import torch

from torchtrace.optim.optimizer import Optimizer, Params, check_non_negative, l2_regularised, refuse_flags


class SGD(Optimizer):
    r"""Stochastic gradient descent (torch.optim.SGD), one parameter theta with gradient g:

        g <- -g                               if maximize
        g <- g + weight_decay * theta         (L2 penalty)
        b <- g                                at the first step        } only when momentum != 0;
        b <- momentum * b + (1 - dampening) g  afterwards               } b is state['momentum_buffer']
        g <- g + momentum * b                 if nesterov, else g <- b
        theta <- theta - lr * g
    """

    def __init__(self, params: Params, lr: float = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, *, maximize: bool = False,
                 foreach: Optional[bool] = None, differentiable: bool = False, fused: Optional[bool] = None):
        check_non_negative(lr=lr, momentum=momentum, weight_decay=weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        refuse_flags(differentiable=differentiable, fused=fused)  # foreach only picks torch's kernel: ignored
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize, foreach=foreach, differentiable=differentiable,
                        fused=fused)  # (the last three kept in each group as torch keeps them)
        super().__init__(params, defaults)

    def update(self, param: torch.Tensor, grad: torch.Tensor, state: Dict[str, Any], group: Dict[str, Any]) -> None:
        grad = l2_regularised(grad, param, group["maximize"], group["weight_decay"])
        momentum = group["momentum"]
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.clone()
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
            grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
        param.add_(grad, alpha=-float(group["lr"]))
