"""Gradients out of scale with the weights: the relative gradient |dL/dW| / |W| of each weight matrix.

- Over depth, from the layer nearest the loss to the farthest: each layer of a stack multiplies the gradient by its
  local derivative, so saturating activations (sigmoid' <= 1/4) make the first layers' gradients vanish, and a
  stack whose backward gain is above 1 makes them explode. Healthy networks (normalised, residual, initialised for
  their depth) keep nearest and farthest within a few orders of magnitude; beyond DEPTH_RATIO it is a finding.
- In size: where the activations grow layer by layer (a plain stack at gain 3: x 3^20 by the end), the gradient of
  every layer grows with them, evenly (the depth ratio stays near 1) but huge: a median relative gradient above
  SIZE_RATIO means that any learning rate that moves the weights sanely is far too large for the gradient.
"""
import math
import statistics
from typing import Any, Dict, List, Tuple

import torch

from torchtrace.autograd.node import AccumulateGrad
from torchtrace.autograd.plain import plain_torch
from torchtrace.doctor.findings import Finding

DEPTH_RATIO = 1e4
SIZE_RATIO = 1e4
ADVICE = {"exploding": "initialise each layer for its depth (kaiming / xavier gain), normalise the activations "
                       "(LayerNorm, BatchNorm), add residual connections, or clip the gradient norm",
          "vanishing": "initialise each layer for its depth (kaiming / xavier gain), use ReLU-like activations rather "
                       "than saturating ones, normalise the activations, or add residual connections"}


def depth_findings(order: List[Any], grads: Dict[int, torch.Tensor], names: Dict[int, str]) -> List[Finding]:
    """A finding when the relative gradient of the weight matrix farthest from the loss is DEPTH_RATIO times that
    of the nearest (or that much smaller). `order`: the graph from the loss; `grads`: id(leaf) -> its gradient."""
    relative: List[Tuple[str, float]] = []
    for node in order:  # nearest the loss first
        if not isinstance(node, AccumulateGrad) or node.variable.dim() < 2 or id(node.variable) not in grads:
            continue
        with plain_torch():
            weight = float(node.variable.detach().double().norm())
            grad = float(grads[id(node.variable)].double().norm())
        if weight > 0 and grad > 0 and math.isfinite(grad):
            relative.append((names.get(id(node.variable), f"a {tuple(node.variable.shape)} weight"), grad / weight))
    if len(relative) < 3:
        return []
    median = statistics.median(ratio for _, ratio in relative)
    if median > SIZE_RATIO:
        return [Finding("exploding", "backward", "", "", "", "", f"exploding gradients: the median relative gradient "
                        f"|dL/dW| / |W| of the {len(relative)} weight matrices is {median:.1e} (healthy training: "
                        "below 1), largest at " + max(relative, key=lambda item: item[1])[0], ADVICE["exploding"])]
    (near, near_ratio), (far, far_ratio) = relative[0], relative[-1]
    growth = far_ratio / near_ratio
    if 1 / DEPTH_RATIO <= growth <= DEPTH_RATIO:
        return []
    kind = "exploding" if growth > 1 else "vanishing"
    message = (f"{kind} gradients over depth: the relative gradient |dL/dW| / |W| is {far_ratio:.2e} at {far} (the "
               f"weight farthest from the loss) and {near_ratio:.2e} at {near} (the nearest), a factor {growth:.1e} "
               f"across {len(relative)} weight matrices")
    return [Finding(kind, "backward", "", "", "", "", message, ADVICE[kind])]
