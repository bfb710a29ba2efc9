"""Gradient rules for tensor-level torch ops, one module per family."""
from torchtrace.autograd.dispatch import pair_inplace_methods
from torchtrace.ops import arithmetic, indexing, linalg, nondifferentiable, pointwise, reduction, shape  # noqa: F401

pair_inplace_methods()
