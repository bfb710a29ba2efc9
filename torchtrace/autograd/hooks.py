"""What the walk does at a node besides running its rule: tensor hooks, retain_grad and tt.grad's capture.

Hooks see (and may replace) the gradient of the tensor they were registered on before it flows on. Every
gradient a hook sees or returns is reported to `hand_out` (the walk's Ownership): user code may keep it, so
no leaf may keep it as its .grad without a copy.
"""
from typing import Any, Callable, List, Optional

import torch

from torchtrace.autograd.node import Node


def as_user_code(call: Callable, *args: Any) -> Any:
    """call(*args) for a hook or a user's backward: torch calls on tracers inside it are seen by torchtrace, so with
    torch.enable_grad() it may record and call tt.grad (a DEQ's implicit gradient, a reentrant checkpoint), as under
    torch, though a plain backward's walk runs on plain tensors; the tracers it returns come back plain."""
    if torch._C._is_torch_function_enabled():  # (create_graph: the walk itself records)
        return call(*args)
    with torch._C._EnableTorchFunction():
        result = call(*args)
    return _plain(result)


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value if type(value) is torch.Tensor else value.as_subclass(torch.Tensor)
    if type(value) in (tuple, list):
        return type(value)(_plain(v) for v in value)
    return value


def run_hooks(hooks: List[Callable], g: Any, where: str, hand_out: Callable[[Any], None]) -> Any:
    """hook(grad) for each hook; a returned tensor (of the gradient's shape) replaces the gradient."""
    for fn in list(hooks):
        hand_out(g)
        replaced = as_user_code(fn, g)
        if replaced is None:
            continue
        if not isinstance(replaced, torch.Tensor) or replaced.shape != g.shape:
            got = f"shape {tuple(replaced.shape)}" if isinstance(replaced, torch.Tensor) else type(replaced).__name__
            raise RuntimeError(f"hook {getattr(fn, '__name__', fn)} on {where} returned {got}; a hook must return "
                               f"None or a tensor of the gradient's shape {tuple(g.shape)}")
        for what, was, got, fix in (("type", g.dtype, replaced.dtype, ".to(g.dtype)"),
                                    ("device", g.device, replaced.device, ".to(g.device)")):
            if was != got:  # torch refuses both, in these words
                raise RuntimeError(f"hook '{getattr(fn, '__name__', fn)}' has changed the {what} of value (was {was} "
                                   f"got {got}): return the gradient as it came ({fix})")
        g = replaced
        hand_out(g)
    return g


def non_leaf_hooks(node: Node, grads: List[Any], captured: Optional[dict], hand_out: Callable[[Any], None]) -> None:
    """Hooks and retain_grad of non-leaf tracers, and tt.grad's capture of non-leaf inputs (grads, one per output
    of node, is updated in place)."""
    for nr, g in enumerate(grads):
        if g is not None:
            grads[nr] = output_hooks(node, nr, g, captured, hand_out)


def output_hooks(node: Node, nr: int, g: Any, captured: Optional[dict], hand_out: Callable[[Any], None]) -> Any:
    """What the walk does with the whole gradient g of output nr of node: its hooks (which may replace it), its
    retain_grad, tt.grad's capture. Returns the gradient that flows on."""
    if node.hooks and nr in node.hooks:
        g = run_hooks(node.hooks[nr], g, f"an output of {node.name}", hand_out)
    t = node.retained[nr]() if node.retained and nr in node.retained else None
    if t is not None:
        t._tt_grad = g.clone() if t._tt_grad is None else t._tt_grad + g
    if captured is not None and (node, nr) in captured:
        captured[(node, nr)] = g
    return g
