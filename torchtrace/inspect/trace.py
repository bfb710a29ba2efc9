"""The backprop trace: one line per node, in the order gradients flow (iterative, so deep graphs print)."""
from typing import List

import torch

from torchtrace.autograd.engine import _topological_order
from torchtrace.autograd.function import AccumulateGrad


def label(node: object) -> str:
    """`Mul()` for MulBackward; a node made inside a module can carry that module's own label."""
    if getattr(node, "module", None):
        return node.module
    return f"{'AccumulateGrad' if isinstance(node, AccumulateGrad) else node.rule.__name__}()"


def backprop_lines(output: torch.Tensor) -> List[str]:
    """The lines that `output.backward(show=True)` prints."""
    if output.grad_fn is None:
        return ["BackProp:", "↘︎ Input"]
    order = [n for n in _topological_order([output.grad_fn]) if not isinstance(n, AccumulateGrad)]
    return ["BackProp:", *(f"↘︎ {label(node)}" for node in order), "↘︎ Input"]


def show(output: torch.Tensor) -> None:
    """Print the backprop trace of `output`."""
    print("\n".join(backprop_lines(output)))
