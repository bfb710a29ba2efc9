"""Build Function classes from one line of math: most pointwise rules are data, not code."""
from typing import Any, Callable, Sequence

from torchtrace.autograd.function import Function, register


def unary(name: str, targets: Sequence[Callable], math: str, grad: Callable) -> type:
    """Rule for y = f(x, *options); grad(g, x, y) is the vector-Jacobian product."""
    op = targets[0]

    def forward(ctx: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        y = op(x, *args, **kwargs)
        ctx.save_for_backward(x, y)
        return y

    def backward(ctx: Any, g: Any) -> Any:
        x, y = ctx.saved_tensors
        return grad(g, x, y)

    rule = type(name, (Function,), {"__doc__": math, "forward": staticmethod(forward), "backward": staticmethod(backward)})
    return register(*targets, rule=rule)


def binary(name: str, targets: Sequence[Callable], math: str, grad_a: Callable, grad_b: Callable) -> type:
    """Rule for z = f(a, b); grad_a(g, a, b, z) and grad_b(g, a, b, z) are computed only when needed."""
    op = targets[0]

    def forward(ctx: Any, a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        z = op(a, b, *args, **kwargs)
        ctx.save_for_backward(a, b, z)
        return z

    def backward(ctx: Any, g: Any) -> Any:
        a, b, z = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[:2]
        return (grad_a(g, a, b, z) if need_a else None, grad_b(g, a, b, z) if need_b else None)

    rule = type(name, (Function,), {"__doc__": math, "forward": staticmethod(forward), "backward": staticmethod(backward)})
    return register(*targets, rule=rule)


def reflected(name: str, rule: type, targets: Sequence[Callable]) -> type:
    """`2 - x` arrives as Tensor.__rsub__(x, 2): run `rule` on the swapped operands, swap the gradients back."""

    def forward(ctx: Any, a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        return rule.forward(ctx, b, a, *args, **kwargs)

    def backward(ctx: Any, g: Any) -> Any:
        ctx.needs_input_grad = ctx.needs_input_grad[1::-1]
        grad_b, grad_a = rule.backward(ctx, g)[:2]
        return grad_a, grad_b

    doc = f"{rule.__doc__} (operands swapped)"
    swapped = type(name, (Function,), {"__doc__": doc, "forward": staticmethod(forward), "backward": staticmethod(backward)})
    return register(*targets, rule=swapped)
