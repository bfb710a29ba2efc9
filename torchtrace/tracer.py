"""The tracer: a torch.Tensor whose every torch call is intercepted and recorded for torchtrace's backward."""
import functools
import warnings
import weakref
from typing import Any, Callable, Optional

import numpy as np
import torch

from torchtrace.autograd import dispatch, engine
from torchtrace.autograd.grad_fn_hooks import RemovableHandle
from torchtrace.autograd.inplace import catch_up
from torchtrace.autograd.node import Node
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import LANE_SWITCHES, LANES_ON
from torchtrace.errors import NON_LEAF_GRAD_WARNING
from torchtrace.lanes import forward as lanes
from torchtrace.lanes import walk as _walk_lane  # noqa: F401  (installs the walk's lane: engine.WALK_LANE)
from torchtrace.lanes.operators import use_lanes
from torchtrace.tensor_protocols import TensorProtocols


def _to_tensor(data: Any, dtype: Optional[torch.dtype], device: Any) -> torch.Tensor:
    """Copy `data` into a tensor; Python numbers and lists of ints become float32 (legacy torch.Tensor)."""
    if isinstance(data, torch.Tensor):
        with plain_torch(), torch.inference_mode(False):
            return data.detach().to(dtype=dtype, device=device, copy=True).as_subclass(torch.Tensor)
    if isinstance(data, np.ndarray):
        return torch.tensor(data, dtype=dtype, device=device)
    tensor = torch.tensor(data, dtype=dtype, device=device)
    if dtype is None and not tensor.is_floating_point() and not tensor.is_complex():
        tensor = tensor.to(torch.get_default_dtype())
    return tensor


def _check_grad(t: torch.Tensor, value: Optional[torch.Tensor]) -> None:
    """What torch checks when `.grad` is assigned: a tensor of the same shape, dtype and device."""
    if value is None:
        return
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of type {type(value).__name__}")
    with plain_torch():
        if value.dtype != t.dtype:
            raise RuntimeError(f"assigned grad has data of a different type ({value.dtype} vs the tracer's {t.dtype})")
        if value.shape != t.shape:
            raise RuntimeError(f"assigned grad has data of a different size ({tuple(value.shape)} vs the tracer's "
                               f"{tuple(t.shape)})")
        if value.device != t.device:
            raise RuntimeError(f"assigned grad has data located on a different device ({value.device} vs {t.device})")


