"""Build Function classes from one line of math: most rules are data, not code.

A table rule reads like a line of PyTorch's derivatives.yaml: the op, one gradient formula per input, and
`uses`, the names each formula reads. The formulas name the input x and the result y (one input), or the
inputs a, b and the result z (two inputs); `x.meta` (`a.meta`, `b.meta`) is an input's shape, dtype and device
without its values. A rule saves only what a needed gradient uses, so an in-place change of a tensor no needed
gradient reads stays allowed (as in torch); a test checks every declaration against its formula
(tests/ops/test_rule_tables.py). What a hand-written forward would do besides calling the op is an option of
the builder: keep the op's options (dim, keepdim, ...) for the formulas, keep an input's shape or dtype to
reshape or cast the gradient back, save the result, refuse an input the formulas do not cover (`check`).
"""
import inspect
import itertools
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from torchtrace.autograd.function import Function, register

NAMES = {1: ("x", "y"), 2: ("a", "b", "z")}  # what the formulas call the inputs, then the result
AS_CALLED = "as called"  # options=AS_CALLED: the formulas get the op's other arguments as the call passed them


class Meta(NamedTuple):
    """What a formula may read of an input it does not save (`uses=("x.meta",)`): no values, so nothing is held."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device


def make_rule(name: str, math: str, forward: Callable, backward: Callable, targets: Sequence[Callable],
              module: Optional[str] = None) -> type:
    """A Function subclass named `name` from a forward and a backward, registered for `targets`; filed under
    `module` (by default the module that defined forward) by `python -m torchtrace ops`."""
    members = {"__doc__": math, "forward": staticmethod(forward), "backward": staticmethod(backward),
               "__module__": module or forward.__module__}
    return register(*targets, rule=type(name, (Function,), members))


def _what_to_keep(n: int, uses: Sequence[Sequence[str]], suffix: str) -> Dict[Tuple[bool, ...], list]:
    """For each combination of inputs needing a gradient: which of NAMES[n] (+ suffix) a needed formula reads."""
    reads = [[k + suffix in used for k in NAMES[n]] for used in uses]
    return {needs: [any(need and read[k] for need, read in zip(needs, reads)) for k in range(n + 1)]
            for needs in itertools.product((False, True), repeat=n)}


def _call_options(args: Sequence[Any], kwargs: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any]]:
    """The op's other arguments as called, frozen: a 0-d tensor (narrow's start) becomes its number, now; any other
    tensor lends only its shape or dtype (view_as(other), to(other)) and is kept as None."""
    def frozen(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return a.item() if a.dim() == 0 else None
        return a

    return tuple(frozen(a) for a in args), {k: frozen(v) for k, v in kwargs.items()}


def _by_position(args: tuple, kwargs: Dict[str, Any], input_names: Sequence[str]) -> Tuple[tuple, Dict[str, Any]]:
    """The inputs the call passed by keyword, moved to their positions after those it passed by position."""
    kwargs = dict(kwargs)
    moved = [kwargs.pop(name) for name in input_names[len(args):] if name in kwargs]
    return (*args, *moved), kwargs


def _signature(inputs: Sequence[str], options: Union[None, str, Dict[str, Any]]) -> inspect.Signature:
    """forward's signature as callers see it (keyword arguments are routed, and checked, by these names): ctx, the
    inputs, then the named options with their defaults, or whatever the call passes."""
    P = inspect.Parameter
    parameters = [P(name, P.POSITIONAL_OR_KEYWORD) for name in ("ctx", *inputs)]
    if isinstance(options, dict):
        parameters += [P(name, P.POSITIONAL_OR_KEYWORD, default=default) for name, default in options.items()]
    else:
        parameters.append(P("args", P.VAR_POSITIONAL))
    return inspect.Signature([*parameters, P("kwargs", P.VAR_KEYWORD)])


def table_rule(name: str, targets: Sequence[Callable], math: str, grads: Sequence[Callable],
               uses: Sequence[Sequence[str]], options: Union[None, str, Dict[str, Any]] = None,
               op: Optional[Callable] = None, check: Optional[Callable] = None,
               inputs: Optional[Sequence[str]] = None, module: Optional[str] = None) -> type:
    """Rule for out = op(*inputs, ...) (op: targets[0] unless given): grads[i](g, *inputs, out, ...) is input i's
    vector-Jacobian product, computed only when input i needs a gradient, and reads only the names uses[i].

    `options`, the op's arguments after its inputs:
      None       they go to the op alone;
      a dict     the op's named options in positional order with their defaults (dim, keepdim, dtype): they reach
                 the formulas as keywords (an `inplace` option is dropped: the dispatcher records inplace=True);
      AS_CALLED  they reach the formulas as the call passed them, after the values (view(2, 3): grad(g, x, y, 2, 3)).
    `check(*inputs)` runs before the op (e.g. refuses complex inputs); `inputs` names forward's tensor parameters
    for keyword routing (default x / a, b); `module` files the rule (default: the module of the first formula).
    """
    op, n = op or targets[0], len(grads)
    names = NAMES[n]
    known = {*names, *(k + ".meta" for k in names[:n])}
    unknown = {u for used in uses for u in used} - known
    if len(uses) != n or unknown:
        raise ValueError(f"{name}: uses must name, for each of the {n} gradients, some of {sorted(known)} (got {uses})")
    keep, keep_meta = _what_to_keep(n, uses, ""), _what_to_keep(n, uses, ".meta")
    keep = {needs: saving if any(saving) else None for needs, saving in keep.items()}  # None: nothing to save
    keep_meta = {needs: kept if any(kept) else None for needs, kept in keep_meta.items()}
    option_names = list(options) if isinstance(options, dict) else []
    input_names = tuple(inputs or names[:n])

    def forward(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) < n:  # torch.fill(x, value=2.0): an input passed by keyword takes its place
            args, kwargs = _by_position(args, kwargs, input_names)
        if check is not None:
            check(*args[:n])
        if isinstance(options, dict):
            ctx.options = {**options, **dict(zip(option_names, args[n:])), **kwargs}
            ctx.options.pop("inplace", None)
            out = op(*args[:n], **ctx.options)
        else:
            if options == AS_CALLED:
                ctx.args, ctx.kwargs = _call_options(args[n:], kwargs)  # ctx.args: what a trace line shows
            out = op(*args, **kwargs)
        needs = ctx.needs_input_grad[:n]
        saving = keep[needs]
        if saving is not None:  # nothing saved: a second backward through this node is no error (as in torch)
            ctx.save_for_backward(*[value if save else None for value, save in zip((*args[:n], out), saving)])
        metas = keep_meta[needs]
        if metas is not None:
            ctx.metas = [Meta(t.shape, t.dtype, t.device) if meta else None for t, meta in zip(args[:n], metas)]
        return out

    def backward(ctx: Any, g: Any) -> Tuple[Any, ...]:
        needs = ctx.needs_input_grad
        values = list(ctx.saved_tensors) if keep[needs[:n]] is not None else [None] * (n + 1)
        for k, meta in enumerate(getattr(ctx, "metas", ())):
            if meta is not None and values[k] is None:
                values[k] = meta
        if options == AS_CALLED:
            args, kwargs = ctx.args, ctx.kwargs
        else:
            args, kwargs = (), ctx.options if isinstance(options, dict) else {}
        computed = [grad(g, *values, *args, **kwargs) if need else None for grad, need in zip(grads, needs)]
        return (*computed, *[None] * len(args))  # the other arguments (view_as's `other`) get none

    forward.__signature__ = _signature(input_names, options)
    rule = make_rule(name, math, forward, backward, targets, module=module or grads[0].__module__)
    rule.formulas, rule.uses = tuple(grads), tuple(tuple(u) for u in uses)
    rule.options = dict(options) if isinstance(options, dict) else options
    if options == AS_CALLED:  # the other arguments reach the formulas as called and get no gradient (view_as's other)
        rule._tt_inputs = n
    return rule


def unary(name: str, targets: Sequence[Callable], math: str, grad: Callable, uses: Sequence[str],
          **builder: Any) -> type:
    """Rule for y = f(x, ...); grad(g, x, y) is the vector-Jacobian product and reads only `uses` (of x, y, x.meta).
    `builder`: table_rule's options, op, check, inputs, module."""
    return table_rule(name, targets, math, [grad], [uses], **builder)


