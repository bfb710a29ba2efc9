"""What a low dtype did to a tensor, counted element by element against the same tensor computed in float32.

    underflow: nonzero in float32, exactly 0 in the low dtype (flushed: below half the smallest subnormal)
    overflow:  finite in float32, +-inf in the low dtype (above the largest finite value: 65504 for float16)
    subnormal: nonzero but below the smallest normal number of the low dtype (6.1e-5 for float16): kept with
               fewer significant bits, the last step before 0
Shares are of all the elements of the tensor.
"""
from dataclasses import dataclass
from typing import Iterable, Optional, Tuple

import torch

from torchtrace.autograd.plain import plain_torch


@dataclass
class Counts:
    """Element counts of one tensor (or several added up)."""

    elements: int = 0
    underflow: int = 0
    overflow: int = 0
    subnormal: int = 0

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(self.elements + other.elements, self.underflow + other.underflow,
                      self.overflow + other.overflow, self.subnormal + other.subnormal)

    def share(self, what: str) -> float:
        """getattr(self, what) / elements (0 for an empty tensor)."""
        return getattr(self, what) / self.elements if self.elements else 0.0


def count(low: Optional[torch.Tensor], reference: Optional[torch.Tensor], scale: float = 1.0,
          dtype: Optional[torch.dtype] = None) -> Counts:
    """Counts of `low` (the value a low-precision run computed, `scale` times the true one) against `reference`
    (the float32 run's value of the same tensor, unscaled). `dtype`: the one the value was computed in, when it
    was cast after: the subnormal range counted is the narrower dtype's of the two (a gradient computed in float16
    handed on in float32, or one computed in float32 by a float32-list rule and sent on in float16)."""
    if low is None or reference is None or low.shape != reference.shape or not low.is_floating_point():
        return Counts()
    with plain_torch():
        ref = reference.double() * scale
        tiny = max(torch.finfo(low.dtype).tiny, torch.finfo(dtype or low.dtype).tiny)
        underflow = (ref != 0) & (low == 0)
        overflow = torch.isfinite(ref) & torch.isinf(low)
        subnormal = (low != 0) & (low.abs() < tiny)
        return Counts(low.numel(), int(underflow.sum()), int(overflow.sum()), int(subnormal.sum()))


def count_all(pairs: Iterable[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]], scale: float = 1.0,
              dtype: Optional[torch.dtype] = None) -> Counts:
    total = Counts()
    for low, reference in pairs:
        total = total + count(low, reference, scale, dtype)
    return total


def relative_error(low: Optional[torch.Tensor], reference: Optional[torch.Tensor], scale: float = 1.0,
                   atol: float = 1e-12) -> float:
    """max |low / scale - reference| / max(max |low / scale|, max |reference|, atol) over the elements where both
    are finite; inf where only one of them is (an overflow), 0 where they are the same inf or NaN (a -inf mask)."""
    if low is None or reference is None:
        return 0.0 if low is None and reference is None else float("inf")
    if low.shape != reference.shape:
        return float("inf")
    with plain_torch():
        a, b = low.double() / scale, reference.double()
        finite_a, finite_b = torch.isfinite(a), torch.isfinite(b)
        same = (a == b) | (torch.isnan(a) & torch.isnan(b))
        if bool(((finite_a != finite_b) | (~finite_a & ~same)).any()):
            return float("inf")
        both = finite_a & finite_b
        if not bool(both.any()):
            return 0.0
        a, b = a[both], b[both]
        return float((a - b).abs().max()) / max(float(a.abs().max()), float(b.abs().max()), atol)
