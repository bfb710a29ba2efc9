"""What a node keeps of its own outputs, so the player can show every value: the value itself, up to a budget.

A node holds each result strongly (a detached alias: its memory and version counter, never the graph) while the
results so held in this thread stay under BUDGET bytes; beyond it, a weak reference to the result tracer, alive
while the caller's variables or a rule's saved tensors hold it. A held value gives its bytes back to the
thread's count when its node is freed. `tt.explore.keep_values(n)` sets the budget (0: weak references only).

Both kinds answer `ref()` with the result, and `ref.version` is its version counter when the op produced it
(None for a weak reference: the tracer's own `_tt_version` says it), so a tool can tell a value changed in
place afterwards.
"""
import contextlib
import threading
import weakref
from typing import Iterator, Optional, Union

import torch

from torchtrace.autograd.plain import plain_torch

BUDGET = [64 * 2**20]  # bytes of results the nodes of one thread may hold strongly at once
_UNBOUNDED = 2**62  # credited to a thread's count while it keeps every value


class _Count:
    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = 0


class _Thread(threading.local):
    def __init__(self) -> None:
        self.count = _Count()


_THREAD = _Thread()


class Kept:
    """A result held strongly: `kept()` is the value, `kept.version` its version counter when produced."""

    __slots__ = ("value", "version", "nbytes", "count")

    def __call__(self) -> torch.Tensor:
        return self.value

    def __del__(self) -> None:
        self.count.held -= self.nbytes  # the count of the thread that made it, wherever the node is freed


def output_ref(t: torch.Tensor, raw: torch.Tensor) -> Union[Kept, "weakref.ref[torch.Tensor]"]:
    """How node keeps its output tracer `t` (linked from the forward's plain result `raw`): strongly while the
    thread's held results stay under the budget, else weakly."""
    count = _THREAD.count
    with plain_torch():
        nbytes = t.nbytes
        if count.held + nbytes > BUDGET[0]:
            return weakref.ref(t)
        kept = Kept()
        # a plain result other than the tracer holds no node; the tracer itself would (a cycle): hold an alias
        kept.value = value = raw if raw is not t and type(raw) is torch.Tensor else t.detach()
        kept.version = value._version
    kept.nbytes, kept.count = nbytes, count
    count.held += nbytes
    return kept


def keep_values(budget: Optional[int] = None) -> int:
    """Set how many bytes of results the graph keeps for the player (per thread; default 64 MB), return the budget.

    Results beyond it are held weakly and the player may show them as gone; `tt.explore(fn, *inputs)` keeps
    them all whatever the budget."""
    if budget is not None:
        if int(budget) < 0:
            raise ValueError(f"keep_values takes a number of bytes >= 0, not {budget}")
        BUDGET[0] = int(budget)
    return BUDGET[0]


def held_bytes() -> int:
    """Bytes of results this thread's live nodes hold now."""
    return _THREAD.count.held


@contextlib.contextmanager
def keeping_every_value() -> Iterator[None]:
    """Inside the block, this thread's ops keep every result whatever the budget (tt.explore(fn, *inputs) and the
    doctor's players run their forward so). The results count against the budget as usual once the block ends."""
    count = _THREAD.count
    count.held -= _UNBOUNDED
    try:
        yield
    finally:
        count.held += _UNBOUNDED
