"""torch.load's default (weights_only=True) reads what torch.save wrote of tracers: parameters, a detached output,
a dict of them, a state_dict(keep_vars=True).

A tracer pickles as a leaf rebuilt by a function of torchtrace's (tensor_protocols._rebuild, nn.module's
_rebuild_parameter: plain data, a requires_grad flag and the user's attributes, no code run). torch's weights-only
unpickler refuses every global it was not told is safe, so torch.load of a saved parameter raised an UnpicklingError
naming torchtrace's internals one at a time. These four globals are declared safe once, as torch's documentation
asks of a library whose tensor subclass is saved (torch.serialization.add_safe_globals); a subclass of a user's is
not among them (torch's message names it).
"""
import torch.serialization

from torchtrace.nn.module import Parameter, _rebuild_parameter
from torchtrace.tensor_protocols import _rebuild
from torchtrace.tracer import tracer

SAFE = [tracer, Parameter, _rebuild, _rebuild_parameter]


def install() -> None:
    """Declare torchtrace's rebuild functions and classes safe for torch.load(weights_only=True)."""
    torch.serialization.add_safe_globals(SAFE)
