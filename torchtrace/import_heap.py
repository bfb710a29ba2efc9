"""The objects that exist once torch and torchtrace are imported, moved out of the cyclic garbage collector's way.

Python's collector scans its oldest generation in full whenever enough objects have survived into it since the last
full scan. torch's import alone leaves about 180,000 objects there (modules, functions, types), and a recorded graph
is Python objects (a Node, its Context and edges, the result tracer), which live until the backward, long enough to
be promoted. A 200-op forward then pays a full scan of torch's import every few calls: 3 us of its 15 us per op on an
8x8 chain (torch autograd's graph is C++, which the collector never sees). `gc.freeze()` after a `gc.collect()`
moves what exists at import into the collector's permanent generation, as CPython's documentation suggests for a
process's start-up state: those objects are never scanned again (nor collected as cycles: none of them is garbage
now, and module-level objects live as long as the process). Objects made afterwards, the graphs included, are
collected as before. `TORCHTRACE_FREEZE_IMPORTS=0` in the environment leaves the collector as it was.
"""
import gc
import os


def freeze_import_heap() -> bool:
    """Collect, then freeze every object the collector tracks now; False (nothing done) when the environment says
    TORCHTRACE_FREEZE_IMPORTS=0."""
    if os.environ.get("TORCHTRACE_FREEZE_IMPORTS", "1") == "0":
        return False
    gc.collect()
    gc.freeze()
    return True