class tracer(TensorProtocols, torch.Tensor):
    """A tensor that records its own computation graph; gradients come from torchtrace's rules."""

    _tt_node: Optional[Node] = None  # the node that produced this tracer (None for a leaf)
    _tt_nr = 0  # which output of that node
    _tt_requires_grad = False
    _tt_grad: Optional[torch.Tensor] = None
    _tt_acc = None  # weak reference to the leaf's AccumulateGrad node
    _tt_hooks: Optional[list] = None  # hooks of a leaf (a non-leaf's hooks live on its node)
    _tt_post_hooks: Optional[list] = None  # post-accumulate-grad hooks of a leaf
    _tt_version = 0
    _tt_view = False  # the forward result was a view of another tensor (they share memory)
    _tt_base: Optional["tracer"] = None  # the tracer a view shares memory with (None: not a view, or not known)
    _tt_no_grad_view = False  # a view taken with grad mode off: not to be changed in place with it on (as torch)
    _tt_custom_view = ""  # "Output i of F": a user Function's output sharing an input's memory (no in-place, as torch)
    _tt_piece = ""  # "Output i of Split": one of several views an op returned, or a view of one (inplace.mark_piece)

    # a rule's common call takes its generated lane (torchtrace/lanes), every other call dispatch.torch_function;
    # everything dispatch.torch_function while the lanes are off (tt.readable(), a tool observing calls)
    __torch_function__ = classmethod(lanes.torch_function)
    backward = engine.tensor_backward  # y.backward(gradient, retain_graph, create_graph, inputs, show=False)

    def __new__(cls, data: Any = (), requires_grad: bool = False, dtype: Any = None, device: Any = None) -> "tracer":
        check_flag(requires_grad, "tt.tracer(): argument 'requires_grad'")
        t = _to_tensor(data, dtype, device).as_subclass(cls)
        if requires_grad:
            t.requires_grad_(True)
        return t

    def __repr__(self, **kwargs: Any) -> str:
        with plain_torch():
            text = torch.Tensor.__repr__(self, **kwargs)
        return text.replace("grad_fn=<Node>", f"grad_fn=<{self.grad_fn.name}>") if self._tt_node else text

    def _follow_base(self, reading: bool = False) -> None:
        """A view whose base changed in place since is now a view of the new value (as torch rebases it). A read of a
        flag (`reading`) on a piece of a multi-output view, which cannot follow its base, answers from what the piece
        was, as torch answers it; using the piece raises torch's error."""
        if self._tt_view:
            try:
                catch_up(self, self._tt_type, dispatch.run_rule)
            except RuntimeError:
                if not (reading and self._tt_piece):
                    raise

    @property
    def requires_grad(self) -> bool:
        self._follow_base(reading=True)
        return self._tt_requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        if type(flag) is not bool:
            raise RuntimeError("requires_grad must be a bool")
        if self._tt_node is not None:  # as torch: a non-leaf's flag is fixed (x.requires_grad_() alone passes)
            raise RuntimeError("you can only change requires_grad of leaf tracers; use .detach() on a non-leaf")
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad: bool = True) -> "tracer":
        """Make this leaf record gradients (torch's own autograd flag stays False underneath)."""
        check_flag(requires_grad, "requires_grad_(): argument 'requires_grad'")
        if self._tt_node is not None and not requires_grad:
            raise RuntimeError("you can only change requires_grad of leaf tracers; use .detach() on a non-leaf")
        if requires_grad:
            with plain_torch():
                if not (self.is_floating_point() or self.is_complex()):
                    raise RuntimeError(f"Only floating point tracers can require gradients, but this one has dtype "
                                       f"{self.dtype}. Convert it first, e.g. x = x.float().")
        self._tt_requires_grad = bool(requires_grad)
        return self

    @property
    def is_leaf(self) -> bool:
        self._follow_base(reading=True)
        return self._tt_node is None

    @property
    def grad_fn(self) -> Optional[Node]:
        self._follow_base()
        node = self._tt_node
        per_output = getattr(node.ctx, "grad_fn_of", None) if node is not None else None
        return node if per_output is None else per_output(self._tt_nr)  # a compiled call's: its statement's node

    @property
    def grad(self) -> Optional[torch.Tensor]:
        if self._tt_grad is None and self._tt_node is not None and not self.retains_grad:
            warnings.warn(NON_LEAF_GRAD_WARNING, UserWarning, stacklevel=2)
        return self._tt_grad

    @grad.setter
    def grad(self, value: Optional[torch.Tensor]) -> None:
        _check_grad(self, value)
        self._tt_grad = value

    @grad.deleter
    def grad(self) -> None:
        self._tt_grad = None

    def retain_grad(self) -> None:
        """Keep `.grad` on this non-leaf after backward."""
        self._follow_base()
        if not self._tt_requires_grad:  # (a leaf that requires grad keeps its .grad anyway: nothing to do)
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self._tt_node is not None:
            self._tt_node.retained = self._tt_node.retained or {}
            self._tt_node.retained[self._tt_nr] = weakref.ref(self)

    def set_(self, *args: Any, **kwargs: Any) -> "tracer":
        """torch's Tensor.set_ (a call torch never hands to __torch_function__): it has no derivative, so it is refused
        on a tracer that requires grad while grad mode is on (torch refuses it on a leaf at once, on a non-leaf at
        backward)."""
        if self._tt_requires_grad and torch.is_grad_enabled():
            raise RuntimeError("set_ on a tracer that requires grad: set_ has no derivative. Do it under tt.no_grad() "
                               "(as for a leaf in torch), or make a new tracer from the tensor instead.")
        with plain_torch():
            torch.Tensor.set_(self, *args, **kwargs)
        return self

    @property
    def retains_grad(self) -> bool:
        self._follow_base(reading=True)
        return self._tt_node is not None and self._tt_nr in (self._tt_node.retained or {})

    def register_hook(self, hook: Callable) -> RemovableHandle:
        """hook(grad) runs when this tracer's gradient is computed; a returned tensor replaces it."""
        self._follow_base()
        if not self._tt_requires_grad:
            raise RuntimeError("cannot register a hook on a tracer that doesn't require gradient")
        if self._tt_node is None:
            hooks = self._tt_hooks = self._tt_hooks if self._tt_hooks is not None else []
        else:
            self._tt_node.hooks = self._tt_node.hooks or {}
            hooks = self._tt_node.hooks.setdefault(self._tt_nr, [])
        hooks.append(hook)
        return RemovableHandle(hooks, hook)

    def register_post_accumulate_grad_hook(self, hook: Callable) -> RemovableHandle:
        """hook(leaf) runs after a backward has accumulated into this leaf's `.grad`."""
        if self._tt_node is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tracers")
        if not self._tt_requires_grad:
            raise RuntimeError("cannot register a hook on a tracer that doesn't require gradient")
        hooks = self._tt_post_hooks = self._tt_post_hooks if self._tt_post_hooks is not None else []
        hooks.append(hook)
        return RemovableHandle(hooks, hook)

    def detach(self) -> "tracer":
        with plain_torch():
            t = torch.Tensor.detach(self)
        t.__class__ = tracer  # a new tensor object: it becomes the tracer itself (cheaper than as_subclass)
        return t

    def detach_(self) -> "tracer":
        """Make this tracer a leaf that does not require grad (as torch's detach_)."""
        if self._tt_view:
            raise RuntimeError("detach_() cannot be called on a view of another tracer; use detach() instead")
        self._tt_node, self._tt_nr, self._tt_requires_grad = None, 0, False
        return self


tracer._tt_type = tracer  # what the dispatcher wraps results as (also for subclasses such as tt.nn.Parameter)


LANE_SWITCHES.append(functools.partial(use_lanes, tracer))  # its entry points: the lanes' or the readable path's
use_lanes(tracer, LANES_ON[0])


def check_flag(value: Any, argument: str) -> None:
    """requires_grad is a bool, as torch insists ('yes', 1 or None are refused in torch's words)."""
    if type(value) is not bool:
        raise TypeError(f"{argument} must be bool, not {type(value).__name__}")
