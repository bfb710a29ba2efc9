"""What a node keeps of its own outputs, so the player can show every value: the value itself, up to a budget.

A node holds each result strongly (a detached alias: its memory and version counter, never the graph) while the
results so held in this thread stay under BUDGET bytes; beyond it, a weak reference to the result tracer, alive
while the caller's variables or a rule's saved tensors hold it. A held value gives its bytes back to the
thread's count when its node is freed. `tt.explore.keep_values(n)` sets the budget (0: weak references only;
inspect/explore/budget.py).

Both kinds answer `ref()` with the result (a plain tensor for a Kept, the tracer or None for a weak reference).
A Kept's `version` is the version counter when the op produced it (a weak reference's tracer has its own
`_tt_version`), so a tool can tell a value changed in place afterwards. The cost, paid by every recorded op
while under the budget: the alias (one `detach`) and the tuple.
"""
import threading
from typing import Optional

import torch

# bytes of results the nodes of one thread may hold strongly at once: every graph a lesson draws fits; a real model's
# step does not pay for it (a result held past its last use is memory the allocator cannot reuse: at 64 MB a GPT step
# of bench/models.py ran 20% slower)
BUDGET = [2 * 2**20]


class _Thread(threading.local):
    def __init__(self) -> None:
        self.count = [0]  # bytes this thread's live nodes hold (a list: a Kept gives back to its own thread's)


THREAD = _Thread()


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
        self[3][0] -= self[2]


def kept_output(raw: torch.Tensor) -> Optional[Kept]:
    """A Kept of a forward's result `raw`, read before it is linked as a tracer (a plain tensor then, read at plain
    speed), while the thread's kept results stay under the budget with it; else None, and the node keeps a weak
    reference to the output tracer instead."""
    count = THREAD.count
    nbytes = raw.nbytes
    if count[0] + nbytes > BUDGET[0]:
        return None
    value = raw.detach()  # an alias (no node): raw itself may become the tracer, which holds the node (a cycle)
    count[0] += nbytes
    return Kept((value, raw._version, nbytes, count))
