"""Mixed precision explained: tt.precision(fn, *args, dtype=...) runs fn under torch.autocast and in float32 and
says, per op and per rule, which dtype it ran in and why, what underflowed or overflowed, and how far it is from
float32; tt.precision.training(model, optimizer, scaler) watches a GradScaler loop step by step.

    r = tt.precision(loss_fn, x, y, dtype=torch.float16)               # r.rows, r.top(5), print(r), r.explore()
    r = tt.precision(loss_fn, x, y, dtype=torch.float16, scale=2.0 ** 16)   # the same after loss scaling
    with tt.precision.training(model, optimizer, scaler) as p: ...     # p.steps: .scale, .skipped, .first_inf

This package is itself callable (`tt.precision(...)` is `tt.precision.precision(...)`).
"""
import sys
import types
from typing import Any

from torchtrace.autocast_lists import why
from torchtrace.precision.counts import Counts, count
from torchtrace.precision.report import PrecisionReport
from torchtrace.precision.rows import Row
from torchtrace.precision.run import precision
from torchtrace.precision.training import FirstInf, PrecisionTraining, Step, training

__all__ = ["precision", "training", "PrecisionReport", "Row", "PrecisionTraining", "Step", "FirstInf", "Counts",
           "count", "why"]


class _CallablePackage(types.ModuleType):
    """The package object answers a call as precision() does, so `tt.precision(fn, ...)` and
    `tt.precision.training(...)` are both spelled from the one name."""

    def __call__(self, fn: Any, *args: Any, **kwargs: Any) -> PrecisionReport:
        return precision(fn, *args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
