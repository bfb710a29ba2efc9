"""Leaky ReLUs whose negative slope is not a fixed option: learned (PReLU) or random (RReLU).

F.prelu arrives as torch.prelu; its weight is a tensor of 1 slope (shared) or C slopes (one per channel,
dim 1 of the input), and gets a gradient. F.rrelu in training draws one slope per non-positive element,
uniformly in [lower, upper], with torch's own generator: forward runs torch's rrelu on a tensor of
+-1 with x's sign pattern (x <= 0 -> -1), which makes exactly the draws torch makes for x, and reads the
slopes back. So after the same torch.manual_seed both draw the same slopes, and backward uses them.
In eval the slope is (lower + upper) / 2, as F.leaky_relu.
"""
import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.nn.module import Module
from torchtrace.ops.input_in_backward import reading_input


def _channel_shape(weight: torch.Tensor, x: torch.Tensor) -> list:
    """The shape that broadcasts prelu's weight over x: a scalar, or C slopes along dim 1."""
    return [] if weight.numel() == 1 else [-1 if d == 1 else 1 for d in range(x.dim())]


@register(torch.prelu, torch.Tensor.prelu)
class Prelu(Function):
    """y = x if x > 0 else w x  ->  dy/dx = 1 if x > 0 else w,  dy/dw = 0 if x > 0 else x (summed over w's uses)"""

    @staticmethod
    def forward(ctx, input, weight):
        ctx.save_for_backward(input, weight)
        return torch.prelu(input, weight)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        w = weight.reshape(_channel_shape(weight, x))
        positive = x > 0
        need_x, need_w = ctx.needs_input_grad[:2]
        grad_x = reading_input(torch.where(positive, g, g * w), x) if need_x else None
        grad_w = None
        if need_w:
            per_element = torch.where(positive, 0.0, x * g)
            dims = [d for d in range(x.dim()) if weight.numel() == 1 or d != 1]
            grad_w = (per_element.sum(dims) if dims else per_element).reshape(weight.shape)
        return grad_x, grad_w


@register(F.rrelu)
class Rrelu(Function):
    """y = x if x > 0 else r x  ->  dx = g (1 if x > 0 else r), with the very r of forward: r ~ U(lower, upper) per
    element in training, (lower + upper) / 2 in eval"""

    draws_random = True

    @staticmethod
    def forward(ctx, input, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False, generator=None):
        mean_slope = (lower + upper) / 2
        if training:
            signs = torch.where(input <= 0, -1.0, 1.0).to(input.dtype)
            kwargs = {} if generator is None else {"generator": generator}
            slope = torch.rrelu(signs, lower, upper, True, **kwargs).abs()  # torch's draws, for x <= 0 only
            y = input * slope
            if upper - lower <= 1e-6:  # torch's backward then uses the fixed slope, as in eval
                slope = torch.where(input > 0, 1.0, torch.full_like(input, mean_slope))  # in input's dtype
        else:
            y = torch.rrelu(input, lower, upper, False)  # torch's checks of the bounds, then leaky_relu(mean_slope)
            slope = torch.where(input > 0, 1.0, torch.full_like(input, mean_slope))  # in input's dtype
        ctx.save_for_backward(slope, input)  # (input: read by a create_graph backward, as torch's kernel reads it)
        return y

    @staticmethod
    def backward(ctx, g):
        slope, x = ctx.saved_tensors
        return reading_input(g * slope, x)


@register(torch.rrelu)
class TorchRrelu(Rrelu):
    """torch.rrelu(x, lower, upper, training): y = x if x > 0 else r x  ->  dx = g (1 if x > 0 else r), as F.rrelu"""

    @staticmethod
    def forward(ctx, input, lower=1.0 / 8, upper=1.0 / 3, training=False, generator=None):
        return Rrelu.forward(ctx, input, lower, upper, training, generator=generator)


class PReLU(Module, torch.nn.PReLU):
    """x if x > 0 else a x, with a learned slope a (one, or one per channel)."""


class RReLU(Module, torch.nn.RReLU):
    """x if x > 0 else r x, r random in [lower, upper] in train(), (lower + upper) / 2 in eval()."""
