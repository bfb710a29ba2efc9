"""What a function's forward pass changes besides its result, kept so that several passes are one pass repeated.

tt.jacobian(mode="forward") (and tt.hessian forward-over-reverse) runs f once per input element, one column of the
Jacobian each. A function that draws random numbers (dropout) drew another mask per column, and a module in training
mode (BatchNorm) updated its running statistics once per column: the columns were the Jacobians of different
functions, and the module's state moved n times. torch.func.jacfwd refuses randomness; reverse mode runs f once.
Here every pass starts from the state the first one started from — torch's random generators and, for a module,
its buffers — so the columns belong to one forward pass (reverse mode's Jacobian), and afterwards the state is
what one pass leaves.
"""
from typing import Any, List, Optional, Tuple

import torch

from torchtrace.autograd.plain import plain_torch


class PassState:
    """The random generators' states and a module's buffer values now; `restore()` puts them back."""

    def __init__(self, f: Any):
        self.cpu = torch.get_rng_state()
        self.cuda: Optional[List[torch.Tensor]] = (
            torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None)
        buffers = list(f.buffers()) if isinstance(f, torch.nn.Module) else []
        with plain_torch(), torch.no_grad():
            self.buffers: List[Tuple[torch.Tensor, torch.Tensor]] = [(b, b.clone()) for b in buffers]

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        with plain_torch(), torch.no_grad():
            for buffer, value in self.buffers:
                buffer.copy_(value)
