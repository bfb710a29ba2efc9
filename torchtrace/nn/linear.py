"""Linear layers: y = x W^T + b (F.linear) and y_k = x1^T A_k x2 + b_k (F.bilinear), their gradients and modules.

Batch dimensions: the bias gradient is g itself, which the engine sums back to the bias's shape.
"""
import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.nn.module import Module


@register(F.linear)  # F.linear is torch._C._nn.linear, which nn.Linear calls too
class LinearFunction(Function):
    """y = x W^T + b  ->  dy/dx = g W,  dy/dW = g^T x (summed over the batch),  dy/db = g

    x is saved only if W needs its gradient, W only if x does, as torch does."""

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        need_x, need_w = ctx.needs_input_grad[:2]
        ctx.weight_shape = weight.shape
        ctx.save_for_backward(input if need_w else None, weight if need_x else None)
        return F.linear(input, weight, bias)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_b = g if need_b else None
        if len(ctx.weight_shape) == 1:  # a vector weight: y = x . w, one number per row
            g = g.unsqueeze(-1)
            return (g * w if need_x else None), (g * x if need_w else None), grad_b
        grad_x = g @ w if need_x else None
        if not need_w:
            return grad_x, None, grad_b
        if x.dim() == 2:  # a batch of rows: dW = g^T x as it is
            return grad_x, g.t() @ x, grad_b
        n_out, n_in = ctx.weight_shape
        rows = x.numel() // n_in if n_in else g.numel() // n_out if n_out else 0  # no -1: 0-wide
        return grad_x, g.reshape(rows, n_out).t() @ x.reshape(rows, n_in), grad_b


@register(torch.bilinear)  # F.bilinear is torch.bilinear
class BilinearFunction(Function):
    """y_k = x1^T A_k x2 + b_k  ->  dy/dx1 = sum_k g_k A_k x2,  dy/dx2 = sum_k g_k A_k^T x1,  dy/dA_k = g_k x1 x2^T,
    dy/db = g"""

    @staticmethod
    def forward(ctx, input1, input2, weight, bias=None):
        ctx.save_for_backward(input1, input2, weight)
        return torch.bilinear(input1, input2, weight, bias)

    @staticmethod
    def backward(ctx, g):
        x1, x2, a = ctx.saved_tensors
        need_x1, need_x2, need_a, need_b = ctx.needs_input_grad[:4]
        grad_x1 = torch.einsum("...k,kij,...j->...i", g, a, x2) if need_x1 else None
        grad_x2 = torch.einsum("...k,kij,...i->...j", g, a, x1) if need_x2 else None
        grad_a = torch.einsum("...k,...i,...j->kij", g, x1, x2) if need_a else None
        return grad_x1, grad_x2, grad_a, g if need_b else None


class Linear(Module, torch.nn.Linear):
    """torch.nn.Linear with tracer parameters: the same initialisation, so the same seed gives the same weights."""

    def original_repr(self) -> str:
        return f"Linear layer ({self.in_features} X {self.out_features})"


class Bilinear(Module, torch.nn.Bilinear):
    """torch.nn.Bilinear with tracer parameters: y = x1^T A x2 + b."""
