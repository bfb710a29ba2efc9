"""The one place torchtrace touches torch.autograd: it wraps a few of its entry points, never calls them on tracers.

Installed once at import (torchtrace/__init__.py). Each wrapper looks for a tracer among the arguments; calls with
none go to torch's original untouched.
- torch.autograd.Function.apply: a user Function on tracers runs its own forward/backward as a torchtrace node
  (torch.utils.checkpoint's reentrant CheckpointFunction becomes a recomputing torchtrace checkpoint instead).
- torch.autograd.grad / torch.autograd.backward on tracers: a clear error naming tt.grad / y.backward(), and
  torch.autograd.functional's jacobian, hessian, vjp, jvp, hvp, vhp one naming torchtrace's own;
  torch.autograd.graph.register_multi_grad_hook on tracers (an AssertionError from torch's engine): one too.
"""
from typing import Any, Callable

import torch
import torch.autograd
import torch.autograd.function
import torch.utils.checkpoint

from torchtrace.errors import UnsupportedOperationError
from torchtrace.interop.detect import has_tracer
from torchtrace.interop.function_bridge import apply_on_tracers

_Function = torch.autograd.function.Function
_base_setup_context = torch.autograd.function._SingleLevelFunction.setup_context


def _apply(original: Callable) -> classmethod:
    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        if not has_tracer(args) and not has_tracer(kwargs.values()):
            return original(cls, *args, **kwargs)
        if cls is torch.utils.checkpoint.CheckpointFunction:
            from torchtrace.interop.checkpoint import checkpoint

            function, preserve_rng_state, *inputs = args
            return checkpoint(function, *inputs, preserve_rng_state=preserve_rng_state)
        return apply_on_tracers(cls, cls.setup_context is not _base_setup_context, args, kwargs)

    apply.__wrapped__, apply._torchtrace = original, True
    apply.__doc__ = "torch's Function.apply; on tracers the Function runs as a torchtrace node (torchtrace.interop)."
    return classmethod(apply)


def _refuse_on_tracers(original: Callable, name: str, instead: str) -> Callable:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if has_tracer(args) or has_tracer(kwargs.values()):
            raise UnsupportedOperationError(f"{name}: torch's autograd does not see tracers (torchtrace records "
                                            f"their graph itself) — {instead}")
        return original(*args, **kwargs)

    wrapper.__wrapped__, wrapper._torchtrace = original, True
    wrapper.__name__, wrapper.__doc__ = original.__name__, original.__doc__
    return wrapper


FUNCTIONAL = {  # torch.autograd.functional's entry points, and torchtrace's own to use on tracers
    "jacobian": "use tt.jacobian(f, inputs)", "hessian": "use tt.hessian(f, x)",
    "vjp": "use tt.grad(f(x), x, grad_outputs=v)", "jvp": "use tt.jvp(f, primals, tangents)",
    "hvp": "use tt.hvp(f, params, v)", "vhp": "use tt.hvp(f, params, v) (the Hessian is symmetric: vhp = hvp)"}


def install() -> None:
    """Wrap torch's entry points once (idempotent)."""
    apply = _Function.__dict__["apply"]
    if not getattr(apply.__func__, "_torchtrace", False):
        _Function.apply = _apply(apply.__func__)
    if not getattr(torch.autograd.grad, "_torchtrace", False):
        torch.autograd.grad = _refuse_on_tracers(
            torch.autograd.grad, "torch.autograd.grad", "use tt.grad(outputs, inputs, ...) (same arguments)")
    if not getattr(torch.autograd.backward, "_torchtrace", False):
        torch.autograd.backward = _refuse_on_tracers(
            torch.autograd.backward, "torch.autograd.backward", "use y.backward() or tt.backward(tensors, ...)")
    for name, instead in FUNCTIONAL.items():  # (they call torch.autograd.grad, whose refusal would name that)
        original = getattr(torch.autograd.functional, name)
        if not getattr(original, "_torchtrace", False):
            setattr(torch.autograd.functional, name,
                    _refuse_on_tracers(original, f"torch.autograd.functional.{name}", instead))
    multi = torch.autograd.graph.register_multi_grad_hook
    if not getattr(multi, "_torchtrace", False):  # (it asks torch's engine which tensors a backward reaches)
        torch.autograd.graph.register_multi_grad_hook = _refuse_on_tracers(
            multi, "torch.autograd.graph.register_multi_grad_hook",
            "register a hook on each tensor instead (t.register_hook(fn)), and combine what they receive")
