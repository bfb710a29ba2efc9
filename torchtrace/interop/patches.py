"""The one place torchtrace touches torch.autograd: it wraps a few of its entry points, never calls them on tracers.

Installed once at import (torchtrace/__init__.py). Each wrapper looks for a tracer among the arguments; calls with
none go to torch's original untouched.
- torch.autograd.Function.apply: a user Function on tracers runs its own forward/backward as a torchtrace node
  (torch.utils.checkpoint's reentrant CheckpointFunction becomes a recomputing torchtrace checkpoint instead); a
  TorchFunctionMode that asks for them (`sees_function_apply`: tt.compile's, which records the call as a statement)
  sees the call first, as it sees every torch call.
- torch.autograd.grad / torch.autograd.backward on tracers: answered by torchtrace's engine (tt.grad / tt.backward,
  the arguments bound as torch binds them), so torch code that calls them (a gradient penalty, torch's own
  torch.autograd.functional jacobian, hessian, vjp, jvp, hvp, vhp, written on torch.autograd.grad) runs on tracers.
  What still cannot serve tracers refuses them by name: functional's forward-mode strategy (torch's forward AD),
  torch.autograd.gradcheck / gradgradcheck (their undefined-gradient check applies one of torch's C++ Functions;
  tt.gradcheck is torchtrace's), torch.autograd.graph.register_multi_grad_hook (an AssertionError from torch's
  engine).
- torch.distributed's collectives, which write their tensors in place below torch's dispatch (no rule sees them), on a
  tracer of the graph (a result that requires grad) with grad mode on: a clear error naming
  torch.distributed.nn.functional (differentiable) or t.detach(). Unrecorded, backward took them for the identity
  (torch warns that it may be silently incorrect). A leaf (dist.broadcast(p, 0) of a parameter) goes to torch.
- torch.nn.parallel.DistributedDataParallel around a module with tracer parameters: a clear error naming
  tt.nn.parallel.DistributedDataParallel (torch's C++ reducer hooks torch autograd's gradient accumulators, which
  tracers do not have: its construction crashed the process).
"""
import inspect
import warnings
from typing import Any, Callable

import torch
import torch.autograd
import torch.autograd.function
import torch.distributed
import torch.utils.checkpoint
from torch.overrides import _get_current_function_mode_stack as _current_function_mode_stack

from torchtrace.autograd import engine
from torchtrace.errors import UnsupportedOperationError
from torchtrace.interop.detect import has_tracer, tensors_in
from torchtrace.interop.function_bridge import apply_on_tracers
from torchtrace.tracer import tracer as TRACER

_Function = torch.autograd.function.Function
_base_setup_context = torch.autograd.function._SingleLevelFunction.setup_context


def _wrapping(original: Callable, wrapper: Callable) -> Callable:
    """`wrapper` marked as torchtrace's wrapper of `original` (install() stays idempotent), under its name and doc."""
    wrapper.__wrapped__, wrapper._torchtrace = original, True
    wrapper.__name__, wrapper.__doc__ = original.__name__, original.__doc__
    return wrapper


def _apply(original: Callable) -> classmethod:
    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        if not has_tracer(args) and not has_tracer(kwargs.values()):
            return original(cls, *args, **kwargs)
        if torch._C._is_torch_function_mode_enabled() and any(
                getattr(mode, "sees_function_apply", False) for mode in _current_function_mode_stack()):
            return torch.overrides.handle_torch_function(cls.apply, tensors_in((args, kwargs)), *args, **kwargs)
        if cls is torch.utils.checkpoint.CheckpointFunction:
            from torchtrace.interop.checkpoint import checkpoint

            function, preserve_rng_state, *inputs = args
            return checkpoint(function, *inputs, preserve_rng_state=preserve_rng_state)
        return apply_on_tracers(cls, cls.setup_context is not _base_setup_context, args, kwargs)

    _wrapping(original, apply)
    apply.__doc__ = "torch's Function.apply; on tracers the Function runs as a torchtrace node (torchtrace.interop)."
    return classmethod(apply)


def _refuse_on_tracers(original: Callable, name: str, instead: str) -> Callable:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if has_tracer(args) or has_tracer(kwargs.values()):
            raise UnsupportedOperationError(f"{name}: torch's autograd does not see tracers (torchtrace records "
                                            f"their graph itself) — {instead}")
        return original(*args, **kwargs)

    return _wrapping(original, wrapper)


def _answer_on_tracers(original: Callable, answer: Callable) -> Callable:
    """torch's `original`, except that a call with a tracer among its arguments goes to `answer`, given the arguments
    as torch's signature binds them (by name: what the caller passed, positionally or not)."""
    signature = inspect.signature(original)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if has_tracer(args) or has_tracer(kwargs.values()):
            return answer(**signature.bind(*args, **kwargs).arguments)
        return original(*args, **kwargs)

    return _wrapping(original, wrapper)


