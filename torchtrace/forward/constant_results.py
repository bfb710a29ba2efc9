"""What forward mode hands back where torch.func's result would carry a gradient: a tracer whose backward refuses.

tt.jvp and tt.hvp compute their tangents outside the graph (on plain tensors, forward/dual.py), and tt.jacobian and
tt.hessian assemble theirs from separate passes, so their results are constants to reverse mode. torch.func's results,
by contrast, carry a gradient into every tensor f read that requires one (a primal, a parameter f closed over) while
grad mode is on. Handed back as plain tensors, such results would make a loss built from them (a Jacobian penalty, a
curvature regulariser) back-propagate without that term: a gradient silently missing. So where f read such a tensor,
the results come back as tracers of a node whose backward raises, naming what to do; elsewhere they stay plain
tensors.
"""
from typing import Any, List, Optional, Sequence

import torch

from torchtrace.autograd.dispatch import run_rule
from torchtrace.autograd.engine import topological_order
from torchtrace.autograd.function import Function
from torchtrace.autograd.node import AccumulateGrad
from torchtrace.errors import UnsupportedOperationError
from torchtrace.tracer import tracer as TRACER


class ForwardModeResult(Function):
    """y = v, a value forward mode computed outside the graph  ->  no gradient flows back through it: refused"""

    @staticmethod
    def forward(ctx: Any, value: torch.Tensor, what: str, *graph: torch.Tensor) -> torch.Tensor:
        ctx.what = what
        return value.detach().clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        raise UnsupportedOperationError(
            f"{ctx.what}: its result was computed outside the graph, so no gradient flows back through it into the "
            "tensors f read that require grad (torch.func's would carry one). Differentiate "
            "with reverse mode twice instead (g = tt.grad(f(x), params, create_graph=True), then back-propagate "
            "through g), or use the result as a constant: .detach() it before building the loss.")


def reads_a_gradient(primals: Sequence[Any], leaves: Sequence[torch.Tensor], outputs: Sequence[Any],
                     first_node: int) -> Optional[List[torch.Tensor]]:
    """What the results' refusing node hangs on where the pass shows f read a tensor requiring grad (a primal, a leaf
    or a node recorded before the pass began at sequence number `first_node`) while grad mode is on: a tracer of the
    pass, and the caller's primals that require grad (the pass ran on fresh leaves of them: a backward aimed at a
    primal must meet the refusal, not find the result unused). None: torch.func's result would be constant too."""
    if not torch.is_grad_enabled():
        return None
    anchors = [o for o in outputs if isinstance(o, TRACER) and o._tt_requires_grad]
    read = [p for p in primals if isinstance(p, torch.Tensor) and p.requires_grad]
    if read and anchors:
        return anchors[:1] + read
    for node in topological_order([o.grad_fn for o in anchors if o.grad_fn is not None]):
        outer_leaf = type(node) is AccumulateGrad and not any(node.variable is leaf for leaf in leaves)
        if outer_leaf or node.sequence_nr < first_node:
            return anchors[:1] + read
    return None


def constant_results(values: List[torch.Tensor], graph: Optional[List[torch.Tensor]], what: str) -> List[torch.Tensor]:
    """values as they are (graph None), else each a tracer whose backward refuses (ForwardModeResult), its edges to
    the tensors of `graph`."""
    if graph is None:
        return values
    return [run_rule(TRACER, ForwardModeResult, None, (v, what, *graph), {}) for v in values]
