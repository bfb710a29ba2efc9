"""Gradient rules for tensor-level torch ops, one module per family."""
from torchtrace.autograd.dispatch import pair_inplace_methods
from torchtrace.ops import (  # noqa: F401
    arithmetic,
    construction,
    differences,
    distances,
    indexing,
    linalg,
    nondifferentiable,
    pointwise,
    reduction,
    shape,
    softmax,
    view_copies,
)

pair_inplace_methods()