def _grad(only_inputs: bool = True, **arguments: Any) -> Any:
    """torch.autograd.grad on tracers: tt.grad (only_inputs, deprecated, is ignored as torch ignores it)."""
    if not only_inputs:
        warnings.warn("only_inputs argument is deprecated and is ignored now (defaults to True). To accumulate "
                      "gradient for other parts of the graph, please use torch.autograd.backward.", FutureWarning,
                      stacklevel=3)
    return engine.grad(**arguments)


def _backward(grad_variables: Any = None, **arguments: Any) -> None:
    """torch.autograd.backward on tracers: tt.backward (grad_variables, deprecated, is grad_tensors, as in torch)."""
    if grad_variables is not None:
        warnings.warn("`grad_variables` is deprecated. Use `grad_tensors` instead.", FutureWarning, stacklevel=3)
        if arguments.get("grad_tensors") is not None:
            raise RuntimeError("`grad_tensors` and `grad_variables` (deprecated) arguments both passed to "
                               "`backward()`. Please only use `grad_tensors`.")
        arguments["grad_tensors"] = grad_variables
    return engine.backward(**arguments)


def _refuse_forward_mode(original: Callable, name: str) -> Callable:
    """torch.autograd.functional's jacobian / hessian: torch's own on tracers (on torch.autograd.grad, which
    torchtrace answers), except the forward-mode strategy (by name or by position), which runs torch's forward AD."""
    signature = inspect.signature(original)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if (has_tracer(args) or has_tracer(kwargs.values())) and "forward-mode" in (
                (bound := signature.bind(*args, **kwargs).arguments).get("strategy"),
                bound.get("outer_jacobian_strategy")):
            raise UnsupportedOperationError(
                f"torch.autograd.functional.{name}: its forward-mode strategy runs torch's forward AD, which does "
                f"not see tracers — use tt.jacobian(f, x, mode='forward'), or strategy='reverse-mode'")
        return original(*args, **kwargs)

    return _wrapping(original, wrapper)


def _refuse_on_graph(original: Callable, name: str) -> Callable:
    def collective(*args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and any(isinstance(t, TRACER) and t._tt_requires_grad and t._tt_node is not None
                                           for t in tensors_in((*args, *kwargs.values()))):
            raise UnsupportedOperationError(
                f"torch.distributed.{name} writes a result that requires grad in place, and no gradient rule can "
                "follow it (backward would take it for the identity): use torch.distributed.nn.functional's "
                f"{name} where it exists (differentiable), or communicate a value without its graph (t.detach()), "
                "or run it under tt.no_grad()")
        return original(*args, **kwargs)

    return _wrapping(original, collective)


def _refuse_tracer_module(original: Callable) -> Callable:
    def __init__(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(module, torch.nn.Module) and any(isinstance(p, TRACER) for p in module.parameters()):
            raise UnsupportedOperationError(
                "torch.nn.parallel.DistributedDataParallel: this module's parameters are tracers, whose gradients "
                "torch's reducer cannot see (it hooks torch autograd's engine) — use "
                "tt.nn.parallel.DistributedDataParallel(module, ...) (same arguments), which averages them in "
                "torchtrace's backward")
        original(self, module, *args, **kwargs)

    return _wrapping(original, __init__)


COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "scatter", "gather", "send", "recv",
               "isend", "irecv")

def install() -> None:
    """Wrap torch's entry points once (idempotent)."""
    apply = _Function.__dict__["apply"]
    if not getattr(apply.__func__, "_torchtrace", False):
        _Function.apply = _apply(apply.__func__)
    if not getattr(torch.autograd.grad, "_torchtrace", False):
        torch.autograd.grad = _answer_on_tracers(torch.autograd.grad, _grad)
    if not getattr(torch.autograd.backward, "_torchtrace", False):
        torch.autograd.backward = _answer_on_tracers(torch.autograd.backward, _backward)
    for name in ("jacobian", "hessian"):
        original = getattr(torch.autograd.functional, name)
        if not getattr(original, "_torchtrace", False):
            setattr(torch.autograd.functional, name, _refuse_forward_mode(original, name))
    for name in ("gradcheck", "gradgradcheck"):
        original = getattr(torch.autograd, name)
        if not getattr(original, "_torchtrace", False):
            setattr(torch.autograd, name, _refuse_on_tracers(
                original, f"torch.autograd.{name}", f"use tt.{name}(fn, *inputs), torchtrace's own"))
    if torch.distributed.is_available():
        for name in COLLECTIVES:
            original = getattr(torch.distributed, name)
            if not getattr(original, "_torchtrace", False):
                setattr(torch.distributed, name, _refuse_on_graph(original, name))
        ddp = torch.nn.parallel.DistributedDataParallel
        if not getattr(ddp.__init__, "_torchtrace", False):
            ddp.__init__ = _refuse_tracer_module(ddp.__init__)
    multi = torch.autograd.graph.register_multi_grad_hook
    if not getattr(multi, "_torchtrace", False):  # (it asks torch's engine which tensors a backward reaches)
        torch.autograd.graph.register_multi_grad_hook = _refuse_on_tracers(
            multi, "torch.autograd.graph.register_multi_grad_hook",
            "register a hook on each tensor instead (t.register_hook(fn)), and combine what they receive")
