"""Gradient rules for tensor-level torch ops, one module per family."""
from torchtrace.ops import (  # noqa: F401
    arithmetic,
    construction,
    differences,
    distances,
    indexing,
    linalg,
    linalg_decompositions,
    linalg_functions,
    linalg_inverse,
    nondifferentiable,
    pointwise,
    reduction,
    rounding,
    shape,
    softmax,
    special,
    trigonometric,
    view_copies,
)

