"""The references a compiled gradient is compared with: torch autograd on plain copies, and finite differences."""
from typing import Callable, List, Sequence

import torch


def plain(t: torch.Tensor) -> torch.Tensor:
    return torch.Tensor.detach(t).as_subclass(torch.Tensor)


def finite_differences(fn: Callable[[], torch.Tensor], tensors: Sequence[torch.Tensor],
                       step: float = 1e-6) -> List[torch.Tensor]:
    """d fn() / d t for each plain float64 tensor t, by central differences (t is changed in place and put back)."""
    grads = []
    with torch.no_grad():
        for t in tensors:
            g = torch.zeros_like(t)
            flat, out = t.view(-1), g.view(-1)
            for k in range(flat.numel()):
                kept = flat[k].item()
                flat[k] = kept + step
                up = float(fn())
                flat[k] = kept - step
                down = float(fn())
                flat[k] = kept
                out[k] = (up - down) / (2 * step)
            grads.append(g)
    return grads


def torch_grads(fn: Callable[[], torch.Tensor], tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """torch autograd's d fn() / d t for plain leaves t, by backward() (which reentrant checkpoints need); their
    .grad is left as it was."""
    kept = [t.grad for t in tensors]
    for t in tensors:
        t.grad = None
    fn().backward()
    grads = [t.grad for t in tensors]
    for t, g in zip(tensors, kept):
        t.grad = g
    return grads
