"""What a compiled specialisation depends on: the structure and metadata of its inputs, and Python values.

`flatten` turns nested inputs (tuples, lists, dicts of tensors and Python values) into a list of
tensors and a hashable key; two calls with equal keys can run the same generated code.
"""
import dataclasses
import inspect
import math
import re
from typing import Any, Callable, Dict, List, Tuple

import torch

RESERVED = re.compile(r"^([tg]\d+|grad\d+|params|saved|torch|GuardFailed|forward|backward|_)$")


def tensor_key(t: torch.Tensor) -> tuple:
    return type(t), t.shape, t.dtype, t.device, t.requires_grad, t.is_contiguous()


def flatten(value: Any, name: str, tensors: List[Tuple[str, torch.Tensor]]) -> Any:
    """Append (name, tensor) for every tensor in `value`; return a hashable description of the rest, by value.

    Containers (tuples, namedtuples, lists, dicts, sets, dataclasses) are described by their contents; a
    hashable value by itself (its equality); any other object is refused, because neither its identity (ids are
    reused) nor its current contents (it can change after the call) would say whether the code still fits.
    """
    if isinstance(value, torch.Tensor):
        tensors.append((name, value))
        return tensor_key(value)
    if isinstance(value, (list, tuple)):
        return type(value), tuple(flatten(v, f"{name}_{i}", tensors) for i, v in enumerate(value))
    if isinstance(value, dict):
        return dict, tuple((k, flatten(v, f"{name}_{identifier(str(k))}", tensors)) for k, v in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value), tuple((f.name, flatten(getattr(value, f.name), f"{name}_{f.name}", tensors))
                                  for f in dataclasses.fields(value))
    if isinstance(value, (set, frozenset)):
        return type(value), frozenset(flatten(v, name, []) for v in value)
    if isinstance(value, float):
        return float, value, math.copysign(1.0, value)  # -0.0 == 0.0, but 1 / -0.0 is not 1 / 0.0
    if isinstance(value, (int, bool, str, bytes, complex, type(None), torch.dtype, torch.device, slice, type)) \
            or value is Ellipsis or callable(value):
        return type(value), value
    raise TypeError(f"tt.compile cannot key a call on an argument of type {type(value).__name__}: pass tensors, "
                    "numbers, strings, containers or dataclasses of them (or bind it in a closure)")


def identifier(text: str) -> str:
    """A Python name made of `text` that cannot clash with the names the generated code uses."""
    name = re.sub(r"\W", "_", text) or "_"
    name = "_" + name if name[0].isdigit() else name
    return name + "_in" if RESERVED.match(name) else name


def rebuild_spec(value: Any) -> Any:
    """How to rebuild an output from its flat tensors: ('T',), ('C', value), (kind, [(field, spec)]) for containers."""
    if isinstance(value, torch.Tensor):
        return ("T",)
    if isinstance(value, (list, tuple, dict)) or (dataclasses.is_dataclass(value) and not isinstance(value, type)):
        return type(value), [(k, rebuild_spec(v)) for k, v in _items(value)]
    return "C", value


def _items(value: Any) -> List[Tuple[Any, Any]]:
    """(key, item) of a container output: index, dict key or dataclass field."""
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, (list, tuple)):
        return list(enumerate(value))
    return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]


def output_tensors(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple, dict)) or (dataclasses.is_dataclass(value) and not isinstance(value, type)):
        return [t for _, v in _items(value) for t in output_tensors(v)]
    return []


def rebuild(spec: Any, tensors: Any) -> Any:
    """Inverse of rebuild_spec + output_tensors: `tensors` is an iterator over the flat tensors."""
    kind = spec[0]
    if kind == "T":
        return next(tensors)
    if kind == "C":
        return spec[1]
    items = [(k, rebuild(s, tensors)) for k, s in spec[1]]
    if issubclass(kind, dict):
        return kind(items)
    if hasattr(kind, "_fields"):  # a namedtuple takes its fields as arguments
        return kind(*(v for _, v in items))
    if issubclass(kind, (list, tuple)):
        return kind(v for _, v in items)
    return kind(**dict(items))  # a dataclass


def argument_names(fn: Callable, n: int) -> List[str]:
    """The names of fn's first n positional parameters (input0, input1, ... where unknown)."""
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        params = [p.name for p in inspect.signature(target).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [identifier(params[i]) if i < len(params) else f"input{i}" for i in range(n)]


def unique(names: List[str]) -> List[str]:
    seen: Dict[str, int] = {}
    out = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        out.append(name if not count else f"{name}_{count}")
    return out
