"""What each tensor a rule saved for backward is, in the words of the rule's math line.

A table rule's formulas name the input x and the result y (one input), or the inputs a, b and the result z
(two inputs); other rules' inputs are numbered by their place in the call. A saved tensor is an input of the
call (the tracer itself), the node's own output, a mask (bool), indices (integers), or something the forward
computed for the backward (a softmax, a normalisation's statistics, ...).
"""
from typing import Any, Callable

import torch

from torchtrace.autograd.node import AccumulateGrad, Node


def _input_names(node: Node) -> tuple:
    formulas = getattr(node.rule, "formulas", ())
    return ("x",) if len(formulas) == 1 else ("a", "b") if len(formulas) == 2 else ()


def _position_of(node: Node, s: torch.Tensor) -> Any:
    """The place in the call of the input `s`, if an edge of `node` carries it."""
    producer, nr = getattr(s, "_tt_node", None), getattr(s, "_tt_nr", 0)
    for edge in node.edges:
        if isinstance(edge.node, AccumulateGrad) and edge.node.variable is s:
            return edge.position
        if producer is not None and edge.node is producer and edge.output_nr == nr:
            return edge.position
    return None


def position_text(position: Any) -> str:
    """An argument's place in the call: `1`, or `0[2]` for item 2 of a list argument (torch.cat)."""
    return str(position) if type(position) is int else f"{position[0]}[{position[1]}]"


def saved_label(node: Node, s: torch.Tensor, j: int, name_of: Callable[[torch.Tensor], str]) -> str:
    """`input a (e)`, `output y`, `mask`, `indices`, or `computed in forward`, numbered as the rule saved them."""
    names = _input_names(node)
    name = name_of(s)
    if getattr(s, "_tt_node", None) is node or any(i == j for i, _ in node.saved_outputs):
        what = "output " + ("z" if len(names) == 2 else "y") if names else "output"
        if node.n_outputs > 1:
            what += f" {s._tt_nr}" if hasattr(s, "_tt_nr") else ""
        return f"#{j} {what}"
    position = _position_of(node, s)
    if position is not None:
        pos = position if type(position) is int else position[0]
        what = names[pos] if pos < len(names) else position_text(position)
        return f"#{j} input {what}" + (f" ({name})" if name else "")
    if hasattr(type(s), "_tt_node"):
        return f"#{j} input (needs no gradient)" + (f" ({name})" if name else "")
    if s.dtype == torch.bool:
        return f"#{j} mask"
    if not s.is_floating_point() and not s.is_complex():
        return f"#{j} indices"
    return f"#{j} computed in forward"
