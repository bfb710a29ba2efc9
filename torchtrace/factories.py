"""tt.zeros, tt.ones, tt.rand, ... : torch's factory functions returning leaf tracers."""
from typing import Any, Callable

import numpy as np
import torch

from torchtrace.autograd.plain import plain_torch
from torchtrace.tracer import as_tracer, tracer


def _factory(torch_factory: Callable) -> Callable[..., tracer]:
    def make(*args: Any, requires_grad: bool = False, **kwargs: Any) -> tracer:
        with plain_torch():
            plain = torch_factory(*args, **kwargs)
        return as_tracer(plain, requires_grad)

    make.__name__ = torch_factory.__name__
    make.__doc__ = f"torch.{torch_factory.__name__}(...) as a leaf tracer (accepts requires_grad=)."
    return make


zeros = _factory(torch.zeros)
ones = _factory(torch.ones)
rand = _factory(torch.rand)
randn = _factory(torch.randn)
zeros_like = _factory(torch.zeros_like)
ones_like = _factory(torch.ones_like)
full = _factory(torch.full)
arange = _factory(torch.arange)
linspace = _factory(torch.linspace)
eye = _factory(torch.eye)


def from_numpy(array: np.ndarray, requires_grad: bool = False) -> tracer:
    """Share memory with a numpy array, as torch.from_numpy does."""
    return as_tracer(torch.from_numpy(array), requires_grad)
