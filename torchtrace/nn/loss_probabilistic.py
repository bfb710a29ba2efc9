"""Negative log-likelihood losses of probability distributions: Poisson and Gaussian.

  poisson_nll_loss: l = e^x - t x (log_input), or x - t log(x + eps); full adds Stirling's approximation of
                    log(t!), t log t - t + log(2 pi t) / 2, where t > 1 (torch masks it elsewhere).
  gaussian_nll_loss: l = (log v + (x - t)^2 / v) / 2 (+ log(2 pi) / 2 with full), v = max(var, eps). torch
                    clamps a clone of var in place under no_grad, so var's gradient is computed at the clamped
                    v but passes the clamp unmasked; so does ours. var may have the input's shape, lack its last
                    dim, or have size 1 in one dim (homoscedastic), or be a float.
Both rules give input, target and var their gradients (torch's composites do too).
"""
import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.nn.distance import clamped_value
from torchtrace.nn.loss import _reduction, _scale, aten_twin
from torchtrace.nn.module import Module


def _count_scale(g: torch.Tensor, reduction: str, *tensors: torch.Tensor) -> torch.Tensor:
    """d(reduced)/d(l) for an elementwise loss over the broadcast of `tensors` (a Python number broadcasts too)."""
    shape = torch.broadcast_shapes(*(t.shape for t in tensors if isinstance(t, torch.Tensor)))
    return _scale(g, reduction, max(shape.numel(), 1))


@register(F.poisson_nll_loss)
class PoissonNll(Function):
    """l = e^x - t x  ->  dl/dx = e^x - t, dl/dt = -x;   log_input=False: l = x - t log(x + eps)
    ->  dl/dx = 1 - t / (x + eps), dl/dt = -log(x + eps);   full: dl/dt += log t + 1 / (2 t) where t > 1"""

    @staticmethod
    def forward(ctx, input, target, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None,
                reduction="mean"):
        ctx.log_input, ctx.full, ctx.eps = log_input, full, eps
        ctx.reduction = _reduction(size_average, reduce, reduction)
        ctx.save_for_backward(input, target)
        return F.poisson_nll_loss(input, target, log_input, full, eps=eps, reduction=ctx.reduction)

    @staticmethod
    def backward(ctx, g):
        x, t = ctx.saved_tensors
        s = _count_scale(g, ctx.reduction, x, t)
        need_x, need_t = ctx.needs_input_grad[:2]
        if ctx.log_input:
            grad_x, grad_t = (torch.exp(x) - t) if need_x else None, -x if need_t else None
        else:
            grad_x = 1 - t / (x + ctx.eps) if need_x else None
            grad_t = -torch.log(x + ctx.eps) if need_t else None
        if need_t and ctx.full:
            counted = t > 1
            safe = torch.where(counted, t, 1.0)  # keeps log and 1/t finite where the term is masked
            grad_t = grad_t + (torch.log(safe) + 0.5 / safe) * counted
        return (grad_x * s if need_x else None), (grad_t * s if need_t else None)


aten_twin("TorchPoissonNll", PoissonNll, torch.poisson_nll_loss, "input target log_input full eps reduction")


def _var_for_input(var: torch.Tensor, input: torch.Tensor) -> tuple:
    """(var shaped to broadcast against input, whether torch unsqueezed its last dim)."""
    if var.shape != input.shape and var.shape == input.shape[:-1]:
        return var.unsqueeze(-1), True
    return var, False


@register(F.gaussian_nll_loss)
class GaussianNll(Function):
    """l = (log v + d^2 / v) / 2  ->  dx = g d / v,  dt = -g d / v,  dvar = g (1 / v - d^2 / v^2) / 2;
    d = x - t, v = max(var, eps);  x = the predicted mean, var = the predicted variance, t = the target"""

    @staticmethod
    def forward(ctx, input, target, var, full=False, eps=1e-6, reduction="mean"):
        ctx.eps, ctx.reduction = eps, reduction
        ctx.var_value = None if isinstance(var, torch.Tensor) else float(var)  # a float var is a constant
        ctx.save_for_backward(input, target, var if ctx.var_value is None else None)
        return F.gaussian_nll_loss(input, target, var, full, eps, reduction)

    @staticmethod
    def backward(ctx, g):
        x, t, var = ctx.saved_tensors
        if var is None:
            v, unsqueezed = torch.full_like(x, ctx.var_value), False
        else:
            v, unsqueezed = _var_for_input(var, x)
        v = clamped_value(v, ctx.eps)
        d = x - t
        s = _count_scale(g, ctx.reduction, x, t, v)
        need_x, need_t, need_var = ctx.needs_input_grad[:3]
        grad_x = d / v * s
        grad_var = None
        if need_var:
            grad_var = 0.5 * (1 / v - d * d / v / v) * s  # (d^2/v)/v: v^2 of float16 underflows below 2e-4
            if unsqueezed:
                grad_var = grad_var.sum_to_size(var.unsqueeze(-1).shape).squeeze(-1)
        return (grad_x if need_x else None), (-grad_x if need_t else None), grad_var


class PoissonNLLLoss(Module, torch.nn.PoissonNLLLoss):
    """Negative log-likelihood of a Poisson target given its (log-)rate."""


class GaussianNLLLoss(Module, torch.nn.GaussianNLLLoss):
    """Negative log-likelihood of a Gaussian target given its mean (input) and variance (var)."""
