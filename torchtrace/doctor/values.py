"""Plain-number summaries of tensors for the doctor's messages (computed without recording anything)."""
from typing import Any, List

import torch

from torchtrace.autograd.plain import plain_torch


def tensors_in(values: Any) -> List[torch.Tensor]:
    """The floating-point tensors among `values` (one level of lists and tuples, as torch calls take them)."""
    items = values if isinstance(values, (list, tuple)) else [values]
    found = []
    for item in items:
        if isinstance(item, (list, tuple)):
            found.extend(t for t in item if isinstance(t, torch.Tensor) and t.is_floating_point())
        elif isinstance(item, torch.Tensor) and item.is_floating_point():
            found.append(item)
    return found


def has_nan(values: Any) -> bool:
    with plain_torch():
        return any(bool(torch.isnan(t).any()) for t in tensors_in(values))


def has_inf(values: Any) -> bool:
    with plain_torch():
        return any(bool(torch.isinf(t).any()) for t in tensors_in(values))


def all_finite(values: Any) -> bool:
    with plain_torch():
        return all(bool(torch.isfinite(t).all()) for t in tensors_in(values))


def count(mask: torch.Tensor) -> int:
    with plain_torch():
        return int(mask.sum())


def describe(t: torch.Tensor) -> str:
    """`shape (4, 3): 2 zeros, 1 negative, min -0.5, max 3`: what a reader needs to see why a rule failed."""
    with plain_torch():
        x = t.detach().double()
        finite = x[torch.isfinite(x)]
        parts = [f"shape {tuple(t.shape)}"]
        for label, n in (("zeros", count(x == 0)), ("negatives", count(x < 0)), ("NaN", count(torch.isnan(x))),
                         ("+inf", count(x == float("inf"))), ("-inf", count(x == float("-inf")))):
            if n:
                parts.append(f"{n} {label}")
        if finite.numel():
            parts.append(f"min {finite.min().item():.3g}, max {finite.max().item():.3g}")
    return ", ".join(parts)
