"""Gradient rules for tensor-level torch ops, one module per family."""
from torchtrace.autograd.dispatch import pair_inplace_methods
from torchtrace.ops import (  # noqa: F401
    arithmetic,
    indexing,
    linalg,
    linalg_decompositions,
    linalg_functions,
    linalg_inverse,
    nondifferentiable,
    pointwise,
    reduction,
    shape,
    softmax,
)

pair_inplace_methods()
