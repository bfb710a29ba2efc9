"""Importing torchtrace freezes the objects that exist then (torch's import heap) out of the cyclic collector's full
scans; TORCHTRACE_FREEZE_IMPORTS=0 leaves the collector alone; what is made afterwards is collected as before."""
import gc
import os
import subprocess
import sys
import weakref

import torch

import torchtrace as tt

PROBE = "import gc, torchtrace; print(gc.get_freeze_count())"
UNTOUCHED = "import gc; print(gc.get_freeze_count())"  # what the interpreter froze itself (3.12: a few hundred)


def _frozen_after_import(probe: str = PROBE, **environment: str) -> int:
    env = {**os.environ, **environment}
    return int(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                              check=True).stdout)


def test_the_import_heap_is_frozen_unless_the_environment_says_no():
    assert _frozen_after_import(TORCHTRACE_FREEZE_IMPORTS="1") > 50_000  # torch's modules, functions, types
    assert _frozen_after_import(TORCHTRACE_FREEZE_IMPORTS="0") == _frozen_after_import(UNTOUCHED)


def test_a_cycle_made_after_import_is_still_collected():
    class Cycle:
        pass

    a, b = Cycle(), Cycle()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    del a, b
    gc.collect()
    assert alive() is None


def test_a_graph_recorded_after_import_is_freed():
    x = tt.tracer(torch.rand(3), requires_grad=True)
    y = (x * 2).tanh()
    node = weakref.ref(y.grad_fn)
    y.sum().backward()
    del y
    gc.collect()
    assert node() is None
