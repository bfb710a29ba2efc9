"""float16 and bfloat16 values computed in float32, as torch's kernels compute them ("opmath").

A backward that squares, sums or subtracts low-precision values loses them: a float16 square overflows past 256 (an
RMS norm's gradient became exactly 0), a bfloat16 difference of near-equal sums cancels (softmax's gradient 30% off).
torch's fused kernels accumulate in float32; so do the rules that call `opmath` on what their backward reads. The
engine casts each gradient back to its input's dtype (node.edge_gradient).
"""
import functools
from typing import Any, Callable, Tuple

import torch

LOW_PRECISION = (torch.float16, torch.bfloat16)


def opmath(*tensors: Any) -> Tuple[Any, ...]:
    """Each float16 / bfloat16 tensor as float32 (differentiable, under create_graph); anything else as it is."""
    return tuple(t.float() if isinstance(t, torch.Tensor) and t.dtype in LOW_PRECISION else t for t in tensors)


def in_float32(formula: Callable, dtypes: Tuple[torch.dtype, ...] = LOW_PRECISION) -> Callable:
    """`formula` as torch's fused backward kernels compute it (tanh_backward, silu_backward, ...): values of `dtypes`
    taken to float32 and the gradient rounded once (the engine casts it to the input's dtype), not rounded to the low
    dtype after every step. Other dtypes: the formula as written. (torch's CPU sigmoid_backward does this for bfloat16
    only: float16 computes in float16.)"""
    @functools.wraps(formula)
    def fused(g: Any, *values: Any, **options: Any) -> Any:
        if g.dtype in dtypes:
            g, *values = opmath(g, *values)
        return formula(g, *values, **options)

    return fused
