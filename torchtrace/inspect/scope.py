"""Module paths for plain torch modules, and the names the tools give a node's modules.

tt.nn modules and ported modules push themselves onto the core's per-thread module stack
(`STATE.module_stack`), so every node records `node.module_path`. A plain torch module (neither) is
seen only inside `module_scope()`, which installs torch's global module hooks for as long as some
tool needs them and pushes such modules onto the same stack; every tool then reads `node.module_path`.
"""
import contextlib
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from torchtrace.autograd.state import STATE
from torchtrace.nn.module import ForwardInModule, Module

_LOCK = threading.Lock()
_USERS: List[int] = [0]  # how many module_scope blocks are open (in any thread)
_HANDLES: List[Any] = []


def _pushes_itself(module: torch.nn.Module) -> bool:
    """tt.nn modules and ported modules push themselves; the global hooks must not push them twice."""
    return isinstance(module, Module) or isinstance(module.__dict__.get("forward"), ForwardInModule)


def _enter(module: torch.nn.Module, args: tuple) -> None:
    if not _pushes_itself(module):
        STATE.module_stack = (*STATE.module_stack, module)


def _leave(module: torch.nn.Module, args: tuple, output: object) -> None:
    stack = STATE.module_stack
    if stack and stack[-1] is module and not _pushes_itself(module):
        STATE.module_stack = stack[:-1]


@contextlib.contextmanager
def module_scope() -> Iterator[None]:
    """Inside the block, plain torch modules join the module stack too, so their nodes know their modules."""
    with _LOCK:
        _USERS[0] += 1
        if _USERS[0] == 1:
            _HANDLES[:] = [register_module_forward_pre_hook(_enter),
                           register_module_forward_hook(_leave, always_call=True)]
    try:
        yield
    finally:
        with _LOCK:
            _USERS[0] -= 1
            if _USERS[0] == 0:
                for handle in _HANDLES:
                    handle.remove()
                _HANDLES.clear()


def module_names(model: Optional[torch.nn.Module]) -> Dict[int, str]:
    """id(module) -> its dotted name inside `model` ('model' for the root)."""
    if model is None:
        return {}
    return {id(m): name or "model" for name, m in model.named_modules()}


def path_name(modules: Sequence[torch.nn.Module], names: Optional[Dict[int, str]] = None) -> str:
    """The dotted name of the innermost module of a node's `module_path` ('' outside modules).

    A module of the given model is named by its attribute path; otherwise the class names of the
    whole path are joined (`Sequential.Linear`).
    """
    if not modules:
        return ""
    known = (names or {}).get(id(modules[-1]))
    return known if known else ".".join(type(m).__name__ for m in modules)
