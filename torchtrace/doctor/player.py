"""The doctor in the player: a diagnosis as badges and messages on the steps of tt.explore's page, and a diff as
two players side by side, stepping through the aligned rules, opened at the first divergence.

Both re-run the function once more with its backward through tt.explore (`.grad` is left as it was), and find
the nodes of that run by their place in the recording: the forward records the same ops in the same order.
"""
from typing import Any, Dict, List, Optional

from torchtrace.doctor.recording import Pass, RuleStep
from torchtrace.inspect.explore import Explorer, side_by_side
from torchtrace.inspect.explore.side_by_side import SideBySide

SEVERITY = {"nonfinite": "error", "killed": "warn", "saturated": "warn", "no_path": "warn", "exploding": "warn",
            "underflow": "warn", "zero_by_construction": "info", "diverges": "error", "wrong_rule": "error"}


def _annotate(explorer: Explorer, node: Any, kind: str, message: str) -> bool:
    try:
        explorer.annotate(node, kind, message, SEVERITY.get(kind, "warn"))
    except ValueError:  # a node that does not reach the loss is not on the page
        return False
    return True


def diagnosis_in_player(diagnosis: Any, rerun: Pass, recorded: List[Any]) -> Explorer:
    """The player of `rerun` with every finding of `diagnosis` (made on the run that recorded `recorded`) marked."""
    place = {node: i for i, node in enumerate(recorded)}
    for finding in diagnosis.findings:
        i = place.get(finding.node)
        if i is not None and i < len(rerun.recorded):
            _annotate(rerun.explorer, rerun.recorded[i], finding.kind, f"{finding.message} — {finding.advice}")
    return rerun.explorer


def _rule_step_indices(explorer: Explorer, steps: List[RuleStep]) -> List[int]:
    """The index in the player's steps of each rule step (the player's rule steps run in the engine's order)."""
    indices = [i for i, s in enumerate(explorer.steps) if s.kind == "rule"]
    if len(indices) != len(steps):
        raise RuntimeError(f"the player recorded {len(indices)} rule steps where the diff saw {len(steps)}: the "
                           "function does not run the same way twice (random ops?); fix a seed inside it")
    return indices


def diff_in_player(report: Any, first: Optional[int] = None) -> SideBySide:
    """Both passes of a DiffReport, re-run through tt.explore, side by side; each divergent step marked; opened at
    the first one."""
    a, b = report.rerun(explore=True)
    again = type(report)(a, b, report.rtol, report.atol, report.titles)
    at_a, at_b = _rule_step_indices(a.explorer, a.steps), _rule_step_indices(b.explorer, b.steps)
    pair_of: Dict[int, int] = {i: n for n, (i, _) in enumerate(again.pairs)}
    for d in again.divergences:
        j = again.pairs[pair_of[d.index]][1]
        message = f"the gradient it sends differs from the other run's by {d.error:.2e}"
        _annotate(a.explorer, a.steps[d.index].node, "diverges", message)
        _annotate(b.explorer, b.steps[j].node, "diverges", message)
    pairs = [(at_a[i], at_b[j]) for i, j in again.pairs]
    if first is None and again.divergences:
        first = pair_of[again.divergences[0].index]
    return side_by_side(a.explorer, b.explorer, pairs, first=first, titles=report.titles)
