"""Adam and AdamW: adaptive moment estimation, with L2 (Adam) or decoupled (AdamW) weight decay and AMSGrad."""
from typing import Any, Dict, List, Optional, Tuple

import torch

from torchtrace.optim.optimizer import (
    Optimizer,
    Params,
    as_scalar,
    check_non_negative,
    l2_regularised,
    next_step,
    refuse_flags,
    uses_foreach,
)


class Adam(Optimizer):
    r"""Adam (torch.optim.Adam), one parameter theta with gradient g at step t = 1, 2, ...:

        g <- -g                                   if maximize
        theta <- theta * (1 - lr * weight_decay)  if decoupled_weight_decay (AdamW)
        g <- g + weight_decay * theta             otherwise (L2 penalty)
        m <- beta1 * m + (1 - beta1) * g          first moment,  state['exp_avg']
        v <- beta2 * v + (1 - beta2) * g^2        second moment, state['exp_avg_sq']
        v <- v_max = max(v_max, v)                if amsgrad,    state['max_exp_avg_sq']
        theta <- theta - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

    `update` is that rule for one parameter; `update_all` runs the same steps for all of a group's parameters at
    once with torch's multi-tensor kernels where torch does (CUDA by default, or foreach=True).
    """

    def __init__(self, params: Params, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, amsgrad: bool = False, *,
                 foreach: Optional[bool] = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused: Optional[bool] = None, decoupled_weight_decay: bool = False):
        if isinstance(lr, torch.Tensor) and foreach:
            raise ValueError("lr as a Tensor is not supported for capturable=False and foreach=True")
        check_non_negative(lr=lr, epsilon=eps, weight_decay=weight_decay)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:  # (step() would fail to unpack it)
            raise ValueError(f"Invalid betas: {betas!r}: a pair (beta1, beta2), as (0.9, 0.999)")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {beta}")
        if not any(all(isinstance(beta, kind) for beta in betas) for kind in (float, torch.Tensor)):
            raise ValueError("betas must be either both floats or both Tensors")
        for i, beta in enumerate(betas):
            if isinstance(beta, torch.Tensor) and foreach:
                raise ValueError(f"betas[{i}] as a Tensor is not supported for capturable=False and foreach=True")
        refuse_flags(capturable=capturable, differentiable=differentiable, fused=fused)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=foreach, decoupled_weight_decay=decoupled_weight_decay,
                        capturable=capturable, differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """After load_state_dict: the flags a checkpoint from an older torch lacks take their defaults, as torch's."""
        super().__setstate__(state)
        for group in self.param_groups:
            for flag in ("amsgrad", "maximize", "decoupled_weight_decay"):
                group.setdefault(flag, False)
            for p in group["params"]:  # a checkpoint that kept the step count as a number: a 0-d tensor, as torch
                values = self.state.get(p)
                if values and not torch.is_tensor(values["step"]):
                    values["step"] = torch.tensor(float(values["step"]))

    @staticmethod
    def first_state(param: torch.Tensor, state: Dict[str, Any], group: Dict[str, Any]) -> None:
        """t = 0, m = v (= v_max) = 0, on a parameter's first step."""
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(param)
            state["exp_avg_sq"] = torch.zeros_like(param)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(param)

    def update(self, param: torch.Tensor, grad: torch.Tensor, state: Dict[str, Any], group: Dict[str, Any]) -> None:
        # a tensor lr stays one: torch computes lr / (1 - beta1^t) and 1 - lr wd in its dtype
        lr, beta1, beta2 = map(as_scalar, (group["lr"], *group["betas"]))  # (a 1-element tensor: 0-d, as torch)
        weight_decay = group["weight_decay"]
        self.first_state(param, state, group)
        step = next_step(state)
        decoupled = group["decoupled_weight_decay"]
        grad = l2_regularised(grad, param, group["maximize"], 0 if decoupled else weight_decay)
        if decoupled and weight_decay != 0:
            param.mul_(1 - lr * weight_decay)

        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        if group["amsgrad"]:
            torch.maximum(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
            exp_avg_sq = state["max_exp_avg_sq"]

        step_size = lr / (1 - beta1**step)
        denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(group["eps"])
        param.addcdiv_(exp_avg, denom, value=-step_size)

    def update_all(self, params: List[torch.Tensor], grads: List[torch.Tensor], states: List[Dict[str, Any]],
                   group: Dict[str, Any]) -> None:
        """`update`'s steps, each for all the parameters at once (torch._foreach_*), where torch uses them."""
        if not params:  # no gradient in this group: nothing to do
            return None
        if not uses_foreach(group, params):
            return super().update_all(params, grads, states, group)
        if isinstance(group["lr"], torch.Tensor):
            raise RuntimeError("lr as a Tensor is not supported for capturable=False and foreach=True")
        lr, (beta1, beta2), weight_decay = group["lr"], group["betas"], group["weight_decay"]
        for param, state in zip(params, states):
            self.first_state(param, state, group)
        steps = [state["step"] for state in states]
        exp_avgs, exp_avg_sqs = [state["exp_avg"] for state in states], [state["exp_avg_sq"] for state in states]
        torch._foreach_add_(steps, 1)
        if group["maximize"]:
            grads = torch._foreach_neg(grads)
        if weight_decay != 0 and group["decoupled_weight_decay"]:
            torch._foreach_mul_(params, 1 - lr * weight_decay)
        elif weight_decay != 0:
            grads = torch._foreach_add(grads, params, alpha=weight_decay)
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
        if group["amsgrad"]:
            exp_avg_sqs = [state["max_exp_avg_sq"] for state in states]
            torch._foreach_maximum_(exp_avg_sqs, [state["exp_avg_sq"] for state in states])
        counts = [float(step) for step in steps]
        denoms = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denoms, [(1 - beta2**t) ** 0.5 for t in counts])
        torch._foreach_add_(denoms, group["eps"])
        torch._foreach_addcdiv_(params, exp_avgs, denoms, [(lr / (1 - beta1**t)) * -1 for t in counts])


class AdamW(Adam):
    r"""AdamW (torch.optim.AdamW): Adam with decoupled weight decay, theta <- theta * (1 - lr * weight_decay)
    before the Adam step instead of an L2 term in the gradient; weight_decay defaults to 1e-2."""

    def __init__(self, params: Params, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: Optional[bool] = None, capturable: bool = False, differentiable: bool = False,
                 fused: Optional[bool] = None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """After load_state_dict, as torch's AdamW: the decay stays decoupled, whatever the checkpoint says (an Adam's
        state_dict, or one older than the flag, would otherwise turn it into Adam's L2 penalty)."""
        super().__setstate__(state)
        for group in self.param_groups:
            group["decoupled_weight_decay"] = True
