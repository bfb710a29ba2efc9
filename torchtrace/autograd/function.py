"""Function (a forward/backward pair, its ctx a node.Context) and the rule registry: torch callable -> Function."""
import inspect
from typing import Any, Callable, Dict, List, Optional

import torch
from torch.overrides import handle_torch_function, has_torch_function

from torchtrace.autograd.node import Context
from torchtrace.errors import instantiated_function
from torchtrace.naming import callable_name

RULES: Dict[Callable, type] = {}  # torch callable -> the Function whose forward/backward it runs
INPLACE: Dict[Callable, tuple] = {}  # in-place twin (Tensor.add_, torch.relu_, F.elu_) -> (rule, out-of-place callable)
INPLACE_FLAG: Dict[Callable, int] = {}  # callable with an `inplace` parameter (F.relu) -> its position
# Rules shipped with torchtrace: their backward returns new tensors or views of its gradient, and keeps neither.
OUR_RULES = ("torchtrace.ops.", "torchtrace.nn.", "torchtrace.autograd.")


class Function:
    """Subclass with static `forward(ctx, *args)` and `backward(ctx, *grads)`; call with `.apply(...)`.

    `backward` returns one gradient per positional parameter of `forward` (None where there is none);
    a list parameter (as in `torch.cat`) gets a list of gradients.
    """

    @staticmethod
    def forward(ctx: Context, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("a Function must define forward(ctx, *args)")

    @staticmethod
    def backward(ctx: Context, *grads: Any) -> Any:
        raise NotImplementedError("a Function must define backward(ctx, *grads)")

    _tt_trusted = False  # one of OUR_RULES: the engine need not note what its backward receives or returns
    _tt_inputs: Optional[int] = None  # only the first this many arguments can get a gradient (view_as(other): other
    # lends its shape only, and joins no graph, as in torch); None: any argument can
    forward_when_not_recording = False  # forward runs (on a throwaway ctx) even when no gradient is recorded
    draws_random = False  # forward draws from torch's random generator: its in-place form must not draw twice
    several_views = False  # forward returns several views of one input (split, chunk, unbind): no in-place on them

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._tt_trusted = cls.__module__.startswith(OUR_RULES)  # each class its own flag: a user's subclass is not
        if "setup_context" in cls.__dict__ and "forward" in cls.__dict__:
            cls.forward = staticmethod(_with_setup_context(cls.forward, cls.setup_context))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise instantiated_function(type(self).__name__)

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        """Run forward; on tracers the call goes through the tracer's __torch_function__, which records it."""
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        tensors += [e for a in (*args, *kwargs.values()) if isinstance(a, (list, tuple)) for e in a
                    if isinstance(e, torch.Tensor)]
        if has_torch_function(tensors):
            return handle_torch_function(cls.apply, tensors, *args, **kwargs)
        ctx = Context(cls)  # plain tensors: an ordinary function call (one needs_input_grad flag per argument)
        ctx.needs_input_grad = ctx.needs_input_grad[:len(args) + len(kwargs)]
        return cls.forward(ctx, *args, **kwargs)

    @classmethod
    def parameter_names(cls) -> List[str]:
        """forward's parameters after ctx (kept on the class itself, so no cache outlives it)."""
        names = cls.__dict__.get("_param_names")
        if names is None:
            names = cls._param_names = list(inspect.signature(cls.forward).parameters)[1:]
        return names

    @classmethod
    def param_index(cls, name: str) -> int:
        """Position of forward's parameter `name` (so keyword tensors get their gradient routed)."""
        names = cls.parameter_names()
        if name in names:
            return names.index(name)
        if name in ("input", "self") and names:
            return 0
        raise TypeError(f"{cls.__name__}: cannot route the gradient of keyword argument '{name}'")


def _with_setup_context(forward: Callable, setup_context: Callable) -> Callable:
    """torch 2's style of Function, forward(*args) without ctx and setup_context(ctx, inputs, output), as the
    forward(ctx, *args) every rule has: inputs are the arguments with forward's defaults filled in, as torch's."""
    signature = inspect.signature(forward)

    def forward_with_ctx(ctx: Context, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        output = forward(*bound.args, **bound.kwargs)
        setup_context(ctx, bound.args, output)
        return output

    ctx_parameter = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_ONLY)
    forward_with_ctx.__signature__ = signature.replace(parameters=[ctx_parameter, *signature.parameters.values()])
    forward_with_ctx.__name__, forward_with_ctx.__doc__ = forward.__name__, forward.__doc__
    return forward_with_ctx


def register(*torch_callables: Callable, rule: Optional[type] = None) -> Any:
    """`register(torch.mul, Mul)` or `@register(torch.mul, torch.Tensor.mul)` above a Function class."""
    last = torch_callables[-1] if torch_callables else None
    if len(torch_callables) > 1 and isinstance(last, type) and issubclass(last, Function):
        *torch_callables, rule = torch_callables

    if not torch_callables or not all(callable(t) and not isinstance(t, (type, torch.nn.Module))
                                      for t in torch_callables):
        raise TypeError("tt.register takes the torch callables a rule is for (torch.mul, torch.Tensor.mul, ...), then "
                        f"the rule: register(torch.mul, Mul); got {', '.join(map(repr, torch_callables)) or 'none'}")

    def add(fn_class: type) -> type:
        if not (isinstance(fn_class, type) and issubclass(fn_class, Function)) or fn_class is Function:
            raise TypeError(f"tt.register: the rule must be a subclass of tt.Function with forward and backward, not "
                            f"{fn_class!r}")
        for target in torch_callables:
            RULES[target] = fn_class
            _note_inplace_forms(target, fn_class)
        return fn_class

    return add if rule is None else add(rule)


_NAMESPACES = {"torch.Tensor": torch.Tensor, "torch": torch, "torch.nn.functional": torch.nn.functional}


def _note_inplace_forms(func: Callable, rule: type) -> None:
    """x.add_(y), x **= y, torch.relu_(x), F.elu_(x): run `rule` out of place, then write x (as inplace=True does)."""
    owner, _, name = callable_name(func).rpartition(".")
    namespace = _NAMESPACES.get(owner)
    for spelling in {name, getattr(func, "__name__", name)}:  # Tensor.abs is Tensor.__abs__: pair abs_ and __iabs__
        in_place = f"__i{spelling[2:]}" if spelling.startswith("__") else spelling + "_"
        already_in_place = spelling.endswith("_") and not spelling.endswith("__")
        twin = getattr(namespace, in_place, None) if namespace is not None and not already_in_place else None
        if twin is not None and twin not in RULES:
            INPLACE.setdefault(twin, (rule, func))
    try:
        names = list(inspect.signature(func).parameters) if inspect.isfunction(func) else []
    except ValueError:  # a Python wrapper around a builtin (Tensor.__pow__)
        names = []
    if "inplace" in names:
        INPLACE_FLAG[func] = names.index("inplace")
