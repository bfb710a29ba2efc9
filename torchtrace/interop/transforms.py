"""torch.vmap, torch.func transforms and torch.compile on tracers: a clear error at the call, never a silent gradient.

These run torch's own machinery (functorch levels, dynamo), which cannot see torchtrace's graph. The wrappers
installed here check the arguments of each call; calls without tracers go to torch's original untouched.
"""
import functools
from typing import Any, Callable, Optional

import torch
import torch.func
from torch.overrides import TorchFunctionMode

from torchtrace.autograd.function import RULES
from torchtrace.errors import UnsupportedOperationError
from torchtrace.interop.detect import has_tracer, tensors_in

TRANSFORMS = ("vmap", "grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian", "linearize",
              "functionalize")


def _check(name: str, args: tuple, kwargs: dict, instead: str) -> None:
    if has_tracer(args) or has_tracer(kwargs.values()):
        raise UnsupportedOperationError(f"{name}: not supported on tracers (torch's transforms cannot see "
                                        f"torchtrace's graph) — {instead}")


class _RefuseTracersInside(TorchFunctionMode):
    """While a transformed function runs: a differentiable torch call on a tracer that requires grad (one the
    function closes over, as a model's parameter) is refused; torch's transform would give a plain result with no
    gradient to it, and a loss that adds it would miss that part of the gradient without a word. Tracers needing no
    grad (a ported model's buffers) compute as plain tensors."""

    def __init__(self, name: str, instead: str):
        super().__init__()
        self.name, self.instead = name, instead

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if func in RULES and torch.is_grad_enabled() and any(  # (detach, shape and the like record nothing)
                getattr(t, "_tt_requires_grad", False) for t in tensors_in((args, kwargs))):
            raise UnsupportedOperationError(
                f"{self.name}: the function uses a tracer that requires grad (a parameter or value it closes over), "
                f"whose gradient torch's transform cannot see (torchtrace records it) — {self.instead}")
        return func(*args, **kwargs)


def _transform(original: Callable, name: str) -> Callable:
    """`torch.func.grad(f)(x)`: refuse when the transformed function (or the transform itself) gets a tracer."""
    instead = ("use tt.grad for gradients, and a Python loop (or torch.stack of per-sample results) instead of "
               "vmap" if name != "torch.func.functionalize" else "call the function directly")

    @functools.wraps(original)
    def transform(*args: Any, **kwargs: Any) -> Any:
        _check(name, args, kwargs, instead)  # vjp(f, x) and jvp(f, (x,), (v,)) take the primals here
        with _RefuseTracersInside(name, instead):  # vjp(f, x) and jvp(f, ...) run f here
            result = original(*args, **kwargs)
        if not callable(result):
            return result

        @functools.wraps(result)
        def transformed(*a: Any, **k: Any) -> Any:
            _check(name, a, k, instead)
            with _RefuseTracersInside(name, instead):
                return result(*a, **k)

        return transformed

    transform._torchtrace = True
    return transform


def _compile(original: Callable) -> Callable:
    """torch.compile(fn)(tracer): dynamo would trace torch's own autograd, not torchtrace's: refuse clearly."""
    instead = ("use tt.compile(fn, example_inputs) instead: it compiles torchtrace's forward and backward — or call "
               "the function or module eagerly")

    @functools.wraps(original)
    def compile(model: Any = None, **kwargs: Any) -> Any:
        if model is None:  # used as @torch.compile(mode=...)
            return lambda m: compile(m, **kwargs)
        compiled = original(model, **kwargs)
        if isinstance(compiled, torch.nn.Module):
            def refuse(module: Any, args: tuple, kw: dict) -> None:
                _check("torch.compile", args, kw, instead)
                if any(isinstance(p, torch.Tensor) and has_tracer([p]) for p in module.parameters()):
                    raise UnsupportedOperationError("torch.compile: the module's parameters are tracers, which "
                                                    f"torch.compile cannot differentiate — {instead}")
            compiled.register_forward_pre_hook(refuse, with_kwargs=True)
            return compiled

        @functools.wraps(model)
        def run(*args: Any, **kw: Any) -> Any:
            _check("torch.compile", args, kw, instead)
            return compiled(*args, **kw)

        return run

    compile._torchtrace = True
    return compile


def install() -> None:
    """Wrap torch.vmap, the torch.func transforms and torch.compile once (idempotent)."""
    for name in TRANSFORMS:
        original = getattr(torch.func, name, None)
        if original is None or getattr(original, "_torchtrace", False):
            continue
        wrapped = _transform(original, f"torch.func.{name}" if name != "vmap" else "torch.vmap")
        setattr(torch.func, name, wrapped)
        if getattr(torch, name, None) is original:
            setattr(torch, name, wrapped)
    if not getattr(torch.compile, "_torchtrace", False):
        torch.compile = _compile(torch.compile)
