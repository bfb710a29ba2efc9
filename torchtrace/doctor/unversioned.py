"""Writes the version counter does not see: a value changed through `.data` or a numpy array's memory after an op
made it or saved it. torch's in-place check reads only version counters, so such a write passes silently: the ops
after it compute with values no recorded op produced, or a backward with values its forward did not see.

While tt.diagnose(fn, *args) watches the forward, its torch function mode (paths.CutWatcher) sees every `.data`
and `.numpy()` of a tensor in the graph; `UnversionedWrites.before_access` copies that tensor there, once, with its
version counter and the line. Just before the backward, a copy whose tensor kept its version but not its values is
a finding, named by the op that made the tensor (or, for a leaf, the ops that saved it) and by the line of the access.
Only tensors reached through `.data` or `.numpy()` are copied: a forward without them costs nothing here.
"""
from typing import Any, Dict, List, Tuple

import torch

from torchtrace.autograd.node import Node
from torchtrace.autograd.plain import plain_torch
from torchtrace.doctor.where import user_line

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
    """Copies of the graph's tensors taken at their `.data` / `.numpy()`; `findings` compares them with now."""

    def __init__(self) -> None:
        self.copies: Dict[int, Tuple[Any, torch.Tensor, int, str, str]] = {}  # id -> (tensor, copy, version, how, line)

    def before_access(self, how: str, t: torch.Tensor) -> None:
        if id(t) in self.copies or t.is_inference():
            return
        with plain_torch():
            self.copies[id(t)] = (t, t.detach().clone(), t._version, how, user_line()[0])

    def findings(self, lines: Dict[Node, Tuple[str, str]], make: Any) -> List[Any]:
        """Every tensor changed without a version change since its `.data` / `.numpy()` (call before the backward,
        which frees what the ops saved). `lines`: the watched ops; `make(node, kind, phase, message, advice)`: the
        Finding of one."""
        found = []
        for t, copy, version, how, line in self.copies.values():
            if t._version != version:
                continue
            with plain_torch():
                changed = _differ(copy, t)
            if not changed:
                continue
            made_by = getattr(t, "_tt_node", None)
            blamed = [made_by] if made_by in lines else [n for n in lines if any(s is t for s in n.ctx._saved)]
            for node in blamed:
                what = "its result" if node is made_by else "a tensor it saved for its backward"
                so = ("the ops after it compute with values no recorded op produced" if node is made_by else
                      "its gradient uses values the forward did not compute with")
                found.append(make(node, "unversioned_write", "forward",
                                  f"{what} was changed through {how} at {line} without moving its version counter "
                                  f"({changed} of {t.numel()} elements), which torch's in-place check cannot see: "
                                  f"{so}, and nothing raises", ADVICE))
        return found
