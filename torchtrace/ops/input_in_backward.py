"""The first derivative of an op whose torch backward kernel takes the forward's input: it reads that input too.

torch differentiates pooling, reflect / replicate padding, prelu and rrelu with kernels of their own
(max_pool2d_with_indices_backward(grad, self, ...)), whose derivative toward `self` is zeros. Under create_graph=True
their result therefore requires grad whenever the input does, and a second backward through it gives the input zeros,
as for any op whose gradient depends on its input. torchtrace's formulas need only g and what forward kept (indices,
shapes), so their result did not reach the input: a gradient penalty left its .grad None, and tt.grad of the first
derivative raised that nothing required grad. `reading_input` makes the formula's result read the input with a zero
derivative: where(False, x, dx) is dx itself, and its derivative toward x is where(False, ., 0) = 0.
"""
from typing import Optional

import torch


def reading_input(dx: Optional[torch.Tensor], x: torch.Tensor) -> Optional[torch.Tensor]:
    """dx, read with the input x at derivative zero, while a create_graph backward records the rule's calls and x
    requires grad (of x's shape and dtype); dx as it is otherwise (a plain backward records nothing)."""
    if (dx is None or not torch.is_grad_enabled() or not getattr(x, "_tt_requires_grad", False)
            or dx.shape != x.shape or dx.dtype != x.dtype):
        return dx
    return torch.where(torch.zeros((), dtype=torch.bool, device=x.device), x, dx)
