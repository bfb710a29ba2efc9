"""What changes while code runs, kept per thread: the running backward, the running modules, the watching tools.

torch keeps its grad-mode flag per thread, and so does torchtrace with everything below: a backward
with create_graph=True in one thread, or a tt.detect_anomaly() block, never affects another thread.
"""
import contextlib
import os
import threading
from typing import Any, Callable, Iterator, List, Optional, Tuple


class ThreadState(threading.local):
    """One instance per thread (threading.local runs __init__ afresh in each thread)."""

    def __init__(self) -> None:
        self.create_graph = False  # a backward with create_graph=True is running in this thread
        # the running backward's retain_graph, tt.grad's capture and what reports a gradient handed to user code
        # (outside a backward, a rule's backward run by a tool frees nothing and hands out nothing to note)
        self.walk: Tuple[bool, Optional[dict], Callable[[Any], None]] = (True, None, lambda g: None)
        # the modules running now, outermost first: a tuple replaced on a module's entry and exit, never changed, so
        # every node recorded meanwhile keeps this very object as its module_path
        self.module_stack: Tuple[object, ...] = ()
        self.on_record: List[Callable] = []  # fn(node, args, kwargs, result) after forward records a node
        self.on_backward: List[Callable] = []  # fn(node, grads_of_outputs, grads_of_inputs) after a backward


STATE = ThreadState()


@contextlib.contextmanager
def observing(on_record: Optional[Callable] = None, on_backward: Optional[Callable] = None) -> Iterator[None]:
    """Call `on_record` for every op recorded and `on_backward` for every node run in this thread, inside the block.

    Empty lists cost the hot path one truth test; tools (tt.check, tt.detect_anomaly, tt.draw) add a
    callable only while they run.
    """
    added = [(hooks, fn) for hooks, fn in ((STATE.on_record, on_record), (STATE.on_backward, on_backward))
             if fn is not None]
    for hooks, fn in added:
        hooks.append(fn)
    _lanes_off("observers", 1)  # a tool watches: every call takes the readable path, which tells observers
    try:
        yield
    finally:
        for hooks, fn in added:
            hooks.remove(fn)
        _lanes_off("observers", -1)



LANES_ON = [True]  # False: every call and every backward runs on the readable path (dispatch.run_rule, engine._walk)
_LANES_OFF = {"environment": int(os.environ.get("TORCHTRACE_READABLE", "") not in ("", "0")), "readable": 0,
              "observers": 0}  # why the generated fast lanes (torchtrace/lanes) are off, process-wide
_SWITCHING = threading.Lock()
LANE_SWITCHES: List[Callable[[bool], None]] = []  # switch(lanes on) after every change (the tracer's entry point)


def _lanes_off(reason: str, by: int) -> None:
    with _SWITCHING:
        _LANES_OFF[reason] += by
        LANES_ON[0] = not any(_LANES_OFF.values())
        for switch in LANE_SWITCHES:
            switch(LANES_ON[0])


_lanes_off("environment", 0)


@contextlib.contextmanager
def readable() -> Iterator[None]:
    """Inside the block every torch call is recorded by the readable path (dispatch.run_rule) and every backward
    runs the readable walk (engine._walk), in every thread: the reference the generated fast lanes must equal.
    TORCHTRACE_READABLE=1 does the same for a whole run."""
    _lanes_off("readable", 1)
    try:
        yield
    finally:
        _lanes_off("readable", -1)
