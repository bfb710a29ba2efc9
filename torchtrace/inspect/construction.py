"""Gradients that are zero by construction: a bias right before a batch (or instance) normalisation.

Batch normalisation subtracts each channel's mean over the batch (and the spatial positions); a bias adds
the same number to every element of a channel, so the mean takes it away again and the loss does not
depend on it: d loss / d bias = 0 in exact arithmetic, and what the backward computes is rounding
(|g| around 1e-9). That is not a vanishing gradient and no learning rate fixes it; the bias is useless
(bias=False). Recognised structurally — the leaf enters a Linear / Convolution as its bias, or is added
(broadcast) to a tensor, and that result feeds only normalisations that subtract a per-channel mean — and
confirmed numerically: its gradient is below ZERO_RELATIVE times the gradient of the layer's weight.
"""
from typing import Any, Dict, List, Optional, Tuple

import torch

from torchtrace.autograd.node import AccumulateGrad
from torchtrace.autograd.plain import plain_torch

ZERO_RELATIVE = 1e-4
NORMALISING = {
    "BatchNormFunction": "batch normalisation subtracts each channel's mean over the batch",
    "InstanceNormFunction": "instance normalisation subtracts each channel's mean over every sample",
}
BIAS_AT = {"LinearFunction": 2, "Convolution": 2}  # where a layer rule takes its bias


class ByConstruction:
    """A leaf whose gradient is zero by construction: the layer rule it enters, the normalisation, the sibling."""

    def __init__(self, user: Any, norm: Any, reference: Optional[torch.Tensor]) -> None:
        self.user, self.norm, self.reference = user, norm, reference

    @property
    def reason(self) -> str:
        return (f"it is a bias added right before a {self.norm.rule.__name__.replace('Function', '')}: "
                f"{NORMALISING[self.norm.rule.__name__]}, which removes any constant per channel, so the loss "
                "does not depend on it and its gradient is 0 up to rounding")

    advice = "nothing is wrong with training; drop the bias (bias=False on the layer before the normalisation)"


def consumers(order: List[Any]) -> Dict[Any, List[Tuple[Any, Any]]]:
    """node -> [(the node that used its output, the edge)], in the recorded graph."""
    used: Dict[Any, List[Tuple[Any, Any]]] = {}
    for node in order:
        for edge in node.edges:
            used.setdefault(edge.node, []).append((node, edge))
    return used


def _is_bias(user: Any, edge: Any, leaf: torch.Tensor) -> bool:
    name = user.rule.__name__
    if name in BIAS_AT:
        return edge.position == BIAS_AT[name]
    return name in ("Add", "Sub") and leaf.dim() <= 1  # x + b with b broadcast along the channels


def _reference(user: Any, leaf: torch.Tensor) -> Optional[torch.Tensor]:
    """The layer's weight (the other leaf its rule takes), whose gradient sets the scale of 'zero'."""
    for edge in user.edges:
        if isinstance(edge.node, AccumulateGrad) and edge.node.variable is not leaf:
            return edge.node.variable
    return None


def by_construction(order: List[Any]) -> Dict[int, ByConstruction]:
    """id(leaf) -> why its gradient is structurally zero, for every bias that feeds only normalisations."""
    used = consumers(order)
    found: Dict[int, ByConstruction] = {}
    for node in order:
        users = used.get(node, []) if isinstance(node, AccumulateGrad) else []
        if users and all(_feeds_only_normalisations(user, edge, node.variable, used) for user, edge in users):
            user = users[0][0]
            found[id(node.variable)] = ByConstruction(user, used[user][0][0], _reference(user, node.variable))
    return found


def _feeds_only_normalisations(user: Any, edge: Any, leaf: torch.Tensor, used: Dict[Any, List[Tuple[Any, Any]]]
                               ) -> bool:
    after = used.get(user, [])
    return _is_bias(user, edge, leaf) and bool(after) and all(
        n.rule.__name__ in NORMALISING and e.position == 0 for n, e in after)


def looks_zero(grad: Optional[torch.Tensor], reference_grad: Optional[torch.Tensor]) -> bool:
    """Is `grad` rounding-sized next to the gradient of the layer's weight (or below 1e-6 without one)?"""
    if grad is None:
        return False
    with plain_torch():
        size = float(grad.detach().abs().max()) if grad.numel() else 0.0
        if reference_grad is None:
            return size <= 1e-6
        scale = float(reference_grad.detach().abs().max()) if reference_grad.numel() else 0.0
    return size <= ZERO_RELATIVE * scale


def zero_leaves(order: List[Any]) -> Dict[int, ByConstruction]:
    """After a backward: the leaves of `order` whose `.grad` is zero by construction (id(leaf) -> why)."""
    found = {}
    for key, why in by_construction(order).items():
        leaf = next(n.variable for n in order if isinstance(n, AccumulateGrad) and id(n.variable) == key)
        reference = why.reference.grad if why.reference is not None else None
        if looks_zero(leaf.grad, reference):
            found[key] = why
    return found
