"""What a compiled function sees besides its arguments, as facts checked before the generated code runs.

The traced function can read the modules it calls (their parameters, buffers, submodules, hooks and plain
attributes such as `training`, `Dropout.p` or `self.scale`), the cells of its closure and the globals its
code names, and, through them, the functions those name in turn. `World` collects all of that while the
function is traced and writes one check, `unchanged()`, that compares each fact with the value it had:
tensors, modules and other objects by identity (the facts hold them, so their ids cannot be reused), numbers,
strings and containers of them by value. The same check run right after tracing finds Python side effects
of the call itself (`self.h = out.detach()`, a counter in a global), which replayed code would not repeat.

What it cannot see: a mutable object reached by attribute from something it checks by identity (a list
inside an object), files and other I/O, and the internals of torch and torchtrace.
"""
import os
import sys
import types
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch

# Module.__dict__ entries that only serialisation reads
_SERIALISATION = {"_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                  "_load_state_dict_post_hooks", "_non_persistent_buffers_set"}
_HOOK_DICTS = ("_hooks", "_hooks_with_kwargs", "_hooks_always_called")  # Module.__dict__ keys ending so
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks", "_global_forward_hooks_with_kwargs")
_LIBRARIES = tuple(os.path.dirname(m.__file__) for m in (torch, sys.modules["torchtrace"]))
_IMMUTABLE = (bool, int, str, bytes, type(None), torch.dtype, torch.device)


def _value_fact(value: Any) -> Tuple[str, Any]:
    """How a value read from an attribute, cell or global is compared: ('==', value), ('frozen', snapshot) for
    plain data that can change in place or hides a -0.0 or NaN, ('items', tuple) or ('is', object)."""
    if isinstance(value, _IMMUTABLE) or (isinstance(value, float) and value == value and value != 0.0):
        return "==", value
    if _plain_data(value):
        return "frozen", freeze(value)
    if type(value) in (list, tuple) and len(value) <= 64:  # e.g. LSTM's _flat_weights: a new list, same tensors
        return "items", tuple(value)
    return "is", value


def _plain_data(value: Any, depth: int = 0) -> bool:
    """Numbers, strings and containers of them (compared by value: == on them never touches a tensor)."""
    if depth > 4:
        return False
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_plain_data(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(_plain_data(k, depth + 1) and _plain_data(v, depth + 1) for k, v in value.items())
    return isinstance(value, (*_IMMUTABLE, float, complex))


def freeze(value: Any) -> Any:
    """A snapshot of plain data that == compares exactly: floats by repr (-0.0 is not 0.0, NaN is NaN)."""
    if isinstance(value, dict):
        return dict, tuple((freeze(k), freeze(v)) for k, v in value.items())
    if isinstance(value, (set, frozenset)):
        return type(value), frozenset(freeze(v) for v in value)
    if isinstance(value, (list, tuple)):
        return type(value), tuple(freeze(v) for v in value)
    if isinstance(value, (float, complex)):
        return type(value), repr(value)
    return type(value), value


class World:
    """Facts about the state a traced function reads, and one generated check that they still hold."""

    def __init__(self) -> None:
        self.facts: List[Tuple[str, str]] = []  # (Python expression that is True while the fact holds, what it says)
        self.namespace: Dict[str, Any] = {"len": len, "int": int, "float": float}
        self.seen: Set[int] = set()
        self.modules: List[torch.nn.Module] = []
        self.python_names: Dict[int, str] = {}  # id(value of a cell or global) -> its name there (alive meanwhile)
        self.tensors: List[torch.Tensor] = []  # tensors in those cells and globals
        self.optimizers: List[torch.optim.Optimizer] = []

    def _bind(self, value: Any) -> str:
        name = f"o{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def _compare(self, expression: str, value: Any, what: str) -> None:
        kind, expected = _value_fact(value)
        if kind == "items":
            self._same_items(expression, expected, what)
            return
        if kind == "frozen":
            self.namespace["_freeze"] = freeze
            self.facts.append((f"_freeze({expression}) == {self._bind(expected)}", what))
            return
        if type(value) in (int, float):  # 2 == 2.0, but x * 2 and x * 2.0 differ on an integer tensor
            self.facts.append((f"{expression} == {expected!r} and {expression}.__class__ is {type(value).__name__}",
                               what))
        elif kind == "==" and isinstance(value, (bool, type(None))):
            self.facts.append((f"{expression} is {expected!r}", what))
        else:
            self.facts.append((f"{expression} {kind} {self._bind(expected)}", what))
        self.follow(value)

    def _same_items(self, expression: str, items: tuple, what: str) -> None:
        """The same objects in the same order (the facts hold them, so their ids cannot be reused)."""
        self.namespace.setdefault("_ids", lambda found: tuple(map(id, found)))
        self.facts.append((f"_ids({expression}) == {tuple(map(id, items))!r}", what))
        self._bind(items)
        for item in items:
            self.follow(item)

    def follow(self, value: Any) -> None:
        """Add what `value` lets the function read: a module's state, a function's closure and globals."""
        if id(value) in self.seen:
            return
        if isinstance(value, torch.nn.Module):
            self.seen.add(id(value))
            self.add_module(value, type(value).__name__)
        elif isinstance(value, torch.optim.Optimizer):
            self.seen.add(id(value))
            self.add_optimizer(value, type(value).__name__)
        elif isinstance(value, types.MethodType):
            self.seen.add(id(value))
            self.follow(value.__self__)
            self.follow(value.__func__)
        elif isinstance(value, types.FunctionType) and not value.__code__.co_filename.startswith(_LIBRARIES):
            self.seen.add(id(value))
            self.add_function(value)
        elif hasattr(value, "func") and hasattr(value, "args") and callable(value):  # functools.partial
            self.seen.add(id(value))
            self.follow(value.func)

    def add_function(self, fn: types.FunctionType) -> None:
        """Its closure cells and the globals its code (nested functions included) names."""
        name = fn.__qualname__
        for cell_name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:  # a cell not filled yet
                continue
            self.python_names.setdefault(id(value), cell_name)
            self._note_tensor(value)
            self._compare(f"{self._bind(cell)}.cell_contents", value, f"{cell_name} in the closure of {name}")
        scope = fn.__globals__
        bound = self._bind(scope)
        for global_name in sorted(_names(fn.__code__)):
            if global_name in scope:
                self.python_names.setdefault(id(scope[global_name]), global_name)
                self._note_tensor(scope[global_name])
                self._compare(f"{bound}.get({global_name!r})", scope[global_name], f"global {global_name} of {name}")

    def _note_tensor(self, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self.tensors.append(value)

    def add_module(self, module: torch.nn.Module, label: str) -> None:
        """Every entry of the module's __dict__: parameters, buffers, submodules and hooks by identity, the rest
        by value; then its forward's globals and its submodules."""
        if any(module is m for m in self.modules):
            return
        self.seen.add(id(module))
        self.modules.append(module)
        state = module.__dict__
        d = self._bind(state)
        self.facts.append((f"len({d}) == {len(state)}", f"the attributes of {label}"))
        hooks = []
        for key, value in state.items():
            if key in _SERIALISATION:
                continue
            what = f"{label}.{key.lstrip('_')}"
            if isinstance(value, dict) and key.endswith(_HOOK_DICTS) and not value:
                hooks.append(self._bind(value))  # empty: one test of them all below
            elif isinstance(value, dict) and key.startswith("_"):  # parameters, buffers, submodules, hooks
                entries = self._bind(value)
                self.facts.append((f"len({entries}) == {len(value)}", what))
                for k, v in value.items():
                    self.facts.append((f"{entries}[{k!r}] is {self._bind(v)}", f"{what}[{k!r}]"))
                    if key == "_modules" and v is not None:
                        self.add_module(v, f"{label}.{k}")
                    elif key not in ("_parameters", "_buffers"):
                        self.follow(v)
            else:
                self._compare(f"{d}[{key!r}]", value, what)
        if hooks:
            self.facts.append((f"not ({' or '.join(hooks)})", f"the hooks of {label}"))
        for cls in type(module).__mro__:  # forward and the helpers it calls: their globals
            if cls.__module__.startswith(("torch.", "torchtrace.")):
                break
            for attribute in vars(cls).values():
                self.follow(attribute)

    def add_optimizer(self, optimizer: torch.optim.Optimizer, label: str) -> None:
        """Its hyperparameters (`lr`, `momentum`, `betas`: what a scheduler changes) by value, its parameters and
        state tensors by identity (the code reads their values when it runs), and its hooks."""
        self.optimizers.append(optimizer)
        for key, value in optimizer.__dict__.items():
            expression, what = f"{self._bind(optimizer.__dict__)}[{key!r}]", f"{label}.{key}"
            if key == "param_groups":
                self._same_items(expression, tuple(value), what)
                for i, group in enumerate(value):
                    self._entries(self._bind(group), group, f"{what}[{i}]")
            elif key == "state":
                self._entries(self._bind(value), value, what)
                for state in value.values():
                    self._entries(self._bind(state), state, f"the state of a parameter of {label}")
            elif isinstance(value, dict) and not _plain_data(value):  # hooks
                self._entries(self._bind(value), value, what)
            else:
                self._compare(expression, value, what)
        for name in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"):
            hooks = getattr(sys.modules.get("torch.optim.optimizer"), name, None)
            if isinstance(hooks, dict):
                self.facts.append((f"len({self._bind(hooks)}) == {len(hooks)}", f"torch's {name.strip('_')}"))

    def _entries(self, bound: str, mapping: dict, what: str) -> None:
        """Each key of a dict: tensors by identity, the rest by _compare."""
        self.facts.append((f"len({bound}) == {len(mapping)}", what))
        for key, value in mapping.items():
            where = f"{bound}[{self._bind(key)}]"
            if isinstance(value, torch.Tensor):
                self.facts.append((f"{where} is {self._bind(value)}", f"{what}[{key!r:.40}]"))
            else:
                self._compare(where, value, f"{what}[{key!r:.40}]")

    def add_global_hooks(self) -> None:
        registry = torch.nn.modules.module
        for name in _GLOBAL_HOOKS:
            hooks = getattr(registry, name, None)
            if isinstance(hooks, dict):
                self.facts.append((f"len({self._bind(hooks)}) == {len(hooks)}", f"torch's {name.strip('_')}"))
        self.facts.append((f"{self._bind(torch.get_default_dtype)}() is {self._bind(torch.get_default_dtype())}",
                           "torch.get_default_dtype()"))

    def check(self) -> Callable[[], bool]:
        """One function evaluating every fact (a few tens of nanoseconds each)."""
        body = " and ".join(f"({expression})" for expression, _ in self.facts) or "True"
        return eval(f"lambda: {body}", dict(self.namespace))  # noqa: S307 - our own expressions

    def changed(self) -> Optional[str]:
        """What no longer holds (None if all facts do)."""
        for expression, what in self.facts:
            try:
                holds = eval(expression, dict(self.namespace))  # noqa: S307
            except Exception:
                holds = False
            if not holds:
                return what
        return None


def _names(code: types.CodeType) -> Set[str]:
    """Global names a code object and the functions defined in it can read."""
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _names(const)
    return found
