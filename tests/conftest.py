import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

# The tests run thousands of tiny ops: one torch thread is faster and steadier than two fighting over 2 cores.
torch.set_num_threads(1)
