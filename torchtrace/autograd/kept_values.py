"""What a node keeps of its own outputs, so the player can show every value: the value itself, up to a budget.

A node holds each result strongly (a detached alias: its memory and version counter, never the graph) while the
results so held in this thread stay under BUDGET bytes; beyond it, a weak reference to the result tracer, alive
while the caller's variables or a rule's saved tensors hold it. A held value gives its bytes back to the
thread's count when its node is freed. `tt.explore.keep_values(n)` sets the budget (0: weak references only).

Both kinds answer `ref()` with the result (a plain tensor for a Kept, the tracer or None for a weak reference).
A Kept's `version` is the version counter when the op produced it (a weak reference's tracer has its own
`_tt_version`), so a tool can tell a value changed in place afterwards. The cost, paid by every recorded op
while under the budget: the alias (one `detach`) and the tuple.
"""
import contextlib
import threading
from typing import Iterator, Optional

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


class Kept(tuple):
    """A result held strongly: `kept()` is the value, `kept.version` its version counter when produced. A tuple
    (value, version, bytes, the count of the thread that made it), which gives its bytes back when freed."""

    __slots__ = ()

    def __call__(self) -> torch.Tensor:
        return self[0]

    @property
    def version(self) -> int:
        return self[1]

    def __del__(self) -> None:
        self[3].held -= self[2]  # the count of the thread that made it, wherever the node is freed


def kept_output(raw: torch.Tensor) -> Optional[Kept]:
    """A Kept of a forward's result `raw`, read before it is linked as a tracer (a plain tensor then, so no guard is
    needed), while the thread's kept results stay under the budget with it; else None, and the node keeps a weak
    reference to the output tracer instead."""
    if type(raw) is not torch.Tensor:  # a rule's forward handed back a tracer: read it as a plain tensor
        with plain_torch():
            return kept_output(raw.as_subclass(torch.Tensor))
    count = _THREAD.count
    nbytes = raw.nbytes
    if count.held + nbytes > BUDGET[0]:
        return None
    value = raw.detach()  # an alias: raw itself may become the tracer, which holds the node (a cycle)
    count.held += nbytes
    return Kept((value, raw._version, nbytes, count))


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
