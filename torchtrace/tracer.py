"""The tracer: a torch.Tensor whose every torch call is intercepted and recorded for torchtrace's backward."""
import weakref
from typing import Any, Callable, Optional

import numpy as np
import torch

from torchtrace.autograd import dispatch, engine
from torchtrace.autograd.function import Node, RemovableHandle

_guard = torch._C.DisableTorchFunctionSubclass


def _check_differentiable(t: torch.Tensor) -> None:
    with _guard():
        if not (t.is_floating_point() or t.is_complex()):
            raise RuntimeError(
                f"Only floating point tracers can require gradients, but this one has dtype {t.dtype}. "
                "Convert it first, e.g. x = x.float()."
            )


def _to_tensor(data: Any, dtype: Optional[torch.dtype], device: Any) -> torch.Tensor:
    """Copy `data` into a tensor; Python numbers and lists of ints become float32 (legacy torch.Tensor)."""
    if isinstance(data, torch.Tensor):
        with _guard():
            return data.detach().to(dtype=dtype, device=device, copy=True).as_subclass(torch.Tensor)
    if isinstance(data, np.ndarray):
        return torch.tensor(data, dtype=dtype, device=device)
    tensor = torch.tensor(data, dtype=dtype, device=device)
    if dtype is None and not tensor.is_floating_point() and not tensor.is_complex():
        tensor = tensor.to(torch.get_default_dtype())
    return tensor


class tracer(torch.Tensor):
    """A tensor that records its own computation graph; gradients come from torchtrace's rules."""

    _tt_node: Optional[Node] = None  # the node that produced this tracer (None for a leaf)
    _tt_nr = 0  # which output of that node
    _tt_requires_grad = False
    _tt_grad: Optional[torch.Tensor] = None
    _tt_acc = None  # weak reference to the leaf's AccumulateGrad node
    _tt_hooks: Optional[list] = None
    _tt_version = 0
    _tt_view = False  # the forward result was a view of another tensor (in-place on it is refused)

    __torch_function__ = classmethod(dispatch.torch_function)

    def __new__(cls, data: Any = (), requires_grad: bool = False, dtype: Any = None, device: Any = None) -> "tracer":
        t = _to_tensor(data, dtype, device).as_subclass(cls)
        if requires_grad:
            t.requires_grad_(True)
        return t

    def __repr__(self, **kwargs: Any) -> str:
        with _guard():
            text = torch.Tensor.__repr__(self, **kwargs)
        return text.replace("grad_fn=<Node>", f"grad_fn=<{self._tt_node.name}>") if self._tt_node else text

    @property
    def requires_grad(self) -> bool:
        return self._tt_requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad: bool = True) -> "tracer":
        """Make this leaf record gradients (torch's own autograd flag stays False underneath)."""
        if self._tt_node is not None and not requires_grad:
            raise RuntimeError("you can only change requires_grad of leaf tracers; use .detach() on a non-leaf")
        if requires_grad:
            _check_differentiable(self)
        self._tt_requires_grad = bool(requires_grad)
        return self

    @property
    def is_leaf(self) -> bool:
        return self._tt_node is None

    @property
    def grad_fn(self) -> Optional[Node]:
        return self._tt_node

    @property
    def grad(self) -> Optional[torch.Tensor]:
        return self._tt_grad

    @grad.setter
    def grad(self, value: Optional[torch.Tensor]) -> None:
        self._tt_grad = value

    @grad.deleter
    def grad(self) -> None:
        self._tt_grad = None

    def retain_grad(self) -> None:
        """Keep `.grad` on this non-leaf after backward."""
        if self._tt_node is None:
            return
        retained = self._tt_node.retained = self._tt_node.retained or {}
        retained[self._tt_nr] = weakref.ref(self)

    @property
    def retains_grad(self) -> bool:
        return self._tt_node is not None and self._tt_nr in (self._tt_node.retained or {})

    def register_hook(self, hook: Callable) -> RemovableHandle:
        """hook(grad) runs when this tracer's gradient is computed; a returned tensor replaces it."""
        if not self._tt_requires_grad:
            raise RuntimeError("cannot register a hook on a tracer that doesn't require gradient")
        if self._tt_node is None:
            hooks = self._tt_hooks = self._tt_hooks if self._tt_hooks is not None else []
        else:
            self._tt_node.hooks = self._tt_node.hooks or {}
            hooks = self._tt_node.hooks.setdefault(self._tt_nr, [])
        hooks.append(hook)
        return RemovableHandle(hooks, hook)

    def backward(
        self,
        gradient: Optional[torch.Tensor] = None,
        retain_graph: Optional[bool] = None,
        create_graph: bool = False,
        show: bool = False,
    ) -> None:
        """Back-propagate from this tracer into every leaf's `.grad`; `show=True` prints the trace."""
        if show:
            from torchtrace.inspect.trace import show as print_trace

            print_trace(self)
        engine.backward(self, gradient, retain_graph, create_graph)

    def detach(self) -> "tracer":
        with _guard():
            return torch.Tensor.detach(self).as_subclass(tracer)

    def __iter__(self) -> Any:
        return iter(self.unbind(0))

    def __reduce_ex__(self, protocol: int) -> Any:
        with _guard():
            plain = torch.Tensor.detach(self).as_subclass(torch.Tensor)
        return _rebuild, (plain, self._tt_requires_grad if self._tt_node is None else False)

    def __deepcopy__(self, memo: dict) -> "tracer":
        with _guard():
            copy = torch.Tensor.clone(self).as_subclass(type(self))
        copy._tt_requires_grad = self._tt_requires_grad and self._tt_node is None
        memo[id(self)] = copy
        return copy

    # Capitalised aliases of the original torchtrace, recorded exactly like their torch counterparts.
    def Sum(self) -> "tracer":
        """Sum of all elements."""
        return self.sum()

    def View(self, *shape: Any) -> "tracer":
        return self.view(*shape)

    def Gather(self, index: torch.Tensor) -> "tracer":
        """For a 2-D tracer and a 1-D index of length N: picks self[i, index[i]], shape (N, 1)."""
        return self.gather(1, index.reshape(-1, 1))


def _rebuild(data: torch.Tensor, requires_grad: bool) -> tracer:
    return as_tracer(data, requires_grad)


def as_tracer(tensor: torch.Tensor, requires_grad: bool = False) -> tracer:
    """Wrap `tensor` as a tracer without copying (the storage is shared)."""
    with _guard():
        t = tensor.detach().as_subclass(tracer)
    if requires_grad:
        t.requires_grad_(True)
    return t


dispatch.TRACER = tracer
