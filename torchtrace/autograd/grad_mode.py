"""Recording on/off. torchtrace shares torch's grad-mode flag, so `torch.no_grad()` stops recording too."""
import functools
from typing import Any, Callable

import torch

is_grad_enabled = torch.is_grad_enabled


class _GradMode:
    """Context manager and decorator that sets the grad-mode flag and restores it on exit."""

    enabled: bool

    def __enter__(self) -> None:
        self._previous = torch.is_grad_enabled()
        torch.set_grad_enabled(self.enabled)

    def __exit__(self, *exc: Any) -> None:
        torch.set_grad_enabled(self._previous)

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with type(self)():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_GradMode):
    """Stop recording: ops on tracers compute values only (as `torch.no_grad()`)."""

    enabled = False


class enable_grad(_GradMode):
    """Resume recording inside a `no_grad` block."""

    enabled = True