def binary(name: str, targets: Sequence[Callable], math: str, grad_a: Callable, grad_b: Callable,
           uses: Tuple[Sequence[str], Sequence[str]], **builder: Any) -> type:
    """Rule for z = f(a, b, ...); grad_a(g, a, b, z) and grad_b(g, a, b, z) read only uses[0] and uses[1].
    `builder`: table_rule's options, op, check, inputs, module."""
    return table_rule(name, targets, math, [grad_a, grad_b], uses, **builder)


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
        ctx.needs_input_grad = tuple(flags[k] for k in order) + tuple(flags[n:])  # the rule's order while it runs
        try:
            return rule.forward(ctx, *[args[k] for k in order], *args[n:], **kwargs)
        finally:  # the ctx keeps the call's flags: a compiled statement's traced forward (which makes its Context
            ctx.needs_input_grad = flags  # from the call's mask and never replays this write) leaves the same ctx

    forward.__signature__ = signature  # keyword tensors are routed by this call's parameter names

    def backward(ctx: Any, g: Any) -> Any:
        flags = ctx.needs_input_grad
        ctx.needs_input_grad = tuple(flags[k] for k in order) + tuple(flags[n:])
        try:
            grads = rule.backward(ctx, g)
        finally:
            ctx.needs_input_grad = flags
        return (*(grads[k] for k in back), *grads[n:])

    return make_rule(name, math or f"{rule.__doc__} (arguments reordered)", forward, backward, targets,
                     module=rule.__module__)


def reflected(name: str, rule: type, targets: Sequence[Callable]) -> type:
    """`2 - x` arrives as Tensor.__rsub__(x, 2): run `rule` on the swapped operands, swap the gradients back."""
    math, gap, notes = (rule.__doc__ or "").partition("\n\n")  # the note joins the math, its first paragraph
    return reordered(name, rule, targets, (1, 0), f"{math} (operands swapped){gap}{notes}")
