"""float16 and bfloat16 values computed in float32, as torch's kernels compute them ("opmath").

A backward that squares, sums or subtracts low-precision values loses them: a float16 square overflows past 256 (an
RMS norm's gradient became exactly 0), a bfloat16 difference of near-equal sums cancels (softmax's gradient 30% off).
torch's fused kernels accumulate in float32; so do the rules that call `opmath` on what their backward reads. The
engine casts each gradient back to its input's dtype (node.edge_gradient).
"""
from typing import Any, Tuple

import torch

LOW_PRECISION = (torch.float16, torch.bfloat16)


def opmath(*tensors: Any) -> Tuple[Any, ...]:
    """Each float16 / bfloat16 tensor as float32 (differentiable, under create_graph); anything else as it is."""
    return tuple(t.float() if isinstance(t, torch.Tensor) and t.dtype in LOW_PRECISION else t for t in tensors)
