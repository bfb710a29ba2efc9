"""torchtrace: an educational autograd engine on a torch.Tensor subclass. Public names only."""
import importlib
from typing import Any

from torchtrace import (
    interop,  # noqa: F401  (autograd Functions, checkpoint, vmap on tracers)
    nn,
    ops,  # noqa: F401  (registers every gradient rule)
    optim,
)
from torchtrace.autograd.engine import ANOMALY_MODE, BACKWARD_WATCHERS, TOOLS, backward, grad
from torchtrace.autograd.function import Function, register
from torchtrace.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad
from torchtrace.autograd.state import readable
from torchtrace.check import check, gradcheck
from torchtrace.curvature import hessian, hvp, landscape, spectrum
from torchtrace.errors import GradientMismatch, UnsupportedOperationError
from torchtrace.factories import (
    arange,
    as_tracer,
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
from torchtrace.forward import jacobian, jvp
from torchtrace.import_heap import freeze_import_heap
from torchtrace.ops.listing import supported_ops
from torchtrace.port import port
from torchtrace.second_order_check import gradgradcheck
from torchtrace.tracer import tracer

# The tools that walk the graph load on first use, so the engine never imports them.
_INSPECT = {"AnomalyError": "anomaly", "detect_anomaly": "anomaly", "draw": "dot", "recording": "values",
            "flow": "flow", "trace": "graph", "show": "trace", "explore": "explore"}


def __getattr__(name: str) -> Any:
    if name == "compile":  # loads on first use too: it records with the inspection machinery
        return importlib.import_module("torchtrace.compiler").compile
    if name in _INSPECT:
        return getattr(importlib.import_module(f"torchtrace.inspect.{_INSPECT[name]}"), name)
    if name in ("diagnose", "diff"):  # the gradient doctor
        return getattr(importlib.import_module("torchtrace.doctor"), name)
    if name == "precision":  # mixed precision explained: a callable package (tt.precision(...), .training)
        return importlib.import_module("torchtrace.precision")
    raise AttributeError(f"module 'torchtrace' has no attribute '{name}'")


TOOLS["show"] = lambda output: __getattr__("show")(output)  # y.backward(show=True) prints tt.show's trace


def _noting_tiny_graphs(output: Any, create_graph: bool) -> Any:
    """Every backward, from the first one on: one through a tiny graph notes each node's numbers for tt.draw (as
    micrograd's draw_dot shows them); the notes' module loads on the first backward."""
    return importlib.import_module("torchtrace.inspect.values").noting_tiny_graphs(output, create_graph)


BACKWARD_WATCHERS.append(_noting_tiny_graphs)


def _refusing_nan_in_torchs_anomaly_mode(node: Any, grads: Any, result: Any) -> None:
    """torch's anomaly mode (set_detect_anomaly(True)) on a tracer's backward: a rule returning NaN raises, as
    torch's engine does (its check loads with the first backward run in that mode)."""
    importlib.import_module("torchtrace.inspect.anomaly").refuse_nan(node, grads, result)


ANOMALY_MODE.append(_refusing_nan_in_torchs_anomaly_mode)


freeze_import_heap()  # torch's import heap out of the collector's full scans (import_heap.py)


def __dir__() -> list:
    """dir(tt), help(tt) and tab completion list the tools that load on first use too."""
    return sorted(set(globals()) | set(__all__))

__all__ = [
    "tracer", "as_tracer", "zeros", "ones", "rand", "randn", "zeros_like", "ones_like", "full", "arange",
    "linspace", "eye", "from_numpy", "backward", "grad", "Function", "register", "supported_ops",
    "no_grad", "enable_grad", "is_grad_enabled", "check", "gradcheck", "gradgradcheck", "GradientMismatch",
    "UnsupportedOperationError", "nn", "optim", "draw", "recording", "flow", "trace", "show",
    "detect_anomaly", "AnomalyError", "port", "compile", "explore", "diagnose", "diff",
    "jvp", "jacobian", "precision", "hvp", "hessian", "spectrum", "landscape", "readable",
]
