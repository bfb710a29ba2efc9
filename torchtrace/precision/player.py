"""report.explore(): the player of the low-precision backward with each node marked by what the low dtype did there.

A data layer only: every node gets one mark whose kind is the dtype it ran in and whose severity colours it
(info: float32, warn: the low dtype, error: some of its values or gradients underflowed or overflowed); the
message says why autocast chose that dtype and shows the float32 value beside the low-precision one.
"""
from typing import Any, Dict, List, Optional

import torch

from torchtrace.autograd.plain import plain_torch
from torchtrace.doctor.recording import Pass

SHOWN = 4  # values shown of each tensor


def _preview(t: Optional[torch.Tensor]) -> str:
    if t is None:
        return "-"
    with plain_torch():
        values = t.detach().flatten()[:SHOWN].double().tolist()
    return "[" + ", ".join(f"{v:.4g}" for v in values) + (", ...]" if t.numel() > SHOWN else "]")


def _describe(row: Any, dtype: str) -> str:
    what = "value" if row.phase == "forward" else "gradient sent"
    return (f"{row.phase}: {what} in {dtype} ({row.why}); underflow {row.underflow:.1%}, subnormal "
            f"{row.subnormal:.1%}, overflow {row.overflow:.1%}, rel. error {row.rel_error:.2e}; float32 "
            f"{_preview(row.reference)} vs {dtype} {_preview(row.value)}")


def in_player(report: Any, rerun: Pass) -> Any:
    """The player of `rerun` (the low-precision run again, through tt.explore) with the report's rows marked."""
    marks: Dict[Any, List[Any]] = {}
    for row in report.rows:
        node = rerun.recorded[row.index] if row.phase == "forward" else rerun.steps[row.index].node
        marks.setdefault(node, []).append(row)
    for node, rows in marks.items():
        dtype = next((str(r.dtype).replace("torch.", "") for r in rows if r.dtype is not None), "-")
        damaged = any(r.underflow > 0 or r.overflow > 0 for r in rows)
        severity = "error" if damaged else ("info" if dtype == "float32" else "warn")
        try:
            rerun.explorer.annotate(node, dtype, " | ".join(_describe(r, dtype) for r in rows), severity)
        except ValueError:  # an op whose value does not reach the loss is not on the page
            continue
    return rerun.explorer
