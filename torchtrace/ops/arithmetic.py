"""Gradient rules for + - * / ** and their reflected forms (2 - x, 1 / x, 2 ** x)."""
import torch

from torchtrace.autograd.function import Function, register
from torchtrace.ops.rule_tables import binary, reflected, unary

T = torch.Tensor


@register(torch.add, T.add, T.__add__, T.__radd__)
class Add(Function):
    """z = a + alpha*b  ->  dz/da = 1, dz/db = alpha"""

    @staticmethod
    def forward(ctx, a, b, *, alpha=1):
        ctx.alpha = alpha
        return torch.add(a, b) if alpha == 1 else torch.add(a, b, alpha=alpha)

    @staticmethod
    def backward(ctx, g):
        return g, g if ctx.alpha == 1 else g * ctx.alpha


@register(torch.sub, torch.subtract, T.sub, T.subtract, T.__sub__)
class Sub(Function):
    """z = a - alpha*b  ->  dz/da = 1, dz/db = -alpha"""

    @staticmethod
    def forward(ctx, a, b, *, alpha=1):
        ctx.alpha = alpha
        return torch.sub(a, b) if alpha == 1 else torch.sub(a, b, alpha=alpha)

    @staticmethod
    def backward(ctx, g):
        return g, -g if ctx.alpha == 1 else g * -ctx.alpha


reflected("Rsub", Sub, [T.__rsub__, torch.rsub])

@register(torch.mul, torch.multiply, T.mul, T.multiply, T.__mul__, T.__rmul__)
class Mul(Function):
    """z = a * b  ->  dz/da = b, dz/db = a   (each operand is saved only if the other needs its gradient)"""

    @staticmethod
    def forward(ctx, a, b):
        need_a, need_b = ctx.needs_input_grad[:2]
        ctx.save_for_backward(b if need_a else None, a if need_b else None)
        return torch.mul(a, b)

    @staticmethod
    def backward(ctx, g):
        b, a = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[:2]
        return (g * b if need_a else None), (g * a if need_b else None)


@register(torch.div, torch.divide, torch.true_divide, T.div, T.divide, T.true_divide, T.__truediv__)
class Div(Function):
    """z = a / b  ->  dz/da = 1/b, dz/db = -a/b^2 = -(a/b)/b   (zero with a rounding_mode: floor/trunc are flat)"""

    @staticmethod
    def forward(ctx, a, b, *, rounding_mode=None):
        ctx.rounded = rounding_mode is not None
        ctx.save_for_backward(a if ctx.needs_input_grad[1] and not ctx.rounded else None, b)
        return torch.div(a, b, rounding_mode=rounding_mode)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        if ctx.rounded:  # zeros even where g is inf or NaN, as torch
            zeros = torch.zeros_like(g)
            return zeros, zeros if isinstance(b, torch.Tensor) else None
        need_a, need_b = ctx.needs_input_grad[:2]
        return (g / b if need_a else None), (-g * (a / b / b) if need_b else None)


@register(T.__rdiv__, T.__rtruediv__)
class Rdiv(Function):
    """z = c / x, computed as torch does: r = 1/x, z = r c  ->  dz/dx = -c r^2, dz/dc = r

    The rule of Tensor.__rtruediv__ called by name; `c / x` on a tracer records torch's two nodes, a Reciprocal and a
    Mul (tracer.__rtruediv__)."""

    @staticmethod
    def forward(ctx, x, c):
        ctx.save_for_backward(x, c if ctx.needs_input_grad[0] else None)
        return torch.reciprocal(x) * c

    @staticmethod
    def backward(ctx, g):
        x, c = ctx.saved_tensors
        need_x, need_c = ctx.needs_input_grad[:2]
        r = torch.reciprocal(x)  # recomputed from the saved input, so a second derivative sees it depend on x
        return (-(g * c) * (r * r) if need_x else None), (g * r if need_c else None)


def _pow_grad_base(g, a, b, z):
    """d(a^b)/da = b * a^(b-1), defined as 0 where b == 0 (even where g is inf or NaN, as torch)."""
    if isinstance(b, torch.Tensor):  # torch's order: g (b a^(b-1)) (2 * 1e308 overflows before g scales it); the
        zero = b == 0  # factor is masked too (0 * 0^-1 is NaN), so the formula read as a linear map of g has no NaN
        return torch.where(zero, 0.0, g * torch.where(zero, 0.0, b * torch.pow(a, b - 1)))  # (forward mode)
    return torch.zeros_like(g) if b == 0 else g * (b * torch.pow(a, b - 1))


def _pow_grad_exponent(g, a, b, z):
    """d(a^b)/db = a^b * ln a, with a^b ln a := 0 where a == 0 and b >= 0 (NaN for a negative base).

    g multiplies outside the mask, as in torch: an inf or NaN g still gives NaN at a == 0. The log is taken in the
    result's dtype, as torch promotes the base first (a bfloat16 or integer base: its log in float32 or float64)."""
    base = a.to(z.dtype) if isinstance(a, torch.Tensor) else torch.as_tensor(a, dtype=z.dtype, device=z.device)
    return g * torch.where((base == 0) & (b >= 0), 0.0, z * torch.log(base))


Pow = binary("Pow", [torch.pow, T.pow, T.__pow__],
       "z = a ^ b  ->  dz/da = b a^(b-1), dz/db = a^b ln a",
       _pow_grad_base, _pow_grad_exponent, uses=(("a", "b"), ("a", "b", "z")))

reflected("Rpow", Pow, [T.__rpow__])

unary("Neg", [torch.neg, torch.negative, T.neg, T.negative, T.__neg__], "y = -x  ->  dy/dx = -1",
      lambda g, x, y: -g, uses=())
unary("Reciprocal", [torch.reciprocal, T.reciprocal], "y = 1/x  ->  dy/dx = -y^2",
      lambda g, x, y: -g * (y * y), uses=("y",))  # torch's order: -g (y y)
