"""Side effects of a traced call that generated code would not repeat, found by comparing before and after.

Replayed code repeats the torch calls of the traced run, nothing else. So a call that changes Python
state (an attribute, a global, a closure cell), draws Python or NumPy random numbers, sets torch's
generator (`manual_seed`, `set_rng_state`, `fork_rng`), or changes its inputs' autograd state
(`requires_grad_()`, `register_hook`, `retain_grad`) cannot be compiled: tt.compile runs it eagerly.
"""
import random
import threading
from typing import Any, List, Optional, Tuple

import numpy as np
import torch


class _Tracing(threading.local):
    depth = 0  # > 0 while this thread traces a function for tt.compile


TRACING = _Tracing()


def _autograd_state(t: torch.Tensor) -> tuple:
    """requires_grad, hooks and retain_grad of one tensor (tracer or plain)."""
    node = getattr(t, "_tt_node", None)
    return (getattr(t, "_tt_requires_grad", False), len(getattr(t, "_tt_hooks", None) or ()),
            len(getattr(t, "_tt_post_hooks", None) or ()), bool(node is not None and node.hooks),
            bool(node is not None and node.retained), type(t) is torch.Tensor and t.requires_grad)


class Snapshot:
    """The state a call could change without a torch call tt.compile records."""

    def __init__(self, inputs: List[torch.Tensor]):
        self.inputs = inputs
        self.autograd = [_autograd_state(t) for t in inputs]
        self.python_random = random.getstate()
        self.numpy_random = np.random.get_state()[1].copy()
        self.seed = torch.initial_seed()
        self.torch_random = torch.get_rng_state()

    def changed_by_call(self, world: Any, draws: List[Tuple[torch.Tensor, torch.Tensor]]) -> Optional[str]:
        """Why the traced call cannot be replayed (None if nothing it changed escapes the generated code)."""
        what = world.changed()
        if what is not None:
            return f"it changes {what}"
        if random.getstate() != self.python_random or not np.array_equal(np.random.get_state()[1], self.numpy_random):
            return "it draws Python or NumPy random numbers (random, numpy.random)"
        states = [self.torch_random, *(s for draw in draws for s in draw), torch.get_rng_state()]
        if torch.initial_seed() != self.seed or not all(torch.equal(a, b) for a, b in zip(states[::2], states[1::2])):
            return "it sets torch's random generator (manual_seed, set_rng_state, fork_rng)"
        if any(_autograd_state(t) != state for t, state in zip(self.inputs, self.autograd)):
            return "it changes an input's requires_grad, hooks or retain_grad"
        return None
