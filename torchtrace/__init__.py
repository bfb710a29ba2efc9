"""torchtrace: an educational autograd engine on a torch.Tensor subclass. Public names only."""
from torchtrace import (
    interop,  # noqa: F401  (autograd Functions, checkpoint, vmap on tracers)
    nn,
    ops,  # noqa: F401  (registers every gradient rule)
    optim,
)
from torchtrace.autograd.engine import backward, grad
from torchtrace.autograd.function import Function, register, supported_ops
from torchtrace.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad
from torchtrace.check import check, gradcheck
from torchtrace.errors import GradientMismatch, UnsupportedOperationError
from torchtrace.factories import (
    arange,
    eye,
    from_numpy,
    full,
    linspace,
    ones,
    ones_like,
    rand,
    randn,
    zeros,
    zeros_like,
)
from torchtrace.inspect.anomaly import AnomalyError, detect_anomaly
from torchtrace.inspect.dot import draw, recording
from torchtrace.inspect.flow import flow
from torchtrace.inspect.graph import trace
from torchtrace.inspect.trace import show
from torchtrace.port import port
from torchtrace.tracer import as_tracer, tracer

__all__ = [
    "tracer", "as_tracer", "zeros", "ones", "rand", "randn", "zeros_like", "ones_like", "full", "arange",
    "linspace", "eye", "from_numpy", "backward", "grad", "Function", "register", "supported_ops",
    "no_grad", "enable_grad", "is_grad_enabled", "check", "gradcheck", "GradientMismatch",
    "UnsupportedOperationError", "nn", "optim", "draw", "recording", "flow", "trace", "show",
    "detect_anomaly", "AnomalyError", "port",
]
