"""How the player writes a tensor: every number up to FULL elements, else its shape and a summary.

Python makes these texts once; the page only displays them, so `str(step)` and the browser show the
same numbers.
"""
from typing import Any, List, Optional

import torch

from torchtrace.autograd.plain import plain_torch

FULL = 16  # tensors with at most this many elements are written in full


def number(value: float) -> str:
    """Four significant digits in plain notation where it reads well: 6, -0.5, 0.3333, 1e-07; NaN, inf, -inf."""
    return "NaN" if value != value else f"{value + 0.0:.4g}"


def nested(values: Any) -> str:
    """A number, or nested lists of numbers, as `[[1, 2], [3, NaN]]`."""
    if isinstance(values, list):
        return "[" + ", ".join(nested(v) for v in values) + "]"
    return number(values)


def plain(t: torch.Tensor) -> torch.Tensor:
    """A detached plain-tensor copy (tracers included), safe to keep after the graph is gone."""
    with plain_torch():
        return t.detach().as_subclass(torch.Tensor).clone()


def tensor_text(t: Optional[torch.Tensor]) -> str:
    """`6`, `[1, -0.5]`, `[[1, 2], [3, 4]]`, or `(64, 10): mean 0.01, min -0.9, max 1.2` for a large tensor (which
    counts its NaN and infinite elements first, and summarises the finite ones)."""
    if t is None:
        return "—"
    with plain_torch():
        t = t.detach()
        if not t.is_floating_point():
            t = t.double()
        if t.numel() <= FULL:
            return nested(t.double().tolist())
        d = t.double()
        finite = d.isfinite()
        bad = ""
        if not bool(finite.all()):
            nan, inf = int(d.isnan().sum()), int(d.isinf().sum())
            bad = ", ".join(f"{k} {what}" for k, what in ((nan, "NaN"), (inf, "inf")) if k) + f" of {d.numel()}; "
            d = d[finite]
            if not d.numel():
                return f"{shape_text(t.shape)}: {bad[:-2]}"
            bad += "finite: "
        return (f"{shape_text(t.shape)}: {bad}mean {number(d.mean().item())}, min {number(d.min().item())}, "
                f"max {number(d.max().item())}")


def shape_text(shape: Any) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def matrix_text(rows: List[List[float]]) -> str:
    """A Jacobian: `diag [..]` when only its diagonal is non-zero, else its rows."""
    square = len(rows) == len(rows[0]) if rows else False
    if square and len(rows) > 1 and all(v == 0 for i, row in enumerate(rows) for j, v in enumerate(row) if i != j):
        return "diag " + nested([row[i] for i, row in enumerate(rows)])
    return nested(rows[0][0] if len(rows) == 1 and len(rows[0]) == 1 else rows)
