"""Hooks for tools that watch the engine (tt.check, tt.detect_anomaly, tt.trace, tt.draw).

Empty lists cost the hot path one truth test; tools add a callable only while they run.
"""
import contextlib
from typing import Callable, Iterator, List, Optional

ON_RECORD: List[Callable] = []  # fn(node, args, kwargs, result) after forward records a node
ON_BACKWARD: List[Callable] = []  # fn(node, grads_of_outputs, grads_of_inputs) after a rule's backward


@contextlib.contextmanager
def observing(on_record: Optional[Callable] = None, on_backward: Optional[Callable] = None) -> Iterator[None]:
    """Call `on_record` for every recorded op and `on_backward` for every node run, inside the block."""
    added = [(hooks, fn) for hooks, fn in ((ON_RECORD, on_record), (ON_BACKWARD, on_backward)) if fn is not None]
    for hooks, fn in added:
        hooks.append(fn)
    try:
        yield
    finally:
        for hooks, fn in added:
            hooks.remove(fn)
