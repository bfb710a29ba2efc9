"""One row of a precision report: an op of the forward, or a rule of the backward, run under torch.autocast and
compared with the same op of a float32 run."""
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from torchtrace.precision.counts import Counts


@dataclass
class Row:
    """An op (phase "forward": its value) or a rule (phase "backward": the gradients it sent) of the low-precision
    run, beside the float32 run's."""

    rule: str
    module: str
    line: str
    phase: str  # "forward" or "backward"
    dtype: Optional[torch.dtype]  # what the op ran in under autocast (the dtype of its result / of what it sent)
    why: str  # "lower-precision list", "float32 list" or "promoted"
    counts: Counts
    rel_error: float  # max |low / scale - float32| / max(|low / scale|, |float32|), as tt.diff measures
    value: Optional[torch.Tensor] = field(default=None, repr=False)  # the low-precision value (scaled, in backward)
    reference: Optional[torch.Tensor] = field(default=None, repr=False)  # the float32 run's value
    node: Any = field(default=None, repr=False)  # the low-precision run's graph node
    index: int = -1  # the place of the op in the recording (forward) or of the rule in the backward

    @property
    def underflow(self) -> float:
        """Share of elements nonzero in float32 and 0 in the low dtype."""
        return self.counts.share("underflow")

    @property
    def overflow(self) -> float:
        """Share of elements finite in float32 and inf in the low dtype."""
        return self.counts.share("overflow")

    @property
    def subnormal(self) -> float:
        """Share of elements kept as subnormal numbers of the low dtype (nonzero, below its smallest normal)."""
        return self.counts.share("subnormal")

    def __str__(self) -> str:
        dtype = str(self.dtype).replace("torch.", "") if self.dtype is not None else "-"
        where = " ".join(p for p in (f"in {self.module}" if self.module else "", f"at {self.line}" if self.line
                                     else "") if p)
        return (f"{self.phase:8} {self.rule:22} {dtype:9} ({self.why}) underflow {self.underflow:.1%} "
                f"(subnormal {self.subnormal:.1%}) overflow {self.overflow:.1%} rel. error {self.rel_error:.2e} "
                f"{where}").rstrip()
