"""A progress bar (tqdm, on stderr) for the long runs of the curvature lab: shown when asked, or by default when a
run makes at least LONG passes over batches; without tqdm installed the run is simply silent."""
import contextlib
from typing import Any, Iterator, Optional

LONG = 50  # passes (an HVP or a loss on one batch each)


class _Silent:
    def update(self, n: int = 1) -> None:
        pass


SILENT = _Silent()


@contextlib.contextmanager
def progress(total: int, what: str, show: Optional[bool]) -> Iterator[Any]:
    """A bar of `total` passes named `what` (call .update() after each), when `show` is True, or `show` is None
    and total >= LONG; else an object whose update() does nothing."""
    if show is False or (show is None and total < LONG):
        yield SILENT
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield SILENT
        return
    bar = tqdm(total=total, desc=what, leave=False)
    try:
        yield bar
    finally:
        bar.close()
