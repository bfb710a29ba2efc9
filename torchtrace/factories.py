"""tt.zeros, tt.ones, tt.rand, ... : torch's factory functions returning leaf tracers."""
from typing import Any, Callable

import numpy as np
import torch

from torchtrace.autograd.plain import plain_torch
from torchtrace.tracer import check_flag, tracer


def as_tracer(tensor: torch.Tensor, requires_grad: bool = False) -> tracer:
    """Wrap `tensor` as a tracer without copying (the storage is shared): a new leaf. A tensor that requires grad in
    torch autograd (a torch leaf, or one it computed) is refused: no gradient would reach it or its leaves."""
    check_flag(requires_grad, "tt.as_tracer(): argument 'requires_grad'")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tt.as_tracer wraps a torch.Tensor without copying it, not a {type(tensor).__name__}: for "
                        "lists, numbers or numpy arrays use tt.tracer(data)")
    if not isinstance(tensor, tracer) and tensor.requires_grad:
        made = "a torch leaf" if tensor.grad_fn is None else f"grad_fn={tensor.grad_fn.name()}"
        raise RuntimeError(f"tt.as_tracer: the tensor requires grad in torch autograd ({made}); a tracer made of it "
                           "would be a new leaf, and no gradient would reach the tensor or its leaves. Make those "
                           "leaves tracers (tt.as_tracer(x.detach(), requires_grad=True)) and compute with them, or "
                           "pass tensor.detach() to start a new leaf here.")
    with plain_torch():
        t = tensor.detach().as_subclass(tracer)
    if requires_grad:
        t.requires_grad_(True)
    return t


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
