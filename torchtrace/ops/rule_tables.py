"""Build Function classes from one line of math: most pointwise rules are data, not code."""
import dis
import inspect
import sys
from typing import Any, Callable, Optional, Sequence

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


def reads(fn: Callable, *names: str) -> Sequence[bool]:
    """Does fn's code read each of these parameters? A rule saves only what its gradient reads, so an in-place
    change of a tensor it does not need stays allowed (as in torch)."""
    try:
        loaded = {ins.argval for ins in dis.get_instructions(fn) if ins.opname.startswith("LOAD_")}
    except TypeError:  # not Python code (a builtin, a partial): assume it reads everything
        return [True] * len(names)
    return [name in loaded for name in names]


def unary(name: str, targets: Sequence[Callable], math: str, grad: Callable) -> type:
    """Rule for y = f(x, *options); grad(g, x, y) is the vector-Jacobian product (x, y saved if it reads them)."""
    op = targets[0]
    keep_x, keep_y = reads(grad, *list(inspect.signature(grad).parameters)[1:3])

    def forward(ctx: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        y = op(x, *args, **kwargs)
        ctx.save_for_backward(x if keep_x else None, y if keep_y else None)
        return y

    def backward(ctx: Any, g: Any) -> Any:
        x, y = ctx.saved_tensors
        return grad(g, x, y)

    return make_rule(name, math, forward, backward, targets)


def binary(name: str, targets: Sequence[Callable], math: str, grad_a: Callable, grad_b: Callable,
           save_output: bool = False) -> type:
    """Rule for z = f(a, b); grad_a(g, a, b, z) and grad_b(g, a, b, z) are computed only when needed.

    a, b and z are saved only when a gradient that is needed reads them (z only with save_output=True): a saved
    tensor makes a later in-place change of it an error, as in torch, and one that is not saved does not.
    """
    op = targets[0]
    names = list(inspect.signature(grad_a).parameters)[1:4]
    reads_a, reads_b = reads(grad_a, *names), reads(grad_b, *list(inspect.signature(grad_b).parameters)[1:4])

    def forward(ctx: Any, a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        z = op(a, b, *args, **kwargs)
        need_a, need_b = ctx.needs_input_grad[:2]
        keep = [(need_a and by_a) or (need_b and by_b) for by_a, by_b in zip(reads_a, reads_b)]
        ctx.save_for_backward(a if keep[0] else None, b if keep[1] else None, z if keep[2] and save_output else None)
        return z

    def backward(ctx: Any, g: Any) -> Any:
        a, b, z = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[:2]
        return (grad_a(g, a, b, z) if need_a else None, grad_b(g, a, b, z) if need_b else None)

    return make_rule(name, math, forward, backward, targets)


def reordered(name: str, rule: type, targets: Sequence[Callable], order: Sequence[int],
              math: Optional[str] = None) -> type:
    """A spelling that takes `rule`'s leading arguments in another order: the rule's k-th argument is this call's
    argument order[k] (x.where(c, y) is torch.where(c, x, y): order (1, 0, 2)); the gradients go back to match."""
    n = len(order)
    back = [order.index(k) for k in range(n)]  # this call's argument k is the rule's argument back[k]
    ctx_param, *params = inspect.signature(rule.forward).parameters.values()
    signature = inspect.Signature([ctx_param, *(params[k] for k in back), *params[n:]])

    def forward(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) < n:  # x.where(c, other=y): bind keywords and defaults to their places
            bound = signature.bind(ctx, *args, **kwargs)
            bound.apply_defaults()
            args, kwargs = bound.args[1:], bound.kwargs
        flags = ctx.needs_input_grad
        ctx.needs_input_grad = tuple(flags[k] for k in order) + tuple(flags[n:])  # the rule's order from now on
        return rule.forward(ctx, *[args[k] for k in order], *args[n:], **kwargs)

    forward.__signature__ = signature  # keyword tensors are routed by this call's parameter names

    def backward(ctx: Any, g: Any) -> Any:
        grads = rule.backward(ctx, g)
        return (*(grads[k] for k in back), *grads[n:])

    return make_rule(name, math or f"{rule.__doc__} (arguments reordered)", forward, backward, targets)


def reflected(name: str, rule: type, targets: Sequence[Callable]) -> type:
    """`2 - x` arrives as Tensor.__rsub__(x, 2): run `rule` on the swapped operands, swap the gradients back."""
    return reordered(name, rule, targets, (1, 0), f"{rule.__doc__} (operands swapped)")
