"""How much of what ops produce the graph keeps for the player: tt.explore.keep_values(bytes), this thread's count,
and a block that keeps everything (the nodes keep their values in torchtrace/autograd/kept_values.py)."""
import contextlib
from typing import Iterator, Optional

from torchtrace.argument_checks import count
from torchtrace.autograd.kept_values import BUDGET, THREAD

_UNBOUNDED = 2**62  # credited to a thread's count while it keeps every value


def keep_values(budget: Optional[int] = None) -> int:
    """Set how many bytes of results the graph keeps for the player (per thread; default 2 MB), return the budget.

    Results beyond it are held weakly and the player may show them as gone; `tt.explore(fn, *inputs)` keeps
    them all whatever the budget."""
    if budget is not None:
        BUDGET[0] = count("tt.explore.keep_values", "the budget (a number of bytes)", budget, least=0)
    return BUDGET[0]


def held_bytes() -> int:
    """Bytes of results this thread's live nodes hold now."""
    return THREAD.count[0]


@contextlib.contextmanager
def keeping_every_value() -> Iterator[None]:
    """Inside the block, this thread's ops keep every result whatever the budget (tt.explore(fn, *inputs) and the
    doctor's players run their forward so). The results count against the budget as usual once the block ends."""
    count = THREAD.count
    count[0] -= _UNBOUNDED
    try:
        yield
    finally:
        count[0] += _UNBOUNDED
