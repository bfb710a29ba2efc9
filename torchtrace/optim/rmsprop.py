"""RMSprop: divide the gradient by a running root-mean-square of recent gradients."""
from typing import Any, Dict, Optional

import torch

from torchtrace.optim.optimizer import Optimizer, Params, check_non_negative, l2_regularised, next_step, refuse_flags


class RMSprop(Optimizer):
    r"""RMSprop (torch.optim.RMSprop), one parameter theta with gradient g:

        g <- -g                                      if maximize
        g <- g + weight_decay * theta                (L2 penalty)
        v <- alpha * v + (1 - alpha) * g^2           state['square_avg']
        gbar <- alpha * gbar + (1 - alpha) * g       if centered, state['grad_avg']
        d <- sqrt(v - gbar^2) + eps                  if centered, else d <- sqrt(v) + eps
        b <- momentum * b + g / d                    if momentum > 0, state['momentum_buffer']
        theta <- theta - lr * b                      if momentum > 0, else theta <- theta - lr * g / d
    """

    def __init__(self, params: Params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0, momentum: float = 0, centered: bool = False, capturable: bool = False,
                 foreach: Optional[bool] = None, maximize: bool = False, differentiable: bool = False):
        check_non_negative(lr=lr, epsilon=eps, momentum=momentum, weight_decay=weight_decay, alpha=alpha)
        refuse_flags(capturable=capturable, differentiable=differentiable)
        defaults = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                        centered=centered, maximize=maximize, capturable=capturable, foreach=foreach,
                        differentiable=differentiable)
        super().__init__(params, defaults)

    def update(self, param: torch.Tensor, grad: torch.Tensor, state: Dict[str, Any], group: Dict[str, Any]) -> None:
        alpha, momentum = group["alpha"], group["momentum"]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["square_avg"] = torch.zeros_like(param)
            if momentum > 0:
                state["momentum_buffer"] = torch.zeros_like(param)
            if group["centered"]:
                state["grad_avg"] = torch.zeros_like(param)
        next_step(state)
        grad = l2_regularised(grad, param, group["maximize"], group["weight_decay"])

        square_avg = state["square_avg"]
        square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        if group["centered"]:
            grad_avg = state["grad_avg"]
            grad_avg.lerp_(grad, 1 - alpha)
            denom = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_().add_(group["eps"])
        else:
            denom = square_avg.sqrt().add_(group["eps"])

        lr = float(group["lr"])
        if momentum > 0:
            buf = state["momentum_buffer"]
            buf.mul_(momentum).addcdiv_(grad, denom)
            param.add_(buf, alpha=-lr)
        else:
            param.addcdiv_(grad, denom, value=-lr)
