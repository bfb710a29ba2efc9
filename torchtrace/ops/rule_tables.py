"""Build Function classes from one line of math: most pointwise rules are data, not code.

A table rule reads like a line of PyTorch's derivatives.yaml: the op, one gradient formula per input, and
`uses`, the names each formula reads. The formulas name the input x and the result y (one input), or the
inputs a, b and the result z (two inputs). A rule saves only what a needed gradient uses, so an in-place
change of a tensor no needed gradient reads stays allowed (as in torch); a test checks every declaration
against its formula (tests/ops/test_rule_tables.py).
"""
import inspect
import itertools
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from torchtrace.autograd.function import Function, register

NAMES = {1: ("x", "y"), 2: ("a", "b", "z")}  # what the formulas call the inputs, then the result


def make_rule(name: str, math: str, forward: Callable, backward: Callable, targets: Sequence[Callable],
              module: Optional[str] = None) -> type:
    """A Function subclass named `name` from a forward and a backward, registered for `targets`; filed under
    `module` (by default the module that defined forward) by `python -m torchtrace ops`."""
    members = {"__doc__": math, "forward": staticmethod(forward), "backward": staticmethod(backward),
               "__module__": module or forward.__module__}
    return register(*targets, rule=type(name, (Function,), members))


def table_rule(name: str, targets: Sequence[Callable], math: str, grads: Sequence[Callable],
               uses: Sequence[Sequence[str]], options: Optional[Dict[str, Any]] = None) -> type:
    """Rule for out = targets[0](*inputs, ...): grads[i](g, *inputs, out, **options) is input i's vector-Jacobian
    product, computed only when input i needs a gradient, and reads only the names uses[i].

    `options`: the op's options after its inputs, in positional order with their defaults; they reach the
    formulas as keywords (an `inplace` option is dropped: the dispatcher records inplace=True itself).
    Without `options`, extra arguments go to the op alone.
    """
    op, n = targets[0], len(grads)
    names = NAMES[n]
    unknown = {u for used in uses for u in used} - set(names)
    if len(uses) != n or unknown:
        raise ValueError(f"{name}: uses must name, for each of the {n} gradients, some of {names} (got {uses})")
    reads = [[k in used for k in names] for used in uses]
    keep = {needs: [any(need and read[k] for need, read in zip(needs, reads)) for k in range(n + 1)]
            for needs in itertools.product((False, True), repeat=n)}  # what to save, by which inputs need a gradient
    option_names = list(options or ())

    def forward(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        if options is None:
            out = op(*args, **kwargs)
        else:
            ctx.options = {**options, **dict(zip(option_names, args[n:])), **kwargs}
            ctx.options.pop("inplace", None)
            out = op(*args[:n], **ctx.options)
        saving = keep[ctx.needs_input_grad[:n]]
        ctx.save_for_backward(*[value if save else None for value, save in zip((*args[:n], out), saving)])
        return out

    def backward(ctx: Any, g: Any) -> Tuple[Any, ...]:
        saved = ctx.saved_tensors
        extra = ctx.options if options is not None else {}
        return tuple(grad(g, *saved, **extra) if need else None for grad, need in zip(grads, ctx.needs_input_grad))

    parameters = [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in ("ctx", *names[:n])]
    forward.__signature__ = inspect.Signature([*parameters, inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                                               inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])
    rule = make_rule(name, math, forward, backward, targets, module=grads[0].__module__)
    rule.formulas, rule.uses, rule.options = tuple(grads), tuple(tuple(u) for u in uses), dict(options or {})
    return rule


def unary(name: str, targets: Sequence[Callable], math: str, grad: Callable, uses: Sequence[str]) -> type:
    """Rule for y = f(x, ...); grad(g, x, y) is the vector-Jacobian product and reads only `uses` (of x, y)."""
    return table_rule(name, targets, math, [grad], [uses])


def binary(name: str, targets: Sequence[Callable], math: str, grad_a: Callable, grad_b: Callable,
           uses: Tuple[Sequence[str], Sequence[str]]) -> type:
    """Rule for z = f(a, b, ...); grad_a(g, a, b, z) and grad_b(g, a, b, z) read only uses[0] and uses[1]."""
    return table_rule(name, targets, math, [grad_a, grad_b], uses)


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

    return make_rule(name, math or f"{rule.__doc__} (arguments reordered)", forward, backward, targets,
                     module=rule.__module__)


def reflected(name: str, rule: type, targets: Sequence[Callable]) -> type:
    """`2 - x` arrives as Tensor.__rsub__(x, 2): run `rule` on the swapped operands, swap the gradients back."""
    return reordered(name, rule, targets, (1, 0), f"{rule.__doc__} (operands swapped)")
