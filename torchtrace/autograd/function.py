"""Function (a forward/backward pair), the graph Node that doubles as its ctx, and the rule registry."""
import inspect
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

_guard = torch._C.DisableTorchFunctionSubclass

RULES: Dict[Callable, type] = {}


class BackwardMode:
    """Set by the engine while a backward with create_graph=True runs."""

    create_graph = False


class Function:
    """Subclass with static `forward(ctx, *args)` and `backward(ctx, *grads)`; call with `.apply(...)`.

    `backward` returns one gradient per positional parameter of `forward` (None where there is none);
    a list parameter (as in `torch.cat`) gets a list of gradients.
    """

    @staticmethod
    def forward(ctx: "Node", *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("a Function must define forward(ctx, *args)")

    @staticmethod
    def backward(ctx: "Node", *grads: Any) -> Any:
        raise NotImplementedError("a Function must define backward(ctx, *grads)")

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        from torchtrace.autograd.dispatch import TRACER, flat_arguments, run_rule

        if not any(isinstance(v, TRACER) for v in flat_arguments(args, kwargs)):
            return cls.forward(Node(cls, None, []), *args, **kwargs)  # plain tensors: torch semantics
        return run_rule(cls, None, args, kwargs)

    @classmethod
    def param_index(cls, name: str) -> int:
        """Position of forward's parameter `name` (so keyword tensors get their gradient routed)."""
        names = cls.__dict__.get("_param_names")
        if names is None:
            names = list(inspect.signature(cls.forward).parameters)[1:]
            cls._param_names = names
        if name in names:
            return names.index(name)
        if name in ("input", "self") and names:
            return 0
        raise TypeError(f"{cls.__name__}: cannot route the gradient of keyword argument '{name}'")


def register(*torch_callables: Callable, rule: Optional[type] = None) -> Any:
    """`register(torch.mul, Mul)` or `@register(torch.mul, torch.Tensor.mul)` above a Function class."""
    last = torch_callables[-1] if torch_callables else None
    if len(torch_callables) > 1 and isinstance(last, type) and issubclass(last, Function):
        *torch_callables, rule = torch_callables

    def add(fn_class: type) -> type:
        for target in torch_callables:
            RULES[target] = fn_class
        return fn_class

    return add if rule is None else add(rule)


_PUBLIC_MODULES = {"torch._C._nn": "torch.nn.functional", "torch._C._special": "torch.special",
                   "torch._C._linalg": "torch.linalg", "torch._C._fft": "torch.fft"}


def callable_name(func: Callable) -> str:
    """How a user writes the torch callable: 'torch.log', 'torch.Tensor.log', 'torch.Tensor.T.__get__', ..."""
    if getattr(func, "__name__", "") == "__get__" and hasattr(func, "__self__"):
        return f"torch.Tensor.{func.__self__.__name__}.__get__"
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    owner, _, name = qualname.rpartition(".")
    if owner == "_VariableFunctionsClass":
        return f"torch.{name}"
    if owner in ("TensorBase", "Tensor"):
        return f"torch.Tensor.{name}"
    module = _PUBLIC_MODULES.get(getattr(func, "__module__", None), getattr(func, "__module__", None) or "torch")
    name = getattr(func, "__name__", name)
    for prefix in ("special_", "linalg_", "fft_"):
        if module.endswith(prefix[:-1]) and name.startswith(prefix):
            name = name[len(prefix):]
    return f"{module}.{name}"


def supported_ops() -> List[Callable]:
    """Every torch callable that has a gradient rule (function, method and operator forms)."""
    return list(RULES)


class RemovableHandle:
    """Returned by register_hook; `.remove()` takes the hook out again."""

    def __init__(self, hooks: list, fn: Callable):
        self._hooks, self._fn = hooks, fn

    def remove(self) -> None:
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)


class Node:
    """One recorded op: the rule's ctx during forward, the grad_fn of its outputs, a graph node in backward."""

    released = False
    n_outputs = 1
    saved = ()
    raw_outputs = ()  # weak references to forward's plain results, kept only when something was saved
    func = None
    hooks = None
    retained = None
    module = None

    def __init__(self, rule: type, func: Optional[Callable], inputs: List[Tuple]):
        self.rule, self.func, self.inputs = rule, func, inputs

    @property
    def name(self) -> str:
        return self.rule.__name__ + "Backward"

    def __repr__(self) -> str:
        return f"<{self.name}>"

    @property
    def next_functions(self) -> Tuple[Tuple[Any, int], ...]:
        return tuple((nxt, nr) for _, nxt, nr, _, _ in self.inputs)

    @property
    def needs_input_grad(self) -> Tuple[bool, ...]:
        """One flag per positional parameter of forward: does that argument need a gradient?"""
        needs = self.__dict__.get("_needs")
        if needs is None:  # computed once per node, then kept
            flags = [False] * 8
            for entry in self.inputs:
                position = entry[0] if type(entry[0]) is int else entry[0][0]
                if position >= len(flags):
                    flags += [False] * (position + 1 - len(flags))
                flags[position] = True
            needs = self._needs = tuple(flags)
        return needs

    @needs_input_grad.setter
    def needs_input_grad(self, flags: Tuple[bool, ...]) -> None:
        self._needs = tuple(flags)

    def save_for_backward(self, *tensors: Any) -> None:
        """Keep tensors for backward (forward runs under the dispatcher's guard: plain tensor reads)."""
        self.saved = tensors
        self.saved_versions = [t._version if isinstance(t, torch.Tensor) else None for t in tensors]

    @property
    def saved_tensors(self) -> Tuple[Any, ...]:
        if self.released:
            raise RuntimeError(
                f"Trying to backward through the graph a second time ({self.name}): its saved tensors were "
                "freed after the first backward. Pass retain_graph=True to the first backward()."
            )
        if BackwardMode.create_graph:  # rules run with the hook active: read versions as plain tensors
            with _guard():
                self._check_versions()
        else:
            self._check_versions()
        if BackwardMode.create_graph and self.raw_outputs:
            return self._saved_with_graph()
        return self.saved

    def _check_versions(self) -> None:
        for t, version in zip(self.saved, self.saved_versions):
            if version is not None and t._version != version:
                raise RuntimeError(
                    f"A tensor saved by {self.name} for backward was modified by an in-place operation "
                    f"(version {version} -> {t._version}). Use the out-of-place form of that op "
                    "(e.g. x = x + 1 instead of x += 1), or .clone() before modifying it."
                )

    def _saved_with_graph(self) -> Tuple[Any, ...]:
        """Saved outputs re-linked to this node, so a backward recorded with create_graph sees them."""
        from torchtrace.autograd.dispatch import link_output

        outputs = [ref() for ref in self.raw_outputs]
        linked = {id(o): link_output(o, self, nr) for nr, o in enumerate(outputs) if o is not None}
        return tuple(linked.get(id(s), s) if s is not None else s for s in self.saved)

    def release(self) -> None:
        """Free what forward saved (called after this node ran, unless retain_graph)."""
        if self.saved:
            self.saved = ()
            self.released = True


class AccumulateGrad:
    """The graph node of a leaf tracer: gradients that reach it are accumulated into `leaf.grad`."""

    name = "AccumulateGrad"
    n_outputs = 1
    inputs = ()
    next_functions = ()
    released = False
    module = None

    def __init__(self, leaf: torch.Tensor):
        self.variable = leaf
        self.weak_self = weakref.ref(self)

    def __repr__(self) -> str:
        return "<AccumulateGrad>"
