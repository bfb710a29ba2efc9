"""What a compiled specialisation depends on: the structure and metadata of its inputs, and Python values.

`flatten` turns nested inputs (tuples, lists, dicts of tensors and Python values) into a list of
tensors and a hashable key; two calls with equal keys can run the same generated code.
"""
import re
from typing import Any, Callable, Dict, List, Tuple

import torch

_RESERVED = re.compile(r"^([tg]\d+|grad\d+|params|saved|torch|GuardFailed|forward|backward|_)$")


def tensor_key(t: torch.Tensor) -> tuple:
    return type(t), t.shape, t.dtype, t.device, t.requires_grad, t.is_contiguous()


def flatten(value: Any, name: str, tensors: List[Tuple[str, torch.Tensor]]) -> Any:
    """Append (name, tensor) for every tensor in `value`; return a hashable description of the rest."""
    if isinstance(value, torch.Tensor):
        tensors.append((name, value))
        return tensor_key(value)
    if isinstance(value, (list, tuple)):
        return type(value), tuple(flatten(v, f"{name}_{i}", tensors) for i, v in enumerate(value))
    if isinstance(value, dict):
        return dict, tuple((k, flatten(v, f"{name}_{identifier(str(k))}", tensors)) for k, v in value.items())
    try:
        hash(value)
    except TypeError:
        return "object", id(value)
    return type(value), value


def identifier(text: str) -> str:
    """A Python name made of `text` that cannot clash with the names the generated code uses."""
    name = re.sub(r"\W", "_", text) or "_"
    name = "_" + name if name[0].isdigit() else name
    return name + "_in" if _RESERVED.match(name) else name


def rebuild_spec(value: Any) -> Any:
    """How to rebuild an output from its flat tensors: ('T',), ('C', value), (type, [specs]), (dict, ...)."""
    if isinstance(value, torch.Tensor):
        return ("T",)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value), [rebuild_spec(v) for v in value]
    if isinstance(value, dict):
        return dict, [(k, rebuild_spec(v)) for k, v in value.items()]
    return "C", value


def output_tensors(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in output_tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in output_tensors(v)]
    return []


def rebuild(spec: Any, tensors: Any) -> Any:
    """Inverse of rebuild_spec + output_tensors: `tensors` is an iterator over the flat tensors."""
    kind = spec[0]
    if kind == "T":
        return next(tensors)
    if kind == "C":
        return spec[1]
    if kind is dict:
        return {k: rebuild(s, tensors) for k, s in spec[1]}
    return kind(rebuild(s, tensors) for s in spec[1])


def argument_names(fn: Callable, n: int) -> List[str]:
    """The names of fn's first n positional parameters (input0, input1, ... where unknown)."""
    import inspect

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
