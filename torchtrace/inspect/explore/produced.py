"""What an op produced, as the player shows it: read before the backward, never the memory as it is now.

A node keeps each of its results (`node.value_refs`, kept_values.kept_output): the value itself while the
thread's kept results fit the budget (`tt.explore.keep_values`), else a weak reference, alive while the caller's
variables or a rule's saved tensors hold the result. Other sources stand in for a result no one holds: the
caller's named variables, a call copied by tt.explore(fn, *inputs) or tt.recording().

A result changed in place after its op (under no_grad, or a view whose base changed) has a newer version
than the op gave it: its memory is not what the op produced. The player then shows a copy taken when the op
ran, where one exists, else says so and shows both: what it holds now, and that the op's value is lost.
A write that moves no version counter (through `.data` or a numpy array's memory) is not seen, as torch's check
of saved tensors does not see it either.
"""
from typing import Any, List, Mapping, Optional, Tuple

import torch

from torchtrace.autograd.kept_values import BUDGET, Kept
from torchtrace.inspect.explore.shown import number, tensor_text

GONE = ("not kept: nothing holds this result any more (the graph keeps values up to "
        "tt.explore.keep_values(bytes), {budget} now, and weak references beyond; tt.explore(fn, *inputs) "
        "keeps every value)")
REWRITTEN = "changed in place after this op by a recorded in-place op: what this op produced is not kept"


def budget_text() -> str:
    return f"{BUDGET[0] / 2**20:g} MB"


def gone() -> str:
    return GONE.format(budget=budget_text())


def is_gone(note: str) -> bool:
    return note.startswith(GONE[:GONE.index("(")])


def dropped_notice(notes: List[str]) -> str:
    """'' when every value is known; else how many are gone, and how to keep them."""
    lost = sum(1 for note in notes if is_gone(note))
    if not lost:
        return ""
    return (f"{lost} of {len(notes)} values were not kept: the graph keeps what each op produced up to "
            f"tt.explore.keep_values(bytes) ({budget_text()} now) and only weak references beyond; "
            "tt.explore(fn, *inputs) keeps them all")


def _changed(before: int, now: int, current: torch.Tensor, kept: Optional[str]) -> Tuple[str, str]:
    note = f"changed in place after this op (version {before} → {now}): it holds {tensor_text(current)} now"
    if kept is not None:
        return kept, note + "; shown: what the op produced"
    return "", note + "; what the op produced is not kept (tt.explore(fn, *inputs) copies small results)"


def _copy(node: Any, nr: int, call: Optional[tuple]) -> Optional[str]:
    """A copy of output nr taken when the op ran (tt.explore(fn, *inputs), tt.recording()), as text."""
    if call is not None and nr < len(call[2]) and isinstance(call[2][nr], torch.Tensor):
        return tensor_text(call[2][nr])
    noted = (node.notes or {}).get("values", {}).get(nr)
    if noted is None:
        return None
    return tensor_text(noted) if isinstance(noted, torch.Tensor) else f"|value| {number(noted)}"


def output_value(node: Any, nr: int, results: Mapping[Tuple[Any, int], Tuple[str, Any]],
                 call: Optional[tuple]) -> Tuple[str, str]:
    """(the text of what output nr of node was when the op ran, '') or ('' or a stand-in, why it is not shown)."""
    refs = node.value_refs or ()
    ref = refs[nr] if nr < len(refs) else None
    t = ref() if ref is not None else None
    if isinstance(ref, Kept):
        if t._version == ref.version:
            return tensor_text(t), ""
        return _changed(ref.version, t._version, t, _copy(node, nr, call))
    if t is not None and (t._tt_node is not node or t._tt_nr != nr):
        return _copy(node, nr, call) or "", REWRITTEN
    if t is None and (node, nr) in results:
        t = results[(node, nr)][1]
    if t is not None:
        if t._version == t._tt_version:
            return tensor_text(t), ""
        return _changed(t._tt_version, t._version, t, _copy(node, nr, call))
    copy = _copy(node, nr, call)
    if copy is not None:
        return copy, ""
    if any(o == nr for _, o in node.saved_outputs) and not node.released:  # the rule saved its result
        return tensor_text(node.saved[next(i for i, o in node.saved_outputs if o == nr)]), ""
    return "", gone()
