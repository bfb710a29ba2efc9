"""Function (a forward/backward pair), its Context (the ctx a rule saves into), and the rule registry."""
import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.overrides import handle_torch_function, has_torch_function

from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import STATE
from torchtrace.errors import instantiated_function, saved_inference_tensor
from torchtrace.naming import callable_name

RULES: Dict[Callable, type] = {}  # torch callable -> the Function whose forward/backward it runs
INPLACE: Dict[Callable, tuple] = {}  # in-place twin (Tensor.add_, torch.relu_, F.elu_) -> (rule, out-of-place callable)
INPLACE_FLAG: Dict[Callable, int] = {}  # callable with an `inplace` parameter (F.relu) -> its position


class Context:
    """What a rule keeps between its forward and its backward (PyTorch's `ctx`).

    Rules call `save_for_backward`, read `saved_tensors` and `needs_input_grad`, and may set any
    attribute of their own (`ctx.dim = dim`, even `ctx.rule`). What torchtrace keeps here is underscored:
    `_rule` is the Function this ctx serves (a rule class shared by several ops reads its data there). The
    graph bookkeeping lives apart, in the Node.
    """

    _saved: Tuple[Any, ...] = ()
    _versions: List[Any] = []
    _released = False
    _needs: Optional[Tuple[bool, ...]] = None
    _graph_saved: Optional[Tuple[Any, ...]] = None
    _n_inputs: Optional[int] = None  # set for Function.apply: how many arguments backward returns gradients for

    def __init__(self, rule: type, edges: Any = (), needs_mask: Optional[int] = None):
        self._rule = rule
        self._edges = edges
        self._mask = needs_mask  # bit i set: argument i needs a gradient (None: read it from the edges)

    def save_for_backward(self, *tensors: Any) -> None:
        """Keep tensors for backward; an in-place change of one of them before backward is an error."""
        self._saved = tensors
        try:
            self._versions = [getattr(t, "_version", None) for t in tensors]
        except RuntimeError:  # an inference tensor has no version counter
            raise saved_inference_tensor(self._rule.__name__) from None

    def save_for_forward(self, *tensors: Any) -> None:
        """Keep tensors for the rule's jvp (forward mode), which reads them as ctx.saved_tensors (as torch's)."""
        self.saved_for_forward = tensors

    @property
    def saved_tensors(self) -> Tuple[Any, ...]:
        if self._released:
            raise RuntimeError(
                f"Trying to backward through the graph a second time ({self._rule.__name__}Backward): its saved "
                "tensors were freed after the first backward. Pass retain_graph=True to the first backward()."
            )
        if STATE.create_graph:  # rules run with the hook active: read versions as plain tensors
            with plain_torch():
                self._check_versions()
        else:
            self._check_versions()
        return self._saved if self._graph_saved is None else self._graph_saved

    def _check_versions(self) -> None:
        for t, version in zip(self._saved, self._versions):
            if version is not None and t._version != version:
                raise RuntimeError(
                    f"A tensor saved by {self._rule.__name__}Backward for backward was modified by an in-place "
                    f"operation (version {version} -> {t._version}). Use the out-of-place form of that op "
                    "(e.g. x = x + 1 instead of x += 1), or .clone() before modifying it."
                )

    def use_graph_saved(self, saved: Optional[Tuple[Any, ...]]) -> None:
        """While a create_graph backward runs: saved outputs re-linked to the graph (None restores them)."""
        self._graph_saved = saved

    def release(self) -> None:
        """Free what forward saved (after the node ran, unless retain_graph)."""
        if self._saved:
            self._saved, self._released = (), True

    @property
    def needs_input_grad(self) -> Tuple[bool, ...]:
        """One flag per positional parameter of forward: does that argument need a gradient?"""
        needs = self._needs
        if needs is None:
            mask = self._mask
            if mask is None:
                mask = self._mask = sum({1 << (p if type(p) is int else p[0]) for p, *_ in self._edges})
            needs = self._needs = _NEEDS.get(mask) or _needs_flags(mask)
        return needs

    @needs_input_grad.setter
    def needs_input_grad(self, flags: Tuple[bool, ...]) -> None:
        self._needs = tuple(flags)


_NEEDS: Dict[int, Tuple[bool, ...]] = {}  # bit mask of the arguments needing a gradient -> needs_input_grad flags


def _needs_flags(mask: int) -> Tuple[bool, ...]:
    """0b101 -> (True, False, True, False, ...): one flag per parameter, at least 8."""
    return _NEEDS.setdefault(mask, tuple(bool(mask >> i & 1) for i in range(max(8, mask.bit_length()))))


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
        return cls.forward(Context(cls), *args, **kwargs)  # plain tensors: an ordinary function call

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


def register(*torch_callables: Callable, rule: Optional[type] = None) -> Any:
    """`register(torch.mul, Mul)` or `@register(torch.mul, torch.Tensor.mul)` above a Function class."""
    last = torch_callables[-1] if torch_callables else None
    if len(torch_callables) > 1 and isinstance(last, type) and issubclass(last, Function):
        *torch_callables, rule = torch_callables

    def add(fn_class: type) -> type:
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


def supported_ops() -> List[Callable]:
    """Every torch callable that has a gradient rule (function, method and operator forms)."""
    return list(RULES)
