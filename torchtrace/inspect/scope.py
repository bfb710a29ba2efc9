"""Which module is running: a stack kept by torch's global module hooks, installed only while a tool needs it."""
import contextlib
from typing import Dict, Iterator, List, Optional

import torch

_STACK: List[torch.nn.Module] = []


def _enter(module: torch.nn.Module, args: tuple) -> None:
    _STACK.append(module)


def _leave(module: torch.nn.Module, args: tuple, output: object) -> None:
    if _STACK and _STACK[-1] is module:
        _STACK.pop()


@contextlib.contextmanager
def module_scope() -> Iterator[None]:
    """Track the stack of running modules inside the block."""
    pre = torch.nn.modules.module.register_module_forward_pre_hook(_enter)
    post = torch.nn.modules.module.register_module_forward_hook(_leave)
    try:
        yield
    finally:
        pre.remove()
        post.remove()
        _STACK.clear()


def module_path(names: Optional[Dict[int, str]] = None) -> str:
    """Dotted path of the innermost running module ('' outside modules); class names where no name is known."""
    names = names or {}
    parts = [names.get(id(m)) or type(m).__name__ for m in _STACK]
    return parts[-1] if parts and names.get(id(_STACK[-1])) else ".".join(parts)


def module_names(model: Optional[torch.nn.Module]) -> Dict[int, str]:
    """id(module) -> its dotted name inside `model` ('model' for the root)."""
    if model is None:
        return {}
    return {id(m): name or "model" for name, m in model.named_modules()}
