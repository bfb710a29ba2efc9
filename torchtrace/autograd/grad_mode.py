"""Recording on/off. torchtrace shares torch's grad-mode flag, so `torch.no_grad()` stops recording too."""
import functools
import inspect
from typing import Any, Callable, Optional

import torch

is_grad_enabled = torch.is_grad_enabled


class _GradMode:
    """Context manager and decorator (`@tt.no_grad()` or `@tt.no_grad`) that sets the grad-mode flag."""

    enabled: bool

    def __new__(cls, fn: Optional[Callable] = None) -> Any:
        mode = super().__new__(cls)
        return mode if fn is None else mode(fn)

    def __enter__(self) -> None:
        self._previous = torch.is_grad_enabled()
        torch.set_grad_enabled(self.enabled)

    def __exit__(self, *exc: Any) -> None:
        torch.set_grad_enabled(self._previous)

    def __call__(self, fn: Callable) -> Callable:
        """Wrap fn so it runs in this mode; a generator runs in it each time it is resumed (as torch's)."""
        mode = type(self)
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def generator(*args: Any, **kwargs: Any) -> Any:
                inner, request = fn(*args, **kwargs), None
                while True:
                    with mode():
                        try:
                            response = inner.send(request)
                        except StopIteration as stop:
                            return stop.value
                    request = yield response

            return generator

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with mode():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_GradMode):
    """Stop recording: ops on tracers compute values only (as `torch.no_grad()`)."""

    enabled = False


class enable_grad(_GradMode):
    """Resume recording inside a `no_grad` block."""

    enabled = True
