"""Writes the version counter does not see: a value changed through `.data`, `.set_()` or shared (numpy) memory
after an op made it or saved it. torch's in-place check reads only version counters, so such a write passes
silently: an op computes with values no recorded op produced, or a backward with values its forward did not see.

While tt.diagnose(fn, *args) watches the forward, `UnversionedWrites` copies each op's result and what it saved
(up to BUDGET bytes), with their version counters. A later op's input whose counter did not move but whose values
did, and a saved tensor in the same state just before the backward, are findings, named by the op that made (or
saved) the value and its source line.
"""
from typing import Any, Dict, List, Optional, Tuple

import torch

from torchtrace.autograd.node import Node
from torchtrace.autograd.plain import plain_torch
from torchtrace.doctor.findings import Finding

BUDGET = 256 * 2**20  # bytes of copies one diagnosis may keep (beyond it, the values made later are not checked)
ADVICE = ("write through the tensor itself under torch.no_grad() (w.mul_(0) instead of w.data.mul_(0)): torch then "
          "counts the write, and a backward that needs the old values raises instead of using the new ones; or make "
          "the change before the forward, or on a .clone()")


def _differ(copy: torch.Tensor, now: torch.Tensor) -> int:
    """How many elements of `now` differ from `copy` (NaN equal to NaN); every one where the shapes differ."""
    if copy.shape != now.shape or copy.dtype != now.dtype:
        return now.numel()
    same = copy == now
    if copy.is_floating_point() or copy.is_complex():
        same |= torch.isnan(copy) & torch.isnan(now)
    return int((~same).sum())


class UnversionedWrites:
    """Copies of what each watched op made and saved; `on_input` and `saved_findings` compare them with now."""

    def __init__(self) -> None:
        self.results: Dict[Tuple[Node, int], Tuple[torch.Tensor, int]] = {}  # (node, output nr) -> (copy, version)
        self.saved: List[Tuple[Node, int, Any, torch.Tensor, int]] = []  # (node, index, tensor, copy, version)
        self.kept = 0
        self.found: List[Tuple[Node, str, int, int, str]] = []  # (node, what, elements changed, of how many, so)

    def _copy(self, t: Any) -> Optional[Tuple[torch.Tensor, int]]:
        if not isinstance(t, torch.Tensor) or t.is_inference() or self.kept + t.nbytes > BUDGET:
            return None
        with plain_torch():
            self.kept += t.nbytes
            return t.detach().clone(), t._version

    def on_record(self, node: Node, args: tuple, result: Any) -> None:
        """Compare the op's inputs with their producers' copies, then copy its result and what it saved."""
        for position, x in enumerate(args):
            key = (getattr(x, "_tt_node", None), getattr(x, "_tt_nr", 0))
            known = self.results.pop(key, None) if key[0] is not None else None  # (checked once, at first use)
            if known is not None and x._version == known[1]:
                with plain_torch():
                    changed = _differ(known[0], x)
                if changed:
                    self.found.append((key[0], f"its result, changed before {node.rule.__name__} (argument "
                                               f"{position}) read it", changed, x.numel(), "the ops after it "
                                               "compute with values no recorded op produced"))
        copied = self._copy(result[0] if isinstance(result, (tuple, list)) and result else result)
        if copied is not None:
            self.results[(node, 0)] = copied
        for index, t in enumerate(node.ctx._saved):
            copied = self._copy(t)
            if copied is not None:
                self.saved.append((node, index, t, *copied))

    def findings(self, make: Any) -> List[Finding]:
        """Every value changed without a version change: those read by a later op, and the saved tensors as they are
        now (call before the backward, which frees them). `make(node, kind, phase, message, advice)` words one."""
        for node, index, t, copy, version in self.saved:
            if node.ctx._saved and t._version == version:
                with plain_torch():
                    changed = _differ(copy, t)
                if changed:
                    self.found.append((node, f"saved tensor {index} of its backward, changed after the op ran",
                                       changed, t.numel(), "its gradient uses values the forward did not compute with"))
        return [make(node, "unversioned_write", "forward",
                     f"{what} without moving its version counter ({changed} of {total} elements): a write through "
                     f".data, .set_() or numpy's memory, which torch's in-place check cannot see: {so}, and nothing "
                     "raises", ADVICE)
                for node, what, changed, total, so in self.found]
