import os
import sys

import torch
from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))

# The tests run thousands of tiny ops: one torch thread is faster and steadier than two fighting over 2 cores.
torch.set_num_threads(1)

# Property tests draw the same examples on every run, so CI is reproducible (set HYPOTHESIS_PROFILE=explore
# to search new examples locally).
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
