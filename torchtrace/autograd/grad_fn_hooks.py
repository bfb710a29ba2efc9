"""Hooks on a graph node, as torch's grad_fn.name() / register_prehook / register_hook (module full backward hooks
are built on them): Node mixes GradFnHooks in, and the engine runs the hooks around the node's rule."""
from typing import Any, Callable, List, Optional

import torch


class NodeName(str):
    """A node's name, read as torch's grad_fn.name() or as the attribute grad_fn.name."""

    def __call__(self) -> str:
        return str(self)


class RemovableHandle:
    """Returned by register_hook; `.remove()` takes this registration out again, once (a second call does nothing, as
    torch's: the same function registered twice stays registered once)."""

    def __init__(self, hooks: list, fn: Callable):
        self._hooks, self._fn = hooks, fn

    def remove(self) -> None:
        if self._hooks is not None and self._fn in self._hooks:
            self._hooks.remove(self._fn)
        self._hooks = None


class GradFnHooks:
    """torch's grad_fn hook API on a graph node."""

    pre_hooks: Optional[list] = None  # hook(grad_outputs) before the rule runs (grad_fn.register_prehook)
    post_hooks: Optional[list] = None  # hook(grad_inputs, grad_outputs) after it (grad_fn.register_hook)

    def register_prehook(self, hook: Callable) -> RemovableHandle:
        """hook(grad_outputs) runs before this node's rule; a returned tuple replaces grad_outputs (as torch)."""
        self.pre_hooks = self.pre_hooks if self.pre_hooks is not None else []
        self.pre_hooks.append(hook)
        return RemovableHandle(self.pre_hooks, hook)

    def register_hook(self, hook: Callable) -> RemovableHandle:
        """hook(grad_inputs, grad_outputs) runs after this node's rule; a returned tuple replaces grad_inputs, the
        gradients of forward's tensor arguments in order (as torch)."""
        self.post_hooks = self.post_hooks if self.post_hooks is not None else []
        self.post_hooks.append(hook)
        return RemovableHandle(self.post_hooks, hook)


def run_pre_hooks(node: Any, grads: List[Any]) -> List[Any]:
    """grad_fn.register_prehook hooks: each may return new gradients of the node's outputs."""
    for hook in list(node.pre_hooks or ()):
        replaced = hook(tuple(grads))
        if replaced is not None:
            grads = _checked_replacement(hook, replaced, len(grads), "grad_outputs")
    return grads


def run_post_hooks(node: Any, result: tuple, grads: List[Any], inputs: Optional[list] = None) -> tuple:
    """grad_fn.register_hook hooks: each sees the gradients of forward's arguments (grad_inputs) as the inputs receive
    them, and those of the node's outputs (grad_outputs), and may return new grad_inputs. `inputs`: (position, shape,
    dtype) of each input that receives one (default: the node's edges)."""
    hidden = getattr(node.rule, "hidden_arguments", 0)  # leading arguments the user never passed (a bridge's own)
    if inputs is None:
        inputs = [(edge.position, edge.shape, edge.dtype) for edge in node.edges]
    grad_inputs = tuple(_as_received(inputs, result)[hidden:])
    for hook in list(node.post_hooks or ()):
        replaced = hook(grad_inputs, tuple(grads))
        if replaced is not None:
            grad_inputs = _checked_replacement(hook, replaced, len(grad_inputs), "grad_inputs")
    return tuple(result[:hidden]) + tuple(grad_inputs)


def _as_received(inputs: list, result: tuple) -> list:
    """The rule's gradients as the inputs receive them (summed over what forward broadcast, cast to each input's
    dtype, as the engine sends them), as torch's hooks see them: a hook that clamps a bias's gradient clamps the sum."""
    received = list(result)
    for position, shape, dtype in inputs:
        index, item = (position, None) if type(position) is int else position
        entry = received[index] if index < len(received) else None
        if item is not None:
            if not isinstance(entry, (list, tuple)) or item >= len(entry):
                continue
            items = list(entry)
            items[item] = _reduced(items[item], shape, dtype)
            received[index] = type(entry)(items)
        elif entry is not None:
            received[index] = _reduced(entry, shape, dtype)
    return received


def _reduced(g: Any, shape: torch.Size, dtype: torch.dtype) -> Any:
    if not isinstance(g, torch.Tensor):
        return g
    if g.shape != shape:
        try:
            g = g.sum_to_size(shape)
        except RuntimeError:  # a gradient of a wrong shape: the engine names the rule that returned it
            return g
    return g if g.dtype == dtype else g.to(dtype)


def _checked_replacement(hook: Callable, replaced: Any, expected: int, what: str) -> Any:
    if not isinstance(replaced, (tuple, list)) or len(replaced) != expected:
        got = len(replaced) if isinstance(replaced, (tuple, list)) else type(replaced).__name__
        raise RuntimeError(f"hook '{getattr(hook, '__name__', hook)}' has returned an incorrect number of values "
                           f"(got {got}, but expected {expected}): return None or one gradient per entry of {what}")
    return list(replaced) if what == "grad_outputs" else tuple(replaced)
