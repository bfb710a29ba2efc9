"""Build Function classes from one line of math: most pointwise rules are data, not code."""
import sys
from typing import Any, Callable, Sequence

from torchtrace.autograd.function import Function, register


def _caller_module() -> str:
    """The module that declared the rule (outside this file), so `python -m torchtrace ops` files it there."""
    frame = sys._getframe(1)
    while frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return frame.f_globals.get("__name__", __name__)


def make_rule(name: str, math: str, forward: Callable, backward: Callable, targets: Sequence[Callable]) -> type:
    """A Function subclass named `name` from a forward and a backward, registered for `targets`."""
    members = {"__doc__": math, "forward": staticmethod(forward), "backward": staticmethod(backward),
               "__module__": _caller_module()}
    return register(*targets, rule=type(name, (Function,), members))


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

    return make_rule(name, math, forward, backward, targets)


def binary(name: str, targets: Sequence[Callable], math: str, grad_a: Callable, grad_b: Callable,
           save_output: bool = False) -> type:
    """Rule for z = f(a, b); grad_a(g, a, b, z) and grad_b(g, a, b, z) are computed only when needed.

    z is saved (and passed, else None) only with save_output=True: a saved output makes a later in-place
    change of it an error, as in torch.
    """
    op = targets[0]

    def forward(ctx: Any, a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        z = op(a, b, *args, **kwargs)
        ctx.save_for_backward(a, b, z) if save_output else ctx.save_for_backward(a, b)
        return z

    def backward(ctx: Any, g: Any) -> Any:
        a, b, z = (*ctx.saved_tensors, None)[:3]
        need_a, need_b = ctx.needs_input_grad[:2]
        return (grad_a(g, a, b, z) if need_a else None, grad_b(g, a, b, z) if need_b else None)

    return make_rule(name, math, forward, backward, targets)


def reflected(name: str, rule: type, targets: Sequence[Callable]) -> type:
    """`2 - x` arrives as Tensor.__rsub__(x, 2): run `rule` on the swapped operands, swap the gradients back."""

    def forward(ctx: Any, a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        flags = ctx.needs_input_grad
        ctx.needs_input_grad = (flags[1], flags[0]) + flags[2:]  # the rule sees (b, a) from now on
        return rule.forward(ctx, b, a, *args, **kwargs)

    def backward(ctx: Any, g: Any) -> Any:
        grad_b, grad_a = rule.backward(ctx, g)[:2]
        return grad_a, grad_b

    return make_rule(name, f"{rule.__doc__} (operands swapped)", forward, backward, targets)
